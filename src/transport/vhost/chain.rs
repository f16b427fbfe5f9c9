//! One descriptor chain → one FUSE request: the readable descriptors are copied into a
//! bounded buffer (the request), the writable ones get the reply. INIT, FORGET,
//! BATCH_FORGET and INTERRUPT are answered here (the `/dev/fuse` transports leave them to
//! fuser); everything else is decoded by [`dispatch::decode`] and run by [`dispatch::run`].
//!
//! Invariants: nothing here trusts a length the guest wrote: the in-header's `len`, the
//! argument structs, the forget count and the reply sizes are checked against the bytes
//! really there (and [`MAX_REQUEST`], [`MAX_REPLY`]); a chain the crates refuse (a
//! descriptor outside guest memory, a loop, an overflowing length) goes back used with
//! length 0.

use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

use fuser::Errno;
use vhost_user_backend::VringT;
use virtio_queue::Reader;

use super::reply::GuestReply;
use super::stats::Stats;
use super::{MAX_REPLY, MAX_REQUEST, MAX_WRITE};
use crate::fs::Core;
use crate::fs::reply::Reply;
use crate::transport::abi::{self, Args, IN_HEADER, InHeader, op};
use crate::transport::dispatch::{self, Acl};
use crate::transport::pool::Pool;
use crate::transport::ring::Incoming;

pub use super::queue::{Chain, Vring, notify};

/// What one connection's requests share.
pub struct Session {
    core: Arc<Core>,
    pool: Pool,
    /// Requests by opcode, and the queue threads' time on them.
    pub stats: Stats,
}

impl Session {
    /// A session serving `core`.
    pub fn new(core: Arc<Core>, pool: Pool) -> Session {
        Session {
            core,
            pool,
            stats: Stats::default(),
        }
    }
}

/// Puts a chain back on the used ring with nothing written (and tells the guest).
pub fn unanswered(vring: &Vring, head: u16) {
    if let Err(e) = vring.add_used(head, 0) {
        log::warn!("vhost-user: returning descriptor {head}: {e}");
    }
    notify(vring);
}

/// The readable bytes of `chain`, or why it is refused: `Err(None)` to return it
/// unanswered, `Err(Some(unique))` to answer it EINVAL.
fn read_request(chain: &Chain, buf: &mut Vec<u8>) -> Result<(), Option<u64>> {
    let mem = chain.memory();
    let mut r = Reader::new(mem, chain.clone()).map_err(|e| {
        log::warn!("vhost-user: a malformed request chain: {e}");
        None
    })?;
    let n = r.available_bytes();
    if n < IN_HEADER {
        log::warn!("vhost-user: a request of {n} bytes (no FUSE header)");
        return Err(None);
    }
    buf.clear();
    buf.resize(n.min(MAX_REQUEST), 0);
    r.read_exact(buf).map_err(|e| {
        log::warn!("vhost-user: reading a request: {e}");
        None
    })?;
    let h = InHeader::parse(buf).map_err(|_| None)?;
    let len = Args(buf).u32(0).map_err(|_| None)? as usize;
    if n > MAX_REQUEST || len < IN_HEADER || len > buf.len() {
        log::warn!(
            "vhost-user: a request of {n} bytes saying {len} (opcode {})",
            h.opcode
        );
        return Err(Some(h.unique));
    }
    buf.truncate(len);
    Ok(())
}

/// Serves one chain popped from `vring` (`hiprio`: the high-priority queue, FORGETs only).
pub fn serve(s: &Session, chain: Chain, vring: &Vring, hiprio: bool) {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let head = chain.head_index();
    BUF.with_borrow_mut(|buf| match read_request(&chain, buf) {
        Err(None) => unanswered(vring, head),
        Err(Some(unique)) => GuestReply::new(chain, vring.clone(), unique).error(Errno::EINVAL),
        Ok(()) => {
            let t = Instant::now();
            let opcode = InHeader::parse(buf).map_or(0, |h| h.opcode);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                request(s, chain, vring, buf, hiprio)
            }));
            s.stats.record(opcode, t);
            if r.is_err() {
                // The unwound reply answered EIO; the queue goes on.
                log::error!("vhost-user: a request handler panicked; answered EIO");
            }
        }
    })
}

