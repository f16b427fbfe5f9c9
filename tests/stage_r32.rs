//! Issue "the fence, round 3", re-checked on the daemon's own staging engine (the merged
//! view served by `host::union`, settled nodes, shared copy-ups, live swaps): sequences
//! no other test drives, each on a real mount with the host checked byte for byte —
//! writes through a descriptor held open across a live apply, a read through the second
//! name of a SOURCE hard link before a host save, a directory moved into a new one (a
//! policy-hidden file in it) applied or refused, a renamed directory's old name made again
//! while the host replaces it, and the item-1/item-6 sequences as an ordinary user.

mod common;

use std::fs;
use std::io::Write;
use std::path::Path;

use common::stage::*;
use common::*;

fn ctl(sock: &Path, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), args[0].into(), sock.into()];
    v.extend(args[1..].iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// `apply` through `sock` once the daemon saw the close of a write handle (the kernel
/// sends the release after close(2) returns).
fn apply_once_closed(sock: &Path) {
    let ok = eventually(std::time::Duration::from_secs(5), || {
        ctl(sock, &["apply"]).status.success()
    });
    assert!(ok, "{}", ctl(sock, &["apply"]).stdout);
}

/// A live staged mount over `a.txt` and `b.txt` (`who`'s), with `b.txt` staged by the
/// agent and `a.txt` opened for appending through the mount (the descriptor returned).
fn a_held_b_staged(
    who: Who,
    name: &str,
) -> (Mount, std::path::PathBuf, std::path::PathBuf, fs::File) {
    let (m, dir, sock) = staged_live_as(who, name, |src| {
        put(&src.join("a.txt"), b"a\n", 0o644);
        put(&src.join("b.txt"), b"b\n", 0o644);
    });
    who.agent(&m, "echo b1 >> b.txt").assert_ok("stage b");
    let held = fs::OpenOptions::new()
        .append(true)
        .open(m.mnt("a.txt"))
        .unwrap();
    (m, dir, sock, held)
}

/// An editor's atomic save of `rel` on the host by `who`: a temporary file renamed over it.
fn editor_save(m: &Mount, who: Who, rel: &str, bytes: &[u8]) {
    let tmp = m.host(format!("{rel}.swp"));
    fs::write(&tmp, bytes).unwrap();
    who.own(&tmp);
    fs::rename(&tmp, m.host(rel)).unwrap();
}

crate::as_root_and_as_a_user!(
    writes_through_a_descriptor_held_across_a_live_apply_are_not_lost,
    writes_through_a_descriptor_opened_but_unused_at_a_live_apply_are_not_lost,
    writes_through_a_descriptor_held_across_a_checkpoint_and_an_apply_at_it_are_not_lost,
    an_editor_save_between_an_open_for_writing_and_the_write_is_a_conflict,
    a_host_edit_then_a_rewrite_by_rename_of_a_file_held_open_is_a_conflict,
);

/// The agent appends to a file and keeps it open (a log, an editor); the operator applies
/// live; the agent writes on through the same descriptor. What it writes after the apply
/// is either in SOURCE or still staged (the mount shows it, `status` lists it): never in
/// a file that is in neither.
fn writes_through_a_descriptor_held_across_a_live_apply_are_not_lost(who: Who) {
    let (mut m, dir, sock, mut held) = a_held_b_staged(who, "r32-held-apply");
    held.write_all(b"one\n").unwrap();
    let a = ctl(&sock, &["apply"]);
    // b.txt, closed, is applied whatever happens to a.txt.
    assert!(a.stdout.contains("applied M b.txt"), "{}", a.stdout);
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"b\nb1\n");
    held.write_all(b"two\n").unwrap();
    held.sync_all().unwrap();
    drop(held);
    let host = fs::read(m.host("a.txt")).unwrap();
    let shown = fs::read(m.mnt("a.txt")).unwrap();
    assert_eq!(
        shown,
        b"a\none\ntwo\n",
        "the mount shows every byte written (SOURCE: {:?})",
        String::from_utf8_lossy(&host)
    );
    // Whatever SOURCE has not got yet is still staged, and a later apply carries it.
    if host != b"a\none\ntwo\n" {
        assert_eq!(ctl(&sock, &["status"]).stdout, "M a.txt\n");
    }
    apply_once_closed(&sock);
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"a\none\ntwo\n");
    stop(&mut m);
    assert_eq!(who.stage(&["status"], &dir).stdout, "");
}

