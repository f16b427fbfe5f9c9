//! The writer thread: queue → coalescer (coalesce.rs) → sink (rotate.rs).
//!
//! Job: takes events and reopen requests from the bounded queue, folds identical refusals
//! into window lines, writes every line, reports dropped events and publishes the
//! counters. It wakes on a message or on a timer — the end of the oldest open window, a
//! due drop report, or an idle tick — so a window's line is written when the window ends
//! even when no other event arrives.
//!
//! Invariants: never panics (no unwrap, no indexing) and blocks no one but itself. Every
//! event that reached it ends up in the `repeat` of exactly one line or in the dropped
//! counters (a line that cannot be written adds its `repeat` to them), so
//! Σ repeat + Σ dropped `count` = events logged, once the writer caught up. A `dropped`
//! line is written at most once per window (a storm of drops stays a handful of lines)
//! and at the latest one idle tick after the drop.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use super::coalesce::{Coalescer, Line};
use super::rotate::Sink;
use super::{Counters, Msg, timestamp};

/// Longest sleep when nothing is due (a drop counted while the writer slept is reported
/// after at most this).
const IDLE_TICK: Duration = Duration::from_secs(1);

/// The writer's knobs (tests shrink them).
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Coalescing window.
    pub window: Duration,
    /// Open windows at most (the key map's bound).
    pub max_keys: usize,
    /// Queue length between `Audit::log` and the writer.
    pub queue: usize,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            window: Duration::from_secs(1),
            max_keys: 4096,
            queue: 8192,
        }
    }
}

/// `{"ts":..,"op":"audit","event":EVENT, ...fields}`.
fn meta(event: &str, fields: &[(&str, u64)]) -> Value {
    let mut v = json!({"ts": timestamp(SystemTime::now()), "op": "audit", "event": event});
    if let Value::Object(m) = &mut v {
        for (k, n) in fields {
            m.insert((*k).to_string(), json!(n));
        }
    }
    v
}

fn render(buf: &mut Vec<u8>, v: &Value) {
    buf.clear();
    // Serializing a `Value` into a Vec cannot fail; an empty line would be harmless.
    if serde_json::to_writer(&mut *buf, v).is_err() {
        buf.clear();
    }
    buf.push(b'\n');
}

