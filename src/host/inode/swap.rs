//! Replacing the view the table serves (a staged mount's live checkpoint, rewind, apply
//! or discard): the root handle changes and every node becomes *loose* — re-found at its
//! path in the new view the next time it is needed — except the files open now, which
//! stay with the view they were opened in.
//!
//! Invariants: the table's lock is never held while calling out (`keep`); a loose node
//! settles on the first file of its kind found at one of its names.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Inodes, Key, ROOT, Table};
use crate::host::sys;

impl Inodes {
    /// Serves `u` (a new merged view of a staged mount, the daemon's own union) from now
    /// on. Every node but those `keep` names (files open now: they keep their
    /// descriptors) is marked loose: re-found at its path in the new view when next
    /// needed. Cached `O_PATH` handles are dropped; directories' file handles for host
    /// change events are SOURCE's and stay; node ids stay those of SOURCE's device.
    /// O(nodes known), no syscall under the table's lock but one `fstat`. Returns the
    /// names (parent, name) of the nodes kept: the kernel must look them up again to reach
    /// the new view.
    pub fn swap_union(
        &self,
        u: Arc<crate::host::union::Union>,
        keep: &dyn Fn(u64, u32) -> bool,
    ) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let root = sys::reopen(self.proc_fd.as_fd(), u.upper_root().as_fd(), libc::O_PATH)?;
        let st = sys::fstat(root.as_fd())?;
        // `keep` may take other locks: asked outside the table's.
        let known: Vec<(u64, u32)> = {
            let t = self.table.lock();
            t.nodes.iter().map(|(&id, n)| (id, n.kind)).collect()
        };
        let kept: std::collections::HashSet<u64> = known
            .into_iter()
            .filter(|&(id, k)| id != ROOT && keep(id, k))
            .map(|(id, _)| id)
            .collect();
        let mut names = Vec::new();
        {
            let mut t = self.table.lock();
            let t = &mut *t;
            let mut by_key = HashMap::with_capacity(t.by_key.len());
            for (&id, n) in t.nodes.iter_mut() {
                // Nothing is known to be the new view's upper object yet: a kept file's
                // inode may now be a sealed layer's (a checkpoint stays sealed).
                n.settled = false;
                if id == ROOT {
                    n.key = (st.st_dev, st.st_ino);
                } else if !kept.contains(&id) {
                    n.loose = true;
                    n.pinned = None;
                } else {
                    // Stays with the old view: never found by a new lookup.
                    names.extend(n.aliases.iter().map(|(p, nm)| (*p, nm.to_vec())));
                    continue;
                }
                by_key.insert(n.key, id);
            }
            t.by_key = by_key;
            self.swapped.store(true, Ordering::Relaxed);
            *self.root_fd.lock() = Arc::new(root);
            *self.union.write() = Some(u);
            self.stacks.clear();
        }
        let mut f = self.fds.lock();
        f.map.clear();
        f.order.clear();
        Ok(names)
    }

    /// A loose node was found again as the file `key`.
    pub(super) fn settle(&self, ino: u64, key: Key) {
        settle_in(&mut self.table.lock(), ino, key);
    }

    /// Node `ino` is an upper object now (its copy-up is done): see [`Inodes::may_copy_up`].
    pub(super) fn mark_settled(&self, ino: u64) {
        if let Some(n) = self.table.lock().nodes.get_mut(&ino) {
            n.settled = true;
        }
    }
}

pub(super) fn settle_in(t: &mut Table, ino: u64, key: Key) {
    let Some(n) = t.nodes.get_mut(&ino) else {
        return;
    };
    let old = n.key;
    n.key = key;
    n.loose = false;
    if t.by_key.get(&old) == Some(&ino) {
        t.by_key.remove(&old);
    }
    t.by_key.insert(key, ino);
}