/// A descriptor opened for writing (the file copied up, still equal to SOURCE: no change
/// to list) and first written after a live apply of the other changes: the apply must not
/// drop the staged tree whole, or the bytes written next land in a dropped inode.
fn writes_through_a_descriptor_opened_but_unused_at_a_live_apply_are_not_lost(who: Who) {
    let (mut m, dir, sock, mut held) = a_held_b_staged(who, "r32-held-unused");
    let a = ctl(&sock, &["apply"]);
    assert!(a.stdout.contains("applied M b.txt"), "{}", a.stdout);
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"b\nb1\n");
    held.write_all(b"two\n").unwrap();
    held.sync_all().unwrap();
    drop(held);
    assert_eq!(
        fs::read(m.mnt("a.txt")).unwrap(),
        b"a\ntwo\n",
        "the write after the apply shows through the mount"
    );
    assert_eq!(ctl(&sock, &["status"]).stdout, "M a.txt\n");
    assert_eq!(
        fs::read(m.host("a.txt")).unwrap(),
        b"a\n",
        "not applied yet"
    );
    apply_once_closed(&sock);
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"a\ntwo\n");
    stop(&mut m);
    assert_eq!(who.stage(&["status"], &dir).stdout, "");
}

/// The same across a checkpoint (the file moved to the live layer, the layer keeping a
/// copy) and `apply --at 1`, then `apply` (the squash of the layers).
fn writes_through_a_descriptor_held_across_a_checkpoint_and_an_apply_at_it_are_not_lost(who: Who) {
    let (mut m, dir, sock, mut held) = a_held_b_staged(who, "r32-held-at");
    held.write_all(b"one\n").unwrap();
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    let a = ctl(&sock, &["apply", "--at", "1"]);
    assert!(a.stdout.contains("applied M b.txt"), "{}", a.stdout);
    held.write_all(b"two\n").unwrap();
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint 2");
    ctl(&sock, &["apply"]);
    held.write_all(b"three\n").unwrap();
    drop(held);
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"a\none\ntwo\nthree\n");
    apply_once_closed(&sock);
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"a\none\ntwo\nthree\n");
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"b\nb1\n");
    stop(&mut m);
    assert_eq!(who.stage(&["status"], &dir).stdout, "");
}

/// Item 1 with the copy-up made before the save: the agent opens a file for writing (it
/// is copied up, its base recorded), the person saves over it on the host, then the agent
/// writes through the descriptor it holds (a settled node: no lookup, no new record).
fn an_editor_save_between_an_open_for_writing_and_the_write_is_a_conflict(who: Who) {
    let (mut m, dir, sock) = staged_live_as(who, "r32-open-save", |src| {
        put(&src.join("a.txt"), b"line1\n", 0o644);
    });
    let mut held = fs::OpenOptions::new()
        .append(true)
        .open(m.mnt("a.txt"))
        .unwrap();
    editor_save(&m, who, "a.txt", b"line1\nHOST EDIT\n");
    held.write_all(b"agent line\n").unwrap();
    drop(held);
    assert_eq!(ctl(&sock, &["status"]).stdout, "CM a.txt\n");
    let a = ctl(&sock, &["apply"]);
    a.assert_fail("a conflict is refused");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"line1\nHOST EDIT\n");
    // A checkpoint (a view swap: the node is no longer settled) changes nothing of it.
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    who.agent(&m, "echo more >> a.txt")
        .assert_ok("append again");
    assert_eq!(ctl(&sock, &["status"]).stdout, "CM a.txt\n");
    ctl(&sock, &["apply"]).assert_fail("still a conflict");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"line1\nHOST EDIT\n");
    stop(&mut m);
    assert_eq!(who.stage(&["status"], &dir).stdout, "CM a.txt\n");
}

