//! Cycles of file renames on a staged mount (`mv x t; mv y x; mv t y`, and longer ones):
//! each path is one `R old -> new` in `stage status` (text and `--json`) and `stage diff`
//! (which `git apply` reproduces), apply lands each path's staged bytes and leaves
//! SOURCE's other files alone, a host edit of one path of a cycle refuses the whole cycle,
//! a PATH of a cycle applies or discards the whole cycle (a PATH@ID of one rename alone is
//! refused), and SIGKILL in the middle of the apply of a long cycle leaves every path
//! applied or still staged, nothing lost; with the daemon's engine and the kernel one.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::stage::*;
use common::*;

fn ctl(sock: &Path, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), args[0].into(), sock.into()];
    v.extend(args[1..].iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// Each of `names` in SOURCE, holding its own name and a newline.
fn files(src: &Path, names: &[&str]) {
    for n in names {
        put(&src.join(n), format!("{n}\n").as_bytes(), 0o644);
    }
}

fn text(p: PathBuf) -> String {
    String::from_utf8(fs::read(p).unwrap()).unwrap()
}

/// The `--json` objects of `stage status`, by path.
fn json(sock: &Path) -> BTreeMap<String, serde_json::Value> {
    let out = ctl(sock, &["status", "--json"]);
    out.assert_ok("status --json");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap().to_string(), e.clone()))
        .collect()
}

const SWAPS: &str = "mv x t && mv y x && mv t y \
     && mv a t && mv c a && mv b c && mv t b \
     && mv d/p d/t && mv d/q d/p && mv d/t d/q && echo more >> d/q";

/// x <-> y; a -> b -> c -> a (a's file now at b, b's at c, c's at a); d/p <-> d/q with
/// d/p's file (now at d/q) edited.
fn swapped(src: &Path) {
    files(src, &["x", "y", "a", "b", "c", "k", "d/p", "d/q"]);
}

const LISTED: &str =
    "R c -> a\nR a -> b\nR b -> c\nR d/q -> d/p\nR d/p -> d/q\nR y -> x\nR x -> y\n";

#[test]
fn a_swap_and_a_three_cycle_are_listed_diffed_and_applied_as_renames() {
    let (m, _dir, sock) = staged_live("stage-cycles", swapped);
    let k = fs::metadata(m.host("k")).unwrap();
    m.sh(SWAPS).assert_ok("cycles through the mount");
    assert_eq!(ctl(&sock, &["status"]).stdout, LISTED);
    let v = json(&sock);
    for (path, from) in [
        ("x", "y"),
        ("y", "x"),
        ("a", "c"),
        ("b", "a"),
        ("d/q", "d/p"),
    ] {
        assert_eq!(v[path]["change"], "renamed", "{path}");
        assert_eq!(v[path]["from"], from, "{path}");
        assert_eq!(v[path]["conflict"], false, "{path}");
    }
    let diff = ctl(&sock, &["diff"]).stdout;
    for block in [
        "diff --git a/y b/x\nrename from y\nrename to x\n",
        "diff --git a/x b/y\nrename from x\nrename to y\n",
        "diff --git a/c b/a\nrename from c\nrename to a\n",
        "rename from d/p\nrename to d/q\n--- a/d/p\n+++ b/d/q\n@@ -1 +1,2 @@\n d/p\n+more\n",
    ] {
        assert!(diff.contains(block), "{block}\nnot in\n{diff}");
    }
    // git apply reproduces the cycles in a copy of SOURCE.
    let copy = git_applied(&m, &diff);
    for (p, want) in [("x", "y\n"), ("y", "x\n"), ("a", "c\n"), ("b", "a\n")] {
        assert_eq!(text(copy.join(p)), want, "git apply: {p}");
    }
    assert_eq!(text(copy.join("d/q")), "d/p\nmore\n");

    let a = ctl(&sock, &["apply"]);
    a.assert_ok("apply");
    for line in LISTED.lines() {
        assert!(
            a.stdout.contains(&format!("applied {line}\n")),
            "{line}: {}",
            a.stdout
        );
    }
    let want = [
        ("x", "y\n"),
        ("y", "x\n"),
        ("a", "c\n"),
        ("b", "a\n"),
        ("c", "b\n"),
        ("d/p", "d/q\n"),
        ("d/q", "d/p\nmore\n"),
        ("k", "k\n"),
    ];
    for (p, w) in want {
        assert_eq!(text(m.host(p)), w, "SOURCE {p}");
        assert_eq!(text(m.mnt(p)), w, "merged view {p}");
    }
    let names = |d: PathBuf| {
        let mut v: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(m.host("")), ["a", "b", "c", "d", "k", "x", "y"]);
    assert_eq!(names(m.host("d")), ["p", "q"]);
    let k2 = fs::metadata(m.host("k")).unwrap();
    assert_eq!((k2.ino(), k2.mtime()), (k.ino(), k.mtime()), "k untouched");
    assert_eq!(ctl(&sock, &["status"]).stdout, "", "nothing left staged");
}

