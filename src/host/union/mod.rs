//! The merged view of a staged mount, served by the daemon itself: copy-on-write over
//! handle-based layers, in kernel overlayfs's upper-directory format.
//!
//! Layers, top first: the writable staged tree (`DIR/upper`, layer 0), the sealed
//! checkpoint layers (`DIR/layers/N`, newest first), and SOURCE (last). A name is looked
//! up in each layer the parent directory has, top down, as overlayfs does: a whiteout
//! (character device 0/0 in a staged layer) ends the search; a file ends it; directories
//! merge until one is opaque (`*.overlay.opaque = y`); a renamed directory's redirect
//! (`*.overlay.redirect`) names where its lower parts are. Every change goes to layer 0
//! only: a file is copied up from the object SOURCE (or a layer) holds *now* — nothing
//! below the upper is cached but `O_PATH` handles, re-found at every lookup — and a name
//! removed from a lower layer gets a whiteout.
//!
//! Fault injection for tests/stage_atomic.rs: with `FENCEFS_FAULT_UNION_ABORT=STEP` the
//! daemon aborts (as a `kill -9` would end it) at that step of a name change — between two
//! of its renames — so the test can show what a crash there leaves.
//!
//! With `FENCEFS_FAULT_UNION_PAUSE=STEP:MS` the daemon sleeps at that step instead (see
//! [`pause_point`]: `remove`, before a removal takes the names lock; `copy-up`,
//! between a copy's data and the check that its source was not changed meanwhile;
//! `copy-up-follow`, between a follower's wait for the copy in flight and its open of the
//! copy by name), so a test can land a concurrent request in that window.
//!
//! Markers are written in the area's namespace (`trusted.overlay.` when the daemon runs as
//! root, `user.overlay.` otherwise, so an ordinary user can stage) and read in both.
//!
//! Invariants: nothing here writes a layer but layer 0 (and `DIR/work`, where copies,
//! whiteouts and opaque directories are made before they are renamed into place, and
//! where removed objects are deleted, so a crash never leaves half a file staged nor
//! shows again what the agent deleted: every change of a name a lower layer holds is one
//! rename); SOURCE's entries are never taken for whiteouts (a real 0/0 device there is
//! shown); the name changes of the union are serialized by one lock, which is never held
//! while a file's data is copied; every path walked is walked one `O_PATH|O_NOFOLLOW`
//! step at a time.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::path::join;
use super::sys::{self, Name, Xattr};

mod change;
mod copyup;
mod list;
mod probe;
mod purge;
mod remove;
mod staged;
mod sweep;

pub use change::NewName;
pub use list::MergedEntry;
pub use probe::Probed;
pub use purge::finish as finish_deletions;
pub use remove::{Label, Left};
pub use staged::STAGED;
pub use sweep::{reserved, sweep_new_leftovers};

/// Prefixes of overlayfs's markers.
pub const TRUSTED: &[u8] = b"trusted.overlay.";
/// The unprivileged form (overlayfs's `userxattr`).
pub const USER: &[u8] = b"user.overlay.";

/// The prefix this process writes markers under: `trusted.overlay.` with the host's root
/// (uid 0 in the initial user namespace), `user.overlay.` otherwise (an ordinary user, or
/// `fencefs run` inside its user namespace). Readers take either.
pub fn prefix() -> &'static [u8] {
    static P: std::sync::OnceLock<&'static [u8]> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let initial_ns = std::fs::read_to_string("/proc/self/uid_map")
            .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]);
        if sys::geteuid() == 0 && initial_ns {
            TRUSTED
        } else {
            USER
        }
    })
}

/// `name` in the other namespace (`trusted.overlay.X` ↔ `user.overlay.X`), if a marker.
pub fn other_form(name: &[u8]) -> Option<Vec<u8>> {
    if let Some(rest) = name.strip_prefix(TRUSTED) {
        Some([USER, rest].concat())
    } else {
        name.strip_prefix(USER).map(|rest| [TRUSTED, rest].concat())
    }
}

/// Whether `name` is one of overlayfs's markers (either namespace).
pub fn is_marker(name: &[u8]) -> bool {
    name.starts_with(TRUSTED) || name.starts_with(USER)
}

