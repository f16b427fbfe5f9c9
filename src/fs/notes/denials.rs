//! The store behind `.fencefs/denials`: each uid's last [`PER_UID`] refusals, newest last.
//!
//! Invariants: memory is bounded whoever calls — at most [`MAX_UIDS`] uids are tracked
//! (a new uid past the cap evicts the uid written least recently, so a caller cycling
//! uids only evicts, never grows the table), at most [`PER_UID`] lines each, each line's
//! path cut at [`MAX_PATH`] bytes as shown (a line is that, the time, op and errno, and
//! the rule's text the operator wrote); one short lock per refusal, no I/O.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;

/// Lines kept per uid.
pub const PER_UID: usize = 100;
/// Uids tracked at once.
pub const MAX_UIDS: usize = 64;
/// Bytes of a refused path, as shown (quoted), kept in a line (longer ones end in `...`).
pub const MAX_PATH: usize = 512;

#[derive(Default)]
struct Inner {
    /// uid → (last write tick, lines).
    rings: HashMap<u32, (u64, VecDeque<String>)>,
    tick: u64,
}

/// Each uid's last refusals.
#[derive(Default)]
pub struct Denials {
    inner: Mutex<Inner>,
}

impl Denials {
    /// Appends `line` to `uid`'s ring.
    pub fn record(&self, uid: u32, line: String) {
        let mut g = self.inner.lock();
        g.tick += 1;
        let tick = g.tick;
        if !g.rings.contains_key(&uid) && g.rings.len() >= MAX_UIDS {
            let oldest = g.rings.iter().min_by_key(|(_, (t, _))| *t).map(|(u, _)| *u);
            if let Some(u) = oldest {
                g.rings.remove(&u);
            }
        }
        let (t, ring) = g.rings.entry(uid).or_default();
        *t = tick;
        if ring.len() >= PER_UID {
            ring.pop_front();
        }
        ring.push_back(line);
    }

    /// `uid`'s lines, oldest first.
    pub fn lines(&self, uid: u32) -> Vec<String> {
        let g = self.inner.lock();
        g.rings
            .get(&uid)
            .map(|(_, r)| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// How many uids are tracked.
    pub fn uids(&self) -> usize {
        self.inner.lock().rings.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_per_uid_and_in_uids() {
        let d = Denials::default();
        for i in 0..250 {
            d.record(7, format!("line {i}"));
        }
        let l = d.lines(7);
        assert_eq!(l.len(), PER_UID);
        assert_eq!(l.first().unwrap(), "line 150");
        assert_eq!(l.last().unwrap(), "line 249");
        for uid in 1000..1000 + 10 * MAX_UIDS as u32 {
            d.record(uid, "x".into());
        }
        assert_eq!(d.uids(), MAX_UIDS);
        // The uid written least recently went first; the newest are kept.
        assert!(d.lines(7).is_empty());
        assert_eq!(
            d.lines(1000 + 10 * MAX_UIDS as u32 - 1),
            vec!["x".to_string()]
        );
    }
}
