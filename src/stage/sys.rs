//! The syscalls staging needs beyond `host::sys`: `flock` for the one-daemon lock, `syncfs`,
//! `statx` for birth times, and whiteout creation.
//!
//! Invariants: like `host::sys`, every path argument is relative to a held handle or names
//! a descriptor through `/proc/self/fd/N`; nothing follows a symlink; errors keep their
//! errno. With `host::sys`, the only staging code that holds `unsafe`.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::host::sys::Name;

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: false when another open file description holds it.
pub fn try_lock(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: valid fd; flock has no memory arguments.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// The xattr of a copy a checkpoint sealed in place of a file held open for writing
/// (`stage/seal.rs`): when the staged entry it copies was made (ns since the epoch, in
/// decimal), which the copy's own birth time is not. Under overlayfs's prefix, so it is
/// hidden through the mount and never compared or applied (`tree::OVL`).
pub const STAGED_AT: &[u8] = b"trusted.overlay.fencefs.staged_at";

/// [`STAGED_AT`]'s marker name, without the namespace (`tree::ovl` writes it; the merged
/// view carries it across replacements: `host::union::STAGED`).
pub const STAGED: &[u8] = crate::host::union::STAGED;

fn statx(dir: BorrowedFd<'_>, name: &[u8], flags: i32) -> io::Result<libc::statx> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid fd and NUL-terminated name; st points to a writable statx.
    cvt(unsafe {
        libc::statx(
            dir.as_raw_fd(),
            c.as_ptr(),
            flags | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BTIME | libc::STATX_TYPE | libc::STATX_CTIME,
            st.as_mut_ptr(),
        )
    } as libc::c_long)?;
    // SAFETY: statx succeeded, so it filled the struct (zeroed before).
    Ok(unsafe { st.assume_init() })
}

fn btime_of(st: &libc::statx) -> Option<i128> {
    (st.stx_mask & libc::STATX_BTIME != 0)
        .then(|| st.stx_btime.tv_sec as i128 * 1_000_000_000 + st.stx_btime.tv_nsec as i128)
}

/// Birth time (ns since the epoch) of `dir/name`, without following a symlink — for a
/// regular file carrying [`STAGED_AT`], that time instead; `None` when the file system
/// does not record one.
pub fn btime_ns(dir: BorrowedFd<'_>, name: &Name) -> io::Result<Option<i128>> {
    let st = statx(dir, name.bytes(), 0)?;
    if st.stx_mode as u32 & libc::S_IFMT == libc::S_IFREG
        && let Some(t) = staged_mark(dir, name)
    {
        return Ok(Some(t));
    }
    Ok(btime_of(&st))
}

/// When the staged entry `dir/name` was made, as far as its own attributes tell: its birth
/// time, or an earlier [`STAGED_AT`] it carries (a sealed copy's, or a time the merged view
/// carried over a replacement: on a file or directory, and as root on a symlink, FIFO,
/// socket or device too; a whiteout's is its modification time, [`staged_at`]); `None`
/// when the file system records no birth time and no mark is there.
pub fn staged_ns(dir: BorrowedFd<'_>, name: &Name) -> io::Result<Option<i128>> {
    let st = statx(dir, name.bytes(), 0)?;
    let born = btime_of(&st);
    let whiteout = st.stx_mode as u32 & libc::S_IFMT == libc::S_IFCHR
        && st.stx_rdev_major == 0
        && st.stx_rdev_minor == 0;
    if !whiteout && let Some(t) = staged_mark(dir, name) {
        return Ok(Some(born.map_or(t, |b| b.min(t))));
    }
    Ok(born)
}

/// When the staged entry `dir/name` (attributes `st`) was made (ns): its birth time or
/// else its ctime — earlier if a replacement carried an older time over (a file's or
/// directory's [`STAGED_AT`] mark, a whiteout's modification time: `host::union`'s
/// staged times).
pub fn staged_at(dir: BorrowedFd<'_>, name: &[u8], st: &libc::stat) -> i128 {
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    let t = Name::new(name)
        .ok()
        .and_then(|n| staged_ns(dir, &n).ok().flatten())
        .unwrap_or(ns(st.st_ctime, st.st_ctime_nsec));
    if st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == 0 {
        t.min(ns(st.st_mtime, st.st_mtime_nsec))
    } else {
        t
    }
}

/// When the staged file behind `fd` was made: its [`STAGED_AT`] mark, else its birth
/// time, else its ctime (what a copy of it is marked with).
pub fn staged_at_fd(fd: BorrowedFd<'_>) -> io::Result<i128> {
    let user = crate::host::union::other_form(STAGED_AT).unwrap_or_default();
    if let Ok(v) = file::get(fd, STAGED_AT).or_else(|_| file::get(fd, &user))
        && let Some(t) = std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok())
    {
        return Ok(t);
    }
    let st = statx(fd, b"", libc::AT_EMPTY_PATH)?;
    Ok(btime_of(&st)
        .unwrap_or(st.stx_ctime.tv_sec as i128 * 1_000_000_000 + st.stx_ctime.tv_nsec as i128))
}