/// One real directory of a merged one: its layer, handle, and path in that layer.
#[derive(Clone)]
pub struct Part {
    /// Layer index (0: the upper).
    pub layer: usize,
    /// Its `O_PATH` handle.
    pub fd: Arc<OwnedFd>,
    /// Its path in the layer (redirects make it differ from the merged path).
    pub path: Vec<u8>,
}

/// A merged directory: its real directories, top first.
#[derive(Clone)]
pub struct Stack {
    /// The parts, top first (the first one's attributes are the directory's).
    pub parts: Vec<Part>,
    /// The union generation it was found in (see [`Union::generation`]).
    pub generation: u64,
    /// Some part was found through a redirect walked from a lower layer's root (here or
    /// in a parent): host events in it name directories the mount may not know.
    pub walked: bool,
}

impl Stack {
    /// Whether the directory exists in the upper.
    pub fn in_upper(&self) -> bool {
        self.parts.first().is_some_and(|p| p.layer == 0)
    }
    /// Whether some part lives below the upper.
    pub fn has_lower(&self) -> bool {
        self.parts.iter().any(|p| p.layer > 0)
    }
}

/// An entry found in the merged view.
pub struct Found {
    /// The layer of the object shown.
    pub layer: usize,
    /// The object shown (`O_PATH`).
    pub fd: Arc<OwnedFd>,
    /// Its attributes. A directory's `st_dev`/`st_ino` are those of its lowest part (its
    /// origin, as overlayfs reports them): its identity stays across its copy-up, a
    /// rename and a rewind.
    pub st: libc::stat,
    /// For a directory: every part of it.
    pub stack: Option<Stack>,
    /// Its birth time (ns; 0 where the file system keeps none), when the lookup was asked
    /// for it ([`Union::lookup_in`]).
    pub btime: Option<i128>,
}

/// What a character device 0/0 of SOURCE is copied up as: 0/0 in any other layer is a
/// whiteout, so the copy is a device with this reserved number instead (major 0, which no
/// driver registers; minor 0x3ffff, the largest every local file system stores) — the
/// stand-in `stage::standin` reads back as 0/0.
pub const STAND_IN: u64 = libc::makedev(0, 0x3ffff);

/// A staged mount's layers.
pub struct Union {
    layers: Vec<OwnedFd>,
    /// `None`: a read-only union ([`Union::read_only`]), which nothing changes.
    work: Option<OwnedFd>,
    proc_fd: OwnedFd,
    xa: &'static [u8],
    generation: AtomicU64,
    root: Mutex<Option<Arc<Stack>>>,
    /// Serializes the name changes (copy-ups, whiteouts, renames) of the union.
    names: Mutex<()>,
    /// A lookup followed a redirect to a path walked from a lower layer's root: a
    /// directory's parts may then lie below SOURCE directories the mount never looked
    /// up, whose host events it cannot tell apart (see [`Union::follows_redirects`]).
    redirects: std::sync::atomic::AtomicBool,
    /// Set by [`Union::freeze`]: nothing changes through it any more.
    frozen: std::sync::atomic::AtomicBool,
    /// The copy-ups in flight (one per object and name: see [`Union::copy_up`]).
    flights: Mutex<std::collections::HashMap<copyup::FlightKey, Arc<copyup::Flight>>>,
    /// Copy-ups made.
    copies: AtomicU64,
    /// Node ids of merged directories with parts found through a redirect walked from a
    /// lower layer's root ([`Stack::walked`]): the kernel's listings and attributes of
    /// these are dropped on the host events the watch cannot place (bounded).
    walked: Mutex<std::collections::HashSet<u64>>,
    /// Decodes the time of a staged entry's base record (`stage::record`'s format), when
    /// the union is the daemon's ([`Union::reading_records`]).
    record_since: Option<RecordSince>,
    /// Deletes removed directories' whiteouts off the requests' path (`purge.rs`).
    purger: purge::Purger,
}

/// Decodes the time of a base record's value (`stage::record::since_of`).
pub type RecordSince = fn(&[u8]) -> Option<i128>;

/// Node ids [`Union::note_walked`] keeps at most (past it the oldest are not told apart:
/// the set starts over).
const MAX_WALKED: usize = 4096;

fn kind(st: &libc::stat) -> u32 {
    st.st_mode & libc::S_IFMT
}

