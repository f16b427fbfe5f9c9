//! Staging (`mount --stage DIR`, `fencefs stage …`): every change made through the mount
//! lands in the staging area DIR, SOURCE stays untouched until a person applies it.
//!
//! Job: validate and lock DIR ([`area`]), build the merged view the daemon serves
//! ([`engine`], [`view`], [`tree_mount`]), keep checkpoints as sealed layers ([`layers`],
//! flattened by `flatten`), stand in for the character devices 0/0 overlayfs cannot hold
//! ([`standin`]), and read, diff, apply and discard the staged tree ([`changes`],
//! [`diff`], [`apply`], [`cli`], live through [`control`]).
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
//! - Nothing here deletes staged work except `discard`, `apply` of the paths asked for, and
//!   `rewind` (the layers above its checkpoint).
//! - One daemon (or one offline apply/discard/checkpoint/rewind) per DIR at a time
//!   (`DIR/lock`); a running daemon changes DIR only with its requests quiesced.

pub mod absent;
pub mod apply;
pub mod area;
pub mod base;
pub mod changes;
pub mod cli;
pub mod control;
mod copy;
pub mod diff;
mod discard;
mod flatten;
mod guard;
pub mod ids;
mod intent;
pub mod layers;
mod remove;
mod render;
pub mod seal;
mod space;
pub mod standin;
mod sys;
pub mod tree;
pub mod tree_mount;
pub mod view;

use std::os::fd::OwnedFd;
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

pub use view::engine;

/// Opens, validates and locks `dir` for a mount of `src` at `mnt` (canonical), then builds
/// the merged view. The lock is held for the daemon's lifetime (its descriptor stays open
/// until the process exits, whatever way it exits).
pub fn start(dir: &Path, src: &Path, mnt: &Path, source: &OwnedFd) -> Result<OwnedFd, String> {
    let area = Area::create_or_open(dir, src, mnt)?;
    area.lock()?;
    let area = recover(area)?;
    area.match_root(source)?;
    let l = cli::layers(&area)?;
    cli::repair(&l)?;
    if let Some(what) = intent::recover(&area.dir, &l)? {
        log::warn!("stage '{}': {what}", area.dir.display());
    }
    drop(l);
    // What a killed background removal left in DIR/trash (the mount need not wait).
    layers::empty_trash_later(&area.dir, true);
    let (root, _gen) = tree_mount::attach(engine(&area, source)?)?;
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

/// Finishes what a crash interrupted (a checkpoint, rewind or squash: see [`layers`]) and
/// drops scratch trees; returns the area reopened (its `upper` may have been replaced).
pub fn recover(area: Area) -> Result<Area, String> {
    view::clear_scratch(&area)?;
    match layers::recover(&area.dir)? {
        Some(what) => {
            log::warn!(
                "stage '{}': {what} (interrupted before)",
                area.dir.display()
            );
            area.reopen()
        }
        None => Ok(area),
    }
}
