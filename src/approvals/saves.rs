//! Atomic saves as one question (SPEC.md "Approvals": "An atomic save is one question").
//! Agents and editors save NAME by creating a temporary sibling, writing it, setting its
//! mode and renaming it over NAME. In a directory whose changes an `ask` rule puts to a
//! person, the create of such a *recognised temporary name* ([`target`]) is allowed
//! provisionally, unasked, and so are that uid's writes, mode changes and removal of it;
//! the rename over NAME is the one question ("save", `write NAME`). This module is the
//! pure half: which names are temporary files, and the bounded table of provisional
//! temporary files ([`Temps`]). The file-system half (`fs/ops/saves.rs`) makes, lands and
//! removes them on the host.
//!
//! Invariants:
//! - A provisional file is exactly one `(uid, path)`: it lifts only that uid's refusals on
//!   that path, never another uid's, never another path (NAME is still asked for).
//! - Bounded: at most [`MAX_PER_UID`] provisional files per uid and [`MAX_TEMPS`] in all;
//!   past that, a create is decided as before (asked). Each lives at most [`TEMP_TTL`]
//!   unless its save question is open (then until that question ends, or [`PARKED_TTL`]).
//!   An expired one is handed back by [`Temps::due`] for the caller to remove from the host.
//! - No I/O, no lock of its own: the caller's lock guards a table.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Provisional temporary files one uid may have at once.
pub const MAX_PER_UID: usize = 16;
/// Provisional temporary files at once, all uids together.
pub const MAX_TEMPS: usize = 256;
/// How long a provisional file lives without a save question (its rename).
pub const TEMP_TTL: Duration = Duration::from_secs(60);
/// How long one whose save question is open lives at most (a safety net: the question's
/// end removes or lands it first).
pub const PARKED_TTL: Duration = Duration::from_secs(3600);
/// The most bytes a provisional file may hold (a write past it is EFBIG).
pub const MAX_TEMP_BYTES: u64 = 64 << 20;

/// What a new file's name says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A temporary file for one of these names in the same directory (most likely first).
    Named(Vec<Vec<u8>>),
    /// A temporary file of a tool that does not put the name in it (`sed -i`'s
    /// `sedXXXXXX`, Python's `tempfile` `tmpXXXXXXXX`).
    Nameless,
    /// Not a recognised temporary name.
    Not,
}

/// A random or counter suffix: 1 to 64 of `[A-Za-z0-9_-]` and `.`.
fn suffix(s: &[u8]) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// `n` to `m` characters, all of `ok`.
fn run_of(s: &[u8], n: usize, m: usize, ok: impl Fn(u8) -> bool) -> bool {
    (n..=m).contains(&s.len()) && s.iter().all(|&b| ok(b))
}

/// A plausible NAME: not empty, not `.`/`..`, no `/`.
fn name_ok(n: &[u8]) -> bool {
    !n.is_empty() && n != b"." && n != b".." && !n.contains(&b'/')
}

