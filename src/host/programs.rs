//! Which program a calling process runs, as that process sees it, and its ancestors'
//! (for the policy's `exe` / `ancestor_exe` rules); also, on the same thread, whether a
//! caller holds host privilege (`privilege.rs`, for `trusted.*`/`security.*` changes).
//!
//! A process's program is the kernel's name for its executable (`/proc/PID/exe`) made
//! relative to the process's own root (`/proc/PID/root`): a process in a container names
//! its own `/usr/bin/git`. Both are magic links, *read* (readlinkat), never followed or
//! opened, so no path an attacker controls on the host is walked. Each id is pinned with
//! a pidfd first and checked alive after the links are read, so a pid reused meanwhile
//! is never taken for the process that asked.
//!
//! The daemon's request workers run in a Landlock domain, which forbids reading another
//! domain's processes' magic links (Landlock scopes ptrace access): a mount resolves
//! programs on one thread of its own started before the confinement
//! ([`Programs::with_thread`]), asked over a bounded queue; a worker waits at most
//! [`WAIT`] for the answer, and a full queue or a late answer is "no program".
//!
//! Invariants: bounded work per request — the caller plus at most [`MAX_ANCESTORS`]
//! ancestors, a handful of syscalls each; the caller is always read afresh (an `execve`
//! between two requests is seen at once); each parent is pinned and checked to still be
//! the child's parent after the pin, so a parent whose id was reused is never read for the
//! new process; ancestors are cached by the parent's identity for this boot (its pidfs
//! inode, never a reused pid's) on the resolver thread, bounded and for one second at most
//! (see `Ancestors`); any failure (the process has exited, an executable outside its root,
//! an old kernel, the queue full, an answer late) answers "unknown", and the policy then
//! gives the most restrictive answer any program could get (`Caller::program_unknown`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::sys;

/// How far up the parent chain `ancestor_exe` looks.
pub const MAX_ANCESTORS: usize = 64;

/// A calling process's program and its ancestors' (parent first).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The caller's program (empty: unknown).
    pub exe: Vec<u8>,
    /// The ancestors' programs, parent first (unknown ones left out).
    pub ancestors: Vec<Vec<u8>>,
}

/// How long a request waits for its program to be resolved.
pub const WAIT: Duration = Duration::from_secs(2);

/// Requests queued for the resolver thread at most.
const QUEUE: usize = 256;

/// One question to the resolver thread.
enum Question {
    /// A program chain: (pid, with ancestors, where to answer).
    Chain(u32, bool, SyncSender<Chain>),
    /// Whether `pid` holds host privilege ([`super::privilege::host_admin`]).
    Admin(u32, SyncSender<bool>),
}

/// Reads processes' programs through `/proc` (opened on first use): directly, or through
/// the resolver thread when one was started.
#[derive(Default)]
pub struct Programs {
    proc: OnceLock<Option<OwnedFd>>,
    thread: Option<Mutex<SyncSender<Question>>>,
}

/// `exe` as seen from `root` (both as the daemon reads them): `None` when the executable
/// lies outside the process's root.
pub fn as_seen(root: &[u8], exe: &[u8]) -> Option<Vec<u8>> {
    if root == b"/" {
        return Some(exe.to_vec());
    }
    let rest = exe.strip_prefix(root)?;
    rest.starts_with(b"/").then(|| rest.to_vec())
}

