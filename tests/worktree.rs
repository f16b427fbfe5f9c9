//! Git linked worktrees through the mount (SPEC "Several roots, and git linked
//! worktrees"): SOURCE is a worktree made by `git worktree add` on the host; the agent is
//! the real git of the distribution in a bubblewrap sandbox as host uid 1000 with nothing
//! but the mount (at /workspace), so no host path of the repository exists for it.
//!
//! Checked: status, add, commit, branch, switch, log, stash / pop, rebase onto a branch
//! made on the host and worktree list each exit 0; the agent's commits are in the host's
//! `git log` and `git fsck` is clean; the host's `.git` file and the worktree's records are
//! byte-identical; the repository's hooks/ and config are read-only (EROFS), other
//! worktrees' private dirs are absent, the served names cannot be removed or renamed;
//! `--no-git-worktree` serves the `.git` file as it is; an ordinary repository is served
//! unchanged; two agents in two worktrees of one repository commit at once without a lost
//! commit.
//!
//! Needs `bwrap`, `setpriv` and git; it never skips.

mod common;

use common::worktree::*;
use common::*;
use std::fs;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

/// Every git command of the SPEC, each checked for exit 0 (the script stops at the first
/// failure and says which).
const WORKFLOW: &str = r#"
run() { "$@" || { echo "FAILED: $*" >&2; exit 1; }; }
run git status
echo two > b.txt
run git add b.txt
run git commit -q -m "agent commit"
run git branch feature
run git switch -q feature
echo three > c.txt
run git add c.txt
run git commit -q -m "feature commit"
run git switch -q wt
run git log --oneline
echo change >> a.txt
run git stash -q
test "$(cat a.txt)" = one || { echo "FAILED: stash left a.txt changed" >&2; exit 1; }
run git stash pop -q
run git checkout -q -- a.txt
run git rebase -q hostbranch
test -f host.txt || { echo "FAILED: rebase did not bring host.txt" >&2; exit 1; }
run git worktree list
echo "LIST:"; git worktree list
echo "TOP:"; ls -a
"#;

#[test]
fn git_works_in_a_linked_worktree_with_only_the_mount() {
    let (m, repo) = mount_worktree("wt-git", &[]);
    let o = agent(&m, WORKFLOW);
    assert!(o.ok(), "agent workflow: {}\n{}", o.stdout, o.stderr);
    // The commits are in the shared repository, seen at once by the host's git.
    let log = host_git(&repo.main, &["log", "--format=%s", "wt"]).stdout;
    assert!(log.contains("agent commit"), "host log of wt: {log}");
    assert!(
        log.contains("host commit"),
        "rebased onto hostbranch: {log}"
    );
    let feat = host_git(&repo.main, &["log", "--format=%s", "feature"]).stdout;
    assert!(feat.contains("feature commit"), "{feat}");
    let fsck = host_git(&repo.main, &["fsck", "--strict"]);
    assert!(!fsck.stderr.contains("error"), "fsck: {}", fsck.stderr);
    // worktree list names the main repository (as served) and this worktree.
    let list = o.stdout.split("LIST:").nth(1).unwrap();
    assert!(list.contains("/workspace/.fencefs-git"), "{list}");
    assert!(list.contains("[wt]"), "{list}");
    assert!(
        !list.contains("[other]"),
        "other worktrees are not served: {list}"
    );
    // The repository's root is reached by name only: no listing shows it, so neither
    // `git status` nor `git add -A` ever sees it.
    let top = o.stdout.split("TOP:").nth(1).unwrap();
    assert!(top.lines().any(|l| l == ".git"), "{top}");
    assert!(!top.contains(".fencefs-git"), "{top}");
    assert_records_unchanged(&m, &repo);
    // The agent's files landed as the agent.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(m.host("b.txt")).unwrap().uid(), AGENT);
}

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

