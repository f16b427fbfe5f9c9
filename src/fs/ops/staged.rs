//! Staged mounts: the base records of [`crate::stage::base`] taken around the requests
//! that change a non-directory, so `stage status`/`apply` know which SOURCE object each
//! staged entry was made from (a host edit is never silently overwritten).
//!
//! Each changing operation asks for a note before it touches the merged view and hands it
//! back after it succeeded; both are no-ops without staging. The note is taken inside the
//! request gate, so a checkpoint never falls between the two halves.
//!
//! Invariants: never fails a request (a record that cannot be taken is logged by
//! `stage::base`); directories get no note.

use std::os::fd::{AsFd, OwnedFd};

use super::Shared;
use crate::host::sys::Name;
use crate::stage::base::{self, Pending};

/// A note taken before a change (nothing without staging).
pub type Note = Option<Pending>;

impl Shared {
    /// Before a change of the entry `name` in `pfd` (merged path `path`); `replaces`:
    /// another entry will stand at `path` after it (unlink, rename, create).
    pub(super) fn note_name(
        &self,
        path: &[u8],
        pfd: &OwnedFd,
        name: &Name,
        replaces: bool,
    ) -> Note {
        let b = self.bases.as_ref()?;
        b.before(path, base::shown(pfd.as_fd(), name), replaces)
    }

    /// Before a change of node `ino` in place (a write open, setattr, xattrs, a link).
    pub(super) fn note_node(&self, ino: u64) -> Note {
        let b = self.bases.as_ref()?;
        let path = self.inodes.paths(ino).ok()?.into_iter().next()?;
        let fd = self.inodes.fd(ino).ok()?;
        b.before(&path, base::shown_fd(&fd), false)
    }

    /// An open for reading of node `ino`: what a later change of it may be built on.
    pub(super) fn note_read(&self, ino: u64) {
        let Some(b) = self.bases.as_ref() else {
            return;
        };
        let (Ok(paths), Ok(fd)) = (self.inodes.paths(ino), self.inodes.fd(ino)) else {
            return;
        };
        if let Some(path) = paths.into_iter().next() {
            b.read(&path, base::shown_fd(&fd));
        }
    }

    /// After the change went through: records the note.
    pub(super) fn noted(&self, n: Note) {
        if let (Some(b), Some(p)) = (self.bases.as_ref(), n) {
            b.after(p);
        }
    }
}
