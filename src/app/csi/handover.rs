//! The FUSE descriptors' way to the pods' sidecars, and their resumption when a sidecar
//! restarts: one thread of the driver ([`Supervisor`]) looks after every published
//! volume, every [`POLL`]. The kubelet publishes a pod's volumes before it starts any of
//! its containers, so NodePublishVolume cannot wait for the sidecar: it mounts, registers
//! the volume here, and answers.
//!
//! A volume ([`Slot`]) is in one of four states:
//! - **pending**: a mount at the target and its descriptor in hand; the sidecar's socket
//!   is tried until the volume's timeout. The socket must be a socket in the emptyDir (not
//!   a symlink: it is checked through a descriptor of the directory and reached as
//!   `/proc/self/fd/N/NAME`) whose listener runs as the volume's uid; the descriptor goes
//!   over (SCM_RIGHTS) and the sidecar answers `ok`. The driver then closes its copy.
//! - **serving**: the sidecar keeps the hand-over connection open while it lives; its
//!   hang-up (exit, crash, SIGKILL, OOM) makes the volume dead. Another sidecar listening
//!   on the socket meanwhile is sent [`fusefd::REFUSED`] and gives up: never two daemons
//!   for one volume.
//! - **dead**: nobody serves the mount (its descriptor closed, the kernel aborted the
//!   connection: it answers ENOTCONN, it fails closed). When a sidecar listens on the
//!   socket again, a fresh `/dev/fuse` is mounted **on top of** the dead mount at the
//!   same target with the same options and handed to it. The dead mount stays beneath
//!   until the unpublish: the pod's containers got their view of the volume as a bind of
//!   it, and only a mount made on it reaches them (mount propagation, `HostToContainer`;
//!   see the book's Kubernetes chapter). At most [`MAX_RESUMES`] per volume.
//! - **gone**: unpublished; the slot is dropped at the next poll.
//!
//! A pending hand-over that times out makes the volume dead with the reason, kept for the
//! next NodePublishVolume of the target (`requiresRepublish`) to report.
//!
//! Invariants: one thread for all volumes, no thread per volume or connection; a slot's
//! state changes only under its lock, and NodeUnpublishVolume takes that lock to make it
//! gone, so nothing is mounted at a target once its unpublish began; a descriptor is
//! closed on every way out of the pending state; nothing here blocks longer than one
//! sidecar's answer ([`ANSWER`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::attrs::Attrs;
use crate::host::sys::fusefd;

/// How often the supervisor looks at the volumes.
const POLL: Duration = Duration::from_millis(100);
/// How long a sidecar has to answer a hand-over.
const ANSWER: Duration = Duration::from_secs(10);
/// How long after a refused hand-over the same descriptor is offered again.
const RETRY: Duration = Duration::from_secs(1);
/// Fresh mounts per volume after its first: each sidecar restart takes one, and each
/// leaves a dead mount beneath the live one until the unpublish.
pub const MAX_RESUMES: u32 = 100;

/// What a volume's NodePublishVolume is told again (`requiresRepublish`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Waiting for a sidecar, served, or dead while a restarted sidecar is awaited.
    Fine,
    /// Why no sidecar serves it (a timeout, a mount that failed, too many restarts).
    Failed(String),
}

enum State {
    Pending {
        dev: OwnedFd,
        deadline: Instant,
        retry_at: Instant,
    },
    Serving {
        conn: UnixStream,
    },
    Dead {
        why: String,
        failed: bool,
        retry_at: Instant,
    },
    Gone,
}

/// One published volume as the supervisor keeps it.
pub struct Slot {
    target: PathBuf,
    /// The directory of the sidecar's socket (its emptyDir on the node).
    dir: PathBuf,
    attrs: Attrs,
    fsname: String,
    readonly: bool,
    state: Mutex<State>,
    resumes: AtomicU32,
}

/// Opens `/dev/fuse` and mounts it at `target` as the volume's spec says, shared (see
/// [`fusefd::make_shared`]); the descriptor.
pub fn mount_fresh(
    target: &Path,
    fsname: &str,
    a: &Attrs,
    readonly: bool,
) -> Result<OwnedFd, String> {
    let dev = fusefd::open_dev().map_err(|e| format!("cannot open /dev/fuse: {e}"))?;
    let spec = fusefd::MountSpec {
        fsname,
        uid: a.uid,
        gid: a.gid,
        allow_other: a.allow_other,
        read_only: readonly,
    };
    fusefd::mount_dev(dev.as_fd(), target, &spec)
        .map_err(|e| format!("cannot mount FUSE at '{}': {e}", target.display()))?;
    if let Err(e) = fusefd::make_shared(target) {
        // Served all the same; only a restarted sidecar's mount would not reach the pod.
        log::warn!("{}: cannot make the mount shared: {e}", target.display());
    }
    Ok(dev)
}

