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
//! Invariants: bounded — at most [`WORKERS`] threads, [`BACKLOG`] waiting jobs in all and
//! [`PER_UID_BACKLOG`] of one uid; past either bound the queue thread runs the job itself
//! (back-pressure, never an unbounded queue, and nothing waits on a worker that cannot
//! come: no deadlock); every job is run exactly once.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// Worker threads.
pub const WORKERS: usize = 4;
/// Jobs waiting for a worker, in all, before the queue threads run them themselves.
pub const BACKLOG: usize = 64;
/// Jobs of one uid waiting for a worker before that uid's jobs run on the queue thread.
pub const PER_UID_BACKLOG: usize = 16;
/// Workers one uid may hold at once: the others stay free for the other uids.
pub const PER_UID_RUNNING: usize = WORKERS - 1;

type Job = Box<dyn FnOnce() + Send>;

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
    /// Waiting jobs in all.
    waiting: usize,
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

    /// Runs `job` (a request of `uid`) on a worker, or here when its uid's backlog or the
    /// whole backlog is full.
    pub fn run(&self, uid: u32, job: impl FnOnce() + Send + 'static) {
        {
            let mut st = self.inner.state.lock();
            let State {
                uids,
                turn,
                waiting,
                ..
            } = &mut *st;
            let q = uids.entry(uid).or_default();
            if *waiting < BACKLOG && q.jobs.len() < PER_UID_BACKLOG {
                if q.jobs.is_empty() {
                    turn.push_back(uid);
                }
                q.jobs.push_back(Box::new(job));
                *waiting += 1;
                drop(st);
                self.inner.cv.notify_one();
                return;
            }
            if q.jobs.is_empty() && q.running == 0 {
                uids.remove(&uid);
            }
        }
        job()
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
    st.waiting -= 1;
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
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
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
            pool.run(u, move || {
                b.fetch_add(1, Ordering::SeqCst);
                g.wait();
            });
        }
        while busy.load(Ordering::SeqCst) < uids.len() {
            std::thread::yield_now();
        }
        gate
    }

    /// Submits `n` jobs of `uid`; gives how many ran on this thread.
    fn submit(pool: &Pool, uid: u32, n: usize, done: &Arc<AtomicUsize>) -> usize {
        let here = std::thread::current().id();
        let inline = Arc::new(AtomicUsize::new(0));
        for _ in 0..n {
            let (d, r) = (done.clone(), inline.clone());
            pool.run(uid, move || {
                if std::thread::current().id() == here {
                    r.fetch_add(1, Ordering::SeqCst);
                }
                d.fetch_add(1, Ordering::SeqCst);
            });
        }
        inline.load(Ordering::SeqCst)
    }

    fn wait_for(done: &AtomicUsize, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while done.load(Ordering::SeqCst) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(done.load(Ordering::SeqCst), n);
    }

    #[test]
    fn slow_jobs_do_not_hold_the_caller_and_a_full_backlog_runs_inline() {
        let pool = Pool::start().unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let gate = occupy(&pool, &[100, 101, 102, 103]);
        let t = Instant::now();
        // BACKLOG + 3 jobs over 8 uids (none past its own bound): the backlog takes
        // BACKLOG, the rest run on the calling thread.
        let mut inline = 0;
        for i in 0..BACKLOG + 3 {
            inline += submit(&pool, (i % 8) as u32, 1, &done);
        }
        assert!(t.elapsed() < Duration::from_secs(1), "the caller was held");
        assert_eq!(inline, 3);
        gate.wait();
        wait_for(&done, BACKLOG + 3);
    }

    #[test]
    fn one_uid_past_its_backlog_runs_inline() {
        let pool = Pool::start().unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let gate = occupy(&pool, &[100, 101, 102, 103]);
        assert_eq!(submit(&pool, 7, PER_UID_BACKLOG + 2, &done), 2);
        // Another uid still gets the backlog.
        assert_eq!(submit(&pool, 8, 1, &done), 0);
        gate.wait();
        wait_for(&done, PER_UID_BACKLOG + 3);
    }

    #[test]
    fn one_uid_with_many_long_jobs_leaves_a_worker_to_the_others() {
        let pool = Pool::start().unwrap();
        // uid 1000 fills what it may hold, and queues more behind.
        let gate = Arc::new(std::sync::Barrier::new(PER_UID_RUNNING + 1));
        let started = Arc::new(AtomicUsize::new(0));
        for _ in 0..PER_UID_RUNNING + 10 {
            let (g, s) = (gate.clone(), started.clone());
            pool.run(1000, move || {
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
        pool.run(1001, move || tx.send(()).unwrap());
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
