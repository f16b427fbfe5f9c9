//! Extended attributes of the inode behind an `O_PATH` handle, through `/proc/self/fd/N`
//! (the `*xattr` calls have no `AT_EMPTY_PATH` form for `O_PATH` handles). Where the
//! kernel has the `*xattrat` calls (6.13), the name `N` is resolved from a held
//! `/proc/self/fd` directory instead of walking `/proc/self/fd/` for every call (2.0
//! against 2.9 µs a call, measured); without them (`ENOSYS`, or `EPERM` from a seccomp
//! filter that does not know them, found by one probe), the path form.
//!
//! Invariant: only called on regular files and directories (never a symlink or a special
//! file), but for the base records on whiteouts (`stage::base`, and [`lsetxattr_at`] on a
//! whiteout just made under the union's names lock); errors keep their raw errno.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{cvt, size_result};

// The generic syscall table's numbers (alpha and mips number theirs otherwise: there the
// path form is used, see `proc_dir`).
const SYS_SETXATTRAT: libc::c_long = 463;
const SYS_GETXATTRAT: libc::c_long = 464;
const SYS_LISTXATTRAT: libc::c_long = 465;
const SYS_REMOVEXATTRAT: libc::c_long = 466;

/// `struct xattr_args` of the `*xattrat` calls.
#[repr(C)]
struct XattrArgs {
    value: u64,
    size: u32,
    flags: u32,
}

/// Opens the held `/proc/self/fd` now (the daemon, once it will not fork any more, before
/// it serves: its descriptor is then there from the start, not from the first xattr call).
pub fn prepare() {
    let _ = proc_dir();
}

/// The held `/proc/self/fd` when the kernel serves the `*xattrat` calls. It names the
/// descriptors of the process that opened it: a process forked after that uses the path
/// form (told by a fork handler, not by a `getpid` per call).
fn proc_dir() -> Option<BorrowedFd<'static>> {
    static DIR: OnceLock<Option<OwnedFd>> = OnceLock::new();
    let d = DIR.get_or_init(|| {
        // SAFETY: registers a child handler that only stores to an atomic.
        let forks_seen = unsafe { libc::pthread_atfork(None, None, Some(forked)) } == 0;
        forks_seen.then(open_if_served).flatten()
    });
    if FORKED.load(Ordering::Relaxed) {
        return None;
    }
    d.as_ref().map(|d| d.as_fd())
}

/// Set in a child forked after [`proc_dir`] was first asked.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn forked() {
    FORKED.store(true, Ordering::Relaxed);
}

/// `/proc/self/fd`, if this kernel serves the `*xattrat` calls on it.
fn open_if_served() -> Option<OwnedFd> {
    if !cfg!(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "loongarch64",
        target_arch = "powerpc64",
        target_arch = "s390x",
        target_arch = "arm",
        target_arch = "x86"
    )) {
        return None;
    }
    {
        let d = super::open_proc_self_fd().ok()?;
        // One probe: a name the directory has no value for answers ENODATA (or
        // EOPNOTSUPP); ENOSYS or a seccomp filter's EPERM means no such calls here.
        let mut args = XattrArgs {
            value: 0,
            size: 0,
            flags: 0,
        };
        // SAFETY: valid directory fd, NUL-terminated path and name, `args` sized as given.
        let r = unsafe {
            libc::syscall(
                SYS_GETXATTRAT,
                d.as_raw_fd(),
                c".".as_ptr(),
                0u32,
                c"user.fencefs-probe".as_ptr(),
                &mut args as *mut XattrArgs,
                std::mem::size_of::<XattrArgs>(),
            )
        };
        let e = io::Error::last_os_error().raw_os_error();
        (r >= 0 || !matches!(e, Some(libc::ENOSYS | libc::EPERM))).then_some(d)
    }
}

/// `fd`'s number as a name in `/proc/self/fd`.
fn fd_name(fd: BorrowedFd<'_>) -> CString {
    CString::new(fd.as_raw_fd().to_string()).unwrap_or_default()
}

