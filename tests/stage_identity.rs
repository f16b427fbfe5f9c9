//! Staging never overwrites a host edit it did not show (issue "the fence, round 3"):
//! a staged entry remembers which SOURCE object it was made from (its base record), so
//! an editor's save on the host (a new file renamed over the old one), a host edit
//! followed by the agent's rewrite by rename (`sed -i`), and a host replacement the agent
//! then deletes are conflicts that `apply` refuses without `--force`, with SOURCE checked
//! byte for byte; and a refused directory rename never lets `apply` delete what the rename
//! carried (hidden files included).

mod common;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::stage::*;
use common::*;

fn ctl(sock: &Path, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), args[0].into(), sock.into()];
    v.extend(args[1..].iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// An editor's atomic save of `rel` on the host: a temporary file renamed over it.
fn editor_save(m: &Mount, rel: &str, bytes: &[u8]) {
    let tmp = m.host(format!("{rel}.swp"));
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, m.host(rel)).unwrap();
}

#[test]
fn an_editor_save_after_the_agent_read_the_file_is_a_conflict() {
    let (mut m, dir, sock) = staged_live("stage-id-editor", |src| {
        put(&src.join("a.txt"), b"line1\n", 0o644);
        put(&src.join("b.txt"), b"bee\n", 0o644);
    });
    // The agent reads both files (the kernel and the daemon now know them).
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"line1\n");
    assert_eq!(fs::read(m.mnt("b.txt")).unwrap(), b"bee\n");
    editor_save(&m, "a.txt", b"line1\nHOST EDIT\n");
    // The agent appends to a.txt without reading it again (its change is built on the
    // version before the save: a conflict), and (a control) to b.txt.
    m.sh("echo 'agent line' >> a.txt && echo agent >> b.txt")
        .assert_ok("append");
    assert_eq!(ctl(&sock, &["status"]).stdout, "CM a.txt\nM b.txt\n");
    let a = ctl(&sock, &["apply"]);
    a.assert_fail("a conflict is refused");
    assert!(
        a.stdout.contains("refused CM a.txt: conflict"),
        "{}",
        a.stdout
    );
    assert!(a.stdout.contains("applied M b.txt"), "{}", a.stdout);
    assert_eq!(
        fs::read(m.host("a.txt")).unwrap(),
        b"line1\nHOST EDIT\n",
        "the person's save is kept byte for byte"
    );
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"bee\nagent\n");
    // The staged version (the save with the agent's line) is what the mount shows and
    // what --force applies: nothing of the person's is lost either way.
    assert_eq!(
        fs::read(m.mnt("a.txt")).unwrap(),
        b"line1\nHOST EDIT\nagent line\n"
    );
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CM a.txt\n");
    stage(&["apply", "--force", "a.txt"], &dir).assert_ok("--force");
    assert_eq!(
        fs::read(m.host("a.txt")).unwrap(),
        b"line1\nHOST EDIT\nagent line\n"
    );
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

#[test]
fn a_rewrite_by_rename_keeps_the_conflict_of_the_file_it_replaced() {
    let (mut m, dir) = staged("stage-id-sed", WRITE, |src| {
        put(&src.join("b.txt"), b"b1\n", 0o644);
        put(&src.join("c.txt"), b"c1\n", 0o644);
        put(&src.join("d.txt"), b"d1\n", 0o644);
        put(&src.join("e.txt"), b"e1\n", 0o644);
    });
    // b.txt: staged, then the host edits it in place, then the agent rewrites it by rename.
    m.sh("echo agent >> b.txt").assert_ok("stage b");
    std::thread::sleep(Duration::from_millis(30));
    fs::write(m.host("b.txt"), b"b1\nhost\n").unwrap();
    m.sh("sed -i 's/b1/B1/' b.txt").assert_ok("sed -i b");
    // c.txt: a rewrite by rename with no host edit is a plain modification.
    m.sh("sed -i 's/c1/C1/' c.txt").assert_ok("sed -i c");
    // d.txt over e.txt: the agent's own move is no conflict.
    m.sh("mv d.txt e.txt").assert_ok("mv");
    stop(&mut m);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "CM b.txt\nM c.txt\nD d.txt\nM e.txt\n"
    );
    let a = stage(&["apply"], &dir);
    a.assert_fail("the conflict is refused");
    assert!(
        a.stdout.contains("refused CM b.txt: conflict"),
        "{}",
        a.stdout
    );
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"b1\nhost\n");
    assert_eq!(fs::read(m.host("c.txt")).unwrap(), b"C1\n");
    assert_eq!(fs::read(m.host("e.txt")).unwrap(), b"d1\n");
    assert!(!m.host("d.txt").exists());
    assert_eq!(stage(&["status"], &dir).stdout, "CM b.txt\n");
}

