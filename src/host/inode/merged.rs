//! The table over a staged mount's merged view ([`crate::host::union`]): nodes are found
//! through their parent directory's parts, and a node about to change is copied up first
//! (its id stays; its key becomes the upper object's).
//!
//! Without a union every method here is the plain table's: the node's handle, the
//! parent's handle. With one, the handles handed out for a change are always the upper's
//! — never SOURCE's nor a sealed layer's.
//!
//! Invariants: a copy-up copies the object the merged view shows at the node's name now,
//! and only if it is still the node's (else `ESTALE`: the kernel looks the name up again)
//! — checked before the copy, and again under the union's names lock before the copy is
//! put in place (the data is copied without the lock); a new name is made where
//! [`Inodes::new_at`] says and put in place by [`Inodes::new_done`];
//! a directory's parts are cached per node for one union generation, bounded; the table's
//! lock is never held across a syscall.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::{Inodes, ROOT, stale};
use crate::host::sys::{self, DirEntry, Name};
use crate::host::union::{Found, Label, Left, NewName, Stack, Union};

/// Directory stacks kept at most (past it the cache starts over).
const MAX_STACKS: usize = 8192;

/// Descriptors the stacks cache holds at most unless told otherwise.
pub const MAX_STACK_PARTS: usize = 4096;

/// The deepest directory whose parts are found (deeper: ELOOP).
const MAX_DEPTH: usize = 4096;

/// Which layer of the merged view shows an entry ([`Inodes::peek_entry`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Place {
    /// The upper: a staged entry.
    Upper,
    /// A sealed checkpoint layer.
    Sealed,
    /// SOURCE.
    Source,
    /// Not a merged view the daemon serves (no staging, another root).
    Unmerged,
}

/// Which [`Place`] layer `layer` of `u` is.
/// A name as the merged view showed it ([`Inodes::peek_entry`]).
pub struct Peek {
    /// The object shown (`O_PATH`).
    pub fd: Arc<OwnedFd>,
    /// Its attributes.
    pub st: libc::stat,
    /// Where it is.
    pub place: Place,
    /// Its birth time (ns; 0 where the file system keeps none), when the lookup learnt
    /// it (the merged view's does, in the call that stats it).
    pub btime: Option<i128>,
    /// The rest of the merged view's finding (its layer and, for a directory, its parts),
    /// for a removal of it ([`Inodes::remove_seen`]); `None` unmerged.
    merged: Option<(usize, Option<Stack>)>,
}

pub(super) fn place(u: &Union, layer: usize) -> Place {
    match layer {
        0 => Place::Upper,
        l if u.is_source(l) => Place::Source,
        _ => Place::Sealed,
    }
}

/// What the merged view shows at a name ([`Inodes::peek_name`]). (Returned once per
/// request and taken apart at once: a box would cost an allocation per lookup.)
#[allow(clippy::large_enum_variant)]
pub enum Peeked {
    /// An entry.
    Shown(Peek),
    /// Nothing; `upper_free`: the daemon's merged view saw nothing at all at the name in
    /// the upper (no whiteout either), so nothing staged stands there.
    Nothing { upper_free: bool },
}

/// What [`Inodes::up_node`] made of a node about to change.
pub enum Up {
    /// The handle to change it through.
    Here(Arc<OwnedFd>),
    /// Copied up to a new node (files are open on this one): the caller answers
    /// `ESTALE`, and the kernel looks the name up again and repeats the call there. A
    /// copy-up that failed (the host changed the object meanwhile: also `ESTALE`) is an
    /// error, not this: nothing was changed.
    Moved,
}