/// When the staged directory `n` of layer `l` was made: its [`STAGED_AT`] mark (a
/// flattened tree makes its directories anew and marks them so), else its birth time,
/// else its ctime.
pub fn dir_staged_at(l: &super::tree::Layer, n: &super::tree::Node) -> i128 {
    l.xattr(n, STAGED_AT)
        .and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok())
        .or_else(|| btime_fd(n.fd.as_fd()).ok().flatten())
        .unwrap_or(n.st.st_ctime as i128 * 1_000_000_000 + n.st.st_ctime_nsec as i128)
}

/// The [`STAGED_AT`] mark of the entry `dir/name` (one `lgetxattr` through
/// `/proc/self/fd`, not following `name`).
fn staged_mark(dir: BorrowedFd<'_>, name: &Name) -> Option<i128> {
    let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    p.extend_from_slice(name.bytes());
    let p = CString::new(p).ok()?;
    let mut buf = [0u8; 48];
    let mut n = -1;
    for name in [
        STAGED_AT.to_vec(),
        crate::host::union::other_form(STAGED_AT)?,
    ] {
        let k = CString::new(name).ok()?;
        // SAFETY: NUL-terminated path and name; `buf` points to `len` writable bytes.
        n = unsafe { libc::lgetxattr(p.as_ptr(), k.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            break;
        }
    }
    if n <= 0 {
        return None;
    }
    std::str::from_utf8(&buf[..n as usize]).ok()?.parse().ok()
}

/// Birth time (ns since the epoch) of the file behind `fd` (an `O_PATH` handle too);
/// `None` when the file system does not record one.
pub fn btime_fd(fd: BorrowedFd<'_>) -> io::Result<Option<i128>> {
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid fd with an empty, NUL-terminated path; st points to a writable statx.
    cvt(unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BTIME,
            st.as_mut_ptr(),
        )
    } as libc::c_long)?;
    // SAFETY: statx succeeded, so it filled the struct (zeroed before).
    let st = unsafe { st.assume_init() };
    if st.stx_mask & libc::STATX_BTIME == 0 {
        return Ok(None);
    }
    Ok(Some(
        st.stx_btime.tv_sec as i128 * 1_000_000_000 + st.stx_btime.tv_nsec as i128,
    ))
}

/// Now (ns since the epoch) by the kernel's coarse clock, the clock file times are taken
/// from: a change made after this call carries a time at or after it.
pub fn coarse_now_ns() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    if r != 0 {
        return 0;
    }
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// `syncfs`: commits the whole file system holding `fd` (one call for a tree of files).
pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: valid fd; no memory arguments.
    cvt(unsafe { libc::syncfs(fd.as_raw_fd()) } as libc::c_long).map(drop)
}

/// Whether the file named by an overlayfs origin (`trusted.overlay.origin`: version,
/// magic 0xfb, length, flags, handle type, the file system's uuid, then the file handle)
/// still exists on the file system of `mount_fd`. `None` when the value cannot be read as
/// one (another format, a handle this file system does not decode).
pub fn origin_exists(mount_fd: BorrowedFd<'_>, origin: &[u8]) -> Option<bool> {
    open_origin(mount_fd, origin).map(|f| f.is_some())
}

/// Whether the overlayfs origin `origin` is the object `st` (same inode on the file
/// system of `mount_fd`): `Some(false)` when it is another one or gone, `None` when the
/// value cannot be read as one.
pub fn origin_is(mount_fd: BorrowedFd<'_>, origin: &[u8], st: &libc::stat) -> Option<bool> {
    Some(match open_origin(mount_fd, origin)? {
        Some(f) => {
            let o = crate::host::sys::fstat(f.as_fd()).ok()?;
            (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino)
        }
        None => false,
    })
}

/// The attributes of the object the overlayfs origin `origin` names (`None`: gone, or a
/// value that cannot be read as one).
pub fn origin_stat(mount_fd: BorrowedFd<'_>, origin: &[u8]) -> Option<libc::stat> {
    crate::host::sys::fstat(open_origin(mount_fd, origin)??.as_fd()).ok()
}

