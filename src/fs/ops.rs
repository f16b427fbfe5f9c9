//! The operations: take one policy snapshot, decide, audit, then touch the host through
//! handles. Each `do_*` returns `Result<T, Error>`; the glue in `mod.rs` only replies.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{FileAttr, FileType, TimeOrNow};

use super::attr::{self, to_attr};
use super::decide::Ask;
use super::kcache::{Inval, KernelCache};
use crate::approvals::{Approvals, Outcome};
use crate::audit::Audit;
use crate::host::handle::{Handle, HandleFd, Handles, ListEntry, Slots};
use crate::host::inode::{Inodes, ROOT, join};
use crate::host::sys::{self, Name, SetTime, Xattr};
use crate::idmap::IdMap;
use crate::policy::{Access, By, Caller, Need, Special, Verdict};
use crate::reload::{PolicyStore, Snapshot};

/// An errno for the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error(pub i32);

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        match e.raw_os_error() {
            Some(n) => Error(n),
            None => {
                log::warn!("host error without errno: {e}");
                Error(libc::EIO)
            }
        }
    }
}

/// Result of an operation.
pub type Res<T> = Result<T, Error>;

/// Who asks, and the policy snapshot the whole request is decided against.
pub struct Ctx {
    /// uid/gid of the caller.
    pub caller: Caller,
    /// pid of the caller.
    pub pid: u32,
    /// The policy in force when the request arrived.
    pub snap: Arc<Snapshot>,
    /// Re-running a held request an approver allowed: refusals an approver could lift are
    /// lifted (and audited with this outcome).
    pub approved: Option<Outcome>,
    /// Set by a refusal an approver could lift: what to ask (the glue holds the request).
    pub ask: RefCell<Option<Ask>>,
    /// The glue can hold this request (`Core::serve`); otherwise such a refusal is final.
    pub may_hold: bool,
}

/// Cache lifetimes for one reply.
#[derive(Clone, Copy)]
pub struct Ttl {
    /// Entry (name → inode) lifetime.
    pub entry: Duration,
    /// Attribute lifetime.
    pub attr: Duration,
}

/// Daemon-wide settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Re-check every read and write against the policy in force.
    pub revoke: bool,
    /// Kernel cache lifetime for names and attributes when no rule depends on the caller.
    pub ttl: Duration,
    /// Use kernel FUSE passthrough for file I/O where the kernel allows it.
    pub passthrough: bool,
}

/// Everything the operations share.
pub struct Shared {
    /// Inode table.
    pub inodes: Inodes,
    /// Open handles.
    pub handles: Handles,
    /// Policy in force.
    pub policy: PolicyStore,
    /// Audit writer.
    pub audit: Option<Audit>,
    /// Settings.
    pub settings: Settings,
    /// The daemon runs as root: created files are chowned to the caller.
    pub as_root: bool,
    /// Caller ↔ host uid map.
    pub uids: IdMap,
    /// Caller ↔ host gid map.
    pub gids: IdMap,
    /// What the kernel caches on the daemon's word (hidden negative entries, invalidations).
    pub kcache: KernelCache,
    /// Requests held for an approver.
    pub approvals: Arc<Approvals>,
    /// Decisions made (for `status`).
    pub stats: Stats,
}

/// Decision counters.
#[derive(Default)]
pub struct Stats {
    /// Operations allowed.
    pub allowed: AtomicU64,
    /// Operations refused.
    pub denied: AtomicU64,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// A visible file.
    Found(FileAttr),
    /// No such name on the host.
    Absent,
    /// The policy hides the name (answered exactly like `Absent`).
    Hidden,
}

/// A host file opened for a caller, not yet registered as a handle: the glue first offers
/// it to the kernel as a passthrough backing file.
pub struct Opened {
    /// The node.
    pub ino: u64,
    /// The open host file.
    pub file: OwnedFd,
    /// The opener's host file-system ids (uid, gid): a passthrough backing file's writes
    /// run with them.
    pub writer: (u32, u32),
    read: bool,
    write: bool,
    exec: bool,
    slots: Slots,
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(st) => match st.duration_since(UNIX_EPOCH) {
            Ok(d) => SetTime::At(d.as_secs() as i64, d.subsec_nanos() as i64),
            Err(e) => {
                let d = e.duration();
                let mut s = -(d.as_secs() as i64);
                let mut n = d.subsec_nanos() as i64;
                if n > 0 {
                    s -= 1;
                    n = 1_000_000_000 - n;
                }
                SetTime::At(s, n)
            }
        },
    }
}

impl Shared {
    /// Host attributes as the caller sees them (ids mapped). Every attribute reply to the
    /// kernel is made here. When the policy may hide something, a directory's link count is
    /// 1 (what `find` and fts read as "unknown", as btrfs reports): the host's count
    /// includes hidden subdirectories.
    fn attr(&self, ctx: &Ctx, ino: u64, st: &libc::stat) -> FileAttr {
        let mut a = to_attr(ino, st);
        a.uid = self.uids.to_caller(a.uid);
        a.gid = self.gids.to_caller(a.gid);
        if a.kind == FileType::Directory && ctx.snap.policy.may_hide() {
            a.nlink = 1;
        }
        a
    }

    /// Builds the request context (one policy snapshot).
    pub fn ctx(&self, uid: u32, gid: u32, pid: u32) -> Ctx {
        Ctx {
            caller: Caller { uid, gid },
            pid,
            snap: self.policy.get(),
            approved: None,
            ask: RefCell::new(None),
            may_hold: false,
        }
    }

    /// Cache lifetimes under this snapshot: zero when rules depend on the caller, so a
    /// name or attribute cached for one caller never serves another.
    pub fn ttl(&self, ctx: &Ctx) -> Ttl {
        if ctx.snap.policy.has_id_rules() {
            Ttl {
                entry: Duration::ZERO,
                attr: Duration::ZERO,
            }
        } else {
            Ttl {
                entry: self.settings.ttl,
                attr: self.settings.ttl,
            }
        }
    }

