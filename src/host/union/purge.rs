//! Deferred deletion of removed directories' whiteouts: a staged `rmdir` of a directory
//! that held SOURCE's files (every `rm -rf` of a host tree) is decided — the directory
//! swapped out of the view into `DIR/work` and every entry it holds seen to be a whiteout
//! — before the agent is answered; deleting those whiteouts and the directory (one
//! `unlinkat` per whiteout, an inode freed each) is left to one background thread per
//! union, off the request's path, as the work of a removal already made.
//!
//! Invariants: only a directory already out of the view (renamed into `DIR/work`, which
//! nothing but the union writes) is queued, with the names it was seen to hold, all
//! whiteouts; the thread deletes those names only and then the directory, which fails and
//! stays (logged; swept, or kept if it holds more, at the next start: `sweep.rs`) if
//! anything else is in it — nothing but a whiteout is ever deleted. Bounded: at most
//! [`MAX_JOBS`] directories and [`MAX_NAMES`] whiteouts wait across all unions; past
//! either the caller deletes at once, as before, so a caller cannot take more than that
//! from the others. The thread starts at the first deferral (a read-only union, the stage
//! tools' offline ones, never start one), runs on every CPU the process may use (not the
//! FUSE queue's it was started from), and ends once its union is gone and its queue is
//! empty (a union dropped never waits for it); [`finish`] stops new deferrals and waits
//! for every queue to empty before the daemon exits, so a clean exit leaves no leftover.
//! Before a name is deleted it is looked at once more: anything but a whiteout's shape (a
//! 0/0 character device, an empty regular file) stays, and with it the directory.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::host::sys::{self, Name};

/// Directories waiting, across all unions, at most.
pub const MAX_JOBS: usize = 64;
/// Whiteouts waiting, across all unions, at most.
pub const MAX_NAMES: usize = 1 << 16;

/// Directories and whiteouts waiting to be deleted, across all unions.
static WAITING: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));

/// Set by [`finish`]: the daemon is ending, nothing more is deferred.
static CLOSING: AtomicBool = AtomicBool::new(false);

/// A directory out of the view to delete: `DIR/work/tmp`, open as `dir`, with the
/// whiteouts it was seen to hold.
pub(super) struct Job {
    pub tmp: Name,
    pub dir: OwnedFd,
    pub names: Vec<Name>,
}

/// One union's deleting thread and its queue.
#[derive(Default)]
pub(super) struct Purger {
    /// The queue's sending end (dropped with the union: the thread then ends once it has
    /// emptied the queue).
    queue: Mutex<Option<(SyncSender<Job>, JoinHandle<()>)>>,
}

impl Purger {
    /// Queues `job` (deleted later, in `work`); gives it back when it must be done now:
    /// the bounds are reached, or no thread could start.
    pub fn later(&self, work: BorrowedFd<'_>, job: Job) -> Result<(), Job> {
        if CLOSING.load(Ordering::SeqCst) {
            return Err(job);
        }
        let n = job.names.len();
        let names = WAITING.1.fetch_add(n, Ordering::SeqCst) + n;
        if WAITING.0.fetch_add(1, Ordering::SeqCst) >= MAX_JOBS || names > MAX_NAMES {
            return Err(undo(job));
        }
        let mut q = self.queue.lock();
        if q.is_none() {
            match start(work) {
                Some(s) => *q = Some(s),
                None => return Err(undo(job)),
            }
        }
        let Some((tx, _)) = q.as_ref() else {
            return Err(undo(job));
        };
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(j) | TrySendError::Disconnected(j)) => Err(undo(j)),
        }
    }
}

/// Counts `job` out of the waiting ones (not queued after all).
fn undo(job: Job) -> Job {
    WAITING.0.fetch_sub(1, Ordering::SeqCst);
    WAITING.1.fetch_sub(job.names.len(), Ordering::SeqCst);
    job
}

fn start(work: BorrowedFd<'_>) -> Option<(SyncSender<Job>, JoinHandle<()>)> {
    let work = work.try_clone_to_owned().ok()?;
    let (tx, rx) = sync_channel::<Job>(MAX_JOBS);
    let h = std::thread::Builder::new()
        .name("fencefs-purge".into())
        .spawn(move || {
            every_cpu();
            for job in rx {
                let n = job.names.len();
                delete(work.as_fd(), job);
                WAITING.1.fetch_sub(n, Ordering::SeqCst);
                WAITING.0.fetch_sub(1, Ordering::SeqCst);
            }
        })
        .ok()?;
    Some((tx, h))
}

