//! Coalescing of identical refusals: one line at once, then one line per window for the rest.
//!
//! PURE: no I/O and no clock of its own — every call takes `now`, so tests drive time.
//!
//! Semantics (docs/src/audit.md says the same):
//! - A refusal's key is (uid, op, path, errno). The first refusal of a key opens a window
//!   and is returned at once as a line with `repeat` 1.
//! - Further refusals of that key less than `window` after the first are only counted;
//!   the last one is kept.
//! - When the window ends (`expire`), when the key is evicted because `cap` windows are
//!   open, or on `drain`, a window with a count > 0 becomes ONE line: the last refusal
//!   with `repeat` = count. A window whose count is 0 ends silently.
//! - The next refusal of the key after its window ended opens a new window.
//! - Allowed operations are never coalesced: each is a line with `repeat` 1.
//!
//! Invariants: every offered event is accounted for exactly once — in a `repeat` 1 line
//! or in the count of exactly one window line — so Σ repeat over the lines = events
//! offered (once drained). At most `cap` windows are open. `order` holds exactly the keys
//! of `open`, oldest window first (a window is only ever removed at the front), so the
//! oldest window is the next to end and the one evicted. No panics (no indexing, no
//! unwrap).

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::Event;

/// One line to write: the event and how many refusals it stands for.
#[derive(Debug)]
pub struct Line {
    /// The event (for a window line: the last refusal counted).
    pub event: Box<Event>,
    /// How many events this line stands for (≥ 1).
    pub repeat: u64,
}

/// What makes two refusals identical.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Key {
    uid: u32,
    op: &'static str,
    errno: &'static str,
    path: Vec<u8>,
}

struct Window {
    start: Instant,
    /// Refusals counted after the first (which was written at once).
    count: u64,
    /// The last of them, its path moved out (the key has it).
    last: Option<Box<Event>>,
}

/// The open windows, oldest first.
pub struct Coalescer {
    window: Duration,
    cap: usize,
    open: HashMap<Rc<Key>, Window>,
    order: VecDeque<Rc<Key>>,
    coalesced: u64,
}

impl Coalescer {
    /// Windows of `window`; at most `cap` (≥ 1) open at once.
    pub fn new(window: Duration, cap: usize) -> Coalescer {
        Coalescer {
            window,
            cap: cap.max(1),
            open: HashMap::new(),
            order: VecDeque::new(),
            coalesced: 0,
        }
    }

    /// Takes one event at time `now`; pushes the lines now due to `out` (ended windows
    /// first, then an evicted one, then the event itself unless it was only counted).
    pub fn offer(&mut self, mut ev: Box<Event>, now: Instant, out: &mut Vec<Line>) {
        self.expire(now, out);
        let errno = match ev.errno {
            Some(e) if !ev.allowed => e,
            _ => {
                out.push(Line {
                    event: ev,
                    repeat: 1,
                });
                return;
            }
        };
        let key = Key {
            uid: ev.uid,
            op: ev.op,
            errno,
            path: std::mem::take(&mut ev.path),
        };
        if let Some(w) = self.open.get_mut(&key) {
            w.count += 1;
            w.last = Some(ev);
            self.coalesced += 1;
            return;
        }
        if self.open.len() >= self.cap
            && let Some(oldest) = self.order.pop_front()
        {
            self.close(&oldest, out);
        }
        ev.path = key.path.clone();
        let key = Rc::new(key);
        self.open.insert(
            key.clone(),
            Window {
                start: now,
                count: 0,
                last: None,
            },
        );
        self.order.push_back(key);
        out.push(Line {
            event: ev,
            repeat: 1,
        });
    }

    /// Ends every window opened `window` or longer before `now`.
    pub fn expire(&mut self, now: Instant, out: &mut Vec<Line>) {
        while let Some(k) = self.order.front() {
            let ended = self
                .open
                .get(k)
                .is_none_or(|w| now.saturating_duration_since(w.start) >= self.window);
            if !ended {
                break;
            }
            if let Some(k) = self.order.pop_front() {
                self.close(&k, out);
            }
        }
    }

    /// Ends every window (shutdown).
    pub fn drain(&mut self, out: &mut Vec<Line>) {
        while let Some(k) = self.order.pop_front() {
            self.close(&k, out);
        }
    }

    /// When the oldest open window ends, if any is open.
    pub fn next_deadline(&self) -> Option<Instant> {
        let k = self.order.front()?;
        let w = self.open.get(k)?;
        Some(w.start.checked_add(self.window).unwrap_or(w.start))
    }

