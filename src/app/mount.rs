//! The mount's life cycle, in the order it must run: block signals; check and build the
//! shared state; bind the control socket, plan the transport and mount the session; start
//! the daemon's threads (notify, watch, control, signals) and the exit thread; confine the
//! workers; start the io_uring queues; signal readiness; serve until unmounted; shut down.
//!
//! Invariants (the order of [`mount`]'s steps is load-bearing; keep it):
//! - the signal mask is set before any thread exists, so every thread inherits it;
//! - the control socket is bound before mounting (once the mount is there, so is the
//!   socket), and the transport plan is made before `Session::new` (it decides what INIT
//!   offers);
//! - the threads that need the host outside SOURCE (notify, watch, control, signals, exit)
//!   start before the main thread confines itself, so they stay unconfined;
//! - confinement comes before the io_uring queues, the resume thread and readiness, so the
//!   queue threads inherit it and nobody is told "ready" before it applies;
//! - after the session ends: `SESSION_DONE`, held requests released, the audit flushed,
//!   then the exit thread reports whether the mount is really gone.
//!
//! Where each step is (`mount` calls them one after the other):
//!
//! | step | functions | file |
//! |---|---|---|
//! | 1. check: signal mask, SOURCE/MOUNTPOINT, policy, audit writer | `block_signals`; then, from `build_state`, `startup_checks`, `load_policy`, `start_audit` | `startup.rs` |
//! | 2. open SOURCE and build the shared state (budgets, node table, fanotify) | `build_state`, `handle_budget` | here, `startup.rs` |
//! | 3. mount: control socket, transport plan, session options (fsname = SOURCE), `Session::new` | `mount_session`, `bind_control`, `session_config` | here, `threads.rs`, `startup.rs` |
//! | 4. start the daemon's threads: notify, watch, control, signals, exit | `start_threads`, `start_watch`, `start_control`, `start_exit_thread` | here, `threads.rs` |
//! | 5. serve: confine, io_uring queues, readiness, resume thread, detach stdio, `session.run` | `serve`, `confine`, `start_transport`, `signal_ready`, `start_resume` | here, `threads.rs` |
//! | 6. tear down: `SESSION_DONE`, held requests refused, audit flushed, exit thread joined | the end of `serve`, `flush_audit` | here |

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::Session;
use nix::sys::signal::SigSet;

use super::SESSION_DONE;
use super::notify::notify_loop;
use super::startup::{
    block_signals, handle_budget, load_policy, session_config, start_audit, startup_checks,
    top_mount,
};
use super::threads::{self, signal_loop};
use crate::approvals::Approvals;
use crate::cli::MountArgs;
use crate::fs::kcache::{Inval, KernelCache};
use crate::fs::ops::{Settings, Shared, Stats};
use crate::fs::{Core, FenceFs};
use crate::host::inode::Inodes;
use crate::host::sys;
use crate::idmap::IdMap;
use crate::policy::Mode;
use crate::reload::PolicyStore;
use crate::transport::Plan;

/// Kernel cache lifetime (s) for names and attributes when host changes are watched.
const WATCHED_TTL: f64 = 10.0;
/// ... and when they are not (no CAP_SYS_ADMIN, --no-watch).
const UNWATCHED_TTL: f64 = 1.0;

/// What the first step built: the state every thread shares, and what later steps need.
pub(super) struct State {
    /// SOURCE and MOUNTPOINT, canonical.
    pub(super) src: PathBuf,
    pub(super) mnt: PathBuf,
    pub(super) shared: Arc<Shared>,
    /// FUSE worker threads.
    threads: usize,
    /// Kernel cache lifetime (s) for names and attributes.
    pub(super) ttl: f64,
    /// For the "mounted" log line: the policy's rule count and mode.
    pub(super) rules: usize,
    pub(super) mode: Mode,
}