/// Item 6 with a descriptor kept: the agent stages a file and keeps writing it through
/// its descriptor, the host edits it in place, the agent rewrites it by rename.
fn a_host_edit_then_a_rewrite_by_rename_of_a_file_held_open_is_a_conflict(who: Who) {
    let (mut m, dir, _sock) = staged_live_as(who, "r32-held-sed", |src| {
        put(&src.join("b.txt"), b"b1\n", 0o644);
    });
    let mut held = fs::OpenOptions::new()
        .append(true)
        .open(m.mnt("b.txt"))
        .unwrap();
    held.write_all(b"agent\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30));
    who.host(&m, "echo host >> b.txt")
        .assert_ok("host edit in place");
    held.write_all(b"agent2\n").unwrap();
    drop(held);
    who.agent(&m, "sed -i 's/b1/B1/' b.txt").assert_ok("sed -i");
    stop(&mut m);
    assert_eq!(who.stage(&["status"], &dir).stdout, "CM b.txt\n");
    who.stage(&["apply"], &dir)
        .assert_fail("the conflict is refused");
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"b1\nhost\n");
}

/// Item 1 through the second name of a SOURCE hard link: the agent looks up `x`, reads
/// `y` (the same file), the person saves over `y`, and the agent writes a whole new
/// version of `y` by rename, built on what it read.
#[test]
fn a_read_through_a_hard_links_second_name_is_what_a_rewrite_is_built_on() {
    let (mut m, dir, sock) = staged_live("r32-link-read", |src| {
        put(&src.join("x"), b"v1\n", 0o644);
        fs::hard_link(src.join("x"), src.join("y")).unwrap();
    });
    let keep = m.host("").parent().unwrap().join("agent-memory");
    fs::create_dir_all(&keep).unwrap();
    fs::metadata(m.mnt("x")).unwrap();
    fs::copy(m.mnt("y"), keep.join("y")).unwrap();
    editor_save(&m, Who::Root, "y", b"v1\nperson\n");
    // A fresh view: the mount shows the person's save at y.
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    let mut v = fs::read(keep.join("y")).unwrap();
    v.extend_from_slice(b"agent\n");
    fs::write(m.mnt("y.new"), &v).unwrap();
    fs::rename(m.mnt("y.new"), m.mnt("y")).unwrap();
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CM y\n");
    stage(&["apply"], &dir).assert_fail("the conflict is refused");
    assert_eq!(fs::read(m.host("y")).unwrap(), b"v1\nperson\n");
    assert_eq!(fs::read(m.host("x")).unwrap(), b"v1\n");
}

const HIDES: &str = "mode = \"workspace-write\"\ndefault = \"write\"\n\
                     [[rule]]\npath = \"**/secret\"\naccess = \"none\"\n";

/// Item 2, a directory moved into a directory the agent made (`A q/`, its staged tree
/// holding only the rename's marker): never `D w/a/`, and the new directory is refused
/// rather than copied without what the move carried; nothing of SOURCE is deleted (the
/// policy-hidden file included), and the merged view still shows the move.
#[test]
fn a_directory_moved_into_a_new_one_deletes_nothing() {
    let (mut m, dir) = staged("r32-move-new", HIDES, |src| {
        put(&src.join("w/a/f"), b"eff\n", 0o644);
        put(&src.join("w/a/secret"), b"hidden\n", 0o600);
        put(&src.join("w/keep"), b"k\n", 0o644);
    });
    m.sh("set -e; mkdir q; mv w/a q/a; echo n > n.txt")
        .assert_ok("the agent's moves");
    assert_eq!(fs::read(m.mnt("q/a/f")).unwrap(), b"eff\n");
    stop(&mut m);
    let before = snapshot(&m.host(""));
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "A n.txt\nA q/ (1 entry)\n",
        "what the move carried is not deleted"
    );
    let a = stage(&["apply"], &dir);
    a.assert_fail("the new directory holding the move is refused");
    assert!(
        a.stdout
            .contains("refused A q/ (1 entry): it holds SOURCE's w/a/"),
        "{}",
        a.stdout
    );
    assert!(!a.stdout.contains("applied D"), "{}", a.stdout);
    assert_eq!(fs::read(m.host("n.txt")).unwrap(), b"n\n");
    fs::remove_file(m.host("n.txt")).unwrap();
    assert_host_unchanged(&before, &m.host(""), "a move into a new directory");
    assert_eq!(fs::read(m.host("w/a/secret")).unwrap(), b"hidden\n");
    assert_eq!(stage(&["status"], &dir).stdout, "A q/ (1 entry)\n");
}