/// Runs the calling thread on every CPU the process's main thread may use (a thread
/// inherits its starter's mask: a FUSE queue's single CPU).
fn every_cpu() {
    use nix::unistd::Pid;
    if let Ok(set) = nix::sched::sched_getaffinity(Pid::this()) {
        let _ = nix::sched::sched_setaffinity(Pid::from_raw(0), &set);
    }
}

/// Whether `st` has a whiteout's shape: a 0/0 character device, or an empty regular file
/// (an ordinary user's whiteout, told by a marker the directory's check read).
fn whiteout_shape(st: &libc::stat) -> bool {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFCHR => st.st_rdev == 0,
        libc::S_IFREG => st.st_size == 0,
        _ => false,
    }
}

/// Deletes `job`'s whiteouts and then its directory (which stays if anything else is in
/// it).
pub(super) fn delete(work: BorrowedFd<'_>, job: Job) {
    for w in &job.names {
        match sys::fstatat_nofollow(job.dir.as_fd(), w) {
            Ok(st) if whiteout_shape(&st) => {}
            _ => continue,
        }
        if let Err(e) = sys::unlinkat(job.dir.as_fd(), w, 0)
            && e.raw_os_error() != Some(libc::ENOENT)
        {
            log::warn!("stage: deleting a removed directory's whiteout: {e}");
        }
    }
    if let Err(e) = sys::unlinkat(work, &job.tmp, libc::AT_REMOVEDIR) {
        log::warn!(
            "stage: a removed directory stays in the work directory as {} ({e})",
            String::from_utf8_lossy(job.tmp.bytes())
        );
    }
}

/// Stops deferring and waits until no deletion waits (at most `limit`): before the
/// daemon exits.
pub fn finish(limit: Duration) {
    CLOSING.store(true, Ordering::SeqCst);
    if !idle_within(limit) {
        log::warn!("stage: removed directories still wait in the work directory");
    }
}

/// Whether no deletion waits any more within `limit`.
fn idle_within(limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while WAITING.0.load(Ordering::SeqCst) > 0 {
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(p: &std::path::Path) -> OwnedFd {
        sys::open_root(p).unwrap()
    }

    /// The thread deletes the names it was given, if they still have a whiteout's shape,
    /// and then the directory; a name that is anything else stays, and the directory with
    /// it; past the bound the job comes back to the caller untouched; a union dropped
    /// does not stop its queue.
    #[test]
    fn only_the_given_names_go_and_the_bound_gives_the_job_back() {
        let root = std::env::temp_dir().join(format!("fencefs-purge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["work/a", "work/b"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in ["work/a/w1", "work/a/w2", "work/b/w"] {
            std::fs::write(root.join(f), b"").unwrap();
        }
        std::fs::write(root.join("work/b/data"), b"x").unwrap();
        std::fs::write(root.join("work/c"), b"").unwrap();
        let work = open(&root.join("work"));
        let p = Purger::default();
        let job = |d: &str, names: &[&str]| Job {
            tmp: Name::new(d.as_bytes()).unwrap(),
            dir: open(&root.join("work").join(d)),
            names: names
                .iter()
                .map(|n| Name::new(n.as_bytes()).unwrap())
                .collect(),
        };
        assert!(p.later(work.as_fd(), job("a", &["w1", "w2"])).is_ok());
        assert!(p.later(work.as_fd(), job("b", &["w", "data"])).is_ok());
        let many = Job {
            names: vec![Name::new(b"w").unwrap(); MAX_NAMES + 1],
            ..job("b", &[])
        };
        let back = p.later(work.as_fd(), many).expect_err("over the bound");
        assert_eq!(back.names.len(), MAX_NAMES + 1);
        drop(p); // the thread empties its queue all the same
        assert!(idle_within(Duration::from_secs(10)), "the queue emptied");
        assert!(!root.join("work/a").exists(), "a deleted");
        assert!(!root.join("work/b/w").exists(), "b's whiteout deleted");
        assert_eq!(std::fs::read(root.join("work/b/data")).unwrap(), b"x");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
