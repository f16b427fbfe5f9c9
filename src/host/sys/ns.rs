//! The namespace syscalls of `fencefs run`: a private user and mount namespace, the FUSE
//! mount made directly with mount(2) inside it (no fusermount3: a setuid helper does not
//! work in a user namespace), bind and tmpfs mounts that cover the daemon's own files, the
//! fork of the daemon and COMMAND's last steps before exec.
//!
//! Invariants: [`enter_private_ns`] and [`fork`] are only called while the process has
//! a single thread (unshare(CLONE_NEWUSER) refuses otherwise, and a forked copy of a
//! threaded process may only call async-signal-safe functions). The code [`pre_exec`]
//! installs runs between fork and exec: it allocates nothing and calls raw syscalls only.
//! Errors keep their raw errno (the caller turns EPERM/ENOSPC into "how to enable it").
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::unistd::Pid;

fn errno(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Enters a new mount namespace — inside a new user namespace that maps only the caller's
/// own uid and gid (to themselves) when `user` — and makes every mount in it private, so
/// nothing mounted here propagates to the host.
pub fn enter_private_ns(user: bool, uid: u32, gid: u32) -> io::Result<()> {
    if user {
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(errno)?;
        // gid_map may only be written once setgroups is denied (an unprivileged map).
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))?;
    } else {
        unshare(CloneFlags::CLONE_NEWNS).map_err(errno)?;
    }
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(errno)
}

/// Enters a new mount namespace (a copy of the current one, in the same user namespace).
pub fn enter_mount_ns() -> io::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(errno)
}

/// Makes this process's next child the first process (pid 1) of a new PID namespace.
/// Allowed with threads running (unlike a new user or mount namespace).
pub fn enter_pid_ns() -> io::Result<()> {
    unshare(CloneFlags::CLONE_NEWPID).map_err(errno)
}

/// What the init of COMMAND's PID namespace does between fork and exec (it is pid 1 there
/// already, and still has the capabilities `fencefs run` has in its user namespace, which
/// an ordinary user's exec drops): [`pre_exec`]'s steps, then, in a new mount namespace
/// (a copy of this one), a `/proc` of the new PID namespace (`nosuid,nodev,noexec`), so
/// `/proc` lists only its processes. A `/proc` that cannot be mounted (a container masking
/// parts of its own) is one line on stderr; the init goes on.
pub fn pre_exec_init(cmd: &mut std::process::Command) {
    pre_exec(cmd, false);
    // SAFETY: as in `pre_exec`: raw syscalls on static data only, in the forked child.
    unsafe {
        cmd.pre_exec(|| {
            // Not the real workspace beneath the fence (COMMAND's cwd is resolved again).
            if libc::chdir(c"/".as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let ok = libc::unshare(libc::CLONE_NEWNS) == 0
                && libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                ) == 0;
            if !ok {
                let msg = b"fencefs: cannot mount a /proc of COMMAND's own: it lists the machine's processes (they still cannot be signalled or traced from inside)\n";
                libc::write(2, msg.as_ptr().cast(), msg.len());
            }
            Ok(())
        });
    }
}

/// Mounts the FUSE connection `dev` (an open /dev/fuse) at `target`, type
/// `fuse.fencefs`, `nosuid,nodev`, owned by `uid`/`gid` (the kernel lets only them in
/// unless `allow_other`).
pub fn mount_fuse(
    dev: BorrowedFd<'_>,
    target: &Path,
    fsname: &str,
    uid: u32,
    gid: u32,
    allow_other: bool,
) -> io::Result<()> {
    let mut data = format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid}",
        dev.as_raw_fd()
    );
    if allow_other {
        data.push_str(",allow_other,default_permissions");
    }
    mount(
        Some(fsname),
        target,
        Some("fuse.fencefs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(errno)
}

/// Bind-mounts `src` (a directory, or `/proc/self/fd/N`) over `dst`.
pub fn bind(src: &Path, dst: &Path) -> io::Result<()> {
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(errno)
}

/// Covers `dst` with an empty read-only tmpfs (what was there is out of reach by path).
pub fn cover(dst: &Path) -> io::Result<()> {
    mount(
        Some("fencefs-hidden"),
        dst,
        Some("tmpfs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=4k,mode=0500"),
    )
    .map_err(errno)
}

/// Covers `dst` as [`cover`] does, but for `keep` (a directory directly in `dst`), which
/// stays reachable at its own path: the cover is a tmpfs with only `keep`'s name in it,
/// `keep` bound there, then the cover made read-only (the bind mount below it keeps its
/// own flags).
pub fn cover_keeping(dst: &Path, keep: Option<&Path>) -> io::Result<()> {
    let Some(keep) = keep else {
        return cover(dst);
    };
    let name = keep
        .file_name()
        .filter(|_| keep.parent() == Some(dst))
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    use std::os::unix::fs::OpenOptionsExt;
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(keep)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some("fencefs-hidden"),
        dst,
        Some("tmpfs"),
        flags,
        Some("size=4k,mode=0500"),
    )
    .map_err(errno)?;
    let at = dst.join(name);
    let r = std::fs::create_dir(&at)
        .and_then(|()| bind(Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())), &at))
        .and_then(|()| {
            mount(
                None::<&str>,
                dst,
                None::<&str>,
                MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | flags,
                None::<&str>,
            )
            .map_err(errno)
        });
    if r.is_err() {
        let _ = umount2(dst, MntFlags::MNT_DETACH);
    }
    r
}

