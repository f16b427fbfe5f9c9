//! The command-line clients of the control socket: `fencefs ctl` (one command, print the
//! answer) and `fencefs approve` (an approver on a terminal, or `--auto` for scripts).

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use crate::quote;

use serde_json::{Value, json};

/// Connects to `path`, sends one command and returns its answer.
pub fn call_once(path: &Path, v: &Value) -> Result<Value, String> {
    let (mut c, _) = Client::connect(path)?;
    c.call(v)
}

/// A connection: the greeting read, lines both ways.
struct Client {
    out: UnixStream,
    lines: BufReader<UnixStream>,
}

impl Client {
    fn connect(path: &Path) -> Result<(Client, Value), String> {
        let s = super::sockpath::with(path, |p| UnixStream::connect(p))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let r = s.try_clone().map_err(|e| e.to_string())?;
        let mut c = Client {
            out: s,
            lines: BufReader::new(r),
        };
        let hello = c.recv()?;
        if hello.get("ok") == Some(&Value::Bool(false)) {
            return Err(format!(
                "{}: {}",
                path.display(),
                hello["error"].as_str().unwrap_or("refused")
            ));
        }
        Ok((c, hello))
    }

    fn send(&mut self, v: &Value) -> Result<(), String> {
        let mut b = serde_json::to_vec(v).map_err(|e| e.to_string())?;
        b.push(b'\n');
        self.out.write_all(&b).map_err(|e| e.to_string())
    }

    fn recv(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        match self.lines.read_line(&mut line) {
            Ok(0) => Err("the daemon closed the connection".into()),
            Ok(_) => serde_json::from_str(&line).map_err(|e| format!("bad line from daemon: {e}")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Sends a command and returns its answer (skipping events that arrive meanwhile).
    fn call(&mut self, v: &Value) -> Result<Value, String> {
        self.send(v)?;
        loop {
            let a = self.recv()?;
            if a.get("event").is_none() {
                return Ok(a);
            }
        }
    }
}

/// `fencefs ctl SOCKET status|reload|held|learn`; returns the exit code. The answer is printed as
/// JSON with every character a terminal would act on escaped as `\uXXXX` (still the same
/// JSON); error lines are escaped with [`quote::escape`].
pub fn ctl(path: &Path, what: &str) -> i32 {
    let run = || -> Result<i32, String> {
        let (mut c, _) = Client::connect(path)?;
        let a = c.call(&json!({ "cmd": what }))?;
        if what == "reload" {
            if a["ok"] == true {
                crate::outln!(
                    "policy reloaded: generation {}, {} rules",
                    number(&a["generation"]),
                    number(&a["rules"])
                );
                return Ok(0);
            }
            for e in a["errors"].as_array().into_iter().flatten() {
                eprintln!("{}", text(e));
            }
            if a["errors"].as_array().is_none_or(|e| e.is_empty()) {
                eprintln!(
                    "{}",
                    a["error"].as_str().map_or("reload failed".into(), text_str)
                );
            }
            return Ok(1);
        }
        if what == "learn" && a["ok"] == true {
            crate::outln!(
                "draft policy written to {}: {} rules",
                text(&a["path"]),
                number(&a["rules"])
            );
            return Ok(0);
        }
        let pretty = serde_json::to_string_pretty(&a).map_err(|e| e.to_string())?;
        crate::outln!("{}", quote::json_safe(&pretty));
        Ok(if a["ok"] == true { 0 } else { 1 })
    };
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencefs ctl: {}", quote::escape(e.as_bytes()));
            1
        }
    }
}

/// A value from the daemon shown as a word: a string quoted ([`quote::quote`]), anything
/// else as its JSON, quoted too. A word with white space in it (a space, U+00A0, U+3000…)
/// is put in double quotes as well, so that a file name or an argument cannot pass for
/// the fields after it (`x.md (needs read) uid 1000 …`) or push them out of sight.
fn word(v: &Value) -> String {
    let q = match v {
        Value::String(s) => quote::quote(s.as_bytes()).into_owned(),
        Value::Null => return "?".into(),
        v => quote::quote(v.to_string().as_bytes()).into_owned(),
    };
    if !q.starts_with('"') && q.chars().any(char::is_whitespace) {
        // Unquoted means it holds no `"` or `\`: the quotes are unambiguous.
        return format!("\"{q}\"");
    }
    q
}

/// A number from the daemon (anything else quoted like [`word`]).
fn number(v: &Value) -> String {
    match v.as_u64() {
        Some(n) => n.to_string(),
        None => word(v),
    }
}

/// A message from the daemon: escaped, not quoted.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => text_str(s),
        v => text_str(&v.to_string()),
    }
}

fn text_str(s: &str) -> String {
    quote::escape(s.as_bytes()).into_owned()
}

