//! The `fuser::Filesystem` implementation: translation only. Every operation is written
//! out (none falls back to fuser's defaults, whose `open`/`opendir` succeed and whose
//! `access` ENOSYS means "allow"); each calls a `do_*` in [`ops`] and replies once.

pub mod attr;
mod core;
mod decide;
pub mod kcache;
pub mod ops;

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents,
    PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek,
    ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::host::sys::{Name, Xattr};
use core::Core;
use ops::{Error, Lookup, Shared};
use std::sync::atomic::Ordering;

/// The mounted file system: the kernel's entry points, over a [`Core`] that held requests
/// also reach when they resume on another thread.
pub struct FenceFs {
    core: Arc<Core>,
}

impl std::ops::Deref for FenceFs {
    type Target = Arc<Core>;
    fn deref(&self) -> &Arc<Core> {
        &self.core
    }
}

fn errno(e: Error) -> Errno {
    Errno::from_i32(e.0)
}

/// Attributes of a negative entry (node id 0).
fn negative_attr() -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: std::time::UNIX_EPOCH,
        mtime: std::time::UNIX_EPOCH,
        ctime: std::time::UNIX_EPOCH,
        crtime: std::time::UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn name(n: &OsStr) -> Result<Name, Errno> {
    Name::from_os(n)
        .map_err(|e: io::Error| Errno::from_i32(e.raw_os_error().unwrap_or(libc::EINVAL)))
}

const GEN: Generation = Generation(0);

impl FenceFs {
    /// A file system serving `shared`.
    pub fn new(shared: Arc<Shared>) -> FenceFs {
        FenceFs {
            core: Arc::new(Core::new(shared)),
        }
    }
}