#[test]
fn deleting_a_file_the_host_replaced_is_a_conflict() {
    let (mut m, dir) = staged("stage-id-delete", WRITE, |src| {
        put(&src.join("a.txt"), b"old\n", 0o644);
        put(&src.join("b.txt"), b"bee\n", 0o644);
    });
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"old\n");
    editor_save(&m, "a.txt", b"new from the host\n");
    m.sh("rm a.txt b.txt").assert_ok("rm");
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CD a.txt\nD b.txt\n");
    stage(&["apply"], &dir).assert_fail("the conflict is refused");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"new from the host\n");
    assert!(!m.host("b.txt").exists());
}

/// The record of a staged copy goes on to the whiteout its deletion leaves (read from the
/// deleted copy after the unlink, not before it): a host edit after the agent's change
/// stays a conflict once the agent deletes the file, and the host's bytes survive apply.
#[test]
fn deleting_a_staged_copy_after_a_host_edit_is_a_conflict() {
    let (mut m, dir) = staged("stage-id-delete-staged", WRITE, |src| {
        put(&src.join("a.txt"), b"one\n", 0o644);
        put(&src.join("b.txt"), b"two\n", 0o644);
        put(&src.join("c.txt"), b"three\n", 0o644);
    });
    m.sh("echo agent >> a.txt && echo agent >> b.txt && echo new > d.txt")
        .assert_ok("stage a, b and a new d");
    std::thread::sleep(Duration::from_millis(30));
    // a.txt: edited in place on the host after the agent's change; c.txt never staged.
    fs::write(m.host("a.txt"), b"one\nhost\n").unwrap();
    m.sh("rm a.txt b.txt c.txt d.txt").assert_ok("rm");
    stop(&mut m);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "CD a.txt\nD b.txt\nD c.txt\n"
    );
    let a = stage(&["apply"], &dir);
    a.assert_fail("the conflict is refused");
    assert!(
        a.stdout.contains("refused CD a.txt: conflict"),
        "{}",
        a.stdout
    );
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"one\nhost\n");
    assert!(!m.host("b.txt").exists() && !m.host("c.txt").exists());
    assert!(!m.host("d.txt").exists());
}
#[test]
fn a_refused_directory_rename_keeps_what_it_carried() {
    let policy = "mode = \"workspace-write\"\ndefault = \"write\"\n\
                  [[rule]]\npath = \"**/secret\"\naccess = \"none\"\n";
    let (mut m, dir) = staged("stage-id-rename", policy, |src| {
        put(&src.join("w/a/f"), b"eff\n", 0o644);
        put(&src.join("w/a/secret"), b"hidden\n", 0o600);
        put(&src.join("w/keep"), b"k\n", 0o644);
    });
    let before = snapshot(&m.host(""));
    m.sh("set -e; mv w/a w/x; mkdir w/a; mv w/x w/a/x")
        .assert_ok("the agent's moves");
    assert_eq!(fs::read(m.mnt("w/a/x/f")).unwrap(), b"eff\n");
    stop(&mut m);
    let a = stage(&["apply"], &dir);
    a.assert_fail("a rename SOURCE cannot take is refused");
    assert!(
        a.stdout.contains("refused R w/a/ -> w/a/x/"),
        "{}",
        a.stdout
    );
    assert!(!a.stdout.contains("applied D"), "{}", a.stdout);
    assert_host_unchanged(
        &before,
        &m.host(""),
        "the refused rename and what it carried",
    );
    assert_eq!(fs::read(m.host("w/a/secret")).unwrap(), b"hidden\n");
    // Still staged: the next mount of DIR shows the same merged view.
    assert_eq!(stage(&["status"], &dir).stdout, "R w/a/ -> w/a/x/\n");
}

fn ids(out: &Out) -> std::collections::HashMap<String, String> {
    out.assert_ok("status --json");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let id = e["id"].as_str().unwrap().to_string();
            assert_eq!(id.len(), 16, "{e}");
            (e["path"].as_str().unwrap().to_string(), id)
        })
        .collect()
}

