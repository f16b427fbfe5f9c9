//! Base records: which SOURCE object a staged entry was made from, so that a host edit is
//! never silently overwritten by `apply` (the conflict rule of [`super::changes`]).
//!
//! The daemon records, just before the first change of a path through the mount (the
//! copy-up of a write, chmod, truncate, xattr change; an unlink; either name of a
//! rename), the identity of the object the merged view showed there — its inode number
//! and birth time, which together no later file can share — and the time of the record.
//! After the change it is stored on the staged entry (file or whiteout) as the xattr
//! [`XATTR`]. An entry that replaces a staged one (a rename over it: `sed -i`; a create
//! over a whiteout) takes over the replaced entry's record, so a rewrite by rename keeps
//! the base of the file it rewrote. A path already staged in a sealed checkpoint layer
//! hands that layer's record on to its copy in the live upper. The replaced entry's record
//! is read from the entry itself (held open) after the change, and only when something
//! stands at the path then: an unlink of a file the agent made leaves nothing there and
//! reads no xattr.
//!
//! The record's format and the conflict rule it decides are [`super::record`]'s.
//!
//! A change is then a conflict when SOURCE's object at the path is not the recorded one
//! (the host replaced it by rename, as editors and `git checkout` do, or deleted it — also
//! when the merged view still showed the replaced one), or changed at or after the record.
//!
//! The name is under overlayfs's private `trusted.overlay.` prefix: overlayfs never shows
//! it through the merged view, never copies it up, and ignores it otherwise. A record is
//! text, or — on a whiteout, taken at the whiteout's own path — compact binary with a
//! hash of the path ([`RecPath`]): small enough for ext4 to keep in the inode, as the one
//! record written per deleted file should be.
//!
//! Invariants: only non-directories get records; the record is written on the staged
//! tree (`DIR/upper`), never in SOURCE or a sealed layer; a failure to record is logged
//! and never fails the caller's request (the conflict rule then falls back to times).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::tree::{Layer, Node, kind};
use crate::host::sys::{self, Name};

use super::record::of_entry;
pub use super::record::{Base, RecPath, XATTR, ns, of, xattr_name};

/// What to record once a change went through: `rec` onto the staged entry at `path`.
#[derive(Debug)]
pub struct Pending {
    path: Vec<u8>,
    rec: Rec,
}

/// The record a [`Pending`] carries.
#[derive(Debug)]
enum Rec {
    /// Known when the change was noted.
    Known(Base),
    /// The record of the staged entry the change replaces (held, with its attributes),
    /// read only when something stands at the path after the change: an unlink of a file
    /// the agent made, which leaves no whiteout, reads no xattr at all (and, the handle
    /// being the lookup's own, shared, makes no syscall for it).
    Of(Arc<OwnedFd>, libc::stat),
}

impl Rec {
    /// The record itself (`None`: the replaced entry carries none).
    fn base(&self) -> Option<Base> {
        match self {
            Rec::Known(b) => Some(b.clone()),
            Rec::Of(fd, st) => of_entry(fd.as_fd(), st),
        }
    }
}

/// The time a record taken now carries (the coarse clock file times come from): read
/// before a change's look at what it changes, so a host edit during that look counts.
pub fn record_time() -> i128 {
    super::sys::coarse_now_ns()
}

impl Pending {
    /// The same note, its record taken no later than `t` (a time read before the look at
    /// the object it names: [`record_time`]).
    pub fn no_later_than(mut self, t: i128) -> Pending {
        if let Rec::Known(b) = &mut self.rec {
            b.since = b.since.min(t);
        }
        self
    }

    /// The record a whiteout left at this change's path carries, as (xattr name, value),
    /// when it is known already: the removal that makes the whiteout sets it in the same
    /// step (then [`Bases::after`] is not asked). `None` for the record of a staged entry
    /// the change replaces (read only once a whiteout is known to stand there).
    pub fn whiteout_record(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        let name = xattr_name();
        // A user namespace's `user.` xattrs are refused on a character device (EPERM):
        // not asked for twice.
        if name.starts_with(b"user.") {
            return None;
        }
        match &self.rec {
            Rec::Known(b) => Some((name, b.clone().compact_at(&self.path).encode())),
            Rec::Of(..) => None,
        }
    }

    /// The record read now, if it was held to be read later (`None`: there is none). A
    /// rename settles both of its notes before recording either: the record of what it
    /// replaced must be read before the other name's record is written (an exchange
    /// puts the replaced entry at the other name).
    pub fn settle(self) -> Option<Pending> {
        let rec = match self.rec {
            Rec::Known(b) => Rec::Known(b),
            r @ Rec::Of(..) => Rec::Known(r.base()?),
        };
        Some(Pending {
            path: self.path,
            rec,
        })
    }

