//! Approvals (SPEC.md "Approvals", "Control socket"): a rule's `ask` holds a request until
//! an approver on the control socket decides. Real mounts, real processes; the test is the
//! approver, through the socket, or runs `fencefs approve --auto`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const PY: &str = "/usr/bin/python3";
const ASK: &str =
    "mode = \"danger\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\n";

fn mount(name: &str, policy: &str, extra: &[&str]) -> (Mount, PathBuf) {
    let mut b = Mount::builder(name).policy(policy).arg("--allow-other");
    let sock = b.root().join("ctl.sock");
    let audit = b.root().join("audit.jsonl");
    b = b.arg("--control").arg(&sock).arg("--audit").arg(&audit);
    for a in extra {
        b = b.arg(*a);
    }
    mkdirp(&b.host("docs"));
    put(&b.host("docs/a.md"), b"alpha\n", 0o644);
    put(&b.host("docs/b.md"), b"beta\n", 0o644);
    let st = Command::new("chown")
        .args(["-R", "1000:1000"])
        .arg(b.host("."))
        .status()
        .unwrap();
    assert!(st.success());
    (b.start(), sock)
}

/// `python3 -c code` as uid 1000 in the mount; prints what the code prints.
fn agent(m: &Mount, code: &str) -> Child {
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

const WRITE_A: &str = "import os, errno\n\
try:\n    f = os.open('docs/a.md', os.O_WRONLY | os.O_TRUNC); os.write(f, b'changed\\n'); print('ok')\n\
except OSError as e:\n    print(errno.errorcode[e.errno])\n";

fn output(c: Child) -> String {
    let o = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn audit_lines(m: &Mount) -> Vec<Value> {
    std::fs::read_to_string(m.root().join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn an_approver_allows_denies_times_out_and_remembers() {
    let (m, sock) = mount("ask-basic", ASK, &["--ask-timeout", "1"]);
    let before = snapshot(&m.root().join("src"));
    // No approver connected: refused at once with the refusal it would have had.
    let t = Instant::now();
    assert_eq!(output(agent(&m, WRITE_A)), "EACCES");
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_host_unchanged(&before, &m.root().join("src"), "no approver");

    let mut ap = Peer::subscribe(&sock);
    // Deny.
    let c = agent(&m, WRITE_A);
    let ev = ap.next(Some("ask"));
    assert_eq!(ev["op"], "open");
    assert_eq!(ev["paths"], json!(["docs/a.md"]));
    assert_eq!(ev["need"], "write");
    assert_eq!(ev["uid"], 1000);
    assert_eq!(ev["rule"], "docs");
    assert!(ev["cmdline"][0].as_str().unwrap().contains("python3"));
    let a = ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": false}));
    assert_eq!(a["ok"], true);
    assert_eq!(output(c), "EACCES");
    assert_host_unchanged(&before, &m.root().join("src"), "denied write");

    // Time out (--ask-timeout 1): the approver sees `done` by timeout.
    let t = Instant::now();
    let c = agent(&m, WRITE_A);
    let ev = ap.next(Some("ask"));
    let done = ap.next(Some("done"));
    assert_eq!(done["id"], ev["id"]);
    assert_eq!(
        (done["decision"].clone(), done["by"].clone()),
        (json!("deny"), json!("timeout"))
    );
    assert_eq!(output(c), "EACCES");
    assert!(t.elapsed() >= Duration::from_millis(900));
    assert_host_unchanged(&before, &m.root().join("src"), "timed-out write");

    // Allow once: this write proceeds, the next one is asked again.
    let c = agent(&m, WRITE_A);
    let ev = ap.next(Some("ask"));
    let t = Instant::now();
    ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true, "remember": "once"}));
    assert_eq!(output(c), "ok");
    eprintln!("decide → syscall returned: {:?}", t.elapsed());
    assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), b"changed\n");
    let c = agent(&m, "open('docs/b.md', 'a').write('x')");
    let ev = ap.next(Some("ask"));
    assert_eq!(ev["paths"], json!(["docs/b.md"]));
    // Remember the directory for this uid: the rest of docs/ is allowed without asking.
    let ev2 = json!({"cmd": "decide", "id": ev["id"], "allow": true, "remember": "path"});
    ap.call(ev2);
    assert!(output(c).is_empty());
    // A new remembered ask covers only docs/b.md (the path asked), so ask once for docs.
    let c = agent(
        &m,
        "import os; os.umask(0); os.mkdir('docs/sub', 0o777); print('ok')",
    );
    let ev = ap.next(Some("ask"));
    assert_eq!(ev["op"], "mkdir");
    ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true, "remember": "path"}));
    assert_eq!(output(c), "ok");
    // Remembered: docs/sub and below go through without an ask.
    let o = m.sh_as(1000, "echo y > docs/sub/f && echo ok");
    assert_eq!(o.stdout.trim(), "ok", "{}", o.stderr);
    // ... but never for another uid (1001 is asked, and with no answer times out).
    let c = Command::new("setpriv")
        .args([
            "--reuid=1001",
            "--regid=1001",
            "--groups=1000",
            "sh",
            "-c",
            "(echo z > docs/sub/g) 2>/dev/null; echo $?",
        ])
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ev = ap.next(Some("ask"));
    assert_eq!(ev["uid"], 1001);
    ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": false}));
    assert_eq!(output(c), "2", "the shell's redirection was refused");
    // ... and not after a reload.
    m.reload();
    thread::sleep(Duration::from_millis(300));
    let c = Command::new("setpriv")
        .args([
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            "sh",
            "-c",
            "(echo w > docs/sub/h) 2>/dev/null; echo $?",
        ])
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ev = ap.next(Some("ask"));
    assert_eq!(ev["paths"], json!(["docs/sub/h"]));
    ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": false}));
    assert_eq!(output(c), "2");

    // The audit has both lines of each held request.
    let lines = audit_lines(&m);
    let held = lines.iter().filter(|l| l["decision"] == "ask").count();
    let by: Vec<&str> = lines.iter().filter_map(|l| l["by"].as_str()).collect();
    assert!(held >= 6, "{lines:#?}");
    for want in ["approver", "timeout", "no-approver", "remembered"] {
        assert!(by.contains(&want), "audit by {want}: {by:?}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l["by"] == "approver" && l["approver"] == 0)
    );
}

