//! Approvals against a hostile agent (issue 17, findings 1, 3 and 8): terminal escapes in
//! argv and file names reach `fencefs approve` and `fencefs ctl` quoted; 1 MiB argvs neither
//! disconnect approvers nor cut `held`; a peer that never reads is dropped as dead while
//! the others are served; the last approver leaving refuses what is held at once. Real
//! mounts, real processes, the real `fencefs approve`.

mod common;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const PY: &str = "/usr/bin/python3";
const ASK: &str =
    "mode = \"danger\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\n";

impl Peer {
    /// The next `n` ask events, each id once.
    fn asks(&mut self, n: usize) -> Vec<Value> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        while out.len() < n {
            let ev = self.next(Some("ask"));
            assert!(
                seen.insert(ev["id"].as_u64().unwrap()),
                "ask twice: {}",
                ev["id"]
            );
            out.push(ev);
        }
        out
    }
}

fn mount(name: &str, extra: &[&str], env: &[(&str, &str)]) -> (Mount, PathBuf) {
    let mut b = Mount::builder(name).policy(ASK).arg("--allow-other");
    let sock = b.root().join("ctl.sock");
    let audit = b.root().join("audit.jsonl");
    b = b.arg("--control").arg(&sock).arg("--audit").arg(&audit);
    for a in extra {
        b = b.arg(*a);
    }
    for (k, v) in env {
        b = b.env(*k, *v);
    }
    mkdirp(&b.host("docs"));
    put(&b.host("docs/a.md"), b"alpha\n", 0o644);
    (b.start(), sock)
}

fn chown_docs(m: &Mount) {
    let st = Command::new("chown")
        .args(["-R", "1000:1000"])
        .arg(m.host("docs"))
        .status()
        .unwrap();
    assert!(st.success());
}

