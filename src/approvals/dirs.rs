//! Directory changes held briefly (SPEC.md "Approvals", `--ask-dir-hold S`). create, mkdir,
//! mknod, symlink, link, unlink, rmdir and rename keep their parent directory locked in the
//! kernel while they wait, so the table holds them at most `S` and then refuses the caller
//! while their question stays posted. This module keeps the clocks and memory that takes:
//!
//! - [`Windows`]: the changes held in one directory share one window, opened by the first
//!   of them and ending `S` after it. A window that runs out with a change still held (its
//!   approver did not answer in time) is followed by a rest of `S` in which nothing in
//!   that directory is held (questions are posted, callers refused at once). So a caller
//!   queued on a directory's lock waits at most about `S` for held changes, however many
//!   processes and uids queue changes ahead of it.
//! - [`Grants`]: an allow given after its caller was refused, remembered for that uid and
//!   exactly those paths for [`RETRY_GRANT`], so the retry passes without a second question.
//!
//! Invariants: pure bookkeeping on `Instant`s, no I/O and no lock of its own (the table's
//! lock guards it); bounded memory: windows that are over are pruned at every admission and
//! at most [`MAX_WINDOWS`] are kept (past that, nothing more is held: questions are
//! posted); expired grants are pruned whenever one is added.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an allow given after the caller was refused lets its retry through.
pub const RETRY_GRANT: Duration = Duration::from_secs(120);
/// A window with less than this left holds nothing more: the question is posted instead
/// (a hold that short only races its own expiry).
const MIN_HOLD: Duration = Duration::from_millis(100);
/// Directories with an open or resting window at once.
pub const MAX_WINDOWS: usize = 4 * super::MAX_HELD;

/// Whether the FUSE operation `op` changes its parent directory (the kernel holds that
/// directory's lock while the daemon answers).
pub fn is_dir_change(op: &str) -> bool {
    matches!(
        op,
        "create" | "mkdir" | "mknod" | "symlink" | "link" | "unlink" | "rmdir" | "rename" | "save"
    )
}

/// Whether the FUSE operation `op` keeps its target's own lock in the kernel while the
/// daemon answers (setattr: chmod, chown, utimes, truncate; setxattr; removexattr): held
/// like a directory change when that target is a directory.
pub fn is_inode_change(op: &str) -> bool {
    matches!(op, "setattr" | "setxattr" | "removexattr")
}

/// The directories a held `op` on `paths` keeps locked in the kernel: a directory
/// change's parents, an [`is_inode_change`]'s targets themselves.
pub fn locked(op: &str, paths: &[Vec<u8>]) -> Vec<Vec<u8>> {
    if is_inode_change(op) {
        let mut out: Vec<Vec<u8>> = Vec::new();
        for p in paths {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        return out;
    }
    parents(paths)
}

/// The parent directories of workspace paths (`""`: the workspace root), each once.
pub fn parents(paths: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for p in paths {
        let parent = match p.iter().rposition(|&b| b == b'/') {
            Some(i) => p[..i].to_vec(),
            None => Vec::new(),
        };
        if !out.contains(&parent) {
            out.push(parent);
        }
    }
    out
}

/// Whether two directory lists share a directory.
pub fn overlap(a: &[Vec<u8>], b: &[Vec<u8>]) -> bool {
    a.iter().any(|d| b.contains(d))
}

/// What a directory change gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Held until this instant at the latest.
    Hold(Instant),
    /// Not held: the caller is refused at once, its question posted.
    Post,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    /// Changes held in the directory end by then.
    end: Instant,
    /// After `end`, nothing is held in the directory until then.
    rest_until: Option<Instant>,
}

impl Window {
    fn live(&self, now: Instant) -> bool {
        now < self.end || self.rest_until.is_some_and(|r| now < r)
    }
}

/// Per-directory hold windows.
#[derive(Default)]
pub struct Windows {
    by_dir: HashMap<Vec<u8>, Window>,
}

