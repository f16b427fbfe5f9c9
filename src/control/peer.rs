//! One peer of the control socket: its commands in, its answers and events out.
//!
//! Invariants (SPEC.md, the paragraph after the control-socket commands):
//! - **Answers are never dropped.** They are streamed with backpressure: a long answer
//!   (`held` with 1,024 entries) is rendered one entry at a time as the peer reads, and no
//!   further command of the peer is read while an answer of its own waits. What a peer can
//!   make the daemon keep for it is one chunk ([`CHUNK`]) plus one line, a command line
//!   ([`MAX_LINE`]) and a cursor.
//! - **Asks are never dropped either.** An approver's ask events are not queued: each peer
//!   has a cursor into the table of held requests (ids only grow) and is sent the next held
//!   request as it reads, so a burst of 1,024 asks costs no memory per peer, a slow
//!   approver gets every request still held, and one that subscribes gets what is held
//!   already the same way.
//! - **Other events may be dropped, and are counted.** `done` events wait in a per-peer
//!   queue of shared lines; past [`MAX_EVENT_BACKLOG`] bytes ([`event_backlog`]) queued for
//!   a peer, new ones for it are dropped and counted (`events_dropped` in `status`), and once
//!   it has caught up it is told how many with `{"event":"dropped","events":N}`.
//! - **A dead peer is disconnected.** A peer that has read nothing for [`dead_after`]
//!   while data waits for it is closed; a live peer is never closed for being slow.

use std::collections::{HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::proto::{self, MAX_LINE};

/// Output rendered ahead for a peer (whole lines are added while less than this waits).
pub const CHUNK: usize = 64 * 1024;
/// Events queued for a peer past which new events for it are dropped (counted).
pub const MAX_EVENT_BACKLOG: usize = 16 << 20;
/// A peer that reads nothing for this long while data waits for it is dead.
pub const DEAD_AFTER: Duration = Duration::from_secs(60);

/// [`DEAD_AFTER`], or `FENCEFS_CONTROL_DEAD_AFTER_MS` (for tests only: undocumented in
/// `--help`, read once).
pub fn dead_after() -> Duration {
    static D: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("FENCEFS_CONTROL_DEAD_AFTER_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(DEAD_AFTER, Duration::from_millis)
    })
}

/// [`MAX_EVENT_BACKLOG`], or `FENCEFS_CONTROL_EVENT_BACKLOG` bytes (for tests only, as
/// [`dead_after`]).
pub fn event_backlog() -> usize {
    static B: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *B.get_or_init(|| {
        std::env::var("FENCEFS_CONTROL_EVENT_BACKLOG")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(MAX_EVENT_BACKLOG)
    })
}

/// Events dropped for slow peers since the daemon started (`events_dropped`).
pub static EVENTS_DROPPED: AtomicU64 = AtomicU64::new(0);

/// What [`Conn::next_line`] found.
pub enum Next {
    /// A command line (without its newline).
    Line(Vec<u8>),
    /// Nothing to handle now.
    Wait,
    /// A line longer than [`MAX_LINE`].
    TooLong,
}

/// Where a peer's ask events come from: the table of held requests.
pub trait Asks {
    /// The held request with the lowest id above `after`: its id and its ask event line.
    fn next_ask(&self, after: u64) -> Option<(u64, Vec<u8>)>;
    /// The highest id held now (0: none).
    fn newest(&self) -> u64;
}

/// An answer waiting to be written.
enum Answer {
    /// One line, rendered.
    Line(Vec<u8>),
    /// `{"ok":true,"held":[…]}`: the requests held with ids in `after+1..=until` when
    /// their turn comes (those that ended meanwhile are left out).
    Held {
        after: u64,
        until: u64,
        started: bool,
    },
    /// Being worked out on a lane (`lane.rs`): nothing after it is written until it is
    /// [filled](Conn::fill); events and asks still flow meanwhile.
    Pending,
}

