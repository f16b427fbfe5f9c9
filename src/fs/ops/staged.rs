//! Staged mounts: the base records of [`crate::stage::base`] taken around the requests
//! that change a non-directory, so `stage status`/`apply` know which SOURCE object each
//! staged entry was made from (a host edit is never silently overwritten).
//!
//! Each changing operation asks for a note before it touches the merged view and hands it
//! back after it succeeded; both are no-ops without staging. The note is taken inside the
//! request gate, so a checkpoint never falls between the two halves. A removal's record
//! known before it ([`Noted::whiteout_record`]) goes onto its whiteout as the union makes
//! it; only one not set there is handed back after.
//!
//! Invariants: never fails a request (a record that cannot be taken is logged by
//! `stage::base`); directories get no note.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::{Error, Res, Shared};
use crate::host::inode::{Peek, Peeked, Place, Up};
use crate::host::sys::Name;
use crate::host::union::Left;
use crate::stage::base::{self, Bases, Below, Pending, UpperDir};

/// A note taken before a change (nothing without staging).
pub type Note = Option<Noted>;

/// What [`Shared::noted`] records once the change went through, and the merged directory
/// its path is in. Dropped without being recorded (the change failed, or the kernel
/// repeats it on another node), what it was built on goes back as a read of the path
/// ([`Bases::unnoted`]): the next attempt is built on what this one was, so a host edit
/// meanwhile stays a conflict.
pub struct Noted {
    p: Option<Pending>,
    parent: u64,
    bases: Arc<Bases>,
}

impl Noted {
    /// The record a whiteout the change leaves carries, if known before the change (see
    /// [`Pending::whiteout_record`]).
    pub fn whiteout_record(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        self.p.as_ref()?.whiteout_record()
    }

    /// The same record for the entry a rename moved to `path` in directory `parent`.
    pub fn moved_to(&self, path: &[u8], parent: u64) -> Noted {
        Noted {
            p: self.p.as_ref().and_then(|p| p.moved_to(path)),
            parent,
            bases: self.bases.clone(),
        }
    }
}

impl Drop for Noted {
    fn drop(&mut self) {
        if let Some(p) = self.p.take() {
            self.bases.unnoted(p);
        }
    }
}

impl Shared {
    /// Before a change of the entry `name` in `pfd` (merged path `path`); `replaces`:
    /// another entry will stand at `path` after it (unlink, rename, create).
    pub(super) fn note_name(&self, path: &[u8], parent: u64, name: &Name, replaces: bool) -> Note {
        self.bases.as_ref()?;
        let (shown, upper_free) = match self.inodes.peek_name(parent, name) {
            Ok(Peeked::Shown(p)) => (Some(p), false),
            Ok(Peeked::Nothing { upper_free }) => (None, upper_free),
            Err(_) => (None, false),
        };
        self.note_seen(path, parent, replaces, shown.as_ref(), upper_free)
    }

    /// [`Shared::note_name`] before a new name is made, but none when the merged view's
    /// preparation of it found nothing in any layer (`fresh`): no whiteout's record to
    /// carry on, nothing shown to be built on — the record [`Bases::before`] would find
    /// is none, and the lookup is spared. (Prepared before the note: the preparation
    /// changes nothing but the parent's copy-up, which no record depends on.)
    pub(super) fn note_unless_fresh(
        &self,
        path: &[u8],
        parent: u64,
        name: &Name,
        fresh: bool,
    ) -> Note {
        if fresh {
            return None;
        }
        self.note_name(path, parent, name, true)
    }

    /// [`Shared::note_name`] of what the caller looked up itself (`shown`: `None` when
    /// nothing is there), so that the change can act on the same finding (a staged
    /// unlink: [`Inodes::remove_seen`](crate::host::inode::Inodes::remove_seen)).
    pub(super) fn note_peeked(
        &self,
        path: &[u8],
        parent: u64,
        replaces: bool,
        shown: Option<&Peek>,
    ) -> Note {
        self.note_seen(path, parent, replaces, shown, false)
    }

