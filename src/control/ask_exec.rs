//! `--ask-exec CMD` (SPEC.md "Approvals", notify): for every newly held request the daemon
//! runs CMD, without a shell, with the ask event as one JSON line on its stdin, so that a
//! person can be told (a desktop notification, a chat message) that something waits.
//!
//! Invariants:
//! - It never delays or decides a request: the approvals table hands an ask over with a
//!   `try_send` into a bounded queue ([`QUEUE`]); a full queue drops the notification
//!   (counted in the log), never the request.
//! - At most [`RUNNING`] commands run at once (one per runner thread); each is killed
//!   (SIGKILL) after [`LIMIT`]. Its stdout is discarded; its exit status and the first
//!   [`STDERR_KEPT`] bytes of its stderr go to the log (rate-limited, quoted) when it
//!   fails, is killed or cannot be started. Memory, threads and descriptors are bounded.
//! - CMD is split at whitespace into the program and its arguments: no shell, no quoting,
//!   no expansion. The command runs with the daemon's user and environment; the runner
//!   threads are started before the workers' confinement, outside the Landlock domain.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::approvals::Held;
use crate::quote;

/// Commands running at once at most.
pub const RUNNING: usize = 4;
/// A command still running after this is killed.
pub const LIMIT: Duration = Duration::from_secs(10);
/// Asks waiting for a free runner at most; more are dropped (and counted).
pub const QUEUE: usize = 64;
/// Bytes of a failing command's stderr kept for the log.
pub const STDERR_KEPT: usize = 2048;

/// The handle the approvals' event sink notifies through.
#[derive(Clone)]
pub struct AskExec {
    tx: SyncSender<Held>,
    dropped: Arc<AtomicU64>,
}

/// CMD as a program and its arguments (split at whitespace); `None` when it is empty.
pub fn argv(cmd: &std::ffi::OsStr) -> Option<Vec<OsString>> {
    let v: Vec<OsString> = cmd
        .as_bytes()
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| std::ffi::OsStr::from_bytes(w).to_os_string())
        .collect();
    (!v.is_empty()).then_some(v)
}

impl AskExec {
    /// Starts the [`RUNNING`] runner threads for `argv`.
    pub fn start(argv: Vec<OsString>) -> std::io::Result<AskExec> {
        let (tx, rx) = sync_channel::<Held>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let argv = Arc::new(argv);
        for i in 0..RUNNING {
            let (rx, argv) = (rx.clone(), argv.clone());
            std::thread::Builder::new()
                .name(format!("fencefs-ask-exec-{i}"))
                .spawn(move || runner(&rx, &argv))?;
        }
        Ok(AskExec {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
        })
    }

    /// A request is held: run CMD for it, if a runner is free soon. Never blocks.
    pub fn notify(&self, h: &Held) {
        match self.tx.try_send(h.clone()) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                log::warn!(
                    "ask-exec: {n} notifications dropped so far ({RUNNING} running, {QUEUE} waiting)"
                );
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

fn runner(rx: &Mutex<Receiver<Held>>, argv: &[OsString]) {
    loop {
        let h = match rx.lock().recv() {
            Ok(h) => h,
            Err(_) => return,
        };
        let c = super::server::cmdline(h.req.pid);
        let line = super::proto::line(&super::proto::ask_event(&h, c));
        run_one(argv, &line, h.id);
    }
}

/// Runs CMD once with `line` on its stdin; logs how it ended unless it exited 0.
fn run_one(argv: &[OsString], line: &[u8], id: u64) {
    let shown = quote::quote(argv[0].as_bytes()).into_owned();
    let mut child = match crate::host::sys::private_umask(&mut Command::new(&argv[0]))
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            log::warn!("ask-exec: cannot run {shown} for request {id}: {e}");
            return;
        }
    };
    // The line (a few KiB at most) fits in the pipe's buffer: this write does not wait
    // for the command to read. A command that exits first gets EPIPE: ignored.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(line);
    }
    let mut err = child.stderr.take();
    if let Some(e) = &err {
        // Read as it comes, never waited on: a command that says nothing is not a wait.
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let _ = fcntl(e, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    }
    let mut kept = Vec::new();
    let started = Instant::now();
    let mut drain = |err: &mut Option<std::process::ChildStderr>| {
        let mut buf = [0u8; 4096];
        while let Some(e) = err.as_mut() {
            match e.read(&mut buf) {
                Ok(0) => *err = None,
                Ok(n) => {
                    let room = STDERR_KEPT.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Err(_) => break,
            }
        }
    };
    let (status, killed) = loop {
        drain(&mut err);
        match child.try_wait() {
            Ok(Some(st)) => break (Some(st), false),
            Ok(None) if started.elapsed() >= LIMIT => {
                let _ = child.kill();
                break (child.wait().ok(), true);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break (None, false),
        }
    };
    drain(&mut err);
    let text = String::from_utf8_lossy(&kept);
    let said = quote::escape(text.trim_end().as_bytes()).into_owned();
    if killed {
        log::warn!(
            "ask-exec: {shown} for request {id} killed after {} s; stderr: {said}",
            LIMIT.as_secs()
        );
    } else if let Some(st) = status.filter(|s| !s.success()) {
        log::warn!("ask-exec: {shown} for request {id} failed ({st}); stderr: {said}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_splits_at_whitespace_without_a_shell() {
        let v = argv(std::ffi::OsStr::new("  /bin/x  'a b' $HOME ")).unwrap();
        assert_eq!(v, ["/bin/x", "'a", "b'", "$HOME"]);
        assert!(argv(std::ffi::OsStr::new("   ")).is_none());
    }
}