/// The thread body; returns when every `Audit` handle is gone (after writing what is
/// pending).
pub fn run(rx: Receiver<Msg>, mut sink: Sink, counters: Arc<Counters>, t: Tuning) {
    let mut co = Coalescer::new(t.window, t.max_keys);
    let mut lines: Vec<Line> = Vec::new();
    let mut buf = Vec::with_capacity(512);
    let mut last_drop_report: Option<Instant> = None;
    let mut notes: Vec<Value> = Vec::new();
    loop {
        let now = Instant::now();
        let mut wait = IDLE_TICK;
        if let Some(d) = co.next_deadline() {
            wait = wait.min(d.saturating_duration_since(now));
        }
        if counters.pending_dropped.load(Ordering::Relaxed) > 0 {
            let due = last_drop_report.map_or(now, |t0| t0.checked_add(t.window).unwrap_or(t0));
            wait = wait.min(due.saturating_duration_since(now));
        }
        let mut ack = None;
        let stop = match rx.recv_timeout(wait) {
            Ok(Msg::Event(ev)) => {
                co.offer(ev, Instant::now(), &mut lines);
                false
            }
            Ok(Msg::Note(v)) => {
                notes.push(*v);
                false
            }
            Ok(Msg::Reopen) => false,
            Ok(Msg::Flush(done)) => {
                ack = Some(done);
                false
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        let drain = stop || ack.is_some();
        if counters.reopen.swap(false, Ordering::Relaxed)
            && let Err(e) = sink.reopen()
        {
            log::error!("audit: cannot reopen the audit file: {e}");
        }
        let now = Instant::now();
        if drain {
            co.drain(&mut lines);
        } else {
            co.expire(now, &mut lines);
        }
        let coalesced = co.coalesced_total();
        counters.coalesced_total.store(coalesced, Ordering::Relaxed);
        let header = || {
            let v = meta(
                "rotated",
                &[
                    (
                        "dropped_total",
                        counters.dropped_total.load(Ordering::Relaxed),
                    ),
                    ("coalesced_total", coalesced),
                ],
            );
            let mut b = Vec::new();
            render(&mut b, &v);
            b
        };

        let report_due = drain
            || last_drop_report.is_none_or(|t0| now.saturating_duration_since(t0) >= t.window);
        if report_due {
            let n = counters.pending_dropped.swap(0, Ordering::Relaxed);
            if n > 0 {
                last_drop_report = Some(now);
                render(&mut buf, &meta("dropped", &[("count", n)]));
                if sink.write_line(&buf, &header).is_err() {
                    // Reported again with the next report.
                    counters.pending_dropped.fetch_add(n, Ordering::Relaxed);
                }
            }
        }
        for v in notes.drain(..) {
            render(&mut buf, &v);
            if sink.write_line(&buf, &header).is_err() {
                counters.drop_events(1);
            }
        }
        for l in lines.drain(..) {
            render(&mut buf, &l.event.to_json(l.repeat));
            if let Err(e) = sink.write_line(&buf, &header) {
                counters.drop_events(l.repeat);
                log_write_error(&e);
            }
        }
        if let Some(done) = ack {
            let _ = done.send(());
        }
        if stop {
            return;
        }
    }
}

/// Write errors are counted as drops; the log says why at debug level (a full disk would
/// otherwise turn every refused operation into a log line on stderr).
fn log_write_error(e: &io::Error) {
    log::debug!("audit: line dropped: {e}");
}

#[cfg(test)]
mod tests {
    use super::super::{Audit, Event, Rotation, Target};
    use super::*;
    use std::fs;
    use std::path::{Path, PathBuf};

    fn temp_file(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fencefs-writer-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d.join("audit.jsonl")
    }

    fn deny(path: &str, pid: u32) -> Event {
        Event {
            op: "open",
            path: path.as_bytes().to_vec(),
            uid: 1000,
            gid: 1000,
            pid,
            allowed: false,
            held: false,
            approver: None,
            errno: Some("ENOENT"),
            access: "none",
            by: "rule",
            rule: Some(("secrets".into(), Some(3))),
            layer: None,
            root: None,
            mode: "read-only",
            generation: 0,
            need: None,
            program_unknown: false,
            would_deny: false,
        }
    }

    fn lines(p: &Path) -> Vec<Value> {
        fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }

    fn wait_for(d: Duration, mut f: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < d {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        f()
    }

    fn sum(ls: &[Value], key: &str) -> u64 {
        ls.iter().filter_map(|l| l[key].as_u64()).sum()
    }

    #[test]
    fn the_window_line_is_written_on_the_timer_without_another_event() {
        let f = temp_file("timer");
        let t = Tuning {
            window: Duration::from_millis(400),
            max_keys: 16,
            queue: 1024,
        };
        let a = Audit::start_tuned(Target::File(f.clone()), false, Rotation::default(), t).unwrap();
        for pid in 1..=50 {
            a.log(deny("secrets/key", pid));
        }
        // Nothing else is logged: only the timer can write the second line.
        assert!(wait_for(Duration::from_secs(5), || lines(&f).len() == 2));
        let ls = lines(&f);
        assert_eq!(ls[0]["repeat"], 1);
        assert_eq!(ls[0]["pid"], 1);
        assert_eq!(ls[1]["repeat"], 49);
        assert_eq!(ls[1]["pid"], 50);
        assert_eq!(ls[1]["path"], "secrets/key");
        assert_eq!(ls[1]["rule"], "secrets");
        assert_eq!(a.coalesced_total(), 49);
        assert_eq!(a.dropped_total(), 0);
        // A refusal after the window: a new line at once.
        a.log(deny("secrets/key", 51));
        assert!(wait_for(Duration::from_secs(5), || lines(&f).len() == 3));
        assert_eq!(lines(&f)[2]["repeat"], 1);
        let _ = fs::remove_dir_all(f.parent().unwrap());
    }

    #[test]
    fn flush_writes_open_windows_at_once() {
        let f = temp_file("flush");
        let t = Tuning {
            window: Duration::from_secs(3600),
            max_keys: 16,
            queue: 1024,
        };
        let a = Audit::start_tuned(Target::File(f.clone()), false, Rotation::default(), t).unwrap();
        for pid in 1..=10 {
            a.log(deny("secrets/key", pid));
        }
        // The window would stay open for an hour: flush (at shutdown) writes it now.
        assert!(a.flush(Duration::from_secs(5)), "the writer answers");
        let ls = lines(&f);
        assert_eq!(ls.len(), 2, "{ls:?}");
        assert_eq!(
            (ls[0]["repeat"].as_u64(), ls[1]["repeat"].as_u64()),
            (Some(1), Some(9))
        );
        let _ = fs::remove_dir_all(f.parent().unwrap());
    }

    #[test]
    fn repeats_plus_drops_account_for_every_event_logged() {
        let f = temp_file("drops");
        // A tiny queue: most events are dropped while the writer sleeps.
        let t = Tuning {
            window: Duration::from_millis(100),
            max_keys: 16,
            queue: 2,
        };
        let a = Audit::start_tuned(Target::File(f.clone()), false, Rotation::default(), t).unwrap();
        let n = 20_000u64;
        for i in 0..n {
            a.log(deny(if i % 2 == 0 { "a" } else { "b" }, i as u32));
        }
        let total = |ls: &[Value]| {
            let repeats: u64 = ls
                .iter()
                .filter(|l| l["op"] == "open")
                .map(|l| l["repeat"].as_u64().unwrap())
                .sum();
            let dropped: u64 = ls
                .iter()
                .filter(|l| l["event"] == "dropped")
                .map(|l| l["count"].as_u64().unwrap())
                .sum();
            (repeats, dropped)
        };
        assert!(
            wait_for(Duration::from_secs(10), || {
                let (r, d) = total(&lines(&f));
                r + d == n
            }),
            "{:?} != {n}",
            total(&lines(&f))
        );
        std::thread::sleep(Duration::from_millis(300));
        let ls = lines(&f);
        let (r, d) = total(&ls);
        assert_eq!(r + d, n, "nothing counted twice");
        assert_eq!(a.dropped_total(), d);
        let event_lines = ls.iter().filter(|l| l["op"] == "open").count() as u64;
        // Σ repeat = lines written at once (≥ 1 per key) + coalesced events.
        assert!(
            a.coalesced_total() <= r - 2,
            "{} vs {r}",
            a.coalesced_total()
        );
        assert!(a.coalesced_total() >= r - event_lines);
        // Drop reports are rate-limited: a handful, not one per drop.
        let reports = ls.iter().filter(|l| l["event"] == "dropped").count();
        assert!(reports <= 60, "{reports} dropped lines");
        assert_eq!(sum(&ls, "count"), d);
        let _ = fs::remove_dir_all(f.parent().unwrap());
    }

    #[test]
    fn rotation_through_the_writer_writes_a_rotated_header() {
        let f = temp_file("rotate");
        let t = Tuning {
            window: Duration::from_secs(1),
            max_keys: 8,
            queue: 100_000,
        };
        let rot = Rotation {
            max_size: 4096,
            keep: 2,
        };
        let a = Audit::start_tuned(Target::File(f.clone()), false, rot, t).unwrap();
        let n = 400u32;
        for i in 0..n {
            a.log(deny(&format!("secrets/n{i}"), i));
        }
        let last = format!("secrets/n{}", n - 1);
        assert!(wait_for(Duration::from_secs(10), || lines(&f)
            .iter()
            .any(|l| l["path"] == last.as_str())));
        let numbered = |k: u32| super::super::rotate::numbered(&f, k);
        assert!(numbered(1).exists() && numbered(2).exists());
        assert!(!numbered(3).exists());
        for p in [f.clone(), numbered(1), numbered(2)] {
            let text = fs::read_to_string(&p).unwrap();
            let longest = text.lines().map(|l| l.len() + 1).max().unwrap();
            assert!(
                text.len() <= 4096 + longest,
                "{}: {}",
                p.display(),
                text.len()
            );
            let ls = lines(&p);
            if p != f {
                assert_eq!(ls[0]["event"], "rotated", "{}", p.display());
            }
            assert!(
                ls.iter()
                    .skip(1)
                    .all(|l| l["op"] == "open" && l["repeat"] == 1)
            );
        }
        let first = &lines(&f)[0];
        assert_eq!(first["event"], "rotated");
        assert_eq!(first["dropped_total"], 0);
        assert_eq!(first["coalesced_total"], 0);
        let _ = fs::remove_dir_all(f.parent().unwrap());
    }
}
