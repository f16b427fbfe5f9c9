//! The inode table: FUSE node ids ↔ host files, the names they were seen under, and a
//! bounded cache of `O_PATH` handles.
//!
//! Invariants:
//! - A node is keyed by its host `(st_dev, st_ino)`; its FUSE id is the host inode number
//!   when the file lives on SOURCE's device (stable `st_ino` for git and friends), else a
//!   synthetic id. The root is always id 1.
//! - Each node records the `(parent id, name)` aliases it was seen under through the mount;
//!   its workspace paths are derived from those, so the policy decides on the logical path
//!   the caller used, never on a host path string. Directories have one alias.
//! - A node stays while the kernel holds lookups on it or a child names it as parent
//!   (`children`); forget is saturating.
//! - No fd is held per node: handles live in a bounded FIFO cache and are re-resolved from
//!   the parent's handle by one `openat(O_PATH|O_NOFOLLOW)` step, verified against the key,
//!   so a file swapped on the host is never mistaken for the one the kernel knows.
//! - Lock order: `table` before `fds`; no syscall while holding `table`.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, RwLock};

use super::path::join;
use super::roots::Roots;
use super::sys::{self, Name};
use super::union::Probed;

mod forget;
mod handles;
mod merged;
pub use merged::{MAX_STACK_PARTS, Peek, Peeked, Place, Up};
mod swap;
use forget::{Gone, maybe_remove};
use swap::settle_in;

/// FUSE id of the root.
pub const ROOT: u64 = 1;
const SYNTH_BASE: u64 = 1 << 62;

/// Host identity of a file.
pub type Key = (u64, u64);

struct Node {
    key: Key,
    /// Kernel file handle (directories, when host changes are watched).
    handle: Option<Box<[u8]>>,
    kind: u32,
    nlookup: u64,
    children: u64,
    aliases: Vec<(u64, Box<[u8]>)>,
    /// Handle kept for a node whose last alias was removed while still known to the kernel.
    pinned: Option<Arc<OwnedFd>>,
    /// The last path of a node whose every name was removed through the mount.
    gone: Option<Box<[u8]>>,
    /// The view under the mount was replaced ([`Inodes::swap_union`]): the file now at
    /// the node's first alias, if of the same kind, is this node (its key is re-read).
    loose: bool,
    /// Last seen as an upper entry of the merged view: a change needs no copy-up of it
    /// ([`Inodes::settled_file`]). (Another root's files are never settled: on a staged
    /// mount their changes go to the slow pool like a copy-up's.) Only a hint for where a
    /// request is served; every change still finds its object under the lock.
    settled: bool,
}

/// A node is the live upper's own object: seen there, and with at most one name. A node
/// with two names may be two objects of the merged view (hard links of SOURCE, one of them
/// copied up: the other name still shows SOURCE's; or a host inode number reused by a new
/// upper file): its changes find it again by name.
fn is_settled(n: &Node) -> bool {
    n.settled && n.aliases.len() <= 1
}

struct Table {
    nodes: HashMap<u64, Node>,
    by_key: HashMap<Key, u64>,
    by_name: HashMap<(u64, Box<[u8]>), u64>,
    /// Kernel file handles of known directories (for host change events).
    by_handle: HashMap<Box<[u8]>, u64>,
    next_synth: u64,
}

