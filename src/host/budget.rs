//! Per-caller budgets for what open handles hold in the daemon: descriptors and table
//! entries. One hostile uid must not be able to take what every other user needs.
//!
//! Invariants:
//! - A [`Slot`] is taken *before* the resource it stands for is acquired and released when
//!   the slot is dropped, so the count never lags behind what is really held.
//! - A uid never holds more than `per_uid` slots, and all uids together never more than
//!   `total`: past the first the caller gets EMFILE (its own limit, as for a process),
//!   past the second ENFILE (the daemon's table is full). Both are checked under one lock.
//! - No syscall and no allocation beyond the per-uid map happens under the lock.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

/// A bounded pool shared by every caller, with a fair share per uid.
pub struct Budget {
    what: &'static str,
    total: usize,
    per_uid: usize,
    used: Mutex<Used>,
}

#[derive(Default)]
struct Used {
    all: usize,
    by_uid: HashMap<u32, usize>,
}

/// One unit of a [`Budget`] held by a uid; given back on drop.
pub struct Slot {
    budget: Arc<Budget>,
    uid: u32,
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
            used: Mutex::new(Used::default()),
        })
    }

    /// Takes one unit for `uid`: EMFILE past the uid's share, ENFILE when the pool is full.
    pub fn take(self: &Arc<Budget>, uid: u32) -> io::Result<Slot> {
        let mut u = self.used.lock();
        let mine = u.by_uid.get(&uid).copied().unwrap_or(0);
        let errno = if mine >= self.per_uid {
            Some(libc::EMFILE)
        } else if u.all >= self.total {
            Some(libc::ENFILE)
        } else {
            None
        };
        if let Some(e) = errno {
            drop(u);
            log::debug!(
                "{} budget: uid {uid} refused ({}; uid holds {mine}, cap {}, pool {})",
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
        u.all += 1;
        *u.by_uid.entry(uid).or_insert(0) += 1;
        Ok(Slot {
            budget: self.clone(),
            uid,
        })
    }

    /// Takes one unit for `uid` for something the daemon merely keeps to save work (a
    /// descriptor it could reopen): only while the uid holds less than half its share and
    /// the pool is less than half used, so what is kept never costs a caller an open.
    pub fn take_spare(self: &Arc<Budget>, uid: u32) -> Option<Slot> {
        let mut u = self.used.lock();
        let mine = u.by_uid.get(&uid).copied().unwrap_or(0);
        if (mine + 1) * 2 > self.per_uid || (u.all + 1) * 2 > self.total {
            return None;
        }
        u.all += 1;
        *u.by_uid.entry(uid).or_insert(0) += 1;
        Some(Slot {
            budget: self.clone(),
            uid,
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
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut u = self.budget.used.lock();
        u.all = u.all.saturating_sub(1);
        if let Some(n) = u.by_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                u.by_uid.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(r: io::Result<Slot>) -> i32 {
        r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
    }

    #[test]
    fn one_uid_cannot_take_more_than_its_share() {
        let b = Budget::new("fd", 10, 4);
        let held: Vec<Slot> = (0..4).map(|_| b.take(1000).unwrap()).collect();
        assert_eq!(errno(b.take(1000)), libc::EMFILE);
        // Everyone else keeps working.
        let other = b.take(1001).unwrap();
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
            held.push(b.take(uid).unwrap());
            held.push(b.take(uid).unwrap());
        }
        held.push(b.take(7).unwrap());
        assert_eq!(errno(b.take(8)), libc::ENFILE);
        assert_eq!(errno(b.take(0)), libc::EMFILE, "own share is checked first");
        held.pop();
        assert!(b.take(8).is_ok());
    }

    #[test]
    fn spare_units_leave_half_of_every_share_for_real_opens() {
        let b = Budget::new("fd", 20, 8);
        let kept: Vec<Slot> = (0..4).map(|_| b.take_spare(1000).unwrap()).collect();
        assert!(b.take_spare(1000).is_none(), "half of uid 1000's share");
        assert_eq!(kept[0].uid(), 1000);
        // The rest of the share is still there for opens.
        let opens: Vec<Slot> = (0..4).map(|_| b.take(1000).unwrap()).collect();
        assert_eq!(errno(b.take(1000)), libc::EMFILE);
        drop(opens);
        // Half the pool: other uids' spares stop there too.
        let more: Vec<Slot> = (0..4).map(|_| b.take_spare(1001).unwrap()).collect();
        assert_eq!(b.used(1001), (8, 4));
        let tenth = (b.take_spare(1002), b.take_spare(1002));
        assert!(tenth.0.is_some() && tenth.1.is_some(), "pool at 10 of 20");
        assert!(b.take_spare(1003).is_none(), "pool half used");
        drop((kept, more, tenth));
    }

    #[test]
    fn shares_are_clamped_to_sane_values() {
        let b = Budget::new("fd", 0, 0);
        assert_eq!((b.total(), b.per_uid()), (1, 1));
        let b = Budget::new("fd", 3, 100);
        assert_eq!(b.per_uid(), 3);
    }
}