impl Windows {
    /// Whether a change in `dirs` may be held now (`s`: `--ask-dir-hold`), and until when.
    /// Holding opens a window in each of `dirs` that has none.
    pub fn admit(&mut self, dirs: &[Vec<u8>], now: Instant, s: Duration) -> Admit {
        if s.is_zero() {
            return Admit::Post;
        }
        self.by_dir.retain(|_, w| w.live(now));
        let mut until = now + s;
        let mut fresh = 0;
        for d in dirs {
            match self.by_dir.get(d) {
                Some(w) if now < w.end => until = until.min(w.end),
                Some(_) => return Admit::Post, // resting
                None => fresh += 1,
            }
        }
        if until.saturating_duration_since(now) < MIN_HOLD
            || self.by_dir.len() + fresh > MAX_WINDOWS
        {
            return Admit::Post;
        }
        for d in dirs {
            self.by_dir.entry(d.clone()).or_insert(Window {
                end: now + s,
                rest_until: None,
            });
        }
        Admit::Hold(until)
    }

    /// A change held in `dirs` ran out unanswered: each of `dirs` rests for `s` once its
    /// window is over.
    pub fn ran_out(&mut self, dirs: &[Vec<u8>], now: Instant, s: Duration) {
        for d in dirs {
            let w = self.by_dir.entry(d.clone()).or_insert(Window {
                end: now,
                rest_until: None,
            });
            let rest = w.end.max(now) + s;
            w.rest_until = Some(w.rest_until.map_or(rest, |r| r.max(rest)));
        }
    }

    /// Directories with an open or resting window (pruned at the next admission).
    pub fn len(&self) -> usize {
        self.by_dir.len()
    }

    /// Whether no directory has a window.
    pub fn is_empty(&self) -> bool {
        self.by_dir.is_empty()
    }
}

/// Allows given after the caller was refused: uid → (exact path, until).
#[derive(Default)]
pub struct Grants {
    by_uid: HashMap<u32, Vec<(Vec<u8>, Instant)>>,
}

impl Grants {
    /// Lets `uid` through on each of `paths` until `until`.
    pub fn grant(&mut self, uid: u32, paths: &[Vec<u8>], until: Instant, now: Instant) {
        self.by_uid.retain(|_, l| {
            l.retain(|(_, u)| now < *u);
            !l.is_empty()
        });
        let list = self.by_uid.entry(uid).or_default();
        for p in paths {
            match list.iter_mut().find(|(q, _)| q == p) {
                Some(e) => e.1 = e.1.max(until),
                None => list.push((p.clone(), until)),
            }
        }
    }

    /// Whether `uid` may pass on `path` now.
    pub fn covers(&self, uid: u32, path: &[u8], now: Instant) -> bool {
        self.by_uid
            .get(&uid)
            .is_some_and(|l| l.iter().any(|(q, u)| q == path && now < *u))
    }

