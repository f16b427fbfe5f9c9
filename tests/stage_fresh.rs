//! The daemon's own merged view (issue "Staging that never loses a host edit, follows the
//! host, and needs no root"): a staged mount shows what the host does while the agent
//! works — an editor's save, a new file after a negative lookup, a deletion, a `git
//! checkout` — and a copy-up always copies SOURCE's object as it is now. Kernel overlayfs is
//! the oracle: the same DIR mounted read-only over SOURCE shows the same tree.
//!
//! The issue's list runs twice, in `as_root::` and `as_a_user::`: with the daemon, the
//! agent and the host's edits as root, and as an ordinary user (uid 1000, no capabilities,
//! mounting through fusermount3: `user.overlay.*` markers in DIR, and no fanotify watch,
//! so host changes show within the kernel's cache time); `scripts/test.sh` runs the file
//! once per transport. The oracle runs both ways too (`trusted.*` markers read with
//! `redirect_dir=follow`, `user.*` ones with `userxattr`).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::oracle::*;
use common::stage::*;
use common::*;

fn ctl(sock: &Path, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), args[0].into(), sock.into()];
    v.extend(args[1..].iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// `rel` read through the mount equals `want` within the cache time.
fn shows(m: &Mount, rel: &str, want: &[u8]) -> bool {
    eventually(Duration::from_secs(5), || {
        fs::read(m.mnt(rel)).ok().as_deref() == Some(want)
    })
}

/// `rel` is absent through the mount within the cache time.
fn gone(m: &Mount, rel: &str) -> bool {
    eventually(Duration::from_secs(5), || {
        fs::symlink_metadata(m.mnt(rel)).is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT))
    })
}

/// An editor's atomic save of `rel` on the host by `who`: a temporary file renamed over it.
fn editor_save(m: &Mount, who: Who, rel: &str, bytes: &[u8]) {
    let tmp = m.host(format!("{rel}.swp"));
    fs::write(&tmp, bytes).unwrap();
    who.own(&tmp);
    fs::rename(&tmp, m.host(rel)).unwrap();
}

/// A new host file at `rel`, written by `who`.
fn host_new(m: &Mount, who: Who, rel: &str, bytes: &[u8]) {
    fs::write(m.host(rel), bytes).unwrap();
    who.own(&m.host(rel));
}

crate::as_root_and_as_a_user!(
    the_issues_reproduction_keeps_the_host_edit,
    new_host_files_and_host_deletions_show_after_lookups,
    discard_and_rewind_give_back_what_the_agent_deleted,
    swapped_file_names_apply_each_paths_bytes,
    a_moved_directory_and_a_new_one_at_its_name_apply,
    a_host_git_checkout_shows_while_the_agent_works,
    a_copy_up_copies_what_source_holds_now,
    a_listed_directory_lists_new_host_entries,
    a_second_checkpoint_counts_what_changed_since_the_first,
);

fn the_issues_reproduction_keeps_the_host_edit(who: Who) {
    let (mut m, dir, sock) = staged_live_as(who, "fresh-repro", |src| {
        put(&src.join("a.txt"), b"line1\n", 0o644);
        put(&src.join("b.txt"), b"b\n", 0o644);
        put(&src.join("c.txt"), b"c\n", 0o644);
    });
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"line1\n");
    editor_save(&m, who, "a.txt", b"line1\nHOST EDIT\n");
    assert!(shows(&m, "a.txt", b"line1\nHOST EDIT\n"), "the save shows");
    who.agent(&m, "echo 'agent line' >> a.txt")
        .assert_ok("agent append");
    assert_eq!(
        fs::read(m.mnt("a.txt")).unwrap(),
        b"line1\nHOST EDIT\nagent line\n"
    );
    assert_eq!(ctl(&sock, &["status"]).stdout, "M a.txt\n");
    ctl(&sock, &["apply"]).assert_ok("apply");
    assert_eq!(
        fs::read(m.host("a.txt")).unwrap(),
        b"line1\nHOST EDIT\nagent line\n",
        "the host edit survives the apply"
    );
    stop(&mut m);
    assert_eq!(who.stage(&["status"], &dir).stdout, "");
}

