//! What the kernel caches on the daemon's word, and how the daemon takes it back.
//!
//! Workers never talk to the kernel's notification channel themselves (an invalidation
//! waits for the directory lock, which the kernel holds while the worker's own request is
//! in flight): they queue an [`Inval`] for the notify thread.
//!
//! Hidden names are answered like absent ones, as negative entries the kernel may cache, so
//! that repeated lookups cost the same and time reveals nothing. Unlike a name absent on the
//! host, a reload can make a hidden name visible, so every hidden negative entry handed out
//! is remembered here (a bounded FIFO) until a reload takes them all back. Invariant: every
//! hidden negative entry the kernel may still hold is in the set, or an invalidation for it
//! has been queued (eviction queues one).

use std::collections::{HashSet, VecDeque};
use std::sync::OnceLock;
use std::sync::mpsc::Sender;
use std::time::Instant;

use parking_lot::Mutex;

/// Names and inodes whose kernel cache entries must go.
#[derive(Default)]
pub struct Inval {
    /// `(parent, name)` entries.
    pub entries: Vec<(u64, Vec<u8>)>,
    /// `(inode, offset)`: -1 drops attributes, 0 also cached pages.
    pub inodes: Vec<(u64, i64)>,
    /// Invalidate every name and inode known (a reload, a lost host event).
    pub everything: bool,
    /// Also drop cached file pages when invalidating everything (--revoke).
    pub drop_pages: bool,
    /// Set for reloads: the time is logged.
    pub started: Option<Instant>,
}

/// Hidden names given out as cacheable negative entries, at most this many at once.
const HIDDEN_CAP: usize = 65_536;

type EntryKey = (u64, Box<[u8]>);

#[derive(Default)]
struct Hidden {
    set: HashSet<EntryKey>,
    order: VecDeque<EntryKey>,
}

/// The daemon's side of the kernel's caches.
#[derive(Default)]
pub struct KernelCache {
    tx: OnceLock<Sender<Inval>>,
    hidden: Mutex<Hidden>,
}

impl KernelCache {
    /// Connects the notify thread's queue (once, at mount).
    pub fn connect(&self, tx: Sender<Inval>) {
        let _ = self.tx.set(tx);
    }

    /// Queues invalidations for the notify thread; never blocks. `false` when nobody
    /// listens (not mounted yet, or shutting down).
    pub fn send(&self, inval: Inval) -> bool {
        self.tx.get().is_some_and(|tx| tx.send(inval).is_ok())
    }

    /// Records that `parent/name`, hidden by the policy, was answered as a cacheable
    /// negative entry. `false`: it cannot be taken back (no notify thread), so the caller
    /// must not let the kernel cache it.
    pub fn hidden_negative(&self, parent: u64, name: &[u8]) -> bool {
        if self.tx.get().is_none() {
            return false;
        }
        let key: EntryKey = (parent, name.into());
        let evicted = {
            let mut h = self.hidden.lock();
            if !h.set.insert(key.clone()) {
                return true;
            }
            h.order.push_back(key);
            let mut evicted = Vec::new();
            while h.set.len() > HIDDEN_CAP {
                match h.order.pop_front() {
                    Some(old) => {
                        h.set.remove(&old);
                        evicted.push((old.0, old.1.into_vec()));
                    }
                    None => break,
                }
            }
            evicted
        };
        if !evicted.is_empty() {
            // Taken out of the set: the kernel must forget them now.
            self.send(Inval {
                entries: evicted,
                ..Inval::default()
            });
        }
        true
    }

    /// Every hidden negative entry handed out since the last call (a reload takes them
    /// all back).
    pub fn take_hidden(&self) -> Vec<(u64, Vec<u8>)> {
        let mut h = self.hidden.lock();
        h.set.clear();
        let order = std::mem::take(&mut h.order);
        order.into_iter().map(|(p, n)| (p, n.into_vec())).collect()
    }

    /// How many hidden negative entries the kernel may hold now.
    #[cfg(test)]
    fn hidden_len(&self) -> usize {
        self.hidden.lock().set.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn hidden_names_are_only_cached_when_they_can_be_taken_back() {
        let k = KernelCache::default();
        assert!(!k.hidden_negative(1, b"secret"), "no notify thread yet");
        let (tx, rx) = channel();
        k.connect(tx);
        assert!(k.hidden_negative(1, b"secret"));
        assert!(k.hidden_negative(1, b"secret"), "recorded once");
        assert_eq!(k.hidden_len(), 1);
        assert_eq!(k.take_hidden(), vec![(1, b"secret".to_vec())]);
        assert_eq!(k.hidden_len(), 0);
        assert!(rx.try_recv().is_err(), "nothing evicted");
    }

    #[test]
    fn the_set_is_bounded_and_evictions_are_invalidated() {
        let k = KernelCache::default();
        let (tx, rx) = channel();
        k.connect(tx);
        for i in 0..(HIDDEN_CAP as u64 + 3) {
            assert!(k.hidden_negative(7, &i.to_ne_bytes()));
        }
        assert_eq!(k.hidden_len(), HIDDEN_CAP);
        let evicted: Vec<(u64, Vec<u8>)> = rx.try_iter().flat_map(|i| i.entries).collect();
        let want: Vec<(u64, Vec<u8>)> = (0..3u64).map(|i| (7, i.to_ne_bytes().to_vec())).collect();
        assert_eq!(evicted, want, "the oldest go, and the kernel is told");
    }
}
