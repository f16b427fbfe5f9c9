//! Roots: the host directories (and the few daemon-made files) served in one mount, each
//! at its own path of the mount's namespace, besides SOURCE at the mount's root.
//!
//! A root is a layer under the inode table, not a special case in the operations: the
//! table asks [`Roots::at`] when it looks a name up (a root's point answers with the
//! root's own handle, whatever SOURCE holds there) and [`Roots::by_key`] when it resolves
//! a node (a root's node is never re-resolved through SOURCE). Everything below a root is
//! reached from that root's `O_PATH` handle by the same `*at` steps as SOURCE.
//!
//! Invariants:
//! - A root's path is normalized (relative, no `.`/`..`/empty component), unique, and
//!   never SOURCE's root; the handles are opened once, before the mount, and kept.
//! - Names and policy decisions are in the mount's namespace: a path below a root is the
//!   root's path joined with the path inside it; [`Roots::root_of`] says which root a path
//!   is in (the longest root path that covers it; `None`: SOURCE).
//! - Fences are facts of the layout, not policy: a [`Fence::Hidden`] path answers as
//!   absent (and cannot be created), a [`Fence::ReadOnly`] path cannot be changed (EROFS),
//!   a [`Fence::Kept`] one can be made but, once there, not changed nor removed (EROFS),
//!   in every mode and whatever the policy says; they only ever take access away.
//! - A root's point, and every directory above it, cannot be removed, renamed or
//!   replaced (EBUSY), and nothing moves or links across roots (EXDEV).
//! - PURE apart from the handles it holds: no syscall here.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

/// One root: a host directory (or file) served at `path`.
#[derive(Clone)]
pub struct Root {
    /// Where it appears in the mount (normalized, never empty).
    pub path: Vec<u8>,
    /// What it is on the host (messages only: the root is reached through `fd`).
    pub host: PathBuf,
    /// How `explain` and audit lines name it.
    pub label: String,
    /// The root's handle, opened before the mount.
    pub fd: Arc<OwnedFd>,
    /// The host identity behind `fd`: `(st_dev, st_ino)`, as the inode table's keys.
    pub key: (u64, u64),
    /// `S_IFMT` bits of the root.
    pub kind: u32,
    /// Whether readdir of its parent shows it (a hidden root is reached by name only).
    pub listed: bool,
}

/// What the layout itself forbids at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// Absent to every caller: lookups find nothing, creating it is refused (EACCES).
    Hidden,
    /// Read-only to every caller (EROFS for any change).
    ReadOnly,
    /// May be created, but an existing entry is never changed, renamed nor removed
    /// (EROFS): what must outlive whatever a caller runs (a repository's objects).
    Kept,
}

#[derive(Clone)]
struct FenceRule {
    path: Vec<u8>,
    /// Covers the paths below `path` too.
    below: bool,
    fence: Fence,
}

/// Says whether a path below a kept directory (relative to it) is to be kept.
pub type KeepShape = fn(&[u8]) -> bool;

/// Every root of a mount and the fences of their layout.
#[derive(Default, Clone)]
pub struct Roots {
    roots: Vec<Root>,
    fences: Vec<FenceRule>,
    /// `(dir, shape)`: the paths below `dir` whose rest has `shape` are [`Fence::Kept`].
    kept: Vec<(Vec<u8>, KeepShape)>,
    /// `(dir, kept)`: every entry of `dir` other than `kept` is hidden.
    only: Vec<(Vec<u8>, Vec<u8>)>,
    /// `(dir, names)`: every entry of `dir` other than `names` (and what is below it) is
    /// [`Fence::ReadOnly`], under the explicit fences.
    writable: Vec<(Vec<u8>, Vec<&'static [u8]>)>,
    /// `(served, name)`: paths below `served` are also decided as the same paths below
    /// `name` (a linked worktree's repository is decided as `.git` too).
    alias: Option<(Vec<u8>, Vec<u8>)>,
}

/// Normalizes a root path: relative, `/`-separated, no `.`, `..` or empty component.
pub fn normalize(path: &str) -> Result<Vec<u8>, String> {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(format!(
            "root path '{path}' is empty (the mount's root is SOURCE)"
        ));
    }
    if trimmed.starts_with('/') {
        return Err(format!(
            "root path '{path}' must be relative to the mount's root"
        ));
    }
    for c in trimmed.split('/') {
        if c.is_empty() || c == "." || c == ".." {
            return Err(format!(
                "root path '{path}' has an empty, '.' or '..' component"
            ));
        }
    }
    if trimmed.bytes().any(|b| b == 0) {
        return Err(format!("root path '{path}' holds a NUL byte"));
    }
    Ok(trimmed.as_bytes().to_vec())
}