fn new_host_files_and_host_deletions_show_after_lookups(who: Who) {
    let (m, _dir, sock) = staged_live_as(who, "fresh-new", |src| {
        put(&src.join("old.txt"), b"old\n", 0o644);
        put(&src.join("d/x"), b"x\n", 0o644);
    });
    // A negative lookup first: the name is absent.
    assert!(fs::metadata(m.mnt("later.txt")).is_err());
    assert!(fs::metadata(m.mnt("d/y")).is_err());
    host_new(&m, who, "later.txt", b"host made me\n");
    host_new(&m, who, "d/y", b"y\n");
    assert!(shows(&m, "later.txt", b"host made me\n"), "a new host file");
    assert!(shows(&m, "d/y", b"y\n"), "a new host file below");
    // A host deletion of a file the agent read.
    assert_eq!(fs::read(m.mnt("old.txt")).unwrap(), b"old\n");
    fs::remove_file(m.host("old.txt")).unwrap();
    assert!(gone(&m, "old.txt"), "a host deletion");
    // None of it is a staged change.
    assert_eq!(ctl(&sock, &["status"]).stdout, "");
}

fn discard_and_rewind_give_back_what_the_agent_deleted(who: Who) {
    let (m, _dir, sock) = staged_live_as(who, "fresh-discard", |src| {
        put(&src.join("a.txt"), b"a\n", 0o644);
        put(&src.join("b.txt"), b"b\n", 0o644);
    });
    who.agent(&m, "rm a.txt").assert_ok("rm");
    assert!(fs::metadata(m.mnt("a.txt")).is_err(), "negative lookup");
    ctl(&sock, &["discard"]).assert_ok("discard");
    assert!(
        shows(&m, "a.txt", b"a\n"),
        "SOURCE's a.txt again after discard"
    );
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    who.agent(&m, "rm b.txt").assert_ok("rm");
    assert!(fs::metadata(m.mnt("b.txt")).is_err(), "negative lookup");
    ctl(&sock, &["rewind", "1"]).assert_ok("rewind");
    assert!(
        shows(&m, "b.txt", b"b\n"),
        "SOURCE's b.txt again after rewind"
    );
}

/// Two names swapped (`mv x t; mv y x; mv t y`): listed as the two renames they are
/// (each staged file's origin names the other path's SOURCE file: a cycle), and apply
/// writes each path's bytes.
fn swapped_file_names_apply_each_paths_bytes(who: Who) {
    let (mut m, dir, sock) = staged_live_as(who, "fresh-swap", |src| {
        put(&src.join("x"), b"ex\n", 0o644);
        put(&src.join("y"), b"why\n", 0o644);
    });
    who.agent(&m, "mv x t && mv y x && mv t y")
        .assert_ok("swap");
    assert_eq!(fs::read(m.mnt("x")).unwrap(), b"why\n");
    assert_eq!(fs::read(m.mnt("y")).unwrap(), b"ex\n");
    let st = ctl(&sock, &["status"]).stdout;
    assert_eq!(st, "R y -> x\nR x -> y\n", "{st}");
    stop(&mut m);
    who.stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(fs::read(m.host("x")).unwrap(), b"why\n");
    assert_eq!(fs::read(m.host("y")).unwrap(), b"ex\n");
}

