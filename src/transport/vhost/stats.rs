//! What one connection's guest asked for: requests by opcode and the queue threads' time
//! on them, logged when the connection ends (the profile `docs/src/vhost.md` reports).
//!
//! Invariants: counting is lock-free and bounded (a fixed table; opcodes past it share
//! the last slot); the time is the queue thread's, from the chain popped to the reply
//! sent or handed on (a request held or sent to a worker counts only its dispatch).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const SLOTS: usize = 64;

/// Counters of one connection.
pub struct Stats {
    count: [AtomicU64; SLOTS],
    nanos: [AtomicU64; SLOTS],
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            count: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Stats {
    /// Counts a request of `opcode` whose handling started at `t`.
    pub fn record(&self, opcode: u32, t: Instant) {
        let i = (opcode as usize).min(SLOTS - 1);
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.count[i].fetch_add(1, Ordering::Relaxed);
        self.nanos[i].fetch_add(ns, Ordering::Relaxed);
    }

    /// Requests counted.
    pub fn total(&self) -> u64 {
        self.count.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// One line: the total, the mean queue-thread time, and the opcodes by count.
    pub fn summary(&self) -> String {
        let mut v: Vec<(u64, u64, usize)> = (0..SLOTS)
            .map(|i| {
                let c = self.count[i].load(Ordering::Relaxed);
                (c, self.nanos[i].load(Ordering::Relaxed), i)
            })
            .filter(|&(c, _, _)| c > 0)
            .collect();
        v.sort_unstable_by_key(|x| std::cmp::Reverse(x.0));
        let total: u64 = v.iter().map(|x| x.0).sum();
        let ns: u64 = v.iter().map(|x| x.1).sum();
        let per = |c: u64, n: u64| {
            if c == 0 {
                0.0
            } else {
                n as f64 / c as f64 / 1000.0
            }
        };
        let ops: Vec<String> = v
            .iter()
            .map(|&(c, n, i)| format!("{} {c} ({:.1} µs)", name(i as u32), per(c, n)))
            .collect();
        format!(
            "{total} requests, {:.1} µs each on the queue threads: {}",
            per(total, ns),
            ops.join(", ")
        )
    }
}

fn name(op: u32) -> String {
    use crate::transport::abi::op;
    let n = match op {
        op::LOOKUP => "LOOKUP",
        op::FORGET => "FORGET",
        op::BATCH_FORGET => "BATCH_FORGET",
        op::GETATTR => "GETATTR",
        op::SETATTR => "SETATTR",
        op::MKDIR => "MKDIR",
        op::CREATE => "CREATE",
        op::OPEN => "OPEN",
        op::READ => "READ",
        op::WRITE => "WRITE",
        op::FLUSH => "FLUSH",
        op::RELEASE => "RELEASE",
        op::FSYNC => "FSYNC",
        op::OPENDIR => "OPENDIR",
        op::READDIR => "READDIR",
        op::READDIRPLUS => "READDIRPLUS",
        op::RELEASEDIR => "RELEASEDIR",
        op::GETXATTR => "GETXATTR",
        op::LISTXATTR => "LISTXATTR",
        op::ACCESS => "ACCESS",
        op::STATFS => "STATFS",
        op::INIT => "INIT",
        op::DESTROY => "DESTROY",
        _ => return format!("op{op}"),
    };
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::abi::op;

    #[test]
    fn the_summary_counts_by_opcode_most_first() {
        let s = Stats::default();
        let t = Instant::now();
        for _ in 0..3 {
            s.record(op::LOOKUP, t);
        }
        s.record(op::GETATTR, t);
        s.record(9999, t);
        assert_eq!(s.total(), 5);
        let line = s.summary();
        assert!(line.starts_with("5 requests, "), "{line}");
        let (l, g) = (
            line.find("LOOKUP 3").unwrap(),
            line.find("GETATTR 1").unwrap(),
        );
        assert!(l < g, "{line}");
        assert!(line.contains("op63 1"), "{line}");
    }
}
