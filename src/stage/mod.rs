//! Staging (`mount --stage DIR`, `fencefs stage …`): every change made through the mount
//! lands in the staging area DIR, SOURCE stays untouched until a person applies it.
//!
//! Job: validate and lock DIR ([`area`]), open the layers of the merged view the daemon
//! serves (`host::union`, started by [`session`]), resolve the view at a checkpoint
//! ([`lower`], [`view`]), keep checkpoints as sealed layers ([`layers`],
//! flattened by `flatten`), stand in for the character devices 0/0 overlayfs cannot hold
//! ([`standin`]), and read, diff, apply and discard the staged tree ([`changes`],
//! [`diff`], [`apply`]). [`session`] is the engine's entry (the daemon's `start`, the
//! apply and discard the front-ends run); the two front-ends are [`cli`]
//! (`fencefs stage`) and [`control`] (the control socket), and `render` makes the text
//! both show. No engine file imports a front-end.
//!
//! The staged tree is kept in kernel overlayfs's upper-directory format, so standard tools
//! (and `mount -t overlay`) read it; no kernel overlay is mounted at run time: the daemon
//! serves the merged view itself (`host::union`) and the stage tools resolve the view at
//! a checkpoint in user space ([`lower`]), so none of it needs root. The policy decides on
//! the merged view with the same code, errnos and audit as without staging.
//!
//! Invariants:
//! - SOURCE is written only by `apply` (never by the mount), through directory handles
//!   without following symlinks, each file written beside its destination, synced, renamed.
//! - Nothing here deletes staged work except `discard`, `apply` of the paths asked for, and
//!   `rewind` (the layers above its checkpoint).
//! - One daemon (or one offline apply/discard/checkpoint/rewind) per DIR at a time
//!   (`DIR/lock`); a running daemon changes DIR only with its requests quiesced.

pub mod absent;
pub mod agent;
pub mod apply;
pub mod area;
pub mod base;
pub mod changes;
pub mod cli;
pub mod control;
mod copy;
mod cycles;
#[cfg(test)]
mod deep_tests;
pub mod diff;
mod discard;
pub mod error;
pub mod feedback;
mod flatten;
mod guard;
mod held;
pub mod hunks;
pub mod ids;
mod intent;
pub mod layers;
pub mod lower;
mod moved_in;
mod moves;
pub mod partial;
pub mod record;
mod remove;
mod render;
pub mod request;
pub mod seal;
pub mod session;
mod space;
pub mod standin;
mod sys;
pub mod tree;
pub mod view;
mod walk;

use std::sync::atomic::{AtomicBool, Ordering};

pub use area::Area;
pub use error::StageError;

/// SOURCE as the daemon opened it before mounting (set once, by a staged daemon).
static SOURCE: std::sync::OnceLock<std::os::fd::OwnedFd> = std::sync::OnceLock::new();

/// Records SOURCE's descriptor, opened before the mount: `fencefs run` mounts the fence
/// over SOURCE's own path, where opening SOURCE by path would reach this daemon's own
/// mount (the merged view, and a deadlock while a live change holds its requests).
pub fn set_source(fd: &std::os::fd::OwnedFd) {
    if let Ok(d) = fd.try_clone() {
        let _ = SOURCE.set(d);
    }
}

/// SOURCE of `area`: the descriptor [`set_source`] recorded in a daemon, else opened by
/// path (the CLI's `--dir`).
pub fn open_source(area: &Area) -> Result<std::os::fd::OwnedFd, StageError> {
    match SOURCE.get() {
        Some(fd) => fd.try_clone(),
        None => crate::host::sys::open_root(&area.source),
    }
    .map_err(StageError::op(format!(
        "source '{}'",
        area.source.display()
    )))
}
pub use session::{recover, start_union};

/// Set once this daemon serves a staged mount (before the FUSE session starts).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The FUSE stack depth to announce for passthrough: 2 on a staged mount (as when a
/// kernel overlay held its backing files; the daemon's own merged view needs only 1, but
/// the stand-ins of `standin.rs` key on it, and nothing is gained by letting another
/// stack on this mount), otherwise 1.
pub fn stack_depth() -> u32 {
    if ACTIVE.load(Ordering::Relaxed) { 2 } else { 1 }
}

/// This daemon serves a staged mount now ([`session::start_union`], before the FUSE session).
fn set_active() {
    ACTIVE.store(true, Ordering::Relaxed);
}