fn a_moved_directory_and_a_new_one_at_its_name_apply(who: Who) {
    let (mut m, dir, _sock) = staged_live_as(who, "fresh-dmove", |src| {
        put(&src.join("d/f"), b"old f\n", 0o644);
        put(&src.join("d/g"), b"g\n", 0o644);
    });
    who.agent(&m, "mv d d2 && mkdir d && echo new > d/f")
        .assert_ok("mv d d2; mkdir d");
    assert_eq!(fs::read(m.mnt("d2/f")).unwrap(), b"old f\n");
    assert_eq!(fs::read(m.mnt("d/f")).unwrap(), b"new\n");
    assert!(fs::metadata(m.mnt("d/g")).is_err(), "the new d is opaque");
    // The markers are the daemon's: `trusted.overlay.*` as root, `user.overlay.*` as an
    // ordinary user.
    let ns = match who {
        Who::Root => "trusted",
        Who::User => "user",
    };
    let marker = |rel: &str, what: &str| {
        lgetxattr(
            &dir.join("upper").join(rel),
            format!("{ns}.overlay.{what}").as_bytes(),
        )
        .unwrap_or_else(|e| panic!("{ns}.overlay.{what} on {rel}: {e}"))
    };
    assert_eq!(marker("d", "opaque"), b"y");
    assert_eq!(marker("d2", "redirect"), b"/d");
    stop(&mut m);
    who.stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(fs::read(m.host("d2/f")).unwrap(), b"old f\n");
    assert_eq!(fs::read(m.host("d2/g")).unwrap(), b"g\n");
    assert_eq!(fs::read(m.host("d/f")).unwrap(), b"new\n");
    assert!(!m.host("d/g").exists());
    assert_eq!(who.stage(&["status"], &dir).stdout, "");
}

fn a_host_git_checkout_shows_while_the_agent_works(who: Who) {
    let (m, _dir, sock) = staged_live_as(who, "fresh-git", |src| {
        put(&src.join("seed"), b"", 0o644);
    });
    let g = "git -c user.name=t -c user.email=t@t -c init.defaultBranch=main";
    who.host(
        &m,
        &format!(
            "{g} init -q && echo one > f && {g} add f && {g} commit -qm one && \
             {g} checkout -qb other && echo two > f && echo extra > e && {g} add f e && \
             {g} commit -qm two && {g} checkout -q main"
        ),
    )
    .assert_ok("host repo");
    // The agent reads the tree.
    assert_eq!(fs::read(m.mnt("f")).unwrap(), b"one\n");
    assert!(fs::metadata(m.mnt("e")).is_err());
    who.host(&m, &format!("{g} checkout -q other"))
        .assert_ok("host checkout");
    assert!(shows(&m, "f", b"two\n"), "f after the checkout");
    assert!(shows(&m, "e", b"extra\n"), "e after the checkout");
    who.agent(&m, "echo agent > g").assert_ok("agent writes");
    assert_eq!(ctl(&sock, &["status"]).stdout, "A g\n");
}

fn a_copy_up_copies_what_source_holds_now(who: Who) {
    let (m, _dir, sock) = staged_live_as(who, "fresh-copyup", |src| {
        put(&src.join("a.txt"), b"v1\n", 0o644);
    });
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"v1\n");
    // An in-place host edit (same inode), then the agent's first change.
    fs::write(m.host("a.txt"), b"v2\n").unwrap();
    assert!(shows(&m, "a.txt", b"v2\n"), "the edit shows");
    // The agent reads it again a moment later (a read in the clock tick of the host's
    // edit counts as one built on the version before: a conflict, erring safe).
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"v2\n");
    who.agent(&m, "chmod 600 a.txt")
        .assert_ok("chmod copies up");
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"v2\n");
    assert_eq!(
        fs::metadata(m.mnt("a.txt")).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"v2\n");
    assert_eq!(
        fs::metadata(m.host("a.txt")).unwrap().permissions().mode() & 0o777,
        0o644,
        "SOURCE untouched"
    );
    assert_eq!(ctl(&sock, &["status"]).stdout, "m a.txt\n");
}