    /// [`Shared::note_peeked`]; `upper_free`: the lookup that found nothing shown saw
    /// nothing at all in the upper either (no whiteout whose record a new entry takes
    /// on), so the upper is not asked again.
    fn note_seen(
        &self,
        path: &[u8],
        parent: u64,
        replaces: bool,
        shown: Option<&Peek>,
        upper_free: bool,
    ) -> Note {
        let b = self.bases.as_ref()?;
        let shown_peek = shown;
        let shown = shown.map(|p| (&p.fd, p.st, p.place));
        // The merged view just showed the entry: in the upper it is the staged one (no
        // second lookup); below it, its layer says where its record is.
        // (An entry shown from below has nothing of the upper's over it.)
        let (at_entry, below) = match &shown {
            Some((fd, st, Place::Upper)) => (Some(UpperDir::Entry(fd, *st)), Below::Source),
            Some((fd, st, Place::Sealed)) => {
                (Some(UpperDir::Parent(None)), Below::Sealed(fd.as_fd(), *st))
            }
            Some((_, _, Place::Source)) => (Some(UpperDir::Parent(None)), Below::Source),
            None if upper_free => (Some(UpperDir::Parent(None)), Below::Unknown),
            _ => (None, Below::Unknown),
        };
        // The entry's identity: its birth time as the lookup learnt it, or asked now.
        let btime = shown_peek.and_then(|p| p.btime);
        let seen = || {
            shown.as_ref().and_then(|(fd, st, _)| match btime {
                Some(b) if !base::is_dir(st) => Some((st.st_ino, b)),
                _ => base::shown_st(fd, st),
            })
        };
        let p = match at_entry {
            Some(at) => b.before(path, seen, replaces, at, below)?,
            None => {
                let up = self.inodes.upper_part(parent);
                b.before(path, seen, replaces, upper_dir(&up), below)?
            }
        };
        Some(Noted {
            p: Some(p),
            parent,
            bases: b.clone(),
        })
    }

    /// A staged unlink of SOURCE's file at `path` (`name` in `parent`; the kernel's node
    /// for it: `known`) in one look under the merged view's lock
    /// ([`Inodes::remove_below`](crate::host::inode::Inodes::remove_below)), noted with
    /// what it hid — or, when the kernel's node for the name is another object (the host
    /// replaced the file after the agent looked it up), with that node's identity: the
    /// agent deleted what it saw, and the host's file there is a conflict for `apply`.
    /// Whether it was that case (else nothing was changed or noted).
    pub(super) fn remove_source_file(
        &self,
        path: &[u8],
        parent: u64,
        name: &Name,
        known: Option<u64>,
    ) -> Res<bool> {
        let Some(b) = self.bases.as_ref() else {
            return Ok(false);
        };
        let seen_as = known.and_then(|i| self.inodes.key(i));
        // Read before the look under the lock: a host edit while it looks counts.
        let t0 = base::record_time();
        let r = self.inodes.remove_below(parent, name, |st, btime| {
            let seen = match seen_as {
                Some((dev, ino)) if (dev, ino) != (st.st_dev, st.st_ino) => (ino, 0),
                _ => (st.st_ino, btime),
            };
            let note = b
                .before(
                    path,
                    || Some(seen),
                    true,
                    UpperDir::Parent(None),
                    Below::Source,
                )
                .map(|p| Noted {
                    p: Some(p.no_later_than(t0)),
                    parent,
                    bases: b.clone(),
                });
            let rec = note.as_ref().and_then(Noted::whiteout_record);
            (note, rec)
        })?;
        let Some((left, note)) = r else {
            return Ok(false);
        };
        self.noted_removal(note, left);
        Ok(true)
    }

