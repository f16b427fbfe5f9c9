//! The control socket server: one thread, `poll(2)` over the listener, every connection
//! and a wake-up socket; no thread per connection.
//!
//! Invariants:
//! - Only root, the daemon's uid and members of `--control-group` are served (SO_PEERCRED,
//!   and the peer's groups from /proc); anyone else gets one refusal line and is closed.
//! - Nothing a peer does blocks the file system: sockets are non-blocking, a command line
//!   is at most [`MAX_LINE`] bytes, at most [`MAX_CONNS`] peers are served. Answers are
//!   streamed with backpressure and never dropped, events for a slow peer are dropped
//!   past a bound and counted, a peer that reads nothing for a minute while data waits is
//!   closed as dead ([`peer`]).
//! - The last approver leaving (closed, dead, or its side shut) refuses everything held
//!   at once (`no-approver`): nobody is left to answer it.
//! - The server also keeps the approvals' clocks: timeouts, and askers killed while held
//!   (a pending SIGKILL in /proc: the kernel would drop the answer anyway).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use serde_json::{Value, json};

use super::lane::{Done, Lane};
pub use super::lane::{Waker, waker};
use super::peer::{self, Conn, Next};
#[cfg(doc)]
use super::proto::MAX_LINE;
use super::proto::{self, Cmdline, Command, Remember};
use crate::approvals::{Approvals, Event};

/// Peers served at once.
pub const MAX_CONNS: usize = 64;
/// How often held requests' askers are checked while something is held.
const REAP_EVERY: Duration = Duration::from_millis(200);

/// What the server asks of the rest of the daemon. `reload`, `learn`, `stage` and
/// `staged` may take long: they run on lanes (`lane.rs`), off the control thread.
pub struct Hooks {
    /// Fields of the `status` answer.
    pub status: Box<dyn Fn() -> Value + Send>,
    /// Reloads the policy: `generation`/`rules` fields, or the error lines.
    pub reload: Arc<dyn Fn() -> Result<Value, Vec<String>> + Send + Sync>,
    /// The policy generation in force.
    pub generation: Box<dyn Fn() -> u64 + Send>,
    /// Staging operations (`None`: the mount has no `--stage`).
    pub stage: Option<StageHandler>,
    /// Writes `--learn`'s draft now (`None`: the mount does not learn).
    pub learn: Option<LearnHandler>,
    /// The `staged` field of `status`: the number of changed paths, or null.
    pub staged: Option<Arc<dyn Fn() -> Value + Send + Sync>>,
}

/// What the server calls for a `learn` command: the answer's fields (`path`, `rules`,
/// `bytes`) or why the draft could not be written.
pub type LearnHandler = Arc<dyn Fn() -> Result<Value, String> + Send + Sync>;

/// Who may connect.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    /// The daemon's uid.
    pub daemon_uid: u32,
    /// `--control-group`.
    pub group: Option<u32>,
}

/// Binds the socket at `path` (a stale socket there is replaced; anything else is an
/// error), mode 0600, or 0660 owned by `group`.
pub fn bind(path: &Path, group: Option<u32>) -> io::Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if std::os::unix::fs::FileTypeExt::is_socket(&md.file_type()) => {
            std::fs::remove_file(path)?
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a socket",
            ));
        }
        Err(_) => {}
    }
    let l = super::sockpath::with(path, |p| UnixListener::bind(p))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    if let Some(g) = group {
        std::os::unix::fs::lchown(path, None, Some(g))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    }
    l.set_nonblocking(true)?;
    Ok(l)
}

/// What the server calls for a `stage` command (set by the staging module), with the
/// peer's uid (for the audit).
pub type StageHandler = Arc<dyn Fn(&proto::StageRequest, u32) -> Value + Send + Sync>;