fn covers(prefix: &[u8], path: &[u8]) -> bool {
    path.len() > prefix.len() && path.starts_with(prefix) && path[prefix.len()] == b'/'
}

fn parent_of(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[..i],
        None => b"",
    }
}

impl Roots {
    /// Adds a root; refuses a path already served by another root.
    pub fn add(&mut self, root: Root) -> Result<(), String> {
        if self.roots.iter().any(|r| r.path == root.path) {
            return Err(format!(
                "root path '{}' is given twice",
                String::from_utf8_lossy(&root.path)
            ));
        }
        self.roots.push(root);
        Ok(())
    }

    /// Fences `path` (and, with `below`, every path under it).
    pub fn fence(&mut self, path: &[u8], below: bool, fence: Fence) {
        self.fences.push(FenceRule {
            path: path.to_vec(),
            below,
            fence,
        });
    }

    /// Keeps (see [`Fence::Kept`]) every path below `dir` whose rest has `shape`.
    pub fn keep(&mut self, dir: &[u8], shape: KeepShape) {
        self.kept.push((dir.to_vec(), shape));
    }

    /// Whether `path` is a kept directory, inside one or above one: moved, what is kept
    /// there would move out of its shape (and could then be removed).
    pub fn holds_kept(&self, path: &[u8]) -> bool {
        self.kept
            .iter()
            .any(|(dir, _)| dir == path || covers(dir, path) || covers(path, dir))
    }

    /// Hides every entry of directory `dir` except `kept`.
    pub fn keep_only(&mut self, dir: &[u8], kept: &[u8]) {
        self.only.push((dir.to_vec(), kept.to_vec()));
    }

    /// Makes every entry of directory `dir` read-only (with what is below it) except
    /// `names`; the explicit fences ([`Roots::fence`]) still apply on top, below `names`
    /// too. For a directory whose entries are mostly not the mount's to change.
    pub fn writable_only(&mut self, dir: &[u8], names: &[&'static [u8]]) {
        self.writable.push((dir.to_vec(), names.to_vec()));
    }

    /// Decides every path below `served` also as the same path below `name`.
    pub fn alias(&mut self, served: &[u8], name: &[u8]) {
        self.alias = Some((served.to_vec(), name.to_vec()));
    }

    /// The second name `path` is decided under (see [`Roots::alias`]), if any.
    pub fn alias_of(&self, path: &[u8]) -> Option<Vec<u8>> {
        let (served, name) = self.alias.as_ref()?;
        if path == served.as_slice() {
            return Some(name.clone());
        }
        covers(served, path).then(|| {
            let mut p = name.clone();
            p.extend_from_slice(&path[served.len()..]);
            p
        })
    }

    /// Whether the mount has no root besides SOURCE and no fence.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
            && self.fences.is_empty()
            && self.only.is_empty()
            && self.kept.is_empty()
            && self.writable.is_empty()
    }

