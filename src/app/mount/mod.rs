//! A mount's life cycle: [`mount`] calls one function per step, in the order they must
//! run, and each step lives in its own file (its header says what it takes, what it gives
//! and the order it relies on):
//!
//! | step | function | file |
//! |---|---|---|
//! | 1. check: signal mask; SOURCE, MOUNTPOINT, `/dev/fuse`, `fusermount3`, options | `block_signals`, `startup_checks` | `check.rs` |
//! | 2. open SOURCE and build the shared state: policy, audit writer, `--learn` file, staging, roots, fanotify, budgets, node table, approvals, programs thread | `build_state` | `state.rs` |
//! | 3. mount: control socket bound, transport planned, session options, `Session::new` | `mount_session` | `session.rs` |
//! | 1 and 3 with `--fuse-fd-from`: SOURCE checked; the descriptor taken over a socket, `Session::from_fd` | `fd_from::startup_checks`, `fd_from::receive` | `fd_from.rs` |
//! | 4. start the daemon's threads: notify, watch, control, signals; then the exit thread | `start_threads`, `start_exit_thread` | `threads.rs` |
//! | 5. serve: confinement, io_uring queues, readiness, resume thread, `session.run` | `serve` | `serve.rs` |
//! | 6. tear down: `SESSION_DONE`, held requests refused, audit flushed, draft written, exit thread joined | `teardown` | `teardown.rs` |
//!
//! The threads' bodies are in `app/threads.rs` (signals, reload, control socket),
//! `app/notify.rs` and `app/policy_watch.rs`. `vhost-user` (`app/vhost.rs`) runs steps 1
//! (`block_signals`, `source_dir`, `cache_ttl`), 2 (`build_state`), 5 (`confine_workers`,
//! `signal_ready`) and 6 (`end_session`) with the same functions.
//!
//! Invariants (the order of [`mount`]'s steps is load-bearing; keep it):
//! - the signal mask is set before any thread exists, so every thread inherits it;
//! - SOURCE is opened (step 2) before the mount exists, so mounting over SOURCE works;
//! - the control socket is bound before mounting (once the mount is there, so is the
//!   socket), and the transport plan is made before `Session::new` (it decides what INIT
//!   offers);
//! - the threads that need the host outside SOURCE (notify, watch, control, signals, exit,
//!   programs) start before the main thread confines itself, so they stay unconfined;
//! - Landlock comes after every descriptor that must be opened outside SOURCE, and before
//!   the io_uring queues, the resume thread and readiness, so the queue threads inherit it
//!   and nobody is told "ready" before it applies;
//! - after the session ends: `SESSION_DONE`, held requests released, the audit flushed,
//!   then the exit thread reports whether the mount is really gone.

mod check;
mod fd_from;
mod serve;
mod session;
mod state;
mod teardown;
mod threads;

use crate::cli::MountArgs;
use crate::host::sys;

pub(super) use check::{block_signals, cache_ttl, mount_type_at, source_dir, top_mount_type};
pub(super) use serve::{confine_workers, signal_ready};
pub(super) use state::build_state;
pub(super) use teardown::end_session;

/// Mounts and serves until unmounted. The steps run in exactly this order (module docs).
pub(super) fn mount(a: MountArgs) -> Result<(), String> {
    // Few malloc arenas: memory freed after a big walk goes back to the system.
    sys::limit_malloc_arenas(2);
    if a.direct {
        super::DIRECT_MOUNT.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let sigs = check::block_signals()?;
    let (src, mnt) = match fd_from::startup_checks(&a)? {
        Some(handed) => handed,
        None => check::startup_checks(&a)?,
    };
    let (state, fan) = state::build_state(&a, src, mnt)?;
    let mut m = session::mount_session(&a, &state)?;
    let (control, resume) = threads::start_threads(&a, &state, &mut m, fan, sigs)?;
    log::info!(
        "mounted {} at {} (mode {}, {} rules, {} threads{})",
        state.src.display(),
        state.mnt.display(),
        state.mode,
        state.rules,
        state.threads,
        if a.revoke { ", revoke" } else { "" }
    );
    let exit = threads::start_exit_thread(&state.mnt, control)?;
    let served = serve::serve(&a, &state, m, resume, exit)?;
    teardown::teardown(&state, served)
}
