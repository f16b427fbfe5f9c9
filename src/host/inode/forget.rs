//! A node's end of life: the kernel's FORGETs (one, or all of a connection's when a VM
//! disconnects), removing nodes nothing names any more with their cached handles, and
//! giving memory back after a big walk.
//!
//! Invariants: a node goes only when the kernel holds no lookup on it and no child names
//! it as parent; removal walks up to parents that became removable (iteratively, no
//! recursion); handles are closed after the table's and the handle cache's locks are
//! released: closing the last descriptor of an unlinked file is where the host file
//! system frees it (ext4: its blocks, a journal transaction), tens of µs during which a
//! request needing any node's handle would otherwise wait on the lock.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::{Inodes, ROOT, Table};
use crate::host::sys;

/// What removing nodes let go of: their ids (their cached handles go too) and the handles
/// they pinned, closed by [`Inodes::drop_fds`] once no lock is held.
#[derive(Default)]
pub(super) struct Gone {
    inos: Vec<u64>,
    fds: Vec<Arc<OwnedFd>>,
}

impl Gone {
    pub(super) fn is_empty(&self) -> bool {
        self.inos.is_empty() && self.fds.is_empty()
    }

    /// A handle to close after the locks are released.
    pub(super) fn close_later(&mut self, fd: Option<Arc<OwnedFd>>) {
        self.fds.extend(fd);
    }
}

impl Inodes {
    /// Drops the removed nodes' cached handles, then closes what they held, unlocked.
    pub(super) fn drop_fds(&self, mut gone: Gone) {
        if gone.inos.is_empty() {
            return;
        }
        {
            let mut f = self.fds.lock();
            for &r in &gone.inos {
                gone.fds.extend(f.remove(r));
            }
        }
        drop(gone);
    }

    /// The kernel dropped `n` lookups.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let removed = {
            let mut t = self.table.lock();
            let Some(node) = t.nodes.get_mut(&ino) else {
                return;
            };
            node.nlookup = node.nlookup.saturating_sub(n);
            let mut removed = Gone::default();
            maybe_remove(&mut t, ino, &mut removed);
            removed
        };
        let any = !removed.is_empty();
        self.drop_fds(removed);
        if any {
            self.shrink();
        }
    }

    /// The connection ended (a VM disconnected): every lookup it held is forgotten, as if
    /// it had sent the FORGETs; the nodes go with their cached handles. Returns how many.
    pub fn forget_all(&self) -> usize {
        let removed = {
            let mut t = self.table.lock();
            let held: Vec<u64> = t.nodes.keys().copied().filter(|&i| i != ROOT).collect();
            let mut removed = Gone::default();
            for ino in held {
                if let Some(n) = t.nodes.get_mut(&ino) {
                    n.nlookup = 0;
                }
                maybe_remove(&mut t, ino, &mut removed);
            }
            removed
        };
        let n = removed.inos.len();
        self.drop_fds(removed);
        self.shrink();
        n
    }

    /// Gives memory back after the kernel forgot most of what a big walk made it learn:
    /// maps that fell below a quarter of their capacity are shrunk (rare: afterwards the
    /// capacity matches the size), and the allocator returns the freed pages.
    pub(super) fn shrink(&self) {
        const MIN: usize = 4096;
        let shrunk = {
            let mut t = self.table.lock();
            if t.nodes.capacity() > MIN && t.nodes.len() * 4 < t.nodes.capacity() {
                t.nodes.shrink_to_fit();
                t.by_key.shrink_to_fit();
                t.by_name.shrink_to_fit();
                t.by_handle.shrink_to_fit();
                true
            } else {
                false
            }
        };
        let shrunk = {
            let mut f = self.fds.lock();
            if f.map.capacity() > MIN && f.map.len() * 4 < f.map.capacity() {
                f.map.shrink_to_fit();
                f.order.shrink_to_fit();
                true
            } else {
                shrunk
            }
        };
        if shrunk {
            sys::trim_heap();
        }
    }
}

pub(super) fn maybe_remove(t: &mut Table, ino: u64, removed: &mut Gone) {
    // No allocation unless a removed node names parents to look at (a forgotten
    // unlinked file names none).
    let mut next = Some(ino);
    let mut stack: Vec<u64> = Vec::new();
    while let Some(ino) = next.take().or_else(|| stack.pop()) {
        if ino == ROOT {
            continue;
        }
        let gone = match t.nodes.get(&ino) {
            Some(n) => n.nlookup == 0 && n.children == 0,
            None => false,
        };
        if !gone {
            continue;
        }
        if let Some(n) = t.nodes.remove(&ino) {
            if t.by_key.get(&n.key) == Some(&ino) {
                t.by_key.remove(&n.key);
            }
            if let Some(h) = &n.handle
                && t.by_handle.get(h) == Some(&ino)
            {
                t.by_handle.remove(h);
            }
            removed.inos.push(ino);
            removed.fds.extend(n.pinned);
            for (p, name) in n.aliases {
                let k = (p, name);
                if t.by_name.get(&k) == Some(&ino) {
                    t.by_name.remove(&k);
                }
                if let Some(pn) = t.nodes.get_mut(&p) {
                    pn.children = pn.children.saturating_sub(1);
                }
                stack.push(p);
            }
        }
    }
}
