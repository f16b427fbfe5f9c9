//! FUSE over io_uring (Linux 6.14+, `CONFIG_FUSE_IO_URING`): one queue per possible CPU,
//! as the kernel expects, each an io_uring with SQE128 entries owned by one thread. Every
//! ring entry is a pair of buffers registered with the kernel (`FUSE_IO_URING_CMD_REGISTER`);
//! the kernel copies a request into one, completes the command, and the thread decodes it
//! ([`super::dispatch`]), runs the operation and answers with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which hands the reply over and waits for the next
//! request in the same system call. FORGET and INTERRUPT still arrive on `/dev/fuse`
//! (served by fuser's loop); notifications are still written there.
//!
//! Invariants: an entry's buffers belong to exactly one party at a time — the kernel from
//! a submitted command until its completion, the queue thread from the completion to the
//! dispatch, then the [`RingReply`] until it answers (possibly on another thread: requests
//! held for an approver), then the queue thread again until it submits the commit. A reply
//! from another thread is queued and the queue thread woken through an eventfd; an idle
//! queue thread sleeps in `io_uring_enter` (no polling). This and `abi.rs` hold the
//! transport's `unsafe`, each with its reason.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, FopenFlags};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use parking_lot::Mutex;

use super::abi::{self, OUT_HEADER};
use crate::fs::reply::{
    AttrReply, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply, LseekReply,
    OpenReply, Reply, StatfsReply, WriteReply, XattrReply,
};

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `sizeof(struct fuse_uring_req_header)`: in_out (128), op_in (128), ent_in_out (32).
const HEADER: usize = 288;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
/// user_data of the eventfd read (entries use their index).
const WAKE: u64 = u64::MAX;

/// An entry's header buffer, aligned as the kernel's structs are.
#[repr(C, align(8))]
struct Header([u8; HEADER]);

/// One ring entry's header and the iovecs that register it with its payload.
struct Slot {
    header: UnsafeCell<Header>,
    iov: UnsafeCell<[libc::iovec; 2]>,
}

/// What a queue shares with the replies it handed out.
pub struct Queue {
    slots: Box<[Slot]>,
    /// Every entry's payload buffer, `payload` bytes each, in one anonymous mapping made
    /// without reserving memory: pages exist only once the kernel or a reply touches them.
    region: *mut u8,
    payload: usize,
    /// Entries answered, waiting for their commit.
    done: Mutex<Vec<u16>>,
    /// Wakes the queue thread when a reply comes from another thread.
    wake: OwnedFd,
    /// Where the kernel reads the eventfd's counter into.
    wake_buf: UnsafeCell<[u8; 8]>,
}

// SAFETY: the slots' cells and the region are only touched by whoever owns the entry at
// the time (see the module invariants); ownership moves with the completion, the
// `RingReply` value and the `done` list, all of which synchronise (io_uring, moves
// between threads, the mutex).
unsafe impl Sync for Queue {}
// SAFETY: as above; the raw pointers point into the queue's own, never-freed memory.
unsafe impl Send for Queue {}