impl Table {
    fn add_alias(&mut self, ino: u64, parent: u64, name: &[u8]) {
        let Some(n) = self.nodes.get_mut(&ino) else {
            return;
        };
        if n.aliases
            .iter()
            .any(|(p, nm)| *p == parent && **nm == *name)
        {
            return;
        }
        n.aliases.push((parent, name.into()));
        n.pinned = None;
        n.gone = None;
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children += 1;
        }
        // A name maps to one node: a newer node under the same name replaces the old alias.
        if let Some(old) = self.by_name.insert((parent, name.into()), ino)
            && old != ino
            && let Some(o) = self.nodes.get_mut(&old)
        {
            let before = o.aliases.len();
            o.aliases.retain(|(p, nm)| !(*p == parent && **nm == *name));
            if o.aliases.len() != before
                && let Some(p) = self.nodes.get_mut(&parent)
            {
                p.children = p.children.saturating_sub(1);
            }
        }
    }

    /// Removes one alias; returns true when it existed.
    /// `path`: the workspace path `parent/name` when the caller has it built already.
    fn del_alias(&mut self, ino: u64, parent: u64, name: &[u8], path: Option<&[u8]>) -> bool {
        let Some(n) = self.nodes.get_mut(&ino) else {
            return false;
        };
        let before = n.aliases.len();
        n.aliases.retain(|(p, nm)| !(*p == parent && **nm == *name));
        if n.aliases.len() == before {
            return false;
        }
        if !n.aliases.is_empty() {
            // A name left of several: it may show another object than the one this node
            // is now (a SOURCE hard link whose other name was copied up): found by name.
            n.settled = false;
        }
        if n.aliases.is_empty() {
            // The path it was known under: kept, as its last name is gone (unlinked but
            // still open: it keeps the policy of the name it had). The parent's path is
            // built only here: other aliases name it still.
            let last = match path {
                Some(p) => Some(p.into()),
                None => path_below(self, parent, name).map(Vec::into_boxed_slice),
            };
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.gone = last;
            }
        }
        let k: (u64, Box<[u8]>) = (parent, name.into());
        if let Entry::Occupied(e) = self.by_name.entry(k)
            && *e.get() == ino
        {
            e.remove();
        }
        if let Some(p) = self.nodes.get_mut(&parent) {
            p.children = p.children.saturating_sub(1);
        }
        true
    }
}

struct FdCache {
    map: HashMap<u64, Arc<OwnedFd>>,
    order: VecDeque<u64>,
    cap: usize,
}

impl FdCache {
    fn get(&self, ino: u64) -> Option<Arc<OwnedFd>> {
        self.map.get(&ino).cloned()
    }
    /// Returns the handles it evicted, for the caller to drop once the lock is released.
    #[must_use]
    fn put(&mut self, ino: u64, fd: Arc<OwnedFd>) -> Vec<Arc<OwnedFd>> {
        let mut evicted: Vec<Arc<OwnedFd>> = self.map.insert(ino, fd).into_iter().collect();
        if evicted.is_empty() {
            self.order.push_back(ino);
        }
        // FIFO eviction; ids removed meanwhile are stale in `order` and skipped.
        while self.map.len() > self.cap {
            match self.order.pop_front() {
                Some(old) if old != ino => {
                    evicted.extend(self.map.remove(&old));
                }
                Some(old) => self.order.push_back(old),
                None => break,
            }
        }
        if self.order.len() > 2 * self.cap + 64 {
            let map = &self.map;
            let mut seen = std::collections::HashSet::with_capacity(map.len());
            self.order
                .retain(|i| map.contains_key(i) && seen.insert(*i));
        }
        evicted
    }
    /// The cached handle, for the caller to drop once the lock is released.
    fn remove(&mut self, ino: u64) -> Option<Arc<OwnedFd>> {
        // O(1): the id stays in `order` until eviction or compaction skips it.
        self.map.remove(&ino)
    }
}

/// The inode table.
pub struct Inodes {
    table: Mutex<Table>,
    fds: Mutex<FdCache>,
    root_fd: Mutex<Arc<OwnedFd>>,
    root_dev: std::sync::atomic::AtomicU64,
    watch_handles: AtomicBool,
    /// The view was swapped once ([`Inodes::swap_union`]): loose nodes may exist.
    swapped: AtomicBool,
    /// `/proc/self/fd`, to reopen `O_PATH` handles.
    pub proc_fd: OwnedFd,
    /// The roots served besides SOURCE (set before the mount; a reload may swap them
    /// when a linked worktree's state changed, `app/roots.rs`).
    roots: RwLock<Arc<Roots>>,
    /// With staging: SOURCE under the merged view, for host change events (`handles.rs`).
    event_source: Option<OwnedFd>,
    /// A staged mount's merged view, when the daemon serves it itself (`merged.rs`).
    union: RwLock<Option<Arc<crate::host::union::Union>>>,
    /// Its directories' parts, per node.
    stacks: merged::Stacks,
}

