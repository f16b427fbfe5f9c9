//! `fencefs run`'s daemons: each fence (the workspace's, $HOME's) is an ordinary `mount`
//! life cycle (`app/mount`) in a child forked inside the run's namespaces, mounting
//! directly (`MountArgs::direct`). The run waits for its "ready" line and stops it when
//! COMMAND is done.
//!
//! Invariants: [`start`] forks, so it runs only while `fencefs run` has a single thread.
//! A daemon dies with `fencefs run` (PR_SET_PDEATHSIG, checked against a race with the
//! parent's death), sits in its own process group (the terminal's Ctrl-C and Ctrl-Z reach
//! COMMAND, never the file system it depends on), is not dumpable (COMMAND, same uid, cannot
//! read its memory or descriptors through /proc), and holds neither stdin nor stdout (only
//! stderr, for its error lines and the approval line).

use std::io::Read;
use std::os::fd::{IntoRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::cli::MountArgs;
use crate::host::sys::ns;

/// A running fence.
pub(super) struct Daemon {
    pub(super) pid: Pid,
}

/// Forks a daemon serving `m` and waits until it serves. `Err("")`: it failed and has
/// already said why on stderr.
pub(super) fn start(m: MountArgs) -> Result<Daemon, String> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| e.to_string())?;
    let parent = nix::unistd::getpid();
    match ns::fork().map_err(|e| format!("fork: {e}"))? {
        None => {
            drop(r);
            child(m, w, parent)
        }
        Some(pid) => {
            drop(w);
            wait_ready(r, pid)
        }
    }
}

/// The daemon's side: set itself apart, then mount and serve until stopped.
fn child(mut m: MountArgs, ready: OwnedFd, parent: Pid) -> ! {
    let r = (|| -> Result<(), String> {
        ns::die_with(parent).map_err(|e| format!("parent death signal: {e}"))?;
        nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))
            .map_err(|e| format!("setpgid: {e}"))?;
        nix::sys::prctl::set_dumpable(false).map_err(|e| format!("dumpable: {e}"))?;
        // The terminal and COMMAND's pipes are COMMAND's; the daemon keeps stderr only.
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(|e| format!("/dev/null: {e}"))?;
        nix::unistd::dup2_stdin(&null).map_err(|e| format!("stdin: {e}"))?;
        nix::unistd::dup2_stdout(&null).map_err(|e| format!("stdout: {e}"))?;
        m.ready_fd = Some(ready.into_raw_fd());
        super::super::mount::mount(m)
    })();
    let code = match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("fencefs: {e}");
            super::super::EXIT_ERR
        }
    };
    log::logger().flush();
    std::process::exit(code)
}

/// Reads the daemon's readiness line; on EOF reaps it and fails.
fn wait_ready(r: OwnedFd, pid: Pid) -> Result<Daemon, String> {
    let mut f = std::fs::File::from(r);
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    if buf.starts_with(b"ready") {
        return Ok(Daemon { pid });
    }
    let _ = waitpid(pid, None);
    Err(String::new())
}

impl Daemon {
    /// SIGTERM (the daemon detaches its mount and ends its session), then waits up to
    /// 3 s before SIGKILL. Always reaps it.
    pub(super) fn stop(self) {
        let _ = kill(self.pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(5)),
                _ => return,
            }
        }
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}
