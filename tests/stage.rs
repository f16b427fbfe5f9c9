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
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const WRITE: &str = "mode = \"workspace-write\"\ndefault = \"write\"\n";
const LIMIT: Duration = Duration::from_secs(60);

fn stage_dir(b: &MountBuilder) -> PathBuf {
    b.root().join("stage")
}

/// A staged mount with `policy`, SOURCE populated by `setup`; returns it and DIR.
fn staged(name: &str, policy: &str, setup: impl FnOnce(&Path)) -> (Mount, PathBuf) {
    let b = Mount::builder(name).policy(policy);
    setup(&b.host(""));
    let dir = stage_dir(&b);
    let m = b.arg("--stage").arg(&dir).start();
    (m, dir)
}

fn stage(args: &[&str], dir: &Path) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), args[0].into()];
    v.push("--dir".into());
    v.push(dir.into());
    v.extend(args[1..].iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

fn sample(src: &Path) {
    put(&src.join("a.txt"), b"one\ntwo\nthree\n", 0o644);
    put(&src.join("sub/b.txt"), b"bee\n", 0o644);
    put(&src.join("sub/deep/c.txt"), b"sea\n", 0o644);
    put(&src.join("gone/x"), b"x\n", 0o644);
    put(&src.join("gone/y"), b"y\n", 0o644);
    put(&src.join("run.sh"), b"#!/bin/sh\necho hi\n", 0o644);
}

/// The daemon was told to unmount and has exited.
fn stop(m: &mut Mount) {
    let st = m.terminate().expect("daemon exits on SIGTERM");
    assert!(st.success(), "daemon exit: {st}; stderr:\n{}", m.stderr());
    assert!(!m.is_mounted());
}

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
    let (m, dir) = staged("stage-programs", WRITE, sample);
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
    let (mut m, dir) = staged("stage-diff", WRITE, sample);
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
    let (mut m, dir) = staged("stage-apply", WRITE, sample);
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
    let (mut m, dir) = staged("stage-partial", WRITE, sample);
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
    let (mut m, dir) = staged("stage-conflict", WRITE, sample);
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
    let (mut m, dir) = staged("stage-host-delete", WRITE, sample);
    m.sh("set -e; echo agent >> sub/b.txt; echo agent >> a.txt; mv run.sh run2.sh")
        .assert_ok("stage");
    fs::remove_file(m.host("sub/b.txt")).unwrap();
    // While the mount runs its overlay keeps the deleted original alive; stopped, the
    // deletion shows.
    stop(&mut m);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "M a.txt\nD run.sh\nA run2.sh\nCA sub/b.txt\n"
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
}

/// A second daemon on the same SOURCE and DIR, at its own mount point.
struct Second {
    child: Child,
    mnt: PathBuf,
}

impl Second {
    fn start(m: &Mount, dir: &Path, policy: &Path) -> Second {
        let mnt = m.root().join("mp2");
        fs::create_dir_all(&mnt).unwrap();
        let mut child = Command::new(BIN)
            .arg("mount")
            .arg("-p")
            .arg(policy)
            .arg("--stage")
            .arg(dir)
            .arg(m.host(""))
            .arg(&mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !is_mounted(&mnt) {
            if let Ok(Some(st)) = child.try_wait() {
                let mut e = String::new();
                use std::io::Read;
                child.stderr.take().unwrap().read_to_string(&mut e).unwrap();
                panic!("second daemon exited ({st}): {e}");
            }
            assert!(t.elapsed() < READY_DEADLINE, "second daemon did not mount");
            std::thread::sleep(Duration::from_millis(10));
        }
        Second { child, mnt }
    }
}

impl Drop for Second {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own, not yet reaped, child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .status();
        }
    }
}

