//! A few worker threads for the requests that can take long on the host (fsync,
//! fallocate, copy_file_range, copy-ups, data through the daemon): an io_uring queue
//! thread serves one request at a time, so one such call would stall every other request
//! of its CPU. The queue thread hands them here and goes on; the worker answers through
//! the ring entry's reply, which wakes the queue thread to commit it.
//!
//! Fair per caller uid: each uid has its own queue, the workers serve the uids with work
//! round-robin, and one uid runs at most [`PER_UID_RUNNING`] jobs at once — so one uid
//! opening many big files for writing (a copy-up each) leaves a worker to everyone else's
//! renames and setattrs, which wait behind at most one job per other uid.
//!
//! A uid past its share waits for it: its job joins its own queue, and the request waits
//! there holding its ring entry, never the queue thread (a queue thread serves every
//! request of its CPU: running one uid's copy-up or fsync on it would stall every other
//! uid's request there — the inline fallback this pool once had). What bounds the waiting
//! is what the kernel lets a queue hold: a request is in the daemon only while it has a
//! ring entry, and each queue has a fixed number of them ([`super::ring::Sizes::depth`]),
//! [`RING_ROOM`] of them besides the rest for one uid's slow requests waiting: a uid with
//! more in flight on one CPU at once takes entries the others' requests would have had,
//! and those then wait in the kernel for one, served in turn as the workers finish (no
//! thread of the daemon waits). Slow requests are never refused for being many (an fsync
//! answered `EAGAIN` is data lost to a database): only past [`PER_UID_HELD`] held jobs of
//! one uid — a bound on the memory the jobs take, which a program's own threads, each
//! blocked in its call, do not reach — is a request answered `EAGAIN` ([`Turn::Busy`]).
//!
//! Invariants: at most [`WORKERS`] threads; at most [`PER_UID_HELD`] jobs of one uid held;
//! no job ever runs on the thread that hands it over (the caller never waits for a disk);
//! nothing waits on a job that has not started (a job waits at most on one running, a
//! copy-up's leader: no deadlock); every job is called exactly once, to run or to refuse.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// Worker threads.
pub const WORKERS: usize = 4;
/// Jobs of one uid held at once (waiting for a worker and running), all queues together;
/// past it its requests are refused with `EAGAIN`: a memory bound (a job is a few hundred
/// bytes), far past what a program's threads have in flight.
pub const PER_UID_HELD: usize = 65_536;
/// Ring entries each queue has, besides the rest, for one uid's slow requests waiting for
/// a worker ([`super::sizes`]).
pub const RING_ROOM: usize = 256;
/// Workers one uid may hold at once: the others stay free for the other uids.
pub const PER_UID_RUNNING: usize = WORKERS - 1;

/// What a job is called with: run it (on a worker), or answer it busy (`EAGAIN`, on the
/// caller's thread: its uid holds [`PER_UID_HELD`] jobs already).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Do the work.
    Run,
    /// Answer `EAGAIN` without doing it.
    Busy,
}

type Job = Box<dyn FnOnce(Turn) + Send>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    running: usize,
}

#[derive(Default)]
struct State {
    /// Per uid: its waiting jobs and how many of its jobs run.
    uids: HashMap<u32, Queue>,
    /// The uids with waiting jobs, in the order they are served (each once).
    turn: VecDeque<u32>,
    closed: bool,
}

struct Inner {
    state: Mutex<State>,
    cv: Condvar,
}

/// The workers' inbox.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
    /// The last clone's drop lets the workers end once the queues are empty.
    _close: Arc<Closer>,
}

struct Closer(Arc<Inner>);

impl Drop for Closer {
    fn drop(&mut self) {
        self.0.state.lock().closed = true;
        self.0.cv.notify_all();
    }
}

impl Pool {
    /// Starts the workers.
    pub fn start() -> std::io::Result<Pool> {
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        for i in 0..WORKERS {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name(format!("fencefs-slow{i}"))
                .spawn(move || work(&inner))?;
        }
        Ok(Pool {
            _close: Arc::new(Closer(inner.clone())),
            inner,
        })
    }