    /// Forgets every grant (a reload).
    pub fn clear(&mut self) {
        self.by_uid.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(5);

    fn d(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn directory_changes_and_their_parents() {
        for op in [
            "create", "mkdir", "mknod", "symlink", "link", "unlink", "rmdir", "rename",
        ] {
            assert!(is_dir_change(op), "{op}");
        }
        for op in [
            "open",
            "setattr",
            "setxattr",
            "fallocate",
            "copy_file_range",
        ] {
            assert!(!is_dir_change(op), "{op}");
        }
        assert_eq!(
            parents(&[d("docs/a.md"), d("docs/b.md"), d("top"), d("x/y/z")]),
            vec![d("docs"), d(""), d("x/y")]
        );
        assert!(overlap(&[d("docs"), d("a")], &[d("b"), d("docs")]));
        // chmod/setxattr of docs itself locks docs, as a create in docs does.
        for op in ["setattr", "setxattr", "removexattr"] {
            assert!(is_inode_change(op) && !is_dir_change(op), "{op}");
            assert_eq!(locked(op, &[d("docs"), d("docs")]), vec![d("docs")]);
        }
        assert_eq!(locked("create", &[d("docs/a")]), vec![d("docs")]);
        assert!(!overlap(&[d("docs")], &[d("docs/sub")]));
    }

    #[test]
    fn changes_in_one_directory_share_one_window() {
        let mut w = Windows::default();
        let t0 = Instant::now();
        assert_eq!(w.admit(&[d("docs")], t0, S), Admit::Hold(t0 + S));
        // A second change in docs 2 s later ends with the first window, not 5 s after it.
        let t2 = t0 + Duration::from_secs(2);
        assert_eq!(w.admit(&[d("docs")], t2, S), Admit::Hold(t0 + S));
        // A rename between docs and a fresh directory is bound by the earlier window.
        assert_eq!(w.admit(&[d("docs"), d("src")], t2, S), Admit::Hold(t0 + S));
        // Another directory has its own window.
        assert_eq!(w.admit(&[d("other")], t2, S), Admit::Hold(t2 + S));
        // Almost over: posted rather than held for a few milliseconds.
        let late = t0 + S - Duration::from_millis(50);
        assert_eq!(w.admit(&[d("docs")], late, S), Admit::Post);
        // Over, nothing ran out: the next change opens a new window.
        let t6 = t0 + Duration::from_secs(6);
        assert_eq!(w.admit(&[d("docs")], t6, S), Admit::Hold(t6 + S));
        // 0 s: nothing is ever held.
        assert_eq!(w.admit(&[d("new")], t6, Duration::ZERO), Admit::Post);
    }

    #[test]
    fn a_window_that_ran_out_rests_its_directory() {
        let mut w = Windows::default();
        let t0 = Instant::now();
        assert_eq!(w.admit(&[d("docs")], t0, S), Admit::Hold(t0 + S));
        w.ran_out(&[d("docs")], t0 + S, S);
        for after in [S, S + Duration::from_secs(4)] {
            assert_eq!(
                w.admit(&[d("docs")], t0 + after, S),
                Admit::Post,
                "{after:?}"
            );
            // A rename touching the resting directory is not held either.
            assert_eq!(w.admit(&[d("src"), d("docs")], t0 + after, S), Admit::Post);
        }
        let t10 = t0 + 2 * S;
        assert_eq!(w.admit(&[d("docs")], t10, S), Admit::Hold(t10 + S));
    }

    #[test]
    fn windows_are_bounded_and_pruned() {
        let mut w = Windows::default();
        let t0 = Instant::now();
        for i in 0..MAX_WINDOWS {
            assert!(matches!(
                w.admit(&[d(&format!("d{i}"))], t0, S),
                Admit::Hold(_)
            ));
        }
        assert_eq!(
            w.admit(&[d("one-more")], t0, S),
            Admit::Post,
            "at the bound"
        );
        assert_eq!(w.len(), MAX_WINDOWS);
        // Once they are over they go.
        let later = t0 + 2 * S;
        assert!(matches!(
            w.admit(&[d("one-more")], later, S),
            Admit::Hold(_)
        ));
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn grants_are_exact_per_uid_and_expire() {
        let mut g = Grants::default();
        let t0 = Instant::now();
        g.grant(1000, &[d("docs/a"), d("docs/b")], t0 + RETRY_GRANT, t0);
        assert!(g.covers(1000, b"docs/a", t0));
        assert!(g.covers(1000, b"docs/b", t0 + RETRY_GRANT - Duration::from_secs(1)));
        assert!(!g.covers(1000, b"docs/a/below", t0), "exactly those paths");
        assert!(!g.covers(1000, b"docs", t0));
        assert!(!g.covers(1001, b"docs/a", t0), "never another uid");
        assert!(!g.covers(1000, b"docs/a", t0 + RETRY_GRANT), "expired");
        // Adding prunes what expired.
        g.grant(1001, &[d("x")], t0 + 2 * RETRY_GRANT, t0 + RETRY_GRANT);
        assert!(!g.by_uid.contains_key(&1000));
        g.clear();
        assert!(!g.covers(1001, b"x", t0));
    }
}
