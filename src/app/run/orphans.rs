//! What COMMAND leaves behind. `fencefs run` is a child subreaper, so every process
//! COMMAND starts and abandons (a daemonized server, a double fork) becomes its child.
//! While COMMAND runs, those that exit are reaped (no zombies pile up in a long session);
//! when COMMAND exits, the rest are ended — SIGTERM, then SIGKILL after a second — and
//! reaped: the fence goes away with COMMAND, and none of them keeps a session alive.
//!
//! Invariants: only this process's own children that are neither COMMAND nor a daemon are
//! signalled or reaped, each read from `/proc/self/task/*/children` (where a child stays
//! listed until it is reaped, here), so no pid is ever signalled after it was reaped.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// How long the leftovers get to exit after SIGTERM.
const GRACE: Duration = Duration::from_secs(1);

/// Makes this process the reaper of what its descendants abandon.
pub(super) fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        log::warn!("child subreaper: {e}; what COMMAND leaves behind outlives the run");
    }
}

/// This process's children, but those in `keep`.
fn children(keep: &[Pid]) -> Vec<Pid> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .map(Pid::from_raw)
                .filter(|p| !keep.contains(p)),
        );
    }
    out
}

/// Reaps the children outside `keep` that have exited.
pub(super) fn reap(keep: &[Pid]) {
    for p in children(keep) {
        let _ = waitpid(p, Some(WaitPidFlag::WNOHANG));
    }
}

/// Ends and reaps every child outside `keep` (COMMAND has exited).
pub(super) fn end(keep: &[Pid]) {
    let start = Instant::now();
    let mut sent = None;
    loop {
        reap(keep);
        let left = children(keep);
        if left.is_empty() {
            return;
        }
        let sig = if start.elapsed() < GRACE {
            Signal::SIGTERM
        } else {
            Signal::SIGKILL
        };
        if sent != Some(sig) {
            for p in &left {
                let _ = kill(*p, sig);
            }
            sent = Some(sig);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
