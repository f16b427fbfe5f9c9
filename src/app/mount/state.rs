//! Step 2 of a mount, **open and build the state**: open SOURCE (the root handle every
//! host access starts from), load the policy (the workspace layer is read through that
//! handle), start the audit writer, staging's merged view, the other roots, fanotify, the
//! descriptor and handle budgets, the node table, the approvals table (with `--answers`),
//! `--learn`'s draft file and the programs thread; all of it in the [`Shared`] state every thread uses.
//!
//! Takes: [`MountArgs`], SOURCE and MOUNTPOINT canonical (from `check`). Gives: [`State`]
//! and the fanotify descriptor on SOURCE (or why host changes are not watched), for the
//! threads step.
//!
//! Invariants: nothing here mounts. SOURCE is opened before anything is read from it, and
//! before the mount exists (so mounting over SOURCE itself still mirrors the host). The
//! programs thread starts here, before the workers are confined (host/programs.rs).
//! `vhost-user` builds its state with the same function.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::super::learn_out::LearnOut;
use super::super::threads;
use crate::approvals::Approvals;
use crate::audit::{Audit, Rotation, Target};
use crate::cli::MountArgs;
use crate::fs::kcache::KernelCache;
use crate::fs::ops::{Settings, Shared, Stats};
use crate::host::handle::Handles;
use crate::host::inode::Inodes;
use crate::host::roots::Roots;
use crate::host::sys;
use crate::idmap::IdMap;
use crate::policy::{Mode, Policy};
use crate::reload::{self, PolicyStore};

/// Kernel cache lifetime (s) for names and attributes when host changes are watched.
const WATCHED_TTL: f64 = 10.0;
/// ... and when they are not (no CAP_SYS_ADMIN, --no-watch).
const UNWATCHED_TTL: f64 = 1.0;

/// What the first step built: the state every thread shares, and what later steps need.
pub(in crate::app) struct State {
    /// SOURCE and MOUNTPOINT, canonical.
    pub(in crate::app) src: PathBuf,
    pub(in crate::app) mnt: PathBuf,
    pub(in crate::app) shared: Arc<Shared>,
    /// FUSE worker threads.
    pub(super) threads: usize,
    /// Kernel cache lifetime (s) for names and attributes.
    pub(in crate::app) ttl: f64,
    /// For the "mounted" log line: the policy's rule count and mode.
    pub(in crate::app) rules: usize,
    pub(in crate::app) mode: Mode,
    /// `--learn`'s draft file, opened here (before the mount, outside any confinement).
    pub(in crate::app) learn_out: Option<Arc<LearnOut>>,
}

