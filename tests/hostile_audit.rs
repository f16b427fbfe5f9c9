//! A hostile caller against the audit log: it must stay bounded on the host disk.
//!
//! - One process refused the same path in a tight loop: identical refusals are coalesced
//!   into `"repeat": N` lines, and every attempt is accounted for (Σ repeat + Σ dropped).
//! - Many different refused paths (nothing to coalesce): the file is rotated by size and
//!   only `--audit-keep` old files stay.
//!
//! The loops run as uid 1000 through `--allow-other`, like a sandboxed agent.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

type Line = serde_json::Value;

/// Every complete line of `p` as JSON. A file that does not exist has no lines: during a
/// rotation FILE is renamed to FILE.1 an instant before the fresh FILE is created. A last
/// line without its newline is one the daemon is still appending (read while polling):
/// not a line yet.
fn parse_lines(p: &Path) -> Vec<Line> {
    let text = match fs::read_to_string(p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => panic!("read {}: {e}", p.display()),
    };
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

fn numbered(p: &Path, n: u32) -> PathBuf {
    PathBuf::from(format!("{}.{n}", p.display()))
}

/// Runs a python3 program as uid 1000 in the mount; returns its stdout. python3 is taken
/// from the system directories (the caller's PATH may point into root-only homes).
fn python_as_1000(m: &Mount, program: &str) -> String {
    let script = format!(
        "exec env PATH=/usr/local/bin:/usr/bin:/bin python3 -c '{}'",
        program.replace('\'', "'\\''")
    );
    let o = m.sh_as(1000, &script);
    o.assert_ok("python3 as uid 1000");
    o.stdout
}

/// Σ repeat over event lines for `path`, Σ count over `dropped` lines.
fn tally(lines: &[Line], path: &str) -> (u64, u64) {
    let repeats = lines
        .iter()
        .filter(|l| l["path"] == path)
        .map(|l| l["repeat"].as_u64().expect("repeat is a number"))
        .sum();
    let dropped = lines
        .iter()
        .filter(|l| l["op"] == "audit" && l["event"] == "dropped")
        .map(|l| l["count"].as_u64().expect("count is a number"))
        .sum();
    (repeats, dropped)
}

#[test]
fn a_refusal_flood_is_coalesced_and_every_attempt_is_counted() {
    let mut b = Mount::builder("audit-flood")
        .policy("mode = \"workspace-write\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\n")
        .arg("--allow-other");
    let audit = b.root().join("audit.jsonl");
    b = b.arg("--audit").arg(&audit);
    put(&b.host("docs/a"), b"k\n", 0o644);
    for p in [b.host("docs"), b.host("docs/a")] {
        std::os::unix::fs::chown(p, Some(1000), Some(1000)).unwrap();
    }
    let m = b.start();

    // Open a read-only path for writing for 3 s. Opens are never cached by the kernel:
    // every attempt reaches the daemon, which refuses it (EACCES): one audited refusal each.
    // (A hidden name would not do: after the first lookup the kernel answers it from its
    // negative entry, exactly as for an absent name, and the daemon never sees the rest.)
    let started = Instant::now();
    let out = python_as_1000(
        &m,
        "import os, time\n\
         t0 = time.monotonic(); n = 0; ok = 0\n\
         while time.monotonic() - t0 < 3.0:\n\
         \x20   for _ in range(500):\n\
         \x20       try:\n\
         \x20           os.close(os.open('docs/a', os.O_WRONLY)); ok += 1\n\
         \x20       except PermissionError:\n\
         \x20           n += 1\n\
         print(os.getpid(), n, ok)\n",
    );
    let flood = started.elapsed();
    let f: Vec<u64> = out.split_whitespace().map(|w| w.parse().unwrap()).collect();
    let (pid, attempts, opened) = (f[0], f[1], f[2]);
    assert_eq!(opened, 0, "a hidden file was opened");
    assert!(
        attempts >= 10_000,
        "the loop barely ran: {attempts} attempts"
    );

    // The last window ends at most 1 s after the last refusal; then every attempt is in
    // a `repeat` or in a `dropped` count.
    let settled = eventually(Duration::from_secs(10), || {
        let (r, d) = tally(&parse_lines(&audit), "docs/a");
        r + d == attempts
    });
    let lines = parse_lines(&audit);
    let (repeats, dropped) = tally(&lines, "docs/a");
    assert!(
        settled,
        "Σ repeat {repeats} + Σ dropped {dropped} != {attempts} attempts; log:\n{lines:#?}"
    );
    // Stable: nothing more arrives later (no double counting).
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(parse_lines(&audit).len(), lines.len());

    let bytes = fs::metadata(&audit).unwrap().len();
    eprintln!(
        "audit flood: {attempts} refusals in {:.2} s → {} lines, {bytes} bytes ({:.0} B/s), \
         Σ repeat {repeats}, dropped {dropped}",
        flood.as_secs_f64(),
        lines.len(),
        bytes as f64 / flood.as_secs_f64()
    );
    // ≈3 s of flood: a line at once and one `repeat` line per 1 s window, plus at most
    // one `dropped` line per second.
    assert!(lines.len() <= 20, "{} lines:\n{lines:#?}", lines.len());
    assert!(
        repeats >= attempts / 2,
        "most attempts must be in repeat lines, not dropped"
    );
    let events: Vec<&Line> = lines.iter().filter(|l| l["op"] != "audit").collect();
    assert!(events.len() >= 2, "{lines:#?}");
    assert_eq!(
        events[0]["repeat"], 1,
        "the first refusal is written at once"
    );
    assert!(
        events.iter().any(|l| l["repeat"].as_u64().unwrap() > 1000),
        "{lines:#?}"
    );
    for l in &events {
        assert_eq!(l["op"], "open", "{l}");
        assert_eq!(l["path"], "docs/a", "{l}");
        assert_eq!(l["decision"], "deny", "{l}");
        assert_eq!(l["errno"], "EACCES", "{l}");
        assert_eq!(l["uid"], 1000, "{l}");
        assert_eq!(l["gid"], 1000, "{l}");
        assert_eq!(l["pid"], pid, "{l}");
        assert_eq!(l["rule"], "docs", "{l}");
        assert!(l["repeat"].as_u64().unwrap() >= 1, "{l}");
    }
    for l in lines.iter().filter(|l| l["op"] == "audit") {
        assert_eq!(l["event"], "dropped", "{l}");
    }
}

#[test]
fn distinct_refusals_rotate_the_file_and_keep_only_n_old_ones() {
    const MAX: u64 = 64 * 1024;
    const N: u32 = 3000;
    let mut b = Mount::builder("audit-rotate")
        .policy("[[rule]]\npath = \"secrets/*\"\naccess = \"none\"\n")
        .arg("--allow-other");
    let audit = b.root().join("audit.jsonl");
    b = b
        .arg("--audit")
        .arg(&audit)
        .arg("--audit-max-size")
        .arg("64K")
        .arg("--audit-keep")
        .arg("2");
    for i in 0..N {
        put(&b.host(format!("secrets/n{i}")), b"s", 0o644);
    }
    let m = b.start();

    // Each name is refused once: nothing to coalesce, one line per name (≈ 300 bytes),
    // so ≈ 900 KB in all: many rotations of 64 KiB files.
    let out = python_as_1000(
        &m,
        &format!(
            "import os\n\
             n = 0\n\
             for i in range({N}):\n\
             \x20   try:\n\
             \x20       os.close(os.open(\"secrets/n%d\" % i, os.O_RDONLY))\n\
             \x20   except FileNotFoundError:\n\
             \x20       n += 1\n\
             print(n)\n"
        ),
    );
    assert_eq!(out.trim(), N.to_string(), "every name must be refused");
    let last = format!("secrets/n{}", N - 1);
    assert!(
        eventually(Duration::from_secs(10), || parse_lines(&audit)
            .iter()
            .any(|l| l["path"] == last.as_str())),
        "the last refusal never reached {}",
        audit.display()
    );

    let files = [numbered(&audit, 2), numbered(&audit, 1), audit.clone()];
    for p in &files {
        assert!(p.exists(), "{} missing", p.display());
    }
    assert!(
        !numbered(&audit, 3).exists(),
        "more than --audit-keep 2 old files"
    );
    let mut indices = vec![];
    let mut longest = 0u64;
    let mut sizes = vec![];
    for p in &files {
        let text = fs::read_to_string(p).unwrap();
        // Every line whole once the daemon is quiet (`parse_lines` skips a partial tail).
        assert!(text.ends_with('\n'), "{}: a partial last line", p.display());
        longest = longest.max(text.lines().map(|l| l.len() as u64 + 1).max().unwrap_or(0));
        sizes.push(text.len() as u64);
        let lines = parse_lines(p);
        // A rotated-into file starts with the `rotated` line (all three are: the first
        // file of the run was deleted long ago).
        assert_eq!(lines[0]["op"], "audit", "{}: {}", p.display(), lines[0]);
        assert_eq!(
            lines[0]["event"],
            "rotated",
            "{}: {}",
            p.display(),
            lines[0]
        );
        assert!(lines[0]["dropped_total"].is_u64() && lines[0]["coalesced_total"] == 0);
        for l in &lines[1..] {
            if l["op"] == "audit" {
                assert_eq!(l["event"], "dropped", "{l}");
                continue;
            }
            assert_eq!(l["repeat"], 1, "distinct paths are never coalesced: {l}");
            assert_eq!(l["errno"], "ENOENT", "{l}");
            let path = l["path"].as_str().unwrap();
            let i: u32 = path.strip_prefix("secrets/n").unwrap().parse().unwrap();
            indices.push(i);
        }
    }
    for (p, size) in files.iter().zip(&sizes) {
        assert!(*size <= MAX + longest, "{}: {size} bytes", p.display());
    }
    // The two old files were full: rotation happens only when the next line does not fit.
    for (p, size) in files[..2].iter().zip(&sizes) {
        assert!(
            *size > MAX - longest,
            "{} rotated early: {size} bytes",
            p.display()
        );
    }
    // The kept lines are the newest refusals, oldest file first, in order.
    assert!(
        indices.windows(2).all(|w| w[0] < w[1]),
        "out of order: {indices:?}"
    );
    assert_eq!(indices.last(), Some(&(N - 1)));
    eprintln!(
        "audit rotation: {N} refusals → kept {} lines in 3 files of {sizes:?} bytes",
        indices.len()
    );
}
