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
    /// Written to the daemon's `--answers` file: for good.
    Always,
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
    /// Write `--learn`'s draft now; answers where and how many rules.
    Learn,
    /// A staging operation (`fencefs stage … SOCKET`): `op` and the CLI's arguments.
    Stage(StageRequest),
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

/// Argument bytes of a command line carried in an event (SPEC.md: 4 KiB): the NUL-separated
/// `/proc/PID/cmdline`, terminators included, is cut there.
pub const MAX_CMDLINE: usize = 4096;

/// A process's command line as events show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmdline {
    /// The arguments (invalid UTF-8 replaced by U+FFFD; JSON strings are UTF-8).
    pub args: Vec<String>,
    /// Whether it was cut at [`MAX_CMDLINE`] bytes.
    pub truncated: bool,
}

impl Cmdline {
    /// From the first bytes of `/proc/PID/cmdline`: `raw` holds at most [`MAX_CMDLINE`] + 1
    /// of them (one more than is kept tells that it is longer). `None` for an empty file (a
    /// kernel thread or a zombie).
    pub fn parse(raw: &[u8]) -> Option<Cmdline> {
        if raw.is_empty() {
            return None;
        }
        let truncated = raw.len() > MAX_CMDLINE;
        let mut raw = &raw[..raw.len().min(MAX_CMDLINE)];
        if truncated {
            raw = &raw[..raw.len() - partial_char(raw)];
        }
        // The last argument's terminator ends the list; empty arguments inside it stay.
        let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
        Some(Cmdline {
            args: raw
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
            truncated,
        })
    }
}

/// How many bytes at the end of `b` are the start of a UTF-8 character cut short (0–3):
/// a cut there would become U+FFFD (3 bytes) instead of being dropped.
fn partial_char(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let x = b[b.len() - back];
        if x & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the lead
        }
        let want = match x {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0, // ASCII or not a lead byte at all: nothing to drop
        };
        return if back < want { back } else { 0 };
    }
    0
}

/// The ask event of a held request; `cmdline` from /proc (`None`: unreadable).
pub fn ask_event(h: &Held, cmdline: Option<Cmdline>) -> Value {
    let (rule, line) = match &h.req.rule {
        Some((r, l)) => (json!(r), json!(l)),
        None => (Value::Null, Value::Null),
    };
    let truncated = cmdline.as_ref().is_some_and(|c| c.truncated);
    let mut ev = json!({
        "event": "ask",
        "id": h.id,
        "op": h.req.op,
        "paths": h.req.paths.iter().map(|p| lossy(p)).collect::<Vec<_>>(),
        "need": h.req.need,
        "uid": h.req.uid,
        "gid": h.req.gid,
        "pid": h.req.pid,
        "cmdline": cmdline.map(|c| c.args),
        "rule": rule,
        "rule_line": line,
        "expires_in_ms": h.expires_in.as_millis() as u64,
        "retry": h.req.retry,
    });
    if truncated {
        ev["cmdline_truncated"] = Value::Bool(true);
    }
    ev
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

/// One `{"cmd":"stage",…}` request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageRequest {
    /// status | diff | hunks | apply | discard | checkpoint | log | rewind | feedback
    pub op: String,
    /// The paths (workspace-relative; all when empty).
    #[serde(default)]
    pub paths: Vec<String>,
    /// `--force` (apply).
    #[serde(default)]
    pub force: bool,
    /// `--at N` (apply): only what checkpoint N sealed, never later writes.
    #[serde(default)]
    pub at: Option<u64>,
    /// `--since N` (status, diff).
    #[serde(default)]
    pub since: Option<u64>,
    /// `-m MESSAGE` (checkpoint).
    #[serde(default)]
    pub message: Option<String>,
    /// `N` (rewind).
    #[serde(default)]
    pub to: Option<u64>,
    /// `--note TEXT` (discard, apply): the reviewer's note for the agent's feedback.
    #[serde(default)]
    pub note: Option<String>,
    /// `apply` | `discard` (feedback: the reviewer's decision on `paths[0]`).
    #[serde(default)]
    pub decision: Option<String>,
    /// The hunk numbers a decision was on (feedback; empty: the whole path).
    #[serde(default)]
    pub hunks: Vec<usize>,
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
    fn cmdlines_are_cut_at_4_kib_on_a_character_boundary() {
        assert_eq!(Cmdline::parse(b""), None);
        let c = Cmdline::parse(b"sed\0-i\0\0x\0").unwrap();
        assert_eq!(
            (c.args, c.truncated),
            (
                vec!["sed".into(), "-i".into(), String::new(), "x".into()],
                false
            )
        );
        // Exactly 4 KiB with its terminator: whole.
        let mut raw = vec![b'a'; MAX_CMDLINE - 1];
        raw.push(0);
        let c = Cmdline::parse(&raw).unwrap();
        assert_eq!((c.args[0].len(), c.truncated), (MAX_CMDLINE - 1, false));
        // Longer: cut, flagged.
        let mut raw = b"python3\0".to_vec();
        raw.extend(std::iter::repeat_n(b'x', 2 * MAX_CMDLINE));
        let c = Cmdline::parse(&raw[..MAX_CMDLINE + 1]).unwrap();
        assert!(c.truncated);
        assert_eq!(
            c.args.iter().map(|a| a.len() + 1).sum::<usize>(),
            MAX_CMDLINE + 1
        );
        // A cut through a 3-byte character drops its first bytes instead of a U+FFFD.
        let mut raw = vec![b'y'; MAX_CMDLINE - 2];
        raw.extend("\u{20ac}\u{20ac}".as_bytes());
        let c = Cmdline::parse(&raw[..MAX_CMDLINE + 1]).unwrap();
        assert!(c.truncated);
        assert_eq!(c.args, vec!["y".repeat(MAX_CMDLINE - 2)]);
        let mut h = Held {
            id: 1,
            req: crate::approvals::Request {
                op: "open",
                paths: vec![b"docs/a".to_vec()],
                need: "write",
                uid: 1,
                gid: 1,
                pid: 2,
                rule: None,
                generation: 0,
                checks: vec![],
                retry: false,
            },
            expires_in: std::time::Duration::ZERO,
        };
        let ev = ask_event(&h, Some(c));
        assert_eq!(ev["cmdline_truncated"], true);
        h.id = 2;
        let ev = ask_event(&h, Cmdline::parse(b"ls\0"));
        assert!(ev.get("cmdline_truncated").is_none());
        assert_eq!(ev["cmdline"], json!(["ls"]));
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