#[test]
fn a_host_edit_of_one_path_of_a_cycle_refuses_the_whole_cycle() {
    let (m, _dir, sock) = staged_live("stage-cycles-conflict", swapped);
    m.sh(SWAPS).assert_ok("cycles through the mount");
    std::thread::sleep(Duration::from_millis(30));
    // The host edits y (of the swap) and b (of the 3-cycle) in place.
    fs::write(m.host("y"), b"y\nHOST\n").unwrap();
    fs::write(m.host("b"), b"b\nHOST\n").unwrap();
    assert_eq!(
        ctl(&sock, &["status"]).stdout,
        "R c -> a\nCR a -> b\nCR b -> c\nR d/q -> d/p\nR d/p -> d/q\nCR y -> x\nCR x -> y\n"
    );
    assert_eq!(json(&sock)["x"]["conflict"], true);
    let r = ctl(&sock, &["apply"]);
    r.assert_fail("a conflict is refused");
    for line in [
        "refused CR y -> x: conflict",
        "refused CR x -> y: conflict",
        "refused CR a -> b: conflict",
        "refused CR b -> c: conflict",
        "refused R c -> a: another rename of its cycle was refused",
        "applied R d/q -> d/p",
        "applied R d/p -> d/q",
    ] {
        assert!(r.stdout.contains(line), "{line}: {}", r.stdout);
    }
    // Nothing of the refused cycles reached SOURCE; the merged view is unchanged.
    for (p, host, view) in [
        ("x", "x\n", "y\n"),
        ("y", "y\nHOST\n", "x\n"),
        ("a", "a\n", "c\n"),
        ("b", "b\nHOST\n", "a\n"),
        ("c", "c\n", "b\n"),
    ] {
        assert_eq!(text(m.host(p)), host, "SOURCE {p}");
        assert_eq!(text(m.mnt(p)), view, "merged view {p}");
    }
    assert_eq!(text(m.host("d/q")), "d/p\nmore\n");
    assert_eq!(
        ctl(&sock, &["status"]).stdout,
        "R c -> a\nCR a -> b\nCR b -> c\nCR y -> x\nCR x -> y\n"
    );
    // --force applies the staged versions, whole.
    ctl(&sock, &["apply", "--force", "x"]).assert_ok("forced");
    assert_eq!(
        (text(m.host("x")), text(m.host("y"))),
        ("y\n".into(), "x\n".into())
    );
}