/// A directory listed through the mount, then given a new file and a new directory on the
/// host: the next listing has them within the cache time. (As an ordinary user there is
/// no host watch, and a merged directory shows its upper part's mtime, which the host's
/// change leaves alone: the kernel kept the old listing for good until listings of
/// merged directories were no longer cached there; found by the oracle's first seed.)
fn a_listed_directory_lists_new_host_entries(who: Who) {
    let (m, _dir, sock) = staged_live_as(who, "fresh-listing", |src| {
        put(&src.join("a"), b"a\n", 0o644);
        put(&src.join("d/x"), b"x\n", 0o644);
    });
    who.agent(&m, "echo new > b && echo new > d/y")
        .assert_ok("agent writes");
    let names = |rel: &str| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(m.mnt(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(""), ["a", "b", "d"]);
    assert_eq!(names("d"), ["x", "y"]);
    who.host(&m, "mkdir g && echo h > g/h && echo h > c && echo h > d/z")
        .assert_ok("host adds");
    assert!(
        eventually(Duration::from_secs(5), || names("")
            == ["a", "b", "c", "d", "g"]),
        "the root's listing: {:?}",
        names("")
    );
    assert!(
        eventually(Duration::from_secs(5), || names("d") == ["x", "y", "z"]),
        "d's listing: {:?}",
        names("d")
    );
    assert_eq!(ctl(&sock, &["status"]).stdout, "A b\nA d/y\n");
}

/// Checkpoints stack: a second one (whose count of changes is taken against the first)
/// works as an ordinary user too, where the view at a checkpoint cannot be a kernel
/// overlay (it once failed "overlay: Operation not permitted").
fn a_second_checkpoint_counts_what_changed_since_the_first(who: Who) {
    let (m, _dir, sock) = staged_live_as(who, "fresh-ckpt", |src| {
        put(&src.join("a"), b"a\n", 0o644);
        put(&src.join("b"), b"b\n", 0o644);
    });
    who.agent(&m, "echo 1 > a && echo new > n1")
        .assert_ok("turn 1");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint 1");
    who.agent(&m, "echo 2 > b && rm a").assert_ok("turn 2");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint 2");
    who.agent(&m, "echo 3 > b").assert_ok("turn 3");
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint 3");
    let log = ctl(&sock, &["log", "--json"]);
    log.assert_ok("log");
    let v: serde_json::Value = serde_json::from_str(&log.stdout).unwrap();
    let changes: Vec<u64> = v
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|c| c["changes"].as_u64().unwrap())
        .collect();
    assert_eq!(changes, [2, 2, 1], "{v}");
    ctl(&sock, &["rewind", "1"]).assert_ok("rewind 1");
    assert!(shows(&m, "a", b"1\n") && shows(&m, "b", b"b\n"));
    assert_eq!(ctl(&sock, &["status"]).stdout, "M a\nA n1\n");
}

// --- the oracle (tests/common/oracle.rs) ----------------------------------------------

/// One random step by `who`: an agent's operation through the mount, or a host edit of
/// SOURCE. As an ordinary user (see
/// [`random_operations_and_host_edits_as_an_ordinary_user_match_kernel_overlayfs`]) no
/// directory is renamed — a `mv` of a directory is skipped, and the directory-rename slot
/// deletes a directory and makes it again instead — and `chmod` keeps the owner's `rwx`.
/// The generator draws the same numbers either way.
fn step(r: &mut Rng, m: &Mount, who: Who, i: usize) -> String {
    let names = ["a", "b", "d/a", "d/b", "d/e/a", "e", "e/a", "d/e"];
    let dirs = ["d", "e", "d/e", "f"];
    let n = r.pick(&names);
    let k = r.pick(&names);
    let d = r.pick(&dirs);
    let user = who == Who::User;
    let cmd = match r.next() % 14 {
        0 => format!("echo w{i} > {n}"),
        1 => format!("echo a{i} >> {n}"),
        2 => format!("truncate -s 2 {n}"),
        3 => format!("mkdir -p {d}"),
        4 if user => format!("[ -d {n} ] || mv -T {n} {k}"),
        4 => format!("mv -T {n} {k}"),
        5 => {
            let to = r.pick(&dirs);
            if user {
                format!("rm -rf {d} && mkdir -p {d}")
            } else {
                format!("mv -T {d} {to}")
            }
        }
        6 => format!("rm -f {n}"),
        7 => format!("rmdir {d}"),
        8 if user => format!("chmod 7{}4 {n}", r.next() % 8),
        8 => format!("chmod 6{} {n}", r.next() % 8),
        9 => format!("ln -s t{i} {n}"),
        10 => format!("ln {n} {k}"),
        11 => format!("rm -rf {d}"),
        _ => {
            // The host: a save by rename, a new file, a deletion.
            let cmd = match r.next() % 3 {
                0 => format!("echo h{i} > {n}.tmp && mv -f {n}.tmp {n}"),
                1 => format!("mkdir -p {d} && echo h{i} > {d}/h{i}"),
                _ => format!("rm -f {n}"),
            };
            let o = who.host(m, &format!("{cmd} 2>/dev/null"));
            return format!("host: {cmd} -> {}", o.status);
        }
    };
    let o = who.agent(m, &format!("{cmd} 2>/dev/null"));
    format!("agent: {cmd} -> {}", o.status)
}