fn xattr_name(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn proc_path(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

/// An xattr answer: the size asked for (buffer size 0) or the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Xattr {
    /// The size a buffer would need.
    Size(usize),
    /// The value or the name list.
    Data(Vec<u8>),
}

impl Xattr {
    /// An empty answer in the form the caller asked for.
    pub fn empty(size: usize) -> Xattr {
        if size == 0 {
            Xattr::Size(0)
        } else {
            Xattr::Data(Vec::new())
        }
    }
}

/// Runs a get/list xattr call with a buffer of `size` bytes (a null buffer for 0).
fn xattr_call(
    size: usize,
    call: impl FnOnce(*mut libc::c_void, usize) -> isize,
) -> io::Result<Xattr> {
    if size == 0 {
        return size_result(call(std::ptr::null_mut(), 0)).map(Xattr::Size);
    }
    let mut buf = vec![0u8; size];
    let len = size_result(call(buf.as_mut_ptr().cast(), size))?;
    buf.truncate(len);
    Ok(Xattr::Data(buf))
}

/// `getxattr` on the inode behind an `O_PATH` handle (regular file or directory).
pub fn getxattr_fd(fd: BorrowedFd<'_>, name: &[u8], size: usize) -> io::Result<Xattr> {
    get(proc_dir(), fd, name, size)
}

/// `listxattr` on the inode behind an `O_PATH` handle.
pub fn listxattr_fd(fd: BorrowedFd<'_>, size: usize) -> io::Result<Xattr> {
    list(proc_dir(), fd, size)
}

/// `setxattr` on the inode behind an `O_PATH` handle.
pub fn setxattr_fd(fd: BorrowedFd<'_>, name: &[u8], value: &[u8], flags: i32) -> io::Result<()> {
    set(proc_dir(), fd, name, value, flags)
}

/// `lsetxattr` of entry `entry` of directory `dir` (never following a symlink at
/// `entry`): one `setxattrat` call where the kernel has it, no handle opened.
pub fn lsetxattr_at(
    dir: BorrowedFd<'_>,
    entry: &super::Name,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> io::Result<()> {
    lset(proc_dir().is_some(), dir, entry, name, value, flags)
}

/// [`lsetxattr_at`] in the `*xattrat` form (`served`) or the path form.
fn lset(
    served: bool,
    dir: BorrowedFd<'_>,
    entry: &super::Name,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> io::Result<()> {
    let e = CString::new(entry.bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    if served {
        return set_at(
            dir,
            &e,
            libc::AT_SYMLINK_NOFOLLOW as u32,
            name,
            value,
            flags,
        );
    }
    let mut p = proc_path(dir).into_bytes();
    p.push(b'/');
    p.extend_from_slice(entry.bytes());
    let p = CString::new(p).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    set_path(libc::lsetxattr, &p, name, value, flags)
}

/// `removexattr` on the inode behind an `O_PATH` handle.
pub fn removexattr_fd(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    remove(proc_dir(), fd, name)
}

// Each call through `at` (the held `/proc/self/fd`, the `*xattrat` form) or, without it,
// through the path `/proc/self/fd/N`.

fn get(
    at: Option<BorrowedFd<'_>>,
    fd: BorrowedFd<'_>,
    name: &[u8],
    size: usize,
) -> io::Result<Xattr> {
    let n = xattr_name(name)?;
    if let Some(d) = at {
        let f = fd_name(fd);
        return xattr_call(size, |buf, len| {
            let mut args = XattrArgs {
                value: buf as u64,
                size: len.min(u32::MAX as usize) as u32,
                flags: 0,
            };
            // SAFETY: NUL-terminated strings; `args.value` is null or points to `len`
            // writable bytes (a buffer of at most 64 KiB: `len` fits the u32).
            unsafe {
                libc::syscall(
                    SYS_GETXATTRAT,
                    d.as_raw_fd(),
                    f.as_ptr(),
                    0u32,
                    n.as_ptr(),
                    &mut args as *mut XattrArgs,
                    std::mem::size_of::<XattrArgs>(),
                ) as isize
            }
        });
    }
    let p = proc_path(fd);
    // SAFETY: NUL-terminated strings; `buf` is null or points to `len` writable bytes.
    xattr_call(size, |buf, len| unsafe {
        libc::getxattr(p.as_ptr(), n.as_ptr(), buf, len)
    })
}

fn list(at: Option<BorrowedFd<'_>>, fd: BorrowedFd<'_>, size: usize) -> io::Result<Xattr> {
    if let Some(d) = at {
        let f = fd_name(fd);
        // SAFETY: NUL-terminated path; `buf` is null or points to `len` writable bytes.
        return xattr_call(size, |buf, len| unsafe {
            libc::syscall(SYS_LISTXATTRAT, d.as_raw_fd(), f.as_ptr(), 0u32, buf, len) as isize
        });
    }
    let p = proc_path(fd);
    // SAFETY: NUL-terminated path; `buf` is null or points to `len` writable bytes.
    xattr_call(size, |buf, len| unsafe {
        libc::listxattr(p.as_ptr(), buf.cast(), len)
    })
}

fn set(
    at: Option<BorrowedFd<'_>>,
    fd: BorrowedFd<'_>,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> io::Result<()> {
    if let Some(d) = at {
        return set_at(d, &fd_name(fd), 0, name, value, flags);
    }
    set_path(libc::setxattr, &proc_path(fd), name, value, flags)
}

/// The path form of a set: `call` is `setxattr` (following `/proc/self/fd/N` to the
/// handle's inode) or `lsetxattr` (an entry by name, never followed).
fn set_path(
    call: unsafe extern "C" fn(
        *const libc::c_char,
        *const libc::c_char,
        *const libc::c_void,
        libc::size_t,
        libc::c_int,
    ) -> libc::c_int,
    path: &std::ffi::CStr,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> io::Result<()> {
    let n = xattr_name(name)?;
    // SAFETY: NUL-terminated strings; value buffer with its length.
    cvt(unsafe {
        call(
            path.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// `setxattrat(dir, path, at_flags, name, value)`.
fn set_at(
    dir: BorrowedFd<'_>,
    path: &std::ffi::CStr,
    at_flags: u32,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> io::Result<()> {
    let n = xattr_name(name)?;
    // A value past a u32 is past every file system's limit: E2BIG, as setxattr says.
    let size = u32::try_from(value.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let args = XattrArgs {
        value: value.as_ptr() as u64,
        size,
        flags: flags as u32,
    };
    // SAFETY: NUL-terminated strings; `args.value` points to `size` readable bytes.
    cvt(unsafe {
        libc::syscall(
            SYS_SETXATTRAT,
            dir.as_raw_fd(),
            path.as_ptr(),
            at_flags,
            n.as_ptr(),
            &args as *const XattrArgs,
            std::mem::size_of::<XattrArgs>(),
        ) as libc::c_int
    })
    .map(drop)
}

fn remove(at: Option<BorrowedFd<'_>>, fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let n = xattr_name(name)?;
    if let Some(d) = at {
        let f = fd_name(fd);
        // SAFETY: NUL-terminated strings.
        return cvt(unsafe {
            libc::syscall(
                SYS_REMOVEXATTRAT,
                d.as_raw_fd(),
                f.as_ptr(),
                0u32,
                n.as_ptr(),
            ) as libc::c_int
        })
        .map(drop);
    }
    let p = proc_path(fd);
    // SAFETY: NUL-terminated strings.
    cvt(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both forms give the same answers on a directory held `O_PATH`: set, get (size and
    /// value), list, remove, and the errno of a missing name.
    #[test]
    fn both_forms_answer_alike() {
        let p = std::env::temp_dir().join(format!("fencefs-xattr-{}", std::process::id()));
        std::fs::create_dir(&p).unwrap();
        let f = super::super::open_root(&p).unwrap();
        let fd = f.as_fd();
        let forms = [None, proc_dir()];
        // Since 6.13 the kernel has the *xattrat calls: they must be found then.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release.trim().split(|c: char| !c.is_ascii_digit());
        let (major, minor): (u32, u32) = (
            v.next().unwrap().parse().unwrap(),
            v.next().unwrap().parse().unwrap(),
        );
        if (major, minor) >= (6, 13) {
            assert!(
                forms[1].is_some(),
                "kernel {release}: the *xattrat calls not found"
            );
        }
        for (i, at) in forms.into_iter().enumerate() {
            let name = format!("user.fencefs-test-{i}");
            let n = name.as_bytes();
            set(at, fd, n, b"value", 0).unwrap();
            let e = set(at, fd, n, b"again", libc::XATTR_CREATE).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
            assert_eq!(get(at, fd, n, 0).unwrap(), Xattr::Size(5));
            assert_eq!(get(at, fd, n, 64).unwrap(), Xattr::Data(b"value".to_vec()));
            let Xattr::Data(l) = list(at, fd, 1024).unwrap() else {
                panic!("a list");
            };
            assert!(l.split(|&b| b == 0).any(|x| x == n));
            remove(at, fd, n).unwrap();
            let e = get(at, fd, n, 64).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENODATA));
            let e = remove(at, fd, n).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENODATA));
        }
        std::fs::remove_dir(&p).unwrap();
    }

    /// Both forms of [`lsetxattr_at`] set the value on the entry itself: a whiteout (a
    /// 0/0 character device, as the union makes them) gets a trusted value (as root; an
    /// ordinary user's run, which may set neither, uses an empty file and a `user.` value);
    /// a symlink at the name is never followed (its target keeps nothing); a missing
    /// entry is ENOENT.
    #[test]
    fn an_entry_gets_its_value_by_name_in_both_forms() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let p = std::env::temp_dir().join(format!("fencefs-xattr-at-{}", std::process::id()));
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("target"), b"").unwrap();
        std::os::unix::fs::symlink("target", p.join("link")).unwrap();
        let d = super::super::open_root(&p).unwrap();
        let name = |n: &str| super::super::Name::new(n.as_bytes()).unwrap();
        for (i, served) in [false, proc_dir().is_some()].into_iter().enumerate() {
            let wh = name(&format!("wh{i}"));
            let xa = if root {
                super::super::mknodat(d.as_fd(), &wh, libc::S_IFCHR, 0).unwrap();
                format!("trusted.fencefs-test-{i}")
            } else {
                std::fs::write(p.join(format!("wh{i}")), b"").unwrap();
                format!("user.fencefs-test-{i}")
            };
            lset(served, d.as_fd(), &wh, xa.as_bytes(), b"rec", 0).unwrap();
            let fd = super::super::open_path(d.as_fd(), &wh).unwrap();
            assert_eq!(
                get(None, fd.as_fd(), xa.as_bytes(), 64).unwrap(),
                Xattr::Data(b"rec".to_vec())
            );
            // trusted.* on a symlink itself is allowed: the link gets it, not its target
            // (user.* on a symlink is EPERM: the call still never reaches the target).
            let r = lset(served, d.as_fd(), &name("link"), xa.as_bytes(), b"l", 0);
            assert_eq!(
                r.map_err(|e| e.raw_os_error()),
                if root { Ok(()) } else { Err(Some(libc::EPERM)) }
            );
            let t = super::super::open_path(d.as_fd(), &name("target")).unwrap();
            let e = get(None, t.as_fd(), xa.as_bytes(), 64).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENODATA));
            let e = lset(served, d.as_fd(), &name("none"), xa.as_bytes(), b"x", 0).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        }
        std::fs::remove_dir_all(&p).unwrap();
    }

    /// A child forked after the directory was opened never uses it (its descriptor numbers
    /// would name the parent's files): the path form.
    #[test]
    fn a_forked_child_takes_the_path_form() {
        let _ = proc_dir();
        // SAFETY: the child only reads an initialised OnceLock and an atomic, then exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let code = if proc_dir().is_none() { 0 } else { 1 };
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
        assert!(!FORKED.load(Ordering::Relaxed), "the parent keeps it");
    }
}
