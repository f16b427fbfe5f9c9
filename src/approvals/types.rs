//! The vocabulary of held requests ([`super`]): what is asked ([`Request`]), how it
//! ended ([`Outcome`]), what approvers see ([`Held`], [`Event`]), what
//! [`Approvals::hold`](super::Approvals::hold) did ([`Hold`]) and what a reload decides
//! ([`Redecide`]).
//!
//! Invariants: plain data, no behaviour beyond constructors; shared by the table, the
//! file-system glue and the control server.

use std::time::Duration;

/// How a held request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Proceed as if the grant were the rule's `ask`.
    pub allow: bool,
    /// `approver`, `timeout`, `no-approver`, `held-limit`, `dir-hold` (a directory
    /// change's hold ran out), `dir-pending`, `reload`, `killed`, `shutdown`.
    pub by: &'static str,
    /// The uid of the approver who answered.
    pub approver: Option<u32>,
}

impl Outcome {
    /// A refusal, `by` this reason.
    pub fn deny(by: &'static str) -> Outcome {
        Outcome {
            allow: false,
            by,
            approver: None,
        }
    }
}

/// How long an approver's allow holds (the `decide` command's `remember`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Remember {
    /// This request only.
    #[default]
    Once,
    /// This uid, these paths (and below) until the next reload.
    Path,
    /// Written to `--answers FILE`: this uid, these paths, for good.
    Always,
}

/// Where events for the control socket go.
pub type EventSink = Box<dyn Fn(Event) + Send>;

/// The continuation of a held request: re-runs it (allowed) or refuses it, and replies.
pub type Resume = Box<dyn FnOnce(Outcome) + Send>;

/// What a held request asks for (shown to approvers, kept for reload re-decisions).
#[derive(Debug, Clone)]
pub struct Request {
    /// The operation (`write`-style FUSE op name: `open`, `mkdir`, `rename`, …).
    pub op: &'static str,
    /// Workspace paths it needs more access on (two for rename/link).
    pub paths: Vec<Vec<u8>>,
    /// The access level it needs.
    pub need: &'static str,
    /// Caller.
    pub uid: u32,
    /// Caller's gid.
    pub gid: u32,
    /// Caller's pid (in the daemon's pid namespace).
    pub pid: u32,
    /// The deciding rule's pattern and line.
    pub rule: Option<(String, usize)>,
    /// Policy generation it was decided under.
    pub generation: u64,
    /// `(is_dir, need)` of each path, to re-decide it after a reload.
    pub checks: Vec<(bool, crate::policy::Need)>,
    /// A directory change (create, mkdir, mknod, symlink, link, unlink, rmdir, rename):
    /// held at most `--ask-dir-hold`, then refused with the question left open for the
    /// caller's retry (the ask event's `"retry":true`).
    pub retry: bool,
}

/// A held request as approvers see it.
#[derive(Debug, Clone)]
pub struct Held {
    /// Its id (answers name it).
    pub id: u64,
    /// What it asks.
    pub req: Request,
    /// Time left before it times out.
    pub expires_in: Duration,
}

/// An event for the control socket's subscribers.
#[derive(Debug, Clone)]
pub enum Event {
    /// A request is held.
    Ask(Held),
    /// A held request ended.
    Done {
        /// Its id.
        id: u64,
        /// allow or deny.
        allow: bool,
        /// Who ended it.
        by: &'static str,
    },
}

/// What a reload decides for a held request under the new policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redecide {
    /// Allowed outright now.
    Allow,
    /// Refused outright now.
    Refuse,
    /// Still needs an approver.
    Keep,
}

/// What [`Approvals::hold`](super::Approvals::hold) did with a request.
pub enum Hold {
    /// Held under this id: its continuation runs when it ends.
    Held(u64),
    /// A directory change whose question is posted under this id, but which is not held
    /// (`--ask-dir-hold 0`, or its directory rests): refuse it now (`dir-hold`) with the
    /// continuation given back.
    Posted(u64, Resume),
    /// Not held, nothing asked: refuse it now, `by` this reason (`no-approver`,
    /// `held-limit`, `dir-pending`).
    Refused(Resume, &'static str),
}
