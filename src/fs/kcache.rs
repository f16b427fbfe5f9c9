//! What the kernel caches on the daemon's word, and how the daemon takes it back.
//!
//! Workers never talk to the kernel's notification channel themselves (an invalidation
//! waits for the directory lock, which the kernel holds while the worker's own request is
//! in flight): they queue an [`Inval`] for the notify thread.
//!
//! A reload (`app/threads.rs` `reload_now`) and a staged mount's live change
//! (`app/restage.rs`) are each one instant for every caller, and both go through one
//! [`Swap`] ([`KernelCache::swap`]): one at a time; while the notify thread takes back
//! what the kernel holds, the **no-cache window** is open and nothing the daemon answers
//! may be cached ([`KernelCache::caching`] is false, hidden negative entries are not handed
//! out); what the daemon answers from is replaced inside the window; once it closes, a
//! second pass takes back listings (and, if asked, cached pages). Invariant: a reply is
//! cacheable only if the name or node it is about was registered (inode table, hidden set)
//! *before* the caching check — so either the window's snapshot saw it and takes it back,
//! or the check saw the window and the reply is not cacheable. A `Swap` dropped with its
//! window open closes it.
//!
//! A directory change held for an approver keeps its parent locked in the kernel, and an
//! entry invalidation in that directory would wait for the lock: such directories are
//! registered as **busy** ([`KernelCache::hold_dirs`]) while the request is held, and the
//! notify thread leaves their entries to a lane of their own (`app/notify.rs`).
//!
//! Hidden names are answered like absent ones, as negative entries the kernel may cache, so
//! that repeated lookups cost the same and time reveals nothing. Unlike a name absent on the
//! host, a reload can make a hidden name visible, so every hidden negative entry handed out
//! is remembered here (a bounded FIFO) until a reload takes them all back. Invariant: every
//! hidden negative entry the kernel may still hold is in the set, or an invalidation for it
//! has been queued (eviction queues one).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::mpsc::channel;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};

/// Names and inodes whose kernel cache entries must go.
#[derive(Default)]
pub struct Inval {
    /// `(parent, name)` entries.
    pub entries: Vec<(u64, Vec<u8>)>,
    /// `(inode, offset)`: -1 drops attributes, 0 also cached pages.
    pub inodes: Vec<(u64, i64)>,
    /// Invalidate every name and inode known (a reload, a lost host event).
    pub everything: bool,
    /// A reload's second pass, once the new policy is in force: directory listings again
    /// and, with `drop_pages`, cached file pages.
    pub after_swap: bool,
    /// Also drop cached file pages (--revoke, after a reload's swap).
    pub drop_pages: bool,
    /// Told when the job is done (a reload waits for its passes).
    pub done: Option<Sender<Done>>,
}

/// What a pass of the notify thread did.
#[derive(Default, Clone, Copy, Debug)]
pub struct Done {
    /// Names invalidated.
    pub names: usize,
    /// Inodes invalidated.
    pub inodes: usize,
    /// Names left to the held-directory lane (their directory is locked by a held request).
    pub deferred: usize,
}

/// Hidden names given out as cacheable negative entries, at most this many at once.
const HIDDEN_CAP: usize = 65_536;

type EntryKey = (u64, Box<[u8]>);

#[derive(Default)]
struct Hidden {
    set: HashSet<EntryKey>,
    order: VecDeque<EntryKey>,
}

/// Directories locked in the kernel by a held request: node → number of such requests.
type Busy = Arc<Mutex<HashMap<u64, u32>>>;

/// The daemon's side of the kernel's caches.
#[derive(Default)]
pub struct KernelCache {
    tx: OnceLock<Sender<Inval>>,
    hidden: Mutex<Hidden>,
    /// The no-cache window of a reload is open.
    window: AtomicBool,
    busy: Busy,
    /// One swap at a time (SIGHUP, `ctl reload` and a live restage may come together).
    swapping: Mutex<()>,
}

/// How long a swap waits for one pass of the notify thread before it goes on (the pass
/// waits only for requests in flight, so this is a safety net, never the normal case).
const PASS_LIMIT: Duration = Duration::from_secs(10);

/// One swap of what the daemon answers from (a policy reload, a staged mount's new view),
/// from [`KernelCache::swap`]: holds the one-at-a-time lock, and owns the no-cache window
/// and the invalidation passes. The caller decides where in the window its change goes.
pub struct Swap<'a> {
    cache: &'a KernelCache,
    _one: MutexGuard<'a, ()>,
    window: bool,
}

