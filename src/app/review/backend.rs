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

use crate::stage::request::Op;
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
    /// One `{"cmd":"stage",…}` request for `op`; the answer (`ok:false` as the error).
    pub fn stage(&self, op: Op) -> Result<Value, String> {
        match self {
            Backend::Socket(s) => checked(crate::control::client::call_once(s, &op.request())?),
            Backend::Dir(d) => match op {
                Op::Apply { .. } | Op::Discard { .. } | Op::Rewind { .. } => offline_change(d, op),
                op => checked(crate::stage::control::answer_offline(d, op, uid())),
            },
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
fn offline_change(dir: &std::path::Path, op: Op) -> Result<Value, String> {
    let area = crate::stage::Area::open(dir)?;
    area.lock()?;
    let area = session::recover(area)?;
    let (name, paths, note) = match op {
        Op::Rewind { to } => {
            let to = to.ok_or("rewind needs a checkpoint number")?;
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
            return Ok(json!({"rewound_to": to}));
        }
        Op::Apply { paths, note, .. } => ("apply", paths, note),
        Op::Discard { paths, note } => ("discard", paths, note),
        _ => return Err("only apply, discard and rewind change a staging area".into()),
    };
    let ps: Vec<Vec<u8>> = paths.iter().map(|p| p.as_bytes().to_vec()).collect();
    let o = Opts {
        note,
        ..Opts::default()
    };
    let rep = session::apply_or_discard(&area.dir, name, &ps, o, uid())?;
    crate::stage::layers::empty_trash_later(&area.dir, false);
    Ok(json!({"lines": rep.lines, "refused": rep.refused}))
}
