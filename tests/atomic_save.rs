//! An atomic save is one question (SPEC.md "Approvals", issue 36). Agents save NAME by
//! creating `NAME.tmp.<random>`, writing it, setting its mode and renaming it over NAME;
//! `sed -i` and Python's `tempfile` do the same with nameless temporary files. In a
//! directory an `ask` rule puts to a person, that whole sequence asks exactly one question
//! ("save", write NAME), and an answer given after `--ask-dir-hold` (the caller was already
//! refused) still decides the edit: an allow lands the bytes the caller wrote, a deny
//! leaves NAME and the directory as they were, with no temporary file left. A flood of
//! provisional temporary files is bounded. Real mounts, real processes as uid 1000, the
//! test is the approver through the control socket; host state is checked on the host.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const PY: &str = "/usr/bin/python3";

/// uid 1000 may read docs and ask to write it.
const POLICY: &str = "mode = \"danger\"\n\
[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\nuid = [1000]\n";

const OLD: &[u8] = b"old text\n";

fn mount(name: &str, extra: &[&str]) -> (Mount, PathBuf) {
    let mut b = Mount::builder(name).policy(POLICY).arg("--allow-other");
    let sock = b.root().join("ctl.sock");
    let audit = b.root().join("audit.jsonl");
    b = b.arg("--control").arg(&sock).arg("--audit").arg(&audit);
    for a in extra {
        b = b.arg(*a);
    }
    mkdirp(&b.host("docs"));
    put(&b.host("docs/a.md"), OLD, 0o640);
    put(&b.host("docs/b.md"), b"bee\n", 0o644);
    chown_tree(&b.host("."), 1000);
    // Host permissions let uid 1000 create in docs: only the policy decides.
    std::fs::set_permissions(
        b.host("docs"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    (b.start(), sock)
}

/// `python3 -c code` as uid 1000 in the mount.
fn py(m: &Mount, code: &str) -> Child {
    Command::new("setpriv")
        .args([
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            PY,
            "-c",
            code,
        ])
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What a child printed (stdout), failing on a traceback.
#[track_caller]
fn output(c: Child) -> String {
    let o = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("Traceback") && !err.contains("Error"),
        "{err}"
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// How an agent saves `docs/a.md`: Claude Code's way (O_EXCL temporary file, write,
/// chmod, rename; on failure remove it and write in place), Qwen Code's (the same; on
/// failure remove it and give up), or one that leaves its temporary file behind.
#[derive(Clone, Copy, PartialEq)]
enum Agent {
    Claude,
    Qwen,
    Leaves,
}

fn save_script(agent: Agent, data: &str) -> String {
    let (excl, fallback, cleanup) = match agent {
        Agent::Claude => ("os.O_EXCL", "True", "True"),
        Agent::Qwen => ("os.O_TRUNC", "False", "True"),
        Agent::Leaves => ("os.O_EXCL", "False", "False"),
    };
    format!(
        "import os, errno, time\n\
         name = 'docs/a.md'\n\
         data = {data:?}.encode()\n\
         tmp = '%s.tmp.%d.%d' % (name, os.getpid(), int(time.time() * 1000))\n\
         mode = os.stat(name).st_mode & 0o7777\n\
         def word(e): return errno.errorcode[e.errno]\n\
         try:\n\
         \x20   fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | {excl}, 0o644)\n\
         \x20   os.write(fd, data)\n\
         \x20   os.fsync(fd)\n\
         \x20   os.close(fd)\n\
         \x20   os.chmod(tmp, mode)\n\
         \x20   os.rename(tmp, name)\n\
         \x20   print('atomic ok', flush=True)\n\
         except OSError as e:\n\
         \x20   print('atomic', word(e), flush=True)\n\
         \x20   if {cleanup}:\n\
         \x20       try: os.unlink(tmp)\n\
         \x20       except OSError: pass\n\
         \x20   if {fallback}:\n\
         \x20       try:\n\
         \x20           with open(name, 'wb') as f: f.write(data)\n\
         \x20           print('fallback ok', flush=True)\n\
         \x20       except OSError as e2: print('fallback', word(e2), flush=True)\n"
    )
}

/// The names in the host's docs directory, sorted.
fn host_docs(m: &Mount) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(m.host("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The ask events this subscriber got so far (a `status` round trip flushes them).
fn asks_so_far(p: &mut Peer) -> Vec<Value> {
    p.send(json!({"cmd": "status"}));
    let mut out = Vec::new();
    loop {
        let v = p.recv();
        match v.get("event").and_then(Value::as_str) {
            Some("ask") => out.push(v),
            Some(_) => {}
            None => return out,
        }
    }
}

fn decide(p: &mut Peer, id: &Value, allow: bool) {
    let a = p.call(json!({"cmd": "decide", "id": id, "allow": allow, "remember": "once"}));
    assert_eq!(a["ok"], true, "{a}");
}

fn mode_of(p: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions()) & 0o7777
}

#[test]
fn an_atomic_save_answered_in_time_is_one_question() {
    let (m, sock) = mount("save-in-time", &["--ask-timeout", "60"]);
    let mut ap = Peer::subscribe(&sock);
    for (agent, data) in [(Agent::Claude, "by claude\n"), (Agent::Qwen, "by qwen\n")] {
        let c = py(&m, &save_script(agent, data));
        let ev = ap.next(Some("ask"));
        assert_eq!(
            (&ev["op"], &ev["paths"], &ev["need"]),
            (&json!("save"), &json!(["docs/a.md"]), &json!("write")),
            "{ev}"
        );
        decide(&mut ap, &ev["id"], true);
        assert_eq!(output(c), "atomic ok\n");
        assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), data.as_bytes());
        assert_eq!(mode_of(&m.host("docs/a.md")), 0o640, "the chmod was kept");
        assert_eq!(host_docs(&m), ["a.md", "b.md"], "no temporary file left");
        assert!(asks_so_far(&mut ap).is_empty(), "exactly one question");
    }
}

/// One agent's save, the answer given 7 s after the question (past --ask-dir-hold 5 s).
/// Returns the mount, what the agent printed and the approver (still subscribed).
fn slow_answer(name: &str, agent: Agent, allow: bool) -> (Mount, String, Peer) {
    let (m, sock) = mount(name, &["--ask-dir-hold", "5", "--ask-timeout", "60"]);
    let mut ap = Peer::subscribe(&sock);
    let c = py(&m, &save_script(agent, "the edit\n"));
    let ev = ap.next(Some("ask"));
    assert_eq!((&ev["op"], &ev["retry"]), (&json!("save"), &json!(true)));
    let asked = Instant::now();
    std::thread::sleep(Duration::from_secs(7));
    let out = output(c);
    assert!(asked.elapsed() >= Duration::from_secs(7));
    decide(&mut ap, &ev["id"], allow);
    assert!(asks_so_far(&mut ap).is_empty(), "exactly one question");
    (m, out, ap)
}

#[test]
fn claude_code_save_allowed_after_the_dir_hold_lands() {
    let (m, out, mut ap) = slow_answer("save-claude-allow", Agent::Claude, true);
    // The rename was refused at 5 s; the in-place fallback is no second question.
    assert_eq!(out, "atomic EACCES\nfallback EACCES\n");
    let want = b"the edit\n";
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read(
            m.host("docs/a.md")
        )
        .is_ok_and(|b| b == want)),
        "the allowed edit landed: {:?}",
        std::fs::read(m.host("docs/a.md"))
    );
    assert_eq!(mode_of(&m.host("docs/a.md")), 0o640);
    assert_eq!(host_docs(&m), ["a.md", "b.md"]);
    // The agent's retry, with a new temporary name, passes unasked.
    let o = output(py(&m, &save_script(Agent::Claude, "retried\n")));
    assert_eq!(o, "atomic ok\n");
    assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), b"retried\n");
    assert!(asks_so_far(&mut ap).is_empty(), "the retry asked nothing");
    assert_eq!(host_docs(&m), ["a.md", "b.md"]);
}