    /// Queues `job` (a request of `uid`) for a worker: it is called with [`Turn::Run`]
    /// there, in its uid's turn. When `uid` holds [`PER_UID_HELD`] jobs already it is
    /// called here at once with [`Turn::Busy`] instead. Never runs the work here.
    pub fn run(&self, uid: u32, job: impl FnOnce(Turn) + Send + 'static) {
        {
            let mut st = self.inner.state.lock();
            let State { uids, turn, .. } = &mut *st;
            let q = uids.entry(uid).or_default();
            if q.jobs.len() + q.running < PER_UID_HELD {
                if q.jobs.is_empty() {
                    turn.push_back(uid);
                }
                q.jobs.push_back(Box::new(job));
                drop(st);
                self.inner.cv.notify_one();
                return;
            }
        }
        log::debug!("slow requests of uid {uid}: {PER_UID_HELD} held already; answered EAGAIN");
        job(Turn::Busy)
    }
}

/// The next job: the first uid in turn that may run one more, which goes to the back of
/// the turn if it has more waiting.
fn next(st: &mut State) -> Option<(u32, Job)> {
    let pos = st
        .turn
        .iter()
        .position(|u| st.uids.get(u).is_some_and(|q| q.running < PER_UID_RUNNING))?;
    let uid = st.turn.remove(pos)?;
    let q = st.uids.get_mut(&uid)?;
    let job = q.jobs.pop_front()?;
    q.running += 1;
    if !q.jobs.is_empty() {
        st.turn.push_back(uid);
    }
    Some((uid, job))
}