/// The mounted session, before the daemon's threads run.
struct Mounted {
    session: Session<FenceFs>,
    core: Arc<Core>,
    plan: Plan,
    /// The connection's device, for kernel passthrough and the io_uring queues.
    dev: io::Result<OwnedFd>,
    /// The bound control socket, until its server starts.
    control: Option<threads::Control>,
}

/// The thread that finishes up after the session ends (see [`start_exit_thread`]).
struct ExitThread {
    ended: Sender<()>,
    handle: JoinHandle<()>,
}

/// Mounts and serves until unmounted. The steps run in exactly this order (module docs).
pub(super) fn mount(a: MountArgs) -> Result<(), String> {
    // Few malloc arenas: memory freed after a big walk goes back to the system.
    sys::limit_malloc_arenas(2);
    let sigs = block_signals()?;
    let (src, mnt) = startup_checks(&a)?;
    let (state, fan) = build_state(&a, src, mnt)?;
    let mut m = mount_session(&a, &state)?;
    let (control, resume) = start_threads(&a, &state, &mut m, fan, sigs)?;
    log::info!(
        "mounted {} at {} (mode {}, {} rules, {} threads{})",
        state.src.display(),
        state.mnt.display(),
        state.mode,
        state.rules,
        state.threads,
        if a.revoke { ", revoke" } else { "" }
    );
    let exit = start_exit_thread(&state.mnt, control)?;
    serve(&a, &state, m, resume, exit)
}

/// Loads the policy (the workspace layer read from SOURCE), starts the audit writer, opens
/// SOURCE (checked, canonical) and builds the shared state. Also returns the fanotify
/// descriptor on SOURCE, or why host changes are not watched.
pub(super) fn build_state(
    a: &MountArgs,
    src: PathBuf,
    mnt: PathBuf,
) -> Result<(State, Result<OwnedFd, String>), String> {
    let root_fd = sys::open_root(&src).map_err(|e| format!("source '{}': {e}", src.display()))?;
    let (policy, policy_file) = load_policy(a, root_fd.as_fd())?;
    let policy_source = root_fd
        .try_clone()
        .map_err(|e| format!("source '{}': {e}", src.display()))?;
    let audit = start_audit(a)?;
    let threads = a.threads.map(usize::from).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let uids = IdMap::parse(&a.map_uid)?;
    let gids = IdMap::parse(&a.map_gid)?;
    let nofile = sys::raise_nofile_limit();
    sys::set_umask(0);
    // Staging: the daemon serves the merged view (SOURCE with DIR's staged tree on top).
    let root_fd = match &a.stage {
        Some(dir) => crate::stage::start(dir, &src, &mnt, &root_fd)?,
        None => root_fd,
    };
    let roots = super::roots::build(a, &src, &mnt)?;
    let fan = if a.no_watch {
        Err("--no-watch".to_string())
    } else if a.stage.is_some() {
        Err("staging".to_string())
    } else {
        crate::watch::open(root_fd.as_fd())
            .and_then(|fan| super::roots::watch(&fan, &roots, root_fd.as_fd()).map(|()| fan))
            .map_err(|e| e.to_string())
    };
    // Host changes arrive as events: names and attributes may be cached for long.
    let ttl = a.cache_ttl.unwrap_or(if fan.is_ok() {
        WATCHED_TTL
    } else {
        UNWATCHED_TTL
    });
    let fd_cap = (nofile / 3).clamp(64, 16_384) as usize;
    let handles = handle_budget(nofile as usize, fd_cap, threads, a.max_open_per_uid);
    let mut inodes = Inodes::new(root_fd, fd_cap).map_err(|e| format!("source: {e}"))?;
    inodes.set_roots(roots);
    let rules = policy.rules().len();
    let mode = policy.mode();
    let mut approvals = Approvals::new(crate::approvals::MAX_HELD, threads::ask_timeout(a))
        .with_dir_hold(Duration::from_secs(a.ask_dir_hold));
    if let Some(f) = &a.answers {
        // The agent must not write its own answers, nor the daemon write through its mount.
        let dir = f.parent().filter(|p| !p.as_os_str().is_empty());
        let dir = std::fs::canonicalize(dir.unwrap_or(Path::new(".")))
            .map_err(|e| format!("--answers {}: {e}", f.display()))?;
        if dir.starts_with(&src) || dir.starts_with(&mnt) {
            return Err(format!(
                "--answers {} must live outside SOURCE and MOUNTPOINT (the agent could write its own answers)",
                f.display()
            ));
        }
        let answers = crate::approvals::answers::Answers::load(f).map_err(|errs| {
            let lines: Vec<String> = errs
                .iter()
                .map(|e| crate::quote::escape(e.to_string().as_bytes()).into_owned())
                .collect();
            format!("invalid answers file:\n{}", lines.join("\n"))
        })?;
        log::info!(
            "answers: {} remembered in {}",
            answers.list().len(),
            crate::quote::quote(f.as_os_str().as_encoded_bytes())
        );
        approvals = approvals.with_answers(answers);
    }
    let shared = Arc::new(Shared {
        inodes,
        handles,
        policy: PolicyStore::new(policy, policy_file, a.mode, Some(policy_source)),
        audit,
        settings: Settings {
            revoke: a.revoke,
            ttl: Duration::from_secs_f64(ttl),
            passthrough: !a.no_passthrough,
            learn: a.learn.as_ref().map(|_| Default::default()),
        },
        as_root: sys::geteuid() == 0,
        uids,
        gids,
        kcache: KernelCache::default(),
        gate: a.stage.as_ref().map(|_| Default::default()),
        approvals: Arc::new(approvals),
        stats: Stats::default(),
        // Started now, before the workers are confined (host/programs.rs).
        programs: crate::host::programs::Programs::with_thread()
            .map_err(|e| format!("cannot start the programs thread: {e}"))?,
        notes: crate::fs::notes::Notes::new(a.stage.is_some()),
    });
    let state = State {
        src,
        mnt,
        shared,
        threads,
        ttl,
        rules,
        mode,
    };
    Ok((state, fan))
}

