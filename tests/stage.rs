//! Staging (`mount --stage DIR`, `fencefs stage … --dir DIR`) on real mounts driven by
//! real programs: SOURCE stays byte-for-byte and stat-for-stat the same until `apply`, the
//! merged view is what the programs made, `status`/`diff` say exactly what changed (and
//! `git apply` accepts the diff), `apply`/`discard` give SOURCE (or the merged view) the
//! expected tree, conflicts are refused, the stage survives SIGKILL, the policy's errnos
//! are the same on the merged view, and a bad DIR is refused with one line at startup.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::stage::*;
use common::*;

const PROGRAMS: &str = "set -e
printf 'ONE\\n' > a.txt.new && mv a.txt.new a.txt
sed -i 's/bee/BEE/' sub/b.txt
echo fresh > new.txt
mkdir -p made/inner && echo m > made/inner/m.txt
cp -a sub copied
mv sub moved
rm -rf gone
chmod 755 run.sh
ln -s a.txt link
";

#[test]
fn programs_change_only_the_stage_and_status_says_what() {
    let (m, dir) = staged("stage-programs", WRITE, staged_sample);
    let before = snapshot(&m.host(""));
    m.sh(PROGRAMS)
        .assert_ok("programs through the staged mount");
    // The merged view is what the programs made, for every process.
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\n");
    assert_eq!(fs::read(m.mnt("moved/b.txt")).unwrap(), b"BEE\n");
    assert_eq!(fs::read(m.mnt("moved/deep/c.txt")).unwrap(), b"sea\n");
    assert_eq!(fs::read(m.mnt("copied/b.txt")).unwrap(), b"BEE\n");
    assert_eq!(fs::read(m.mnt("made/inner/m.txt")).unwrap(), b"m\n");
    assert_errno(fs::metadata(m.mnt("gone")), libc::ENOENT, "rm -rf'd dir").ok();
    assert_errno(
        fs::metadata(m.mnt("sub")),
        libc::ENOENT,
        "moved dir's old name",
    )
    .ok();
    assert_eq!(
        fs::metadata(m.mnt("run.sh")).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(fs::read_link(m.mnt("link")).unwrap(), Path::new("a.txt"));
    m.sh("./run.sh").assert_ok("the chmod'ed script runs");
    // SOURCE: byte-for-byte and stat-for-stat the same.
    assert_host_unchanged(&before, &m.host(""), "staged programs");
    let st = stage(&["status"], &dir);
    st.assert_ok("stage status");
    assert_eq!(
        st.stdout,
        "M a.txt\n\
         A copied/ (3 entries)\n\
         D gone/\n\
         A link\n\
         A made/ (2 entries)\n\
         R sub/ -> moved/\n\
         M moved/b.txt\n\
         A new.txt\n\
         m run.sh\n"
    );
    let js = stage(&["status", "--json"], &dir);
    let v: serde_json::Value = serde_json::from_str(&js.stdout).expect("one JSON array");
    // Every entry carries its review id (16 hex digits), distinct per change.
    let ids: std::collections::HashSet<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 9, "{v}");
    assert!(
        ids.iter()
            .all(|i| i.len() == 16 && i.bytes().all(|b| b.is_ascii_hexdigit()))
    );
    let v = without_ids(v);
    assert_eq!(
        v[0],
        serde_json::json!({"path":"a.txt","change":"modified","conflict":false})
    );
    assert_eq!(
        v[1],
        serde_json::json!({"path":"copied","change":"added","conflict":false,"entries":3})
    );
    assert_eq!(
        v[5],
        serde_json::json!({"path":"moved","change":"renamed","conflict":false,"from":"sub"})
    );
    // PATH filters: a file, and a directory with everything below it.
    assert_eq!(stage(&["status", "a.txt"], &dir).stdout, "M a.txt\n");
    assert_eq!(
        stage(&["status", "moved"], &dir).stdout,
        "R sub/ -> moved/\nM moved/b.txt\n"
    );
}

