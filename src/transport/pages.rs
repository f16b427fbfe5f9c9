//! Which payload pages of a queue's ring entries may be resident, and which to give back.
//! A queue has ~1,040 entries of 128 KiB each in a mapping made without reserving memory:
//! a page exists once the kernel copied a request into it or a reply was written there,
//! and stays until given back (`MADV_DONTNEED`, done by [`super::ring`]). This keeps the
//! books, per queue, on the queue thread alone (PURE: no syscalls).
//!
//! Invariants: an entry's pages are only given back while the kernel holds the entry idle
//! (committed, and not yet handed back with a request): the queue thread asks
//! [`Pages::reclaim`] only right after taking every completion off the ring, with nothing
//! left unsubmitted, on a ring whose task work runs only when that thread enters the kernel
//! to wait (`IORING_SETUP_DEFER_TASKRUN`), so no request can be copied into an idle entry
//! until the queue thread next waits. The entries kept are the most recently committed:
//! the kernel hands out the entry committed last first, so a steady load reuses the same
//! few entries and never pays for a page fault; only a burst past [`HIGH`] bytes costs
//! `madvise` calls and fresh pages. A queue that rests (a second without a request) keeps
//! [`LOW`].

/// Payload bytes a queue may keep resident in idle entries before it gives pages back.
pub const HIGH: usize = 4 << 20;
/// What a give-back leaves resident (the hysteresis keeps a load just above `HIGH` from
/// paying on every request).
pub const LOW: usize = 2 << 20;
const PAGE: usize = 4096;

/// The books of one queue.
pub struct Pages {
    /// Bytes from the start of each entry's payload that may be resident (page-rounded).
    extent: Vec<usize>,
    /// When each entry was last committed (a counter).
    stamp: Vec<u64>,
    /// The kernel holds the entry (registered or committed, not yet handed back).
    kernel: Vec<bool>,
    /// Sum of `extent`.
    resident: usize,
    tick: u64,
    high: usize,
    low: usize,
    payload: usize,
}

impl Pages {
    /// `depth` registered entries of `payload` bytes, none touched; give back past `high`
    /// bytes, down to `low`.
    pub fn new(depth: usize, payload: usize, high: usize, low: usize) -> Pages {
        Pages {
            extent: vec![0; depth],
            stamp: vec![0; depth],
            kernel: vec![true; depth],
            resident: 0,
            tick: 0,
            high,
            low,
            payload,
        }
    }

    fn touch(&mut self, i: usize, len: usize) {
        let len = len
            .min(self.payload)
            .next_multiple_of(PAGE)
            .min(self.payload);
        if len > self.extent[i] {
            self.resident += len - self.extent[i];
            self.extent[i] = len;
        }
    }

    /// Entry `i` came back with a request of `payload_sz` payload bytes.
    pub fn fetched(&mut self, i: u16, payload_sz: usize) {
        let i = i as usize;
        self.kernel[i] = false;
        self.touch(i, payload_sz);
    }

    /// Entry `i` is committed with a reply of `len` payload bytes.
    pub fn committed(&mut self, i: u16, len: usize) {
        let i = i as usize;
        self.touch(i, len);
        self.kernel[i] = true;
        self.tick += 1;
        self.stamp[i] = self.tick;
    }

    /// Payload bytes that may be resident.
    pub fn resident(&self) -> usize {
        self.resident
    }

    /// The entries whose pages to give back now, with the bytes each may hold: when more
    /// than `high` bytes may be resident — or the queue rested (`idle`) and more than `low` —
    /// the least recently committed idle entries, until `low` bytes remain (or no idle
    /// entry has any). They count as untouched from here on: the caller must give them
    /// back before the kernel next runs the queue's task work.
    pub fn reclaim(&mut self, idle: bool) -> Vec<(u16, usize)> {
        let limit = if idle { self.low } else { self.high };
        if self.resident <= limit {
            return Vec::new();
        }
        let mut idle_touched: Vec<usize> = (0..self.extent.len())
            .filter(|&i| self.kernel[i] && self.extent[i] > 0)
            .collect();
        idle_touched.sort_unstable_by_key(|&i| self.stamp[i]);
        let mut out = Vec::new();
        for i in idle_touched {
            if self.resident <= self.low {
                break;
            }
            out.push((i as u16, self.extent[i]));
            self.resident -= self.extent[i];
            self.extent[i] = 0;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 128 << 10;

    #[test]
    fn a_steady_load_keeps_its_pages_and_a_burst_gives_the_oldest_back() {
        let mut p = Pages::new(64, P, 4 * P, 2 * P);
        // One request at a time: the same entry, a 128 KiB reply each time.
        for _ in 0..100 {
            p.fetched(0, 0);
            p.committed(0, P);
            assert!(p.reclaim(false).is_empty());
        }
        assert_eq!(p.resident(), P);
        // A burst: 8 more entries at once, each a full reply; one more is still being
        // served (the daemon owns it: never given back).
        for i in 1..10 {
            p.fetched(i, 100);
        }
        for i in 1..9 {
            p.committed(i, P);
        }
        assert_eq!(p.resident(), 9 * P + PAGE);
        let back = p.reclaim(false);
        // The least recently committed first (0, then 1, 2, …), down to `low`.
        let ids: Vec<u16> = back.iter().map(|&(i, _)| i).collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(back.iter().all(|&(_, n)| n == P));
        assert_eq!(p.resident(), P + PAGE, "entry 8 and the one in service");
        assert!(p.reclaim(false).is_empty());
        assert!(p.reclaim(true).is_empty(), "at most `low` left");
    }

    #[test]
    fn an_idle_queue_keeps_only_low_and_sizes_are_page_rounded() {
        let mut p = Pages::new(8, P, 4 * P, P);
        p.fetched(0, 1);
        p.committed(0, 10);
        assert_eq!(p.resident(), PAGE, "one page for a small request and reply");
        p.fetched(1, 0);
        p.committed(1, P + 1);
        p.fetched(2, 0);
        p.committed(2, 3 * PAGE);
        assert_eq!(p.resident(), PAGE + P + 3 * PAGE);
        assert!(p.reclaim(false).is_empty(), "below high");
        assert_eq!(p.reclaim(true), vec![(0, PAGE), (1, P)]);
        assert_eq!(p.resident(), 3 * PAGE);
        // A given-back entry touched again counts again.
        p.fetched(0, 5000);
        assert_eq!(p.resident(), 5 * PAGE);
    }
}