impl Slot {
    /// A volume just mounted at `target` with `dev`, its sidecar's socket in `dir`.
    pub fn new(
        dev: OwnedFd,
        dir: PathBuf,
        target: PathBuf,
        attrs: &Attrs,
        fsname: String,
        readonly: bool,
    ) -> Slot {
        let now = Instant::now();
        Slot {
            target,
            dir,
            attrs: attrs.clone(),
            fsname,
            readonly,
            state: Mutex::new(State::Pending {
                dev,
                deadline: now + attrs.timeout,
                retry_at: now,
            }),
            resumes: AtomicU32::new(0),
        }
    }

    /// What a repeated NodePublishVolume answers.
    pub fn outcome(&self) -> Outcome {
        match &*self.state.lock() {
            State::Dead {
                why, failed: true, ..
            } => Outcome::Failed(why.clone()),
            _ => Outcome::Fine,
        }
    }

    /// NodeUnpublishVolume: nothing more is mounted or handed over for this volume (waits
    /// for a hand-over under way, [`ANSWER`] at most). Drops the descriptor or connection.
    pub fn close(&self) {
        *self.state.lock() = State::Gone;
    }

    fn gone(&self) -> bool {
        matches!(*self.state.lock(), State::Gone)
    }

    /// One look at the volume: the step its state calls for, if any.
    fn tick(&self) {
        let mut st = self.state.lock();
        let now = Instant::now();
        let next = match &mut *st {
            State::Gone => None,
            State::Pending {
                dev,
                deadline,
                retry_at,
            } => {
                if now < *retry_at {
                    return;
                }
                self.offer(dev, *deadline, retry_at, now)
            }
            State::Serving { conn } => self.watch(conn),
            State::Dead { retry_at, .. } => {
                if now < *retry_at {
                    return;
                }
                self.resume(now)
            }
        };
        if let Some(n) = next {
            *st = n;
        }
    }

    /// Pending: tries the socket, hands `dev` to a sidecar that listens there.
    fn offer(
        &self,
        dev: &OwnedFd,
        deadline: Instant,
        retry_at: &mut Instant,
        now: Instant,
    ) -> Option<State> {
        match connect(&self.dir, &self.attrs.socket, self.attrs.uid) {
            Ok(conn) => match give(&conn, dev, &self.target) {
                Ok(()) => {
                    log::info!("{}: the sidecar serves it", self.target.display());
                    Some(State::Serving { conn })
                }
                Err(e) => {
                    log::warn!("{}: {e}", self.target.display());
                    *retry_at = now + RETRY;
                    None
                }
            },
            Err(last) if now >= deadline => {
                let why = format!(
                    "no sidecar took the FUSE descriptor within {} s ({}: {last}); is the `fencefs mount --fuse-fd-from {}` sidecar running? its log says why not; the volume answers ENOTCONN until a sidecar listens there",
                    self.attrs.timeout.as_secs(),
                    self.dir.join(&self.attrs.socket).display(),
                    self.attrs.socket
                );
                log::error!("{}: {why}", self.target.display());
                Some(State::Dead {
                    why,
                    failed: true,
                    retry_at: now,
                })
            }
            Err(_) => None,
        }
    }

    /// Serving: a hang-up makes the volume dead; another sidecar listening is refused.
    fn watch(&self, conn: &mut UnixStream) -> Option<State> {
        if hung_up(conn) {
            log::warn!(
                "{}: the sidecar that served it is gone (the mount answers ENOTCONN); a restarted sidecar gets a fresh mount",
                self.target.display()
            );
            return Some(State::Dead {
                why: "the sidecar exited; waiting for it to restart".into(),
                failed: false,
                retry_at: Instant::now(),
            });
        }
        if let Ok(other) = connect(&self.dir, &self.attrs.socket, self.attrs.uid) {
            log::warn!(
                "{}: refused a second sidecar: the one that serves the volume is alive",
                self.target.display()
            );
            let why = format!(
                "another sidecar serves {} and is alive",
                self.target.display()
            );
            refuse(other, &why);
        }
        None
    }

