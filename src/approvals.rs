//! Held requests: a write (or read) that a rule's `ask` lets a person approve waits here,
//! without a thread, until an approver decides, it times out, a reload re-decides it, the
//! asking process dies, or the daemon stops.
//!
//! Invariants:
//! - Every held request is resumed exactly once: its [`Resume`] is taken out of the table
//!   under the lock and run on the resume thread (never on the thread that decided, never
//!   under the lock), so a slow continuation cannot stall the control socket.
//! - At most `cap` requests are held; past it, or with no approver connected, [`hold`]
//!   hands the continuation back and the caller refuses at once.
//! - Remembered answers are per uid and per path (and everything below a path), and are
//!   all forgotten on reload: they never widen access for another uid, never outlive the
//!   policy they were given under.
//!
//! This module knows nothing of FUSE or the socket, and of the policy only what a reload
//! needs to re-decide (`Need`): the glue builds the continuation, the control server
//! delivers events.
//!
//! [`hold`]: Approvals::hold

/// Requests held for an approver at once (SPEC.md: 1024).
pub const MAX_HELD: usize = 1024;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How a held request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Proceed as if the grant were the rule's `ask`.
    pub allow: bool,
    /// `approver`, `timeout`, `no-approver`, `reload`, `killed`, `shutdown`.
    pub by: &'static str,
    /// The uid of the approver who answered.
    pub approver: Option<u32>,
}

impl Outcome {
    fn deny(by: &'static str) -> Outcome {
        Outcome {
            allow: false,
            by,
            approver: None,
        }
    }
}

/// Where events for the control socket go.
pub type EventSink = Box<dyn Fn(Event) + Send>;

/// The continuation of a held request: re-runs it (allowed) or refuses it, and replies.
pub type Resume = Box<dyn FnOnce(Outcome) + Send>;

/// What a held request asks for (shown to approvers, kept for reload re-decisions).
#[derive(Debug, Clone)]
pub struct Request {
    /// The operation (`write`-style FUSE op name: `open`, `mkdir`, `rename`, …).
    pub op: &'static str,
    /// Workspace paths it needs more access on (two for rename/link).
    pub paths: Vec<Vec<u8>>,
    /// The access level it needs.
    pub need: &'static str,
    /// Caller.
    pub uid: u32,
    /// Caller's gid.
    pub gid: u32,
    /// Caller's pid (in the daemon's pid namespace).
    pub pid: u32,
    /// The deciding rule's pattern and line.
    pub rule: Option<(String, usize)>,
    /// Policy generation it was decided under.
    pub generation: u64,
    /// `(is_dir, need)` of each path, to re-decide it after a reload.
    pub checks: Vec<(bool, crate::policy::Need)>,
}

/// A held request as approvers see it.
#[derive(Debug, Clone)]
pub struct Held {
    /// Its id (answers name it).
    pub id: u64,
    /// What it asks.
    pub req: Request,
    /// Time left before it times out.
    pub expires_in: Duration,
}

/// An event for the control socket's subscribers.
#[derive(Debug, Clone)]
pub enum Event {
    /// A request is held.
    Ask(Held),
    /// A held request ended.
    Done {
        /// Its id.
        id: u64,
        /// allow or deny.
        allow: bool,
        /// Who ended it.
        by: &'static str,
    },
}

/// What a reload decides for a held request under the new policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redecide {
    /// Allowed outright now.
    Allow,
    /// Refused outright now.
    Refuse,
    /// Still needs an approver.
    Keep,
}

struct Entry {
    req: Request,
    expires: Instant,
    resume: Resume,
}

#[derive(Default)]
struct Inner {
    held: BTreeMap<u64, Entry>,
    next: u64,
    /// uid → remembered paths (allowed, with everything below them).
    remembered: HashMap<u32, Vec<Vec<u8>>>,
}

/// The table of held requests.
pub struct Approvals {
    inner: Mutex<Inner>,
    cap: usize,
    timeout: Duration,
    approvers: AtomicUsize,
    events: Mutex<Option<EventSink>>,
    resume: Mutex<Option<Sender<(Resume, Outcome)>>>,
}

/// Whether `path` is `base` or lies below it.
fn covers(base: &[u8], path: &[u8]) -> bool {
    base.is_empty()
        || path == base
        || (path.len() > base.len() && path.starts_with(base) && path[base.len()] == b'/')
}

impl Approvals {
    /// A table holding at most `cap` requests, each for at most `timeout`.
    pub fn new(cap: usize, timeout: Duration) -> Approvals {
        Approvals {
            inner: Mutex::new(Inner::default()),
            cap,
            timeout,
            approvers: AtomicUsize::new(0),
            events: Mutex::new(None),
            resume: Mutex::new(None),
        }
    }

