//! The agent's checkpoint channel (`mount --checkpoint-socket PATH`; `fencefs run` sets
//! one up and names it in `$FENCEFS_CHECKPOINT`): a Unix stream socket, apart from the
//! control socket, that accepts exactly one request — `{"cmd":"checkpoint","message":…}`
//! — after a greeting line ([`HELLO`]), and answers one JSON line (SPEC "Per-turn checkpoints and the agent's feedback").
//!
//! Invariants:
//! - Nothing on it applies, discards, rewinds, approves or reads anything: every other
//!   line (another `cmd`, unknown fields, bad JSON, over [`MAX_LINE`] bytes) is answered
//!   `ok:false` with the same kind of one-line refusal, and the connection is closed.
//! - The message is its first line, control characters replaced by spaces, cut at
//!   [`MAX_MESSAGE`] bytes on a character boundary: no escape of it reaches an operator's
//!   terminal through `stage log`.
//! - At most one seal a second (a request within a second of the previous one is refused
//!   before any work); the per-area cap is `stage/agent.rs`'s.
//! - One connection at a time, each bounded by [`IO_TIMEOUT`] for reading and writing: a
//!   peer that never writes costs the channel two seconds, never a thread or memory.
//! - The socket is created 0600 (owned by the daemon's user); handing it to another uid
//!   is the operator's choice (chown/chmod, or a bind into a container).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

/// A checkpoint message is cut at this many bytes.
pub const MAX_MESSAGE: usize = 200;
/// The longest request line read.
pub const MAX_LINE: usize = 4096;
/// How long a peer may take to send its line or read the answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// At most one seal per this long.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// The environment variable `fencefs run` names the channel in (and the hook reads).
pub const ENV: &str = "FENCEFS_CHECKPOINT";

/// Seals a checkpoint with a (cleaned) message: the answer's fields, or why not.
pub type Sealer = Box<dyn Fn(&str) -> Result<Value, String> + Send>;

/// The one request the channel accepts.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    cmd: String,
    #[serde(default)]
    message: Option<String>,
}

/// A message as the channel keeps it: the first line, control characters as spaces,
/// trimmed, at most [`MAX_MESSAGE`] bytes (cut on a character boundary).
pub fn clean_message(raw: &str) -> String {
    let first = raw.lines().next().unwrap_or("");
    let mut s: String = first
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    s = s.trim().to_string();
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The message of a request line, or the refusal's text.
pub fn parse(line: &[u8]) -> Result<String, String> {
    const ONLY: &str =
        "this socket only seals checkpoints: send {\"cmd\":\"checkpoint\",\"message\":\"…\"}";
    let r: Request = serde_json::from_slice(line).map_err(|_| format!("refused: {ONLY}"))?;
    if r.cmd != "checkpoint" {
        return Err(format!(
            "refused: '{}' is not served here; {ONLY}",
            clean_message(&r.cmd)
        ));
    }
    Ok(clean_message(r.message.as_deref().unwrap_or("")))
}

/// Binds the channel at `path` (0600; a stale socket there is replaced, anything else is
/// an error), blocking.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    let l = super::server::bind(path, None)?;
    l.set_nonblocking(false)?;
    Ok(l)
}

/// Serves the channel on its own thread for the daemon's lifetime.
pub fn start(listener: UnixListener, seal: Sealer) -> io::Result<()> {
    std::thread::Builder::new()
        .name("fencefs-checkpoint".into())
        .spawn(move || serve(listener, seal))
        .map(drop)
}

fn serve(listener: UnixListener, seal: Sealer) {
    let mut last: Option<Instant> = None;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = handle(s, &seal, &mut last);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::warn!("checkpoint channel: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// The line sent on connect (as the control socket's greeting, so a control client sent
/// here by mistake gets its refusal instead of waiting).
pub const HELLO: &str = "{\"fencefs\":1,\"channel\":\"checkpoint\"}\n";

/// One connection: the greeting, one line in, one answer out.
fn handle(s: UnixStream, seal: &Sealer, last: &mut Option<Instant>) -> io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    (&s).write_all(HELLO.as_bytes())?;
    let mut line = Vec::new();
    BufReader::new((&s).take(MAX_LINE as u64 + 1)).read_until(b'\n', &mut line)?;
    let answer = if line.len() > MAX_LINE {
        json!({"ok": false, "error": format!("refused: a request is one line of at most {MAX_LINE} bytes")})
    } else {
        answer(&line, seal, last)
    };
    let mut out = serde_json::to_vec(&answer).unwrap_or_default();
    out.push(b'\n');
    (&s).write_all(&out)
}

fn answer(line: &[u8], seal: &Sealer, last: &mut Option<Instant>) -> Value {
    let msg = match parse(line.strip_suffix(b"\n").unwrap_or(line)) {
        Ok(m) => m,
        Err(e) => return json!({"ok": false, "error": e}),
    };
    if let Some(t) = last
        && t.elapsed() < MIN_INTERVAL
    {
        return json!({"ok": false, "error": "refused: at most one checkpoint a second"});
    }
    *last = Some(Instant::now());
    match seal(&msg) {
        Ok(v) => {
            log::info!("checkpoint channel: {v}");
            super::proto::ok(v)
        }
        Err(e) => json!({"ok": false, "error": e}),
    }
}

/// The client side (the hook): sends one request to the channel at `path`, returns the
/// answer (`ok:false` answers too) or why the channel could not be reached.
pub fn request(path: &Path, message: &str) -> Result<Value, String> {
    let s = super::sockpath::with(path, |p| UnixStream::connect(p))
        .map_err(|e| format!("checkpoint channel '{}': {e}", path.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .and_then(|()| s.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let mut line = serde_json::to_vec(&json!({"cmd": "checkpoint", "message": message}))
        .map_err(|e| e.to_string())?;
    line.push(b'\n');
    (&s).write_all(&line).map_err(|e| e.to_string())?;
    let mut r = BufReader::new((&s).take(1 << 16));
    let mut ans = Vec::new();
    for _ in 0..2 {
        ans.clear();
        r.read_until(b'\n', &mut ans)
            .map_err(|e| format!("checkpoint channel: {e}"))?;
        if ans != HELLO.as_bytes() {
            break;
        }
    }
    serde_json::from_slice(&ans).map_err(|_| "checkpoint channel: no answer".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_clean_line_cut_at_200_bytes() {
        assert_eq!(clean_message("fix the build\nand more"), "fix the build");
        assert_eq!(clean_message("a\u{1b}[31mred\t!"), "a [31mred !");
        let long = "é".repeat(150);
        let c = clean_message(&long);
        assert!(
            c.len() <= MAX_MESSAGE && c.len() >= MAX_MESSAGE - 1,
            "{}",
            c.len()
        );
        assert!(c.chars().all(|ch| ch == 'é'));
        assert_eq!(clean_message(""), "");
    }

    #[test]
    fn only_checkpoint_is_accepted() {
        assert_eq!(
            parse(br#"{"cmd":"checkpoint","message":"hi"}"#),
            Ok("hi".into())
        );
        assert_eq!(parse(br#"{"cmd":"checkpoint"}"#), Ok(String::new()));
        for bad in [
            &br#"{"cmd":"stage","op":"apply"}"#[..],
            br#"{"cmd":"checkpoint","message":"x","op":"apply"}"#,
            br#"{"cmd":"decide","id":1,"allow":true}"#,
            br#"{"cmd":"status"}"#,
            b"checkpoint please",
            b"",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.starts_with("refused: "), "{e}");
            assert!(e.contains("only seals checkpoints"), "{e}");
        }
    }
}
