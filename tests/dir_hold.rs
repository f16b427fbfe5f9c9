//! Held directory changes and held slots (SPEC.md "Approvals": `--ask-dir-hold`, the
//! shared 1,024 slots). A held create keeps its directory locked in the kernel, so it is
//! held at most `--ask-dir-hold`; then it fails EACCES, its question stays open, and a later
//! allow lets the retry through. Real mounts, real processes as uids 1000/1001; the test is
//! the approver, through the control socket.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const PY: &str = "/usr/bin/python3";

/// uid 1000 may read docs and ask to write it; uid 1001 may write it outright.
const POLICY: &str = "mode = \"danger\"\n\
[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\nuid = [1000]\n\
[[rule]]\npath = \"docs\"\naccess = \"write\"\nuid = [1001]\n";

fn mount(name: &str, policy: &str, extra: &[&str]) -> (Mount, PathBuf) {
    let mut b = Mount::builder(name).policy(policy).arg("--allow-other");
    let sock = b.root().join("ctl.sock");
    let audit = b.root().join("audit.jsonl");
    b = b.arg("--control").arg(&sock).arg("--audit").arg(&audit);
    for a in extra {
        b = b.arg(*a);
    }
    mkdirp(&b.host("docs"));
    for f in ["a.md", "b.md", "c.md"] {
        put(&b.host(format!("docs/{f}")), b"text\n", 0o666);
    }
    let st = Command::new("chown")
        .args(["-R", "1000:1000"])
        .arg(b.host("."))
        .status()
        .unwrap();
    assert!(st.success());
    // Host permissions let every uid create in docs: only the policy decides.
    std::fs::set_permissions(
        b.host("docs"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    (b.start(), sock)
}

/// `python3 -c code` as `uid` in the mount.
fn py_as(m: &Mount, uid: u32, code: &str) -> Child {
    Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args(["--clear-groups", PY, "-c", code])
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Python that runs `stmt` and prints `ok` or the errno's name, then the seconds the
/// statement took (measured around it alone, not the interpreter's start).
fn timed(stmt: &str) -> String {
    format!(
        "import os, errno, time\n\
         t = time.monotonic()\n\
         try:\n    {stmt}\n    r = 'ok'\n\
         except OSError as e:\n    r = errno.errorcode[e.errno]\n\
         print(r, time.monotonic() - t)\n"
    )
}

/// The result word and seconds printed by a [`timed`] child.
#[track_caller]
fn result(c: Child) -> (String, f64) {
    let o = c.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let mut w = out.split_whitespace();
    let r = w
        .next()
        .unwrap_or_else(|| panic!("no output; stderr: {}", String::from_utf8_lossy(&o.stderr)));
    (r.to_string(), w.next().unwrap().parse().unwrap())
}

fn audit_lines(m: &Mount) -> Vec<Value> {
    std::fs::read_to_string(m.root().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `(decision, by)` of every audit line for `path`, in order.
fn audit_of(m: &Mount, path: &str) -> Vec<(String, String)> {
    audit_lines(m)
        .iter()
        .filter(|l| l["path"] == path)
        .map(|l| {
            (
                l["decision"].as_str().unwrap_or("").to_string(),
                l["by"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn a_held_create_holds_its_directory_at_most_ask_dir_hold() {
    let (m, sock) = mount(
        "dirhold-bystander",
        POLICY,
        &["--ask-dir-hold", "3", "--ask-timeout", "30"],
    );
    let mut ap = Peer::subscribe(&sock);
    let create = timed("open('docs/new.txt', 'w').write('new\\n')");
    let agent = py_as(&m, 1000, &create);
    let ev = ap.next(Some("ask"));
    assert_eq!(ev["op"], "create");
    assert_eq!(ev["paths"], json!(["docs/new.txt"]));
    assert_eq!(
        (ev["uid"].clone(), ev["retry"].clone()),
        (json!(1000), json!(true))
    );

    // A bystander (uid 1001, which may write docs) lists docs, looks up a name nobody
    // looked up yet and creates a file there, while the create is held: it waits for the
    // directory at most about --ask-dir-hold (3 s), not --ask-timeout (30 s). (Bounds are
    // generous for a loaded machine; "at once" below is under half the hold.)
    let t = Instant::now();
    let o = m.sh_as(
        1001,
        "ls docs >/dev/null && stat docs/c.md >/dev/null && echo by > docs/by.txt && echo ok",
    );
    let waited = t.elapsed();
    eprintln!("bystander's ls + stat + create during a held create: {waited:?}");
    assert_eq!(o.stdout.trim(), "ok", "{}", o.stderr);
    assert!(
        waited < Duration::from_secs(10),
        "the bystander waited {waited:?} in docs"
    );
    assert_eq!(std::fs::read(m.host("docs/by.txt")).unwrap(), b"by\n");

    // The held create itself failed with EACCES after about 3 s; host untouched.
    let (r, secs) = result(agent);
    assert_eq!(r, "EACCES");
    assert!((2.8..10.0).contains(&secs), "held {secs} s");
    assert!(!m.host("docs/new.txt").exists());

    // Its question is still open, and says so.
    let mut ctl = Peer::connect(&sock);
    let held = ctl.call(json!({"cmd": "held"}));
    assert_eq!(held["held"].as_array().map(Vec::len), Some(1), "{held}");
    assert_eq!(held["held"][0]["id"], ev["id"]);
    assert_eq!(held["held"][0]["retry"], true);

    // Meanwhile uid 1000's retry, and another change of its in docs, fail at once, unasked.
    for stmt in [
        "open('docs/new.txt', 'w')",
        "os.mkdir('docs/sub')",
        "os.unlink('docs/b.md')",
    ] {
        let (r, secs) = result(py_as(&m, 1000, &timed(stmt)));
        assert_eq!(r, "EACCES", "{stmt}");
        assert!(secs < 1.5, "{stmt} waited {secs} s");
    }
    assert!(!m.host("docs/sub").exists() && m.host("docs/b.md").exists());
    assert_eq!(
        ctl.call(json!({"cmd": "held"}))["held"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "no new question"
    );

    // The approver allows it later (once): the retry succeeds without a second question.
    let a = ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true, "remember": "once"}));
    assert_eq!(a["ok"], true, "{a}");
    let (r, secs) = result(py_as(&m, 1000, &create));
    assert_eq!(r, "ok");
    assert!(secs < 1.5, "the retry waited {secs} s");
    assert_eq!(std::fs::read(m.host("docs/new.txt")).unwrap(), b"new\n");
    // Only that path: another create in docs is asked (and, unanswered, refused again).
    let other = py_as(&m, 1000, &timed("open('docs/other.txt', 'w')"));
    let ev2 = ap.next(Some("ask"));
    assert_eq!(ev2["paths"], json!(["docs/other.txt"]));
    assert_eq!(result(other).0, "EACCES");

    // The audit tells the whole story of docs/new.txt (refusals reach the file through
    // the coalescer, a little later: compared as a set).
    let mut want = [
        ("ask", "rule"),
        ("deny", "dir-hold"),
        ("deny", "dir-pending"),
        ("allow", "approver"),
        ("allow", "remembered"),
    ];
    let story = || audit_of(&m, "docs/new.txt");
    eventually(Duration::from_secs(5), || story().len() >= want.len());
    let got = story();
    let mut got: Vec<(&str, &str)> = got.iter().map(|(d, b)| (d.as_str(), b.as_str())).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(
        audit_of(&m, "docs/sub"),
        vec![("deny".to_string(), "dir-pending".to_string())]
    );
}

#[test]
fn with_ask_dir_hold_0_directory_changes_are_never_held() {
    let (m, sock) = mount(
        "dirhold-zero",
        POLICY,
        &["--ask-dir-hold", "0", "--ask-timeout", "30"],
    );
    let mut ap = Peer::subscribe(&sock);
    let before = snapshot(&m.root().join("src"));
    // A rename in docs: refused at once, its question posted (naming both paths).
    let rename = timed("os.rename('docs/a.md', 'docs/renamed.md')");
    let (r, secs) = result(py_as(&m, 1000, &rename));
    assert_eq!(r, "EACCES");
    assert!(secs < 1.5, "the rename waited {secs} s");
    assert_host_unchanged(&before, &m.root().join("src"), "refused rename");
    let ev = ap.next(Some("ask"));
    assert_eq!(ev["op"], "rename");
    assert_eq!(ev["paths"], json!(["docs/a.md", "docs/renamed.md"]));
    assert_eq!(ev["retry"], true);

    // A write to an existing file is still held until the approver answers.
    let write = py_as(
        &m,
        1000,
        &timed("f = os.open('docs/c.md', os.O_WRONLY | os.O_TRUNC); os.write(f, b'w\\n')"),
    );
    let w = ap.next(Some("ask"));
    assert_eq!(
        (w["op"].clone(), w["retry"].clone()),
        (json!("open"), json!(false))
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        ap.call(json!({"cmd": "decide", "id": w["id"], "allow": true}))["ok"],
        true
    );
    let (r, secs) = result(write);
    assert_eq!(r, "ok");
    assert!(secs >= 2.4, "the write was held {secs} s");
    assert_eq!(std::fs::read(m.host("docs/c.md")).unwrap(), b"w\n");

    // The posted rename, allowed later: the retry goes through, unasked.
    assert_eq!(
        ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true}))["ok"],
        true
    );
    assert_eq!(result(py_as(&m, 1000, &rename)).0, "ok");
    assert!(m.host("docs/renamed.md").exists() && !m.host("docs/a.md").exists());
    let mut ctl = Peer::connect(&sock);
    assert_eq!(ctl.call(json!({"cmd": "status"}))["held"], 0);
}

#[test]
fn two_uids_share_the_held_slots() {
    let policy =
        "mode = \"danger\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\n";
    let (m, sock) = mount("dirhold-slots", policy, &[]);
    for i in 0..1024 {
        put(&m.host(format!("docs/n{i}")), b"", 0o666);
    }
    let mut ap = Peer::subscribe(&sock);
    // uid 1000 fills all 1,024 slots with held opens (one process each).
    let mut forker = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", PY, "-c"])
        .arg(
            "import os, errno\n\
             kids = []\n\
             for i in range(1024):\n\
             \x20   pid = os.fork()\n\
             \x20   if pid == 0:\n\
             \x20       try:\n\
             \x20           os.close(os.open('docs/n%d' % i, os.O_WRONLY)); os._exit(0)\n\
             \x20       except OSError as e:\n\
             \x20           os._exit(e.errno)\n\
             \x20   kids.append(pid)\n\
             codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]\n\
             print(sum(c == 0 for c in codes), sum(c == errno.EACCES for c in codes))\n",
        )
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut asks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while asks.len() < 1024 && Instant::now() < deadline {
        asks.push(ap.next(Some("ask")));
    }
    assert_eq!(asks.len(), 1024);
    let mut ctl = Peer::connect(&sock);
    assert_eq!(ctl.call(json!({"cmd": "status"}))["held"], 1024);

    // uid 1001 asks: it is held, and uid 1000's longest-held request is refused for it.
    let other = py_as(
        &m,
        1001,
        &timed("f = os.open('docs/a.md', os.O_WRONLY | os.O_TRUNC); os.write(f, b'1001\\n')"),
    );
    // Asks are sent from the held table and done events from a queue: either may come
    // first.
    let (mut done, mut ev) = (None, None);
    while done.is_none() || ev.is_none() {
        let v = ap.recv();
        match v.get("event").and_then(Value::as_str) {
            Some("done") if done.is_none() => done = Some(v),
            Some("ask") if ev.is_none() => ev = Some(v),
            _ => {}
        }
    }
    let (done, ev) = (done.unwrap(), ev.unwrap());
    assert_eq!(
        (
            done["id"].clone(),
            done["by"].clone(),
            done["decision"].clone()
        ),
        (asks[0]["id"].clone(), json!("held-limit"), json!("deny"))
    );
    assert_eq!(
        (ev["uid"].clone(), ev["paths"].clone()),
        (json!(1001), json!(["docs/a.md"]))
    );
    let held = ctl.call(json!({"cmd": "held"}));
    let held = held["held"].as_array().unwrap();
    assert_eq!(held.len(), 1024);
    assert_eq!(held.iter().filter(|h| h["uid"] == 1001).count(), 1);
    assert!(!held.iter().any(|h| h["id"] == asks[0]["id"]));
    assert_eq!(
        ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true}))["ok"],
        true
    );
    assert_eq!(result(other).0, "ok");
    assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), b"1001\n");

    // Refuse the rest: every one of uid 1000's children got EACCES, the first of them
    // (refused to make room) audited by held-limit.
    for a in &asks[1..] {
        ap.send(json!({"cmd": "decide", "id": a["id"], "allow": false}));
    }
    let out = {
        let o = forker.stdout.take().unwrap();
        let mut l = String::new();
        BufReader::new(o).read_line(&mut l).unwrap();
        l
    };
    let _ = forker.wait();
    assert_eq!(out.trim(), "0 1024", "allowed, refused");
    let first = asks[0]["paths"][0].as_str().unwrap().to_string();
    let refused_for_room = || {
        audit_lines(&m)
            .iter()
            .filter(|l| l["by"] == "held-limit")
            .map(|l| l["path"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    eventually(Duration::from_secs(5), || !refused_for_room().is_empty());
    assert_eq!(refused_for_room(), vec![first]);
}

#[test]
fn a_held_chmod_or_setxattr_of_a_directory_holds_it_at_most_ask_dir_hold() {
    // chmod, utimes and setxattr of a directory keep that directory's own lock in the
    // kernel while they wait (notify_change, vfs_setxattr), like a create keeps its
    // parent's: another user's `ls docs` and create in docs wait for it. Held at most
    // --ask-dir-hold, then EACCES; the same uid's retry is refused at once.
    let (m, sock) = mount(
        "dirhold-setattr",
        POLICY,
        &["--ask-dir-hold", "3", "--ask-timeout", "30"],
    );
    let mut ap = Peer::subscribe(&sock);
    for (op, stmt) in [
        ("setattr", "os.chmod('docs', 0o775)"),
        ("setxattr", "os.setxattr('docs', 'user.x', b'1')"),
    ] {
        let agent = py_as(&m, 1000, &timed(stmt));
        let ev = ap.next(Some("ask"));
        assert_eq!(
            (ev["op"].as_str(), ev["paths"].clone()),
            (Some(op), json!(["docs"]))
        );
        let t = Instant::now();
        let o = m.sh_as(
            1001,
            "ls docs >/dev/null && echo by > docs/by.txt && echo ok",
        );
        let waited = t.elapsed();
        eprintln!("bystander's ls + create during a held {op} of docs: {waited:?}");
        assert_eq!(o.stdout.trim(), "ok", "{}", o.stderr);
        assert!(
            waited < Duration::from_secs(10),
            "the bystander waited {waited:?} in docs behind a held {op}"
        );
        let (r, secs) = result(agent);
        assert_eq!(r, "EACCES", "{op}");
        assert!((2.8..10.0).contains(&secs), "{op} held {secs} s");
        // The retry fails at once, unasked, while the question is open.
        let (r, secs) = result(py_as(&m, 1000, &timed(stmt)));
        assert_eq!(r, "EACCES", "{op} retry");
        assert!(secs < 1.5, "{op} retry waited {secs} s");
        let d = ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": false}));
        assert_eq!(d["ok"], true, "{d}");
        std::fs::remove_file(m.host("docs/by.txt")).unwrap();
        // Let the directory's rest (a window ran out) pass before the next round.
        std::thread::sleep(Duration::from_secs(7));
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(m.host("docs"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o777,
        "host untouched"
    );
    assert!(xattr_absent(&m.host("docs")));
}

/// Whether `p` has no `user.x` attribute on the host.
fn xattr_absent(p: &Path) -> bool {
    let o = Command::new(PY)
        .args(["-c", "import os, sys; os.getxattr(sys.argv[1], 'user.x')"])
        .arg(p)
        .output()
        .unwrap();
    !o.status.success()
}
