//! Running the commands. This file dispatches; the work is in:
//! - `explain`: `check` and `explain` (read a policy, never mount);
//! - `mount`: the mount's life cycle, one file per step in the order they run (check,
//!   state, session, threads, serve, teardown; `mount/mod.rs` maps them);
//! - `vhost`: `vhost-user`'s life cycle, sharing the mount's steps where they are the same;
//! - `threads`: the daemon's own threads' bodies (signals, reloads, the control socket);
//! - `notify`: the notify thread (kernel cache invalidations) and its held-directory lane;
//! - `run`: `fencefs run`: COMMAND in a private namespace with the fences up;
//! - `roots`: the mount's roots besides SOURCE (`--root`, a linked worktree's repository).
//! - `policy_watch`: the debounced reload when the host edits a policy file in SOURCE
//!   (and, with `--watch-policy`, a `-p` file: `policy_files`);
//! - `review`: `fencefs review`, the terminal UI over a staging area's changes.
//! - `csi`: `fencefs csi`, the Kubernetes CSI node plugin.

mod answers;
mod csi;
mod explain;
mod hooks;
mod learn;
mod learn_out;
mod mount;
mod notify;
mod policy_files;
mod policy_watch;
mod restage;
mod review;
mod roots;
mod run;
mod threads;
mod vhost;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::cli::Command;
use crate::fs::ops::Shared;

pub use explain::normalize;

/// Set once the FUSE session has ended (the signal thread waits for it on SIGTERM).
pub(crate) static SESSION_DONE: AtomicBool = AtomicBool::new(false);

/// Set once a signal asked the daemon to unmount: the session's end that follows (the
/// kernel may answer the last read with ECONNABORTED rather than ENODEV) is the asked-for
/// one, not a failure.
pub(crate) static UNMOUNT_ASKED: AtomicBool = AtomicBool::new(false);

/// Writes the audit lines still pending (coalescing windows) before the daemon exits:
/// at the end of the session (`mount/teardown.rs`) and at the signal thread's
/// last-resort exit (`threads.rs`, `vhost.rs`), so it lives here, beside
/// [`SESSION_DONE`], below both.
pub(crate) fn flush_audit(shared: &Shared) {
    if let Some(a) = &shared.audit
        && !a.flush(Duration::from_secs(2))
    {
        log::warn!("audit: the writer did not flush within 2 s; the last lines may be missing");
    }
}

/// Set when the mount was made with mount(2) directly (`fencefs run`): unmounting is a
/// detach in the run's namespace, not fusermount3.
pub(crate) static DIRECT_MOUNT: AtomicBool = AtomicBool::new(false);

/// Set when the mount serves a descriptor handed over by another process
/// (`--fuse-fd-from`): the mount is not this process's to unmount; SIGTERM ends the
/// connection by exiting.
pub(crate) static FD_MOUNT: AtomicBool = AtomicBool::new(false);

/// Exit code for runtime and policy errors.
pub const EXIT_ERR: i32 = 1;

/// Runs a parsed command; returns the exit code.
pub fn run(cmd: Command) -> i32 {
    match cmd {
        Command::GenerateDocs { dir } => match crate::docs::generate(&dir) {
            Ok(files) => {
                for f in files {
                    crate::outln!("{}", f.display());
                }
                0
            }
            Err(e) => {
                eprintln!("fencefs: {}: {e}", dir.display());
                EXIT_ERR
            }
        },
        Command::Mount(a) => match mount::mount(a) {
            Ok(()) => 0,
            Err(msg) => {
                eprintln!("fencefs: {msg}");
                EXIT_ERR
            }
        },
        Command::Run(r) => run::run(r),
        Command::RunInit { lock, cwd, command } => run::init(lock, &cwd, &command),
        Command::VhostUser(v) => match vhost::vhost_user(v) {
            Ok(()) => 0,
            Err(msg) => {
                eprintln!("fencefs: {msg}");
                EXIT_ERR
            }
        },
        Command::Check { policy } => explain::check(&policy),
        Command::Presets => explain::presets(),
        Command::Learn(a) => learn::learn(a),
        Command::Schema => {
            crate::out!("{}", crate::policy::schema::json());
            0
        }
        Command::Explain(a) => explain::explain(a),
        Command::Csi(a) => csi::run(a),
        Command::Ctl { socket, what } => crate::control::client::ctl(&socket, &what),
        Command::Stage(a) => crate::stage::cli::run(a),
        Command::Review(a) => review::run(a),
        Command::Answers { file } => answers::list(&file),
        Command::Hooks(a) => hooks::hooks(a),
        Command::CheckpointHook(a) => hooks::checkpoint_hook(a),
        Command::Approve { socket, auto } => {
            crate::control::client::approve(&socket, auto.map(|a| a == "allow"))
        }
    }
}