#[test]
fn diff_is_what_git_apply_needs_to_reproduce_the_merged_view() {
    let (mut m, dir) = staged("stage-diff", WRITE, staged_sample);
    m.sh(PROGRAMS).assert_ok("programs");
    let merged = snapshot(&m.mnt(""));
    let d = stage(&["diff"], &dir);
    d.assert_ok("stage diff");
    assert!(
        d.stdout.contains(
            "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1 @@\n-one\n-two\n-three\n+ONE\n"
        ),
        "{}",
        d.stdout
    );
    assert!(
        d.stdout
            .contains("diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n")
    );
    assert!(
        d.stdout
            .contains("rename from sub/deep/c.txt\nrename to moved/deep/c.txt\n")
    );
    stop(&mut m);
    // `git apply` in a copy of SOURCE reproduces the merged view's text files.
    let copy = m.root().join("copy");
    sh_in(m.root(), "cp -a src copy && cd copy && git init -q .").assert_ok("copy");
    fs::write(m.root().join("p.diff"), &d.stdout).unwrap();
    sh_in(&copy, "git apply ../p.diff").assert_ok("git apply");
    sh_in(&copy, "rm -rf .git").assert_ok("drop .git");
    let got = snapshot(&copy);
    for (p, e) in &merged {
        let g = got
            .get(p)
            .unwrap_or_else(|| panic!("missing after git apply: {p:?}"));
        assert_eq!((g.kind, &g.data), (e.kind, &e.data), "{p:?}");
        if e.kind == "file" {
            assert_eq!(g.mode & 0o111, e.mode & 0o111, "{p:?} exec bits");
        }
    }
    assert_eq!(got.len(), merged.len(), "same paths");
    // And patch -p1 too.
    let copy2 = m.root().join("copy2");
    sh_in(m.root(), "cp -a src copy2").assert_ok("copy2");
    sh_in(&copy2, "patch -p1 -s < ../p.diff").assert_ok("patch -p1");
    assert_eq!(fs::read(copy2.join("a.txt")).unwrap(), b"ONE\n");
}

#[test]
fn apply_all_makes_source_the_merged_view_and_leaves_nothing_staged() {
    let (mut m, dir) = staged("stage-apply", WRITE, staged_sample);
    m.sh(PROGRAMS).assert_ok("programs");
    common::setxattr(&m.mnt("new.txt"), "user.tag", b"v1").unwrap();
    let merged = snapshot(&m.mnt(""));
    // While the mount runs, apply is refused (one daemon or one apply per DIR).
    let busy = stage(&["apply"], &dir);
    busy.assert_fail("apply while mounted");
    assert!(
        busy.stderr.contains("is in use by another fencefs"),
        "{}",
        busy.stderr
    );
    stop(&mut m);
    let a = stage(&["apply"], &dir);
    a.assert_ok("stage apply");
    assert!(
        a.stdout.contains("applied R sub/ -> moved/\n"),
        "{}",
        a.stdout
    );
    assert!(a.stdout.contains("applied D gone/\n"), "{}", a.stdout);
    let src = snapshot(&m.host(""));
    let d = snapshot_diff(&merged, &src);
    assert!(
        d.is_empty(),
        "SOURCE after apply differs from the merged view:\n{d}"
    );
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "",
        "nothing staged after apply"
    );
    // Recorded in DIR/audit.jsonl: op, the operator's uid, the results.
    let log = fs::read_to_string(dir.join("audit.jsonl")).unwrap();
    let ev: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(ev["op"], "stage-apply");
    assert_eq!(ev["uid"], 0);
    assert_eq!(ev["refused"], 0);
    assert!(
        ev["results"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "applied R sub/ -> moved/")
    );
    // No temporary file left beside the applied ones.
    let left = sh_in(&m.host(""), "find . -name '*fencefs-*'");
    assert_eq!(left.stdout, "");
}