    fn child_path(&self, parent: u64, name: &Name) -> Res<Vec<u8>> {
        let pp = self.inodes.path(parent)?;
        Ok(join(&pp, name.bytes()))
    }

    fn stat_ino(&self, ino: u64) -> Res<libc::stat> {
        let fd = self.inodes.fd(ino)?;
        Ok(sys::fstat(fd.as_fd())?)
    }

    /// Creates `name` in directory `pfd` with `make`, owned by the caller from the first
    /// instant: when the daemon runs as root, `make` runs under the caller's (mapped)
    /// file-system ids, so the host also checks permissions as the caller, and a set-group-ID
    /// parent gives its group, as on a local disk. The one exception: a parent directory
    /// writable through its group, which is not the caller's primary group — the kernel
    /// allowed the request with the caller's supplementary groups (`default_permissions`),
    /// which this thread does not carry. Then, on EACCES, the entry is made as the daemon
    /// and given to the caller, and removed again if that fails — never a daemon-owned
    /// leftover.
    fn create_as_caller<T>(
        &self,
        ctx: &Ctx,
        pfd: &OwnedFd,
        name: &Name,
        dir: bool,
        make: impl Fn() -> io::Result<T>,
    ) -> Res<T> {
        match self.as_caller(ctx, &make) {
            Err(Error(libc::EACCES)) if self.as_root => {}
            r => return r,
        }
        let uid = self.uids.to_host(ctx.caller.uid);
        let gid = self.gids.to_host(ctx.caller.gid);
        let pst = sys::fstat(pfd.as_fd())?;
        let by_group = pst.st_mode & 0o030 == 0o030 && pst.st_gid != gid && pst.st_uid != uid;
        if !by_group {
            return Err(Error(libc::EACCES));
        }
        let made = make()?;
        let owner_gid = if pst.st_mode & libc::S_ISGID != 0 {
            pst.st_gid
        } else {
            gid
        };
        let give = sys::fchownat_nofollow(pfd.as_fd(), name, uid, owner_gid);
        if let Err(e) = give {
            let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
            if let Err(e2) = sys::unlinkat(pfd.as_fd(), name, flags) {
                log::error!("cannot remove an entry whose ownership failed ({e}): {e2}");
            }
            return Err(e.into());
        }
        Ok(made)
    }

    /// Runs `f` under the caller's (mapped) file-system ids when the daemon runs as root:
    /// what it creates belongs to the caller and the host checks the caller's permissions.
    fn as_caller<T>(&self, ctx: &Ctx, f: impl FnOnce() -> io::Result<T>) -> Res<T> {
        let uid = self.uids.to_host(ctx.caller.uid);
        let gid = self.gids.to_host(ctx.caller.gid);
        if !self.as_root || (uid, gid) == (0, 0) {
            return Ok(f()?);
        }
        let _ids = sys::FsIds::assume(uid, gid)?;
        Ok(f()?)
    }

    /// The kernel believed `parent/name` absent and it is not: tell it to forget that.
    fn forget_entry(&self, parent: u64, name: &Name) {
        self.kcache.send(Inval {
            entries: vec![(parent, name.bytes().to_vec())],
            ..Inval::default()
        });
    }

    /// Records an entry just created in `parent` (stat through the held parent handle: no
    /// descriptor needed). If even that fails, the entry is removed again: a create either
    /// happens completely or not at all.
    fn finish_create(
        &self,
        ctx: &Ctx,
        parent: u64,
        pfd: &OwnedFd,
        name: &Name,
        dir: bool,
    ) -> Res<FileAttr> {
        match sys::fstatat_nofollow(pfd.as_fd(), name) {
            Ok(st) => {
                let ino = self.inodes.adopt(parent, name, &st, true);
                Ok(self.attr(ctx, ino, &st))
            }
            Err(e) => {
                let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
                let _ = sys::unlinkat(pfd.as_fd(), name, flags);
                Err(e.into())
            }
        }
    }