fn audit_lines(m: &Mount) -> Vec<Value> {
    std::fs::read_to_string(m.root().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn status(sock: &Path) -> Value {
    Peer::connect(sock).call(json!({"cmd": "status"}))
}

/// Forks `n` children of one python (uid 1000) whose argv carries `argv_bytes` more bytes;
/// child i opens docs/n<i> for writing (held). Prints "allowed refused total" at the end.
fn askers(m: &Mount, n: usize, argv_bytes: usize) -> Child {
    for i in 0..n {
        put(&m.host(format!("docs/n{i}")), b"", 0o666);
    }
    chown_docs(m);
    // Arguments of at most 128 KiB each (MAX_ARG_STRLEN).
    let big: Vec<String> = (0..argv_bytes.div_ceil(120_000))
        .map(|i| format!("{i}{}", "x".repeat(120_000)))
        .collect();
    Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", PY, "-c"])
        .arg(format!(
            "import os, sys, errno\n\
             kids = []\n\
             for i in range({n}):\n\
             \x20   pid = os.fork()\n\
             \x20   if pid == 0:\n\
             \x20       try:\n\
             \x20           os.close(os.open('docs/n%d' % i, os.O_WRONLY)); os._exit(0)\n\
             \x20       except OSError as e:\n\
             \x20           os._exit(e.errno)\n\
             \x20   kids.append(pid)\n\
             codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]\n\
             print(sum(c == 0 for c in codes), sum(c == errno.EACCES for c in codes), len(codes))\n"
        ))
        .args(&big)
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The "allowed refused total" line of [`askers`].
fn askers_result(mut c: Child) -> Vec<usize> {
    let mut l = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut l)
        .unwrap();
    let _ = c.wait();
    l.split_whitespace().map(|x| x.parse().unwrap()).collect()
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

/// Bytes a terminal would act on: C0 controls but `\n`, DEL, C1 controls (as UTF-8),
/// and bidi embeddings, overrides and isolates.
fn raw_controls(out: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(out);
    text.chars()
        .filter(|&c| {
            let u = c as u32;
            (u < 0x20 && c != '\n')
                || (0x7f..=0x9f).contains(&u)
                || (0x202a..=0x202e).contains(&u)
                || (0x2066..=0x2069).contains(&u)
                || u == 0x200e
                || u == 0x200f
        })
        .map(|c| format!("U+{:04X}", c as u32))
        .collect()
}

#[test]
fn terminal_escapes_in_argv_and_names_reach_approve_and_ctl_quoted() {
    let (m, sock) = mount("hostile-escapes", &[], &[]);
    // A file name that would erase the line, move up, and reverse what follows.
    let name: &[u8] = b"x\x1b[2Ky\rz\xe2\x80\xaegpj.md";
    let mut host = m.host("docs").into_os_string().into_vec();
    host.push(b'/');
    host.extend_from_slice(name);
    put(Path::new(OsStr::from_bytes(&host)), b"", 0o666);
    chown_docs(&m);
    let mut ap = Peer::subscribe(&sock);
    let code = "import os, sys\n\
                f = os.fsencode(sys.argv[1])\n\
                try:\n    os.close(os.open(b'docs/' + f, os.O_WRONLY)); print('ok')\n\
                except OSError as e:\n    print(e.errno)\n";
    let mut agent = Command::new("setpriv")
        .args([
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            PY,
            "-c",
            code,
        ])
        .arg(OsStr::from_bytes(name))
        .args([
            "\x1b[2K\x1b[1A",
            "\x1b]0;owned\x07",
            "a\rb",
            "\u{9b}31m",
            "\u{202e}txt.exe",
            "open docs/notes-draft.md\n",
        ])
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The event on the wire is JSON: the bytes as they are (serde escapes them).
    let ev = ap.next(Some("ask"));
    let shown_path = format!("docs/{}", String::from_utf8_lossy(name));
    assert_eq!(ev["paths"], json!([shown_path]));
    assert_eq!(ev["cmdline"][4], "\x1b[2K\x1b[1A");

    // `fencefs ctl held` while it is held: JSON with the controls escaped, same meaning.
    let o = Command::new(BIN)
        .arg("ctl")
        .arg(&sock)
        .arg("held")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(
        raw_controls(&o.stdout),
        Vec::<String>::new(),
        "ctl held printed raw controls"
    );
    let held: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(held["held"][0]["paths"], json!([shown_path]));
    assert_eq!(held["held"][0]["cmdline"], ev["cmdline"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(r#""\u001b[2K\u001b[1A""#), "{text}");
    assert!(text.contains(r#""\u202etxt.exe""#), "{text}");

    // `fencefs approve` on a person's input (stdin and stdout pipes) shows it quoted; the
    // person reads the prompt and answers n.
    let mut approver = Command::new(BIN)
        .arg("approve")
        .arg(&sock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut screen = approver.stdout.take().unwrap();
    let mut stdout = Vec::new();
    let mut read_until = |stdout: &mut Vec<u8>, what: &str| {
        let mut b = [0u8; 4096];
        while !String::from_utf8_lossy(stdout).contains(what) {
            let n = screen.read(&mut b).unwrap();
            assert!(n > 0, "approve ended: {}", String::from_utf8_lossy(stdout));
            stdout.extend_from_slice(&b[..n]);
        }
    };
    read_until(&mut stdout, "[n]o: ");
    approver.stdin.as_mut().unwrap().write_all(b"n\n").unwrap();
    let mut l = String::new();
    BufReader::new(agent.stdout.take().unwrap())
        .read_line(&mut l)
        .unwrap();
    let _ = agent.wait();
    assert_eq!(l.trim(), libc::EACCES.to_string(), "denied by the approver");
    assert_eq!(ap.next(Some("done"))["by"], "approver");
    read_until(&mut stdout, "denied");
    approver.kill().unwrap();
    let _ = approver.wait();
    let stdout = &stdout;
    assert_eq!(
        raw_controls(stdout),
        Vec::<String>::new(),
        "approve printed raw controls"
    );
    let shown = String::from_utf8_lossy(stdout);
    eprintln!("approve showed:\n{shown}");
    let line = shown
        .lines()
        .find(|l| l.starts_with(&format!("#{} open ", ev["id"])))
        .unwrap_or_else(|| panic!("no line for the request: {shown}"));
    let pid = ev["pid"].as_u64().unwrap();
    let want = format!(
        "#{} open \"docs/x\\033[2Ky\\rz\\342\\200\\256gpj.md\" (needs write) uid 1000 pid {pid}: \
         {PY} -c {} \"x\\033[2Ky\\rz\\342\\200\\256gpj.md\" \"\\033[2K\\033[1A\" \"\\033]0;owned\\a\" \
         \"a\\rb\" \"\\302\\23331m\" \"\\342\\200\\256txt.exe\" \"open docs/notes-draft.md\\n\"",
        ev["id"],
        fencefs_quote(code),
    );
    assert_eq!(line, want);
    assert!(shown.contains(&format!("#{} denied", ev["id"])), "{shown}");
    assert_eq!(std::fs::read(OsStr::from_bytes(&host)).unwrap(), b"");
}

/// How approve shows the python code argument: C escapes for its newlines, quoted.
fn fencefs_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[test]
fn a_thousand_held_requests_with_1_mib_argvs_reach_two_approvers_and_held_is_complete() {
    let (m, sock) = mount("hostile-argv", &[], &[]);
    let mut a1 = Peer::subscribe(&sock);
    let mut a2 = Peer::subscribe(&sock);
    let t = Instant::now();
    let forker = askers(&m, 1024, 1 << 20);
    // Every event reaches both approvers (each read in turn: neither is a slow peer).
    let mut e1 = Vec::new();
    let mut e2 = Vec::new();
    while e1.len() < 1024 || e2.len() < 1024 {
        if e1.len() < 1024 {
            e1.extend(a1.asks(1));
        }
        if e2.len() < 1024 {
            e2.extend(a2.asks(1));
        }
    }
    eprintln!(
        "1,024 asks with 1 MiB argvs to two approvers: {:?}",
        t.elapsed()
    );
    for ev in e1.iter().chain(&e2) {
        let args = ev["cmdline"].as_array().expect("a command line");
        let bytes: usize = args.iter().map(|a| a.as_str().unwrap().len()).sum();
        assert!(bytes <= 4096, "{bytes} argument bytes in an event");
        assert!(bytes > 4000, "cut at 4 KiB, not before: {bytes}");
        assert_eq!(ev["cmdline_truncated"], true);
        assert_eq!(args[0], PY);
    }
    // `held`: all 1,024 (a 4 MiB answer), each cut the same way.
    let mut st = Peer::connect(&sock);
    let held = st.call(json!({"cmd": "held"}));
    assert_eq!(held["ok"], true);
    let held = held["held"].as_array().unwrap();
    assert_eq!(held.len(), 1024);
    assert!(held.iter().all(|h| {
        h["cmdline_truncated"] == true
            && h["cmdline"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().len())
                .sum::<usize>()
                <= 4096
    }));
    // An approver that leaves and comes back is served everything held.
    drop(a2);
    let mut a3 = Peer::subscribe(&sock);
    let again = a3.asks(1024);
    let mut ids: Vec<u64> = again.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    ids.sort();
    let mut want: Vec<u64> = e1.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    want.sort();
    assert_eq!(
        ids, want,
        "the reconnected approver sees every held request"
    );
    let s = st.call(json!({"cmd": "status"}));
    assert_eq!(
        (s["held"].clone(), s["approvers"].clone()),
        (json!(1024), json!(2))
    );
    // What the daemon keeps for all this: command lines cut at 4 KiB, no per-peer queue.
    let rss = rss_kib(m.pid());
    eprintln!("daemon RSS with 1,024 held 1 MiB-argv requests and three approvers: {rss} KiB");
    assert!(rss < 128 * 1024, "daemon RSS {rss} KiB");
    assert_eq!(s["events_dropped"], 0);
    // Answer them all: allow half, deny half.
    for (i, ev) in e1.iter().enumerate() {
        a1.send(json!({"cmd": "decide", "id": ev["id"], "allow": i % 2 == 0}));
    }
    assert_eq!(askers_result(forker), vec![512, 512, 1024]);
    let s = st.call(json!({"cmd": "status"}));
    assert_eq!(
        (s["held"].clone(), s["events_dropped"].clone()),
        (json!(0), json!(0))
    );
}

#[test]
fn a_peer_that_never_reads_is_dropped_as_dead_while_others_are_served() {
    // The dead-peer clock and the event bound, shortened for the test (test-only env).
    let (mut m, sock) = mount(
        "hostile-deadpeer",
        &[],
        &[
            ("FENCEFS_CONTROL_DEAD_AFTER_MS", "8000"),
            ("FENCEFS_CONTROL_EVENT_BACKLOG", "2048"),
        ],
    );
    let mut good = Peer::subscribe(&sock);
    let bad = Peer::subscribe(&sock);
    // 600 held requests with 4 KiB command lines: ~2.6 MB of asks for each approver, far
    // more than the socket buffer holds for `bad`. Asks are sent from the table as a peer
    // reads: `good` gets every one however far behind `bad` is.
    let t = Instant::now();
    let forker = askers(&m, 600, 64 << 10);
    let first = good.asks(600);
    let s = status(&sock);
    eprintln!(
        "600 asks read by the good approver in {:?}; status {s}",
        t.elapsed()
    );
    assert_eq!(
        (s["held"].clone(), s["events_dropped"].clone()),
        (json!(600), json!(0))
    );
    // 300 answered: 300 `done` events for `bad`, past the (shortened, 2 KiB) event bound
    // behind its full socket: dropped and counted.
    for ev in &first[..300] {
        good.send(json!({"cmd": "decide", "id": ev["id"], "allow": false}));
    }
    for _ in 0..300 {
        assert_eq!(good.next(None)["ok"], true);
    }
    let counted = eventually(Duration::from_secs(10), || {
        let s = status(&sock);
        s["held"] == 300 && s["events_dropped"].as_u64().unwrap() > 200
    });
    let s = status(&sock);
    assert!(
        counted,
        "events for a peer that does not read are dropped and counted: {s}"
    );
    assert_eq!(s["approvers"], 2, "not dead yet after {:?}", t.elapsed());
    // A peer that is slow but alive gets its whole answer: `held` is never dropped.
    let mut slow = Peer::connect(&sock);
    slow.send(json!({"cmd": "held"}));
    thread::sleep(Duration::from_millis(1500));
    let h = slow.next(None);
    assert_eq!(
        h["held"].as_array().map(Vec::len),
        Some(300),
        "the whole answer"
    );
    // The peer that never reads is disconnected once it has read nothing for 8 s.
    let dropped = eventually(Duration::from_secs(30), || status(&sock)["approvers"] == 1);
    let at = t.elapsed();
    assert!(dropped, "the dead peer was never disconnected");
    eprintln!("the dead peer was disconnected after {at:?}");
    assert!(
        at >= Duration::from_millis(7900),
        "disconnected before the dead timeout: {at:?}"
    );
    // Its socket gives what was written, then end of file.
    let mut r = bad.r;
    r.get_ref()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest)
        .expect("end of file, not a timeout");
    assert!(
        rest.len() > 100_000,
        "it was sent what its socket took: {}",
        rest.len()
    );
    // Nothing was refused for it: the good approver still holds everything up.
    let s = status(&sock);
    assert_eq!(s["held"], 300, "{s}");
    // The good approver is still served: answers and events.
    let ev = good.call(json!({"cmd": "held"}));
    let ids: Vec<Value> = ev["held"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].clone())
        .collect();
    assert_eq!(ids.len(), 300);
    for id in &ids {
        good.send(json!({"cmd": "decide", "id": id, "allow": false}));
    }
    assert_eq!(askers_result(forker), vec![0, 600, 600]);
    let s = status(&sock);
    assert_eq!(
        (s["held"].clone(), s["approvers"].clone()),
        (json!(0), json!(1))
    );
    m.assert_alive("after a dead peer");
}

#[test]
fn approve_says_why_it_lost_the_connection_and_reconnects() {
    let (m, sock) = mount(
        "hostile-reconnect",
        &[],
        &[("FENCEFS_CONTROL_DEAD_AFTER_MS", "2000")],
    );
    let mut approver = Command::new(BIN)
        .arg("approve")
        .arg(&sock)
        .args(["--auto", "deny"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(
        Duration::from_secs(10),
        || status(&sock)["approvers"] == 1
    ));
    // Another approver that reads everything but answers nothing keeps the requests held
    // meanwhile.
    let keeper = Peer::subscribe(&sock);
    let _w = keeper.w;
    let mut kr = keeper.r;
    kr.get_ref().set_read_timeout(None).unwrap();
    thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = kr.read_to_end(&mut sink);
    });
    // Stopped: it reads nothing while ~1 MB waits for it, so the daemon drops it.
    let pid = approver.id() as i32;
    // SAFETY: kill(2) on our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let forker = askers(&m, 200, 64 << 10);
    let dropped = eventually(Duration::from_secs(30), || {
        status(&sock)["approvers"] == 1 && status(&sock)["held"] == 200
    });
    assert!(dropped, "the stopped approver was never dropped");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    // It notices, says so, reconnects and denies everything held.
    let t = Instant::now();
    assert_eq!(askers_result(forker), vec![0, 200, 200]);
    eprintln!("reconnected and answered 200 requests in {:?}", t.elapsed());
    approver.kill().unwrap();
    let out = approver.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let lost: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("lost the connection"))
        .collect();
    assert_eq!(lost.len(), 1, "one line per loss: {err}");
    assert!(
        lost[0].starts_with("fencefs approve: lost the connection to "),
        "{err}"
    );
    assert!(lost[0].ends_with("; reconnecting"), "{err}");
    assert!(err.contains("approver reconnected to "), "{err}");
    let by = audit_lines(&m)
        .iter()
        .filter(|l| l["decision"] == "deny" && l["by"] == "approver")
        .count();
    assert!(
        eventually(Duration::from_secs(5), || audit_lines(&m)
            .iter()
            .filter(|l| l["decision"] == "deny" && l["by"] == "approver")
            .count()
            == 200),
        "{by}"
    );
}

#[test]
fn the_last_approver_leaving_refuses_what_is_held_at_once() {
    let (m, sock) = mount("hostile-orphan", &["--ask-timeout", "60"], &[]);
    let a1 = Peer::subscribe(&sock);
    let mut a2 = Peer::subscribe(&sock);
    let forker = askers(&m, 3, 0);
    let before = snapshot(&m.root().join("src"));
    a2.asks(3);
    // One approver leaves: another is still there, nothing is refused.
    drop(a1);
    thread::sleep(Duration::from_millis(500));
    let s = status(&sock);
    assert_eq!(
        (s["held"].clone(), s["approvers"].clone()),
        (json!(3), json!(1))
    );
    // The last one leaves: everything held is refused at once, EACCES.
    let t = Instant::now();
    drop(a2);
    assert_eq!(askers_result(forker), vec![0, 3, 3]);
    let took = t.elapsed();
    eprintln!("refused {took:?} after the last approver left");
    assert!(
        took < Duration::from_secs(10),
        "waited for the 60 s timeout: {took:?}"
    );
    assert_eq!(status(&sock)["held"], 0);
    assert_host_unchanged(
        &before,
        &m.root().join("src"),
        "refused for want of an approver",
    );
    let count = || {
        audit_lines(&m)
            .iter()
            .filter(|l| l["decision"] == "deny" && l["by"] == "no-approver")
            .count()
    };
    assert!(
        eventually(Duration::from_secs(5), || count() == 3),
        "audit: {:?}",
        audit_lines(&m)
    );
    // A peer that shuts its writing side after a command still gets the answer.
    let mut p = Peer::connect(&sock);
    p.send(json!({"cmd": "held"}));
    p.w.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(p.next(None), json!({"ok": true, "held": []}));
    let mut rest = String::new();
    assert_eq!(
        p.r.read_to_string(&mut rest).unwrap(),
        0,
        "then end of file: {rest}"
    );
}
