//! A replacement through a staged mount keeps the time of what it replaces: a host edit
//! made after the agent deleted something stays a conflict when the agent then puts
//! something else at that name, or removes the directory around it. Before, the new entry's
//! own birth time was what `status`/`apply` judged the host's changes by, so the edit
//! passed as older than the agent's change and `apply` deleted it.
//!
//! Each case: the agent deletes, the host edits what was deleted, the agent replaces (or
//! removes the parent); `status` lists a conflict, `apply` refuses it, and the host's bytes
//! stay. As root and as an ordinary user (whose whiteouts carry no xattrs: the time goes
//! on as the whiteout's modification time).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::stage::*;
use common::*;

fn ctl(sock: &Path, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), args[0].into(), sock.into()];
    v.extend(args[1..].iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// A moment later: file times tick coarsely.
fn later() {
    std::thread::sleep(Duration::from_millis(30));
}

const ORIG: &[u8] = b"orig\n";
/// SOURCE's directories, each holding `f`.
const DIRS: [&str; 7] = ["d", "e", "g", "k", "s", "u", "w"];
/// `status` after the replacements: every deletion the host edited after is a conflict.
const STATUS: &str =
    "CD d/f\nCD e/\nCT g\nCT h/\nCD k/f\nCD s/f\nCD u/\nCD w/\nA w.new/ (0 entries)\n";
/// What stays after `apply`: the conflicts (the new `w.new/` went through).
const CONFLICTS: &str = "CD d/f\nCD e/\nCT g\nCT h/\nCD k/f\nCD s/f\nCD u/\nCD w/\n";
/// What the host edits after the agent deleted it.
const EDITED: [&str; 8] = ["d/f", "e/f", "g/f", "k/f", "s/f", "u/f", "w/f", "h"];
const HOST: &str = "host edit";

/// SOURCE's `paths` hold the original bytes and the host's edit, as the host left them.
fn assert_host_kept(m: &Mount, paths: &[&str]) {
    let want = [ORIG, format!("{HOST}\n").as_bytes()].concat();
    for p in paths {
        assert_eq!(fs::read(m.host(p)).unwrap(), want, "{p}");
    }
}

fn replacements(who: Who) {
    let (mut m, dir, sock) = staged_live_as(who, &format!("stage-replaced-{who:?}"), |src| {
        for d in DIRS {
            put(&src.join(d).join("f"), ORIG, 0o644);
            who.own(&src.join(d));
            who.own(&src.join(d).join("f"));
        }
        put(&src.join("h"), ORIG, 0o644);
        who.own(&src.join("h"));
    });
    // The agent deletes; one turn is sealed in a checkpoint (s, u: a sealed layer's
    // whiteout, and a sealed directory holding one).
    who.agent(&m, "rm -rf s && rm u/f").assert_ok("turn 1");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    who.agent(&m, "rm -rf d g k w && rm e/f h")
        .assert_ok("agent deletes");
    later();
    // The host edits what the agent deleted.
    for p in EDITED {
        who.host(&m, &format!("echo '{HOST}' >> {p}"))
            .assert_ok("host edit");
    }
    let source = snapshot(&m.host(""));
    later();
    // The agent puts something else there, or removes the directory around it.
    who.agent(
        &m,
        "mkdir d && rmdir e && touch g && mkdir h && mkdir x && mv x k && mkdir s && rmdir u \
         && mkdir w && mv w w.new",
    )
    .assert_ok("agent replaces");
    assert_host_unchanged(&source, &m.host(""), "staged replacements");
    assert_eq!(ctl(&sock, &["status"]).stdout, STATUS);
    let a = ctl(&sock, &["apply"]);
    a.assert_fail("the conflicts are refused");
    for p in EDITED {
        let want = [ORIG, format!("{HOST}\n").as_bytes()].concat();
        assert_eq!(fs::read(m.host(p)).unwrap(), want, "{p}: {}", a.stdout);
    }
    stop(&mut m);
    assert_eq!(
        who.stage(&["status"], &dir).stdout,
        CONFLICTS,
        "offline, after the daemon stopped"
    );
}

#[test]
fn a_host_edit_after_a_deletion_stays_a_conflict_when_the_name_is_replaced() {
    replacements(Who::Root);
}

#[test]
fn a_host_edit_after_a_deletion_stays_a_conflict_when_the_name_is_replaced_as_a_user() {
    replacements(Who::User);
}

/// A file the agent made, sealed in a checkpoint, then changed again (copied up from the
/// sealed layer) after the host made a file of its own at that name: the copy stands for
/// the agent's file since it was first staged, so the host's new file is a conflict (before:
/// the copy's birth time was later than the host's file, and `apply` replaced it).
#[test]
fn a_copy_up_from_a_checkpoint_keeps_the_time_the_file_was_staged() {
    let (mut m, dir, sock) = staged_live("stage-replaced-copy", |src| {
        put(&src.join("keep"), ORIG, 0o644);
    });
    m.sh("echo agent > n").assert_ok("agent's new file");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    later();
    fs::write(m.host("n"), b"the host's own n\n").unwrap();
    later();
    // Through the mount the agent's file still shows (its layer is above SOURCE).
    m.sh("echo more >> n").assert_ok("agent appends");
    assert_eq!(fs::read(m.mnt("n")).unwrap(), b"agent\nmore\n");
    assert_eq!(ctl(&sock, &["status"]).stdout, "CM n\n");
    ctl(&sock, &["apply"]).assert_fail("the conflict is refused");
    assert_eq!(fs::read(m.host("n")).unwrap(), b"the host's own n\n");
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CM n\n");
}

/// The other side: a removed directory's whiteout is dated at its earliest deletion, not
/// at its copy-up. The agent changes `gen/a.go` (the directory is copied up then), the
/// operator applies that change, and the agent later regenerates `gen` (`rm -rf gen &&
/// mkdir gen`): SOURCE's `a.go`, changed by that apply after the copy-up but before the
/// deletion, is no conflict (it was, while the whiteout took the directory's copy-up time).
#[test]
fn an_apply_between_the_copy_up_and_the_removal_is_no_conflict() {
    let (mut m, dir, sock) = staged_live("stage-replaced-regen", |src| {
        put(&src.join("gen/a.go"), ORIG, 0o644);
        put(&src.join("gen/b.go"), ORIG, 0o644);
    });
    m.sh("echo agent >> gen/a.go").assert_ok("agent edits");
    later();
    ctl(&sock, &["apply", "gen/a.go"]).assert_ok("the operator applies gen/a.go");
    assert_eq!(fs::read(m.host("gen/a.go")).unwrap(), b"orig\nagent\n");
    later();
    m.sh("rm -rf gen && mkdir gen && echo new > gen/c.go")
        .assert_ok("agent regenerates");
    assert_eq!(
        ctl(&sock, &["status"]).stdout,
        "D gen/a.go\nD gen/b.go\nA gen/c.go\n"
    );
    ctl(&sock, &["apply"]).assert_ok("apply");
    assert!(!m.host("gen/a.go").exists() && !m.host("gen/b.go").exists());
    assert_eq!(fs::read(m.host("gen/c.go")).unwrap(), b"new\n");
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

/// A file the agent read, then changed, deleted and replaced by a directory: the host's
/// edit made after the read (before the agent's change) stays a conflict — the file's
/// record (taken at the read) dates its whiteout, and so the directory made over it.
fn read_then_replaced(who: Who) {
    let (mut m, dir, sock) = staged_live_as(who, &format!("stage-replaced-read-{who:?}"), |src| {
        put(&src.join("f"), ORIG, 0o644);
        who.own(&src.join("f"));
    });
    who.agent(&m, "cat f >/dev/null").assert_ok("agent reads");
    later();
    who.host(&m, &format!("echo '{HOST}' >> f"))
        .assert_ok("host edit");
    later();
    who.agent(&m, "echo agent >> f && rm f && mkdir f")
        .assert_ok("agent changes, deletes, replaces");
    assert_eq!(ctl(&sock, &["status"]).stdout, "CT f/\n");
    ctl(&sock, &["apply"]).assert_fail("the conflict is refused");
    let want = [ORIG, format!("{HOST}\n").as_bytes()].concat();
    assert_eq!(fs::read(m.host("f")).unwrap(), want);
    stop(&mut m);
    assert_eq!(who.stage(&["status"], &dir).stdout, "CT f/\n");
}

#[test]
fn a_host_edit_after_the_agents_read_stays_a_conflict_through_a_replacement() {
    read_then_replaced(Who::Root);
}

#[test]
fn a_host_edit_after_the_agents_read_stays_a_conflict_through_a_replacement_as_a_user() {
    read_then_replaced(Who::User);
}

/// A read before a deletion dates the directory that deletion leaves behind (root: the
/// whiteout carries the read's record and is dated at it): the agent reads `gen/b` and
/// `d/f`, the host edits both, the agent deletes the directories (`rm -rf gen`; `d/f`
/// written, deleted, and `d` replaced by a directory renamed over it, `mv -T x d`). Both
/// stay conflicts (before: `D gen/` and `D d/f`, dated at the deletions, after the edits).
#[test]
fn a_read_before_a_deletion_dates_the_directory_it_leaves() {
    let (mut m, dir, sock) = staged_live("stage-replaced-dirread", |src| {
        put(&src.join("gen/b"), ORIG, 0o644);
        put(&src.join("d/f"), ORIG, 0o644);
    });
    m.sh("echo x > gen/new && cat gen/b d/f >/dev/null")
        .assert_ok("agent reads");
    later();
    for p in ["gen/b", "d/f"] {
        fs::write(m.host(p), format!("{HOST}\n")).unwrap();
    }
    later();
    m.sh("rm -rf gen && echo agent > d/f && rm d/f && mkdir x && mv -T x d")
        .assert_ok("agent deletes");
    assert_eq!(ctl(&sock, &["status"]).stdout, "CD d/f\nCD gen/\n");
    ctl(&sock, &["apply"]).assert_fail("the conflicts are refused");
    for p in ["gen/b", "d/f"] {
        assert_eq!(fs::read(m.host(p)).unwrap(), format!("{HOST}\n").as_bytes());
    }
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CD d/f\nCD gen/\n");
}

/// apply's last look below a directory it removes does not count its own renames: the
/// agent moves a directory out of a directory and deletes the rest (`mv d/a/sub e && rm -rf
/// d`); apply renames `d/a/sub` first (which moves `d/a`'s ctime), then removes `d`.
#[test]
fn an_applys_own_rename_out_of_a_directory_does_not_stop_its_removal() {
    let (mut m, dir, sock) = staged_live("stage-replaced-moveout", |src| {
        put(&src.join("d/a/sub/x"), b"x\n", 0o644);
        put(&src.join("d/a/z"), ORIG, 0o644);
    });
    later();
    m.sh("mv d/a/sub e && rm -rf d").assert_ok("agent");
    assert_eq!(ctl(&sock, &["status"]).stdout, "D d/\nR d/a/sub/ -> e/\n");
    ctl(&sock, &["apply"]).assert_ok("apply");
    assert_eq!(fs::read(m.host("e/x")).unwrap(), b"x\n");
    assert!(!m.host("d").exists());
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

/// An ordinary user's symlink or FIFO can carry no staged time (`user.*` xattrs are refused
/// on them): put over a deletion whose SOURCE entry the host changed since — a file, or
/// anything below a directory — it is refused (EPERM), nothing made, the deletion and the
/// host's bytes kept (a conflict for `apply`); over one the host left alone it is made.
#[test]
fn a_symlink_over_a_deletion_the_host_changed_since_is_refused_as_a_user() {
    let who = Who::User;
    let (mut m, _dir, sock) = staged_live_as(who, "stage-replaced-uncarried", |src| {
        for d in ["d", "e", "q"] {
            put(&src.join(d).join("f"), ORIG, 0o644);
            who.own(&src.join(d));
            who.own(&src.join(d).join("f"));
        }
        put(&src.join("g"), ORIG, 0o644);
        who.own(&src.join("g"));
    });
    who.agent(&m, "rm -rf d e q && rm g")
        .assert_ok("agent deletes");
    later();
    for p in ["d/f", "g"] {
        who.host(&m, &format!("echo '{HOST}' >> {p}"))
            .assert_ok("host edit");
    }
    let source = snapshot(&m.host(""));
    later();
    for (script, what) in [
        ("ln -s x d", "a symlink over d"),
        ("mkfifo g", "a FIFO over g"),
        ("ln -s x t && mv -T t d", "a symlink renamed over d"),
    ] {
        let o = who.agent(&m, script);
        o.assert_fail(what);
        assert!(
            o.stderr.contains("Operation not permitted"),
            "{what}: {}",
            o.stderr
        );
    }
    assert!(fs::symlink_metadata(m.mnt("d")).is_err(), "d stays deleted");
    assert!(fs::symlink_metadata(m.mnt("g")).is_err(), "g stays deleted");
    who.agent(&m, "ln -s x e && mkfifo q")
        .assert_ok("over what the host left alone");
    assert_host_unchanged(&source, &m.host(""), "refused replacements");
    assert_eq!(
        ctl(&sock, &["status"]).stdout,
        "CD d/\nT e\nCD g\nT q\nA t\n"
    );
    ctl(&sock, &["apply"]).assert_fail("the conflicts are refused");
    assert_host_kept(&m, &["d/f", "g"]);
    stop(&mut m);
}

/// More replacements that must keep the deletion's time, as root and as an ordinary user
/// (red team): a file made over a deletion sealed in a checkpoint (`rm g`, checkpoint,
/// host edit, `echo new > g`); a hard link made over a deletion (`ln t h`); a file made in
/// a directory made again over a deleted one (`rm -rf d; mkdir d; echo new > d/f`, the
/// host having edited `d/f` in between: the opaque directory's time bounds what is below
/// it); and a symlink renamed over a file that stands for a deletion (`rm k; touch k`,
/// host edit, `mv -T t k`: refused, `EPERM`). Each stays a conflict; the host keeps its
/// bytes.
fn more_replacements(who: Who) {
    let (mut m, _dir, sock) = staged_live_as(who, &format!("stage-replaced-more-{who:?}"), |src| {
        for f in ["g", "h", "k", "d/f"] {
            put(&src.join(f), ORIG, 0o644);
        }
        for f in ["g", "h", "k", "d", "d/f"] {
            who.own(&src.join(f));
        }
    });
    who.agent(&m, "rm g").assert_ok("turn 1");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    who.agent(&m, "rm h && rm -rf d && rm k && touch k")
        .assert_ok("agent deletes");
    later();
    for p in ["g", "h", "k", "d/f"] {
        who.host(&m, &format!("echo '{HOST}' >> {p}"))
            .assert_ok("host edit");
    }
    let source = snapshot(&m.host(""));
    later();
    who.agent(
        &m,
        "echo new > g && echo t > t && ln t h && mkdir d && echo new > d/f && ln -s x s",
    )
    .assert_ok("agent replaces");
    // As root the symlink takes k's record (a conflict then); an ordinary user's cannot
    // hold it: refused.
    let o = who.agent(&m, "mv -T s k");
    let k = match who {
        Who::Root => {
            o.assert_ok("a symlink renamed over k");
            "CT k"
        }
        Who::User => {
            o.assert_fail("a symlink renamed over k");
            assert!(o.stderr.contains("Operation not permitted"), "{}", o.stderr);
            "CM k"
        }
    };
    assert_host_unchanged(&source, &m.host(""), "staged replacements");
    let status = ctl(&sock, &["status"]).stdout;
    for want in ["CM g", "CM h", "CM d/f", k] {
        assert!(status.lines().any(|l| l == want), "{want} in:\n{status}");
    }
    ctl(&sock, &["apply"]).assert_fail("the conflicts are refused");
    assert_host_kept(&m, &["g", "h", "k", "d/f"]);
    stop(&mut m);
}

#[test]
fn more_replacements_keep_the_deletions_time() {
    more_replacements(Who::Root);
}

#[test]
fn more_replacements_keep_the_deletions_time_as_a_user() {
    more_replacements(Who::User);
}

/// A symlink the agent made over a deleted file, sealed in a checkpoint, then moved after
/// the host edited the file: the move copies the symlink up, and the copy cannot carry the
/// time the symlink was staged (a symlink holds no marker), so the whiteout left at `g`
/// would be dated after the edit and `apply` would delete it. Refused (EPERM) instead; the
/// conflict stays; a symlink the host did not change around moves.
fn sealed_symlink_moved(who: Who) {
    let (mut m, _dir, sock) =
        staged_live_as(who, &format!("stage-replaced-sealed-{who:?}"), |src| {
            for f in ["g", "k"] {
                put(&src.join(f), ORIG, 0o644);
                who.own(&src.join(f));
            }
        });
    who.agent(&m, "rm g k && ln -s a g && ln -s b k")
        .assert_ok("turn 1");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    later();
    who.host(&m, &format!("echo '{HOST}' >> g"))
        .assert_ok("host edit");
    let source = snapshot(&m.host(""));
    later();
    // As root the copy takes the symlink's record (the move stays a conflict); an
    // ordinary user's cannot: refused.
    let o = who.agent(&m, "mv g h");
    let g = match who {
        Who::Root => {
            o.assert_ok("moving the sealed symlink g");
            "CR g -> h"
        }
        Who::User => {
            o.assert_fail("moving the sealed symlink g");
            assert!(o.stderr.contains("Operation not permitted"), "{}", o.stderr);
            "CT g"
        }
    };
    who.agent(&m, "mv k l")
        .assert_ok("moving the sealed symlink k");
    assert_host_unchanged(&source, &m.host(""), "staged moves");
    let status = ctl(&sock, &["status"]).stdout;
    assert!(status.lines().any(|l| l == g), "{g} in:\n{status}");
    ctl(&sock, &["apply"]).assert_fail("the conflict is refused");
    assert_host_kept(&m, &["g"]);
    stop(&mut m);
}

#[test]
fn a_sealed_symlink_moved_after_a_host_edit_is_refused() {
    sealed_symlink_moved(Who::Root);
}

#[test]
fn a_sealed_symlink_moved_after_a_host_edit_is_refused_as_a_user() {
    sealed_symlink_moved(Who::User);
}

/// A read-only file made over a deletion (`umask 222`, `cp -p` of a read-only file) still
/// carries the deletion's time, as root and as an ordinary user (whose daemon may not
/// write an xattr on a file without write permission: it lends itself that permission on
/// the new file, not yet in place, and gives it back).
fn read_only_over_a_deletion(who: Who) {
    let (mut m, _dir, sock) = staged_live_as(who, &format!("stage-replaced-ro-{who:?}"), |src| {
        put(&src.join("f"), ORIG, 0o644);
        who.own(&src.join("f"));
    });
    who.agent(&m, "rm f").assert_ok("agent deletes");
    later();
    who.host(&m, &format!("echo '{HOST}' >> f"))
        .assert_ok("host edit");
    later();
    who.agent(&m, "umask 222 && echo new > f")
        .assert_ok("a read-only file over the deletion");
    let mode = fs::metadata(m.mnt("f")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o444);
    assert_eq!(ctl(&sock, &["status"]).stdout, "CM f\n");
    stop(&mut m);
}

#[test]
fn a_read_only_file_over_a_deletion_keeps_its_time() {
    read_only_over_a_deletion(Who::Root);
}

#[test]
fn a_read_only_file_over_a_deletion_keeps_its_time_as_a_user() {
    read_only_over_a_deletion(Who::User);
}

/// A symlink made over a deletion sealed in a checkpoint, after the host edited the file:
/// no record passes from a sealed whiteout, so the symlink must carry the deletion's time
/// itself — as root it does (its marker, read by the stage tools on every kind): `CT g`;
/// an ordinary user's cannot: refused (`EPERM`), the deletion stays `CD g`.
fn symlink_over_a_sealed_deletion(who: Who) {
    let (mut m, _dir, sock) =
        staged_live_as(who, &format!("stage-replaced-sealed-del-{who:?}"), |src| {
            put(&src.join("g"), ORIG, 0o644);
            who.own(&src.join("g"));
        });
    who.agent(&m, "rm g").assert_ok("turn 1");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    later();
    who.host(&m, &format!("echo '{HOST}' >> g"))
        .assert_ok("host edit");
    let source = snapshot(&m.host(""));
    later();
    let o = who.agent(&m, "ln -s x g");
    let want = match who {
        Who::Root => {
            o.assert_ok("a symlink over the sealed deletion");
            "CT g\n"
        }
        Who::User => {
            o.assert_fail("a symlink over the sealed deletion");
            assert!(o.stderr.contains("Operation not permitted"), "{}", o.stderr);
            "CD g\n"
        }
    };
    assert_host_unchanged(&source, &m.host(""), "a symlink over a sealed deletion");
    assert_eq!(ctl(&sock, &["status"]).stdout, want);
    ctl(&sock, &["apply"]).assert_fail("the conflict is refused");
    assert_host_kept(&m, &["g"]);
    stop(&mut m);
}

#[test]
fn a_symlink_over_a_sealed_deletion_keeps_its_time() {
    symlink_over_a_sealed_deletion(Who::Root);
}

#[test]
fn a_symlink_over_a_sealed_deletion_keeps_its_time_as_a_user() {
    symlink_over_a_sealed_deletion(Who::User);
}

/// A change of a read-only SOURCE file (its copy-up: markers written on the copy) works as
/// root and as an ordinary user, whose daemon cannot write an xattr on a read-only file
/// (the copy gets its mode after its markers).
fn read_only_copied_up(who: Who) {
    let (mut m, _dir, sock) =
        staged_live_as(who, &format!("stage-replaced-ro-up-{who:?}"), |src| {
            put(&src.join("ro"), ORIG, 0o444);
            who.own(&src.join("ro"));
        });
    who.agent(&m, "chmod 640 ro")
        .assert_ok("chmod of a read-only file");
    let mode = fs::metadata(m.mnt("ro")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    assert_eq!(
        fs::metadata(m.host("ro")).unwrap().permissions().mode() & 0o777,
        0o444
    );
    assert_eq!(ctl(&sock, &["status"]).stdout, "m ro\n");
    stop(&mut m);
}

#[test]
fn a_read_only_source_file_is_copied_up() {
    read_only_copied_up(Who::Root);
}

#[test]
fn a_read_only_source_file_is_copied_up_as_a_user() {
    read_only_copied_up(Who::User);
}
