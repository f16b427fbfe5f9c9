//! A few worker threads for the requests that can take long on the host (fsync,
//! fallocate, copy_file_range, data through the daemon): an io_uring queue thread serves
//! one request at a time, so one such call would stall every other request of its CPU.
//! The queue thread hands them here and goes on; the worker answers through the ring
//! entry's reply, which wakes the queue thread to commit it.
//!
//! Invariants: bounded — at most [`WORKERS`] threads and [`BACKLOG`] waiting jobs; when
//! the backlog is full the queue thread runs the job itself (back-pressure, never an
//! unbounded queue); every job is run exactly once.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use parking_lot::Mutex;

/// Worker threads.
pub const WORKERS: usize = 4;
/// Jobs waiting for a worker before the queue threads run them themselves.
pub const BACKLOG: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

/// The workers' inbox.
#[derive(Clone)]
pub struct Pool {
    tx: SyncSender<Job>,
}

impl Pool {
    /// Starts the workers.
    pub fn start() -> std::io::Result<Pool> {
        let (tx, rx) = sync_channel::<Job>(BACKLOG);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..WORKERS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("fencefs-slow{i}"))
                .spawn(move || work(&rx))?;
        }
        Ok(Pool { tx })
    }

    /// Runs `job` on a worker, or here when all are busy and the backlog is full.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        match self.tx.try_send(Box::new(job)) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => job(),
        }
    }
}

fn work(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = rx.lock().recv();
        match job {
            // A panicking job answers EIO as its reply unwinds; the worker goes on.
            Ok(job) => {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                    log::error!("a request handler panicked on a worker; answered EIO");
                }
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn slow_jobs_do_not_hold_the_caller_and_a_full_backlog_runs_inline() {
        let pool = Pool::start().unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(std::sync::Barrier::new(WORKERS + 1));
        let busy = Arc::new(AtomicUsize::new(0));
        // Occupy every worker (and wait until each has taken its job off the backlog).
        for _ in 0..WORKERS {
            let (g, b) = (gate.clone(), busy.clone());
            pool.run(move || {
                b.fetch_add(1, Ordering::SeqCst);
                g.wait();
            });
        }
        while busy.load(Ordering::SeqCst) < WORKERS {
            std::thread::yield_now();
        }
        let t = Instant::now();
        let here = std::thread::current().id();
        let ran_inline = Arc::new(AtomicUsize::new(0));
        for _ in 0..BACKLOG + 3 {
            let (d, r) = (done.clone(), ran_inline.clone());
            pool.run(move || {
                if std::thread::current().id() == here {
                    r.fetch_add(1, Ordering::SeqCst);
                }
                d.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert!(t.elapsed() < Duration::from_secs(1), "the caller was held");
        // The backlog took BACKLOG jobs; the rest ran on the calling thread.
        assert_eq!(ran_inline.load(Ordering::SeqCst), 3);
        gate.wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        while done.load(Ordering::SeqCst) < BACKLOG + 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(done.load(Ordering::SeqCst), BACKLOG + 3);
    }
}
