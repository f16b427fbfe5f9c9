//! Whether a READDIRPLUS batch carries attributes.
//!
//! The kernel's adaptive READDIRPLUS asks for attributes on the first batch of every
//! directory it lists. Sending them costs the daemon a `fstatat` and a policy decision per
//! entry and the kernel a dentry and an inode each; a reader that never looks at them
//! (`find`, a build tool's walk, `git status`'s untracked-file scan) pays for nothing.
//! A READDIRPLUS entry with node id 0 is a plain directory entry to the kernel (no
//! attributes, no dentry, no lookup count), so this module decides per batch, from what
//! readers did with the names listed before:
//!
//! - names sent without attributes are counted, per directory (`plain`), and a LOOKUP of
//!   a name in such a directory counts as "looked up" — names of nodes the kernel holds
//!   already (looked up before, not forgotten) are not counted: no reader looks them up,
//!   and a tree listed again after it was made through the mount (`rm -rf` after an
//!   untar) would otherwise talk the estimate out of attributes for the next tree;
//! - attributes are sent when at least half the names sent plain were looked up since
//!   (`ls -l`, `find -ls`: the reader stats what it lists), over a window that halves
//!   past [`WINDOW`] names, so the estimate follows the workload;
//! - while attributes are sent, one directory in [`PROBE`] is listed plain anyway, or a
//!   reader that stopped stat'ing would never be seen — but never one of the last
//!   [`RECENT`] directories listed with attributes: the kernel holds entries for their
//!   names already, so a plain listing of them again (`rm -rf` lists each directory twice)
//!   would count names no reader needs to look up, and talk the estimate out of attributes.
//!
//! It starts plain: a cold walk sends no attributes, the first `ls -l` of a directory
//! costs its first batch's names a LOOKUP each, and the next directories get attributes.
//!
//! Invariants: this only chooses between two answers the kernel treats alike for
//! correctness (an entry with attributes is also a lookup, counted as the kernel counts
//! it; one without leaves the kernel to LOOKUP the name when it needs it, decided then
//! as any lookup); the per-directory table is bounded ([`MAX_DIRS`]): a hostile caller
//! listing many directories only loses the estimate's precision.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;

/// Past this many names sent plain, both counts are halved.
pub const WINDOW: u32 = 4096;
/// While attributes are sent, every `PROBE`-th listing is sent plain.
pub const PROBE: u64 = 8;
/// How many directories listed with attributes a probe leaves out.
pub const RECENT: usize = 64;
/// Directories whose names sent plain are tracked at most; when full, the table starts
/// over (the lookups of the dropped directories are not counted).
pub const MAX_DIRS: usize = 4096;

/// The estimate: how many of the names sent plain readers looked up.
#[derive(Default)]
pub struct PlusAdvisor {
    /// Names sent plain still not looked up, by directory node.
    plain: Mutex<HashMap<u64, u32>>,
    /// Whether `plain` holds anything (a LOOKUP then takes its lock).
    tracking: AtomicBool,
    /// Names sent plain (in the window).
    sent: AtomicU32,
    /// Of them, names looked up (in the window).
    looked: AtomicU32,
    /// Listings of directories not in `recent` while attributes were wanted (for the
    /// probe).
    listings: AtomicU64,
    /// The last [`RECENT`] directories listed with attributes, oldest first.
    recent: Mutex<std::collections::VecDeque<u64>>,
}

impl PlusAdvisor {
    /// Whether the first batch of a listing of directory `dir` should carry attributes.
    /// Called once per READDIRPLUS at offset 0.
    pub fn attrs_wanted(&self, dir: u64) -> bool {
        let sent = self.sent.load(Ordering::Relaxed);
        let looked = self.looked.load(Ordering::Relaxed);
        if sent == 0 || looked * 2 < sent {
            return false;
        }
        // Attributes wanted: probe now and then whether they still are (never on a
        // directory just listed with them).
        let mut r = self.recent.lock();
        if r.contains(&dir) {
            return true;
        }
        if self.listings.fetch_add(1, Ordering::Relaxed) % PROBE == PROBE - 1 {
            return false;
        }
        if r.len() >= RECENT {
            r.pop_front();
        }
        r.push_back(dir);
        true
    }