impl Swap<'_> {
    /// Opens the no-cache window (if not open yet).
    pub fn open_window(&mut self) {
        if !self.window {
            self.cache.begin_window();
            self.window = true;
        }
    }

    /// The first pass: opens the window if needed, then the notify thread takes back every
    /// name and inode the kernel holds, and `entries` (names it may hold as negative
    /// entries, which the pass over every known name does not reach).
    pub fn take_back(&mut self, entries: Vec<(u64, Vec<u8>)>) -> Done {
        self.open_window();
        self.pass(Inval {
            everything: true,
            entries,
            ..Inval::default()
        })
    }

    /// Hands one more job to the notify thread inside the swap and waits for it.
    pub fn pass(&self, job: Inval) -> Done {
        self.cache.pass(job)
    }

    /// Closes the window (the new answers are in force) and runs the second pass:
    /// directory listings again and, with `drop_pages`, cached file pages.
    pub fn finish(mut self, drop_pages: bool) -> Done {
        self.close_window();
        self.cache.pass(Inval {
            after_swap: true,
            drop_pages,
            ..Inval::default()
        })
    }

    /// Closes the window (if open): from here every answer may be cached again.
    pub fn close_window(&mut self) {
        if self.window {
            self.cache.end_window();
            self.window = false;
        }
    }
}

impl Drop for Swap<'_> {
    fn drop(&mut self) {
        self.close_window();
    }
}

/// Marks directories busy while a request that locks them in the kernel is held; dropped
/// once the request is answered.
pub struct BusyDirs {
    busy: Busy,
    dirs: Vec<u64>,
}

impl Drop for BusyDirs {
    fn drop(&mut self) {
        let mut b = self.busy.lock();
        for d in &self.dirs {
            if let Some(n) = b.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    b.remove(d);
                }
            }
        }
    }
}

impl KernelCache {
    /// Connects the notify thread's queue (once, at mount).
    pub fn connect(&self, tx: Sender<Inval>) {
        let _ = self.tx.set(tx);
    }

    /// Queues invalidations for the notify thread; never blocks. `false` when nobody
    /// listens (not mounted yet, or shutting down).
    pub fn send(&self, inval: Inval) -> bool {
        self.tx.get().is_some_and(|tx| tx.send(inval).is_ok())
    }

