//! `fencefs vhost-user`: the same shared state, policy, audit, control socket and approvals
//! as a mount, served to a VM over a vhost-user socket ([`crate::transport::vhost`])
//! instead of a FUSE mount. In order: block signals; check SOURCE; build the shared state;
//! bind the control socket and the vhost-user socket; start the control and signal
//! threads; confine; say "ready"; serve until the VM disconnects (or, with
//! `--keep-serving`, until SIGTERM); flush the audit and remove the sockets.
//! The steps it has in common with a mount are the mount's own functions (`app/mount/`:
//! `block_signals`, `source_dir`, `cache_ttl`, `build_state`, `confine_workers`,
//! `signal_ready`, `end_session`).
//!
//! Invariants: as for a mount, the signal mask is set before any thread exists and the
//! threads that need the host outside SOURCE start before confinement. The guest's caches
//! cannot be invalidated (virtio-fs has no notifications): host changes are not watched
//! and names and attributes are cached for `--cache-ttl` (default 1 s), so a reload or a
//! host change reaches the guest within that.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};

use super::mount::{
    block_signals, build_state, cache_ttl, confine_workers, end_session, signal_ready, source_dir,
};
use super::threads;
use super::{SESSION_DONE, flush_audit};
use crate::cli::VhostArgs;
use crate::fs::ops::Shared;
use crate::host::sys;
use crate::transport::devfuse::FenceFs;
use crate::transport::vhost::{self, Stop};

/// Serves until the VM disconnects (or SIGTERM).
pub(super) fn vhost_user(v: VhostArgs) -> Result<(), String> {
    let VhostArgs {
        socket,
        keep_serving,
        request_queues,
        mount: mut a,
    } = v;
    sys::limit_malloc_arenas(2);
    let sigs = block_signals()?;
    let src = checks(&a, &socket)?;
    // Nothing can tell the guest that a host file changed: no watching, short caching.
    a.no_watch = true;
    let (state, _) = build_state(&a, src, socket.clone())?;
    let shared = state.shared.clone();
    let control = threads::bind_control(&a)?;
    let mut listener = vhost::listen(&socket)
        .map_err(|e| format!("vhost-user socket '{}': {e}", socket.display()))?;
    // Reloads would ask for kernel cache invalidations; a guest cannot get them (its
    // caches expire within the TTL), so no notify thread is connected (`fs::kcache`: a
    // swap's passes then have nothing to wait for).
    let learn_out = state.learn_out.clone();
    threads::start_feedback(&shared)?;
    let live = threads::stage_live(&a, &shared);
    let checkpoint = threads::start_checkpoint(&a, live.clone())?;
    let (control_path, resume) =
        threads::start_control(control, &a, &shared, (Instant::now(), live), learn_out)?
            .map_or((None, None), |(p, q)| (Some(p), Some(q)));
    let stop = Stop::default();
    let files = Files {
        control: control_path,
        checkpoint,
        socket: socket.clone(),
    };
    {
        let (shared, stop, files) = (shared.clone(), stop.clone(), files.clone());
        std::thread::Builder::new()
            .name("fencefs-signals".into())
            .spawn(move || signal_loop(sigs, shared, stop, files))
            .map_err(|e| e.to_string())?;
    }
    // Removing the sockets needs the host outside SOURCE: a thread started unconfined.
    let (ended, ended_rx) = channel::<()>();
    let finisher = {
        let files = files.clone();
        std::thread::Builder::new()
            .name("fencefs-exit".into())
            .spawn(move || {
                let _ = ended_rx.recv();
                files.remove();
            })
            .map_err(|e| e.to_string())?
    };
    confine_workers(&a, &shared, &state.src);
    let core = FenceFs::new(shared.clone()).core();
    log::info!(
        "serving {} as a vhost-user virtio-fs device at {} (mode {}, {} rules, {} request queue{}, cache {} s)",
        state.src.display(),
        socket.display(),
        state.mode,
        state.rules,
        request_queues,
        if request_queues == 1 { "" } else { "s" },
        state.ttl
    );
    threads::start_resume(resume)?;
    signal_ready(a.ready_fd, &socket);
    if a.daemonized {
        crate::daemon::detach_stdio();
    }
    let opts = vhost::Options {
        request_queues: usize::from(request_queues),
        keep_serving,
    };
    let r = vhost::serve(&mut listener, &core, &opts, &stop);
    end_session(&shared);
    if let Some(out) = &state.learn_out {
        out.write_logged(&shared);
    }
    crate::host::union::finish_deletions(std::time::Duration::from_secs(2));
    let _ = ended.send(());
    let _ = finisher.join();
    r
}

/// SOURCE must be a directory; no MOUNTPOINT; the FUSE-mount-only options are refused.
fn checks(a: &crate::cli::MountArgs, socket: &Path) -> Result<PathBuf, String> {
    if a.mountpoint.as_os_str() != crate::cli::NO_MOUNTPOINT {
        return Err(format!(
            "vhost-user takes no MOUNTPOINT ('{}'): the guest mounts the device's tag",
            a.mountpoint.display()
        ));
    }
    if a.allow_other {
        return Err(
            "--allow-other is for FUSE mounts; a guest's kernel checks its own permissions".into(),
        );
    }
    cache_ttl(a)?;
    if socket.as_os_str().is_empty() {
        return Err("--socket: an empty path".into());
    }
    source_dir(a)?;
    let src = &a.source;
    src.canonicalize()
        .map_err(|e| format!("source '{}': {e}", src.display()))
}

/// The files to remove at exit.
#[derive(Clone)]
struct Files {
    control: Option<PathBuf>,
    checkpoint: Option<PathBuf>,
    socket: PathBuf,
}

impl Files {
    fn remove(&self) {
        threads::remove_control(self.control.as_deref());
        threads::remove_control(self.checkpoint.as_deref());
        threads::remove_control(Some(&self.socket));
    }
}

/// SIGHUP: reopen the audit file and reload. SIGTERM/SIGINT: refuse held requests, end
/// the connection; exit at once when none is being served, or after 2 s if it does not
/// end by then.
fn signal_loop(sigs: SigSet, shared: Arc<Shared>, stop: Stop, files: Files) {
    loop {
        let sig = match sigs.wait() {
            Ok(s) => s,
            Err(e) => {
                log::error!("sigwait: {e}");
                return;
            }
        };
        if sig == Signal::SIGHUP {
            if let Some(a) = &shared.audit {
                a.reopen();
            }
            let _ = threads::reload_now(&shared);
            continue;
        }
        log::info!("{sig:?}: ending the vhost-user device");
        shared.approvals.shutdown();
        let connected = stop.stop();
        let deadline = Instant::now() + Duration::from_secs(2);
        while connected && Instant::now() < deadline {
            if SESSION_DONE.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        flush_audit(&shared);
        crate::host::union::finish_deletions(std::time::Duration::from_millis(500));
        files.remove();
        std::process::exit(0);
    }
}