thread_local! {
    /// The queue whose thread this is (replies on it need no wake-up).
    static OWN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Queue {
    /// A queue of `depth` entries with `payload` bytes each (none registered yet).
    fn new(depth: usize, payload: usize) -> io::Result<Queue> {
        let slots: Box<[Slot]> = (0..depth)
            .map(|_| Slot {
                header: UnsafeCell::new(Header([0; HEADER])),
                iov: UnsafeCell::new(
                    [libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    }; 2],
                ),
            })
            .collect();
        let len = depth
            .checked_mul(payload)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: a fresh private anonymous mapping; the result is checked. It is never
        // unmapped (the kernel may write into it until the connection is torn down).
        let region = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if region == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Queue {
            slots,
            region: region.cast(),
            payload,
            done: Mutex::new(Vec::new()),
            // SAFETY: a fresh descriptor nobody else owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            wake_buf: UnsafeCell::new([0; 8]),
        })
    }

    fn payload_ptr(&self, i: usize) -> *mut u8 {
        // In bounds: i < depth and the region holds depth * payload bytes.
        self.region.wrapping_add(i * self.payload)
    }

    /// The iovecs that register entry `i`.
    ///
    /// # Safety
    /// Entry `i` was never registered, and only the queue thread calls this.
    unsafe fn prepare(&self, i: usize) -> *const libc::iovec {
        let s = &self.slots[i];
        // SAFETY: nobody else can reach an unregistered entry. The buffers never move:
        // the header lives in the boxed slice, the payload in the never-unmapped region.
        unsafe {
            let iov = &mut *s.iov.get();
            iov[0] = libc::iovec {
                iov_base: (*s.header.get()).0.as_mut_ptr().cast(),
                iov_len: HEADER,
            };
            iov[1] = libc::iovec {
                iov_base: self.payload_ptr(i).cast(),
                iov_len: self.payload,
            };
            iov.as_ptr()
        }
    }

    /// The header and payload of entry `i`, to read.
    ///
    /// # Safety
    /// The caller owns entry `i` and nothing writes it while the slices are used.
    unsafe fn view(&self, i: u16) -> (&[u8; HEADER], &[u8]) {
        let s = &self.slots[i as usize];
        // SAFETY: by the caller's contract; the payload is `payload` bytes of the region.
        unsafe {
            (
                &(*s.header.get()).0,
                std::slice::from_raw_parts(self.payload_ptr(i as usize), self.payload),
            )
        }
    }

    /// The header and payload of entry `i`.
    ///
    /// # Safety
    /// The caller owns entry `i` (module invariants) for as long as it uses the slices.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bufs(&self, i: u16) -> (&mut [u8; HEADER], &mut [u8]) {
        let s = &self.slots[i as usize];
        // SAFETY: exclusive by the caller's contract; the payload is `payload` bytes of
        // the region.
        unsafe {
            (
                &mut (*s.header.get()).0,
                std::slice::from_raw_parts_mut(self.payload_ptr(i as usize), self.payload),
            )
        }
    }

    fn answered(&self, i: u16) {
        self.done.lock().push(i);
        if OWN.with(|o| o.get()) != self as *const Queue as usize {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            let _ = unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }
}

/// A request in ring entry `slot`, to be answered once (then committed by the queue
/// thread). Dropped unanswered, it answers EIO, as fuser's replies do.
pub struct RingReply {
    q: Arc<Queue>,
    slot: u16,
    unique: u64,
    sent: bool,
}

impl RingReply {
    /// The reply for the request now in `slot` (the caller hands over the entry).
    pub(super) fn new(q: Arc<Queue>, slot: u16, unique: u64) -> RingReply {
        RingReply {
            q,
            slot,
            unique,
            sent: false,
        }
    }

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
    fn ok(self) {
        let n = self.used;
        self.reply.finish(0, n)
    }
}

/// A request as the queue thread hands it to the dispatcher.
pub struct Incoming<'a> {
    /// `struct fuse_in_header` bytes.
    pub in_header: &'a [u8],
    /// The per-opcode argument struct.
    pub op_in: &'a [u8],
    /// Names, data: what follows the struct.
    pub payload: &'a [u8],
}

/// Ring sizes.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Entries per queue: requests one CPU can have with the daemon at once. A request
    /// held for an approver keeps its entry, and the kernel hands requests that found no
    /// free entry to the queue only when one is committed (registering more does not pick
    /// them up), so a queue must never have all its entries held: it gets room for every
    /// request the approvals table can hold, plus the ones that keep cycling.
    pub depth: usize,
    /// Payload buffer per entry (at least what the kernel computed from INIT).
    pub payload: usize,
}

fn build_ring(max: usize) -> io::Result<IoUring<squeue::Entry128, cqueue::Entry>> {
    // Room for a commit or a registration per entry, and the eventfd read.
    let entries = (max + 1).next_power_of_two().min(32768) as u32;
    // Task work (copying the next request into our buffer) runs when this thread enters
    // the kernel to wait, batched, not by interrupting it.
    IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(2 * entries)
        .dontfork()
        .build(entries)
        .or_else(|_| {
            IoUring::<squeue::Entry128, cqueue::Entry>::builder()
                .setup_cqsize(2 * entries)
                .dontfork()
                .build(entries)
        })
}

