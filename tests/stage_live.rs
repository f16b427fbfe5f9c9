//! Staging checkpoints and live changes on real mounts: `checkpoint`, `log`, `rewind`,
//! `--since` offline (`--dir`) and through a running mount's control socket, `apply` and
//! `discard` while mounted, and the crash story. Every process sees the new merged view
//! at once; SOURCE stays byte-for-byte and stat-for-stat the same until `apply`; every
//! refusal leaves SOURCE untouched.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::stage::*;
use common::*;

/// A staged mount of the sample SOURCE with a control socket; returns it, DIR and SOCKET.
fn live(name: &str) -> (Mount, PathBuf, PathBuf) {
    staged_live(name, sample)
}

/// `fencefs stage OP SOCKET ARGS…`.
fn via(sock: &Path, op: &str, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), op.into()];
    v.push(sock.into());
    v.extend(args.iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// A shell started through the mount before a live change, run from inside it: it prints
/// what it sees when told to (`look`), so the test sees what a process that was already
/// there sees.
struct Watcher {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Watcher {
    fn start(dir: &Path) -> Watcher {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("while read cmd; do eval \"$cmd\"; echo @@; done")
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Watcher { child, out }
    }
    fn look(&mut self, cmd: &str) -> String {
        writeln!(self.child.stdin.as_mut().unwrap(), "{cmd}").unwrap();
        let mut all = String::new();
        loop {
            let mut l = String::new();
            assert!(self.out.read_line(&mut l).unwrap() > 0, "watcher died");
            if l == "@@\n" {
                return all;
            }
            all.push_str(&l);
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

const TURN: &str = "set -e
sed -i 's/two/TWO/' a.txt
rm -rf gone
mv sub moved
echo later > later.txt
";

#[test]
fn a_turn_is_rewound_live_and_every_process_sees_it_at_once() {
    let (m, dir, sock) = live("stage-live-rewind");
    let before = snapshot(&m.host(""));
    m.sh("echo first > t1.txt").assert_ok("turn 1");
    let c = via(&sock, "checkpoint", &["-m", "after turn 1"]);
    c.assert_ok("checkpoint");
    assert_eq!(c.stdout, "checkpoint 1\n");
    // A process already inside the mount, in a directory the turn will rename away.
    let mut w = Watcher::start(&m.mnt("sub"));
    assert_eq!(w.look("cat b.txt"), "bee\n");
    m.sh(TURN).assert_ok("turn 2: sed -i, rm -rf, mv dir");
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"one\nTWO\nthree\n");
    // What the last turn did.
    let since = via(&sock, "status", &["--since", "1"]);
    since.assert_ok("status --since 1");
    assert_eq!(
        since.stdout,
        "M a.txt\nD gone/\nA later.txt\nR sub/ -> moved/\n"
    );
    let all = via(&sock, "status", &[]);
    assert_eq!(
        all.stdout,
        "M a.txt\nD gone/\nA later.txt\nR sub/ -> moved/\nA t1.txt\n"
    );
    let d = via(&sock, "diff", &["--since", "1", "a.txt"]);
    assert!(d.stdout.contains("-two\n+TWO\n"), "{}", d.stdout);
    let log = via(&sock, "log", &["--json"]);
    let v: serde_json::Value = serde_json::from_str(&log.stdout).unwrap();
    assert_eq!(v[0]["n"], 1);
    assert_eq!(v[0]["message"], "after turn 1");
    assert_eq!(v[0]["changes"], 1, "{v}");
    assert_eq!(v[0]["ended"], false);
    assert_host_unchanged(&before, &m.host(""), "before the rewind");

    let r = via(&sock, "rewind", &["1"]);
    r.assert_ok("rewind 1");
    assert_eq!(r.stdout, "rewound to checkpoint 1\n");
    // At once, for a new process and for the one that was there.
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"one\ntwo\nthree\n");
    assert_eq!(fs::read(m.mnt("t1.txt")).unwrap(), b"first\n");
    assert_eq!(fs::read(m.mnt("gone/y")).unwrap(), b"y\n");
    assert_eq!(fs::read(m.mnt("sub/deep/c.txt")).unwrap(), b"sea\n");
    assert_errno(fs::metadata(m.mnt("moved")), libc::ENOENT, "moved/ rewound").ok();
    assert_errno(
        fs::metadata(m.mnt("later.txt")),
        libc::ENOENT,
        "later.txt rewound",
    )
    .ok();
    assert_eq!(
        w.look("cat ../a.txt; ls ..; cat b.txt"),
        "one\ntwo\nthree\na.txt\ngone\nsub\nt1.txt\nbee\n"
    );
    let st = via(&sock, "status", &[]);
    assert_eq!(st.stdout, "A t1.txt\n");
    assert_eq!(via(&sock, "status", &["--since", "1"]).stdout, "");
    // The stage keeps working after the swap: a write lands in the new live layer.
    fs::write(m.mnt("a.txt"), b"again\n").unwrap();
    assert_eq!(via(&sock, "status", &["--since", "1"]).stdout, "M a.txt\n");
    assert_host_unchanged(&before, &m.host(""), "after the rewind");
    // Audited.
    let audit = fs::read_to_string(dir.join("audit.jsonl")).unwrap();
    let line: serde_json::Value =
        serde_json::from_str(audit.lines().last().unwrap()).expect("a JSON line");
    assert_eq!(line["op"], "stage-rewind");
    assert_eq!(line["to"], 1);
    assert_eq!(line["uid"], 0);
    // Rewinding to a checkpoint that does not exist is refused, nothing changes.
    let bad = via(&sock, "rewind", &["7"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(bad.stderr.contains("no checkpoint 7"), "{}", bad.stderr);
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"again\n");
}

#[test]
fn checkpoints_offline_then_apply_ends_them() {
    let (mut m, dir, _sock) = live("stage-offline-ckpt");
    m.sh("echo one > t1.txt; sed -i 's/one/ONE/' a.txt")
        .assert_ok("turn 1");
    stop(&mut m);
    let before = snapshot(&m.host(""));
    let c = offline(&dir, "checkpoint", &["-m", "t1"]);
    c.assert_ok("checkpoint --dir");
    assert_eq!(c.stdout, "checkpoint 1\n");
    // A second daemon on the same DIR serves the stack; turn 2 through it.
    let b = Second::start(&m, &dir, &m.policy_path());
    b.sh("set -e; echo two > t2.txt; rm t1.txt; mv sub moved; echo more >> moved/b.txt")
        .assert_ok("turn 2");
    drop(b);
    let merged_status = offline(&dir, "status", &[]);
    assert_eq!(
        merged_status.stdout,
        "M a.txt\nR sub/ -> moved/\nM moved/b.txt\nA t2.txt\n"
    );
    assert_eq!(
        offline(&dir, "status", &["--since", "1"]).stdout,
        "R sub/ -> moved/\nM moved/b.txt\nD t1.txt\nA t2.txt\n"
    );
    let log = offline(&dir, "log", &[]);
    assert!(log.stdout.starts_with("1  "), "{}", log.stdout);
    assert!(
        log.stdout.trim_end().ends_with("2 changes  t1"),
        "{}",
        log.stdout
    );
    assert_host_unchanged(&before, &m.host(""), "checkpoint and status");
    // apply of one path squashes the stack: checkpoint 1 ends as a rewind target.
    let a = offline(&dir, "apply", &["t2.txt"]);
    a.assert_ok("apply t2.txt");
    assert_eq!(fs::read(m.host("t2.txt")).unwrap(), b"two\n");
    assert_eq!(
        offline(&dir, "status", &[]).stdout,
        "M a.txt\nR sub/ -> moved/\nM moved/b.txt\n"
    );
    let log = offline(&dir, "log", &["--json"]);
    let v: serde_json::Value = serde_json::from_str(&log.stdout).unwrap();
    assert_eq!(v[0]["ended"], true, "{v}");
    let r = offline(&dir, "rewind", &["1"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(
        r.stderr.contains("ended by an apply or discard"),
        "{}",
        r.stderr
    );
    assert!(
        !dir.join("layers/1").exists(),
        "the layer went with the squash"
    );
    // The rest applies whole; SOURCE then equals the merged view.
    offline(&dir, "apply", &[]).assert_ok("apply the rest");
    assert_eq!(fs::read(m.host("moved/b.txt")).unwrap(), b"bee\nmore\n");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"ONE\ntwo\nthree\n");
    assert!(!m.host("sub").exists() && !m.host("t1.txt").exists());
    assert_eq!(offline(&dir, "status", &[]).stdout, "");
}

#[test]
fn a_checkpoint_killed_midway_is_finished_at_restart() {
    let (mut m, dir, _sock) = live("stage-ckpt-crash");
    m.sh("set -e; echo k > k.txt; rm -rf gone; mv sub moved")
        .assert_ok("changes");
    let merged = snapshot(&m.mnt(""));
    m.signal(libc::SIGKILL);
    assert!(m.wait_exit(Duration::from_secs(10)).is_some());
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(m.mnt(""))
        .status();
    let before = snapshot(&m.host(""));
    // The states a SIGKILL between the steps of a checkpoint leaves: (1) the new upper
    // prepared and the intent written; (2) the live upper sealed as layers/1 too.
    let entry = serde_json::json!({"op":"checkpoint","entry":{"n":1,"ts":"2026-01-01T00:00:00Z","message":"m","changes":3,"ended":false}});
    for step in 1..=2 {
        let work = m.root().join(format!("crash{step}"));
        let _ = Command::new("cp").arg("-a").arg(&dir).arg(&work).status();
        let _ = fs::remove_file(work.join("lock"));
        fs::create_dir(work.join("next")).unwrap();
        fs::write(work.join("intent"), entry.to_string()).unwrap();
        if step == 2 {
            fs::create_dir(work.join("layers")).unwrap();
            fs::rename(work.join("upper"), work.join("layers/1")).unwrap();
        }
        let second = Second::start(&m, &work, &m.policy_path());
        let again = snapshot(&second.mnt(""));
        let d = snapshot_diff(&merged, &again);
        assert!(d.is_empty(), "step {step}: merged view after restart:\n{d}");
        drop(second);
        assert!(
            !work.join("intent").exists(),
            "step {step}: intent finished"
        );
        let log = offline(&work, "log", &[]);
        assert!(log.stdout.starts_with("1  "), "step {step}: {}", log.stdout);
        // Rewinding to it keeps every change (they were all before the checkpoint).
        offline(&work, "rewind", &["1"]).assert_ok("rewind 1");
        assert_eq!(
            offline(&work, "status", &[]).stdout,
            "D gone/\nA k.txt\nR sub/ -> moved/\n",
            "step {step}"
        );
    }
    assert_host_unchanged(&before, &m.host(""), "crash and restart");
}

#[test]
fn live_apply_keeps_the_merged_view_and_live_discard_shows_source_at_once() {
    let (m, dir, sock) = live("stage-live-apply");
    m.sh("set -e; echo A > new.txt; sed -i 's/one/ONE/' a.txt; echo B > sub/b.txt; rm -rf gone")
        .assert_ok("changes");
    via(&sock, "checkpoint", &[]).assert_ok("checkpoint");
    let merged = snapshot(&m.mnt(""));
    // A process holding a staged file open across the discard keeps its descriptor.
    let mut held = fs::File::open(m.mnt("sub/b.txt")).unwrap();
    let a = via(&sock, "apply", &["new.txt", "gone"]);
    a.assert_ok("live apply");
    assert_eq!(fs::read(m.host("new.txt")).unwrap(), b"A\n");
    assert!(!m.host("gone").exists(), "the delete applied");
    let after = snapshot(&m.mnt(""));
    let d = snapshot_diff(&merged, &after);
    assert!(d.is_empty(), "the merged view is unchanged by apply:\n{d}");
    assert_eq!(via(&sock, "status", &[]).stdout, "M a.txt\nM sub/b.txt\n");
    // apply ended the checkpoint.
    assert_eq!(via(&sock, "rewind", &["1"]).status.code(), Some(1));
    let host_before = snapshot(&m.host(""));
    let dd = via(&sock, "discard", &["sub"]);
    dd.assert_ok("live discard");
    assert_eq!(
        fs::read(m.mnt("sub/b.txt")).unwrap(),
        b"bee\n",
        "SOURCE at once"
    );
    let mut s = String::new();
    held.read_to_string(&mut s).unwrap();
    assert_eq!(s, "B\n", "the open descriptor keeps the discarded file");
    assert_eq!(via(&sock, "status", &[]).stdout, "M a.txt\n");
    assert_host_unchanged(&host_before, &m.host(""), "discard");
    let audit = fs::read_to_string(dir.join("audit.jsonl")).unwrap();
    let ops: Vec<String> = audit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["op"].to_string())
        .collect();
    // The refused rewind is audited too (`"ok": false`).
    assert_eq!(
        ops,
        ["\"stage-apply\"", "\"stage-rewind\"", "\"stage-discard\""]
    );
}

#[test]
fn live_apply_refusals_leave_source_untouched() {
    let (m, _dir, sock) = live("stage-live-refuse");
    m.sh("set -e; sed -i 's/one/ONE/' a.txt; echo B > sub/b.txt")
        .assert_ok("changes");
    // The host edits a.txt after it was staged (a conflict), and replaces sub/ with a
    // file (the staged sub/b.txt's parent is no longer a directory).
    std::thread::sleep(Duration::from_millis(20));
    fs::write(m.host("a.txt"), b"host edit\n").unwrap();
    fs::rename(m.host("sub"), m.root().join("sub.away")).unwrap();
    fs::write(m.host("sub"), b"a file now\n").unwrap();
    let before = snapshot(&m.host(""));
    let st = via(&sock, "status", &[]);
    assert!(st.stdout.contains("CM a.txt"), "{}", st.stdout);
    let a = via(&sock, "apply", &["a.txt"]);
    assert_eq!(
        a.status.code(),
        Some(1),
        "conflict without --force: {}",
        a.stdout
    );
    assert!(a.stdout.contains("refused"), "{}", a.stdout);
    let b = via(&sock, "apply", &["sub/b.txt"]);
    assert_eq!(
        b.status.code(),
        Some(1),
        "parent not a directory: {}",
        b.stdout
    );
    assert_host_unchanged(&before, &m.host(""), "refused applies");
    // Both stay staged.
    let st = via(&sock, "status", &[]);
    assert_eq!(st.stdout, "CM a.txt\nCT sub/\n");
    // --force: the staged version wins.
    via(&sock, "apply", &["--force", "a.txt"]).assert_ok("apply --force");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"ONE\ntwo\nthree\n");
}

#[test]
fn renames_across_checkpoints_flatten_and_apply_whole() {
    let (m, _dir, sock) = live("stage-flatten-renames");
    m.sh("set -e; mv sub moved; echo n > moved/new.txt")
        .assert_ok("turn 1");
    via(&sock, "checkpoint", &[]).assert_ok("checkpoint 1");
    m.sh("set -e; echo more >> moved/deep/c.txt; mv moved again; rm again/b.txt; mkdir gone2; mv gone/x gone2/x")
        .assert_ok("turn 2");
    via(&sock, "checkpoint", &[]).assert_ok("checkpoint 2");
    m.sh("set -e; mv again/deep again/deeper; echo top > again/deeper/top.txt")
        .assert_ok("turn 3");
    let merged = snapshot(&m.mnt(""));
    let before = snapshot(&m.host(""));
    // The whole stack over SOURCE, and each turn over the view before it.
    assert_eq!(
        via(&sock, "status", &[]).stdout,
        "R sub/ -> again/\nD again/b.txt\nR sub/deep/ -> again/deeper/\nM again/deeper/c.txt\nA again/deeper/top.txt\nA again/new.txt\nD gone/x\nA gone2/ (1 entry)\n"
    );
    assert_eq!(
        via(&sock, "status", &["--since", "2"]).stdout,
        "R again/deep/ -> again/deeper/\nA again/deeper/top.txt\n"
    );
    assert_host_unchanged(&before, &m.host(""), "status over three layers");
    // Applied whole (squashing the stack), the merged view unchanged, SOURCE equal to it.
    via(&sock, "apply", &[]).assert_ok("apply everything");
    let after = snapshot(&m.mnt(""));
    let d = snapshot_diff(&merged, &after);
    assert!(d.is_empty(), "the merged view is unchanged by apply:\n{d}");
    assert_eq!(
        fs::read(m.host("again/deeper/c.txt")).unwrap(),
        b"sea\nmore\n"
    );
    assert_eq!(fs::read(m.host("again/deeper/top.txt")).unwrap(), b"top\n");
    assert_eq!(fs::read(m.host("again/new.txt")).unwrap(), b"n\n");
    assert!(!m.host("sub").exists() && !m.host("again/b.txt").exists());
    assert_eq!(via(&sock, "status", &[]).stdout, "");
}

#[test]
fn a_file_open_across_a_live_checkpoint_stays_usable() {
    let (m, _dir, sock) = live("stage-open-ckpt");
    let mut held = fs::OpenOptions::new()
        .append(true)
        .open(m.mnt("a.txt"))
        .unwrap();
    held.write_all(b"four\n").unwrap();
    via(&sock, "checkpoint", &[]).assert_ok("checkpoint with a file open");
    // The kernel keeps its entries (same contents): a new open of the same file works.
    assert_eq!(
        fs::read(m.mnt("a.txt")).unwrap(),
        b"one\ntwo\nthree\nfour\n"
    );
    held.write_all(b"five\n").unwrap();
    drop(held);
    assert_eq!(
        fs::read(m.mnt("a.txt")).unwrap(),
        b"one\ntwo\nthree\nfour\nfive\n"
    );
    // A new open after the checkpoint writes into the live layer, never the sealed one.
    fs::write(m.mnt("a.txt"), b"new\n").unwrap();
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"new\n");
    assert_eq!(via(&sock, "status", &["--since", "1"]).stdout, "M a.txt\n");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"one\ntwo\nthree\n");
}

/// Everything writable but `docs/`, where a write waits for an approver.
const ASKS: &str = "mode = \"workspace-write\"\ndefault = \"write\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\n";

#[test]
fn approvals_status_and_reload_are_answered_during_a_long_live_apply() {
    use common::Peer;
    use serde_json::json;
    use std::time::Instant;
    let b = Mount::builder("stage-live-lane")
        .policy(ASKS)
        .arg("--allow-other");
    sample(&b.host(""));
    put(&b.host("docs/a.md"), b"alpha\n", 0o644);
    chown_tree(&b.host("."), 1000);
    let dir = stage_dir(&b);
    let sock = b.root().join("ctl.sock");
    let m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(&sock)
        .start();
    const N: usize = 4000;
    m.sh_as(
        1000,
        &format!("mkdir bulk && python3 -c \"[open('bulk/f%d' % i, 'w').write('x' * 100) for i in range({N})]\""),
    )
    .assert_ok("thousands of staged files");
    let mut ap = Peer::subscribe(&sock);
    // A write the policy asks about, held before the apply starts (while the apply swaps
    // the view, new requests wait at the door; a held one has left it).
    let writer = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
        .args(["sh", "-c", "echo approved > docs/a.md && echo written"])
        .current_dir(m.mnt(""))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ev = ap.next(Some("ask"));
    assert_eq!(ev["paths"], json!(["docs/a.md"]));
    let before = snapshot(&m.host(""));
    // The long apply, through the CLI, from another thread.
    let s2 = sock.clone();
    let apply = std::thread::spawn(move || {
        let o = via(&s2, "apply", &["bulk"]);
        (o, Instant::now())
    });
    // `status` is answered while it runs, and says what runs.
    let mut peer = Peer::connect(&sock);
    let started = Instant::now();
    loop {
        let s = peer.call(json!({"cmd": "status"}));
        assert_eq!(s["ok"], true, "{s}");
        if s["stage_busy"]["op"] == "stage apply" {
            assert_eq!(s["staged"], serde_json::Value::Null, "{s}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30) && !apply.is_finished(),
            "the apply never showed as running: {s}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A reload waits for the staging change, on its own lane: the control thread goes on.
    let mut reloader = Peer::connect(&sock);
    reloader.send(json!({"cmd": "reload"}));
    // `held` and the approver's answer come at once, not after the apply.
    let t = Instant::now();
    let held = peer.call(json!({"cmd": "held"}));
    assert_eq!(held["held"][0]["id"], ev["id"], "{held}");
    let a = ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true}));
    assert_eq!(a["ok"], true, "{a}");
    let s = peer.call(json!({"cmd": "status"}));
    let answered = Instant::now();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "held, decide and status took {:?} during the apply",
        t.elapsed()
    );
    assert_eq!(s["stage_busy"]["op"], "stage apply", "still applying: {s}");
    let (o, ended) = apply.join().unwrap();
    o.assert_ok("the live apply");
    assert!(answered < ended, "answered while the apply ran");
    assert_eq!(
        reloader.next(None)["ok"],
        true,
        "the reload, after the apply"
    );
    assert_eq!(o.stdout.lines().count(), 1, "one line: A bulk/ applied");
    assert_eq!(fs::read_dir(m.host("bulk")).unwrap().count(), N);
    // The approved write went on once the view was swapped: staged, SOURCE untouched.
    let w = writer.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&w.stdout), "written\n");
    assert_eq!(fs::read(m.mnt("docs/a.md")).unwrap(), b"approved\n");
    assert_eq!(fs::read(m.host("docs/a.md")).unwrap(), b"alpha\n");
    let _ = before;
    assert_eq!(via(&sock, "status", &[]).stdout, "M docs/a.md\n");
    let s = peer.call(json!({"cmd": "status"}));
    assert_eq!(s["staged"], 1, "{s}");
    assert!(s.get("stage_busy").is_none(), "{s}");
}