    /// A descriptor for I/O on handle `h`: its own, or (a passthrough handle, whose file
    /// the kernel holds) the node reopened with `flags` for this call.
    fn io_fd<'a>(&self, h: &'a Handle, flags: i32) -> Res<HandleFd<'a>> {
        if let Some(f) = &h.file {
            return Ok(HandleFd::Held(f));
        }
        let node = self.inodes.fd(h.ino)?;
        Ok(HandleFd::Temp(sys::reopen(
            self.inodes.proc_fd.as_fd(),
            node.as_fd(),
            flags,
        )?))
    }

    /// The caller's host uid and gid.
    fn host_ids(&self, ctx: &Ctx) -> (u32, u32) {
        (
            self.uids.to_host(ctx.caller.uid),
            self.gids.to_host(ctx.caller.gid),
        )
    }

    /// Whether the kernel would have the file system clear set-ID bits for this caller
    /// (FUSE_HANDLE_KILLPRIV_V2: a write, truncate or fallocate by a caller without
    /// CAP_FSETID). The kernel says so on writes; for truncates, opens with `O_TRUNC` and
    /// fallocate fuser does not pass its flag on, so it is read from the caller: any host
    /// uid but root, as the caller's own kernel would decide for an unprivileged process.
    fn kills_setid(&self, ctx: &Ctx) -> bool {
        self.uids.to_host(ctx.caller.uid) != 0
    }

    /// Clears the set-user-ID bit, and the set-group-ID bit of a group-executable file,
    /// of the regular file behind `fd`, as a local disk does when a caller without
    /// CAP_FSETID writes or truncates it (the daemon's own write, as root, would keep
    /// them). `security.capability` needs no help: the host drops it on every write,
    /// truncate and chown, whoever makes it.
    ///
    /// The kernel may hold the old mode (an open or a write replies without attributes),
    /// so a change queues an invalidation of `ino`'s attributes.
    fn kill_setid(&self, ino: u64, fd: BorrowedFd<'_>) -> Res<()> {
        let st = sys::fstat(fd)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(());
        }
        let mut kill = st.st_mode & libc::S_ISUID;
        if st.st_mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
            kill |= libc::S_ISGID;
        }
        if kill != 0 {
            sys::fchmod_fd(self.inodes.proc_fd.as_fd(), fd, st.st_mode & 0o7777 & !kill)?;
            self.kcache.send(Inval {
                inodes: vec![(ino, -1)],
                ..Inval::default()
            });
        }
        Ok(())
    }

    /// Registers an opened file as a handle; returns its `fh`. A passthrough file gives
    /// its descriptor (and the descriptor budget) back: the kernel holds the backing file.
    pub fn register(&self, o: Opened, passthrough: bool) -> u64 {
        let Opened {
            ino,
            file,
            writer: _,
            read,
            write,
            exec,
            mut slots,
        } = o;
        let file = if passthrough {
            slots.fd = None;
            None
        } else {
            Some(file)
        };
        self.handles.insert(Handle {
            ino,
            file,
            read,
            write,
            exec,
            entries: None,
            slots,
            kept: OnceLock::new(),
        })
    }

    // ---- names -------------------------------------------------------------------------

    /// lookup: one `fstatat(parent, name, AT_SYMLINK_NOFOLLOW)` (the type decides whether
    /// the visibility lift applies), then `list` on the child path. A name absent on the
    /// host and a name the policy hides give the same answer (`Absent` / `Hidden`), which
    /// the glue sends as the same negative entry.
    pub fn do_lookup(&self, ctx: &Ctx, parent: u64, name: &Name) -> Res<Lookup> {
        let path = self.child_path(parent, name)?;
        let st = match self.inodes.probe(parent, name) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // The same policy work as for a present name, so that the time of a
                // lookup does not tell an absent name from a hidden one.
                std::hint::black_box(ctx.snap.policy.verdict_for(&path, ctx.caller, false));
                return Ok(Lookup::Absent);
            }
            Err(e) => return Err(e.into()),
        };
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        match self.allow(ctx, "lookup", &path, is_dir, Need::List, Special::default()) {
            Ok(_) => {}
            Err(Error(libc::ENOENT)) => return Ok(Lookup::Hidden),
            Err(e) => return Err(e),
        }
        let ino = self.inodes.adopt(parent, name, &st, true);
        Ok(Lookup::Found(self.attr(ctx, ino, &st)))
    }

    /// Whether the kernel may cache the hidden name `parent/name` as a negative entry
    /// decided under `ctx`'s snapshot: only if a reload can take it back (it is recorded)
    /// and no reload has happened since the decision.
    pub fn cache_hidden(&self, ctx: &Ctx, parent: u64, name: &Name) -> bool {
        self.kcache.hidden_negative(parent, name.bytes())
            && self.policy.generation() == ctx.snap.generation
    }

    /// forget.
    pub fn do_forget(&self, ino: u64, n: u64) {
        self.inodes.forget(ino, n);
    }

    /// getattr (through the open handle when the kernel names one).
    pub fn do_getattr(&self, ctx: &Ctx, ino: u64, fh: Option<u64>) -> Res<FileAttr> {
        self.allow_ino(ctx, "getattr", ino, Need::List, Special::default())?;
        if let Some(h) = fh.and_then(|fh| self.handles.get(fh))
            && let Some(f) = h.file_fd()
        {
            return Ok(self.attr(ctx, ino, &sys::fstat(f)?));
        }
        Ok(self.attr(ctx, ino, &self.stat_ino(ino)?))
    }

    /// setattr: chmod, chown, truncate, utimens — all need `write`; setting set-ID bits
    /// needs `allow_setid`.
    #[allow(clippy::too_many_arguments)]
    pub fn do_setattr(
        &self,
        ctx: &Ctx,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<u64>,
    ) -> Res<FileAttr> {
        let st = self.stat_ino(ino)?;
        let mut sp = Special::default();
        if let Some(m) = mode {
            let setid = libc::S_ISUID | libc::S_ISGID;
            // Only turning a set-ID bit on is "setting" it.
            sp.setid = (m & setid) & !(st.st_mode & setid) != 0;
        }
        self.allow_ino(ctx, "setattr", ino, Need::Write, sp)?;
        let kind = st.st_mode & libc::S_IFMT;
        let fd = self.inodes.fd(ino)?;
        let handle = fh.and_then(|fh| self.handles.get(fh));
        if let Some(m) = mode {
            if kind == libc::S_IFLNK {
                return Err(Error(libc::EOPNOTSUPP));
            }
            sys::fchmod_fd(self.inodes.proc_fd.as_fd(), fd.as_fd(), m & 0o7777)?;
        }
        if uid.is_some() || gid.is_some() {
            let u = uid.map_or(u32::MAX, |u| self.uids.to_host(u));
            let g = gid.map_or(u32::MAX, |g| self.gids.to_host(g));
            sys::fchown_fd(fd.as_fd(), u, g)?;
        }
        // Nothing to set: the kernel's "remove privileges" before a write (the file is
        // open for writing) or for chown(-1, -1) by the owner (FUSE_HANDLE_KILLPRIV_V2
        // leaves the clearing to the daemon; the reply then carries the new mode). Anyone
        // else's chown(-1, -1) changes nothing, as a local disk refuses it the mode change.
        // A truncate clears them too.
        let nothing = [mode, uid, gid].iter().all(Option::is_none)
            && size.is_none()
            && atime.is_none()
            && mtime.is_none()
            && (st.st_uid == self.host_ids(ctx).0 || self.handles.any_on(ino, |h| h.write));
        if (nothing || (size.is_some() && mode.is_none()))
            && kind == libc::S_IFREG
            && self.kills_setid(ctx)
        {
            self.kill_setid(ino, fd.as_fd())?;
        }
        if let Some(sz) = size {
            match &handle {
                Some(h) if h.write => sys::ftruncate(self.io_fd(h, libc::O_WRONLY)?.as_fd(), sz)?,
                _ => {
                    if kind == libc::S_IFDIR {
                        return Err(Error(libc::EISDIR));
                    }
                    if kind != libc::S_IFREG {
                        return Err(Error(libc::EINVAL));
                    }
                    let f = sys::reopen(self.inodes.proc_fd.as_fd(), fd.as_fd(), libc::O_WRONLY)?;
                    sys::ftruncate(f.as_fd(), sz)?;
                }
            }
        }
        if atime.is_some() || mtime.is_some() {
            let a = atime.map(set_time).unwrap_or(SetTime::Omit);
            let m = mtime.map(set_time).unwrap_or(SetTime::Omit);
            if kind == libc::S_IFLNK {
                let (parent, name) = self.inodes.alias(ino).ok_or(Error(libc::ESTALE))?;
                let pfd = self.inodes.fd(parent)?;
                sys::utimens_nofollow(pfd.as_fd(), &Name::new(&name)?, a, m)?;
            } else {
                sys::utimens_fd(self.inodes.proc_fd.as_fd(), fd.as_fd(), a, m)?;
            }
        }
        Ok(self.attr(ctx, ino, &sys::fstat(fd.as_fd())?))
    }

    /// readlink: `list`; the stored target unchanged.
    pub fn do_readlink(&self, ctx: &Ctx, ino: u64) -> Res<Vec<u8>> {
        self.allow_ino(ctx, "readlink", ino, Need::List, Special::default())?;
        let fd = self.inodes.fd(ino)?;
        Ok(sys::readlink_fd(fd.as_fd())?)
    }

    /// mknod: `write` on the new path; device nodes need `allow_devices`.
    pub fn do_mknod(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &Name,
        mode: u32,
        rdev: u32,
    ) -> Res<FileAttr> {
        let path = self.child_path(parent, name)?;
        let fmt = mode & libc::S_IFMT;
        let sp = Special {
            device: fmt == libc::S_IFCHR || fmt == libc::S_IFBLK,
            setid: mode & (libc::S_ISUID | libc::S_ISGID) != 0,
        };
        self.allow(ctx, "mknod", &path, false, Need::Create, sp)?;
        let pfd = self.inodes.fd(parent)?;
        self.create_as_caller(ctx, &pfd, name, false, || {
            sys::mknodat(pfd.as_fd(), name, mode, rdev as u64)
        })?;
        self.finish_create(ctx, parent, &pfd, name, false)
    }

    /// mkdir.
    pub fn do_mkdir(&self, ctx: &Ctx, parent: u64, name: &Name, mode: u32) -> Res<FileAttr> {
        let path = self.child_path(parent, name)?;
        let sp = Special {
            device: false,
            setid: mode & (libc::S_ISUID | libc::S_ISGID) != 0,
        };
        self.allow(ctx, "mkdir", &path, true, Need::Create, sp)?;
        let pfd = self.inodes.fd(parent)?;
        self.create_as_caller(ctx, &pfd, name, true, || {
            sys::mkdirat(pfd.as_fd(), name, mode & 0o7777)
        })?;
        self.finish_create(ctx, parent, &pfd, name, true)
    }

    /// symlink: the target is stored as given; the caller's kernel resolves it later.
    pub fn do_symlink(&self, ctx: &Ctx, parent: u64, name: &Name, target: &[u8]) -> Res<FileAttr> {
        let path = self.child_path(parent, name)?;
        self.allow(
            ctx,
            "symlink",
            &path,
            false,
            Need::Create,
            Special::default(),
        )?;
        let pfd = self.inodes.fd(parent)?;
        self.create_as_caller(ctx, &pfd, name, false, || {
            sys::symlinkat(target, pfd.as_fd(), name)
        })?;
        self.finish_create(ctx, parent, &pfd, name, false)
    }

    /// The handle to keep for a node about to lose its name: an operation on it after the
    /// unlink (fchmod on an open file, stat of a removed cwd) can no longer resolve it by
    /// name. Opened only for directories and files still open; otherwise what is cached.
    fn pin_handle(&self, ino: u64) -> Option<Arc<OwnedFd>> {
        let needed = self.inodes.kind(ino).is_ok_and(|k| k == libc::S_IFDIR)
            || self.handles.any_on(ino, |_| true);
        if needed {
            self.inodes.fd(ino).ok()
        } else {
            self.inodes.cached_fd(ino)
        }
    }

    /// The answer for a directory the host calls not empty (ENOTEMPTY, or EEXIST on some
    /// file systems) when removing it or renaming onto it: if nothing in it is visible to
    /// the caller (exactly as `readdir` filters), EACCES, audited as a refusal — ENOTEMPTY
    /// would reveal the hidden entries. Every other host error passes through.
    #[allow(clippy::too_many_arguments)]
    fn not_empty(
        &self,
        ctx: &Ctx,
        op: &'static str,
        path: &[u8],
        v: &Verdict,
        dir: BorrowedFd<'_>,
        name: &Name,
        e: io::Error,
    ) -> Error {
        let err = Error::from(e);
        if err.0 != libc::ENOTEMPTY && err.0 != libc::EEXIST {
            return err;
        }
        match self.nothing_visible(ctx, path, dir, name) {
            Some(hidden_by) => {
                let by = hidden_by.unwrap_or(v.by);
                self.audit(ctx, op, path, v, by, Some(libc::EACCES));
                Error(libc::EACCES)
            }
            None => err,
        }
    }

    /// `Some` when directory `dir/name` (workspace path `path`) holds no entry visible to
    /// the caller, with what hides its first entry (`Some(None)`: it is empty by now);
    /// `None` when some entry is visible or the directory cannot be read.
    fn nothing_visible(
        &self,
        ctx: &Ctx,
        path: &[u8],
        dir: BorrowedFd<'_>,
        name: &Name,
    ) -> Option<Option<By>> {
        let fd = sys::openat(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0).ok()?;
        let entries = sys::read_dir(fd.as_fd()).ok()?;
        let mut p = join(path, b"");
        let base = p.len();
        let mut hidden_by = None;
        for e in &entries {
            p.truncate(base);
            p.extend_from_slice(&e.name);
            // As `list`: DT_UNKNOWN counts as a directory.
            let is_dir = e.dtype == libc::DT_DIR || e.dtype == libc::DT_UNKNOWN;
            let v = ctx.snap.policy.verdict_for(&p, ctx.caller, is_dir);
            if v.effective != Access::None {
                return None;
            }
            hidden_by.get_or_insert(v.by);
        }
        Some(hidden_by)
    }

    /// unlink / rmdir: `write` on the path; a directory holding only hidden entries is
    /// refused with EACCES (see [`Shared::not_empty`]).
    pub fn do_remove(&self, ctx: &Ctx, parent: u64, name: &Name, dir: bool) -> Res<()> {
        let path = self.child_path(parent, name)?;
        let op = if dir { "rmdir" } else { "unlink" };
        let v = self.allow(ctx, op, &path, dir, Need::Write, Special::default())?;
        let pfd = self.inodes.fd(parent)?;
        let known = self.inodes.child(parent, name.bytes());
        let pin = known.and_then(|i| self.pin_handle(i));
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        if let Err(e) = sys::unlinkat(pfd.as_fd(), name, flags) {
            return Err(if dir {
                self.not_empty(ctx, op, &path, &v, pfd.as_fd(), name, e)
            } else {
                e.into()
            });
        }
        self.inodes.remove_alias(parent, name.bytes(), pin);
        Ok(())
    }

    /// rename (with `RENAME_NOREPLACE` / `RENAME_EXCHANGE`): `write` on both names; a
    /// directory moves only when no rule could give a path below either name a different
    /// access (a rename never changes a path's policy).
    pub fn do_rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &Name,
        newparent: u64,
        newname: &Name,
        flags: u32,
    ) -> Res<()> {
        let old = self.child_path(parent, name)?;
        let new = self.child_path(newparent, newname)?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let pfd = self.inodes.fd(parent)?;
        let npfd = self.inodes.fd(newparent)?;
        let src_st = sys::fstatat_nofollow(pfd.as_fd(), name)?;
        let dst_st = sys::fstatat_nofollow(npfd.as_fd(), newname).ok();
        let dir_of = |st: &libc::stat| st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let src_dir = dir_of(&src_st);
        let dst_dir = if exchange {
            dst_st.as_ref().is_some_and(dir_of)
        } else {
            src_dir
        };
        let new_need = if exchange { Need::Write } else { Need::Create };
        self.allow_all(
            ctx,
            "rename",
            &[(&old, src_dir, Need::Write), (&new, dst_dir, new_need)],
        )?;
        let moves_dir = src_dir || (exchange && dst_dir);
        if moves_dir && !ctx.snap.policy.dir_rename_allowed(&old, &new) {
            let v = ctx.snap.policy.verdict(&old, ctx.caller);
            self.audit(ctx, "rename", &old, &v, v.grant_by, Some(libc::EACCES));
            return Err(Error(libc::EACCES));
        }
        let src = self.inodes.child(parent, name.bytes());
        let dst = self.inodes.child(newparent, newname.bytes());
        let dst_pin = dst.and_then(|i| self.pin_handle(i));
        if let Err(e) = sys::renameat2(pfd.as_fd(), name, npfd.as_fd(), newname, flags) {
            // Replacing a directory that holds only hidden entries: EACCES, not ENOTEMPTY.
            let replaces_dir = flags & (libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) == 0
                && dst_st.as_ref().is_some_and(dir_of);
            return Err(if replaces_dir {
                let v = ctx.snap.policy.verdict_for(&new, ctx.caller, true);
                self.not_empty(ctx, "rename", &new, &v, npfd.as_fd(), newname, e)
            } else {
                e.into()
            });
        }
        if exchange {
            self.inodes
                .exchange_alias((parent, name.bytes()), (newparent, newname.bytes()));
        } else {
            if dst.is_some() {
                self.inodes
                    .remove_alias(newparent, newname.bytes(), dst_pin);
            }
            match src {
                Some(ino) => {
                    self.inodes
                        .rename_alias(ino, parent, name.bytes(), newparent, newname.bytes())
                }
                None => self.inodes.remove_alias(parent, name.bytes(), None),
            }
        }
        Ok(())
    }

    /// link: `write` on the existing file (every name it is known under) and on the new name.
    pub fn do_link(&self, ctx: &Ctx, ino: u64, newparent: u64, newname: &Name) -> Res<FileAttr> {
        let new = self.child_path(newparent, newname)?;
        let sources = self.inodes.paths(ino)?;
        if sources.is_empty() {
            return Err(Error(libc::ENOENT));
        }
        let is_dir = self.inodes.kind(ino)? == libc::S_IFDIR;
        let mut checks: Vec<(&[u8], bool, Need)> = sources
            .iter()
            .map(|p| (p.as_slice(), is_dir, Need::Write))
            .collect();
        checks.push((&new, false, Need::Create));
        self.allow_all(ctx, "link", &checks)?;
        let fd = self.inodes.fd(ino)?;
        let npfd = self.inodes.fd(newparent)?;
        sys::linkat_fd(
            self.inodes.proc_fd.as_fd(),
            fd.as_fd(),
            npfd.as_fd(),
            newname,
        )?;
        let (ino, st) = self.inodes.lookup(newparent, newname, true)?;
        Ok(self.attr(ctx, ino, &st))
    }

    // ---- files -------------------------------------------------------------------------

    /// open: the flags decide the level needed; the handle keeps what was granted. Only
    /// regular files and directories are ever opened on the host (the type is checked on
    /// the handle first, and the open is `O_NONBLOCK`), so an open never waits. The caller's
    /// descriptor budget is taken before the open.
    pub fn do_open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Res<Opened> {
        let intent = attr::classify(flags);
        self.allow_ino(ctx, "open", ino, intent.need, Special::default())?;
        // O_TRUNC is applied by the host open itself (atomic O_TRUNC): refuse it for a
        // running program before the host file is touched, as a local disk would.
        if flags & libc::O_TRUNC != 0 && self.handles.executing(ino) {
            return Err(Error(libc::ETXTBSY));
        }
        let fd = self.inodes.fd(ino)?;
        let st = sys::fstat(fd.as_fd())?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFDIR => {
                if intent.write {
                    return Err(Error(libc::EISDIR));
                }
            }
            _ => return Err(Error(libc::EINVAL)),
        }
        let slots = self.handles.reserve(ctx.caller.uid)?;
        let file = sys::reopen(
            self.inodes.proc_fd.as_fd(),
            fd.as_fd(),
            attr::host_open_flags(flags),
        )?;
        if flags & libc::O_TRUNC != 0 && self.kills_setid(ctx) {
            self.kill_setid(ino, file.as_fd())?;
        }
        Ok(Opened {
            ino,
            file,
            writer: self.host_ids(ctx),
            read: intent.read,
            write: intent.write,
            exec: flags & attr::FMODE_EXEC != 0,
            slots,
        })
    }

    /// create: `write` on the new path (EACCES if hidden, host untouched); set-ID bits
    /// need `allow_setid`. Returns attributes and the opened file. The host file is made
    /// with `O_CREAT|O_EXCL` as the caller; only when the caller did not ask for `O_EXCL`
    /// and the name turns out to exist after all (the kernel's negative entry was stale) is
    /// the existing file opened — as the caller, never waiting, and only a regular file:
    /// anything else answers EEXIST and the kernel is told to forget its stale entry.
    pub fn do_create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &Name,
        mode: u32,
        flags: i32,
    ) -> Res<(FileAttr, Opened)> {
        let path = self.child_path(parent, name)?;
        let sp = Special {
            device: false,
            setid: mode & (libc::S_ISUID | libc::S_ISGID) != 0,
        };
        self.allow(ctx, "create", &path, false, Need::Create, sp)?;
        let intent = attr::classify(flags);
        if flags & libc::O_TRUNC != 0
            && let Some(existing) = self.inodes.child(parent, name.bytes())
            && self.handles.executing(existing)
        {
            return Err(Error(libc::ETXTBSY));
        }
        let slots = self.handles.reserve(ctx.caller.uid)?;
        let pfd = self.inodes.fd(parent)?;
        let base = attr::host_open_flags(flags);
        let created = self.create_as_caller(ctx, &pfd, name, false, || {
            sys::openat(
                pfd.as_fd(),
                name,
                base | libc::O_CREAT | libc::O_EXCL,
                mode & 0o7777,
            )
        });
        let (file, existed) = match created {
            Ok(f) => (f, false),
            Err(Error(libc::EEXIST)) if flags & libc::O_EXCL == 0 => {
                (self.open_existing(ctx, parent, &pfd, name, base)?, true)
            }
            Err(e) => return Err(e),
        };
        let mut st = sys::fstat(file.as_fd())?;
        // The open file is exactly what is under that name now.
        let ino = self.inodes.adopt(parent, name, &st, true);
        if existed && flags & libc::O_TRUNC != 0 && self.kills_setid(ctx) {
            self.kill_setid(ino, file.as_fd())?;
            st = sys::fstat(file.as_fd())?;
        }
        let opened = Opened {
            ino,
            file,
            writer: self.host_ids(ctx),
            read: intent.read,
            write: true,
            exec: false,
            slots,
        };
        Ok((self.attr(ctx, ino, &st), opened))
    }

    /// The existing-name half of a create without `O_EXCL`: opens `name` as the caller
    /// (the kernel checked no permission on a file it believed absent), `O_NONBLOCK`, and
    /// keeps it only if it is a regular file.
    fn open_existing(
        &self,
        ctx: &Ctx,
        parent: u64,
        pfd: &OwnedFd,
        name: &Name,
        flags: i32,
    ) -> Res<OwnedFd> {
        // Whatever is there, the kernel's "absent" was wrong.
        self.forget_entry(parent, name);
        let file = match self.as_caller(ctx, || sys::openat(pfd.as_fd(), name, flags, 0)) {
            Ok(f) => f,
            // A FIFO without a reader (ENXIO), a symlink (ELOOP), a device: not a file.
            Err(Error(libc::ENXIO | libc::ELOOP)) => return Err(Error(libc::EEXIST)),
            Err(e) => return Err(e),
        };
        if sys::fstat(file.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error(libc::EEXIST));
        }
        Ok(file)
    }

    fn handle(&self, fh: u64) -> Res<Arc<Handle>> {
        self.handles.get(fh).ok_or(Error(libc::EBADF))
    }

    /// With `--revoke`, re-decides a handle's I/O against the policy in force.
    fn recheck(&self, ctx: &Ctx, op: &'static str, h: &Handle, need: Need) -> Res<()> {
        if self.settings.revoke {
            self.allow_ino(ctx, op, h.ino, need, Special::default())?;
        }
        Ok(())
    }

    /// read through a handle opened for reading.
    pub fn do_read(&self, ctx: &Ctx, fh: u64, offset: u64, size: u32) -> Res<Vec<u8>> {
        let h = self.handle(fh)?;
        if !h.read {
            return Err(Error(libc::EBADF));
        }
        self.recheck(ctx, "read", &h, Need::Read)?;
        let fd = self.io_fd(&h, libc::O_RDONLY)?;
        let mut buf = vec![0u8; size as usize];
        let mut done = 0;
        while done < buf.len() {
            match sys::pread(fd.as_fd(), &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// write through a handle opened for writing; `kill_setid`: the kernel's
    /// FUSE_WRITE_KILL_SUIDGID (the writer lacks CAP_FSETID), see [`Shared::kill_setid`].
    pub fn do_write(
        &self,
        ctx: &Ctx,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_setid: bool,
    ) -> Res<u32> {
        let h = self.handle(fh)?;
        if !h.write {
            return Err(Error(libc::EBADF));
        }
        self.recheck(ctx, "write", &h, Need::Write)?;
        let fd = self.io_fd(&h, libc::O_WRONLY)?;
        if kill_setid {
            self.kill_setid(h.ino, fd.as_fd())?;
        }
        let n = pwrite_all(fd.as_fd(), data, offset)?;
        Ok(n as u32)
    }

    /// fsync / fsyncdir. A passthrough handle keeps the descriptor its first fsync
    /// reopens (see [`Handle::sync_fd`]): a database commits with an fsync every time.
    pub fn do_fsync(&self, fh: u64, datasync: bool) -> Res<()> {
        let h = self.handle(fh)?;
        let fd = h.sync_fd(&self.handles.fds, || {
            let node = self.inodes.fd(h.ino)?;
            sys::reopen(self.inodes.proc_fd.as_fd(), node.as_fd(), read_or_write(&h))
        })?;
        Ok(sys::fsync(fd.as_fd(), datasync)?)
    }

    /// release / releasedir.
    pub fn do_release(&self, fh: u64) {
        self.handles.remove(fh);
    }

    /// fallocate (a write).
    pub fn do_fallocate(&self, ctx: &Ctx, fh: u64, offset: u64, len: u64, mode: i32) -> Res<()> {
        let h = self.handle(fh)?;
        if !h.write {
            return Err(Error(libc::EBADF));
        }
        self.recheck(ctx, "fallocate", &h, Need::Write)?;
        let fd = self.io_fd(&h, libc::O_WRONLY)?;
        if self.kills_setid(ctx) {
            self.kill_setid(h.ino, fd.as_fd())?;
        }
        Ok(sys::fallocate(fd.as_fd(), mode, offset, len)?)
    }

    /// lseek (SEEK_DATA / SEEK_HOLE).
    pub fn do_lseek(&self, fh: u64, offset: i64, whence: i32) -> Res<i64> {
        let h = self.handle(fh)?;
        let fd = self.io_fd(&h, read_or_write(&h))?;
        Ok(sys::lseek(fd.as_fd(), offset, whence)?)
    }

    /// copy_file_range: read on the source handle, write on the destination handle.
    #[allow(clippy::too_many_arguments)]
    pub fn do_copy_file_range(
        &self,
        ctx: &Ctx,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Res<u32> {
        let hi = self.handle(fh_in)?;
        let ho = self.handle(fh_out)?;
        if !hi.read || !ho.write {
            return Err(Error(libc::EBADF));
        }
        self.recheck(ctx, "read", &hi, Need::Read)?;
        self.recheck(ctx, "write", &ho, Need::Write)?;
        let len = len.min(u32::MAX as u64 & !0xfff);
        let fi = self.io_fd(&hi, libc::O_RDONLY)?;
        let fo = self.io_fd(&ho, libc::O_WRONLY)?;
        if self.kills_setid(ctx) {
            self.kill_setid(ho.ino, fo.as_fd())?;
        }
        let n = sys::copy_file_range(fi.as_fd(), off_in, fo.as_fd(), off_out, len)?;
        Ok(n as u32)
    }

    // ---- directories -------------------------------------------------------------------

    /// opendir: `list`; the listing shows only what the caller may see.
    pub fn do_opendir(&self, ctx: &Ctx, ino: u64) -> Res<u64> {
        self.allow_ino(ctx, "opendir", ino, Need::List, Special::default())?;
        if self.inodes.kind(ino)? != libc::S_IFDIR {
            return Err(Error(libc::ENOTDIR));
        }
        let fd = self.inodes.fd(ino)?;
        let slots = self.handles.reserve(ctx.caller.uid)?;
        let file = sys::reopen(
            self.inodes.proc_fd.as_fd(),
            fd.as_fd(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )?;
        // The listing is read by the first readdir (and again on rewind), for its caller.
        Ok(self.handles.insert(Handle {
            ino,
            file: Some(file),
            read: true,
            write: false,
            exec: false,
            entries: Some(parking_lot::Mutex::new(None)),
            slots,
            kept: OnceLock::new(),
        }))
    }

    fn list(&self, ctx: &Ctx, ino: u64, file: Option<&OwnedFd>) -> Res<Vec<ListEntry>> {
        let file = file.ok_or(Error(libc::EBADF))?;
        let dir = self.inodes.path(ino)?;
        let mut raw = sys::read_dir(file.as_fd())?;
        let mut path = join(&dir, b"");
        let base = path.len();
        raw.retain(|e| {
            // One buffer for every entry's path; DT_UNKNOWN counts as a directory.
            path.truncate(base);
            path.extend_from_slice(&e.name);
            let is_dir = e.dtype == libc::DT_DIR || e.dtype == libc::DT_UNKNOWN;
            ctx.snap
                .policy
                .verdict_for(&path, ctx.caller, is_dir)
                .effective
                != Access::None
        });
        let ids = self.inodes.ids_for(raw.iter().map(|e| e.ino));
        Ok(raw
            .into_iter()
            .zip(ids)
            .map(|(e, ino)| ListEntry {
                ino,
                kind: attr::dtype_to_mode(e.dtype),
                name: e.name,
            })
            .collect())
    }

    /// The listing for a readdir at `offset` (0 re-reads the directory, like rewinddir).
    pub fn dir_entries(
        &self,
        ctx: &Ctx,
        fh: u64,
        offset: u64,
    ) -> Res<(Arc<Handle>, Arc<Vec<ListEntry>>)> {
        let h = self.handle(fh)?;
        let Some(entries) = &h.entries else {
            return Err(Error(libc::EBADF));
        };
        let mut cur = entries.lock();
        let listing = match &*cur {
            Some(l) if offset != 0 => l.clone(),
            _ => {
                let fresh = Arc::new(self.list(ctx, h.ino, h.file.as_ref())?);
                *cur = Some(fresh.clone());
                fresh
            }
        };
        drop(cur);
        Ok((h, listing))
    }

    /// Parent id of a directory node (for `..`).
    pub fn parent_ino(&self, ino: u64) -> u64 {
        self.inodes.alias(ino).map_or(ROOT, |(parent, _)| parent)
    }

    /// readdirplus: a lookup for one listed entry.
    pub fn plus_lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Res<FileAttr> {
        let name = Name::new(name)?;
        match self.do_lookup(ctx, parent, &name)? {
            Lookup::Found(a) => Ok(a),
            Lookup::Absent | Lookup::Hidden => Err(Error(libc::ENOENT)),
        }
    }

    /// statfs of SOURCE's file system.
    pub fn do_statfs(&self, ctx: &Ctx, ino: u64) -> Res<libc::statvfs> {
        self.allow_ino(ctx, "statfs", ino, Need::List, Special::default())?;
        let fd = self.inodes.fd(ROOT)?;
        Ok(sys::fstatvfs(fd.as_fd())?)
    }

    // ---- xattrs ------------------------------------------------------------------------

    fn xattr_target(&self, ino: u64) -> Res<(Arc<OwnedFd>, bool)> {
        // The node's type is fixed (a different type under the same number is a new node).
        let ok = matches!(self.inodes.kind(ino)?, libc::S_IFREG | libc::S_IFDIR);
        let fd = self.inodes.fd(ino)?;
        Ok((fd, ok))
    }

    /// getxattr: `read`. Symlinks and special files report no attributes; names the mount
    /// does not mirror ([`attr::unmirrored_xattr`]) are EOPNOTSUPP everywhere.
    pub fn do_getxattr(&self, ctx: &Ctx, ino: u64, name: &[u8], size: u32) -> Res<Xattr> {
        if attr::unmirrored_xattr(name) {
            return Err(Error(libc::EOPNOTSUPP));
        }
        self.allow_ino(ctx, "getxattr", ino, Need::Read, Special::default())?;
        let (fd, ok) = self.xattr_target(ino)?;
        if !ok {
            return Err(Error(libc::ENODATA));
        }
        Ok(sys::getxattr_fd(fd.as_fd(), name, size as usize)?)
    }

    /// listxattr: `read`; the names the mount does not mirror are left out (so the whole
    /// list is read, at most `XATTR_LIST_MAX` bytes, and then sized for the caller).
    pub fn do_listxattr(&self, ctx: &Ctx, ino: u64, size: u32) -> Res<Xattr> {
        self.allow_ino(ctx, "listxattr", ino, Need::Read, Special::default())?;
        let (fd, ok) = self.xattr_target(ino)?;
        if !ok {
            return Ok(Xattr::empty(size as usize));
        }
        let all = match sys::listxattr_fd(fd.as_fd(), XATTR_LIST_MAX)? {
            Xattr::Data(v) => v,
            Xattr::Size(_) => Vec::new(),
        };
        let list = attr::mirrored_xattr_list(&all);
        match size as usize {
            0 => Ok(Xattr::Size(list.len())),
            n if n < list.len() => Err(Error(libc::ERANGE)),
            _ => Ok(Xattr::Data(list)),
        }
    }

    /// setxattr: `write`. Setting `security.capability` (file capabilities) counts as
    /// setting a set-ID bit: it needs `allow_setid`. The attribute lands on the host, where
    /// a capability (v3, with the caller's user namespace root as `rootid`) takes effect in
    /// every user namespace whose root is that host uid — outside the mount's `nosuid`.
    pub fn do_setxattr(
        &self,
        ctx: &Ctx,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Res<()> {
        if attr::unmirrored_xattr(name) {
            return Err(Error(libc::EOPNOTSUPP));
        }
        let sp = Special {
            device: false,
            setid: name == b"security.capability",
        };
        self.allow_ino(ctx, "setxattr", ino, Need::Write, sp)?;
        let (fd, ok) = self.xattr_target(ino)?;
        if !ok {
            return Err(Error(libc::EPERM));
        }
        Ok(sys::setxattr_fd(fd.as_fd(), name, value, flags)?)
    }

    /// removexattr: `write`.
    pub fn do_removexattr(&self, ctx: &Ctx, ino: u64, name: &[u8]) -> Res<()> {
        if attr::unmirrored_xattr(name) {
            return Err(Error(libc::EOPNOTSUPP));
        }
        self.allow_ino(ctx, "removexattr", ino, Need::Write, Special::default())?;
        let (fd, ok) = self.xattr_target(ino)?;
        if !ok {
            return Err(Error(libc::ENODATA));
        }
        Ok(sys::removexattr_fd(fd.as_fd(), name)?)
    }

    /// access(2): F_OK needs `list`, R_OK/X_OK `read`, W_OK `write`; X_OK also needs an
    /// execute bit on non-directories (as for root on a local disk).
    pub fn do_access(&self, ctx: &Ctx, ino: u64, mask: i32) -> Res<()> {
        let need = if mask & libc::W_OK != 0 {
            Need::Write
        } else if mask & (libc::R_OK | libc::X_OK) != 0 {
            Need::Read
        } else {
            Need::List
        };
        self.allow_ino(ctx, "access", ino, need, Special::default())?;
        if mask & libc::X_OK != 0 {
            let st = self.stat_ino(ino)?;
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR && st.st_mode & 0o111 == 0 {
                return Err(Error(libc::EACCES));
            }
        }
        Ok(())
    }
}

/// The longest name list a `listxattr` can return (the kernel's `XATTR_LIST_MAX`).
const XATTR_LIST_MAX: usize = 65_536;

/// The access mode a reopen for fsync/lseek needs: one the handle itself was granted.
fn read_or_write(h: &Handle) -> i32 {
    if h.read || !h.write {
        libc::O_RDONLY
    } else {
        libc::O_WRONLY
    }
}

fn pwrite_all(fd: std::os::fd::BorrowedFd<'_>, data: &[u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < data.len() {
        match sys::pwrite(fd, &data[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if done > 0 => {
                log::debug!("short write after {done} bytes: {e}");
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