/// Whether `uid`/`gid`/`pid` (a peer) may use the socket.
fn authorized(a: Access, uid: u32, gid: u32, pid: i32) -> bool {
    if uid == 0 || uid == a.daemon_uid {
        return true;
    }
    let Some(g) = a.group else { return false };
    if gid == g {
        return true;
    }
    // Supplementary groups of the peer process.
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Groups:"))
                .map(|l| l[7..].split_whitespace().any(|x| x == g.to_string()))
        })
        .unwrap_or(false)
}

/// Whether process `pid` is being killed (SIGKILL pending) or is gone. Pid 0 is a caller
/// outside the daemon's pid namespace (fencefs in a container, the agent in another): it
/// cannot be watched, and such a request ends by its answer or its timeout.
fn dying(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    s.lines()
        .filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
        .filter_map(|l| u64::from_str_radix(l[7..].trim(), 16).ok())
        .any(|mask| mask & SIGKILL_BIT != 0)
}

/// The first [`MAX_CMDLINE`](proto::MAX_CMDLINE) bytes of the command line of `pid`.
pub(crate) fn cmdline(pid: u32) -> Option<Cmdline> {
    if pid == 0 {
        return None;
    }
    let f = std::fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    let mut raw = Vec::with_capacity(proto::MAX_CMDLINE + 1);
    f.take(proto::MAX_CMDLINE as u64 + 1)
        .read_to_end(&mut raw)
        .ok()?;
    Cmdline::parse(&raw)
}

/// The command lines of what is held, each read once from /proc when the request is held
/// (so every approver is shown the same one), and the ask event lines rendered from the
/// table as peers read (so `expires_in_ms` is current).
struct AskLines<'a> {
    approvals: &'a Approvals,
    cmdlines: RefCell<HashMap<u64, Option<Cmdline>>>,
}

impl AskLines<'_> {
    fn cmdline_of(&self, h: &crate::approvals::Held) -> Option<Cmdline> {
        self.cmdlines
            .borrow_mut()
            .entry(h.id)
            .or_insert_with(|| cmdline(h.req.pid))
            .clone()
    }

    fn forget(&self, id: u64) {
        self.cmdlines.borrow_mut().remove(&id);
    }

    /// Drops what is kept for requests no longer held (a done can overtake its ask).
    fn prune(&self) {
        let mut l = self.cmdlines.borrow_mut();
        if l.len() > self.approvals.len() + 64 {
            l.retain(|id, _| {
                self.approvals
                    .next_held(id - 1)
                    .is_some_and(|h| h.id == *id)
            });
        }
    }
}

impl peer::Asks for AskLines<'_> {
    fn next_ask(&self, after: u64) -> Option<(u64, Vec<u8>)> {
        let h = self.approvals.next_held(after)?;
        let c = self.cmdline_of(&h);
        Some((h.id, proto::line(&proto::ask_event(&h, c))))
    }

    fn newest(&self) -> u64 {
        self.approvals.newest()
    }
}

/// The lanes long commands run on, and their answers.
struct Lanes {
    /// Staging operations and `status`'s `staged` count (`None`: no `--stage`, or the
    /// thread could not start: they run on the control thread).
    stage: Option<Lane>,
    /// Reloads (they wait for a staging change in progress) and `learn`'s draft writes
    /// (drafting up to the recorder's bound and syncing the file).
    reload: Option<Lane>,
    done: Receiver<Done>,
}

impl Lanes {
    fn start(hooks: &Hooks, wake: &Waker) -> Lanes {
        let (tx, done) = std::sync::mpsc::channel();
        let lane = |name: &'static str| {
            wake.try_clone()
                .and_then(|w| Lane::start(name, tx.clone(), w))
                .map_err(|e| log::error!("control: no {name} lane ({e}); it runs here"))
                .ok()
        };
        Lanes {
            stage: hooks.stage.as_ref().and_then(|_| lane("stage")),
            reload: lane("reload"),
            done,
        }
    }
}

