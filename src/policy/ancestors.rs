//! Glob sets matched against a path and every ancestor of it, with a per-thread memo of
//! what the ancestors gave. PURE (no I/O).
//!
//! Job: the deepest-match rule, `except` globs, `writable_roots` and `protected` all ask
//! "which globs of this set match the path or one of its ancestors?". Requests come in
//! runs over one directory (a listing's entries, `rm -rf`, an untar, a build): their
//! paths share every ancestor but the last name. [`PrefixSet::hits`] matches the path
//! itself and takes the ancestors' answers from the memo, computed once per directory.
//!
//! Invariants:
//! - [`Hits`] is exactly what matching the set against each prefix gives: a remembered
//!   answer is only ever the answer of the same compiled set (its [`MemoId`], fresh for
//!   every set built or cloned and never reused) for the same directory bytes, and
//!   matching is a pure function of the two.
//! - Bounded: [`SLOTS`] directories per thread, each at most [`MAX_DIR`] bytes (a longer
//!   one is matched without the memo); entries hold only glob indices.
//! - Nothing a caller's request chose is kept beyond the thread's next [`SLOTS`]
//!   directories, and no answer depends on who asked: the memo holds set matches, not
//!   decisions (those are `memo.rs`'s, keyed by caller).

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;

use globset::{Candidate, GlobSet};

use super::memo::MemoId;

/// Directories remembered per thread: a few sets (rules, excepts, roots, protected) of a
/// few layers over one directory at a time.
const SLOTS: usize = 8;
/// Longest directory remembered (PATH_MAX).
const MAX_DIR: usize = 4096;

/// A compiled glob set and its identity for the memo.
#[derive(Clone, Debug)]
pub(super) struct PrefixSet {
    set: GlobSet,
    /// Fresh for every set built and every clone (`MemoId`'s `Clone`).
    id: MemoId,
}

/// The prefixes of one directory at which some glob matched, deepest first: (prefix
/// length, glob indices).
type Above = Rc<[(u32, Box<[usize]>)]>;

/// What [`PrefixSet::hits`] found: the glob indices matching the path itself (empty if
/// none), then those of each ancestor that some glob matched, deepest first. The root
/// (`b""`) is never matched: callers keep their own root-only lists.
pub(super) struct Hits {
    own: Vec<usize>,
    above: Option<Above>,
}

impl Hits {
    /// Each non-empty list of glob indices, deepest prefix first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &[usize]> {
        let own = (!self.own.is_empty()).then_some(self.own.as_slice());
        let above = self
            .above
            .iter()
            .flat_map(|a| a.iter().map(|(_, h)| &h[..]));
        own.into_iter().chain(above)
    }

    /// No glob matches the path or an ancestor.
    pub(super) fn is_empty(&self) -> bool {
        self.own.is_empty() && self.above.as_ref().is_none_or(|a| a.is_empty())
    }
}

struct Slot {
    set: u64,
    dir: Vec<u8>,
    above: Above,
}

#[derive(Default)]
struct Memo {
    slots: Vec<Slot>,
    /// The slot the next new directory takes (round robin).
    next: usize,
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::default();
}

impl PrefixSet {
    pub(super) fn new(set: GlobSet) -> PrefixSet {
        PrefixSet {
            set,
            id: MemoId::fresh(),
        }
    }

    /// Whether some glob matches `c` itself (no ancestor).
    pub(super) fn is_match_candidate(&self, c: &Candidate<'_>) -> bool {
        self.set.is_match_candidate(c)
    }

    /// The globs matching `path` and each of its non-root ancestors (see [`Hits`]).
    pub(super) fn hits(&self, path: &[u8]) -> Hits {
        if path.is_empty() || self.set.is_empty() {
            return Hits {
                own: Vec::new(),
                above: None,
            };
        }
        let mut own = Vec::new();
        self.set
            .matches_candidate_into(&Candidate::new(as_path(path)), &mut own);
        let dir = match path.iter().rposition(|&b| b == b'/') {
            Some(end) => &path[..end],
            None => &path[..0],
        };
        Hits {
            own,
            above: (!dir.is_empty()).then(|| self.above(dir)),
        }
    }

    /// The matches of `dir` and its ancestors, from the memo or computed and remembered.
    fn above(&self, dir: &[u8]) -> Above {
        if dir.len() > MAX_DIR {
            return self.compute(dir);
        }
        let id = self.id.raw();
        // Nothing is computed while the memo is borrowed.
        let found = MEMO.with(|m| {
            m.borrow()
                .slots
                .iter()
                .find(|s| s.set == id && s.dir == dir)
                .map(|s| s.above.clone())
        });
        if let Some(a) = found {
            return a;
        }
        let above = self.compute(dir);
        MEMO.with(|m| {
            let mut m = m.borrow_mut();
            let fresh = Slot {
                set: id,
                dir: dir.to_vec(),
                above: above.clone(),
            };
            let i = m.next;
            m.next = (i + 1) % SLOTS;
            if i == m.slots.len() {
                m.slots.push(fresh);
            } else {
                m.slots[i] = fresh;
            }
        });
        above
    }