/// Detaches the topmost mount at `path` (lazily: the FUSE session ends when the last
/// file in it is closed).
pub fn detach(path: &Path) -> io::Result<()> {
    umount2(path, MntFlags::MNT_DETACH).map_err(errno)
}

/// fork(2). `Ok(None)` in the child, `Ok(Some(child))` in the parent.
pub fn fork() -> io::Result<Option<Pid>> {
    // SAFETY: callers fork only while single-threaded (module invariant), so the child
    // is a full copy with no lock held by a thread that does not exist there.
    match unsafe { nix::unistd::fork() }.map_err(errno)? {
        nix::unistd::ForkResult::Child => Ok(None),
        nix::unistd::ForkResult::Parent { child } => Ok(Some(child)),
    }
}

/// Makes the calling process die (SIGKILL) when `parent` does; fails when it already has.
pub fn die_with(parent: Pid) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(errno)?;
    if nix::unistd::getppid() != parent {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

/// Root mapped to itself, for root's COMMAND. A process can map only its own id in a
/// namespace it made (the full range needs a writer in the parent namespace), so other
/// users' files show as owned by the overflow id in there.
const ROOT_MAP: &[u8] = b"0 0 1\n";

/// What COMMAND's child does between fork and exec: unblock every signal, die with
/// `fencefs run` (SIGKILL),
/// and, when `lock`, enter one more user and mount namespace (root mapped to itself) so every mount it inherits — the fence included — is locked: COMMAND
/// keeps its capabilities over its own namespace but can no longer unmount or move the
/// fence to uncover the workspace beneath.
pub fn pre_exec(cmd: &mut std::process::Command, lock: bool) {
    // SAFETY: the closure runs in the forked child before exec; it only makes raw
    // syscalls on static data (no allocation, no lock), as pre_exec requires.
    unsafe {
        cmd.pre_exec(move || {
            // `fencefs run` blocks the signals it waits for; COMMAND starts with none.
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if lock {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                    return Err(io::Error::last_os_error());
                }
                write_static(c"/proc/self/setgroups", b"deny")?;
                write_static(c"/proc/self/uid_map", ROOT_MAP)?;
                write_static(c"/proc/self/gid_map", ROOT_MAP)?;
            }
            Ok(())
        });
    }
}

/// Writes `data` to `path` with raw syscalls (safe between fork and exec).
fn write_static(path: &CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is a NUL-terminated C string; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `data` is a valid buffer of `data.len()` bytes; `fd` is ours.
    let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    if n != data.len() as isize {
        return Err(err);
    }
    Ok(())
}

/// Puts process group `pgrp` in the foreground of the terminal on `fd`.
pub fn tcsetpgrp(fd: BorrowedFd<'_>, pgrp: Pid) -> io::Result<()> {
    // SAFETY: a plain ioctl-backed libc call on a borrowed, open descriptor.
    if unsafe { libc::tcsetpgrp(fd.as_raw_fd(), pgrp.as_raw()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The terminal's foreground process group on `fd`.
pub fn tcgetpgrp(fd: BorrowedFd<'_>) -> io::Result<Pid> {
    // SAFETY: as above.
    let p = unsafe { libc::tcgetpgrp(fd.as_raw_fd()) };
    if p < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Pid::from_raw(p))
}

/// Takes every pending signal of `set` without waiting (so unblocking it afterwards
/// delivers none of those that arrived while it was blocked).
pub fn drain(set: &nix::sys::signal::SigSet) {
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `set` is a valid sigset_t and `zero` a valid timespec; no siginfo is asked
    // for. Each call consumes one pending signal of `set` or fails (EAGAIN): the loop ends.
    while unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &zero) } > 0 {}
}
