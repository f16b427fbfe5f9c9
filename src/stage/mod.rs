//! Staging (`mount --stage DIR`, `fencefs stage …`): every change made through the mount
//! lands in the staging area DIR, SOURCE stays untouched until a person applies it.
//!
//! Job: validate and lock DIR ([`area`]), build the merged view the daemon serves
//! ([`engine`]), and read, diff, apply and discard the staged tree offline ([`changes`],
//! [`diff`], [`apply`], [`cli`]).
//!
//! The staged tree is kept in kernel overlayfs's upper-directory format, so standard tools
//! (and `mount -t overlay`) read it. This increment's engine is the kernel's own overlayfs,
//! mounted *detached* (`fsopen`/`fsmount`, never attached to any mount namespace): only
//! the daemon's descriptor reaches it, it disappears with the daemon (SIGKILL included),
//! and the host layer (`host::`) serves it exactly as it serves SOURCE without staging, so
//! the policy decides on the merged view with the same code, errnos and audit.
//!
//! Invariants:
//! - SOURCE is written only by `apply` (never by the mount), through directory handles
//!   without following symlinks, each file written beside its destination, synced, renamed.
//! - Nothing here deletes staged work except `discard` and `apply` of the paths asked for.
//! - One daemon (or one apply/discard) per DIR at a time (`DIR/lock`).

pub mod apply;
pub mod area;
pub mod changes;
pub mod cli;
pub mod control;
pub mod diff;
mod sys;
pub mod tree;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

pub use area::Area;

/// Set once this daemon serves a staged mount (before the FUSE session starts).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The FUSE stack depth to announce for passthrough: backing files of a staged mount live
/// on the overlay (depth 1), so they need 2 (and then nothing may stack on this mount);
/// otherwise 1.
pub fn stack_depth() -> u32 {
    if ACTIVE.load(Ordering::Relaxed) { 2 } else { 1 }
}

/// The merged view of `source` (its handle) with the staged tree of `area` on top: the
/// root handle of a detached overlay mount (lower SOURCE, upper `DIR/upper`). Redirects
/// are on, so a renamed directory keeps its children (no EXDEV for `mv dir`).
pub fn engine(area: &Area, source: &OwnedFd) -> Result<OwnedFd, String> {
    let fail = |what: &str, e: std::io::Error| {
        let hint = match e.raw_os_error() {
            Some(libc::EPERM) => " (kernel overlayfs needs CAP_SYS_ADMIN: run the daemon as root)",
            Some(libc::ENODEV) => " (no overlay file system in this kernel: modprobe overlay)",
            _ => "",
        };
        format!("stage '{}': {what}: {e}{hint}", area.dir.display())
    };
    let work = crate::host::sys::open_root(&area.work()).map_err(|e| fail("work", e))?;
    let fs = sys::fsopen("overlay").map_err(|e| fail("overlay", e))?;
    let fd_path = |fd: &OwnedFd| format!("/proc/self/fd/{}", fd.as_raw_fd());
    let opts = [
        ("lowerdir", fd_path(source)),
        ("upperdir", fd_path(&area.upper)),
        ("workdir", fd_path(&work)),
        ("redirect_dir", "on".to_string()),
        ("index", "off".to_string()),
        ("metacopy", "off".to_string()),
    ];
    for (k, v) in &opts {
        sys::fsconfig_str(std::os::fd::AsFd::as_fd(&fs), k, v)
            .map_err(|e| fail(&format!("overlay option {k}"), e))?;
    }
    sys::fsconfig_create(std::os::fd::AsFd::as_fd(&fs))
        .map_err(|e| fail("overlay (upper on a file system with trusted xattrs?)", e))?;
    sys::fsmount(std::os::fd::AsFd::as_fd(&fs)).map_err(|e| fail("overlay mount", e))
}

/// Opens, validates and locks `dir` for a mount of `src` at `mnt` (canonical), then builds
/// the merged view. The lock is held for the daemon's lifetime (its descriptor stays open
/// until the process exits, whatever way it exits).
pub fn start(dir: &Path, src: &Path, mnt: &Path, source: &OwnedFd) -> Result<OwnedFd, String> {
    let area = Area::create_or_open(dir, src, mnt)?;
    area.lock()?;
    area.match_root(source)?;
    cli::repair(&cli::layers(&area)?)?;
    let root = engine(&area, source)?;
    log::info!(
        "staging: every change lands in {} (SOURCE {} untouched until `fencefs stage apply`)",
        area.dir.display(),
        src.display()
    );
    ACTIVE.store(true, Ordering::Relaxed);
    // The lock lives exactly as long as the daemon.
    std::mem::forget(area);
    Ok(root)
}
