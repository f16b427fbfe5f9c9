//! The audit trail: one JSON object per line, written by its own thread.
//!
//! Modules, each with one job:
//! - `mod.rs` (here): the handle the file system holds (`Audit`), the event and its JSON
//!   form, the shared counters.
//! - `coalesce.rs`: PURE — folds identical refusals (uid, op, path, errno) into one line
//!   per 1 s window (`"repeat": N`); bounded number of open windows.
//! - `rotate.rs`: the output — stderr, or a file rotated by size (FILE.1 … FILE.N).
//! - `writer.rs`: the thread that ties them together, woken by events and by a timer.
//!
//! Invariant: logging never blocks or fails a file operation. `Audit::log` is O(1): a
//! `try_send` on a bounded queue; when the queue is full the event is counted as dropped
//! (two atomic adds) and the count is written as a `dropped` line once the writer catches
//! up. The writer thread never panics; what it cannot write it counts as dropped.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::SystemTime;

use serde_json::{Map, Value, json};

mod coalesce;
mod rotate;
mod writer;

pub use rotate::Rotation;
use writer::Tuning;

/// One audited decision.
#[derive(Debug, Clone)]
pub struct Event {
    /// FUSE operation name.
    pub op: &'static str,
    /// Workspace-relative path bytes.
    pub path: Vec<u8>,
    /// Caller uid, gid, pid.
    pub uid: u32,
    /// Caller gid.
    pub gid: u32,
    /// Caller pid.
    pub pid: u32,
    /// "allow" or "deny" (unless `held`).
    pub allowed: bool,
    /// The request is held for an approver: decision "ask".
    pub held: bool,
    /// `--learn`: refused by the policy, allowed in report-only form: decision
    /// "would-deny".
    pub would_deny: bool,
    /// The uid of the approver whose answer decided (`by` = "approver").
    pub approver: Option<u32>,
    /// Errno name for refusals.
    pub errno: Option<&'static str>,
    /// Effective access of the path.
    pub access: &'static str,
    /// "rule" | "default" | "mode" | "protected" | "writable_roots".
    pub by: &'static str,
    /// The deciding rule's (or `protected` entry's) pattern and its line in the policy
    /// file when known.
    pub rule: Option<(String, Option<usize>)>,
    /// The file of the layer that decided (`None`: the built-in policy).
    pub layer: Option<String>,
    /// The root the path is in, by its path in the mount (`None`: SOURCE).
    pub root: Option<String>,
    /// Mode in force.
    pub mode: &'static str,
    /// Policy generation.
    pub generation: u64,
    /// The access level the decision needed (`None`: not a policy check, e.g. an
    /// `exec = false` refusal).
    pub need: Option<&'static str>,
    /// The policy has program rules and the caller's program could not be known: it was
    /// decided with the most restrictive answer any program could get (`"program":"unknown"`).
    pub program_unknown: bool,
}

enum Msg {
    Event(Box<Event>),
    /// A daemon event (`{"ts","op":"audit","event":..}` and its fields), written as is.
    Note(Box<Value>),
    Reopen,
    /// Write every open window and pending count now, then answer.
    Flush(std::sync::mpsc::SyncSender<()>),
}

/// Where audit lines go.
#[derive(Debug, Clone)]
pub enum Target {
    /// Standard error.
    Stderr,
    /// Append to a file.
    File(PathBuf),
}

/// State shared by the handle and the writer thread.
#[derive(Default)]
struct Counters {
    /// A reopen was asked for (SIGHUP). A flag, not only a message, so that a full queue
    /// cannot lose it; the `Reopen` message just wakes the writer.
    reopen: AtomicBool,
    /// Dropped since the last `dropped` line (the writer swaps it to 0 when it reports).
    pending_dropped: AtomicU64,
    /// Dropped since start: queue full, or a line that could not be written.
    dropped_total: AtomicU64,
    /// Refusals folded into a window line instead of a line of their own.
    coalesced_total: AtomicU64,
}

impl Counters {
    fn drop_events(&self, n: u64) {
        self.pending_dropped.fetch_add(n, Ordering::Relaxed);
        self.dropped_total.fetch_add(n, Ordering::Relaxed);
    }
}

/// Handle to the audit writer.
pub struct Audit {
    tx: SyncSender<Msg>,
    counters: Arc<Counters>,
    /// Also log allowed operations.
    pub allowed: bool,
}

impl Audit {
    /// Opens the target (an error here is a startup error) and starts the writer thread.
    /// `rotation` applies to a file target only.
    pub fn start(target: Target, allowed: bool, rotation: Rotation) -> io::Result<Audit> {
        Audit::start_tuned(target, allowed, rotation, Tuning::default())
    }

    fn start_tuned(
        target: Target,
        allowed: bool,
        rotation: Rotation,
        tuning: Tuning,
    ) -> io::Result<Audit> {
        let sink = rotate::Sink::open(target, rotation)?;
        let (tx, rx) = sync_channel(tuning.queue);
        let counters = Arc::new(Counters::default());
        let c2 = counters.clone();
        std::thread::Builder::new()
            .name("fencefs-audit".into())
            .spawn(move || writer::run(rx, sink, c2, tuning))?;
        Ok(Audit {
            tx,
            counters,
            allowed,
        })
    }

