//! Staging on the control socket: `{"cmd":"stage","op":…}` for a running mount, and the
//! `staged` count in `status`.
//!
//! Answers carry what the CLI prints with `--json` (`changes` for status, with the human
//! `lines` too; `diff` for diff; `hunks` and `text` for hunks;
//! nothing more for `feedback`, which appends the reviewer's decision to
//! `DIR/feedback.jsonl`; `checkpoint`, `checkpoints`, `rewound_to`; `lines` and
//! `refused` for apply and discard).
//!
//! `status`, `diff` and `log` only read. `checkpoint`, `rewind`, `apply` and `discard`
//! change the layer stack under the live overlay, so they run through [`Live::swap`]: the
//! daemon holds new requests at the door, waits for those in flight, makes the change,
//! serves a new overlay built from DIR as it is then, and takes back the kernel's caches,
//! so every process sees the new merged view at once.
//!
//! A request is decoded once into an [`Op`] (an unknown op refused there) and answered
//! by its variant; the engine's [`StageError`] becomes the answer's text only here.
//!
//! Invariants: an error is an answer (`ok:false`), never a panic or a dropped connection;
//! whatever a change did, the daemon serves DIR's state afterwards (an interrupted change
//! is finished or rolled back by [`layers::recover`] first).

use super::StageError;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::Area;
use super::request::Op;
use super::session::Opts;
use super::{layers, view};
use crate::control::proto::{self, StageRequest};
use crate::control::server::Hooks;

/// The largest diff answered on the socket (an answer is one line the daemon holds until
/// the peer reads it).
const MAX_DIFF: usize = 32 << 20;

/// The diff being rendered for an answer: refuses to grow past [`MAX_DIFF`] (the staged
/// tree is the agent's: its size must not decide the daemon's memory).
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_DIFF {
            return Err(std::io::ErrorKind::FileTooLarge.into());
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The running daemon's side of a live change (implemented by `app`, which owns the
/// request gate, the inode table and the kernel caches).
pub trait Live: Send + Sync {
    /// Runs `change` with no request in flight, then serves the merged view built from
    /// DIR again and (unless `same_view`: the change keeps every path's contents, as a
    /// checkpoint does) invalidates the kernel's caches; returns `change`'s answer.
    fn swap(
        &self,
        same_view: bool,
        change: &mut dyn FnMut() -> Result<Value, StageError>,
    ) -> Result<Value, StageError>;

    /// During [`Live::swap`]'s change: the files (inodes in DIR) some handle holds open
    /// for writing, recorded with the request gate closed.
    fn writers(&self) -> std::collections::HashSet<super::seal::Key> {
        std::collections::HashSet::new()
    }
}

fn paths(ps: &[String]) -> Vec<Vec<u8>> {
    ps.iter()
        .map(|p| {
            p.trim_start_matches("./")
                .trim_end_matches('/')
                .as_bytes()
                .to_vec()
        })
        .collect()
}

/// One staging operation of this daemon at a time: the control socket's stage lane and
/// the agent's checkpoint channel (`stage/agent.rs`) both hold this while they work.
static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Holds the daemon's staging operations off until the guard is dropped.
pub fn serial() -> parking_lot::MutexGuard<'static, ()> {
    SERIAL.lock()
}

/// The answer to `r` (from a peer with `uid`) for the staging area `dir` served by this
/// daemon.
pub fn answer(dir: &Path, live: Option<&dyn Live>, r: &StageRequest, uid: u32) -> Value {
    let _one = serial();
    let res = Area::open(dir).and_then(|area| run(&area, live, Op::decode(r)?, uid));
    match res {
        Ok(v) => proto::ok(v),
        Err(e) => proto::error(&e.to_string()),
    }
}

/// The answer to `op` for a staging area no daemon serves (`fencefs review --dir`: its
/// reads; its changes take DIR's lock and go through `session`).
pub fn answer_offline(dir: &Path, op: Op, uid: u32) -> Value {
    match Area::open(dir).and_then(|area| run(&area, None, op, uid)) {
        Ok(v) => proto::ok(v),
        Err(e) => proto::error(&e.to_string()),
    }
}

