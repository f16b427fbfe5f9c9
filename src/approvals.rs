//! Held requests: a write (or read) that a rule's `ask` lets a person approve waits here,
//! without a thread, until an approver decides, it times out, a reload re-decides it, the
//! asking process dies, or the daemon stops.
//!
//! Invariants:
//! - Every held request is resumed exactly once: its [`Resume`] is taken out of the table
//!   under the lock and run on the resume thread (never on the thread that decided, never
//!   under the lock), so a slow continuation cannot stall the control socket.
//! - At most `cap` questions are open; one uid alone may fill them, but when they are full
//!   a uid with fewer than the uid with the most makes room: the longest-open question of
//!   the uid with the most is refused (`held-limit`). Otherwise, or with no approver
//!   connected, [`hold`] hands the continuation back and the caller refuses at once.
//! - A directory change ([`Request::retry`]) is held at most `--ask-dir-hold` (less when
//!   its directory's window ends sooner, see [`dirs`]); then its caller is refused and its
//!   question stays open until answered or timed out, and an allow given then lets that
//!   uid's retry through ([`dirs::RETRY_GRANT`]). While it is open, the same uid's further
//!   askable changes in those directories are refused at once (`dir-pending`), unasked,
//!   and so is any askable request of that uid on no other paths than that question's
//!   (`pending`): an agent's fallback (an in-place write after a failed atomic save) is
//!   not a second question; the answer to the first one decides what lands.
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

pub mod answers;
pub mod dirs;
pub mod saves;
mod types;

pub use types::{Event, EventSink, Held, Hold, Outcome, Redecide, Remember, Request, Resume};

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use dirs::{Admit, Grants, Windows};

struct Entry {
    req: Request,
    /// When the question times out.
    expires: Instant,
    /// The caller's continuation; `None` once a directory change's hold ran out (its
    /// caller was refused, the question stays open for the retry).
    resume: Option<Resume>,
    /// A directory change: audits how its question ended once its caller is gone.
    late: Option<Resume>,
    /// A directory change still held: when its caller is refused if nobody answered.
    release: Option<Instant>,
    /// A directory change: its paths' parent directories (empty otherwise).
    dirs: Vec<Vec<u8>>,
}

impl Entry {
    /// What runs when its question ends: the caller's continuation if it still waits,
    /// else the late audit.
    fn ending(self) -> Option<Resume> {
        self.resume.or(self.late)
    }
}

#[derive(Default)]
struct Inner {
    held: BTreeMap<u64, Entry>,
    next: u64,
    /// Open questions per uid (every uid in it has at least one).
    per_uid: HashMap<u32, usize>,
    /// uid → remembered paths (allowed, with everything below them).
    remembered: HashMap<u32, Vec<Vec<u8>>>,
    /// Directory changes' hold windows.
    windows: Windows,
    /// Allows given after a directory change's caller was refused.
    grants: Grants,
}

impl Inner {
    fn insert(&mut self, id: u64, e: Entry) {
        *self.per_uid.entry(e.req.uid).or_default() += 1;
        self.held.insert(id, e);
    }

    fn take(&mut self, id: u64) -> Option<Entry> {
        let e = self.held.remove(&id)?;
        if let Some(n) = self.per_uid.get_mut(&e.req.uid) {
            *n -= 1;
            if *n == 0 {
                self.per_uid.remove(&e.req.uid);
            }
        }
        Some(e)
    }

    /// Room for one more question of `uid` among `cap`: `Ok(None)` there is room,
    /// `Ok(Some(id))` once question `id` is refused (the longest-open question of the uid
    /// with the most, when `uid` has fewer), `Err` none.
    fn room(&self, uid: u32, cap: usize) -> Result<Option<u64>, ()> {
        if self.held.len() < cap {
            return Ok(None);
        }
        let mine = self.per_uid.get(&uid).copied().unwrap_or(0);
        let most = self.per_uid.values().copied().max().unwrap_or(0);
        if mine >= most {
            return Err(());
        }
        // Ids grow, so the first in order is the longest open (of the uids tied for most).
        self.held
            .iter()
            .find(|(_, e)| self.per_uid.get(&e.req.uid) == Some(&most))
            .map(|(id, _)| Some(*id))
            .ok_or(())
    }