/// Pushes `e`, submitting first when the submission queue is full.
fn push(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    e: &squeue::Entry128,
) -> io::Result<()> {
    loop {
        // SAFETY: every entry pushed points only at memory of the never-freed queue (or
        // at nothing).
        if unsafe { ring.submission().push(e) }.is_ok() {
            return Ok(());
        }
        ring.submit()?;
    }
}

/// Sends the connection back to `/dev/fuse` after INIT offered io_uring but the queues
/// cannot all be served: a REGISTER the kernel must refuse (a queue id past the last)
/// makes it clear the connection's io_uring flag and wake the requests waiting for the
/// rings. Without this they would wait forever.
pub fn abandon(dev: &OwnedFd) -> io::Result<()> {
    let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2)?;
    let e = command(dev.as_raw_fd(), CMD_REGISTER, u16::MAX, 0, None).user_data(1);
    push(&mut ring, &e)?;
    ring.submit_and_wait(1)?;
    match ring.completion().next().map(|c| c.result()) {
        Some(r) if r < 0 => Ok(()),
        r => Err(io::Error::other(format!(
            "the kernel accepted an invalid REGISTER ({r:?})"
        ))),
    }
}

/// Checks, before mounting, that this process can create an SQE128 io_uring at all
/// (io_uring may be disabled by `kernel.io_uring_disabled` or a seccomp filter).
pub fn probe() -> io::Result<()> {
    build_ring(1).map(drop)
}

/// A `FUSE_IO_URING_CMD_*` command for queue `qid`: REGISTER carries the entry's iovecs.
fn command(
    dev: i32,
    cmd: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<*const libc::iovec>,
) -> squeue::Entry128 {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut b = opcode::UringCmd80::new(types::Fd(dev), cmd).cmd(c);
    if let Some(p) = iov {
        b = b.addr(Some(p as u64));
    }
    let e = b.build();
    if iov.is_none() {
        return e;
    }
    // The kernel wants sqe->len = 2 (header and payload iovecs); the builder has no
    // setter for it.
    // SAFETY: Entry128 is repr(C): a 64-byte io_uring_sqe followed by 64 bytes; `len` is
    // the u32 at byte 24 of io_uring_sqe. The transmute round-trips the same bytes.
    unsafe {
        let mut raw: [u8; 128] = std::mem::transmute(e);
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
    }
}

