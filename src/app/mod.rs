//! Running the commands. This file dispatches; the work is in:
//! - `explain`: `check` and `explain` (read a policy, never mount);
//! - `startup`: before the mount (checks on SOURCE and MOUNTPOINT, signal mask, policy,
//!   audit writer, session settings, descriptor budget, mountinfo);
//! - `mount`: the mount's life cycle, step by step, in an order that must be kept;
//! - `threads`: the daemon's own threads (signals, reloads, cache invalidations, the
//!   control socket).
//!
//! The steps of `fencefs mount`, in order, and where each one is (`mount::mount` calls
//! them one after the other):
//!
//! | step | function | file |
//! |---|---|---|
//! | 1. check: signal mask, SOURCE/MOUNTPOINT, policy, audit writer | `block_signals`; then, from `build_state`, `startup_checks`, `load_policy`, `start_audit` | `startup.rs` |
//! | 2. open SOURCE and build the shared state (budgets, node table, fanotify) | `build_state`, `handle_budget` | `mount.rs`, `startup.rs` |
//! | 3. mount: control socket, transport plan, session options (fsname = SOURCE), `Session::new` | `mount_session`, `bind_control`, `session_config` | `mount.rs`, `threads.rs`, `startup.rs` |
//! | 4. start threads: notify, watch, control, signals, exit | `start_threads`, `start_watch`, `start_control`, `start_exit_thread` | `mount.rs`, `threads.rs` |
//! | 5. serve: confine, io_uring queues, readiness, resume thread, detach stdio, `session.run` | `serve`, `confine`, `start_transport`, `signal_ready`, `start_resume` | `mount.rs`, `threads.rs` |
//! | 6. tear down: `SESSION_DONE`, held requests refused, audit flushed, exit thread joined | end of `serve`, `flush_audit` | `mount.rs` |
//!
//! While serving, `threads.rs` holds what runs on the daemon's own threads: `signal_loop`
//! (HUP → `reload_now`, INT/TERM → unmount), `notify_loop` (kernel cache invalidations)
//! and the control socket's hooks.

mod explain;
mod mount;
mod startup;
mod threads;

use std::sync::atomic::AtomicBool;

use crate::cli::Command;

pub use explain::normalize;
pub(crate) use mount::flush_audit;

/// Set once the FUSE session has ended (the signal thread waits for it on SIGTERM).
pub(crate) static SESSION_DONE: AtomicBool = AtomicBool::new(false);

/// Exit code for runtime and policy errors.
pub const EXIT_ERR: i32 = 1;

/// Runs a parsed command; returns the exit code.
pub fn run(cmd: Command) -> i32 {
    match cmd {
        Command::GenerateDocs { dir } => match crate::docs::generate(&dir) {
            Ok(files) => {
                for f in files {
                    println!("{}", f.display());
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
        Command::Check { policy } => explain::check(&policy),
        Command::Explain(a) => explain::explain(a),
        Command::Ctl { socket, what } => crate::control::client::ctl(&socket, &what),
        Command::Approve { socket, auto } => {
            crate::control::client::approve(&socket, auto.map(|a| a == "allow"))
        }
    }
}
