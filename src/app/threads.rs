//! The daemon's own threads besides the FUSE workers: the notify thread (kernel cache
//! invalidations), the signal thread (reload, unmount), the reload procedure they and the
//! control socket share, and the control socket's wiring (hooks, resume thread).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use fuser::{INodeNo, Notifier, SessionUnmounter};
use nix::sys::signal::{SigSet, Signal};
use serde_json::json;

use super::{SESSION_DONE, flush_audit};
use crate::approvals::{self, Redecide};
use crate::control::server::{self, Hooks};
use crate::fs::kcache::Inval;
use crate::fs::ops::Shared;
use crate::policy::PolicyError;
use crate::reload::Snapshot;

/// Reloads the policy (SIGHUP, `ctl reload`): on success the kernel's caches are
/// invalidated, remembered answers forgotten and every held request re-decided under the
/// new policy; on error nothing changes and each error is logged.
pub(super) fn reload_now(
    shared: &Shared,
    tx: &Sender<Inval>,
) -> Result<Arc<Snapshot>, Vec<PolicyError>> {
    let started = Instant::now();
    match shared.policy.reload() {
        Ok(snap) => {
            log::info!(
                "policy reloaded: generation {}, {} rules, mode {}",
                snap.generation,
                snap.policy.rules().len(),
                snap.policy.mode()
            );
            let _ = tx.send(Inval {
                everything: true,
                drop_pages: shared.settings.revoke,
                started: Some(started),
                ..Inval::default()
            });
            let policy = &snap.policy;
            shared.approvals.reload(|req| {
                let caller = crate::policy::Caller {
                    uid: req.uid,
                    gid: req.gid,
                };
                let mut all_ok = true;
                for (path, (is_dir, need)) in req.paths.iter().zip(&req.checks) {
                    let sp = crate::policy::Special::default();
                    match policy.check_for(path, caller, *need, sp, *is_dir) {
                        Ok(_) => {}
                        Err(d) if d.askable(policy, *need).is_some() => all_ok = false,
                        Err(_) => return Redecide::Refuse,
                    }
                }
                if all_ok {
                    Redecide::Allow
                } else {
                    Redecide::Keep
                }
            });
            Ok(snap)
        }
        Err(errs) => {
            for e in &errs {
                log::error!("reload refused, old policy stays in force: {e}");
            }
            Err(errs)
        }
    }
}

/// The bound control socket, before its server runs.
pub(super) struct Control {
    path: PathBuf,
    group: Option<u32>,
    listener: std::os::unix::net::UnixListener,
}

/// Binds `--control` (before mounting: once the mount is there, so is the socket; peers
/// that connect early wait in the backlog until the server runs).
pub(super) fn bind_control(a: &crate::cli::MountArgs) -> Result<Option<Control>, String> {
    let Some(path) = a.control.clone() else {
        return Ok(None);
    };
    let group = match &a.control_group {
        None => None,
        Some(g) => Some(resolve_group(g)?),
    };
    let listener = server::bind(&path, group)
        .map_err(|e| format!("control socket '{}': {e}", path.display()))?;
    let _ = CONTROL_SOCKET.set(path.clone());
    Ok(Some(Control {
        path,
        group,
        listener,
    }))
}

/// The queue of held requests' continuations, for [`start_resume`].
pub(super) type ResumeQueue = Receiver<(approvals::Resume, approvals::Outcome)>;

