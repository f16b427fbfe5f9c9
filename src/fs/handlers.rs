//! The requests, transport-neutral: each handler takes a request's decoded arguments, runs
//! the `do_*` operation (through `Core::serve` where an approver could lift a refusal)
//! and answers through one of the [`super::reply`] traits. The fuser `Filesystem` impl
//! (classic `/dev/fuse`) and the io_uring transport both call these, so the two cannot
//! drift apart.
//!
//! Invariant: every handler answers its reply exactly once (possibly later, from the
//! resume thread, when the request is held for an approver).

use std::sync::Arc;

use fuser::{Errno, FileType, FopenFlags};

use super::attr;
use super::core::{Core, Rq};
use super::notes::{self, owns, owns_fh};
use super::ops::{Error, Lookup, WriteKind};
use super::reply::{
    AttrReply, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply, LseekReply,
    OpenReply, StatfsReply, WriteReply, XattrReply,
};
use super::reply::{errno, negative_attr};
use crate::host::handle::ListEntry;
use crate::host::sys::{Name, Xattr};

/// Hands a request on a synthetic `.fencefs/` node or handle (`fs/notes/`) its answer
/// and returns: the one line each handler gives the notes.
macro_rules! notes {
    ($ours:expr, $answer:expr) => {
        if $ours {
            return $answer;
        }
    };
}

/// `--no-xattr`: an xattr request is answered ENOSYS before its node is looked at, so
/// the answer is the same for every node (hidden, notes, refused or not) and nothing
/// reaches the host; the kernel remembers ENOSYS and stops asking.
macro_rules! xattr_off {
    ($core:expr, $reply:expr) => {
        if !$core.shared.settings.xattr {
            return $reply.error(Errno::ENOSYS);
        }
    };
}

/// A name from the kernel, validated.
fn name(n: &[u8]) -> Result<Name, Errno> {
    Name::new(n).map_err(|e| Errno::from_i32(e.raw_os_error().unwrap_or(libc::EINVAL)))
}

/// Answers an entry-or-error result.
fn entry<R: EntryReply>(
    c: &Core,
    ctx: &super::ops::Ctx,
    reply: R,
    r: Result<fuser::FileAttr, Error>,
) {
    match r {
        Ok(a) => {
            let ttl = c.shared.ttl(ctx);
            reply.entry(&ttl.attr, &ttl.entry, &a)
        }
        Err(e) => reply.error(errno(e)),
    }
}

