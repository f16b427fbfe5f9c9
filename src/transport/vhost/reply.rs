//! Replies to a guest's requests: the out header and payload written into the chain's
//! writable descriptors (through `virtio-queue`'s `Writer`, which checks every guest
//! address), the chain put on the used ring and the guest signalled. Implements every
//! [`crate::fs::reply`] trait, so the handlers answer a guest as they answer the kernel.
//!
//! Invariants: a reply answers its chain exactly once (dropped unanswered: EIO); a reply
//! that does not fit the writable room becomes EIO (or, without room for the out header,
//! a used chain of length 0); it may be sent from any thread (a held request's resume).

use std::io::Write;
use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, FopenFlags};
use vhost_user_backend::VringT;
use virtio_queue::Writer;

use super::queue::{Chain, Vring, notify};
use crate::fs::reply::{
    AttrReply, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply, LseekReply,
    OpenReply, Reply, StatfsReply, WriteReply, XattrReply,
};
use crate::transport::abi::{self, OUT_HEADER};
use crate::transport::dispatch::Answer;

/// The answer to one chain.
pub struct GuestReply {
    chain: Option<Chain>,
    vring: Vring,
    unique: u64,
}

impl GuestReply {
    /// The reply to the request `unique` that came in `chain`.
    pub fn new(chain: Chain, vring: Vring, unique: u64) -> GuestReply {
        GuestReply {
            chain: Some(chain),
            vring,
            unique,
        }
    }

    /// Payload bytes the writable descriptors hold after the out header.
    pub fn room(&self) -> usize {
        self.chain
            .as_ref()
            .and_then(|c| Writer::<()>::new(c.memory(), c.clone()).ok())
            .map_or(0, |w| w.available_bytes().saturating_sub(OUT_HEADER))
    }

    /// Sends `error` (0 or a negative errno) with the payload `parts`.
    fn send(&mut self, error: i32, parts: &[&[u8]]) {
        let Some(chain) = self.chain.take() else {
            return;
        };
        let head = chain.head_index();
        let len: usize = OUT_HEADER + parts.iter().map(|p| p.len()).sum::<usize>();
        let mem = chain.memory();
        let written = match Writer::<()>::new(mem, chain.clone()) {
            Err(e) => {
                log::warn!("vhost-user: a malformed reply chain: {e}");
                0
            }
            Ok(mut w) => {
                let room = w.available_bytes();
                let mut h = [0u8; OUT_HEADER];
                let ok = if len <= room {
                    abi::out_header(&mut h, len, error, self.unique);
                    w.write_all(&h).is_ok() && parts.iter().all(|p| w.write_all(p).is_ok())
                } else if OUT_HEADER <= room {
                    log::warn!(
                        "vhost-user: a reply of {len} bytes does not fit the guest's {room}"
                    );
                    abi::out_header(&mut h, OUT_HEADER, -libc::EIO, self.unique);
                    w.write_all(&h).is_ok()
                } else {
                    false
                };
                if ok { w.bytes_written() } else { 0 }
            }
        };
        if let Err(e) = self.vring.add_used(head, written as u32) {
            log::warn!("vhost-user: returning descriptor {head}: {e}");
        }
        notify(&self.vring);
    }

    fn finish(mut self, error: i32, parts: &[&[u8]]) {
        self.send(error, parts)
    }

    /// Answers with `b` as the whole payload.
    pub fn raw(self, b: &[u8]) {
        self.finish(0, &[b])
    }
}

impl Drop for GuestReply {
    fn drop(&mut self) {
        if self.chain.is_some() {
            self.send(-libc::EIO, &[]);
        }
    }
}

impl Reply for GuestReply {
    fn error(self, e: Errno) {
        let n = i32::from(e);
        self.finish(-n.abs(), &[])
    }
}

impl EmptyReply for GuestReply {
    fn ok(self) {
        self.finish(0, &[])
    }
}

