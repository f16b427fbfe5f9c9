//! Open file and directory handles: the rights granted at open live here, server-side,
//! never in the `fh` bits the kernel hands back.
//!
//! Invariants: every handle holds a [`Slot`] of the per-uid handle budget, and one of the
//! descriptor budget exactly while it holds a host fd (a kernel-passthrough file holds
//! none: the kernel keeps the backing file). Operations that need an fd of a handle that
//! holds none reopen the node for the call ([`HandleFd::Temp`]); `fsync` keeps what it
//! reopened ([`Handle::kept`]) while a spare unit of the descriptor budget can be had.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};

use super::budget::{Budget, RootId, Slot};

/// One entry of a directory listing as the caller may see it.
#[derive(Debug, Clone)]
pub struct ListEntry {
    /// FUSE id to report as `d_ino`.
    pub ino: u64,
    /// `S_IFMT` bits.
    pub kind: u32,
    /// Raw name.
    pub name: Vec<u8>,
    /// Whether the daemon holds a node for it (the kernel looked it up and has not
    /// forgotten it): no reader needs a LOOKUP of it (`fs/plus.rs`).
    pub known: bool,
}

/// An open file or directory.
pub struct Handle {
    /// The node it was opened on.
    pub ino: u64,
    /// The open host file (a real fd, not `O_PATH`); `None` once the kernel holds it as a
    /// passthrough backing file, and for a directory (listed through [`Handle::node`]).
    pub file: Option<OwnedFd>,
    /// For a directory: the node's `O_PATH` handle as OPENDIR found it (it holds the
    /// handle's descriptor unit). The directory is opened for reading only when a listing
    /// is read (the first READDIR, a rewind), and closed after it: a reader the kernel
    /// answers from its cached listing (a warm `git status`, `find`) costs no open.
    pub node: Option<Arc<OwnedFd>>,
    /// The caller that opened it (uid, gid, as the policy sees them). With `--revoke`, I/O
    /// the kernel does on its own (writeback of a shared map: no caller, uid 0) is
    /// re-decided for it.
    pub opener: (u32, u32),
    /// Reads allowed through this handle.
    pub read: bool,
    /// Writes allowed through this handle.
    pub write: bool,
    /// Opened to execute the file (FMODE_EXEC): the file is "text busy" while it is open.
    pub exec: bool,
    /// Made by this handle's CREATE under a grant without `write` (`create`): until this
    /// handle is released, the opener may keep writing the file (reopen, truncate, chmod
    /// it); afterwards it is a pre-existing file like any other. The state lives only
    /// here, so it is bounded by the handle budget and gone after a daemon restart.
    pub fresh: bool,
    /// Granted `append` but not `write`: every write must carry O_APPEND (and the host
    /// file is open with O_APPEND, so it lands at the end whatever the offset).
    pub append_only: bool,
    /// For directories: the listing read by the first readdir or a rewind (`None` until
    /// then).
    pub entries: Option<Mutex<Option<Arc<Vec<ListEntry>>>>>,
    /// The budget units this handle holds (the table entry; the fd while `file` is set).
    pub slots: Slots,
    /// The view it was opened in (set by [`Handles::insert`]: the number of views
    /// replaced before, see [`Handles::next_view`]; always 0 without staging): a live
    /// change pins the passthrough handles of the view it replaces (see
    /// [`Handle::pin`]).
    pub view: u64,
    /// A handle without its own descriptor (kernel passthrough): the node reopened by its
    /// first `fsync` and kept, with a spare unit of the descriptor budget, so that the
    /// next ones (SQLite: one per commit) need no reopen. Empty while the budget is short.
    pub kept: OnceLock<Kept>,
    /// A passthrough handle held open across a view swap: an `O_PATH` descriptor of its
    /// file in the view it was opened in, taken by the swap (with a spare unit of the
    /// descriptor budget). The calls the daemon makes for the handle (fsync,
    /// copy_file_range, fallocate, lseek) reopen it, not the node, which is re-found in
    /// the new view or may name another file there.
    pub pin: OnceLock<Kept>,
}