/// A caller looping copy_file_range of a 4 GiB sparse file (16 runs of 4 MiB of data)
/// through the mount, pass after pass, while a live checkpoint is taken: each request is
/// served in bounded steps and answers a short count, so the checkpoint's drain does not
/// wait for a 4 GiB copy (one request copying it all, holes written as zeros, takes about
/// 17 s on an ext4 disk: more than its 10 s); the copied bytes are right and the copy's
/// holes stay holes.
#[test]
fn a_long_copy_file_range_loop_does_not_hold_a_live_checkpoint() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileExt, MetadataExt};
    use std::sync::atomic::{AtomicBool, Ordering};
    const SIZE: u64 = 4 << 30;
    const RUN: usize = 4 << 20;
    let island = |i: u64| (i << 28, vec![i as u8 + 1; RUN]);
    let (m, dir, sock) = staged_live("stage-long-copy", |src| {
        sample(src);
        let f = fs::File::create(src.join("big")).unwrap();
        for i in 0..16 {
            let (at, data) = island(i);
            f.write_all_at(&data, at).unwrap();
        }
        f.set_len(SIZE).unwrap();
    });
    // SOURCE's 4 GiB file is not hashed: its size and times stand for it.
    let host = |p: &str| {
        fs::metadata(m.host(p)).map(|md| (md.len(), md.mtime(), md.mtime_nsec(), md.ctime()))
    };
    let before = host("big").unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (src, dst) = (m.mnt("big"), m.mnt("copy"));
    let s2 = stop.clone();
    let copier = std::thread::spawn(move || {
        let fi = fs::File::open(&src).unwrap();
        let fo = fs::File::create(&dst).unwrap();
        let (mut passes, mut calls, mut longest) = (0, 0, Duration::ZERO);
        while passes == 0 || !s2.load(Ordering::Relaxed) {
            let mut off: i64 = 0;
            while (off as u64) < SIZE {
                let (mut oi, mut oo) = (off, off);
                let t = Instant::now();
                // SAFETY: copy_file_range(2) between two descriptors this thread owns,
                // with pointers to local offsets.
                let n = unsafe {
                    libc::copy_file_range(
                        fi.as_raw_fd(),
                        &mut oi,
                        fo.as_raw_fd(),
                        &mut oo,
                        (SIZE - off as u64) as usize,
                        0,
                    )
                };
                longest = longest.max(t.elapsed());
                assert!(
                    n > 0,
                    "copy_file_range: {}",
                    std::io::Error::last_os_error()
                );
                off += n as i64;
                calls += 1;
            }
            passes += 1;
        }
        (passes, calls, longest)
    });
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let c = via(&sock, "checkpoint", &[]);
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    c.assert_ok("checkpoint while copy_file_range loops");
    assert!(
        took < Duration::from_secs(5),
        "the checkpoint took {took:?}"
    );
    let (passes, calls, longest) = copier.join().unwrap();
    assert!(
        calls > passes,
        "{calls} calls for {passes} passes: never a short count"
    );
    assert!(
        longest < Duration::from_secs(3),
        "one call took {longest:?}"
    );
    // The bytes: every run of data, zeros around it, the whole size.
    let f = fs::File::open(m.mnt("copy")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), SIZE);
    for i in 0..16 {
        let (at, data) = island(i);
        let mut got = vec![0u8; RUN + 4096];
        f.read_exact_at(&mut got, at).unwrap();
        assert_eq!(&got[..RUN], &data[..], "run {i}");
        assert!(got[RUN..].iter().all(|&b| b == 0), "after run {i}");
    }
    let mut tail = [1u8; 4096];
    f.read_exact_at(&mut tail, SIZE - 4096).unwrap();
    assert!(tail.iter().all(|&b| b == 0));
    drop(f);
    // Staged in DIR (the live layer: it was open across the checkpoint), holes kept.
    let staged = fs::metadata(dir.join("upper/copy")).unwrap();
    assert_eq!(staged.len(), SIZE);
    assert!(
        staged.blocks() * 512 < 256 << 20,
        "{} blocks",
        staged.blocks()
    );
    assert_eq!(host("big").unwrap(), before);
    assert!(host("copy").is_err(), "SOURCE got the copy");
}

