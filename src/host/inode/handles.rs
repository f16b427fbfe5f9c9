//! The kernel file handles that host change events (fanotify, `watch.rs`) name directories
//! by: each known directory's handle on the host, so an event's parent handle finds the
//! node whose kernel caches to take back.
//!
//! Without staging a directory's handle is that of the file the node is (SOURCE's, or
//! another root's). With staging the nodes are the merged view's (upper or layer files), whose
//! handles no host event carries: a directory's handle is then that of SOURCE's directory
//! at the same path, reached from SOURCE's root one `O_PATH|O_NOFOLLOW` step per
//! component (never following a symlink), so a host edit of an unstaged path reaches the
//! merged view's node at once.
//!
//! Invariants: recording a handle never fails a request (a directory without one is only
//! not watched: its caches expire with the TTL); the table's lock is not held during the
//! syscalls. A directory the merged view has where SOURCE has none (made or renamed
//! through the mount) has no handle; its staged entries hide SOURCE's anyway.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use super::{Inodes, ROOT};
use crate::host::sys::{self, Name};

/// The deepest path walked in SOURCE for a handle (deeper directories are not watched).
const MAX_WALK: usize = 512;

impl Inodes {
    /// With staging: SOURCE itself (the merged view's lower layer), whose directories'
    /// handles host change events carry. Set before the mount.
    pub fn set_event_source(&mut self, source: OwnedFd) {
        self.event_source = Some(source);
    }

    /// Starts recording directories' kernel file handles (host change events name them).
    pub fn watch_handles(&self) {
        self.watch_handles.store(true, Ordering::Relaxed);
        let h = match &self.event_source {
            Some(src) => sys::file_handle(src.as_fd()),
            None => sys::file_handle(self.root_fd().as_fd()),
        };
        if let Ok(h) = h {
            self.record_handle(ROOT, h);
        }
    }

    pub fn watching(&self) -> bool {
        self.watch_handles.load(Ordering::Relaxed)
    }

    /// Records the handle of directory node `ino`, just found as `parent/name`.
    pub(super) fn record_dir(&self, ino: u64, parent: u64, name: &Name) {
        let h = match self.root_at(parent, name.bytes()) {
            Some(root) => sys::file_handle(root.as_fd()),
            None => match &self.event_source {
                // The daemon's merged view: the SOURCE directory it merges (a renamed
                // one's is found by its redirect, not at the merged path).
                Some(_) if self.union().is_some() => self.merged_source_handle(ino),
                Some(src) => self.source_handle(src, ino),
                None => self
                    .fd(parent)
                    .and_then(|pfd| sys::file_handle_at(pfd.as_fd(), name)),
            },
        };
        if let Ok(h) = h {
            self.record_handle(ino, h);
        }
    }

    /// The handle of SOURCE's directory at node `ino`'s path.
    fn source_handle(&self, src: &OwnedFd, ino: u64) -> std::io::Result<Vec<u8>> {
        let path = self.path(ino)?;
        let parts: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
        if parts.len() > MAX_WALK {
            return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
        }
        let (last, dirs) = parts.split_last().expect("split yields one part at least");
        let mut cur: Option<OwnedFd> = None;
        for p in dirs {
            let at = cur.as_ref().map_or(src.as_fd(), |f| f.as_fd());
            cur = Some(sys::open_path(at, &Name::new(p)?)?);
        }
        let at = cur.as_ref().map_or(src.as_fd(), |f| f.as_fd());
        sys::file_handle_at(at, &Name::new(last)?)
    }

    fn record_handle(&self, ino: u64, h: Vec<u8>) {
        let mut t = self.table.lock();
        let h: Box<[u8]> = h.into();
        if let Some(n) = t.nodes.get_mut(&ino) {
            if n.handle.as_deref() == Some(&*h) {
                return;
            }
            if let Some(old) = n.handle.replace(h.clone())
                && t.by_handle.get(&old) == Some(&ino)
            {
                t.by_handle.remove(&old);
            }
            t.by_handle.insert(h, ino);
        }
    }

    /// The directory node with this kernel file handle, if known.
    pub fn by_handle(&self, h: &[u8]) -> Option<u64> {
        self.table.lock().by_handle.get(h).copied()
    }
}
