//! The policy in force: an immutable snapshot swapped atomically on reload.
//!
//! Invariants: a new policy (every layer) is parsed and compiled completely before it
//! replaces the old one; an invalid layer changes nothing (the whole old set stays); `generation` only grows (one per successful
//! reload); every request takes one snapshot at entry, so a rename or link is decided
//! against one policy, never a mix.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::policy::{self, Mode, Policy, PolicyError};

/// One policy generation.
pub struct Snapshot {
    /// The compiled policy (mode override already applied).
    pub policy: Policy,
    /// Number of successful reloads before this one.
    pub generation: u64,
}

/// The current policy and where it comes from.
pub struct PolicyStore {
    cur: RwLock<Arc<Snapshot>>,
    /// `cur`'s generation, read without the lock (every cacheable reply checks it).
    generation: AtomicU64,
    /// The layers' files, in order (empty: the built-in policy).
    files: Vec<PathBuf>,
    mode: Option<Mode>,
}

/// Loads every layer's file (or the built-in default when there is none) and applies the
/// CLI mode override.
pub fn load(files: &[PathBuf], mode: Option<Mode>) -> Result<Policy, Vec<PolicyError>> {
    let mut p = if files.is_empty() {
        Policy::builtin_default()
    } else {
        policy::load_all(files)?
    };
    if let Some(m) = mode {
        p.set_mode(m);
    }
    Ok(p)
}

impl PolicyStore {
    /// A store starting with `policy` at generation 0.
    pub fn new(policy: Policy, files: Vec<PathBuf>, mode: Option<Mode>) -> PolicyStore {
        PolicyStore {
            cur: RwLock::new(Arc::new(Snapshot {
                policy,
                generation: 0,
            })),
            generation: AtomicU64::new(0),
            files,
            mode,
        }
    }

    /// The layers' files reloads read, in order (empty: the built-in policy).
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The generation in force now (no snapshot clone).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The snapshot in force now.
    pub fn get(&self) -> Arc<Snapshot> {
        self.cur.read().clone()
    }

    /// Re-reads every layer's file; on success swaps it in and returns the new snapshot.
    pub fn reload(&self) -> Result<Arc<Snapshot>, Vec<PolicyError>> {
        Ok(self.install(self.prepare()?))
    }

    /// Reads and compiles every layer's file without putting it in force (a reload first
    /// takes back what the kernel caches, then [`install`](Self::install)s it).
    pub fn prepare(&self) -> Result<Policy, Vec<PolicyError>> {
        load(&self.files, self.mode)
    }

    /// Puts a prepared policy in force as the next generation.
    pub fn install(&self, p: Policy) -> Arc<Snapshot> {
        let mut cur = self.cur.write();
        let snap = Arc::new(Snapshot {
            policy: p,
            generation: cur.generation + 1,
        });
        *cur = snap.clone();
        self.generation.store(snap.generation, Ordering::SeqCst);
        snap
    }
}