#[test]
fn apply_at_an_id_carries_only_what_was_shown() {
    let (mut m, dir, sock) = staged_live("stage-id-review", |src| {
        put(&src.join("a.txt"), b"a\n", 0o644);
        put(&src.join("b.txt"), b"b\n", 0o644);
        put(&src.join("c.txt"), b"c\n", 0o644);
    });
    m.sh("echo reviewed >> a.txt && echo reviewed >> b.txt && echo x >> c.txt")
        .assert_ok("the agent's turn");
    let shown = ids(&ctl(&sock, &["status", "--json"]));
    // The same state shows the same ids (offline and through the socket alike).
    assert_eq!(ids(&ctl(&sock, &["status", "--json"])), shown);
    // The agent keeps writing after the review; the host edits c.txt's SOURCE side.
    m.sh("echo unreviewed >> a.txt").assert_ok("a later write");
    fs::write(m.host("c.txt"), b"c\nhost\n").unwrap();
    let at = |p: &str| format!("{p}@{}", shown[p]);
    let a = ctl(&sock, &["apply", &at("a.txt"), &at("b.txt"), &at("c.txt")]);
    a.assert_fail("changed paths are refused");
    assert!(
        a.stdout.contains(&format!(
            "refused M a.txt@{}: changed since it was shown",
            shown["a.txt"]
        )),
        "{}",
        a.stdout
    );
    assert!(a.stdout.contains("refused CM c.txt@"), "{}", a.stdout);
    assert!(a.stdout.contains("applied M b.txt"), "{}", a.stdout);
    assert_eq!(
        fs::read(m.host("a.txt")).unwrap(),
        b"a\n",
        "unreviewed bytes stay staged"
    );
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"b\nreviewed\n");
    assert_eq!(fs::read(m.host("c.txt")).unwrap(), b"c\nhost\n");
    assert_eq!(
        fs::read(m.mnt("a.txt")).unwrap(),
        b"a\nreviewed\nunreviewed\n"
    );
    // Shown again, the new id applies.
    let now = ids(&ctl(&sock, &["status", "--json"]));
    assert_ne!(now["a.txt"], shown["a.txt"]);
    ctl(&sock, &["apply", &format!("a.txt@{}", now["a.txt"])]).assert_ok("re-reviewed");
    assert_eq!(
        fs::read(m.host("a.txt")).unwrap(),
        b"a\nreviewed\nunreviewed\n"
    );
    // discard checks ids the same way; a path no longer staged is refused, not applied.
    let d = ctl(&sock, &["discard", &format!("a.txt@{}", now["a.txt"])]);
    d.assert_fail("nothing staged there any more");
    assert!(
        d.stdout.contains("no longer staged as shown"),
        "{}",
        d.stdout
    );
    let c = ids(&ctl(&sock, &["status", "--json"]))["c.txt"].clone();
    ctl(&sock, &["discard", &format!("c.txt@{c}")]).assert_ok("discard by id");
    assert_eq!(fs::read(m.mnt("c.txt")).unwrap(), b"c\nhost\n");
    assert_eq!(ctl(&sock, &["status"]).stdout, "");
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

#[test]
fn apply_at_a_checkpoint_carries_what_it_sealed_and_no_later_write() {
    let (mut m, dir, sock) = staged_live("stage-id-at", |src| {
        put(&src.join("a.txt"), b"a\n", 0o644);
        put(&src.join("b.txt"), b"b\n", 0o644);
    });
    m.sh("echo turn1 >> a.txt && echo turn1 >> b.txt && mkdir d && echo d1 > d/x")
        .assert_ok("turn 1");
    let c = ctl(&sock, &["checkpoint", "-m", "turn 1"]);
    c.assert_ok("checkpoint");
    assert_eq!(c.stdout.trim(), "checkpoint 1");
    m.sh("echo turn2 >> a.txt && echo new > c.txt")
        .assert_ok("turn 2");
    let a = ctl(&sock, &["apply", "--at", "1"]);
    a.assert_fail("a path changed after the checkpoint is refused");
    assert!(
        a.stdout.contains("refused M a.txt@") && a.stdout.contains("changed after checkpoint 1"),
        "{}",
        a.stdout
    );
    assert!(a.stdout.contains("applied M b.txt"), "{}", a.stdout);
    assert!(a.stdout.contains("applied A d/ (1 entry)"), "{}", a.stdout);
    assert!(!a.stdout.contains("c.txt"), "{}", a.stdout);
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"a\n");
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"b\nturn1\n");
    assert_eq!(fs::read(m.host("d/x")).unwrap(), b"d1\n");
    assert!(!m.host("c.txt").exists(), "turn 2's new file stays staged");
    // The merged view is unchanged; what turn 2 did is still staged.
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"a\nturn1\nturn2\n");
    assert_eq!(fs::read(m.mnt("c.txt")).unwrap(), b"new\n");
    assert_eq!(ctl(&sock, &["status"]).stdout, "M a.txt\nA c.txt\n");
    // The apply ended checkpoint 1.
    let again = ctl(&sock, &["apply", "--at", "1"]);
    again.assert_fail("an ended checkpoint");
    assert!(
        again.stderr.contains("checkpoint 1 was ended"),
        "{}",
        again.stderr
    );
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "M a.txt\nA c.txt\n");
}

