//! `.fencefs/feedback` on a staged mount: the reviewer's decisions since the agent's last
//! turn began (`stage/feedback.rs` reads them from `DIR/feedback.jsonl`), as this caller
//! may see them.
//!
//! The FUSE workers are confined (Landlock) away from DIR, so they never read it: a thread
//! of the daemon's started before confinement ([`Feedback::refresh`], every
//! [`REFRESH`]) keeps the decisions and the window's start in memory, re-reading only
//! when the file or the checkpoint log changed (size and mtime), and a read renders from
//! that copy.
//!
//! Invariants: bounded (at most `stage::feedback::KEEP` decisions held, 100 lines shown,
//! a note cut at [`MAX_NOTE`] bytes); the no-oracle rule of `render.rs`: a decision whose
//! path (or any directory above it) the caller cannot see is left out, so the file names
//! nothing the caller could not name already; names and notes are shown escaped (no
//! control character).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::policy::{Access, Caller, Policy};
use crate::stage::feedback::{self, Decision};

/// How often the thread looks at the files.
pub const REFRESH: Duration = Duration::from_millis(300);
/// Lines shown, newest last (as `denials`).
pub const LINES: usize = 100;
/// A note is cut at this many bytes as shown.
pub const MAX_NOTE: usize = 500;

#[derive(Default)]
struct Held {
    decisions: Vec<Decision>,
    since: u64,
    stamp: Option<(u64, SystemTime, u64, SystemTime)>,
}

/// The decisions of one staging area, as last read.
pub struct Feedback {
    dir: PathBuf,
    held: Mutex<Held>,
}

fn stamp_of(p: &std::path::Path) -> (u64, SystemTime) {
    std::fs::metadata(p).map_or((0, UNIX_EPOCH), |m| {
        (m.len(), m.modified().unwrap_or(UNIX_EPOCH))
    })
}

impl Feedback {
    /// The feedback of the staging area `dir` (nothing read yet).
    pub fn new(dir: PathBuf) -> Feedback {
        Feedback {
            dir,
            held: Mutex::new(Held::default()),
        }
    }

    /// Re-reads the decisions and the window's start when their files changed. Runs on
    /// an unconfined thread of the daemon, never on a FUSE worker.
    pub fn refresh(&self) {
        let (a, b) = stamp_of(&self.dir.join(feedback::FILE));
        let (c, d) = stamp_of(&self.dir.join("checkpoints.json"));
        let stamp = Some((a, b, c, d));
        if self.held.lock().stamp == stamp {
            return;
        }
        let decisions = match feedback::read(&self.dir) {
            Ok(ds) => ds,
            Err(e) => {
                log::warn!("{}: {e}", self.dir.join(feedback::FILE).display());
                return;
            }
        };
        let since = feedback::since(&self.dir);
        *self.held.lock() = Held {
            decisions,
            since,
            stamp,
        };
    }

    /// Runs [`Self::refresh`] every [`REFRESH`] on a thread of its own.
    pub fn start(self: std::sync::Arc<Self>) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("fencefs-feedback".into())
            .spawn(move || {
                loop {
                    self.refresh();
                    std::thread::sleep(REFRESH);
                }
            })
            .map(drop)
    }

    /// The file's text for `caller` under `policy`.
    pub fn render(&self, policy: &Policy, caller: Caller) -> String {
        let held = self.held.lock();
        let shown: Vec<&Decision> = held
            .decisions
            .iter()
            .filter(|d| d.ts >= held.since && visible(policy, caller, &d.path))
            .collect();
        let mut s = String::new();
        for d in &shown[shown.len().saturating_sub(LINES)..] {
            line(&mut s, d);
        }
        s
    }
}

/// Whether `path` and every directory above it are visible to `caller`.
fn visible(policy: &Policy, caller: Caller, path: &str) -> bool {
    let path = path.trim_matches('/');
    if path.is_empty()
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return false;
    }
    let mut end = 0;
    for comp in path.split('/') {
        end += comp.len();
        let p = &path.as_bytes()[..end];
        let last = end == path.len();
        // The path itself may be a file or a directory: hidden as either, it is left out.
        let dirs: &[bool] = if last { &[true, false] } else { &[true] };
        if dirs
            .iter()
            .any(|&d| policy.verdict_for(p, caller, d).effective == Access::None)
        {
            return false;
        }
        end += 1;
    }
    true
}

/// One line: `TIME decision PATH [hunks N,M][: note]`.
fn line(s: &mut String, d: &Decision) {
    let t = UNIX_EPOCH + Duration::from_secs(d.ts);
    let path = crate::quote::quote(d.path.as_bytes());
    let _ = write!(s, "{} {} {path}", crate::audit::timestamp(t), d.decision);
    if let Some(h) = &d.hunks {
        let list: Vec<String> = h.iter().map(u32::to_string).collect();
        let _ = write!(s, " hunks {}", list.join(","));
    }
    if let Some(n) = d.note.as_deref().filter(|n| !n.is_empty()) {
        let mut n: String = n
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if n.len() > MAX_NOTE {
            let mut end = MAX_NOTE;
            while !n.is_char_boundary(end) {
                end -= 1;
            }
            n.truncate(end);
            n.push_str("...");
        }
        let _ = write!(s, ": {n}");
    }
    s.push('\n');
}