    /// Whether `uid` has a question open, whose caller was already refused, on every one
    /// of `paths`.
    fn asked(&self, uid: u32, paths: &[Vec<u8>]) -> bool {
        self.held.values().any(|e| {
            e.req.uid == uid && e.resume.is_none() && paths.iter().all(|p| e.req.paths.contains(p))
        })
    }

    /// Whether `uid` has a directory change's question open in one of `dirs`.
    fn pending(&self, uid: u32, dirs: &[Vec<u8>]) -> bool {
        self.held
            .values()
            .any(|e| e.req.uid == uid && dirs::overlap(&e.dirs, dirs))
    }
}

/// The table of held requests.
pub struct Approvals {
    inner: Mutex<Inner>,
    cap: usize,
    timeout: Duration,
    dir_hold: Duration,
    approvers: AtomicUsize,
    /// `fencefs run`: requests wait (until the timeout) even while no approver is
    /// connected, since the person at the terminal was told how to answer them.
    standing: std::sync::atomic::AtomicBool,
    events: Mutex<Option<EventSink>>,
    resume: Mutex<Option<Sender<(Resume, Outcome)>>>,
    answers: Option<answers::Answers>,
    /// Periodic work of the file-system side ([`Sweep`]), run from [`Approvals::expire`].
    sweep: Mutex<Option<Sweep>>,
}

/// The file-system side's periodic work (removing expired provisional files of atomic
/// saves, [`saves`]): given the time, what to run on the resume thread and its next
/// deadline.
pub type Sweep = Box<dyn Fn(Instant) -> (Vec<Resume>, Option<Instant>) + Send>;

/// Whether `path` is `base` or lies below it.
fn covers(base: &[u8], path: &[u8]) -> bool {
    base.is_empty()
        || path == base
        || (path.len() > base.len() && path.starts_with(base) && path[base.len()] == b'/')
}

/// `--ask-dir-hold`'s default (SPEC.md).
pub const DIR_HOLD: Duration = Duration::from_secs(5);

impl Approvals {
    /// A table holding at most `cap` requests, each for at most `timeout` (directory
    /// changes for at most [`DIR_HOLD`], see [`Approvals::with_dir_hold`]).
    pub fn new(cap: usize, timeout: Duration) -> Approvals {
        Approvals {
            inner: Mutex::new(Inner::default()),
            cap,
            timeout,
            dir_hold: DIR_HOLD,
            approvers: AtomicUsize::new(0),
            standing: std::sync::atomic::AtomicBool::new(false),
            events: Mutex::new(None),
            resume: Mutex::new(None),
            answers: None,
            sweep: Mutex::new(None),
        }
    }

    /// Answers remembered for good are kept in (and read from) this file (`--answers`).
    pub fn with_answers(mut self, a: answers::Answers) -> Approvals {
        self.answers = Some(a);
        self
    }

    /// The `--answers` file's answers, if one is given.
    pub fn answers(&self) -> Option<&answers::Answers> {
        self.answers.as_ref()
    }

    /// Directory changes are held at most `d` (`--ask-dir-hold`; zero: never held).
    pub fn with_dir_hold(mut self, d: Duration) -> Approvals {
        self.dir_hold = d;
        self
    }

    /// Connects the resume thread's queue and the control server's event queue.
    pub fn connect(&self, resume: Sender<(Resume, Outcome)>, events: EventSink) {
        *self.resume.lock() = Some(resume);
        *self.events.lock() = Some(events);
    }

    /// Runs `f` whenever held requests are expired (and at its own deadlines): its
    /// continuations run on the resume thread, refused (`Outcome::deny("sweep")`).
    pub fn set_sweep(&self, f: Sweep) {
        *self.sweep.lock() = Some(f);
    }

    /// The control server counts its subscribed approvers here.
    pub fn set_approvers(&self, n: usize) {
        self.approvers.store(n, Ordering::SeqCst);
    }