#[test]
fn a_path_of_a_cycle_applies_or_discards_the_whole_cycle_and_an_id_alone_is_refused() {
    let (m, _dir, sock) = staged_live("stage-cycles-partial", swapped);
    m.sh(SWAPS).assert_ok("cycles through the mount");
    let v = json(&sock);
    let id = |p: &str| format!("{p}@{}", v[p]["id"].as_str().unwrap());
    // One rename of a cycle by its id: refused, apply and discard alike.
    let r = ctl(&sock, &["apply", &id("b")]);
    r.assert_fail("part of a cycle");
    assert!(
        r.stdout.contains(
            "refused R a -> b: part of a cycle of renames: apply all of its paths together"
        ),
        "{}",
        r.stdout
    );
    let r = ctl(&sock, &["discard", &id("x")]);
    r.assert_fail("part of a cycle");
    assert!(
        r.stdout.contains(
            "refused R y -> x: part of a cycle of renames: discard all of its paths together"
        ),
        "{}",
        r.stdout
    );
    assert_eq!(ctl(&sock, &["status"]).stdout, LISTED, "nothing changed");
    // Every rename of the cycle by its id: applied.
    ctl(&sock, &["apply", &id("x"), &id("y")]).assert_ok("the swap by ids");
    assert_eq!(
        (text(m.host("x")), text(m.host("y"))),
        ("y\n".into(), "x\n".into())
    );
    // One path of the 3-cycle: the whole cycle, in status, diff and apply.
    assert_eq!(
        ctl(&sock, &["status", "a"]).stdout,
        "R c -> a\nR a -> b\nR b -> c\n"
    );
    assert!(
        ctl(&sock, &["diff", "a"])
            .stdout
            .contains("rename from b\nrename to c\n")
    );
    let a = ctl(&sock, &["apply", "a"]);
    a.assert_ok("apply a");
    assert!(a.stdout.contains("applied R b -> c\n"), "{}", a.stdout);
    for (p, w) in [("a", "c\n"), ("b", "a\n"), ("c", "b\n")] {
        assert_eq!(text(m.host(p)), w, "SOURCE {p}");
    }
    assert_eq!(
        ctl(&sock, &["status"]).stdout,
        "R d/q -> d/p\nR d/p -> d/q\n"
    );
    // Discarding one path of a swap takes the whole swap back.
    let d = ctl(&sock, &["discard", "d/p", "d/q"]);
    d.assert_ok("discard");
    assert_eq!(
        d.stdout, "discarded R d/q -> d/p\ndiscarded R d/p -> d/q\n",
        "each once"
    );
    assert_eq!(ctl(&sock, &["status"]).stdout, "");
    assert_eq!(text(m.mnt("d/p")), "d/p\n");
    assert_eq!(text(m.mnt("d/q")), "d/q\n");
    assert_eq!(text(m.host("d/p")), "d/p\n");
}

#[test]
fn a_chain_of_renames_that_does_not_close_stays_as_it_was_listed() {
    let (m, _dir, sock) = staged_live("stage-cycles-chain", |s| files(s, &["x", "y", "z"]));
    // x's file to t, y's to x: no cycle (t is new, y is gone).
    m.sh("mv x t && mv y x").assert_ok("a chain");
    assert_eq!(ctl(&sock, &["status"]).stdout, "A t\nM x\nD y\n");
    ctl(&sock, &["apply"]).assert_ok("apply");
    for (p, w) in [("t", "x\n"), ("x", "y\n"), ("z", "z\n")] {
        assert_eq!(text(m.host(p)), w, "SOURCE {p}");
    }
    assert!(!m.host("y").exists());
}

/// Two hard links of one SOURCE file, both changed (as `chmod -R` does to a pnpm store's
/// links): each staged copy's origin is that one object, which is SOURCE's at the file's
/// own path — no move, no cycle: `M x`, `M y`, each applied and discarded on its own.
#[test]
fn two_changed_hard_links_of_one_file_are_not_a_cycle() {
    let (m, _dir, sock) = staged_live("stage-cycles-links", |s| {
        files(s, &["x", "z"]);
        fs::hard_link(s.join("x"), s.join("y")).unwrap();
    });
    m.sh("echo more >> x && chmod 600 y")
        .assert_ok("change both links");
    assert_eq!(ctl(&sock, &["status"]).stdout, "M x\nm y\n");
    ctl(&sock, &["discard", "y"]).assert_ok("discard y alone");
    assert_eq!(ctl(&sock, &["status"]).stdout, "M x\n");
    ctl(&sock, &["apply", "x"]).assert_ok("apply x alone");
    assert_eq!(text(m.host("x")), "x\nmore\n");
    assert_eq!(text(m.host("z")), "z\n");
}

const N: usize = 1500;

fn cyc(i: usize) -> String {
    format!("c/f{i:04}")
}