/// The server loop; runs for the daemon's lifetime. `lane_wake` wakes it when a lane's
/// answer is ready.
pub fn run(
    listener: UnixListener,
    (wake, lane_wake): (UnixStream, Waker),
    events: Receiver<Event>,
    approvals: Arc<Approvals>,
    access: Access,
    hooks: Hooks,
) {
    let lanes = Lanes::start(&hooks, &lane_wake);
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let asks = AskLines {
        approvals: &approvals,
        cmdlines: RefCell::new(HashMap::new()),
    };
    let mut next_id = 0u64;
    let mut last_reap = Instant::now();
    loop {
        // Deadlines: the next timeout, reaping while anything is held, dead peers.
        let now = Instant::now();
        let next = approvals.expire(now);
        if next.is_some() && last_reap.elapsed() >= REAP_EVERY {
            approvals.reap(dying);
            last_reap = Instant::now();
        }
        let wake_at = next
            .map(|t| t.min(now + REAP_EVERY))
            .into_iter()
            .chain(conns.values().filter_map(Conn::deadline))
            .min();
        let Some(ready) = wait(&listener, &wake, &conns, &asks, wake_at) else {
            continue;
        };
        if ready.wake {
            let mut b = [0u8; 256];
            while matches!((&wake).read(&mut b), Ok(n) if n > 0) {}
        }
        for d in lanes.done.try_iter() {
            // A peer gone meanwhile is not answered (ids are never reused).
            if let Some(c) = conns.get_mut(&d.conn) {
                c.fill(&d.answer);
            }
        }
        if ready.listener {
            accept_all(&listener, &mut conns, &mut next_id, access, &hooks);
        }
        for id in ready.peers {
            if let Some(c) = conns.get_mut(&id)
                && c.wants_read()
            {
                c.read();
            }
        }
        for (id, c) in conns.iter_mut() {
            serve_commands(c, *id, &approvals, &asks, &hooks, &lanes);
        }
        deliver(&events, &mut conns, &asks);
        let now = Instant::now();
        for c in conns.values_mut() {
            c.flush(&asks, now);
        }
        // Approvers before this round's closes (a closing one was one until now).
        let before = conns.values().filter(|c| c.subscribed).count();
        conns.retain(|_, c| !c.closing);
        let after = conns.values().filter(|c| c.approver()).count();
        approvals.set_approvers(after);
        if before > 0 && after == 0 && !approvals.is_empty() {
            // Nobody is left to answer what is held.
            log::info!("control: the last approver left; refusing what is held");
            approvals.orphaned();
        }
    }
}

/// What [`wait`] found ready.
struct Ready {
    listener: bool,
    wake: bool,
    /// Peers with something to read (or hung up).
    peers: Vec<u64>,
}

