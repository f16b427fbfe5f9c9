//! `fencefs learn`: a real session through a mount with `--audit-allowed` (a Python
//! project's tests, a build writing outputs, a log appended to), the draft drawn from its
//! audit log, the same session re-run under the draft (all succeeds) and what the session
//! did not use refused (SPEC "Learning a policy").

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::time::Duration;

const UID: u32 = 1000;

const WORKLOAD: &str = "set -e
/usr/bin/python3 -m unittest discover -s tests -t . -q 2>&1
mkdir -p build
cat src/a.c src/b.c > build/all.c
echo built > build/stamp
echo run >> logs/app.log
ls src > /dev/null
";

fn layout(b: &MountBuilder) {
    put(&b.host("pkg/__init__.py"), b"", 0o644);
    put(&b.host("pkg/mod.py"), b"def f():\n    return 42\n", 0o644);
    put(&b.host("tests/__init__.py"), b"", 0o644);
    put(
        &b.host("tests/test_mod.py"),
        b"import unittest\nfrom pkg import mod\n\nclass T(unittest.TestCase):\n    def test_f(self):\n        self.assertEqual(mod.f(), 42)\n",
        0o644,
    );
    put(&b.host("src/a.c"), b"int a;\n", 0o644);
    put(&b.host("src/b.c"), b"int b;\n", 0o644);
    put(&b.host("logs/app.log"), b"start\n", 0o644);
    put(&b.host("secret/unused.txt"), b"never read\n", 0o644);
    mkdirp(&b.host("unused"));
    chown_r(&b.host(""), UID);
}

fn chown_r(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
    if fs::symlink_metadata(p).unwrap().is_dir() {
        for e in fs::read_dir(p).unwrap() {
            chown_r(&e.unwrap().path(), uid);
        }
    }
}

#[test]
fn a_learned_policy_runs_the_session_again_and_refuses_the_rest() {
    // 1. The session under a permissive policy, every decision audited.
    let b = Mount::builder("learn-record").policy("mode = \"danger\"\ndefault = \"write\"\n");
    layout(&b);
    let audit = b.root().join("audit.jsonl");
    let mut rec = b
        .arg("--allow-other")
        .arg("--audit")
        .arg(&audit)
        .arg("--audit-allowed")
        .start();
    rec.sh_as(UID, WORKLOAD).assert_ok("the session");
    rec.terminate(); // flushes the audit log; the workspace stays until `rec` drops
    assert!(audit.exists());

    // 2. The draft.
    let o = run_fencefs(
        [std::ffi::OsStr::new("learn"), audit.as_os_str()],
        Duration::from_secs(30),
    );
    o.assert_ok("fencefs learn");
    let draft = o.stdout.clone();
    assert!(draft.contains("default = \"none\""), "{draft}");
    assert!(draft.contains("mode = \"workspace-write\""), "{draft}");
    assert!(draft.contains("access = \"append\""), "the log: {draft}");
    let p = fencefs::policy::Policy::parse(&draft, "draft").unwrap();
    let me = fencefs::policy::Caller::new(UID, UID);
    for unused in [&b"secret/unused.txt"[..], b"unused/x", b"elsewhere"] {
        let v = p.verdict_for(unused, me, false);
        assert_eq!(v.effective, fencefs::policy::Access::None, "{draft}");
    }
    assert!(draft.contains("accesses\n[[rule]]") || draft.contains("access\n[[rule]]"));

    // 3. The same session from the same start, under the draft: all of it works.
    let b = Mount::builder("learn-replay").policy(&draft);
    layout(&b);
    let audit2 = b.root().join("audit.jsonl");
    let m = b.arg("--allow-other").arg("--audit").arg(&audit2).start();
    let o = m.sh_as(UID, WORKLOAD);
    o.assert_ok(&format!("the session under the draft\n{draft}"));
    assert_eq!(fs::read(m.host("build/stamp")).unwrap(), b"built\n");
    assert_eq!(fs::read(m.host("logs/app.log")).unwrap(), b"start\nrun\n");

    // 4. What the session did not use is not there, or not writable.
    m.sh_as(UID, "echo x > unused/new")
        .assert_fail("write to an unused dir");
    m.sh_as(UID, "cat secret/unused.txt")
        .assert_fail("read an unused file");
    m.sh_as(UID, "echo x > logs/app.log")
        .assert_fail("truncate the log");
    assert!(!m.host("unused/new").exists());
    assert_eq!(fs::read(m.host("logs/app.log")).unwrap(), b"start\nrun\n");

    // A draft under a base policy keeps the base's `none` rules.
    let base = m.outside().join("base.toml");
    put(
        &base,
        b"[[rule]]\npath = \"src/b.c\"\naccess = \"none\"\n",
        0o644,
    );
    let o = run_fencefs(
        [
            std::ffi::OsStr::new("learn"),
            audit.as_os_str(),
            std::ffi::OsStr::new("--policy"),
            base.as_os_str(),
        ],
        Duration::from_secs(30),
    );
    o.assert_ok("fencefs learn --policy");
    assert!(
        o.stdout.contains("# kept from the base policy"),
        "{}",
        o.stdout
    );
    let p = fencefs::policy::Policy::parse(&o.stdout, "draft").unwrap();
    let me = fencefs::policy::Caller::new(UID, UID);
    assert_eq!(
        p.verdict(b"src/b.c", me).effective,
        fencefs::policy::Access::None
    );
    assert_eq!(
        p.verdict(b"src/a.c", me).effective,
        fencefs::policy::Access::Read
    );
}

