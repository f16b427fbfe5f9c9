//! The control protocol: JSON lines both ways, one object per line (SPEC.md, "Control
//! socket"). Pure: parsing commands and rendering answers and events.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::approvals::{Event, Held};

/// Protocol version in the greeting.
pub const VERSION: u32 = 1;
/// Longest command line accepted (bytes).
pub const MAX_LINE: usize = 64 * 1024;

/// How long an allowed answer holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Remember {
    /// This request only.
    #[default]
    Once,
    /// This uid, this path and below, until the next reload.
    Path,
}

/// A command from a peer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Command {
    /// Daemon status.
    Status,
    /// Reload the policy now; answers with the result.
    Reload,
    /// The requests held now.
    Held,
    /// Become an approver.
    Subscribe,
    /// A staging operation (`fencefs stage … SOCKET`): `op` and the CLI's arguments.
    Stage(crate::stage::control::Request),
    /// Answer a held request.
    Decide {
        /// The request's id.
        id: u64,
        /// Allow it (or refuse it).
        allow: bool,
        /// How long an allow holds.
        #[serde(default)]
        remember: Remember,
    },
}

/// Parses one line; the error is the message for `{"ok":false,"error":…}`.
pub fn parse(line: &[u8]) -> Result<Command, String> {
    serde_json::from_slice(line).map_err(|e| format!("bad command: {e}"))
}

/// `{"fencefs":1,"generation":N}`.
pub fn greeting(generation: u64) -> Value {
    json!({"fencefs": VERSION, "generation": generation})
}

/// `{"ok":false,"error":msg}`.
pub fn error(msg: &str) -> Value {
    json!({"ok": false, "error": msg})
}

/// `{"ok":true}` merged with `fields` (an object).
pub fn ok(fields: Value) -> Value {
    let mut m = match fields {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    m.insert("ok".into(), Value::Bool(true));
    Value::Object(m)
}

fn lossy(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

/// The ask event of a held request; `cmdline` from /proc (`None`: unreadable).
pub fn ask_event(h: &Held, cmdline: Option<Vec<String>>) -> Value {
    let (rule, line) = match &h.req.rule {
        Some((r, l)) => (json!(r), json!(l)),
        None => (Value::Null, Value::Null),
    };
    json!({
        "event": "ask",
        "id": h.id,
        "op": h.req.op,
        "paths": h.req.paths.iter().map(|p| lossy(p)).collect::<Vec<_>>(),
        "need": h.req.need,
        "uid": h.req.uid,
        "gid": h.req.gid,
        "pid": h.req.pid,
        "cmdline": cmdline,
        "rule": rule,
        "rule_line": line,
        "expires_in_ms": h.expires_in.as_millis() as u64,
    })
}

/// The line for an approvals event (`None` for asks: they need /proc, see [`ask_event`]).
pub fn done_event(ev: &Event) -> Option<Value> {
    match ev {
        Event::Done { id, allow, by } => Some(json!({
            "event": "done",
            "id": id,
            "decision": if *allow { "allow" } else { "deny" },
            "by": by,
        })),
        Event::Ask(_) => None,
    }
}

/// Renders a value as one line (with `\n`).
pub fn line(v: &Value) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    b.push(b'\n');
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_parse_strictly() {
        assert_eq!(parse(br#"{"cmd":"status"}"#), Ok(Command::Status));
        assert_eq!(
            parse(br#"{"cmd":"decide","id":7,"allow":true,"remember":"path"}"#),
            Ok(Command::Decide {
                id: 7,
                allow: true,
                remember: Remember::Path
            })
        );
        assert_eq!(
            parse(br#"{"cmd":"decide","id":7,"allow":false}"#),
            Ok(Command::Decide {
                id: 7,
                allow: false,
                remember: Remember::Once
            })
        );
        for bad in [
            &b"garbage"[..],
            br#"{"cmd":"rm -rf"}"#,
            br#"{"cmd":"decide","id":"x","allow":true}"#,
            br#"{"cmd":"decide","id":1,"allow":true,"remember":"forever"}"#,
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn answers_and_events_have_their_keys() {
        assert_eq!(ok(json!({"held": 2}))["ok"], true);
        assert_eq!(error("x"), json!({"ok": false, "error": "x"}));
        let d = done_event(&Event::Done {
            id: 3,
            allow: false,
            by: "timeout",
        })
        .unwrap();
        assert_eq!(
            d,
            json!({"event":"done","id":3,"decision":"deny","by":"timeout"})
        );
        assert!(line(&d).ends_with(b"\n"));
    }
}
