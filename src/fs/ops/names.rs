//! Operations on names: lookup, forget, readlink, mknod / mkdir / symlink / create,
//! unlink / rmdir, rename, link.
//!
//! Invariants: a name absent on the host and a name the policy hides give the same answer
//! (and cost the same policy work); a new entry belongs to the caller from its first
//! instant (`create_as_caller`) and either is recorded completely or is removed again
//! (`finish_create`), never a daemon-owned leftover; `create` makes the host file with
//! `O_CREAT|O_EXCL` and opens an existing one only as the caller and only if it is a
//! regular file; removing or replacing a directory whose entries are all hidden answers
//! EACCES, never ENOTEMPTY; a directory moves only when the move cannot change any path's
//! policy.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use fuser::FileAttr;

use super::{Ctx, Error, Lookup, Opened, Res, Shared};
use crate::fs::attr;
use crate::fs::kcache::Inval;
use crate::host::inode::{Inodes, Place};
use crate::host::path::join;
use crate::host::roots::Fence;
use crate::host::sys::{self, Name};
use crate::host::union::NewName;
use crate::policy::{Access, By, Need, Special, Verdict};

impl Shared {
    /// Creates `name` in directory `pfd` with `make`, owned by the caller from the first
    /// instant: when the daemon runs as root, `make` runs under the caller's (mapped)
    /// file-system ids, so the host also checks permissions as the caller, and a set-group-ID
    /// parent gives its group, as on a local disk. The one exception: a parent directory
    /// writable through its group, which is not the caller's primary group — the kernel
    /// allowed the request with the caller's supplementary groups (`default_permissions`),
    /// which this thread does not carry. Then, on EACCES, the entry is made as the daemon
    /// and given to the caller, and removed again if that fails — never a daemon-owned
    /// leftover.
    pub(super) fn create_as_caller<T>(
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
                let ino = self.inodes.adopt(parent, name, &st, true, Place::Upper);
                Ok(self.attr(ctx, ino, &st))
            }
            Err(e) => {
                let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
                let _ = sys::unlinkat(pfd.as_fd(), name, flags);
                Err(e.into())
            }
        }
    }

    /// lookup: one `fstatat(parent, name, AT_SYMLINK_NOFOLLOW)` (the type decides whether
    /// the visibility lift applies), then `list` on the child path. A name absent on the
    /// host and a name the policy hides give the same answer (`Absent` / `Hidden`), which
    /// the glue sends as the same negative entry.
    pub fn do_lookup(&self, ctx: &Ctx, parent: u64, name: &Name) -> Res<Lookup> {
        if let Some(found) = self.notes_lookup(ctx, parent, name.bytes()) {
            return found;
        }
        let path = self.child_path(parent, name)?;
        let (st, at) = match self.inodes.probe_at(parent, name) {
            Ok(found) => found,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // The same policy work as for a present name, so that the time of a
                // lookup does not tell an absent name from a hidden one.
                let v = ctx.snap.policy.verdict_for(&path, ctx.caller, false);
                std::hint::black_box(v);
                // `.fencefs/denials` shows a hidden name whether or not it exists: the
                // layout's fences and the `.git` alias first, as `allow` decides them.
                if self.fence(ctx, "lookup", &path, false, Need::List).is_ok()
                    && v.effective == crate::policy::Access::None
                {
                    let by = v.by;
                    self.notes
                        .record(ctx, "lookup", &path, &v, by, libc::ENOENT, None);
                }
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
        let ino = self.inodes.adopt(parent, name, &st, true, at);
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
        let (pfd, new) = self.inodes.new_name(parent, name)?;
        let fresh = new.as_ref().is_some_and(|n| n.is_fresh());
        let note = self.note_unless_fresh(&path, parent, name, fresh);
        let at = Inodes::new_at(&new, name);
        let made = self.create_as_caller(ctx, &pfd, at, false, || {
            crate::stage::standin::mknodat(pfd.as_fd(), at, mode, rdev as u64)
        });
        let done = self.inodes.new_done(&pfd, name, new, made.is_ok(), false);
        placed(made, done)?;
        self.noted(note);
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
        let (pfd, new) = self.inodes.new_name(parent, name)?;
        let at = Inodes::new_at(&new, name);
        let made = self.create_as_caller(ctx, &pfd, at, true, || {
            sys::mkdirat(pfd.as_fd(), at, mode & 0o7777)
        });
        let done = self.inodes.new_done(&pfd, name, new, made.is_ok(), true);
        placed(made, done)?;
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
        let (pfd, new) = self.inodes.new_name(parent, name)?;
        let fresh = new.as_ref().is_some_and(|n| n.is_fresh());
        let note = self.note_unless_fresh(&path, parent, name, fresh);
        let at = Inodes::new_at(&new, name);
        let made = self.create_as_caller(ctx, &pfd, at, false, || {
            sys::symlinkat(target, pfd.as_fd(), at)
        });
        let done = self.inodes.new_done(&pfd, name, new, made.is_ok(), false);
        placed(made, done)?;
        self.noted(note);
        self.finish_create(ctx, parent, &pfd, name, false)
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
        let provisional = self.provisional_create(ctx, parent, name, &path, sp);
        let v = match provisional {
            Some(v) => v,
            None => self.allow(ctx, "create", &path, false, Need::Create, sp)?,
        };
        let made = self.make_file(ctx, parent, name, &path, (mode, flags), v);
        if provisional.is_some() {
            let file = made.as_ref().ok().map(|(_, o)| (o.ino, &o.file));
            self.provisional_made(ctx, parent, &path, file);
        }
        made
    }

    /// The host half of [`Shared::do_create`], once the create is allowed with `v`.
    fn make_file(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &Name,
        path: &[u8],
        (mode, flags): (u32, i32),
        v: Verdict,
    ) -> Res<(FileAttr, Opened)> {
        let path = path.to_vec();
        // Granted `create` but not `write`: the new file stays writable by this handle
        // (and this uid) until it is closed, and an existing file is never opened.
        let fresh = !v.effective.includes(Access::Write);
        let intent = attr::classify(flags);
        if flags & libc::O_TRUNC != 0
            && let Some(existing) = self.inodes.child(parent, name.bytes())
            && self.handles.executing(existing)
        {
            return Err(Error(libc::ETXTBSY));
        }
        let root = self.inodes.roots().id_of(&path);
        let slots = self.handles.reserve(ctx.caller.uid, root)?;
        let prepared = self.inodes.new_name(parent, name);
        // A name no layer holds anything at needs no note (`note_unless_fresh`); one is
        // taken if the create finds the name taken after all.
        let untouched = matches!(&prepared, Ok((_, Some(n))) if n.is_fresh());
        let mut note = self.note_unless_fresh(&path, parent, name, untouched);
        let base = attr::host_open_flags(flags);
        let (pfd, created) = self.create_new(ctx, (parent, name), prepared, base, mode)?;
        let (file, existed) = match created {
            Ok(f) => (f, false),
            Err(Error(libc::EEXIST)) if fresh && !self.learning() => {
                // The kernel's negative entry was stale: the name is an existing file,
                // which `create` may not change.
                self.forget_entry(parent, name);
                self.audit(ctx, "create", &path, &v, v.grant_by, Some(libc::EACCES));
                return Err(Error(libc::EACCES));
            }
            Err(Error(libc::EEXIST)) if flags & libc::O_EXCL == 0 => {
                // Opening the file that is there is an open of an existing file, and the
                // layout's fences decide it as one (a kept object opened to write: EROFS,
                // the answer when the kernel knew the name).
                let need = attr::classify(flags & !libc::O_CREAT).need;
                if let Err(e) = self.fence(ctx, "create", &path, false, need) {
                    self.forget_entry(parent, name);
                    return Err(e);
                }
                if untouched {
                    note = self.note_name(&path, parent, name, true);
                }
                (self.open_existing(ctx, parent, &pfd, name, base)?, true)
            }
            Err(e) => return Err(e),
        };
        self.noted(note);
        let mut st = sys::fstat(file.as_fd())?;
        // The open file is exactly what is under that name now (a new one is the upper's;
        // an existing one may be below it).
        let at = if existed { Place::Source } else { Place::Upper };
        let ino = self.inodes.adopt(parent, name, &st, true, at);
        // On a merged view, finding a node's handle again is a lookup through the layers:
        // the first write's GETXATTR (`security.capability`) would pay it at once.
        if !existed && self.inodes.union().is_some() {
            self.inodes.cache_from(ino, file.as_fd());
        }
        if existed && flags & libc::O_TRUNC != 0 && self.kills_setid(ctx) {
            self.kill_setid(ino, file.as_fd())?;
            st = sys::fstat(file.as_fd())?;
        }
        let opened = Opened {
            ino,
            file,
            writer: self.host_ids(ctx),
            opener: (ctx.caller.uid, ctx.caller.gid),
            read: intent.read,
            write: true,
            exec: false,
            fresh: fresh && !existed,
            append_only: false,
            slots,
        };
        Ok((self.attr(ctx, ino, &st), opened))
    }

    /// The new file of a create, opened `O_CREAT|O_EXCL` (and the host flags `base`) as
    /// the caller where the name's preparation (`prepared`: [`Inodes::new_name`]) says —
    /// on a staged mount in the parent's upper part, under a temporary name put over a
    /// whiteout once made. Returns the directory it is in and the open, `EEXIST` when the
    /// name is taken (the merged view shows it, or the open finds it).
    fn create_new(
        &self,
        ctx: &Ctx,
        (parent, name): (u64, &Name),
        prepared: io::Result<(Arc<OwnedFd>, Option<NewName>)>,
        base: i32,
        mode: u32,
    ) -> Res<(Arc<OwnedFd>, Res<OwnedFd>)> {
        match prepared {
            Ok((pfd, new)) => {
                let at = Inodes::new_at(&new, name);
                let created = self.create_as_caller(ctx, &pfd, at, false, || {
                    sys::openat(
                        pfd.as_fd(),
                        at,
                        base | libc::O_CREAT | libc::O_EXCL,
                        mode & 0o7777,
                    )
                });
                let done = self
                    .inodes
                    .new_done(&pfd, name, new, created.is_ok(), false);
                Ok((pfd, placed(created, done)))
            }
            // The merged view of a staged mount shows the name.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                Ok((self.inodes.up_dir(parent)?, Err(Error(libc::EEXIST))))
            }
            Err(e) => Err(e.into()),
        }
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
        // A staged mount changes the upper's copy of a regular file.
        if self.inodes.union().is_some() {
            let shown = self.inodes.peek(parent, name)?;
            if sys::fstat(shown.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(Error(libc::EEXIST));
            }
            self.inodes.up_child(parent, name)?;
        }
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

    /// The handle to keep for a node about to lose its name: an operation on it after the
    /// unlink (fchmod on an open file, stat of a removed cwd) can no longer resolve it by
    /// name. Opened for directories and files still open; for the rest what is cached.
    ///
    /// On an unstaged mount a regular file that has no cached handle gets one in the
    /// handle cache (not pinned: the cache's bound holds): while it is open the host's
    /// unlink drops only the name, and the host frees the file (its blocks, a journal
    /// transaction, on a `discard` mount one synchronous discard per extent: 5–40 µs) when
    /// the kernel's FORGET drops the node's handles, after the caller has its answer — as
    /// libfuse's passthrough does with the handle it holds for every inode. Without it
    /// that work ran inside the UNLINK, in front of the caller (`rm -rf` of files made on
    /// the host: 47 µs per unlink against 9 µs). Not on a staged mount: there a SOURCE
    /// file only gets a whiteout (nothing is freed), and the upper's files were made
    /// through the mount, their handles cached.
    fn pin_handle(&self, ino: u64) -> Option<Arc<OwnedFd>> {
        let kind = self.inodes.kind(ino).ok();
        let needed = kind == Some(libc::S_IFDIR) || self.handles.any_on(ino, |_| true);
        if needed {
            return self.inodes.fd(ino).ok();
        }
        let cached = self.inodes.cached_fd(ino);
        if cached.is_none() && self.bases.is_none() && kind == Some(libc::S_IFREG) {
            // Resolved into the cache only; a failure (the host removed it) changes
            // nothing: the unlink answers as before.
            let _ = self.inodes.fd(ino);
        }
        cached
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
        parent: u64,
        name: &Name,
        e: io::Error,
    ) -> Error {
        let err = Error::from(e);
        if err.0 != libc::ENOTEMPTY && err.0 != libc::EEXIST {
            return err;
        }
        match self.nothing_visible(ctx, path, parent, name) {
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
        parent: u64,
        name: &Name,
    ) -> Option<Option<By>> {
        let entries = self.inodes.list_child(parent, name).ok()?;
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

    /// A root's point (`host/roots.rs`), or a directory above one, is not removed nor
    /// renamed: EBUSY, as a mount point (moved, the root's files would be SOURCE's).
    fn not_a_root_point(&self, path: &[u8]) -> Res<()> {
        match self.inodes.roots().holds_point(path) {
            true => Err(Error(libc::EBUSY)),
            false => Ok(()),
        }
    }

    /// Whether a directory rename would move a kept directory, one inside it or one above
    /// it (its objects would leave the kept shape): audited as the fence's refusal.
    fn moves_kept(&self, ctx: &Ctx, old: &[u8], new: &[u8]) -> bool {
        let roots = self.inodes.roots();
        let Some(path) = [old, new].into_iter().find(|p| roots.holds_kept(p)) else {
            return false;
        };
        let v = ctx.snap.policy.verdict_for(path, ctx.caller, true);
        self.audit(ctx, "rename", path, &v, By::Mode, Some(libc::EROFS));
        true
    }

    /// Nothing moves or links across roots: EXDEV, as across file systems.
    fn same_root(&self, a: &[u8], b: &[u8]) -> Res<()> {
        let roots = self.inodes.roots();
        if roots.is_empty() || roots.same_root(a, b) {
            Ok(())
        } else {
            Err(Error(libc::EXDEV))
        }
    }

    /// unlink / rmdir: `write` on the path; a directory holding only hidden entries is
    /// refused with EACCES (see [`Shared::not_empty`]).
    pub fn do_remove(&self, ctx: &Ctx, parent: u64, name: &Name, dir: bool) -> Res<()> {
        let path = self.child_path(parent, name)?;
        let op = if dir { "rmdir" } else { "unlink" };
        self.not_a_root_point(&path)?;
        let v = self.allow(ctx, op, &path, dir, Need::Write, Special::default())?;
        let known = self.inodes.child(parent, name.bytes());
        let pin = known.and_then(|i| self.pin_handle(i));
        // A staged unlink in a directory with nothing below the upper: no note, one
        // look; of SOURCE's file: one look, under the merged view's lock.
        let done = !dir
            && (self.inodes.remove_upper_only(parent, name)?.is_some()
                || self.remove_source_file(&path, parent, name, known)?);
        if !done {
            self.remove_shown(ctx, (op, &path, &v), parent, name, dir)?;
        }
        self.inodes.remove_alias(parent, name.bytes(), &path, pin);
        if !dir {
            self.provisional_gone(ctx, &path, true);
        }
        Ok(())
    }

    /// unlink / rmdir of what the merged view (or the host's directory) shows at `name`,
    /// allowed as `v` for `op` on `path`. A staged unlink notes the entry shown, and
    /// removes that finding (one lookup of the name, not two).
    fn remove_shown(
        &self,
        ctx: &Ctx,
        (op, path, v): (&'static str, &[u8], &Verdict),
        parent: u64,
        name: &Name,
        dir: bool,
    ) -> Res<()> {
        let seen = (!dir && self.bases.is_some())
            .then(|| self.inodes.peek_entry(parent, name).ok())
            .flatten();
        let note = if dir {
            None
        } else {
            self.note_peeked(path, parent, true, seen.as_ref())
        };
        // A deletion's record, when known now, is set on its whiteout as it is made.
        let rec = note.as_ref().and_then(|n| n.whiteout_record());
        let label = rec.as_ref().map(|(n, v)| (n.as_slice(), v.as_slice()));
        match self.inodes.remove_seen(parent, name, dir, seen, label) {
            Ok(left) => {
                self.noted_removal(note, left);
                Ok(())
            }
            Err(e) if dir => Err(self.not_empty(ctx, op, path, v, parent, name, e)),
            Err(e) => Err(e.into()),
        }
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
        self.not_a_root_point(&old)?;
        self.not_a_root_point(&new)?;
        self.same_root(&old, &new)?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let src_st = self.inodes.probe(parent, name)?;
        let dst_st = self.inodes.probe(newparent, newname).ok();
        let dir_of = |st: &libc::stat| st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        let src_dir = dir_of(&src_st);
        let dst_dir = if exchange {
            dst_st.as_ref().is_some_and(dir_of)
        } else {
            src_dir
        };
        let new_need = if exchange { Need::Write } else { Need::Create };
        let replaces = !exchange && !src_dir && dst_st.as_ref().is_some_and(|st| !dir_of(st));
        let op = self.rename_op(ctx, &old, &new, replaces);
        self.allow_all(
            ctx,
            op,
            &[(&old, src_dir, Need::Write), (&new, dst_dir, new_need)],
        )?;
        // Allowed as a create only (`create`, not `write`): an existing name is never
        // replaced (EACCES), nor one that appears meanwhile (RENAME_NOREPLACE: EEXIST).
        // (An approved re-run, whose policy grants neither, is the approver's to decide.)
        let create_only = new_need == Need::Create
            && !self.learning()
            && self.grants(ctx, &new, dst_dir, Need::Create)
            && !self.grants(ctx, &new, dst_dir, Need::Write);
        let flags = if create_only {
            if dst_st.is_some() && flags & libc::RENAME_NOREPLACE == 0 {
                let v = ctx.snap.policy.verdict_for(&new, ctx.caller, dst_dir);
                self.audit(ctx, "rename", &new, &v, v.grant_by, Some(libc::EACCES));
                return Err(Error(libc::EACCES));
            }
            flags | libc::RENAME_NOREPLACE
        } else {
            flags
        };
        let moves_dir = src_dir || (exchange && dst_dir);
        if moves_dir && self.moves_kept(ctx, &old, &new) {
            return Err(Error(libc::EROFS));
        }
        // A kept name (`host/roots.rs`) is made once: never replaced (EEXIST).
        let flags = if self.inodes.roots().fence_at(&new) == Some(Fence::Kept) {
            flags | libc::RENAME_NOREPLACE
        } else {
            flags
        };
        if moves_dir && !ctx.snap.policy.dir_rename_allowed(&old, &new) {
            let v = ctx.snap.policy.verdict(&old, ctx.caller);
            // Moving a pinned file (an ignore file, the workspace layer) away: EROFS.
            let errno = if ctx.snap.policy.dir_rename_pinned(&old, &new) {
                libc::EROFS
            } else {
                libc::EACCES
            };
            self.audit(ctx, "rename", &old, &v, v.grant_by, Some(errno));
            return Err(Error(errno));
        }
        let src = self.inodes.child(parent, name.bytes());
        let dst = self.inodes.child(newparent, newname.bytes());
        // An exchange keeps both names: nothing is removed, nothing to pin.
        let dst_pin = dst.filter(|_| !exchange).and_then(|i| self.pin_handle(i));
        let notes = [
            self.note_name(&old, parent, name, true),
            self.note_name(&new, newparent, newname, true),
        ];
        let renamed = self
            .inodes
            .rename_names((parent, name), (newparent, newname), flags);
        if let Err(e) = renamed {
            // Replacing a directory that holds only hidden entries: EACCES, not ENOTEMPTY.
            let replaces_dir = flags & (libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) == 0
                && dst_st.as_ref().is_some_and(dir_of);
            return Err(if replaces_dir {
                let v = ctx.snap.policy.verdict_for(&new, ctx.caller, true);
                self.not_empty(ctx, "rename", &new, &v, newparent, newname, e)
            } else {
                e.into()
            });
        }
        // Both records read before either is written (an exchange swaps the entries).
        let [o, n] = notes.map(|n| self.settled(n));
        // A rename to a free name (or over an entry with no record): the moved entry keeps
        // the record of what it was made from (`stage status` lists `mv a b` as
        // `R a -> b` by it).
        let n = match (&n, &o) {
            (None, Some(o)) if !exchange => Some(o.moved_to(&new, newparent)),
            _ => n,
        };
        [o, n].into_iter().for_each(|n| self.noted(n));
        if exchange {
            self.inodes
                .exchange_alias((parent, name.bytes()), (newparent, newname.bytes()));
        } else {
            if dst.is_some() {
                self.inodes
                    .remove_alias(newparent, newname.bytes(), &new, dst_pin);
            }
            match src {
                Some(ino) => {
                    self.inodes
                        .rename_alias(ino, parent, name.bytes(), newparent, newname.bytes())
                }
                None => self.inodes.remove_alias(parent, name.bytes(), &old, None),
            }
        }
        self.provisional_gone(ctx, &old, false);
        Ok(())
    }

    /// link: `write` on the existing file (every name it is known under) and on the new name.
    pub fn do_link(&self, ctx: &Ctx, ino: u64, newparent: u64, newname: &Name) -> Res<FileAttr> {
        let new = self.child_path(newparent, newname)?;
        let sources = self.inodes.paths(ino)?;
        if sources.is_empty() {
            return Err(Error(libc::ENOENT));
        }
        for p in &sources {
            self.same_root(p, &new)?;
        }
        let is_dir = self.inodes.kind(ino)? == libc::S_IFDIR;
        let mut checks: Vec<(&[u8], bool, Need)> = sources
            .iter()
            .map(|p| (p.as_slice(), is_dir, Need::Write))
            .collect();
        checks.push((&new, false, Need::Create));
        self.allow_all(ctx, "link", &checks)?;
        let mut note = self.note_node(ino);
        let fd = self.for_change(ino, &mut note)?;
        let (npfd, new) = self.inodes.new_name(newparent, newname)?;
        let made = sys::linkat_fd(
            self.inodes.proc_fd.as_fd(),
            fd.as_fd(),
            npfd.as_fd(),
            Inodes::new_at(&new, newname),
        );
        let done = self
            .inodes
            .new_done(&npfd, newname, new, made.is_ok(), false);
        placed(made.map_err(Into::into), done)?;
        self.noted(note);
        let (ino, st) = self.inodes.lookup(newparent, newname, true)?;
        Ok(self.attr(ctx, ino, &st))
    }
}

/// A new name's outcome: the create's, or the error of putting it in place
/// ([`Inodes::new_done`]) when that failed after the create succeeded.
fn placed<T>(made: Res<T>, done: io::Result<()>) -> Res<T> {
    let v = made?;
    done?;
    Ok(v)
}
