//! The agent's checkpoint channel (`mount --checkpoint-socket`, `fencefs checkpoint-hook`,
//! `fencefs hooks`), on real staged mounts: the hook run as an agent runs it (its documented
//! JSON on stdin) seals a checkpoint named after the prompt's first line; 10,000 calls are
//! bounded by the rate and the per-area cap; every other command is refused; `hooks
//! install` keeps every other setting and leaves a backup; `fencefs run` hands the channel
//! to COMMAND in $FENCEFS_CHECKPOINT.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::stage::*;
use common::*;
use serde_json::{Value, json};

/// A staged mount with a control socket and a checkpoint channel: (mount, DIR, channel).
fn channel_mount(name: &str) -> (Mount, PathBuf, PathBuf) {
    let b = Mount::builder(name).policy(WRITE);
    sample(&b.host(""));
    let dir = stage_dir(&b);
    let chan = b.root().join("ckpt.sock");
    let m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--checkpoint-socket")
        .arg(&chan)
        .start();
    (m, dir, chan)
}

/// `fencefs checkpoint-hook [ARGS]` with `event` on stdin and $FENCEFS_CHECKPOINT set.
fn hook(chan: &Path, args: &[&str], event: &str) -> Out {
    let mut c = Command::new(BIN);
    c.arg("checkpoint-hook")
        .args(args)
        .env("FENCEFS_CHECKPOINT", chan)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn the hook");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(event.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap().into()
}

