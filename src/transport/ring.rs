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
//! queue thread sleeps in `io_uring_enter` (no polling; one wait of at most a second after
//! a burst, to give pages back). Payload pages of idle entries are given back past a
//! budget ([`super::pages`]), only between taking every completion off the ring and the
//! next `io_uring_enter`, on a ring with deferred task work, so never while the kernel
//! may be copying a request in. This and `reply.rs` hold the transport's `unsafe`, each
//! with its reason (`abi.rs` has none).
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use parking_lot::Mutex;

use super::abi;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `sizeof(struct fuse_uring_req_header)`: in_out (128), op_in (128), ent_in_out (32).
const HEADER: usize = 288;
const OP_IN: usize = 128;
pub(super) const ENT_IN_OUT: usize = 256;
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

/// A request in ring entry `slot`, to be answered once (then committed by the queue
/// thread). Dropped unanswered, it answers EIO, as fuser's replies do. Answering is in
/// `reply.rs`.
pub struct RingReply {
    pub(super) q: Arc<Queue>,
    pub(super) slot: u16,
    pub(super) unique: u64,
    pub(super) sent: bool,
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
    pub(super) unsafe fn bufs(&self, i: u16) -> (&mut [u8; HEADER], &mut [u8]) {
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

    /// Gives back the pages of the entries in `back` (entry, bytes from its start), in as
    /// few `madvise` calls as the entries' order allows.
    ///
    /// # Safety
    /// The kernel holds every entry in `back` idle and cannot copy a request into it
    /// before this returns (see [`super::pages`]), and no reply owns it.
    unsafe fn give_back(&self, back: &mut [(u16, usize)]) {
        back.sort_unstable_by_key(|&(i, _)| i);
        let mut run: Option<(usize, usize)> = None;
        let flush = |(start, end): (usize, usize)| {
            // SAFETY: [start, end) lies within the region (entries < depth, bytes <=
            // payload), page-aligned (the region is, and `payload` is a page multiple);
            // by the caller's contract nobody reads or writes these pages now, and
            // MADV_DONTNEED leaves them mapped, reading as zeros.
            let r = unsafe {
                libc::madvise(
                    self.region.wrapping_add(start).cast(),
                    end - start,
                    libc::MADV_DONTNEED,
                )
            };
            if r != 0 {
                log::debug!("madvise: {}", io::Error::last_os_error());
            }
        };
        for &(i, n) in back.iter() {
            let start = i as usize * self.payload;
            run = match run {
                Some((s, e)) if e == start => Some((s, start + n)),
                Some(r) => {
                    flush(r);
                    Some((start, start + n))
                }
                None => Some((start, start + n)),
            };
            // Only a whole entry joins the next one.
            if n < self.payload
                && let Some(r) = run.take()
            {
                flush(r);
            }
        }
        if let Some(r) = run {
            flush(r);
        }
    }

    /// The read of the wake-up eventfd's counter.
    fn wake_read(&self) -> squeue::Entry128 {
        opcode::Read::new(
            types::Fd(self.wake.as_raw_fd()),
            self.wake_buf.get().cast(),
            8,
        )
        .build()
        .user_data(WAKE)
        .into()
    }

    pub(super) fn answered(&self, i: u16) {
        self.done.lock().push(i);
        if OWN.with(|o| o.get()) != self as *const Queue as usize {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd.
            let _ = unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
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
    /// request the approvals table can hold and for one uid's slow requests waiting for a
    /// worker (`pool.rs`), plus the ones that keep cycling.
    pub depth: usize,
    /// Payload buffer per entry (at least what the kernel computed from INIT).
    pub payload: usize,
}

/// A ring with room for `max` entries' commands; `true` when its task work runs only when
/// the owning thread enters the kernel to wait (`IORING_SETUP_DEFER_TASKRUN`), which giving
/// idle entries' pages back relies on ([`super::pages`]).
fn build_ring(max: usize) -> io::Result<(Ring, bool)> {
    // Room for a commit or a registration per entry, and the eventfd read.
    let entries = (max + 1).next_power_of_two().min(32768) as u32;
    // Task work (copying the next request into our buffer) runs when this thread enters
    // the kernel to wait, batched, not by interrupting it.
    match Ring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(2 * entries)
        .dontfork()
        .build(entries)
    {
        Ok(r) => Ok((r, true)),
        Err(_) => Ring::builder()
            .setup_cqsize(2 * entries)
            .dontfork()
            .build(entries)
            .map(|r| (r, false)),
    }
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

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Completions sorted: requests to serve, entries ended, the wake read done, the first
/// error.
#[derive(Default)]
struct Reaped {
    ready: Vec<u16>,
    ended: usize,
    woken: bool,
    error: Option<io::Error>,
}

/// Takes every completion off the ring into `r` (emptied first; its buffer is kept, so a
/// queue's loop allocates nothing per wake-up).
fn reap_into(ring: &mut Ring, qid: u16, r: &mut Reaped) {
    r.ready.clear();
    r.ended = 0;
    r.woken = false;
    r.error = None;
    for c in ring.completion() {
        if c.user_data() == WAKE {
            r.woken = true;
            continue;
        }
        let i = c.user_data() as u16;
        if c.result() >= 0 {
            r.ready.push(i);
            continue;
        }
        // ENOTCONN/ECONNABORTED/ENODEV: the connection is going away; the entry is gone.
        // ENOENT: the kernel no longer waited for the request committed (it was ended
        // while the daemon worked on it): normal, debug-level like fuser's equivalent.
        let e = -c.result();
        let err = io::Error::from_raw_os_error(e);
        if e == libc::ENOENT {
            log::debug!("io_uring queue {qid}: entry {i}: {err}");
        } else if ![libc::ENOTCONN, libc::ECONNABORTED, libc::ENODEV].contains(&e) {
            log::warn!("io_uring queue {qid}: entry {i}: {err}");
        }
        r.error.get_or_insert(io::Error::from_raw_os_error(e));
        r.ended += 1;
    }
}

/// The unique id of the request (or reply) in entry `i`'s header.
fn unique_of(q: &Queue, i: u16) -> u64 {
    // SAFETY: the caller owns entry `i` (fetched, or answered and not yet committed).
    let head = unsafe { q.view(i) }.0;
    u64::from_ne_bytes(head[8..16].try_into().unwrap_or_default())
}

/// Requests served between two commits: the replies of a burst are handed back (and their
/// pages can be given back) a few at a time, not after the whole burst.
const CHUNK: usize = 16;
/// A queue that waited this long without a request keeps only `pages::LOW`.
const REST: std::time::Duration = std::time::Duration::from_secs(1);

/// The payload bytes of the request in entry `i` (the kernel's `ent_in_out.payload_sz`).
fn payload_sz(q: &Queue, i: u16) -> usize {
    // SAFETY: the caller owns entry `i` (fetched, or answered and not yet committed).
    let h = unsafe { q.view(i) }.0;
    u32::from_ne_bytes(
        h[ENT_IN_OUT + 16..ENT_IN_OUT + 20]
            .try_into()
            .unwrap_or_default(),
    ) as usize
}

/// Decodes the request in entry `i` and runs it; the reply owns the entry from here.
fn serve_one<R>(
    q: &Arc<Queue>,
    qid: u16,
    i: u16,
    decode: &impl Fn(&Incoming<'_>) -> R,
    run: &impl Fn(R, RingReply),
) {
    let req = {
        let n = payload_sz(q, i);
        // SAFETY: a completed fetch hands the entry to this thread; it is only read
        // here, and the borrow ends with `decode`, before the reply takes the entry.
        let (h, p) = unsafe { q.view(i) };
        decode(&Incoming {
            in_header: &h[..abi::IN_HEADER],
            op_in: &h[128..128 + OP_IN],
            payload: &p[..n.min(p.len())],
        })
    };
    let reply = RingReply::new(q.clone(), i, unique_of(q, i));
    // A panic in a handler must not end the queue (every later request of this CPU
    // would wait forever): the unwound reply answers EIO, the queue goes on.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(req, reply)));
    if r.is_err() {
        log::error!("io_uring queue {qid}: a request handler panicked; answered EIO");
    }
}

/// Registers entries `0..depth` of `q` with queue `qid` and starts the eventfd read.
fn register(ring: &mut Ring, q: &Queue, fd: i32, qid: u16, depth: usize) -> io::Result<()> {
    for i in 0..depth {
        // SAFETY: entry `i` was never registered; this is the queue thread.
        let iov = unsafe { q.prepare(i) };
        let e = command(fd, CMD_REGISTER, qid, 0, Some(iov)).user_data(i as u64);
        push(ring, &e)?;
    }
    push(ring, &q.wake_read())?;
    ring.submit().map(drop)
}

/// Gives back what is past the queue's budget (after a rest: past `pages::LOW`). Called
/// between taking every completion off the ring and the next `io_uring_enter`, on a ring
/// with deferred task work.
fn give_back_idle(ring: &mut Ring, q: &Queue, pages: &mut super::pages::Pages, rested: bool) {
    // A command not yet submitted (an interrupted submit) may be a commit whose reply
    // is still to be read from its entry: then wait for the next round.
    if !ring.submission().is_empty() {
        return;
    }
    let mut back = pages.reclaim(rested);
    if !back.is_empty() {
        // SAFETY: `reclaim` names only entries the kernel holds idle: committed (and
        // submitted: the queue is empty), and not handed back with a request at the last
        // reap, which took every completion; with deferred task work nothing is copied
        // into them before this thread's next `io_uring_enter`. The entries in service are
        // not idle.
        unsafe { q.give_back(&mut back) };
    }
}

/// Submits what was pushed and, if `wait`, waits for a completion — at most [`REST`] if
/// `timed`. `Ok(true)`: that wait ended without one.
fn enter(ring: &mut Ring, wait: bool, timed: bool) -> io::Result<bool> {
    let want = usize::from(wait);
    let r = if wait && timed {
        let ts = types::Timespec::new().sec(REST.as_secs());
        ring.submitter()
            .submit_with_args(want, &types::SubmitArgs::new().timespec(&ts))
    } else {
        ring.submit_and_wait(want)
    };
    match r {
        Ok(_) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(true),
        Err(e) if [Some(libc::EINTR), Some(libc::EBUSY)].contains(&e.raw_os_error()) => Ok(false),
        Err(e) => Err(e),
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
    let (mut ring, deferred) = build_ring(sizes.depth).map_err(|e| fail("io_uring_setup", e))?;
    OWN.with(|o| o.set(Arc::as_ptr(&q) as usize));
    let fd = dev.as_raw_fd();
    register(&mut ring, &q, fd, qid, sizes.depth).map_err(|e| fail("register", e))?;
    // A registration completes only with a request or an error; errors show at once.
    let mut got = Reaped::default();
    reap_into(&mut ring, qid, &mut got);
    // Entries still alive (not ended by the connection going away).
    let mut live = sizes.depth - got.ended;
    match got.error.take() {
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
    let mut pages = super::pages::Pages::new(
        sizes.depth,
        sizes.payload,
        super::pages::HIGH,
        super::pages::LOW,
    );
    let mut ready = std::collections::VecDeque::new();
    let mut answered: Vec<u16> = Vec::new();
    // The last wait ended after `REST` without a request; and whether the next may be
    // timed (not again after a rest, until a request comes: what stays resident then is
    // in entries the daemon holds).
    let (mut rested, mut may_rest) = (false, true);
    loop {
        may_rest |= !got.ready.is_empty();
        for &i in &got.ready {
            pages.fetched(i, payload_sz(&q, i));
        }
        ready.extend(got.ready.drain(..));
        for _ in 0..CHUNK {
            let Some(i) = ready.pop_front() else { break };
            serve_one(&q, qid, i, &decode, &run);
        }
        if deferred {
            give_back_idle(&mut ring, &q, &mut pages, rested);
        }
        if got.woken {
            push(&mut ring, &q.wake_read())?;
        }
        // Commit what was answered (here or on other threads). The two lists swap
        // buffers: neither is allocated again once grown.
        answered.clear();
        std::mem::swap(&mut answered, &mut *q.done.lock());
        for &i in &answered {
            pages.committed(i, payload_sz(&q, i));
            let commit = command(fd, CMD_COMMIT_AND_FETCH, qid, unique_of(&q, i), None);
            push(&mut ring, &commit.user_data(i as u64))?;
        }
        if live == 0 {
            return Ok(());
        }
        // With requests still to serve, only hand the commits over; otherwise wait — for
        // at most a second while there are pages to give back once the queue rests.
        may_rest &= !rested;
        let timed = may_rest && deferred && pages.resident() > super::pages::LOW;
        rested = enter(&mut ring, ready.is_empty(), timed)?;
        reap_into(&mut ring, qid, &mut got);
        live -= got.ended.min(live);
    }
}
