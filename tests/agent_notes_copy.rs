//! `.fencefs/` never ends up in what tools copy or commit from the workspace: with
//! `agent_notes = true` the directory is reachable by name but not listed at the root, so
//! `git add -A` / `git add .` + commit, `tar -cf`, `rsync -a` and `cp -a` of the mount leave
//! it out, `stage status` never lists it and `stage apply` never writes it, while the agent
//! still reads `.fencefs/denials` by name. Real mounts, real tools.

mod common;

use std::fs;
use std::time::Duration;

use common::*;

const AGENT: u32 = 1000;

const POLICY: &str = "agent_notes = true\nmode = \"workspace-write\"\ndefault = \"write\"\n\
                      [[rule]]\npath = \"vault\"\naccess = \"none\"\n";

/// A git repository made on the host before the mount (git init writes `.git/config`,
/// which workspace-write protects).
fn repo(src: &std::path::Path) {
    put(&src.join("a.txt"), b"one\n", 0o644);
    put(&src.join("sub/b.txt"), b"bee\n", 0o644);
    put(&src.join("vault/key"), b"k\n", 0o644);
    sh_in(src, "git init -q -b main . && git add a.txt sub && git -c user.name=t -c user.email=t@t commit -q -m init")
        .assert_ok("host git init");
    for d in ["", "sub"] {
        fs::set_permissions(
            src.join(d),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
    }
}

/// The names each tool copied, one per line, sorted.
fn names(out: &Out) -> Vec<String> {
    let mut v: Vec<String> = out.stdout.lines().map(str::to_string).collect();
    v.sort();
    v
}

#[test]
fn git_add_all_and_commit_leave_it_out_and_apply_never_writes_it() {
    let b = Mount::builder("notes-git")
        .policy(POLICY)
        .arg("--allow-other");
    repo(&b.host(""));
    let dir = b.root().join("stage");
    let mut m = b.arg("--stage").arg(&dir).start();
    // The agent refuses once, then reads its denials by name.
    m.sh_as(AGENT, "cat vault/key; true").assert_ok("a refusal");
    let d = m.sh_as(AGENT, "cat .fencefs/denials");
    d.assert_ok("denials by name");
    assert!(d.stdout.contains(" vault ENOENT hidden"), "{}", d.stdout);
    assert!(m.sh("test -d .fencefs && test -f .fencefs/README").ok());
    // The agent's usual turn: edit, git add -A, commit; then git add . as well.
    let git = "git -c user.name=t -c user.email=t@t";
    let o = m.sh(&format!(
        "echo two >> a.txt && echo new > new.txt && {git} add -A && {git} commit -q -m turn \
         && {git} add . && {git} status --porcelain --ignored && echo --- \
         && {git} ls-tree -r --name-only HEAD"
    ));
    o.assert_ok("git add -A, commit");
    let (status, tree) = o.stdout.split_once("---\n").unwrap();
    assert_eq!(status, "", "nothing left to add, nothing ignored: {status}");
    assert_eq!(tree, "a.txt\nnew.txt\nsub/b.txt\n");
    // Nothing of it staged; apply writes everything staged and no `.fencefs` on the host.
    let st = run_fencefs(
        ["stage", "status", "--dir"]
            .iter()
            .map(std::ffi::OsStr::new)
            .chain([dir.as_os_str()]),
        Duration::from_secs(60),
    );
    st.assert_ok("stage status");
    assert!(st.stdout.contains("new.txt"), "{}", st.stdout);
    assert!(!st.stdout.contains(".fencefs"), "{}", st.stdout);
    let st = m.terminate().expect("daemon exits on SIGTERM");
    assert!(st.success(), "{}", m.stderr());
    let ap = run_fencefs(
        ["stage", "apply", "--dir"]
            .iter()
            .map(std::ffi::OsStr::new)
            .chain([dir.as_os_str()]),
        Duration::from_secs(60),
    );
    ap.assert_ok("stage apply");
    assert!(!ap.stdout.contains(".fencefs"), "{}", ap.stdout);
    let src = dir.parent().unwrap().join("src");
    assert!(!src.join(".fencefs").exists());
    let h = sh_in(
        &src,
        "git status --porcelain --ignored -- . ':!vault'; git log --oneline | wc -l",
    );
    h.assert_ok("host git status");
    assert_eq!(
        h.stdout.trim(),
        "2",
        "the host's repository is clean: {}",
        h.stdout
    );
}

#[test]
fn tar_rsync_and_cp_a_of_the_root_leave_it_out() {
    let b = Mount::builder("notes-copy")
        .policy(POLICY)
        .arg("--allow-other");
    repo(&b.host(""));
    let out = b.outside();
    let m = b.start();
    let o = out.display();
    let tar = m.sh(&format!(
        "tar -cf {o}/w.tar . && tar -tf {o}/w.tar | grep -v '^./.git/.'"
    ));
    tar.assert_ok("tar");
    assert_eq!(
        names(&tar),
        vec!["./", "./.git/", "./a.txt", "./sub/", "./sub/b.txt"]
    );
    for (what, cmd) in [
        ("rsync -a", format!("rsync -a ./ {o}/rs/")),
        ("cp -a", format!("cp -a . {o}/cp")),
    ] {
        m.sh(&cmd).assert_ok(what);
        let dest = if what == "cp -a" { "cp" } else { "rs" };
        // `.git` itself is copied (checked apart, as tar's `./.git/`), not walked here.
        assert!(out.join(dest).join(".git/HEAD").is_file(), "{what}");
        let l = sh_in(&out.join(dest), "find . -path ./.git -prune -o -print");
        assert_eq!(
            names(&l),
            vec![".", "./a.txt", "./sub", "./sub/b.txt"],
            "{what}"
        );
    }
    // As the agent, too; and still there by name.
    let a = m.sh_as(AGENT, "ls -A; echo ---; cat .fencefs/README | head -n 1");
    a.assert_ok("ls as the agent");
    let (ls, readme) = a.stdout.split_once("---\n").unwrap();
    assert!(!ls.contains(".fencefs"), "{ls}");
    assert!(
        readme.starts_with("This directory is a file system mount"),
        "{readme}"
    );
}
