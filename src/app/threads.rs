//! The daemon's own threads besides the FUSE workers and the notify thread (`notify.rs`):
//! the signal thread (reload, unmount), the reload procedure it and the control socket
//! share, and the control socket's wiring (hooks, resume thread).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use fuser::SessionUnmounter;
use nix::sys::signal::{SigSet, Signal};
use serde_json::json;

use super::{DIRECT_MOUNT, SESSION_DONE, flush_audit};
use crate::approvals::{self, Redecide};
use crate::control::server::{self, Hooks};
use crate::fs::kcache::Inval;
use crate::fs::ops::Shared;
use crate::policy::PolicyError;
use crate::reload::Snapshot;

/// Reloads the policy (SIGHUP, `ctl reload`) as one instant for every caller:
/// 1. the new file is read and compiled (on error nothing changes and each error is logged);
/// 2. the no-cache window opens and the notify thread takes back every name, attribute and
///    listing the kernel holds — meanwhile the *old* policy answers, uncached;
/// 3. the new policy (and the roots, when a linked worktree changed) goes in force and the window closes: from here every answer is the
///    new policy's, and nothing the kernel still holds says otherwise (but the entries of
///    directories a held request locks, deferred to the held-directory lane);
/// 4. remembered answers are forgotten and every held request is re-decided;
/// 5. listings again and, with `--revoke`, cached file pages are dropped.
///
/// It returns (and logs `policy reloaded`) only when all of that is done.
pub(super) fn reload_now(shared: &Shared) -> Result<Arc<Snapshot>, Vec<PolicyError>> {
    let mut swap = shared.kcache.swap();
    let started = Instant::now();
    let next = match shared.policy.prepare() {
        Ok(p) => p,
        Err(errs) => {
            for e in &errs {
                log::error!(
                    "reload refused, old policy stays in force: {}",
                    crate::quote::escape(e.to_string().as_bytes())
                );
            }
            if let Some(a) = &shared.audit {
                let why: Vec<_> = errs.iter().map(|e| e.to_string().into()).collect();
                let mut m = serde_json::Map::new();
                m.insert("outcome".into(), "refused".into());
                m.insert(
                    "kept_generation".into(),
                    shared.policy.get().generation.into(),
                );
                m.insert("errors".into(), serde_json::Value::Array(why));
                a.note("policy_reload", m);
            }
            return Err(errs);
        }
    };
    // A linked worktree made, changed or gone since: its roots are swapped with the
    // policy, inside the window (the kernel's names for `.git` and `.fencefs-git` go too).
    let roots = super::roots::redetect();
    let first = swap.take_back(Vec::new());
    if let Some(r) = &roots {
        // The names at the top of the mount the roots change (`.git`, `.fencefs-git`): the
        // kernel may hold them as negative entries (absent on the host), which the pass
        // over every known name does not reach.
        let names = super::roots::top_names(&shared.inodes.roots(), r);
        let entries = names.into_iter().map(|n| (crate::host::inode::ROOT, n));
        swap.pass(Inval {
            entries: entries.collect(),
            ..Inval::default()
        });
    }
    if let Some(r) = roots {
        if r.iter().next().is_some() {
            shared.handles.split();
        }
        shared.inodes.set_roots(r);
    }
    let snap = shared.policy.install(next);
    swap.close_window();
    reload_answers(shared);
    redecide(shared, &snap);
    let second = swap.finish(shared.settings.revoke);
    let deferred = if first.deferred > 0 {
        format!(
            ", {} names in directories held for an approver deferred",
            first.deferred
        )
    } else {
        String::new()
    };
    if let Some(a) = &shared.audit {
        let mut m = serde_json::Map::new();
        m.insert("outcome".into(), "loaded".into());
        m.insert("generation".into(), snap.generation.into());
        a.note("policy_reload", m);
    }
    log::info!(
        "policy reloaded: generation {}, {} rules, mode {} (kernel caches: {} names, {} inodes invalidated in {:?}{deferred})",
        snap.generation,
        snap.policy.rules().len(),
        snap.policy.mode(),
        first.names,
        first.inodes + second.inodes,
        started.elapsed()
    );
    Ok(snap)
}

/// Re-reads `--answers FILE` with the policy; an invalid FILE is logged like an invalid
/// policy (file:line:column) and the answers in force stay.
fn reload_answers(shared: &Shared) {
    let Some(answers) = shared.approvals.answers() else {
        return;
    };
    if let Err(errs) = answers.reload() {
        for e in &errs {
            log::error!(
                "answers not reloaded, the old answers stay in force: {}",
                crate::quote::escape(e.to_string().as_bytes())
            );
        }
    }
}

