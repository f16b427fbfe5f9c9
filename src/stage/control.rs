//! Staging on the control socket: `{"cmd":"stage","op":…}` for a running mount, and the
//! `staged` count in `status`.
//!
//! Answers carry what the CLI prints with `--json` (`changes` for status, with the human
//! `lines` too; `diff` for diff).
//! With this increment's engine (kernel overlayfs under the daemon) the staged tree may
//! not change under a live overlay, so `apply` and `discard` are refused while the mount
//! runs, with what to do instead; checkpoint, log and rewind are not built yet.
//!
//! Invariants: read-only on DIR and SOURCE; an error is an answer (`ok:false`), never a
//! panic or a dropped connection.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::Area;
use super::cli::{json as change_json, layers, selected};
use crate::control::proto;
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

pub use crate::control::proto::StageRequest as Request;
pub use crate::control::server::StageHandler as Handler;

fn paths(r: &Request) -> Vec<Vec<u8>> {
    r.paths
        .iter()
        .map(|p| {
            p.trim_start_matches("./")
                .trim_end_matches('/')
                .as_bytes()
                .to_vec()
        })
        .collect()
}

/// The answer to `r` for the staging area `dir` (served by this daemon).
pub fn answer(dir: &Path, r: &Request) -> Value {
    match run(dir, r) {
        Ok(v) => proto::ok(v),
        Err(e) => proto::error(&e),
    }
}

fn run(dir: &Path, r: &Request) -> Result<Value, String> {
    if r.since.is_some() {
        return Err("--since needs checkpoints, which are not implemented yet".into());
    }
    let area = Area::open(dir)?;
    match r.op.as_str() {
        "status" => {
            let list = selected(&layers(&area)?, &paths(r))?;
            Ok(json!({
                "changes": list.iter().map(change_json).collect::<Vec<_>>(),
                "lines": list.iter().map(super::cli::status_line).collect::<Vec<_>>(),
            }))
        }
        "diff" => {
            let l = layers(&area)?;
            let list = selected(&l, &paths(r))?;
            let mut out = Capped(Vec::new());
            match super::diff::write(&l, &list, &mut out) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                    return Err(format!(
                        "the diff is over {} MiB: read it with `fencefs stage diff --dir {}`",
                        MAX_DIFF >> 20,
                        area.dir.display()
                    ));
                }
                Err(e) => return Err(format!("diff: {e}")),
            }
            Ok(json!({"diff": String::from_utf8_lossy(&out.0)}))
        }
        "apply" | "discard" => Err(format!(
            "{} while the mount runs is not implemented yet: stop the mount, then `fencefs stage {} --dir {}`",
            r.op,
            r.op,
            area.dir.display()
        )),
        "checkpoint" | "log" | "rewind" => Err(format!("{} is not implemented yet", r.op)),
        other => Err(format!("unknown stage op '{other}'")),
    }
}

/// Wires staging into the control socket's hooks when the mount stages into `dir`.
pub fn hook(hooks: &mut Hooks, dir: Option<&Path>) {
    let Some(dir) = dir.map(Path::to_path_buf) else {
        return;
    };
    let d1: PathBuf = dir.clone();
    hooks.stage = Some(Box::new(move |r| answer(&d1, r)));
    let status = std::mem::replace(&mut hooks.status, Box::new(|| json!({})));
    hooks.status = Box::new(move || {
        let mut v = status();
        let n = Area::open(&dir)
            .and_then(|a| layers(&a))
            .and_then(|l| l.changes().map_err(|e| e.to_string()))
            .map(|c| c.len());
        if let Value::Object(m) = &mut v {
            m.insert(
                "staged".into(),
                n.map_or(Value::Null, |n| Value::from(n as u64)),
            );
        }
        v
    });
}
