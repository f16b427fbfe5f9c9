//! The daemon's own merged view (issue "Staging that never loses a host edit, follows the
//! host, and needs no root"): a staged mount shows what the host does while the agent
//! works — an editor's save, a new file after a negative lookup, a deletion, a `git
//! checkout` — and a copy-up always copies SOURCE's object as it is now. Kernel overlayfs is
//! the oracle: the same DIR mounted read-only over SOURCE shows the same tree.

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

/// An editor's atomic save of `rel` on the host: a temporary file renamed over it.
fn editor_save(m: &Mount, rel: &str, bytes: &[u8]) {
    let tmp = m.host(format!("{rel}.swp"));
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, m.host(rel)).unwrap();
}

#[test]
fn the_issues_reproduction_keeps_the_host_edit() {
    let (mut m, dir, sock) = staged_live("fresh-repro", |src| {
        put(&src.join("a.txt"), b"line1\n", 0o644);
        put(&src.join("b.txt"), b"b\n", 0o644);
        put(&src.join("c.txt"), b"c\n", 0o644);
    });
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"line1\n");
    editor_save(&m, "a.txt", b"line1\nHOST EDIT\n");
    assert!(shows(&m, "a.txt", b"line1\nHOST EDIT\n"), "the save shows");
    m.sh("echo 'agent line' >> a.txt").assert_ok("agent append");
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
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

#[test]
fn new_host_files_and_host_deletions_show_after_lookups() {
    let (m, _dir, sock) = staged_live("fresh-new", |src| {
        put(&src.join("old.txt"), b"old\n", 0o644);
        put(&src.join("d/x"), b"x\n", 0o644);
    });
    // A negative lookup first: the name is absent.
    assert!(fs::metadata(m.mnt("later.txt")).is_err());
    assert!(fs::metadata(m.mnt("d/y")).is_err());
    fs::write(m.host("later.txt"), b"host made me\n").unwrap();
    fs::write(m.host("d/y"), b"y\n").unwrap();
    assert!(shows(&m, "later.txt", b"host made me\n"), "a new host file");
    assert!(shows(&m, "d/y", b"y\n"), "a new host file below");
    // A host deletion of a file the agent read.
    assert_eq!(fs::read(m.mnt("old.txt")).unwrap(), b"old\n");
    fs::remove_file(m.host("old.txt")).unwrap();
    assert!(gone(&m, "old.txt"), "a host deletion");
    // None of it is a staged change.
    assert_eq!(ctl(&sock, &["status"]).stdout, "");
}

#[test]
fn discard_and_rewind_give_back_what_the_agent_deleted() {
    let (m, _dir, sock) = staged_live("fresh-discard", |src| {
        put(&src.join("a.txt"), b"a\n", 0o644);
        put(&src.join("b.txt"), b"b\n", 0o644);
    });
    m.sh("rm a.txt").assert_ok("rm");
    assert!(fs::metadata(m.mnt("a.txt")).is_err(), "negative lookup");
    ctl(&sock, &["discard"]).assert_ok("discard");
    assert!(
        shows(&m, "a.txt", b"a\n"),
        "SOURCE's a.txt again after discard"
    );
    ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
    m.sh("rm b.txt").assert_ok("rm");
    assert!(fs::metadata(m.mnt("b.txt")).is_err(), "negative lookup");
    ctl(&sock, &["rewind", "1"]).assert_ok("rewind");
    assert!(
        shows(&m, "b.txt", b"b\n"),
        "SOURCE's b.txt again after rewind"
    );
}

/// Two names swapped (`mv x t; mv y x; mv t y`): each path's new bytes are a change of
/// that path (`M`: a rename onto a name SOURCE has is a rewrite of it, as `sed -i`'s),
/// and apply writes each path's bytes.
#[test]
fn swapped_file_names_apply_each_paths_bytes() {
    let (mut m, dir, sock) = staged_live("fresh-swap", |src| {
        put(&src.join("x"), b"ex\n", 0o644);
        put(&src.join("y"), b"why\n", 0o644);
    });
    m.sh("mv x t && mv y x && mv t y").assert_ok("swap");
    assert_eq!(fs::read(m.mnt("x")).unwrap(), b"why\n");
    assert_eq!(fs::read(m.mnt("y")).unwrap(), b"ex\n");
    let st = ctl(&sock, &["status"]).stdout;
    assert_eq!(st, "M x\nM y\n", "{st}");
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(fs::read(m.host("x")).unwrap(), b"why\n");
    assert_eq!(fs::read(m.host("y")).unwrap(), b"ex\n");
}