/// Starts the control server thread (before the workers are confined: it reads /proc and
/// the policy file). Returns the socket path to remove at exit and the queue the resume
/// thread must serve.
pub(super) fn start_control(
    control: Option<Control>,
    a: &crate::cli::MountArgs,
    shared: &Arc<Shared>,
    tx: &Sender<Inval>,
    started: Instant,
) -> Result<Option<(PathBuf, ResumeQueue)>, String> {
    let Some(Control {
        path,
        group,
        listener,
    }) = control
    else {
        return Ok(None);
    };
    let (waker, wake_rx) = server::waker().map_err(|e| e.to_string())?;
    let (ev_tx, ev_rx) = channel();
    let (res_tx, res_rx) = channel();
    shared.approvals.connect(
        res_tx,
        Box::new(move |ev| {
            let _ = ev_tx.send(ev);
            waker.wake();
        }),
    );
    let mut hooks = hooks(shared, tx, started);
    crate::stage::control::hook(&mut hooks, a.stage.as_deref());
    let access = server::Access {
        daemon_uid: crate::host::sys::geteuid(),
        group,
    };
    let approvals = shared.approvals.clone();
    std::thread::Builder::new()
        .name("fencefs-control".into())
        .spawn(move || server::run(listener, wake_rx, ev_rx, approvals, access, hooks))
        .map_err(|e| e.to_string())?;
    log::info!(
        "control socket at {} (ask timeout {} s)",
        path.display(),
        a.ask_timeout
    );
    Ok(Some((path, res_rx)))
}

/// The control socket's file, for the signal thread's last-resort exit.
static CONTROL_SOCKET: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Starts the thread that runs held requests' continuations; call after the workers'
/// confinement, on the main thread, so it runs under the same Landlock domain.
pub(super) fn start_resume(rx: Option<ResumeQueue>) -> Result<(), String> {
    let Some(rx) = rx else {
        return Ok(());
    };
    std::thread::Builder::new()
        .name("fencefs-resume".into())
        .spawn(move || approvals::resume_loop(rx))
        .map(drop)
        .map_err(|e| e.to_string())
}

fn resolve_group(g: &str) -> Result<u32, String> {
    if let Ok(n) = g.parse::<u32>() {
        return Ok(n);
    }
    match nix::unistd::Group::from_name(g) {
        Ok(Some(gr)) => Ok(gr.gid.as_raw()),
        _ => Err(format!("--control-group '{g}': no such group")),
    }
}

fn hooks(shared: &Arc<Shared>, tx: &Sender<Inval>, started: Instant) -> Hooks {
    let s1 = shared.clone();
    let s2 = shared.clone();
    let s3 = shared.clone();
    let tx = tx.clone();
    Hooks {
        status: Box::new(move || {
            let snap = s1.policy.get();
            let (dropped, coalesced) = s1
                .audit
                .as_ref()
                .map_or((0, 0), |a| (a.dropped_total(), a.coalesced_total()));
            json!({
                "mode": snap.policy.mode().as_str(),
                "policy": s1.policy.file().map(|p| p.display().to_string()),
                "generation": snap.generation,
                "rules": snap.policy.rules().len(),
                "uptime_s": started.elapsed().as_secs(),
                "held": s1.approvals.len(),
                "approvers": s1.approvals.approvers(),
                "allowed": s1.stats.allowed.load(Ordering::Relaxed),
                "denied": s1.stats.denied.load(Ordering::Relaxed),
                "audit_dropped": dropped,
                "audit_coalesced": coalesced,
            })
        }),
        reload: Box::new(move || match reload_now(&s2, &tx) {
            Ok(snap) => Ok(json!({
                "generation": snap.generation,
                "rules": snap.policy.rules().len(),
            })),
            Err(errs) => Err(errs.iter().map(|e| e.to_string()).collect()),
        }),
        generation: Box::new(move || s3.policy.generation()),
        stage: None,
    }
}

/// Ask timeout as a duration.
pub(super) fn ask_timeout(a: &crate::cli::MountArgs) -> Duration {
    Duration::from_secs(a.ask_timeout)
}

/// Removes the control socket file at exit (if it is still ours: a socket).
pub(super) fn remove_control(path: Option<&Path>) {
    if let Some(p) = path
        && std::fs::symlink_metadata(p)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
    {
        let _ = std::fs::remove_file(p);
    }
}

