//! A memo of the grants (`Layer::grant`) and mode ceilings (`Layer::ceiling`) a layer
//! gave lately, shared by the daemon's threads, so that the run of requests one caller
//! sends on one path (an untarred file: LOOKUP, CREATE, GETXATTR, three SETATTRs) matches
//! the layer's globs once instead of seven times, and a warm pass over a tree (find, ls
//! -lR, git status: OPENDIR, GETATTR, GETXATTR on what the cold pass decided) matches
//! none — also when the kernel hands those
//! requests to different queue threads (FUSE over io_uring routes each to the queue of
//! the CPU its caller runs on, and a caller that slept on a reply often wakes on the
//! other CPU). Every request is still decided: the fence, the need, set-ID/devices, the
//! ignore files, the audit line and an approver's lift all run as before; only the two
//! pure functions of (layer, path, caller) are remembered.
//!
//! Invariants:
//! - An entry answers only the question it was computed for: the same compiled layer
//!   (its [`MemoId`], fresh for every layer built, cloned or changed and never reused, so
//!   a reload's layers never meet an answer of the old ones), the same [`Caller`] (uid,
//!   gid, program bits, unknown program), the same is-a-directory flag and the same path
//!   bytes. A layer is only read (`&self`) once its id is set, and both functions are pure,
//!   so a remembered answer is the answer the globs give.
//! - Bounded: two fixed tables per layer (directories, files), set-associative, each
//!   path at most [`INLINE`] bytes (a longer one is decided without the memo); one
//!   allocation each, made at the first answer. The lock is held only to look or to store
//!   (a scan of one set, a copy of the path; the hash is taken before), never while globs
//!   are matched.
//! - An entry is keyed by the caller: one caller's requests never find another's, so
//!   no timing tells a caller which paths someone else has touched. The set an entry
//!   lands in is a hash of the caller and the path under a key drawn at random per
//!   process: a caller that fills sets and watches its own entries go learns that someone
//!   decided something, never which path (no prime-and-probe on another's paths).

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{Access, By, Caller};

/// Slots per set.
const WAYS: usize = 4;
/// Sets for directories: 4,096 directories' answers (a large repository's tree, decided
/// again by every warm pass: OPENDIR, GETATTR, the lookups below them).
const DIR_SETS: usize = 1024;
/// Sets for files: 1,024 files' answers (a file's requests come in a run).
const FILE_SETS: usize = 256;
/// The longest path remembered (a longer one is decided without the memo); with it a
/// slot is 192 bytes, a layer's two tables 960 KiB, allocated at its first answers.
const INLINE: usize = 120;

/// The identity of a compiled layer as the memo knows it: fresh for every layer built and
/// for every clone (`Clone` draws a new one), renewed whenever the layer is changed.
#[derive(Debug)]
pub(crate) struct MemoId(u64);

impl MemoId {
    /// An id no layer had before.
    pub(crate) fn fresh() -> MemoId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        MemoId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The id as a number (for keys).
    pub(crate) fn raw(&self) -> u64 {
        self.0
    }
}

impl Clone for MemoId {
    /// A copy of a layer may be changed apart from the original: it gets its own id.
    fn clone(&self) -> MemoId {
        MemoId::fresh()
    }
}

/// One question: which layer, who, what kind of file, which path.
pub(super) struct Key<'a> {
    pub layer: &'a MemoId,
    pub caller: Caller,
    pub is_dir: bool,
    pub path: &'a [u8],
}

/// One remembered answer: the question (layer, caller, kind, path) and its answer.
#[derive(Clone, Copy)]
struct Slot {
    used: bool,
    layer: u64,
    caller: Caller,
    len: u16,
    path: [u8; INLINE],
    grant: (Access, By),
    ceiling: Option<Access>,
}

const EMPTY: Slot = Slot {
    used: false,
    layer: 0,
    caller: Caller {
        uid: 0,
        gid: 0,
        progs: 0,
        program_unknown: false,
    },
    len: 0,
    path: [0; INLINE],
    grant: (Access::None, By::Default),
    ceiling: None,
};

impl Slot {
    fn answers(&self, k: &Key<'_>) -> bool {
        self.used
            && self.layer == k.layer.0
            && self.caller == k.caller
            && usize::from(self.len) == k.path.len()
            && self.path[..k.path.len()] == *k.path
    }
}

