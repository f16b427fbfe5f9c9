//! Ignore files (`ignore_files = [".aiignore", ...]`): what they match gets access `none`.
//! PURE: the files' contents come in as data ([`IgnoreSource`], read by the host side at
//! start, on reload and when the host watch sees one change); nothing here reads a file.
//!
//! # Semantics (gitignore's, through the `ignore` crate's matcher)
//!
//! A file at directory `D` applies to paths below `D`, relative to `D`: `!` re-includes, a
//! leading `/` anchors at `D`, a trailing `/` matches directories only, a pattern without
//! `/` matches at any depth. For one path, each of its prefixes is checked from the top:
//! the prefix is hidden when the deepest ignore file (at a directory above it) with a
//! matching line says "ignore" (the last matching line of that file decides, as in git).
//! A hidden directory hides everything below it, whatever deeper files say (git does not
//! descend into an excluded directory either). Among several ignore-file names in the same
//! directory, the one listed later in `ignore_files` takes precedence.
//!
//! Invariants: at most [`MAX_PATTERNS`] pattern lines in all; an ignore file's own name (as the last component) is never hidden by an
//! ignore file (it stays readable; its directory can still hide it); a set is compiled
//! whole or not at all (an unparsable line is an error naming file and line); deciding a
//! path reads nothing and allocates only the prefix key.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::PolicyError;

/// Most pattern lines (not blank, not comments) of all ignore files together: more fail
/// the compile (a hostile repository cannot make the matchers take unbounded time or
/// memory to build).
pub const MAX_PATTERNS: usize = 10_000;

/// One ignore file's contents, as the host side read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnoreSource {
    /// The directory holding it, workspace-relative (`b""`: SOURCE's root).
    pub dir: Vec<u8>,
    /// Its name (one of `ignore_files`).
    pub name: String,
    /// Its text (invalid UTF-8 already replaced).
    pub text: String,
}

