//! The requests on the synthetic nodes, answered through the same reply traits as the
//! host-backed ones (so both transports serve them alike). Every handler in
//! `fs/handlers.rs` that receives a synthetic node or handle hands it here.

use fuser::{Errno, FileType, FopenFlags};

use super::{BASE, FILES, NAME, TTL, owns};
use crate::fs::core::{Core, Rq};
use crate::fs::ctx::{Ctx, Error, Res};
use crate::fs::ops::{Lookup, Shared};
use crate::fs::reply::{AttrReply, DataReply, DirPlusReply, DirReply, EmptyReply, LseekReply};
use crate::fs::reply::{OpenReply, XattrReply};
use crate::host::inode::ROOT;

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

impl Shared {
    /// A lookup the notes answer: `.fencefs` at the root while on, and any name in it.
    /// `None`: an ordinary lookup.
    pub(crate) fn notes_lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Option<Res<Lookup>> {
        if parent == ROOT && name == NAME {
            return self.notes.attr(ctx, BASE).map(|a| Ok(Lookup::Found(a)));
        }
        if !owns(parent) {
            return None;
        }
        if parent != BASE || !ctx.snap.policy.agent_notes() {
            return Some(Err(Error(libc::ENOENT)));
        }
        Some(Ok(FILES
            .iter()
            .find(|(_, n)| *n == name)
            .and_then(|(ino, _)| self.notes.attr(ctx, *ino))
            .map_or(Lookup::Absent, Lookup::Found)))
    }
}

impl Core {
    /// GETATTR of a synthetic node.
    pub(crate) fn notes_getattr(&self, rq: Rq, ino: u64, reply: impl AttrReply) {
        let ctx = self.ctx(rq);
        match self.shared.notes.attr(&ctx, ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// OPEN of a synthetic node: read-only, contents frozen now, direct I/O, no backing.
    pub(crate) fn notes_open(&self, rq: Rq, ino: u64, flags: i32, reply: impl OpenReply) {
        let ctx = self.ctx(rq);
        let n = &self.shared.notes;
        if n.attr(&ctx, ino).is_none() {
            return reply.error(Errno::ENOENT);
        }
        if ino == BASE {
            return reply.error(Errno::EISDIR);
        }
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        match n.register(rq.uid, n.contents(&ctx, ino)) {
            Ok(fh) => reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO, None),
            Err(e) => reply.error(err(e.0)),
        }
    }

    /// READ of an open note.
    pub(crate) fn notes_read(&self, fh: u64, offset: u64, size: u32, reply: impl DataReply) {
        match self.shared.notes.data(fh) {
            Ok(d) => {
                let start = (offset.min(d.len() as u64)) as usize;
                let end = start.saturating_add(size as usize).min(d.len());
                reply.data(&d[start..end])
            }
            Err(e) => reply.error(err(e.0)),
        }
    }

    /// LSEEK in an open note (SEEK_DATA / SEEK_HOLE: one data extent, no holes).
    pub(crate) fn notes_lseek(&self, fh: u64, offset: i64, whence: i32, reply: impl LseekReply) {
        let len = match self.shared.notes.data(fh) {
            Ok(d) => d.len() as i64,
            Err(e) => return reply.error(err(e.0)),
        };
        match whence {
            libc::SEEK_SET if offset >= 0 => reply.offset(offset),
            libc::SEEK_END if len + offset >= 0 => reply.offset(len + offset),
            libc::SEEK_DATA if (0..len).contains(&offset) => reply.offset(offset),
            libc::SEEK_HOLE if (0..len).contains(&offset) => reply.offset(len),
            libc::SEEK_DATA | libc::SEEK_HOLE => reply.error(Errno::ENXIO),
            _ => reply.error(Errno::EINVAL),
        }
    }

    /// RELEASE / RELEASEDIR of an open note.
    pub(crate) fn notes_release(&self, fh: u64, reply: impl EmptyReply) {
        self.shared.notes.release(fh);
        reply.ok()
    }

    /// OPENDIR of a synthetic node.
    pub(crate) fn notes_opendir(&self, rq: Rq, ino: u64, reply: impl OpenReply) {
        let ctx = self.ctx(rq);
        if self.shared.notes.attr(&ctx, ino).is_none() {
            return reply.error(Errno::ENOENT);
        }
        if ino != BASE {
            return reply.error(Errno::ENOTDIR);
        }
        match self.shared.notes.register(rq.uid, Vec::new()) {
            Ok(fh) => reply.opened(fh, FopenFlags::empty(), None),
            Err(e) => reply.error(err(e.0)),
        }
    }

    /// READDIR of `.fencefs/`: offsets 1 = ".", 2 = "..", 3.. = the files.
    pub(crate) fn notes_readdir(&self, fh: u64, offset: u64, mut reply: impl DirReply) {
        if let Err(e) = self.shared.notes.data(fh) {
            return reply.error(err(e.0));
        }
        let dots = [(BASE, &b"."[..]), (ROOT, b"..")];
        let all = dots.iter().map(|(i, n)| (*i, *n, FileType::Directory));
        let files = FILES.iter().map(|(i, n)| (*i, *n, FileType::RegularFile));
        for (k, (ino, name, kind)) in all.chain(files).enumerate().skip(offset as usize) {
            if reply.add(ino, k as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    /// READDIRPLUS of `.fencefs/` (same offsets as readdir).
    pub(crate) fn notes_readdirplus(
        &self,
        rq: Rq,
        fh: u64,
        offset: u64,
        mut reply: impl DirPlusReply,
    ) {
        if let Err(e) = self.shared.notes.data(fh) {
            return reply.error(err(e.0));
        }
        let ctx = self.ctx(rq);
        let names = [(BASE, &b"."[..]), (ROOT, b"..")].into_iter().chain(FILES);
        for (k, (ino, name)) in names.enumerate().skip(offset as usize) {
            let a = if ino == ROOT {
                self.shared.do_getattr(&ctx, ROOT, None).ok()
            } else {
                self.shared.notes.attr(&ctx, ino)
            };
            let Some(a) = a else {
                return reply.error(Errno::ENOENT);
            };
            if reply.add(k as u64 + 1, name, &TTL, &a) {
                break;
            }
        }
        reply.ok()
    }

    /// ACCESS on a synthetic node: any read or search, never a write.
    pub(crate) fn notes_access(&self, rq: Rq, ino: u64, mask: i32, reply: impl EmptyReply) {
        let ctx = self.ctx(rq);
        if self.shared.notes.attr(&ctx, ino).is_none() {
            reply.error(Errno::ENOENT)
        } else if mask & libc::W_OK != 0 {
            reply.error(Errno::EROFS)
        } else {
            reply.ok()
        }
    }

    /// GETXATTR (`list`: LISTXATTR) on a synthetic node: it has none.
    pub(crate) fn notes_xattr(&self, list: bool, size: u32, reply: impl XattrReply) {
        if list && size == 0 {
            reply.size(0)
        } else if list {
            reply.data(&[])
        } else {
            reply.error(Errno::ENODATA)
        }
    }
}