#[test]
fn a_learn_mount_reports_instead_of_refusing_and_writes_the_draft_at_unmount() {
    let policy = "mode = \"read-only\"\ndefault = \"read\"\n\n\
                  [[rule]]\npath = \"secret\"\naccess = \"none\"\n";
    let b = Mount::builder("learn-mount").policy(policy);
    layout(&b);
    let audit = b.root().join("audit.jsonl");
    let out = b.root().join("learned.toml");
    let mut rec = b
        .arg("--allow-other")
        .arg("--audit")
        .arg(&audit)
        .arg("--learn")
        .arg(&out)
        .start();
    // Everything the read-only policy would refuse runs; `none` still hides.
    rec.sh_as(UID, WORKLOAD)
        .assert_ok("the session in report-only form");
    assert_eq!(fs::read(rec.host("build/stamp")).unwrap(), b"built\n");
    let o = rec.sh_as(UID, "cat secret/unused.txt");
    assert!(!o.ok() && o.stderr.contains("No such file"), "{o:?}");
    rec.terminate();
    let lines = fs::read_to_string(&audit).unwrap();
    assert!(
        lines
            .lines()
            .any(|l| l.contains("\"decision\":\"would-deny\"")
                && l.contains("\"path\":\"build/stamp\"")
                && l.contains("\"errno\":\"EROFS\"")),
        "{lines}"
    );
    assert!(!lines.contains("\"decision\":\"would-deny\",\"errno\":\"ENOENT\""));
    let draft = fs::read_to_string(&out).expect("the draft at unmount");
    let p = fencefs::policy::Policy::parse(&draft, "learned")
        .unwrap_or_else(|e| panic!("{e:?}\n{draft}"));
    let me = fencefs::policy::Caller::new(UID, UID);
    assert_eq!(
        p.verdict(b"secret", me).grant,
        fencefs::policy::Access::None,
        "{draft}"
    );
    assert!(draft.contains("# kept from the base policy"), "{draft}");

    // The same session under the draft, from the same start.
    let b = Mount::builder("learn-mount-replay").policy(&draft);
    layout(&b);
    let m = b.arg("--allow-other").start();
    m.sh_as(UID, WORKLOAD)
        .assert_ok(&format!("the session under the learned policy\n{draft}"));
    m.sh_as(UID, "echo x > unused/new")
        .assert_fail("unused dir");
    assert!(!m.host("unused/new").exists());
}

/// An npm project with a local package tarball as its dependency (made here with `npm
/// pack`: no network) and a crate without dependencies whose build.rs generates code.
fn tool_layout(b: &MountBuilder) {
    let dep = b.outside().join("dep");
    put(
        &dep.join("package.json"),
        br#"{"name":"dep","version":"1.0.0","main":"index.js"}"#,
        0o644,
    );
    put(
        &dep.join("index.js"),
        b"exports.hi = () => 'hi from dep';\n",
        0o644,
    );
    mkdirp(&b.host("app/vendor"));
    let o = sh_in(
        &dep,
        &format!(
            "npm pack --silent --pack-destination {} >/dev/null",
            b.host("app/vendor").display()
        ),
    );
    o.assert_ok("npm pack");
    put(
        &b.host("app/package.json"),
        br#"{"name":"app","version":"1.0.0","private":true,"dependencies":{"dep":"file:vendor/dep-1.0.0.tgz"}}"#,
        0o644,
    );
    put(
        &b.host("crate/Cargo.toml"),
        b"[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
        0o644,
    );
    put(
        &b.host("crate/build.rs"),
        b"fn main() {\n    let out = std::env::var(\"OUT_DIR\").unwrap();\n    \
          std::fs::write(format!(\"{out}/gen.rs\"), \"pub const GREETING: &str = \\\"hello from build.rs\\\";\").unwrap();\n    \
          println!(\"cargo:rerun-if-changed=build.rs\");\n}\n",
        0o644,
    );
    put(
        &b.host("crate/src/main.rs"),
        b"include!(concat!(env!(\"OUT_DIR\"), \"/gen.rs\"));\nfn main() {\n    println!(\"{GREETING}\");\n}\n",
        0o644,
    );
    // target/ exists (an earlier `cargo clean` leaves it): a first build would make it
    // as `targetXXXXXX` and rename it, a name picked at random in a directory the session
    // did not make, which a draft cannot know (see the policy chapter).
    mkdirp(&b.host("crate/target"));
    put(&b.host("notes/todo.txt"), b"unused\n", 0o644);
    mkdirp(&b.host("unused"));
}