/// The staging area's checkpoint log (`stage log --json`).
fn log(dir: &Path) -> Vec<Value> {
    let o = offline(dir, "log", &["--json"]);
    o.assert_ok("stage log");
    serde_json::from_str::<Value>(&o.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// One raw line to the channel; its answer.
fn send(chan: &Path, line: &[u8]) -> Value {
    let mut s = UnixStream::connect(chan).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(line).unwrap();
    let mut r = BufReader::new(&s);
    let mut ans = String::new();
    r.read_line(&mut ans).unwrap();
    assert_eq!(ans, "{\"fencefs\":1,\"channel\":\"checkpoint\"}\n");
    ans.clear();
    r.read_line(&mut ans).unwrap();
    serde_json::from_str(&ans).unwrap_or_else(|e| panic!("{e}: {ans:?}"))
}

fn claude_event(prompt: &str) -> String {
    json!({
        "session_id": "abc123",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": "/work",
        "hook_event_name": "UserPromptSubmit",
        "prompt": prompt,
    })
    .to_string()
}

#[test]
fn the_hook_seals_a_checkpoint_named_after_the_prompts_first_line() {
    let (m, dir, chan) = channel_mount("ckpt-hook");
    assert_eq!(
        fs::metadata(&chan).unwrap().permissions().mode() & 0o777,
        0o600
    );
    fs::write(m.mnt("a.txt"), b"changed\n").unwrap();
    let o = hook(
        &chan,
        &[],
        &claude_event("Fix the parser\nand then the docs"),
    );
    o.assert_ok("hook");
    assert_eq!(o.stdout, "", "nothing reaches the agent's context");
    assert_eq!(o.stderr, "");
    let l = log(&dir);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["message"], "Fix the parser");
    assert_eq!(l[0]["changes"], 1);
    // Within the second: refused with one line, exit 0 (the agent never fails for it).
    fs::write(m.mnt("new.txt"), b"n\n").unwrap();
    let o = hook(&chan, &[], &claude_event("again"));
    o.assert_ok("hook within a second");
    assert_eq!(
        o.stderr,
        "fencefs: no checkpoint: refused: at most one checkpoint a second\n"
    );
    assert_eq!(log(&dir).len(), 1);
    // Gemini's BeforeAgent: `{}` on stdout; a 300-byte first line cut at 200 bytes, an
    // escape character replaced.
    std::thread::sleep(Duration::from_millis(1100));
    let long = format!("\u{1b}[31m{}", "é".repeat(150));
    let o = hook(
        &chan,
        &["--agent", "gemini"],
        &json!({"hook_event_name": "BeforeAgent", "prompt": long}).to_string(),
    );
    o.assert_ok("gemini hook");
    assert_eq!(o.stdout, "{}\n");
    assert_eq!(o.stderr, "");
    let l = log(&dir);
    assert_eq!(l.len(), 2, "{l:?}");
    let msg = l[1]["message"].as_str().unwrap();
    assert!(msg.len() <= 200 && msg.len() >= 198, "{} bytes", msg.len());
    assert!(
        msg.starts_with(" [31mé") || msg.starts_with("[31mé"),
        "{msg:?}"
    );
    assert!(!msg.contains('\u{1b}'));
    // A turn that changed nothing seals nothing (no layer spent on it).
    std::thread::sleep(Duration::from_millis(1100));
    let a = send(
        &chan,
        b"{\"cmd\":\"checkpoint\",\"message\":\"idle turn\"}\n",
    );
    assert_eq!(a, json!({"ok": true, "checkpoint": 2, "sealed": false}));
    assert_eq!(log(&dir).len(), 2);
    // `--since` of the last checkpoint is the last turn.
    fs::write(m.mnt("sub/b.txt"), b"turn 3\n").unwrap();
    let st = offline(&dir, "status", &["--since", "2"]);
    assert_eq!(st.stdout, "M sub/b.txt\n", "{}", st.stderr);
    // Not fenced (no $FENCEFS_CHECKPOINT): the hook does nothing, quietly.
    let o = run_bounded(
        {
            let mut c = Command::new(BIN);
            c.arg("checkpoint-hook")
                .env_remove("FENCEFS_CHECKPOINT")
                .stdin(Stdio::null());
            c
        },
        Duration::from_secs(10),
        "hook outside a fence",
    );
    o.assert_ok("hook outside a fence");
    assert_eq!((o.stdout.as_str(), o.stderr.as_str()), ("", ""));
    drop(m);
}

#[test]
fn ten_thousand_calls_are_bounded_by_the_rate_and_the_cap() {
    let (m, dir, chan) = channel_mount("ckpt-bound");
    let started = Instant::now();
    let (mut sealed, mut rate) = (0, 0);
    for i in 0..10_000 {
        if i % 500 == 0 {
            fs::write(m.mnt(format!("f{i}")), b"x").unwrap();
        }
        let a = send(
            &chan,
            format!("{{\"cmd\":\"checkpoint\",\"message\":\"call {i}\"}}\n").as_bytes(),
        );
        match a["ok"].as_bool() {
            Some(true) => sealed += 1,
            _ => {
                assert_eq!(
                    a["error"], "refused: at most one checkpoint a second",
                    "{a}"
                );
                rate += 1;
            }
        }
    }
    let secs = started.elapsed().as_secs() + 1;
    assert!(sealed as u64 <= secs, "{sealed} seals in {secs} s");
    assert_eq!(sealed + rate, 10_000);
    let n = log(&dir).len();
    assert!(n as u64 <= secs && n >= 1, "{n} checkpoints in {secs} s");
    // The cap: a staging area whose log already holds 999 checkpoints takes one more,
    // then every request is refused and the log stays at 1,000.
    let path = dir.join("checkpoints.json");
    let mut l: Vec<Value> = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    // Ended checkpoints of earlier turns (an apply or discard ended them), numbered apart.
    let mut old: Vec<Value> = (0..999 - l.len() as u64)
        .map(|k| json!({"n": 100_000 + k, "ts": "2026-01-01T00:00:00Z", "message": format!("old {k}"), "changes": 0, "ended": true}))
        .collect();
    old.append(&mut l);
    fs::write(&path, serde_json::to_string(&old).unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    fs::write(m.mnt("last"), b"x").unwrap();
    let a = send(
        &chan,
        b"{\"cmd\":\"checkpoint\",\"message\":\"the 1000th\"}\n",
    );
    assert_eq!(a["ok"], true, "{a}");
    assert_eq!(log(&dir).len(), 1000);
    fs::write(m.mnt("past"), b"x").unwrap();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1100));
        let o = hook(&chan, &[], &claude_event("one too many"));
        o.assert_ok("hook past the cap");
        assert!(
            o.stderr.starts_with(
                "fencefs: no checkpoint: refused: this staging area holds 1000 checkpoints"
            ),
            "{}",
            o.stderr
        );
    }
    assert_eq!(log(&dir).len(), 1000);
    drop(m);
}