    /// The same record for the entry a rename moves to `path` (a name nothing stood at:
    /// the moved entry is still built on what it was made from, at its old path). `None`:
    /// there is no record to carry.
    pub fn moved_to(&self, path: &[u8]) -> Option<Pending> {
        let rec = match &self.rec {
            Rec::Known(b) => Rec::Known(b.clone()),
            Rec::Of(fd, st) => Rec::Of(fd.clone(), *st),
        };
        Some(Pending {
            path: path.to_vec(),
            rec,
        })
    }
}

/// The daemon's side: reads the staging area's live upper and layers (they are replaced
/// by checkpoints and applies, so each call opens them anew from DIR).
pub struct Bases {
    dir: PathBuf,
    /// The last object each unstaged path was opened for reading as, and when: what a
    /// writer's bytes may be built on ([`Bases::read`]).
    reads: Mutex<Reads>,
    /// DIR itself (`O_PATH`), for the daemon's Landlock rule.
    fd: Option<OwnedFd>,
}

impl Bases {
    /// Records for the staging area `dir`.
    pub fn new(dir: &Path) -> Bases {
        Bases {
            dir: dir.to_path_buf(),
            reads: Mutex::new(Reads::default()),
            fd: sys::open_root(dir).ok(),
        }
    }

    /// DIR's handle (for the workers' Landlock domain).
    pub fn dir_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// An open for reading of the non-directory at `path`, shown as `shown` (inode, birth
    /// time): a later change of the path is taken as built on this object, as of now —
    /// the agent may read, think, and write a whole new version by rename while the host
    /// saves over the file meanwhile (a conflict), or edits it in place (a conflict too:
    /// the record's time is the read's).
    pub fn read(&self, path: &[u8], shown: Option<(u64, i128)>) {
        if let Some((ino, btime)) = shown {
            self.reads.lock().put(path, Base::now(ino, btime, path));
        }
    }