/// The seeds every oracle run draws from.
const SEEDS: [u64; 3] = [0x9e37_79b9_7f4a_7c15, 0x2545_f491, 0xdead_beef_1234];

#[test]
fn random_operations_and_host_edits_match_kernel_overlayfs() {
    for (i, seed) in SEEDS.into_iter().enumerate() {
        oracle_run(Who::Root, &format!("fresh-oracle-{i}"), seed, 20);
    }
}

/// The same with the daemon, the agent and the host as an ordinary user (uid 1000): DIR
/// holds `user.overlay.*` markers, and the oracle mounts it with `-o userxattr`. That
/// option implies `redirect_dir=nofollow` (the kernel refuses it with `redirect_dir=on` or
/// `follow`, and a lookup that meets a redirect fails EPERM, "refusing to follow
/// redirect"), so kernel overlayfs cannot show a renamed directory that has lower parts,
/// which the daemon marks with `user.overlay.redirect` (checked by
/// `as_a_user::a_moved_directory_and_a_new_one_at_its_name_apply`): this variant's agent
/// renames no directory, and deletes directories and makes them again (opaque ones)
/// instead; files, symlinks and hard links are renamed, over names a lower layer holds
/// too. And an ordinary user's daemon reads with that user's permissions, so a file its
/// owner may not read cannot be read through the mount by anyone (root included), while
/// root's overlayfs mount reads it: `chmod` keeps the owner's `rwx` here.
#[test]
fn random_operations_and_host_edits_as_an_ordinary_user_match_kernel_overlayfs() {
    for (i, seed) in SEEDS.into_iter().enumerate() {
        oracle_run(Who::User, &format!("fresh-oracle-user-{i}"), seed, 20);
    }
}

/// `rounds` rounds of twelve random steps from `seed` by `who`, a checkpoint every fourth,
/// each compared with the oracle.
fn oracle_run(who: Who, name: &str, seed: u64, rounds: usize) {
    let (mut m, dir, sock) = staged_live_as(who, name, |src| {
        put(&src.join("a"), b"a\n", 0o644);
        put(&src.join("d/a"), b"da\n", 0o644);
        put(&src.join("d/e/a"), b"dea\n", 0o644);
        put(&src.join("e/a"), b"ea\n", 0o644);
    });
    let markers = match who {
        Who::Root => Markers::Trusted,
        Who::User => Markers::User,
    };
    let mut r = Rng(seed);
    let mut log = Vec::new();
    for round in 0..rounds {
        for i in 0..12 {
            log.push(step(&mut r, &m, who, round * 100 + i));
        }
        if round % 4 == 3 {
            ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
            log.push("checkpoint".into());
        }
        // Past the cache time of names the host changed.
        let want = Oracle::view_with(&m, &dir, markers);
        let ok = eventually(Duration::from_secs(5), || view(&m.mnt("")) == want);
        if !ok {
            panic!(
                "round {round}: the merged view differs from kernel overlayfs\n{}\nsteps: {log:#?}",
                view_diff(&view(&m.mnt("")), &want)
            );
        }
    }
    stop(&mut m);
}

