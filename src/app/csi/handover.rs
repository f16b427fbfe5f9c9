//! The hand-over of one volume's FUSE descriptor to the pod's sidecar, on a thread of its
//! own: the kubelet publishes a pod's volumes before it starts any of its containers, so
//! NodePublishVolume cannot wait for the sidecar; it mounts, starts this, and answers.
//!
//! The thread tries the sidecar's socket until the volume's timeout: the socket must be a
//! socket in the emptyDir (not a symlink: it is checked through a descriptor of the
//! directory and reached as `/proc/self/fd/N/NAME`), the process at the other end must
//! run as the volume's uid, then the descriptor goes over (SCM_RIGHTS) and the sidecar
//! answers `ok`. Either way the driver's copy of the descriptor is closed at the end: once
//! the sidecar has it, the sidecar alone keeps the connection alive; when no sidecar took
//! it, the kernel aborts the connection and the mount answers ENOTCONN (it fails closed:
//! the pod never writes into a plain directory on the node). The outcome is kept in
//! [`Outcome`] for the next NodePublishVolume of the target (`requiresRepublish`).
//!
//! Invariants: the descriptor is dropped on every path out of [`run`]; a cancelled
//! hand-over (NodeUnpublishVolume) stops within one poll interval.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::attrs::Attrs;
use crate::host::sys::fusefd;

/// Where a volume's hand-over stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Waiting,
    Served,
    Failed(String),
}

/// A running or finished hand-over.
pub struct Handover {
    pub outcome: Arc<Mutex<Outcome>>,
    pub cancel: Arc<AtomicBool>,
}

const POLL: Duration = Duration::from_millis(100);

/// Starts the hand-over of `dev` (mounted at `target`) to the sidecar listening at
/// `dir/attrs.socket`.
pub fn start(dev: OwnedFd, dir: PathBuf, target: PathBuf, attrs: &Attrs) -> Handover {
    let outcome = Arc::new(Mutex::new(Outcome::Waiting));
    let cancel = Arc::new(AtomicBool::new(false));
    let (o, c, a) = (outcome.clone(), cancel.clone(), attrs.clone());
    let spawned = std::thread::Builder::new()
        .name("fencefs-csi-handover".into())
        .spawn(move || {
            let r = run(dev, &dir, &target, &a, &c);
            match &r {
                Ok(()) => log::info!("{}: the sidecar serves it", target.display()),
                Err(e) => log::error!("{}: {e}", target.display()),
            }
            *o.lock() = match r {
                Ok(()) => Outcome::Served,
                Err(e) => Outcome::Failed(e),
            };
        });
    if let Err(e) = spawned {
        *outcome.lock() = Outcome::Failed(format!("cannot start the hand-over: {e}"));
    }
    Handover { outcome, cancel }
}

fn run(
    dev: OwnedFd,
    dir: &Path,
    target: &Path,
    a: &Attrs,
    cancel: &AtomicBool,
) -> Result<(), String> {
    let deadline = Instant::now() + a.timeout;
    loop {
        if cancel.load(Ordering::SeqCst) {
            return Err("unpublished before the sidecar took the descriptor".into());
        }
        let last = match connect(dir, &a.socket, a.uid) {
            Ok(conn) => return give(conn, dev, target),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "no sidecar took the FUSE descriptor within {} s ({}: {last}); is the `fencefs mount --fuse-fd-from {}` sidecar running? its log says why not; the volume answers ENOTCONN until the pod is recreated",
                a.timeout.as_secs(),
                dir.join(&a.socket).display(),
                a.socket
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Connects to `dir/name` when it is a socket (not a symlink) and its listener runs as
/// `uid`.
fn connect(dir: &Path, name: &str, uid: u32) -> Result<UnixStream, String> {
    let d = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| format!("emptyDir: {e}"))?;
    let via = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&d)
    ))
    .join(name);
    let md = std::fs::symlink_metadata(&via).map_err(|e| e.to_string())?;
    if !md.file_type().is_socket() {
        return Err("not a socket".into());
    }
    let conn = UnixStream::connect(&via).map_err(|e| e.to_string())?;
    let peer = fusefd::peer_uid(conn.as_fd()).map_err(|e| e.to_string())?;
    if peer != uid {
        return Err(format!(
            "the socket's listener runs as uid {peer}, not the volume's uid {uid}"
        ));
    }
    Ok(conn)
}

/// Sends the descriptor and waits (10 s at most) for the sidecar's answer.
fn give(conn: UnixStream, dev: OwnedFd, target: &Path) -> Result<(), String> {
    let hello = format!("{} {}", fusefd::HELLO, target.display());
    fusefd::send(conn.as_fd(), dev.as_fd(), hello.as_bytes())
        .map_err(|e| format!("sending the descriptor to the sidecar: {e}"))?;
    drop(dev);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = String::new();
    let mut w = &conn;
    let _ = w.flush();
    BufReader::new(&conn)
        .read_line(&mut line)
        .map_err(|e| format!("the sidecar did not answer the hand-over: {e}"))?;
    match line.trim_end() {
        "ok" => Ok(()),
        other => Err(format!("the sidecar refused the descriptor: {other}")),
    }
}