#[test]
fn a_whole_new_version_written_after_a_host_save_is_built_on_what_was_read() {
    let (mut m, dir, sock) = staged_live("stage-id-read", |src| {
        put(&src.join("a.txt"), b"v1\n", 0o644);
        put(&src.join("b.txt"), b"b1\n", 0o644);
    });
    let keep = m.host("").parent().unwrap().join("agent-memory");
    fs::create_dir_all(&keep).unwrap();
    // The agent reads both files and keeps them in memory (here: a file outside the mount).
    let read = |n: &str| fs::copy(m.mnt(n), keep.join(n)).unwrap();
    read("a.txt");
    read("b.txt");
    // The person saves a.txt; the agent writes a whole new version of each by rename,
    // built on what it read, without reading again.
    editor_save(&m, "a.txt", b"v1\nperson\n");
    // A checkpoint builds a new merged view: the mount now shows the person's save (the
    // same inode; stat opens nothing), so only the read tells what the agent's version is
    // built on.
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    let ino =
        |p: std::path::PathBuf| std::os::unix::fs::MetadataExt::ino(&fs::metadata(p).unwrap());
    assert_eq!(ino(m.host("a.txt")), ino(m.mnt("a.txt")), "a fresh view");
    for n in ["a.txt", "b.txt"] {
        let mut v = fs::read(keep.join(n)).unwrap();
        v.extend_from_slice(b"agent\n");
        fs::write(m.mnt(format!("{n}.new")), &v).unwrap();
        fs::rename(m.mnt(format!("{n}.new")), m.mnt(n)).unwrap();
    }
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CM a.txt\nM b.txt\n");
    stage(&["apply"], &dir).assert_fail("the conflict is refused");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"v1\nperson\n");
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"b1\nagent\n");
}

#[test]
fn a_directory_made_where_a_renamed_one_was_is_new_and_applied_whole() {
    let (mut m, dir) = staged("stage-id-remade", WRITE, |src| {
        put(&src.join("d/f"), b"old\n", 0o644);
        put(&src.join("d/g"), b"g\n", 0o644);
    });
    m.sh("set -e; mv d d2; mkdir d; echo new > d/f")
        .assert_ok("the agent's moves");
    stop(&mut m);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "A d/ (1 entry)\nR d/ -> d2/\n"
    );
    // Discarding the rename alone would take back the new d/: refused until d/ goes.
    let d = stage(&["discard", "d2"], &dir);
    d.assert_fail("the rename's old name holds new work");
    assert!(
        d.stdout.contains("was made again since; discard it first"),
        "{}",
        d.stdout
    );
    stage(&["apply"], &dir).assert_ok("the rename, then the new directory whole");
    assert_eq!(fs::read(m.host("d/f")).unwrap(), b"new\n");
    assert!(!m.host("d/g").exists());
    assert_eq!(fs::read(m.host("d2/f")).unwrap(), b"old\n");
    assert_eq!(fs::read(m.host("d2/g")).unwrap(), b"g\n");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