/// A set-associative table of answers: a path hashes to one set of [`WAYS`] slots, the
/// set's oldest slot is replaced. Its slots are one allocation made at the first answer
/// and kept (a fixed amount of memory, never many small blocks pinning the heap's pages
/// after a big walk).
struct Table {
    sets: usize,
    slots: Vec<Slot>,
    /// The way each set replaces next.
    next: Vec<u8>,
}

impl Table {
    const fn new(sets: usize) -> Table {
        Table {
            sets,
            slots: Vec::new(),
            next: Vec::new(),
        }
    }

    fn set(&self, hash: u64) -> usize {
        (hash % self.sets as u64) as usize * WAYS
    }

    fn find(&mut self, hash: u64, k: &Key<'_>) -> Option<&mut Slot> {
        if self.slots.is_empty() {
            return None;
        }
        let at = self.set(hash);
        self.slots[at..at + WAYS].iter_mut().find(|s| s.answers(k))
    }

    fn insert(&mut self, hash: u64, k: &Key<'_>, grant: (Access, By), ceiling: Option<Access>) {
        if self.slots.is_empty() {
            self.slots = vec![EMPTY; self.sets * WAYS];
            self.next = vec![0; self.sets];
        }
        let at = self.set(hash);
        let ways = &self.slots[at..at + WAYS];
        let way = match ways.iter().position(|s| s.answers(k) || !s.used) {
            Some(w) => w,
            None => {
                let w = usize::from(self.next[at / WAYS]);
                self.next[at / WAYS] = ((w + 1) % WAYS) as u8;
                w
            }
        };
        let slot = &mut self.slots[at + way];
        *slot = Slot {
            used: true,
            layer: k.layer.0,
            caller: k.caller,
            len: k.path.len() as u16,
            grant,
            ceiling,
            ..*slot
        };
        slot.path[..k.path.len()].copy_from_slice(k.path);
    }
}

/// The answers kept: directories and files apart, so the thousands of files a cold walk
/// decides never push out the directories a warm pass decides again.
struct Memo {
    dirs: Table,
    files: Table,
}

impl Default for Memo {
    fn default() -> Memo {
        Memo {
            dirs: Table::new(DIR_SETS),
            files: Table::new(FILE_SETS),
        }
    }
}

impl Memo {
    fn table(&mut self, k: &Key<'_>) -> &mut Table {
        if k.is_dir {
            &mut self.dirs
        } else {
            &mut self.files
        }
    }
}

/// One layer's memo, shared by every thread deciding with it. A clone (a layer copied to
/// be changed) starts empty; its id is fresh anyway.
#[derive(Default)]
pub(crate) struct Shared {
    /// Keyed at random per process. The set an answer lands in is a hash of the caller
    /// and the path: a caller learns where its own answers land, never another's, so
    /// filling a set and watching its own answers go tells it nothing of which paths
    /// someone else decided.
    hasher: RandomState,
    tables: Mutex<Memo>,
}

impl Shared {
    fn hash(&self, k: &Key<'_>) -> u64 {
        self.hasher.hash_one((k.caller, k.path))
    }

    fn find(&self, h: u64, k: &Key<'_>) -> Option<(Access, By, Option<Access>)> {
        let mut m = self.tables.lock();
        let s = m.table(k).find(h, k)?;
        Some((s.grant.0, s.grant.1, s.ceiling))
    }

    fn insert(&self, h: u64, k: &Key<'_>, grant: (Access, By), ceiling: Option<Access>) {
        self.tables.lock().table(k).insert(h, k, grant, ceiling);
    }

    fn set_ceiling(&self, h: u64, k: &Key<'_>, c: Access) {
        if let Some(s) = self.tables.lock().table(k).find(h, k) {
            s.ceiling = Some(c);
        }
    }
}

impl Clone for Shared {
    fn clone(&self) -> Shared {
        Shared::default()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("memo::Shared")
    }
}