impl IgnoreSource {
    /// The file's workspace-relative path.
    pub fn path(&self) -> Vec<u8> {
        join(&self.dir, self.name.as_bytes())
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// One compiled ignore file.
#[derive(Debug)]
struct Compiled {
    /// Its workspace-relative path.
    path: Vec<u8>,
    /// The `ignore_files` index of its name (precedence within a directory).
    rank: usize,
    matcher: Gitignore,
    /// Its text, for [`IgnoreSet::describe`].
    text: String,
    /// The directory holding it (workspace-relative).
    dir: Vec<u8>,
    /// Its patterns that name a path (a `/` before the end), as components: the ones a
    /// directory rename can change the answer of (see [`IgnoreSet::dir_rename_keeps_hides`]).
    anchored: Vec<Vec<Vec<u8>>>,
}

/// Which line of which ignore file hid a path (see [`IgnoreSet::describe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IgnoreHit {
    /// Index of the ignore file in the set.
    pub file: usize,
    /// 1-based line of the deciding pattern.
    pub line: usize,
}

/// The compiled ignore files of one policy. Empty when no layer sets `ignore_files`.
#[derive(Debug, Default)]
pub struct IgnoreSet {
    /// The `ignore_files` names, in precedence order (later wins within a directory).
    names: Vec<String>,
    files: Vec<Compiled>,
    /// Directory → indices into `files`, highest precedence first.
    by_dir: HashMap<Vec<u8>, Vec<usize>>,
    /// Every component of every directory holding an ignore file (see [`IgnoreSet::affects`]).
    dir_names: HashSet<Vec<u8>>,
}

impl IgnoreSet {
    /// Compiles the ignore files found (`sources`) for the names `names`. Every
    /// unparsable line is an error at `file:line:1`; any error fails the whole set.
    pub fn compile(
        names: &[String],
        sources: &[IgnoreSource],
    ) -> Result<IgnoreSet, Vec<PolicyError>> {
        let mut set = IgnoreSet {
            names: names.to_vec(),
            ..IgnoreSet::default()
        };
        let mut errors = Vec::new();
        let patterns = sources
            .iter()
            .flat_map(|s| s.text.lines())
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .count();
        if patterns > MAX_PATTERNS {
            return Err(vec![PolicyError {
                file: "SOURCE".into(),
                line: 0,
                column: 0,
                message: format!(
                    "ignore_files: more than {MAX_PATTERNS} patterns in the ignore files together"
                ),
            }]);
        }
        for src in sources {
            let Some(rank) = names.iter().position(|n| *n == src.name) else {
                continue;
            };
            let path = src.path();
            let shown = format!("SOURCE/{}", String::from_utf8_lossy(&path));
            let mut b = GitignoreBuilder::new("/");
            for (k, line) in src.text.lines().enumerate() {
                // The line number rides in the glob's `from` (see `describe`).
                if let Err(e) = b.add_line(Some(PathBuf::from((k + 1).to_string())), line) {
                    errors.push(PolicyError {
                        file: shown.clone(),
                        line: k + 1,
                        column: 1,
                        message: format!("invalid ignore pattern: {e}"),
                    });
                }
            }
            match b.build() {
                Ok(matcher) => set.files.push(Compiled {
                    path,
                    rank,
                    matcher,
                    text: src.text.clone(),
                    dir: src.dir.clone(),
                    anchored: anchored_patterns(&src.text),
                }),
                Err(e) => errors.push(PolicyError {
                    file: shown,
                    line: 0,
                    column: 0,
                    message: format!("the ignore patterns do not compile: {e}"),
                }),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        for (i, f) in set.files.iter().enumerate() {
            let dir = f.path[..f.path.len() - set.names[f.rank].len()]
                .strip_suffix(b"/")
                .unwrap_or_default()
                .to_vec();
            set.by_dir.entry(dir).or_default().push(i);
        }
        set.dir_names = set
            .by_dir
            .keys()
            .flat_map(|d| d.split(|&c| c == b'/'))
            .filter(|c| !c.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        for list in set.by_dir.values_mut() {
            list.sort_by_key(|&i| std::cmp::Reverse(set.files[i].rank));
        }
        Ok(set)
    }

    /// The names ignore files go by (every layer's `ignore_files`).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The ignore files compiled, as read (what a reload whose scan fails keeps).
    pub fn sources(&self) -> Vec<IgnoreSource> {
        self.files
            .iter()
            .map(|f| IgnoreSource {
                dir: f.dir.clone(),
                name: self.names[f.rank].clone(),
                text: f.text.clone(),
            })
            .collect()
    }

    /// Number of ignore files compiled.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// No ignore file was found (or none is named).
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Whether `name` is one of the names ignore files go by.
    pub fn is_ignore_name(&self, name: &[u8]) -> bool {
        self.names.iter().any(|n| n.as_bytes() == name)
    }

    /// Whether `path` is an ignore file (by its last component), found or not.
    pub fn is_ignore_file(&self, path: &[u8]) -> bool {
        !self.names.is_empty() && self.is_ignore_name(last(path))
    }

    /// Whether a host change to an entry called `name` may change the ignore files found:
    /// it is an ignore file's name or a component of a directory holding one.
    pub fn affects(&self, name: &[u8]) -> bool {
        self.is_ignore_name(name) || self.dir_names.contains(name)
    }

    /// Whether some ignore file lies at or below directory `dir` (`b""`: everywhere).
    pub fn holds_ignore_file(&self, dir: &[u8]) -> bool {
        self.by_dir.keys().any(|d| under(d, dir))
    }

    /// Whether renaming directory `old` to `new` leaves every ignore file's answer for
    /// the entries below it as it was: the same ignore files stand above both names (a
    /// move under a directory whose file says `!name` would re-include what an upper file
    /// hides), and none of them has a pattern naming a path that could reach below
    /// either name (`vault/keys` hides nothing once `vault` is renamed). Patterns without
    /// a `/` match names at any depth and stand alike under both.
    pub fn dir_rename_keeps_hides(&self, old: &[u8], new: &[u8]) -> bool {
        if self.files.is_empty() {
            return true;
        }
        let above = |p: &[u8]| -> Vec<usize> {
            (0..self.files.len())
                .filter(|&i| self.files[i].dir != p && under(p, &self.files[i].dir))
                .collect()
        };
        let chain = above(old);
        if chain != above(new) {
            return false;
        }
        chain.iter().all(|&i| {
            let f = &self.files[i];
            let rel = |p: &[u8]| -> Vec<Vec<u8>> {
                let r = if f.dir.is_empty() {
                    p
                } else {
                    &p[f.dir.len() + 1..]
                };
                r.split(|&c| c == b'/').map(<[u8]>::to_vec).collect()
            };
            let (o, n) = (rel(old), rel(new));
            !f.anchored
                .iter()
                .any(|pat| could_reach(pat, &o) || could_reach(pat, &n))
        })
    }

    /// The ignore file and line that hide `path` (a directory when `is_dir`), if any.
    pub fn hides(&self, path: &[u8], is_dir: bool) -> Option<IgnoreHit> {
        if self.files.is_empty() || path.is_empty() {
            return None;
        }
        let mut ends: Vec<usize> = path
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c == b'/')
            .map(|(i, _)| i)
            .collect();
        ends.push(path.len());
        for (k, &end) in ends.iter().enumerate() {
            let prefix = &path[..end];
            let last_one = k + 1 == ends.len();
            if last_one && self.is_ignore_name(last(prefix)) {
                return None;
            }
            let prefix_is_dir = !last_one || is_dir;
            if let Some(hit) = self.decide(prefix, &ends[..k], prefix_is_dir) {
                return Some(hit);
            }
        }
        None
    }

    /// The deepest ignore file above `prefix` with a matching line: `Some` when it says
    /// "ignore". `dirs_end` are the ends of `prefix`'s proper ancestor directories.
    fn decide(&self, prefix: &[u8], dirs_end: &[usize], is_dir: bool) -> Option<IgnoreHit> {
        for d in (0..=dirs_end.len()).rev() {
            let (dir, rel) = match d {
                0 => (&prefix[..0], prefix),
                _ => (&prefix[..dirs_end[d - 1]], &prefix[dirs_end[d - 1] + 1..]),
            };
            let Some(list) = self.by_dir.get(dir) else {
                continue;
            };
            for &i in list {
                match self.files[i]
                    .matcher
                    .matched(Path::new(OsStr::from_bytes(rel)), is_dir)
                {
                    Match::None => continue,
                    Match::Whitelist(_) => return None,
                    Match::Ignore(g) => {
                        let line = g
                            .from()
                            .and_then(|f| f.to_str())
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0);
                        return Some(IgnoreHit { file: i, line });
                    }
                }
            }
        }
        None
    }

    /// The name (last component) of the ignore file of `hit`.
    pub fn describe_name(&self, hit: IgnoreHit) -> &[u8] {
        self.files.get(hit.file).map_or(&b""[..], |f| last(&f.path))
    }

    /// The ignore file of `hit` (workspace-relative path) and the pattern of its line.
    pub fn describe(&self, hit: IgnoreHit) -> (String, String) {
        let Some(f) = self.files.get(hit.file) else {
            return (String::new(), String::new());
        };
        let glob = f
            .text
            .lines()
            .nth(hit.line.saturating_sub(1))
            .unwrap_or_default()
            .trim()
            .to_string();
        (String::from_utf8_lossy(&f.path).into_owned(), glob)
    }
}

/// The patterns of an ignore file's text that contain a `/` before their end (anchored
/// at its directory), split into components (`!`, a leading and a trailing `/` removed),
/// but for `**/name`: it matches a name at any depth.
fn anchored_patterns(text: &str) -> Vec<Vec<Vec<u8>>> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.strip_prefix('!').unwrap_or(l))
        .map(|l| l.strip_suffix('/').unwrap_or(l))
        .filter(|l| l.contains('/'))
        .map(|l| l.strip_prefix('/').unwrap_or(l))
        .filter(|l| {
            // `**/name` (and `/**/name`) matches names at any depth, as `name` does.
            let mut rest = *l;
            while let Some(r) = rest.strip_prefix("**/") {
                rest = r;
            }
            rest.len() == l.len() || rest.contains('/')
        })
        .map(|l| l.split('/').map(|c| c.as_bytes().to_vec()).collect())
        .collect()
}

/// Whether an anchored pattern (components) could match `dir` (components, relative to
/// the pattern's directory) or a path below it. Conservative: a component with a glob
/// character matches any, `**` anything below.
fn could_reach(pat: &[Vec<u8>], dir: &[Vec<u8>]) -> bool {
    for (k, d) in dir.iter().enumerate() {
        let Some(p) = pat.get(k) else {
            // The pattern names an ancestor of `dir`: not what moves.
            return false;
        };
        if p == b"**" {
            return true;
        }
        let glob = p.iter().any(|c| b"*?[\\".contains(c));
        if !glob && p != d {
            return false;
        }
    }
    true
}

fn last(path: &[u8]) -> &[u8] {
    path.rsplit(|&c| c == b'/').next().unwrap_or(path)
}

/// `path` is `dir` or lies below it (`b""` holds everything).
fn under(path: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() || path == dir || (path.starts_with(dir) && path.get(dir.len()) == Some(&b'/'))
}