#[test]
fn a_thousand_held_requests_take_no_worker() {
    let (m, sock) = mount("ask-thousand", ASK, &[]);
    for i in 0..1030 {
        put(&m.host(format!("docs/n{i}")), b"", 0o666);
    }
    let mut ap = Peer::subscribe(&sock);
    // 1,030 processes each ask to open a file for writing: 1,024 are held, the rest refused
    // at once. (Opens, not creates: a held create would hold the kernel's lock on `docs`,
    // and the VFS would queue the other creates there before they reach the daemon.)
    let mut forker = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", PY, "-c"])
        .arg(
            "import os, sys, errno\n\
             kids = []\n\
             for i in range(1030):\n\
             \x20   pid = os.fork()\n\
             \x20   if pid == 0:\n\
             \x20       try:\n\
             \x20           os.close(os.open('docs/n%d' % i, os.O_WRONLY)); os._exit(0)\n\
             \x20       except OSError as e:\n\
             \x20           os._exit(e.errno)\n\
             \x20   kids.append(pid)\n\
             codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]\n\
             print(sum(c == 0 for c in codes), sum(c == errno.EACCES for c in codes), len(codes))\n",
        )
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut asks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while asks.len() < 1024 && Instant::now() < deadline {
        let ev = ap.next(Some("ask"));
        asks.push(ev["id"].clone());
    }
    assert_eq!(asks.len(), 1024, "the cap holds 1,024");
    let (mut st, _) = Peer::connect_hello(&sock);
    let s = st.call(json!({"cmd": "status"}));
    assert_eq!(s["held"], 1024);
    // Everyone else is served as fast as before: stat, ls, reads through the mount.
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        let o = m.sh("ls -la docs >/dev/null && cat docs/a.md >/dev/null && stat docs/b.md >/dev/null && echo ok");
        assert_eq!(o.stdout.trim(), "ok");
        worst = worst.max(t.elapsed());
    }
    eprintln!("while 1,024 requests are held: worst ls+cat+stat {worst:?}");
    // A blocked worker pool would stall these until the held requests time out (minutes);
    // 5 s leaves room for a loaded machine.
    assert!(
        worst < Duration::from_secs(5),
        "a blocked worker pool: {worst:?}"
    );
    // Allow half, deny half; every process ends.
    for (i, id) in asks.iter().enumerate() {
        ap.send(json!({"cmd": "decide", "id": id, "allow": i % 2 == 0}));
    }
    let out = {
        let o = forker.stdout.take().unwrap();
        let mut l = String::new();
        BufReader::new(o).read_line(&mut l).unwrap();
        l
    };
    let _ = forker.wait();
    let n: Vec<usize> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(
        n,
        vec![512, 518, 1030],
        "allowed, refused (512 denied + 6 over the cap), all"
    );
    // Every held request is audited twice (the writer thread may lag a moment).
    let counts = || {
        let lines = audit_lines(&m);
        let count = |d: &str, by: &str| {
            lines
                .iter()
                .filter(|l| l["decision"] == d && l["by"] == by)
                .count()
        };
        [
            count("ask", "rule"),
            count("allow", "approver"),
            count("deny", "approver"),
            count("deny", "held-limit"),
        ]
    };
    eventually(Duration::from_secs(5), || counts() == [1024, 512, 512, 6]);
    assert_eq!(counts(), [1024, 512, 512, 6]);
}