    /// Starts a swap; waits for the one under way, if any.
    pub fn swap(&self) -> Swap<'_> {
        Swap {
            cache: self,
            _one: self.swapping.lock(),
            window: false,
        }
    }

    /// Hands one job to the notify thread and waits until it is done (at most
    /// [`PASS_LIMIT`]); nothing to wait for when nobody listens.
    fn pass(&self, mut job: Inval) -> Done {
        let (done_tx, done_rx) = channel();
        job.done = Some(done_tx);
        if !self.send(job) {
            return Done::default();
        }
        match done_rx.recv_timeout(PASS_LIMIT) {
            Ok(d) => d,
            Err(_) => {
                log::warn!(
                    "reload: the kernel cache invalidation did not finish within {PASS_LIMIT:?}; going on"
                );
                Done::default()
            }
        }
    }

    /// Opens a reload's no-cache window (under the hidden set's lock, so a hidden negative
    /// entry is either recorded before the reload takes the set, or not cached).
    fn begin_window(&self) {
        let _h = self.hidden.lock();
        self.window.store(true, Ordering::SeqCst);
    }

    /// Closes the window: the new policy is in force.
    fn end_window(&self) {
        self.window.store(false, Ordering::SeqCst);
    }

    /// Whether a reply may let the kernel cache what it says (no reload under way). Check
    /// it after the reply's name or node is registered (see the module invariant).
    pub fn caching(&self) -> bool {
        !self.window.load(Ordering::SeqCst)
    }

    /// Marks `dirs` busy until the guard is dropped (a held request locking them).
    pub fn hold_dirs(&self, dirs: &[u64]) -> BusyDirs {
        let mut b = self.busy.lock();
        for d in dirs {
            *b.entry(*d).or_default() += 1;
        }
        BusyDirs {
            busy: self.busy.clone(),
            dirs: dirs.to_vec(),
        }
    }

    /// Whether a held request locks directory `dir` in the kernel now.
    pub fn is_busy(&self, dir: u64) -> bool {
        self.busy.lock().contains_key(&dir)
    }

    /// Records that `parent/name`, hidden by the policy, was answered as a cacheable
    /// negative entry. `false`: it cannot be taken back (no notify thread, or a reload's
    /// window is open), so the caller must not let the kernel cache it.
    pub fn hidden_negative(&self, parent: u64, name: &[u8]) -> bool {
        if self.tx.get().is_none() {
            return false;
        }
        let key: EntryKey = (parent, name.into());
        let evicted = {
            let mut h = self.hidden.lock();
            if self.window.load(Ordering::SeqCst) {
                return false;
            }
            if !h.set.insert(key.clone()) {
                return true;
            }
            h.order.push_back(key);
            let mut evicted = Vec::new();
            while h.set.len() > HIDDEN_CAP {
                match h.order.pop_front() {
                    Some(old) => {
                        h.set.remove(&old);
                        evicted.push((old.0, old.1.into_vec()));
                    }
                    None => break,
                }
            }
            evicted
        };
        if !evicted.is_empty() {
            // Taken out of the set: the kernel must forget them now.
            self.send(Inval {
                entries: evicted,
                ..Inval::default()
            });
        }
        true
    }

    /// Every hidden negative entry handed out since the last call (a reload takes them
    /// all back).
    pub fn take_hidden(&self) -> Vec<(u64, Vec<u8>)> {
        let mut h = self.hidden.lock();
        h.set.clear();
        let order = std::mem::take(&mut h.order);
        order.into_iter().map(|(p, n)| (p, n.into_vec())).collect()
    }

    /// How many hidden negative entries the kernel may hold now.
    #[cfg(test)]
    fn hidden_len(&self) -> usize {
        self.hidden.lock().set.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn hidden_names_are_only_cached_when_they_can_be_taken_back() {
        let k = KernelCache::default();
        assert!(!k.hidden_negative(1, b"secret"), "no notify thread yet");
        let (tx, rx) = channel();
        k.connect(tx);
        assert!(k.hidden_negative(1, b"secret"));
        assert!(k.hidden_negative(1, b"secret"), "recorded once");
        assert_eq!(k.hidden_len(), 1);
        assert_eq!(k.take_hidden(), vec![(1, b"secret".to_vec())]);
        assert_eq!(k.hidden_len(), 0);
        assert!(rx.try_recv().is_err(), "nothing evicted");
        k.begin_window();
        assert!(!k.caching());
        assert!(
            !k.hidden_negative(1, b"other"),
            "not during a reload's window"
        );
        assert_eq!(k.hidden_len(), 0);
        k.end_window();
        assert!(k.caching());
        assert!(k.hidden_negative(1, b"other"));
    }

    #[test]
    fn busy_directories_are_counted_per_held_request() {
        let k = KernelCache::default();
        let a = k.hold_dirs(&[5, 6]);
        let b = k.hold_dirs(&[5]);
        assert!(k.is_busy(5) && k.is_busy(6) && !k.is_busy(7));
        drop(a);
        assert!(k.is_busy(5) && !k.is_busy(6));
        drop(b);
        assert!(!k.is_busy(5));
    }

    #[test]
    fn the_set_is_bounded_and_evictions_are_invalidated() {
        let k = KernelCache::default();
        let (tx, rx) = channel();
        k.connect(tx);
        for i in 0..(HIDDEN_CAP as u64 + 3) {
            assert!(k.hidden_negative(7, &i.to_ne_bytes()));
        }
        assert_eq!(k.hidden_len(), HIDDEN_CAP);
        let evicted: Vec<(u64, Vec<u8>)> = rx.try_iter().flat_map(|i| i.entries).collect();
        let want: Vec<(u64, Vec<u8>)> = (0..3u64).map(|i| (7, i.to_ne_bytes().to_vec())).collect();
        assert_eq!(evicted, want, "the oldest go, and the kernel is told");
    }

    #[test]
    fn a_swap_runs_its_passes_in_the_window_one_swap_at_a_time() {
        let k = Arc::new(KernelCache::default());
        // No notify thread (vhost-user): a pass has nothing to wait for.
        let done = k.swap().take_back(Vec::new());
        assert_eq!((done.names, done.inodes), (0, 0));
        assert!(k.caching(), "a dropped swap closes its window");

        let (tx, rx) = channel::<Inval>();
        k.connect(tx);
        let notify = std::thread::spawn(move || {
            let mut jobs = Vec::new();
            for job in rx.iter().take(2) {
                jobs.push((job.everything, job.after_swap, job.drop_pages, job.entries));
                let d = Done {
                    names: 1,
                    ..Done::default()
                };
                let _ = job.done.expect("a swap waits for its pass").send(d);
            }
            jobs
        });
        let mut swap = k.swap();
        assert!(k.caching(), "the window opens only when asked");
        swap.open_window();
        assert!(!k.caching());
        let (k2, (go, ready)) = (k.clone(), std::sync::mpsc::channel());
        let second = std::thread::spawn(move || {
            let _s = k2.swap();
            go.send(()).unwrap();
        });
        let first = swap.take_back(vec![(1, b"gone".to_vec())]);
        assert_eq!(first.names, 1);
        assert!(!k.caching(), "still in the window after the first pass");
        assert!(ready.try_recv().is_err(), "one swap at a time");
        let last = swap.finish(true);
        assert_eq!(last.names, 1);
        assert!(k.caching());
        ready.recv().unwrap();
        second.join().unwrap();
        let jobs = notify.join().unwrap();
        assert_eq!(jobs[0], (true, false, false, vec![(1, b"gone".to_vec())]));
        assert_eq!(jobs[1], (false, true, true, vec![]));
    }
}
