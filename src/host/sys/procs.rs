//! Other processes, read through `/proc` and pidfds: which program a process runs (the
//! kernel's name for its executable and its root) and its parent. Safe wrappers; the
//! names are the kernel's `d_path` strings, read with readlinkat(2) — a magic link is
//! read, never followed or opened.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::cvt_fd;

/// `/proc`, as an `O_PATH` directory handle.
pub fn open_proc() -> io::Result<OwnedFd> {
    // SAFETY: constant NUL-terminated path; the result is checked.
    cvt_fd(unsafe {
        libc::open(
            c"/proc".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    })
}

/// readlinkat(`proc`, "PID/NAME"): the target of a process's magic link (`exe`, `root`),
/// as text; never followed.
pub fn proc_link(proc: BorrowedFd<'_>, pid: u32, name: &str) -> io::Result<Vec<u8>> {
    let rel = CString::new(format!("{pid}/{name}"))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: valid directory fd, NUL-terminated relative path, buffer of that length.
    let n = unsafe {
        libc::readlinkat(
            proc.as_raw_fd(),
            rel.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n >= buf.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf.truncate(n);
    Ok(buf)
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// capget(2) of thread `pid`: its effective capability set (in its own user namespace),
/// as one 64-bit mask. No file is opened (a Landlock domain does not restrict it).
pub fn effective_caps(pid: u32) -> io::Result<u64> {
    let pid = libc::c_int::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pid == 0 {
        // 0 would ask about the calling thread.
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    let mut hdr = CapHeader {
        version: CAP_VERSION_3,
        pid,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: a valid header and room for the two structs version 3 writes; checked.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

/// `PIDFD_THREAD` (= O_EXCL): the id may name any thread, not only a thread-group leader
/// (FUSE names the calling thread). Linux 6.9+.
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// pidfd_open(2) of a thread or process id: a handle that a later reuse of the id cannot
/// redirect.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: plain syscall with integer arguments; the result is checked.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, PIDFD_THREAD) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// `struct pidfd_info` (linux/pidfd.h, version 0: 64 bytes).
#[repr(C)]
#[derive(Default)]
struct PidfdInfo {
    mask: u64,
    cgroupid: u64,
    pid: u32,
    tgid: u32,
    ppid: u32,
    ruid: u32,
    rgid: u32,
    euid: u32,
    egid: u32,
    suid: u32,
    sgid: u32,
    fsuid: u32,
    fsgid: u32,
    exit_code: i32,
}

/// `PIDFD_GET_INFO` = _IOWR(0xFF, 11, struct pidfd_info).
const PIDFD_GET_INFO: libc::c_ulong = (3 << 30) | (64 << 16) | (0xFF << 8) | 11;
/// `PIDFD_INFO_PID`: pid, tgid, ppid and the ids are wanted.
const PIDFD_INFO_PID: u64 = 1;

/// The process's pid and parent's pid, in the daemon's pid namespace (ESRCH once it has
/// exited; ppid 0 for a process without a parent there). Linux 6.13+ (ENOTTY before).
pub fn pidfd_pids(pidfd: BorrowedFd<'_>) -> io::Result<(u32, u32)> {
    const _: () = assert!(std::mem::size_of::<PidfdInfo>() == 64);
    let mut info = PidfdInfo {
        mask: PIDFD_INFO_PID,
        ..PidfdInfo::default()
    };
    // SAFETY: valid pidfd and a pointer to a writable struct of the size encoded in the
    // request number; the result is checked.
    let r = unsafe {
        libc::ioctl(
            pidfd.as_raw_fd(),
            PIDFD_GET_INFO,
            &mut info as *mut PidfdInfo,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((info.pid, info.ppid))
}

/// `PID_FS_MAGIC` (linux/magic.h): pidfds are pidfs inodes (Linux 6.9+).
const PID_FS_MAGIC: i64 = 0x5049_4446;

/// A process's identity for this boot: the pidfs inode number of its pidfd, which is
/// never given to another process (unlike a pid, or a start time counted in clock ticks,
/// which a pid reused within the same tick shares). EOPNOTSUPP when pidfds are not pidfs
/// inodes (before Linux 6.9 every pidfd had the same anonymous inode).
pub fn pidfd_id(pidfd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: valid descriptor, pointer to a writable statfs; the result is checked.
    if unsafe { libc::fstatfs(pidfd.as_raw_fd(), fs.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatfs succeeded, so it filled the struct.
    let fs = unsafe { fs.assume_init() };
    // `f_type` is not i64 on every architecture.
    #[allow(clippy::unnecessary_cast)]
    let f_type = fs.f_type as i64;
    if f_type != PID_FS_MAGIC {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    Ok(super::fstat(pidfd)?.st_ino)
}