fn work(inner: &Inner) {
    loop {
        let (uid, job) = {
            let mut st = inner.state.lock();
            loop {
                if let Some(j) = next(&mut st) {
                    break j;
                }
                if st.closed {
                    return;
                }
                inner.cv.wait(&mut st);
            }
        };
        // A panicking job answers EIO as its reply unwinds; the worker goes on.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(Turn::Run))).is_err() {
            log::error!("a request handler panicked on a worker; answered EIO");
        }
        let mut st = inner.state.lock();
        if let Some(q) = st.uids.get_mut(&uid) {
            q.running -= 1;
            if q.running == 0 && q.jobs.is_empty() {
                st.uids.remove(&uid);
            }
        }
        drop(st);
        // A job of this uid held back by its running bound may go now.
        inner.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;
    use std::time::{Duration, Instant};

    /// Occupies one worker per uid of `uids` until the returned barrier is passed.
    fn occupy(pool: &Pool, uids: &[u32]) -> Arc<std::sync::Barrier> {
        let gate = Arc::new(std::sync::Barrier::new(uids.len() + 1));
        let busy = Arc::new(AtomicUsize::new(0));
        for &u in uids {
            let (g, b) = (gate.clone(), busy.clone());
            pool.run(u, move |_| {
                b.fetch_add(1, Ordering::SeqCst);
                g.wait();
            });
        }
        while busy.load(Ordering::SeqCst) < uids.len() {
            std::thread::yield_now();
        }
        gate
    }

    /// How `n` jobs of `uid` went: (run on this thread, refused busy).
    #[derive(Default)]
    struct Went {
        here: AtomicUsize,
        busy: AtomicUsize,
    }

    /// Submits `n` jobs of `uid` (each counted in `done` when called).
    fn submit(pool: &Pool, uid: u32, n: usize, done: &Arc<AtomicUsize>) -> Arc<Went> {
        let here = std::thread::current().id();
        let went = Arc::new(Went::default());
        for _ in 0..n {
            let (d, w) = (done.clone(), went.clone());
            pool.run(uid, move |turn| {
                if turn == Turn::Run && std::thread::current().id() == here {
                    w.here.fetch_add(1, Ordering::SeqCst);
                }
                if turn == Turn::Busy {
                    w.busy.fetch_add(1, Ordering::SeqCst);
                }
                d.fetch_add(1, Ordering::SeqCst);
            });
        }
        went
    }

    fn wait_for(done: &AtomicUsize, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while done.load(Ordering::SeqCst) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(done.load(Ordering::SeqCst), n);
    }

    #[test]
    fn no_job_runs_on_the_callers_thread_however_many_wait() {
        let pool = Pool::start().unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let gate = occupy(&pool, &[100, 101, 102, 103]);
        let t = Instant::now();
        // Many jobs over 8 uids, every worker busy: all wait for one, none runs here.
        let mut went = Vec::new();
        for i in 0..200 {
            went.push(submit(&pool, (i % 8) as u32, 1, &done));
        }
        assert!(t.elapsed() < Duration::from_secs(1), "the caller was held");
        for w in &went {
            assert_eq!(
                w.here.load(Ordering::SeqCst),
                0,
                "a job ran on the caller's thread"
            );
            assert_eq!(w.busy.load(Ordering::SeqCst), 0, "a job was refused");
        }
        gate.wait();
        wait_for(&done, 200);
        assert!(went.iter().all(|w| w.here.load(Ordering::SeqCst) == 0));
    }

    #[test]
    fn one_uid_past_its_share_waits_in_its_queue_and_past_its_bound_is_refused() {
        let pool = Pool::start().unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        // uid 7 holds the workers it may (and one more uid holds the last).
        let gate = occupy(&pool, &[7, 7, 7, 8]);
        let t = Instant::now();
        // Far past the old inline bound: they wait, then the rest is refused, none here.
        let w = submit(&pool, 7, PER_UID_HELD + 5, &done);
        assert!(t.elapsed() < Duration::from_secs(1), "the caller was held");
        assert_eq!(
            w.here.load(Ordering::SeqCst),
            0,
            "a job ran on the caller's thread"
        );
        // The three running count: PER_UID_HELD - 3 wait, the other 8 are refused.
        assert_eq!(w.busy.load(Ordering::SeqCst), PER_UID_RUNNING + 5);
        // Another uid is not refused.
        let other = submit(&pool, 9, 1, &done);
        assert_eq!(other.busy.load(Ordering::SeqCst), 0);
        gate.wait();
        wait_for(&done, PER_UID_HELD + 5 + 1);
        assert_eq!(w.here.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_flood_past_one_uids_share_does_not_delay_anothers_job() {
        let pool = Pool::start().unwrap();
        // uid 1000 floods with long jobs, far past its running share.
        let gate = Arc::new(std::sync::Barrier::new(PER_UID_RUNNING + 1));
        let started = Arc::new(AtomicUsize::new(0));
        let t = Instant::now();
        for _ in 0..PER_UID_RUNNING + 100 {
            let (g, s) = (gate.clone(), started.clone());
            pool.run(1000, move |turn| {
                assert_eq!(turn, Turn::Run);
                if s.fetch_add(1, Ordering::SeqCst) < PER_UID_RUNNING {
                    g.wait();
                }
            });
        }
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "the flood held the caller"
        );
        // uid 1001's job runs on the free worker at once.
        let (tx, rx) = channel();
        let t = Instant::now();
        pool.run(1001, move |_| tx.send(()).unwrap());
        rx.recv_timeout(Duration::from_secs(2))
            .expect("uid 1001's job ran while uid 1000's flood waited");
        assert!(t.elapsed() < Duration::from_millis(500));
        gate.wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        while started.load(Ordering::SeqCst) < PER_UID_RUNNING + 100 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(started.load(Ordering::SeqCst), PER_UID_RUNNING + 100);
    }

    #[test]
    fn one_uid_with_many_long_jobs_leaves_a_worker_to_the_others() {
        let pool = Pool::start().unwrap();
        // uid 1000 fills what it may hold, and queues more behind.
        let gate = Arc::new(std::sync::Barrier::new(PER_UID_RUNNING + 1));
        let started = Arc::new(AtomicUsize::new(0));
        for _ in 0..PER_UID_RUNNING + 10 {
            let (g, s) = (gate.clone(), started.clone());
            pool.run(1000, move |_| {
                if s.fetch_add(1, Ordering::SeqCst) < PER_UID_RUNNING {
                    g.wait();
                }
            });
        }
        // Its jobs hold their workers.
        let deadline = Instant::now() + Duration::from_secs(5);
        while started.load(Ordering::SeqCst) < PER_UID_RUNNING && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        // The last worker took none of the ones queued behind them.
        assert_eq!(started.load(Ordering::SeqCst), PER_UID_RUNNING);
        let (tx, rx) = channel();
        pool.run(1001, move |_| tx.send(()).unwrap());
        rx.recv_timeout(Duration::from_secs(2))
            .expect("uid 1001's job ran while uid 1000's held their workers");
        assert_eq!(started.load(Ordering::SeqCst), PER_UID_RUNNING);
        gate.wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        while started.load(Ordering::SeqCst) < PER_UID_RUNNING + 10 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(started.load(Ordering::SeqCst), PER_UID_RUNNING + 10);
    }
}