    /// Before a live change replaces the view (apply, discard, rewind): drops the reads of
    /// paths staged now. Those were reads of staged objects, not of SOURCE's; after an apply
    /// SOURCE holds what they showed, after a discard or rewind what SOURCE shows is new to
    /// nobody's read. The reads of unstaged paths stay: they still show SOURCE's objects.
    pub fn forget_staged_reads(&self) {
        let mut r = self.reads.lock();
        if r.by_path.is_empty() {
            return;
        }
        let Ok(up) = self.upper() else {
            r.by_path.clear();
            return;
        };
        let layers: Vec<Layer> = super::layers::open_layers(&self.dir)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|l| Layer::new(l).ok())
            .collect();
        // One walk of each layer along the read paths (sorted: a directory is opened
        // once per layer, not once per path below it; a path whose directory a layer
        // lacks costs nothing there): the gate is closed meanwhile.
        let mut keys: Vec<&[u8]> = r.by_path.keys().map(|k| k.as_slice()).collect();
        keys.sort_unstable();
        let mut hit = std::collections::HashSet::new();
        for l in std::iter::once(&up).chain(layers.iter()) {
            match sys::reopen(l.proc_fd.as_fd(), l.root.as_fd(), libc::O_PATH) {
                Ok(root) => staged_below(root.as_fd(), &keys, 0, 0, &mut hit),
                Err(_) => hit.extend(keys.iter().map(|k| k.to_vec())),
            }
        }
        r.by_path.retain(|p, _| !hit.contains(p));
    }

    fn upper(&self) -> io::Result<Layer> {
        Layer::new(sys::open_root(&self.dir.join("upper"))?)
    }

    /// Before a change of the non-directory at `path`: `shown` gives the merged view's
    /// entry there now (inode, birth time; `None`: no entry), asked only when the path is
    /// not staged already. `replaces`: the change puts another entry at `path` (unlink,
    /// rename, create over a deleted name), whose record must be the one `path` has now.
    /// `at`: where the upper's entry at `path` is. Returns what [`Bases::after`] must
    /// record, if anything.
    pub fn before(
        &self,
        path: &[u8],
        shown: impl FnOnce() -> Option<(u64, i128)>,
        replaces: bool,
        at: UpperDir<'_>,
        below: Below<'_>,
    ) -> Option<Pending> {
        let r = self.find(path, shown, replaces, at, below);
        r.unwrap_or_else(|e| {
            log::warn!(
                "stage: base record of {}: {e}",
                String::from_utf8_lossy(path)
            );
            None
        })
        .map(|rec| Pending {
            path: path.to_vec(),
            rec,
        })
    }

    /// The upper's entry at `path`, found as `at` says.
    fn staged(&self, path: &[u8], at: UpperDir<'_>) -> io::Result<Option<Node>> {
        match at {
            UpperDir::Entry(fd, st) => Ok(Some(Node::of(fd.as_fd().try_clone_to_owned()?, st))),
            UpperDir::Walk => self.upper()?.get(path),
            UpperDir::Parent(None) => Ok(None),
            UpperDir::Parent(Some(d)) => child(d, super::tree::split(path).1),
        }
    }

    fn find(
        &self,
        path: &[u8],
        shown: impl FnOnce() -> Option<(u64, i128)>,
        replaces: bool,
        at: UpperDir<'_>,
        below: Below<'_>,
    ) -> io::Result<Option<Rec>> {
        // Staged already: its record stays where it is unless the entry is replaced (then
        // read once something stands at the path again).
        match at {
            UpperDir::Entry(fd, st) if replaces => return Ok(Some(Rec::Of(fd.clone(), st))),
            UpperDir::Entry(..) => return Ok(None),
            _ => {
                if let Some(n) = self.staged(path, at)? {
                    return Ok(replaces
                        .then(|| of(&n).or_else(|| Base::deleted(&n.st, path)))
                        .flatten()
                        .map(Rec::Known));
                }
            }
        }
        // Nothing shown there: a new name (a name deleted in a sealed layer and made again
        // is judged by times).
        let Some((ino, btime)) = shown() else {
            return Ok(None);
        };
        // Staged in a sealed layer: that layer's record (what was read of it is staged
        // work, not SOURCE's).
        match below {
            Below::Source => {}
            Below::Sealed(fd, st) => {
                self.reads.lock().take(path);
                return Ok(of_entry(fd, &st).map(Rec::Known));
            }
            Below::Unknown => {
                for l in super::layers::open_layers(&self.dir)
                    .map_err(io::Error::other)?
                    .into_iter()
                    .rev()
                {
                    if let Some(n) = Layer::new(l)?.get(path)? {
                        self.reads.lock().take(path);
                        return Ok(of(&n).map(Rec::Known));
                    }
                }
            }
        }
        // Read before: the change is built on what was read (another object than the one
        // shown now when the host replaced it meanwhile: a conflict).
        if let Some(r) = self.reads.lock().take(path) {
            return Ok(Some(Rec::Known(r)));
        }
        Ok(Some(Rec::Known(Base::now(ino, btime, path))))
    }

    /// A change noted by [`Bases::before`] did not happen (the kernel repeats it on
    /// another node, or it failed): what it was built on stays what the path's next
    /// change is built on, as a read of it.
    pub fn unnoted(&self, p: Pending) {
        let Some(b) = p.rec.base() else { return };
        // Kept under the path it was taken at (a compact one is at the note's own path,
        // or its path is not known: then it is not kept).
        let path = match b.path {
            RecPath::Plain(ref path) => path.clone(),
            RecPath::Hashed(_) if b.path.is(&p.path) => p.path.clone(),
            RecPath::Hashed(_) => return,
        };
        let b = Base {
            path: RecPath::Plain(path.clone()),
            ..b
        };
        self.reads.lock().put(&path, b);
    }

    /// Records `p` on the staged entry now at its path (a non-directory), replacing what
    /// that entry carried; `at`: where the upper's entry at the path is.
    pub fn after(&self, p: Pending, at: UpperDir<'_>) {
        let r = (|| {
            let Some(n) = self.staged(&p.path, at)? else {
                return Ok(());
            };
            if kind(&n.st) == libc::S_IFDIR {
                return Ok(());
            }
            let Some(base) = p.rec.base() else {
                return Ok(());
            };
            // A whiteout is the change's own (an unlink's, a rename's old name): it carries
            // no record yet, so none is read to compare.
            let whiteout = kind(&n.st) == libc::S_IFCHR && n.st.st_rdev == 0;
            // A deletion's record is taken at the whiteout's own path: kept compact (one
            // per deleted file; see `RecPath`).
            let base = if whiteout {
                base.compact_at(&p.path)
            } else {
                base
            };
            if whiteout && n.st.st_nlink > 1 {
                let (parent, _) = super::tree::split(&p.path);
                return match at {
                    UpperDir::Parent(Some(d)) => private_whiteout(d, &p.path, &base),
                    UpperDir::Entry(..) => Ok(()),
                    _ => match self.upper()?.dir(parent)? {
                        Some(d) => private_whiteout(d.fd.as_fd(), &p.path, &base),
                        None => Ok(()),
                    },
                };
            }
            if !whiteout && of(&n).as_ref() == Some(&base) {
                return Ok(());
            }
            sys::setxattr_fd(n.fd.as_fd(), &xattr_name(), &base.encode(), 0)
        })();
        if let Err(e) = r {
            log::warn!(
                "stage: cannot record the base of {}: {e}",
                String::from_utf8_lossy(&p.path)
            );
        }
    }
}