/// A live checkpoint whose new view cannot be built (the test-only
/// `FENCEFS_FAULT_STAGE_REBUILD=1` in the daemon's environment): the command fails and
/// says the previous view is served read-only, and it is — every change through the mount
/// answers EROFS (a write of a staged and of a SOURCE file, `O_TRUNC`, truncate, create,
/// unlink, rename, chmod, utimes, mkdir, rmdir, symlink, link, setxattr), DIR's sealed
/// layer (the old upper), its new upper and SOURCE stay byte for byte as they were, and
/// reads and listings still work.
#[test]
fn a_checkpoint_whose_view_cannot_be_built_freezes_the_union() {
    use libc::EROFS;
    let b = Mount::builder("stage-live-frozen")
        .policy(WRITE)
        .env("FENCEFS_FAULT_STAGE_REBUILD", "1");
    sample(&b.host(""));
    put(&b.host("empty/.keep"), b"", 0o644);
    let (m, dir, sock) = start_staged_live(b);
    let source = snapshot(&m.host(""));
    m.sh("echo staged > t1.txt && sed -i 's/two/TWO/' a.txt && mkdir d && rm empty/.keep")
        .assert_ok("turn 1");
    let c = via(&sock, "checkpoint", &["-m", "turn 1"]);
    assert!(!c.ok(), "the checkpoint answered success: {}", c.stdout);
    assert!(
        c.stderr.contains("still served, read-only"),
        "checkpoint's stderr: {}",
        c.stderr
    );
    assert!(
        m.stderr().contains("FENCEFS_FAULT_STAGE_REBUILD"),
        "daemon log:\n{}",
        m.stderr()
    );
    assert!(
        dir.join("layers/1").is_dir(),
        "the checkpoint sealed no layer"
    );
    let layers = snapshot(&dir.join("layers"));
    let upper = snapshot(&dir.join("upper"));

    let w = |p: &str| fs::OpenOptions::new().write(true).open(m.mnt(p));
    let _ = assert_errno(w("t1.txt"), EROFS, "open a staged file for writing");
    let _ = assert_errno(w("sub/b.txt"), EROFS, "open a SOURCE file for writing");
    let _ = assert_errno(
        fs::OpenOptions::new().append(true).open(m.mnt("a.txt")),
        EROFS,
        "open for appending",
    );
    let _ = assert_errno(fs::File::create(m.mnt("a.txt")), EROFS, "O_TRUNC");
    let _ = assert_errno(truncate(&m.mnt("sub/deep/c.txt"), 0), EROFS, "truncate");
    let _ = assert_errno(fs::File::create(m.mnt("new.txt")), EROFS, "create");
    let _ = assert_errno(
        fs::File::create(m.mnt("sub/new.txt")),
        EROFS,
        "create in SOURCE's dir",
    );
    let _ = assert_errno(
        fs::remove_file(m.mnt("t1.txt")),
        EROFS,
        "unlink a staged file",
    );
    let _ = assert_errno(
        fs::remove_file(m.mnt("sub/b.txt")),
        EROFS,
        "unlink a SOURCE file",
    );
    let _ = assert_errno(fs::rename(m.mnt("a.txt"), m.mnt("a2.txt")), EROFS, "rename");
    let _ = assert_errno(
        fs::rename(m.mnt("t1.txt"), m.mnt("sub/t1.txt")),
        EROFS,
        "rename a staged file",
    );
    let _ = assert_errno(chmod(&m.mnt("a.txt"), 0o600), EROFS, "chmod");
    let _ = assert_errno(
        chmod(&m.mnt("sub/b.txt"), 0o600),
        EROFS,
        "chmod a SOURCE file",
    );
    let _ = assert_errno(utimes(&m.mnt("t1.txt"), 1), EROFS, "utimes");
    let _ = assert_errno(fs::create_dir(m.mnt("newdir")), EROFS, "mkdir");
    let _ = assert_errno(
        fs::create_dir(m.mnt("sub/newdir")),
        EROFS,
        "mkdir in SOURCE's dir",
    );
    let _ = assert_errno(fs::remove_dir(m.mnt("d")), EROFS, "rmdir a staged dir");
    let _ = assert_errno(fs::remove_dir(m.mnt("empty")), EROFS, "rmdir a SOURCE dir");
    let _ = assert_errno(
        std::os::unix::fs::symlink("a.txt", m.mnt("ln")),
        EROFS,
        "symlink",
    );
    let _ = assert_errno(fs::hard_link(m.mnt("a.txt"), m.mnt("hl")), EROFS, "link");
    let _ = assert_errno(setxattr(&m.mnt("a.txt"), "user.k", b"v"), EROFS, "setxattr");
    // Reads and listings as before.
    assert_eq!(fs::read(m.mnt("t1.txt")).unwrap(), b"staged\n");
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"one\nTWO\nthree\n");
    assert_eq!(fs::read(m.mnt("sub/deep/c.txt")).unwrap(), b"sea\n");
    let mut top = names_str(&m.mnt("")).unwrap();
    top.sort();
    assert_eq!(top, ["a.txt", "d", "empty", "gone", "sub", "t1.txt"]);
    assert!(names_str(&m.mnt("empty")).unwrap().is_empty());
    // Nothing written anywhere.
    assert_host_unchanged(&source, &m.host(""), "SOURCE");
    assert_host_unchanged(&layers, &dir.join("layers"), "DIR/layers");
    assert_host_unchanged(&upper, &dir.join("upper"), "DIR/upper");
}

