//! Step 4 of a mount, **start the daemon's threads**, in order: notify (kernel cache
//! invalidations), watch (fanotify, and the policy-watch thread it pokes), control (the
//! socket's server), signals; then, after the "mounted" log line, the exit thread. Their
//! bodies live elsewhere: `app/notify.rs`, `watch.rs`, `app/policy_watch.rs`,
//! `app/threads.rs` (signals, reload, the control socket's wiring).
//!
//! Takes: [`MountArgs`], the [`State`], the [`Mounted`] session (its notifier, unmounter
//! and bound control socket), the fanotify descriptor from `state` and the signal set from
//! `check`. Gives: the control socket's path (removed at exit), the resume queue (served
//! after confinement) and the [`ExitThread`].
//!
//! Invariants: every thread here needs the host outside SOURCE (/proc, the policy files,
//! the control socket, mountinfo), so all of them start before the main thread confines
//! itself and stay unconfined; the signal mask set in `check` is inherited by each. The
//! resume thread is not started here: it must run confined (`serve`).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;
use std::time::Instant;

use nix::sys::signal::SigSet;

use super::super::notify::notify_loop;
use super::super::threads::{self, signal_loop};
use super::check::top_mount;
use super::session::Mounted;
use super::state::State;
use crate::cli::MountArgs;
use crate::fs::kcache::Inval;
use crate::fs::ops::Shared;

/// The thread that finishes up after the session ends (see [`start_exit_thread`]).
pub(super) struct ExitThread {
    pub(super) ended: Sender<()>,
    pub(super) handle: JoinHandle<()>,
}

/// Starts the daemon's threads, in order: notify, watch, checkpoint channel, control,
/// signals. Returns the sockets' paths (control, checkpoint channel: to remove at exit)
/// and the resume queue (served after confinement).
pub(super) fn start_threads(
    a: &MountArgs,
    state: &State,
    m: &mut Mounted,
    fan: Result<OwnedFd, String>,
    sigs: SigSet,
) -> Result<(Vec<PathBuf>, Option<threads::ResumeQueue>), String> {
    let shared = &state.shared;
    let notifier = m.session.notifier();
    let unmounter = m.session.unmount_callable();
    let (tx, rx) = channel::<Inval>();
    shared.kcache.connect(tx.clone());
    std::thread::Builder::new()
        .name("fencefs-notify".into())
        .spawn({
            let shared = shared.clone();
            move || notify_loop(notifier, rx, shared)
        })
        .map_err(|e| e.to_string())?;
    start_watch(fan, shared, &tx, state.ttl)?;
    threads::start_feedback(shared)?;
    let live = threads::stage_live(a, shared);
    let checkpoint = threads::start_checkpoint(a, live.clone())?;
    if a.watch_policy {
        super::super::policy_files::start(&a.policy, shared)?;
    }
    let (control, resume) = threads::start_control(
        m.control.take(),
        a,
        shared,
        (Instant::now(), live),
        state.learn_out.clone(),
    )?
    .map_or((None, None), |(p, q)| (Some(p), Some(q)));
    let s2 = shared.clone();
    let mnt2 = state.mnt.clone();
    std::thread::Builder::new()
        .name("fencefs-signals".into())
        .spawn(move || signal_loop(sigs, s2, unmounter, mnt2))
        .map_err(|e| e.to_string())?;
    let sockets = control.into_iter().chain(checkpoint).collect();
    Ok((sockets, resume))
}

/// What runs after the session ends but needs the host outside SOURCE (mountinfo, the
/// control socket's file) runs on this thread, started before the main thread confines
/// itself (and the workers it starts).
pub(super) fn start_exit_thread(mnt: &Path, sockets: Vec<PathBuf>) -> Result<ExitThread, String> {
    let (ended_tx, ended_rx) = channel::<()>();
    let finisher = std::thread::Builder::new()
        .name("fencefs-exit".into())
        .spawn({
            let mnt = mnt.to_path_buf();
            let ours = top_mount(&mnt).map(|m| m.dev);
            move || {
                let _ = ended_rx.recv();
                for s in &sockets {
                    threads::remove_control(Some(s));
                }
                // fuser's own unmount at the end of the session fails (EINVAL, logged as a
                // warning by fuser, which main() filters) whenever the mount is already
                // gone — the normal case after `fusermount3 -u` or SIGTERM. Say what
                // matters: whether it is really gone.
                match top_mount(&mnt) {
                    Some(m) if ours.as_ref() == Some(&m.dev) => log::warn!(
                        "{} is still mounted but no longer served; detach it with `fusermount3 -u -z {}`",
                        mnt.display(),
                        mnt.display()
                    ),
                    _ => log::info!("unmounted {}", mnt.display()),
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(ExitThread {
        ended: ended_tx,
        handle: finisher,
    })
}

/// Starts the thread that turns host changes into kernel cache invalidations.
fn start_watch(
    fan: Result<OwnedFd, String>,
    shared: &Arc<Shared>,
    tx: &Sender<Inval>,
    ttl: f64,
) -> Result<(), String> {
    let fan = match fan {
        Ok(fan) => fan,
        Err(e) => {
            log::info!(
                "host changes: not watched ({e}); kernel caches names and attributes for {ttl} s"
            );
            return Ok(());
        }
    };
    shared.inodes.watch_handles();
    let tx = tx.clone();
    let s = shared.clone();
    let s2 = shared.clone();
    let reload = super::super::policy_watch::start(shared.clone(), "a policy file in SOURCE")?;
    std::thread::Builder::new()
        .name("fencefs-watch".into())
        .spawn(move || {
            crate::watch::run(fan, s, true, |b| {
                // A host edit of the workspace layer's file or of an ignore file takes
                // effect like a reload (debounced, on the policy-watch thread).
                let snap = s2.policy.get();
                let layer_changed = snap.policy.workspace_policy().is_some_and(|n| {
                    b.everything || b.root_names.iter().any(|r| r == n.as_bytes())
                }) || (b.everything && !snap.policy.ignore_names().is_empty());
                drop(snap);
                if layer_changed || b.ignore_changed {
                    reload.poke();
                }
                if b.everything || !b.entries.is_empty() || !b.inodes.is_empty() {
                    let _ = tx.send(Inval {
                        entries: b.entries,
                        inodes: b.inodes,
                        everything: b.everything,
                        ..Inval::default()
                    });
                }
            })
        })
        .map_err(|e| e.to_string())?;
    log::info!("host changes: watched (fanotify); kernel caches names and attributes for {ttl} s");
    Ok(())
}