fn stale() -> io::Error {
    io::Error::from_raw_os_error(libc::ESTALE)
}

fn enoent() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOENT)
}

impl Inodes {
    /// A table for SOURCE, opened as `root_fd`; at most `fd_cap` cached handles.
    pub fn new(root_fd: OwnedFd, fd_cap: usize) -> io::Result<Inodes> {
        let st = sys::fstat(root_fd.as_fd())?;
        let mut nodes = HashMap::new();
        let key = (st.st_dev, st.st_ino);
        nodes.insert(
            ROOT,
            Node {
                key,
                handle: None,
                kind: st.st_mode & libc::S_IFMT,
                nlookup: 1,
                children: 0,
                aliases: Vec::new(),
                pinned: None,
                gone: None,
                loose: false,
                settled: true,
            },
        );
        let mut by_key = HashMap::new();
        by_key.insert(key, ROOT);
        Ok(Inodes {
            table: Mutex::new(Table {
                nodes,
                by_key,
                by_name: HashMap::new(),
                by_handle: HashMap::new(),
                next_synth: SYNTH_BASE,
            }),
            fds: Mutex::new(FdCache {
                map: HashMap::new(),
                order: VecDeque::new(),
                cap: fd_cap.max(64),
            }),
            root_fd: Mutex::new(Arc::new(root_fd)),
            root_dev: st.st_dev.into(),
            watch_handles: AtomicBool::new(false),
            swapped: AtomicBool::new(false),
            proc_fd: sys::open_proc_self_fd()?,
            roots: RwLock::new(Arc::new(Roots::default())),
            event_source: None,
            union: RwLock::new(None),
            stacks: merged::Stacks::default(),
        })
    }

    /// Serves `roots` besides SOURCE from now on (before the mount; on a reload, inside
    /// its no-cache window).
    pub fn set_roots(&self, roots: Roots) {
        *self.roots.write() = Arc::new(roots);
    }

    /// The roots served besides SOURCE now.
    pub fn roots(&self) -> Arc<Roots> {
        self.roots.read().clone()
    }

    /// The handle of SOURCE (opened before mounting), or of the merged view served now.
    pub fn root_fd(&self) -> Arc<OwnedFd> {
        self.root_fd.lock().clone()
    }

    fn root_dev(&self) -> u64 {
        self.root_dev.load(Ordering::Relaxed)
    }

    /// The FUSE ids that host files of SOURCE's device with these inode numbers have or
    /// would get (for readdir's `d_ino`), under one lock, and whether each has a node.
    pub fn ids_for(&self, inos: impl Iterator<Item = u64>) -> Vec<(u64, bool)> {
        let t = self.table.lock();
        let dev = self.root_dev();
        inos.map(|ino| match t.by_key.get(&(dev, ino)) {
            Some(&id) => (id, true),
            None if ino != ROOT && ino != 0 && ino < SYNTH_BASE => (ino, false),
            // Not a stable id, but only ever reported as d_ino.
            None => (ino | SYNTH_BASE, false),
        })
        .collect()
    }

    /// Whether a change of node `ino` can need a copy of a file's data first (a regular
    /// file last seen below the upper of a merged view): where the transport serves it.
    /// A hint (the copy-up itself decides under the union's lock): a node not known, or
    /// not seen since a view swap, may.
    pub fn may_copy_up(&self, ino: u64) -> bool {
        self.table
            .lock()
            .nodes
            .get(&ino)
            .is_none_or(|n| n.kind == libc::S_IFREG && !is_settled(n))
    }

    /// Whether node `ino` is a non-directory last seen as an upper object of the merged
    /// view (made or copied up through the mount): its handle is the staged entry itself,
    /// which only this daemon changes, and its base record was taken when it was made.
    pub fn settled_file(&self, ino: u64) -> bool {
        self.table
            .lock()
            .nodes
            .get(&ino)
            .is_some_and(|n| is_settled(n) && n.kind != libc::S_IFDIR)
    }

    /// The node's file type (`S_IFMT` bits).
    pub fn kind(&self, ino: u64) -> io::Result<u32> {
        self.table
            .lock()
            .nodes
            .get(&ino)
            .map(|n| n.kind)
            .ok_or_else(stale)
    }

