//! `mount --fuse-fd-from SOCKET`: the mount is made by someone else (`fencefs csi`, root on
//! the node) and this daemon, unprivileged, only serves it. Replaces step 1's mount point
//! checks ([`startup_checks`]) and step 3's `Session::new` ([`receive`]).
//!
//! The hand-over: bind SOCKET (mode 0600, a stale socket file replaced), accept, take one
//! message carrying one descriptor (SCM_RIGHTS), check it is `/dev/fuse`, stop listening
//! and remove SOCKET, answer `ok` (or `error: WHY`). A connection that sends something
//! else is answered and dropped; the daemon keeps waiting. The mounter's refusal
//! (`fusefd::REFUSED`: another daemon serves the volume), from a root process, ends the
//! daemon.
//!
//! The connection the descriptor came on stays open for the daemon's life
//! ([`HANDOVER`]): `fencefs csi` reads its hang-up as this daemon's exit, and mounts
//! afresh for the next one (a restarted sidecar resumes the volume). Nothing is read or
//! written on it after `ok`.
//!
//! Invariants: SOCKET is bound only after the policy loaded (step 2 ran: a bad policy
//! fails before any mounter is told "ok", so the mount it made is never half-served); the
//! descriptor is taken as the session's own, and the mount's life is the mounter's (it
//! unmounts; SIGTERM here closes the connection by exiting, `app/threads.rs`).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::cli::{MountArgs, NO_MOUNTPOINT};
use crate::host::sys::fusefd::{self, HELLO};

/// Step 1 for `--fuse-fd-from`: SOURCE checked; the "mount point" the logs and checks
/// name is SOCKET itself (there is none here). Also refuses MOUNTPOINT with the option,
/// and no MOUNTPOINT without it.
pub(super) fn startup_checks(a: &MountArgs) -> Result<Option<(PathBuf, PathBuf)>, String> {
    let none = a.mountpoint.as_os_str() == NO_MOUNTPOINT;
    let sock = match (&a.fuse_fd_from, none) {
        (None, false) => return Ok(None),
        (None, true) => {
            return Err(
                "MOUNTPOINT is missing (or serve a handed-over mount: --fuse-fd-from SOCKET)"
                    .into(),
            );
        }
        (Some(_), false) => {
            return Err(format!(
                "--fuse-fd-from takes no MOUNTPOINT ('{}'): the mount is made by whoever sends the descriptor",
                a.mountpoint.display()
            ));
        }
        (Some(s), true) => s,
    };
    super::check::source_dir(a)?;
    super::check::cache_ttl(a)?;
    let src = a
        .source
        .canonicalize()
        .map_err(|e| format!("source '{}': {e}", a.source.display()))?;
    let sock = std::path::absolute(sock).map_err(|e| format!("--fuse-fd-from: {e}"))?;
    Ok(Some((src, sock)))
}

/// The connection the descriptor came on, kept open until the process exits.
static HANDOVER: OnceLock<UnixStream> = OnceLock::new();

/// Binds SOCKET and waits for the descriptor (see the module docs).
pub(super) fn receive(sock: &Path) -> Result<OwnedFd, String> {
    let what = |e: std::io::Error| format!("--fuse-fd-from '{}': {e}", sock.display());
    if let Ok(md) = std::fs::symlink_metadata(sock)
        && md.file_type().is_socket()
    {
        std::fs::remove_file(sock).map_err(what)?;
    }
    let listener = crate::control::sockpath::with(sock, |p| UnixListener::bind(p)).map_err(what)?;
    std::fs::set_permissions(sock, std::fs::Permissions::from_mode(0o600)).map_err(what)?;
    log::info!(
        "waiting for the FUSE descriptor on {} (fencefs csi sends it)",
        sock.display()
    );
    let (dev, mut conn) = loop {
        let (mut conn, _) = listener.accept().map_err(what)?;
        match take(&conn) {
            Ok(Taken::Dev(dev, target)) => {
                log::info!("FUSE descriptor received for {target}");
                break (dev, conn);
            }
            Ok(Taken::Refused(why)) => {
                let _ = std::fs::remove_file(sock);
                return Err(format!(
                    "--fuse-fd-from '{}': the mounter refused this daemon: {why}",
                    sock.display()
                ));
            }
            Err(e) => {
                log::warn!("--fuse-fd-from: refused a hand-over: {e}");
                let _ = conn.write_all(format!("error: {e}\n").as_bytes());
            }
        }
    };
    // Gone before `ok`: whoever finds a listener at SOCKET later is another daemon.
    drop(listener);
    let _ = std::fs::remove_file(sock);
    let _ = conn.write_all(b"ok\n");
    let _ = HANDOVER.set(conn);
    super::super::FD_MOUNT.store(true, std::sync::atomic::Ordering::SeqCst);
    Ok(dev)
}

/// What a hand-over message brought.
enum Taken {
    /// The descriptor and the target path it names.
    Dev(OwnedFd, String),
    /// The mounter's refusal, and why.
    Refused(String),
}

/// One hand-over message.
fn take(conn: &UnixStream) -> Result<Taken, String> {
    let (msg, fd) = fusefd::recv(conn.as_fd()).map_err(|e| e.to_string())?;
    if fd.is_none()
        && let Some(why) = String::from_utf8_lossy(&msg).strip_prefix(fusefd::REFUSED)
    {
        // Only the mounter (root: it mounts) may end this daemon; from anyone else it is
        // a bad message like any other.
        return match fusefd::peer_uid(conn.as_fd()) {
            Ok(0) => Ok(Taken::Refused(why.trim().to_string())),
            _ => Err("a refusal from a process that is not root".into()),
        };
    }
    let fd = fd.ok_or("the message carried no descriptor")?;
    if !fusefd::is_fuse_dev(fd.as_fd()).map_err(|e| e.to_string())? {
        return Err("the descriptor is not /dev/fuse".into());
    }
    let msg = String::from_utf8_lossy(&msg);
    let target = msg
        .trim_end()
        .strip_prefix(HELLO)
        .map(|t| t.trim().to_string())
        .ok_or_else(|| format!("not a fencefs hand-over ({:?})", msg.trim_end()))?;
    Ok(Taken::Dev(fd, target))
}
