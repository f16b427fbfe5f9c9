//! Replies to requests that came on a ring: written in place into the request's own
//! entry (out header, payload, `payload_sz`), then handed back to the queue thread to
//! commit ([`Queue::answered`]). Implements every [`crate::fs::reply`] trait, so the
//! handlers answer ring requests exactly as they answer fuser's.
//!
//! Invariant: a reply owns its entry from creation until it answers (or is dropped, which
//! answers EIO); it answers exactly once. Its `unsafe` is the entry buffer access that
//! ownership makes exclusive.
#![allow(unsafe_code)]

use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, FopenFlags};

use super::abi::{self, OUT_HEADER};
use super::ring::ENT_IN_OUT;
pub use super::ring::RingReply;
use crate::fs::reply::{
    AttrReply, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply, LseekReply,
    OpenReply, Reply, StatfsReply, WriteReply, XattrReply,
};

impl RingReply {
    /// Writes the out header for `len` payload bytes already in place and queues the commit.
    fn finish(mut self, error: i32, len: usize) {
        self.sent = true;
        // SAFETY: this reply owns the entry until `answered`.
        let (h, _) = unsafe { self.q.bufs(self.slot) };
        abi::out_header(&mut h[..OUT_HEADER], OUT_HEADER + len, error, self.unique);
        h[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(len as u32).to_ne_bytes());
        self.q.answered(self.slot);
    }

    /// The payload buffer to write a reply into.
    fn payload(&mut self) -> &mut [u8] {
        // SAFETY: this reply owns the entry.
        unsafe { self.q.bufs(self.slot).1 }
    }

    /// Replies with `n` bytes written by `fill` (EIO if the buffer cannot hold them).
    fn with(mut self, n: usize, fill: impl FnOnce(&mut [u8])) {
        let p = self.payload();
        if n > p.len() {
            log::warn!("io_uring reply of {n} bytes does not fit the ring buffer");
            return self.finish(-libc::EIO, 0);
        }
        fill(&mut p[..n]);
        self.finish(0, n)
    }
}

impl Drop for RingReply {
    fn drop(&mut self) {
        if !self.sent {
            self.sent = true;
            // SAFETY: this reply still owns the entry.
            let (h, _) = unsafe { self.q.bufs(self.slot) };
            abi::out_header(&mut h[..OUT_HEADER], OUT_HEADER, -libc::EIO, self.unique);
            h[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&0u32.to_ne_bytes());
            self.q.answered(self.slot);
        }
    }
}

impl Reply for RingReply {
    fn error(self, e: Errno) {
        let n = i32::from(e);
        self.finish(-n.abs(), 0)
    }
}

impl EmptyReply for RingReply {
    fn ok(self) {
        self.finish(0, 0)
    }
}

impl EntryReply for RingReply {
    fn entry(self, attr_ttl: &Duration, entry_ttl: &Duration, attr: &FileAttr) {
        self.with(abi::ENTRY_OUT, |b| {
            abi::entry_out(b, attr_ttl, entry_ttl, attr)
        })
    }
}

impl AttrReply for RingReply {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        self.with(abi::ATTR_OUT, |b| abi::attr_out(b, ttl, attr))
    }
}

impl DataReply for RingReply {
    fn data(self, data: &[u8]) {
        self.with(data.len(), |b| b.copy_from_slice(data))
    }
}

impl OpenReply for RingReply {
    fn opened(self, fh: u64, flags: FopenFlags, backing: Option<u32>) {
        self.with(abi::OPEN_OUT, |b| {
            abi::open_out(b, fh, flags.bits(), backing)
        })
    }
}

impl WriteReply for RingReply {
    fn written(self, n: u32) {
        self.with(8, |b| abi::u32_out(b, n))
    }
}

impl CreateReply for RingReply {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        fh: u64,
        flags: FopenFlags,
        backing: Option<u32>,
    ) {
        self.with(abi::ENTRY_OUT + abi::OPEN_OUT, |b| {
            abi::entry_out(&mut b[..abi::ENTRY_OUT], ttl, ttl, attr);
            abi::open_out(&mut b[abi::ENTRY_OUT..], fh, flags.bits(), backing);
        })
    }
}

impl StatfsReply for RingReply {
    fn statfs(self, s: &libc::statvfs) {
        self.with(abi::STATFS_OUT, |b| abi::statfs_out(b, s))
    }
}

impl XattrReply for RingReply {
    fn size(self, n: u32) {
        self.with(8, |b| abi::u32_out(b, n))
    }
    fn data(self, d: &[u8]) {
        self.with(d.len(), |b| b.copy_from_slice(d))
    }
}

impl LseekReply for RingReply {
    fn offset(self, o: i64) {
        self.with(8, |b| abi::u64_out(b, o as u64))
    }
}

/// A readdir(plus) reply filled in place, up to the size the kernel asked for.
pub struct RingDir {
    reply: RingReply,
    max: usize,
    used: usize,
}

impl RingDir {
    pub(super) fn new(reply: RingReply, max: usize) -> RingDir {
        RingDir {
            reply,
            max,
            used: 0,
        }
    }

    fn room(&mut self, n: usize) -> Option<&mut [u8]> {
        let end = self.used + n;
        let cap = self.max.min(self.reply.payload().len());
        if end > cap {
            return None;
        }
        let start = self.used;
        self.used = end;
        Some(&mut self.reply.payload()[start..end])
    }
}

impl Reply for RingDir {
    fn error(self, e: Errno) {
        self.reply.error(e)
    }
}

impl DirReply for RingDir {
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &[u8]) -> bool {
        match self.room(abi::dirent_len(name.len())) {
            Some(b) => {
                abi::dirent(b, ino, offset, kind, name);
                false
            }
            None => true,
        }
    }
    fn ok(self) {
        let n = self.used;
        self.reply.finish(0, n)
    }
}

impl DirPlusReply for RingDir {
    fn add(&mut self, offset: u64, name: &[u8], ttl: &Duration, attr: &FileAttr) -> bool {
        match self.room(abi::direntplus_len(name.len())) {
            Some(b) => {
                abi::direntplus(b, offset, name, ttl, attr);
                false
            }
            None => true,
        }
    }
    fn can_plain(&self) -> bool {
        true
    }
    fn add_plain(&mut self, ino: u64, offset: u64, kind: FileType, name: &[u8]) -> bool {
        match self.room(abi::direntplus_len(name.len())) {
            Some(b) => {
                abi::direntplus_plain(b, ino, offset, kind, name);
                false
            }
            None => true,
        }
    }
    fn ok(self) {
        let n = self.used;
        self.reply.finish(0, n)
    }
}