/// `c/fNNNN` after `mv c/f0000 t; mv c/f0001 c/f0000; …; mv t c/f1499`: each path holds
/// the next one's file, the last the first's.
fn long_cycle(src: &Path) -> (BTreeMap<String, Vec<u8>>, BTreeMap<String, Vec<u8>>) {
    let mut orig = BTreeMap::new();
    for i in 0..N {
        let data = pseudo_random(64 + (i * 37) % 4096, i as u64 + 1);
        put(&src.join(cyc(i)), &data, 0o644);
        orig.insert(cyc(i), data);
    }
    let staged = (0..N)
        .map(|i| (cyc(i), orig[&cyc((i + 1) % N)].clone()))
        .collect();
    (orig, staged)
}

fn read(p: &Path) -> Option<Vec<u8>> {
    match fs::read(p) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("{}: {e}", p.display()),
    }
}

#[test]
fn sigkill_in_the_apply_of_a_long_cycle_leaves_each_path_applied_or_staged() {
    let (mut orig, mut want) = (BTreeMap::new(), BTreeMap::new());
    let (mut m, dir) = staged("stage-cycles-crash", WRITE, |s| {
        (orig, want) = long_cycle(s);
        put(&s.join("other"), b"other\n", 0o600);
    });
    m.sh(&format!(
        "cd c && mv f0000 ../t && i=1 && while [ $i -lt {N} ]; do \
           mv $(printf f%04d $i) $(printf f%04d $((i-1))); i=$((i+1)); done \
         && mv ../t $(printf f%04d {})",
        N - 1
    ))
    .assert_ok("a cycle of {N} renames");
    stop(&mut m);
    let st = offline(&dir, "status", &[]);
    assert_eq!(st.stdout.lines().count(), N, "{}", &st.stdout[..200]);
    assert!(
        st.stdout.starts_with("R c/f0001 -> c/f0000\n"),
        "{}",
        &st.stdout[..200]
    );
    assert!(
        st.stdout
            .ends_with(&format!("R c/f0000 -> {}\n", cyc(N - 1)))
    );
    let (mut killed, mut partial) = (0, 0);
    // Kill once the apply shows the Nth path of the cycle being written.
    for at in [3, 1100, 1400] {
        let mut child = Command::new(BIN)
            .args(["stage", "apply", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let p = m.host(cyc(at));
        let tmp = m.host(format!("c/.f{at:04}.fencefs-apply-{}", child.id()));
        let t = Instant::now();
        while child.try_wait().unwrap().is_none()
            && fs::symlink_metadata(&tmp).is_err()
            && read(&p).as_ref() != Some(&want[&cyc(at)])
        {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "apply never reached {at}"
            );
            std::thread::sleep(Duration::from_micros(300));
        }
        if child.try_wait().unwrap().is_none() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            killed += 1;
        }
        let _ = child.wait();
        // A new daemon recovers; every path is applied (and unstaged) or still staged.
        let second = Second::start(&m, &dir, &m.policy_path());
        let mut pending = 0;
        for (p, w) in &want {
            let now = read(&m.host(p));
            if now.as_ref() == Some(w) {
                assert!(
                    fs::symlink_metadata(dir.join("upper").join(p)).is_err(),
                    "{p} applied but still staged"
                );
            } else {
                assert_eq!(now.as_ref(), Some(&orig[p]), "SOURCE {p}: neither version");
                pending += 1;
            }
            assert_eq!(read(&second.mnt.join(p)).as_ref(), Some(w), "view {p}");
        }
        let temps: Vec<_> = fs::read_dir(m.host("c"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".fencefs-"))
            .collect();
        assert!(temps.is_empty(), "temporary entries left: {temps:?}");
        assert_eq!(read(&m.host("other")).unwrap(), b"other\n");
        eprintln!("killed at {at}: {pending} paths still staged");
        partial += usize::from(pending > 0 && pending < N);
        drop(second);
        if pending == 0 {
            break;
        }
        offline(&dir, "status", &[]).assert_ok("status after recovery");
    }
    assert!(killed >= 1, "no apply was killed while running");
    assert!(partial >= 1, "no kill left the cycle partly applied");
    offline(&dir, "apply", &[]).assert_ok("the last apply");
    for (p, w) in &want {
        assert_eq!(read(&m.host(p)).as_ref(), Some(w), "SOURCE {p}");
    }
    assert_eq!(offline(&dir, "status", &[]).stdout, "");
}