/// Loads the policy (the workspace layer read from SOURCE), starts the audit writer, opens
/// SOURCE (checked, canonical) and builds the shared state. Also returns the fanotify
/// descriptor on SOURCE, or why host changes are not watched.
pub(in crate::app) fn build_state(
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
    let learn_out = match &a.learn {
        Some(p) => Some(Arc::new(LearnOut::open(p)?)),
        None => None,
    };
    let threads = a.threads.map(usize::from).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let uids = IdMap::parse(&a.map_uid)?;
    let gids = IdMap::parse(&a.map_gid)?;
    let nofile = sys::raise_nofile_limit();
    sys::set_umask(0);
    // Staging: the daemon serves the merged view (SOURCE with DIR's staged tree on top);
    // host changes are still watched on SOURCE itself.
    let (root_fd, event_source, union) = match &a.stage {
        Some(dir) => {
            crate::stage::set_source(&root_fd);
            let u = crate::stage::start_union(dir, &src, &mnt, &root_fd)?;
            let source = root_fd.try_clone().map_err(|e| format!("source: {e}"))?;
            (root_fd, Some(source), Some(u))
        }
        None => (root_fd, None, None),
    };
    let roots = super::super::roots::build(a, &src, &mnt)?;
    let fan = open_watch(a, &roots, event_source.as_ref().unwrap_or(&root_fd).as_fd());
    // Host changes arrive as events: names and attributes may be cached for long.
    let ttl = a.cache_ttl.unwrap_or(if fan.is_ok() {
        WATCHED_TTL
    } else {
        UNWATCHED_TTL
    });
    let fd_cap = (nofile / 3).clamp(64, 16_384) as usize;
    // A staged mount's merged directories hold a descriptor per layer part (cached, see
    // `host::inode::merged::Stacks`): their share comes out of the handles' budget.
    let stack_fds = match union {
        Some(_) => (fd_cap / 4).clamp(16, crate::host::inode::MAX_STACK_PARTS),
        None => 0,
    };
    let handles = handle_budget(
        nofile as usize,
        fd_cap + stack_fds,
        threads,
        a.max_open_per_uid,
    );
    if roots.iter().next().is_some() {
        // One root's flood of opens must not starve the others (host/budget.rs).
        handles.split();
    }
    let mut inodes = Inodes::new(root_fd, fd_cap).map_err(|e| format!("source: {e}"))?;
    inodes.set_roots(roots);
    if let Some(source) = event_source {
        inodes.set_event_source(source);
    }
    if let Some(u) = union {
        inodes
            .set_union(u, stack_fds)
            .map_err(|e| format!("staging: the merged view: {e}"))?;
    }
    let rules = policy.rules().len();
    let mode = policy.mode();
    let approvals = Approvals::new(crate::approvals::MAX_HELD, threads::ask_timeout(a))
        .with_dir_hold(Duration::from_secs(a.ask_dir_hold));
    let approvals = load_answers(a, &src, &mnt, approvals)?;
    let shared = Arc::new(Shared {
        inodes,
        handles,
        policy: PolicyStore::new(policy, policy_file, a.mode, Some(policy_source)),
        audit,
        settings: Settings {
            revoke: a.revoke,
            ttl: Duration::from_secs_f64(ttl),
            passthrough: !a.no_passthrough && passthrough_possible(a),
            learn: a.learn.as_ref().map(|_| Default::default()),
            xattr: !a.no_xattr,
        },
        as_root: sys::geteuid() == 0,
        uids,
        gids,
        kcache: KernelCache::default(),
        gate: a.stage.as_ref().map(|_| Default::default()),
        bases: a.stage.as_ref().map(|d| {
            Arc::new(crate::stage::base::Bases::new(
                &std::fs::canonicalize(d).unwrap_or(d.clone()),
            ))
        }),
        approvals: Arc::new(approvals),
        stats: Stats::default(),
        // Started now, before the workers are confined (host/programs.rs).
        programs: crate::host::programs::Programs::with_thread()
            .map_err(|e| format!("cannot start the programs thread: {e}"))?,
        notes: crate::fs::notes::Notes::new(a.stage.clone()),
        saves: Default::default(),
    });
    shared
        .approvals
        .set_sweep(crate::fs::ops::sweeper(Arc::downgrade(&shared)));
    let state = State {
        src,
        mnt,
        shared,
        threads,
        ttl,
        rules,
        mode,
        learn_out,
    };
    Ok((state, fan))
}

/// The fanotify descriptor on SOURCE (`root`: SOURCE itself, also with staging) and the
/// other roots, or why host changes are not watched.
fn open_watch(a: &MountArgs, roots: &Roots, root: BorrowedFd<'_>) -> Result<OwnedFd, String> {
    if a.no_watch {
        Err("--no-watch".to_string())
    } else {
        crate::watch::open(root)
            .and_then(|fan| super::super::roots::watch(&fan, roots, root).map(|()| fan))
            .map_err(|e| e.to_string())
    }
}