/// The layer's grant for `k` and, when `wants_ceiling(grant)`, its mode ceiling (else
/// `Access::Read`), from `memo` or computed (`grant`, `ceiling`: pure, run unlocked) and
/// then remembered. One look into the memo for an answer it has.
pub(super) fn decided(
    memo: &Shared,
    k: &Key<'_>,
    grant: impl FnOnce() -> (Access, By),
    wants_ceiling: impl Fn(Access) -> bool,
    ceiling: impl FnOnce() -> Access,
) -> (Access, By, Access) {
    if k.path.len() > INLINE {
        let g = grant();
        let c = if wants_ceiling(g.0) {
            ceiling()
        } else {
            Access::Read
        };
        return (g.0, g.1, c);
    }
    // Hashed once, unlocked; nothing is computed while the memo is locked.
    let h = memo.hash(k);
    match memo.find(h, k) {
        Some((g, b, _)) if !wants_ceiling(g) => (g, b, Access::Read),
        Some((g, b, Some(c))) => (g, b, c),
        Some((g, b, None)) => {
            let c = ceiling();
            memo.set_ceiling(h, k, c);
            (g, b, c)
        }
        None => {
            let g = grant();
            let c = wants_ceiling(g.0).then(ceiling);
            memo.insert(h, k, g, c);
            (g.0, g.1, c.unwrap_or(Access::Read))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(layer: &'a MemoId, uid: u32, path: &'a [u8]) -> Key<'a> {
        Key {
            layer,
            caller: Caller::new(uid, uid),
            is_dir: false,
            path,
        }
    }

    /// A grant (and a ceiling when one is wanted) through the memo.
    fn ask(m: &Shared, k: &Key<'_>, g: (Access, By), c: Option<Access>) -> (Access, By, Access) {
        decided(m, k, || g, |_| c.is_some(), || c.expect("a ceiling"))
    }

    fn never() -> (Access, By) {
        panic!("a remembered answer was expected")
    }

    /// The same question is answered from the memo; any other one is computed.
    #[test]
    fn answers_only_the_same_question() {
        let m = Shared::default();
        let (a, b) = (MemoId::fresh(), MemoId::fresh());
        let g = (Access::Write, By::Default);
        assert_eq!(
            ask(&m, &key(&a, 1, b"x/y"), g, None),
            (g.0, g.1, Access::Read)
        );
        let again = decided(&m, &key(&a, 1, b"x/y"), never, |_| false, || Access::Write);
        assert_eq!(again, (g.0, g.1, Access::Read));
        let other = (Access::None, By::Rule(3));
        let want = (other.0, other.1, Access::Read);
        assert_eq!(ask(&m, &key(&b, 1, b"x/y"), other, None), want);
        assert_eq!(ask(&m, &key(&a, 2, b"x/y"), other, None), want);
        assert_eq!(ask(&m, &key(&a, 1, b"x/z"), other, None), want);
        let dir = Key {
            is_dir: true,
            ..key(&a, 1, b"x/y")
        };
        assert_eq!(ask(&m, &dir, other, None), want);
        // A clone is another layer.
        assert_eq!(ask(&m, &key(&a.clone(), 1, b"x/y"), other, None), want);
    }

    /// The ceiling is computed when first wanted and remembered beside the grant.
    #[test]
    fn ceiling_rides_on_the_grant() {
        let m = Shared::default();
        let a = MemoId::fresh();
        let k = key(&a, 7, b"p");
        let g = (Access::Write, By::Default);
        assert_eq!(ask(&m, &k, g, None).2, Access::Read);
        assert_eq!(ask(&m, &k, g, Some(Access::Write)).2, Access::Write);
        let c = decided(&m, &k, never, |_| true, || panic!("a remembered ceiling"));
        assert_eq!(c, (g.0, g.1, Access::Write));
    }

    /// Fixed tables: however many paths are decided, the slots stay the same allocation;
    /// the newest answer is always found; the files a walk decides never push out a
    /// directory's answer; long paths are never kept.
    #[test]
    fn bounded() {
        assert!(
            std::mem::size_of::<Slot>() <= 192,
            "the docs say 960 KiB a layer"
        );
        let m = Shared::default();
        let a = MemoId::fresh();
        let g = (Access::Read, By::Default);
        let other = (Access::None, By::Default);
        let dir = Key {
            is_dir: true,
            ..key(&a, 9, b"src/lib")
        };
        ask(&m, &dir, g, None);
        for i in 0..100_000 {
            let p = format!("src/lib/f{i}").into_bytes();
            ask(&m, &key(&a, 9, &p), g, None);
            let again = decided(&m, &key(&a, 9, &p), never, |_| false, || Access::Read);
            assert_eq!(again.0, Access::Read);
        }
        {
            let memo = m.tables.lock();
            assert_eq!(memo.files.slots.len(), FILE_SETS * WAYS);
            assert_eq!(memo.dirs.slots.len(), DIR_SETS * WAYS);
        }
        let kept = decided(&m, &dir, never, |_| false, || Access::Read);
        assert_eq!(kept.0, Access::Read);
        // Most of the 100,000 files are gone: the first one is computed again.
        let first = ask(&m, &key(&a, 9, b"src/lib/f0"), other, None);
        assert_eq!(first.0, Access::None);
        let long = vec![b'l'; INLINE + 1];
        ask(&m, &key(&a, 9, &long), g, None);
        assert_eq!(ask(&m, &key(&a, 9, &long), other, None).0, Access::None);
        let just = vec![b'j'; INLINE];
        ask(&m, &key(&a, 9, &just), g, None);
        let fits = decided(&m, &key(&a, 9, &just), never, |_| false, || Access::Read);
        assert_eq!(fits.0, Access::Read);
        // More callers on one path than a set has ways: the newest is kept.
        for uid in 0..=WAYS as u32 {
            ask(&m, &key(&a, 100 + uid, b"q"), g, None);
        }
        let last = 100 + WAYS as u32;
        let newest = decided(&m, &key(&a, last, b"q"), never, |_| false, || Access::Read);
        assert_eq!(newest.0, Access::Read);
    }

    /// An answer one thread computed is found by another (the queue threads share it);
    /// a clone of the memo (a copied layer's) starts empty.
    #[test]
    fn shared_by_threads_not_by_clones() {
        let m = Shared::default();
        let a = MemoId::fresh();
        let g = (Access::Write, By::Rule(1));
        std::thread::scope(|s| {
            s.spawn(|| ask(&m, &key(&a, 5, b"t/u"), g, None));
        });
        let got = std::thread::scope(|s| {
            s.spawn(|| decided(&m, &key(&a, 5, b"t/u"), never, |_| false, || Access::Write))
                .join()
                .expect("no panic")
        });
        assert_eq!(got, (g.0, g.1, Access::Read));
        let copy = m.clone();
        let other = (Access::None, By::Default);
        assert_eq!(ask(&copy, &key(&a, 5, b"t/u"), other, None).0, Access::None);
    }

    /// Within one set, only the exact path answers: not its prefix, not a longer path
    /// starting with it, not another path of the same length.
    #[test]
    fn one_set_tells_paths_apart() {
        let a = MemoId::fresh();
        let mut t = Table::new(1);
        let g = (Access::Write, By::Rule(7));
        t.insert(42, &key(&a, 1, b"x/y"), g, None);
        for other in [&b"x"[..], b"x/y/z", b"x/z", b"x/", b""] {
            assert!(t.find(42, &key(&a, 1, other)).is_none(), "{other:?}");
        }
        assert_eq!(t.find(42, &key(&a, 1, b"x/y")).map(|s| s.grant), Some(g));
        // The others in the same set, each answered alone; the first stays in.
        let n = (Access::None, By::Default);
        t.insert(42, &key(&a, 1, b"x"), n, None);
        t.insert(42, &key(&a, 1, b"x/y/z"), n, None);
        t.insert(42, &key(&a, 1, b"x/z"), n, None);
        assert_eq!(t.find(42, &key(&a, 1, b"x/y")).map(|s| s.grant), Some(g));
        assert_eq!(t.find(42, &key(&a, 1, b"x")).map(|s| s.grant), Some(n));
        // A fifth pushes out the oldest of the four.
        t.insert(42, &key(&a, 1, b"w"), n, None);
        assert!(t.find(42, &key(&a, 1, b"x/y")).is_none());
    }

    /// Nothing is computed under the lock: a grant that itself asks the memo (another
    /// path) does not deadlock.
    #[test]
    fn computes_unlocked() {
        let m = Shared::default();
        let a = MemoId::fresh();
        let inner = (Access::Read, By::Default);
        let got = decided(
            &m,
            &key(&a, 3, b"outer"),
            || {
                ask(&m, &key(&a, 3, b"inner"), inner, None);
                (Access::Write, By::Default)
            },
            |_| true,
            || decided(&m, &key(&a, 3, b"inner"), never, |_| false, || Access::Read).0,
        );
        assert_eq!(got, (Access::Write, By::Default, Access::Read));
    }
}