impl EntryReply for GuestReply {
    fn entry(self, attr_ttl: &Duration, entry_ttl: &Duration, attr: &FileAttr) {
        let mut b = [0u8; abi::ENTRY_OUT];
        abi::entry_out(&mut b, attr_ttl, entry_ttl, attr);
        self.raw(&b)
    }
}

impl AttrReply for GuestReply {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        let mut b = [0u8; abi::ATTR_OUT];
        abi::attr_out(&mut b, ttl, attr);
        self.raw(&b)
    }
}

impl DataReply for GuestReply {
    fn data(self, data: &[u8]) {
        self.raw(data)
    }
}

/// Open flags for a guest: no cache kept across opens (a listing or file pages), since
/// nothing can tell a guest to drop it after a reload or a host change.
fn guest_open_flags(flags: FopenFlags) -> u32 {
    (flags - (FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE)).bits()
}

impl OpenReply for GuestReply {
    fn opened(self, fh: u64, flags: FopenFlags, _backing: Option<u32>) {
        let mut b = [0u8; abi::OPEN_OUT];
        abi::open_out(&mut b, fh, guest_open_flags(flags), None);
        self.raw(&b)
    }
}

impl WriteReply for GuestReply {
    fn written(self, n: u32) {
        let mut b = [0u8; 8];
        abi::u32_out(&mut b, n);
        self.raw(&b)
    }
}

impl CreateReply for GuestReply {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        fh: u64,
        flags: FopenFlags,
        _backing: Option<u32>,
    ) {
        let mut b = [0u8; abi::ENTRY_OUT + abi::OPEN_OUT];
        abi::entry_out(&mut b[..abi::ENTRY_OUT], ttl, ttl, attr);
        abi::open_out(&mut b[abi::ENTRY_OUT..], fh, guest_open_flags(flags), None);
        self.raw(&b)
    }
}

impl StatfsReply for GuestReply {
    fn statfs(self, s: &libc::statvfs) {
        let mut b = [0u8; abi::STATFS_OUT];
        abi::statfs_out(&mut b, s);
        self.raw(&b)
    }
}

impl XattrReply for GuestReply {
    fn size(self, n: u32) {
        let mut b = [0u8; 8];
        abi::u32_out(&mut b, n);
        self.raw(&b)
    }
    fn data(self, d: &[u8]) {
        self.raw(d)
    }
}

impl LseekReply for GuestReply {
    fn offset(self, o: i64) {
        let mut b = [0u8; 8];
        abi::u64_out(&mut b, o as u64);
        self.raw(&b)
    }
}

/// A readdir(plus) reply built in memory, up to the size asked for (and the room).
pub struct GuestDir {
    reply: GuestReply,
    buf: Vec<u8>,
    max: usize,
}

impl GuestDir {
    fn room(&mut self, n: usize) -> Option<&mut [u8]> {
        let start = self.buf.len();
        if start + n > self.max {
            return None;
        }
        self.buf.resize(start + n, 0);
        Some(&mut self.buf[start..])
    }
}

impl Answer for GuestReply {
    type Dir = GuestDir;
    fn dir(self, size: usize) -> GuestDir {
        // The size was clamped to the room when the request was decoded.
        GuestDir {
            reply: self,
            buf: Vec::with_capacity(size.min(64 << 10)),
            max: size,
        }
    }
}

impl Reply for GuestDir {
    fn error(self, e: Errno) {
        self.reply.error(e)
    }
}

impl DirReply for GuestDir {
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
        let GuestDir { reply, buf, .. } = self;
        reply.raw(&buf)
    }
}

impl DirPlusReply for GuestDir {
    fn add(&mut self, offset: u64, name: &[u8], ttl: &Duration, attr: &FileAttr) -> bool {
        match self.room(abi::direntplus_len(name.len())) {
            Some(b) => {
                abi::direntplus(b, offset, name, ttl, attr);
                false
            }
            None => true,
        }
    }
    fn ok(self) {
        let GuestDir { reply, buf, .. } = self;
        reply.raw(&buf)
    }
}
