//! The policy in force: an immutable snapshot swapped atomically on reload.
//!
//! Invariants: a new policy (every layer) is parsed and compiled completely before it
//! replaces the old one; an invalid layer changes nothing (the whole old set stays); `generation` only grows (one per successful
//! reload); every request takes one snapshot at entry, so a rename or link is decided
//! against one policy, never a mix.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
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
    /// SOURCE's root handle, where the workspace layer (`workspace_policy`) is read.
    source: Option<OwnedFd>,
}

/// The largest workspace layer read (a policy is a few KiB; a bigger file is an error).
const WORKSPACE_LAYER_MAX: u64 = 1 << 20;

/// Reads the workspace layer `name` at the root of `source`, handle-based: `O_NOFOLLOW`
/// (a symlink there is an error, never followed), `O_NONBLOCK` (a FIFO never blocks), a
/// regular file of at most [`WORKSPACE_LAYER_MAX`] bytes. `Ok(None)`: there is none.
fn read_workspace_layer(
    source: BorrowedFd<'_>,
    name: &str,
) -> Result<Option<policy::Layer>, Vec<PolicyError>> {
    let shown = format!("SOURCE/{name}");
    let err = |message: String| {
        vec![PolicyError {
            file: shown.clone(),
            line: 0,
            column: 0,
            message,
        }]
    };
    let cname = crate::host::sys::Name::new(name.as_bytes()).map_err(|e| err(e.to_string()))?;
    let fd = match crate::host::sys::openat(source, &cname, libc::O_RDONLY, 0) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(err(format!("cannot open the workspace layer: {e}"))),
    };
    let st = crate::host::sys::fstat(fd.as_fd()).map_err(|e| err(e.to_string()))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(err("the workspace layer is not a regular file".into()));
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(WORKSPACE_LAYER_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| err(format!("cannot read the workspace layer: {e}")))?;
    if text.len() as u64 > WORKSPACE_LAYER_MAX {
        return Err(err(format!(
            "the workspace layer is larger than {WORKSPACE_LAYER_MAX} bytes"
        )));
    }
    policy::Layer::parse(&text, &shown).map(Some)
}

/// Loads every layer's file without a SOURCE (`check`, `explain`): see [`load_in`].
pub fn load(files: &[PathBuf], mode: Option<Mode>) -> Result<Policy, Vec<PolicyError>> {
    load_in(files, mode, None)
}

/// Loads every layer's file (or the built-in default when there is none) and applies the
/// CLI mode override.
///
/// With `source` (a mount), a `workspace_policy = NAME` in any layer adds SOURCE/NAME, when
/// present, as one more layer; an invalid one fails the load like any layer. Then the
/// ignore files every layer names (`ignore_files`) are found in SOURCE and compiled in;
/// a scan over its bounds or an unparsable line fails the load too.
pub fn load_in(
    files: &[PathBuf],
    mode: Option<Mode>,
    source: Option<BorrowedFd<'_>>,
) -> Result<Policy, Vec<PolicyError>> {
    load_keeping(files, mode, source, None)
}

/// [`load_in`], but a scan of SOURCE that fails (over a bound any caller of the mount can
/// reach: directories or entries walked) uses the ignore files in `kept` (those in force)
/// instead of failing the load, logged as an error: a caller filling SOURCE must not keep
/// the operator's new layers out (a refused reload keeps the old, maybe less
/// restrictive, policy whole). An unparsable ignore file still fails the load.
fn load_keeping(
    files: &[PathBuf],
    mode: Option<Mode>,
    source: Option<BorrowedFd<'_>>,
    kept: Option<&[policy::IgnoreSource]>,
) -> Result<Policy, Vec<PolicyError>> {
    let mut p = if files.is_empty() {
        Policy::builtin_default()
    } else {
        policy::load_all(files)?
    };
    if let (Some(src), Some(name)) = (source, p.workspace_policy().map(str::to_string))
        && let Some(layer) = read_workspace_layer(src, &name)?
    {
        p = p.with_layer(layer);
        p.check_limits()?;
    }
    if let Some(src) = source
        && !p.ignore_names().is_empty()
    {
        let found = match (crate::host::ignore_scan::scan(src, p.ignore_names()), kept) {
            (Ok(found), _) => found,
            (Err(e), Some(kept)) => {
                log::error!(
                    "SOURCE/{}: ignore_files: {}; the ignore files in force are kept, the policy files reloaded",
                    e.path,
                    e.message
                );
                kept.to_vec()
            }
            (Err(e), None) => {
                return Err(vec![PolicyError {
                    file: format!("SOURCE/{}", e.path),
                    line: 0,
                    column: 0,
                    message: format!("ignore_files: {}", e.message),
                }]);
            }
        };
        p = p.with_ignores(&found)?;
    }
    if let Some(m) = mode {
        p.set_mode(m);
    }
    Ok(p)
}

impl PolicyStore {
    /// A store starting with `policy` at generation 0.
    pub fn new(
        policy: Policy,
        files: Vec<PathBuf>,
        mode: Option<Mode>,
        source: Option<OwnedFd>,
    ) -> PolicyStore {
        PolicyStore {
            cur: RwLock::new(Arc::new(Snapshot {
                policy,
                generation: 0,
            })),
            generation: AtomicU64::new(0),
            files,
            mode,
            source,
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
        let kept = self.get().policy.ignore_sources();
        load_keeping(
            &self.files,
            self.mode,
            self.source.as_ref().map(|f| f.as_fd()),
            Some(&kept),
        )
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