#[test]
fn qwen_code_save_allowed_after_the_dir_hold_lands() {
    let (m, out, _ap) = slow_answer("save-qwen-allow", Agent::Qwen, true);
    assert_eq!(out, "atomic EACCES\n", "it gave up");
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read(
            m.host("docs/a.md")
        )
        .is_ok_and(|b| b == b"the edit\n")),
        "the allowed edit landed"
    );
    assert_eq!(host_docs(&m), ["a.md", "b.md"]);
    // Seen through the mount too.
    assert_eq!(std::fs::read(m.mnt("docs/a.md")).unwrap(), b"the edit\n");
}

#[test]
fn a_left_temporary_file_is_renamed_into_place_by_a_slow_allow() {
    let (m, out, _ap) = slow_answer("save-leaves-allow", Agent::Leaves, true);
    assert_eq!(out, "atomic EACCES\n");
    assert!(eventually(Duration::from_secs(5), || {
        std::fs::read(m.host("docs/a.md")).is_ok_and(|b| b == b"the edit\n")
            && host_docs(&m) == ["a.md", "b.md"]
    }));
    assert_eq!(mode_of(&m.host("docs/a.md")), 0o640);
}

#[test]
fn a_save_denied_after_the_dir_hold_leaves_the_host_untouched() {
    for (name, agent) in [
        ("save-claude-deny", Agent::Claude),
        ("save-qwen-deny", Agent::Qwen),
        ("save-leaves-deny", Agent::Leaves),
    ] {
        let (m, out, _ap) = slow_answer(name, agent, false);
        assert!(out.starts_with("atomic EACCES\n"), "{out}");
        // The daemon removes a temporary file its creator left, once the deny is in.
        assert!(
            eventually(Duration::from_secs(5), || host_docs(&m) == ["a.md", "b.md"]),
            "{name}: {:?}",
            host_docs(&m)
        );
        assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), OLD, "{name}");
        assert_eq!(mode_of(&m.host("docs/a.md")), 0o640);
        // Nothing lands later either.
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), OLD, "{name}");
    }
}

/// Starts a program in the mount.
type Start<'a> = dyn Fn() -> Child + 'a;