    /// Every workspace path the node is known under (root: `[b""]`; a node unlinked
    /// through the mount: the last path it had), with its file type, under one lock.
    pub fn paths_kind(&self, ino: u64) -> io::Result<(Vec<Vec<u8>>, u32)> {
        let t = self.table.lock();
        let node = t.nodes.get(&ino).ok_or_else(stale)?;
        if ino == ROOT {
            return Ok((vec![Vec::new()], node.kind));
        }
        let mut out: Vec<Vec<u8>> = node
            .aliases
            .iter()
            .filter_map(|(parent, name)| path_below(&t, *parent, name))
            .collect();
        if out.is_empty()
            && let Some(g) = &node.gone
        {
            out.push(g.to_vec());
        }
        Ok((out, node.kind))
    }

    /// Every workspace path the node is known under.
    pub fn paths(&self, ino: u64) -> io::Result<Vec<Vec<u8>>> {
        Ok(self.paths_kind(ino)?.0)
    }

    /// The `(parent, name)` a node is known under (a directory has exactly one).
    pub fn alias(&self, ino: u64) -> Option<(u64, Vec<u8>)> {
        let t = self.table.lock();
        let (p, n) = t.nodes.get(&ino)?.aliases.first()?;
        Some((*p, n.to_vec()))
    }

    /// The node's handle if one is open already (no syscall).
    pub fn cached_fd(&self, ino: u64) -> Option<Arc<OwnedFd>> {
        if ino == ROOT {
            return Some(self.root_fd());
        }
        let pinned = self.table.lock().nodes.get(&ino)?.pinned.clone();
        pinned.or_else(|| self.fds.lock().get(ino))
    }

    /// The single workspace path of a directory node (or the first alias of a file).
    pub fn path(&self, ino: u64) -> io::Result<Vec<u8>> {
        self.paths(ino)?.into_iter().next().ok_or_else(enoent)
    }

    /// Caches an `O_PATH` handle of node `ino`, reopened from `file`, an open descriptor
    /// of exactly that object (a create's): the next request on the node finds it without
    /// a lookup. Best effort (a failed reopen caches nothing).
    pub fn cache_from(&self, ino: u64, file: std::os::fd::BorrowedFd<'_>) {
        if let Ok(fd) = sys::reopen(self.proc_fd.as_fd(), file, libc::O_PATH) {
            let evicted = self.fds.lock().put(ino, Arc::new(fd));
            drop(evicted); // closed unlocked
        }
    }

    /// The `O_PATH` handle of a node, re-resolved from its parent when not cached.
    pub fn fd(&self, ino: u64) -> io::Result<Arc<OwnedFd>> {
        if ino == ROOT {
            return Ok(self.root_fd());
        }
        if let Some(fd) = self.fds.lock().get(ino) {
            return Ok(fd);
        }
        self.resolve(ino, 0)
    }