fn run(area: &Area, live: Option<&dyn Live>, op: Op, uid: u32) -> Result<Value, StageError> {
    // A change of the layer stack runs through the live mount's swap (checked first).
    let live = |op: &'static str| live.ok_or(StageError::NeedsLiveMount(op));
    match op {
        Op::Status { paths: ps, since } => {
            let st = view::staged(area, since)?;
            let list = st.selected(&paths(&ps))?;
            Ok(json!({
                "changes": view::json_list(area, &st, &list, since)?,
                "lines": list.iter().map(super::render::status_line).collect::<Vec<_>>(),
            }))
        }
        Op::Diff { paths: ps, since } => diff(area, &paths(&ps), since),
        Op::Hunks { paths: ps } => hunks(area, &paths(&ps)),
        Op::Feedback {
            paths: ps,
            decision,
            hunks,
            message,
        } => {
            let p = ps.first().ok_or("feedback needs the path")?;
            let d = decision.as_deref().unwrap_or_default();
            let note = message.as_deref().unwrap_or_default();
            super::feedback::append_one(&area.dir, p, &hunks, d, note)?;
            Ok(json!({}))
        }
        Op::Log => Ok(json!({"checkpoints": layers::log(&area.dir)?})),
        Op::Checkpoint { message } => {
            let live = live("checkpoint")?;
            // Counted before the door closes (what changes meanwhile is sealed uncounted).
            let n = super::session::count_for_checkpoint(area).unwrap_or(0);
            let msg = message.unwrap_or_default();
            live.swap(true, &mut || {
                let c = layers::checkpoint(&area.dir, &msg, n)?;
                Ok(json!({"checkpoint": c}))
            })
        }
        Op::Rewind { to } => {
            let live = live("rewind")?;
            let to = to.ok_or("rewind needs `to` (the checkpoint number)")?;
            let v = live.swap(false, &mut || {
                layers::rewind(&area.dir, to)?;
                Ok(json!({"rewound_to": to}))
            });
            super::session::record_line(
                area,
                "stage-rewind",
                uid,
                &[],
                &json!({"to": to, "ok": v.is_ok()}),
            );
            let _ = layers::empty_trash(&area.dir);
            v
        }
        Op::Apply {
            paths: ps,
            force,
            at,
            note,
        } => {
            let o = Opts {
                force,
                at,
                note,
                ..Opts::default()
            };
            apply_or_discard(area, live("apply")?, "apply", &paths(&ps), o, uid)
        }
        Op::Discard { paths: ps, note } => {
            let o = Opts {
                note,
                ..Opts::default()
            };
            apply_or_discard(area, live("discard")?, "discard", &paths(&ps), o, uid)
        }
    }
}

fn apply_or_discard(
    area: &Area,
    live: &dyn Live,
    op: &str,
    ps: &[Vec<u8>],
    o: Opts,
    uid: u32,
) -> Result<Value, StageError> {
    let v = live.swap(false, &mut || {
        let mut o = o.clone();
        if op == "apply" {
            o.held = live.writers();
        }
        let report = super::session::apply_or_discard(&area.dir, op, ps, o, uid)?;
        Ok(json!({"lines": report.lines, "refused": report.refused}))
    });
    layers::empty_trash_later(&area.dir, true);
    v
}

/// `diff`: the changes of `ps` as git's diff, at most [`MAX_DIFF`] bytes.
fn diff(area: &Area, ps: &[Vec<u8>], since: Option<u64>) -> Result<Value, StageError> {
    let st = view::staged(area, since)?;
    let list = st.selected(ps)?;
    let mut out = Capped(Vec::new());
    match super::diff::write(&st.layers, &list, &mut out) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            return Err(format!(
                "the diff is over {} MiB: read it with `fencefs stage diff --dir {}`",
                MAX_DIFF >> 20,
                area.dir.display()
            )
            .into());
        }
        Err(e) => return Err(StageError::op("diff")(e)),
    }
    Ok(json!({"diff": String::from_utf8_lossy(&out.0)}))
}

/// `hunks`: the one path's numbered hunks (`hunks`, as `stage hunks --json` prints them)
/// and their text (`text`, as `stage hunks` prints it), at most [`MAX_DIFF`] bytes.
fn hunks(area: &Area, ps: &[Vec<u8>]) -> Result<Value, StageError> {
    let [p] = ps else {
        return Err("hunks takes one path".into());
    };
    let st = view::staged(area, None)?;
    let mut text = Capped(Vec::new());
    super::partial::write_list(&st.layers, p, &mut text).map_err(|e| {
        if e.io_kind() == Some(std::io::ErrorKind::FileTooLarge) {
            format!(
                "the hunks are over {} MiB: use `fencefs stage hunks --dir`",
                MAX_DIFF >> 20
            )
            .into()
        } else {
            e
        }
    })?;
    Ok(json!({
        "hunks": super::partial::list_json(&st.layers, p)?,
        "text": String::from_utf8_lossy(&text.0),
    }))
}

/// Wires staging into the control socket's hooks when the mount stages into `dir` (the
/// server runs both on its stage lane, one at a time).
pub fn hook(hooks: &mut Hooks, dir: Option<&Path>, live: Option<Arc<dyn Live>>) {
    let Some(dir) = dir.map(Path::to_path_buf) else {
        return;
    };
    let d1: PathBuf = dir.clone();
    hooks.stage = Some(Arc::new(move |r, uid| answer(&d1, live.as_deref(), r, uid)));
    hooks.staged = Some(Arc::new(move || {
        Area::open(&dir)
            .and_then(|a| {
                let st = view::staged(&a, None)?;
                Ok(st.layers.changes()?)
            })
            .map_or(Value::Null, |c| Value::from(c.len() as u64))
    }));
}