#[test]
fn apply_at_a_checkpoint_never_carries_a_later_write_below_a_directory_it_changed() {
    let (mut m, dir, sock) = staged_live("stage-id-at-below", |src| {
        put(&src.join("d/f"), b"f\n", 0o644);
    });
    // Turn 1 changes the directory itself (its mode) and a file in it.
    m.sh("chmod 700 d && echo turn1 > d/f").assert_ok("turn 1");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    // Turn 2 writes below that directory.
    m.sh("echo turn2 >> d/f && echo later > d/new")
        .assert_ok("turn 2");
    let a = ctl(&sock, &["apply", "--at", "1"]);
    a.assert_fail("d/f changed after the checkpoint");
    assert!(
        a.stdout.contains("refused M d/f@") && a.stdout.contains("changed after checkpoint 1"),
        "{}",
        a.stdout
    );
    assert!(a.stdout.contains("applied m d/"), "{}", a.stdout);
    // d's id covers d's own change: neither the refused d/f nor the later d/new ride along.
    assert!(!a.stdout.contains("applied M d/f"), "{}", a.stdout);
    assert!(!a.stdout.contains("d/new"), "{}", a.stdout);
    assert_eq!(fs::read(m.host("d/f")).unwrap(), b"f\n");
    assert!(!m.host("d/new").exists());
    assert_eq!(ctl(&sock, &["status"]).stdout, "M d/f\nA d/new\n");
    // The same for PATH@ID given by hand.
    let ids = ids(&ctl(&sock, &["status", "--json"]));
    m.sh("echo unseen > d/unseen").assert_ok("after the review");
    let a = ctl(&sock, &["apply", &format!("d/f@{}", ids["d/f"])]);
    a.assert_ok("d/f as shown");
    assert!(!a.stdout.contains("unseen"), "{}", a.stdout);
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "A d/new\nA d/unseen\n");
}

#[test]
fn a_host_edit_below_a_directory_the_agent_deleted_or_replaced_is_a_conflict() {
    let (mut m, dir) = staged("stage-id-dir-below", WRITE, |src| {
        for d in ["d", "e", "g", "q", "t"] {
            put(&src.join(d).join("f"), b"orig\n", 0o644);
            put(&src.join(d).join("sub/g"), b"orig\n", 0o644);
        }
    });
    // Deleted (d, e), deleted and made again (g, q), replaced by a file (t).
    m.sh("rm -rf d e g q t && mkdir g q && echo a > g/a && echo x > t")
        .assert_ok("agent");
    std::thread::sleep(Duration::from_millis(30));
    // The host edits deep below d and t, and below g, and makes a new file in g.
    fs::write(m.host("d/sub/g"), b"HOST\n").unwrap();
    fs::write(m.host("t/sub/g"), b"HOST\n").unwrap();
    fs::write(m.host("g/sub/g"), b"HOST\n").unwrap();
    fs::write(m.host("g/hostnew"), b"HOST NEW\n").unwrap();
    stop(&mut m);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "CD d/\nD e/\nA g/a\nD g/f\nCD g/hostnew\nCD g/sub/\nD q/f\nD q/sub/\nCT t\n"
    );
    stage(&["apply"], &dir).assert_fail("the conflicts are refused");
    for p in ["d/sub/g", "t/sub/g", "g/sub/g"] {
        assert_eq!(fs::read(m.host(p)).unwrap(), b"HOST\n", "{p}");
    }
    assert_eq!(fs::read(m.host("g/hostnew")).unwrap(), b"HOST NEW\n");
    assert!(!m.host("e").exists() && !m.host("g/f").exists() && !m.host("q/f").exists());
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "CD d/\nCD g/hostnew\nCD g/sub/\nCT t\n"
    );
}

#[test]
fn a_directory_the_host_replaced_after_the_agent_moved_it_is_a_conflict() {
    let (mut m, dir, sock) = staged_live("stage-id-dir-moved", |src| {
        put(&src.join("d/f"), b"f\n", 0o644);
        put(&src.join("k/f"), b"k\n", 0o644);
    });
    m.sh("mv d e && mv k k2").assert_ok("agent");
    // Sealed in a checkpoint, so the squash's flattened tree is what apply reads.
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    std::thread::sleep(Duration::from_millis(30));
    // The host moves its d aside and makes a new one.
    fs::rename(m.host("d"), m.host("d.old")).unwrap();
    fs::create_dir(m.host("d")).unwrap();
    fs::write(m.host("d/h"), b"host\n").unwrap();
    assert_eq!(ctl(&sock, &["status"]).stdout, "CR d/ -> e/\nR k/ -> k2/\n");
    let a = ctl(&sock, &["apply"]);
    a.assert_fail("the conflict is refused");
    assert!(a.stdout.contains("refused CR d/ -> e/"), "{}", a.stdout);
    assert!(a.stdout.contains("applied R k/ -> k2/"), "{}", a.stdout);
    // The host's new d stays where the host made it.
    assert_eq!(fs::read(m.host("d/h")).unwrap(), b"host\n");
    assert_eq!(fs::read(m.host("d.old/f")).unwrap(), b"f\n");
    assert!(!m.host("e").exists());
    assert_eq!(fs::read(m.host("k2/f")).unwrap(), b"k\n");
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CR d/ -> e/\n");
}

