//! Work the control thread hands off: a command whose answer may take long (a staging
//! operation — a live `apply` of thousands of files, a `status` flattening checkpoints —,
//! a reload that waits for one) runs on a lane's own thread, and its answer is queued for
//! the peer when it is ready. The control thread meanwhile keeps serving every other peer:
//! approvals (`decide`), `held`, `status`, `subscribe`.
//!
//! Invariants:
//! - One job at a time per lane, in the order they came; at most [`MAX_WAITING`] wait
//!   behind the running one, and a further one is answered at once with a `busy` error
//!   naming what runs (never queued without bound). A peer has at most one command in
//!   flight (its next command is read only once this one is answered), so a lane holds at
//!   most `MAX_WAITING + 1` requests.
//! - A job's answer always comes back (a job that panics is answered `ok:false`); the answer
//!   for a peer gone meanwhile is dropped, but the job runs to its end (a staging change
//!   stopped halfway would be worse than an answer nobody reads).

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{Sender, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use super::proto;

/// Jobs that may wait behind the running one.
pub const MAX_WAITING: usize = 8;

/// A job: what it is (for `busy` errors and `status`) and the work, which returns the
/// answer.
type Work = Box<dyn FnOnce() -> Value + Send>;

struct Job {
    conn: u64,
    what: String,
    work: Work,
}

/// A finished job's answer for connection `conn`.
pub struct Done {
    pub conn: u64,
    pub answer: Value,
}

#[derive(Default)]
struct State {
    /// What runs now, since when.
    running: Option<(String, Instant)>,
    /// Jobs handed in and not finished (the running one included).
    queued: usize,
}

/// One lane: a thread and its bounded queue.
pub struct Lane {
    name: &'static str,
    tx: SyncSender<Job>,
    state: Arc<Mutex<State>>,
}

impl Lane {
    /// Starts lane `name` (its thread is `fencefs-NAME`); answers go to `done`, and `wake`
    /// wakes the control thread for each.
    pub fn start(name: &'static str, done: Sender<Done>, wake: Waker) -> io::Result<Lane> {
        let (tx, rx) = sync_channel::<Job>(MAX_WAITING);
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        std::thread::Builder::new()
            .name(format!("fencefs-{name}"))
            .spawn(move || {
                for job in rx {
                    st.lock().running = Some((job.what.clone(), Instant::now()));
                    let answer = catch_unwind(AssertUnwindSafe(job.work)).unwrap_or_else(|_| {
                        log::error!("control: {} failed inside the daemon", job.what);
                        proto::error(&format!("{} failed inside the daemon", job.what))
                    });
                    {
                        let mut s = st.lock();
                        s.running = None;
                        s.queued -= 1;
                    }
                    if done
                        .send(Done {
                            conn: job.conn,
                            answer,
                        })
                        .is_err()
                    {
                        return;
                    }
                    wake.wake();
                }
            })?;
        Ok(Lane { name, tx, state })
    }

    /// Hands `work` (answering connection `conn`) to the lane; `Err` is the `busy` answer
    /// to give at once when [`MAX_WAITING`] jobs wait already.
    pub fn submit(&self, conn: u64, what: &str, work: Work) -> Result<(), Value> {
        let mut s = self.state.lock();
        let job = Job {
            conn,
            what: what.to_string(),
            work,
        };
        match self.tx.try_send(job) {
            Ok(()) => {
                s.queued += 1;
                Ok(())
            }
            Err(TrySendError::Full(_)) => Err(proto::error(&self.busy_line(&s))),
            Err(TrySendError::Disconnected(_)) => {
                Err(proto::error(&format!("the {} lane has stopped", self.name)))
            }
        }
    }

    fn busy_line(&self, s: &State) -> String {
        let (what, since) = s
            .running
            .as_ref()
            .map_or(("a job", Duration::ZERO), |(w, t)| {
                (w.as_str(), t.elapsed())
            });
        format!(
            "busy: {what} has been running for {:.1} s and {} more wait (at most {MAX_WAITING}); try again when it ends",
            since.as_secs_f64(),
            s.queued.saturating_sub(1)
        )
    }

    /// What runs now and for how long, and how many jobs wait behind it; `None` when the
    /// lane is idle (nothing running or waiting).
    pub fn busy(&self) -> Option<(String, Duration, usize)> {
        let s = self.state.lock();
        if s.queued == 0 {
            return None;
        }
        let (what, since) = s
            .running
            .as_ref()
            .map_or((String::from("starting"), Duration::ZERO), |(w, t)| {
                (w.clone(), t.elapsed())
            });
        Some((what, since, s.queued.saturating_sub(1)))
    }
}

/// The write end of the server's wake-up socket: events queued elsewhere become readable.
pub struct Waker(UnixStream);

impl Waker {
    /// Wakes the server (never blocks; a full socket means it is awake already).
    pub fn wake(&self) {
        let _ = (&self.0).write(&[1]);
    }

    /// Another waker of the same server.
    pub fn try_clone(&self) -> io::Result<Waker> {
        self.0.try_clone().map(Waker)
    }
}

/// A wake-up pair: the waker for event producers, the other end for [`run`](super::server::run).
pub fn waker() -> io::Result<(Waker, UnixStream)> {
    let (a, b) = UnixStream::pair()?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    Ok((Waker(a), b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn one_job_at_a_time_a_bounded_queue_then_busy_and_every_answer_comes_back() {
        let (wake, _rx) = super::waker().unwrap();
        let (done_tx, done_rx) = channel();
        let lane = Lane::start("test-lane", done_tx, wake).unwrap();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let go = Arc::new(Mutex::new(go_rx));
        // The first job runs until told; MAX_WAITING more wait; the next is busy.
        let job = |i: u64| -> Work {
            let go = go.clone();
            Box::new(move || {
                go.lock().recv().unwrap();
                serde_json::json!({"ok": true, "n": i})
            })
        };
        lane.submit(0, "apply", job(0)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while lane.busy().is_none_or(|(w, _, _)| w != "apply") {
            assert!(Instant::now() < deadline, "the first job never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        for i in 1..=MAX_WAITING as u64 {
            lane.submit(i, "apply", job(i)).unwrap();
        }
        let busy = lane
            .submit(99, "status", Box::new(|| Value::Null))
            .unwrap_err();
        assert_eq!(busy["ok"], false);
        let e = busy["error"].as_str().unwrap();
        assert!(e.starts_with("busy: apply has been running for "), "{e}");
        assert!(e.contains(&format!("{MAX_WAITING} more wait")), "{e}");
        assert_eq!(lane.busy().unwrap().2, MAX_WAITING);
        // A job that panics is answered too.
        for _ in 0..=MAX_WAITING {
            go_tx.send(()).unwrap();
        }
        let got: Vec<u64> = (0..=MAX_WAITING)
            .map(|_| {
                done_rx
                    .recv_timeout(Duration::from_secs(10))
                    .unwrap()
                    .answer["n"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            got,
            (0..=MAX_WAITING as u64).collect::<Vec<_>>(),
            "in order"
        );
        lane.submit(7, "diff", Box::new(|| panic!("a bug")))
            .unwrap();
        let d = done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((d.conn, d.answer["ok"].clone()), (7, Value::Bool(false)));
        assert!(lane.busy().is_none());
    }
}