#[test]
fn killed_askers_reloads_races_and_bad_peers() {
    let (mut m, sock) = mount("ask-edges", ASK, &[]);
    let mut ap = Peer::subscribe(&sock);
    let mut ap2 = Peer::subscribe(&sock);
    // A killed asker: its request ends, approvers get `done` by killed.
    let mut c = agent(&m, WRITE_A);
    let ev = ap.next(Some("ask"));
    ap2.next(Some("ask"));
    c.kill().unwrap();
    let done = ap.next(Some("done"));
    assert_eq!(
        (done["id"].clone(), done["by"].clone()),
        (ev["id"].clone(), json!("killed"))
    );
    let _ = c.wait();
    let (mut st, hello) = Peer::connect_hello(&sock);
    assert_eq!(hello["fencefs"], 1);
    assert_eq!(st.call(json!({"cmd": "status"}))["held"], 0);

    // Two approvers racing: the first answer wins.
    let c = agent(&m, WRITE_A);
    let ev = ap.next(Some("ask"));
    ap2.next(Some("ask"));
    let a1 = ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true}));
    // The other approver learns it ended, and its late answer is refused.
    let d = ap2.next(Some("done"));
    assert_eq!(
        (d["decision"].clone(), d["by"].clone()),
        (json!("allow"), json!("approver"))
    );
    let a2 = ap2.call(json!({"cmd": "decide", "id": ev["id"], "allow": false}));
    assert_eq!(
        (a1["ok"].clone(), a2["ok"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(output(c), "ok");

    // A reload re-decides what is held: a rule change that allows ...
    let c = agent(&m, "open('docs/r1', 'w').write('1'); print('ok')");
    ap.next(Some("ask"));
    std::fs::write(m.policy_path(), "mode = \"danger\"\n").unwrap();
    let r = st.call(json!({"cmd": "reload"}));
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(output(c), "ok");
    assert_eq!(ap.next(Some("done"))["by"], "reload");
    // ... and one that refuses.
    std::fs::write(m.policy_path(), ASK).unwrap();
    assert_eq!(st.call(json!({"cmd": "reload"}))["ok"], true);
    let c = agent(
        &m,
        "import os\ntry:\n    open('docs/r2', 'w'); print('ok')\nexcept OSError as e: print(e.errno)",
    );
    ap.next(Some("ask"));
    std::fs::write(
        m.policy_path(),
        "mode = \"danger\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\n",
    )
    .unwrap();
    assert_eq!(st.call(json!({"cmd": "reload"}))["ok"], true);
    assert_eq!(output(c), libc::EACCES.to_string());
    assert!(!m.host("docs/r2").exists());

    // A broken policy: `ctl reload` prints file:line:column, exits 1, old policy stays.
    std::fs::write(
        m.policy_path(),
        "mode = \"danger\"\n[[rule]]\npath = \"docs\"\naccess = \"sometimes\"\n",
    )
    .unwrap();
    let o: Out = Command::new(BIN)
        .arg("ctl")
        .arg(&sock)
        .arg("reload")
        .output()
        .unwrap()
        .into();
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stderr.contains("policy.toml:4:10:"), "{}", o.stderr);
    assert_eq!(st.call(json!({"cmd": "status"}))["generation"], 3);

    // Garbage on the socket: ok:false, and the connection and the daemon survive.
    st.send_raw(b"this is not json\n");
    let g = st.next(None);
    assert_eq!(g["ok"], false);
    st.send_raw(b"{\"cmd\":\"rm -rf\"}\n");
    assert_eq!(st.next(None)["ok"], false);
    assert_eq!(st.call(json!({"cmd": "status"}))["ok"], true);

    // An unauthorised uid: the socket file is made reachable, SO_PEERCRED still refuses.
    std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let o: Out = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
        .arg(BIN)
        .arg("ctl")
        .arg(&sock)
        .arg("status")
        .output()
        .unwrap()
        .into();
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stderr.contains("not authorized"), "{}", o.stderr);

    // The daemon stopped with a request held: it is refused first, no hang.
    std::fs::write(m.policy_path(), ASK).unwrap();
    assert_eq!(st.call(json!({"cmd": "reload"}))["ok"], true);
    let c = agent(&m, WRITE_A);
    ap.next(Some("ask"));
    let t = Instant::now();
    let status = m.terminate().expect("the daemon exits");
    assert_eq!(status.code(), Some(0));
    let out = output(c);
    assert!(
        out == "EACCES" || out == "ENOTCONN",
        "held request at shutdown: {out}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(!sock.exists(), "the socket file is removed at exit");
}

#[test]
fn approve_auto_drives_a_bubblewrap_agent() {
    let (m, sock) = mount("ask-bwrap", ASK, &[]);
    let agent_sed = |m: &Mount| -> Out {
        Command::new("setpriv")
            .args([
                "--reuid=1000",
                "--regid=1000",
                "--clear-groups",
                "bwrap",
                "--ro-bind",
                "/",
                "/",
            ])
            .arg("--bind")
            .arg(m.mnt("."))
            // /mnt: an existing directory of the read-only root to mount over.
            .args([
                "/mnt", "--chdir", "/mnt", "--dev", "/dev", "--proc", "/proc",
            ])
            .args([
                "--unshare-pid",
                "--die-with-parent",
                "sed",
                "-i",
                "s/alpha/ALPHA/",
                "docs/a.md",
            ])
            .output()
            .unwrap()
            .into()
    };
    let mut approver = Command::new(BIN)
        .args(["approve"])
        .arg(&sock)
        .args(["--auto", "allow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_approvers(&sock, 1);
    // What the approver prints, line by line (its decision's line may come a moment
    // after the request it allowed went on).
    let printed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let printed = printed.clone();
        let out = approver.stdout.take().unwrap();
        thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let mut p = printed.lock().unwrap();
                p.push_str(&l);
                p.push('\n');
            }
        })
    };
    let o = agent_sed(&m);
    o.assert_ok("sed -i under --auto allow");
    assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), b"ALPHA\n");
    let decided = eventually(Duration::from_secs(10), || {
        printed.lock().unwrap().contains("allowed")
    });
    approver.kill().unwrap();
    let _ = approver.wait();
    reader.join().unwrap();
    let shown = printed.lock().unwrap().clone();
    assert!(decided && shown.contains("docs/"), "{shown}");
    assert!(shown.contains("sed"), "the command line is shown: {shown}");

    let mut denier = Command::new(BIN)
        .args(["approve"])
        .arg(&sock)
        .args(["--auto", "deny"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_approvers(&sock, 1);
    let before = snapshot(&m.root().join("src"));
    let o = agent_sed(&m);
    o.assert_fail("sed -i under --auto deny");
    assert!(o.stderr.contains("Permission denied"), "{}", o.stderr);
    assert_host_unchanged(&before, &m.root().join("src"), "denied sed -i");
    denier.kill().unwrap();
    let _ = denier.wait();
}

fn wait_for_approvers(sock: &Path, n: u64) {
    let (mut p, _) = Peer::connect_hello(sock);
    let ok = eventually(Duration::from_secs(5), || {
        p.call(json!({"cmd": "status"}))["approvers"] == n
    });
    assert!(ok, "{n} approver(s) never connected");
}

/// A held request that a reload allows outright (and one it refuses) is audited as its end
/// without `--audit-allowed` (SPEC.md: every held request is audited twice).
#[test]
fn a_reload_that_allows_or_refuses_is_audited_without_audit_allowed() {
    let (m, sock) = mount("ask-reload-audit", ASK, &[]);
    let mut ap = Peer::subscribe(&sock);
    let (mut st, _) = Peer::connect_hello(&sock);
    let c = agent(&m, "open('docs/r1', 'w').write('1'); print('ok')");
    let ev = ap.next(Some("ask"));
    std::fs::write(m.policy_path(), "mode = \"danger\"\n").unwrap();
    assert_eq!(st.call(json!({"cmd": "reload"}))["ok"], true);
    assert_eq!(output(c), "ok");
    assert_eq!(ap.next(Some("done"))["by"], "reload");
    std::fs::write(m.policy_path(), ASK).unwrap();
    assert_eq!(st.call(json!({"cmd": "reload"}))["ok"], true);
    let c = agent(&m, WRITE_A);
    ap.next(Some("ask"));
    std::fs::write(
        m.policy_path(),
        "mode = \"danger\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\n",
    )
    .unwrap();
    assert_eq!(st.call(json!({"cmd": "reload"}))["ok"], true);
    assert_eq!(output(c), "EACCES");
    assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), b"alpha\n");
    // The audit writer is asynchronous: wait for the last line.
    eventually(Duration::from_secs(5), || {
        audit_lines(&m)
            .iter()
            .any(|l| l["path"] == "docs/a.md" && l["by"] == "reload")
    });
    let lines = audit_lines(&m);
    let of = |path: &str| -> Vec<(String, String)> {
        lines
            .iter()
            .filter(|l| l["path"] == path)
            .map(|l| {
                let s = |k: &str| l[k].as_str().unwrap_or("").to_string();
                (s("decision"), s("by"))
            })
            .collect()
    };
    let want = |d: &str, b: &str| (d.to_string(), b.to_string());
    let r1 = of("docs/r1");
    assert!(r1.contains(&want("ask", "rule")), "{lines:#?}");
    assert!(r1.contains(&want("allow", "reload")), "{lines:#?}");
    let a = of("docs/a.md");
    assert!(a.contains(&want("ask", "rule")), "{lines:#?}");
    assert!(a.contains(&want("deny", "reload")), "{lines:#?}");
    assert_eq!(ev["paths"], json!(["docs/r1"]));
}