impl Programs {
    fn proc(&self) -> Option<BorrowedFd<'_>> {
        self.proc
            .get_or_init(|| match sys::open_proc() {
                Ok(fd) => Some(fd),
                Err(e) => {
                    log::warn!("programs: cannot open /proc ({e}): exe rules match nothing");
                    None
                }
            })
            .as_ref()
            .map(|f| f.as_fd())
    }

    /// The program of thread or process `pid`, pinned by `pidfd`, as it sees it, and its
    /// parent's pid.
    fn one(&self, pid: u32, pidfd: BorrowedFd<'_>) -> Option<(Vec<u8>, u32)> {
        let proc = self.proc()?;
        let exe = sys::proc_link(proc, pid, "exe").ok()?;
        let root = sys::proc_link(proc, pid, "root").ok()?;
        // Still alive after the reads: the links were this process's (its id cannot have
        // been reused while it lives).
        let (_, ppid) = sys::pidfd_pids(pidfd).ok()?;
        Some((as_seen(&root, &exe)?, ppid))
    }

    /// A resolver whose reads run on a thread started now (call it before the workers are
    /// confined). The thread ends when the `Programs` is dropped.
    pub fn with_thread() -> std::io::Result<Programs> {
        let (tx, rx) = sync_channel::<Question>(QUEUE);
        std::thread::Builder::new()
            .name("programs".into())
            .spawn(move || serve(rx))?;
        Ok(Programs {
            proc: OnceLock::new(),
            thread: Some(Mutex::new(tx)),
        })
    }

    /// The program of `pid` and, when `ancestors`, of up to [`MAX_ANCESTORS`] ancestors
    /// (on the resolver thread when there is one).
    pub fn chain(&self, pid: u32, ancestors: bool) -> Chain {
        let Some(tx) = &self.thread else {
            return self.resolve(pid, ancestors, None);
        };
        let (atx, arx) = sync_channel(1);
        let sent = tx
            .lock()
            .map(|t| t.try_send(Question::Chain(pid, ancestors, atx)));
        match sent {
            Ok(Ok(())) => arx.recv_timeout(WAIT).unwrap_or_default(),
            Ok(Err(TrySendError::Full(_))) => {
                log::debug!("programs: resolver queue full; pid {pid} matches no program");
                Chain::default()
            }
            _ => Chain::default(),
        }
    }

    /// Whether thread `pid` holds host privilege ([`super::privilege::host_admin`]), read
    /// on the resolver thread when there is one (reading another process's user
    /// namespace is ptrace access, which the workers' Landlock domain forbids); a full
    /// queue or a late answer is "no".
    pub fn host_admin(&self, pid: u32) -> bool {
        let Some(tx) = &self.thread else {
            return super::privilege::host_admin(pid);
        };
        if pid == 0 {
            return false;
        }
        let (atx, arx) = sync_channel(1);
        match tx.lock().map(|t| t.try_send(Question::Admin(pid, atx))) {
            Ok(Ok(())) => arx.recv_timeout(WAIT).unwrap_or(false),
            _ => false,
        }
    }

    /// [`Programs::chain`], read on this thread; the parent's chain from `cache` when it
    /// has it.
    fn resolve(&self, pid: u32, ancestors: bool, cache: Option<&mut Ancestors>) -> Chain {
        let Ok(pidfd) = sys::pidfd_open(pid) else {
            return Chain::default();
        };
        let Some((exe, ppid)) = self.one(pid, pidfd.as_fd()) else {
            return Chain::default();
        };
        let mut out = Chain {
            exe,
            ancestors: Vec::new(),
        };
        if !ancestors || ppid == 0 {
            return out;
        }
        let Some(parent) = pin_parent(pidfd.as_fd(), ppid) else {
            return out;
        };
        out.ancestors = match cache {
            Some(c) => c.get_or_walk(self, parent, ppid),
            None => self.walk(parent, ppid),
        };
        out
    }

    /// The programs of `pid` (pinned by `pidfd`) and its ancestors, `pid` first,
    /// [`MAX_ANCESTORS`] at most; each parent pinned by [`pin_parent`].
    fn walk(&self, mut pidfd: OwnedFd, mut pid: u32) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for _ in 0..MAX_ANCESTORS {
            let Some((exe, next)) = self.one(pid, pidfd.as_fd()) else {
                break;
            };
            out.push(exe);
            if next == 0 {
                break;
            }
            let Some(parent) = pin_parent(pidfd.as_fd(), next) else {
                break;
            };
            (pidfd, pid) = (parent, next);
        }
        out
    }
}

/// A pidfd of `ppid`, the parent of the process `child` pins, when it is still its parent
/// after the open: a parent that exited meanwhile (its id free for reuse) reparents the
/// child, so the check fails rather than pin a process that took the id over.
fn pin_parent(child: BorrowedFd<'_>, ppid: u32) -> Option<OwnedFd> {
    let parent = sys::pidfd_open(ppid).ok()?;
    let (_, now) = sys::pidfd_pids(child).ok()?;
    (now == ppid).then_some(parent)
}

