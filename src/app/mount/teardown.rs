//! Step 6 of a mount, **tear down**: mark the session done, refuse every held request,
//! flush the audit log, write `--learn`'s draft, then let the exit thread report whether
//! the mount is really gone (and remove the control socket's file).
//!
//! Takes: the [`State`] and what `serve` gave ([`Served`]). Gives: the mount's result.
//!
//! Invariants: `SESSION_DONE` is set first (the signal thread waits for it on SIGTERM);
//! held requests are answered before the audit is flushed (their refusals are audited);
//! the exit thread is told last, and joined, so its "unmounted" line is the daemon's last.
//! `vhost-user` ends its device with the same [`end_session`].

use std::sync::atomic::Ordering;

use super::super::{SESSION_DONE, UNMOUNT_ASKED, flush_audit};
use super::serve::Served;
use super::state::State;
use crate::fs::ops::Shared;

/// Ends the mount after its session ended.
pub(super) fn teardown(state: &State, served: Served) -> Result<(), String> {
    let Served { run, exit } = served;
    end_session(&state.shared);
    if let Some(out) = &state.learn_out {
        out.write_logged(&state.shared);
    }
    // The removed directories still waiting in the staging area's work directory.
    crate::host::union::finish_deletions(std::time::Duration::from_secs(2));
    let _ = exit.ended.send(());
    let _ = exit.handle.join();
    match run {
        // Unmounted as a signal asked: the connection going away is how it ends.
        Err(e)
            if UNMOUNT_ASKED.load(Ordering::SeqCst)
                && matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::ENODEV)) =>
        {
            log::info!("session ended with the unmount ({e})");
            Ok(())
        }
        r => r.map_err(|e| format!("session ended: {e}")),
    }
}

/// The session is over: say so, refuse every held request, flush the audit.
pub(in crate::app) fn end_session(shared: &Shared) {
    SESSION_DONE.store(true, Ordering::SeqCst);
    shared.approvals.shutdown();
    flush_audit(shared);
}
