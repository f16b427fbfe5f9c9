//! A reload as the kernel's caches show it (issue 17, findings 10, 6 and 11): a reload is
//! one instant for every caller of the mount — once any path shows the new policy, every
//! other path does too; a held directory change does not delay the invalidation of the
//! rest; and link/unlink/rename/stat under reloads and load never wait forever.

mod common;

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const OPEN: &str = "mode = \"danger\"\ndefault = \"write\"\n";

fn hiding(paths: &[&str]) -> String {
    let mut p = OPEN.to_string();
    for h in paths {
        p.push_str(&format!("[[rule]]\npath = \"{h}\"\naccess = \"none\"\n"));
    }
    p
}

/// Paths the two policies disagree on: visible under A, hidden under B, and the reverse.
const A_ONLY: &[&str] = &[
    "d", "d/c0", "d/c1", "d/c2", "d/c3", "d/sub", "d/sub/s0", "v0", "v1", "w/x",
];
const B_ONLY: &[&str] = &["h0", "h1", "w/y", "w/z"];

fn visible(m: &Mount, p: &str) -> bool {
    match fs::symlink_metadata(m.mnt(p)) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::NotFound => false,
        Err(e) => panic!("stat {p}: unexpected {e}"),
    }
}

/// Whether `p` shows policy A (`true`) or B.
fn shows_a(m: &Mount, p: &str) -> bool {
    visible(m, p) == A_ONLY.contains(&p)
}

#[test]
fn once_one_path_shows_a_reload_every_other_path_does() {
    let a = hiding(B_ONLY);
    let b = hiding(&["d", "v0", "v1", "w/x"]);
    let m = Mount::with("reload-order", Some(&a), None, |src| {
        for p in ["d/sub", "w"] {
            mkdirp(&src.join(p));
        }
        for p in A_ONLY.iter().chain(B_ONLY) {
            if *p != "d" && *p != "d/sub" {
                put(&src.join(p), b"x", 0o644);
            }
        }
        put(&src.join("stays"), b"y", 0o644);
    });
    let changed: Vec<&str> = A_ONLY.iter().chain(B_ONLY).copied().collect();
    let rounds = 30;
    let mut halves = Vec::new();
    let mut to_a = false;
    for round in 0..rounds {
        let now_a = !to_a;
        // Settled on the policy in force, and every name and attribute cached by the
        // kernel (positive and negative entries, listings).
        assert!(
            eventually(Duration::from_secs(15), || changed
                .iter()
                .all(|p| shows_a(&m, p) == now_a)),
            "round {round}: never settled on {}",
            if now_a { "A" } else { "B" }
        );
        let _ = names(&m.mnt(""));
        let _ = names(&m.mnt("w"));
        let _ = names(&m.mnt("d"));
        let canary = changed[round % changed.len()];
        m.reload_with(if to_a { &a } else { &b });
        let t = Instant::now();
        while shows_a(&m, canary) != to_a {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "round {round}: {canary} never showed the reload; stderr:\n{}",
                m.stderr()
            );
            thread::yield_now();
        }
        let stale: Vec<&str> = changed
            .iter()
            .copied()
            .filter(|p| shows_a(&m, p) != to_a)
            .collect();
        if !stale.is_empty() {
            halves.push(format!(
                "round {round} (to {}): {canary} showed it, still old: {stale:?}",
                if to_a { "A" } else { "B" }
            ));
        }
        to_a = !to_a;
    }
    assert!(
        halves.is_empty(),
        "half a policy in {} of {rounds} reloads:\n{}",
        halves.len(),
        halves.join("\n")
    );
    assert!(visible(&m, "stays"));
}