    /// Before a change of node `ino` in place (a write open, setattr, xattrs, a link).
    pub(super) fn note_node(&self, ino: u64) -> Note {
        let b = self.bases.as_ref()?;
        // Directories get no note; nor does an entry staged already (made or copied up
        // through the mount): its record was taken then, and a change in place keeps it.
        if self.inodes.kind(ino).ok()? == libc::S_IFDIR
            || (self.inodes.union().is_some() && self.inodes.settled_file(ino))
        {
            return None;
        }
        // Its first name (a node unlinked meanwhile has none: nothing to record).
        let (parent, name) = self.inodes.alias(ino)?;
        let path = crate::host::path::join(&self.inodes.path(parent).ok()?, &name);
        let fd = self.inodes.fd(ino).ok()?;
        let up = self.inodes.upper_part(parent);
        // What it shows is asked only when it is not staged already.
        let shown = || base::shown_fd(&fd);
        let p = b.before(&path, shown, false, upper_dir(&up), Below::Unknown)?;
        Some(Noted {
            p: Some(p),
            parent,
            bases: b.clone(),
        })
    }

    /// An open for reading of node `ino`: what a later change of it may be built on, at
    /// each of its names (the names of a hard link are one node: a read through any of
    /// them is what a rewrite of any of them is built on).
    pub(super) fn note_read(&self, ino: u64) {
        let Some(b) = self.bases.as_ref() else {
            return;
        };
        let (Ok(paths), Ok(fd)) = (self.inodes.paths(ino), self.inodes.fd(ino)) else {
            return;
        };
        let shown = base::shown_fd(&fd);
        for path in paths {
            b.read(&path, shown);
        }
    }

    /// A note whose record is read now rather than at [`Shared::noted`] (see
    /// [`Pending::settle`]); `None` when there is nothing to record.
    pub(super) fn settled(&self, n: Note) -> Note {
        let mut n = n?;
        let p = n.p.take()?.settle()?;
        n.p = Some(p);
        Some(n)
    }

    /// After the change went through: records the note.
    pub(super) fn noted(&self, n: Note) {
        if let Some(mut n) = n
            && let Some(p) = n.p.take()
        {
            let up = self.inodes.upper_part(n.parent);
            n.bases.after(p, upper_dir(&up));
        }
    }

    /// After a change that went through and left nothing at the path (an unlink with no
    /// whiteout): there is nothing to record on, and nothing goes back as a read.
    pub(super) fn noted_nothing(&self, n: Note) {
        if let Some(mut n) = n {
            n.p = None;
        }
    }

    /// After a removal through the daemon's merged view (or the host's directory) that
    /// left `left` at the path: a whiteout made with its record (its label) needs nothing
    /// more, nor does a name the merged view left empty; anything else is recorded as
    /// [`Shared::noted`] does (a mount whose staging the kernel's overlayfs serves: its
    /// whiteout is found now).
    pub(super) fn noted_removal(&self, n: Note, left: Left) {
        match left {
            Left::Whiteout { labelled: true } => self.noted_nothing(n),
            Left::Nothing if self.inodes.union().is_some() => self.noted_nothing(n),
            _ => self.noted(n),
        }
    }

    /// The handle to change node `ino` through: on a staged mount served by the daemon,
    /// its upper copy (`host::inode::merged`). When the copy had to become a new node
    /// (files are open on this one), `note` is recorded on it now and the answer is
    /// ESTALE: the kernel looks the name up again and repeats the call on the copy.
    pub(super) fn for_change(&self, ino: u64, note: &mut Note) -> Res<Arc<OwnedFd>> {
        let busy = self.inodes.union().is_some() && self.handles.any_on(ino, |_| true);
        match self.inodes.up_node(ino, busy)? {
            Up::Moved => {
                self.noted(note.take());
                Err(Error(libc::ESTALE))
            }
            // (On an error, `note` is dropped by the caller unrecorded: it goes back as
            // a read, and the next attempt is built on what this one was.)
            Up::Here(fd) => Ok(fd),
        }
    }
}

/// Where the base records find the upper's entry: in the parent's upper part when the
/// daemon serves the merged view, else walked from the upper's root.
fn upper_dir(up: &Option<Option<Arc<OwnedFd>>>) -> UpperDir<'_> {
    match up {
        Some(d) => UpperDir::Parent(d.as_ref().map(|f| f.as_fd())),
        None => UpperDir::Walk,
    }
}
