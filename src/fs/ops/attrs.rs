//! Attributes: getattr, setattr (chmod, chown, truncate, utimens), access, statfs.
//!
//! Invariants: reading attributes needs `list`, changing them `write`, and turning a
//! set-ID bit on needs `allow_setid`; ids are mapped between caller and host both ways;
//! a truncate (or the kernel's "remove privileges" request) by a caller without
//! CAP_FSETID clears set-ID bits as a local disk would; a symlink's own mode is never
//! changed and its times are set without following it.

use std::os::fd::AsFd;
use std::time::UNIX_EPOCH;

use fuser::{FileAttr, TimeOrNow};

use super::{Ctx, Error, Res, Shared};
use crate::host::inode::ROOT;
use crate::host::sys::{self, Name, SetTime};
use crate::policy::{Need, Special};

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

/// Setattr's arguments (what the kernel asks to change).
#[derive(Default, Clone, Copy, Debug)]
pub struct SetAttr {
    /// New mode.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeOrNow>,
    /// New modification time.
    pub mtime: Option<TimeOrNow>,
    /// The handle the change came through (ftruncate, futimens).
    pub fh: Option<u64>,
}

impl Shared {
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
    pub fn do_setattr(&self, ctx: &Ctx, ino: u64, s: &SetAttr) -> Res<FileAttr> {
        let SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh,
        } = *s;
        let setid = libc::S_ISUID | libc::S_ISGID;
        let asks_nothing = [mode, uid, gid].iter().all(Option::is_none)
            && size.is_none()
            && atime.is_none()
            && mtime.is_none();
        // The file's own mode and owner only matter for a mode with set-ID bits and for
        // an empty request: a chown, a utimens or a plain chmod (tar, per file) needs no
        // stat of its own. The type never changes: the node table has it.
        let st = match mode.is_some_and(|m| m & setid != 0) || asks_nothing {
            true => Some(self.stat_ino(ino)?),
            false => None,
        };
        let mut sp = Special::default();
        if let (Some(m), Some(st)) = (mode, &st) {
            // Only turning a set-ID bit on is "setting" it.
            sp.setid = (m & setid) & !(st.st_mode & setid) != 0;
        }
        let need = self.mutate_need(ctx, ino);
        self.allow_ino(ctx, "setattr", ino, need, sp)?;
        if let Some(sz) = size {
            self.cap(ino, sz)?;
        }
        let kind = self.inodes.kind(ino)?;
        let handle = fh.and_then(|fh| self.handles.get(fh));
        let mut note = self.note_node(ino);
        // A staged mount changes the upper's copy (made now), never a lower layer's.
        let changes = !asks_nothing || st.as_ref().is_some_and(|s| s.st_mode & setid != 0);
        let fd = if changes {
            self.for_change(ino, &mut note)?
        } else {
            self.inodes.fd(ino)?
        };
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
        let nothing = asks_nothing
            && (st.is_some_and(|st| st.st_uid == self.host_ids(ctx).0)
                || self.handles.any_on(ino, |h| h.write));
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
                let pfd = self.inodes.up_dir(parent)?;
                sys::utimens_nofollow(pfd.as_fd(), &Name::new(&name)?, a, m)?;
            } else {
                sys::utimens_fd(self.inodes.proc_fd.as_fd(), fd.as_fd(), a, m)?;
            }
        }
        self.noted(note);
        Ok(self.attr(ctx, ino, &sys::fstat(fd.as_fd())?))
    }

    /// access(2): F_OK needs `list`, R_OK/X_OK `read`, W_OK some way to write (`write`;
    /// `append` for a file, `create` for a directory or a file this uid is creating); X_OK
    /// also needs an execute bit on non-directories (as for root on a local disk) that no
    /// `exec = false` rule masks.
    pub fn do_access(&self, ctx: &Ctx, ino: u64, mask: i32) -> Res<()> {
        let need = if mask & libc::W_OK != 0 {
            self.access_write_need(ctx, ino)
        } else if mask & (libc::R_OK | libc::X_OK) != 0 {
            Need::Read
        } else {
            Need::List
        };
        self.allow_ino(ctx, "access", ino, need, Special::default())?;
        if mask & libc::X_OK != 0 {
            let st = self.stat_ino(ino)?;
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR
                && (st.st_mode & 0o111 == 0 || self.no_exec(ctx, ino))
            {
                return Err(Error(libc::EACCES));
            }
        }
        Ok(())
    }

    /// statfs of the file system of the root `ino` is in (SOURCE's for SOURCE).
    pub fn do_statfs(&self, ctx: &Ctx, ino: u64) -> Res<libc::statvfs> {
        self.allow_ino(ctx, "statfs", ino, Need::List, Special::default())?;
        let root = self.inodes.path(ino).ok().and_then(|p| {
            let roots = self.inodes.roots();
            Some(roots.root_of(&p)?.fd.clone())
        });
        let fd = match root {
            Some(fd) => fd,
            None => self.inodes.fd(ROOT)?,
        };
        Ok(sys::fstatvfs(fd.as_fd())?)
    }
}
