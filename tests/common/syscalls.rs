//! Exact errnos: `errno_of`, `ename`, `assert_errno`, and raw syscall wrappers that keep
//! the errno (`open_flags`, `mknod`, `renameat2`, the xattr calls, …) where std would hide
//! it or not offer the call.

use super::*;

/// 0 for Ok, the raw errno for Err (-1 if the error has none).
pub fn errno_of<T>(r: &io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

/// Symbolic name of an errno (0 → "ok").
pub fn ename(e: i32) -> String {
    let s = match e {
        0 => "ok",
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EROFS => "EROFS",
        libc::EEXIST => "EEXIST",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EINVAL => "EINVAL",
        libc::EIO => "EIO",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ELOOP => "ELOOP",
        libc::ENOTCONN => "ENOTCONN",
        libc::EXDEV => "EXDEV",
        libc::EBADF => "EBADF",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESTALE => "ESTALE",
        libc::ETXTBSY => "ETXTBSY",
        -1 => "no-errno",
        _ => return format!("errno {e}"),
    };
    s.to_string()
}

/// Asserts `r` failed with exactly `want` (or succeeded, for want == 0).
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: io::Result<T>, want: i32, what: &str) -> io::Result<T> {
    let got = errno_of(&r);
    assert_eq!(
        ename(got),
        ename(want),
        "{what}: expected {}, got {} ({r:?})",
        ename(want),
        ename(got)
    );
    r
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn cvt_s(rc: libc::ssize_t) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// open(2) with raw flags and mode; the fd is closed again. Returns Ok on success.
pub fn open_flags(p: &Path, flags: i32, mode: u32) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path; the returned fd is closed right away.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open(2) and is owned here.
    unsafe { libc::close(fd) };
    Ok(())
}

/// mkdir(2) with a raw mode (no `mkdir -m` chmod afterwards).
pub fn mkdir_mode(p: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::mkdir(c.as_ptr(), mode as libc::mode_t) })
}

pub fn mknod(p: &Path, mode: u32, dev: u64) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, dev as libc::dev_t) })
}

pub fn chmod(p: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::chmod(c.as_ptr(), mode as libc::mode_t) })
}

pub fn lchown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::lchown(c.as_ptr(), uid, gid) })
}

pub fn truncate(p: &Path, len: i64) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::truncate(c.as_ptr(), len) })
}

/// Sets atime and mtime to `secs` (no symlink follow).
pub fn utimes(p: &Path, secs: i64) -> io::Result<()> {
    let c = cstr(p);
    let ts = [
        libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
    ];
    // SAFETY: valid path and a 2-element timespec array.
    cvt(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

pub fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let a = cstr(from);
    let b = cstr(to);
    // SAFETY: valid NUL-terminated paths.
    cvt(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

pub fn setxattr(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    // SAFETY: valid path/name and a value buffer of the given length.
    cvt(unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

pub fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    // SAFETY: valid path and name.
    cvt(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) })
}

pub fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid path/name; buf is writable for its length.
    let len = cvt_s(unsafe {
        libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })?;
    buf.truncate(len);
    Ok(buf)
}

/// lgetxattr-based list of xattr names (no symlink follow).
pub fn llistxattr(p: &Path) -> io::Result<Vec<Vec<u8>>> {
    let c = cstr(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid path; buf is writable for its length.
    let len = cvt_s(unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    buf.truncate(len);
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| s.to_vec())
        .collect())
}

pub fn lgetxattr(p: &Path, name: &[u8]) -> io::Result<Vec<u8>> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid path/name; buf is writable for its length.
    let len = cvt_s(unsafe {
        libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })?;
    buf.truncate(len);
    Ok(buf)
}

/// Reads a whole file through `open(O_RDONLY)`.
pub fn read_all(p: &Path) -> io::Result<Vec<u8>> {
    let mut f = fs::File::open(p)?;
    let mut v = vec![];
    f.read_to_end(&mut v)?;
    Ok(v)
}

/// Sorted names in a directory (via read_dir, i.e. getdents), as raw bytes.
pub fn names(p: &Path) -> io::Result<Vec<Vec<u8>>> {
    let mut v = vec![];
    for e in fs::read_dir(p)? {
        v.push(e?.file_name().into_vec());
    }
    v.sort();
    Ok(v)
}

/// Sorted names as lossy strings, for readable assertions.
pub fn names_str(p: &Path) -> io::Result<Vec<String>> {
    Ok(names(p)?
        .into_iter()
        .map(|n| String::from_utf8_lossy(&n).into_owned())
        .collect())
}