#[test]
fn partial_apply_and_discard_touch_only_their_paths() {
    let (mut m, dir) = staged("stage-partial", WRITE, staged_sample);
    m.sh(PROGRAMS).assert_ok("programs");
    stop(&mut m);
    let before = snapshot(&m.host(""));
    stage(&["apply", "a.txt", "made"], &dir).assert_ok("apply two paths");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"ONE\n");
    assert_eq!(fs::read(m.host("made/inner/m.txt")).unwrap(), b"m\n");
    assert!(m.host("gone/x").exists() && m.host("sub/b.txt").exists());
    assert_eq!(fs::read(m.host("sub/b.txt")).unwrap(), b"bee\n");
    let mut left = before.clone();
    left.retain(|p, _| p.as_slice() != b"a.txt" && p.as_slice() != b"");
    let now = snapshot(&m.host(""));
    for (p, e) in &left {
        assert_eq!(now.get(p), Some(e), "{p:?} untouched by a partial apply");
    }
    stage(&["discard", "gone", "moved/b.txt"], &dir).assert_ok("discard two paths");
    let st = stage(&["status"], &dir).stdout;
    assert_eq!(
        st,
        "A copied/ (3 entries)\nA link\nR sub/ -> moved/\nA new.txt\nm run.sh\n"
    );
    stage(&["discard"], &dir).assert_ok("discard everything");
    assert_eq!(stage(&["status"], &dir).stdout, "");
    assert_eq!(
        fs::read(m.host("sub/b.txt")).unwrap(),
        b"bee\n",
        "SOURCE kept"
    );
}

#[test]
fn host_edit_of_a_staged_path_is_a_conflict_refused_without_force() {
    let (mut m, dir) = staged("stage-conflict", WRITE, staged_sample);
    fs::write(m.mnt("a.txt"), b"agent\n").unwrap();
    fs::write(m.mnt("sub/b.txt"), b"agent b\n").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // A person edits a.txt on the host (atomically, as editors save).
    fs::write(m.host("a.tmp"), b"person\n").unwrap();
    fs::rename(m.host("a.tmp"), m.host("a.txt")).unwrap();
    // Unstaged paths show host edits through the mount.
    fs::write(m.host("run.sh"), b"#!/bin/sh\necho host\n").unwrap();
    assert!(
        eventually(Duration::from_secs(5), || fs::read(m.mnt("run.sh"))
            .is_ok_and(|b| b == b"#!/bin/sh\necho host\n")),
        "an in-place host edit of an unstaged file shows through"
    );
    assert_eq!(
        fs::read(m.mnt("a.txt")).unwrap(),
        b"agent\n",
        "staged version shown"
    );
    assert_eq!(stage(&["status"], &dir).stdout, "CM a.txt\nM sub/b.txt\n");
    stop(&mut m);
    let a = stage(&["apply"], &dir);
    a.assert_fail("apply with a conflict exits 1");
    assert!(
        a.stdout.contains("refused CM a.txt: conflict"),
        "{}",
        a.stdout
    );
    assert!(a.stdout.contains("applied M sub/b.txt"), "{}", a.stdout);
    assert_eq!(
        fs::read(m.host("a.txt")).unwrap(),
        b"person\n",
        "host edit kept"
    );
    assert_eq!(fs::read(m.host("sub/b.txt")).unwrap(), b"agent b\n");
    assert_eq!(stage(&["status"], &dir).stdout, "CM a.txt\n");
    stage(&["apply", "--force", "a.txt"], &dir).assert_ok("--force");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"agent\n");
}

