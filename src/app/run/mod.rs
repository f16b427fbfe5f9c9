//! `fencefs run [OPTIONS] -- COMMAND…`: COMMAND with the workspace (and $HOME) fenced at
//! their own paths, no root needed. The steps, in the order they must run:
//!
//! 1. `setup`: paths, policy files, the daemons' `mount` arguments (nothing mounted);
//! 2. prerequisites: `/dev/fuse` usable; staging needs root for now;
//! 3. `ns::enter_private_ns`: a new mount namespace, inside a new user namespace mapping
//!    only the caller's uid and gid when not root; every mount in it private;
//! 4. `prove::Before::take` of each directory to fence (the host's view);
//! 5. `daemon::start`: the workspace's fence, mounted directly over its own path; then a
//!    mount namespace of `fencefs run`'s own (COMMAND's; the workspace's daemon stays in
//!    the one before, seeing the host's $HOME and the run's directories as they are),
//!    where $HOME's fence is mounted the same way (a workspace inside $HOME is bound back
//!    on top of it);
//! 6. `prove`: each fence checked from inside, or COMMAND never starts;
//! 7. the run's own directories (control socket, staging area) covered with an empty
//!    tmpfs there, out of COMMAND's reach;
//! 8. one line on stderr, then `child::run`: COMMAND, in the caller's cwd (resolved again,
//!    so it is the fence's), as the caller, in the terminal's foreground job, under an init
//!    of its own in a new PID namespace (`init`), with `$FENCEFS_CHECKPOINT` naming the
//!    agent's checkpoint channel when staged (its own directory, not covered: the one thing
//!    of the run COMMAND may reach);
//! 9. what COMMAND left running ended (`orphans`), this namespace's copies of the mounts
//!    detached, the daemons stopped; staged changes offered for review (`finish`).
//!
//! Invariants: steps 1–5 run while the process has a single thread (unshare and fork
//! need it). The mounts exist only in the private namespace: when its last process exits
//! they are gone, and every process in it dies with `fencefs run` (the daemons and COMMAND
//! by PR_SET_PDEATHSIG), so nothing is left mounted anywhere, even after SIGKILL.

mod child;
mod daemon;
mod finish;
mod init;
mod orphans;
mod prove;
mod setup;

pub(super) use setup::places;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::cli::RunArgs;
use crate::host::sys::ns;

pub(super) use init::main as init;

/// Runs COMMAND fenced; returns the exit code.
pub(super) fn run(a: RunArgs) -> i32 {
    // Quiet: one line when the fence is up, nothing else unless something is wrong.
    if std::env::var_os("RUST_LOG").is_none() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    match fence(&a) {
        Ok(f) => {
            eprintln!("{}", f.line);
            let lock = f.s.uid == 0;
            let daemons: Vec<_> = f.daemons.iter().map(|d| d.pid).collect();
            let env = f.s.checkpoint.as_deref();
            let code = child::run(&a.command, (&f.s.cwd, env), lock, &daemons);
            // This process's copies of the mounts go first (a copy would keep a session
            // alive), then the daemons; staging's review below sees the host again.
            for d in f.covered.iter().chain([&f.s.ws]).chain(&f.s.home) {
                let _ = ns::detach(d);
            }
            stop_all(f.daemons);
            child::release_signals();
            if let Some(dir) = &f.s.stage {
                finish::staged(dir);
            }
            code
        }
        Err(e) => {
            if !e.is_empty() {
                eprintln!("fencefs: {e}");
            }
            super::EXIT_ERR
        }
    }
}

/// The fence, up and proven.
struct Fence {
    s: setup::Setup,
    daemons: Vec<daemon::Daemon>,
    line: String,
    /// The directories covered by `hide_own_dirs`.
    covered: Vec<PathBuf>,
}

/// Steps 1–7. On an error every daemon already started is stopped.
fn fence(a: &RunArgs) -> Result<Fence, String> {
    let s = setup::setup(a)?;
    let root = s.uid == 0;
    let ws_args = setup::workspace_mount(a, &s)?;
    let home_args = match &s.home {
        Some(h) => Some(setup::home_mount(&s, h)?),
        None => None,
    };
    dev_fuse()?;
    ns::enter_private_ns(!root, s.uid, s.gid).map_err(|e| userns_error(root, &e))?;
    // COMMAND runs as the same uid: it must not read this process's memory (or, through
    // /proc, its descriptors and its cwd, the real workspace). After the maps: a process
    // that is not dumpable cannot write its own.
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("dumpable: {e}"))?;
    let ws_before = prove::Before::take(&s.ws)?;
    let home_before = match &s.home {
        Some(h) => Some(prove::Before::take(h)?),
        None => None,
    };
    let mut daemons = Vec::new();
    let mut covered = Vec::new();
    let r = (|| {
        daemons.push(daemon::start(ws_args)?);
        // From here on, a mount namespace of fencefs run's own (a copy; COMMAND's): the
        // workspace's daemon stays in the one before, where nothing else is mounted — it
        // reaches its staging area by path, which the $HOME fence (hiding
        // ~/.local/state/fencefs) and the covers below would otherwise take away.
        ns::enter_mount_ns().map_err(|e| format!("cannot make a mount namespace: {e}"))?;
        if let (Some(home), Some(args)) = (&s.home, home_args) {
            fence_home(&s.ws, home, args, &mut daemons)?;
        }
        ws_before.check(&s.policy, s.uid, s.gid, None)?;
        if let Some(b) = &home_before {
            b.check(
                std::slice::from_ref(&s.home_policy),
                s.uid,
                s.gid,
                Some(&s.ws),
            )?;
        }
        covered = hide_own_dirs(&s)?;
        Ok::<(), String>(())
    })();
    if let Err(e) = r {
        stop_all(daemons);
        return Err(e);
    }
    let line = up_line(&s);
    Ok(Fence {
        s,
        daemons,
        line,
        covered,
    })
}