#[test]
fn the_channel_refuses_every_other_command() {
    let (m, dir, chan) = channel_mount("ckpt-refuse");
    fs::write(m.mnt("a.txt"), b"staged\n").unwrap();
    let before = offline(&dir, "status", &[]).stdout;
    assert_eq!(before, "M a.txt\n", "{before}");
    let mut long = b"{\"cmd\":\"checkpoint\",\"message\":\"".to_vec();
    long.extend(std::iter::repeat_n(b'x', 5000));
    long.extend(b"\"}\n");
    for line in [
        &br#"{"cmd":"stage","op":"apply"}"#[..],
        br#"{"cmd":"stage","op":"discard","paths":["a.txt"]}"#,
        br#"{"cmd":"stage","op":"rewind","to":1}"#,
        br#"{"cmd":"stage","op":"status"}"#,
        br#"{"cmd":"stage","op":"diff"}"#,
        br#"{"cmd":"stage","op":"log"}"#,
        br#"{"cmd":"status"}"#,
        br#"{"cmd":"reload"}"#,
        br#"{"cmd":"held"}"#,
        br#"{"cmd":"subscribe"}"#,
        br#"{"cmd":"decide","id":1,"allow":true,"remember":"always"}"#,
        br#"{"cmd":"learn"}"#,
        br#"{"cmd":"checkpoint","message":"x","op":"apply"}"#,
        b"checkpoint",
        b"\x00\xff",
        &long,
    ] {
        let mut l = line.to_vec();
        if !l.ends_with(b"\n") {
            l.push(b'\n');
        }
        let a = send(&chan, &l);
        assert_eq!(a["ok"], false, "{a}");
        let e = a["error"].as_str().unwrap();
        assert!(e.starts_with("refused: "), "{e}");
        assert!(
            e.contains("only seals checkpoints") || e.contains("one line of at most 4096 bytes"),
            "{e}"
        );
        assert!(!e.contains("a.txt") && !e.contains("staged"), "{e}");
    }
    // Nothing changed: the same staged changes, no checkpoint, SOURCE untouched.
    assert_eq!(offline(&dir, "status", &[]).stdout, before);
    assert!(log(&dir).is_empty());
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"one\ntwo\nthree\n");
    // A peer that never writes does not stop the next one for long.
    let idle = UnixStream::connect(&chan).unwrap();
    let t = Instant::now();
    let a = send(
        &chan,
        b"{\"cmd\":\"checkpoint\",\"message\":\"after an idle peer\"}\n",
    );
    assert_eq!(a["ok"], true, "{a}");
    assert!(t.elapsed() < Duration::from_secs(5));
    drop(idle);
    // Without --stage there is no channel to serve.
    let o = run_fencefs(
        [
            "mount",
            "--checkpoint-socket",
            "/tmp/x.sock",
            "/tmp",
            "/mnt",
        ],
        Duration::from_secs(10),
    );
    assert_eq!(o.status.code(), Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("--stage"), "{}", o.stderr);
    // Removed at exit.
    let mut m = m;
    stop(&mut m);
    assert!(!chan.exists(), "the channel's socket outlived the daemon");
}

