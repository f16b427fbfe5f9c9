//! File renames on a staged mount: `mv a b` is one `R a -> b` in `stage status`,
//! `--json` and `diff` (git's `rename from`/`rename to`), is applied as a rename in
//! SOURCE (the file keeps its inode there), together with whatever the agent changed in
//! it afterwards, and is applied or discarded whole whichever of its names is given.
//! A host edit of the old file is a conflict: `apply` refuses it and SOURCE keeps the
//! host's bytes at the old name, nothing at the new one. Swapped names are two renames
//! (`R y -> x`, `R x -> y`: more in `stage_cycles.rs`), and `mv d d2; mkdir d; echo new >
//! d/f` applies both.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::stage::*;
use common::*;

fn ctl(sock: &Path, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), args[0].into(), sock.into()];
    v.extend(args[1..].iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

#[test]
fn file_renames_are_listed_and_applied_as_renames() {
    let (m, _dir, sock) = staged_live("stage-moves", |src| {
        put(&src.join("k"), b"keep\n", 0o640);
        put(&src.join("m"), b"one\n", 0o644);
        put(&src.join("x"), b"x\n", 0o644);
        put(&src.join("y"), b"y\n", 0o644);
        fs::create_dir(src.join("d")).unwrap();
        put(&src.join("d/f"), b"f\n", 0o644);
    });
    let k_ino = fs::metadata(m.host("k")).unwrap().ino();
    m.sh(
        "mv k k2 && mv m m2 && echo two >> m2 && mv x t && mv y x && mv t y \
          && mv d d2 && mkdir d && echo new > d/f",
    )
    .assert_ok("renames through the mount");
    assert_eq!(
        ctl(&sock, &["status"]).stdout,
        "A d/ (1 entry)\nR d/ -> d2/\nR k -> k2\nR m -> m2\nR y -> x\nR x -> y\n"
    );
    let json = ctl(&sock, &["status", "--json"]).stdout;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let k2 = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "k2")
        .expect("k2 listed");
    assert_eq!(k2["change"], "renamed");
    assert_eq!(k2["from"], "k");
    let diff = ctl(&sock, &["diff"]).stdout;
    assert!(
        diff.contains("diff --git a/k b/k2\nrename from k\nrename to k2\n"),
        "{diff}"
    );
    assert!(
        diff.contains("rename from m\nrename to m2\n--- a/m\n+++ b/m2\n"),
        "{diff}"
    );
    // The diff reproduces the renames with git apply in a copy of SOURCE.
    let copy = git_applied(&m, &diff);
    assert_eq!(fs::read(copy.join("m2")).unwrap(), b"one\ntwo\n");
    assert!(!copy.join("k").exists() && copy.join("k2").exists());

    let a = ctl(&sock, &["apply"]);
    a.assert_ok("apply");
    assert!(a.stdout.contains("applied R k -> k2\n"), "{}", a.stdout);
    let k2 = fs::metadata(m.host("k2")).unwrap();
    assert_eq!(
        k2.ino(),
        k_ino,
        "applied as a rename: SOURCE's file kept its inode"
    );
    assert_eq!(k2.mode() & 0o7777, 0o640);
    assert!(!m.host("k").exists() && !m.host("m").exists());
    assert_eq!(fs::read(m.host("k2")).unwrap(), b"keep\n");
    assert_eq!(fs::read(m.host("m2")).unwrap(), b"one\ntwo\n");
    assert_eq!(fs::read(m.host("x")).unwrap(), b"y\n");
    assert_eq!(fs::read(m.host("y")).unwrap(), b"x\n");
    assert_eq!(fs::read(m.host("d/f")).unwrap(), b"new\n");
    assert_eq!(fs::read(m.host("d2/f")).unwrap(), b"f\n");
    assert_eq!(ctl(&sock, &["status"]).stdout, "", "nothing left staged");
    assert_eq!(fs::read(m.mnt("m2")).unwrap(), b"one\ntwo\n");
    assert!(!m.mnt("k").exists());
}