    /// `n` names of directory `dir` went out without attributes. A listing of a directory
    /// whose names went out plain before and are not looked up yet counts only the names
    /// beyond those (`rm -rf` lists each directory twice before it removes a name: its
    /// names are not twice as many names unread).
    pub fn sent_plain(&self, dir: u64, n: u32) {
        if n == 0 {
            return;
        }
        let n = {
            let mut p = self.plain.lock();
            if p.len() >= MAX_DIRS && !p.contains_key(&dir) {
                p.clear();
            }
            let left = p.entry(dir).or_insert(0);
            let new = n.saturating_sub(*left);
            *left = (*left).max(n);
            self.tracking.store(true, Ordering::Relaxed);
            new
        };
        if n == 0 {
            return;
        }
        let sent = self.sent.fetch_add(n, Ordering::Relaxed) + n;
        if sent > WINDOW {
            // Halve both (a racing update is lost, which only blurs the estimate).
            self.sent.store(sent / 2, Ordering::Relaxed);
            let looked = self.looked.load(Ordering::Relaxed);
            self.looked.store(looked / 2, Ordering::Relaxed);
        }
    }

    /// The kernel looked up a name in directory `parent`.
    pub fn looked_up(&self, parent: u64) {
        if !self.tracking.load(Ordering::Relaxed) {
            return;
        }
        let mut p = self.plain.lock();
        if let Some(left) = p.get_mut(&parent) {
            *left -= 1;
            if *left == 0 {
                p.remove(&parent);
            }
            self.looked.fetch_add(1, Ordering::Relaxed);
        }
        if p.is_empty() {
            self.tracking.store(false, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_plain_and_follows_the_readers() {
        let a = PlusAdvisor::default();
        assert!(!a.attrs_wanted(7), "a cold walk sends no attributes");
        // A walk that never stats: stays plain.
        for d in 0..100 {
            a.sent_plain(d, 30);
        }
        assert!(!a.attrs_wanted(7));
        // `ls -l`: every name listed is looked up; attributes come back.
        for d in 1000..1100 {
            a.sent_plain(d, 30);
            for _ in 0..30 {
                a.looked_up(d);
            }
        }
        let wanted = (0..PROBE).filter(|i| a.attrs_wanted(5000 + i)).count() as u64;
        assert_eq!(wanted, PROBE - 1, "one listing in {PROBE} probes plain");
    }

    #[test]
    fn a_directory_listed_again_before_its_names_are_looked_up_counts_once() {
        let a = PlusAdvisor::default();
        // `rm -rf`: each directory listed twice, then every name in it looked up once.
        for d in 0..20 {
            a.sent_plain(d, 25);
            a.sent_plain(d, 25);
            for _ in 0..25 {
                a.looked_up(d);
            }
        }
        assert!(
            a.attrs_wanted(7),
            "a reader that looks up every name gets attributes"
        );
        // Listed again after some of its names were looked up: only the rest count anew.
        let b = PlusAdvisor::default();
        b.sent_plain(1, 10);
        for _ in 0..4 {
            b.looked_up(1);
        }
        b.sent_plain(1, 10);
        assert_eq!(b.sent.load(Ordering::Relaxed), 14);
        assert_eq!(*b.plain.lock().get(&1).unwrap(), 10);
    }

    #[test]
    fn a_probe_never_lists_plain_a_directory_just_listed_with_attributes() {
        let a = PlusAdvisor::default();
        for d in 0..20 {
            a.sent_plain(d, 25);
            for _ in 0..25 {
                a.looked_up(d);
            }
        }
        // Each directory listed twice in a row: the second listing is never the probe,
        // while first listings of new directories still are, now and then.
        let mut probes = 0;
        for d in 100..100 + 4 * PROBE {
            let first = a.attrs_wanted(d);
            let second = a.attrs_wanted(d);
            assert!(
                !first || second,
                "directory {d} listed plain right after attributes"
            );
            probes += usize::from(!first);
        }
        assert!(probes >= 1, "new directories are still probed");
        assert!(a.recent.lock().len() <= RECENT);
    }

    #[test]
    fn lookups_outside_plain_directories_do_not_count() {
        let a = PlusAdvisor::default();
        a.sent_plain(1, 10);
        for _ in 0..100 {
            a.looked_up(2);
        }
        assert!(!a.attrs_wanted(7));
        // More lookups than names sent in a directory count once per name.
        for _ in 0..100 {
            a.looked_up(1);
        }
        assert_eq!(a.looked.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn the_table_is_bounded() {
        let a = PlusAdvisor::default();
        for d in 0..(MAX_DIRS as u64 * 3) {
            a.sent_plain(d, 1);
        }
        assert!(a.plain.lock().len() <= MAX_DIRS);
        assert!(a.sent.load(Ordering::Relaxed) <= WINDOW);
    }
}