#[test]
fn install_keeps_every_other_key_and_leaves_a_backup() {
    let w = Workspace::new("ckpt-install");
    let home = w.outside().join("home");
    let claude = home.join(".claude/settings.json");
    let original = "{\n  \"model\": \"opus\",\n  \"permissions\": {\"allow\": [\"Bash(ls)\"]},\n  \"hooks\": {\"UserPromptSubmit\": [{\"hooks\": [{\"type\": \"command\", \"command\": \"mine.sh\"}]}],\n            \"Stop\": [{\"hooks\": [{\"type\": \"command\", \"command\": \"stop.sh\"}]}]},\n  \"env\": {\"A\": \"1\"}\n}\n";
    put(&claude, original.as_bytes(), 0o640);
    let hooks = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.arg("hooks")
            .args(args)
            .env("HOME", &home)
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("CODEX_HOME");
        run_bounded(c, Duration::from_secs(10), "fencefs hooks")
    };
    // print: only prints.
    let p = hooks(&["print", "claude-code"]);
    p.assert_ok("print");
    assert!(p.stdout.contains("\"UserPromptSubmit\""), "{}", p.stdout);
    assert!(
        p.stdout.contains("checkpoint-hook --agent claude-code"),
        "{}",
        p.stdout
    );
    assert_eq!(fs::read_to_string(&claude).unwrap(), original);
    // install, twice: every other key kept, one fencefs hook, the file as it was backed up.
    for _ in 0..2 {
        hooks(&["install", "claude-code"]).assert_ok("install");
    }
    let v: Value = serde_json::from_str(&fs::read_to_string(&claude).unwrap()).unwrap();
    let orig: Value = serde_json::from_str(original).unwrap();
    for k in ["model", "permissions", "env"] {
        assert_eq!(v[k], orig[k], "{k}");
    }
    assert_eq!(v["hooks"]["Stop"], orig["hooks"]["Stop"]);
    let ev = v["hooks"]["UserPromptSubmit"].as_array().unwrap();
    assert_eq!(ev.len(), 2, "{v}");
    assert_eq!(ev[0]["hooks"][0]["command"], "mine.sh");
    let cmd = ev[1]["hooks"][0]["command"].as_str().unwrap();
    assert!(
        cmd.ends_with("checkpoint-hook --agent claude-code"),
        "{cmd}"
    );
    assert_eq!(ev[1]["hooks"][0]["type"], "command");
    assert_eq!(
        fs::metadata(&claude).unwrap().permissions().mode() & 0o777,
        0o640
    );
    let backups: Vec<PathBuf> = fs::read_dir(claude.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.to_string_lossy()
                .contains("settings.json.fencefs-backup-")
        })
        .collect();
    assert_eq!(backups.len(), 2, "{backups:?}");
    assert!(
        backups
            .iter()
            .any(|b| fs::read_to_string(b).unwrap() == original)
    );
    // Codex (hooks.json, created) and Gemini (BeforeAgent).
    hooks(&["install", "codex"]).assert_ok("codex");
    let c: Value =
        serde_json::from_str(&fs::read_to_string(home.join(".codex/hooks.json")).unwrap()).unwrap();
    assert!(
        c["hooks"]["UserPromptSubmit"][0]["hooks"][0]["command"]
            .as_str()
            .unwrap()
            .ends_with("--agent codex")
    );
    put(
        &home.join(".gemini/settings.json"),
        b"{\"theme\": \"dark\"}",
        0o644,
    );
    hooks(&["install", "gemini"]).assert_ok("gemini");
    let g: Value =
        serde_json::from_str(&fs::read_to_string(home.join(".gemini/settings.json")).unwrap())
            .unwrap();
    assert_eq!(g["theme"], "dark");
    assert!(
        g["hooks"]["BeforeAgent"][0]["hooks"][0]["command"]
            .as_str()
            .unwrap()
            .ends_with("--agent gemini")
    );
    // A settings file that is not JSON is refused and left as it is.
    put(&claude, b"{ not json", 0o644);
    let bad = hooks(&["install", "claude-code"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(bad.stderr.contains("not JSON"), "{}", bad.stderr);
    assert_eq!(fs::read(&claude).unwrap(), b"{ not json");
}

/// `fencefs run` as root, staged (the default), HOME the fixture's.
fn root_run(f: &common::run::Fixture, script: &str) -> Out {
    let mut c = Command::new(BIN);
    c.arg("run")
        .args(["--", "sh", "-c", script])
        .current_dir(f.ws())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C")
        .env("HOME", f.home())
        .env("BIN", BIN)
        .env("XDG_RUNTIME_DIR", f.w.root.join("run-root"));
    run_bounded(c, Duration::from_secs(60), "fencefs run as root")
}

#[test]
fn fencefs_run_hands_the_channel_to_command() {
    let f = common::run::Fixture::new("ckpt-run");
    let o = root_run(
        &f,
        r#"exec 2>&1; echo one > s.txt
printf '%s' '{"hook_event_name":"UserPromptSubmit","prompt":"turn one\nmore"}' | "$BIN" checkpoint-hook
test -S "$FENCEFS_CHECKPOINT" && echo channel
timeout 20 "$BIN" stage apply "$FENCEFS_CHECKPOINT" >/dev/null 2>&1 && echo applied
timeout 20 "$BIN" stage rewind "$FENCEFS_CHECKPOINT" 1 >/dev/null 2>&1 && echo rewound
timeout 20 "$BIN" ctl "$FENCEFS_CHECKPOINT" status >/dev/null 2>&1 && echo status
true"#,
    );
    o.assert_ok("run");
    assert_eq!(o.stdout, "channel\n", "{}", o.stderr);
    let state = f.home().join(".local/state/fencefs");
    let stage = fs::read_dir(&state)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("stage");
    let l = log(&stage);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["message"], "turn one");
    assert!(!f.ws().join("s.txt").exists(), "nothing applied");
}
