//! `fencefs run`'s COMMAND: a grandchild of `fencefs run` — under COMMAND's init
//! ([`mod@super::init`], pid 1 of a PID namespace of its own) — in the same session and the
//! same process group (the job the shell put in the terminal's foreground). The terminal's
//! Ctrl-C, Ctrl-\ and Ctrl-Z reach both: COMMAND acts on them, `fencefs run` ignores the
//! first two (as system(3) does) and stops with COMMAND on the third, so the shell sees
//! the job stop and `fg` continues both. SIGWINCH goes to COMMAND directly. SIGTERM and
//! SIGHUP sent to `fencefs run` alone are passed on to COMMAND. The daemons are in groups
//! of their own, out of the terminal's reach.
//!
//! Invariants: every signal `fencefs run` handles is blocked before COMMAND is spawned (no
//! exit is missed); COMMAND starts with an empty mask and default dispositions (std resets
//! them in the child) and dies with `fencefs run` (PR_SET_PDEATHSIG, `ns::pre_exec`). The
//! exit status is COMMAND's, or 128+N when signal N ended it. After COMMAND, the terminal's
//! foreground goes back to `fencefs run`'s group (COMMAND may have moved it), and what
//! COMMAND left running is ended (`orphans`).

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;

use nix::sys::signal::{SigSet, Signal, kill};
use nix::unistd::Pid;

use crate::host::sys::ns;

/// The signals `fencefs run` handles while COMMAND runs (blocked, waited for).
fn handled() -> SigSet {
    let mut sigs = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTERM,
        Signal::SIGHUP,
    ] {
        sigs.add(s);
    }
    sigs
}

/// After COMMAND and the daemons: the signals [`run`] blocked act as usual again (Ctrl-C
/// at the staging prompt ends `fencefs run`); those that came meanwhile are dropped.
pub(super) fn release_signals() {
    let sigs = handled();
    ns::drain(&sigs);
    let _ = sigs.thread_unblock();
}

/// Runs COMMAND in `cwd` and returns its exit status (127 when it cannot be started).
/// `lock`: COMMAND enters one more user namespace first (root's COMMAND: see `ns`).
/// `daemons`: children that are not COMMAND's (see `orphans`).
/// `checkpoint`: the checkpoint channel, named to COMMAND in `$FENCEFS_CHECKPOINT`.
pub(super) fn run(
    cmd: &[OsString],
    (cwd, checkpoint): (&Path, Option<&Path>),
    lock: bool,
    daemons: &[Pid],
) -> i32 {
    let sigs = handled();
    super::orphans::become_subreaper();
    if let Err(e) = sigs.thread_block() {
        eprintln!("fencefs: cannot block signals: {e}");
        return super::super::EXIT_ERR;
    }
    // COMMAND runs under an init of its own, pid 1 of a new PID namespace (`init`).
    if let Err(e) = ns::enter_pid_ns() {
        eprintln!("fencefs: cannot make a PID namespace: {e}");
        return super::super::EXIT_ERR;
    }
    let mut c = std::process::Command::new("/proc/self/exe");
    c.arg0("fencefs").arg("run-init").arg("--cwd").arg(cwd);
    if lock {
        c.arg("--lock");
    }
    c.arg("--").args(cmd);
    // COMMAND inherits it from its init.
    if let Some(p) = checkpoint {
        c.env(crate::control::checkpoint::ENV, p);
    }
    ns::pre_exec_init(&mut c);
    let mut child = match c.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fencefs: starting COMMAND's init: {e}");
            return super::super::EXIT_ERR;
        }
    };
    let pid = Pid::from_raw(child.id() as i32);
    let mut keep = daemons.to_vec();
    keep.push(pid);
    let status = loop {
        super::orphans::reap(&keep);
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => {
                eprintln!("fencefs: waiting for COMMAND: {e}");
                break std::process::ExitStatus::from_raw(1 << 8);
            }
        }
        if let Ok(s @ (Signal::SIGTERM | Signal::SIGHUP)) = sigs.wait() {
            let _ = kill(pid, s);
        }
    };
    take_terminal_back();
    super::orphans::end(daemons);
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => super::super::EXIT_ERR,
    }
}

/// Puts `fencefs run`'s process group back in the terminal's foreground if COMMAND (a
/// shell with job control) moved it elsewhere; SIGTTOU is blocked meanwhile.
fn take_terminal_back() {
    use std::io::IsTerminal;
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return;
    }
    let ours = nix::unistd::getpgrp();
    use std::os::fd::AsFd;
    let fd = stdin.as_fd();
    if ns::tcgetpgrp(fd).is_ok_and(|fg| fg != ours) {
        let mut ttou = SigSet::empty();
        ttou.add(Signal::SIGTTOU);
        let _ = ttou.thread_block();
        let _ = ns::tcsetpgrp(fd, ours);
    }
}