#[test]
fn hooks_and_config_are_read_only_and_other_worktrees_absent() {
    let (m, repo) = mount_worktree("wt-fence", &[]);
    let g = |p: &str| m.mnt(format!(".fencefs-git/{p}"));
    let config = fs::read(repo.main.join(".git/config")).unwrap();
    let hook = fs::read(repo.main.join(".git/hooks/pre-commit")).unwrap();
    let append = |p: PathBuf| fs::OpenOptions::new().append(true).open(p);
    // Read-only: the repository's config and hooks, this worktree's records, the .git file.
    assert_eq!(errno_of(append(g("config"))), Some(libc::EROFS));
    assert_eq!(errno_of(append(g("hooks/pre-commit"))), Some(libc::EROFS));
    assert_eq!(
        errno_of(fs::write(g("hooks/post-checkout"), "#!/bin/sh\n")),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno_of(fs::remove_file(g("hooks/pre-commit"))),
        Some(libc::EROFS)
    );
    assert_eq!(errno_of(fs::rename(g("hooks"), g("h2"))), Some(libc::EROFS));
    assert_eq!(
        errno_of(append(g("worktrees/src/gitdir"))),
        Some(libc::EROFS)
    );
    // No commondir can be planted for the host's own git, no submodule config or hook.
    assert_eq!(
        errno_of(fs::write(g("commondir"), "../evil\n")),
        Some(libc::EROFS)
    );
    assert_eq!(errno_of(fs::create_dir(g("modules"))), Some(libc::EROFS));
    assert_eq!(
        errno_of(fs::write(g("config.worktree"), "")),
        Some(libc::EROFS)
    );
    assert_eq!(
        errno_of(fs::remove_file(g("worktrees/src/commondir"))),
        Some(libc::EROFS)
    );
    assert_eq!(errno_of(append(m.mnt(".git"))), Some(libc::EROFS));
    // The served names stay: EBUSY, as a mount point.
    assert_eq!(errno_of(fs::remove_file(m.mnt(".git"))), Some(libc::EBUSY));
    assert_eq!(
        errno_of(fs::rename(m.mnt(".git"), m.mnt("g"))),
        Some(libc::EBUSY)
    );
    assert_eq!(
        errno_of(fs::write(m.mnt("x"), "x").and_then(|_| fs::rename(m.mnt("x"), m.mnt(".git")))),
        Some(libc::EBUSY)
    );
    assert_eq!(
        errno_of(fs::remove_dir(m.mnt(".fencefs-git"))),
        Some(libc::EBUSY)
    );
    // Other worktrees and the main checkout's index are absent; nothing new appears there.
    assert_eq!(
        errno_of(fs::metadata(g("worktrees/other"))),
        Some(libc::ENOENT)
    );
    assert_eq!(errno_of(fs::metadata(g("index"))), Some(libc::ENOENT));
    assert_eq!(
        errno_of(fs::create_dir(g("worktrees/new"))),
        Some(libc::EACCES)
    );
    let listed: Vec<String> = fs::read_dir(g("worktrees"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed, vec!["src"]);
    // The served .git names the served repository, relative: no host path.
    let served = fs::read_to_string(m.mnt(".git")).unwrap();
    assert_eq!(served, "gitdir: .fencefs-git/worktrees/src\n");
    // Prune and gc inside cannot drop the host's record of this worktree (whose gitdir
    // names a host path the sandbox lacks): the served `locked` keeps it.
    let o = agent(
        &m,
        "git worktree prune && git gc -q --prune=now && git worktree list",
    );
    assert!(o.ok(), "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("locked"), "{}", o.stdout);
    assert!(repo.main.join(".git/worktrees/src/HEAD").exists());
    assert!(!repo.main.join(".git/worktrees/src/locked").exists());
    // git config writes are refused too.
    let o = agent(&m, "git config user.name evil");
    assert!(!o.ok(), "git config must fail: {}", o.stdout);
    assert_eq!(fs::read(repo.main.join(".git/config")).unwrap(), config);
    assert_eq!(
        fs::read(repo.main.join(".git/hooks/pre-commit")).unwrap(),
        hook
    );
    assert!(!repo.main.join(".git/hooks/post-checkout").exists());
    assert!(!repo.main.join(".git/commondir").exists());
    assert!(!repo.main.join(".git/modules").exists());
    assert!(!repo.main.join(".git/worktrees/new").exists());
    assert!(repo.main.join(".git/worktrees/other").exists());
    assert_records_unchanged(&m, &repo);
}

#[test]
fn no_git_worktree_serves_the_git_file_as_it_is() {
    let (m, repo) = mount_worktree("wt-off", &["--no-git-worktree"]);
    assert_eq!(fs::read(m.mnt(".git")).unwrap(), repo.dotgit);
    assert_eq!(
        errno_of(fs::metadata(m.mnt(".fencefs-git"))),
        Some(libc::ENOENT)
    );
    let o = agent(&m, "git status");
    assert!(
        !o.ok(),
        "git has no repository without the host path: {}",
        o.stdout
    );
    assert!(o.stderr.contains("not a git repository"), "{}", o.stderr);
    assert!(m.stderr().contains("--no-git-worktree"), "{}", m.stderr());
    assert_records_unchanged(&m, &repo);
}

#[test]
fn an_ordinary_repository_is_served_unchanged() {
    require_programs();
    let b = Mount::builder("wt-plain")
        .policy(POLICY)
        .arg("--allow-other");
    let src = b.host("");
    host_git(&src, &["init", "-q", "-b", "main"]);
    fs::write(src.join("a.txt"), "one\n").unwrap();
    host_git(&src, &["add", "."]);
    host_git(&src, &["commit", "-q", "-m", "init"]);
    chown_r(&src);
    let m = b.start();
    assert!(fs::metadata(m.mnt(".git")).unwrap().is_dir());
    assert_eq!(
        errno_of(fs::metadata(m.mnt(".fencefs-git"))),
        Some(libc::ENOENT)
    );
    let o = agent(
        &m,
        "echo two > b.txt && git add b.txt && git commit -q -m agent && git status --short",
    );
    assert!(o.ok(), "{}{}", o.stdout, o.stderr);
    let log = host_git(&src, &["log", "--format=%s"]).stdout;
    assert!(log.contains("agent"), "{log}");
    assert!(!m.stderr().contains("git worktree"), "{}", m.stderr());
}

/// Two agents in two worktrees of one repository (two mounts) commit in a loop at once:
/// every commit of each is in the host's log afterwards and `git fsck` is clean.
///
/// The agents' git runs no automatic maintenance (`maintenance.auto=false`, `gc.auto=0`):
/// after ~1,100 commits each, the shared repository passes `gc.auto`'s 6,700 loose
/// objects, and every `git commit` then starts a detached `git maintenance run --auto`.
/// Its `git reflog expire --all` holds the worktree's `HEAD.lock` while the loop's next
/// commit takes it (git waits 100 ms for a ref lock, then fails with "File exists"; up to
/// three such gcs were seen at once in one agent: gc.pid's liveness check, `kill(pid,
/// 0)`, cannot see the other agent's pid namespace). That is git racing itself, on any
/// file system once the gc is slow enough: over this mount on a loaded machine it failed
/// 9 runs in 10, on either transport.
#[test]
fn two_agents_in_two_worktrees_lose_no_commit() {
    let (m1, repo) = mount_worktree("wt-two", &[]);
    // The second worktree is `other`: mount it too.
    let b = Mount::builder("wt-two-b")
        .policy(POLICY)
        .arg("--allow-other");
    let src2 = b.host("");
    fs::remove_dir(&src2).unwrap();
    host_git(
        &repo.main,
        &["worktree", "add", "-q", src2.to_str().unwrap(), "-b", "wt2"],
    );
    chown_r(&repo.main);
    chown_r(&src2);
    let m2 = b.start();
    let secs = 30;
    let script = format!(
        r#"export GIT_CONFIG_COUNT=2 GIT_CONFIG_KEY_0=maintenance.auto GIT_CONFIG_VALUE_0=false
export GIT_CONFIG_KEY_1=gc.auto GIT_CONFIG_VALUE_1=0
n=0; end=$(( $(date +%s) + {secs} ))
while [ "$(date +%s)" -lt "$end" ]; do
  n=$((n+1)); echo "$n" > "f$n"; git add "f$n" || exit 1; git commit -q -m "c$n" || exit 1
done; echo "COMMITS $n""#
    );
    let (s1, s2) = (script.clone(), script);
    let mnt1 = m1.mnt("");
    let mnt2 = m2.mnt("");
    let limit = Duration::from_secs(secs + 120);
    let t1 = thread::spawn(move || run_bounded(bwrap(&mnt1, &s1), limit, "agent 1"));
    let t2 = thread::spawn(move || run_bounded(bwrap(&mnt2, &s2), limit, "agent 2"));
    for (o, branch) in [(t1.join().unwrap(), "wt"), (t2.join().unwrap(), "wt2")] {
        assert!(o.ok(), "{branch}: {}{}", o.stdout, o.stderr);
        let n: usize = o
            .stdout
            .rsplit("COMMITS ")
            .next()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("{branch}: {}", o.stdout));
        assert!(n > 0, "{branch}: no commit in {secs} s");
        eprintln!("{branch}: {n} commits in {secs} s");
        let log = host_git(&repo.main, &["log", "--format=%s", branch]).stdout;
        let mine = log.lines().filter(|l| l.starts_with('c')).count();
        assert_eq!(mine, n, "{branch}: every commit is in the host's log");
    }
    let fsck = host_git(&repo.main, &["fsck", "--strict"]);
    assert!(!fsck.stderr.contains("error"), "fsck: {}", fsck.stderr);
}

/// A commit made on the host in the main checkout is seen through the mount at once: the
/// agent reads `main`, the host commits there (git replaces the ref file by a rename), the
/// agent sees the new commit well before the kernel's 10 s name cache would expire.
#[test]
fn host_commits_reach_the_mount_at_once() {
    let (m, repo) = mount_worktree("wt-watch", &[]);
    let o = agent(&m, "git log -1 --format=%s main");
    assert!(
        o.ok() && o.stdout.trim() == "init",
        "{}{}",
        o.stdout,
        o.stderr
    );
    fs::write(repo.main.join("late.txt"), "late\n").unwrap();
    host_git(&repo.main, &["add", "late.txt"]);
    host_git(&repo.main, &["commit", "-q", "-m", "host late commit"]);
    chown_r(&repo.main);
    let start = Instant::now();
    let seen = loop {
        let o = agent(&m, "git log -1 --format=%s main");
        if o.stdout.trim() == "host late commit" {
            break true;
        }
        if start.elapsed() > Duration::from_secs(5) {
            break false;
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert!(
        seen,
        "the host's commit on main is visible through the mount within 5 s"
    );
}

/// The policy's rules for `.git/...` apply to the served repository too: it is decided
/// under both names, so a policy written for ordinary repositories keeps its meaning.
#[test]
fn git_rules_of_the_policy_apply_to_the_served_repository() {
    let policy = format!(
        "{POLICY}\n[[rule]]\npath = \".git/refs/tags\"\naccess = \"read\"\n\n\
         [[rule]]\npath = \".git/description\"\naccess = \"none\"\n"
    );
    require_programs();
    let b = Mount::builder("wt-alias")
        .policy(&policy)
        .arg("--allow-other");
    let src = b.host("");
    let repo = make_repo(b.root(), &src);
    fs::write(repo.main.join(".git/description"), "the repository\n").unwrap();
    let m = b.start();
    let o = agent(&m, "git tag v1");
    assert!(!o.ok(), "a tag needs .git/refs/tags writable: {}", o.stdout);
    assert!(!repo.main.join(".git/refs/tags/v1").exists());
    let tag = fs::write(m.mnt(".fencefs-git/refs/tags/v2"), "x\n");
    assert_eq!(errno_of(tag), Some(libc::EACCES));
    assert_eq!(
        errno_of(fs::metadata(m.mnt(".fencefs-git/description"))),
        Some(libc::ENOENT)
    );
    let listed = fs::read_dir(m.mnt(".fencefs-git")).unwrap();
    let names: Vec<String> = listed
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!names.iter().any(|n| n == "description"), "{names:?}");
    assert!(names.iter().any(|n| n == "objects"), "{names:?}");
    // Everything else still works.
    let o = agent(&m, "echo x > x.txt && git add x.txt && git commit -q -m x");
    assert!(o.ok(), "{}{}", o.stdout, o.stderr);
    assert_records_unchanged(&m, &repo);
}

/// `.fencefs/denials` is no oracle for the names the layout or the `.git` alias hides: an
/// existing hidden name (another worktree's private dir, a `.git/...` rule's file seen as
/// `.fencefs-git/...`) and a missing one leave the same line.
#[test]
fn denials_do_not_tell_an_existing_fenced_or_aliased_name_from_a_missing_one() {
    let policy = format!(
        "{POLICY}agent_notes = true\n\n[[rule]]\npath = \".git/secret-*\"\naccess = \"none\"\n"
    );
    require_programs();
    let b = Mount::builder("wt-notes-oracle")
        .policy(&policy)
        .arg("--allow-other");
    let src = b.host("");
    let repo = make_repo(b.root(), &src);
    fs::write(repo.main.join(".git/secret-x"), "s\n").unwrap();
    let m = b.start();
    let o = m.sh_as(
        AGENT,
        "for p in worktrees/other worktrees/nope secret-x secret-y; do \
         stat .fencefs-git/$p >/dev/null 2>&1 && echo \"FOUND $p\"; done; \
         cat .fencefs/denials",
    );
    o.assert_ok("stat and cat denials as 1000");
    assert!(!o.stdout.contains("FOUND"), "{}", o.stdout);
    // Each line without its timestamp, the probed names made one.
    let seen = |name: &str, same: &str| -> Vec<String> {
        o.stdout
            .lines()
            .filter(|l| l.contains(name))
            .map(|l| l.split_once(' ').map_or(l, |x| x.1).replace(name, same))
            .collect()
    };
    assert_eq!(
        seen("worktrees/other", "worktrees/N"),
        seen("worktrees/nope", "worktrees/N"),
        "another worktree's private dir is told from a missing one:\n{}",
        o.stdout
    );
    assert_eq!(
        seen("secret-x", "secret-N"),
        seen("secret-y", "secret-N"),
        "a hidden .git file is told from a missing one:\n{}",
        o.stdout
    );
    assert_records_unchanged(&m, &repo);
}

/// SOURCE's `.git` is the agent's to write (here: a plain directory, no repository):
/// a `.git` file naming another repository's worktree does not get that repository
/// served at the next mount, since that worktree's `gitdir` does not name this `.git`.
#[test]
fn a_git_file_naming_another_repository_s_worktree_serves_nothing_of_it() {
    require_programs();
    let b = Mount::builder("wt-foreign")
        .policy(POLICY)
        .arg("--allow-other");
    let src = b.host("");
    let victim = b.root().join("outside/victim");
    let vwt = b.root().join("outside/victim-wt");
    fs::create_dir_all(&victim).unwrap();
    host_git(&victim, &["init", "-q", "-b", "main"]);
    fs::write(victim.join("v.txt"), "victim\n").unwrap();
    host_git(&victim, &["add", "."]);
    host_git(&victim, &["commit", "-q", "-m", "victim"]);
    host_git(
        &victim,
        &["worktree", "add", "-q", vwt.to_str().unwrap(), "-b", "v"],
    );
    let planted = format!("gitdir: {}/.git/worktrees/victim-wt\n", victim.display());
    fs::write(src.join(".git"), &planted).unwrap();
    let m = b.start();
    assert_eq!(
        errno_of(fs::metadata(m.mnt(".fencefs-git/HEAD"))),
        Some(libc::ENOENT),
        "the other repository is served"
    );
    assert_eq!(fs::read_to_string(m.mnt(".git")).unwrap(), planted);
}

/// The main checkout's own state in the common dir is not the agent's: its `HEAD`, and
/// the todo lists of an operation in progress there (`rebase-merge/`, `rebase-apply/`,
/// `sequencer/`), whose `exec` lines the host's git runs on `--continue`, are read-only
/// (EROFS). Git in the linked worktree keeps its own in its private dir, and still works.
#[test]
fn the_main_checkout_s_head_and_todo_lists_are_read_only() {
    let (m, repo) = mount_worktree("wt-main-state", &[]);
    let g = |p: &str| m.mnt(format!(".fencefs-git/{p}"));
    let head = fs::read(repo.main.join(".git/HEAD")).unwrap();
    let o = m.sh_as(
        AGENT,
        "for d in rebase-merge rebase-apply sequencer; do mkdir .fencefs-git/$d && echo \"MADE $d\"; done; \
         echo 'ref: refs/heads/wt' > .fencefs-git/HEAD && echo WROTE-HEAD; true",
    );
    assert!(
        !o.stdout.contains("MADE") && !o.stdout.contains("WROTE"),
        "{}",
        o.stdout
    );
    assert_eq!(
        errno_of(fs::create_dir(g("rebase-merge"))),
        Some(libc::EROFS)
    );
    let append = fs::OpenOptions::new().append(true).open(g("HEAD"));
    assert_eq!(errno_of(append), Some(libc::EROFS));
    for d in ["rebase-merge", "rebase-apply", "sequencer"] {
        assert!(
            !repo.main.join(".git").join(d).exists(),
            "{d} made on the host"
        );
    }
    assert_eq!(fs::read(repo.main.join(".git/HEAD")).unwrap(), head);
    // The worktree's own rebase state lives in its private dir: rebase still works.
    let o = agent(
        &m,
        "git rebase -q hostbranch && git switch -q -c side && git status --short",
    );
    assert!(o.ok(), "{}{}", o.stdout, o.stderr);
    assert_records_unchanged(&m, &repo);
}

/// SIGHUP, then waits for the daemon's `policy reloaded` line.
fn reload_and_wait(m: &Mount) {
    let before = m.stderr().matches("policy reloaded").count();
    m.reload();
    assert!(
        eventually(Duration::from_secs(30), || m
            .stderr()
            .matches("policy reloaded")
            .count()
            > before),
        "no reload: {}",
        m.stderr()
    );
}

/// `git worktree list` inside names no host path: the main worktree is the served
/// repository, this one `.` (the served record), other worktrees are not listed. Checked
/// with Debian's git (/usr/bin/git) and the newer one on PATH, byte for byte.
#[test]
fn worktree_list_inside_prints_the_mount_s_own_view() {
    let (m, repo) = mount_worktree("wt-list", &[]);
    let short = |rev: &str| {
        host_git(&repo.main, &["rev-parse", "--short", rev])
            .stdout
            .trim()
            .to_string()
    };
    let long = |rev: &str| {
        host_git(&repo.main, &["rev-parse", rev])
            .stdout
            .trim()
            .to_string()
    };
    let main_path = "/workspace/.fencefs-git";
    let pad = |p: &str| format!("{p}{} ", " ".repeat(1 + main_path.len() - p.len()));
    let plain = format!(
        "{}{} [main]\n{}{} [wt] locked\n",
        pad(main_path),
        short("main"),
        pad("."),
        short("wt")
    );
    let porcelain = format!(
        "worktree {main_path}\nHEAD {}\nbranch refs/heads/main\n\n\
         worktree .\nHEAD {}\nbranch refs/heads/wt\nlocked served by fencefs: not to be pruned while mounted\n\n",
        long("main"),
        long("wt")
    );
    for git in ["/usr/bin/git", "git"] {
        let o = agent(
            &m,
            &format!(
                "{git} --version >&2 && {git} worktree list && echo PORCELAIN && {git} worktree list --porcelain"
            ),
        );
        assert!(o.ok(), "{git}: {}{}", o.stdout, o.stderr);
        let (got_plain, got_porcelain) = o.stdout.split_once("PORCELAIN\n").unwrap();
        assert_eq!(
            got_plain,
            plain,
            "{git} worktree list ({})",
            o.stderr.trim()
        );
        assert_eq!(got_porcelain, porcelain, "{git} --porcelain");
        let host_root = m.root().display().to_string();
        assert!(!o.stdout.contains(&host_root), "a host path: {}", o.stdout);
    }
    // The record git reads is served; the host's is untouched.
    assert_eq!(
        fs::read_to_string(m.mnt(".fencefs-git/worktrees/src/gitdir")).unwrap(),
        "./.git\n"
    );
    assert_records_unchanged(&m, &repo);
}

/// `git gc --prune=now` inside cannot see what only the other worktrees reach (their
/// HEADs, indexes and reflogs are hidden): the objects stay (kept: removing one is
/// EROFS), so a host-side worktree's own commit and staged file survive and the host's
/// `git fsck` is clean.
#[test]
fn gc_inside_keeps_the_objects_only_other_worktrees_reach() {
    let (m, repo) = mount_worktree("wt-gc", &[]);
    let other = m.root().join("outside/other");
    host_git(&other, &["switch", "-q", "--detach"]);
    fs::write(
        other.join("only-here.txt"),
        "only in other's detached HEAD\n",
    )
    .unwrap();
    host_git(&other, &["add", "only-here.txt"]);
    host_git(
        &other,
        &["commit", "-q", "-m", "detached, unreferenced elsewhere"],
    );
    let commit = host_git(&other, &["rev-parse", "HEAD"])
        .stdout
        .trim()
        .to_string();
    fs::write(other.join("staged.txt"), "staged in other's index only\n").unwrap();
    host_git(&other, &["add", "staged.txt"]);
    let blob = host_git(&other, &["rev-parse", ":staged.txt"])
        .stdout
        .trim()
        .to_string();
    chown_r(&repo.main);
    chown_r(&other);
    // Removing an object through the mount is refused, the file stays.
    let loose = format!(".fencefs-git/objects/{}/{}", &commit[..2], &commit[2..]);
    assert_eq!(errno_of(fs::remove_file(m.mnt(&loose))), Some(libc::EROFS));
    let host_obj = repo
        .main
        .join(".git/objects")
        .join(&commit[..2])
        .join(&commit[2..]);
    assert!(host_obj.exists());
    let o = agent(
        &m,
        "git reflog expire --expire=now --all; git gc -q --prune=now; git prune --expire=now; \
         echo two > t.txt && git add t.txt && git commit -q -m after-gc && echo COMMITTED",
    );
    assert!(o.stdout.contains("COMMITTED"), "{}{}", o.stdout, o.stderr);
    for obj in [&commit, &blob] {
        host_git(&other, &["cat-file", "-e", obj]);
    }
    let fsck = host_git(&repo.main, &["fsck", "--strict"]);
    assert!(
        !fsck.stderr.contains("error") && !fsck.stderr.contains("missing"),
        "fsck: {}",
        fsck.stderr
    );
    let log = host_git(&repo.main, &["log", "--format=%s", "wt"]).stdout;
    assert!(log.contains("after-gc"), "{log}");
    assert_records_unchanged(&m, &repo);
}

/// A reload reads `SOURCE/.git` again: a worktree that stops being one is no longer
/// served (`.fencefs-git` absent), one that becomes one again is served (git works), a
/// record changed on the host (the repository moved and `git worktree repair`) is
/// followed, and a `.git` naming a worktree whose record does not point back is refused
/// as at mount, logged, while the rest of the reload (the policy) goes on.
#[test]
fn a_reload_follows_the_worktree_s_state_on_the_host() {
    let (m, repo) = mount_worktree("wt-reload", &[]);
    let dotgit = m.host(".git");
    let o = agent(&m, "git status --short && cat .git");
    assert!(o.ok(), "{}{}", o.stdout, o.stderr);
    // Gone: `.git` moved away on the host.
    fs::rename(&dotgit, m.host("git-file.off")).unwrap();
    reload_and_wait(&m);
    assert!(
        m.stderr().contains("no longer served as a linked worktree"),
        "{}",
        m.stderr()
    );
    assert_eq!(
        errno_of(fs::metadata(m.mnt(".fencefs-git"))),
        Some(libc::ENOENT)
    );
    assert_eq!(
        errno_of(fs::metadata(m.mnt(".fencefs-git/HEAD"))),
        Some(libc::ENOENT)
    );
    assert_eq!(errno_of(fs::metadata(m.mnt(".git"))), Some(libc::ENOENT));
    // Back: served again, git works and commits land on the host.
    fs::rename(m.host("git-file.off"), &dotgit).unwrap();
    reload_and_wait(&m);
    assert!(
        m.stderr().contains("src (detected on reload)"),
        "{}",
        m.stderr()
    );
    let o = agent(
        &m,
        "echo r > r.txt && git add r.txt && git commit -q -m after-reload",
    );
    assert!(o.ok(), "{}{}", o.stdout, o.stderr);
    let log = host_git(&repo.main, &["log", "--format=%s", "wt"]).stdout;
    assert!(log.contains("after-reload"), "{log}");
    assert_records_unchanged(&m, &repo);
    // The repository moves on the host and the worktree is repaired: followed.
    let moved = m.root().join("outside/repo-moved");
    fs::rename(&repo.main, &moved).unwrap();
    host_git(
        &moved,
        &["worktree", "repair", m.host("").to_str().unwrap()],
    );
    chown_r(&moved);
    chown_r(&m.host(""));
    reload_and_wait(&m);
    let moved = fs::canonicalize(&moved).unwrap();
    let line = format!("repository {}/.git is served", moved.display());
    assert!(m.stderr().contains(&line), "{}", m.stderr());
    let o = agent(
        &m,
        "echo s > s.txt && git add s.txt && git commit -q -m after-move",
    );
    assert!(o.ok(), "{}{}", o.stdout, o.stderr);
    let log = host_git(&moved, &["log", "--format=%s", "wt"]).stdout;
    assert!(log.contains("after-move"), "{log}");
    // A `.git` naming a worktree whose record does not name it back: refused, the rest
    // of the reload (a new rule) in force.
    let served = fs::read(&dotgit).unwrap();
    let planted = format!("gitdir: {}/.git/worktrees/other\n", moved.display());
    fs::write(&dotgit, &planted).unwrap();
    let policy = format!("{POLICY}\n[[rule]]\npath = \"r.txt\"\naccess = \"read\"\n");
    fs::write(m.policy_path(), policy).unwrap();
    reload_and_wait(&m);
    assert!(
        m.stderr().contains("gitdir does not name"),
        "{}",
        m.stderr()
    );
    assert_eq!(
        errno_of(fs::metadata(m.mnt(".fencefs-git/HEAD"))),
        Some(libc::ENOENT)
    );
    assert_eq!(fs::read_to_string(m.mnt(".git")).unwrap(), planted);
    let o = m.sh_as(AGENT, "echo x >> r.txt");
    assert!(!o.ok(), "the new rule is in force: {}", o.stdout);
    assert_eq!(fs::read(m.host("r.txt")).unwrap(), b"r\n");
    fs::write(&dotgit, served).unwrap();
}

/// A repository that was not served at mount lies outside the daemon's confinement
/// (Landlock, fixed at mount): a SOURCE that becomes a linked worktree of it afterwards
/// is logged and served as it is on reload, never half-served.
#[test]
fn a_worktree_of_a_repository_not_served_at_mount_waits_for_a_remount() {
    require_programs();
    let b = Mount::builder("wt-late")
        .policy(POLICY)
        .arg("--allow-other");
    let src = b.host("");
    let main = b.root().join("outside/late");
    fs::create_dir_all(&main).unwrap();
    host_git(&main, &["init", "-q", "-b", "main"]);
    fs::write(main.join("a.txt"), "one\n").unwrap();
    host_git(&main, &["add", "."]);
    host_git(&main, &["commit", "-q", "-m", "init"]);
    let m = b.start();
    assert!(
        eventually(Duration::from_secs(10), || m
            .stderr()
            .contains("limited by Landlock")),
        "{}",
        m.stderr()
    );
    host_git(
        &main,
        &["worktree", "add", "-q", src.to_str().unwrap(), "-b", "late"],
    );
    let dotgit = fs::read(m.host(".git")).unwrap();
    reload_and_wait(&m);
    assert!(m.stderr().contains("remount to serve it"), "{}", m.stderr());
    assert_eq!(
        errno_of(fs::metadata(m.mnt(".fencefs-git"))),
        Some(libc::ENOENT)
    );
    assert_eq!(fs::read(m.mnt(".git")).unwrap(), dotgit);
}

/// The kept fence against the paths around it: a directory holding objects or packs
/// (`objects/XX`, `objects/pack`, `objects` itself) cannot be moved away (EROFS; moved,
/// its objects would no longer be kept and could be removed), and an existing object is
/// never replaced by a rename onto its name (EEXIST, as git's own "already there").
#[test]
fn kept_objects_are_not_moved_away_nor_replaced() {
    let (m, repo) = mount_worktree("wt-kept", &[]);
    let head = host_git(&repo.main, &["rev-parse", "HEAD"])
        .stdout
        .trim()
        .to_string();
    let (xx, rest) = head.split_at(2);
    let g = |p: &str| m.mnt(format!(".fencefs-git/objects/{p}"));
    let host_objects = repo.main.join(".git/objects");
    let before = fs::read(host_objects.join(xx).join(rest)).unwrap();
    fs::create_dir_all(host_objects.join("pack")).unwrap();
    for (from, to) in [
        (xx.to_string(), "moved".to_string()),
        ("pack".to_string(), "pack-moved".to_string()),
    ] {
        assert_eq!(
            errno_of(fs::rename(g(&from), g(&to))),
            Some(libc::EROFS),
            "{from}"
        );
        assert!(host_objects.join(&from).is_dir(), "{from} stays");
        assert!(!host_objects.join(&to).exists(), "{to}");
    }
    assert_eq!(
        errno_of(fs::rename(g(""), m.mnt(".fencefs-git/objects-moved"))),
        Some(libc::EROFS)
    );
    // A directory moved in over a kept one's place (an empty one made by the host).
    fs::create_dir(g("fresh")).unwrap();
    assert_eq!(errno_of(fs::rename(g("fresh"), g("ee"))), Some(libc::EROFS));
    // A file renamed onto an existing object's name.
    fs::write(g(&format!("{xx}/tmp_obj_x")), "garbage").unwrap();
    assert_eq!(
        errno_of(fs::rename(
            g(&format!("{xx}/tmp_obj_x")),
            g(&format!("{xx}/{rest}"))
        )),
        Some(libc::EEXIST)
    );
    assert_eq!(fs::read(host_objects.join(xx).join(rest)).unwrap(), before);
    let fsck = host_git(&repo.main, &["fsck", "--strict"]);
    assert!(!fsck.stderr.contains("error"), "fsck: {}", fsck.stderr);
    assert_records_unchanged(&m, &repo);
}

#[test]
fn a_create_onto_an_object_the_kernel_thinks_absent_is_erofs() {
    // The kernel sends CREATE (not OPEN) for a name it has cached as absent: an object
    // the host wrote after that lookup is refused as when the kernel knew it (EROFS),
    // never opened to change.
    let (m, repo) = mount_worktree("wt-kept-create", &["--no-watch", "--cache-ttl", "60"]);
    let host_objects = repo.main.join(".git/objects");
    fs::create_dir_all(host_objects.join("ab")).unwrap();
    let rest = "0".repeat(38);
    let obj = m.mnt(format!(".fencefs-git/objects/ab/{rest}"));
    assert_eq!(errno_of(fs::metadata(&obj)), Some(libc::ENOENT));
    fs::write(host_objects.join("ab").join(&rest), b"host object").unwrap();
    let opened = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&obj);
    assert_eq!(
        errno_of(opened),
        Some(libc::EROFS),
        "O_CREAT of a stale absent name"
    );
    // Known once the kernel has been told to forget its stale entry (on `/dev/fuse` the
    // notice follows the reply): every way of changing it is EROFS.
    assert!(eventually(Duration::from_secs(3), || fs::metadata(&obj).is_ok()));
    let write = fs::OpenOptions::new().write(true).open(&obj);
    assert_eq!(errno_of(write), Some(libc::EROFS), "open for writing");
    let append = fs::OpenOptions::new().append(true).open(&obj);
    assert_eq!(errno_of(append), Some(libc::EROFS), "open for appending");
    let create = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&obj);
    assert_eq!(
        errno_of(create),
        Some(libc::EROFS),
        "O_CREAT of a known name"
    );
    let trunc = std::process::Command::new("truncate")
        .args(["-s", "0"])
        .arg(&obj)
        .status()
        .unwrap();
    assert!(!trunc.success(), "truncate");
    assert_eq!(
        fs::read(host_objects.join("ab").join(&rest)).unwrap(),
        b"host object"
    );
    assert_records_unchanged(&m, &repo);
}
