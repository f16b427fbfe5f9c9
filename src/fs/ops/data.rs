//! File data: open, read, write, fsync, fallocate, lseek, copy_file_range (in bounded
//! steps: `copy.rs`), release, and registering an opened file as a handle.
//!
//! Invariants: the rights a handle carries are decided once, at open, and kept server-side
//! (read/write/exec); every I/O checks them, and with `--revoke` re-decides against the
//! policy in force. Only regular files and directories are ever opened on the host, never
//! waiting (`O_NONBLOCK`), after the caller's descriptor budget is reserved. A passthrough
//! handle holds no descriptor (the kernel holds the backing file): I/O the daemon must do
//! on it reopens the node with an access mode the handle was granted. Writes, truncating
//! opens and fallocate by a caller without CAP_FSETID clear set-ID bits first.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsFd;
use std::sync::OnceLock;

use super::grants::write_need;
use super::{Ctx, Error, Opened, Res, Shared, WriteKind};
use crate::fs::attr;
use crate::host::handle::Handle;
use crate::host::sys;
use crate::policy::{Caller, Need, Special};

impl Shared {
    /// Registers an opened file as a handle; returns its `fh`. A passthrough file gives
    /// its descriptor (and the descriptor budget) back: the kernel holds the backing file.
    pub fn register(&self, o: Opened, passthrough: bool) -> u64 {
        let Opened {
            ino,
            file,
            writer: _,
            opener,
            read,
            write,
            exec,
            fresh,
            append_only,
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
            opener,
            read,
            write,
            exec,
            fresh,
            append_only,
            node: None,
            entries: None,
            slots,
            view: 0,
            kept: OnceLock::new(),
            pin: OnceLock::new(),
        })
    }

    /// open: the flags decide the level needed; the handle keeps what was granted. Only
    /// regular files and directories are ever opened on the host (the type is checked on
    /// the handle first, and the open is `O_NONBLOCK`), so an open never waits. The caller's
    /// descriptor budget is taken before the open.
    pub fn do_open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Res<Opened> {
        let intent = attr::classify(flags);
        let need = self.open_need(ctx, ino, flags);
        self.allow_ino(ctx, "open", ino, need, Special::default())?;
        if flags & attr::FMODE_EXEC != 0 {
            self.check_exec(ctx, ino)?;
        }
        // Granted append but not write: the handle may only append.
        let append_only =
            need == Need::Append && !self.learning() && !self.grants_ino(ctx, ino, Need::Write);
        // O_TRUNC is applied by the host open itself (atomic O_TRUNC): refuse it for a
        // running program before the host file is touched, as a local disk would.
        if flags & libc::O_TRUNC != 0 && self.handles.executing(ino) {
            return Err(Error(libc::ETXTBSY));
        }
        let writes = intent.write || flags & libc::O_TRUNC != 0;
        match self.inodes.kind(ino)? {
            libc::S_IFREG => {}
            libc::S_IFDIR => {
                if intent.write {
                    return Err(Error(libc::EISDIR));
                }
            }
            _ => return Err(Error(libc::EINVAL)),
        }
        let slots = self.handles.reserve(ctx.caller.uid, self.root_id(ino))?;
        let mut note = if writes {
            self.note_node(ino)
        } else {
            self.note_read(ino);
            None
        };
        // A staged mount writes the upper's copy (made now), never a lower layer's.
        let fd = if writes {
            self.for_change(ino, &mut note)?
        } else {
            self.inodes.fd(ino)?
        };
        let st = sys::fstat(fd.as_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG && st.st_mode & libc::S_IFMT != libc::S_IFDIR
        {
            return Err(Error(libc::EINVAL));
        }
        let file = sys::reopen(
            self.inodes.proc_fd.as_fd(),
            fd.as_fd(),
            attr::host_open_flags(flags),
        )?;
        self.noted(note);
        if flags & libc::O_TRUNC != 0 && self.kills_setid(ctx) {
            self.kill_setid(ino, file.as_fd())?;
        }
        Ok(Opened {
            ino,
            file,
            writer: self.host_ids(ctx),
            opener: (ctx.caller.uid, ctx.caller.gid),
            read: intent.read,
            write: intent.write,
            exec: flags & attr::FMODE_EXEC != 0,
            fresh: false,
            append_only,
            slots,
        })
    }

    /// With `--revoke`, re-decides a handle's I/O against the policy in force: for the
    /// caller, or — when the request carries none (pid 0: the kernel writing back a shared
    /// map's pages, or reading ahead, with uid 0) — for the handle's opener and every other
    /// uid holding a handle on the node with that access, so that neither root's grants nor
    /// root's refusals, nor another uid's grants, stand in for the opener's.
    fn recheck(&self, ctx: &Ctx, op: &'static str, h: &Handle, need: Need) -> Res<()> {
        if !self.settings.revoke {
            return Ok(());
        }
        if ctx.pid != 0 {
            return self.allow_ino(ctx, op, h.ino, need, Special::default());
        }
        // The kernel writes a file's dirty shared pages back through the handle of the
        // newest shared writable map of the file, whoever dirtied them (and the pages are
        // shared by every map): the I/O is decided for every uid holding a handle on the
        // node with that access, so a uid cut off cannot write through another's handle.
        let write = need.mutates();
        let mut openers = self
            .handles
            .openers_on(h.ino, |o| if write { o.write } else { o.read });
        if !openers.contains(&h.opener) {
            openers.push(h.opener);
        }
        for (uid, gid) in openers {
            // No program is known for the kernel's writeback: the most restrictive answer.
            let caller = if ctx.snap.policy.has_programs() {
                Caller::unknown_program(uid, gid)
            } else {
                Caller::new(uid, gid)
            };
            let opener = Ctx {
                caller,
                pid: 0,
                snap: ctx.snap.clone(),
                approved: None,
                ask: RefCell::new(None),
                may_hold: false,
                inside: None,
                need: std::cell::Cell::new(None),
            };
            self.allow_ino(&opener, op, h.ino, need, Special::default())?;
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

    /// write through a handle opened for writing; `kind.kill_setid`: the kernel's
    /// FUSE_WRITE_KILL_SUIDGID (the writer lacks CAP_FSETID), see [`Shared::kill_setid`];
    /// an append-only handle takes only appending writes (see `grants.rs`).
    pub fn do_write(
        &self,
        ctx: &Ctx,
        fh: u64,
        offset: u64,
        data: &[u8],
        kind: WriteKind,
    ) -> Res<u32> {
        let h = self.handle(fh)?;
        if !h.write {
            return Err(Error(libc::EBADF));
        }
        self.check_append(ctx, &h, kind)?;
        self.recheck(ctx, "write", &h, write_need(&h))?;
        self.cap(h.ino, offset.saturating_add(data.len() as u64))?;
        let fd = self.io_fd(&h, libc::O_WRONLY)?;
        if kind.kill_setid {
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
            if let Some(p) = h.pin.get() {
                return sys::reopen(self.inodes.proc_fd.as_fd(), p.fd.as_fd(), read_or_write(&h));
            }
            // A directory: the object its OPENDIR found.
            if let Some(n) = &h.node {
                return sys::reopen(self.inodes.proc_fd.as_fd(), n.as_fd(), libc::O_RDONLY);
            }
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
        if h.append_only {
            // Never a pure append: it may punch, zero or extend in place.
            self.check_append(ctx, &h, WriteKind::default())?;
        }
        self.recheck(ctx, "fallocate", &h, write_need(&h))?;
        self.cap(h.ino, offset.saturating_add(len))?;
        let fd = self.io_fd(&h, libc::O_WRONLY)?;
        if self.kills_setid(ctx) {
            self.kill_setid(h.ino, fd.as_fd())?;
        }
        // One call that cannot be split (an allocation of a huge range may take long): a
        // view swap need not wait for it (`fs::gate`).
        let call = || sys::fallocate(fd.as_fd(), mode, offset, len);
        Ok(match &self.gate {
            Some(g) => g.outside(call),
            None => call(),
        }?)
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
        // Into an append-only file: the host refuses copy_file_range to an O_APPEND file
        // (EBADF); refusing first says why.
        self.check_append(ctx, &ho, WriteKind::default())?;
        self.recheck(ctx, "read", &hi, Need::Read)?;
        self.recheck(ctx, "write", &ho, write_need(&ho))?;
        let len = len.min(u32::MAX as u64 & !0xfff);
        self.cap(ho.ino, off_out.saturating_add(len))?;
        let fi = self.io_fd(&hi, libc::O_RDONLY)?;
        let fo = self.io_fd(&ho, libc::O_WRONLY)?;
        if self.kills_setid(ctx) {
            self.kill_setid(ho.ino, fo.as_fd())?;
        }
        // In bounded steps, stopping short when a view swap waits (`copy.rs`).
        let stop = || self.gate.as_ref().is_some_and(|g| g.closing());
        let n = super::copy::bounded(fi.as_fd(), off_in, fo.as_fd(), off_out, len, &stop)?;
        Ok(n as u32)
    }
}

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