/// A pipe whose reader is gone: the write end, to be a child's stdout.
fn widowed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors this test owns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] is ours and closed once.
    unsafe { libc::close(fds[0]) };
    // SAFETY: fds[1] is ours; the Stdio takes it over.
    Stdio::from(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) })
}

/// Every subcommand that prints exits 0, quietly, when its reader is gone (EPIPE), as
/// `fencefs ctl SOCK held | head -c1` does.
#[test]
fn printing_to_a_closed_pipe_exits_zero_quietly() {
    let (m, sock) = mount("ask-epipe", ASK, &[]);
    let mut ap = Peer::subscribe(&sock);
    // Enough held that `held` is longer than a pipe buffer (writes to an existing file:
    // not directory changes, which one uid holds one at a time per directory).
    let c = agent(
        &m,
        "import threading\n\
def w(i):\n    try: open('docs/a.md', 'a')\n    except OSError: pass\n\
ts = [threading.Thread(target=w, args=(i,)) for i in range(300)]\n\
[t.start() for t in ts]; [t.join() for t in ts]\n",
    );
    for _ in 0..300 {
        ap.next(Some("ask"));
    }
    let runs: Vec<Vec<std::ffi::OsString>> = vec![
        vec!["ctl".into(), sock.clone().into(), "held".into()],
        vec!["ctl".into(), sock.clone().into(), "status".into()],
        vec![
            "explain".into(),
            "--policy".into(),
            m.policy_path().into(),
            "docs/a.md".into(),
        ],
        vec!["check".into(), m.policy_path().into()],
    ];
    for args in &runs {
        let o = Command::new(BIN)
            .args(args)
            .stdout(widowed_pipe())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?} said: {err}");
    }
    // The shell form of the same, with pipefail: head exits after one byte.
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -o pipefail; {BIN} ctl {} held | head -c1 >/dev/null",
            sock.display()
        ))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    drop(ap);
    let _ = output(c);
}

