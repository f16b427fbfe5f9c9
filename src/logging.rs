//! The daemon's log (stderr; journald under systemd): env_logger's format and `RUST_LOG`
//! filter, behind two guards, because callers can make the daemon log:
//! - fuser's `Failed to send FUSE reply: No such file or directory` is debug-level. The
//!   kernel answers ENOENT to a reply it no longer waits for: an INTERRUPT's reply after the
//!   request was answered (over io_uring always: the kernel keeps those requests off
//!   `/dev/fuse`), or a request whose caller was killed. It is normal, and a thread
//!   signalled while it waits in FUSE made one per signal.
//! - Every call site is rate-limited ([`Limiter`]): at most [`BURST`] lines in each
//!   [`WINDOW`] from one place in the code, then one line saying how many similar ones were
//!   left out (logged with the next line after the window, or at exit).
//!
//! Invariants: the limiter's memory is bounded by the number of call sites (a fixed set
//! of places in the code); no lock is held while a line is written.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use log::{Level, Log, Metadata, Record};
use parking_lot::Mutex;

/// Lines one call site may log in a window before the rest are counted instead.
pub const BURST: u32 = 10;
/// The rate limit's window.
pub const WINDOW: Duration = Duration::from_secs(1);
/// The filter when `RUST_LOG` is unset. fuser's session warns "Failed to umount
/// filesystem" on every clean unmount (its check for a mount that is already gone never
/// says gone); fencefs reports the real state.
const DEFAULT_FILTER: &str = "info,fuser::session=error";

/// Installs the daemon's logger (once, first thing in `main`).
pub fn init() {
    let inner =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(DEFAULT_FILTER))
            .build();
    log::set_max_level(inner.filter());
    let logger = Logger {
        inner,
        limiter: Mutex::new(Limiter::new(BURST, WINDOW)),
    };
    let _ = log::set_boxed_logger(Box::new(logger));
}

/// env_logger behind the downgrade and the rate limit.
struct Logger {
    inner: env_logger::Logger,
    limiter: Mutex<Limiter>,
}

/// What the limiter says about one line.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it.
    Log,
    /// Leave it out (counted).
    Drop,
}

/// A count of lines left out at one call site, to be reported.
#[derive(Debug, PartialEq, Eq)]
pub struct Suppressed {
    /// How many.
    pub count: u64,
    /// The site's level, target and place (`file:line`).
    pub level: Level,
    pub target: String,
    pub place: String,
}

struct Site {
    start: Instant,
    logged: u32,
    dropped: u64,
    level: Level,
    target: String,
    place: String,
}

/// Per call site: at most `burst` lines in each `window`, the rest counted. Pure: the
/// time is passed in.
pub struct Limiter {
    burst: u32,
    window: Duration,
    sites: HashMap<u64, Site>,
}

impl Limiter {
    /// A limiter of `burst` lines per `window` per site.
    pub fn new(burst: u32, window: Duration) -> Limiter {
        Limiter {
            burst,
            window,
            sites: HashMap::new(),
        }
    }

    /// Whether a line from `place` (at `level`, `target`) is logged at `now`; and the
    /// counts of left-out lines whose window has ended, at this site or any other, to
    /// report first.
    pub fn admit(
        &mut self,
        now: Instant,
        level: Level,
        target: &str,
        place: &str,
    ) -> (Verdict, Vec<Suppressed>) {
        let due = self.due(now);
        let key = site_key(target, place);
        let window = self.window;
        let site = self.sites.entry(key).or_insert_with(|| Site {
            start: now,
            logged: 0,
            dropped: 0,
            level,
            target: target.to_string(),
            place: place.to_string(),
        });
        if now.duration_since(site.start) >= window {
            // A count from the ended window is in `due` already.
            site.start = now;
            site.logged = 0;
        }
        if site.logged < self.burst {
            site.logged += 1;
            (Verdict::Log, due)
        } else {
            site.dropped += 1;
            (Verdict::Drop, due)
        }
    }

    /// Counts of left-out lines whose window has ended.
    fn due(&mut self, now: Instant) -> Vec<Suppressed> {
        let window = self.window;
        self.sites
            .values_mut()
            .filter(|s| s.dropped > 0 && now.duration_since(s.start) >= window)
            .map(take)
            .collect()
    }

    /// Every count of left-out lines (at exit).
    pub fn drain(&mut self) -> Vec<Suppressed> {
        self.sites
            .values_mut()
            .filter(|s| s.dropped > 0)
            .map(take)
            .collect()
    }
}

fn take(s: &mut Site) -> Suppressed {
    Suppressed {
        count: std::mem::take(&mut s.dropped),
        level: s.level,
        target: s.target.clone(),
        place: s.place.clone(),
    }
}

fn site_key(target: &str, place: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (target, place).hash(&mut h);
    h.finish()
}