/// How long the resolver trusts what it read about an ancestor.
const ANCESTOR_TTL: Duration = Duration::from_secs(1);

/// Ancestor chains the resolver thread has read, by the parent's identity for this boot
/// (its pidfd's pidfs inode, [`sys::pidfd_id`]): a process that reuses a pid has another,
/// even when it starts within the same clock tick (so the same `/proc/PID/stat` start
/// time) as the process that had the pid. Without pidfs nothing is cached. Bounded by
/// [`ANCESTOR_CAP`] (emptied when full); an entry is used for [`ANCESTOR_TTL`] at most (an
/// ancestor that `exec`s is seen with its new program within that time). The calling
/// process itself is always read afresh.
#[derive(Default)]
struct Ancestors {
    map: std::collections::HashMap<u64, Cached>,
}

/// An ancestor chain (parent first) and when it was read.
type Cached = (Vec<Vec<u8>>, std::time::Instant);

/// Entries [`Ancestors`] keeps at most.
const ANCESTOR_CAP: usize = 4096;

impl Ancestors {
    /// The chain of `ppid` (pinned by `parent`), from the cache while it is fresh.
    fn get_or_walk(&mut self, p: &Programs, parent: OwnedFd, ppid: u32) -> Vec<Vec<u8>> {
        let Ok(id) = sys::pidfd_id(parent.as_fd()) else {
            return p.walk(parent, ppid);
        };
        if let Some((chain, at)) = self.map.get(&id)
            && at.elapsed() < ANCESTOR_TTL
        {
            return chain.clone();
        }
        let chain = p.walk(parent, ppid);
        if self.map.len() >= ANCESTOR_CAP {
            self.map.clear();
        }
        self.map
            .insert(id, (chain.clone(), std::time::Instant::now()));
        chain
    }
}

/// The resolver thread: answers until every sender is gone.
fn serve(rx: Receiver<Question>) {
    let direct = Programs::default();
    let mut cache = Ancestors::default();
    while let Ok(q) = rx.recv() {
        match q {
            Question::Chain(pid, ancestors, answer) => {
                let _ = answer.try_send(direct.resolve(pid, ancestors, Some(&mut cache)));
            }
            Question::Admin(pid, answer) => {
                let _ = answer.try_send(super::privilege::host_admin(pid));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_named_in_their_own_root() {
        assert_eq!(
            as_seen(b"/", b"/usr/bin/git"),
            Some(b"/usr/bin/git".to_vec())
        );
        assert_eq!(
            as_seen(b"/srv/ct", b"/srv/ct/usr/bin/git"),
            Some(b"/usr/bin/git".to_vec())
        );
        assert_eq!(as_seen(b"/srv/ct", b"/srv/ctx/usr/bin/git"), None);
        assert_eq!(
            as_seen(b"/srv/ct", b"/usr/bin/git"),
            None,
            "outside its root"
        );
    }

    #[test]
    fn this_process_and_its_parent_are_found() {
        let p = Programs::default();
        let me = std::process::id();
        let c = p.chain(me, true);
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(c.exe, exe.as_os_str().as_encoded_bytes());
        assert!(!c.ancestors.is_empty(), "the test runner has a parent");
        assert!(c.ancestors.len() <= MAX_ANCESTORS);
        assert_eq!(p.chain(me, false).ancestors, Vec::<Vec<u8>>::new());
        // A pid that does not exist: no program.
        assert_eq!(p.chain(u32::MAX / 2, true), Chain::default());
        // The same through a resolver thread, twice (the second from its cache).
        let t = Programs::with_thread().unwrap();
        assert_eq!(t.chain(me, true), c);
        assert_eq!(t.chain(me, true), c);
        let mine = sys::pidfd_open(me).unwrap();
        let id = sys::pidfd_id(mine.as_fd()).unwrap();
        assert_eq!(
            sys::pidfd_id(sys::pidfd_open(me).unwrap().as_fd()).unwrap(),
            id
        );
        // A child's identity is not its parent's, nor the next child's with the same pid.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let fd = sys::pidfd_open(child.id()).unwrap();
        assert_ne!(sys::pidfd_id(fd.as_fd()).unwrap(), id);
        child.wait().unwrap();
        assert_eq!(t.chain(u32::MAX / 2, false), Chain::default());
    }
}
