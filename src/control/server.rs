//! The control socket server: one thread, `poll(2)` over the listener, every connection
//! and a wake-up socket; no thread per connection.
//!
//! Invariants:
//! - Only root, the daemon's uid and members of `--control-group` are served (SO_PEERCRED,
//!   and the peer's groups from /proc); anyone else gets one refusal line and is closed.
//! - Nothing a peer does blocks the file system: sockets are non-blocking, a command line
//!   is at most [`MAX_LINE`] bytes, at most [`MAX_CONNS`] peers are served, and a peer
//!   whose unread output passes [`MAX_BACKLOG`] (a stuck approver) is dropped.
//! - The server also keeps the approvals' clocks: timeouts, and askers killed while held
//!   (a pending SIGKILL in /proc: the kernel would drop the answer anyway).

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use serde_json::{Value, json};

use super::proto::{self, Command, MAX_LINE, Remember};
use crate::approvals::{Approvals, Event};

/// Peers served at once.
pub const MAX_CONNS: usize = 64;
/// Unread output after which a peer is dropped.
pub const MAX_BACKLOG: usize = 4 << 20;
/// How often held requests' askers are checked while something is held.
const REAP_EVERY: Duration = Duration::from_millis(200);

/// What the server asks of the rest of the daemon.
pub struct Hooks {
    /// Fields of the `status` answer.
    pub status: Box<dyn Fn() -> Value + Send>,
    /// Reloads the policy: `generation`/`rules` fields, or the error lines.
    pub reload: Box<dyn Fn() -> Result<Value, Vec<String>> + Send>,
    /// The policy generation in force.
    pub generation: Box<dyn Fn() -> u64 + Send>,
    /// Staging operations (`None`: the mount has no `--stage`).
    pub stage: Option<crate::stage::control::Handler>,
}

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
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    if let Some(g) = group {
        std::os::unix::fs::lchown(path, None, Some(g))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    }
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The write end of the server's wake-up socket: events queued elsewhere become readable.
pub struct Waker(UnixStream);

impl Waker {
    /// Wakes the server (never blocks; a full socket means it is awake already).
    pub fn wake(&self) {
        let _ = (&self.0).write(&[1]);
    }
}

/// A wake-up pair: the waker for event producers, the other end for [`run`].
pub fn waker() -> io::Result<(Waker, UnixStream)> {
    let (a, b) = UnixStream::pair()?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    Ok((Waker(a), b))
}

struct Conn {
    stream: UnixStream,
    uid: u32,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    subscribed: bool,
    /// Requests this peer answered: it gets no `done` for them.
    decided: HashSet<u64>,
    closing: bool,
}

impl Conn {
    fn send(&mut self, v: &Value) {
        self.wbuf.extend_from_slice(&proto::line(v));
        if self.wbuf.len() > MAX_BACKLOG {
            log::warn!(
                "control: dropping a peer (uid {}) that does not read its answers",
                self.uid
            );
            self.closing = true;
            self.wbuf.clear();
        }
    }

    fn flush(&mut self) {
        while !self.wbuf.is_empty() {
            match self.stream.write(&self.wbuf) {
                Ok(0) => {
                    self.closing = true;
                    return;
                }
                Ok(n) => {
                    self.wbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.closing = true;
                    return;
                }
            }
        }
    }
}

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

