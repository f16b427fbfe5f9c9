//! Per-caller budgets for what open handles hold in the daemon: descriptors and table
//! entries. One hostile uid must not be able to take what every other user needs, nor a
//! flood of opens in one root (`host/roots.rs`) what the other roots need.
//!
//! Invariants:
//! - A [`Slot`] is taken *before* the resource it stands for is acquired and released when
//!   the slot is dropped, so the count never lags behind what is really held.
//! - A uid never holds more than `per_uid` slots, and all uids together never more than
//!   `total`: past the first the caller gets EMFILE (its own limit, as for a process),
//!   past the second ENFILE (the daemon's table is full). Both are checked under one lock.
//! - Once the mount has several roots ([`Budget::split`]), one root holds at most three
//!   quarters of a uid's share (EMFILE past it) and of the pool (ENFILE): a flood in one
//!   root leaves a quarter of both to the others.
//! - No syscall and no allocation beyond the per-uid map happens under the lock.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// A bounded pool shared by every caller, with a fair share per uid.
pub struct Budget {
    what: &'static str,
    total: usize,
    per_uid: usize,
    /// The mount has several roots: each has its share (see the module's invariants).
    split: AtomicBool,
    used: Mutex<Used>,
}

/// Which root a unit is taken in: the root's host `(st_dev, st_ino)`, `(0, 0)` for SOURCE.
pub type RootId = (u64, u64);

#[derive(Default)]
struct Used {
    all: usize,
    by_uid: HashMap<u32, usize>,
    by_root: HashMap<RootId, usize>,
    by_uid_root: HashMap<(u32, RootId), usize>,
}

impl Used {
    /// Counts one unit; per root only on a split budget (`root` is `None` otherwise, so a
    /// mount with SOURCE alone pays no per-root bookkeeping).
    fn add(&mut self, uid: u32, root: Option<RootId>) {
        self.all += 1;
        *self.by_uid.entry(uid).or_insert(0) += 1;
        if let Some(root) = root {
            *self.by_root.entry(root).or_insert(0) += 1;
            *self.by_uid_root.entry((uid, root)).or_insert(0) += 1;
        }
    }

    fn sub(&mut self, uid: u32, root: Option<RootId>) {
        fn dec<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: K) {
            if let Some(n) = m.get_mut(&k) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&k);
                }
            }
        }
        self.all = self.all.saturating_sub(1);
        dec(&mut self.by_uid, uid);
        if let Some(root) = root {
            dec(&mut self.by_root, root);
            dec(&mut self.by_uid_root, (uid, root));
        }
    }
}

/// One unit of a [`Budget`] held by a uid in a root; given back on drop.
pub struct Slot {
    budget: Arc<Budget>,
    uid: u32,
    /// Counted in this root (`None`: the budget is not split).
    root: Option<RootId>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slot({} for uid {})", self.budget.what, self.uid)
    }
}

impl Budget {
    /// A pool of `total` units, at most `per_uid` of them for one uid (both at least 1).
    pub fn new(what: &'static str, total: usize, per_uid: usize) -> Arc<Budget> {
        let total = total.max(1);
        Arc::new(Budget {
            what,
            total,
            per_uid: per_uid.clamp(1, total),
            split: AtomicBool::new(false),
            used: Mutex::new(Used::default()),
        })
    }

    /// Gives each root its own share from now on (the mount has several roots).
    pub fn split(&self) {
        self.split.store(true, Ordering::Relaxed);
    }

    /// A root's part of `n` once split: three quarters (at least 1).
    fn root_share(n: usize) -> usize {
        (n - n / 4).max(1)
    }

    /// The root a unit is counted in: none unless the budget is split.
    fn counted_in(&self, root: RootId) -> Option<RootId> {
        self.split.load(Ordering::Relaxed).then_some(root)
    }

    /// Takes one unit for `uid` in `root`: EMFILE past the uid's share (or its root's
    /// part of it), ENFILE when the pool (or the root's part of it) is full.
    pub fn take(self: &Arc<Budget>, uid: u32, root: RootId) -> io::Result<Slot> {
        let root = self.counted_in(root);
        let mut u = self.used.lock();
        let mine = u.by_uid.get(&uid).copied().unwrap_or(0);
        let (mine_here, here) = root.map_or((0, 0), |r| {
            let mine_here = u.by_uid_root.get(&(uid, r)).copied().unwrap_or(0);
            (mine_here, u.by_root.get(&r).copied().unwrap_or(0))
        });
        let split = root.is_some();
        let errno =
            if mine >= self.per_uid || (split && mine_here >= Self::root_share(self.per_uid)) {
                Some(libc::EMFILE)
            } else if u.all >= self.total || (split && here >= Self::root_share(self.total)) {
                Some(libc::ENFILE)
            } else {
                None
            };
        if let Some(e) = errno {
            drop(u);
            log::debug!(
                "{} budget: uid {uid} refused ({}; uid holds {mine}, {mine_here} in this root, cap {}, pool {})",
                self.what,
                if e == libc::EMFILE {
                    "EMFILE"
                } else {
                    "ENFILE"
                },
                self.per_uid,
                self.total
            );
            return Err(io::Error::from_raw_os_error(e));
        }
        u.add(uid, root);
        Ok(Slot {
            budget: self.clone(),
            uid,
            root,
        })
    }

    /// Takes one unit for `uid` for something the daemon merely keeps to save work (a
    /// descriptor it could reopen): only while the uid holds less than half its share and
    /// the pool is less than half used, so what is kept never costs a caller an open.
    pub fn take_spare(self: &Arc<Budget>, uid: u32, root: RootId) -> Option<Slot> {
        let root = self.counted_in(root);
        let mut u = self.used.lock();
        let mine = u.by_uid.get(&uid).copied().unwrap_or(0);
        if (mine + 1) * 2 > self.per_uid || (u.all + 1) * 2 > self.total {
            return None;
        }
        u.add(uid, root);
        Some(Slot {
            budget: self.clone(),
            uid,
            root,
        })
    }

