//! Extended attributes of the inode behind an `O_PATH` handle, through `/proc/self/fd/N`
//! (the `*xattr` calls have no `AT_EMPTY_PATH` form).
//!
//! Invariant: only called on regular files and directories (never a symlink or a special
//! file); errors keep their raw errno.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::{cvt, size_result};

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
    let p = proc_path(fd);
    let n = xattr_name(name)?;
    // SAFETY: NUL-terminated strings; `buf` is null or points to `len` writable bytes.
    xattr_call(size, |buf, len| unsafe {
        libc::getxattr(p.as_ptr(), n.as_ptr(), buf, len)
    })
}

/// `listxattr` on the inode behind an `O_PATH` handle.
pub fn listxattr_fd(fd: BorrowedFd<'_>, size: usize) -> io::Result<Xattr> {
    let p = proc_path(fd);
    // SAFETY: NUL-terminated path; `buf` is null or points to `len` writable bytes.
    xattr_call(size, |buf, len| unsafe {
        libc::listxattr(p.as_ptr(), buf.cast(), len)
    })
}

/// `setxattr` on the inode behind an `O_PATH` handle.
pub fn setxattr_fd(fd: BorrowedFd<'_>, name: &[u8], value: &[u8], flags: i32) -> io::Result<()> {
    let p = proc_path(fd);
    let n = xattr_name(name)?;
    // SAFETY: NUL-terminated strings; value buffer with its length.
    cvt(unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// `removexattr` on the inode behind an `O_PATH` handle.
pub fn removexattr_fd(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let p = proc_path(fd);
    let n = xattr_name(name)?;
    // SAFETY: NUL-terminated strings.
    cvt(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
}