/// Answers an empty-or-error result.
fn empty<R: EmptyReply>(reply: R, r: Result<(), Error>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

pub use super::ops::SetAttr;

impl Core {
    /// LOOKUP.
    pub fn lookup(self: &Arc<Self>, rq: Rq, parent: u64, n: &[u8], reply: impl EntryReply) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.plus.looked_up(parent);
        let ctx = self.ctx(rq);
        // Absent and hidden names get the same negative entry, cached for the entry TTL
        // (0 when rules depend on the caller), so repeated lookups cost the same; a hidden
        // one only if a reload can take it back. The TTL is read after the lookup
        // registered the node (kcache's invariant).
        let found = self.shared.do_lookup(&ctx, parent, &n);
        let ttl = self.shared.ttl(&ctx);
        let cache = match found {
            Ok(Lookup::Found(a)) if owns(a.ino.0) => {
                return reply.entry(&notes::TTL, &notes::TTL, &a);
            }
            Ok(Lookup::Found(a)) => return reply.entry(&ttl.attr, &ttl.entry, &a),
            // A staged mount's view swaps (discard, rewind, apply) can show an absent
            // name: its negative entry is recorded like a hidden one, and taken back.
            Ok(Lookup::Absent) => {
                !ttl.entry.is_zero()
                    && (self.shared.gate.is_none() || self.shared.cache_hidden(&ctx, parent, &n))
            }
            Ok(Lookup::Hidden) => {
                !ttl.entry.is_zero() && self.shared.cache_hidden(&ctx, parent, &n)
            }
            Err(e) => return reply.error(errno(e)),
        };
        if cache {
            reply.entry(&ttl.attr, &ttl.entry, &negative_attr())
        } else {
            reply.error(Errno::ENOENT)
        }
    }

    /// GETATTR.
    pub fn getattr(self: &Arc<Self>, rq: Rq, ino: u64, fh: Option<u64>, reply: impl AttrReply) {
        notes!(owns(ino), self.notes_getattr(rq, ino, reply));
        let ctx = self.ctx(rq);
        let r = self.shared.do_getattr(&ctx, ino, fh);
        match r {
            Ok(a) => reply.attr(&self.shared.ttl(&ctx).attr, &a),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// The directory a setattr or xattr change of `ino` keeps locked in the kernel while it
    /// is in flight: `ino` itself when it is a directory (held like a directory change).
    fn locked_dir<'a>(&self, ino: &'a [u64; 1]) -> &'a [u64] {
        match self.shared.inodes.kind(ino[0]) {
            Ok(libc::S_IFDIR) => ino,
            _ => &[],
        }
    }

    /// SETATTR.
    pub fn setattr(self: &Arc<Self>, rq: Rq, ino: u64, s: SetAttr, reply: impl AttrReply) {
        notes!(owns(ino), reply.error(Errno::EROFS));
        self.serve_in(
            self.locked_dir(&[ino]),
            rq,
            reply,
            move |c, ctx| c.shared.do_setattr(ctx, ino, &s),
            |c, ctx, reply, r| match r {
                Ok(a) => reply.attr(&c.shared.ttl(ctx).attr, &a),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    /// READLINK.
    pub fn readlink(self: &Arc<Self>, rq: Rq, ino: u64, reply: impl DataReply) {
        notes!(owns(ino), reply.error(Errno::EINVAL));
        let ctx = self.ctx(rq);
        match self.shared.do_readlink(&ctx, ino) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// MKNOD.
    pub fn mknod(
        self: &Arc<Self>,
        rq: Rq,
        parent: u64,
        n: &[u8],
        mode: u32,
        rdev: u32,
        reply: impl EntryReply,
    ) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve_in(
            &[parent],
            rq,
            reply,
            move |c, ctx| c.shared.do_mknod(ctx, parent, &n, mode, rdev),
            entry,
        );
    }

    /// MKDIR.
    pub fn mkdir(
        self: &Arc<Self>,
        rq: Rq,
        parent: u64,
        n: &[u8],
        mode: u32,
        reply: impl EntryReply,
    ) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve_in(
            &[parent],
            rq,
            reply,
            move |c, ctx| c.shared.do_mkdir(ctx, parent, &n, mode),
            entry,
        );
    }

    /// UNLINK (`dir` false) and RMDIR (`dir` true).
    pub fn remove(
        self: &Arc<Self>,
        rq: Rq,
        parent: u64,
        n: &[u8],
        dir: bool,
        reply: impl EmptyReply,
    ) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve_in(
            &[parent],
            rq,
            reply,
            move |c, ctx| c.shared.do_remove(ctx, parent, &n, dir),
            |_, _, reply, r| empty(reply, r),
        );
    }

    /// SYMLINK.
    pub fn symlink(
        self: &Arc<Self>,
        rq: Rq,
        parent: u64,
        n: &[u8],
        target: &[u8],
        reply: impl EntryReply,
    ) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let target = target.to_vec();
        self.serve_in(
            &[parent],
            rq,
            reply,
            move |c, ctx| c.shared.do_symlink(ctx, parent, &n, &target),
            entry,
        );
    }

    /// RENAME / RENAME2.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        self: &Arc<Self>,
        rq: Rq,
        parent: u64,
        n: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
        reply: impl EmptyReply,
    ) {
        let (n, nn) = match (name(n), name(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        self.serve_in(
            &[parent, newparent],
            rq,
            reply,
            move |c, ctx| c.shared.do_rename(ctx, parent, &n, newparent, &nn, flags),
            |_, _, reply, r| empty(reply, r),
        );
    }

    /// LINK.
    pub fn link(
        self: &Arc<Self>,
        rq: Rq,
        ino: u64,
        newparent: u64,
        newname: &[u8],
        reply: impl EntryReply,
    ) {
        notes!(owns(ino), reply.error(Errno::EROFS));
        let nn = match name(newname) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve_in(
            &[newparent],
            rq,
            reply,
            move |c, ctx| c.shared.do_link(ctx, ino, newparent, &nn),
            entry,
        );
    }

    /// OPEN.
    pub fn open(self: &Arc<Self>, rq: Rq, ino: u64, flags: i32, reply: impl OpenReply) {
        notes!(owns(ino), self.notes_open(rq, ino, flags, reply));
        self.serve(
            rq,
            reply,
            move |c, ctx| c.shared.do_open(ctx, ino, flags),
            |c, _, reply, r| match r {
                Ok(o) => {
                    let append_only = o.append_only;
                    match c.register(o) {
                        (fh, Some(id), _) => reply.opened(fh, FopenFlags::empty(), Some(id)),
                        (fh, None, direct) => {
                            reply.opened(fh, c.open_flags(append_only || direct), None)
                        }
                    }
                }
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    /// READ.
    pub fn read(self: &Arc<Self>, rq: Rq, fh: u64, offset: u64, size: u32, reply: impl DataReply) {
        notes!(owns_fh(fh), self.notes_read(fh, offset, size, reply));
        let ctx = self.ctx(rq);
        match self.shared.do_read(&ctx, fh, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// WRITE (`kind`: whether the kernel asks to clear set-ID bits, FUSE_WRITE_KILL_SUIDGID,
    /// and whether the write appends).
    pub fn write(
        self: &Arc<Self>,
        rq: Rq,
        fh: u64,
        offset: u64,
        data: &[u8],
        kind: WriteKind,
        reply: impl WriteReply,
    ) {
        let ctx = self.ctx(rq);
        match self.shared.do_write(&ctx, fh, offset, data, kind) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// FLUSH: writes go straight to the host file, nothing is buffered, and POSIX locks
    /// stay in the kernel, so there is nothing to flush on close. ENOSYS tells the kernel
    /// so once, and it stops sending FLUSH at all (one round trip less per close(2)).
    pub fn flush(self: &Arc<Self>, reply: impl EmptyReply) {
        reply.error(Errno::ENOSYS)
    }

    /// RELEASE.
    pub fn release(self: &Arc<Self>, ino: u64, fh: u64, reply: impl EmptyReply) {
        notes!(owns_fh(fh), self.notes_release(fh, reply));
        self.shared.do_release(fh);
        self.release_backing(ino, fh);
        reply.ok();
    }

    /// FSYNC and FSYNCDIR.
    pub fn fsync(self: &Arc<Self>, fh: u64, datasync: bool, reply: impl EmptyReply) {
        notes!(owns_fh(fh), reply.ok());
        empty(reply, self.shared.do_fsync(fh, datasync))
    }

    /// OPENDIR.
    pub fn opendir(self: &Arc<Self>, rq: Rq, ino: u64, reply: impl OpenReply) {
        notes!(owns(ino), self.notes_opendir(rq, ino, reply));
        let ctx = self.ctx(rq);
        let r = self.shared.do_opendir(&ctx, ino);
        // The kernel may keep a listing across opens (it drops it when the directory
        // changes through the mount, and the daemon drops it on host changes and
        // reloads) — but never when rules depend on the caller: listings are filtered
        // per caller — nor from a reload's window, nor when host changes below a merged
        // directory would go unnoticed (`listings_cacheable`).
        let cache = if self.shared.ttl(&ctx).entry.is_zero() || !self.shared.listings_cacheable() {
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
        };
        match r {
            Ok(fh) => reply.opened(fh, cache, None),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// READDIR.
    pub fn readdir(
        self: &Arc<Self>,
        rq: Rq,
        ino: u64,
        fh: u64,
        offset: u64,
        mut reply: impl DirReply,
    ) {
        notes!(owns(ino), self.notes_readdir(fh, offset, reply));
        let ctx = self.ctx(rq);
        let (_h, entries) = match self.shared.dir_entries(&ctx, fh, offset) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        // Offsets: 1 = ".", 2 = "..", 3.. = entries.
        let mut off = offset;
        if off == 0 {
            if reply.add(ino, 1, FileType::Directory, b".") {
                return reply.ok();
            }
            off = 1;
        }
        if off == 1 {
            let p = self.shared.parent_ino(ino);
            if reply.add(p, 2, FileType::Directory, b"..") {
                return reply.ok();
            }
            off = 2;
        }
        for (i, e) in entries.iter().enumerate().skip((off - 2) as usize) {
            if reply.add(e.ino, i as u64 + 3, attr::kind(e.kind), &e.name) {
                break;
            }
        }
        reply.ok();
    }

    /// READDIRPLUS.
    pub fn readdirplus(
        self: &Arc<Self>,
        rq: Rq,
        ino: u64,
        fh: u64,
        offset: u64,
        mut reply: impl DirPlusReply,
    ) {
        notes!(owns(ino), self.notes_readdirplus(rq, fh, offset, reply));
        let ctx = self.ctx(rq);
        let (_h, entries) = match self.shared.dir_entries(&ctx, fh, offset) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        // Same offsets as readdir: 1 = ".", 2 = "..", 3.. = entries. The kernel does not
        // count lookups for the dot entries and ignores their attributes: where the reply
        // can, they go without. A batch after the first one comes as READDIRPLUS only
        // when the reader looked names up meanwhile: it gets attributes.
        let plain = reply.can_plain();
        if plain && offset == 0 && !self.plus.attrs_wanted(ino) {
            return self.readdir_plain(ino, &entries, reply);
        }
        let mut off = offset;
        for (o, dot, dino) in [
            (0u64, &b"."[..], ino),
            (1, b"..", self.shared.parent_ino(ino)),
        ] {
            if off == o {
                if plain {
                    if reply.add_plain(dino, o + 1, FileType::Directory, dot) {
                        return reply.ok();
                    }
                    off = o + 1;
                    continue;
                }
                let Ok(a) = self.shared.do_getattr(&ctx, dino, None) else {
                    return reply.error(Errno::ESTALE);
                };
                if reply.add(o + 1, dot, &self.shared.ttl(&ctx).entry, &a) {
                    return reply.ok();
                }
                off = o + 1;
            }
        }
        for (i, e) in entries.iter().enumerate().skip((off - 2) as usize) {
            // Each entry returned counts as a lookup; hidden or vanished ones are skipped.
            let Ok(a) = self.shared.plus_lookup(&ctx, ino, &e.name) else {
                continue;
            };
            // After the lookup registered the node (kcache's invariant).
            let ttl = match owns(a.ino.0) {
                true => notes::TTL,
                false => self.shared.ttl(&ctx).entry,
            };
            if reply.add(i as u64 + 3, &e.name, &ttl, &a) {
                // Not sent: give the lookup back.
                self.shared.do_forget(a.ino.0, 1);
                break;
            }
        }
        reply.ok();
    }

    /// A directory's first READDIRPLUS batch without attributes (`fs/plus.rs`).
    fn readdir_plain(&self, ino: u64, entries: &[ListEntry], mut reply: impl DirPlusReply) {
        let parent = self.shared.parent_ino(ino);
        if reply.add_plain(ino, 1, FileType::Directory, b".")
            || reply.add_plain(parent, 2, FileType::Directory, b"..")
        {
            return reply.ok();
        }
        // Counted: the names a reader could look up (the kernel holds nodes of the rest).
        let mut sent = 0;
        for (i, e) in entries.iter().enumerate() {
            if reply.add_plain(e.ino, i as u64 + 3, attr::kind(e.kind), &e.name) {
                break;
            }
            sent += u32::from(!e.known);
        }
        self.plus.sent_plain(ino, sent);
        reply.ok();
    }

    /// RELEASEDIR.
    pub fn releasedir(self: &Arc<Self>, fh: u64, reply: impl EmptyReply) {
        notes!(owns_fh(fh), self.notes_release(fh, reply));
        self.shared.do_release(fh);
        reply.ok();
    }

    /// STATFS.
    pub fn statfs(self: &Arc<Self>, rq: Rq, ino: u64, reply: impl StatfsReply) {
        // The notes live on the mount: its statfs is the root's.
        let ino = if owns(ino) { notes::ROOT } else { ino };
        let ctx = self.ctx(rq);
        match self.shared.do_statfs(&ctx, ino) {
            Ok(s) => reply.statfs(&s),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// SETXATTR.
    pub fn setxattr(
        self: &Arc<Self>,
        rq: Rq,
        ino: u64,
        n: &[u8],
        value: &[u8],
        flags: i32,
        reply: impl EmptyReply,
    ) {
        xattr_off!(self, reply);
        notes!(owns(ino), reply.error(Errno::EROFS));
        let n = n.to_vec();
        let value = value.to_vec();
        self.serve_in(
            self.locked_dir(&[ino]),
            rq,
            reply,
            move |c, ctx| c.shared.do_setxattr(ctx, ino, &n, &value, flags),
            |_, _, reply, r| empty(reply, r),
        );
    }

    /// GETXATTR.
    pub fn getxattr(
        self: &Arc<Self>,
        rq: Rq,
        ino: u64,
        n: &[u8],
        size: u32,
        reply: impl XattrReply,
    ) {
        xattr_off!(self, reply);
        notes!(owns(ino), self.notes_xattr(false, size, reply));
        let ctx = self.ctx(rq);
        xattr(reply, self.shared.do_getxattr(&ctx, ino, n, size))
    }

    /// LISTXATTR.
    pub fn listxattr(self: &Arc<Self>, rq: Rq, ino: u64, size: u32, reply: impl XattrReply) {
        xattr_off!(self, reply);
        notes!(owns(ino), self.notes_xattr(true, size, reply));
        let ctx = self.ctx(rq);
        xattr(reply, self.shared.do_listxattr(&ctx, ino, size))
    }

    /// REMOVEXATTR.
    pub fn removexattr(self: &Arc<Self>, rq: Rq, ino: u64, n: &[u8], reply: impl EmptyReply) {
        xattr_off!(self, reply);
        notes!(owns(ino), reply.error(Errno::EROFS));
        let n = n.to_vec();
        self.serve_in(
            self.locked_dir(&[ino]),
            rq,
            reply,
            move |c, ctx| c.shared.do_removexattr(ctx, ino, &n),
            |_, _, reply, r| empty(reply, r),
        );
    }

    /// ACCESS.
    pub fn access(self: &Arc<Self>, rq: Rq, ino: u64, mask: i32, reply: impl EmptyReply) {
        notes!(owns(ino), self.notes_access(rq, ino, mask, reply));
        let ctx = self.ctx(rq);
        empty(reply, self.shared.do_access(&ctx, ino, mask))
    }

    /// CREATE.
    pub fn create(
        self: &Arc<Self>,
        rq: Rq,
        parent: u64,
        n: &[u8],
        mode: u32,
        flags: i32,
        reply: impl CreateReply,
    ) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve_in(
            &[parent],
            rq,
            reply,
            move |c, ctx| c.shared.do_create(ctx, parent, &n, mode, flags),
            |c, ctx, reply, r| {
                let ttl = c.shared.ttl(ctx);
                match r {
                    Ok((a, o)) => match c.register(o) {
                        (fh, Some(id), _) => {
                            reply.created(&ttl.entry, &a, fh, FopenFlags::empty(), Some(id))
                        }
                        (fh, None, direct) => {
                            reply.created(&ttl.entry, &a, fh, c.open_flags(direct), None)
                        }
                    },
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }

    /// FALLOCATE.
    pub fn fallocate(
        self: &Arc<Self>,
        rq: Rq,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
        reply: impl EmptyReply,
    ) {
        self.serve(
            rq,
            reply,
            move |c, ctx| c.shared.do_fallocate(ctx, fh, offset, length, mode),
            |_, _, reply, r| empty(reply, r),
        );
    }

    /// LSEEK.
    pub fn lseek(self: &Arc<Self>, fh: u64, offset: i64, whence: i32, reply: impl LseekReply) {
        notes!(owns_fh(fh), self.notes_lseek(fh, offset, whence, reply));
        match self.shared.do_lseek(fh, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// COPY_FILE_RANGE.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        self: &Arc<Self>,
        rq: Rq,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
        reply: impl WriteReply,
    ) {
        // An open note has no host file: the kernel copies it by reading.
        notes!(owns_fh(fh_in) || owns_fh(fh_out), reply.error(Errno::EXDEV));
        self.serve(
            rq,
            reply,
            move |c, ctx| {
                c.shared
                    .do_copy_file_range(ctx, fh_in, offset_in, fh_out, offset_out, len)
            },
            |_, _, reply, r| match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(e)),
            },
        );
    }
}

fn xattr(reply: impl XattrReply, r: Result<Xattr, Error>) {
    match r {
        Ok(Xattr::Size(n)) => reply.size(n as u32),
        Ok(Xattr::Data(v)) => reply.data(&v),
        Err(e) => reply.error(errno(e)),
    }
}
