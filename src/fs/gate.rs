//! The request gate: a staged mount's view swap (a live checkpoint, rewind, apply or
//! discard) waits here until no request is in flight, and holds new ones at the door
//! while it replaces the merged view, so no request straddles two views.
//!
//! Every request enters when its context is made (`Shared::ctx`) and leaves when the
//! context is dropped (the reply sent). A request held for an approver has left (its
//! continuation enters again). A thread already inside enters again without waiting (a
//! nested context never waits for a closing that waits for it).
//!
//! Invariants: [`Gate::close`] gives up after its timeout and reopens (a swap never blocks
//! the daemon for long); entering never fails, it only waits while the gate is closed.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

#[derive(Default)]
struct State {
    closed: bool,
    inflight: usize,
}

/// See the module header.
#[derive(Default)]
pub struct Gate {
    state: Mutex<State>,
    cv: Condvar,
}

thread_local! {
    static INSIDE: Cell<usize> = const { Cell::new(0) };
}

/// A request inside the gate (leaves on drop).
pub struct Inside {
    gate: Arc<Gate>,
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|c| c.set(c.get().saturating_sub(1)));
        let mut s = self.gate.state.lock();
        s.inflight -= 1;
        if s.inflight == 0 {
            self.gate.cv.notify_all();
        }
    }
}

impl Gate {
    /// Enters (waits while a swap holds the gate closed, unless this thread is inside).
    pub fn enter(self: &Arc<Self>) -> Inside {
        let nested = INSIDE.with(|c| c.get()) > 0;
        let mut s = self.state.lock();
        while s.closed && !nested {
            self.cv.wait(&mut s);
        }
        s.inflight += 1;
        drop(s);
        INSIDE.with(|c| c.set(c.get() + 1));
        Inside { gate: self.clone() }
    }

    /// Closes the gate and waits (at most `timeout`) until no request is inside; `false`
    /// (and the gate open again) when requests were still in flight.
    pub fn close(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut s = self.state.lock();
        s.closed = true;
        while s.inflight > 0 {
            if self.cv.wait_until(&mut s, until).timed_out() && s.inflight > 0 {
                s.closed = false;
                self.cv.notify_all();
                return false;
            }
        }
        true
    }

    /// Whether a swap is waiting for the requests in flight (a long request stops at its
    /// next step and answers what it has done: see `fs/ops/copy.rs`).
    pub fn closing(&self) -> bool {
        self.state.lock().closed
    }

    /// Runs `f` — one host call on a descriptor the request already holds, which cannot be
    /// split (fallocate) — as if the request had left the gate, so a swap does not wait for
    /// it, then enters again (waiting while a swap holds the gate closed). The descriptor
    /// stays the view's it was opened in whatever swap happens meanwhile. A nested request
    /// (this thread inside more than once) runs `f` inside.
    pub fn outside<T>(self: &Arc<Self>, f: impl FnOnce() -> T) -> T {
        if INSIDE.with(|c| c.get()) != 1 {
            return f();
        }
        {
            let mut s = self.state.lock();
            s.inflight -= 1;
            if s.inflight == 0 {
                self.cv.notify_all();
            }
        }
        INSIDE.with(|c| c.set(0));
        let r = f();
        let mut s = self.state.lock();
        while s.closed {
            self.cv.wait(&mut s);
        }
        s.inflight += 1;
        drop(s);
        INSIDE.with(|c| c.set(1));
        r
    }

    /// Opens the gate again.
    pub fn open(&self) {
        self.state.lock().closed = false;
        self.cv.notify_all();
    }

    /// Requests inside now.
    pub fn inflight(&self) -> usize {
        self.state.lock().inflight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_waits_for_requests_in_flight_and_holds_new_ones() {
        let g = Arc::new(Gate::default());
        let inside = g.enter();
        let g2 = g.clone();
        let closer = std::thread::spawn(move || {
            let ok = g2.close(Duration::from_secs(20));
            // Nothing entered while closed.
            let n = g2.inflight();
            g2.open();
            (ok, n)
        });
        std::thread::sleep(Duration::from_millis(100));
        drop(inside);
        let (ok, n) = closer.join().unwrap();
        assert!(ok);
        assert_eq!(n, 0);
        let _again = g.enter();
        assert_eq!(g.inflight(), 1);
    }

    #[test]
    fn a_call_outside_does_not_hold_a_close() {
        let g = Arc::new(Gate::default());
        let _inside = g.enter();
        let (tx, rx) = std::sync::mpsc::channel();
        let g2 = g.clone();
        let closer = std::thread::spawn(move || {
            rx.recv().unwrap();
            let ok = g2.close(Duration::from_secs(5));
            assert!(g2.closing());
            std::thread::sleep(Duration::from_millis(50));
            g2.open();
            ok
        });
        let waited = g.outside(|| {
            tx.send(()).unwrap();
            // The closer gets the gate while this call runs.
            let t = Instant::now();
            while !g.closing() && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Instant::now()
        });
        assert!(closer.join().unwrap());
        assert!(waited.elapsed() < Duration::from_secs(5));
        assert_eq!(g.inflight(), 1);
        assert!(!g.closing());
    }

    #[test]
    fn close_gives_up_and_reopens() {
        let g = Arc::new(Gate::default());
        let _inside = g.enter();
        std::thread::scope(|s| {
            s.spawn(|| assert!(!g.close(Duration::from_millis(50))));
        });
        // Open again: another thread enters at once.
        std::thread::scope(|s| {
            s.spawn(|| drop(g.enter()));
        });
        assert_eq!(g.inflight(), 1);
    }
}