    fn compute(&self, dir: &[u8]) -> Above {
        let mut out = Vec::new();
        let mut hits = Vec::new();
        for prefix in prefixes(dir).filter(|p| !p.is_empty()) {
            self.set
                .matches_candidate_into(&Candidate::new(as_path(prefix)), &mut hits);
            if !hits.is_empty() {
                out.push((prefix.len() as u32, hits.as_slice().into()));
            }
        }
        out.into()
    }
}

/// Splits `path` into its prefixes, deepest first, ending with the root `b""`.
struct Prefixes<'a> {
    path: &'a [u8],
    end: Option<usize>,
}

fn prefixes(path: &[u8]) -> Prefixes<'_> {
    Prefixes {
        path,
        end: Some(path.len()),
    }
}

impl<'a> Iterator for Prefixes<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let end = self.end?;
        let prefix = &self.path[..end];
        self.end = if end == 0 {
            None
        } else {
            Some(prefix.iter().rposition(|&b| b == b'/').unwrap_or(0))
        };
        Some(prefix)
    }
}

pub(super) fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use globset::{GlobBuilder, GlobSetBuilder};

    fn set(globs: &[&str]) -> PrefixSet {
        let mut b = GlobSetBuilder::new();
        for g in globs {
            b.add(
                GlobBuilder::new(g)
                    .literal_separator(true)
                    .backslash_escape(true)
                    .build()
                    .unwrap(),
            );
        }
        PrefixSet::new(b.build().unwrap())
    }

    /// What the hits must be: every non-empty prefix matched on its own, deepest first.
    fn plain(s: &PrefixSet, path: &[u8]) -> Vec<Vec<usize>> {
        prefixes(path)
            .filter(|p| !p.is_empty())
            .map(|p| s.set.matches_candidate(&Candidate::new(as_path(p))))
            .filter(|h| !h.is_empty())
            .collect()
    }

    fn got(s: &PrefixSet, path: &[u8]) -> Vec<Vec<usize>> {
        s.hits(path).iter().map(|h| h.to_vec()).collect()
    }

    #[test]
    fn hits_equal_matching_every_prefix_with_and_without_the_memo() {
        let a = set(&["secrets", "**/*.pem", "a/*/c", "**/node_modules/**", "a"]);
        let b = set(&["a/b", "**/c"]);
        let paths: &[&[u8]] = &[
            b"a/b/c",
            b"a/b/c/d.pem",
            b"a/b/x",
            b"a/b/c",
            b"secrets/k.pem",
            b"x/node_modules/y/z",
            b"x/node_modules/y/w",
            b"a",
            b"",
            b"z",
        ];
        // Twice over, interleaving two sets: the second round answers from the memo.
        for _ in 0..2 {
            for p in paths {
                assert_eq!(got(&a, p), plain(&a, p), "{}", String::from_utf8_lossy(p));
                assert_eq!(got(&b, p), plain(&b, p), "{}", String::from_utf8_lossy(p));
                assert_eq!(a.hits(p).is_empty(), plain(&a, p).is_empty());
            }
        }
    }

    #[test]
    fn a_clone_or_a_new_set_never_meets_anothers_answers() {
        let a = set(&["d/**"]);
        assert_eq!(got(&a, b"d/e/f"), vec![vec![0], vec![0]]);
        // Same directory, other sets: their own answers.
        let b = set(&["x"]);
        assert!(got(&b, b"d/e/f").is_empty());
        let c = a.clone();
        assert_eq!(got(&c, b"d/e/f"), vec![vec![0], vec![0]]);
        assert_ne!(a.id.raw(), c.id.raw());
    }

    #[test]
    fn more_directories_than_slots_and_a_long_one_stay_exact() {
        let a = set(&["**/k*", "p1/**"]);
        for i in 0..(3 * SLOTS) {
            let p = format!("p{}/k{i}/q/f", i % 3);
            assert_eq!(got(&a, p.as_bytes()), plain(&a, p.as_bytes()), "{p}");
        }
        let long = format!("{}/k/f", "d/".repeat(MAX_DIR));
        assert_eq!(got(&a, long.as_bytes()), plain(&a, long.as_bytes()));
    }
}