/// A name no one else makes, `#fencefs-WHAT.PID.N`: an object is made under it in
/// `DIR/work` (or, for a new name made as the caller, in the upper directory itself) and
/// renamed into place.
fn temp_name(what: &str) -> Name {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("#fencefs-{what}.{}.{n}", std::process::id());
    Name::new(name.as_bytes()).expect("a valid name")
}

/// Whether the work directory's file system makes a whiteout in the rename that moves an
/// entry away (`renameat2(RENAME_WHITEOUT)`, tried once on a scratch file in `work`): a
/// rename away from a name a lower layer holds must be that one step. Refused (an error
/// that says so) where it answers EINVAL or EOPNOTSUPP (ramfs, minix, most FUSE file
/// systems), as overlayfs refuses such an upper; another error is logged and the area used.
/// Tried once per process: every view of a daemon has the same `DIR/work`.
fn can_rename_whiteout(work: BorrowedFd<'_>) -> io::Result<()> {
    static TRIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if TRIED.load(Ordering::Acquire) {
        return Ok(());
    }
    let (a, b) = (temp_name("probe"), temp_name("probe"));
    let made = sys::openat(
        work,
        &a,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o600,
    );
    if let Err(e) = made {
        // A full disk, say: nothing to try the rename on; the area is used (a later view
        // tries again).
        log::warn!("stage: trying RENAME_WHITEOUT in DIR/work: {e}");
        return Ok(());
    }
    let r = sys::renameat2(work, &a, work, &b, libc::RENAME_WHITEOUT);
    let _ = sys::unlinkat(work, &b, 0);
    let _ = sys::unlinkat(work, &a, 0);
    match r {
        Ok(()) => {
            TRIED.store(true, Ordering::Release);
            Ok(())
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "its file system cannot leave a whiteout in a rename (renameat2 \
                     RENAME_WHITEOUT in DIR/work: {e}), which every rename away from a \
                     SOURCE name needs to be one step; put the staging area on ext4, xfs, \
                     btrfs or tmpfs"
                ),
            ))
        }
        Err(e) => {
            log::warn!("stage: trying RENAME_WHITEOUT in DIR/work: {e}");
            Ok(())
        }
    }
}

/// Test-only: aborts the daemon at `step` when `FENCEFS_FAULT_UNION_ABORT` names it.
fn crash_point(step: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var("FENCEFS_FAULT_UNION_ABORT").ok());
    if at.as_deref() == Some(step) {
        log::error!("fault injected: abort at {step} (FENCEFS_FAULT_UNION_ABORT)");
        std::process::abort();
    }
}

/// Test-only: sleeps `MS` milliseconds at `step` when `FENCEFS_FAULT_UNION_PAUSE=STEP:MS`
/// names it (a window another request can land in, made wide on purpose); several steps
/// are separated by commas (`copy-up:800,copy-up-follow:1500`).
pub fn pause_point(step: &str) {
    static AT: std::sync::OnceLock<Vec<(String, u64)>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        let v = std::env::var("FENCEFS_FAULT_UNION_PAUSE").unwrap_or_default();
        v.split(',')
            .filter_map(|p| {
                let (s, ms) = p.split_once(':')?;
                Some((s.to_string(), ms.parse().ok()?))
            })
            .collect()
    });
    if let Some((_, ms)) = at.iter().find(|(s, _)| s == step) {
        log::warn!("fault injected: pause of {ms} ms at {step} (FENCEFS_FAULT_UNION_PAUSE)");
        std::thread::sleep(std::time::Duration::from_millis(*ms));
    }
}