    /// Units held now: by everyone, and by `uid`.
    #[cfg(test)]
    fn used(&self, uid: u32) -> (usize, usize) {
        let u = self.used.lock();
        (u.all, u.by_uid.get(&uid).copied().unwrap_or(0))
    }

    /// The per-uid share.
    #[cfg(test)]
    fn per_uid(&self) -> usize {
        self.per_uid
    }

    /// The pool size.
    #[cfg(test)]
    fn total(&self) -> usize {
        self.total
    }
}

impl Slot {
    /// The uid this unit is counted for.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The root this unit was taken in (`(0, 0)`, SOURCE, when the budget is not split).
    pub fn root(&self) -> RootId {
        self.root.unwrap_or((0, 0))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.budget.used.lock().sub(self.uid, self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: RootId = (0, 0);

    fn errno(r: io::Result<Slot>) -> i32 {
        r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
    }

    #[test]
    fn one_uid_cannot_take_more_than_its_share() {
        let b = Budget::new("fd", 10, 4);
        let held: Vec<Slot> = (0..4).map(|_| b.take(1000, S).unwrap()).collect();
        assert_eq!(errno(b.take(1000, S)), libc::EMFILE);
        // Everyone else keeps working.
        let other = b.take(1001, S).unwrap();
        assert_eq!(b.used(1000), (5, 4));
        drop(held);
        assert_eq!(b.used(1000), (1, 0));
        drop(other);
        assert_eq!(b.used(1001), (0, 0));
        assert!(
            b.used.lock().by_uid.is_empty(),
            "no entry left for idle uids"
        );
    }

    #[test]
    fn the_pool_bounds_all_uids_together() {
        let b = Budget::new("fd", 5, 2);
        let mut held = Vec::new();
        for uid in 0..2 {
            held.push(b.take(uid, S).unwrap());
            held.push(b.take(uid, S).unwrap());
        }
        held.push(b.take(7, S).unwrap());
        assert_eq!(errno(b.take(8, S)), libc::ENFILE);
        assert_eq!(
            errno(b.take(0, S)),
            libc::EMFILE,
            "own share is checked first"
        );
        held.pop();
        assert!(b.take(8, S).is_ok());
    }

    #[test]
    fn spare_units_leave_half_of_every_share_for_real_opens() {
        let b = Budget::new("fd", 20, 8);
        let kept: Vec<Slot> = (0..4).map(|_| b.take_spare(1000, S).unwrap()).collect();
        assert!(b.take_spare(1000, S).is_none(), "half of uid 1000's share");
        assert_eq!(kept[0].uid(), 1000);
        // The rest of the share is still there for opens.
        let opens: Vec<Slot> = (0..4).map(|_| b.take(1000, S).unwrap()).collect();
        assert_eq!(errno(b.take(1000, S)), libc::EMFILE);
        drop(opens);
        // Half the pool: other uids' spares stop there too.
        let more: Vec<Slot> = (0..4).map(|_| b.take_spare(1001, S).unwrap()).collect();
        assert_eq!(b.used(1001), (8, 4));
        let tenth = (b.take_spare(1002, S), b.take_spare(1002, S));
        assert!(tenth.0.is_some() && tenth.1.is_some(), "pool at 10 of 20");
        assert!(b.take_spare(1003, S).is_none(), "pool half used");
        drop((kept, more, tenth));
    }

    #[test]
    fn shares_are_clamped_to_sane_values() {
        let b = Budget::new("fd", 0, 0);
        assert_eq!((b.total(), b.per_uid()), (1, 1));
        let b = Budget::new("fd", 3, 100);
        assert_eq!(b.per_uid(), 3);
    }

    #[test]
    fn an_unsplit_budget_counts_no_roots() {
        let b = Budget::new("fd", 4, 4);
        let held: Vec<Slot> = (0..4).map(|_| b.take(1000, (1, 2)).unwrap()).collect();
        assert_eq!(
            errno(b.take(1000, S)),
            libc::EMFILE,
            "one share for every root"
        );
        assert!(b.used.lock().by_root.is_empty() && b.used.lock().by_uid_root.is_empty());
        assert_eq!(held[0].root(), S);
    }

    #[test]
    fn a_flood_in_one_root_leaves_the_others_a_quarter() {
        let b = Budget::new("fd", 16, 8);
        b.split();
        let a: RootId = (1, 2);
        let flood: Vec<Slot> = (0..6).map(|_| b.take(1000, a).unwrap()).collect();
        assert_eq!(errno(b.take(1000, a)), libc::EMFILE, "3/4 of the uid's 8");
        let other: Vec<Slot> = (0..2).map(|_| b.take(1000, S).unwrap()).collect();
        assert_eq!(errno(b.take(1000, S)), libc::EMFILE, "the uid's share");
        // Many uids flooding one root: the pool keeps a quarter for the others.
        let more: Vec<Slot> = (0..6).map(|_| b.take(2000, a).unwrap()).collect();
        assert_eq!(
            errno(b.take(3000, a)),
            libc::ENFILE,
            "3/4 of the pool of 16 in a"
        );
        let source = b.take(3000, S).unwrap();
        assert_eq!(source.root(), S);
        drop((flood, other, more, source));
        let u = b.used.lock();
        assert!(u.by_root.is_empty() && u.by_uid_root.is_empty() && u.all == 0);
    }
}
