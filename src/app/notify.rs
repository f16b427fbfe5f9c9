//! The notify thread: it alone tells the kernel to forget names, attributes, listings and
//! pages (FUSE_NOTIFY_INVAL_ENTRY / _INODE), for reloads, host changes and the workers.
//!
//! An entry invalidation takes the parent directory's lock in the kernel; a directory
//! change held for an approver keeps that lock for as long as it is held. So the entries of
//! directories marked busy (`kcache::KernelCache::hold_dirs`) are never invalidated here:
//! they go to the **held-directory lane**, a thread of its own that invalidates each once
//! its directory is no longer busy. Attribute, listing and page invalidations take no
//! directory lock and are never deferred: they alone already make every later operation
//! on a known node reach the daemon and its policy.
//!
//! Invariants: the notify thread waits only for requests in flight (answered by a worker),
//! never for a held one — except in the race where a directory change takes the kernel's
//! lock and is held between the busy check and the invalidation (the window is the time
//! the request spends queued in the kernel; the stall then lasts as long as that hold);
//! the lane holds at most [`LANE_CAP`] entries (beyond, the oldest are dropped: they then
//! expire with the entry TTL); every job's `done` is answered.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use fuser::{INodeNo, Notifier};
use parking_lot::{Condvar, Mutex};

use crate::fs::kcache::{Done, Inval};
use crate::fs::ops::Shared;

/// Entries the held-directory lane keeps at most.
pub const LANE_CAP: usize = 65_536;

/// How often the lane looks again at directories still busy.
const LANE_POLL: Duration = Duration::from_millis(50);

type Entry = (u64, Vec<u8>);

/// Entries waiting for their directory to be unlocked.
#[derive(Default)]
struct Lane {
    q: Mutex<VecDeque<Entry>>,
    cv: Condvar,
}

impl Lane {
    fn defer(&self, entries: Vec<Entry>) {
        if entries.is_empty() {
            return;
        }
        let mut q = self.q.lock();
        q.extend(entries);
        while q.len() > LANE_CAP {
            q.pop_front();
        }
        self.cv.notify_one();
    }

    fn run(&self, n: &Notifier, shared: &Shared) {
        loop {
            let batch: Vec<Entry> = {
                let mut q = self.q.lock();
                while q.is_empty() {
                    self.cv.wait(&mut q);
                }
                q.drain(..).collect()
            };
            let mut still = Vec::new();
            let mut done = 0usize;
            for (parent, name) in batch {
                if shared.kcache.is_busy(parent) {
                    still.push((parent, name));
                } else {
                    let _ = n.inval_entry(INodeNo(parent), OsStr::from_bytes(&name));
                    done += 1;
                }
            }
            if done > 0 {
                log::debug!("held-directory lane: {done} names invalidated");
            }
            if !still.is_empty() {
                let mut q = self.q.lock();
                for e in still.into_iter().rev() {
                    q.push_front(e);
                }
                q.truncate(LANE_CAP);
                let _ = self.cv.wait_for(&mut q, LANE_POLL);
            }
        }
    }
}

/// Invalidates `(parent, name)` unless the parent is busy (then it is deferred).
fn entry(n: &Notifier, shared: &Shared, e: Entry, done: &mut Done, deferred: &mut Vec<Entry>) {
    if shared.kcache.is_busy(e.0) {
        deferred.push(e);
        done.deferred += 1;
    } else {
        let _ = n.inval_entry(INodeNo(e.0), OsStr::from_bytes(&e.1));
        done.names += 1;
    }
}

/// A reload's first pass (or a lost host event): every name and inode the kernel may hold.
fn everything(n: &Notifier, shared: &Shared, done: &mut Done, deferred: &mut Vec<Entry>) {
    let (mut entries, inodes) = shared.inodes.snapshot();
    // Hidden names the kernel may hold as negative entries: a reload may show them.
    entries.extend(shared.kcache.take_hidden());
    // Attributes, and for directories the cached listing (filtered under the old policy);
    // first, because they need no directory lock: once they are gone, every operation on
    // a node the kernel knows reaches the daemon, whatever entries remain.
    let (dirs, files): (Vec<u64>, Vec<u64>) = inodes
        .iter()
        .partition(|ino| shared.inodes.kind(**ino).is_ok_and(|k| k == libc::S_IFDIR));
    for ino in &dirs {
        let _ = n.inval_inode(INodeNo(*ino), 0, 0);
    }
    for ino in &files {
        // Symlinks: their cached target too (readlink is decided by the policy).
        let link = shared.inodes.kind(*ino).is_ok_and(|k| k == libc::S_IFLNK);
        let _ = n.inval_inode(INodeNo(*ino), if link { 0 } else { -1 }, 0);
    }
    done.inodes += inodes.len();
    for e in entries {
        entry(n, shared, e, done, deferred);
    }
}

/// A reload's second pass, under the new policy: listings filled during the first pass,
/// and (`pages`, --revoke) every cached file page, so a map of a path the reload hid or
/// lowered faults afresh into the daemon.
fn after_swap(n: &Notifier, shared: &Shared, pages: bool, done: &mut Done) {
    let (_, inodes) = shared.inodes.snapshot();
    for ino in inodes {
        let dir = shared.inodes.kind(ino).is_ok_and(|k| k == libc::S_IFDIR);
        if dir || pages {
            let _ = n.inval_inode(INodeNo(ino), 0, 0);
            done.inodes += 1;
        }
    }
}

/// Serves the invalidation queue until every sender is gone.
pub(super) fn notify_loop(n: Notifier, rx: Receiver<Inval>, shared: Arc<Shared>) {
    let lane = Arc::new(Lane::default());
    {
        let (lane, n, shared) = (lane.clone(), n.clone(), shared.clone());
        if let Err(e) = std::thread::Builder::new()
            .name("fencefs-notify-held".into())
            .spawn(move || lane.run(&n, &shared))
        {
            log::error!("held-directory lane not started ({e}): its entries expire with the TTL");
        }
    }
    while let Ok(first) = rx.recv() {
        // Merge what queued up meanwhile (a burst of host events).
        let mut jobs = vec![first];
        while let Ok(more) = rx.try_recv() {
            jobs.push(more);
        }
        let mut done = Done::default();
        let mut deferred = Vec::new();
        if jobs.iter().any(|j| j.everything) {
            everything(&n, &shared, &mut done, &mut deferred);
        }
        if jobs.iter().any(|j| j.after_swap) {
            let pages = jobs.iter().any(|j| j.after_swap && j.drop_pages);
            after_swap(&n, &shared, pages, &mut done);
        }
        for job in &mut jobs {
            // Named entries go too with `everything`: a staged view's swap names the
            // negative entries (deleted names) no pass over the known names reaches.
            for e in std::mem::take(&mut job.entries) {
                entry(&n, &shared, e, &mut done, &mut deferred);
            }
            for (ino, offset) in &job.inodes {
                let _ = n.inval_inode(INodeNo(*ino), *offset, 0);
            }
            done.inodes += job.inodes.len();
        }
        lane.defer(deferred);
        log::debug!(
            "invalidated {} names, {} inodes ({} names deferred behind held requests)",
            done.names,
            done.inodes,
            done.deferred
        );
        for job in jobs {
            if let Some(tx) = job.done {
                let _ = tx.send(done);
            }
        }
    }
}