fn err(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

/// The cache of merged directories' parts, bounded by the descriptors its parts hold
/// (each part is an `O_PATH` handle: a directory in N layers holds N): past the bound it
/// starts over. Its share of RLIMIT_NOFILE is set with the union ([`Inodes::set_union`]),
/// and the open handles' budget is what is left.
pub struct Stacks(parking_lot::Mutex<StackCache>);

struct StackCache {
    map: HashMap<u64, Arc<Stack>>,
    /// Parts held by `map`.
    parts: usize,
    /// At most this many parts.
    cap: usize,
}

impl Default for Stacks {
    fn default() -> Stacks {
        Stacks(parking_lot::Mutex::new(StackCache {
            map: HashMap::new(),
            parts: 0,
            cap: MAX_STACK_PARTS,
        }))
    }
}

impl Stacks {
    /// Forgets every directory's parts.
    pub fn clear(&self) {
        let mut c = self.0.lock();
        c.map.clear();
        c.parts = 0;
    }

    fn get(&self, ino: u64, generation: u64) -> Option<Arc<Stack>> {
        let c = self.0.lock();
        c.map
            .get(&ino)
            .filter(|s| s.generation == generation)
            .cloned()
    }

    fn insert(&self, ino: u64, s: Arc<Stack>) {
        let mut c = self.0.lock();
        let n = s.parts.len();
        if c.map.len() >= MAX_STACKS || c.parts + n > c.cap {
            c.map.clear();
            c.parts = 0;
        }
        if let Some(old) = c.map.insert(ino, s) {
            c.parts -= old.parts.len();
        }
        c.parts += n;
    }

    fn remove(&self, ino: u64) {
        let mut c = self.0.lock();
        if let Some(old) = c.map.remove(&ino) {
            c.parts -= old.parts.len();
        }
    }
}

impl Inodes {
    /// Serves the merged view `u` (before the mount): the root node is the upper's root.
    /// The directories' parts cached hold at most `stack_fds` descriptors.
    pub fn set_union(&mut self, u: Arc<Union>, stack_fds: usize) -> io::Result<()> {
        self.stacks.0.lock().cap = stack_fds;
        let up = sys::reopen(self.proc_fd.as_fd(), u.upper_root().as_fd(), libc::O_PATH)?;
        *self.root_fd.lock() = Arc::new(up);
        *self.union.write() = Some(u);
        Ok(())
    }

    /// The merged view served, if this mount is staged.
    pub fn union(&self) -> Option<Arc<Union>> {
        self.union.read().clone()
    }

    /// The merged view that serves the entries of directory `parent`: none for a
    /// directory of another root (`host/roots.rs`: served as it is, read-only when
    /// staged, never merged).
    pub fn union_for(&self, parent: u64) -> Option<Arc<Union>> {
        let u = self.union()?;
        let roots = self.roots();
        if roots.is_empty() || parent == ROOT {
            return Some(u);
        }
        match self.path(parent) {
            Ok(p) if roots.root_of(&p).is_some() => None,
            _ => Some(u),
        }
    }

    /// The parts of merged directory `ino`.
    pub fn stack(&self, u: &Union, ino: u64) -> io::Result<Arc<Stack>> {
        self.stack_at(u, ino)
    }

    /// Walks up to the nearest directory whose parts are known for this generation (or
    /// the root), then finds each one below it again — a loop, not a recursion: an agent
    /// may nest directories as deep as it likes, one name at a time.
    fn stack_at(&self, u: &Union, ino: u64) -> io::Result<Arc<Stack>> {
        let generation = u.generation();
        let mut below: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut cur = ino;
        let mut s = loop {
            if cur == ROOT {
                break u.root_stack()?;
            }
            if let Some(s) = self.stacks.get(cur, generation) {
                break s;
            }
            if below.len() > MAX_DEPTH {
                return Err(err(libc::ELOOP));
            }
            let (parent, name) = self.alias(cur).ok_or_else(stale)?;
            below.push((cur, name));
            cur = parent;
        };
        while let Some((ino, name)) = below.pop() {
            let f = u.lookup(&s, &name)?.ok_or_else(stale)?;
            self.check_key(ino, &f)?;
            s = Arc::new(f.stack.ok_or_else(|| err(libc::ENOTDIR))?);
            if s.walked {
                u.note_walked(ino);
            }
            self.stacks.insert(ino, s.clone());
        }
        Ok(s)
    }

    /// `f` is node `ino` (a loose node settles on it).
    fn check_key(&self, ino: u64, f: &Found) -> io::Result<()> {
        let key = (f.st.st_dev, f.st.st_ino);
        let (k, loose, kind) = {
            let t = self.table.lock();
            let n = t.nodes.get(&ino).ok_or_else(stale)?;
            (n.key, n.loose, n.kind)
        };
        if k == key {
            return Ok(());
        }
        if loose && kind == f.st.st_mode & libc::S_IFMT {
            self.settle(ino, key);
            return Ok(());
        }
        Err(stale())
    }

    /// The upper part of merged directory `parent` now: `Some(None)` when it has none,
    /// `None` when this mount has no merged view (or the directory cannot be found).
    pub fn upper_part(&self, parent: u64) -> Option<Option<Arc<OwnedFd>>> {
        let u = self.union()?;
        let s = self.stack(&u, parent).ok()?;
        Some(
            s.parts
                .first()
                .filter(|p| p.layer == 0)
                .map(|p| p.fd.clone()),
        )
    }

    /// `name` in merged directory `parent`: the object shown, not recorded.
    pub fn find(&self, u: &Union, parent: u64, name: &[u8]) -> io::Result<Option<Found>> {
        let ps = self.stack(u, parent)?;
        u.lookup(&ps, name)
    }

    /// The upper part of directory `ino`, copied up (with its parents) if it has none.
    /// Without a union: the node's handle.
    pub fn up_dir(&self, ino: u64) -> io::Result<Arc<OwnedFd>> {
        match self.union() {
            Some(u) => self.up_dir_in(&u, ino),
            None => self.fd(ino),
        }
    }

    /// Walks up to the nearest directory with an upper part (or the root), then copies
    /// each one below it up, parents first (a loop: see [`Inodes::stack_at`]). Each is
    /// copied from its top part as found before its parents' copy-ups.
    fn up_dir_in(&self, u: &Union, ino: u64) -> io::Result<Arc<OwnedFd>> {
        u.writable()?;
        let mut below: Vec<(u64, u64, Arc<OwnedFd>, usize)> = Vec::new();
        let mut cur = ino;
        let mut pup = loop {
            if cur == ROOT {
                break self.root_fd();
            }
            if below.len() > MAX_DEPTH {
                return Err(err(libc::ELOOP));
            }
            let s = self.stack(u, cur)?;
            let top = s.parts.first().ok_or_else(stale)?;
            if top.layer == 0 {
                break top.fd.clone();
            }
            let parent = self.alias(cur).ok_or_else(stale)?.0;
            below.push((cur, parent, top.fd.clone(), top.layer));
            cur = parent;
        };
        while let Some((ino, parent, top, layer)) = below.pop() {
            let (_, name) = self.alias(ino).ok_or_else(stale)?;
            let st = sys::fstat(top.as_fd())?;
            let name = Name::new(&name)?;
            pup = self.copied(
                u,
                (parent, ino),
                pup.as_fd(),
                &name,
                (top.as_fd(), &st, layer),
            )?;
        }
        Ok(pup)
    }

    /// Copies `fd` up as `pup/name` for node `ino` of directory `parent` (or takes the
    /// upper's entry there, if one was made meanwhile) and makes the copy the node's.
    fn copied(
        &self,
        u: &Union,
        (parent, ino): (u64, u64),
        pup: BorrowedFd<'_>,
        name: &Name,
        (fd, st, layer): (BorrowedFd<'_>, &libc::stat, usize),
    ) -> io::Result<Arc<OwnedFd>> {
        let still = || self.still_shows(u, parent, name, st);
        u.refuse_uncarried_copy(|| self.stack(u, parent), name, (fd, st, layer))?;
        let new = match u.copy_up(pup, name, (fd, st, layer), &still) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => sys::open_path(pup, name)?,
            Err(e) => return Err(e),
        };
        // A directory keeps its identity (its lowest part's); a file is the copy now.
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            let nst = sys::fstat(new.as_fd())?;
            self.settle(ino, (nst.st_dev, nst.st_ino));
            self.mark_settled(ino);
        }
        self.stacks.remove(ino);
        let new = Arc::new(new);
        let evicted = self.fds.lock().put(ino, new.clone());
        drop(evicted);
        Ok(new)
    }

    /// The merged view shows the object `st` was read from at `parent/name` yet (checked
    /// under the union's names lock before a copy is put in place): else `ESTALE`.
    fn still_shows(&self, u: &Union, parent: u64, name: &Name, st: &libc::stat) -> io::Result<()> {
        let f = self.find(u, parent, name.bytes())?.ok_or_else(stale)?;
        let now = sys::fstat(f.fd.as_fd())?;
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) {
            Ok(())
        } else {
            Err(stale())
        }
    }

    /// The handle to change node `ino` through: its upper copy, made now from the object
    /// the merged view shows at its name (if that is still this node's: else `ESTALE`).
    /// Without a union: the node's handle.
    ///
    /// `busy`: files are open on the node. Their kernel inode may be passed through to
    /// the lower object, and the kernel serves no other host file behind one inode: the
    /// copy is made, the node stays the lower object's, and the answer is [`Up::Moved`]
    /// (the caller's `ESTALE`, on which the kernel looks the name up again, finding the
    /// copy, a new node, and repeats the call there). Readers keep the lower file, as on
    /// overlayfs.
    pub fn up_node(&self, ino: u64, busy: bool) -> io::Result<Up> {
        let Some(u) = self.union() else {
            return self.fd(ino).map(Up::Here);
        };
        u.writable()?;
        // In the upper already: its own (verified) handle, no lookup.
        if self.settled_file(ino) {
            return self.fd(ino).map(Up::Here);
        }
        if self.kind(ino)? == libc::S_IFDIR {
            return self.up_dir_in(&u, ino).map(Up::Here);
        }
        let (parent, name) = self.alias(ino).ok_or_else(|| err(libc::ENOENT))?;
        let f = self.find(&u, parent, &name)?.ok_or_else(stale)?;
        self.check_key(ino, &f)?;
        if f.layer == 0 {
            return Ok(Up::Here(f.fd));
        }
        let pup = self.up_dir_in(&u, parent)?;
        let name = Name::new(&name)?;
        if busy {
            let still = || self.still_shows(&u, parent, &name, &f.st);
            let lower = (f.fd.as_fd(), &f.st, f.layer);
            u.refuse_uncarried_copy(|| self.stack(&u, parent), &name, lower)?;
            match u.copy_up(pup.as_fd(), &name, (f.fd.as_fd(), &f.st, f.layer), &still) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(e),
            }
            return Ok(Up::Moved);
        }
        let lower = (f.fd.as_fd(), &f.st, f.layer);
        self.copied(&u, (parent, ino), pup.as_fd(), &name, lower)
            .map(Up::Here)
    }

    /// The upper copy of whatever `parent/name` shows (not a recorded node: a create that
    /// opens an existing file). `None` when nothing is there.
    pub fn up_child(&self, parent: u64, name: &Name) -> io::Result<Option<Arc<OwnedFd>>> {
        let Some(u) = self.union() else {
            return Ok(None);
        };
        let Some(f) = self.find(&u, parent, name.bytes())? else {
            return Ok(None);
        };
        if f.layer == 0 {
            return Ok(Some(f.fd));
        }
        let pup = self.up_dir_in(&u, parent)?;
        let still = || self.still_shows(&u, parent, name, &f.st);
        let lower = (f.fd.as_fd(), &f.st, f.layer);
        u.refuse_uncarried_copy(|| self.stack(&u, parent), name, lower)?;
        let new = match u.copy_up(pup.as_fd(), name, (f.fd.as_fd(), &f.st, f.layer), &still) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => sys::open_path(pup.as_fd(), name)?,
            Err(e) => return Err(e),
        };
        Ok(Some(Arc::new(new)))
    }

    /// Before a new name in `parent`: the directory handle to make it in and what the
    /// merged view needs done after ([`Inodes::new_done`]). `EEXIST` if the merged view
    /// shows the name.
    pub fn new_name(
        &self,
        parent: u64,
        name: &Name,
    ) -> io::Result<(Arc<OwnedFd>, Option<NewName>)> {
        let Some(u) = self.union() else {
            return Ok((self.fd(parent)?, None));
        };
        if crate::host::union::reserved(name.bytes()) {
            return Err(err(libc::EINVAL));
        }
        let pup = self.up_dir_in(&u, parent)?;
        let ps = self.stack(&u, parent)?;
        let n = u.prepare_new(&ps, pup.as_fd(), name)?;
        Ok((pup, Some(n)))
    }

    /// After a new name was made (`made`) or not, at [`Inodes::new_at`] in `pfd` (from
    /// [`Inodes::new_name`]): one made under a temporary name is put in place (if that
    /// fails it is deleted again, and the error is the create's).
    pub fn new_done(
        &self,
        pfd: &OwnedFd,
        name: &Name,
        n: Option<NewName>,
        made: bool,
        dir: bool,
    ) -> io::Result<()> {
        match (self.union(), n) {
            (Some(u), Some(n)) => u.finish_new(pfd.as_fd(), name, &n, made, dir),
            _ => Ok(()),
        }
    }

    /// The name a new object is made at in its parent's upper directory: `name` itself,
    /// or a temporary name [`Inodes::new_done`] renames over a whiteout.
    pub fn new_at<'a>(n: &'a Option<NewName>, name: &'a Name) -> &'a Name {
        n.as_ref().map_or(name, |n| n.at(name))
    }

    /// Removes `parent/name` (`dir`: a directory).
    pub fn remove_name(&self, parent: u64, name: &Name, dir: bool) -> io::Result<()> {
        self.remove_seen(parent, name, dir, None, None).map(|_| ())
    }

    /// A staged unlink of SOURCE's non-directory `name` in `parent` in one look under the
    /// union's names lock ([`Union::remove_below`], which calls `note` with what it hid):
    /// `None` when that is not the case, nothing changed — the caller peeks and removes
    /// the general way ([`Inodes::remove_seen`]).
    pub fn remove_below<N>(
        &self,
        parent: u64,
        name: &Name,
        note: impl FnOnce(&libc::stat, i128) -> (N, Option<(Vec<u8>, Vec<u8>)>),
    ) -> io::Result<Option<(Left, N)>> {
        let Some(u) = self.union_for(parent) else {
            return Ok(None);
        };
        let ps = self.stack(&u, parent)?;
        crate::host::union::pause_point("remove");
        u.remove_below(&ps, name, note)
    }

    /// An unlink of `name` from `parent` when the merged view's `parent` has no part
    /// below the upper ([`Union::remove_upper_only`]): `None` when that is not the case,
    /// nothing changed.
    pub fn remove_upper_only(&self, parent: u64, name: &Name) -> io::Result<Option<Left>> {
        let Some(u) = self.union_for(parent) else {
            return Ok(None);
        };
        let ps = self.stack(&u, parent)?;
        u.remove_upper_only(&ps, name)
    }

    /// [`Inodes::remove_name`] of a name the same request looked up just before with
    /// [`Inodes::peek_entry`] (a staged unlink notes the entry first): the removal acts on that
    /// finding instead of looking the name up again — as it would on a second look a
    /// moment later; a lower layer's entry is looked at again under the names lock all
    /// the same (`union::remove`). A whiteout it leaves gets `label` (a staged deletion's
    /// record) if it can. Returns what stands at the name now (never a whiteout on an
    /// unstaged mount).
    pub fn remove_seen(
        &self,
        parent: u64,
        name: &Name,
        dir: bool,
        seen: Option<Peek>,
        label: Option<Label<'_>>,
    ) -> io::Result<Left> {
        let Some(u) = self.union() else {
            let pfd = self.fd(parent)?;
            let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
            return sys::unlinkat(pfd.as_fd(), name, flags).map(|()| Left::Nothing);
        };
        let seen = seen.and_then(|p| {
            let (layer, stack) = p.merged?;
            Some(Found {
                layer,
                fd: p.fd,
                st: p.st,
                stack,
                btime: p.btime,
            })
        });
        let f = match seen {
            Some(f) => f,
            None => self
                .find(&u, parent, name.bytes())?
                .ok_or_else(|| err(libc::ENOENT))?,
        };
        let is_dir = f.st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        match (dir, is_dir) {
            (true, false) => return Err(err(libc::ENOTDIR)),
            (false, true) => return Err(err(libc::EISDIR)),
            _ => {}
        }
        let pup = self.up_dir_in(&u, parent)?;
        let ps = self.stack(&u, parent)?;
        crate::host::union::pause_point("remove");
        u.remove(&ps, pup.as_fd(), name, &f, label)
    }

    /// renameat2 of `parent/name` to `newparent/newname` with `flags`.
    pub fn rename_names(
        &self,
        (parent, name): (u64, &Name),
        (newparent, newname): (u64, &Name),
        flags: u32,
    ) -> io::Result<()> {
        let Some(u) = self.union() else {
            let pfd = self.fd(parent)?;
            let npfd = self.fd(newparent)?;
            return sys::renameat2(pfd.as_fd(), name, npfd.as_fd(), newname, flags);
        };
        // RENAME_WHITEOUT (the caller's own whiteout) is overlayfs's to refuse: EINVAL; so
        // is a temporary name's form as the new name (the next start would sweep it).
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0
            || crate::host::union::reserved(newname.bytes())
        {
            return Err(err(libc::EINVAL));
        }
        let ps = self.stack(&u, parent)?;
        let nps = self.stack(&u, newparent)?;
        let src = u
            .lookup(&ps, name.bytes())?
            .ok_or_else(|| err(libc::ENOENT))?;
        let dst = u.lookup(&nps, newname.bytes())?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if exchange && dst.is_none() {
            return Err(err(libc::ENOENT));
        }
        // Both parents and the moved entries in the upper already (the usual case once
        // an agent works in a directory): nothing to copy up, nothing to find again.
        let settled = ps.in_upper()
            && nps.in_upper()
            && src.layer == 0
            && (!exchange || dst.as_ref().is_some_and(|d| d.layer == 0));
        let (ps, nps, src, dst) = if settled {
            (ps, nps, src, dst)
        } else {
            self.rename_copy_up(
                &u,
                (parent, name),
                (newparent, newname),
                &src,
                dst,
                exchange,
            )?
        };
        let (pup, npup) = match (ps.parts.first(), nps.parts.first()) {
            (Some(a), Some(b)) if a.layer == 0 && b.layer == 0 => (a.fd.clone(), b.fd.clone()),
            _ => return Err(stale()),
        };
        if exchange {
            let d = dst.ok_or_else(|| err(libc::ENOENT))?;
            return u.exchange(
                (&ps, pup.as_fd(), name),
                (&nps, npup.as_fd(), newname),
                &src,
                &d,
            );
        }
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        u.rename(
            (&ps, pup.as_fd(), name),
            (&nps, npup.as_fd(), newname),
            &src,
            dst.as_ref(),
            noreplace,
        )
    }

    /// Copies up both parents and the moved entries of a rename, then finds the entries
    /// again (the copy-ups changed the layers they are in).
    #[allow(clippy::type_complexity)]
    fn rename_copy_up(
        &self,
        u: &Union,
        (parent, name): (u64, &Name),
        (newparent, newname): (u64, &Name),
        src: &Found,
        dst: Option<Found>,
        exchange: bool,
    ) -> io::Result<(Arc<Stack>, Arc<Stack>, Found, Option<Found>)> {
        let src_up = self.up_entry(u, parent, name, src)?;
        let dst_up = match (&dst, exchange) {
            (Some(d), true) => Some(self.up_entry(u, newparent, newname, d)?),
            _ => None,
        };
        self.up_dir_in(u, parent)?;
        self.up_dir_in(u, newparent)?;
        let ps = self.stack(u, parent)?;
        let nps = self.stack(u, newparent)?;
        let src = u
            .lookup(&ps, name.bytes())?
            .ok_or_else(|| err(libc::ENOENT))?;
        let dst = u.lookup(&nps, newname.bytes())?;
        drop((src_up, dst_up));
        Ok((ps, nps, src, dst))
    }

    /// The upper copy of entry `f` shown as `parent/name` (a known node's id is kept).
    fn up_entry(&self, u: &Union, parent: u64, name: &Name, f: &Found) -> io::Result<Arc<OwnedFd>> {
        match self.child(parent, name.bytes()) {
            Some(ino) if self.check_key(ino, f).is_ok() => {
                if f.layer == 0 {
                    return Ok(f.fd.clone());
                }
                if f.stack.is_some() {
                    return self.up_dir_in(u, ino);
                }
                let pup = self.up_dir_in(u, parent)?;
                let lower = (f.fd.as_fd(), &f.st, f.layer);
                self.copied(u, (parent, ino), pup.as_fd(), name, lower)
            }
            _ => self
                .up_child(parent, name)?
                .ok_or_else(|| err(libc::ENOENT)),
        }
    }

    /// The kernel file handle of the SOURCE directory merged directory `ino` shows
    /// (host change events name it); `ENOENT` when it has none (made by the agent).
    pub(super) fn merged_source_handle(&self, ino: u64) -> io::Result<Vec<u8>> {
        let u = self.union().ok_or_else(|| err(libc::ENOENT))?;
        let s = self.stack(&u, ino)?;
        let part = u.source_part(&s).ok_or_else(|| err(libc::ENOENT))?;
        sys::file_handle(part.fd.as_fd())
    }

    /// The entries directory `ino` shows (merged); not staged, its handle `node` opened
    /// for this read (and closed after it).
    pub fn list(&self, ino: u64, node: BorrowedFd<'_>) -> io::Result<Vec<DirEntry>> {
        match self.union_for(ino) {
            Some(u) => u.read_dir(&*self.stack(&u, ino)?),
            None => sys::read_dir(sys::reopen_dir(self.proc_fd.as_fd(), node)?.as_fd()),
        }
    }

    /// The entries directory `parent/name` shows (merged).
    pub fn list_child(&self, parent: u64, name: &Name) -> io::Result<Vec<DirEntry>> {
        match self.union_for(parent) {
            Some(u) => {
                let f = self
                    .find(&u, parent, name.bytes())?
                    .ok_or_else(|| err(libc::ENOENT))?;
                u.read_dir(f.stack.as_ref().ok_or_else(|| err(libc::ENOTDIR))?)
            }
            None => {
                let pfd = self.fd(parent)?;
                let fd = sys::openat(pfd.as_fd(), name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                sys::read_dir(fd.as_fd())
            }
        }
    }

    /// The object `parent/name` shows now (`O_PATH`), not recorded.
    pub fn peek(&self, parent: u64, name: &Name) -> io::Result<Arc<OwnedFd>> {
        match self.union_for(parent) {
            Some(u) => Ok(self
                .find(&u, parent, name.bytes())?
                .ok_or_else(|| err(libc::ENOENT))?
                .fd),
            None => Ok(Arc::new(sys::open_path(self.fd(parent)?.as_fd(), name)?)),
        }
    }

    /// What `parent/name` shows now, kept for a removal by the same request
    /// ([`Inodes::remove_seen`]).
    pub fn peek_entry(&self, parent: u64, name: &Name) -> io::Result<Peek> {
        match self.peek_name(parent, name)? {
            Peeked::Shown(p) => Ok(p),
            Peeked::Nothing { .. } => Err(err(libc::ENOENT)),
        }
    }

    /// [`Inodes::peek_entry`], telling what "nothing" is.
    pub fn peek_name(&self, parent: u64, name: &Name) -> io::Result<Peeked> {
        match self.union_for(parent) {
            Some(u) => {
                let ps = self.stack(&u, parent)?;
                let (f, upper_free) = u.lookup_in(&ps, name.bytes(), true)?;
                let Some(f) = f else {
                    return Ok(Peeked::Nothing { upper_free });
                };
                Ok(Peeked::Shown(Peek {
                    place: place(&u, f.layer),
                    merged: Some((f.layer, f.stack)),
                    fd: f.fd,
                    st: f.st,
                    btime: f.btime,
                }))
            }
            None => {
                let fd = match sys::open_path(self.fd(parent)?.as_fd(), name) {
                    Ok(fd) => fd,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        return Ok(Peeked::Nothing { upper_free: false });
                    }
                    Err(e) => return Err(e),
                };
                let st = sys::fstat(fd.as_fd())?;
                Ok(Peeked::Shown(Peek {
                    fd: Arc::new(fd),
                    st,
                    place: Place::Unmerged,
                    merged: None,
                    btime: None,
                }))
            }
        }
    }
}