#[test]
fn a_host_edit_of_a_renamed_file_is_a_conflict_and_a_rename_goes_whole() {
    let (m, _dir, sock) = staged_live("stage-moves-conflict", |src| {
        put(&src.join("a"), b"a1\n", 0o644);
        put(&src.join("b"), b"b1\n", 0o644);
    });
    m.sh("mv a a2 && mv b b2").assert_ok("renames");
    assert_eq!(ctl(&sock, &["status"]).stdout, "R a -> a2\nR b -> b2\n");
    std::thread::sleep(std::time::Duration::from_millis(30));
    fs::write(m.host("a"), b"a1\nHOST\n").unwrap();
    assert_eq!(ctl(&sock, &["status"]).stdout, "CR a -> a2\nR b -> b2\n");
    let r = ctl(&sock, &["apply", "a2"]);
    r.assert_fail("a conflict is refused");
    assert!(
        r.stdout.contains("refused CR a -> a2: conflict"),
        "{}",
        r.stdout
    );
    assert_eq!(
        fs::read(m.host("a")).unwrap(),
        b"a1\nHOST\n",
        "the host edit stays"
    );
    assert!(!m.host("a2").exists());
    // Naming the old path applies the whole rename.
    ctl(&sock, &["apply", "b"]).assert_ok("apply b");
    assert!(!m.host("b").exists());
    assert_eq!(fs::read(m.host("b2")).unwrap(), b"b1\n");
    // Discarding the new name takes the rename back: the mount shows the host's file.
    let d = ctl(&sock, &["discard", "a2"]);
    d.assert_ok("discard");
    assert_eq!(ctl(&sock, &["status"]).stdout, "");
    assert_eq!(fs::read(m.mnt("a")).unwrap(), b"a1\nHOST\n");
    assert!(!m.mnt("a2").exists());
}

#[test]
fn a_directory_id_discards_only_what_it_showed() {
    let (m, _dir, sock) = staged_live("stage-moves-dirid", |src| {
        fs::create_dir(src.join("d")).unwrap();
        put(&src.join("d/f"), b"f\n", 0o644);
        fs::create_dir(src.join("e")).unwrap();
        put(&src.join("e/g"), b"g\n", 0o644);
    });
    m.sh("mv d d2 && echo agent >> d2/f && chmod 700 e && echo work > e/new")
        .assert_ok("agent work");
    assert_eq!(
        ctl(&sock, &["status"]).stdout,
        "R d/ -> d2/\nM d2/f\nm e/\nA e/new\n"
    );
    let v: serde_json::Value =
        serde_json::from_str(&ctl(&sock, &["status", "--json"]).stdout).unwrap();
    let id = |p: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|e| e["path"] == p)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for (p, line) in [("d2", "R d/ -> d2/"), ("e", "m e/")] {
        let r = ctl(&sock, &["discard", &format!("{p}@{}", id(p))]);
        r.assert_fail("a directory id does not cover what lies below it");
        assert!(
            r.stdout
                .contains(&format!("refused {line}: 1 change(s) below it")),
            "{}",
            r.stdout
        );
    }
    // Nothing was discarded: the agent's work below is still in the merged view.
    assert_eq!(fs::read(m.mnt("d2/f")).unwrap(), b"f\nagent\n");
    assert_eq!(fs::read(m.mnt("e/new")).unwrap(), b"work\n");
    assert_eq!(
        ctl(&sock, &["status"]).stdout,
        "R d/ -> d2/\nM d2/f\nm e/\nA e/new\n"
    );
    // Without an id the directory goes whole, as before.
    ctl(&sock, &["discard", "d2"]).assert_ok("discard d2");
    assert_eq!(fs::read(m.mnt("d/f")).unwrap(), b"f\n");
    assert_eq!(ctl(&sock, &["status"]).stdout, "m e/\nA e/new\n");
}