/// A descriptor a handle keeps for `fsync`, and the budget unit it is counted in.
pub struct Kept {
    /// The reopened node.
    pub fd: OwnedFd,
    _slot: Slot,
}

/// The budget units one handle holds.
#[derive(Debug)]
pub struct Slots {
    /// Its entry in the handle table.
    pub entry: Slot,
    /// Its host descriptor, if it holds one.
    pub fd: Option<Slot>,
}

/// A descriptor to do I/O on: the handle's own, or one opened for this call.
pub enum HandleFd<'a> {
    /// The handle's fd.
    Held(&'a OwnedFd),
    /// Reopened for this call; closed when dropped.
    Temp(OwnedFd),
}

impl AsFd for HandleFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            HandleFd::Held(f) => f.as_fd(),
            HandleFd::Temp(f) => f.as_fd(),
        }
    }
}

/// Handle table: `fh` → handle, with the budgets its entries and descriptors come from.
pub struct Handles {
    map: RwLock<HashMap<u64, Arc<Handle>>>,
    next: AtomicU64,
    /// The view new handles are opened in ([`Handle::view`]).
    view: AtomicU64,
    /// Open handles with [`Handle::fresh`]: while zero, no node is "created here".
    fresh: AtomicU64,
    /// Host descriptors held by handles.
    pub fds: Arc<Budget>,
    /// Handle table entries (memory), also of handles that hold no fd.
    pub entries: Arc<Budget>,
}

impl Handles {
    /// A table whose handles may hold `fds` descriptors (`fds_per_uid` for one uid) and
    /// `entries` entries (`entries_per_uid`).
    pub fn new(fds: usize, fds_per_uid: usize, entries: usize, entries_per_uid: usize) -> Handles {
        Handles {
            map: RwLock::new(HashMap::new()),
            next: AtomicU64::new(0),
            view: AtomicU64::new(0),
            fresh: AtomicU64::new(0),
            fds: Budget::new("descriptor", fds, fds_per_uid),
            entries: Budget::new("handle", entries, entries_per_uid),
        }
    }

    /// Takes the budget for a new handle of `uid` in `root` that will hold a host fd:
    /// EMFILE past the uid's share, ENFILE when the daemon's pool is full (each with the
    /// root's part of it once [`Handles::split`]).
    pub fn reserve(&self, uid: u32, root: RootId) -> io::Result<Slots> {
        let entry = self.entries.take(uid, root)?;
        let fd = self.fds.take(uid, root)?;
        Ok(Slots {
            entry,
            fd: Some(fd),
        })
    }

    /// Gives each root its own share of both budgets (the mount has several roots).
    pub fn split(&self) {
        self.fds.split();
        self.entries.split();
    }

