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
//! - Bounded: [`PATHS`] paths and [`BYTES`] bytes of paths per layer, [`PER_PATH`]
//!   answers per path, each path at most [`MAX_PATH`] bytes (a longer one is decided
//!   without the memo); past a bound the memo starts over. The lock is held only to look
//!   or to store (a hash of the path, a copy of it), never while globs are matched. The
//!   map's hasher is std's, keyed at random per process: paths a caller picks cannot be
//!   made to collide.
//! - An entry is keyed by the caller: one caller's requests never find another's, so
//!   no timing tells a caller which paths someone else has touched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{Access, By, Caller};

/// Paths per layer: a tree the size of a large repository's (its directories and the
/// files a warm pass touches again) is decided once per pass, not once per request.
const PATHS: usize = 32_768;
/// Bytes of paths per layer (with the map's own, a few MiB at most).
const BYTES: usize = 2 << 20;
/// Answers per path (callers, layers, file or directory).
const PER_PATH: usize = 4;
/// Longest path memoised (PATH_MAX).
const MAX_PATH: usize = 4096;

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

/// What one path's entry remembers for one question about it.
struct Answer {
    layer: u64,
    caller: Caller,
    is_dir: bool,
    grant: (Access, By),
    ceiling: Option<Access>,
}

/// The answers kept: a map from the path to the few questions asked about it (callers,
/// layers, file or directory), bounded in paths and in path bytes; when a new path would
/// pass either bound the map starts over (empty), so its memory never grows past them.
#[derive(Default)]
struct Memo {
    paths: HashMap<Box<[u8]>, Vec<Answer>>,
    /// The bytes of every path held.
    bytes: usize,
}

impl Memo {
    fn find(&mut self, k: &Key<'_>) -> Option<&mut Answer> {
        self.paths
            .get_mut(k.path)?
            .iter_mut()
            .find(|e| e.layer == k.layer.0 && e.caller == k.caller && e.is_dir == k.is_dir)
    }

    fn insert(&mut self, k: &Key<'_>, grant: (Access, By), ceiling: Option<Access>) {
        let fresh = Answer {
            layer: k.layer.0,
            caller: k.caller,
            is_dir: k.is_dir,
            grant,
            ceiling,
        };
        if let Some(list) = self.paths.get_mut(k.path) {
            if let Some(e) = list
                .iter_mut()
                .find(|e| e.layer == k.layer.0 && e.caller == k.caller && e.is_dir == k.is_dir)
            {
                *e = fresh;
            } else {
                // A path's oldest answer goes first.
                if list.len() == PER_PATH {
                    list.remove(0);
                }
                list.push(fresh);
            }
            return;
        }
        if self.paths.len() >= PATHS || self.bytes + k.path.len() > BYTES {
            self.paths.clear();
            self.bytes = 0;
            if self.paths.capacity() > 2 * PATHS {
                self.paths.shrink_to(PATHS);
            }
        }
        self.bytes += k.path.len();
        self.paths.insert(k.path.into(), vec![fresh]);
    }
}

/// One layer's memo, shared by every thread deciding with it. A clone (a layer copied to
/// be changed) starts empty; its id is fresh anyway.
#[derive(Default)]
pub(crate) struct Shared(Mutex<Memo>);

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
    if k.path.len() > MAX_PATH {
        let g = grant();
        let c = if wants_ceiling(g.0) {
            ceiling()
        } else {
            Access::Read
        };
        return (g.0, g.1, c);
    }
    // Nothing is computed while the memo is locked.
    let hit = memo.0.lock().find(k).map(|e| (e.grant, e.ceiling));
    match hit {
        Some((g, _)) if !wants_ceiling(g.0) => (g.0, g.1, Access::Read),
        Some((g, Some(c))) => (g.0, g.1, c),
        Some((g, None)) => {
            let c = ceiling();
            if let Some(e) = memo.0.lock().find(k) {
                e.ceiling = Some(c);
            }
            (g.0, g.1, c)
        }
        None => {
            let g = grant();
            let c = wants_ceiling(g.0).then(ceiling);
            memo.0.lock().insert(k, g, c);
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

    /// At most PATHS paths (and BYTES bytes): past that the memo starts over; long paths
    /// are never kept; a path keeps at most PER_PATH answers, the oldest going first.
    #[test]
    fn bounded() {
        let m = Shared::default();
        let a = MemoId::fresh();
        let g = (Access::Read, By::Default);
        let other = (Access::None, By::Default);
        let paths: Vec<Vec<u8>> = (0..=PATHS).map(|i| format!("p{i}").into_bytes()).collect();
        for p in &paths[..PATHS] {
            ask(&m, &key(&a, 9, p), g, None);
        }
        assert_eq!(m.0.lock().paths.len(), PATHS);
        // Every one of them is remembered...
        let hit = decided(
            &m,
            &key(&a, 9, &paths[0]),
            never,
            |_| false,
            || Access::Read,
        );
        assert_eq!(hit.0, Access::Read);
        // ...until one more path starts the memo over.
        ask(&m, &key(&a, 9, &paths[PATHS]), g, None);
        assert_eq!(m.0.lock().paths.len(), 1);
        assert_eq!(ask(&m, &key(&a, 9, &paths[0]), other, None).0, Access::None);
        // Bytes: paths of 4 KiB fill BYTES long before PATHS.
        let big: Vec<Vec<u8>> = (0..BYTES / 4000 + 1)
            .map(|i| format!("{i:04000}").into_bytes())
            .collect();
        for p in &big {
            ask(&m, &key(&a, 9, p), g, None);
            assert!(m.0.lock().bytes <= BYTES);
        }
        let long = vec![b'l'; MAX_PATH + 1];
        ask(&m, &key(&a, 9, &long), g, None);
        assert_eq!(ask(&m, &key(&a, 9, &long), other, None).0, Access::None);
        // Per path: PER_PATH callers; a further one pushes the first out.
        for uid in 0..=PER_PATH as u32 {
            ask(&m, &key(&a, 100 + uid, b"q"), g, None);
        }
        assert_eq!(ask(&m, &key(&a, 100, b"q"), other, None).0, Access::None);
        let last = 100 + PER_PATH as u32;
        let kept = decided(&m, &key(&a, last, b"q"), never, |_| false, || Access::Read);
        assert_eq!(kept.0, Access::Read);
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
}