    /// Connects the resume thread's queue and the control server's event queue.
    pub fn connect(&self, resume: Sender<(Resume, Outcome)>, events: EventSink) {
        *self.resume.lock() = Some(resume);
        *self.events.lock() = Some(events);
    }

    /// The control server counts its subscribed approvers here.
    pub fn set_approvers(&self, n: usize) {
        self.approvers.store(n, Ordering::SeqCst);
    }

    /// Approvers connected now.
    pub fn approvers(&self) -> usize {
        self.approvers.load(Ordering::SeqCst)
    }

    fn emit(&self, ev: Event) {
        if let Some(f) = &*self.events.lock() {
            f(ev);
        }
    }

    fn run(&self, resume: Resume, outcome: Outcome) {
        let sent = match &*self.resume.lock() {
            Some(tx) => tx.send((resume, outcome)).map_err(|e| e.0),
            None => Err((resume, outcome)),
        };
        // No resume thread (shutting down): answer here; refusals touch nothing.
        if let Err((resume, outcome)) = sent {
            resume(outcome);
        }
    }

    /// Holds a request. `Err` gives the continuation back with the reason to refuse it at
    /// once: `no-approver` (nobody subscribed) or `full` (the cap is reached).
    pub fn hold(&self, req: Request, resume: Resume) -> Result<u64, (Resume, &'static str)> {
        if self.approvers() == 0 || self.resume.lock().is_none() {
            return Err((resume, "no-approver"));
        }
        let held = {
            let mut g = self.inner.lock();
            if g.held.len() >= self.cap {
                return Err((resume, "full"));
            }
            g.next += 1;
            let id = g.next;
            g.held.insert(
                id,
                Entry {
                    req: req.clone(),
                    expires: Instant::now() + self.timeout,
                    resume,
                },
            );
            Held {
                id,
                req,
                expires_in: self.timeout,
            }
        };
        let id = held.id;
        self.emit(Event::Ask(held));
        Ok(id)
    }

    fn finish(&self, ids: Vec<(u64, Outcome)>) {
        let mut taken = Vec::new();
        {
            let mut g = self.inner.lock();
            for (id, o) in ids {
                if let Some(e) = g.held.remove(&id) {
                    taken.push((id, e, o));
                }
            }
        }
        for (id, e, o) in taken {
            self.emit(Event::Done {
                id,
                allow: o.allow,
                by: o.by,
            });
            self.run(e.resume, o);
        }
    }