/// `--answers`: the remembered answers, loaded into the approvals table. The file must
/// live outside SOURCE and MOUNTPOINT.
fn load_answers(
    a: &MountArgs,
    src: &Path,
    mnt: &Path,
    approvals: Approvals,
) -> Result<Approvals, String> {
    let Some(f) = &a.answers else {
        return Ok(approvals);
    };
    // The agent must not write its own answers, nor the daemon write through its mount.
    let dir = f.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = std::fs::canonicalize(dir.unwrap_or(Path::new(".")))
        .map_err(|e| format!("--answers {}: {e}", f.display()))?;
    if dir.starts_with(src) || dir.starts_with(mnt) {
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
    Ok(approvals.with_answers(answers))
}

/// The policy to mount with, and its layers' files (canonical, for reloads).
fn load_policy(
    a: &MountArgs,
    source: std::os::fd::BorrowedFd<'_>,
) -> Result<(Policy, Vec<PathBuf>), String> {
    let invalid = |errs: Vec<crate::policy::PolicyError>| {
        // One line: every error, separated by "; ".
        let all: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        format!("invalid policy: {}", all.join("; "))
    };
    // Errors name the files as given.
    let policy = reload::load_in(&a.policy, a.mode, Some(source)).map_err(invalid)?;
    let files = a
        .policy
        .iter()
        .map(|p| {
            let e = |e: std::io::Error| format!("policy '{}': {e}", p.display());
            let canon = p.canonicalize().map_err(e)?;
            // A symlinked file stays a symlink (its directory canonical): a ConfigMap's
            // `policy.toml -> ..data/policy.toml` must be read anew at each reload, not
            // the timestamped directory the kubelet removes after its next update.
            match (p.parent(), p.file_name()) {
                (Some(d), Some(n)) if p.is_symlink() => {
                    let d = if d.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        d
                    };
                    Ok(d.canonicalize().map_err(e)?.join(n))
                }
                _ => Ok(canon),
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    // Named by the canonical paths, as every reload reads them: audit lines keep one name.
    let policy = if files == a.policy {
        policy
    } else {
        reload::load_in(&files, a.mode, Some(source)).map_err(invalid)?
    };
    Ok((policy, files))
}

/// Starts the audit writer when `--audit` is given.
fn start_audit(a: &MountArgs) -> Result<Option<Audit>, String> {
    let Some(t) = &a.audit else { return Ok(None) };
    let target = if t == "-" {
        Target::Stderr
    } else {
        Target::File(PathBuf::from(t))
    };
    let rotation = Rotation {
        max_size: a.audit_max_size,
        keep: a.audit_keep,
    };
    Audit::start(target, a.audit_allowed, rotation)
        .map(Some)
        .map_err(|e| format!("audit file '{t}': {e}"))
}

/// Descriptors kept back from open handles for the daemon's own work: the FUSE channels,
/// the audit file, fanotify, and the short-lived opens of every worker.
const FD_RESERVE: usize = 256;
/// Handle table entries: for all uids together, and for one uid.
const HANDLES_TOTAL: usize = 262_144;
const HANDLES_PER_UID: usize = 65_536;

/// The handle table with its budgets: what is left of RLIMIT_NOFILE after the `O_PATH`
/// cache and a reserve goes to handles that hold a descriptor, a quarter of it (or
/// `--max-open-per-uid`) at most to one uid, so one caller cannot starve the others.
fn handle_budget(nofile: usize, fd_cache: usize, threads: usize, cap: Option<u32>) -> Handles {
    let pool = nofile
        .saturating_sub(fd_cache + FD_RESERVE + 8 * threads)
        .max(64);
    let per_uid = cap.map_or(pool / 4, |n| n as usize);
    log::info!(
        "descriptors: {pool} for open handles, at most {} for one uid (RLIMIT_NOFILE {nofile}, {fd_cache} cached lookups)",
        per_uid.min(pool)
    );
    Handles::new(pool, per_uid, HANDLES_TOTAL, HANDLES_PER_UID)
}

/// Kernel passthrough needs CAP_SYS_ADMIN in the daemon (the kernel's backing-file ioctl
/// checks it). A mount made by fusermount3 or by root never offers it otherwise; a
/// descriptor handed to an unprivileged daemon (`--fuse-fd-from`) was mounted by root, so
/// the kernel offers it and every open would fail: serve file I/O through the daemon.
fn passthrough_possible(a: &MountArgs) -> bool {
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    if a.fuse_fd_from.is_none() {
        return true;
    }
    let ok = sys::effective_caps(std::process::id()).is_ok_and(|c| c & CAP_SYS_ADMIN != 0);
    if !ok {
        log::info!("--fuse-fd-from without CAP_SYS_ADMIN: no kernel passthrough");
    }
    ok
}
