//! FORGETs over io_uring. With every ring queue registered, the kernel still sends FORGET,
//! BATCH_FORGET and INTERRUPT on `/dev/fuse`, where fuser's threads wait in `read(2)`.
//! A waiting reader is woken for every single FORGET: one per file an `rm` unlinks (the
//! kernel forgets the inode right after the UNLINK's reply), a wake-up paid by the
//! unlinking caller and a context switch of the daemon each time. Instead, a reader that
//! just got a FORGET sleeps [`PACE`] before it handles it and reads again, so the kernel
//! queues the next ones meanwhile and hands them over as one BATCH_FORGET.
//!
//! Invariants: only once the rings serve every other request (on `/dev/fuse` alone the
//! same threads serve everything, and nothing is paced); at most one pause per read (the
//! entries of one BATCH_FORGET share its request id); nothing is dropped or reordered,
//! only delayed: a node's lookups are released at most [`PACE`] later, and an INTERRUPT
//! queued while every reader pauses is read at most [`PACE`] late (it only cancels an
//! approval wait, which lasts seconds).

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::core::Core;

/// How long a `/dev/fuse` reader waits after a FORGET before it reads again.
pub const PACE: Duration = Duration::from_millis(2);

thread_local! {
    /// The request id of the last FORGET this thread paused for.
    static LAST: Cell<u64> = const { Cell::new(0) };
}

/// Called for each FORGET (each entry of a BATCH_FORGET) with its request id.
pub fn pace(core: &Core, unique: u64) {
    if LAST.with(|last| pauses(core.rings.load(Ordering::Relaxed), last, unique)) {
        std::thread::sleep(PACE);
    }
}

/// Whether the FORGET with request id `unique` pauses its reader (`last`: the id this
/// thread last paused for).
fn pauses(rings: bool, last: &Cell<u64>, unique: u64) -> bool {
    if !rings || last.get() == unique {
        return false;
    }
    last.set(unique);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pause_per_read_and_none_on_dev_fuse_alone() {
        let last = Cell::new(0);
        assert!(
            !pauses(false, &last, 7),
            "/dev/fuse serves everything: no pause"
        );
        assert!(pauses(true, &last, 7));
        assert!(!pauses(true, &last, 7), "a BATCH_FORGET's later entries");
        assert!(pauses(true, &last, 8), "the next read");
    }
}