#[test]
fn the_stage_survives_sigkill_and_a_new_daemon() {
    let (mut m, dir) = staged("stage-sigkill", WRITE, sample);
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
        assert!(marker.starts_with("fencefs-stage 1\nsource "), "{marker}");
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
    sample(&b.host(""));
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
fn names_with_control_characters_are_quoted_as_git_quotes_them() {
    let (m, dir) = staged("stage-names", WRITE, |_| {});
    fs::write(m.mnt("tab\there"), b"t\n").unwrap();
    fs::write(m.mnt("esc\x1b[31m"), b"e\n").unwrap();
    fs::write(m.mnt("").join(bpath(b"raw\xff")), b"\x00\x01bin").unwrap();
    let st = stage(&["status"], &dir);
    assert_eq!(
        st.stdout,
        "A \"esc\\033[31m\"\nA \"raw\\377\"\nA \"tab\\there\"\n"
    );
    let d = stage(&["diff"], &dir).stdout;
    assert!(
        d.contains("diff --git \"a/tab\\there\" \"b/tab\\there\"\n"),
        "{d}"
    );
    assert!(
        d.contains("Binary files /dev/null and \"b/raw\\377\" differ\n"),
        "{d}"
    );
    assert!(
        !d.bytes().any(|b| b == 0x1b || b == 0),
        "no raw control bytes: {d:?}"
    );
}

/// One command on the control socket; the answer.
fn ctl(sock: &Path, cmd: serde_json::Value) -> serde_json::Value {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap(); // greeting
    writeln!(s, "{cmd}").unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

#[test]
fn the_control_socket_serves_status_and_diff_of_a_running_mount() {
    let b = Mount::builder("stage-control").policy(WRITE);
    sample(&b.host(""));
    let dir = stage_dir(&b);
    let sock = b.root().join("ctl.sock");
    let m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(&sock)
        .start();
    fs::write(m.mnt("a.txt"), b"staged\n").unwrap();
    fs::write(m.mnt("new.txt"), b"n\n").unwrap();
    let st = ctl(&sock, serde_json::json!({"cmd":"status"}));
    assert_eq!(st["ok"], true);
    assert_eq!(st["staged"], 2, "{st}");
    let s = ctl(&sock, serde_json::json!({"cmd":"stage","op":"status"}));
    assert_eq!(
        s["changes"],
        serde_json::json!([
            {"path":"a.txt","change":"modified","conflict":false},
            {"path":"new.txt","change":"added","conflict":false}
        ])
    );
    let cli = run_fencefs(
        ["stage".as_ref(), "status".as_ref(), sock.as_os_str()],
        LIMIT,
    );
    cli.assert_ok("stage status SOCKET");
    assert_eq!(cli.stdout, "M a.txt\nA new.txt\n");
    let d = run_fencefs(
        [
            "stage".as_ref(),
            "diff".as_ref(),
            sock.as_os_str(),
            "a.txt".as_ref(),
        ],
        LIMIT,
    );
    assert!(
        d.stdout.starts_with("diff --git a/a.txt b/a.txt\n"),
        "{}",
        d.stdout
    );
    assert!(!d.stdout.contains("new.txt"), "PATH filter: {}", d.stdout);
    // An unknown op is refused, and nothing changes (live apply: tests/stage_live.rs).
    let a = ctl(&sock, serde_json::json!({"cmd":"stage","op":"bogus"}));
    assert_eq!(a["ok"], false);
    assert!(
        a["error"].as_str().unwrap().contains("unknown stage op"),
        "{a}"
    );
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"one\ntwo\nthree\n");
    let bad = ctl(
        &sock,
        serde_json::json!({"cmd":"stage","op":"status","bogus":1}),
    );
    assert_eq!(bad["ok"], false, "{bad}");
}

#[test]
fn an_apply_stopped_after_a_directory_rename_loses_nothing() {
    let (mut m, dir) = staged("stage-rename-crash", WRITE, sample);
    m.sh("set -e; echo changed > sub/b.txt; mv sub moved")
        .assert_ok("stage a dir rename");
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    // What an apply killed right after its SOURCE rename leaves: SOURCE renamed, the
    // staged directory still redirected to the old name.
    fs::rename(m.host("sub"), m.host("moved")).unwrap();
    assert_eq!(stage(&["status"], &dir).stdout, "M moved/b.txt\n");
    // A new daemon shows the same merged view (the redirect is repaired at startup).
    let second = Second::start(&m, &dir, &m.policy_path());
    let d = snapshot_diff(&merged, &snapshot(&second.mnt));
    assert!(
        d.is_empty(),
        "merged view after the interrupted apply:\n{d}"
    );
    drop(second);
    stage(&["apply"], &dir).assert_ok("apply the rest");
    assert_eq!(fs::read(m.host("moved/b.txt")).unwrap(), b"changed\n");
    assert_eq!(fs::read(m.host("moved/deep/c.txt")).unwrap(), b"sea\n");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

#[test]
fn links_fifos_and_renames_over_files_land_in_the_stage() {
    let (mut m, dir) = staged("stage-links", WRITE, sample);
    let before = snapshot(&m.host(""));
    m.sh("set -e; ln a.txt hard; mkfifo pipe; echo r > repl; mv repl sub/b.txt; mv run.sh run2.sh")
        .assert_ok("link, mkfifo, rename over a file, rename a file");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(m.mnt("hard")).unwrap().nlink(),
        2,
        "a link of a host file"
    );
    assert_eq!(fs::read(m.mnt("hard")).unwrap(), b"one\ntwo\nthree\n");
    assert_host_unchanged(&before, &m.host(""), "links, fifos, renames");
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "A hard\nA pipe\nD run.sh\nA run2.sh\nM sub/b.txt\n"
    );
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(fs::read(m.host("hard")).unwrap(), b"one\ntwo\nthree\n");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        fs::symlink_metadata(m.host("pipe"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(!m.host("run.sh").exists());
    assert_eq!(fs::read(m.host("sub/b.txt")).unwrap(), b"r\n");
}

#[test]
fn a_directory_deleted_and_made_again_applies_as_such() {
    let (mut m, dir) = staged("stage-opaque", WRITE, sample);
    m.sh("set -e; rm -rf sub; mkdir sub; echo n > sub/new")
        .assert_ok("rm -rf, mkdir");
    assert_eq!(names_str(&m.mnt("sub")).unwrap(), vec!["new"]);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "D sub/b.txt\nD sub/deep/\nA sub/new\n"
    );
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    // One entry inside cannot be discarded alone (SOURCE's would come back half-way).
    let d = stage(&["discard", "sub/new"], &dir);
    d.assert_fail("discard inside an opaque directory");
    assert!(d.stdout.contains("discard that directory"), "{}", d.stdout);
    // The directory itself can be discarded, and can be made again the same way.
    let backup = m.root().join("stage-copy");
    sh_in(
        m.root(),
        &format!("cp -a {} {}", dir.display(), backup.display()),
    )
    .assert_ok("cp");
    stage(&["discard", "sub"], &dir).assert_ok("discard the directory");
    assert_eq!(stage(&["status"], &dir).stdout, "");
    fs::remove_dir_all(&dir).unwrap();
    fs::rename(&backup, &dir).unwrap();
    stage(&["apply"], &dir).assert_ok("apply");
    let dd = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(dd.is_empty(), "SOURCE after apply:\n{dd}");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

/// A small tmpfs for DIR, unmounted on drop.
struct SmallFs(PathBuf);

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn enospc_in_dir_fails_the_write_and_keeps_the_stage_consistent() {
    let b = Mount::builder("stage-enospc").policy(WRITE);
    sample(&b.host(""));
    let tm = b.root().join("tm");
    fs::create_dir_all(&tm).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&tm)
        .status()
        .unwrap();
    assert!(ok.success(), "mount a 1 MiB tmpfs");
    let _small = SmallFs(tm.clone());
    let dir = tm.join("stage");
    let mut m = b.arg("--stage").arg(&dir).start();
    let before = snapshot(&m.host(""));
    fs::write(m.mnt("small.txt"), b"fits\n").unwrap();
    let big = pseudo_random(4 << 20, 7);
    assert_errno(
        fs::write(m.mnt("big.bin"), &big),
        libc::ENOSPC,
        "write past DIR's space",
    )
    .ok();
    assert_eq!(fs::read(m.mnt("small.txt")).unwrap(), b"fits\n");
    assert_host_unchanged(&before, &m.host(""), "ENOSPC in DIR");
    m.sh("rm -f big.bin").assert_ok("rm the partial file");
    assert_eq!(stage(&["status"], &dir).stdout, "A small.txt\n");
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(fs::read(m.host("small.txt")).unwrap(), b"fits\n");
}

#[test]
fn a_daemon_without_root_is_told_staging_needs_it() {
    let ws = Mount::builder("stage-nonroot");
    let root = ws.root().to_path_buf();
    sh_in(&root, "mkdir -p u/src u/mnt && chown -R 1000:1000 u").assert_ok("setup");
    let o = sh_as(
        1000,
        &root.join("u"),
        &format!("{BIN} mount -m workspace-write --stage st src mnt"),
    );
    o.assert_fail("--stage as uid 1000");
    assert_eq!(o.stderr.lines().count(), 1, "one line: {}", o.stderr);
    assert!(o.stderr.contains("run the daemon as root"), "{}", o.stderr);
    assert!(!is_mounted(&root.join("u/mnt")));
}

#[test]
fn type_changes_are_t_and_apply_replaces_what_is_in_the_way() {
    let (mut m, dir) = staged("stage-type", WRITE, sample);
    m.sh("set -e; rm a.txt; mkdir a.txt; echo in > a.txt/inner; rm -rf gone; ln -s sub gone")
        .assert_ok("a file becomes a directory, a directory a symlink");
    assert_eq!(stage(&["status"], &dir).stdout, "T a.txt/\nT gone\n");
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    let d = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(d.is_empty(), "SOURCE after apply:\n{d}");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

#[test]
fn a_staged_tree_too_deep_to_walk_is_refused_and_the_daemon_lives() {
    let b = Mount::builder("stage-deep").policy(WRITE);
    let dir = stage_dir(&b);
    let sock = b.root().join("ctl.sock");
    let mut m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(&sock)
        .start();
    let deep = vec!["d"; 450].join("/");
    m.sh(&format!("mkdir -p {deep} && echo x > {deep}/f"))
        .assert_ok("a 450-level tree");
    let s = ctl(&sock, serde_json::json!({"cmd":"stage","op":"status"}));
    assert_eq!(s["ok"], false, "{s}");
    assert!(
        s["error"].as_str().unwrap().contains("deeper than 400"),
        "{s}"
    );
    assert_eq!(
        ctl(&sock, serde_json::json!({"cmd":"status"}))["staged"],
        serde_json::Value::Null
    );
    m.assert_alive("after walking a too-deep staged tree");
    let o = stage(&["status"], &dir);
    o.assert_fail("offline status");
    assert!(o.stderr.contains("deeper than 400"), "{}", o.stderr);
    assert_eq!(fs::read(m.mnt(format!("{deep}/f"))).unwrap(), b"x\n");
}

/// `cmd` run with its stdout on a terminal (`script` gives it a pty); what the terminal got.
fn on_a_tty(cmd: &[&std::ffi::OsStr]) -> String {
    let line: Vec<String> = cmd
        .iter()
        .map(|a| format!("'{}'", a.to_string_lossy().replace('\'', "'\\''")))
        .collect();
    let o = std::process::Command::new("timeout")
        .args(["60", "script", "-qec", &line.join(" "), "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script(1)");
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Nothing a terminal acts on: printable ASCII, newlines (and the pty's carriage returns
/// before them), tabs, and printable non-ASCII that is neither a C1 control nor bidi.
fn inert(s: &str, what: &str) {
    let bad: Vec<char> = s
        .chars()
        .filter(|&c| c != '\n' && c != '\t' && fencefs::quote::unsafe_char(c))
        .filter(|&c| c != '\r')
        .collect();
    assert!(bad.is_empty(), "{what}: raw {bad:?} in {s:?}");
}

#[test]
fn hostile_names_and_contents_never_reach_the_operators_terminal_raw() {
    let (m, dir) = staged("stage-tty", WRITE, |_| {});
    // A name that reads "abcexe.pdf" through U+202E, one with a C1 CSI (U+009B).
    fs::write(m.mnt("abc\u{202e}fdp.exe"), b"x\n").unwrap();
    fs::write(m.mnt("csi\u{9b}31m"), b"y\n").unwrap();
    // Contents that, printed raw, erase the line above and redraw what the operator reads.
    let payload = "rm -rf ~ # \x1b[1A\x1b[2K\rharmless\n\u{9b}2K\u{202e}x\n";
    fs::write(m.mnt("run.sh"), payload).unwrap();
    let js = stage(&["status", "--json"], &dir);
    js.assert_ok("stage status --json");
    inert(&js.stdout, "status --json");
    let v: serde_json::Value = serde_json::from_str(&js.stdout).expect("still JSON");
    assert_eq!(v[0]["path"], "abc\u{202e}fdp.exe", "the same JSON: {v}");
    // Piped, the diff is the exact patch (git apply needs the bytes).
    let piped = stage(&["diff"], &dir);
    assert!(
        piped.stdout.contains(payload.lines().next().unwrap()),
        "{}",
        piped.stdout
    );
    // On a terminal, every byte a terminal would act on is escaped.
    let bin: &std::ffi::OsStr = BIN.as_ref();
    let tty = on_a_tty(&[
        bin,
        "stage".as_ref(),
        "diff".as_ref(),
        "--dir".as_ref(),
        dir.as_os_str(),
    ]);
    inert(&tty, "stage diff on a tty");
    assert!(!tty.contains('\x1b'), "{tty:?}");
    assert!(
        tty.contains("+rm -rf ~ # \\033[1A\\033[2K\\rharmless"),
        "{tty:?}"
    );
    assert!(tty.contains("+\\302\\2332K\\342\\200\\256x"), "{tty:?}");
    drop(m);
}

/// The daemon's peak resident memory (VmHWM), in bytes.
fn peak_rss(pid: i32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let l = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn a_huge_staged_diff_on_the_socket_is_refused_without_rendering_it_all() {
    // The agent decides how big the staged tree is: 8 text files of 15 MiB. The socket's
    // diff is refused past 32 MiB, and the daemon stops rendering there, so its memory
    // does not grow with the tree (before: the whole 120 MiB diff was built first).
    let b = Mount::builder("stage-bigdiff").policy(WRITE);
    let dir = stage_dir(&b);
    let sock = b.root().join("ctl.sock");
    let m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(&sock)
        .start();
    let line = format!("{}\n", "x".repeat(1023));
    let text = line.repeat(15 * 1024);
    for i in 0..8 {
        fs::write(m.mnt(format!("big{i}.txt")), &text).unwrap();
    }
    let before = peak_rss(m.pid());
    let a = ctl(&sock, serde_json::json!({"cmd":"stage","op":"diff"}));
    let grew = peak_rss(m.pid()).saturating_sub(before);
    eprintln!(
        "daemon peak RSS growth for a refused 120 MiB diff: {} MiB",
        grew >> 20
    );
    assert_eq!(a["ok"], false, "{}", a.to_string().len());
    assert!(
        a["error"].as_str().unwrap_or("").contains("over 32 MiB"),
        "{a}"
    );
    assert!(grew < 100 << 20, "the daemon grew {} MiB", grew >> 20);
    // And it still answers.
    assert_eq!(ctl(&sock, serde_json::json!({"cmd":"status"}))["ok"], true);
}
