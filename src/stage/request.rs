//! A staging operation as the control socket carries it (`{"cmd":"stage","op":…}`),
//! decoded once into [`Op`]: the daemon's answer (`control.rs`), `fencefs stage SOCKET`
//! (`cli.rs`) and `fencefs review` (`app/review`) all match on its variants, never on the
//! op's name.
//!
//! Invariants: the wire format is the control protocol's `StageRequest` (strict: an
//! unknown field is refused by `control/proto.rs`), unchanged; [`Op::request`] writes what
//! [`Op::decode`] reads back, field for field. A field that an op does not take is ignored,
//! as it always was; a field an op needs but that is missing is that op's refusal (its
//! text is the engine's, in `control.rs`), so each variant keeps the wire's `Option`s.

use serde::Serialize;
use serde_json::Value;

use super::StageError;
use crate::control::proto::StageRequest;

/// One staging operation and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Op {
    /// The changes (one line and one JSON object each).
    Status {
        /// The paths to show (all when empty).
        paths: Vec<String>,
        /// Only the changes made after checkpoint N.
        #[serde(skip_serializing_if = "Option::is_none")]
        since: Option<u64>,
    },
    /// The changes as a git diff.
    Diff {
        /// The paths to show (all when empty).
        paths: Vec<String>,
        /// Only the changes made after checkpoint N.
        #[serde(skip_serializing_if = "Option::is_none")]
        since: Option<u64>,
    },
    /// One path's numbered hunks.
    Hunks {
        /// The path (exactly one).
        paths: Vec<String>,
    },
    /// Carry staged changes into SOURCE.
    Apply {
        /// The paths (all when empty; `PATH@ID`, `PATH#N[@ID]`).
        paths: Vec<String>,
        /// Conflicts too.
        force: bool,
        /// Only what checkpoint N sealed.
        #[serde(skip_serializing_if = "Option::is_none")]
        at: Option<u64>,
        /// The reviewer's note for the agent.
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// Drop staged changes.
    Discard {
        /// The paths (all when empty; `PATH@ID`, `PATH#N[@ID]`).
        paths: Vec<String>,
        /// The reviewer's note for the agent.
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// Seal the staged state as the next checkpoint.
    Checkpoint {
        /// Its message.
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The checkpoints.
    Log,
    /// Make the merged view what it was at checkpoint `to`.
    Rewind {
        /// The checkpoint (needed).
        to: Option<u64>,
    },
    /// A review UI's decision on hunks of `paths[0]`, for the agent's feedback.
    Feedback {
        /// The path (the first is used).
        paths: Vec<String>,
        /// `apply` or `discard`.
        #[serde(skip_serializing_if = "Option::is_none")]
        decision: Option<String>,
        /// The hunk numbers (empty: the whole path).
        hunks: Vec<usize>,
        /// The reviewer's note.
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
}

impl Op {
    /// The operation `r` asks for: the one place an op's name is read.
    pub fn decode(r: &StageRequest) -> Result<Op, StageError> {
        let paths = r.paths.clone();
        Ok(match r.op.as_str() {
            "status" => Op::Status {
                paths,
                since: r.since,
            },
            "diff" => Op::Diff {
                paths,
                since: r.since,
            },
            "hunks" => Op::Hunks { paths },
            "apply" => Op::Apply {
                paths,
                force: r.force,
                at: r.at,
                note: r.note.clone(),
            },
            "discard" => Op::Discard {
                paths,
                note: r.note.clone(),
            },
            "checkpoint" => Op::Checkpoint {
                message: r.message.clone(),
            },
            "log" => Op::Log,
            "rewind" => Op::Rewind { to: r.to },
            "feedback" => Op::Feedback {
                paths,
                decision: r.decision.clone(),
                hunks: r.hunks.clone(),
                message: r.message.clone(),
            },
            other => return Err(format!("unknown stage op '{other}'").into()),
        })
    }

    /// Its name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Status { .. } => "status",
            Op::Diff { .. } => "diff",
            Op::Hunks { .. } => "hunks",
            Op::Apply { .. } => "apply",
            Op::Discard { .. } => "discard",
            Op::Checkpoint { .. } => "checkpoint",
            Op::Log => "log",
            Op::Rewind { .. } => "rewind",
            Op::Feedback { .. } => "feedback",
        }
    }

    /// The control socket's command line for it: `{"cmd":"stage","op":…,…}`.
    pub fn request(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            m.insert("cmd".into(), "stage".into());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(line: &str) -> StageRequest {
        match crate::control::proto::parse(line.as_bytes()).unwrap() {
            crate::control::proto::Command::Stage(r) => r,
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn what_a_client_sends_decodes_to_the_same_op() {
        let ops = [
            Op::Status {
                paths: vec!["a".into()],
                since: Some(2),
            },
            Op::Diff {
                paths: vec![],
                since: None,
            },
            Op::Hunks {
                paths: vec!["a".into()],
            },
            Op::Apply {
                paths: vec!["a@x".into()],
                force: true,
                at: Some(1),
                note: None,
            },
            Op::Discard {
                paths: vec![],
                note: Some("no".into()),
            },
            Op::Checkpoint { message: None },
            Op::Log,
            Op::Rewind { to: Some(3) },
            Op::Feedback {
                paths: vec!["a".into()],
                decision: Some("apply".into()),
                hunks: vec![1, 2],
                message: Some(String::new()),
            },
        ];
        for op in ops {
            let line = op.request().to_string();
            assert_eq!(Op::decode(&wire(&line)).unwrap(), op, "{line}");
        }
    }

    #[test]
    fn the_wire_stays_as_it_was() {
        let r = wire(r#"{"cmd":"stage","op":"status","force":true}"#);
        assert_eq!(
            Op::decode(&r).unwrap(),
            Op::Status {
                paths: vec![],
                since: None
            }
        );
        let r = wire(r#"{"cmd":"stage","op":"rename"}"#);
        assert_eq!(
            Op::decode(&r).unwrap_err().to_string(),
            "unknown stage op 'rename'"
        );
        assert!(crate::control::proto::parse(br#"{"cmd":"stage","op":"log","x":1}"#).is_err());
    }
}