#[test]
fn a_moved_directory_and_a_new_one_at_its_name_apply() {
    let (mut m, dir, _sock) = staged_live("fresh-dmove", |src| {
        put(&src.join("d/f"), b"old f\n", 0o644);
        put(&src.join("d/g"), b"g\n", 0o644);
    });
    m.sh("mv d d2 && mkdir d && echo new > d/f")
        .assert_ok("mv d d2; mkdir d");
    assert_eq!(fs::read(m.mnt("d2/f")).unwrap(), b"old f\n");
    assert_eq!(fs::read(m.mnt("d/f")).unwrap(), b"new\n");
    assert!(fs::metadata(m.mnt("d/g")).is_err(), "the new d is opaque");
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(fs::read(m.host("d2/f")).unwrap(), b"old f\n");
    assert_eq!(fs::read(m.host("d2/g")).unwrap(), b"g\n");
    assert_eq!(fs::read(m.host("d/f")).unwrap(), b"new\n");
    assert!(!m.host("d/g").exists());
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

#[test]
fn a_host_git_checkout_shows_while_the_agent_works() {
    let (m, _dir, sock) = staged_live("fresh-git", |src| {
        put(&src.join("seed"), b"", 0o644);
    });
    let g = "git -c user.name=t -c user.email=t@t -c init.defaultBranch=main";
    sh_in(
        &m.host(""),
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
    sh_in(&m.host(""), &format!("{g} checkout -q other")).assert_ok("host checkout");
    assert!(shows(&m, "f", b"two\n"), "f after the checkout");
    assert!(shows(&m, "e", b"extra\n"), "e after the checkout");
    m.sh("echo agent > g").assert_ok("agent writes");
    assert_eq!(ctl(&sock, &["status"]).stdout, "A g\n");
}

#[test]
fn a_copy_up_copies_what_source_holds_now() {
    let (m, _dir, sock) = staged_live("fresh-copyup", |src| {
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
    m.sh("chmod 600 a.txt").assert_ok("chmod copies up");
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

// --- the oracle (tests/common/oracle.rs) ----------------------------------------------

/// One random step: an agent's operation through the mount, or a host edit of SOURCE.
fn step(r: &mut Rng, m: &Mount, i: usize) -> String {
    let names = ["a", "b", "d/a", "d/b", "d/e/a", "e", "e/a", "d/e"];
    let dirs = ["d", "e", "d/e", "f"];
    let n = r.pick(&names);
    let k = r.pick(&names);
    let d = r.pick(&dirs);
    let cmd = match r.next() % 14 {
        0 => format!("echo w{i} > {n}"),
        1 => format!("echo a{i} >> {n}"),
        2 => format!("truncate -s 2 {n}"),
        3 => format!("mkdir -p {d}"),
        4 => format!("mv -T {n} {k}"),
        5 => format!("mv -T {d} {}", r.pick(&dirs)),
        6 => format!("rm -f {n}"),
        7 => format!("rmdir {d}"),
        8 => format!("chmod 6{} {n}", r.next() % 8),
        9 => format!("ln -s t{i} {n}"),
        10 => format!("ln {n} {k}"),
        11 => format!("rm -rf {d}"),
        _ => {
            // The host: a save by rename, a new file, a deletion.
            let h = m.host("");
            let cmd = match r.next() % 3 {
                0 => format!("echo h{i} > {n}.tmp && mv -f {n}.tmp {n}"),
                1 => format!("mkdir -p {d} && echo h{i} > {d}/h{i}"),
                _ => format!("rm -f {n}"),
            };
            let o = sh_in(&h, &format!("{cmd} 2>/dev/null"));
            return format!("host: {cmd} -> {}", o.status);
        }
    };
    let o = m.sh(&format!("{cmd} 2>/dev/null"));
    format!("agent: {cmd} -> {}", o.status)
}

#[test]
fn random_operations_and_host_edits_match_kernel_overlayfs() {
    for (i, seed) in [0x9e37_79b9_7f4a_7c15u64, 0x2545_f491, 0xdead_beef_1234]
        .into_iter()
        .enumerate()
    {
        oracle_run(&format!("fresh-oracle-{i}"), seed, 20);
    }
}

/// `rounds` rounds of twelve random steps from `seed`, a checkpoint every fourth, each
/// compared with the oracle.
fn oracle_run(name: &str, seed: u64, rounds: usize) {
    let (mut m, dir, sock) = staged_live(name, |src| {
        put(&src.join("a"), b"a\n", 0o644);
        put(&src.join("d/a"), b"da\n", 0o644);
        put(&src.join("d/e/a"), b"dea\n", 0o644);
        put(&src.join("e/a"), b"ea\n", 0o644);
    });
    let mut r = Rng(seed);
    let mut log = Vec::new();
    for round in 0..rounds {
        for i in 0..12 {
            log.push(step(&mut r, &m, round * 100 + i));
        }
        if round % 4 == 3 {
            ctl(&sock, &["checkpoint"]).assert_ok("checkpoint");
            log.push("checkpoint".into());
        }
        // Past the cache time of names the host changed.
        let want = Oracle::view_of(&m, &dir);
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