/// An agent walking a tree of many directories takes no more of the daemon's descriptors
/// than its handle cache allows plus the bounded cache of merged directories' parts
/// (2,048 handles), whatever the number of directories or layers.
#[test]
fn a_walk_of_many_directories_keeps_the_daemons_descriptors_bounded() {
    let (m, _dir, sock) = staged_live("fresh-walk", |src| {
        for i in 0..10_000 {
            fs::create_dir_all(src.join(format!("t{}/d{i}", i % 50))).unwrap();
        }
    });
    // Three layers below the upper: every directory has a part in each once staged.
    for n in 0..3 {
        m.sh(&format!("for t in t*; do touch $t/f{n}; done"))
            .assert_ok("a change in every top directory");
        ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    }
    let fds = || {
        fs::read_dir(format!("/proc/{}/fd", m.pid()))
            .unwrap()
            .count()
    };
    let before = fds();
    m.sh("find . -type d | wc -l >/dev/null && ls -R . >/dev/null")
        .assert_ok("walk");
    let after = fds();
    // "… (RLIMIT_NOFILE N, C cached lookups)": the handle cache's bound.
    let log = m.stderr();
    let cached: usize = log
        .split(" cached lookups")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cached lookups in the log:\n{log}"));
    assert!(
        after <= before + cached + 2048 + 64,
        "{before} descriptors before the walk, {after} after (handle cache {cached})"
    );
}

/// A directory the agent renamed (`mv a/b/c c2`: its SOURCE part is found through an
/// absolute redirect, walked from SOURCE's root), then replaced by the host after the
/// kernel forgot `a/b/c` (`drop_caches`): the host's events name directories the mount
/// does not know, yet `c2`'s cached name, attributes and listing are dropped — `ls c2`
/// shows the host's new file well within the cache time (10 s), as `cat c2/f3` does
/// (before: ESTALE for the cache time, the kernel's cached `c2` being the node of the
/// directory's old identity, its old SOURCE part's).
#[test]
fn a_renamed_directorys_listing_follows_the_host_below_its_redirect() {
    let (m, dir) = staged("fresh-redirect-listing", WRITE, |src| {
        put(&src.join("a/b/c/f1"), b"1\n", 0o644);
        put(&src.join("a/b/c/f2"), b"2\n", 0o644);
    });
    m.sh("mv a/b/c c2").assert_ok("agent renames");
    // The listing, or the error reading it.
    let names = || -> Result<Vec<String>, String> {
        let mut v: Vec<String> = fs::read_dir(m.mnt("c2"))
            .and_then(|d| {
                d.map(|e| e.map(|e| e.file_name()))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|n| n.to_string_lossy().into_owned())
            .collect();
        v.sort();
        Ok(v)
    };
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    // Listed (and cached by the kernel) after a/b/c was forgotten.
    assert_eq!(names().unwrap(), ["f1", "f2"]);
    sh_in(
        &m.host(""),
        "rm -rf a/b/c && mkdir a/b/c && echo x > a/b/c/f3",
    )
    .assert_ok("host replaces a/b/c");
    assert!(
        eventually(Duration::from_secs(3), || names()
            .is_ok_and(|n| n == ["f3"])),
        "c2's listing: {:?}",
        names()
    );
    assert_eq!(fs::read(m.mnt("c2/f3")).unwrap(), b"x\n");
    // Nothing of it was staged by the host's change; SOURCE is the host's.
    assert!(!dir.join("upper/c2/f3").exists());
    assert_eq!(fs::read(m.host("a/b/c/f3")).unwrap(), b"x\n");
}