/// A live checkpoint whose count of changes fails (the test-only
/// `FENCEFS_FAULT_STAGE_COUNT=1` in the daemon's environment, standing in for a tree too
/// deep or too wide to compare): the checkpoint is taken all the same — sealed, in the log
/// with its message and no count (0), a rewind target — the failure is logged, and the
/// mount stays writable.
#[test]
fn a_checkpoint_whose_count_fails_is_taken_and_logged() {
    let b = Mount::builder("stage-live-nocount")
        .policy(WRITE)
        .env("FENCEFS_FAULT_STAGE_COUNT", "1");
    sample(&b.host(""));
    let (m, dir, sock) = start_staged_live(b);
    let source = snapshot(&m.host(""));
    m.sh("echo first > t1.txt && sed -i 's/two/TWO/' a.txt")
        .assert_ok("turn 1");
    let c = via(&sock, "checkpoint", &["-m", "turn 1"]);
    c.assert_ok("checkpoint");
    assert_eq!(c.stdout, "checkpoint 1\n");
    assert!(
        m.stderr().contains(
            "counting the changes for a checkpoint: fault injected (FENCEFS_FAULT_STAGE_COUNT)"
        ),
        "daemon log:\n{}",
        m.stderr()
    );
    let log = via(&sock, "log", &["--json"]);
    log.assert_ok("log");
    let v: serde_json::Value = serde_json::from_str(&log.stdout).unwrap();
    assert_eq!(v[0]["n"], 1, "{v}");
    assert_eq!(v[0]["message"], "turn 1", "{v}");
    assert_eq!(v[0]["changes"], 0, "{v}");
    assert_eq!(v[0]["ended"], false, "{v}");
    assert_eq!(
        fs::read(dir.join("layers/1/t1.txt")).unwrap(),
        b"first\n",
        "the checkpoint's layer"
    );
    // Still writable; the next turn is told apart from the checkpoint.
    m.sh("echo second > t2.txt").assert_ok("turn 2");
    let since = via(&sock, "status", &["--since", "1"]);
    since.assert_ok("status --since 1");
    assert_eq!(since.stdout, "A t2.txt\n");
    via(&sock, "rewind", &["1"]).assert_ok("rewind 1");
    assert!(!m.mnt("t2.txt").exists());
    assert_eq!(fs::read(m.mnt("t1.txt")).unwrap(), b"first\n");
    assert_host_unchanged(&source, &m.host(""), "SOURCE");
}
