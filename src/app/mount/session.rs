//! Step 3 of a mount, **mount the session**: bind the control socket, plan the transport,
//! set the session's options (`nosuid,nodev`, fsname = SOURCE, `subtype=fencefs`, who may
//! use the mount, worker threads), `Session::new`, and hand the connection's device to the
//! core (kernel passthrough, the io_uring queues).
//!
//! Takes: [`MountArgs`] and the [`State`] (from `state`). Gives: [`Mounted`]: the session,
//! the core, the transport plan, the device and the bound control socket.
//!
//! Invariants: the control socket is bound before mounting (once the mount is there, so is
//! the socket; a failed mount removes it again) — with `--fuse-fd-from`, whose mount is
//! the mounter's, once the descriptor arrived (a daemon the mounter refuses, because
//! another one serves the volume, never replaces that one's control socket); the transport
//! plan is made before `Session::new` (it decides what INIT offers). No thread is started
//! here.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use fuser::{Config, MountOption, Session, SessionACL};

use super::super::threads;
use super::state::State;
use crate::cli::MountArgs;
use crate::fs::Core;
use crate::transport::Plan;
use crate::transport::devfuse::FenceFs;

/// The mounted session, before the daemon's threads run.
pub(super) struct Mounted {
    pub(super) session: Session<FenceFs>,
    pub(super) core: Arc<Core>,
    pub(super) plan: Plan,
    /// The connection's device, for kernel passthrough and the io_uring queues.
    pub(super) dev: io::Result<OwnedFd>,
    /// The bound control socket, until its server starts.
    pub(super) control: Option<threads::Control>,
}

/// Takes a handed-over descriptor (`--fuse-fd-from`), binds the control socket, plans the
/// transport, then mounts (in that order: the socket exists once the mount does; the plan
/// decides what INIT offers).
pub(super) fn mount_session(a: &MountArgs, state: &State) -> Result<Mounted, String> {
    let config = session_config(a, &state.src, state.threads);
    let handed = match &a.fuse_fd_from {
        Some(sock) => Some(super::fd_from::receive(sock)?),
        None => None,
    };
    let control = threads::bind_control(a)?;
    let plan = crate::transport::plan(a.transport)?;
    let fs = FenceFs::new(state.shared.clone());
    let core = fs.core();
    if matches!(plan, Plan::Offer { .. }) {
        core.offer_uring.store(true, Ordering::Relaxed);
    }
    let session = if let Some(dev) = handed {
        let acl = config.acl;
        Session::from_fd(fs, dev, acl, config)
    } else if a.direct {
        direct_session(fs, &state.src, &state.mnt, a.allow_other, config)
    } else {
        Session::new(fs, &state.mnt, &config)
    };
    let session = session.map_err(|e| {
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

/// `fencefs run`'s mount: open /dev/fuse, mount(2) it at `mnt` ourselves (inside the
/// run's namespaces, where the setuid fusermount3 cannot help), then let fuser wrap the
/// descriptor (its handshake reads the kernel's INIT, which the mount sends). Nothing here
/// unmounts: the mount lives in the run's private namespace and the signal thread detaches
/// it (`app/threads.rs`).
fn direct_session(
    fs: FenceFs,
    src: &Path,
    mnt: &Path,
    allow_other: bool,
    config: Config,
) -> io::Result<Session<FenceFs>> {
    let dev: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?
        .into();
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    crate::host::sys::ns::mount_fuse(
        dev.as_fd(),
        mnt,
        &fsname(src),
        uid.as_raw(),
        gid.as_raw(),
        allow_other,
    )?;
    let acl = config.acl;
    Session::from_fd(fs, dev, acl, config)
}

/// FUSE session settings: mount options, who may use the mount, worker threads.
/// `src` is the canonical SOURCE: the mount table names it as the mount's source.
fn session_config(a: &MountArgs, src: &Path, threads: usize) -> Config {
    let mut opts = vec![
        MountOption::FSName(fsname(src)),
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
    // A clone is a fresh open of /dev/fuse: a `--fuse-fd-from` daemon (a pod without
    // the device, or a uid it is not open to) shares the one descriptor it was handed.
    config.clone_fd = a.fuse_fd_from.is_none();
    config
}

/// The mount's source in the mount table (findmnt, df, /proc/self/mountinfo): SOURCE, as
/// bindfs and sshfs show theirs. A path that is not UTF-8, or holds a comma, a backslash
/// or a control character (which fusermount3's option list and mount(2) would read
/// differently), shows as `fencefs`.
fn fsname(src: &Path) -> String {
    match src.to_str() {
        Some(s) if !s.chars().any(|c| c == ',' || c == '\\' || c.is_control()) => s.to_string(),
        _ => "fencefs".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    #[test]
    fn fsname_is_source_unless_it_would_be_misread() {
        assert_eq!(fsname(Path::new("/srv/work")), "/srv/work");
        assert_eq!(fsname(Path::new("/srv/my work")), "/srv/my work");
        for odd in ["/srv/a,b", "/srv/a\\b", "/srv/a\nb"] {
            assert_eq!(fsname(Path::new(odd)), "fencefs", "{odd:?}");
        }
        let not_utf8 = std::ffi::OsStr::from_bytes(b"/srv/\xff");
        assert_eq!(fsname(Path::new(not_utf8)), "fencefs");
    }
}