    /// Registers a handle; returns its `fh`.
    pub fn insert(&self, mut h: Handle) -> u64 {
        h.view = self.view.load(Ordering::Relaxed);
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        if h.fresh {
            self.fresh.fetch_add(1, Ordering::Relaxed);
        }
        self.map.write().insert(fh, Arc::new(h));
        fh
    }
    /// The view served was replaced (no request in flight: the request gate is closed);
    /// returns the number of the one replaced.
    pub fn next_view(&self) -> u64 {
        self.view.fetch_add(1, Ordering::Relaxed)
    }
    /// The view new handles are opened in now.
    pub fn view_now(&self) -> u64 {
        self.view.load(Ordering::Relaxed)
    }
    /// The open handles that may write: `(fh, node, view)`.
    pub fn writers(&self) -> Vec<(u64, u64, u64)> {
        self.map
            .read()
            .iter()
            .filter(|(_, h)| h.write)
            .map(|(&fh, h)| (fh, h.ino, h.view))
            .collect()
    }
    /// The open passthrough handles (holding no descriptor) opened in `view` and not
    /// pinned yet (see [`Handle::pin`]).
    pub fn unpinned_in(&self, view: u64) -> Vec<Arc<Handle>> {
        self.map
            .read()
            .values()
            .filter(|h| {
                h.view == view && h.file.is_none() && h.node.is_none() && h.pin.get().is_none()
            })
            .cloned()
            .collect()
    }
    /// The handle for `fh`, if open.
    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.map.read().get(&fh).cloned()
    }
    /// Closes `fh` (the host fd closes when the last user drops it).
    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        let h = self.map.write().remove(&fh);
        if h.as_ref().is_some_and(|h| h.fresh) {
            self.fresh.fetch_sub(1, Ordering::Relaxed);
        }
        h
    }

    /// Whether `uid` created node `ino` through the mount under a `create` grant and the
    /// creating handle is still open (see [`Handle::fresh`]). Free while no such handle
    /// exists anywhere; otherwise one pass over the table.
    pub fn fresh_for(&self, ino: u64, uid: u32) -> bool {
        self.fresh.load(Ordering::Relaxed) != 0
            && self.any_on(ino, |h| h.fresh && h.opener.0 == uid)
    }
    /// Closes every handle: the connection that opened them is gone (a VM disconnected).
    /// Returns how many there were; their descriptors close as their last users finish.
    pub fn clear(&self) -> usize {
        let all = std::mem::take(&mut *self.map.write());
        all.len()
    }
    /// Whether some open handle on node `ino` satisfies `pred`.
    pub fn any_on(&self, ino: u64, pred: impl Fn(&Handle) -> bool) -> bool {
        self.map.read().values().any(|h| h.ino == ino && pred(h))
    }

    /// The distinct openers (uid, gid) of the open handles on node `ino` that satisfy
    /// `pred`.
    pub fn openers_on(&self, ino: u64, pred: impl Fn(&Handle) -> bool) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .map
            .read()
            .values()
            .filter(|h| h.ino == ino && pred(h))
            .map(|h| h.opener)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Whether some open handle executes node `ino` (truncating it must fail ETXTBSY).
    pub fn executing(&self, ino: u64) -> bool {
        self.any_on(ino, |h| h.exec)
    }
}

impl Handle {
    /// Pins the handle to `fd` (see [`Handle::pin`]) if a spare unit of `fds` can be had;
    /// `false` otherwise (its calls then reopen the node, as before any swap).
    pub fn pin_to(&self, fds: &Arc<Budget>, fd: OwnedFd) -> bool {
        let Some(slot) = fds.take_spare(self.slots.entry.uid(), self.slots.entry.root()) else {
            return false;
        };
        let _ = self.pin.set(Kept { fd, _slot: slot });
        true
    }

    /// The handle's own descriptor, if it holds one.
    pub fn file_fd(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(|f| f.as_fd())
    }

    /// A descriptor to sync: the handle's own, the one it keeps, or — the first time, or
    /// while the owner's descriptor budget has no spare unit — `reopen()`, kept when a
    /// spare unit of `fds` can be had for the handle's uid.
    pub fn sync_fd(
        &self,
        fds: &Arc<Budget>,
        reopen: impl FnOnce() -> io::Result<OwnedFd>,
    ) -> io::Result<HandleFd<'_>> {
        if let Some(f) = &self.file {
            return Ok(HandleFd::Held(f));
        }
        if let Some(k) = self.kept.get() {
            return Ok(HandleFd::Held(&k.fd));
        }
        let fd = reopen()?;
        let Some(slot) = fds.take_spare(self.slots.entry.uid(), self.slots.entry.root()) else {
            return Ok(HandleFd::Temp(fd));
        };
        // A concurrent fsync may have kept one first: then this one closes with its unit.
        let k = self.kept.get_or_init(|| Kept { fd, _slot: slot });
        Ok(HandleFd::Held(&k.fd))
    }
}
