//! The view at a checkpoint without root: `stage status --since N`, `stage diff --since N`
//! and `stage apply --at N` compare with checkpoint N's view (its sealed layers over
//! SOURCE), which fencefs resolves itself — no kernel overlay is mounted at run time — so
//! they work for a daemon as an ordinary user (uid 1000, `user.overlay.*` markers) exactly
//! as for root. Each test runs twice, `as_root::` and `as_a_user::`, with the same
//! expected output: a turn that renames a directory with SOURCE parts (a redirect) and
//! deletes files and a directory (whiteouts), then turns that change what the first one
//! made, deleted or renamed (an opaque directory where a deleted one was, files below
//! the renamed directory).
//!
//! The oracles: as root, kernel overlayfs mounted read-only over checkpoint 1's layers
//! shows the tree `rewind 1` brings back; for both, `git apply` of `diff --since 1` on a
//! copy of that tree gives the merged view before the rewind.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::oracle::*;
use common::stage::*;
use common::*;

fn ctl(sock: &Path, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), args[0].into(), sock.into()];
    v.extend(args[1..].iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

crate::as_root_and_as_a_user!(
    status_and_diff_since_a_checkpoint_after_renames_and_deletions,
    apply_at_a_checkpoint_applies_what_it_sealed,
    apply_at_a_checkpoint_through_the_socket,
);

/// SOURCE, three turns, a checkpoint after the first two; returns the mount, DIR and
/// the control socket.
fn three_turns(who: Who, name: &str) -> (Mount, std::path::PathBuf, std::path::PathBuf) {
    let (m, dir, sock) = staged_live_as(who, name, |src| {
        for (p, b) in [
            ("a.txt", "a\n"),
            ("b.txt", "b\n"),
            ("d/x", "x\n"),
            ("d/y", "y\n"),
            ("e/z", "z\n"),
            ("gone.txt", "g\n"),
            ("keep/k", "k\n"),
        ] {
            put(&src.join(p), b.as_bytes(), 0o644);
        }
    });
    who.agent(
        &m,
        "set -e; echo a1 >> a.txt; mv d d2; rm gone.txt; rm -r e; mkdir n; echo f > n/f",
    )
    .assert_ok("turn 1: a rename with SOURCE parts, deletions");
    ctl(&sock, &["checkpoint", "-m", "turn 1"]).assert_ok("checkpoint 1");
    who.agent(
        &m,
        "set -e; echo x2 >> d2/x; rm d2/y; echo b2 >> b.txt; echo a2 >> a.txt; rm n/f; \
         mkdir e; echo new > e/new; mv keep keep2",
    )
    .assert_ok("turn 2: below the renamed directory, over the deleted one");
    ctl(&sock, &["checkpoint", "-m", "turn 2"]).assert_ok("checkpoint 2");
    who.agent(&m, "set -e; echo b3 >> b.txt; echo 3 > d2/three")
        .assert_ok("turn 3");
    (m, dir, sock)
}

const SINCE_1: &str =
    "M a.txt\nM b.txt\nA d2/three\nM d2/x\nD d2/y\nA e/ (1 entry)\nR keep/ -> keep2/\nD n/f\n";
const SINCE_2: &str = "M b.txt\nA d2/three\n";

/// Regular files and symlinks below `root`: path, kind and bytes (owners and modes
/// differ between a `git apply` by root and the user's tree by design).
fn files(root: &Path) -> BTreeMap<Vec<u8>, (&'static str, Vec<u8>)> {
    snapshot(root)
        .into_iter()
        .filter(|(_, e)| e.kind != "dir")
        .map(|(p, e)| (p, (e.kind, e.data)))
        .collect()
}

fn status_and_diff_since_a_checkpoint_after_renames_and_deletions(who: Who) {
    let name = format!("since-{who:?}").to_lowercase();
    let (mut m, dir, sock) = three_turns(who, &name);
    assert_eq!(ctl(&sock, &["status", "--since", "1"]).stdout, SINCE_1);
    assert_eq!(ctl(&sock, &["status", "--since", "2"]).stdout, SINCE_2);
    let json = ctl(&sock, &["status", "--since", "1", "--json"]);
    json.assert_ok("status --since 1 --json");
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(8), "{v}");
    let diff = ctl(&sock, &["diff", "--since", "1"]);
    diff.assert_ok("diff --since 1");
    assert!(
        diff.stdout
            .contains("rename from keep/k\nrename to keep2/k\n"),
        "{}",
        diff.stdout
    );
    assert!(
        diff.stdout.contains("deleted file mode 100644") && diff.stdout.contains("a/n/f"),
        "{}",
        diff.stdout
    );
    // Offline (`--dir`, as the same user) too, with the daemon stopped afterwards.
    let now = files(&m.mnt(""));
    let oracle = (who == Who::Root).then(|| {
        let at = m.host("").parent().unwrap().join("oracle1");
        let o = Oracle::at_checkpoint(&dir, &m.host(""), &at, 1);
        files(&o.at)
    });
    ctl(&sock, &["rewind", "1"]).assert_ok("rewind 1");
    let at1 = files(&m.mnt(""));
    if let Some(o) = oracle {
        assert_eq!(
            at1, o,
            "rewind 1 shows kernel overlayfs's view at checkpoint 1"
        );
    }
    // git apply of the diff since 1, on a copy of the view at 1: the view before.
    let copy = m.host("").parent().unwrap().join("copy1");
    sh_in(
        Path::new("/"),
        &format!(
            "mkdir -p {0} && cp -a {1}/. {0}/ && cd {0} && git init -q .",
            copy.display(),
            m.mnt("").display()
        ),
    )
    .assert_ok("a copy of the view at 1");
    fs::write(copy.join("p.diff"), &diff.stdout).unwrap();
    sh_in(&copy, "git apply p.diff && rm -rf p.diff .git").assert_ok("git apply");
    assert_eq!(files(&copy), now, "diff --since 1 applied to the view at 1");
    stop(&mut m);
    assert_eq!(
        who.stage(&["status", "--since", "1"], &dir).stdout,
        "",
        "offline, after the rewind"
    );
}