/// fuser's reply that the kernel no longer waited for (see the module header).
fn is_late_reply(r: &Record<'_>) -> bool {
    r.target() == "fuser::reply" && {
        let msg = r.args().to_string();
        msg.starts_with("Failed to send FUSE reply") && msg.ends_with("(os error 2)")
    }
}

impl Logger {
    fn report(&self, s: &[Suppressed]) {
        for s in s {
            self.inner.log(
                &Record::builder()
                    .args(format_args!(
                        "{} similar messages suppressed (at most {BURST} a second from {})",
                        s.count, s.place
                    ))
                    .level(s.level)
                    .target(&s.target)
                    .build(),
            );
        }
    }

    fn limited(&self, r: &Record<'_>) {
        if !self.inner.matches(r) {
            return;
        }
        let place = format!(
            "{}:{}",
            r.file().unwrap_or(r.module_path().unwrap_or("?")),
            r.line().unwrap_or(0)
        );
        let (verdict, due) =
            self.limiter
                .lock()
                .admit(Instant::now(), r.level(), r.target(), &place);
        self.report(&due);
        if verdict == Verdict::Log {
            self.inner.log(r);
        }
    }
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        self.inner.enabled(m)
    }

    fn log(&self, r: &Record<'_>) {
        if is_late_reply(r) {
            let debug = Record::builder()
                .args(*r.args())
                .level(Level::Debug)
                .target(r.target())
                .module_path(r.module_path())
                .file(r.file())
                .line(r.line())
                .build();
            return self.limited(&debug);
        }
        self.limited(r)
    }

    fn flush(&self) {
        let due = self.limiter.lock().drain();
        self.report(&due);
        self.inner.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(l: &mut Limiter, t: Instant, place: &str) -> (Verdict, Vec<Suppressed>) {
        l.admit(t, Level::Warn, "fencefs::x", place)
    }

    #[test]
    fn a_site_logs_its_burst_then_counts_and_reports_the_rest() {
        let t0 = Instant::now();
        let mut l = Limiter::new(3, Duration::from_secs(1));
        for i in 0..3 {
            assert_eq!(admit(&mut l, t0, "a.rs:1"), (Verdict::Log, vec![]), "{i}");
        }
        for _ in 0..100 {
            assert_eq!(admit(&mut l, t0, "a.rs:1").0, Verdict::Drop);
        }
        // Another site has its own budget.
        assert_eq!(admit(&mut l, t0, "b.rs:2").0, Verdict::Log);
        // Within the window nothing is due yet.
        let half = t0 + Duration::from_millis(500);
        assert_eq!(admit(&mut l, half, "a.rs:1"), (Verdict::Drop, vec![]));
        // After the window: the count comes first (once), then the line is logged.
        let (v, due) = admit(&mut l, t0 + Duration::from_secs(1), "a.rs:1");
        assert_eq!(v, Verdict::Log);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].count, &due[0].place[..]), (101, "a.rs:1"));
        assert_eq!(due[0].level, Level::Warn);
        assert!(l.drain().is_empty());
    }

    #[test]
    fn counts_are_reported_by_any_later_line_or_at_exit() {
        let t0 = Instant::now();
        let mut l = Limiter::new(1, Duration::from_secs(1));
        admit(&mut l, t0, "a.rs:1");
        admit(&mut l, t0, "a.rs:1");
        admit(&mut l, t0, "a.rs:1");
        // A line from elsewhere after a's window ended reports a's count.
        let (v, due) = admit(&mut l, t0 + Duration::from_secs(2), "b.rs:2");
        assert_eq!(v, Verdict::Log);
        assert_eq!(due.iter().map(|s| s.count).collect::<Vec<_>>(), vec![2]);
        admit(&mut l, t0 + Duration::from_secs(2), "b.rs:2");
        let left = l.drain();
        assert_eq!((left.len(), left[0].count), (1, 1));
        assert_eq!(left[0].place, "b.rs:2");
    }

    #[test]
    fn only_fusers_enoent_reply_failure_is_downgraded() {
        let rec = |target: &str, msg: &str, f: &dyn Fn(&Record<'_>) -> bool| {
            f(&Record::builder()
                .args(format_args!("{msg}"))
                .level(Level::Error)
                .target(target)
                .build())
        };
        let late = &|r: &Record<'_>| is_late_reply(r);
        assert!(rec(
            "fuser::reply",
            "Failed to send FUSE reply: No such file or directory (os error 2)",
            late
        ));
        assert!(!rec(
            "fuser::reply",
            "Failed to send FUSE reply: Invalid argument (os error 22)",
            late
        ));
        assert!(!rec(
            "fencefs::x",
            "Failed to send FUSE reply: No such file or directory (os error 2)",
            late
        ));
    }
}