fn err(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

fn missing(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

impl Union {
    /// A union of `layers` (top first: the upper, the sealed layers, SOURCE) with the work
    /// directory `work` (on the upper's file system), writing markers under `xa`.
    pub fn new(layers: Vec<OwnedFd>, work: OwnedFd, xa: &'static [u8]) -> io::Result<Union> {
        can_rename_whiteout(work.as_fd())?;
        Union::build(layers, Some(work), xa)
    }

    /// A read-only union of `layers` (top first, SOURCE last; at least two), reading
    /// markers in either namespace (`xa`'s first): lookups and listings only, as the view
    /// at a checkpoint (`stage::lower`, which exposes nothing else). It has no work
    /// directory: every change through it fails with EROFS.
    pub fn read_only(layers: Vec<OwnedFd>, xa: &'static [u8]) -> io::Result<Union> {
        Union::build(layers, None, xa)
    }

    fn build(layers: Vec<OwnedFd>, work: Option<OwnedFd>, xa: &'static [u8]) -> io::Result<Union> {
        if layers.len() < 2 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(Union {
            layers,
            work,
            proc_fd: sys::open_proc_self_fd()?,
            xa,
            generation: AtomicU64::new(1),
            root: Mutex::new(None),
            names: Mutex::new(()),
            redirects: std::sync::atomic::AtomicBool::new(false),
            flights: Mutex::new(std::collections::HashMap::new()),
            copies: AtomicU64::new(0),
            walked: Mutex::new(std::collections::HashSet::new()),
            frozen: std::sync::atomic::AtomicBool::new(false),
            record_since: None,
            purger: purge::Purger::default(),
        })
    }

    /// The same union, reading the time of the base record a staged entry carries (its
    /// marker `fencefs-base`, decoded by `since`) into its staged time (`staged.rs`): a
    /// record taken before the entry was made (a read, a deletion it took over) dates what
    /// the entry stands for.
    pub fn reading_records(mut self, since: RecordSince) -> Union {
        self.record_since = Some(since);
        self
    }

    /// Stops every change through this union (EROFS from then on): its upper may no
    /// longer be the live one (a live change sealed it, and serving the new view failed).
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// EROFS once frozen or for a read-only union: checked by every change of the view.
    pub fn writable(&self) -> io::Result<()> {
        if self.work.is_none() || self.frozen.load(Ordering::SeqCst) {
            return Err(err(libc::EROFS));
        }
        Ok(())
    }

    /// The work directory (EROFS for a read-only or frozen union).
    fn work(&self) -> io::Result<BorrowedFd<'_>> {
        self.writable()?;
        match &self.work {
            Some(w) => Ok(w.as_fd()),
            None => Err(err(libc::EROFS)),
        }
    }

    /// The generation: bumped whenever a directory's parts change (a directory copied up,
    /// renamed, removed, made opaque), so cached [`Stack`]s of another generation are
    /// found again.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        *self.root.lock() = None;
    }

    /// Whether a lookup ever followed a redirect walked from a lower layer's root (a
    /// directory with lower parts the agent renamed): from then on a directory made,
    /// removed or moved anywhere on the host may concern a merged directory.
    pub fn follows_redirects(&self) -> bool {
        self.redirects.load(Ordering::Relaxed)
    }

    /// Node `ino` is a merged directory whose parts were found through a redirect walked
    /// from a lower layer's root.
    pub fn note_walked(&self, ino: u64) {
        let mut w = self.walked.lock();
        if w.len() >= MAX_WALKED && !w.contains(&ino) {
            w.clear();
        }
        w.insert(ino);
    }

    /// The node ids noted by [`Union::note_walked`]: the watch drops the kernel's
    /// listings and attributes of these when a host event may concern them.
    pub fn walked_nodes(&self) -> Vec<u64> {
        self.walked.lock().iter().copied().collect()
    }

    /// A directory of SOURCE was made, removed or moved by the host: every merged
    /// directory's parts are found again.
    pub fn host_changed(&self) {
        self.bump();
    }

    /// The part of `s` that is SOURCE's, if any.
    pub fn source_part<'a>(&self, s: &'a Stack) -> Option<&'a Part> {
        s.parts.last().filter(|p| self.is_source(p.layer))
    }

    /// The upper's root handle.
    pub fn upper_root(&self) -> &OwnedFd {
        &self.layers[0]
    }

    /// SOURCE's root handle (the last layer).
    pub fn source_root(&self) -> &OwnedFd {
        &self.layers[self.layers.len() - 1]
    }

    /// Whether `layer` is SOURCE (the last one).
    pub fn is_source(&self, layer: usize) -> bool {
        layer + 1 == self.layers.len()
    }

    /// The merged root.
    pub fn root_stack(&self) -> io::Result<Arc<Stack>> {
        if let Some(s) = self.root.lock().clone() {
            return Ok(s);
        }
        let generation = self.generation();
        let mut parts = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let fd = Arc::new(sys::reopen(self.proc_fd.as_fd(), l.as_fd(), libc::O_PATH)?);
            let opaque = i < self.layers.len() - 1 && self.marker(fd.as_fd(), b"opaque").is_some();
            parts.push(Part {
                layer: i,
                fd,
                path: Vec::new(),
            });
            if opaque {
                break;
            }
        }
        let s = Arc::new(Stack {
            parts,
            generation,
            walked: false,
        });
        if self.generation() == generation {
            *self.root.lock() = Some(s.clone());
        }
        Ok(s)
    }

    /// A marker of a staged directory or file (`None` when absent), in either namespace.
    fn marker(&self, fd: BorrowedFd<'_>, what: &[u8]) -> Option<Vec<u8>> {
        let [m] = self.markers(fd, [what]);
        m
    }

    /// The markers `what` of a staged directory or file (each `None` when absent), in
    /// either namespace (this process's first): one `listxattr` — most objects carry
    /// none — then one `getxattr` per marker present.
    fn markers<const N: usize>(
        &self,
        fd: BorrowedFd<'_>,
        what: [&[u8]; N],
    ) -> [Option<Vec<u8>>; N] {
        let other = if self.xa == USER { TRUSTED } else { USER };
        let listed = match sys::listxattr_fd(fd, 1024) {
            Ok(Xattr::Data(v)) => Some(v),
            // A list too long for the buffer (or none to be had): asked name by name.
            _ => None,
        };
        what.map(|w| {
            for prefix in [self.xa, other] {
                let name = [prefix, w].concat();
                let present = listed
                    .as_ref()
                    .is_none_or(|l| l.split(|&b| b == 0).any(|n| n == name.as_slice()));
                if present && let Ok(Xattr::Data(v)) = sys::getxattr_fd(fd, &name, 4096) {
                    return Some(v);
                }
            }
            None
        })
    }

    fn set_marker(&self, fd: BorrowedFd<'_>, what: &[u8], value: &[u8]) -> io::Result<()> {
        sys::setxattr_fd(fd, &[self.xa, what].concat(), value, 0)
    }

    /// Whether `st` (in `layer`) is a whiteout.
    fn is_whiteout(&self, layer: usize, fd: BorrowedFd<'_>, st: &libc::stat) -> bool {
        if self.is_source(layer) {
            return false;
        }
        match kind(st) {
            libc::S_IFCHR => st.st_rdev == 0,
            libc::S_IFREG => st.st_size == 0 && self.marker(fd, b"whiteout").is_some(),
            _ => false,
        }
    }

    fn child(&self, dir: BorrowedFd<'_>, name: &Name) -> io::Result<Option<(OwnedFd, libc::stat)>> {
        match sys::open_path(dir, name) {
            Ok(fd) => {
                let st = sys::fstat(fd.as_fd())?;
                Ok(Some((fd, st)))
            }
            Err(e) if missing(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Union::child`] with the entry's birth time (0 where the file system keeps none),
    /// from one `statx`; where `statx` fails (a seccomp filter that refuses it), as
    /// [`Union::child`] does it, without a birth time (asked for again, and 0 on an
    /// error, by the note, as before).
    #[allow(clippy::type_complexity)]
    fn child_btime(
        &self,
        dir: BorrowedFd<'_>,
        name: &Name,
    ) -> io::Result<Option<(OwnedFd, libc::stat, Option<i128>)>> {
        match sys::open_path(dir, name) {
            Ok(fd) => match sys::fstat_btime(fd.as_fd()) {
                Ok((st, btime)) => Ok(Some((fd, st, Some(btime.unwrap_or(0))))),
                Err(_) => {
                    let st = sys::fstat(fd.as_fd())?;
                    Ok(Some((fd, st, None)))
                }
            },
            Err(e) if missing(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The object at `path` of `layer`, walked from its root.
    fn walk(&self, layer: usize, path: &[u8]) -> io::Result<Option<(OwnedFd, libc::stat)>> {
        let mut cur = sys::reopen(
            self.proc_fd.as_fd(),
            self.layers[layer].as_fd(),
            libc::O_PATH,
        )?;
        let mut st = sys::fstat(cur.as_fd())?;
        if path.is_empty() {
            return Ok(Some((cur, st)));
        }
        for part in path.split(|&b| b == b'/') {
            if kind(&st) != libc::S_IFDIR {
                return Ok(None);
            }
            match self.child(cur.as_fd(), &Name::new(part)?)? {
                Some((f, s)) => (cur, st) = (f, s),
                None => return Ok(None),
            }
        }
        Ok(Some((cur, st)))
    }

    /// Looks `name` up in the merged directory `parent`: the object shown, or `None`
    /// (absent or whited out).
    pub fn lookup(&self, parent: &Stack, name: &[u8]) -> io::Result<Option<Found>> {
        self.lookup_in(parent, name, false).map(|(f, _)| f)
    }

    /// [`Union::lookup`], and whether the upper holds nothing at all at the name (no
    /// object, no whiteout): the finding a change of the name is noted on — with the
    /// entry's birth time when `btime` (in the same `statx` that stats it; not for a
    /// part walked from a layer's root through an absolute redirect).
    pub fn lookup_in(
        &self,
        parent: &Stack,
        name: &[u8],
        btime: bool,
    ) -> io::Result<(Option<Found>, bool)> {
        let mut upper_free = true;
        // A directory found through `parent` is as current as `parent` is: a change of
        // the parts made after `parent` was found makes both stale at once.
        let generation = parent.generation.min(self.generation());
        let mut look = Name::new(name)?;
        let mut top: Option<(usize, Arc<OwnedFd>, libc::stat, Option<i128>)> = None;
        let mut parts: Vec<Part> = Vec::new();
        let mut bottom = (0, 0);
        // A redirect to an absolute path: the layers below are walked from their roots.
        let mut abs: Option<Vec<u8>> = None;
        let mut walked = false;
        let mut next = 0;
        let mut pi = 0;
        loop {
            let (layer, path, got) = match &abs {
                None => {
                    let Some(p) = parent.parts.get(pi) else { break };
                    pi += 1;
                    if p.layer < next {
                        continue;
                    }
                    let path = join(&p.path, look.bytes());
                    let got = match btime {
                        true => self.child_btime(p.fd.as_fd(), &look)?,
                        false => self.child(p.fd.as_fd(), &look)?.map(|(f, s)| (f, s, None)),
                    };
                    (p.layer, path, got)
                }
                Some(path) => {
                    if next >= self.layers.len() {
                        break;
                    }
                    let got = self.walk(next, path)?.map(|(f, s)| (f, s, None));
                    (next, path.clone(), got)
                }
            };
            next = layer + 1;
            let Some((fd, st, bt)) = got else { continue };
            if layer == 0 {
                upper_free = false;
            }
            if self.is_whiteout(layer, fd.as_fd(), &st) {
                break;
            }
            let is_dir = kind(&st) == libc::S_IFDIR;
            if top.is_some() && !is_dir {
                break;
            }
            let fd = Arc::new(fd);
            if top.is_none() {
                top = Some((layer, fd.clone(), st, bt));
                if !is_dir {
                    break;
                }
            }
            let [opaque, redirect] = if self.is_source(layer) {
                [None, None]
            } else {
                self.markers(fd.as_fd(), [b"opaque".as_slice(), b"redirect"])
            };
            let opaque = opaque.as_deref() == Some(b"y");
            bottom = (st.st_dev, st.st_ino);
            parts.push(Part { layer, fd, path });
            if opaque {
                break;
            }
            match redirect {
                Some(r) if r.starts_with(b"/") => {
                    self.redirects.store(true, Ordering::Relaxed);
                    walked = true;
                    abs = Some(r[1..].to_vec())
                }
                Some(r) if abs.is_none() => look = Name::new(&r)?,
                Some(r) => {
                    let base = abs.as_deref().map(parent_of).unwrap_or(b"");
                    abs = Some(join(base, &r));
                }
                None => {}
            }
        }
        let found = top.map(|(layer, fd, mut st, btime)| {
            let dir = kind(&st) == libc::S_IFDIR;
            if dir {
                (st.st_dev, st.st_ino) = bottom;
            }
            Found {
                layer,
                fd,
                st,
                stack: dir.then(|| Stack {
                    parts,
                    generation,
                    walked: parent.walked || walked,
                }),
                btime,
            }
        });
        Ok((found, upper_free))
    }

    /// Whether a layer below the upper shows something at `name` in `parent` (a removal
    /// or a rename away from it must leave a whiteout).
    pub fn lower_positive(&self, parent: &Stack, name: &Name) -> io::Result<bool> {
        for p in parent.parts.iter().filter(|p| p.layer > 0) {
            if let Some(whiteout) = self.entry_at(p.layer, p.fd.as_fd(), name)? {
                return Ok(!whiteout);
            }
        }
        Ok(false)
    }

    /// The upper's entry `name` in directory `up` is a whiteout.
    fn upper_whiteout(&self, up: BorrowedFd<'_>, name: &Name) -> io::Result<bool> {
        Ok(self.entry_at(0, up, name)? == Some(true))
    }

    /// Whether `dir` (a directory of `layer`) has an entry `name` (`None`: it has none),
    /// and whether it is a whiteout: told by its attributes (one `fstatat`), an empty
    /// regular file of a staged layer also by its marker.
    fn entry_at(&self, layer: usize, dir: BorrowedFd<'_>, name: &Name) -> io::Result<Option<bool>> {
        Ok(self.entry_stat(layer, dir, name)?.map(|(w, _)| w))
    }

    /// [`Union::entry_at`], with the entry's attributes.
    fn entry_stat(
        &self,
        layer: usize,
        dir: BorrowedFd<'_>,
        name: &Name,
    ) -> io::Result<Option<(bool, libc::stat)>> {
        let st = match sys::fstatat_nofollow(dir, name) {
            Ok(st) => st,
            Err(e) if missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        if self.is_source(layer) {
            return Ok(Some((false, st)));
        }
        let whiteout = match kind(&st) {
            libc::S_IFCHR => st.st_rdev == 0,
            libc::S_IFREG if st.st_size == 0 => match sys::open_path(dir, name) {
                Ok(fd) => self.is_whiteout(layer, fd.as_fd(), &st),
                Err(e) if missing(&e) => return Ok(None),
                Err(e) => return Err(e),
            },
            _ => false,
        };
        Ok(Some((whiteout, st)))
    }
}

/// The parent of a relative path (`b""` at the top).
pub fn parent_of(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[..i],
        None => b"",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lookup_in` says the upper holds nothing at a name only when it holds neither an
    /// object nor a whiteout there: a whiteout (what a create over a deleted name must
    /// take the record of) or a staged file is something; a lower layer's entry alone,
    /// or no entry at all, is not. (As root: a whiteout is a 0/0 character device.)
    #[test]
    fn the_upper_is_free_at_a_name_only_with_nothing_there() {
        let root = std::env::temp_dir().join(format!("fencefs-union-free-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["upper", "lower", "work"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in ["lower/low", "lower/gone", "upper/staged"] {
            std::fs::write(root.join(f), b"x").unwrap();
        }
        let open = |d: &str| sys::open_root(&root.join(d)).unwrap();
        let u = Union::new(vec![open("upper"), open("lower")], open("work"), prefix()).unwrap();
        u.whiteout(open("upper").as_fd(), &Name::new(b"gone").unwrap())
            .unwrap();
        let s = u.root_stack().unwrap();
        let look = |n: &[u8]| {
            let (f, free) = u.lookup_in(&s, n, false).unwrap();
            (f.map(|f| f.layer), free)
        };
        assert_eq!(look(b"low"), (Some(1), true));
        assert_eq!(look(b"none"), (None, true));
        assert_eq!(look(b"gone"), (None, false));
        assert_eq!(look(b"staged"), (Some(0), false));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_frozen_or_read_only_union_changes_nothing() {
        let root =
            std::env::temp_dir().join(format!("fencefs-union-frozen-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["upper", "lower", "work"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let open = |d: &str| sys::open_root(&root.join(d)).unwrap();
        let u = Union::new(vec![open("upper"), open("lower")], open("work"), prefix()).unwrap();
        let name = Name::new(b"w").unwrap();
        u.writable().unwrap();
        u.freeze();
        let up = open("upper");
        let e = u.whiteout(up.as_fd(), &name).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS));
        assert!(u.work().is_err());
        let ro = Union::read_only(vec![open("upper"), open("lower")], prefix()).unwrap();
        assert_eq!(
            ro.whiteout(up.as_fd(), &name).unwrap_err().raw_os_error(),
            Some(libc::EROFS)
        );
        assert_eq!(std::fs::read_dir(root.join("upper")).unwrap().count(), 0);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