/// Re-decides every held request under the new policy (SPEC, Approvals): allowed,
/// refused, or still held.
fn redecide(shared: &Shared, snap: &Snapshot) {
    let policy = &snap.policy;
    shared.approvals.reload(|req| {
        // A held request's program is not kept (the new policy's program rules are not
        // the old one's): it is re-decided as a caller whose program is unknown, i.e. with
        // the most restrictive answer any program could get.
        let caller = if policy.has_programs() {
            crate::policy::Caller::unknown_program(req.uid, req.gid)
        } else {
            crate::policy::Caller::new(req.uid, req.gid)
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

/// `fencefs run` without `--ask-exec`: one line on the terminal (which COMMAND may hold in
/// raw mode, hence the carriage returns) on how to answer held requests, at most every 30 s.
fn say_ask(sock: &Path, last: &parking_lot::Mutex<Option<Instant>>) {
    let mut last = last.lock();
    if last.is_some_and(|t| t.elapsed() < Duration::from_secs(30)) {
        return;
    }
    *last = Some(Instant::now());
    eprint!(
        "\r\nfencefs: a request waits for your approval: run `fencefs approve {}` in another terminal\r\n",
        sock.display()
    );
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
    (started, live): (Instant, Option<Arc<dyn crate::stage::control::Live>>),
    learn: Option<Arc<super::learn_out::LearnOut>>,
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
    let lane_waker = waker.try_clone().map_err(|e| e.to_string())?;
    let (ev_tx, ev_rx) = channel();
    let (res_tx, res_rx) = channel();
    let ask_exec = match &a.ask_exec {
        None => None,
        Some(cmd) => {
            let argv = crate::control::ask_exec::argv(cmd).ok_or("--ask-exec: empty command")?;
            Some(crate::control::ask_exec::AskExec::start(argv).map_err(|e| e.to_string())?)
        }
    };
    let say = (a.hold_asks && a.ask_exec.is_none())
        .then(|| (path.clone(), parking_lot::Mutex::new(None::<Instant>)));
    if a.hold_asks {
        shared.approvals.stand_by();
    }
    shared.approvals.connect(
        res_tx,
        Box::new(move |ev| {
            if let (Some(x), crate::approvals::Event::Ask(h)) = (&ask_exec, &ev) {
                x.notify(h);
            }
            if let (Some((sock, last)), crate::approvals::Event::Ask(_)) = (&say, &ev) {
                say_ask(sock, last);
            }
            let _ = ev_tx.send(ev);
            waker.wake();
        }),
    );
    let mut hooks = hooks(shared, started);
    hooks.learn = learn.map(|out| {
        let shared = shared.clone();
        Arc::new(move || {
            let w = out.write(&shared)?;
            log::info!(
                "--learn: the draft policy is written to {} ({} rules, on request)",
                out.path().display(),
                w.rules
            );
            Ok(json!({
                "path": out.path().to_string_lossy(),
                "rules": w.rules,
                "bytes": w.bytes,
            }))
        }) as crate::control::server::LearnHandler
    });
    crate::stage::control::hook(&mut hooks, a.stage.as_deref(), live);
    let access = server::Access {
        daemon_uid: crate::host::sys::geteuid(),
        group,
    };
    let approvals = shared.approvals.clone();
    std::thread::Builder::new()
        .name("fencefs-control".into())
        .spawn(move || {
            server::run(
                listener,
                (wake_rx, lane_waker),
                ev_rx,
                approvals,
                access,
                hooks,
            )
        })
        .map_err(|e| e.to_string())?;
    log::info!(
        "control socket at {} (ask timeout {} s)",
        path.display(),
        a.ask_timeout
    );
    Ok(Some((path, res_rx)))
}

/// The staged mount's live side (one per daemon: the control socket's stage operations
/// and the checkpoint channel share it), or `None` without `--stage`.
pub(super) fn stage_live(
    a: &crate::cli::MountArgs,
    shared: &Arc<Shared>,
) -> Option<Arc<dyn crate::stage::control::Live>> {
    a.stage.as_ref().map(|d| {
        Arc::new(super::restage::Restage::new(shared.clone(), d.clone()))
            as Arc<dyn crate::stage::control::Live>
    })
}

/// Starts the thread that keeps `.fencefs/feedback`'s decisions (staged mounts): it reads
/// DIR, which the confined workers cannot.
pub(super) fn start_feedback(shared: &Arc<Shared>) -> Result<(), String> {
    match shared.notes.feedback() {
        Some(f) => f.start().map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// Binds and serves `--checkpoint-socket` (the agent's checkpoint channel) when given;
/// returns its path (to remove at exit).
pub(super) fn start_checkpoint(
    a: &crate::cli::MountArgs,
    live: Option<Arc<dyn crate::stage::control::Live>>,
) -> Result<Option<PathBuf>, String> {
    let Some(path) = a.checkpoint_socket.clone() else {
        return Ok(None);
    };
    // (The reviewer's feedback is refreshed by `start_feedback`, on every staged mount.)
    let (Some(dir), Some(live)) = (a.stage.clone(), live) else {
        return Err("--checkpoint-socket needs --stage (checkpoints are a staging area's)".into());
    };
    let l = crate::control::checkpoint::bind(&path)
        .map_err(|e| format!("checkpoint socket '{}': {e}", path.display()))?;
    let seal =
        Box::new(move |m: &str| crate::stage::agent::seal(&dir, &*live, m).map_err(String::from));
    crate::control::checkpoint::start(l, seal).map_err(|e| e.to_string())?;
    log::info!("checkpoint channel at {}", path.display());
    Ok(Some(path))
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

fn hooks(shared: &Arc<Shared>, started: Instant) -> Hooks {
    let s1 = shared.clone();
    let s2 = shared.clone();
    let s3 = shared.clone();
    Hooks {
        status: Box::new(move || {
            let snap = s1.policy.get();
            let (dropped, coalesced) = s1
                .audit
                .as_ref()
                .map_or((0, 0), |a| (a.dropped_total(), a.coalesced_total()));
            json!({
                "mode": snap.policy.mode().as_str(),
                "policy": s1.policy.files().first().map(|p| p.display().to_string()),
                "layers": s1.policy.files().iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
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
        reload: Arc::new(move || match reload_now(&s2) {
            Ok(snap) => Ok(json!({
                "generation": snap.generation,
                "rules": snap.policy.rules().len(),
            })),
            Err(errs) => Err(errs.iter().map(|e| e.to_string()).collect()),
        }),
        generation: Box::new(move || s3.policy.generation()),
        stage: None,
        learn: None,
        staged: None,
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

pub(super) fn signal_loop(
    sigs: SigSet,
    shared: Arc<Shared>,
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
                let _ = reload_now(&shared);
            }
            _ => {
                log::info!("{sig:?}: unmounting {}", mnt.display());
                super::UNMOUNT_ASKED.store(true, Ordering::SeqCst);
                // Held requests are answered (refused) first: no caller waits on a
                // daemon that is going away.
                shared.approvals.shutdown();
                if super::FD_MOUNT.load(Ordering::SeqCst) {
                    // `--fuse-fd-from`: the mount is the mounter's, out of reach here;
                    // exiting closes the connection (the mount answers ENOTCONN until
                    // the mounter unmounts it).
                    log::info!("closing the handed-over FUSE connection");
                } else if DIRECT_MOUNT.load(Ordering::SeqCst) {
                    // `fencefs run`: the mount is ours, in the run's private namespace.
                    // EINVAL: already detached with the mount it was on.
                    match crate::host::sys::ns::detach(&mnt) {
                        Err(e) if e.raw_os_error() != Some(libc::EINVAL) => {
                            log::warn!("unmount {}: {e}", mnt.display());
                        }
                        _ => {}
                    }
                } else if let Err(e) = unmounter.unmount() {
                    log::warn!("unmount failed ({e}); detaching lazily");
                    let mut cmd = std::process::Command::new("fusermount3");
                    let _ = crate::host::sys::private_umask(&mut cmd)
                        .arg("-u")
                        .arg("-z")
                        .arg(&mnt)
                        .status();
                }
                // A detached mount stays alive while a process still holds a file in it;
                // give the session a moment to end, then end the connection by exiting
                // (those files then fail with ENOTCONN, as after any unmount).
                let wait = if super::FD_MOUNT.load(Ordering::SeqCst) {
                    Duration::ZERO
                } else {
                    Duration::from_secs(2)
                };
                let deadline = Instant::now() + wait;
                while Instant::now() < deadline {
                    if SESSION_DONE.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                if !wait.is_zero() {
                    log::warn!("files still open in the detached mount; closing the connection");
                }
                flush_audit(&shared);
                crate::host::union::finish_deletions(Duration::from_millis(500));
                remove_control(CONTROL_SOCKET.get().map(PathBuf::as_path));
                log::logger().flush();
                std::process::exit(0);
            }
        }
    }
}