#[test]
fn a_staged_file_the_host_deleted_is_a_conflict_a_moved_one_is_not() {
    let (mut m, dir) = staged("stage-host-delete", WRITE, staged_sample);
    m.sh("set -e; echo agent >> sub/b.txt; echo agent >> a.txt; mv run.sh run2.sh")
        .assert_ok("stage");
    fs::remove_file(m.host("sub/b.txt")).unwrap();
    // While the mount runs its overlay keeps the deleted original alive; stopped, the
    // deletion shows.
    stop(&mut m);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "M a.txt\nR run.sh -> run2.sh\nCA sub/b.txt\n"
    );
    let a = stage(&["apply"], &dir);
    a.assert_fail("a conflict is refused");
    assert!(
        a.stdout.contains("refused CA sub/b.txt: conflict"),
        "{}",
        a.stdout
    );
    assert!(!m.host("sub/b.txt").exists(), "the host's delete is kept");
    assert_eq!(
        fs::read(m.host("run2.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    assert!(!m.host("run.sh").exists(), "the rename is applied whole");
}

#[test]
fn the_stage_survives_sigkill_and_a_new_daemon() {
    let (mut m, dir) = staged("stage-sigkill", WRITE, staged_sample);
    let before = snapshot(&m.host(""));
    m.sh("set -e; printf synced > a.txt; sync a.txt; rm -rf gone; mv sub moved; mkdir n; echo k > n/k")
        .assert_ok("changes");
    let merged = snapshot(&m.mnt(""));
    m.signal(libc::SIGKILL);
    assert!(
        m.wait_exit(Duration::from_secs(10)).is_some(),
        "daemon died"
    );
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(m.mnt(""))
        .status();
    assert_host_unchanged(&before, &m.host(""), "after SIGKILL");
    let second = Second::start(&m, &dir, &m.policy_path());
    let again = snapshot(&second.mnt);
    let d = snapshot_diff(&merged, &again);
    assert!(
        d.is_empty(),
        "merged view after SIGKILL and a new daemon:\n{d}"
    );
    // One daemon per DIR: a third one is refused at startup, nothing mounted.
    let mnt3 = m.root().join("mp3");
    fs::create_dir_all(&mnt3).unwrap();
    let third = run_fencefs(
        [
            "mount".as_ref(),
            "-p".as_ref(),
            m.policy_path().as_os_str(),
            "--stage".as_ref(),
            dir.as_os_str(),
            m.host("").as_os_str(),
            mnt3.as_os_str(),
        ],
        LIMIT,
    );
    third.assert_fail("second daemon on one DIR");
    assert_eq!(
        third.stderr.lines().count(),
        1,
        "one line: {}",
        third.stderr
    );
    assert!(
        third.stderr.contains("is in use by another fencefs"),
        "{}",
        third.stderr
    );
    assert!(!is_mounted(&mnt3));
}

#[test]
fn bad_stage_dirs_are_refused_at_startup_with_one_line() {
    let ws_probe = Mount::builder("stage-bad");
    let root = ws_probe.root().to_path_buf();
    let src = ws_probe.host("");
    let mnt = root.join("mp/mnt");
    let mount = |dir: &Path| {
        run_fencefs(
            [
                "mount".as_ref(),
                "-m".as_ref(),
                "workspace-write".as_ref(),
                "--stage".as_ref(),
                dir.as_os_str(),
                src.as_os_str(),
                mnt.as_os_str(),
            ],
            LIMIT,
        )
    };
    let cases: Vec<(PathBuf, &str)> = vec![
        (src.join("st"), "lies inside the source"),
        (mnt.join("st"), "lies inside the mount point"),
        (root.join("outside"), ""),
    ];
    fs::write(root.join("outside/file"), b"not a stage").unwrap();
    for (dir, want) in cases {
        let o = mount(&dir);
        o.assert_fail(&format!("--stage {}", dir.display()));
        let want = if want.is_empty() {
            "is not a staging area"
        } else {
            want
        };
        assert!(o.stderr.contains(want), "{}: {}", dir.display(), o.stderr);
        assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
        assert!(!is_mounted(&mnt));
    }
    assert_eq!(
        fs::read(root.join("outside/file")).unwrap(),
        b"not a stage",
        "kept"
    );
    // A new DIR is created 0700 and records SOURCE; another SOURCE with it is refused.
    let dir = root.join("st");
    {
        let mut m = ws_probe
            .mode("workspace-write")
            .arg("--stage")
            .arg(&dir)
            .start();
        let md = fs::metadata(&dir).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o700);
        let marker = fs::read_to_string(dir.join("fencefs-stage")).unwrap();
        assert!(marker.starts_with("fencefs-stage 2\nsource "), "{marker}");
        assert!(marker.contains(&m.host("").display().to_string()));
        stop(&mut m);
        let other = m.root().join("outside");
        let o = run_fencefs(
            [
                "mount".as_ref(),
                "--stage".as_ref(),
                dir.as_os_str(),
                other.as_os_str(),
                m.mnt("").as_os_str(),
            ],
            LIMIT,
        );
        o.assert_fail("another SOURCE");
        assert!(o.stderr.contains("stages '"), "{}", o.stderr);
        // A newer format is refused, and nothing in DIR is deleted.
        fs::write(dir.join("fencefs-stage"), "fencefs-stage 99\nsource /x\n").unwrap();
        let o = stage(&["status"], &dir);
        o.assert_fail("newer format");
        assert!(o.stderr.contains("newer fencefs"), "{}", o.stderr);
        fs::write(dir.join("fencefs-stage"), &marker).unwrap();
        fs::remove_dir_all(dir.join("work")).unwrap();
        let o = stage(&["status"], &dir);
        o.assert_fail("damaged");
        assert!(o.stderr.contains("work"), "{}", o.stderr);
        assert!(dir.join("upper").is_dir());
    }
}

#[test]
fn the_policy_decides_on_the_merged_view_with_the_same_errnos() {
    let policy = "mode = \"workspace-write\"\ndefault = \"write\"\n\
                  [[rule]]\npath = \"secrets\"\naccess = \"none\"\n\
                  [[rule]]\npath = \"docs\"\naccess = \"read\"\n\
                  [[rule]]\npath = \"d/hidden\"\naccess = \"none\"\n";
    let (m, dir) = staged("stage-policy", policy, |src| {
        put(&src.join("secrets/key"), b"k", 0o600);
        put(&src.join("docs/a.md"), b"doc\n", 0o644);
        put(&src.join("d/hidden"), b"h", 0o644);
        put(&src.join("d/ok"), b"o", 0o644);
        put(&src.join(".git/config"), b"[core]\n", 0o644);
    });
    let before = snapshot(&m.host(""));
    assert_errno(fs::metadata(m.mnt("secrets/key")), libc::ENOENT, "hidden").ok();
    assert_errno(
        fs::write(m.mnt("secrets/new"), b"x"),
        libc::ENOENT,
        "create hidden",
    )
    .ok();
    assert_errno(
        fs::write(m.mnt("docs/a.md"), b"x"),
        libc::EACCES,
        "read rule",
    )
    .ok();
    assert_errno(
        fs::write(m.mnt("docs/new.md"), b"x"),
        libc::EACCES,
        "create under read",
    )
    .ok();
    assert_errno(
        fs::write(m.mnt(".git/config"), b"x"),
        libc::EROFS,
        "protected",
    )
    .ok();
    // rm -rf of a directory with a hidden child fails as without staging (the policy
    // refuses removing it: EACCES), the hidden file is kept and never becomes a whiteout.
    let rm = m.sh("rm -rf d");
    rm.assert_fail("rm -rf d");
    assert!(
        rm.stderr.contains("cannot remove 'd': Permission denied"),
        "{}",
        rm.stderr
    );
    assert_errno(
        fs::metadata(m.mnt("d/ok")),
        libc::ENOENT,
        "visible child removed",
    )
    .ok();
    assert_host_unchanged(&before, &m.host(""), "refusals and the staged rm");
    assert_eq!(stage(&["status"], &dir).stdout, "D d/ok\n");
}

const GIT: &str = "git -c user.name=fencefs-test -c user.email=test@fencefs.invalid -c init.defaultBranch=main -c commit.gpgsign=false -c safe.directory=*";

#[test]
fn git_tar_and_sqlite_wal_as_uid_1000_stay_staged_until_apply() {
    let b = Mount::builder("stage-uid1000")
        .policy(WRITE)
        .arg("--allow-other");
    let src = b.host("");
    put(&src.join("README"), b"readme\n", 0o644);
    let tar = b.outside().join("t.tar");
    sh_in(
        &b.outside(),
        &format!(
            "mkdir -p t/x/y && echo z > t/x/y/z && tar cf {} -C t x",
            tar.display()
        ),
    )
    .assert_ok("tar cf");
    sh_in(&src, "chown -R 1000:1000 .").assert_ok("chown");
    let dir = stage_dir(&b);
    let mut m = b.arg("--stage").arg(&dir).start();
    let before = snapshot(&m.host(""));
    let script = format!(
        "set -e; {GIT} init -q repo; cd repo; echo hello > a.txt; {GIT} add -A; {GIT} commit -q -m first; \
         echo change >> a.txt; {GIT} commit -q -am second; {GIT} fsck --no-progress; cd ..; \
         tar xf {tar}; \
         sqlite3 db.sqlite 'PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1),(2);' >/dev/null; \
         sqlite3 db.sqlite 'SELECT count(*) FROM t;'",
        tar = tar.display()
    );
    let o = m.sh_as(1000, &script);
    o.assert_ok("git, tar x, sqlite WAL as uid 1000 through the staged mount");
    assert_eq!(o.stdout.trim(), "2");
    assert_eq!(fs::read(m.mnt("x/y/z")).unwrap(), b"z\n");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(m.mnt("repo/a.txt")).unwrap().uid(),
        1000,
        "owned by the caller"
    );
    assert_host_unchanged(&before, &m.host(""), "git/tar/sqlite through the stage");
    // The agent cannot reach DIR (0700, the daemon's).
    let peek = m.sh_as(1000, &format!("ls {}", dir.display()));
    peek.assert_fail("uid 1000 lists DIR");
    assert!(peek.stderr.contains("Permission denied"), "{}", peek.stderr);
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    let d = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(d.is_empty(), "SOURCE after apply:\n{d}");
    let h = sh_in(
        &m.host("repo"),
        &format!("{GIT} log --format=%s && {GIT} fsck --no-progress"),
    );
    h.assert_ok("git on the host after apply");
    assert!(h.stdout.starts_with("second\nfirst\n"), "{}", h.stdout);
}

