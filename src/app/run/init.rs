//! COMMAND's PID namespace: `fencefs run` starts `fencefs run-init` as the first process
//! (pid 1) of a PID namespace of its own, and this init starts COMMAND (pid 2). From
//! inside, nothing outside can be named: the daemons, `fencefs run` itself and every other
//! process of the same user (the person's editor, shell, browser) answer ESRCH to `kill`
//! and `ptrace`, and the namespace's own `/proc` (mounted here, in a mount namespace of
//! the init's own, made before its exec: `ns::pre_exec_init`) lists only the run's processes, so `/proc/PID/mem`, `environ` and `fd`
//! of outside processes are out of reach too.
//!
//! The init forwards SIGTERM and SIGHUP to COMMAND, ignores the terminal's SIGINT and
//! SIGQUIT (COMMAND gets them itself: it is in the terminal's foreground job), reaps every
//! process COMMAND abandons, and when COMMAND exits asks what is left to end (SIGTERM,
//! [`GRACE`]) and exits with COMMAND's status (128+N for signal N); the kernel then kills
//! whatever remains in the namespace. It dies with `fencefs run` (PR_SET_PDEATHSIG), and
//! with it every process in the namespace — after a SIGKILL of `fencefs run` too.
//!
//! Invariants: the init never execs anything but COMMAND; a `/proc` that cannot be
//! mounted (a container that masks parts of its own) is said on stderr in one line and the
//! run goes on (names outside still cannot be signalled or traced: they are not in this
//! namespace).

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::host::sys::ns;

/// How long what COMMAND leaves running gets to exit after SIGTERM.
const GRACE: Duration = Duration::from_secs(1);

/// The signals the init waits for (blocked).
fn handled() -> SigSet {
    let mut s = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTERM,
        Signal::SIGHUP,
    ] {
        s.add(sig);
    }
    s
}

/// The init's body: returns COMMAND's exit code.
pub fn main(lock: bool, cwd: &Path, cmd: &[OsString]) -> i32 {
    // Same uid as COMMAND: COMMAND must not read this process's memory or, through /proc,
    // its descriptors (its cwd is `/`: `ns::pre_exec_init`).
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("fencefs: dumpable: {e}");
        return super::super::EXIT_ERR;
    }
    // `ps` shows what it is (exec'd through /proc/self/exe, it would say `exe`).
    let _ = nix::sys::prctl::set_name(c"fencefs-init");
    let sigs = handled();
    if let Err(e) = sigs.thread_block() {
        eprintln!("fencefs: cannot block signals: {e}");
        return super::super::EXIT_ERR;
    }
    let mut c = std::process::Command::new(&cmd[0]);
    c.args(&cmd[1..]).current_dir(cwd);
    ns::pre_exec(&mut c, lock);
    let child = match c.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fencefs: {}: {e}", Path::new(&cmd[0]).display());
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    let pid = Pid::from_raw(child.id() as i32);
    let code = loop {
        if let Some(code) = reap(pid) {
            break code;
        }
        if let Ok(s @ (Signal::SIGTERM | Signal::SIGHUP)) = sigs.wait() {
            let _ = kill(pid, s);
        }
    };
    end_the_rest();
    code
}

/// Reaps every exited child; COMMAND's exit code once it is among them.
fn reap(command: Pid) -> Option<i32> {
    let mut out = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(p, c)) if p == command => out = Some(c),
            Ok(WaitStatus::Signaled(p, s, _)) if p == command => out = Some(128 + s as i32),
            Ok(WaitStatus::StillAlive) | Err(_) => return out,
            Ok(_) => {}
        }
    }
}

/// SIGTERM to every other process of the namespace, and up to [`GRACE`] for them to go.
fn end_the_rest() {
    // kill(-1) from a namespace's init reaches every process in it but the init.
    if kill(Pid::from_raw(-1), Signal::SIGTERM).is_err() {
        return; // none left
    }
    let end = Instant::now() + GRACE;
    while Instant::now() < end {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(10)),
            Ok(_) => {}
            Err(_) => return, // no child left
        }
    }
}