/// Routes a request read into `buf` (header and arguments, `len` bytes).
fn request(s: &Session, chain: Chain, vring: &Vring, buf: &mut [u8], hiprio: bool) {
    let head = chain.head_index();
    let Ok(h) = InHeader::parse(buf) else {
        return unanswered(vring, head);
    };
    let args = &buf[IN_HEADER..];
    match h.opcode {
        op::FORGET => {
            if let Ok(n) = Args(args).u64(0) {
                s.core.shared.do_forget(h.nodeid, n);
            }
            unanswered(vring, head)
        }
        op::BATCH_FORGET => {
            forget_batch(&s.core, args);
            unanswered(vring, head)
        }
        // Not sent by Linux's virtio-fs; nothing to answer.
        op::INTERRUPT => unanswered(vring, head),
        _ if hiprio => {
            log::warn!("vhost-user: opcode {} on the high-priority queue", h.opcode);
            GuestReply::new(chain, vring.clone(), h.unique).error(Errno::EINVAL)
        }
        op::INIT => init(chain, vring, &h, args),
        _ => {
            // Guest pids are not host pids.
            buf[32..36].fill(0);
            let split = abi::op_in_len(h.opcode).min(buf.len() - IN_HEADER);
            let (head_and_op, payload) = buf.split_at(IN_HEADER + split);
            let mut d = dispatch::decode(
                &Incoming {
                    in_header: &head_and_op[..IN_HEADER],
                    op_in: &head_and_op[IN_HEADER..],
                    payload,
                },
                Acl::All,
            );
            let reply = GuestReply::new(chain, vring.clone(), h.unique);
            d.clamp(reply.room().min(MAX_REPLY as usize) as u32);
            dispatch::run(&s.core, &s.pool, d, reply)
        }
    }
}

/// BATCH_FORGET: `count` (u32) then that many `{nodeid, nlookup}`, as many as are there.
fn forget_batch(core: &Core, args: &[u8]) {
    let a = Args(args);
    let Ok(count) = a.u32(0) else { return };
    let entries = args.get(8..).unwrap_or_default();
    for e in entries.chunks_exact(16).take(count as usize) {
        let e = Args(e);
        if let (Ok(ino), Ok(n)) = (e.u64(0), e.u64(8)) {
            core.shared.do_forget(ino, n);
        }
    }
}

/// `FUSE_*` INIT flags offered when the guest offers them (as the `/dev/fuse` mount's
/// INIT does, without passthrough and io_uring, which a guest cannot use).
mod init_flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const INIT_EXT: u64 = 1 << 30;
}

/// The flags to answer INIT with, given the guest's.
pub fn init_reply_flags(guest: u64) -> u64 {
    use init_flags::*;
    let want = ASYNC_READ
        | ATOMIC_O_TRUNC
        | BIG_WRITES
        | AUTO_INVAL_DATA
        | DO_READDIRPLUS
        | READDIRPLUS_AUTO
        | PARALLEL_DIROPS
        | MAX_PAGES
        | CACHE_SYMLINKS
        | HANDLE_KILLPRIV_V2
        | INIT_EXT;
    guest & want
}

/// `sizeof(struct fuse_init_out)`.
pub const INIT_OUT: usize = 64;

/// The protocol minor version the daemon answers with at most.
const MINOR: u32 = 38;

/// Encodes `fuse_init_out` for a guest's `fuse_init_in` (`args`); `Err`: EPROTO or EINVAL.
pub fn init_out(args: &[u8]) -> Result<[u8; INIT_OUT], Errno> {
    let a = Args(args);
    let (major, minor) = match (a.u32(0), a.u32(4)) {
        (Ok(ma), Ok(mi)) => (ma, mi),
        _ => return Err(Errno::EINVAL),
    };
    if major != 7 || minor < 31 {
        log::warn!("vhost-user: the guest speaks FUSE {major}.{minor}; 7.31 or later is needed");
        return Err(Errno::EPROTO);
    }
    let readahead = a.u32(8).unwrap_or(0);
    let mut guest = u64::from(a.u32(12).unwrap_or(0));
    if guest & init_flags::INIT_EXT != 0 {
        guest |= u64::from(a.u32(16).unwrap_or(0)) << 32;
    }
    let flags = init_reply_flags(guest);
    let mut b = [0u8; INIT_OUT];
    let put32 = |b: &mut [u8; INIT_OUT], off: usize, v: u32| {
        b[off..off + 4].copy_from_slice(&v.to_ne_bytes())
    };
    put32(&mut b, 0, 7);
    put32(&mut b, 4, minor.min(MINOR));
    put32(&mut b, 8, readahead);
    put32(&mut b, 12, flags as u32);
    b[16..18].copy_from_slice(&64u16.to_ne_bytes()); // max_background
    b[18..20].copy_from_slice(&48u16.to_ne_bytes()); // congestion_threshold
    put32(&mut b, 20, MAX_WRITE as u32);
    put32(&mut b, 24, 1); // time_gran: nanoseconds
    b[28..30].copy_from_slice(&((MAX_WRITE / 4096) as u16).to_ne_bytes()); // max_pages
    put32(&mut b, 32, (flags >> 32) as u32);
    Ok(b)
}

fn init(chain: Chain, vring: &Vring, h: &InHeader, args: &[u8]) {
    let reply = GuestReply::new(chain, vring.clone(), h.unique);
    match init_out(args) {
        Ok(b) => {
            log::info!(
                "vhost-user: FUSE session started (guest protocol 7.{}, file I/O through the daemon)",
                Args(args).u32(4).unwrap_or(0)
            );
            reply.raw(&b)
        }
        Err(e) => reply.error(e),
    }
}
