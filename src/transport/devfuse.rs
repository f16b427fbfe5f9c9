//! The `/dev/fuse` transport: fuser's `Filesystem` implementation, translation only.
//! Every operation is written out (none falls back to fuser's defaults, whose
//! `open`/`opendir` succeed and whose `access` ENOSYS means "allow"); each hands its
//! arguments and reply to the transport-neutral handler in [`crate::fs::handlers`], which
//! the io_uring and vhost-user transports call too.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents, PollFlags, PollNotifier,
    RenameFlags, ReplyAttr, ReplyBmap, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::MAX_WRITE;
use crate::fs::handlers::SetAttr;
use crate::fs::ops::Shared;
use crate::fs::{Core, forgets};
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

impl FenceFs {
    /// A file system serving `shared`.
    pub fn new(shared: Arc<Shared>) -> FenceFs {
        FenceFs {
            core: Arc::new(Core::new(shared)),
        }
    }

    /// The core, shared with the other transport and the daemon's threads.
    pub fn core(&self) -> Arc<Core> {
        self.core.clone()
    }
}

impl Filesystem for FenceFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Writes through the daemon (no passthrough, --revoke) come in pieces of at most
        // this; it also sizes each io_uring entry's payload buffer.
        let _ = config.set_max_write(MAX_WRITE as u32);
        if self.core.offer_uring.load(Ordering::Relaxed) {
            match config.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
                Ok(_) => self.core.uring.store(true, Ordering::Relaxed),
                Err(_) => log::info!("transport: the kernel did not offer FUSE over io_uring"),
            }
        }
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // O_TRUNC reaches `open` (instead of a separate setattr after an open for read),
        // so `O_RDONLY|O_TRUNC` is classified as the write it is.
        let _ = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        // The daemon clears set-ID bits on write, truncate and O_TRUNC by a caller without
        // CAP_FSETID (ops/mod.rs `kill_setid`; passthrough writes run with credentials without
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
            && config
                .set_max_stack_depth(crate::stage::stack_depth())
                .is_ok()
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
        self.core.lookup(req.into(), parent.0, n.as_bytes(), reply)
    }

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        forgets::pace(&self.core, req.unique().0);
        self.shared.do_forget(ino.0, nlookup);
    }

    // batch_forget: fuser's default calls `forget` for every entry (its `ForgetOne` type is
    // not public, so the method cannot be written out here).

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.core.getattr(req.into(), ino.0, fh.map(|f| f.0), reply)
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
        let s = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh: fh.map(|f| f.0),
        };
        self.core.setattr(req.into(), ino.0, s, reply)
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.core.readlink(req.into(), ino.0, reply)
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
        self.core
            .mknod(req.into(), parent.0, n.as_bytes(), mode, rdev, reply)
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
        self.core
            .mkdir(req.into(), parent.0, n.as_bytes(), mode, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.core
            .remove(req.into(), parent.0, n.as_bytes(), false, reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.core
            .remove(req.into(), parent.0, n.as_bytes(), true, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        self.core
            .symlink(req.into(), parent.0, link_name.as_bytes(), target, reply)
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
        self.core.rename(
            req.into(),
            parent.0,
            n.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
            reply,
        )
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.core
            .link(req.into(), ino.0, newparent.0, newname.as_bytes(), reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.core.open(req.into(), ino.0, flags.0, reply)
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
        self.core.read(req.into(), fh.0, offset, size, reply)
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let kind = crate::fs::ops::WriteKind::from_flags(write_flags.bits(), kill, flags.0);
        self.core.write(req.into(), fh.0, offset, data, kind, reply)
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.core.flush(reply)
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
        self.core.release(ino.0, fh.0, reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.core.fsync(fh.0, datasync, reply)
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.core.opendir(req.into(), ino.0, reply)
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        self.core.readdir(req.into(), ino.0, fh.0, offset, reply)
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        self.core
            .readdirplus(req.into(), ino.0, fh.0, offset, reply)
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.core.releasedir(fh.0, reply)
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.core.fsync(fh.0, datasync, reply)
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.core.statfs(req.into(), ino.0, reply)
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
        self.core
            .setxattr(req.into(), ino.0, n.as_bytes(), value, flags, reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        self.core
            .getxattr(req.into(), ino.0, n.as_bytes(), size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.core.listxattr(req.into(), ino.0, size, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        self.core
            .removexattr(req.into(), ino.0, n.as_bytes(), reply)
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.core.access(req.into(), ino.0, mask.bits(), reply)
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
        self.core
            .create(req.into(), parent.0, n.as_bytes(), mode, flags, reply)
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
        self.core
            .fallocate(req.into(), fh.0, offset, length, mode, reply)
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
        self.core.lseek(fh.0, offset, whence, reply)
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
        self.core.copy_file_range(
            req.into(),
            fh_in.0,
            offset_in,
            fh_out.0,
            offset_out,
            len,
            reply,
        )
    }
}