    /// Dead: when a sidecar listens again, a fresh mount on top, handed to it.
    fn resume(&self, now: Instant) -> Option<State> {
        // A stale socket file or none: the usual case, quietly.
        let conn = connect(&self.dir, &self.attrs.socket, self.attrs.uid).ok()?;
        let n = self.resumes.load(Ordering::Relaxed);
        if n >= MAX_RESUMES {
            let why = format!(
                "the sidecar restarted {MAX_RESUMES} times: no more fresh mounts for this volume; recreate the pod"
            );
            refuse(conn, &why);
            return Some(State::Dead {
                why,
                failed: true,
                retry_at: now + Duration::from_secs(60),
            });
        }
        let dev = match mount_fresh(&self.target, &self.fsname, &self.attrs, self.readonly) {
            Ok(dev) => dev,
            Err(e) => {
                log::error!("{}: {e}", self.target.display());
                refuse(conn, &e);
                return Some(State::Dead {
                    why: e,
                    failed: true,
                    retry_at: now + Duration::from_secs(5),
                });
            }
        };
        self.resumes.store(n + 1, Ordering::Relaxed);
        log::info!(
            "{}: a sidecar listens again: mounted afresh on top of the dead mount (resume {} of at most {MAX_RESUMES})",
            self.target.display(),
            n + 1
        );
        match give(&conn, &dev, &self.target) {
            Ok(()) => {
                log::info!("{}: the restarted sidecar serves it", self.target.display());
                Some(State::Serving { conn })
            }
            Err(e) => {
                log::warn!("{}: {e}", self.target.display());
                Some(State::Pending {
                    dev,
                    deadline: now + self.attrs.timeout,
                    retry_at: now + RETRY,
                })
            }
        }
    }
}

/// Tells a sidecar it gets no descriptor, and why (it gives up).
fn refuse(mut conn: UnixStream, why: &str) {
    let msg = format!("{} {why}\n", fusefd::REFUSED);
    let _ = conn.set_write_timeout(Some(ANSWER));
    let _ = conn.write_all(msg.as_bytes());
}

/// The supervisor thread and its volumes.
pub struct Supervisor {
    slots: Arc<Mutex<Vec<Arc<Slot>>>>,
}

impl Supervisor {
    /// Starts the thread (it runs as long as the driver).
    pub fn start() -> std::io::Result<Supervisor> {
        let slots: Arc<Mutex<Vec<Arc<Slot>>>> = Arc::default();
        let s = slots.clone();
        std::thread::Builder::new()
            .name("fencefs-csi-handover".into())
            .spawn(move || {
                loop {
                    let now: Vec<Arc<Slot>> = s.lock().clone();
                    for slot in &now {
                        slot.tick();
                    }
                    s.lock().retain(|slot| !slot.gone());
                    std::thread::sleep(POLL);
                }
            })?;
        Ok(Supervisor { slots })
    }

    /// Looks after `slot` from the next poll on.
    pub fn add(&self, slot: Arc<Slot>) {
        self.slots.lock().push(slot);
    }
}

/// Whether the peer closed `conn` (a sidecar keeps it open while it serves).
fn hung_up(conn: &mut UnixStream) -> bool {
    if conn.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 64];
    loop {
        match conn.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
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

/// Sends the descriptor and waits ([`ANSWER`] at most) for the sidecar's answer.
fn give(conn: &UnixStream, dev: &OwnedFd, target: &Path) -> Result<(), String> {
    let hello = format!("{} {}", fusefd::HELLO, target.display());
    fusefd::send(conn.as_fd(), dev.as_fd(), hello.as_bytes())
        .map_err(|e| format!("sending the descriptor to the sidecar: {e}"))?;
    let _ = conn.set_read_timeout(Some(ANSWER));
    let mut line = String::new();
    // Byte by byte: nothing after the answer line is taken from the connection.
    let mut r = BufReader::with_capacity(1, conn);
    r.read_line(&mut line)
        .map_err(|e| format!("the sidecar did not answer the hand-over: {e}"))?;
    match line.trim_end() {
        "ok" => Ok(()),
        other => Err(format!("the sidecar refused the descriptor: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hang_up_is_seen_and_an_open_connection_is_not() {
        let (mut a, mut b) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        assert!(!hung_up(&mut a));
        // Bytes the peer sends are read and ignored: it is still there.
        b.write_all(b"noise").unwrap_or_else(|e| panic!("{e}"));
        assert!(!hung_up(&mut a));
        drop(b);
        assert!(hung_up(&mut a));
    }

    #[test]
    fn a_refusal_is_one_line_naming_why() {
        let (a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        refuse(a, "another sidecar serves /t and is alive");
        let mut line = String::new();
        BufReader::new(b)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            line,
            "fencefs-fuse-fd/1 refused: another sidecar serves /t and is alive\n"
        );
    }
}