pub(super) fn notify_loop(n: Notifier, rx: Receiver<Inval>, shared: Arc<Shared>) {
    while let Ok(first) = rx.recv() {
        // Merge what queued up meanwhile (a burst of reloads or host events).
        let mut jobs = vec![first];
        while let Ok(more) = rx.try_recv() {
            jobs.push(more);
        }
        let everything = jobs.iter().any(|j| j.everything);
        let started = jobs.iter().filter_map(|j| j.started).min();
        let (mut names, mut inos) = (0usize, 0usize);
        if everything {
            let (mut entries, inodes) = shared.inodes.snapshot();
            // Hidden names the kernel may hold as negative entries: a reload may show them.
            entries.extend(shared.kcache.take_hidden());
            // Attributes, and for directories the cached listing (filtered under the old
            // policy); file pages only with --revoke (no data may outlive a lowered grant).
            // Before the names: once a hidden name is gone, no listing shows it either.
            // Directories first: once any name or attribute answers under the new policy,
            // no listing answers under the old one.
            let pages = jobs.iter().any(|j| j.drop_pages);
            let (dirs, files): (Vec<u64>, Vec<u64>) = inodes
                .iter()
                .partition(|ino| shared.inodes.kind(**ino).is_ok_and(|k| k == libc::S_IFDIR));
            for ino in &dirs {
                let _ = n.inval_inode(INodeNo(*ino), 0, 0);
            }
            for ino in &files {
                // Symlinks: their cached target too (readlink is decided by the policy).
                let link = shared.inodes.kind(*ino).is_ok_and(|k| k == libc::S_IFLNK);
                let offset = if pages || link { 0 } else { -1 };
                let _ = n.inval_inode(INodeNo(*ino), offset, 0);
            }
            for (parent, name) in &entries {
                let _ = n.inval_entry(INodeNo(*parent), OsStr::from_bytes(name));
            }
            names += entries.len();
            inos += inodes.len();
        } else {
            for job in &jobs {
                for (parent, name) in &job.entries {
                    let _ = n.inval_entry(INodeNo(*parent), OsStr::from_bytes(name));
                }
                for (ino, offset) in &job.inodes {
                    let _ = n.inval_inode(INodeNo(*ino), *offset, 0);
                }
                names += job.entries.len();
                inos += job.inodes.len();
            }
        }
        match started {
            Some(t) => log::info!(
                "kernel caches invalidated: {names} names, {inos} inodes in {:?}",
                t.elapsed()
            ),
            None => log::debug!("host changes: {names} names, {inos} inodes invalidated"),
        }
    }
}

pub(super) fn signal_loop(
    sigs: SigSet,
    shared: Arc<Shared>,
    tx: Sender<Inval>,
    mut unmounter: SessionUnmounter,
    mnt: PathBuf,
) {
    loop {
        let sig = match sigs.wait() {
            Ok(s) => s,
            Err(e) => {
                log::error!("sigwait: {e}");
                return;
            }
        };
        match sig {
            Signal::SIGHUP => {
                if let Some(a) = &shared.audit {
                    a.reopen();
                }
                let _ = reload_now(&shared, &tx);
            }
            _ => {
                log::info!("{sig:?}: unmounting {}", mnt.display());
                // Held requests are answered (refused) first: no caller waits on a
                // daemon that is going away.
                shared.approvals.shutdown();
                if let Err(e) = unmounter.unmount() {
                    log::warn!("unmount failed ({e}); detaching lazily");
                    let _ = std::process::Command::new("fusermount3")
                        .arg("-u")
                        .arg("-z")
                        .arg(&mnt)
                        .status();
                }
                // A detached mount stays alive while a process still holds a file in it;
                // give the session a moment to end, then end the connection by exiting
                // (those files then fail with ENOTCONN, as after any unmount).
                let deadline = Instant::now() + Duration::from_secs(2);
                while Instant::now() < deadline {
                    if SESSION_DONE.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                log::warn!("files still open in the detached mount; closing the connection");
                flush_audit(&shared);
                remove_control(CONTROL_SOCKET.get().map(PathBuf::as_path));
                std::process::exit(0);
            }
        }
    }
}
