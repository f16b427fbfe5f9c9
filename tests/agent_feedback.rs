//! `.fencefs/feedback` on a staged mount with `agent_notes = true`, read as the agent's
//! uid: the reviewer's decisions (`stage apply`, `stage discard --note` through the control
//! socket and offline, and lines a review UI appends to DIR/feedback.jsonl) since the
//! agent's last turn began, newest last, the last 100, never naming a path the reader
//! cannot see.

mod common;

use std::fs;
use std::io::Write;
use std::time::Duration;

use common::stage::*;
use common::*;
use serde_json::json;

const AGENT: u32 = 1000;

const POLICY: &str = "agent_notes = true\nmode = \"workspace-write\"\ndefault = \"write\"\n\
                      [[rule]]\npath = \"private-agent\"\naccess = \"none\"\nuid = [1000]\n\
                      [[rule]]\npath = \"vault\"\naccess = \"none\"\n";

fn setup(src: &std::path::Path) {
    sample(src);
    put(&src.join("private-agent/p"), b"p\n", 0o644);
    put(&src.join("vault/key"), b"k\n", 0o644);
    // uid 1000 may change what the policy lets it (and the kernel's permission checks).
    for (p, mode) in [
        ("", 0o777),
        ("sub", 0o777),
        ("sub/deep", 0o777),
        ("a.txt", 0o666),
        ("sub/b.txt", 0o666),
        ("sub/deep/c.txt", 0o666),
    ] {
        fs::set_permissions(
            src.join(p),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .unwrap();
    }
}

fn feedback(m: &Mount, uid: u32) -> String {
    let o = if uid == 0 {
        m.sh("cat .fencefs/feedback")
    } else {
        m.sh_as(uid, "cat .fencefs/feedback")
    };
    o.assert_ok("cat .fencefs/feedback");
    o.stdout
}

/// The lines without their times.
fn untimed(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_once(' ').map_or(l, |(_, r)| r).to_string())
        .collect()
}

fn ui_line(dir: &std::path::Path, v: serde_json::Value) {
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("feedback.jsonl"))
        .unwrap();
    writeln!(f, "{v}").unwrap();
}

#[test]
fn decisions_reach_the_agent_and_name_nothing_hidden() {
    let b = Mount::builder("feedback")
        .policy(POLICY)
        .arg("--allow-other");
    setup(&b.host(""));
    let dir = stage_dir(&b);
    let sock = b.root().join("ctl.sock");
    let mut m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(&sock)
        .start();
    let s = sock.to_str().unwrap();
    assert_eq!(feedback(&m, AGENT), "", "no decision yet");
    // The agent's turn.
    m.sh_as(
        AGENT,
        "echo edited > a.txt && echo new > new.txt && echo b2 > sub/b.txt",
    )
    .assert_ok("the agent's edits");
    // The reviewer: a discard with a note and an apply, through the control socket.
    let d = run_fencefs(
        [
            "stage",
            "discard",
            s,
            "--note",
            "keep a.txt as it was\u{1b}[31m",
            "a.txt",
        ],
        LIMIT,
    );
    d.assert_ok("discard --note");
    run_fencefs(["stage", "apply", s, "new.txt"], LIMIT).assert_ok("apply");
    // A review UI's lines: hunks of sub/b.txt, and decisions on hidden paths.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    ui_line(
        &dir,
        json!({"ts": now, "path": "sub/b.txt", "hunks": [1, 2], "decision": "discarded", "note": "wrong indent"}),
    );
    ui_line(
        &dir,
        json!({"ts": now, "path": "vault/key", "hunks": null, "decision": "discarded", "note": "secret"}),
    );
    ui_line(
        &dir,
        json!({"ts": now, "path": "private-agent/p", "hunks": null, "decision": "applied", "note": null}),
    );
    let want = vec![
        "discarded a.txt: keep a.txt as it was [31m".to_string(),
        "applied new.txt".into(),
        "discarded sub/b.txt hunks 1,2: wrong indent".into(),
    ];
    assert!(
        eventually(Duration::from_secs(5), || untimed(&feedback(&m, AGENT))
            == want),
        "agent's feedback:\n{}",
        feedback(&m, AGENT)
    );
    // Root sees the uid-1000-only hidden path; nobody sees `vault`.
    let root = untimed(&feedback(&m, 0));
    assert_eq!(root.len(), 4, "{root:?}");
    assert_eq!(root[3], "applied private-agent/p");
    for who in [0, AGENT] {
        assert!(!feedback(&m, who).contains("vault"), "uid {who}");
    }
    // The merged view: a.txt back to SOURCE's, new.txt applied.
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"one\ntwo\nthree\n");
    assert_eq!(fs::read(m.host("new.txt")).unwrap(), b"new\n");
    // Read-only like every note.
    let w = fs::write(m.mnt(".fencefs/feedback"), b"x");
    assert_eq!(w.err().and_then(|e| e.raw_os_error()), Some(libc::EROFS));
    // Since the agent's last turn began: after two checkpoints, an old decision (before
    // the first of them) is gone and what came after stays.
    ui_line(
        &dir,
        json!({"ts": 1000, "path": "old.txt", "hunks": null, "decision": "applied", "note": null}),
    );
    assert!(eventually(Duration::from_secs(5), || feedback(&m, AGENT)
        .contains(" old.txt")));
    for n in ["turn 1", "turn 2"] {
        m.sh_as(AGENT, &format!("echo '{n}' >> sub/deep/c.txt"))
            .assert_ok("edit");
        run_fencefs(["stage", "checkpoint", s, "-m", n], LIMIT).assert_ok("checkpoint");
        std::thread::sleep(Duration::from_millis(1100));
    }
    assert!(
        eventually(Duration::from_secs(5), || !feedback(&m, AGENT)
            .contains(" old.txt")),
        "{}",
        feedback(&m, AGENT)
    );
    // A decision of this turn is shown; bounded: the last 100, newest last.
    let now = now_secs();
    for i in 0..150 {
        ui_line(
            &dir,
            json!({"ts": now, "path": format!("sub/f{i}"), "hunks": null, "decision": "discarded", "note": format!("n{i}")}),
        );
    }
    let ok = eventually(Duration::from_secs(5), || {
        let l = untimed(&feedback(&m, AGENT));
        l.len() == 100 && l[99] == "discarded sub/f149: n149" && l[0] == "discarded sub/f50: n50"
    });
    assert!(ok, "{}", feedback(&m, AGENT));
    // Offline (no daemon): `stage discard --dir --note` appends too.
    stop(&mut m);
    let o = offline(&dir, "discard", &["--note", "not this", "sub/deep/c.txt"]);
    o.assert_ok("offline discard");
    let text = fs::read_to_string(dir.join("feedback.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["path"], "sub/deep/c.txt");
    assert_eq!(last["decision"], "discarded");
    assert_eq!(last["note"], "not this");
    assert_eq!(last["hunks"], serde_json::Value::Null);
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
