//! The command-line clients of the control socket: `fencefs ctl` (one command, print the
//! answer) and `fencefs approve` (an approver on a terminal, or `--auto` for scripts).

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

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
        let s = UnixStream::connect(path).map_err(|e| format!("{}: {e}", path.display()))?;
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

/// `fencefs ctl SOCKET status|reload|held`; returns the exit code.
pub fn ctl(path: &Path, what: &str) -> i32 {
    let run = || -> Result<i32, String> {
        let (mut c, _) = Client::connect(path)?;
        let a = c.call(&json!({ "cmd": what }))?;
        if what == "reload" {
            if a["ok"] == true {
                println!(
                    "policy reloaded: generation {}, {} rules",
                    a["generation"], a["rules"]
                );
                return Ok(0);
            }
            for e in a["errors"].as_array().into_iter().flatten() {
                eprintln!("{}", e.as_str().unwrap_or_default());
            }
            if a["errors"].as_array().is_none_or(|e| e.is_empty()) {
                eprintln!("{}", a["error"].as_str().unwrap_or("reload failed"));
            }
            return Ok(1);
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&a).map_err(|e| e.to_string())?
        );
        Ok(if a["ok"] == true { 0 } else { 1 })
    };
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencefs ctl: {e}");
            1
        }
    }
}

fn describe(ev: &Value) -> String {
    let paths: Vec<&str> = ev["paths"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let cmd = match ev["cmdline"].as_array() {
        Some(a) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" "),
        None => "?".into(),
    };
    format!(
        "#{} {} {} (needs {}) uid {} pid {}: {}",
        ev["id"],
        ev["op"].as_str().unwrap_or("?"),
        paths.join(" -> "),
        ev["need"].as_str().unwrap_or("?"),
        ev["uid"],
        ev["pid"],
        cmd
    )
}

/// Asks the terminal until it answers y, a or n; `None` at end of input.
fn ask_terminal() -> Result<Option<(bool, &'static str)>, String> {
    let stdin = io::stdin();
    loop {
        print!("allow? [y]es once / [a]llow this path until reload / [n]o: ");
        io::stdout().flush().map_err(|e| e.to_string())?;
        let mut answer = String::new();
        if stdin
            .lock()
            .read_line(&mut answer)
            .map_err(|e| e.to_string())?
            == 0
        {
            return Ok(None);
        }
        match answer.trim() {
            "y" | "Y" => return Ok(Some((true, "once"))),
            "a" | "A" => return Ok(Some((true, "path"))),
            "n" | "N" => return Ok(Some((false, "once"))),
            _ => {}
        }
    }
}

/// `fencefs approve SOCKET [--auto allow|deny]`: subscribes and answers every held
/// request, from the terminal (y: allow once, a: allow this path until reload, n: deny)
/// or automatically. Runs until the daemon goes away (exit 0) or input ends.
pub fn approve(path: &Path, auto: Option<bool>) -> i32 {
    let run = || -> Result<(), String> {
        let (mut c, _) = Client::connect(path)?;
        let a = c.call(&json!({"cmd": "subscribe"}))?;
        if a["ok"] != true {
            return Err(a["error"].as_str().unwrap_or("subscribe refused").into());
        }
        eprintln!("approver connected to {}", path.display());
        let mut queue: std::collections::VecDeque<Value> = std::collections::VecDeque::new();
        let mut ended: std::collections::HashSet<u64> = std::collections::HashSet::new();
        loop {
            let ev = match queue.pop_front() {
                Some(ev) => ev,
                None => match c.recv() {
                    Ok(ev) => ev,
                    // The daemon went away: nothing left to approve.
                    Err(_) => return Ok(()),
                },
            };
            match ev["event"].as_str() {
                Some("ask") => {}
                Some("done") => {
                    if let Some(id) = ev["id"].as_u64() {
                        ended.insert(id);
                    }
                    println!(
                        "#{} ended: {} by {}",
                        ev["id"],
                        ev["decision"].as_str().unwrap_or("?"),
                        ev["by"].as_str().unwrap_or("?")
                    );
                    continue;
                }
                _ => continue,
            }
            if ev["id"].as_u64().is_some_and(|id| ended.remove(&id)) {
                continue;
            }
            println!("{}", describe(&ev));
            let (allow, remember) = match auto {
                Some(allow) => (allow, "once"),
                None => match ask_terminal()? {
                    Some(x) => x,
                    None => return Ok(()),
                },
            };
            c.send(
                &json!({"cmd": "decide", "id": ev["id"], "allow": allow, "remember": remember}),
            )?;
            // Its answer; events that arrive first wait their turn.
            let a = loop {
                let a = c.recv()?;
                if a.get("event").is_some() {
                    queue.push_back(a);
                    continue;
                }
                break a;
            };
            let outcome = if a["ok"] == true {
                String::new()
            } else {
                format!(" — {}", a["error"].as_str().unwrap_or("refused"))
            };
            let verb = if allow { "allowed" } else { "denied" };
            println!("#{} {verb}{outcome}", ev["id"]);
            io::stdout().flush().map_err(|e| e.to_string())?;
        }
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("fencefs approve: {e}");
            1
        }
    }
}