/// A connection.
pub struct Conn {
    stream: UnixStream,
    /// The peer's uid (SO_PEERCRED).
    pub uid: u32,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    answers: VecDeque<Answer>,
    events: VecDeque<Arc<[u8]>>,
    events_bytes: usize,
    /// Events dropped for this peer not yet reported to it.
    unreported: u64,
    /// Since when data has waited without the peer reading any.
    stalled_since: Option<Instant>,
    /// It asked for events (`subscribe`).
    pub subscribed: bool,
    /// Asks with ids up to this one were sent (subscribed peers).
    ask_cursor: u64,
    /// Requests this peer answered: it gets no `done` for them.
    pub decided: HashSet<u64>,
    /// It closed its side: it sends no more commands (and cannot answer).
    eof: bool,
    /// To be closed.
    pub closing: bool,
}

impl Conn {
    /// A new connection (non-blocking stream).
    pub fn new(stream: UnixStream, uid: u32) -> Conn {
        Conn {
            stream,
            uid,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            answers: VecDeque::new(),
            events: VecDeque::new(),
            events_bytes: 0,
            unreported: 0,
            stalled_since: None,
            subscribed: false,
            ask_cursor: 0,
            decided: HashSet::new(),
            eof: false,
            closing: false,
        }
    }

    /// The stream, for poll.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Whether it can answer held requests now.
    pub fn approver(&self) -> bool {
        self.subscribed && !self.eof && !self.closing
    }

    /// Queues an answer (never dropped).
    pub fn answer(&mut self, v: &Value) {
        self.answers.push_back(Answer::Line(proto::line(v)));
    }

    /// Queues the place of an answer a lane works out; [`Conn::fill`] puts it there.
    pub fn defer(&mut self) {
        self.answers.push_back(Answer::Pending);
    }

    /// The answer a lane worked out, in the place [`Conn::defer`] kept for it.
    pub fn fill(&mut self, v: &Value) {
        match self
            .answers
            .iter_mut()
            .find(|a| matches!(a, Answer::Pending))
        {
            Some(a) => *a = Answer::Line(proto::line(v)),
            None => log::warn!("control: an answer for a peer that waits for none"),
        }
    }

    /// Whether an answer is ready to be written (not one a lane still works out).
    fn answer_ready(&self) -> bool {
        self.answers
            .front()
            .is_some_and(|a| !matches!(a, Answer::Pending))
    }

    /// Queues the answer to `held`: what is held now, up to id `until`.
    pub fn answer_held(&mut self, until: u64) {
        self.answers.push_back(Answer::Held {
            after: 0,
            until,
            started: false,
        });
    }

    /// Whether ask events wait for it.
    fn asks_waiting(&self, asks: &dyn Asks) -> bool {
        self.subscribed && !self.eof && !self.closing && asks.newest() > self.ask_cursor
    }

