//! The daemon's own confinement: `no_new_privs` and a Landlock domain for the threads that
//! serve FUSE requests, so that even a bug in path handling cannot touch the host outside
//! SOURCE.
//!
//! Applied by the main thread right before it starts the FUSE workers (which inherit it).
//! The signal thread (reload, unmount), the notify thread and the audit writer are started
//! before and stay outside the domain: they need the policy file, the audit file, and
//! umount(2), which a Landlock domain forbids.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use crate::host::sys;

const PR_SET_NO_NEW_PRIVS: libc::c_int = 38;
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;

// Filesystem access rights by ABI version.
const FS_V1: u64 = (1 << 13) - 1; // EXECUTE .. MAKE_SYM
const FS_REFER: u64 = 1 << 13; // v2
const FS_TRUNCATE: u64 = 1 << 14; // v3
const FS_IOCTL_DEV: u64 = 1 << 15; // v5
const FS_READ_FILE: u64 = 1 << 2;
const FS_WRITE_FILE: u64 = 1 << 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// What was applied, for the log.
pub struct Applied {
    /// Landlock ABI version in force, if any.
    pub landlock_abi: Option<i64>,
    /// Why Landlock is not in force.
    pub landlock_error: Option<String>,
    /// `PR_SET_NO_NEW_PRIVS` set.
    pub no_new_privs: bool,
}

fn abi_version() -> io::Result<i64> {
    // SAFETY: the documented version query: null attr, size 0, VERSION flag.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

fn handled_for(abi: i64) -> u64 {
    let mut r = FS_V1;
    if abi >= 2 {
        r |= FS_REFER;
    }
    if abi >= 3 {
        r |= FS_TRUNCATE;
    }
    if abi >= 5 {
        r |= FS_IOCTL_DEV;
    }
    r
}

fn add_rule(ruleset: &OwnedFd, path_fd: BorrowedFd<'_>, access: u64) -> io::Result<()> {
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: path_fd.as_raw_fd(),
    };
    // SAFETY: valid ruleset fd, rule type PATH_BENEATH with a pointer to a packed attr.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A staged mount's share of the confinement.
#[derive(Clone, Copy)]
pub enum Stage<'a> {
    /// Not staged.
    No,
    /// The daemon serves it (`host::union`): SOURCE is read only, DIR is written.
    Daemon {
        /// SOURCE.
        source: BorrowedFd<'a>,
        /// DIR.
        dir: BorrowedFd<'a>,
    },
}

/// Reading, listing and executing: what a lower layer needs.
const FS_READ_ONLY: u64 = 1 | FS_READ_FILE | (1 << 3);

fn landlock(source: BorrowedFd<'_>, roots: &[BorrowedFd<'_>], stage: Stage<'_>) -> io::Result<i64> {
    let abi = abi_version()?;
    let handled = handled_for(abi);
    let attr = RulesetAttr {
        handled_access_fs: handled,
    };
    // SAFETY: pointer to a valid attr of the given size; the result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor.
    let ruleset = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    // SOURCE: everything (staged by the daemon: see below). /dev/fuse: read and write
    // (fuser opens a clone per worker).
    if !matches!(stage, Stage::Daemon { .. }) {
        add_rule(&ruleset, source, handled)?;
    }
    // Every other root directory: everything. (A root that is a file is a sealed memory
    // file, which Landlock does not restrict: it lives on no user-visible mount.)
    for &root in roots {
        if sys::fstat(root)?.st_mode & libc::S_IFMT == libc::S_IFDIR {
            add_rule(&ruleset, root, handled)?;
        }
    }
    // A staged mount's DIR: what the base records need (stage/base.rs): reading the
    // checkpoint log (which layers are live), and a private whiteout (a 0/0 character
    // device made and renamed over overlayfs's shared one in the same directory).
    match stage {
        Stage::No => {}
        Stage::Daemon { source, dir } => {
            // A change through the mount can only ever reach DIR: SOURCE is read here.
            add_rule(&ruleset, source, FS_READ_ONLY & handled)?;
            add_rule(&ruleset, dir, handled)?;
        }
    }
    // No /dev/fuse (a pod serving a handed-over descriptor): no clone is opened either.
    match sys::open_path_abs(Path::new("/dev/fuse")) {
        Ok(dev) => {
            let ioctl = if abi >= 5 { FS_IOCTL_DEV } else { 0 };
            add_rule(&ruleset, dev.as_fd(), FS_READ_FILE | FS_WRITE_FILE | ioctl)?;
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(e),
    }
    // SAFETY: restricts the calling thread (and threads it creates) to the ruleset.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(abi)
}

/// Confines the calling thread and every thread it creates afterwards to the directory
/// behind `source` (the handle opened before mounting: with the mount over SOURCE, the
/// path now leads to the mount itself), the other roots' handles and `/dev/fuse`.
/// A staged mount's DIR (`stage`) gets only the rights a private whiteout needs.
pub fn confine(source: BorrowedFd<'_>, roots: &[BorrowedFd<'_>], stage: Stage<'_>) -> Applied {
    // SAFETY: prctl with constant arguments.
    let nnp = unsafe { libc::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == 0;
    match landlock(source, roots, stage) {
        Ok(abi) => Applied {
            landlock_abi: Some(abi),
            landlock_error: None,
            no_new_privs: nnp,
        },
        Err(e) => Applied {
            landlock_abi: None,
            landlock_error: Some(e.to_string()),
            no_new_privs: nnp,
        },
    }
}