    /// Queues an event; never blocks.
    pub fn log(&self, ev: Event) {
        match self.tx.try_send(Msg::Event(Box::new(ev))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.drop_events(1);
            }
        }
    }

    /// Queues a daemon event (not a caller's operation): `{"ts":..,"op":"audit",
    /// "event":EVENT, ...fields}`, e.g. a policy reload and its outcome; never blocks.
    pub fn note(&self, event: &str, fields: Map<String, Value>) {
        let mut v =
            serde_json::json!({"ts": timestamp(SystemTime::now()), "op": "audit", "event": event});
        if let Value::Object(m) = &mut v {
            m.extend(fields);
        }
        if self.tx.try_send(Msg::Note(Box::new(v))).is_err() {
            self.counters.drop_events(1);
        }
    }

    /// Writes what is pending (open coalescing windows, drop counts) and waits for it, at
    /// most `limit`; at shutdown, so the last second of refusals is not lost. `false` if the
    /// writer did not answer in time.
    pub fn flush(&self, limit: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let (done_tx, done_rx) = sync_channel(1);
        let mut msg = Msg::Flush(done_tx);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if std::time::Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(_) => return false,
            }
        }
        done_rx
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .is_ok()
    }

    /// Reopens the audit file (after logrotate); never blocks.
    pub fn reopen(&self) {
        self.counters.reopen.store(true, Ordering::Relaxed);
        let _ = self.tx.try_send(Msg::Reopen);
    }

    /// Events dropped since start (queue full, or not writable).
    pub fn dropped_total(&self) -> u64 {
        self.counters.dropped_total.load(Ordering::Relaxed)
    }

    /// Refusals folded into a `repeat` line since start (as far as the writer got).
    pub fn coalesced_total(&self) -> u64 {
        self.counters.coalesced_total.load(Ordering::Relaxed)
    }
}

/// Renders path bytes: UTF-8 as is; otherwise lossy text plus the exact bytes in hex.
pub fn path_fields(path: &[u8], m: &mut Map<String, Value>) {
    match std::str::from_utf8(path) {
        Ok(s) => {
            m.insert("path".into(), Value::String(s.to_string()));
        }
        Err(_) => {
            m.insert(
                "path".into(),
                Value::String(String::from_utf8_lossy(path).into_owned()),
            );
            let hex: String = path.iter().map(|b| format!("{b:02x}")).collect();
            m.insert("path_hex".into(), Value::String(hex));
        }
    }
}

impl Event {
    /// The JSON object of this event, standing for `repeat` identical events.
    pub fn to_json(&self, repeat: u64) -> Value {
        let mut m = Map::new();
        m.insert("ts".into(), Value::String(timestamp(SystemTime::now())));
        m.insert("op".into(), Value::String(self.op.into()));
        path_fields(&self.path, &mut m);
        m.insert("uid".into(), json!(self.uid));
        m.insert("gid".into(), json!(self.gid));
        m.insert("pid".into(), json!(self.pid));
        m.insert(
            "decision".into(),
            Value::String(
                if self.held {
                    "ask"
                } else if self.would_deny {
                    "would-deny"
                } else if self.allowed {
                    "allow"
                } else {
                    "deny"
                }
                .into(),
            ),
        );
        // Every key is always present; what does not apply is null.
        m.insert(
            "errno".into(),
            self.errno.map_or(Value::Null, |e| Value::String(e.into())),
        );
        m.insert("access".into(), Value::String(self.access.into()));
        m.insert("by".into(), Value::String(self.by.into()));
        match &self.rule {
            Some((pat, line)) => {
                m.insert("rule".into(), Value::String(pat.clone()));
                m.insert("rule_line".into(), json!(line));
            }
            None => {
                m.insert("rule".into(), Value::Null);
                m.insert("rule_line".into(), Value::Null);
            }
        }
        m.insert(
            "layer".into(),
            self.layer.clone().map_or(Value::Null, Value::String),
        );
        m.insert(
            "root".into(),
            self.root.clone().map_or(Value::Null, Value::String),
        );
        m.insert("mode".into(), Value::String(self.mode.into()));
        m.insert(
            "need".into(),
            self.need.map_or(Value::Null, |n| Value::String(n.into())),
        );
        m.insert(
            "program".into(),
            if self.program_unknown {
                Value::String("unknown".into())
            } else {
                Value::Null
            },
        );
        m.insert("generation".into(), json!(self.generation));
        m.insert("repeat".into(), json!(repeat));
        m.insert(
            "approver".into(),
            self.approver.map_or(Value::Null, |u| json!(u)),
        );
        Value::Object(m)
    }
}

/// RFC 3339 UTC timestamp with milliseconds, e.g. `2026-11-30T12:00:00.123Z`.
pub fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let ms = d.subsec_millis();
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, mo, da) = civil_from_days(days);
    format!(
        "{y:04}-{mo:02}-{da:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The symbolic name of an errno fencefs returns for refusals.
pub fn errno_name(e: i32) -> &'static str {
    match e {
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EROFS => "EROFS",
        _ => "EIO",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamp_is_rfc3339_utc() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_040_000_123);
        assert_eq!(timestamp(t), "2026-11-30T12:00:00.123Z");
        assert_eq!(
            timestamp(SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn non_utf8_paths_keep_their_bytes() {
        let mut m = Map::new();
        path_fields(b"a/\xff", &mut m);
        assert_eq!(m["path_hex"], "612fff");
        let mut m = Map::new();
        path_fields(b"a/b", &mut m);
        assert_eq!(m["path"], "a/b");
        assert!(!m.contains_key("path_hex"));
    }
}