/// Polls the listener, the wake-up socket and every peer (for commands while it may send
/// them, for writing while something waits for it) until one is ready or `until`.
/// `None`: interrupted, or poll failed (logged): go round again.
fn wait(
    listener: &UnixListener,
    wake: &UnixStream,
    conns: &HashMap<u64, Conn>,
    asks: &AskLines<'_>,
    until: Option<Instant>,
) -> Option<Ready> {
    let timeout = match until {
        Some(t) => {
            let d = t.saturating_duration_since(Instant::now());
            PollTimeout::try_from(d.as_millis().clamp(1, 60_000) as i32)
                .unwrap_or(PollTimeout::NONE)
        }
        None => PollTimeout::NONE,
    };
    let mut ids: Vec<u64> = Vec::with_capacity(conns.len());
    let mut fds = vec![
        PollFd::new(listener.as_fd(), PollFlags::POLLIN),
        PollFd::new(wake.as_fd(), PollFlags::POLLIN),
    ];
    for (id, c) in conns {
        let mut f = PollFlags::empty();
        if c.wants_read() {
            f |= PollFlags::POLLIN;
        }
        if c.pending(asks) {
            f |= PollFlags::POLLOUT;
        }
        // A peer waiting only for a lane's answer is not polled: its hang-up would wake
        // the loop at once, again and again, until the answer (whose write then fails).
        if !f.is_empty() {
            ids.push(*id);
            fds.push(PollFd::new(c.stream().as_fd(), f));
        }
    }
    match poll(&mut fds, timeout) {
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return None,
        Err(e) => {
            log::error!("control: poll: {e}");
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
    }
    let r = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
    let peers = ids
        .iter()
        .zip(&fds[2..])
        .filter(|(_, f)| {
            f.revents()
                .is_some_and(|x| x.intersects(PollFlags::POLLIN | PollFlags::POLLHUP))
        })
        .map(|(id, _)| *id)
        .collect();
    Some(Ready {
        listener: r(&fds[0]),
        wake: r(&fds[1]),
        peers,
    })
}

/// Events from the approvals table, in order. For an ask, its command line is read now
/// (every approver is then sent the ask from the table as it reads); a done line is
/// rendered once and shared by every subscriber's queue.
fn deliver(events: &Receiver<Event>, conns: &mut HashMap<u64, Conn>, asks: &AskLines<'_>) {
    for ev in events.try_iter() {
        match &ev {
            Event::Ask(h) => {
                asks.cmdline_of(h);
            }
            Event::Done { id, .. } => {
                asks.forget(*id);
                let Some(v) = proto::done_event(&ev) else {
                    continue;
                };
                let line: Arc<[u8]> = proto::line(&v).into();
                for c in conns.values_mut().filter(|c| c.subscribed) {
                    if !c.decided.remove(id) {
                        c.event(&line);
                    }
                }
            }
        }
    }
    asks.prune();
}

fn accept_all(
    listener: &UnixListener,
    conns: &mut HashMap<u64, Conn>,
    next_id: &mut u64,
    access: Access,
    hooks: &Hooks,
) {
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::warn!("control: accept: {e}");
                return;
            }
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let cred = getsockopt(&stream, PeerCredentials).ok();
        let (uid, gid, pid) = cred.map_or((u32::MAX, u32::MAX, 0), |c| (c.uid(), c.gid(), c.pid()));
        if !authorized(access, uid, gid, pid) {
            log::warn!("control: refused a peer with uid {uid} (pid {pid})");
            refuse(stream, "not authorized");
            continue;
        } else if conns.len() >= MAX_CONNS {
            refuse(stream, "too many connections");
            continue;
        }
        let mut c = Conn::new(stream, uid);
        c.answer(&proto::greeting((hooks.generation)()));
        *next_id += 1;
        conns.insert(*next_id, c);
    }
}

/// One refusal line (best effort: the socket is new, so it has room), then closed.
fn refuse(stream: UnixStream, why: &str) {
    let _ = (&stream).write(&proto::line(&proto::error(why)));
}

/// Handles the peer's command lines while none of its answers waits (backpressure).
fn serve_commands(
    c: &mut Conn,
    id: u64,
    approvals: &Approvals,
    asks: &AskLines<'_>,
    hooks: &Hooks,
    lanes: &Lanes,
) {
    loop {
        c.render(asks);
        match c.next_line() {
            Next::Line(line) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                handle(c, id, &line, approvals, hooks, lanes);
            }
            Next::Wait => return,
            Next::TooLong => {
                c.answer(&proto::error("line too long"));
                return;
            }
        }
    }
}

/// Runs `work` on `lane` for connection `c` (its answer deferred), or here without a lane;
/// a full lane answers `busy` at once.
fn offload(
    c: &mut Conn,
    id: u64,
    lane: Option<&Lane>,
    what: &str,
    work: Box<dyn FnOnce() -> Value + Send>,
) {
    match lane {
        Some(l) => match l.submit(id, what, work) {
            Ok(()) => c.defer(),
            Err(busy) => c.answer(&busy),
        },
        None => c.answer(&work()),
    }
}

