//! The audit trail: one JSON object per line, written by its own thread.
//!
//! Invariant: logging never blocks or fails a file operation. Events go through a bounded
//! queue with `try_send`; when it is full they are counted, and the count is written as a
//! `dropped` event as soon as the writer catches up.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::SystemTime;

use serde_json::{Map, Value, json};

const QUEUE: usize = 8192;

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
    /// "allow" or "deny".
    pub allowed: bool,
    /// Errno name for refusals.
    pub errno: Option<&'static str>,
    /// Effective access of the path.
    pub access: &'static str,
    /// "rule" | "default" | "mode" | "protected" | "writable_roots".
    pub by: &'static str,
    /// The deciding rule's (or `protected` entry's) pattern and its line in the policy
    /// file when known.
    pub rule: Option<(String, Option<usize>)>,
    /// Mode in force.
    pub mode: &'static str,
    /// Policy generation.
    pub generation: u64,
}

enum Msg {
    Event(Box<Event>),
    Reopen,
}

/// Where audit lines go.
#[derive(Debug, Clone)]
pub enum Target {
    /// Standard error.
    Stderr,
    /// Append to a file.
    File(PathBuf),
}

/// Handle to the audit writer.
pub struct Audit {
    tx: SyncSender<Msg>,
    dropped: Arc<AtomicU64>,
    /// Also log allowed operations.
    pub allowed: bool,
}

fn open_target(t: &Target) -> io::Result<Box<dyn Write + Send>> {
    match t {
        Target::Stderr => Ok(Box::new(io::stderr())),
        Target::File(p) => {
            let f: File = OpenOptions::new().create(true).append(true).open(p)?;
            Ok(Box::new(f))
        }
    }
}

impl Audit {
    /// Opens the target (an error here is a startup error) and starts the writer thread.
    pub fn start(target: Target, allowed: bool) -> io::Result<Audit> {
        let out = open_target(&target)?;
        let (tx, rx) = sync_channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let d2 = dropped.clone();
        std::thread::Builder::new()
            .name("fencefs-audit".into())
            .spawn(move || writer(rx, out, target, d2))?;
        Ok(Audit {
            tx,
            dropped,
            allowed,
        })
    }

    /// Queues an event; never blocks.
    pub fn log(&self, ev: Event) {
        match self.tx.try_send(Msg::Event(Box::new(ev))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Reopens the audit file (after logrotate); never blocks.
    pub fn reopen(&self) {
        let _ = self.tx.try_send(Msg::Reopen);
    }
}

fn writer(
    rx: Receiver<Msg>,
    mut out: Box<dyn Write + Send>,
    target: Target,
    dropped: Arc<AtomicU64>,
) {
    let mut buf = Vec::with_capacity(512);
    while let Ok(msg) = rx.recv() {
        match msg {
            Msg::Reopen => match open_target(&target) {
                Ok(o) => out = o,
                Err(e) => log::error!("audit: cannot reopen {target:?}: {e}"),
            },
            Msg::Event(ev) => {
                let n = dropped.swap(0, Ordering::Relaxed);
                if n > 0 {
                    let line = json!({"ts": timestamp(SystemTime::now()), "op": "audit",
                        "event": "dropped", "count": n});
                    if write_line(&mut out, &mut buf, &line).is_err() {
                        dropped.fetch_add(n, Ordering::Relaxed);
                    }
                }
                if write_line(&mut out, &mut buf, &ev.to_json()).is_err() {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

fn write_line(out: &mut Box<dyn Write + Send>, buf: &mut Vec<u8>, v: &Value) -> io::Result<()> {
    buf.clear();
    serde_json::to_writer(&mut *buf, v).map_err(io::Error::other)?;
    buf.push(b'\n');
    out.write_all(buf)?;
    out.flush()
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
    /// The JSON object of this event.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("ts".into(), Value::String(timestamp(SystemTime::now())));
        m.insert("op".into(), Value::String(self.op.into()));
        path_fields(&self.path, &mut m);
        m.insert("uid".into(), json!(self.uid));
        m.insert("gid".into(), json!(self.gid));
        m.insert("pid".into(), json!(self.pid));
        m.insert(
            "decision".into(),
            Value::String(if self.allowed { "allow" } else { "deny" }.into()),
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
        m.insert("mode".into(), Value::String(self.mode.into()));
        m.insert("generation".into(), json!(self.generation));
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