/// Which NAME(s) a new file called `name` is a temporary file for. Recognised (NAME: any
/// name; S: 1–64 of `[A-Za-z0-9._-]`; each also with a leading `.`):
/// `NAME.tmp`, `NAME.tmp.S`, `NAME.tmp-S`, `NAME.S.tmp`, `NAME~`; `.NAME.swp`/`.swx`
/// (vim); `.NAME.XXXXXX` (mkstemp: 6–12 alphanumerics). Nameless: `sedXXXXXX` (GNU
/// `sed -i`: 6 alphanumerics) and `tmpXXXXXXXX` (Python `tempfile`: 8 of `[a-z0-9_]`).
pub fn target(name: &[u8]) -> Target {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut add = |n: &[u8]| {
        if name_ok(n) && !out.iter().any(|o| o == n) {
            out.push(n.to_vec());
        }
    };
    let dotted = name.strip_prefix(b".");
    for body in [Some(name), dotted].into_iter().flatten() {
        if let Some(n) = body.strip_suffix(b".tmp") {
            add(n);
            // NAME.S.tmp
            if let Some(i) = n.iter().rposition(|&b| b == b'.')
                && suffix(&n[i + 1..])
            {
                add(&n[..i]);
            }
        }
        for sep in [&b".tmp."[..], b".tmp-"] {
            if let Some(i) = find_last(body, sep)
                && suffix(&body[i + sep.len()..])
            {
                add(&body[..i]);
            }
        }
        if let Some(n) = body.strip_suffix(b"~") {
            add(n);
        }
    }
    if let Some(body) = dotted {
        for ext in [&b".swp"[..], b".swx"] {
            if let Some(n) = body.strip_suffix(ext) {
                add(n);
            }
        }
        if let Some(i) = body.iter().rposition(|&b| b == b'.')
            && run_of(&body[i + 1..], 6, 12, |b| b.is_ascii_alphanumeric())
        {
            add(&body[..i]);
        }
    }
    if !out.is_empty() {
        return Target::Named(out);
    }
    let sed = name
        .strip_prefix(b"sed")
        .is_some_and(|s| run_of(s, 6, 6, |b| b.is_ascii_alphanumeric()));
    let py = name.strip_prefix(b"tmp").is_some_and(|s| {
        run_of(s, 8, 8, |b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'
        })
    });
    if sed || py {
        Target::Nameless
    } else {
        Target::Not
    }
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    (0..hay.len().saturating_sub(needle.len() - 1))
        .rev()
        .find(|&i| hay[i..].starts_with(needle))
}

/// One provisional temporary file.
#[derive(Debug)]
pub struct Temp<T> {
    /// Alive until then (see [`TEMP_TTL`], [`PARKED_TTL`]).
    pub until: Instant,
    /// Its save question is open and its caller was refused (the directory's hold ran
    /// out): the file's content waits for that question's answer.
    pub parked: bool,
    /// What the file-system half keeps for it (`None` while it is being created).
    pub data: Option<T>,
}

/// The provisional temporary files: `(uid, path)` → [`Temp`].
#[derive(Debug)]
pub struct Temps<T> {
    by: HashMap<(u32, Vec<u8>), Temp<T>>,
}

impl<T> Default for Temps<T> {
    fn default() -> Self {
        Temps { by: HashMap::new() }
    }
}

impl<T> Temps<T> {
    /// Reserves `(uid, path)` as a provisional file being created; `false` when the bounds
    /// are reached (or it is already one). Call [`Temps::due`] first: expired ones count.
    pub fn admit(&mut self, uid: u32, path: &[u8], now: Instant) -> bool {
        let mine = self.by.keys().filter(|(u, _)| *u == uid).count();
        if mine >= MAX_PER_UID || self.by.len() >= MAX_TEMPS {
            return false;
        }
        let key = (uid, path.to_vec());
        if self.by.contains_key(&key) {
            return false;
        }
        let t = Temp {
            until: now + TEMP_TTL,
            parked: false,
            data: None,
        };
        self.by.insert(key, t);
        true
    }

    /// Gives a reserved file its data (once it exists on the host).
    pub fn fill(&mut self, uid: u32, path: &[u8], data: T) {
        if let Some(t) = self.by.get_mut(&(uid, path.to_vec())) {
            t.data = Some(data);
        }
    }

    /// Whether `uid`'s refusals on `path` are lifted now (a live provisional file).
    pub fn covers(&self, uid: u32, path: &[u8], now: Instant) -> bool {
        self.by
            .get(&(uid, path.to_vec()))
            .is_some_and(|t| now < t.until)
    }

    /// Whether `path` is `uid`'s provisional file, parked or not.
    pub fn is_parked(&self, uid: u32, path: &[u8]) -> bool {
        self.by.get(&(uid, path.to_vec())).is_some_and(|t| t.parked)
    }

    /// Its save question's caller was refused: it waits for the answer.
    pub fn park(&mut self, uid: u32, path: &[u8], now: Instant) {
        if let Some(t) = self.by.get_mut(&(uid, path.to_vec())) {
            t.parked = true;
            t.until = now + PARKED_TTL;
        }
    }

    /// Removes it from the table (renamed into place, removed, landed or discarded).
    pub fn take(&mut self, uid: u32, path: &[u8]) -> Option<Temp<T>> {
        self.by.remove(&(uid, path.to_vec()))
    }

