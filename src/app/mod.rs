//! Running the commands: startup checks, the mount's life cycle; `threads` has the
//! daemon's own threads (signals, reloads, cache invalidations, the control socket).

mod threads;

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::time::{Duration, Instant};

use fuser::{Config, MountOption, Session, SessionACL};
use nix::sys::signal::{SigSet, Signal};

use crate::approvals::Approvals;
use crate::audit::{Audit, Rotation, Target};
use crate::cli::{Command, ExplainArgs, MountArgs};
use crate::fs::FenceFs;
use crate::fs::kcache::{Inval, KernelCache};
use crate::fs::ops::{Settings, Shared, Stats};
use crate::host::handle::Handles;
use crate::host::inode::Inodes;
use crate::host::sys;
use crate::idmap::IdMap;
use crate::policy::{Access, By, Caller, CeilingBy, Need, Policy, PolicyError, Special};
use crate::reload::{self, PolicyStore};
use threads::{notify_loop, signal_loop};

/// Set once the FUSE session has ended (the signal thread waits for it on SIGTERM).
pub(crate) static SESSION_DONE: AtomicBool = AtomicBool::new(false);

/// Kernel cache lifetime (s) for names and attributes when host changes are watched.
const WATCHED_TTL: f64 = 10.0;
/// ... and when they are not (no CAP_SYS_ADMIN, --no-watch).
const UNWATCHED_TTL: f64 = 1.0;

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
        Command::Mount(a) => match mount(a) {
            Ok(()) => 0,
            Err(msg) => {
                eprintln!("fencefs: {msg}");
                EXIT_ERR
            }
        },
        Command::Check { policy } => check(&policy),
        Command::Explain(a) => explain(a),
        Command::Ctl { socket, what } => crate::control::client::ctl(&socket, &what),
        Command::Approve { socket, auto } => {
            crate::control::client::approve(&socket, auto.map(|a| a == "allow"))
        }
    }
}

fn print_errors(errs: &[PolicyError]) {
    for e in errs {
        eprintln!("{e}");
    }
}

fn check(path: &Path) -> i32 {
    match crate::policy::load(path) {
        Ok(p) => {
            println!("ok: {} rules", p.rules().len());
            0
        }
        Err(errs) => {
            print_errors(&errs);
            EXIT_ERR
        }
    }
}

/// Normalizes a user-given workspace path: `./a//b/` → `a/b`; `..` is refused.
pub fn normalize(path: &str) -> Result<Vec<u8>, String> {
    let mut out: Vec<u8> = Vec::new();
    for comp in path.as_bytes().split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err(format!("path '{path}' must not contain '..'")),
            c => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(c);
            }
        }
    }
    Ok(out)
}

fn describe_by(p: &Policy, by: By, file: &str) -> String {
    describe_by_at(p, by, file, b"")
}

fn describe_rule(p: &Policy, i: usize, file: &str) -> String {
    let r = p.rule(i);
    format!(
        "rule #{} path = \"{}\" access = {} ({}:{})",
        i + 1,
        r.pattern,
        r.access,
        file,
        r.line
    )
}

fn describe_by_at(p: &Policy, by: By, file: &str, path: &[u8]) -> String {
    match by {
        By::Mode => describe_ceiling(p, file, path),
        By::Rule(i) => describe_rule(p, i, file),
        By::Visibility(i) => {
            let r = p.rule(i);
            let why = if r.access == Access::None {
                "does not cover what its except globs match below"
            } else {
                "grants access below"
            };
            format!(
                "visibility: rule #{} path = \"{}\" ({}:{}) {why}, so the directory stays listable",
                i + 1,
                r.pattern,
                file,
                r.line
            )
        }
        By::Default => format!("default = {}", p.default_access()),
    }
}

