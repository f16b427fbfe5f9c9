//! Single hunks on real staged mounts: `stage hunks PATH` numbers a staged text file's
//! hunks, `stage apply PATH#N[@ID]` carries only those into SOURCE (the rest stays staged
//! and the merged view keeps the agent's whole version), `stage discard PATH#N` drops
//! them from the merged view at once. Checked byte for byte (CRLF files, files without a
//! trailing newline), with the refusals: a binary file, a change made after it was shown
//! (`@ID`), a conflict with a host edit. A 50 MB file is done in bounded memory.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::stage::*;
use common::*;

/// `fencefs stage OP SOCKET ARGS…`.
fn via(sock: &Path, op: &str, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), op.into()];
    v.push(sock.into());
    v.extend(args.iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// Thirty numbered lines, with `end` after each.
fn numbered(end: &str) -> String {
    (1..=30).map(|i| format!("line {i}{end}")).collect()
}

/// `s` with line `n`'s text replaced (its terminator kept).
fn with_line(s: &str, n: usize, new: &str) -> String {
    s.replacen(&format!("line {n}\r"), &format!("{new}\r"), 1)
        .replacen(&format!("line {n}\n"), &format!("{new}\n"), 1)
}

/// The three-change version of `base`: lines 2, 15 and 28 rewritten.
fn three(base: &str) -> String {
    with_line(
        &with_line(&with_line(base, 2, "TWO"), 15, "FIFTEEN"),
        28,
        "XXVIII",
    )
}

/// The id on the first line of `stage hunks` (`PATH@ID: N hunks`).
fn id_of(listing: &str) -> String {
    let first = listing.lines().next().unwrap_or_default();
    let at = first.find('@').expect(listing);
    first[at + 1..at + 17].to_string()
}

#[test]
fn three_hunks_keep_one_discard_another_byte_for_byte() {
    let base = numbered("\n");
    let agent = three(&base);
    let (_m, _dir, sock) = staged_live("hunks-three", |src| {
        put(&src.join("f.txt"), base.as_bytes(), 0o644)
    });
    let m = _m;
    fs::write(m.mnt("f.txt"), &agent).unwrap();
    let h = via(&sock, "hunks", &["f.txt"]);
    h.assert_ok("stage hunks");
    assert!(h.stdout.starts_with("f.txt@"), "{}", h.stdout);
    assert!(
        h.stdout
            .contains(": 3 hunks\n#1 @@ -1,5 +1,5 @@\n line 1\n-line 2\n+TWO\n"),
        "{}",
        h.stdout
    );
    assert!(
        h.stdout.contains("\n#2 @@ -12,7 +12,7 @@\n"),
        "{}",
        h.stdout
    );
    assert!(
        h.stdout.contains("\n#3 @@ -25,6 +25,6 @@\n"),
        "{}",
        h.stdout
    );
    // `stage diff` numbers nothing and has the same three hunks.
    let d = via(&sock, "diff", &["f.txt"]);
    assert_eq!(d.stdout.matches("\n@@ ").count(), 3, "{}", d.stdout);
    assert!(!d.stdout.contains('#'), "{}", d.stdout);
    let id = id_of(&h.stdout);
    // Keep hunk 2: SOURCE gets it alone; the merged view keeps the agent's whole file.
    let a = via(&sock, "apply", &[&format!("f.txt#2@{id}")]);
    a.assert_ok("apply f.txt#2@ID");
    assert!(
        a.stdout
            .contains("applied M f.txt#2 (2 hunks still staged)"),
        "{}",
        a.stdout
    );
    let kept = with_line(&base, 15, "FIFTEEN");
    assert_eq!(fs::read_to_string(m.host("f.txt")).unwrap(), kept);
    assert_eq!(fs::read_to_string(m.mnt("f.txt")).unwrap(), agent);
    assert_eq!(
        fs::metadata(m.host("f.txt")).unwrap().mode() & 0o7777,
        0o644
    );
    // What stays staged is the other two hunks, no conflict.
    assert_eq!(via(&sock, "status", &[]).stdout, "M f.txt\n");
    let h2 = via(&sock, "hunks", &["f.txt"]);
    assert!(
        h2.stdout.contains(": 2 hunks\n#1 @@ -1,5 +1,5 @@\n"),
        "{}",
        h2.stdout
    );
    assert!(h2.stdout.contains("+XXVIII"), "{}", h2.stdout);
    assert!(!h2.stdout.contains("FIFTEEN"), "{}", h2.stdout);
    // Discard (now) hunk 1: gone from the merged view at once; SOURCE untouched.
    let before = fs::read(m.host("f.txt")).unwrap();
    via(&sock, "discard", &["f.txt#1"]).assert_ok("discard f.txt#1");
    assert_eq!(
        fs::read_to_string(m.mnt("f.txt")).unwrap(),
        with_line(&kept, 28, "XXVIII")
    );
    assert_eq!(fs::read(m.host("f.txt")).unwrap(), before);
    // The rest, whole: SOURCE is the merged view, nothing staged.
    via(&sock, "apply", &["f.txt"]).assert_ok("apply the rest");
    assert_eq!(
        fs::read_to_string(m.host("f.txt")).unwrap(),
        with_line(&kept, 28, "XXVIII")
    );
    assert_eq!(via(&sock, "status", &[]).stdout, "");
}

#[test]
fn crlf_and_no_trailing_newline_round_trip() {
    let crlf = numbered("\r\n");
    let bare = numbered("\n");
    let bare = bare.trim_end_matches('\n').to_string();
    let (m, _dir, sock) = staged_live("hunks-bytes", |src| {
        put(&src.join("crlf.txt"), crlf.as_bytes(), 0o644);
        put(&src.join("nonl.txt"), bare.as_bytes(), 0o600);
    });
    let crlf_agent = three(&crlf);
    // The last line rewritten, still without a newline, and line 2.
    let nonl_agent = with_line(&bare, 2, "TWO").replace("line 30", "THIRTY");
    fs::write(m.mnt("crlf.txt"), &crlf_agent).unwrap();
    fs::write(m.mnt("nonl.txt"), &nonl_agent).unwrap();
    let h = via(&sock, "hunks", &["nonl.txt"]);
    assert!(
        h.stdout.contains("+THIRTY\n\\ No newline at end of file\n"),
        "{}",
        h.stdout
    );
    let out = via(&sock, "apply", &["crlf.txt#1,3", "nonl.txt#2"]);
    out.assert_ok("apply hunks of two files");
    let crlf_src = with_line(&with_line(&crlf, 2, "TWO"), 28, "XXVIII");
    assert_eq!(fs::read(m.host("crlf.txt")).unwrap(), crlf_src.as_bytes());
    let nonl_src = bare.replace("line 30", "THIRTY");
    assert_eq!(fs::read(m.host("nonl.txt")).unwrap(), nonl_src.as_bytes());
    assert_eq!(
        fs::metadata(m.host("nonl.txt")).unwrap().mode() & 0o7777,
        0o600
    );
    assert_eq!(fs::read(m.mnt("crlf.txt")).unwrap(), crlf_agent.as_bytes());
    assert_eq!(fs::read(m.mnt("nonl.txt")).unwrap(), nonl_agent.as_bytes());
    // Discard the last hunk of the file without a newline: the merged view gets SOURCE's
    // last line back, still without one.
    via(&sock, "discard", &["nonl.txt#1"]).assert_ok("discard nonl.txt#1");
    assert_eq!(fs::read(m.mnt("nonl.txt")).unwrap(), nonl_src.as_bytes());
    via(&sock, "discard", &["crlf.txt#1"]).assert_ok("discard crlf.txt#1");
    assert_eq!(fs::read(m.mnt("crlf.txt")).unwrap(), crlf_src.as_bytes());
    assert_eq!(via(&sock, "status", &[]).stdout, "");
}

#[test]
fn binary_files_and_conflicts_are_whole_path_only() {
    let base = numbered("\n");
    let (m, _dir, sock) = staged_live("hunks-refused", |src| {
        put(&src.join("bin"), b"a\0b\nline\n", 0o644);
        put(&src.join("f.txt"), base.as_bytes(), 0o644);
    });
    fs::write(m.mnt("bin"), b"a\0b\nLINE\n").unwrap();
    let h = via(&sock, "hunks", &["bin"]);
    h.assert_fail("hunks of a binary file");
    assert!(h.stderr.contains("a binary file"), "{}", h.stderr);
    let a = via(&sock, "apply", &["bin#1"]);
    a.assert_fail("apply bin#1");
    assert!(
        a.stdout.contains("refused bin#1") && a.stdout.contains("binary"),
        "{}",
        a.stdout
    );
    assert_eq!(fs::read(m.host("bin")).unwrap(), b"a\0b\nline\n");
    // Conflict: the host edits SOURCE after the agent's change.
    fs::write(m.mnt("f.txt"), three(&base)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let host = base.replace("line 10\n", "host ten\n");
    fs::write(m.host("f.txt"), &host).unwrap();
    assert_eq!(via(&sock, "status", &["f.txt"]).stdout, "CM f.txt\n");
    let a = via(&sock, "apply", &["f.txt#1"]);
    a.assert_fail("apply a conflicting path's hunk");
    assert!(
        a.stdout.contains("refused CM f.txt#1: conflict"),
        "{}",
        a.stdout
    );
    assert_eq!(fs::read_to_string(m.host("f.txt")).unwrap(), host);
    // A hunk number past the last.
    let a = via(&sock, "discard", &["f.txt#9"]);
    a.assert_fail("discard f.txt#9");
    assert!(a.stdout.contains("no hunk 9 (it has 3)"), "{}", a.stdout);
}

#[test]
fn a_change_after_it_was_shown_is_refused_and_nothing_written() {
    let base = numbered("\n");
    let (m, _dir, sock) = staged_live("hunks-race", |src| {
        put(&src.join("f.txt"), base.as_bytes(), 0o644)
    });
    fs::write(m.mnt("f.txt"), three(&base)).unwrap();
    let id = id_of(&via(&sock, "hunks", &["f.txt"]).stdout);
    // status --json shows the same id.
    let js: serde_json::Value =
        serde_json::from_str(&via(&sock, "status", &["--json"]).stdout).unwrap();
    assert_eq!(js[0]["id"], serde_json::Value::from(id.clone()));
    let st = fs::metadata(m.host("f.txt")).unwrap();
    // The agent appends between the look and the apply.
    m.sh("echo more >> f.txt").assert_ok("append");
    for op in ["apply", "discard"] {
        let a = via(&sock, op, &[&format!("f.txt#1@{id}")]);
        a.assert_fail("a hunk of a change made after it was shown");
        assert!(
            a.stdout.contains("changed since it was shown"),
            "{}",
            a.stdout
        );
    }
    let now = fs::metadata(m.host("f.txt")).unwrap();
    assert_eq!(
        (now.ino(), now.mtime_nsec(), now.len()),
        (st.ino(), st.mtime_nsec(), st.len())
    );
    assert_eq!(fs::read_to_string(m.host("f.txt")).unwrap(), base);
    assert_eq!(
        fs::read_to_string(m.mnt("f.txt")).unwrap(),
        format!("{}more\n", three(&base))
    );
}

/// The daemon's peak resident memory (VmHWM), in bytes.
fn peak(pid: i32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let l = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = l.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn a_fifty_megabyte_file_in_bounded_memory() {
    const LINES: usize = 1_250_000; // 40 bytes a line: 50 MB
    let line = |i: usize| format!("{i:>10} a quick brown fox jumps over\n");
    let base: String = (0..LINES).map(line).collect();
    assert_eq!(base.len(), 50_000_000);
    let agent = base
        .replacen(&line(10), "ten\n", 1)
        .replacen(&line(600_000), "six hundred thousand\n", 1)
        .replacen(&line(1_249_990), "near the end\n", 1);
    let (m, _dir, sock) = staged_live("hunks-big", |src| {
        put(&src.join("big.txt"), base.as_bytes(), 0o644)
    });
    fs::write(m.mnt("big.txt"), &agent).unwrap();
    let before = peak(m.pid());
    let h = via(&sock, "hunks", &["big.txt"]);
    h.assert_ok("stage hunks of 50 MB");
    assert!(h.stdout.contains(": 3 hunks\n"), "{}", h.stdout);
    via(&sock, "apply", &["big.txt#2"]).assert_ok("apply big.txt#2");
    // Documented bound (docs/src/staging.md): the two versions, the result and 40 bytes
    // a line, about 4× the file: 200 MB here; 260 MB leaves room for the rest.
    let grew = peak(m.pid()).saturating_sub(before);
    eprintln!("daemon peak RSS grew by {} MB", grew >> 20);
    assert!(
        grew < 260 << 20,
        "the daemon grew by {grew} bytes for a 50 MB file"
    );
    let want = base.replacen(&line(600_000), "six hundred thousand\n", 1);
    assert!(fs::read(m.host("big.txt")).unwrap() == want.as_bytes());
    assert!(fs::read(m.mnt("big.txt")).unwrap() == agent.as_bytes());
    assert_eq!(via(&sock, "status", &[]).stdout, "M big.txt\n");
    let h = via(&sock, "hunks", &["big.txt"]);
    assert!(h.stdout.contains(": 2 hunks\n"), "{}", h.stdout);
}

#[test]
fn offline_on_a_dir_with_checkpoints_and_json() {
    let base = numbered("\n");
    let (mut m, dir, sock) = staged_live("hunks-offline", |src| {
        put(&src.join("f.txt"), base.as_bytes(), 0o644)
    });
    let agent = three(&base);
    fs::write(m.mnt("f.txt"), &agent).unwrap();
    via(&sock, "checkpoint", &["-m", "turn 1"]).assert_ok("checkpoint");
    stop(&mut m);
    // --json: the numbered hunks, each line escaped, the same id as status --json.
    let j = stage(&["hunks", "--json", "f.txt"], &dir);
    j.assert_ok("hunks --json");
    let v: serde_json::Value = serde_json::from_str(&j.stdout).unwrap();
    assert_eq!(v["path"], "f.txt");
    assert_eq!(v["change"], "M");
    assert_eq!(v["hunks"].as_array().unwrap().len(), 3);
    assert_eq!(v["hunks"][1]["n"], 2);
    assert_eq!(v["hunks"][1]["header"], "@@ -12,7 +12,7 @@");
    assert!(
        v["hunks"][1]["lines"]
            .as_array()
            .unwrap()
            .contains(&"+FIFTEEN".into())
    );
    let st: serde_json::Value =
        serde_json::from_str(&stage(&["status", "--json"], &dir).stdout).unwrap();
    assert_eq!(st[0]["id"], v["id"]);
    let id = v["id"].as_str().unwrap();
    // With DIR's lock (no daemon): apply hunks 1 and 3, then discard what is left.
    let a = stage(&["apply", &format!("f.txt#3,1@{id}")], &dir);
    a.assert_ok("apply --dir f.txt#1,3@ID");
    assert!(
        a.stdout
            .contains("applied M f.txt#1,3 (1 hunk still staged)"),
        "{}",
        a.stdout
    );
    let src = with_line(&with_line(&base, 2, "TWO"), 28, "XXVIII");
    assert_eq!(fs::read_to_string(m.host("f.txt")).unwrap(), src);
    // The checkpoint was squashed by the apply: no longer a rewind target.
    stage(&["rewind", "1"], &dir).assert_fail("rewind to an ended checkpoint");
    assert!(
        stage(&["hunks", "f.txt"], &dir)
            .stdout
            .contains(": 1 hunk\n#1 @@ -12,7 +12,7 @@")
    );
    // Every hunk named: the whole path (nothing left staged).
    stage(&["discard", "f.txt#1"], &dir).assert_ok("discard --dir f.txt#1");
    assert_eq!(stage(&["status"], &dir).stdout, "");
    assert_eq!(fs::read_to_string(m.host("f.txt")).unwrap(), src);
    let h = stage(&["hunks", "f.txt"], &dir);
    h.assert_fail("hunks of an unstaged path");
    assert!(h.stderr.contains("nothing staged there"), "{}", h.stderr);
}