const ASK_LOCKED: &str = "mode = \"danger\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\n\
[[rule]]\npath = \"locked\"\naccess = \"read\"\n";

/// `--answers FILE` (SPEC.md "Approvals", remembered for good): an "always" answer is
/// written to FILE with what a person wrote kept, is consulted before anyone is asked (also
/// after a restart, with no approver), hand edits count after a reload, a broken FILE keeps
/// the old answers, and an answer never lifts a path without `ask`.
#[test]
fn answers_remembered_for_good_round_trip() {
    let ws = Workspace::new("answers-file");
    let file = ws.root.join("answers.toml");
    std::fs::write(&file, "# my answers\n# keep this comment\n").unwrap();
    let arg = file.to_str().unwrap().to_string();
    let (mut m, sock) = mount("ask-answers", ASK_LOCKED, &["--answers", &arg]);
    let mut ap = Peer::subscribe(&sock);
    let c = agent(&m, WRITE_A);
    let ev = ap.next(Some("ask"));
    let a = ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true, "remember": "always"}));
    assert_eq!(a["ok"], true, "{a}");
    assert_eq!(output(c), "ok");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with("# my answers\n# keep this comment\n"),
        "{text}"
    );
    for want in [
        "[[answer]]",
        "path = \"docs/a.md\"",
        "op = \"write\"",
        "uid = 1000",
        "allow = true",
        "by = \"uid 0\"",
        "ts = \"20",
    ] {
        assert!(text.contains(want), "{want} in {text}");
    }
    // Answered from the file: not asked again (held stays 0, no ask event).
    assert_eq!(output(agent(&m, WRITE_A)), "ok");
    let (mut st, _) = Peer::connect_hello(&sock);
    assert_eq!(st.call(json!({"cmd": "status"}))["held"], 0);
    // The audit writer is asynchronous: wait for the line.
    let by_answers = |m: &Mount, path: &str, d: &str| {
        eventually(Duration::from_secs(5), || {
            audit_lines(m)
                .iter()
                .any(|l| l["path"] == path && l["by"] == "answers" && l["decision"] == d)
        })
    };
    assert!(
        by_answers(&m, "docs/a.md", "allow"),
        "{:#?}",
        audit_lines(&m)
    );
    drop(ap);
    drop(st);
    m.terminate();

    // A restart: the answer is read at start, and decides with no approver connected.
    let (m, sock) = mount("ask-answers2", ASK_LOCKED, &["--answers", &arg]);
    assert_eq!(output(agent(&m, WRITE_A)), "ok");
    assert!(by_answers(&m, "docs/a.md", "allow"));
    // A hand edit (a refusal for docs/b.md, and an allow for a path without `ask`),
    // read on reload: b.md is refused without a question, locked/ stays read-only.
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str(
        "\n# added by hand\n[[answer]]\npath = \"docs/b.md\"\nop = \"write\"\nuid = 1000\nallow = false\n\
[[answer]]\npath = \"locked\"\nop = \"write\"\nuid = 1000\nallow = true\n",
    );
    std::fs::write(&file, &text).unwrap();
    let (mut st, _) = Peer::connect_hello(&sock);
    assert_eq!(st.call(json!({"cmd": "reload"}))["ok"], true);
    let _ap = Peer::subscribe(&sock);
    let t = Instant::now();
    let write_b = WRITE_A.replace("docs/a.md", "docs/b.md");
    assert_eq!(output(agent(&m, &write_b)), "EACCES");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "refused without a question"
    );
    assert_eq!(std::fs::read(m.host("docs/b.md")).unwrap(), b"beta\n");
    assert!(by_answers(&m, "docs/b.md", "deny"));
    mkdirp(&m.host("locked"));
    let write_locked = WRITE_A
        .replace("docs/a.md", "locked/f")
        .replace("O_TRUNC", "O_CREAT");
    assert_eq!(
        output(agent(&m, &write_locked)),
        "EACCES",
        "an answer never lifts a path without ask"
    );
    assert!(!m.host("locked/f").exists());
    // `fencefs answers FILE` lists them for review.
    let o: Out = Command::new(BIN)
        .arg("answers")
        .arg(&file)
        .output()
        .unwrap()
        .into();
    assert_eq!(o.status.code(), Some(0), "{}", o.stderr);
    assert!(
        o.stdout
            .contains("allow write docs/a.md uid 1000 (by uid 0, 20"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("deny write docs/b.md uid 1000"),
        "{}",
        o.stdout
    );
    // A broken file: file:line:column in the log and from `fencefs answers`; the answers
    // in force stay (a.md allowed, b.md refused, still without a question).
    std::fs::write(
        &file,
        format!("{text}[[answer]]\npath = \"x\"\nop = \"exec\"\nuid = 1\nallow = true\n"),
    )
    .unwrap();
    assert_eq!(st.call(json!({"cmd": "reload"}))["ok"], true);
    let line = text.lines().count() + 3;
    let want = format!("answers.toml:{line}:6: `op` must be");
    assert!(
        eventually(Duration::from_secs(5), || m.stderr().contains(&want)),
        "{want} in {}",
        m.stderr()
    );
    let o: Out = Command::new(BIN)
        .arg("answers")
        .arg(&file)
        .output()
        .unwrap()
        .into();
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stderr.contains(&want), "{}", o.stderr);
    assert_eq!(output(agent(&m, WRITE_A)), "ok");
    assert_eq!(output(agent(&m, &write_b)), "EACCES");
    assert_eq!(st.call(json!({"cmd": "status"}))["held"], 0);
}