/// Where [`Bases`] finds the upper's entry at a change's path.
#[derive(Clone, Copy)]
pub enum UpperDir<'a> {
    /// Walked from `DIR/upper`'s root, component by component (a node the union did not
    /// find: no parent part at hand).
    Walk,
    /// The upper part of the path's parent directory as the daemon's merged view holds
    /// it (the upper's paths are the merged view's): one lookup. `None`: nothing is
    /// staged at the path in the upper — the parent has no upper part, or the merged
    /// view's lookup just saw nothing there (no entry, no whiteout).
    Parent(Option<BorrowedFd<'a>>),
    /// The upper's entry itself (the merged view just showed it), with its attributes.
    Entry(&'a Arc<OwnedFd>, libc::stat),
}

/// What [`Bases`] knows of the layers below the upper at a change's path.
#[derive(Clone, Copy)]
pub enum Below<'a> {
    /// Nothing: each sealed layer is looked at, newest first.
    Unknown,
    /// The merged view shows SOURCE's entry there (no sealed layer holds the path).
    Source,
    /// The merged view shows this sealed layer's entry (with its attributes).
    Sealed(BorrowedFd<'a>, libc::stat),
}

/// The entry `name` of the upper directory `dir`, if any.
fn child(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<Node>> {
    match sys::open_path(dir, &Name::new(name)?) {
        Ok(fd) => {
            let st = sys::fstat(fd.as_fd())?;
            Ok(Some(Node::of(fd, st)))
        }
        Err(e) if missing(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// overlayfs makes its whiteouts as hard links of one shared inode, so a record cannot
/// go on one: the whiteout at `path` (in the upper directory `dir`) is replaced by a
/// private one (a 0/0 character device, as overlayfs's own) carrying the record, renamed
/// over it in one step.
fn private_whiteout(dir: BorrowedFd<'_>, path: &[u8], base: &Base) -> io::Result<()> {
    let (_, last) = super::tree::split(path);
    // The `O_PATH` handle serves the *at calls (no read open: outside the workers'
    // Landlock rights on DIR).
    static SEQ: AtomicU64 = AtomicU64::new(0);
    // A name taken already is someone's (the agent may have made a file of that name: it
    // is staged work, never removed here): the next one.
    let mut tries = 0;
    let tmp = loop {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = Name::new(format!(".fencefs-wh-{}-{n}", std::process::id()).as_bytes())?;
        match sys::mknodat(dir, &tmp, libc::S_IFCHR, 0) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && tries < 64 => tries += 1,
            Err(e) => return Err(e),
            Ok(()) => break tmp,
        }
    };
    let done = (|| {
        let fd = sys::open_path(dir, &tmp)?;
        sys::setxattr_fd(fd.as_fd(), &xattr_name(), &base.encode(), 0)?;
        sys::renameat2(dir, &tmp, dir, &Name::new(last)?, 0)
    })();
    if done.is_err() {
        let _ = sys::unlinkat(dir, &tmp, 0);
    }
    done
}

/// How deep [`staged_below`] recurses: a read path deeper than this counts as staged
/// (its base is not kept), which only costs a conflict check its shortcut. A recursion,
/// unlike the stage tools' walks ([`super::walk`]), because it never refuses anything.
const MAX_BELOW: usize = 400;

/// Marks in `hit` each of `paths` (sorted, all below the directory `dir`, their first
/// `off` bytes its path and a `/`) that has an entry in that layer directory — a whiteout
/// included; one that cannot be looked up counts as staged (its read is dropped).
fn staged_below(
    dir: BorrowedFd<'_>,
    paths: &[&[u8]],
    off: usize,
    depth: usize,
    hit: &mut std::collections::HashSet<Vec<u8>>,
) {
    let mut i = 0;
    while i < paths.len() {
        let rest = &paths[i][off..];
        let comp = rest.split(|&b| b == b'/').next().unwrap_or(rest);
        let under = |p: &[u8]| {
            p.len() >= off + comp.len()
                && &p[off..off + comp.len()] == comp
                && matches!(p.get(off + comp.len()), None | Some(b'/'))
        };
        let mut j = i;
        while j < paths.len() && under(paths[j]) {
            j += 1;
        }
        let run = &paths[i..j.max(i + 1)];
        i = j.max(i + 1);
        let Ok(name) = Name::new(comp) else {
            hit.extend(run.iter().map(|p| p.to_vec()));
            continue;
        };
        // Sorted: the path ending here (if read) comes first, deeper ones after it.
        let (leaf, deeper) = match run.first() {
            Some(p) if p.len() == off + comp.len() => (Some(*p), &run[1..]),
            _ => (None, run),
        };
        if let Some(p) = leaf
            && !matches!(sys::fstatat_nofollow(dir, &name), Err(e) if missing(&e))
        {
            hit.insert(p.to_vec());
        }
        if deeper.is_empty() {
            continue;
        }
        if depth >= MAX_BELOW {
            hit.extend(deeper.iter().map(|p| p.to_vec()));
            continue;
        }
        match sys::open_path(dir, &name).and_then(|f| Ok((sys::fstat(f.as_fd())?, f))) {
            Ok((st, f)) if kind(&st) == libc::S_IFDIR => {
                staged_below(f.as_fd(), deeper, off + comp.len() + 1, depth + 1, hit)
            }
            Ok(_) => {}
            Err(e) if missing(&e) => {}
            Err(_) => hit.extend(deeper.iter().map(|p| p.to_vec())),
        }
    }
}

fn missing(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

/// The reads [`Bases::read`] keeps: at most [`MAX_READS`] paths, the oldest dropped
/// first (a change of a path read longer ago is then taken as built on what it shows).
#[derive(Default)]
struct Reads {
    by_path: HashMap<Vec<u8>, Base>,
    order: VecDeque<Vec<u8>>,
}

/// How many paths' reads are kept.
pub const MAX_READS: usize = 65_536;

impl Reads {
    fn put(&mut self, path: &[u8], b: Base) {
        if self.by_path.insert(path.to_vec(), b).is_none() {
            self.order.push_back(path.to_vec());
            while self.order.len() > MAX_READS {
                if let Some(old) = self.order.pop_front() {
                    self.by_path.remove(&old);
                }
            }
        }
    }

    fn take(&mut self, path: &[u8]) -> Option<Base> {
        // Its place in `order` goes when it comes round (a stale key removes nothing).
        self.by_path.remove(path)
    }
}

/// The merged view's entry `dir/name` as [`Bases::before`] takes it: inode and birth
/// time, `None` when absent or a directory.
pub fn shown(dir: BorrowedFd<'_>, name: &Name) -> Option<(u64, i128)> {
    let st = sys::fstatat_nofollow(dir, name).ok()?;
    if kind(&st) == libc::S_IFDIR {
        return None;
    }
    let b = super::sys::btime_ns(dir, name).ok().flatten().unwrap_or(0);
    Some((st.st_ino, b))
}

/// The same for an entry held by `fd` whose attributes are `st`.
pub fn shown_st(fd: &OwnedFd, st: &libc::stat) -> Option<(u64, i128)> {
    if is_dir(st) {
        return None;
    }
    let b = super::sys::btime_fd(fd.as_fd()).ok().flatten().unwrap_or(0);
    Some((st.st_ino, b))
}

/// Whether `st` is a directory's (which takes no base record).
pub fn is_dir(st: &libc::stat) -> bool {
    kind(st) == libc::S_IFDIR
}

/// The same for an entry held by `fd`.
pub fn shown_fd(fd: &OwnedFd) -> Option<(u64, i128)> {
    let st = sys::fstat(fd.as_fd()).ok()?;
    if kind(&st) == libc::S_IFDIR {
        return None;
    }
    let b = super::sys::btime_fd(fd.as_fd()).ok().flatten().unwrap_or(0);
    Some((st.st_ino, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_below_finds_the_read_paths_a_layer_has() {
        let root =
            std::env::temp_dir().join(format!("fencefs-staged-below-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        for f in ["a/b/c", "a/x", "d"] {
            std::fs::write(root.join(f), b"").unwrap();
        }
        let dir = sys::open_root(&root).unwrap();
        let mut paths: Vec<&[u8]> = vec![
            b"a", b"a-x", b"a.c", b"a/b/c", b"a/b/zz", b"a/x", b"d/e", b"q/r", b"d",
        ];
        paths.sort_unstable();
        let mut hit = std::collections::HashSet::new();
        staged_below(dir.as_fd(), &paths, 0, 0, &mut hit);
        let mut got: Vec<Vec<u8>> = hit.into_iter().collect();
        got.sort();
        let want: Vec<Vec<u8>> = [&b"a"[..], b"a/b/c", b"a/x", b"d"]
            .iter()
            .map(|p| p.to_vec())
            .collect();
        assert_eq!(got, want);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