#[test]
fn sed_and_python_tempfile_saves_are_one_question() {
    let (m, sock) = mount("save-programs", &["--ask-timeout", "60"]);
    let mut ap = Peer::subscribe(&sock);
    let sed = || {
        Command::new("setpriv")
            .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
            .args(["sed", "-i", "s/old/sed/", "docs/a.md"])
            .current_dir(m.mnt("."))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let python = || {
        py(
            &m,
            "import os, tempfile\n\
             with tempfile.NamedTemporaryFile(dir='docs', delete=False) as f:\n\
             \x20   f.write(b'python text\\n')\n\
             os.chmod(f.name, 0o640)\n\
             os.replace(f.name, 'docs/a.md')\n\
             print('ok')\n",
        )
    };
    // One after the other: each program is started once the previous one is done.
    let scripts: [(&str, &Start, &[u8]); 2] = [
        ("sed", &sed, b"sed text\n"),
        ("python", &python, b"python text\n"),
    ];
    for (what, start, want) in scripts {
        let child = start();
        let ev = ap.next(Some("ask"));
        assert_eq!(
            (&ev["op"], &ev["paths"]),
            (&json!("save"), &json!(["docs/a.md"])),
            "{what}: {ev}"
        );
        decide(&mut ap, &ev["id"], true);
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{what}: {o:?}");
        assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), want, "{what}");
        assert_eq!(host_docs(&m), ["a.md", "b.md"], "{what}");
        assert!(
            asks_so_far(&mut ap).is_empty(),
            "{what}: exactly one question"
        );
    }
}

#[test]
fn a_flood_of_temporary_files_is_bounded() {
    // --ask-dir-hold 0: what is not provisional is asked and refused at once.
    let (m, sock) = mount(
        "save-flood",
        &["--ask-dir-hold", "0", "--ask-timeout", "60"],
    );
    let _ap = Peer::subscribe(&sock);
    let o = output(py(
        &m,
        "import os, errno\n\
         made, refused = 0, {}\n\
         for i in range(200):\n\
         \x20   try:\n\
         \x20       fd = os.open('docs/a.md.tmp.%d' % i, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n\
         \x20       os.close(fd)\n\
         \x20       made += 1\n\
         \x20   except OSError as e:\n\
         \x20       w = errno.errorcode[e.errno]\n\
         \x20       refused[w] = refused.get(w, 0) + 1\n\
         print(made, sorted(refused.items()))\n",
    ));
    assert_eq!(o, "16 [('EACCES', 184)]\n", "16 provisional files per uid");
    let temps = host_docs(&m)
        .into_iter()
        .filter(|n| n.starts_with("a.md.tmp."))
        .count();
    assert_eq!(temps, 16, "the host holds at most 16 of them");
    // And each at most 64 MiB: a write, truncate or fallocate past it is EFBIG.
    let o = output(py(
        &m,
        "import os, errno\n\
         def t(f):\n\
         \x20   try: f(); return 'ok'\n\
         \x20   except OSError as e: return errno.errorcode[e.errno]\n\
         fd = os.open('docs/a.md.tmp.0', os.O_WRONLY)\n\
         big = 64 << 20\n\
         print(t(lambda: os.pwrite(fd, b'x', 0)), t(lambda: os.pwrite(fd, b'x', big)),\n\
         \x20     t(lambda: os.ftruncate(fd, big + 1)),\n\
         \x20     t(lambda: os.truncate('docs/a.md.tmp.1', big + 1)),\n\
         \x20     t(lambda: os.posix_fallocate(fd, big, 4096)), t(lambda: os.ftruncate(fd, big)))\n",
    ));
    assert_eq!(o, "ok EFBIG EFBIG EFBIG EFBIG ok\n");
    let sizes: Vec<u64> = (0..2)
        .map(|i| {
            std::fs::metadata(m.host(format!("docs/a.md.tmp.{i}")))
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(sizes, [64 << 20, 0]);
    assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), OLD);
}

#[test]
fn a_temporary_file_never_renamed_is_removed_after_a_minute() {
    let (m, sock) = mount("save-stray", &["--ask-timeout", "60"]);
    let _ap = Peer::subscribe(&sock);
    let o = output(py(
        &m,
        "import os\n\
         fd = os.open('docs/a.md.tmp.77', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)\n\
         os.write(fd, b'abandoned\\n')\n\
         os.close(fd)\n\
         print('made')\n",
    ));
    assert_eq!(o, "made\n");
    assert_eq!(host_docs(&m), ["a.md", "a.md.tmp.77", "b.md"]);
    let t = Instant::now();
    // TEMP_TTL (60 s), swept at least every 5 s.
    assert!(
        eventually(Duration::from_secs(90), || host_docs(&m)
            == ["a.md", "b.md"]),
        "{:?}",
        host_docs(&m)
    );
    let took = t.elapsed();
    assert!(took >= Duration::from_secs(55), "removed after {took:?}");
    assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), OLD);
    // And the mount agrees.
    assert!(!m.mnt("docs/a.md.tmp.77").exists());
}