fn cmdline(pid: u32) -> Option<Vec<String>> {
    if pid == 0 {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if raw.is_empty() {
        return None;
    }
    Some(
        raw.split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// The server loop; runs for the daemon's lifetime.
pub fn run(
    listener: UnixListener,
    wake: UnixStream,
    events: Receiver<Event>,
    approvals: Arc<Approvals>,
    access: Access,
    hooks: Hooks,
) {
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut next_id = 0u64;
    let mut last_reap = Instant::now();
    loop {
        // Deadlines: the next timeout, and reaping while anything is held.
        let now = Instant::now();
        let next = approvals.expire(now);
        let timeout = match next {
            Some(t) => {
                let d = t.saturating_duration_since(now).min(REAP_EVERY);
                PollTimeout::try_from(d.as_millis().max(1) as i32).unwrap_or(PollTimeout::NONE)
            }
            None => PollTimeout::NONE,
        };
        if next.is_some() && last_reap.elapsed() >= REAP_EVERY {
            approvals.reap(dying);
            last_reap = Instant::now();
        }
        let ids: Vec<u64> = conns.keys().copied().collect();
        let (ready_listener, ready_wake, ready) = {
            let mut fds = vec![
                PollFd::new(listener.as_fd(), PollFlags::POLLIN),
                PollFd::new(wake.as_fd(), PollFlags::POLLIN),
            ];
            for id in &ids {
                let c = &conns[id];
                let mut f = PollFlags::POLLIN;
                if !c.wbuf.is_empty() {
                    f |= PollFlags::POLLOUT;
                }
                fds.push(PollFd::new(c.stream.as_fd(), f));
            }
            match poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    log::error!("control: poll: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
            let r = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            let ready: Vec<(u64, bool)> = ids
                .iter()
                .zip(&fds[2..])
                .filter(|(_, f)| r(f))
                .map(|(id, f)| {
                    (
                        *id,
                        f.revents()
                            .is_some_and(|x| x.intersects(PollFlags::POLLIN | PollFlags::POLLHUP)),
                    )
                })
                .collect();
            (r(&fds[0]), r(&fds[1]), ready)
        };
        if ready_wake {
            let mut b = [0u8; 256];
            while matches!((&wake).read(&mut b), Ok(n) if n > 0) {}
        }
        if ready_listener {
            accept_all(&listener, &mut conns, &mut next_id, access, &hooks);
        }
        for (id, readable) in ready {
            if readable && let Some(c) = conns.get_mut(&id) {
                read_commands(c, &approvals, &hooks);
            }
        }
        // Events from the approvals table (asks and dones), in order.
        for ev in events.try_iter() {
            let line = match &ev {
                Event::Ask(h) => proto::ask_event(h, cmdline(h.req.pid)),
                Event::Done { .. } => match proto::done_event(&ev) {
                    Some(v) => v,
                    None => continue,
                },
            };
            let done_id = match ev {
                Event::Done { id, .. } => Some(id),
                Event::Ask(_) => None,
            };
            for c in conns.values_mut().filter(|c| c.subscribed) {
                if done_id.is_some_and(|id| c.decided.remove(&id)) {
                    continue;
                }
                c.send(&line);
            }
        }
        for c in conns.values_mut() {
            c.flush();
        }
        let before = approvers(&conns);
        // A closing peer got its last line written above (or never reads it).
        conns.retain(|_, c| !c.closing);
        let after = approvers(&conns);
        approvals.set_approvers(after);
        if before > 0 && after == 0 {
            // Nobody is left to answer what is held.
            approvals.orphaned();
        }
    }
}

fn approvers(conns: &HashMap<u64, Conn>) -> usize {
    conns
        .values()
        .filter(|c| c.subscribed && !c.closing)
        .count()
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
        let mut c = Conn {
            stream,
            uid,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            subscribed: false,
            decided: HashSet::new(),
            closing: false,
        };
        if !authorized(access, uid, gid, pid) {
            log::warn!("control: refused a peer with uid {uid} (pid {pid})");
            c.send(&proto::error("not authorized"));
            c.closing = true;
        } else if conns.len() >= MAX_CONNS {
            c.send(&proto::error("too many connections"));
            c.closing = true;
        } else {
            c.send(&proto::greeting((hooks.generation)()));
        }
        c.flush();
        if c.closing && c.wbuf.is_empty() {
            continue;
        }
        *next_id += 1;
        conns.insert(*next_id, c);
    }
}

fn read_commands(c: &mut Conn, approvals: &Approvals, hooks: &Hooks) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match c.stream.read(&mut buf) {
            Ok(0) => {
                c.closing = true;
                break;
            }
            Ok(n) => c.rbuf.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                c.closing = true;
                break;
            }
        }
        if c.rbuf.len() > MAX_LINE {
            break;
        }
    }
    if c.closing {
        c.wbuf.clear();
    }
    while let Some(pos) = c.rbuf.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = c.rbuf.drain(..=pos).collect();
        let line = &line[..line.len() - 1];
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Some(answer) = handle(c, line, approvals, hooks) {
            c.send(&answer);
        }
    }
    if c.rbuf.len() > MAX_LINE {
        c.send(&proto::error("line too long"));
        c.rbuf.clear();
        c.closing = true;
    }
}

/// Answers one command line (`None`: it answered itself).
fn handle(c: &mut Conn, line: &[u8], approvals: &Approvals, hooks: &Hooks) -> Option<Value> {
    let cmd = match proto::parse(line) {
        Ok(cmd) => cmd,
        Err(e) => return Some(proto::error(&e)),
    };
    let answer = match cmd {
        Command::Status => proto::ok((hooks.status)()),
        Command::Reload => match (hooks.reload)() {
            Ok(v) => proto::ok(v),
            Err(errors) => {
                json!({"ok": false, "error": "invalid policy; the old one stays in force", "errors": errors})
            }
        },
        Command::Stage(r) => match &hooks.stage {
            Some(f) => f(&r),
            None => proto::error("this mount has no --stage"),
        },
        Command::Held => {
            let held: Vec<Value> = approvals
                .held()
                .iter()
                .map(|h| proto::ask_event(h, cmdline(h.req.pid)))
                .collect();
            proto::ok(json!({ "held": held }))
        }
        Command::Subscribe => {
            c.subscribed = true;
            approvals.set_approvers(approvals.approvers().max(1));
            c.send(&proto::ok(json!({})));
            // What is held already, as events.
            for h in approvals.held() {
                c.send(&proto::ask_event(&h, cmdline(h.req.pid)));
            }
            return None;
        }
        Command::Decide {
            id,
            allow,
            remember,
        } => {
            c.decided.insert(id);
            match approvals.decide(id, allow, remember == Remember::Path, c.uid) {
                Ok(()) => proto::ok(json!({"id": id})),
                Err(e) => {
                    c.decided.remove(&id);
                    proto::error(e)
                }
            }
        }
    };
    Some(answer)
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
