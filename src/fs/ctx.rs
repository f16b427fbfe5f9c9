//! The request vocabulary every part of `fs/` speaks: the errno type ([`Error`], [`Res`]),
//! the per-request context ([`Ctx`]: who asks, and one policy snapshot for the whole
//! request) and the refusal an approver could lift ([`Ask`]).
//!
//! Invariants: this module depends on nothing in `fs/` but the view-swap gate's guard
//! (`fs/gate.rs`), so the operations (`fs/ops/`), the virtual `.fencefs/` directory
//! (`fs/notes/`), the decisions (`fs/decide.rs`) and the glue can all use it without an
//! import cycle. Every host error keeps its errno (`From<io::Error> for Error`); one
//! without an errno becomes EIO, with a warning.

use std::cell::{Cell, RefCell};
use std::io;
use std::sync::Arc;

use crate::approvals::Outcome;
use crate::policy::{Access, By, Caller, Need, Verdict};
use crate::reload::Snapshot;

/// A refusal (decided in `fs/decide.rs`) an approver could lift, for every path of the request that needs it.
#[derive(Clone, Debug)]
pub struct Ask {
    /// The operation.
    pub op: &'static str,
    /// `(path, verdict, by)` of each refused path.
    pub paths: Vec<(Vec<u8>, Verdict, By)>,
    /// `(is_dir, need)` of each refused path (a reload re-decides with them).
    pub checks: Vec<(bool, Need)>,
    /// The level asked for (the highest `ask` needed).
    pub need: Access,
    /// An atomic save (op `save`): the caller's provisional temporary file renamed over
    /// `paths[0]` (`fs/ops/saves.rs`).
    pub save: Option<Vec<u8>>,
}

/// An errno for the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error(pub i32);

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        match e.raw_os_error() {
            Some(n) => Error(n),
            None => {
                log::warn!("host error without errno: {e}");
                Error(libc::EIO)
            }
        }
    }
}

/// Result of an operation.
pub type Res<T> = Result<T, Error>;

/// Who asks, and the policy snapshot the whole request is decided against.
pub struct Ctx {
    /// uid/gid of the caller.
    pub caller: Caller,
    /// pid of the caller.
    pub pid: u32,
    /// The policy in force when the request arrived.
    pub snap: Arc<Snapshot>,
    /// Re-running a held request an approver allowed: refusals an approver could lift are
    /// lifted (and audited with this outcome).
    pub approved: Option<Outcome>,
    /// Set by a refusal an approver could lift: what to ask (the glue holds the request).
    pub ask: RefCell<Option<Ask>>,
    /// The glue can hold this request (`Core::serve`); otherwise such a refusal is final.
    pub may_hold: bool,
    /// Inside the view-swap gate while the request runs (staged mounts).
    pub inside: Option<super::gate::Inside>,
    /// What the decision being audited needed (the audit line's `need`, which
    /// `fencefs learn` reads).
    pub need: Cell<Option<Need>>,
}