    /// Every root, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = &Root> {
        self.roots.iter()
    }

    /// Whether some root's last component is `name` (a cheap test before [`Roots::at`]).
    pub fn may_be_point(&self, name: &[u8]) -> bool {
        self.roots
            .iter()
            .any(|r| r.path.rsplit(|&b| b == b'/').next() == Some(name))
    }

    /// The root served exactly at `path`.
    pub fn at(&self, path: &[u8]) -> Option<&Root> {
        self.roots.iter().find(|r| r.path == path)
    }

    /// Whether `path` is a root's point or a directory above one (neither is removed,
    /// renamed nor replaced: a root's files keep their one path in the mount).
    pub fn holds_point(&self, path: &[u8]) -> bool {
        self.roots
            .iter()
            .any(|r| r.path == path || covers(path, &r.path))
    }

    /// The handle of the root whose host identity is `key`.
    pub fn by_key(&self, key: (u64, u64)) -> Option<Arc<OwnedFd>> {
        self.roots
            .iter()
            .find(|r| r.key == key)
            .map(|r| r.fd.clone())
    }

    /// The root `path` is in (`None`: SOURCE).
    pub fn root_of(&self, path: &[u8]) -> Option<&Root> {
        self.roots
            .iter()
            .filter(|r| r.path == path || covers(&r.path, path))
            .max_by_key(|r| r.path.len())
    }

    /// The budget id of the root `path` is in (`host/budget.rs`): its host identity,
    /// `(0, 0)` for SOURCE.
    pub fn id_of(&self, path: &[u8]) -> (u64, u64) {
        self.root_of(path).map_or((0, 0), |r| r.key)
    }

    /// Whether two paths are in the same root.
    pub fn same_root(&self, a: &[u8], b: &[u8]) -> bool {
        let key = |p: &[u8]| self.root_of(p).map(|r| r.path.clone());
        key(a) == key(b)
    }

    /// The label of the root `path` is in (`"SOURCE"` for SOURCE).
    pub fn label_of(&self, path: &[u8]) -> &str {
        self.root_of(path).map_or("SOURCE", |r| r.label.as_str())
    }

    /// What the layout forbids at `path` (`Hidden` before `ReadOnly` before `Kept`).
    pub fn fence_at(&self, path: &[u8]) -> Option<Fence> {
        let hidden_by_only = self.only.iter().any(|(dir, kept)| {
            covers(dir, path) && {
                let rest = &path[dir.len() + 1..];
                let first = rest.split(|&b| b == b'/').next().unwrap_or(rest);
                first != kept.as_slice()
            }
        });
        let kept = self
            .kept
            .iter()
            .any(|(dir, shape)| covers(dir, path) && shape(&path[dir.len() + 1..]));
        let read_only = self.writable.iter().any(|(dir, names)| {
            covers(dir, path) && {
                let rest = &path[dir.len() + 1..];
                let first = rest.split(|&b| b == b'/').next().unwrap_or(rest);
                !names.contains(&first)
            }
        });
        let mut found = hidden_by_only
            .then_some(Fence::Hidden)
            .or(kept.then_some(Fence::Kept))
            .or(read_only.then_some(Fence::ReadOnly));
        for f in &self.fences {
            if f.path == path || (f.below && covers(&f.path, path)) {
                match (found, f.fence) {
                    (Some(Fence::Hidden), _) => {}
                    _ => found = Some(f.fence),
                }
            }
        }
        found
    }

    /// Whether a listing of directory `dir` can differ from the host's: a root's point or
    /// a fenced path is an entry of it, or it lies in a fenced part (cheap: a listing
    /// elsewhere skips the per-entry checks).
    pub fn may_change_listing(&self, dir: &[u8]) -> bool {
        let near =
            |p: &[u8], below: bool| parent_of(p) == dir || (below && (p == dir || covers(p, dir)));
        self.roots.iter().any(|r| parent_of(&r.path) == dir)
            || self.fences.iter().any(|f| near(&f.path, f.below))
            || self.only.iter().any(|(d, _)| d == dir || covers(d, dir))
    }

    /// The listed roots whose point is an entry of directory `dir`.
    pub fn listed_in<'a>(&'a self, dir: &'a [u8]) -> impl Iterator<Item = &'a Root> + 'a {
        self.roots
            .iter()
            .filter(move |r| r.listed && parent_of(&r.path) == dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(path: &str) -> Root {
        let fd: OwnedFd = std::fs::File::open("/").unwrap().into();
        Root {
            path: normalize(path).unwrap(),
            host: "/".into(),
            label: path.to_string(),
            fd: Arc::new(fd),
            key: (0, path.len() as u64),
            kind: libc::S_IFDIR,
            listed: true,
        }
    }

    #[test]
    fn paths_are_normalized_or_refused() {
        assert_eq!(normalize("data/").unwrap(), b"data");
        assert_eq!(normalize("a/b").unwrap(), b"a/b");
        for bad in ["", "/", "/abs", "a//b", "./a", "a/..", "a/./b"] {
            assert!(normalize(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_longest_root_decides_and_source_is_none() {
        let mut r = Roots::default();
        r.add(root("data")).unwrap();
        r.add(root("data/inner")).unwrap();
        assert!(r.add(root("data")).is_err());
        assert!(r.root_of(b"src/main.rs").is_none());
        assert!(r.root_of(b"database").is_none());
        assert_eq!(r.root_of(b"data").unwrap().path, b"data");
        assert_eq!(r.root_of(b"data/x").unwrap().path, b"data");
        assert_eq!(r.root_of(b"data/inner/y").unwrap().path, b"data/inner");
        assert!(r.same_root(b"a", b"b/c"));
        assert!(!r.same_root(b"a", b"data/c"));
        assert!(!r.same_root(b"data/a", b"data/inner/c"));
        assert_eq!(r.label_of(b"x"), "SOURCE");
        assert!(r.may_be_point(b"inner") && !r.may_be_point(b"x"));
        assert!(r.holds_point(b"data") && r.holds_point(b"data/inner"));
        let mut n = Roots::default();
        n.add(root("a/b")).unwrap();
        assert!(n.holds_point(b"a") && n.holds_point(b"a/b"));
        assert!(!n.holds_point(b"a/b/c") && !n.holds_point(b"ab") && !n.holds_point(b"a/bc"));
        let listed: Vec<_> = r.listed_in(b"").map(|r| r.path.clone()).collect();
        assert_eq!(listed, vec![b"data".to_vec()]);
    }

    #[test]
    fn fences_hide_before_they_pin() {
        let mut r = Roots::default();
        r.fence(b"g/hooks", true, Fence::ReadOnly);
        r.fence(b"g/config", false, Fence::ReadOnly);
        r.keep_only(b"g/worktrees", b"wt");
        assert_eq!(r.fence_at(b"g/hooks"), Some(Fence::ReadOnly));
        assert_eq!(r.fence_at(b"g/hooks/pre-commit"), Some(Fence::ReadOnly));
        assert_eq!(r.fence_at(b"g/config"), Some(Fence::ReadOnly));
        assert_eq!(r.fence_at(b"g/config/x"), None);
        assert_eq!(r.fence_at(b"g/configx"), None);
        assert_eq!(r.fence_at(b"g/worktrees"), None);
        assert_eq!(r.fence_at(b"g/worktrees/wt/HEAD"), None);
        assert_eq!(r.fence_at(b"g/worktrees/other"), Some(Fence::Hidden));
        assert_eq!(r.fence_at(b"g/worktrees/other/HEAD"), Some(Fence::Hidden));
        assert_eq!(r.fence_at(b"g/worktrees/wtx"), Some(Fence::Hidden));
        assert!(r.may_change_listing(b"g") && r.may_change_listing(b"g/worktrees"));
        assert!(r.may_change_listing(b"g/hooks") && r.may_change_listing(b"g/worktrees/o"));
        assert!(!r.may_change_listing(b"") && !r.may_change_listing(b"g/objects"));
        r.alias(b"g", b".git");
        assert_eq!(r.alias_of(b"g").unwrap(), b".git");
        assert_eq!(r.alias_of(b"g/hooks/x").unwrap(), b".git/hooks/x");
        assert_eq!(r.alias_of(b"gx/hooks"), None);
        assert_eq!(r.alias_of(b"src"), None);
    }

    #[test]
    fn writable_only_pins_every_other_entry_under_the_explicit_fences() {
        let mut r = Roots::default();
        r.writable_only(b"g", &[b"refs", b"logs", b"objects"]);
        r.fence(b"g/logs/HEAD", false, Fence::Hidden);
        r.fence(b"g/refs/bisect", true, Fence::ReadOnly);
        r.keep(b"g/objects", |rest| rest == b"ab");
        assert_eq!(r.fence_at(b"g"), None);
        for p in [
            "g/refs",
            "g/refs/heads/x",
            "g/logs/refs/heads/x",
            "g/objects/x",
        ] {
            assert_eq!(r.fence_at(p.as_bytes()), None, "{p}");
        }
        for p in [
            "g/MERGE_HEAD",
            "g/info/grafts",
            "g/refsx",
            "g/refs/bisect/bad",
        ] {
            assert_eq!(r.fence_at(p.as_bytes()), Some(Fence::ReadOnly), "{p}");
        }
        assert_eq!(r.fence_at(b"g/logs/HEAD"), Some(Fence::Hidden));
        assert_eq!(r.fence_at(b"g/objects/ab"), Some(Fence::Kept));
        assert_eq!(r.fence_at(b"other/MERGE_HEAD"), None);
        assert!(!r.is_empty());
    }
}