    /// Removes and returns the expired ones (`uid`, path, data) for removal from the host.
    pub fn due(&mut self, now: Instant) -> Vec<(u32, Vec<u8>, Option<T>)> {
        let gone: Vec<(u32, Vec<u8>)> = self
            .by
            .iter()
            .filter(|(_, t)| t.until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .filter_map(|k| self.by.remove(&k).map(|t| (k.0, k.1, t.data)))
            .collect()
    }

    /// Whether the data of some provisional file satisfies `f`.
    pub fn any(&self, f: impl Fn(&T) -> bool) -> bool {
        self.by.values().any(|t| t.data.as_ref().is_some_and(&f))
    }

    /// The next expiry, if any file is provisional.
    pub fn next(&self) -> Option<Instant> {
        self.by.values().map(|t| t.until).min()
    }

    /// Provisional files now.
    pub fn len(&self) -> usize {
        self.by.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.by.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(n: &str) -> Vec<String> {
        match target(n.as_bytes()) {
            Target::Named(v) => v
                .into_iter()
                .map(|b| String::from_utf8(b).unwrap())
                .collect(),
            other => panic!("{n}: {other:?}"),
        }
    }

    #[test]
    fn recognised_temporary_names() {
        assert_eq!(named("a.md.tmp.123"), ["a.md"]);
        assert_eq!(named("a.md.tmp.4242.1733450000000"), ["a.md"]);
        assert_eq!(named("a.md.tmp.x7Gq-z_k"), ["a.md"]);
        assert_eq!(named("a.md.tmp-123"), ["a.md"]);
        assert_eq!(named("a.md.tmp")[0], "a.md", "the likeliest first");
        assert!(named("a.md.3f2a.tmp").contains(&"a.md".to_string()));
        assert_eq!(named("a.md~"), ["a.md"]);
        assert!(named(".a.md.swp").contains(&"a.md".to_string()));
        assert!(named(".a.md.Xy12Ab").contains(&"a.md".to_string()));
        assert!(named(".a.md.tmp.9").contains(&"a.md".to_string()));
        assert_eq!(target(b"sedAb12Cd"), Target::Nameless);
        assert_eq!(target(b"tmpk2_9ab0c"), Target::Nameless);
        for not in [
            "a.md",
            "notes.txt",
            "sed",
            "sedx",
            "tmp",
            "tmpABCDEFGH",
            ".tmp",
            "~",
            ".a.md.12",
            "a.md.tmp.",
        ] {
            assert_eq!(target(not.as_bytes()), Target::Not, "{not}");
        }
        assert_eq!(target(b"a.md"), Target::Not);
        assert_eq!(target(b".tmp"), Target::Not);
        assert_eq!(target(b"~"), Target::Not);
    }

    #[test]
    fn temps_are_bounded_per_uid_and_in_all_and_expire() {
        let mut t: Temps<u8> = Temps::default();
        let t0 = Instant::now();
        for i in 0..MAX_PER_UID {
            assert!(t.admit(1000, format!("d/a.tmp.{i}").as_bytes(), t0));
        }
        assert!(!t.admit(1000, b"d/a.tmp.x", t0), "per uid");
        assert!(!t.admit(1001, b"d/a.tmp.0", t0) || t.len() <= MAX_TEMPS);
        assert!(t.covers(1000, b"d/a.tmp.3", t0));
        assert!(!t.covers(1002, b"d/a.tmp.3", t0), "never another uid");
        assert!(!t.covers(1000, b"d/a", t0), "never another path");
        for u in 2000..2000 + (MAX_TEMPS as u32) {
            t.admit(u, b"x.tmp", t0);
        }
        assert_eq!(t.len(), MAX_TEMPS, "in all");
        t.park(1000, b"d/a.tmp.3", t0);
        assert!(t.is_parked(1000, b"d/a.tmp.3"));
        let gone = t.due(t0 + TEMP_TTL);
        assert_eq!(gone.len(), MAX_TEMPS - 1, "all but the parked one expired");
        assert!(t.covers(1000, b"d/a.tmp.3", t0 + TEMP_TTL));
        assert!(t.take(1000, b"d/a.tmp.3").is_some());
        assert!(t.is_empty() && t.next().is_none());
    }
}