impl Filesystem for FenceFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // O_TRUNC reaches `open` (instead of a separate setattr after an open for read),
        // so `O_RDONLY|O_TRUNC` is classified as the write it is.
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        // The daemon clears set-ID bits on write, truncate and O_TRUNC by a caller without
        // CAP_FSETID (ops.rs `kill_setid`; passthrough writes run with credentials without
        // it, core.rs): the kernel then marks inodes "no security bits" and stops sending a
        // GETXATTR(security.capability) before every write and truncate.
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        // Symlink targets cached by the kernel (a symlink's target never changes in place;
        // reloads drop them with the rest of the pages): no READLINK per path walk.
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        // READDIRPLUS when the reader stats what it lists (`ls -l`, `find -ls`): the kernel
        // then needs no LOOKUP round trip per entry; plain listings stay plain READDIR.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // Kernel passthrough: reads, writes and mmap of a handle go straight to the host
        // file. Not with --revoke, where every read and write must reach the daemon.
        // --revoke serves files with direct I/O; without this the kernel refuses shared
        // mmaps of them (ENODEV), which breaks SQLite's WAL index among others. With it,
        // shared maps use the page cache: faults and writeback are READ/WRITE requests the
        // daemon re-checks, and a reload drops the pages, so a revoked map faults afresh.
        if self.shared.settings.revoke {
            match config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
                Ok(_) => log::info!("--revoke: shared mmap allowed (FUSE_DIRECT_IO_ALLOW_MMAP)"),
                Err(_) => log::warn!(
                    "--revoke: the kernel cannot mmap direct-I/O files shared (needs 6.6+): MAP_SHARED gives ENODEV"
                ),
            }
        }
        if !self.shared.settings.revoke
            && self.shared.settings.passthrough
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.core.passthrough.store(true, Ordering::Relaxed);
        }
        log::info!(
            "file I/O: {}",
            if self.core.passthrough.load(Ordering::Relaxed) {
                "kernel passthrough (reads and writes bypass the daemon)"
            } else if self.shared.settings.revoke {
                "through the daemon, direct I/O (--revoke: every read and write re-checked)"
            } else {
                "through the daemon and the page cache (kernel passthrough unavailable)"
            }
        );
        Ok(())
    }

    fn destroy(&mut self) {}

    fn lookup(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let ctx = self.ctx(req);
        let ttl = self.shared.ttl(&ctx);
        // Absent and hidden names get the same negative entry, cached for the entry TTL
        // (0 when rules depend on the caller), so repeated lookups cost the same; a hidden
        // one only if a reload can take it back.
        let cache = match self.shared.do_lookup(&ctx, parent.0, &n) {
            Ok(Lookup::Found(a)) => {
                return reply.entry_with_ttls(&ttl.attr, &ttl.entry, &a, GEN);
            }
            Ok(Lookup::Absent) => !ttl.entry.is_zero(),
            Ok(Lookup::Hidden) => {
                !ttl.entry.is_zero() && self.shared.cache_hidden(&ctx, parent.0, &n)
            }
            Err(e) => return reply.error(errno(e)),
        };
        if cache {
            reply.entry_with_ttls(&ttl.attr, &ttl.entry, &negative_attr(), GEN)
        } else {
            reply.error(Errno::ENOENT)
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.do_forget(ino.0, nlookup);
    }

    // batch_forget: fuser's default calls `forget` for every entry (its `ForgetOne` type is
    // not public, so the method cannot be written out here).

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let ctx = self.ctx(req);
        let ttl = self.shared.ttl(&ctx);
        match self.shared.do_getattr(&ctx, ino.0, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&ttl.attr, &a),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let fh = fh.map(|f| f.0);
        self.serve(
            req,
            reply,
            move |c, ctx| {
                c.shared
                    .do_setattr(ctx, ino.0, mode, uid, gid, size, atime, mtime, fh)
            },
            |c, ctx, reply, r| match r {
                Ok(a) => reply.attr(&c.shared.ttl(ctx).attr, &a),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let ctx = self.ctx(req);
        match self.shared.do_readlink(&ctx, ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_mknod(ctx, parent.0, &n, mode, rdev),
            |c, ctx, reply, r| match r {
                Ok(a) => {
                    let ttl = c.shared.ttl(ctx);
                    reply.entry_with_ttls(&ttl.attr, &ttl.entry, &a, GEN)
                }
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_mkdir(ctx, parent.0, &n, mode),
            |c, ctx, reply, r| match r {
                Ok(a) => {
                    let ttl = c.shared.ttl(ctx);
                    reply.entry_with_ttls(&ttl.attr, &ttl.entry, &a, GEN)
                }
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_remove(ctx, parent.0, &n, false),
            |_, _, reply, r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_remove(ctx, parent.0, &n, true),
            |_, _, reply, r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let n = match name(link_name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let target = target.as_os_str().as_bytes().to_vec();
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_symlink(ctx, parent.0, &n, &target),
            |c, ctx, reply, r| match r {
                Ok(a) => {
                    let ttl = c.shared.ttl(ctx);
                    reply.entry_with_ttls(&ttl.attr, &ttl.entry, &a, GEN)
                }
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (n, nn) = match (name(n), name(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let flags = flags.bits();
        self.serve(
            req,
            reply,
            move |c, ctx| {
                c.shared
                    .do_rename(ctx, parent.0, &n, newparent.0, &nn, flags)
            },
            |_, _, reply, r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let nn = match name(newname) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_link(ctx, ino.0, newparent.0, &nn),
            |c, ctx, reply, r| match r {
                Ok(a) => {
                    let ttl = c.shared.ttl(ctx);
                    reply.entry_with_ttls(&ttl.attr, &ttl.entry, &a, GEN)
                }
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let flags = flags.0;
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_open(ctx, ino.0, flags),
            |c, _, reply, r| match r {
                Ok(o) => match c.register(o, |f| reply.open_backing(f)) {
                    (fh, Some(id)) => {
                        reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id)
                    }
                    (fh, None) => reply.opened(FileHandle(fh), c.open_flags()),
                },
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let ctx = self.ctx(req);
        match self.shared.do_read(&ctx, fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let ctx = self.ctx(req);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.shared.do_write(&ctx, fh.0, offset, data, kill) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Writes go straight to the host file, nothing is buffered, and POSIX locks stay in
        // the kernel: there is nothing to flush on close. ENOSYS tells the kernel so once,
        // and it stops sending FLUSH at all (one round trip less per close(2)).
        let _ = fh;
        reply.error(Errno::ENOSYS)
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.do_release(fh.0);
        self.release_backing(ino.0, fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.shared.do_fsync(fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let ctx = self.ctx(req);
        // The kernel may keep a listing across opens (it drops it when the directory
        // changes through the mount, and the daemon drops it on host changes and
        // reloads) — but never when rules depend on the caller: listings are filtered
        // per caller.
        let cache = if self.shared.ttl(&ctx).entry.is_zero() {
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
        };
        match self.shared.do_opendir(&ctx, ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), cache),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let ctx = self.ctx(req);
        let (_h, entries) = match self.shared.dir_entries(&ctx, fh.0, offset) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        // Offsets: 1 = ".", 2 = "..", 3.. = entries.
        let mut off = offset;
        if off == 0 {
            if reply.add(ino, 1, fuser::FileType::Directory, ".") {
                return reply.ok();
            }
            off = 1;
        }
        if off == 1 {
            let p = INodeNo(self.shared.parent_ino(ino.0));
            if reply.add(p, 2, fuser::FileType::Directory, "..") {
                return reply.ok();
            }
            off = 2;
        }
        for (i, e) in entries.iter().enumerate().skip((off - 2) as usize) {
            let kind = attr::kind(e.kind);
            if reply.add(
                INodeNo(e.ino),
                i as u64 + 3,
                kind,
                OsStr::from_bytes(&e.name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ctx = self.ctx(req);
        let ttl = self.shared.ttl(&ctx);
        let (_h, entries) = match self.shared.dir_entries(&ctx, fh.0, offset) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        // Same offsets as readdir: 1 = ".", 2 = "..", 3.. = entries. The kernel does not
        // count lookups for the dot entries.
        let mut off = offset;
        for (o, dot, dino) in [(0u64, ".", ino.0), (1, "..", self.shared.parent_ino(ino.0))] {
            if off == o {
                let Ok(a) = self.shared.do_getattr(&ctx, dino, None) else {
                    return reply.error(Errno::ESTALE);
                };
                if reply.add(INodeNo(dino), o + 1, dot, &ttl.entry, &a, GEN) {
                    return reply.ok();
                }
                off = o + 1;
            }
        }
        for (i, e) in entries.iter().enumerate().skip((off - 2) as usize) {
            // Each entry returned counts as a lookup; hidden or vanished ones are skipped.
            let Ok(a) = self.shared.plus_lookup(&ctx, ino.0, &e.name) else {
                continue;
            };
            if reply.add(
                a.ino,
                i as u64 + 3,
                OsStr::from_bytes(&e.name),
                &ttl.entry,
                &a,
                GEN,
            ) {
                // Not sent: give the lookup back.
                self.shared.do_forget(a.ino.0, 1);
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.shared.do_release(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.shared.do_fsync(fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let ctx = self.ctx(req);
        match self.shared.do_statfs(&ctx, ino.0) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let n = n.as_bytes().to_vec();
        let value = value.to_vec();
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_setxattr(ctx, ino.0, &n, &value, flags),
            |_, _, reply, r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        let ctx = self.ctx(req);
        match self.shared.do_getxattr(&ctx, ino.0, n.as_bytes(), size) {
            Ok(Xattr::Size(n)) => reply.size(n as u32),
            Ok(Xattr::Data(v)) => reply.data(&v),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let ctx = self.ctx(req);
        match self.shared.do_listxattr(&ctx, ino.0, size) {
            Ok(Xattr::Size(n)) => reply.size(n as u32),
            Ok(Xattr::Data(v)) => reply.data(&v),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let n = n.as_bytes().to_vec();
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_removexattr(ctx, ino.0, &n),
            |_, _, reply, r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let ctx = self.ctx(req);
        match self.shared.do_access(&ctx, ino.0, mask.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let n = match name(n) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_create(ctx, parent.0, &n, mode, flags),
            |c, ctx, reply, r| {
                let ttl = c.shared.ttl(ctx);
                match r {
                    Ok((a, o)) => match c.register(o, |f| reply.open_backing(f)) {
                        (fh, Some(id)) => reply.created_passthrough(
                            &ttl.entry,
                            &a,
                            GEN,
                            FileHandle(fh),
                            FopenFlags::empty(),
                            &id,
                        ),
                        (fh, None) => {
                            reply.created(&ttl.entry, &a, GEN, FileHandle(fh), c.open_flags())
                        }
                    },
                    Err(e) => reply.error(errno(e)),
                }
            },
        );
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        // POSIX locks are not negotiated (no FUSE_POSIX_LOCKS): the kernel keeps them
        // locally; ENOSYS tells it so should it ever ask.
        reply.error(Errno::ENOSYS);
    }

    fn setlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        _start: u64,
        _end: u64,
        _typ: i32,
        _pid: u32,
        _sleep: bool,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _blocksize: u32, _idx: u64, reply: ReplyBmap) {
        // Only meaningful for block-device-backed FUSE file systems.
        reply.error(Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // No ioctl is forwarded to the host: none can be decided by the policy.
        reply.error(Errno::ENOTTY);
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        // Regular files are always ready; ENOSYS makes the kernel use the default mask.
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.serve(
            req,
            reply,
            move |c, ctx| c.shared.do_fallocate(ctx, fh.0, offset, length, mode),
            |_, _, reply, r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.shared.do_lseek(fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.serve(
            req,
            reply,
            move |c, ctx| {
                c.shared
                    .do_copy_file_range(ctx, fh_in.0, offset_in, fh_out.0, offset_out, len)
            },
            |_, _, reply, r| match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(e)),
            },
        );
    }
}