/// Runs queue `qid` on the calling thread until the connection ends: registers
/// `sizes.depth` entries, then serves requests: `decode` reads one out of its entry,
/// `run` answers it through the reply.
pub fn serve<R>(
    dev: OwnedFd,
    qid: u16,
    sizes: Sizes,
    registered: std::sync::mpsc::Sender<io::Result<()>>,
    decode: impl Fn(&Incoming<'_>) -> R,
    run: impl Fn(R, RingReply),
) -> io::Result<()> {
    let fail = |what: &str, e: io::Error| {
        let _ = registered.send(Err(io::Error::new(e.kind(), format!("{what}: {e}"))));
        e
    };
    let q = Arc::new(Queue::new(sizes.depth, sizes.payload).map_err(|e| fail("eventfd", e))?);
    // The kernel may hold pointers into the queue's buffers until the ring is torn down,
    // which can finish after this thread is gone: the buffers are never freed (one set
    // per queue per mount; the daemon exits when the connection ends).
    std::mem::forget(q.clone());
    let mut ring = build_ring(sizes.depth).map_err(|e| fail("io_uring_setup", e))?;
    OWN.with(|o| o.set(Arc::as_ptr(&q) as usize));
    let fd = dev.as_raw_fd();
    let wake_read = || -> squeue::Entry128 {
        opcode::Read::new(types::Fd(q.wake.as_raw_fd()), q.wake_buf.get().cast(), 8)
            .build()
            .user_data(WAKE)
            .into()
    };
    for i in 0..sizes.depth {
        // SAFETY: entry `i` was never registered; this is the queue thread.
        let iov = unsafe { q.prepare(i) };
        let e = command(fd, CMD_REGISTER, qid, 0, Some(iov)).user_data(i as u64);
        push(&mut ring, &e).map_err(|e| fail("register", e))?;
    }
    // Entries still alive (not ended by the connection going away).
    let mut live = sizes.depth;
    push(&mut ring, &wake_read()).map_err(|e| fail("register", e))?;
    ring.submit().map_err(|e| fail("io_uring_enter", e))?;
    // A registration completes only with a request or an error; errors show at once.
    let mut ready: Vec<u16> = Vec::with_capacity(sizes.depth);
    let mut first_error = None;
    let mut rearm = false;
    for c in ring.completion() {
        if c.user_data() == WAKE {
            rearm = true;
            continue;
        }
        if c.result() < 0 {
            first_error.get_or_insert(io::Error::from_raw_os_error(-c.result()));
            live -= 1;
        } else {
            ready.push(c.user_data() as u16);
        }
    }
    match first_error {
        // Nothing registered: the kernel went back to /dev/fuse (a failed REGISTER does
        // that) unless every queue got an entry.
        Some(e) if live == 0 => return Err(fail("FUSE_IO_URING_CMD_REGISTER", e)),
        // Some entries are in: the kernel may route this CPU's requests here, so serve
        // them with what there is.
        Some(e) => log::warn!(
            "io_uring queue {qid}: {live} of {} entries registered ({e})",
            sizes.depth
        ),
        None => {}
    }
    let _ = registered.send(Ok(()));
    loop {
        for &i in &ready {
            let req = {
                // SAFETY: a completed fetch hands the entry to this thread; it is only read
                // here, and the borrow ends with `decode`, before the reply takes the entry.
                let (h, p) = unsafe { q.view(i) };
                let payload_sz = u32::from_ne_bytes(
                    h[ENT_IN_OUT + 16..ENT_IN_OUT + 20]
                        .try_into()
                        .unwrap_or_default(),
                ) as usize;
                decode(&Incoming {
                    in_header: &h[..abi::IN_HEADER],
                    op_in: &h[128..128 + OP_IN],
                    payload: &p[..payload_sz.min(p.len())],
                })
            };
            // SAFETY: as above (read only, no reply exists yet).
            let head = unsafe { q.view(i) }.0;
            let unique = u64::from_ne_bytes(head[8..16].try_into().unwrap_or_default());
            let reply = RingReply::new(q.clone(), i, unique);
            // A panic in a handler must not end the queue (every later request of this
            // CPU would wait forever): the unwound reply answers EIO, the queue goes on.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(req, reply)));
            if r.is_err() {
                log::error!("io_uring queue {qid}: a request handler panicked; answered EIO");
            }
        }
        ready.clear();
        if rearm {
            rearm = false;
            push(&mut ring, &wake_read())?;
        }
        // Commit what was answered (here or on other threads).
        let answered = std::mem::take(&mut *q.done.lock());
        for &i in &answered {
            // SAFETY: answered entries are the queue thread's again.
            let head = unsafe { q.view(i) }.0;
            let unique = u64::from_ne_bytes(head[8..16].try_into().unwrap_or_default());
            push(
                &mut ring,
                &command(fd, CMD_COMMIT_AND_FETCH, qid, unique, None).user_data(i as u64),
            )?;
        }
        if live == 0 {
            return Ok(());
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
        for c in ring.completion() {
            let ud = c.user_data();
            if ud == WAKE {
                rearm = true;
                continue;
            }
            let i = ud as u16;
            if c.result() < 0 {
                // ENOTCONN/ECONNABORTED: the connection is going away; the entry is gone.
                let e = -c.result();
                if e != libc::ENOTCONN && e != libc::ECONNABORTED && e != libc::ENODEV {
                    log::warn!(
                        "io_uring queue {qid}: entry {i}: {}",
                        io::Error::from_raw_os_error(e)
                    );
                }
                live -= 1;
                continue;
            }
            ready.push(i);
        }
    }
}
