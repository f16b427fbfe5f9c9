//! A per-thread memo of the last few grants (`Layer::grant`) and mode ceilings
//! (`Layer::ceiling`) a layer gave, so that the run of requests one caller sends on one
//! path (an untarred file: LOOKUP, CREATE, GETXATTR, three SETATTRs) matches the layer's
//! globs once instead of seven times. Every request is still decided: the fence, the
//! need, set-ID/devices, the ignore files, the audit line and an approver's lift all run
//! as before; only the two pure functions of (layer, path, caller) are remembered.
//!
//! Invariants:
//! - An entry answers only the question it was computed for: the same compiled layer
//!   (its [`MemoId`], fresh for every layer built, cloned or changed and never reused, so
//!   a reload's layers never meet an answer of the old ones), the same [`Caller`] (uid,
//!   gid, program bits, unknown program), the same is-a-directory flag and the same path
//!   bytes. A layer is only read (`&self`) once its id is set, and both functions are pure,
//!   so a remembered answer is the answer the globs give.
//! - Bounded: [`SLOTS`] entries per thread, each path at most [`MAX_PATH`] bytes (a longer
//!   one is decided without the memo).
//! - An entry is keyed by the caller: one caller's requests never find another's, so
//!   no timing tells a caller which paths someone else has touched.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Access, By, Caller};

/// Entries per thread: a file's requests come in a row from one caller.
const SLOTS: usize = 4;
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

struct Entry {
    layer: u64,
    caller: Caller,
    is_dir: bool,
    path: Vec<u8>,
    grant: (Access, By),
    ceiling: Option<Access>,
}

#[derive(Default)]
struct Memo {
    slots: Vec<Entry>,
    /// The slot the next new entry takes (round robin).
    next: usize,
}

impl Memo {
    fn find(&mut self, k: &Key<'_>) -> Option<&mut Entry> {
        self.slots.iter_mut().find(|e| {
            e.layer == k.layer.0 && e.caller == k.caller && e.is_dir == k.is_dir && e.path == k.path
        })
    }

    fn insert(&mut self, k: &Key<'_>, grant: (Access, By), ceiling: Option<Access>) {
        let fresh = Entry {
            layer: k.layer.0,
            caller: k.caller,
            is_dir: k.is_dir,
            path: Vec::new(),
            grant,
            ceiling,
        };
        let i = self.next;
        self.next = (i + 1) % SLOTS;
        if i == self.slots.len() {
            self.slots.push(fresh);
        } else {
            // The old entry's buffer is reused for the new path.
            let path = std::mem::take(&mut self.slots[i].path);
            self.slots[i] = Entry { path, ..fresh };
        }
        let e = &mut self.slots[i];
        e.path.clear();
        e.path.extend_from_slice(k.path);
    }
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::default();
}

/// The layer's grant for `k` and, when `wants_ceiling(grant)`, its mode ceiling (else
/// `Access::Read`), from the memo or computed (`grant`, `ceiling`: pure) and then
/// remembered. One look into the memo for an answer it has.
pub(super) fn decided(
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
    // Nothing is computed while the memo is borrowed.
    let hit = MEMO.with(|m| m.borrow_mut().find(k).map(|e| (e.grant, e.ceiling)));
    match hit {
        Some((g, _)) if !wants_ceiling(g.0) => (g.0, g.1, Access::Read),
        Some((g, Some(c))) => (g.0, g.1, c),
        Some((g, None)) => {
            let c = ceiling();
            MEMO.with(|m| {
                if let Some(e) = m.borrow_mut().find(k) {
                    e.ceiling = Some(c);
                }
            });
            (g.0, g.1, c)
        }
        None => {
            let g = grant();
            let c = wants_ceiling(g.0).then(ceiling);
            MEMO.with(|m| m.borrow_mut().insert(k, g, c));
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
    fn ask(k: &Key<'_>, g: (Access, By), c: Option<Access>) -> (Access, By, Access) {
        decided(k, || g, |_| c.is_some(), || c.expect("a ceiling"))
    }

    fn never() -> (Access, By) {
        panic!("a remembered answer was expected")
    }

    /// The same question is answered from the memo; any other one is computed.
    #[test]
    fn answers_only_the_same_question() {
        let (a, b) = (MemoId::fresh(), MemoId::fresh());
        let g = (Access::Write, By::Default);
        assert_eq!(ask(&key(&a, 1, b"x/y"), g, None), (g.0, g.1, Access::Read));
        let again = decided(&key(&a, 1, b"x/y"), never, |_| false, || Access::Write);
        assert_eq!(again, (g.0, g.1, Access::Read));
        let other = (Access::None, By::Rule(3));
        let want = (other.0, other.1, Access::Read);
        assert_eq!(ask(&key(&b, 1, b"x/y"), other, None), want);
        assert_eq!(ask(&key(&a, 2, b"x/y"), other, None), want);
        assert_eq!(ask(&key(&a, 1, b"x/z"), other, None), want);
        let dir = Key {
            is_dir: true,
            ..key(&a, 1, b"x/y")
        };
        assert_eq!(ask(&dir, other, None), want);
        // A clone is another layer.
        assert_eq!(ask(&key(&a.clone(), 1, b"x/y"), other, None), want);
    }

    /// The ceiling is computed when first wanted and remembered beside the grant.
    #[test]
    fn ceiling_rides_on_the_grant() {
        let a = MemoId::fresh();
        let k = key(&a, 7, b"p");
        let g = (Access::Write, By::Default);
        assert_eq!(ask(&k, g, None).2, Access::Read);
        assert_eq!(ask(&k, g, Some(Access::Write)).2, Access::Write);
        let c = decided(&k, never, |_| true, || panic!("a remembered ceiling"));
        assert_eq!(c, (g.0, g.1, Access::Write));
    }

    /// At most SLOTS entries: the oldest goes first; long paths are never kept.
    #[test]
    fn bounded() {
        let a = MemoId::fresh();
        let g = (Access::Read, By::Default);
        let paths: Vec<Vec<u8>> = (0..=SLOTS).map(|i| vec![b'a' + i as u8]).collect();
        for p in &paths {
            ask(&key(&a, 9, p), g, None);
        }
        MEMO.with(|m| assert_eq!(m.borrow().slots.len(), SLOTS));
        let other = (Access::None, By::Default);
        assert_eq!(ask(&key(&a, 9, &paths[0]), other, None).0, Access::None);
        let long = vec![b'l'; MAX_PATH + 1];
        ask(&key(&a, 9, &long), g, None);
        assert_eq!(ask(&key(&a, 9, &long), other, None).0, Access::None);
    }
}