#[test]
fn a_writer_never_reaches_source_through_a_readers_open_file() {
    let b = Mount::builder("stage-reader")
        .policy(WRITE)
        .env("RUST_LOG", "fencefs::fs::core=debug");
    staged_sample(&b.host(""));
    let dir = stage_dir(&b);
    let m = b.arg("--stage").arg(&dir).start();
    let before = snapshot(&m.host(""));
    // A reader holds the file open (a passthrough backing file where the kernel allows),
    // then another process appends and rewrites it in place.
    let reader = fs::File::open(m.mnt("a.txt")).unwrap();
    m.sh("echo more >> a.txt && printf X | dd of=a.txt bs=1 seek=0 conv=notrunc status=none")
        .assert_ok("append and in-place write while a reader holds it");
    assert_eq!(
        fs::read(m.mnt("a.txt")).unwrap(),
        b"Xne\ntwo\nthree\nmore\n"
    );
    assert_host_unchanged(&before, &m.host(""), "writes while a reader holds the file");
    // Where the kernel offers passthrough, staged files get it too (backing files on the
    // overlay need the FUSE stack depth 2).
    assert!(
        !m.stderr().contains("passthrough refused"),
        "passthrough refused on a staged mount:\n{}",
        m.stderr()
    );
    drop(reader);
    // truncate, utimens and xattrs land in the stage too.
    truncate(&m.mnt("sub/b.txt"), 1).unwrap();
    utimes(&m.mnt("run.sh"), 1_000_000).unwrap();
    common::setxattr(&m.mnt("sub/deep/c.txt"), "user.k", b"v").unwrap();
    assert_host_unchanged(&before, &m.host(""), "truncate, utimens, setxattr");
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "M a.txt\nm run.sh\nM sub/b.txt\nm sub/deep/c.txt\n"
    );
}

