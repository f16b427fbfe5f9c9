//! Step 5 of a mount, **serve**: confine the FUSE workers
//! (Landlock to SOURCE, the other roots and /dev/fuse; `no_new_privs`), start the io_uring
//! queues, signal readiness (`--ready-fd`, systemd's `READY=1`), start the resume thread,
//! let go of stdio when daemonized, then run the session until it ends.
//!
//! Takes: [`MountArgs`], the [`State`], the [`Mounted`] session, the resume queue and the
//! [`ExitThread`] (from `threads`). Gives: [`Served`], for `teardown`: how the session
//! ended and the exit thread.
//!
//! Invariants: Landlock comes after every descriptor that must be opened outside SOURCE
//! (the control socket, audit file, `--learn` file and fanotify, all earlier) and after
//! every thread that must stay unconfined (`threads`); it comes before the io_uring queues
//! and the resume thread (they inherit it) and before readiness (nobody is told "ready"
//! before it applies). When the transport cannot start, the connection is ended (callers
//! get ENOTCONN, not a hang) and the mount fails.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::threads;
use super::session::Mounted;
use super::state::State;
use super::threads::ExitThread;
use crate::cli::MountArgs;
use crate::fs::ops::Shared;
use crate::host::sys;

/// How the session ended, and what tearing down needs.
pub(super) struct Served {
    /// `Session::run`'s result.
    pub(super) run: io::Result<()>,
    pub(super) exit: ExitThread,
}

/// Confines the workers, starts the transport, says "ready",
/// starts the resume thread and serves until the session ends; what is left to do goes to
/// the tear-down step.
pub(super) fn serve(
    a: &MountArgs,
    state: &State,
    m: Mounted,
    resume: Option<threads::ResumeQueue>,
    exit: ExitThread,
) -> Result<Served, String> {
    let Mounted {
        mut session,
        core,
        plan,
        dev,
        ..
    } = m;
    // Bound after the session: on an early return the exit thread wakes first, as it did.
    let exit = exit;
    confine_workers(a, &state.shared, &state.src);
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
    let run = session.run();
    Ok(Served { run, exit })
}

/// `--no-confine`, or [`confine`] (a mount and `vhost-user` both confine this way).
pub(in crate::app) fn confine_workers(a: &MountArgs, shared: &Shared, src: &Path) {
    if a.no_confine {
        log::info!("self-confinement: off (--no-confine)");
    } else {
        confine(shared, src);
    }
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
            let sizes = transport::sizes(crate::transport::MAX_WRITE);
            match transport::start(&dev, core, acl, sizes, queues)? {
                Started::Uring => {
                    core.rings.store(true, Ordering::Relaxed);
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

/// Confines the FUSE workers (the calling thread's descendants) and logs what was applied.
fn confine(shared: &Shared, src: &Path) {
    let roots: Vec<_> = shared.inodes.roots().iter().map(|r| r.fd.clone()).collect();
    let extra: Vec<_> = roots.iter().map(|fd| fd.as_fd()).collect();
    let root = shared.inodes.root_fd();
    let union = shared.inodes.union();
    let dir = shared.bases.as_ref().and_then(|b| b.dir_fd());
    let stage = match (&union, dir) {
        (Some(u), Some(dir)) => crate::harden::Stage::Daemon {
            source: u.source_root().as_fd(),
            dir,
        },
        _ => crate::harden::Stage::No,
    };
    // Held from before the first request (no descriptor appears in the middle of serving).
    crate::host::sys::prepare_xattr();
    let c = crate::harden::confine(root.as_fd(), &extra, stage);
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
    if c.landlock_abi.is_some() {
        // A reload may serve only repositories this domain covers (app/roots.rs).
        let dirs = shared.inodes.roots();
        let dirs = dirs.iter().filter(|r| r.kind == libc::S_IFDIR);
        super::super::roots::confined(dirs.map(|r| r.key).collect());
    }
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

/// Tells whoever waits that the mount serves requests: `--ready-fd` and systemd's
/// `$NOTIFY_SOCKET` (READY=1). Failures are logged, never fatal.
pub(in crate::app) fn signal_ready(fd: Option<i32>, mnt: &Path) {
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