/// One line for a held request: every value from the event quoted, so that nothing an
/// agent puts in a file name or its argv reaches the terminal raw.
fn describe(ev: &Value) -> String {
    let paths: Vec<String> = ev["paths"]
        .as_array()
        .into_iter()
        .flatten()
        .map(word)
        .collect();
    let cmd = match ev["cmdline"].as_array() {
        Some(a) => {
            let mut s = a.iter().map(word).collect::<Vec<_>>().join(" ");
            if ev["cmdline_truncated"] == true {
                s.push_str(" […]");
            }
            s
        }
        None => "?".into(),
    };
    format!(
        "#{} {} {} (needs {}) uid {} pid {}: {}",
        number(&ev["id"]),
        word(&ev["op"]),
        paths.join(" -> "),
        word(&ev["need"]),
        number(&ev["uid"]),
        number(&ev["pid"]),
        cmd
    )
}

/// What the approver's main loop hears: the daemon (per connection) or the terminal.
enum Msg {
    /// A line from connection `n`, or why it ended.
    Daemon(u64, Result<Value, String>),
    /// A line typed (`None`: end of input).
    Key(Option<String>),
}

/// Reads the connection's lines on a thread of its own, so that the daemon is read from
/// while a person thinks (a peer that reads nothing for a minute is dropped as dead).
fn spawn_reader(mut lines: BufReader<UnixStream>, n: u64, tx: Sender<Msg>) {
    std::thread::spawn(move || {
        loop {
            let mut line = String::new();
            let m = match lines.read_line(&mut line) {
                Ok(0) => Err("the daemon closed the connection".to_string()),
                Ok(_) => {
                    serde_json::from_str(&line).map_err(|e| format!("bad line from daemon: {e}"))
                }
                Err(e) => Err(e.to_string()),
            };
            let end = m.is_err();
            if tx.send(Msg::Daemon(n, m)).is_err() || end {
                return;
            }
        }
    });
}

fn spawn_keys(tx: Sender<Msg>) {
    std::thread::spawn(move || {
        let stdin = io::stdin();
        loop {
            let mut l = String::new();
            let k = match stdin.lock().read_line(&mut l) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(l),
            };
            let end = k.is_none();
            if tx.send(Msg::Key(k)).is_err() || end {
                return;
            }
        }
    });
}

/// How one connection ended.
enum End {
    /// Input ended, or nothing is left to do: exit 0.
    Done,
    /// The connection was lost: reconnect.
    Lost(String),
}

const PROMPT: &str =
    "allow? [y]es once / [a]llow this path until reload / [A]lways (--answers) / [n]o: ";

/// One connection: subscribe, then show and answer held requests until it ends.
fn session(
    path: &Path,
    auto: Option<bool>,
    n: u64,
    tx: &Sender<Msg>,
    rx: &Receiver<Msg>,
    shown: &str,
) -> Result<End, String> {
    let (mut c, _) = Client::connect(path)?;
    let a = c.call(&json!({"cmd": "subscribe"}))?;
    if a["ok"] != true {
        return Err(a["error"]
            .as_str()
            .map_or("subscribe refused".into(), text_str));
    }
    let Client { out, lines } = c;
    spawn_reader(lines, n, tx.clone());
    let again = if n > 1 { "re" } else { "" };
    eprintln!("approver {again}connected to {shown}");
    let mut s = Screen {
        out,
        auto,
        shown,
        queue: VecDeque::new(),
        asking: None,
        awaiting: None,
    };
    loop {
        if let Err(e) = s.put_next() {
            return Ok(End::Lost(e));
        }
        let Ok(m) = rx.recv() else {
            return Ok(End::Done);
        };
        let r = match m {
            Msg::Daemon(k, _) if k != n => Ok(()), // a connection that ended before
            Msg::Daemon(_, Err(e)) => {
                if s.asking.is_some() {
                    crate::outln!();
                }
                return Ok(End::Lost(e));
            }
            Msg::Daemon(_, Ok(ev)) => {
                s.line(ev);
                Ok(())
            }
            Msg::Key(None) => return Ok(End::Done),
            Msg::Key(Some(k)) => s.key(&k),
        };
        if let Err(e) = r {
            return Ok(End::Lost(e));
        }
        io::stdout().flush().map_err(|e| e.to_string())?;
    }
}

/// What one connection of the approver shows and answers.
struct Screen<'a> {
    out: UnixStream,
    auto: Option<bool>,
    shown: &'a str,
    /// Asks not shown yet.
    queue: VecDeque<Value>,
    /// The request put to the person now.
    asking: Option<Value>,
    /// A request answered, its `decide` not yet answered.
    awaiting: Option<(Value, bool)>,
}

