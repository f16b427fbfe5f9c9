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