    fn resolve(&self, ino: u64, depth: usize) -> io::Result<Arc<OwnedFd>> {
        if depth > 4096 {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        let (key, aliases, pinned, loose, nkind) = {
            let t = self.table.lock();
            let n = t.nodes.get(&ino).ok_or_else(stale)?;
            (n.key, n.aliases.clone(), n.pinned.clone(), n.loose, n.kind)
        };
        if let Some(p) = pinned {
            return Ok(p);
        }
        // A root's node is reached through the root's own handle, never through SOURCE.
        if let Some(fd) = self.roots().by_key(key) {
            return Ok(fd);
        }
        // Resource errors (EMFILE, ENOMEM, ...) are the caller's answer; a name that is
        // gone or names another file means this alias is stale.
        let resource = |e: &io::Error| {
            !matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ESTALE | libc::EINVAL)
            )
        };
        for (parent, name) in aliases {
            if let Some(u) = &self.union_for(parent) {
                let found = self.find(u, parent, &name);
                let f = match found {
                    Ok(Some(f)) => f,
                    Ok(None) => continue,
                    Err(e) if resource(&e) => return Err(e),
                    Err(_) => continue,
                };
                if loose && f.st.st_mode & libc::S_IFMT == nkind {
                    self.settle(ino, (f.st.st_dev, f.st.st_ino));
                } else if (f.st.st_dev, f.st.st_ino) != key {
                    continue;
                }
                let evicted = self.fds.lock().put(ino, f.fd.clone());
                drop(evicted);
                return Ok(f.fd);
            }
            let pfd = if parent == ROOT {
                self.root_fd()
            } else if let Some(fd) = self.fds.lock().get(parent) {
                fd
            } else {
                match self.resolve(parent, depth + 1) {
                    Ok(fd) => fd,
                    Err(e) if resource(&e) => return Err(e),
                    Err(_) => continue,
                }
            };
            let Ok(name) = Name::new(&name) else { continue };
            let fd = match sys::open_path(pfd.as_fd(), &name) {
                Ok(fd) => fd,
                Err(e) if resource(&e) => return Err(e),
                Err(_) => continue,
            };
            let st = match sys::fstat(fd.as_fd()) {
                Ok(st) => st,
                Err(e) if resource(&e) => return Err(e),
                Err(_) => continue,
            };
            if loose && st.st_mode & libc::S_IFMT == nkind {
                self.settle(ino, (st.st_dev, st.st_ino));
            } else if (st.st_dev, st.st_ino) != key {
                continue;
            }
            {
                let fd = Arc::new(fd);
                let evicted = self.fds.lock().put(ino, fd.clone());
                drop(evicted); // closed unlocked
                return Ok(fd);
            }
        }
        Err(stale())
    }

    /// Looks up `name` in directory `parent` on the host and records the alias. With
    /// `count`, the kernel gets a lookup reference.
    pub fn lookup(&self, parent: u64, name: &Name, count: bool) -> io::Result<(u64, libc::stat)> {
        let (st, at) = self.probe_at(parent, name)?;
        Ok((self.adopt(parent, name, &st, count, at), st))
    }

    /// Stats `parent/name` without following a symlink and without recording it. No
    /// handle is opened: the node's `O_PATH` handle is resolved (and verified against
    /// this identity) only when an operation needs it.
    pub fn probe(&self, parent: u64, name: &Name) -> io::Result<libc::stat> {
        self.probe_at(parent, name).map(|(st, _)| st)
    }

    /// The same, and which layer of the merged view shows it.
    pub fn probe_at(&self, parent: u64, name: &Name) -> io::Result<(libc::stat, Place)> {
        if let Some(root) = self.root_at(parent, name.bytes()) {
            return Ok((sys::fstat(root.as_fd())?, Place::Unmerged));
        }
        if let Some(u) = self.union_for(parent) {
            let ps = self.stack(&u, parent)?;
            match u.probe(&ps, name.bytes())? {
                Probed::Shown(st, layer) => return Ok((st, merged::place(&u, layer))),
                Probed::Nothing => return Err(enoent()),
                Probed::Ask => {}
            }
            return match u.lookup(&ps, name.bytes())? {
                Some(f) => Ok((f.st, merged::place(&u, f.layer))),
                None => Err(enoent()),
            };
        }
        let pfd = self.fd(parent)?;
        Ok((sys::fstatat_nofollow(pfd.as_fd(), name)?, Place::Unmerged))
    }

    /// The handle of the root served at `parent/name`, if one is.
    pub fn root_at(&self, parent: u64, name: &[u8]) -> Option<Arc<OwnedFd>> {
        let roots = self.roots();
        if roots.is_empty() || !roots.may_be_point(name) {
            return None;
        }
        let dir = self.path(parent).ok()?;
        roots.at(&join(&dir, name)).map(|r| r.fd.clone())
    }

    /// Records a probed file as `parent/name` (with a kernel lookup reference if `count`),
    /// shown by layer `at` (an object just made through the mount: [`Place::Upper`]).
    pub fn adopt(&self, parent: u64, name: &Name, st: &libc::stat, count: bool, at: Place) -> u64 {
        // Only the merged view's upper (another root's file is changed through no union).
        let settled = at == Place::Upper;
        let ino = self.insert(parent, name.bytes(), st, count, settled);
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR && self.watching() {
            self.record_dir(ino, parent, name);
        }
        ino
    }

    /// Records a host file seen as `parent/name`; returns its FUSE id.
    pub fn insert(
        &self,
        parent: u64,
        name: &[u8],
        st: &libc::stat,
        count: bool,
        settled: bool,
    ) -> u64 {
        let key = (st.st_dev, st.st_ino);
        let kind = st.st_mode & libc::S_IFMT;
        let mut t = self.table.lock();
        let mut existing = t.by_key.get(&key).copied();
        // After a view swap: the node known under this name, of this kind, is this file.
        if self.swapped.load(Ordering::Relaxed)
            && let Some(&id) = t.by_name.get(&(parent, name.into()))
            && existing.is_none_or(|e| e == id)
            && t.nodes.get(&id).is_some_and(|n| n.loose && n.kind == kind)
        {
            settle_in(&mut t, id, key);
            existing = Some(id);
        }
        let ino = match existing {
            // The same file — unless every name it had was removed through the mount and
            // nothing of ours held it open: then the host has freed its inode number and
            // now reuses it for a new file, while the kernel may still hold the old inode
            // (until its FORGET). Handing the kernel the old node id would make it take the
            // new file for the old one (its unlinked state, nlink 0 — `link` then fails
            // with ENOENT); the new file gets a node of its own.
            Some(id)
                if t.nodes.get(&id).is_some_and(|n| {
                    n.kind == kind && !(n.gone.is_some() && n.pinned.is_none())
                }) =>
            {
                id
            }
            _ => {
                let id = if st.st_dev == self.root_dev()
                    && st.st_ino != ROOT
                    && st.st_ino != 0
                    && st.st_ino < SYNTH_BASE
                    && !t.nodes.contains_key(&st.st_ino)
                {
                    st.st_ino
                } else {
                    t.next_synth += 1;
                    t.next_synth
                };
                if existing.is_some() {
                    // The host reused an inode number (for a different kind of file, or
                    // after the old one was removed).
                    t.by_key.remove(&key);
                }
                t.nodes.insert(
                    id,
                    Node {
                        key,
                        handle: None,
                        kind,
                        nlookup: 0,
                        children: 0,
                        aliases: Vec::new(),
                        pinned: None,
                        gone: None,
                        loose: false,
                        settled,
                    },
                );
                t.by_key.insert(key, id);
                id
            }
        };
        let mut removed = Vec::new();
        if ino != ROOT {
            if kind == libc::S_IFDIR {
                // A directory has one name: the newest one seen wins.
                let old: Vec<(u64, Box<[u8]>)> = t
                    .nodes
                    .get(&ino)
                    .map(|n| n.aliases.clone())
                    .unwrap_or_default();
                for (p, nm) in old {
                    if !(p == parent && *nm == *name) {
                        t.del_alias(ino, p, &nm, None);
                        removed.push(p);
                    }
                }
            }
            t.add_alias(ino, parent, name);
        }
        if let Some(n) = t.nodes.get_mut(&ino) {
            n.settled = settled;
            if count {
                n.nlookup += 1;
            }
        }
        let mut gone = Gone::default();
        for p in removed {
            maybe_remove(&mut t, p, &mut gone);
        }
        drop(t);
        self.drop_fds(gone);
        ino
    }

    /// Drops the alias `parent/name` (workspace path `path`) after an unlink/rmdir/rename
    /// through the mount. If it was the node's last alias, `fd` (its handle) is pinned so
    /// open files keep working, and `path` is kept as the path it was known under.
    pub fn remove_alias(&self, parent: u64, name: &[u8], path: &[u8], fd: Option<Arc<OwnedFd>>) {
        let mut removed = Gone::default();
        {
            let mut t = self.table.lock();
            let k: (u64, Box<[u8]>) = (parent, name.into());
            if let Some(ino) = t.by_name.get(&k).copied() {
                t.del_alias(ino, parent, name, Some(path));
                if let Some(n) = t.nodes.get_mut(&ino)
                    && n.aliases.is_empty()
                {
                    removed.close_later(std::mem::replace(&mut n.pinned, fd));
                }
                maybe_remove(&mut t, ino, &mut removed);
                maybe_remove(&mut t, parent, &mut removed);
            }
        }
        self.drop_fds(removed);
    }

    /// The host identity node `ino` was last seen as; `None` for an unknown id, or a node
    /// whose identity is to be read again (the view under the mount was replaced).
    pub fn key(&self, ino: u64) -> Option<Key> {
        let t = self.table.lock();
        t.nodes.get(&ino).filter(|n| !n.loose).map(|n| n.key)
    }

    /// Finds the node currently known as `parent/name`, if any.
    pub fn child(&self, parent: u64, name: &[u8]) -> Option<u64> {
        let k: (u64, Box<[u8]>) = (parent, name.into());
        self.table.lock().by_name.get(&k).copied()
    }

    /// Moves the alias `parent/name` of `ino` to `newparent/newname` (after a rename).
    pub fn rename_alias(&self, ino: u64, parent: u64, name: &[u8], newparent: u64, newname: &[u8]) {
        let mut removed = Gone::default();
        {
            let mut t = self.table.lock();
            // Whatever was known as the new name is replaced on the host.
            let k: (u64, Box<[u8]>) = (newparent, newname.into());
            if let Some(old) = t.by_name.get(&k).copied()
                && old != ino
            {
                t.del_alias(old, newparent, newname, None);
                maybe_remove(&mut t, old, &mut removed);
            }
            // Add before removing so the old parent cannot vanish in between.
            t.add_alias(ino, newparent, newname);
            t.del_alias(ino, parent, name, None);
            maybe_remove(&mut t, parent, &mut removed);
        }
        self.drop_fds(removed);
    }

    /// Swaps two names after `RENAME_EXCHANGE`.
    pub fn exchange_alias(&self, a: (u64, &[u8]), b: (u64, &[u8])) {
        let mut t = self.table.lock();
        let ka: (u64, Box<[u8]>) = (a.0, a.1.into());
        let kb: (u64, Box<[u8]>) = (b.0, b.1.into());
        let ia = t.by_name.get(&ka).copied();
        let ib = t.by_name.get(&kb).copied();
        // Add the new aliases first so no parent's child count drops to zero in between.
        if let Some(i) = ia {
            t.del_alias(i, a.0, a.1, None);
        }
        if let Some(i) = ib {
            t.del_alias(i, b.0, b.1, None);
        }
        if let Some(i) = ia {
            t.add_alias(i, b.0, b.1);
        }
        if let Some(i) = ib {
            t.add_alias(i, a.0, a.1);
        }
    }

    /// Every `(parent, name)` alias and every node id (for cache invalidation).
    pub fn snapshot(&self) -> (Vec<(u64, Vec<u8>)>, Vec<u64>) {
        let t = self.table.lock();
        let mut entries = Vec::new();
        let mut inos = Vec::with_capacity(t.nodes.len());
        for (&ino, n) in &t.nodes {
            inos.push(ino);
            for (p, name) in &n.aliases {
                entries.push((*p, name.to_vec()));
            }
        }
        (entries, inos)
    }
}

/// The workspace path of `name` in directory `dir` (`dir`'s path, `/`, `name`; `name`
/// alone in the root), built in one allocation of its exact length: every request on a
/// node builds it (`paths_kind`), an untar three times a file.
fn path_below(t: &Table, dir: u64, name: &[u8]) -> Option<Vec<u8>> {
    // The directory's names, deepest first.
    let mut parts: Vec<&[u8]> = Vec::with_capacity(16);
    let mut len = name.len();
    let mut ino = dir;
    while ino != ROOT {
        let n = t.nodes.get(&ino)?;
        let (p, part) = n.aliases.first()?;
        parts.push(part);
        len += part.len() + 1;
        ino = *p;
        if parts.len() > 4096 {
            return None;
        }
    }
    let mut out = Vec::with_capacity(len);
    for part in parts.iter().rev() {
        out.extend_from_slice(part);
        out.push(b'/');
    }
    out.extend_from_slice(name);
    Some(out)
}

#[cfg(test)]
mod tests;