/// `"remember":"always"` without `--answers` is refused and the request stays held.
#[test]
fn always_needs_answers() {
    let (m, sock) = mount("ask-always-none", ASK, &[]);
    let mut ap = Peer::subscribe(&sock);
    let c = agent(&m, WRITE_A);
    let ev = ap.next(Some("ask"));
    let a = ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true, "remember": "always"}));
    assert_eq!(a["ok"], false);
    assert!(a["error"].as_str().unwrap().contains("--answers"), "{a}");
    let a = ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": false}));
    assert_eq!(a["ok"], true, "still held: {a}");
    assert_eq!(output(c), "EACCES");

    // An answers file the agent could write (inside SOURCE) is refused at start.
    let ws = Workspace::new("answers-inside");
    let o = run_fencefs(
        [
            std::ffi::OsString::from("mount"),
            "--answers".into(),
            ws.src().join("answers.toml").into(),
            ws.src().into(),
            ws.mnt_dir().into(),
        ],
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(1), "{}", o.stderr);
    assert!(
        o.stderr.contains("must live outside SOURCE"),
        "{}",
        o.stderr
    );
    assert!(!ws.src().join("answers.toml").exists());
}

const NOTIFY_PY: &str = "import sys, os, time\n\
d = sys.argv[1]\n\
mode = open(os.path.join(d, 'mode')).read().strip()\n\
data = sys.stdin.buffer.read()\n\
t = os.path.join(d, 'tmp-%d' % os.getpid())\n\
open(t, 'wb').write(data)\n\
os.rename(t, os.path.join(d, 'ev-%d' % os.getpid()))\n\
if mode == 'sleep': time.sleep(60)\n\
if mode == 'fail':\n    sys.stderr.write('boom\\x1b[31m\\n'); sys.exit(3)\n";