/// Item 2 with a file moved in beside the directory (`mv w/b q/b`): while the new
/// directory is refused, the file's deletion at its old path is kept staged too — applied
/// alone it would leave the only copy in the refused directory, which a discard drops.
#[test]
fn a_file_moved_into_a_refused_new_directory_is_not_deleted_from_source() {
    let (mut m, dir) = staged("r32-move-file-new", HIDES, |src| {
        put(&src.join("w/a/f"), b"eff\n", 0o644);
        put(&src.join("w/b"), b"bee\n", 0o644);
        put(&src.join("w/keep"), b"k\n", 0o644);
    });
    m.sh("set -e; mkdir q; mv w/a q/a; mv w/b q/b")
        .assert_ok("the agent's moves");
    assert_eq!(fs::read(m.mnt("q/b")).unwrap(), b"bee\n");
    stop(&mut m);
    let before = snapshot(&m.host(""));
    let a = stage(&["apply"], &dir);
    a.assert_fail("the new directory is refused");
    assert!(a.stdout.contains("refused A q/"), "{}", a.stdout);
    assert!(
        a.stdout.contains("refused D w/b: moved into q/"),
        "{}",
        a.stdout
    );
    assert!(!a.stdout.contains("applied D"), "{}", a.stdout);
    assert_host_unchanged(
        &before,
        &m.host(""),
        "a file moved into a refused new directory",
    );
    // The operator's next step, a discard, brings SOURCE's view back: nothing lost.
    stage(&["discard"], &dir).assert_ok("discard");
    assert_eq!(fs::read(m.host("w/b")).unwrap(), b"bee\n");
    assert_eq!(fs::read(m.host("w/a/f")).unwrap(), b"eff\n");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

/// Item 2, the same when the host made `q` as well (the two merge: a rename into the
/// host's directory): nothing of either is lost.
#[test]
fn a_directory_moved_into_a_new_one_the_host_made_too_loses_nothing() {
    let (mut m, dir) = staged("r32-move-new-host", HIDES, |src| {
        put(&src.join("w/a/f"), b"eff\n", 0o644);
        put(&src.join("w/a/secret"), b"hidden\n", 0o600);
        put(&src.join("w/keep"), b"k\n", 0o644);
    });
    m.sh("set -e; mkdir q; mv w/a q/a")
        .assert_ok("the agent's moves");
    stop(&mut m);
    put(&m.host("q/h"), b"host\n", 0o644);
    stage(&["apply"], &dir);
    assert_eq!(fs::read(m.host("q/h")).unwrap(), b"host\n");
    assert_eq!(fs::read(m.host("w/keep")).unwrap(), b"k\n");
    let at = |p: &str| fs::read(m.host(p)).ok();
    assert!(
        at("q/a/f").as_deref() == Some(b"eff\n") || at("w/a/f").as_deref() == Some(b"eff\n"),
        "f lost"
    );
    assert!(
        at("q/a/secret").as_deref() == Some(b"hidden\n")
            || at("w/a/secret").as_deref() == Some(b"hidden\n"),
        "the hidden file lost"
    );
}

/// Item 2 with a conflict at both names: the agent renames `d` and makes a new `d`; the
/// host moves its `d` aside and makes its own. Nothing of the host's is lost.
#[test]
fn a_renamed_directorys_name_made_again_by_the_agent_and_the_host() {
    let (mut m, dir) = staged("r32-remade-both", WRITE, |src| {
        put(&src.join("d/f"), b"old\n", 0o644);
    });
    m.sh("set -e; mv d d2; mkdir d; echo new > d/f")
        .assert_ok("the agent's moves");
    stop(&mut m);
    fs::rename(m.host("d"), m.host("d.old")).unwrap();
    put(&m.host("d/h"), b"host\n", 0o644);
    let before = snapshot(&m.host(""));
    let a = stage(&["apply"], &dir);
    a.assert_fail("both are conflicts");
    assert!(!a.stdout.contains("applied"), "{}", a.stdout);
    assert_host_unchanged(&before, &m.host(""), "both names the host changed");
}