/// The kernel file handle an overlayfs origin names, in
/// [`crate::host::sys::file_handle`]'s form (its type, then its bytes): compared with a
/// SOURCE object's own handle where opening the origin is not allowed (an ordinary user
/// lacks `CAP_DAC_READ_SEARCH` for `open_by_handle_at`).
pub fn origin_handle(origin: &[u8]) -> Option<Vec<u8>> {
    const HEAD: usize = 5 + 16;
    if origin.len() <= HEAD || origin[1] != 0xfb || origin[2] as usize != origin.len() {
        return None;
    }
    Some([&(origin[4] as i32).to_ne_bytes()[..], &origin[HEAD..]].concat())
}

/// The object an overlayfs origin names, opened `O_PATH` (`Some(None)`: gone).
fn open_origin(mount_fd: BorrowedFd<'_>, origin: &[u8]) -> Option<Option<OwnedFd>> {
    const HEAD: usize = 5 + 16;
    if origin.len() <= HEAD || origin[1] != 0xfb || origin[2] as usize != origin.len() {
        return None;
    }
    let fid = &origin[HEAD..];
    // struct file_handle: u32 handle_bytes, i32 handle_type, then the bytes.
    let mut buf = vec![0u8; 8 + fid.len()];
    buf[..4].copy_from_slice(&(fid.len() as u32).to_ne_bytes());
    buf[4..8].copy_from_slice(&(origin[4] as i32).to_ne_bytes());
    buf[8..].copy_from_slice(fid);
    // SAFETY: valid fd; `buf` is a struct file_handle of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            buf.as_mut_ptr(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: the kernel just returned this descriptor.
        return Some(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) }));
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::ESTALE | libc::ENOENT) => Some(None),
        _ => None,
    }
}

/// The calls `apply` makes on a regular file it holds open (no `/proc/self/fd` lookup
/// each time): `fchmod`, `futimens`, and the `f*xattr` family with a 64 KiB bound.
pub mod file {
    use super::cvt;
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd};

    const MAX: usize = 64 * 1024;

    /// `fchmod`.
    pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
        // SAFETY: valid fd; no memory arguments.
        cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) } as libc::c_long).map(drop)
    }

    /// `futimens` with atime and mtime (seconds, nanoseconds).
    pub fn futimens(fd: BorrowedFd<'_>, at: (i64, i64), mt: (i64, i64)) -> io::Result<()> {
        let t = |(s, n): (i64, i64)| libc::timespec {
            tv_sec: s as libc::time_t,
            tv_nsec: n as libc::c_long,
        };
        let times = [t(at), t(mt)];
        // SAFETY: valid fd; an array of two timespecs.
        cvt(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) } as libc::c_long).map(drop)
    }

    fn bounded(call: impl Fn(*mut libc::c_void, usize) -> isize) -> io::Result<Vec<u8>> {
        // Not zeroed: 64 KiB cleared for every call (four per file an apply copies) was
        // a good part of its CPU; the kernel writes what it returns.
        let mut buf: Vec<u8> = Vec::with_capacity(MAX);
        let n = call(buf.as_mut_ptr().cast(), MAX);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the call wrote `n` (<= MAX, the capacity) bytes at the buffer's start.
        unsafe { buf.set_len((n as usize).min(MAX)) };
        Ok(buf)
    }

    fn cname(name: &[u8]) -> io::Result<std::ffi::CString> {
        std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    /// `flistxattr`: the names, each NUL-terminated (E2BIG past 64 KiB).
    pub fn list(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
        // SAFETY: valid fd; `buf` points to `len` writable bytes.
        bounded(|buf, len| unsafe { libc::flistxattr(fd.as_raw_fd(), buf.cast(), len) })
    }

    /// `fgetxattr` (E2BIG past 64 KiB).
    pub fn get(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<Vec<u8>> {
        let n = cname(name)?;
        // SAFETY: valid fd, NUL-terminated name; `buf` points to `len` writable bytes.
        bounded(|buf, len| unsafe { libc::fgetxattr(fd.as_raw_fd(), n.as_ptr(), buf, len) })
    }

    /// `fsetxattr`.
    pub fn set(fd: BorrowedFd<'_>, name: &[u8], value: &[u8]) -> io::Result<()> {
        let n = cname(name)?;
        // SAFETY: valid fd, NUL-terminated name, a value buffer with its length.
        cvt(unsafe {
            libc::fsetxattr(
                fd.as_raw_fd(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        } as libc::c_long)
        .map(drop)
    }

    /// `fremovexattr`.
    pub fn remove(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
        let n = cname(name)?;
        // SAFETY: valid fd and NUL-terminated name.
        cvt(unsafe { libc::fremovexattr(fd.as_raw_fd(), n.as_ptr()) } as libc::c_long).map(drop)
    }
}