fn apply_at_a_checkpoint_applies_what_it_sealed(who: Who) {
    let name = format!("since-at-{who:?}").to_lowercase();
    let (mut m, dir, sock) = three_turns(who, &name);
    let since = ctl(&sock, &["status", "--since", "2"]);
    assert_eq!(since.stdout, SINCE_2);
    stop(&mut m);
    // Root reads the person's area first (its scratch trees made and removed; no
    // `scratch` there yet, as after a daemon's start): the person's own commands that
    // need scratch space still work afterwards.
    let _ = fs::remove_dir_all(dir.join("scratch"));
    assert_eq!(
        Who::Root.stage(&["status", "--since", "1"], &dir).stdout,
        SINCE_1,
        "offline, as root"
    );
    assert_eq!(
        who.stage(&["status", "--since", "1"], &dir).stdout,
        SINCE_1,
        "offline"
    );
    assert_eq!(
        who.stage(&["diff", "--since", "2"], &dir).stdout,
        "diff --git a/b.txt b/b.txt\n--- a/b.txt\n+++ b/b.txt\n@@ -1,2 +1,3 @@\n b\n b2\n+b3\n\
         diff --git a/d2/three b/d2/three\nnew file mode 100644\n--- /dev/null\n+++ b/d2/three\n\
         @@ -0,0 +1 @@\n+3\n",
    );
    let out = who.stage(&["apply", "--at", "2"], &dir);
    applied_at_2(&m, &out);
    assert_eq!(
        who.stage(&["status"], &dir).stdout,
        "M b.txt\nA d2/three\n",
        "what is left staged"
    );
}

/// The same apply on the daemon's control socket (the daemon flattens and applies).
fn apply_at_a_checkpoint_through_the_socket(who: Who) {
    let name = format!("since-live-{who:?}").to_lowercase();
    let (mut m, _dir, sock) = three_turns(who, &name);
    let out = ctl(&sock, &["apply", "--at", "2"]);
    applied_at_2(&m, &out);
    assert_eq!(ctl(&sock, &["status"]).stdout, "M b.txt\nA d2/three\n");
    assert_eq!(fs::read(m.mnt("b.txt")).unwrap(), b"b\nb2\nb3\n");
    stop(&mut m);
}

/// What `apply --at 2` (answered `out`) leaves in SOURCE: checkpoint 2's state but for
/// the path changed after it (refused, staged) and the one made after it.
fn applied_at_2(m: &Mount, out: &Out) {
    let text = |p: &str| fs::read_to_string(m.host(p)).ok();
    // Changed again after checkpoint 2: refused, staged; the rest is checkpoint 2's.
    assert!(
        out.stdout.contains("b.txt") && out.stdout.contains("changed after checkpoint 2"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(text("b.txt").as_deref(), Some("b\n"), "{}", out.stdout);
    assert_eq!(
        text("a.txt").as_deref(),
        Some("a\na1\na2\n"),
        "{}",
        out.stdout
    );
    assert_eq!(text("d2/x").as_deref(), Some("x\nx2\n"));
    assert_eq!(text("d2/y"), None);
    assert_eq!(text("d/x"), None);
    assert_eq!(text("e/new").as_deref(), Some("new\n"));
    assert_eq!(text("e/z"), None);
    assert_eq!(text("gone.txt"), None);
    assert_eq!(text("keep2/k").as_deref(), Some("k\n"));
    assert_eq!(text("d2/three"), None, "first made after checkpoint 2");
}
