//! The private mount tree the daemon serves its merged views from: a small detached tmpfs
//! (reachable only through the daemon's descriptor) on which each overlay the daemon
//! builds — at startup, and after every live checkpoint, rewind, apply or discard — is
//! attached as `gN`. The workers' Landlock rule is on this tree's root, so it covers every
//! later overlay too (a rule on one overlay's root would not cover the next one).
//!
//! Invariants: one tree per daemon, made before the workers are confined; a replaced view
//! is detached (its mount point removed: the mount goes with its last descriptor, so a
//! process holding a file of it open keeps it); the tree holds directories only.

use super::StageError;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::sys;
use crate::host::sys::Name;

struct Tree {
    root: OwnedFd,
    next: Mutex<u64>,
}

static TREE: OnceLock<Tree> = OnceLock::new();

/// Views attached now (the one served and the retired ones still held).
static ATTACHED: AtomicUsize = AtomicUsize::new(0);

/// How many views are attached now (`stage_views` in the control socket's `status`).
pub fn attached() -> usize {
    ATTACHED.load(Ordering::Relaxed)
}

fn tree() -> Result<&'static Tree, StageError> {
    if let Some(t) = TREE.get() {
        return Ok(t);
    }
    let fs = sys::fsopen("tmpfs").map_err(StageError::op("stage mount tree"))?;
    for (k, v) in [("mode", "0700"), ("size", "1m"), ("nr_inodes", "1024")] {
        sys::fsconfig_str(fs.as_fd(), k, v)
            .map_err(StageError::op(format!("stage mount tree: {k}")))?;
    }
    sys::fsconfig_create(fs.as_fd()).map_err(StageError::op("stage mount tree"))?;
    let root = sys::fsmount(fs.as_fd()).map_err(StageError::op("stage mount tree"))?;
    let _ = TREE.set(Tree {
        root,
        next: Mutex::new(0),
    });
    Ok(TREE.get().expect("just set"))
}

fn name(g: u64) -> Name {
    Name::new(format!("g{g}").as_bytes()).expect("a valid name")
}

/// Attaches the detached overlay `view` to the tree; returns its root handle (`O_PATH`)
/// and its generation (for [`detach`]).
pub fn attach(view: OwnedFd) -> Result<(OwnedFd, u64), StageError> {
    let t = tree()?;
    let mut next = t.next.lock();
    let g = *next;
    let n = name(g);
    crate::host::sys::mkdirat(t.root.as_fd(), &n, 0o700)
        .map_err(StageError::op("stage mount tree: mkdir"))?;
    if let Err(e) = sys::move_mount(view.as_fd(), t.root.as_fd(), &n) {
        let _ = crate::host::sys::unlinkat(t.root.as_fd(), &n, libc::AT_REMOVEDIR);
        return Err(StageError::op("stage mount tree: attaching the overlay")(e));
    }
    let root = crate::host::sys::open_path(t.root.as_fd(), &n)
        .map_err(StageError::op("stage mount tree"))?;
    *next = g + 1;
    ATTACHED.fetch_add(1, Ordering::Relaxed);
    Ok((root, g))
}

/// Detaches view `g` (removing its mount point takes the mount off the tree).
pub fn detach(g: u64) {
    let Some(t) = TREE.get() else {
        return;
    };
    match crate::host::sys::unlinkat(t.root.as_fd(), &name(g), libc::AT_REMOVEDIR) {
        Ok(()) => {
            ATTACHED.fetch_sub(1, Ordering::Relaxed);
        }
        Err(e) => log::warn!("stage: detaching view g{g}: {e}"),
    }
}

/// The tree's root, for the workers' Landlock rule (`None` without staging).
pub fn root() -> Option<BorrowedFd<'static>> {
    TREE.get().map(|t| t.root.as_fd())
}