#[test]
fn a_staged_file_named_like_the_daemons_temporary_whiteout_is_never_removed() {
    let (mut m, dir) = staged("stage-id-wh-name", WRITE, |src| {
        put(&src.join("x/a"), b"a\n", 0o644);
        put(&src.join("x/b"), b"b\n", 0o644);
    });
    // The names the daemon's first private whiteouts would take.
    let names: Vec<String> = (0..4)
        .map(|n| format!(".fencefs-wh-{}-{n}", m.pid()))
        .collect();
    for n in &names {
        fs::write(m.mnt(format!("x/{n}")), b"staged work\n").unwrap();
    }
    m.sh("rm x/a x/b").assert_ok("rm");
    for n in &names {
        assert_eq!(
            fs::read(m.mnt(format!("x/{n}"))).unwrap(),
            b"staged work\n",
            "{n}"
        );
    }
    stop(&mut m);
    let st = stage(&["status"], &dir).stdout;
    assert!(st.contains("D x/a\nD x/b\n"), "{st}");
    assert_eq!(st.matches("A x/.fencefs-wh-").count(), 4, "{st}");
}

#[test]
fn a_host_edit_below_a_directory_deleted_and_made_again_is_a_conflict_after_checkpoints() {
    let (mut m, dir, sock) = staged_live("stage-id-opaque-ckpt", |src| {
        put(&src.join("g/f"), b"orig\n", 0o644);
        put(&src.join("q/f"), b"orig\n", 0o644);
    });
    m.sh("rm -rf g q && mkdir g q && echo a > g/a")
        .assert_ok("agent");
    std::thread::sleep(Duration::from_millis(30));
    fs::write(m.host("g/f"), b"HOST\n").unwrap();
    std::thread::sleep(Duration::from_millis(30));
    // Checkpoints flatten the stack: g is made anew there, after the host's edit.
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint 1");
    m.sh("echo b > g/b").assert_ok("turn 2");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint 2");
    assert_eq!(
        ctl(&sock, &["status"]).stdout,
        "A g/a\nA g/b\nCD g/f\nD q/f\n"
    );
    ctl(&sock, &["apply"]).assert_fail("the conflict is refused");
    assert_eq!(fs::read(m.host("g/f")).unwrap(), b"HOST\n");
    assert!(!m.host("q/f").exists());
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CD g/f\n");
}

/// A staged file changes in place through its own handle (no lookup in the merged view),
/// but only while it is the live upper's: a file open across a checkpoint is a sealed
/// layer's, and a change of it copies it up again — the sealed layer keeps its mode and
/// bytes, the mount shows the change, SOURCE is untouched.
#[test]
fn a_staged_file_changed_after_a_checkpoint_leaves_the_sealed_layer_alone() {
    use std::os::unix::fs::PermissionsExt;
    let (mut m, dir, sock) = staged_live("stage-id-settled", |src| {
        put(&src.join("a.txt"), b"source\n", 0o644);
    });
    let before = snapshot(&m.host(""));
    m.sh("echo new > n.txt && chmod 640 n.txt && echo more >> a.txt && chmod 600 a.txt")
        .assert_ok("agent");
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&dir.join("upper/n.txt")), 0o640);
    let held = fs::File::open(m.mnt("n.txt")).unwrap();
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    // Through the descriptor held across the checkpoint: its file is the sealed layer's
    // now and is copied up for the change, which the kernel cannot move an open
    // descriptor to (ESTALE, as for a file the host replaced); by path it goes through.
    let e = held
        .set_permissions(fs::Permissions::from_mode(0o604))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    m.sh("chmod 604 n.txt && chmod 400 a.txt && echo after >> n.txt")
        .assert_ok("after");
    assert_eq!(mode(&dir.join("layers/1/n.txt")), 0o640, "sealed n.txt");
    assert_eq!(fs::read(dir.join("layers/1/n.txt")).unwrap(), b"new\n");
    assert_eq!(mode(&dir.join("layers/1/a.txt")), 0o600, "sealed a.txt");
    assert_eq!(mode(&m.mnt("n.txt")), 0o604);
    assert_eq!(mode(&m.mnt("a.txt")), 0o400);
    assert_eq!(fs::read(m.mnt("n.txt")).unwrap(), b"new\nafter\n");
    assert_eq!(
        ctl(&sock, &["status", "--since", "1"]).stdout,
        "m a.txt\nM n.txt\n"
    );
    drop(held);
    stop(&mut m);
    assert_host_unchanged(&before, &m.host(""), "changes after a checkpoint");
}