/// Stops the daemons, the last started first: the $HOME fence's daemon holds handles
/// into the workspace's fence (the bind's lookups went through it), which would keep the
/// workspace's session alive.
fn stop_all(daemons: Vec<daemon::Daemon>) {
    for d in daemons.into_iter().rev() {
        d.stop();
    }
}

/// Mounts the $HOME fence; a workspace inside $HOME is bound back on top of it (the
/// workspace's own fence, opened before $HOME's covered it).
fn fence_home(
    ws: &Path,
    home: &Path,
    args: crate::cli::MountArgs,
    daemons: &mut Vec<daemon::Daemon>,
) -> Result<(), String> {
    let inside = ws.starts_with(home);
    let ws_fence = if inside {
        Some(crate::host::sys::open_root(ws).map_err(|e| format!("'{}': {e}", ws.display()))?)
    } else {
        None
    };
    daemons.push(daemon::start(args)?);
    if let Some(fd) = ws_fence {
        let src = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        ns::bind(&src, ws).map_err(|e| {
            format!(
                "binding the workspace's fence over the $HOME fence at '{}': {e}",
                ws.display()
            )
        })?;
        // The first mount of the workspace's fence, now under $HOME's, goes: the one on
        // top is the fence's only mount, so detaching it at the end ends the session.
        ns::detach(&src).map_err(|e| format!("'{}': {e}", ws.display()))?;
    }
    Ok(())
}

/// Hides the run's own files from COMMAND, in `fencefs run`'s own mount namespace
/// (COMMAND's): the runtime directory of every run of this user (policies, control
/// sockets; this run's checkpoint channel excepted) and the staging area are covered with
/// an empty tmpfs, a `--control` socket elsewhere with /dev/null.
/// What the $HOME fence already hides (ENOENT) needs nothing.
fn hide_own_dirs(s: &setup::Setup) -> Result<Vec<PathBuf>, String> {
    // Every run's directory of this user, not only this one's: another run's control
    // socket would let COMMAND approve or apply that run's requests. This run's checkpoint
    // channel stays reachable (`ns::cover_keeping`).
    let base = s.runtime.parent().unwrap_or(&s.runtime);
    let keep = s.checkpoint.as_deref().and_then(Path::parent);
    let dirs: Vec<&Path> = s.stage_cover.as_deref().into_iter().collect();
    let mut covered = Vec::new();
    let mut hide = |p: &Path, r: std::io::Result<()>| match r {
        Ok(()) => {
            covered.push(p.to_path_buf());
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(format!("hiding '{}' from COMMAND: {e}", p.display())),
    };
    hide(base, ns::cover_keeping(base, keep))?;
    for d in dirs {
        hide(d, ns::cover(d))?;
    }
    if !s.control.starts_with(base) {
        hide(&s.control, ns::bind(Path::new("/dev/null"), &s.control))?;
    }
    Ok(covered)
}

/// /dev/fuse must open read-write for the caller.
fn dev_fuse() -> Result<(), String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err("/dev/fuse is missing: load the fuse module (modprobe fuse)".into())
        }
        Err(e) => Err(format!(
            "/dev/fuse: {e}: it must be usable by your user (mode 0666, as the fuse3 package sets it: chmod 0666 /dev/fuse)"
        )),
    }
}

/// One line on why the private namespace could not be made, and how to allow it.
fn userns_error(root: bool, e: &std::io::Error) -> String {
    if root {
        return format!("cannot make a private mount namespace: {e}");
    }
    let hint = match e.raw_os_error() {
        Some(libc::ENOSPC) => {
            "user namespaces are off or used up: sysctl -w user.max_user_namespaces=15000"
        }
        Some(libc::EPERM | libc::EACCES) if restricted_by_apparmor() => {
            "Ubuntu restricts unprivileged user namespaces: install fencefs's AppArmor profile (the package does) or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
        }
        Some(libc::EPERM | libc::EACCES) => {
            "unprivileged user namespaces are not allowed here: sysctl -w kernel.unprivileged_userns_clone=1 (Debian) or user.max_user_namespaces=15000; in a container, allow unshare in its seccomp profile"
        }
        Some(libc::EINVAL) => "the kernel has no user namespaces (CONFIG_USER_NS)",
        _ => "user namespaces are needed to run without root",
    };
    format!("cannot make a private user namespace: {e}: {hint}")
}

fn restricted_by_apparmor() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
        .is_ok_and(|v| v.trim() == "1")
}

/// The one line said when the fence is up.
fn up_line(s: &setup::Setup) -> String {
    let how = match &s.stage {
        Some(d) if s.stage_continued => {
            format!(
                "staged in {}, continuing an earlier run's changes",
                d.display()
            )
        }
        Some(d) => format!("staged in {}", d.display()),
        None => "live".into(),
    };
    let home = match &s.home {
        Some(h) => format!("; {} fenced (preset home)", h.display()),
        None => String::new(),
    };
    format!(
        "fencefs: fenced {} ({}; {how}){home}; control socket {}",
        s.ws.display(),
        s.policy_words,
        s.control.display()
    )
}