#[test]
fn host_edits_of_unstaged_paths_show_at_once_while_names_are_cached_long() {
    // Names and attributes cached for a minute: only the host change watch (fanotify on
    // SOURCE, mapped to the merged view's directories) can make a host edit show sooner.
    let b = Mount::builder("stage-host-watch").policy(WRITE);
    staged_sample(&b.host(""));
    let dir = stage_dir(&b);
    let mut m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--cache-ttl")
        .arg("60")
        .start();
    fs::write(m.mnt("a.txt"), b"staged\n").unwrap();
    // The kernel now holds these names and attributes (and the listing of sub/deep).
    assert_eq!(fs::metadata(m.mnt("sub/deep/c.txt")).unwrap().len(), 4);
    assert_eq!(fs::metadata(m.mnt("run.sh")).unwrap().len(), 18);
    let listed = |p: &str| {
        let mut v: Vec<String> = fs::read_dir(m.mnt(p))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(listed("sub/deep"), ["c.txt"]);
    // A person edits on the host: in place, deep in the tree and at the top; a new file in
    // a directory the mount listed; and the staged a.txt.
    fs::write(m.host("sub/deep/c.txt"), b"sea, longer\n").unwrap();
    fs::write(m.host("run.sh"), b"#!/bin/sh\n").unwrap();
    fs::write(m.host("sub/deep/new.txt"), b"new\n").unwrap();
    fs::write(m.host("a.txt"), b"host\n").unwrap();
    let seen = eventually(Duration::from_secs(3), || {
        fs::metadata(m.mnt("sub/deep/c.txt")).is_ok_and(|s| s.len() == 12)
            && fs::metadata(m.mnt("run.sh")).is_ok_and(|s| s.len() == 10)
            && listed("sub/deep") == ["c.txt", "new.txt"]
    });
    assert!(
        seen,
        "host edits of unstaged paths show within 3 s, not after 60"
    );
    assert_eq!(fs::read(m.mnt("sub/deep/c.txt")).unwrap(), b"sea, longer\n");
    assert_eq!(fs::read(m.mnt("sub/deep/new.txt")).unwrap(), b"new\n");
    // The staged version still wins, and is now a conflict.
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"staged\n");
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CM a.txt\n");
}

