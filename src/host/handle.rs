//! Open file and directory handles: the rights granted at open live here, server-side,
//! never in the `fh` bits the kernel hands back.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

/// One entry of a directory listing as the caller may see it.
#[derive(Debug, Clone)]
pub struct ListEntry {
    /// FUSE id to report as `d_ino`.
    pub ino: u64,
    /// `S_IFMT` bits.
    pub kind: u32,
    /// Raw name.
    pub name: Vec<u8>,
}

/// An open file or directory.
pub struct Handle {
    /// The node it was opened on.
    pub ino: u64,
    /// The open host file (a real fd, not `O_PATH`).
    pub file: OwnedFd,
    /// Reads allowed through this handle.
    pub read: bool,
    /// Writes allowed through this handle.
    pub write: bool,
    /// Opened to execute the file (FMODE_EXEC): the file is "text busy" while it is open.
    pub exec: bool,
    /// For directories: the listing read by the first readdir or a rewind (`None` until
    /// then).
    pub entries: Option<Mutex<Option<Arc<Vec<ListEntry>>>>>,
}

/// Handle table: `fh` → handle.
#[derive(Default)]
pub struct Handles {
    map: RwLock<HashMap<u64, Arc<Handle>>>,
    next: AtomicU64,
}

impl Handles {
    /// Registers a handle; returns its `fh`.
    pub fn insert(&self, h: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.map.write().insert(fh, Arc::new(h));
        fh
    }
    /// The handle for `fh`, if open.
    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.map.read().get(&fh).cloned()
    }
    /// Closes `fh` (the host fd closes when the last user drops it).
    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        self.map.write().remove(&fh)
    }
    /// Whether some open handle on node `ino` satisfies `pred`.
    pub fn any_on(&self, ino: u64, pred: impl Fn(&Handle) -> bool) -> bool {
        self.map.read().values().any(|h| h.ino == ino && pred(h))
    }

    /// Whether some open handle executes node `ino` (truncating it must fail ETXTBSY).
    pub fn executing(&self, ino: u64) -> bool {
        self.any_on(ino, |h| h.exec)
    }
}