    /// An approver's answer. `remember_path`: also allow this uid on these paths (and
    /// below) until the next reload. `Err` when the request is no longer held (answered,
    /// timed out, or never existed): the first answer wins.
    pub fn decide(
        &self,
        id: u64,
        allow: bool,
        remember_path: bool,
        approver: u32,
    ) -> Result<(), &'static str> {
        let entry = {
            let mut g = self.inner.lock();
            let e = g.held.remove(&id).ok_or("no such held request")?;
            if allow && remember_path {
                let list = g.remembered.entry(e.req.uid).or_default();
                for p in &e.req.paths {
                    if !list.iter().any(|b| covers(b, p)) {
                        list.push(p.clone());
                    }
                }
            }
            e
        };
        let o = Outcome {
            allow,
            by: "approver",
            approver: Some(approver),
        };
        self.emit(Event::Done {
            id,
            allow,
            by: o.by,
        });
        self.run(entry.resume, o);
        Ok(())
    }

    /// Whether `uid` was allowed `path` (or a directory above it) with `remember: path`.
    pub fn remembered(&self, uid: u32, path: &[u8]) -> bool {
        self.inner
            .lock()
            .remembered
            .get(&uid)
            .is_some_and(|l| l.iter().any(|b| covers(b, path)))
    }

    /// Times out what is due; returns the next deadline, if anything is held.
    pub fn expire(&self, now: Instant) -> Option<Instant> {
        let due: Vec<(u64, Outcome)> = {
            let g = self.inner.lock();
            g.held
                .iter()
                .filter(|(_, e)| e.expires <= now)
                .map(|(id, _)| (*id, Outcome::deny("timeout")))
                .collect()
        };
        self.finish(due);
        self.inner.lock().held.values().map(|e| e.expires).min()
    }

    /// Ends the requests whose asking process is being killed (`dying(pid)`): their
    /// answer would be dropped by the kernel anyway.
    pub fn reap(&self, dying: impl Fn(u32) -> bool) {
        let pids: Vec<(u64, u32)> = {
            let g = self.inner.lock();
            g.held.iter().map(|(id, e)| (*id, e.req.pid)).collect()
        };
        let gone = pids
            .into_iter()
            .filter(|(_, pid)| dying(*pid))
            .map(|(id, _)| (id, Outcome::deny("killed")))
            .collect();
        self.finish(gone);
    }

    /// After a reload: forgets every remembered answer and re-decides every held request
    /// under the new policy (`f`).
    pub fn reload(&self, f: impl Fn(&Request) -> Redecide) {
        let reqs: Vec<(u64, Request)> = {
            let mut g = self.inner.lock();
            g.remembered.clear();
            g.held.iter().map(|(id, e)| (*id, e.req.clone())).collect()
        };
        let mut done = Vec::new();
        for (id, req) in reqs {
            match f(&req) {
                Redecide::Keep => {}
                Redecide::Allow => done.push((
                    id,
                    Outcome {
                        allow: true,
                        by: "reload",
                        approver: None,
                    },
                )),
                Redecide::Refuse => done.push((id, Outcome::deny("reload"))),
            }
        }
        self.finish(done);
    }

    /// Refuses everything held now, `by` this reason.
    fn deny_all(&self, by: &'static str) {
        let all = {
            let g = self.inner.lock();
            g.held.keys().map(|id| (*id, Outcome::deny(by))).collect()
        };
        self.finish(all);
    }

    /// The last approver left: nobody can answer what is held.
    pub fn orphaned(&self) {
        self.deny_all("no-approver");
    }

    /// The daemon stops: every held request is refused first, then nothing more is held.
    pub fn shutdown(&self) {
        *self.resume.lock() = None;
        self.deny_all("shutdown");
    }

    /// Every request held now.
    pub fn held(&self) -> Vec<Held> {
        let now = Instant::now();
        self.inner
            .lock()
            .held
            .iter()
            .map(|(id, e)| Held {
                id: *id,
                req: e.req.clone(),
                expires_in: e.expires.saturating_duration_since(now),
            })
            .collect()
    }

    /// The held request with the lowest id above `after`, if any: the control server walks
    /// the table with it, one request at a time, as each peer reads.
    pub fn next_held(&self, after: u64) -> Option<Held> {
        let now = Instant::now();
        let g = self.inner.lock();
        let (id, e) = g.held.range(after.saturating_add(1)..).next()?;
        Some(Held {
            id: *id,
            req: e.req.clone(),
            expires_in: e.expires.saturating_duration_since(now),
        })
    }

    /// The highest id held now (0: nothing is held).
    pub fn newest(&self) -> u64 {
        self.inner
            .lock()
            .held
            .keys()
            .next_back()
            .copied()
            .unwrap_or(0)
    }

    /// How many requests are held now.
    pub fn len(&self) -> usize {
        self.inner.lock().held.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Runs continuations handed over by [`Approvals`] until every sender is gone. Spawned
/// after the FUSE workers' confinement, so it runs under the same Landlock domain.
pub fn resume_loop(rx: std::sync::mpsc::Receiver<(Resume, Outcome)>) {
    while let Ok((resume, outcome)) = rx.recv() {
        resume(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    fn req(uid: u32, path: &str) -> Request {
        Request {
            op: "open",
            paths: vec![path.as_bytes().to_vec()],
            need: "write",
            uid,
            gid: uid,
            pid: 42,
            rule: None,
            generation: 0,
            checks: vec![(false, crate::policy::Need::Write)],
        }
    }

    /// A table with one approver, whose continuations report their outcome on a channel.
    fn table(
        cap: usize,
    ) -> (
        Approvals,
        std::sync::mpsc::Receiver<(Resume, Outcome)>,
        std::sync::mpsc::Receiver<Event>,
    ) {
        let a = Approvals::new(cap, Duration::from_secs(60));
        let (rtx, rrx) = channel();
        let (etx, erx) = channel();
        a.connect(
            rtx,
            Box::new(move |e| {
                let _ = etx.send(e);
            }),
        );
        a.set_approvers(1);
        (a, rrx, erx)
    }

    fn resumed(rx: &std::sync::mpsc::Receiver<(Resume, Outcome)>) -> Vec<Outcome> {
        rx.try_iter()
            .map(|(r, o)| {
                r(o);
                o
            })
            .collect()
    }

    #[test]
    fn without_an_approver_nothing_is_held() {
        let a = Approvals::new(4, Duration::from_secs(1));
        let (rtx, _r) = channel();
        let (etx, _e) = channel();
        a.connect(
            rtx,
            Box::new(move |e| {
                let _ = etx.send(e);
            }),
        );
        let r = a.hold(req(1000, "docs/a"), Box::new(|_| {}));
        assert_eq!(r.err().map(|e| e.1), Some("no-approver"));
        assert!(a.is_empty());
    }

    #[test]
    fn the_cap_refuses_at_once() {
        let (a, _r, _e) = table(2);
        assert!(a.hold(req(1, "a"), Box::new(|_| {})).is_ok());
        assert!(a.hold(req(1, "b"), Box::new(|_| {})).is_ok());
        let r = a.hold(req(1, "c"), Box::new(|_| {}));
        assert_eq!(r.err().map(|e| e.1), Some("full"));
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn the_first_answer_wins_and_runs_the_continuation_once() {
        let (a, r, e) = table(8);
        let id = a.hold(req(1000, "docs/a"), Box::new(|_| {})).ok().unwrap();
        assert!(matches!(e.try_recv(), Ok(Event::Ask(h)) if h.id == id));
        assert!(a.decide(id, true, false, 0).is_ok());
        assert!(a.decide(id, false, false, 0).is_err(), "a late answer");
        let outs = resumed(&r);
        assert_eq!(outs.len(), 1);
        assert!(outs[0].allow && outs[0].by == "approver" && outs[0].approver == Some(0));
        assert!(matches!(e.try_recv(), Ok(Event::Done { allow: true, .. })));
    }

    #[test]
    fn remembered_paths_are_per_uid_cover_below_and_end_at_reload() {
        let (a, _r, _e) = table(8);
        let id = a.hold(req(1000, "docs"), Box::new(|_| {})).ok().unwrap();
        a.decide(id, true, true, 0).unwrap();
        assert!(a.remembered(1000, b"docs"));
        assert!(a.remembered(1000, b"docs/x/y"));
        assert!(!a.remembered(1000, b"docsx"), "a sibling is not below");
        assert!(!a.remembered(1001, b"docs"), "never for another uid");
        a.reload(|_| Redecide::Keep);
        assert!(!a.remembered(1000, b"docs"), "forgotten at reload");
    }

    #[test]
    fn a_denial_is_never_remembered() {
        let (a, _r, _e) = table(8);
        let id = a.hold(req(1000, "docs"), Box::new(|_| {})).ok().unwrap();
        a.decide(id, false, true, 0).unwrap();
        assert!(!a.remembered(1000, b"docs"));
    }

    #[test]
    fn timeouts_reload_reaping_and_shutdown_end_requests() {
        let a = Approvals::new(8, Duration::from_millis(0));
        let (rtx, r) = channel();
        let (etx, _e) = channel();
        a.connect(
            rtx,
            Box::new(move |e| {
                let _ = etx.send(e);
            }),
        );
        a.set_approvers(1);
        a.hold(req(1, "t"), Box::new(|_| {})).ok().unwrap();
        assert_eq!(a.expire(Instant::now()), None, "timed out, nothing left");
        assert_eq!(resumed(&r)[0].by, "timeout");

        let (a, r, _e) = table(8);
        a.hold(req(1, "allow"), Box::new(|_| {})).ok().unwrap();
        a.hold(req(1, "refuse"), Box::new(|_| {})).ok().unwrap();
        a.hold(req(1, "keep"), Box::new(|_| {})).ok().unwrap();
        a.reload(|q| match &q.paths[0][..] {
            b"allow" => Redecide::Allow,
            b"refuse" => Redecide::Refuse,
            _ => Redecide::Keep,
        });
        let outs = resumed(&r);
        assert_eq!(outs.len(), 2);
        assert!(outs.iter().all(|o| o.by == "reload"));
        assert_eq!(outs.iter().filter(|o| o.allow).count(), 1);
        assert_eq!(a.len(), 1);

        let mut q = req(1, "k");
        q.pid = 77;
        a.hold(q, Box::new(|_| {})).ok().unwrap();
        a.reap(|pid| pid == 77);
        assert_eq!(resumed(&r)[0].by, "killed");
        assert_eq!(a.len(), 1);

        let (tx, rx) = channel();
        let (a2, _r2, _e2) = table(8);
        a2.hold(
            req(1, "s"),
            Box::new(move |o| {
                let _ = tx.send(o);
            }),
        )
        .ok()
        .unwrap();
        a2.shutdown();
        let o = rx
            .try_recv()
            .expect("answered at shutdown, on the caller's thread");
        assert_eq!((o.allow, o.by), (false, "shutdown"));
        assert!(a2.hold(req(1, "late"), Box::new(|_| {})).is_err());
    }
}