    /// Queues an event, or drops and counts it when too much waits for this peer already.
    pub fn event(&mut self, line: &Arc<[u8]>) {
        if self.eof || self.closing {
            return;
        }
        if self.events_bytes + line.len() > event_backlog() {
            if self.unreported == 0 {
                log::warn!(
                    "control: a peer (uid {}) does not keep up; dropping events for it",
                    self.uid
                );
            }
            self.unreported += 1;
            EVENTS_DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.events_bytes += line.len();
        self.events.push_back(line.clone());
    }

    /// Whether anything waits to be written.
    pub fn pending(&self, asks: &dyn Asks) -> bool {
        !self.wbuf.is_empty()
            || self.answer_ready()
            || !self.events.is_empty()
            || self.unreported > 0
            || self.asks_waiting(asks)
    }

    /// Whether to poll it for commands: not while an answer of its own waits (that is
    /// the backpressure), nor while a command read already waits its turn.
    pub fn wants_read(&self) -> bool {
        !self.eof && !self.closing && self.answers.is_empty() && !self.rbuf.contains(&b'\n')
    }

    /// Renders whole lines into the write buffer while less than [`CHUNK`] waits there:
    /// answers first, then events, then asks.
    fn refill(&mut self, asks: &dyn Asks) {
        while self.wbuf.len() < CHUNK {
            if let Some(a) = self
                .answers
                .front_mut()
                .filter(|a| !matches!(a, Answer::Pending))
            {
                match a {
                    Answer::Line(l) => {
                        self.wbuf.append(l);
                        self.answers.pop_front();
                    }
                    Answer::Held {
                        after,
                        until,
                        started,
                    } => {
                        if !*started {
                            self.wbuf.extend_from_slice(br#"{"ok":true,"held":["#);
                        }
                        match asks.next_ask(*after).filter(|(id, _)| *id <= *until) {
                            Some((id, line)) => {
                                if *started {
                                    self.wbuf.push(b',');
                                }
                                // The event line without its newline.
                                self.wbuf.extend_from_slice(&line[..line.len() - 1]);
                                *after = id;
                                *started = true;
                            }
                            None => {
                                self.wbuf.extend_from_slice(b"]}\n");
                                self.answers.pop_front();
                            }
                        }
                    }
                    Answer::Pending => break, // filtered out above
                }
            } else if let Some(e) = self.events.pop_front() {
                self.events_bytes -= e.len();
                self.wbuf.extend_from_slice(&e);
            } else if self.unreported > 0 {
                let n = std::mem::take(&mut self.unreported);
                self.wbuf
                    .extend_from_slice(&proto::line(&json!({"event": "dropped", "events": n})));
            } else if self.asks_waiting(asks)
                && let Some((id, line)) = asks.next_ask(self.ask_cursor)
            {
                self.ask_cursor = id;
                self.wbuf.extend_from_slice(&line);
            } else {
                break;
            }
        }
    }

    /// Writes what the socket takes now; keeps the dead-peer clock.
    pub fn flush(&mut self, asks: &dyn Asks, now: Instant) {
        loop {
            self.refill(asks);
            if self.wbuf.is_empty() {
                break;
            }
            match self.stream.write(&self.wbuf) {
                Ok(0) => {
                    self.closing = true;
                    return;
                }
                Ok(n) => {
                    self.wbuf.drain(..n);
                    self.stalled_since = Some(now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.closing = true;
                    return;
                }
            }
        }
        if !self.pending(asks) {
            self.stalled_since = None;
            if self.eof && self.answers.is_empty() && !self.rbuf.contains(&b'\n') {
                // It said all it had to say and got every answer.
                self.closing = true;
            }
            return;
        }
        let since = *self.stalled_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= dead_after() {
            log::warn!(
                "control: disconnecting a peer (uid {}) that has read nothing for {} s",
                self.uid,
                dead_after().as_secs_f64()
            );
            self.closing = true;
        }
    }

    /// When the dead-peer clock runs out, if data waits.
    pub fn deadline(&self) -> Option<Instant> {
        self.stalled_since.map(|t| t + dead_after())
    }

    /// Reads what the peer sent (at most one command line beyond what waits).
    pub fn read(&mut self) {
        let mut buf = [0u8; 16 * 1024];
        while !self.eof && self.rbuf.len() <= MAX_LINE && !self.rbuf.contains(&b'\n') {
            match self.stream.read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.rbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.closing = true;
                    break;
                }
            }
        }
    }

    /// The next command line to handle, if it may be handled now (no answer of its own
    /// waits); a line too long ends the peer's commands (it gets the error, then is closed).
    pub fn next_line(&mut self) -> Next {
        if self.closing || !self.answers.is_empty() {
            return Next::Wait;
        }
        match self.rbuf.iter().position(|&b| b == b'\n') {
            Some(pos) => {
                let mut line: Vec<u8> = self.rbuf.drain(..=pos).collect();
                line.pop();
                Next::Line(line)
            }
            None if self.rbuf.len() > MAX_LINE => {
                self.rbuf.clear();
                self.eof = true;
                Next::TooLong
            }
            None => Next::Wait,
        }
    }

    /// Moves rendered answers into the write buffer while there is room, so that commands
    /// with short answers (a burst of `decide`s) are served without a poll round each.
    pub fn render(&mut self, asks: &dyn Asks) {
        self.refill(asks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    /// A table of `n` held requests whose ask lines are `line_len` bytes each.
    struct Table {
        n: u64,
        line_len: usize,
    }

    impl Asks for Table {
        fn next_ask(&self, after: u64) -> Option<(u64, Vec<u8>)> {
            let id = after + 1;
            (id <= self.n).then(|| {
                let pad = "x".repeat(self.line_len - 40);
                let mut l = serde_json::to_vec(&json!({"event":"ask","id":id,"p":pad})).unwrap();
                l.push(b'\n');
                (id, l)
            })
        }
        fn newest(&self) -> u64 {
            self.n
        }
    }

    #[test]
    fn a_long_answer_is_streamed_with_backpressure_and_arrives_whole() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let t = Table {
            n: 2000,
            line_len: 4096,
        };
        let mut c = Conn::new(ours, 0);
        c.answer_held(t.newest());
        let now = Instant::now();
        // The peer reads nothing: what is rendered ahead stays one chunk and a line.
        for _ in 0..50 {
            c.flush(&t, now);
            assert!(c.wbuf.len() < CHUNK + 4200, "{}", c.wbuf.len());
            assert!(!c.wants_read(), "no command is read while its answer waits");
        }
        assert!(c.pending(&t) && !c.closing);
        // The peer reads: the whole 8 MB answer, one valid line.
        let reader = std::thread::spawn(move || {
            let mut l = String::new();
            std::io::BufReader::new(theirs).read_line(&mut l).unwrap();
            l
        });
        while c.pending(&t) {
            c.flush(&t, Instant::now());
            std::thread::sleep(Duration::from_millis(1));
        }
        let l = reader.join().unwrap();
        let v: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["ok"], true);
        let ids: Vec<u64> = v["held"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, (1..=2000).collect::<Vec<u64>>());
        assert!(c.wants_read());
    }

    #[test]
    fn a_subscriber_is_sent_every_held_request_and_events_past_the_bound_are_counted() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let t = Table {
            n: 300,
            line_len: 4096,
        };
        let mut c = Conn::new(ours, 0);
        c.subscribed = true;
        let done: Arc<[u8]> = proto::line(&json!({"event":"done","id":1})).into();
        let before = EVENTS_DROPPED.load(Ordering::Relaxed);
        let n = event_backlog() / done.len() + 10;
        for _ in 0..n {
            c.event(&done);
        }
        assert!(EVENTS_DROPPED.load(Ordering::Relaxed) - before >= 10);
        let reader = std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(theirs);
            let (mut asks, mut dones, mut dropped) = (0, 0, 0);
            while asks < 300 {
                let mut l = String::new();
                r.read_line(&mut l).unwrap();
                let v: Value = serde_json::from_str(&l).unwrap();
                match v["event"].as_str() {
                    Some("ask") => asks += 1,
                    Some("done") => dones += 1,
                    Some("dropped") => dropped = v["events"].as_u64().unwrap(),
                    _ => panic!("{l}"),
                }
            }
            (asks, dones, dropped)
        });
        while c.pending(&t) {
            c.flush(&t, Instant::now());
            std::thread::sleep(Duration::from_millis(1));
        }
        let (asks, dones, dropped) = reader.join().unwrap();
        assert_eq!(asks, 300);
        assert_eq!(dones as u64 + dropped, n as u64, "each queued or counted");
        assert!(dropped >= 10);
    }
}