fn reload_answer(r: Result<Value, Vec<String>>) -> Value {
    match r {
        Ok(v) => proto::ok(v),
        Err(errors) => {
            json!({"ok": false, "error": "invalid policy; the old one stays in force", "errors": errors})
        }
    }
}

/// `status`: the daemon's counters at once; with staging, `staged` is counted on the stage
/// lane when it is idle, and is `null` with `stage_busy` (what runs, for how long, how many
/// wait) while a staging operation runs.
fn status(c: &mut Conn, id: u64, hooks: &Hooks, lanes: &Lanes) {
    let mut v = (hooks.status)();
    v["events_dropped"] = json!(peer::EVENTS_DROPPED.load(Ordering::Relaxed));
    let Some(staged) = hooks.staged.clone() else {
        return c.answer(&proto::ok(v));
    };
    match lanes.stage.as_ref().map(Lane::busy) {
        Some(Some((what, since, waiting))) => {
            v["staged"] = Value::Null;
            v["stage_busy"] = json!({
                "op": what,
                "for_ms": since.as_millis() as u64,
                "waiting": waiting,
            });
            c.answer(&proto::ok(v));
        }
        _ => offload(
            c,
            id,
            lanes.stage.as_ref(),
            "stage status count",
            Box::new(move || {
                v["staged"] = staged();
                proto::ok(v)
            }),
        ),
    }
}

/// Answers one command line (or hands it to a lane, which answers it later).
fn handle(c: &mut Conn, id: u64, line: &[u8], approvals: &Approvals, hooks: &Hooks, lanes: &Lanes) {
    let cmd = match proto::parse(line) {
        Ok(cmd) => cmd,
        Err(e) => return c.answer(&proto::error(&e)),
    };
    let answer = match cmd {
        Command::Status => return status(c, id, hooks, lanes),
        Command::Reload => {
            let f = hooks.reload.clone();
            let work = Box::new(move || reload_answer(f()));
            return offload(c, id, lanes.reload.as_ref(), "reload", work);
        }
        Command::Learn => match &hooks.learn {
            Some(f) => {
                let f = f.clone();
                let work = Box::new(move || match f() {
                    Ok(v) => proto::ok(v),
                    Err(e) => proto::error(&e),
                });
                return offload(c, id, lanes.reload.as_ref(), "learn", work);
            }
            None => proto::error("this mount does not learn (no --learn)"),
        },
        Command::Stage(r) => match &hooks.stage {
            Some(f) => {
                let (f, uid, what) = (f.clone(), c.uid, format!("stage {}", r.op));
                let work = Box::new(move || f(&r, uid));
                return offload(c, id, lanes.stage.as_ref(), &what, work);
            }
            None => proto::error("this mount has no --stage"),
        },
        // Streamed as the peer reads: never dropped, however many are held.
        Command::Held => return c.answer_held(approvals.newest()),
        Command::Subscribe => {
            // From now on it is sent every held request, those held already first.
            c.subscribed = true;
            approvals.set_approvers(approvals.approvers().max(1));
            proto::ok(json!({}))
        }
        Command::Decide {
            id,
            allow,
            remember,
        } => {
            c.decided.insert(id);
            let remember = match remember {
                Remember::Once => crate::approvals::Remember::Once,
                Remember::Path => crate::approvals::Remember::Path,
                Remember::Always => crate::approvals::Remember::Always,
            };
            match approvals.decide(id, allow, remember, c.uid) {
                Ok(()) => proto::ok(json!({"id": id})),
                Err(e) => {
                    c.decided.remove(&id);
                    proto::error(&e)
                }
            }
        }
    };
    c.answer(&answer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_the_daemon_cannot_see_are_not_reaped() {
        assert!(!dying(0), "pid 0: outside the daemon's pid namespace");
        assert!(cmdline(0).is_none());
        assert!(!dying(std::process::id()), "this process is alive");
        assert!(cmdline(std::process::id()).is_some());
    }
}