    /// Refusals counted into a window line so far (they got no line of their own).
    pub fn coalesced_total(&self) -> u64 {
        self.coalesced
    }

    /// Open windows.
    #[cfg(test)]
    pub fn open_windows(&self) -> usize {
        self.open.len()
    }

    fn close(&mut self, k: &Rc<Key>, out: &mut Vec<Line>) {
        if let Some(w) = self.open.remove(k)
            && let Some(mut event) = w.last
            && w.count > 0
        {
            event.path = k.path.clone();
            out.push(Line {
                event,
                repeat: w.count,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(1);

    fn ev(
        uid: u32,
        op: &'static str,
        path: &str,
        errno: Option<&'static str>,
        pid: u32,
    ) -> Box<Event> {
        Box::new(Event {
            op,
            path: path.as_bytes().to_vec(),
            uid,
            gid: uid,
            pid,
            allowed: errno.is_none(),
            held: false,
            approver: None,
            errno,
            access: "none",
            by: "rule",
            rule: None,
            layer: None,
            root: None,
            mode: "read-only",
            generation: 0,
            need: None,
            program_unknown: false,
            would_deny: false,
        })
    }

    fn deny(path: &str, pid: u32) -> Box<Event> {
        ev(1000, "open", path, Some("ENOENT"), pid)
    }

    /// (path, pid, repeat) of each line, for exact comparisons.
    fn brief(lines: &[Line]) -> Vec<(String, u32, u64)> {
        lines
            .iter()
            .map(|l| {
                (
                    String::from_utf8_lossy(&l.event.path).into_owned(),
                    l.event.pid,
                    l.repeat,
                )
            })
            .collect()
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn first_refusal_at_once_the_rest_as_one_line_when_the_window_ends() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W, 16);
        let mut out = vec![];
        c.offer(deny("s", 1), t0, &mut out);
        assert_eq!(brief(&out), [("s".into(), 1, 1)]);
        out.clear();
        for i in 0..99 {
            c.offer(deny("s", 2 + i), at(t0, 10 * u64::from(i)), &mut out);
        }
        assert!(out.is_empty(), "counted, not written: {out:?}");
        assert_eq!(c.coalesced_total(), 99);
        assert_eq!(c.next_deadline(), Some(at(t0, 1000)));
        c.expire(at(t0, 999), &mut out);
        assert!(out.is_empty(), "window still open at 999 ms");
        c.expire(at(t0, 1000), &mut out);
        // One line, pid of the last refusal, repeat = the count.
        assert_eq!(brief(&out), [("s".into(), 100, 99)]);
        assert_eq!(out[0].event.errno, Some("ENOENT"));
        assert_eq!(c.open_windows(), 0);
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn a_refusal_after_the_window_starts_a_new_one() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W, 16);
        let mut out = vec![];
        c.offer(deny("s", 1), t0, &mut out);
        c.offer(deny("s", 2), at(t0, 500), &mut out);
        // No expire call in between: offer ends the old window itself, in order.
        c.offer(deny("s", 3), at(t0, 1500), &mut out);
        assert_eq!(
            brief(&out),
            [("s".into(), 1, 1), ("s".into(), 2, 1), ("s".into(), 3, 1)]
        );
        out.clear();
        c.offer(deny("s", 4), at(t0, 2499), &mut out);
        c.offer(deny("s", 5), at(t0, 2499), &mut out);
        c.expire(at(t0, 2500), &mut out);
        assert_eq!(brief(&out), [("s".into(), 5, 2)]);
    }

    #[test]
    fn a_window_without_repeats_ends_silently() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W, 16);
        let mut out = vec![];
        c.offer(deny("s", 1), t0, &mut out);
        out.clear();
        c.expire(at(t0, 5000), &mut out);
        assert!(out.is_empty());
        assert_eq!(c.open_windows(), 0);
    }

