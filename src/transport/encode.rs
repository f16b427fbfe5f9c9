//! The reply encoder of the daemon's own transports (io_uring ring entries, a guest's
//! virtqueue chains): every [`crate::fs::reply`] trait, written once over a [`Sink`], the
//! few things a transport does differently — where the bytes go, what an open handle may
//! keep, whether a listing can be built in place. fuser's replies (`/dev/fuse`) encode
//! themselves.
//!
//! Invariants: a sink is consumed by exactly one answer; a payload that does not fit the
//! sink is EIO (the sink's own rule, [`Sink::send`]); a listing never exceeds the size the
//! request asked for nor the room the sink has.

use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, FopenFlags};

use super::abi;
use crate::fs::reply::{
    AttrReply, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply, LseekReply,
    OpenReply, Reply, StatfsReply, WriteReply, XattrReply,
};

/// Where one request's answer goes.
pub trait Sink: Send + Sized + 'static {
    /// Whether a readdirplus reply may carry entries without attributes (see
    /// [`DirPlusReply::can_plain`]).
    const PLAIN: bool;

    /// Answers `error` (0, or a negative errno with no parts) with the payload `parts`, in
    /// order; a payload larger than the room answers EIO instead.
    fn send(self, error: i32, parts: &[&[u8]]);

    /// The open flags and kernel passthrough backing id to tell for a handle.
    fn open_flags(flags: FopenFlags, backing: Option<u32>) -> (u32, Option<u32>);

    /// The transport's own payload buffer, when a listing can be built in it in place (a
    /// ring entry's); `None`: the listing is built in memory and sent with [`Sink::send`].
    fn in_place(&mut self) -> Option<&mut [u8]> {
        None
    }

    /// Answers with the first `len` bytes of [`Sink::in_place`]'s buffer.
    fn send_in_place(self, len: usize) {
        let _ = len;
        self.send(-libc::EIO, &[])
    }
}

/// Answers a fixed-size struct encoded by `fill`.
fn fixed<S: Sink, const N: usize>(s: S, fill: impl FnOnce(&mut [u8; N])) {
    let mut b = [0u8; N];
    fill(&mut b);
    s.send(0, &[&b])
}

impl<S: Sink> Reply for S {
    fn error(self, e: Errno) {
        let n = i32::from(e);
        self.send(-n.abs(), &[])
    }
}

impl<S: Sink> EmptyReply for S {
    fn ok(self) {
        self.send(0, &[])
    }
}

impl<S: Sink> EntryReply for S {
    fn entry(self, attr_ttl: &Duration, entry_ttl: &Duration, attr: &FileAttr) {
        fixed::<S, { abi::ENTRY_OUT }>(self, |b| abi::entry_out(b, attr_ttl, entry_ttl, attr))
    }
}

impl<S: Sink> AttrReply for S {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        fixed::<S, { abi::ATTR_OUT }>(self, |b| abi::attr_out(b, ttl, attr))
    }
}

impl<S: Sink> DataReply for S {
    fn data(self, data: &[u8]) {
        self.send(0, &[data])
    }
}

impl<S: Sink> OpenReply for S {
    fn opened(self, fh: u64, flags: FopenFlags, backing: Option<u32>) {
        let (flags, backing) = S::open_flags(flags, backing);
        fixed::<S, { abi::OPEN_OUT }>(self, |b| abi::open_out(b, fh, flags, backing))
    }
}

impl<S: Sink> WriteReply for S {
    fn written(self, n: u32) {
        fixed::<S, 8>(self, |b| abi::u32_out(b, n))
    }
}

impl<S: Sink> CreateReply for S {
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        fh: u64,
        flags: FopenFlags,
        backing: Option<u32>,
    ) {
        let (flags, backing) = S::open_flags(flags, backing);
        fixed::<S, { abi::ENTRY_OUT + abi::OPEN_OUT }>(self, |b| {
            abi::entry_out(&mut b[..abi::ENTRY_OUT], ttl, ttl, attr);
            abi::open_out(&mut b[abi::ENTRY_OUT..], fh, flags, backing);
        })
    }
}

impl<S: Sink> StatfsReply for S {
    fn statfs(self, s: &libc::statvfs) {
        fixed::<S, { abi::STATFS_OUT }>(self, |b| abi::statfs_out(b, s))
    }
}

impl<S: Sink> XattrReply for S {
    fn size(self, n: u32) {
        fixed::<S, 8>(self, |b| abi::u32_out(b, n))
    }
    fn data(self, d: &[u8]) {
        self.send(0, &[d])
    }
}

impl<S: Sink> LseekReply for S {
    fn offset(self, o: i64) {
        fixed::<S, 8>(self, |b| abi::u64_out(b, o as u64))
    }
}

/// A readdir(plus) reply, filled entry by entry up to the size the request asked for: in
/// the sink's own buffer where it has one, otherwise in memory.
pub struct Dir<S: Sink> {
    sink: S,
    buf: Vec<u8>,
    used: usize,
    max: usize,
}

impl<S: Sink> Dir<S> {
    /// A listing of at most `max` bytes answered through `sink`.
    pub fn new(mut sink: S, max: usize) -> Dir<S> {
        let buf = match sink.in_place() {
            Some(_) => Vec::new(),
            None => Vec::with_capacity(max.min(64 << 10)),
        };
        Dir {
            sink,
            buf,
            used: 0,
            max,
        }
    }

    /// The next `n` bytes of the listing, or `None` when they do not fit.
    fn room(&mut self, n: usize) -> Option<&mut [u8]> {
        let (start, end) = (self.used, self.used + n);
        if end > self.max {
            return None;
        }
        let b = match self.sink.in_place() {
            Some(p) => p.get_mut(start..end)?,
            None => {
                self.buf.resize(end, 0);
                &mut self.buf[start..end]
            }
        };
        self.used = end;
        Some(b)
    }

    fn finish(mut self) {
        if self.sink.in_place().is_some() {
            self.sink.send_in_place(self.used)
        } else {
            self.sink.send(0, &[&self.buf])
        }
    }
}

impl<S: Sink> Reply for Dir<S> {
    fn error(self, e: Errno) {
        self.sink.error(e)
    }
}

impl<S: Sink> DirReply for Dir<S> {
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
        self.finish()
    }
}

impl<S: Sink> DirPlusReply for Dir<S> {
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
        S::PLAIN
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
        self.finish()
    }
}