/// What the mode's ceiling at `path` comes from, as the audit log's `by`/`rule` say it.
fn describe_ceiling(p: &Policy, file: &str, path: &[u8]) -> String {
    match p.ceiling_by(path) {
        CeilingBy::Protected(i) => {
            let (entry, line) = p.protected_entry(i);
            let at = match line {
                Some(l) => format!("{file}:{l}"),
                None => "built-in default".to_string(),
            };
            format!(
                "protected entry \"{entry}\" ({at}), mode {} (ceiling)",
                p.mode()
            )
        }
        CeilingBy::WritableRoots => format!(
            "writable_roots: outside every entry of {:?}, mode {} (ceiling)",
            p.writable_roots(),
            p.mode()
        ),
        CeilingBy::ReadOnly | CeilingBy::Open => {
            format!("mode {} ({})", p.mode(), p.ceiling_reason(path))
        }
    }
}

fn explain(a: ExplainArgs) -> i32 {
    let policy = match reload::load(a.policy.as_ref(), a.mode) {
        Ok(p) => p,
        Err(errs) => {
            print_errors(&errs);
            return EXIT_ERR;
        }
    };
    let path = match normalize(&a.path) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fencefs: {e}");
            return 2;
        }
    };
    let file = a
        .policy
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "<built-in>".into());
    let caller = Caller {
        uid: a.uid,
        gid: a.gid,
    };
    // PATH is taken as a file unless it ends with '/', is the root, or OP is `list`: only
    // directories are lifted to `list` to reach granted paths below them.
    let as_dir = a.path.ends_with('/') || path.is_empty() || a.op.as_deref() == Some("list");
    let v = policy.verdict_for(&path, caller, as_dir);
    let shown = if path.is_empty() {
        ".".to_string()
    } else {
        String::from_utf8_lossy(&path).into_owned()
    };
    println!("path: {shown}");
    println!("access: {}", v.effective);
    println!(
        "decided by: {}",
        describe_by_at(&policy, v.by, &file, &path)
    );
    for (rule, k) in policy.excepted(&path, caller) {
        println!(
            "excepted: {} except \"{}\": not covered",
            describe_rule(&policy, rule, &file),
            policy.rule(rule).except[k]
        );
    }
    if v.by == By::Mode {
        println!(
            "grant: {} by {}",
            v.grant,
            describe_by(&policy, v.grant_by, &file)
        );
    }
    if !as_dir {
        let vd = policy.verdict_for(&path, caller, true);
        if vd.effective != v.effective {
            println!(
                "as a directory: {} ({})",
                vd.effective,
                describe_by_at(&policy, vd.by, &file, &path)
            );
        }
    }
    if let By::Rule(i) = v.grant_by
        && let Some(ask) = policy.rule(i).ask
    {
        println!("ask: {ask}");
    }
    println!("mode: {}", policy.mode());
    if let Some(op) = a.op {
        let need = match op.as_str() {
            "read" => Need::Read,
            "list" => Need::List,
            "create" => Need::Create,
            _ => Need::Write,
        };
        match policy.check_for(&path, caller, need, Special::default(), as_dir) {
            Ok(_) => println!("{op}: allow"),
            Err(d) if d.askable(&policy, need).is_some() => println!(
                "{op}: ask (held for an approver; EACCES if refused, timed out or none is connected) (by {})",
                describe_by_at(&policy, d.by, &file, &path)
            ),
            Err(d) => println!(
                "{op}: deny {} (by {})",
                crate::audit::errno_name(d.errno),
                describe_by_at(&policy, d.by, &file, &path)
            ),
        }
    }
    0
}

/// The file system type of the topmost mount exactly at `path`, if one is there.
fn top_mount_type(path: &Path) -> Option<String> {
    top_mount(&path.canonicalize().ok()?).map(|m| m.fstype)
}

/// One mount as `/proc/self/mountinfo` lists it.
struct MountEntry {
    /// `major:minor` of the mounted file system (unique per FUSE connection).
    dev: String,
    fstype: String,
}