    #[test]
    fn the_key_is_uid_op_path_errno() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W, 16);
        let mut out = vec![];
        let variants = [
            ev(1000, "open", "s", Some("ENOENT"), 1),
            ev(1001, "open", "s", Some("ENOENT"), 1),
            ev(1000, "lookup", "s", Some("ENOENT"), 1),
            ev(1000, "open", "t", Some("ENOENT"), 1),
            ev(1000, "open", "s", Some("EACCES"), 1),
        ];
        for v in &variants {
            c.offer(v.clone(), t0, &mut out);
        }
        assert_eq!(out.len(), 5, "five distinct keys, five lines at once");
        out.clear();
        // The same five again: all counted. gid, pid, rule... are not part of the key.
        for v in &variants {
            let mut v = v.clone();
            v.gid = 7;
            v.pid = 9;
            v.generation = 3;
            c.offer(v, at(t0, 1), &mut out);
        }
        assert!(out.is_empty());
        c.expire(at(t0, 1000), &mut out);
        assert_eq!(out.len(), 5);
        for l in &out {
            assert_eq!(
                (l.repeat, l.event.pid, l.event.gid, l.event.generation),
                (1, 9, 7, 3)
            );
        }
        let sum: u64 = out.iter().map(|l| l.repeat).sum();
        assert_eq!(sum + 5, 10);
    }

    #[test]
    fn allowed_events_are_never_coalesced() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W, 16);
        let mut out = vec![];
        for i in 0..10 {
            c.offer(ev(1000, "open", "f", None, i), t0, &mut out);
        }
        assert_eq!(out.len(), 10);
        assert!(out.iter().all(|l| l.repeat == 1));
        assert_eq!(c.open_windows(), 0);
        assert_eq!(c.coalesced_total(), 0);
    }

    #[test]
    fn the_key_map_is_bounded_and_evicts_the_oldest_window() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(W, 3);
        let mut out = vec![];
        for (i, p) in ["a", "b", "c"].iter().enumerate() {
            c.offer(deny(p, 1), at(t0, i as u64), &mut out);
            c.offer(deny(p, 2), at(t0, i as u64), &mut out);
        }
        assert_eq!(
            brief(&out),
            [("a".into(), 1, 1), ("b".into(), 1, 1), ("c".into(), 1, 1)]
        );
        out.clear();
        // A fourth key: "a" (the oldest) is flushed first, with its count.
        c.offer(deny("d", 3), at(t0, 10), &mut out);
        assert_eq!(brief(&out), [("a".into(), 2, 1), ("d".into(), 3, 1)]);
        assert_eq!(c.open_windows(), 3);
        // "a" again: a new window (written at once), evicting "b".
        out.clear();
        c.offer(deny("a", 4), at(t0, 11), &mut out);
        assert_eq!(brief(&out), [("b".into(), 2, 1), ("a".into(), 4, 1)]);
        // Thousands of distinct keys never grow the map past the cap.
        for i in 0..5000 {
            c.offer(deny(&format!("n{i}"), 5), at(t0, 12), &mut out);
            assert!(c.open_windows() <= 3);
        }
    }

    #[test]
    fn every_event_is_accounted_exactly_once() {
        // A deterministic pseudo-random stream over few keys and uneven times.
        let t0 = Instant::now();
        let mut c = Coalescer::new(W, 4);
        let mut out = vec![];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut t = 0u64;
        let n = 20_000u64;
        for i in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += x % 7;
            let path = format!("p{}", x % 6);
            let allowed = x.is_multiple_of(11);
            let e = ev(
                1000,
                "open",
                &path,
                (!allowed).then_some("EACCES"),
                i as u32,
            );
            c.offer(e, at(t0, t), &mut out);
            if x.is_multiple_of(5) {
                c.expire(at(t0, t), &mut out);
            }
        }
        c.drain(&mut out);
        let sum: u64 = out.iter().map(|l| l.repeat).sum();
        assert_eq!(sum, n, "Σ repeat must equal the events offered");
        assert!(out.iter().all(|l| l.repeat >= 1));
        // Lines written at once: one per event not counted into a window.
        let at_once = n - c.coalesced_total();
        assert!(
            c.coalesced_total() > n / 2,
            "few keys: most events coalesce"
        );
        assert!(out.len() as u64 >= at_once);
        assert_eq!(c.open_windows(), 0);
    }

    #[test]
    fn a_clock_that_goes_backwards_does_not_panic_or_lose_events() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut c = Coalescer::new(W, 4);
        let mut out = vec![];
        c.offer(deny("s", 1), t0, &mut out);
        c.offer(deny("s", 2), t0 - Duration::from_secs(5), &mut out);
        c.expire(t0 - Duration::from_secs(9), &mut out);
        c.drain(&mut out);
        assert_eq!(brief(&out), [("s".into(), 1, 1), ("s".into(), 2, 1)]);
    }
}
