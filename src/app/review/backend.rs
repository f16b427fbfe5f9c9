//! Where `fencefs review` gets and changes the staged state: a running mount's control
//! socket, or a staging area no daemon serves (`--dir DIR`, worked on directly with its
//! lock taken for each change). Both answer the control socket's JSON (`stage::control`),
//! so the UI has one shape of data.
//!
//! Invariants: every change carries the ids the UI showed (`PATH@ID`, `PATH#N@ID`);
//! nothing here writes to the terminal; calls are blocking (the UI runs the changing ones
//! on a worker thread).

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::control::proto::StageRequest;
use crate::stage::session::{self, Opts};

/// The staging area the UI works on.
#[derive(Clone, Debug)]
pub enum Backend {
    /// A running mount's control socket.
    Socket(PathBuf),
    /// A staging area no daemon serves.
    Dir(PathBuf),
}

fn checked(a: Value) -> Result<Value, String> {
    if a["ok"] == Value::Bool(true) {
        Ok(a)
    } else {
        Err(a["error"].as_str().unwrap_or("refused").to_string())
    }
}

impl Backend {
    /// One `{"cmd":"stage","op":op,…}` request with the fields of `fields`; the answer
    /// (`ok:false` as the error).
    pub fn stage(&self, op: &str, fields: Value) -> Result<Value, String> {
        let mut req = json!({"cmd": "stage", "op": op});
        if let (Some(r), Some(f)) = (req.as_object_mut(), fields.as_object()) {
            r.extend(f.clone());
        }
        match self {
            Backend::Socket(s) => checked(crate::control::client::call_once(s, &req)?),
            Backend::Dir(d) => {
                // The socket's `stage` command without its `cmd` tag.
                if let Some(r) = req.as_object_mut() {
                    r.remove("cmd");
                }
                let r: StageRequest =
                    serde_json::from_value(req).map_err(|e| format!("request: {e}"))?;
                match op {
                    "apply" | "discard" | "rewind" => offline_change(d, &r),
                    _ => checked(crate::stage::control::answer(d, None, &r, uid())),
                }
            }
        }
    }

    /// The staging area's directory when known (`--dir`), for messages.
    pub fn describe(&self) -> String {
        match self {
            Backend::Socket(s) => format!("mount {}", s.display()),
            Backend::Dir(d) => format!("stage {}", d.display()),
        }
    }
}

fn uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// An apply, discard or rewind on a DIR no daemon serves: its lock held meanwhile.
fn offline_change(dir: &std::path::Path, r: &StageRequest) -> Result<Value, String> {
    let area = crate::stage::Area::open(dir)?;
    area.lock()?;
    let area = session::recover(area)?;
    match r.op.as_str() {
        "rewind" => {
            let to = r.to.ok_or("rewind needs a checkpoint number")?;
            let res = crate::stage::layers::rewind(&area.dir, to);
            session::record_line(
                &area,
                "stage-rewind",
                uid(),
                &[],
                &json!({"to": to, "ok": res.is_ok()}),
            );
            res?;
            let _ = crate::stage::layers::empty_trash(&area.dir);
            Ok(json!({"rewound_to": to}))
        }
        op => {
            let ps: Vec<Vec<u8>> = r.paths.iter().map(|p| p.as_bytes().to_vec()).collect();
            let o = Opts {
                note: r.note.clone(),
                ..Opts::default()
            };
            let rep = session::apply_or_discard(&area.dir, op, &ps, o, uid())?;
            crate::stage::layers::empty_trash_later(&area.dir, false);
            Ok(json!({"lines": rep.lines, "refused": rep.refused}))
        }
    }
}
