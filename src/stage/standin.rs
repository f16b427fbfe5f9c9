//! A character device 0/0 on a staged mount. Kernel overlayfs uses exactly that node as its
//! whiteout, so it refuses to create one (EPERM) and hides one in any layer, SOURCE
//! included. A caller's `mknod c 0 0` is therefore stored in the upper as a **stand-in**:
//! a character device with the reserved number [`STAND_IN`] (major 0, which no driver
//! registers, so opening it fails ENXIO exactly as opening 0/0 does), labelled
//! `trusted.fencefs.dev = "0:0"` for a person reading DIR. The daemon reports it as 0/0
//! ([`reported_rdev`], from the one place attributes are made), `status`/`apply` read it
//! as 0/0 ([`rdev`]), and `apply` makes a real 0/0 device in SOURCE.
//!
//! Invariants: the number decides, the label only explains (a crash between the `mknod`
//! and the label leaves a stand-in all the same); a caller cannot make a stand-in
//! itself (`mknod` of [`STAND_IN`] through a staged mount is EPERM, the errno overlayfs
//! gives for 0/0), so in DIR the number is unambiguous; nothing changes on an unstaged
//! mount.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use crate::host::sys::{self, Name};

/// The reserved device number of a stand-in: major 0, minor 0x3ffff (the largest minor
/// every local file system stores, XFS's 18 bits included).
pub const STAND_IN: u64 = crate::host::union::STAND_IN;

/// The label's name and value.
pub const LABEL: &[u8] = b"trusted.fencefs.dev";
const LABEL_VALUE: &[u8] = b"0:0";

/// Whether `st` is a stand-in (a character device with the reserved number).
pub fn is_stand_in(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == STAND_IN
}

/// The device number a staged tree's entry stands for (0 for a stand-in).
pub fn rdev(st: &libc::stat) -> u64 {
    if is_stand_in(st) { 0 } else { st.st_rdev }
}

/// The device number the mount reports for `st` (0 for a stand-in on a staged mount).
pub fn reported_rdev(st: &libc::stat) -> u64 {
    if super::stack_depth() == 2 {
        rdev(st)
    } else {
        st.st_rdev
    }
}

/// `mknodat` as the mount makes nodes: on a staged mount a character device 0/0 becomes a
/// stand-in and one with the reserved number is refused (EPERM); otherwise unchanged.
pub fn mknodat(dir: BorrowedFd<'_>, name: &Name, mode: u32, rdev: u64) -> io::Result<()> {
    if super::stack_depth() != 2 || mode & libc::S_IFMT != libc::S_IFCHR {
        return sys::mknodat(dir, name, mode, rdev);
    }
    match rdev {
        STAND_IN => Err(io::Error::from_raw_os_error(libc::EPERM)),
        0 => {
            sys::mknodat(dir, name, mode, STAND_IN)?;
            label(dir, name);
            Ok(())
        }
        _ => sys::mknodat(dir, name, mode, rdev),
    }
}

/// Labels the stand-in `dir/name` (best effort: the number is what counts).
fn label(dir: BorrowedFd<'_>, name: &Name) {
    let r = sys::open_path(dir, name)
        .and_then(|fd| sys::setxattr_fd(fd.as_fd(), LABEL, LABEL_VALUE, 0));
    if let Err(e) = r {
        log::debug!("stage: labelling a 0/0 stand-in: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_in_is_major_0_minor_0x3ffff() {
        assert_eq!(libc::major(STAND_IN), 0);
        assert_eq!(libc::minor(STAND_IN), 0x3ffff);
        assert_eq!(STAND_IN, libc::makedev(0, 0x3ffff));
    }

    #[test]
    fn a_stand_in_reads_as_0_0_and_nothing_else_changes() {
        let mut st: libc::stat = some_stat();
        st.st_mode = libc::S_IFCHR | 0o644;
        st.st_rdev = STAND_IN;
        assert!(is_stand_in(&st));
        assert_eq!(rdev(&st), 0);
        st.st_rdev = libc::makedev(1, 3);
        assert_eq!(rdev(&st), libc::makedev(1, 3));
        st.st_mode = libc::S_IFBLK | 0o644;
        st.st_rdev = STAND_IN;
        assert!(!is_stand_in(&st));
        assert_eq!(rdev(&st), STAND_IN);
    }

    /// A real `stat` (of /proc/self/stat) whose fields the test then overwrites: no
    /// zeroing by hand outside the syscall modules.
    fn some_stat() -> libc::stat {
        let f = std::fs::File::open("/proc/self/stat").expect("open");
        crate::host::sys::fstat(f.as_fd()).expect("fstat")
    }
}