/// The topmost mount exactly at the canonical path `canon` (read from mountinfo only: no
/// syscall on the path itself, which may be a FUSE mount nobody serves yet).
fn top_mount(canon: &Path) -> Option<MountEntry> {
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    let target = canon.as_os_str().as_bytes();
    // Later lines are mounted on top of earlier ones.
    info.split(|&b| b == b'\n')
        .rev()
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            if fields.get(4).is_none_or(|mp| unescape(mp) != target) {
                return None;
            }
            let sep = fields.iter().position(|f| *f == b"-")?;
            Some(MountEntry {
                dev: String::from_utf8_lossy(fields.get(2)?).into_owned(),
                fstype: String::from_utf8_lossy(fields.get(sep + 1)?).into_owned(),
            })
        })
        .next()
}

fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

fn find_in_path(bin: &str) -> bool {
    if let Some(p) = std::env::var_os("FUSERMOUNT_PATH") {
        return Path::new(&p).exists();
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

fn startup_checks(a: &MountArgs) -> Result<(PathBuf, PathBuf), String> {
    let src = &a.source;
    let md = std::fs::metadata(src).map_err(|e| format!("source '{}': {e}", src.display()))?;
    if !md.is_dir() {
        return Err(format!("source '{}' is not a directory", src.display()));
    }
    let mnt = &a.mountpoint;
    let mm = std::fs::metadata(mnt).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            format!(
                "mount point '{}': {e}: a FUSE daemon died there; detach it with \
                 `fusermount3 -u -z {}`",
                mnt.display(),
                mnt.display()
            )
        } else {
            format!("mount point '{}': {e}", mnt.display())
        }
    })?;
    if !mm.is_dir() {
        return Err(format!(
            "mount point '{}' is not a directory",
            mnt.display()
        ));
    }
    // Busy: a FUSE file system (another fencefs, say) is already mounted exactly there.
    // Other mounts (a Docker bind target, a Kubernetes volume) are fine to mount over.
    if let Some(t) = top_mount_type(mnt).filter(|t| t == "fuse" || t.starts_with("fuse.")) {
        return Err(format!(
            "mount point '{}' is busy: a {t} file system is already mounted there \
             (if its daemon is gone: fusermount3 -u -z {})",
            mnt.display(),
            mnt.display()
        ));
    }
    let src = src
        .canonicalize()
        .map_err(|e| format!("source '{}': {e}", src.display()))?;
    let mnt_c = mnt
        .canonicalize()
        .map_err(|e| format!("mount point '{}': {e}", mnt.display()))?;
    // Mounting over SOURCE itself is fine (the root handle is opened first); anything
    // strictly inside would make the mirror contain itself.
    if mnt_c != src && mnt_c.starts_with(&src) {
        return Err(format!(
            "mount point '{}' lies inside the source '{}'",
            mnt_c.display(),
            src.display()
        ));
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing: load the fuse module or pass --device /dev/fuse".into());
    }
    if !find_in_path("fusermount3") {
        return Err("fusermount3 not found in PATH: install the fuse3 package".into());
    }
    if a.allow_other && sys::geteuid() != 0 {
        let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
        if !conf.lines().any(|l| l.trim() == "user_allow_other") {
            return Err(
                "--allow-other needs 'user_allow_other' in /etc/fuse.conf when not run as root"
                    .into(),
            );
        }
    }
    if a.cache_ttl
        .is_some_and(|t| !t.is_finite() || !(0.0..=3600.0).contains(&t))
    {
        return Err("--cache-ttl must be between 0 and 3600 seconds".into());
    }
    Ok((src, mnt_c))
}

/// Blocks the signals the signal thread handles; must run before any thread exists.
fn block_signals() -> Result<SigSet, String> {
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGHUP, Signal::SIGINT, Signal::SIGTERM] {
        sigs.add(s);
    }
    sigs.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;
    Ok(sigs)
}