/// The `ev-PID` files the notify script wrote: (pid, the line it read).
fn notified(dir: &Path) -> Vec<(i32, String)> {
    let mut v: Vec<(i32, String)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid = e.file_name().to_str()?.strip_prefix("ev-")?.parse().ok()?;
            Some((pid, std::fs::read_to_string(e.path()).ok()?))
        })
        .collect();
    v.sort();
    v
}

/// `--ask-exec CMD` (SPEC.md "Approvals", notify): CMD gets the ask event on stdin, at
/// most 4 run at once, each is killed after 10 s, a failure is logged (quoted), and the
/// request is neither delayed nor decided by it.
#[test]
fn ask_exec_notifies_bounded_and_logged() {
    let ws = Workspace::new("ask-exec-dir");
    let dir = ws.root.join("notes");
    mkdirp(&dir);
    let script = ws.root.join("notify.py");
    std::fs::write(&script, NOTIFY_PY).unwrap();
    std::fs::write(dir.join("mode"), "ok").unwrap();
    let cmd = format!("{PY} {} {}", script.display(), dir.display());
    let (m, sock) = mount("ask-exec", ASK, &["--ask-exec", &cmd]);
    let mut ap = Peer::subscribe(&sock);

    // The ask event, one JSON line on stdin.
    let c = agent(&m, WRITE_A);
    let ev = ap.next(Some("ask"));
    assert!(eventually(Duration::from_secs(10), || notified(&dir).len() == 1));
    let (_, line) = notified(&dir).remove(0);
    assert!(
        line.ends_with('\n') && line.matches('\n').count() == 1,
        "{line:?}"
    );
    let mut got: Value = serde_json::from_str(&line).unwrap();
    let mut want = ev.clone();
    // The time left is read when each is rendered.
    let left = got["expires_in_ms"].take().as_u64().unwrap();
    assert!(left > 100_000 && left <= 120_000, "{left}");
    want["expires_in_ms"].take();
    assert_eq!(got, want, "the same event the approver got");
    ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true}));
    assert_eq!(output(c), "ok");

    // A failing CMD: its exit status and stderr (quoted) go to the log.
    std::fs::write(dir.join("mode"), "fail").unwrap();
    let c = agent(&m, WRITE_A);
    let ev = ap.next(Some("ask"));
    let logged = || m.stderr().contains("failed (exit status: 3); stderr: boom");
    assert!(
        eventually(Duration::from_secs(10), logged),
        "{}",
        m.stderr()
    );
    assert!(
        !m.stderr().contains('\x1b'),
        "stderr is quoted: {}",
        m.stderr()
    );
    ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": false}));
    assert_eq!(output(c), "EACCES");

    // Commands that hang: at most 4 at once, each killed after 10 s; requests are not
    // delayed (answered while the commands still run).
    for f in notified(&dir) {
        std::fs::remove_file(dir.join(format!("ev-{}", f.0))).unwrap();
    }
    std::fs::write(dir.join("mode"), "sleep").unwrap();
    let c = agent(
        &m,
        "import threading, os\n\
def w(i):\n    try: os.close(os.open('docs/a.md', os.O_WRONLY))\n    except OSError: pass\n\
ts = [threading.Thread(target=w, args=(i,)) for i in range(6)]\n\
[t.start() for t in ts]; [t.join() for t in ts]\nprint('done')\n",
    );
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(ap.next(Some("ask"))["id"].clone());
    }
    let t = Instant::now();
    assert!(eventually(Duration::from_secs(8), || notified(&dir).len() == 4));
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(notified(&dir).len(), 4, "at most 4 at once");
    let first: Vec<i32> = notified(&dir).iter().map(|f| f.0).collect();
    // Answered while the notifications hang: not delayed by them.
    let answered = Instant::now();
    for id in &ids {
        ap.call(json!({"cmd": "decide", "id": id, "allow": true}));
    }
    assert_eq!(output(c), "done");
    assert!(answered.elapsed() < Duration::from_secs(5));
    // Killed after 10 s; then the last two run.
    assert!(eventually(Duration::from_secs(30), || notified(&dir).len() == 6));
    assert!(t.elapsed() >= Duration::from_secs(9), "{:?}", t.elapsed());
    // Each runner kills and reaps its own command; the last two may start while another
    // runner is still reaping, so give the reaping a moment.
    // SAFETY: kill(2) with signal 0 only checks that the pid exists.
    let alive = |pid: i32| unsafe { libc::kill(pid, 0) } == 0;
    assert!(
        eventually(Duration::from_secs(5), || !first.iter().any(|&p| alive(p))),
        "ask-exec commands still run: {:?}",
        first.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
    );
    let killed = || m.stderr().matches("killed after 10 s").count() >= 4;
    assert!(eventually(Duration::from_secs(5), killed), "{}", m.stderr());
}

/// `fencefs approve`: `A` answers "always" (written to the daemon's --answers file); the
/// next request is not asked.
#[test]
fn approve_key_a_capital_allows_always() {
    let ws = Workspace::new("answers-key");
    let file = ws.root.join("answers.toml");
    let arg = file.to_str().unwrap().to_string();
    let (m, sock) = mount("ask-answers-key", ASK, &["--answers", &arg]);
    let mut approver = Command::new(BIN)
        .arg("approve")
        .arg(&sock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_approvers(&sock, 1);
    let c = agent(&m, WRITE_A);
    let mut out = BufReader::new(approver.stdout.take().unwrap());
    let mut shown = String::new();
    while !shown.contains("docs/a.md") {
        assert!(
            out.read_line(&mut shown).unwrap() > 0,
            "approve ended: {shown}"
        );
    }
    approver.stdin.as_mut().unwrap().write_all(b"A\n").unwrap();
    assert_eq!(output(c), "ok");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.contains("path = \"docs/a.md\"") && text.contains("allow = true"),
        "{text}"
    );
    drop(approver.stdin.take());
    let _ = approver.wait();
    // No approver now: answered from the file.
    assert_eq!(output(agent(&m, WRITE_A)), "ok");
}