/// Binds the control socket, plans the transport, then mounts (in that order: the socket
/// exists once the mount does; the plan decides what INIT offers).
fn mount_session(a: &MountArgs, state: &State) -> Result<Mounted, String> {
    let config = session_config(a, &state.src, state.threads);
    let control = threads::bind_control(a)?;
    let plan = crate::transport::plan(a.transport)?;
    let fs = FenceFs::new(state.shared.clone());
    let core = fs.core();
    if matches!(plan, Plan::Offer { .. }) {
        core.offer_uring.store(true, Ordering::Relaxed);
    }
    let session = Session::new(fs, &state.mnt, &config).map_err(|e| {
        threads::remove_control(a.control.as_deref());
        format!("cannot mount at '{}': {e}", state.mnt.display())
    })?;
    // Backing ids for kernel passthrough are opened on the connection's device.
    let dev = session.as_fd().try_clone_to_owned();
    match &dev {
        Ok(dev) => match dev.try_clone() {
            Ok(d) => core.set_device(d),
            Err(e) => log::warn!("FUSE device: {e}; file I/O goes through the daemon"),
        },
        Err(e) => log::warn!("FUSE device: {e}; file I/O goes through the daemon"),
    }
    Ok(Mounted {
        session,
        core,
        plan,
        dev,
        control,
    })
}

/// Starts the daemon's threads, in order: notify, watch, control, signals. Returns the
/// control socket's path (to remove at exit) and the resume queue (served after
/// confinement).
fn start_threads(
    a: &MountArgs,
    state: &State,
    m: &mut Mounted,
    fan: Result<OwnedFd, String>,
    sigs: SigSet,
) -> Result<(Option<PathBuf>, Option<threads::ResumeQueue>), String> {
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
    let (control, resume) =
        threads::start_control(m.control.take(), a, shared, &tx, Instant::now())?
            .map_or((None, None), |(p, q)| (Some(p), Some(q)));
    let s2 = shared.clone();
    let mnt2 = state.mnt.clone();
    std::thread::Builder::new()
        .name("fencefs-signals".into())
        .spawn(move || signal_loop(sigs, s2, tx, unmounter, mnt2))
        .map_err(|e| e.to_string())?;
    Ok((control, resume))
}