/// `status --json` entries without their `id` (checked by the caller).
fn without_ids(mut v: serde_json::Value) -> serde_json::Value {
    for e in v.as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("id");
    }
    v
}

/// A file made through a staged mount keeps its handle in the daemon once made (the
/// first write's `security.capability` question then needs no lookup through the
/// layers): after a bare create and close, the daemon holds the staged file; the file
/// then takes writes, and the host stays untouched.
#[test]
fn a_file_made_on_a_staged_mount_keeps_its_handle() {
    let (mut m, dir) = staged("stage-made-handle", WRITE, |src| {
        put(&src.join("a.txt"), b"a\n", 0o644);
    });
    drop(
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.mnt("made.txt"))
            .unwrap(),
    );
    let upper = dir.join("upper").join("made.txt");
    let pid = m.pid();
    let held = || {
        fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
            .filter(|t| *t == upper)
            .count()
    };
    // (The open file itself goes at the RELEASE, which may follow the close.)
    eventually(Duration::from_secs(10), || held() == 1);
    assert_eq!(held(), 1, "the daemon holds the made file's handle once");
    m.sh("echo x >> made.txt").assert_ok("write");
    assert_eq!(fs::read(m.mnt("made.txt")).unwrap(), b"x\n");
    assert!(!m.host("made.txt").exists());
    stop(&mut m);
}