    /// Approvers connected now (plus one standing approver, see [`Approvals::stand_by`]).
    pub fn approvers(&self) -> usize {
        self.approvers.load(Ordering::SeqCst) + usize::from(self.standing.load(Ordering::SeqCst))
    }

    /// Hold requests even while no approver is connected (`fencefs run`).
    pub fn stand_by(&self) {
        self.standing.store(true, Ordering::SeqCst);
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

    /// Holds a request (or, for a directory change that cannot be held now, posts its
    /// question) and tells approvers. `late` audits how a directory change's question
    /// ended after its caller was refused (`None`: nothing to audit then).
    pub fn hold(&self, req: Request, resume: Resume, late: Option<Resume>) -> Hold {
        if self.approvers() == 0 || self.resume.lock().is_none() {
            return Hold::Refused(resume, "no-approver");
        }
        let now = Instant::now();
        let dirs = if req.retry {
            dirs::locked(req.op, &req.paths)
        } else {
            Vec::new()
        };
        let (held, evicted, posted) = {
            let mut g = self.inner.lock();
            if req.retry && g.pending(req.uid, &dirs) {
                return Hold::Refused(resume, "dir-pending");
            }
            if g.asked(req.uid, &req.paths) {
                return Hold::Refused(resume, "pending");
            }
            let victim = match g.room(req.uid, self.cap) {
                Ok(v) => v,
                Err(()) => return Hold::Refused(resume, "held-limit"),
            };
            let expires = now + self.timeout;
            let admit = if req.retry {
                g.windows.admit(&dirs, now, self.dir_hold)
            } else {
                Admit::Hold(expires)
            };
            let evicted = victim.and_then(|id| g.take(id).map(|e| (id, e)));
            g.next += 1;
            let id = g.next;
            let (resume, release, posted) = match admit {
                Admit::Hold(t) => (Some(resume), (t < expires).then_some(t), None),
                Admit::Post => (None, None, Some(resume)),
            };
            // A directory change that times out before its hold would run out (a short
            // --ask-timeout) ends with its caller: no retry to answer for.
            let mut req = req;
            req.retry &= release.is_some() || posted.is_some();
            g.insert(
                id,
                Entry {
                    req: req.clone(),
                    expires,
                    resume,
                    late,
                    release,
                    dirs,
                },
            );
            let held = Held {
                id,
                req,
                expires_in: self.timeout,
            };
            (held, evicted, posted)
        };
        if let Some((id, e)) = evicted {
            self.end(id, e, Outcome::deny("held-limit"));
        }
        let id = held.id;
        self.emit(Event::Ask(held));
        match posted {
            Some(resume) => Hold::Posted(id, resume),
            None => Hold::Held(id),
        }
    }

    /// Tells approvers question `id` ended and runs what waits on it.
    fn end(&self, id: u64, e: Entry, o: Outcome) {
        self.emit(Event::Done {
            id,
            allow: o.allow,
            by: o.by,
        });
        if let Some(f) = e.ending() {
            self.run(f, o);
        }
    }

    fn finish(&self, ids: Vec<(u64, Outcome)>) {
        let mut taken = Vec::new();
        {
            let mut g = self.inner.lock();
            for (id, o) in ids {
                if let Some(e) = g.take(id) {
                    taken.push((id, e, o));
                }
            }
        }
        for (id, e, o) in taken {
            self.end(id, e, o);
        }
    }

    /// An approver's answer. `remember_path`: also allow this uid on these paths (and
    /// below) until the next reload. An allow of a directory change whose caller was
    /// already refused lets that uid's retry through for [`dirs::RETRY_GRANT`] (or, with
    /// `remember_path`, until the next reload). `Err` when the request is no longer held
    /// (answered, timed out, or never existed): the first answer wins.
    pub fn decide(
        &self,
        id: u64,
        allow: bool,
        remember: Remember,
        approver: u32,
    ) -> Result<(), String> {
        if remember == Remember::Always {
            self.write_answer(id, allow, approver)?;
        }
        let remember_path = remember == Remember::Path;
        let entry = {
            let mut g = self.inner.lock();
            let e = g.take(id).ok_or("no such held request")?;
            if allow && remember_path {
                let list = g.remembered.entry(e.req.uid).or_default();
                for p in &e.req.paths {
                    if !list.iter().any(|b| covers(b, p)) {
                        list.push(p.clone());
                    }
                }
            } else if allow && e.resume.is_none() {
                let now = Instant::now();
                g.grants
                    .grant(e.req.uid, &e.req.paths, now + dirs::RETRY_GRANT, now);
            }
            e
        };
        let o = Outcome {
            allow,
            by: "approver",
            approver: Some(approver),
        };
        self.end(id, entry, o);
        Ok(())
    }

    /// `remember: always`: writes the answer for held request `id` to the answers file
    /// before it is decided (so a failure leaves it held for another answer).
    fn write_answer(&self, id: u64, allow: bool, approver: u32) -> Result<(), String> {
        let Some(file) = &self.answers else {
            return Err("remember \"always\" needs the daemon's --answers FILE".into());
        };
        let req = self
            .inner
            .lock()
            .held
            .get(&id)
            .map(|e| e.req.clone())
            .ok_or("no such held request")?;
        let ts = crate::audit::timestamp(std::time::SystemTime::now());
        let mut list = Vec::new();
        for p in &req.paths {
            let path = std::str::from_utf8(p).map_err(
                |_| "a path that is not UTF-8 cannot be remembered always; answer once or path",
            )?;
            list.push(answers::Answer {
                path: path.to_string(),
                write: !matches!(req.need, "read" | "list"),
                uid: req.uid,
                allow,
                by: format!("uid {approver}"),
                ts: ts.clone(),
            });
        }
        file.remember(list)
    }

    /// Whether `uid` was allowed `path` (or a directory above it) with `remember: path`,
    /// or `path` itself by an answer that came after its directory change was refused.
    pub fn remembered(&self, uid: u32, path: &[u8]) -> bool {
        let g = self.inner.lock();
        g.remembered
            .get(&uid)
            .is_some_and(|l| l.iter().any(|b| covers(b, path)))
            || g.grants.covers(uid, path, Instant::now())
    }

    /// Times out what is due and refuses the callers of directory changes whose hold ran
    /// out (their questions stay); returns the next deadline, if anything is open.
    pub fn expire(&self, now: Instant) -> Option<Instant> {
        let (due, released) = {
            let mut guard = self.inner.lock();
            let g = &mut *guard;
            let due: Vec<(u64, Outcome)> = g
                .held
                .iter()
                .filter(|(_, e)| e.expires <= now)
                .map(|(id, _)| (*id, Outcome::deny("timeout")))
                .collect();
            let mut released = Vec::new();
            for e in g.held.values_mut() {
                if e.expires > now && e.release.is_some_and(|t| t <= now) {
                    e.release = None;
                    if let Some(r) = e.resume.take() {
                        g.windows.ran_out(&e.dirs, now, self.dir_hold);
                        released.push(r);
                    }
                }
            }
            (due, released)
        };
        for r in released {
            self.run(r, Outcome::deny("dir-hold"));
        }
        self.finish(due);
        let (swept, sweep_next) = match &*self.sweep.lock() {
            Some(f) => f(now),
            None => (Vec::new(), None),
        };
        for r in swept {
            self.run(r, Outcome::deny("sweep"));
        }
        self.inner
            .lock()
            .held
            .values()
            .flat_map(|e| [Some(e.expires), e.release])
            .flatten()
            .chain(sweep_next)
            .min()
    }

    /// Ends the requests whose asking process is being killed (`dying(pid)`): their
    /// answer would be dropped by the kernel anyway. A directory change whose caller was
    /// already refused keeps its question: another process of that uid may retry.
    pub fn reap(&self, dying: impl Fn(u32) -> bool) {
        let pids: Vec<(u64, u32)> = {
            let g = self.inner.lock();
            g.held
                .iter()
                .filter(|(_, e)| e.resume.is_some())
                .map(|(id, e)| (*id, e.req.pid))
                .collect()
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
            g.grants.clear();
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
mod tests;