/// The policy to mount with, and its file (canonical, for reloads).
fn load_policy(a: &MountArgs) -> Result<(Policy, Option<PathBuf>), String> {
    let policy = reload::load(a.policy.as_ref(), a.mode).map_err(|errs| {
        // One line: every error, separated by "; ".
        let all: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        format!("invalid policy: {}", all.join("; "))
    })?;
    let policy_file = match &a.policy {
        Some(p) => Some(
            p.canonicalize()
                .map_err(|e| format!("policy '{}': {e}", p.display()))?,
        ),
        None => None,
    };
    Ok((policy, policy_file))
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

/// FUSE session settings: mount options, who may use the mount, worker threads.
fn session_config(a: &MountArgs, threads: usize) -> Config {
    let mut opts = vec![
        MountOption::FSName("fencefs".into()),
        // As root fuser calls mount(2) itself, which ignores `Subtype`; the kernel takes
        // `subtype=` as a mount option, so the type reads `fuse.fencefs` either way.
        MountOption::CUSTOM("subtype=fencefs".into()),
        MountOption::NoSuid,
        MountOption::NoDev,
    ];
    if a.allow_other {
        opts.push(MountOption::DefaultPermissions);
    }
    let mut config = Config::default();
    config.mount_options = opts;
    config.acl = if a.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(threads);
    config.clone_fd = true;
    config
}

fn mount(a: MountArgs) -> Result<(), String> {
    let sigs = block_signals()?;
    let (src, mnt) = startup_checks(&a)?;
    let (policy, policy_file) = load_policy(&a)?;
    let audit = start_audit(&a)?;
    let threads = a.threads.map(usize::from).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let uids = IdMap::parse(&a.map_uid)?;
    let gids = IdMap::parse(&a.map_gid)?;
    let nofile = sys::raise_nofile_limit();
    sys::set_umask(0);
    let root_fd = sys::open_root(&src).map_err(|e| format!("source '{}': {e}", src.display()))?;
    let fan = if a.no_watch {
        Err("--no-watch".to_string())
    } else {
        crate::watch::open(root_fd.as_fd()).map_err(|e| e.to_string())
    };
    // Host changes arrive as events: names and attributes may be cached for long.
    let ttl = a.cache_ttl.unwrap_or(if fan.is_ok() {
        WATCHED_TTL
    } else {
        UNWATCHED_TTL
    });
    let fd_cap = (nofile / 3).clamp(64, 16_384) as usize;
    let handles = handle_budget(nofile as usize, fd_cap, threads, a.max_open_per_uid);
    let inodes = Inodes::new(root_fd, fd_cap).map_err(|e| format!("source: {e}"))?;
    let rules = policy.rules().len();
    let mode = policy.mode();
    let shared = Arc::new(Shared {
        inodes,
        handles,
        policy: PolicyStore::new(policy, policy_file, a.mode),
        audit,
        settings: Settings {
            revoke: a.revoke,
            ttl: Duration::from_secs_f64(ttl),
            passthrough: !a.no_passthrough,
        },
        as_root: sys::geteuid() == 0,
        uids,
        gids,
        kcache: KernelCache::default(),
        approvals: Arc::new(Approvals::new(
            crate::approvals::MAX_HELD,
            threads::ask_timeout(&a),
        )),
        stats: Stats::default(),
    });
    let config = session_config(&a, threads);
    let control = threads::bind_control(&a)?;
    let plan = crate::transport::plan(a.transport)?;
    let fs = FenceFs::new(shared.clone());
    let core = fs.core();
    if matches!(plan, crate::transport::Plan::Offer { .. }) {
        core.offer_uring.store(true, Ordering::Relaxed);
    }
    let mut session = Session::new(fs, &mnt, &config).map_err(|e| {
        threads::remove_control(a.control.as_deref());
        format!("cannot mount at '{}': {e}", mnt.display())
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
    let notifier = session.notifier();
    let unmounter = session.unmount_callable();
    let (tx, rx) = channel::<Inval>();
    shared.kcache.connect(tx.clone());
    std::thread::Builder::new()
        .name("fencefs-notify".into())
        .spawn({
            let shared = shared.clone();
            move || notify_loop(notifier, rx, shared)
        })
        .map_err(|e| e.to_string())?;
    start_watch(fan, &shared, &tx, ttl)?;
    let (control, resume) = threads::start_control(control, &a, &shared, &tx, Instant::now())?
        .map_or((None, None), |(p, q)| (Some(p), Some(q)));
    let s2 = shared.clone();
    let mnt2 = mnt.clone();
    std::thread::Builder::new()
        .name("fencefs-signals".into())
        .spawn(move || signal_loop(sigs, s2, tx, unmounter, mnt2))
        .map_err(|e| e.to_string())?;
    log::info!(
        "mounted {} at {} (mode {mode}, {rules} rules, {threads} threads{})",
        src.display(),
        mnt.display(),
        if a.revoke { ", revoke" } else { "" }
    );
    // What runs after the session ends but needs the host outside SOURCE (mountinfo, the
    // control socket's file) runs on this thread, started before the main thread confines
    // itself (and the workers it starts).
    let (ended_tx, ended_rx) = channel::<()>();
    let finisher = std::thread::Builder::new()
        .name("fencefs-exit".into())
        .spawn({
            let mnt = mnt.clone();
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
    if a.no_confine {
        log::info!("self-confinement: off (--no-confine)");
    } else {
        confine(&shared, &src);
    }
    // After confinement: the queue threads inherit it.
    if let Err(e) = start_transport(plan, dev.ok(), &core, &a) {
        // The mount cannot serve a single request: end the connection (callers get
        // ENOTCONN, not a hang) and fail.
        let _ = session.unmount_callable().unmount();
        return Err(format!("transport: {e}"));
    }
    signal_ready(a.ready_fd, &mnt);
    threads::start_resume(resume)?;
    if a.daemonized {
        crate::daemon::detach_stdio();
    }
    let r = session.run();
    SESSION_DONE.store(true, Ordering::SeqCst);
    shared.approvals.shutdown();
    flush_audit(&shared);
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
    std::thread::Builder::new()
        .name("fencefs-watch".into())
        .spawn(move || {
            crate::watch::run(fan, s, true, |b| {
                let _ = tx.send(Inval {
                    entries: b.entries,
                    inodes: b.inodes,
                    everything: b.everything,
                    ..Inval::default()
                });
            })
        })
        .map_err(|e| e.to_string())?;
    log::info!("host changes: watched (fanotify); kernel caches names and attributes for {ttl} s");
    Ok(())
}

/// Confines the FUSE workers (the calling thread's descendants) and logs what was applied.
fn confine(shared: &Shared, src: &Path) {
    let c = crate::harden::confine(shared.inodes.root_fd().as_fd());
    let nnp = if c.no_new_privs { "on" } else { "off" };
    match (c.landlock_abi, c.landlock_error) {
        (Some(abi), _) => log::info!(
            "self-confinement: FUSE workers limited by Landlock (ABI {abi}) to {} and /dev/fuse; no_new_privs {nnp}",
            src.display()
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

/// Tells whoever waits that the mount serves requests: `--ready-fd` and systemd's
/// `$NOTIFY_SOCKET` (READY=1). Failures are logged, never fatal.
fn signal_ready(fd: Option<i32>, mnt: &Path) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_paths_are_normalized() {
        assert_eq!(normalize("./a//b/").unwrap(), b"a/b");
        assert_eq!(normalize("/").unwrap(), b"");
        assert!(normalize("a/../b").is_err());
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(b"/tmp/a\\040b"), b"/tmp/a b");
        assert_eq!(unescape(b"/x"), b"/x");
    }
}