/// Two names of one SOURCE file (hard links), both looked up, one appended to (copied up)
/// then removed: a change through the other name, within the kernel's entry cache time, is
/// made to what that name shows (SOURCE's file, copied up now), never to the removed copy.
#[test]
fn a_change_through_the_other_name_of_a_hard_link_lands_in_what_it_shows() {
    let (mut m, _dir, _sock) = staged_live("stage-id-links", |src| {
        put(&src.join("x"), b"orig\n", 0o644);
        fs::hard_link(src.join("x"), src.join("y")).unwrap();
    });
    let before = snapshot(&m.host(""));
    m.sh("cat x y >/dev/null && echo a >> x && rm x && echo b >> y")
        .assert_ok("agent");
    assert_eq!(fs::read(m.mnt("y")).unwrap(), b"orig\nb\n");
    assert!(!m.mnt("x").exists());
    stop(&mut m);
    assert_host_unchanged(&before, &m.host(""), "hard links");
}

/// A rename over a staged file that carries no record (one the agent made) hands the moved
/// file's record on: a file the host made at that name meanwhile is a conflict, never
/// overwritten at apply.
#[test]
fn a_rename_over_an_agents_new_file_keeps_the_moved_files_record() {
    let (mut m, dir) = staged("stage-id-mv-over-new", WRITE, |src| {
        put(&src.join("x.txt"), b"x\n", 0o644);
    });
    m.sh("echo agent > y.txt").assert_ok("a new y");
    std::thread::sleep(Duration::from_millis(30));
    fs::write(m.host("y.txt"), b"the host's y\n").unwrap();
    m.sh("mv x.txt y.txt").assert_ok("mv x y");
    stop(&mut m);
    let st = stage(&["status"], &dir).stdout;
    assert!(st.contains("C") && st.contains("y.txt"), "{st}");
    stage(&["apply"], &dir).assert_fail("the conflict is refused");
    assert_eq!(fs::read(m.host("y.txt")).unwrap(), b"the host's y\n");
}

/// RENAME_EXCHANGE of two staged files is two moves: each file keeps its own record (both
/// are read before either is written), so `status` shows the swap and no conflict.
#[test]
fn an_exchange_of_two_staged_files_keeps_each_names_record() {
    let (mut m, dir) = staged("stage-id-exchange", WRITE, |src| {
        put(&src.join("a.txt"), b"a\n", 0o644);
        put(&src.join("b.txt"), b"b\n", 0o644);
    });
    m.sh("echo A >> a.txt && echo B >> b.txt")
        .assert_ok("stage both");
    renameat2(&m.mnt("a.txt"), &m.mnt("b.txt"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"b\nB\n");
    stop(&mut m);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "R b.txt -> a.txt\nR a.txt -> b.txt\n"
    );
    stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"b\nB\n");
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"a\nA\n");
}

/// A deletion's record is kept compact on its whiteout (ext4 holds it in the inode: no
/// xattr block per deleted file) and still names the deleted object: a host directory swap
/// after the deletion (`mv d d.old; mv d.new d`, whose `f` is older than the deletion, so
/// no time tells it) is a conflict, and apply leaves the host's file alone. A file made
/// over the deleted name and moved on keeps that record: shown as the rename it is.
#[test]
fn a_deletions_compact_record_still_tells_a_host_directory_swap() {
    let (mut m, dir) = staged("stage-id-compact", WRITE, |src| {
        put(&src.join("d/f.txt"), b"old\n", 0o644);
        put(&src.join("d.new/f.txt"), b"the host's new f\n", 0o644);
        put(&src.join("a.txt"), b"a\n", 0o644);
    });
    std::thread::sleep(Duration::from_millis(30));
    m.sh("rm d/f.txt && rm a.txt && echo again > a.txt && mv a.txt b.txt")
        .assert_ok("rm, then a new a moved on");
    let rec = lgetxattr(&dir.join("upper/d/f.txt"), b"trusted.overlay.fencefs-base")
        .expect("the whiteout's record");
    assert!(rec.len() <= 52 && rec[0] == 2, "a compact record: {rec:?}");
    std::thread::sleep(Duration::from_millis(30));
    fs::rename(m.host("d"), m.host("d.old")).unwrap();
    fs::rename(m.host("d.new"), m.host("d")).unwrap();
    stop(&mut m);
    let st = stage(&["status"], &dir).stdout;
    assert!(st.contains("CD d/f.txt\n"), "{st}");
    assert!(st.contains("R a.txt -> b.txt\n"), "{st}");
    stage(&["apply"], &dir).assert_fail("the conflict is refused");
    assert_eq!(fs::read(m.host("d/f.txt")).unwrap(), b"the host's new f\n");
}