/// npm install (offline) and cargo build (offline), as root: their caches and toolchain
/// live in root's home, outside the mount.
fn tool_workload() -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    format!(
        "set -e
cd app
npm install --offline --no-audit --no-fund --no-update-notifier 2>&1
node -e \"console.log(require('dep').hi())\"
cd ../crate
'{cargo}' build --offline --quiet 2>&1
./target/debug/hello
"
    )
}

#[test]
fn learn_drafts_npm_install_and_cargo_build_and_answers_the_learn_command() {
    // 1. The session on a learning mount (report-only under a read-only base).
    let b = Mount::builder("learn-tools").policy("mode = \"read-only\"\ndefault = \"read\"\n");
    tool_layout(&b);
    let out = b.root().join("learned.toml");
    let sock = b.outside().join("ctl.sock");
    let mut rec = b
        .watchdog(Duration::from_secs(400))
        .arg("--learn")
        .arg(&out)
        .arg("--control")
        .arg(&sock)
        .start();
    let o = rec.sh(&tool_workload());
    o.assert_ok("npm install + cargo build, learning");
    assert!(o.stdout.contains("hi from dep") && o.stdout.contains("hello from build.rs"));

    // 2. `{"cmd":"learn"}` writes the draft now and says where, and how many rules.
    let mut peer = Peer::connect(&sock);
    let a = peer.call(serde_json::json!({"cmd": "learn"}));
    assert_eq!(a["ok"], true, "{a}");
    assert_eq!(
        a["path"].as_str().unwrap(),
        fs::canonicalize(&out).unwrap().to_str().unwrap()
    );
    let now = fs::read_to_string(&out).unwrap();
    let p = fencefs::policy::Policy::parse(&now, "learned").unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        a["rules"].as_u64().unwrap() as usize,
        p.rules().len(),
        "{a}"
    );
    assert!(p.rules().len() > 2, "{now}");
    assert_eq!(a["bytes"].as_u64().unwrap() as usize, now.len());
    let o = run_fencefs(
        [
            std::ffi::OsStr::new("ctl"),
            sock.as_os_str(),
            "learn".as_ref(),
        ],
        Duration::from_secs(30),
    );
    o.assert_ok("fencefs ctl learn");
    assert!(
        o.stdout.starts_with("draft policy written to ") && o.stdout.contains(" rules"),
        "{o:?}"
    );
    drop(peer);
    // More use after the command, then the unmount's draft replaces it whole.
    rec.sh("cat notes/todo.txt >/dev/null")
        .assert_ok("one more read");
    rec.terminate();
    let draft = fs::read_to_string(&out).unwrap();
    let p = fencefs::policy::Policy::parse(&draft, "learned")
        .unwrap_or_else(|e| panic!("{e:?}\n{draft}"));
    let root = fencefs::policy::Caller::new(0, 0);
    assert_eq!(
        p.verdict_for(b"notes/todo.txt", root, false).effective,
        fencefs::policy::Access::Read,
        "used after the command: {draft}"
    );
    assert_eq!(
        p.verdict_for(b"unused/x", root, false).effective,
        fencefs::policy::Access::None,
        "{draft}"
    );

    // 3. The same session from the same start under the draft: all of it works.
    let b = Mount::builder("learn-tools-replay").policy(&draft);
    tool_layout(&b);
    let sock = b.outside().join("ctl.sock");
    let m = b
        .watchdog(Duration::from_secs(400))
        .arg("--control")
        .arg(&sock)
        .start();
    let o = m.sh(&tool_workload());
    o.assert_ok(&format!(
        "npm install + cargo build under the draft\n{draft}"
    ));
    assert!(o.stdout.contains("hi from dep") && o.stdout.contains("hello from build.rs"));

    // 4. A write where the session wrote nothing: refused, the host unchanged.
    let before = snapshot(&m.host(""));
    let _ = assert_errno(
        fs::write(m.mnt("unused/new"), b"x"),
        libc::ENOENT,
        "create in an unused directory (hidden)",
    );
    let _ = assert_errno(
        fs::write(m.mnt("crate/src/new.rs"), b"x"),
        libc::EACCES,
        "create in a directory the session only read",
    );
    let _ = assert_errno(
        fs::write(m.mnt("app/package.json"), b"{}"),
        libc::EACCES,
        "overwrite a file the session only read",
    );
    assert_eq!(snapshot(&m.host("")), before, "host unchanged");
    // A mount that does not learn says so.
    let mut peer = Peer::connect(&sock);
    let a = peer.call(serde_json::json!({"cmd": "learn"}));
    assert_eq!(a["ok"], false, "{a}");
    assert!(a["error"].as_str().unwrap().contains("--learn"), "{a}");
}