/// What runs after the session ends but needs the host outside SOURCE (mountinfo, the
/// control socket's file) runs on this thread, started before the main thread confines
/// itself (and the workers it starts).
fn start_exit_thread(mnt: &Path, control: Option<PathBuf>) -> Result<ExitThread, String> {
    let (ended_tx, ended_rx) = channel::<()>();
    let finisher = std::thread::Builder::new()
        .name("fencefs-exit".into())
        .spawn({
            let mnt = mnt.to_path_buf();
            let ours = top_mount(&mnt).map(|m| m.dev);
            move || {
                let _ = ended_rx.recv();
                threads::remove_control(control.as_deref());
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

/// Confines the workers, starts the transport, says "ready", serves until the session
/// ends, then shuts down: held requests released, audit flushed, the exit thread joined.
fn serve(
    a: &MountArgs,
    state: &State,
    m: Mounted,
    resume: Option<threads::ResumeQueue>,
    exit: ExitThread,
) -> Result<(), String> {
    let Mounted {
        mut session,
        core,
        plan,
        dev,
        ..
    } = m;
    let ExitThread {
        ended: ended_tx,
        handle: finisher,
    } = exit;
    // --learn: the draft's file is opened now, outside the confinement that follows.
    let learn_out = match &a.learn {
        Some(p) => Some(std::fs::File::create(p).map_err(|e| {
            format!(
                "--learn {}: {e}",
                crate::quote::quote(p.as_os_str().as_encoded_bytes())
            )
        })?),
        None => None,
    };
    if a.no_confine {
        log::info!("self-confinement: off (--no-confine)");
    } else {
        confine(&state.shared, &state.src);
    }
    // After confinement: the queue threads inherit it.
    if let Err(e) = start_transport(plan, dev.ok(), &core, a) {
        // The mount cannot serve a single request: end the connection (callers get
        // ENOTCONN, not a hang) and fail.
        let _ = session.unmount_callable().unmount();
        return Err(format!("transport: {e}"));
    }
    signal_ready(a.ready_fd, &state.mnt);
    threads::start_resume(resume)?;
    if a.daemonized {
        crate::daemon::detach_stdio();
    }
    let r = session.run();
    SESSION_DONE.store(true, Ordering::SeqCst);
    state.shared.approvals.shutdown();
    flush_audit(&state.shared);
    if let (Some(mut f), Some(rec)) = (learn_out, &state.shared.settings.learn) {
        let draft = rec.draft(&state.shared.policy.get().policy);
        match std::io::Write::write_all(&mut f, draft.as_bytes()) {
            Ok(()) => log::info!("--learn: the draft policy is written"),
            Err(e) => log::error!("--learn: writing the draft failed: {e}"),
        }
    }
    let _ = ended_tx.send(());
    let _ = finisher.join();
    r.map_err(|e| format!("session ended: {e}"))?;
    Ok(())
}

/// Starts the io_uring queues when the kernel took the offer, and logs the transport.
/// `Err`: the kernel holds every request and nothing can release it but ending the
/// connection.
fn start_transport(
    plan: crate::transport::Plan,
    dev: Option<OwnedFd>,
    core: &Arc<crate::fs::Core>,
    a: &MountArgs,
) -> Result<(), String> {
    use crate::transport::{self, Plan, Started, dispatch::Acl};
    let why = match (plan, dev) {
        (Plan::Classic(why), _) => why,
        (Plan::Offer { .. }, _) if !core.uring.load(Ordering::Relaxed) => {
            "the kernel did not take FUSE over io_uring at INIT".into()
        }
        (Plan::Offer { .. }, None) => {
            return Err("io_uring was negotiated but the FUSE device cannot be shared".into());
        }
        (Plan::Offer { queues }, Some(dev)) => {
            let acl = if a.allow_other {
                Acl::All
            } else {
                Acl::Owner(sys::geteuid())
            };
            let sizes = transport::sizes(crate::fs::MAX_WRITE);
            match transport::start(&dev, core, acl, sizes, queues)? {
                Started::Uring => {
                    log::info!(
                        "transport: FUSE over io_uring ({queues} queues x {} entries of {} KiB)",
                        sizes.depth,
                        sizes.payload / 1024
                    );
                    return Ok(());
                }
                Started::FellBack(e) => {
                    log::warn!(
                        "transport: io_uring queues failed ({e}); the kernel serves the mount through /dev/fuse"
                    );
                    return Ok(());
                }
            }
        }
    };
    log::info!("transport: /dev/fuse ({why})");
    Ok(())
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
    let reload = super::policy_watch::start(shared.clone(), tx.clone())?;
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

/// Confines the FUSE workers (the calling thread's descendants) and logs what was applied.
pub(super) fn confine(shared: &Shared, src: &Path) {
    let roots: Vec<_> = shared.inodes.roots().iter().map(|r| r.fd.clone()).collect();
    let extra: Vec<_> = roots.iter().map(|fd| fd.as_fd()).collect();
    // Staged: the rule goes on the private tree every merged view is attached to.
    let root = shared.inodes.root_fd();
    let c = crate::harden::confine(
        crate::stage::tree_mount::root().unwrap_or(root.as_fd()),
        &extra,
    );
    let others = shared
        .inodes
        .roots()
        .iter()
        .filter(|r| r.kind == libc::S_IFDIR)
        .count();
    let src = if others > 0 {
        format!("{} (and {others} more roots)", src.display())
    } else {
        src.display().to_string()
    };
    let nnp = if c.no_new_privs { "on" } else { "off" };
    match (c.landlock_abi, c.landlock_error) {
        (Some(abi), _) => log::info!(
            "self-confinement: FUSE workers limited by Landlock (ABI {abi}) to {src} and /dev/fuse; no_new_privs {nnp}"
        ),
        (None, e) => log::warn!(
            "self-confinement: Landlock unavailable ({}); no_new_privs {nnp}",
            e.unwrap_or_default()
        ),
    }
}

/// Writes the audit lines still pending (coalescing windows) before the daemon exits.
pub(crate) fn flush_audit(shared: &Shared) {
    if let Some(a) = &shared.audit
        && !a.flush(Duration::from_secs(2))
    {
        log::warn!("audit: the writer did not flush within 2 s; the last lines may be missing");
    }
}

/// Tells whoever waits that the mount serves requests: `--ready-fd` and systemd's
/// `$NOTIFY_SOCKET` (READY=1). Failures are logged, never fatal.
pub(super) fn signal_ready(fd: Option<i32>, mnt: &Path) {
    if let Some(fd) = fd {
        match sys::write_and_close(fd, b"ready\n") {
            Ok(()) => {}
            Err(e) => log::warn!("--ready-fd {fd}: {e}"),
        }
    }
    if let Some(sock) = std::env::var_os("NOTIFY_SOCKET") {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixDatagram};
        let b = sock.as_bytes();
        let addr = if let Some(abs) = b.strip_prefix(b"@") {
            SocketAddr::from_abstract_name(abs)
        } else {
            SocketAddr::from_pathname(Path::new(&sock))
        };
        let msg = format!(
            "READY=1\nSTATUS=serving {}\nMAINPID={}",
            mnt.display(),
            std::process::id()
        );
        let r = addr.and_then(|addr| {
            let s = UnixDatagram::unbound()?;
            s.send_to_addr(msg.as_bytes(), &addr).map(drop)
        });
        if let Err(e) = r {
            log::warn!("NOTIFY_SOCKET: {e}");
        }
    }
}