/// An area of format 1 (made before compact records) is read as before, and a daemon
/// serving it marks it format 2 before it writes a compact record into it: a fencefs that
/// reads only format 1 then refuses it rather than take those records for none.
#[test]
fn a_daemon_marks_an_older_area_with_the_format_its_records_need() {
    let (mut m, dir) = staged("stage-id-format", WRITE, |src| {
        put(&src.join("a.txt"), b"a\n", 0o644);
    });
    stop(&mut m);
    let marker = dir.join("fencefs-stage");
    let text = fs::read_to_string(&marker).unwrap();
    let old = text.replacen("fencefs-stage 2\n", "fencefs-stage 1\n", 1);
    assert_ne!(old, text, "{text}");
    fs::write(&marker, &old).unwrap();
    stage(&["status"], &dir).assert_ok("format 1 is read");
    assert_eq!(
        fs::read_to_string(&marker).unwrap(),
        old,
        "status leaves it"
    );
    let second = Second::start(&m, &dir, &m.policy_path());
    assert_eq!(
        fs::read_to_string(&marker).unwrap(),
        text,
        "marked 2, the rest kept"
    );
    fs::remove_file(second.mnt.join("a.txt")).unwrap();
    drop(second);
    assert_eq!(stage(&["status"], &dir).stdout, "D a.txt\n");
}

/// Deletions below a sealed checkpoint layer: a file the first turn changed (sealed at
/// checkpoint 1) is removed from that layer's entry — the removal's quick path, with the
/// layer right below the upper — and carries the record the layer's copy carried (the
/// SOURCE file it was made from); a SOURCE file in the same directory (a layer between)
/// and one at the top take the full look under the lock. The host replacing all three
/// afterwards makes each deletion a conflict: every record names the object the agent saw.
#[test]
fn deletions_below_a_checkpoint_carry_the_records_the_agent_saw() {
    let (mut m, dir, sock) = staged_live("stage-id-sealed", |src| {
        put(&src.join("d/a.txt"), b"a\n", 0o644);
        put(&src.join("d/b.txt"), b"b\n", 0o644);
        put(&src.join("top.txt"), b"t\n", 0o644);
        put(&src.join("keep.txt"), b"k\n", 0o644);
    });
    m.sh("echo a1 >> d/a.txt").assert_ok("turn 1");
    ctl(&sock, &["checkpoint", "-m", "turn 1"]).assert_ok("checkpoint 1");
    m.sh("rm d/a.txt d/b.txt top.txt")
        .assert_ok("turn 2: the deletions");
    for w in ["d/a.txt", "d/b.txt", "top.txt"] {
        let rec = lgetxattr(&dir.join("upper").join(w), b"trusted.overlay.fencefs-base")
            .unwrap_or_else(|e| panic!("{w}: the whiteout's record: {e}"));
        assert!(
            rec.len() <= 52 && rec[0] == 2,
            "{w}: a compact record: {rec:?}"
        );
    }
    stop(&mut m);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "D d/a.txt\nD d/b.txt\nD top.txt\n"
    );
    std::thread::sleep(Duration::from_millis(30));
    for w in ["d/a.txt", "d/b.txt", "top.txt"] {
        editor_save(&m, w, b"the host's\n");
    }
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "CD d/a.txt\nCD d/b.txt\nCD top.txt\n"
    );
    stage(&["apply"], &dir).assert_fail("the conflicts are refused");
    for w in ["d/a.txt", "d/b.txt", "top.txt"] {
        assert_eq!(fs::read(m.host(w)).unwrap(), b"the host's\n", "{w}");
    }
    assert_eq!(fs::read(m.host("keep.txt")).unwrap(), b"k\n");
}
