//! The daemon process's own settings: descriptor limit, umask, heap, readiness
//! descriptor, effective uid, the FUSE connection's passthrough backing ids.
//!
//! Invariant: called at startup or from the daemon's own threads, never with a caller's
//! request data.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::cvt;

/// Current RLIMIT_NOFILE soft limit after trying to raise it to the hard limit.
pub fn raise_nofile_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 1024;
    }
    if rl.rlim_cur < rl.rlim_max {
        let new = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: valid pointer to a rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            return new.rlim_cur;
        }
    }
    rl.rlim_cur
}

/// Writes `data` to an inherited descriptor and closes it (readiness notification).
pub fn write_and_close(fd: i32, data: &[u8]) -> io::Result<()> {
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: fcntl on an arbitrary number only queries it; fails with EBADF if not open.
    cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: the descriptor is open (checked above) and handed to us by the caller to own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut f = std::fs::File::from(owned);
    std::io::Write::write_all(&mut f, data)
}

/// Returns freed heap memory to the kernel (glibc `malloc_trim`, every arena).
pub fn trim_heap() {
    // SAFETY: malloc_trim only releases free memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Sets the process umask (0 at startup: modes from the kernel are already masked).
pub fn set_umask(mask: u32) {
    // SAFETY: umask cannot fail.
    unsafe {
        libc::umask(mask as libc::mode_t);
    }
}

/// The umask of the programs the daemon starts for the operator (`--ask-exec`, a
/// background `stage empty-trash`, `fusermount3`): what they create is theirs alone.
pub const CHILD_UMASK: u32 = 0o077;

/// Makes `cmd` start with umask `CHILD_UMASK`, not the daemon's own 0 (which is there
/// for the files it creates for FUSE callers with their own modes).
pub fn private_umask(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec; umask(2) is async-signal-safe,
    // cannot fail and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(CHILD_UMASK as libc::mode_t);
            Ok(())
        })
    }
}

/// The effective uid of the daemon.
pub fn geteuid() -> u32 {
    // SAFETY: cannot fail.
    unsafe { libc::geteuid() }
}

/// `FUSE_DEV_IOC_BACKING_CLOSE` = `_IOW(229, 2, uint32_t)`.
const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = 0x4004_e502;

/// Closes a kernel passthrough backing id on the FUSE connection `dev` belongs to.
pub fn fuse_backing_close(dev: BorrowedFd<'_>, id: u32) -> io::Result<()> {
    // SAFETY: the ioctl reads one u32 from the pointer, which outlives the call.
    let r = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            FUSE_DEV_IOC_BACKING_CLOSE,
            &id as *const u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Caps glibc's malloc arenas at `n` (unless `MALLOC_ARENA_MAX` is set, which wins).
/// With an arena per thread, nodes allocated by the io_uring queue threads and freed by
/// the FORGET workers left whole arenas fragmented: after a second 200,000-file walk was
/// forgotten the daemon kept 74 MiB (io_uring) and 35 MiB (/dev/fuse); with two arenas
/// 19 and 16 MiB (`tests/faults/`).
pub fn limit_malloc_arenas(n: i32) {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: mallopt only sets an allocator parameter; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, n);
    }
}

/// Closes `leaked`, a descriptor number a library took out of an owning type with
/// `into_raw_fd` and never closed, if it is still a duplicate of `ours` (the same open file
/// description, by kcmp(2)). Returns whether it was closed; without kcmp (a seccomp filter,
/// a kernel without it) it is left open.
pub fn close_leaked_dup(ours: &impl AsRawFd, leaked: RawFd) -> bool {
    const KCMP_FILE: libc::c_int = 0;
    if leaked < 0 || leaked == ours.as_raw_fd() {
        return false;
    }
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: kcmp only compares two descriptor numbers of this process; no memory is
    // passed.
    let same = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid,
            pid,
            KCMP_FILE,
            ours.as_raw_fd() as libc::c_ulong,
            leaked as libc::c_ulong,
        )
    } == 0;
    if same {
        // SAFETY: `leaked` is open (kcmp found its file) and is a duplicate of `ours`, which
        // we hold, so the number cannot have been closed and reused meanwhile; the caller
        // says no owning type holds it (the library gave up ownership and leaked it). The
        // OwnedFd closes it once.
        drop(unsafe { OwnedFd::from_raw_fd(leaked) });
    }
    same
}