impl Screen<'_> {
    fn decide(&mut self, ev: Value, allow: bool, remember: &str) -> Result<(), String> {
        let v = json!({"cmd": "decide", "id": ev["id"], "allow": allow, "remember": remember});
        let mut b = serde_json::to_vec(&v).map_err(|e| e.to_string())?;
        b.push(b'\n');
        self.out.write_all(&b).map_err(|e| e.to_string())?;
        self.awaiting = Some((ev, allow));
        Ok(())
    }

    /// Shows the next queued request, if none is being asked or answered; `Err`: the
    /// connection is lost.
    fn put_next(&mut self) -> Result<(), String> {
        while self.asking.is_none() && self.awaiting.is_none() {
            let Some(ev) = self.queue.pop_front() else {
                break;
            };
            crate::outln!("{}", describe(&ev));
            match self.auto {
                Some(allow) => self.decide(ev, allow, "once")?,
                None => {
                    crate::out!("{PROMPT}");
                    self.asking = Some(ev);
                }
            }
            let _ = io::stdout().flush();
        }
        Ok(())
    }

    /// A line from the daemon.
    fn line(&mut self, ev: Value) {
        match ev["event"].as_str() {
            Some("ask") => self.queue.push_back(ev),
            Some("done") => {
                // Asked or not yet: it needs no answer any more.
                self.queue.retain(|q| q["id"] != ev["id"]);
                crate::outln!(
                    "#{} ended: {} by {}",
                    number(&ev["id"]),
                    word(&ev["decision"]),
                    word(&ev["by"])
                );
                if self.asking.is_some() {
                    crate::out!("{PROMPT}");
                }
            }
            Some("dropped") => eprintln!(
                "fencefs approve: the daemon dropped {} events this approver did not read in time; `fencefs ctl {} held` lists what is held",
                number(&ev["events"]),
                self.shown
            ),
            Some(_) => {}
            None => {
                // The answer to our decide.
                if let Some((q, allow)) = self.awaiting.take() {
                    let outcome = if ev["ok"] == true {
                        String::new()
                    } else {
                        let e = ev["error"].as_str().map_or("refused".into(), text_str);
                        format!(" — {e}")
                    };
                    let verb = if allow { "allowed" } else { "denied" };
                    crate::outln!("#{} {verb}{outcome}", number(&q["id"]));
                }
            }
        }
    }

    /// A line the person typed: it counts only for the request shown when it arrives.
    fn key(&mut self, k: &str) -> Result<(), String> {
        let Some(q) = self.asking.take() else {
            return Ok(());
        };
        let (allow, remember) = match k.trim() {
            "y" | "Y" => (true, "once"),
            "a" => (true, "path"),
            "A" => (true, "always"),
            "n" | "N" => (false, "once"),
            _ => {
                crate::out!("{PROMPT}");
                self.asking = Some(q);
                return Ok(());
            }
        };
        self.decide(q, allow, remember)
    }
}

/// Longest wait between reconnection attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long the socket may be missing before the approver gives up.
const GONE_FOR_GOOD: Duration = Duration::from_secs(10);

/// `fencefs approve SOCKET [--auto allow|deny]`: subscribes and answers every held
/// request, from the terminal (y: allow once, a: allow this path until reload, A: allow
/// for good (the daemon needs --answers), n: deny)
/// or automatically. A lost connection is said on stderr (one line) and re-made, with a
/// backoff from 0.1 s to 2 s; once the socket has been gone for 10 s (the daemon stopped
/// and removed it) it exits 0, as it does when input ends. Exit 1: the first connection
/// failed, or the daemon refused this approver.
pub fn approve(path: &Path, auto: Option<bool>) -> i32 {
    let shown = quote::quote(path.as_os_str().as_encoded_bytes()).into_owned();
    let (tx, rx) = channel();
    if auto.is_none() {
        spawn_keys(tx.clone());
    }
    let mut n = 0u64;
    let mut backoff = Duration::from_millis(100);
    let mut missing_since: Option<Instant> = None;
    loop {
        n += 1;
        match session(path, auto, n, &tx, &rx, &shown) {
            Ok(End::Done) => return 0,
            Ok(End::Lost(why)) => {
                eprintln!(
                    "fencefs approve: lost the connection to {shown}: {}; reconnecting",
                    text_str(&why)
                );
                backoff = Duration::from_millis(100);
                missing_since = None;
            }
            Err(e) if n == 1 => {
                eprintln!("fencefs approve: {}", text_str(&e));
                return 1;
            }
            Err(_) => {
                // A failed attempt to reconnect: quiet, unless the socket stays gone.
                if std::fs::symlink_metadata(path).is_err() {
                    let since = *missing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= GONE_FOR_GOOD {
                        eprintln!("fencefs approve: {shown} is gone (the daemon stopped); exiting");
                        return 0;
                    }
                } else {
                    missing_since = None;
                }
            }
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_or_argument_cannot_pass_for_the_fields_after_it() {
        let ev = json!({
            "id": 7, "op": "open", "need": "write", "uid": 1000, "pid": 42,
            "paths": ["docs/notes.md (needs read) uid 1000 pid 1: vim docs/notes.md\u{a0}\u{3000}"],
            "cmdline": ["python3", "-c", "rm -rf ~", "plain"],
        });
        assert_eq!(
            describe(&ev),
            "#7 open \"docs/notes.md (needs read) uid 1000 pid 1: vim docs/notes.md\u{a0}\u{3000}\" \
             (needs write) uid 1000 pid 42: python3 -c \"rm -rf ~\" plain"
        );
        // Quoted already (a control character): not quoted twice.
        assert_eq!(word(&json!("a b\n")), "\"a b\\n\"");
        assert_eq!(word(&json!("plain")), "plain");
    }
}
