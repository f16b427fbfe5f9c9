//! The main checkout's state in a linked worktree's served repository (SPEC "Several
//! roots, and git linked worktrees"): the files at the top of the common dir that are not
//! shared between worktrees (`HEAD`, `ORIG_HEAD`, `FETCH_HEAD`, `MERGE_*`,
//! `CHERRY_PICK_HEAD`, `REVERT_HEAD`, `AUTO_MERGE`, `BISECT_*`, ...) belong to the main
//! checkout, and `shallow` and `info/`'s `grafts`, `attributes`, `exclude`,
//! `sparse-checkout` change what the host's git sees of history and diffs: as the agent's
//! uid, every create, append, truncate, chmod, removal, rename and link there is refused
//! with its exact errno and the host's common dir stays byte for byte what it was, while
//! git in the worktree (fetch, merge, gc) keeps its own state in its private dir and works.
//!
//! Needs `bwrap`, `setpriv` and git; it never skips.

mod common;

use common::worktree::*;
use common::*;
use std::fs;

/// Probes as the agent: one line `OP PATH RESULT` per operation (RESULT `ok` or the errno
/// name), the paths relative to the mount's `.fencefs-git`.
const PROBE: &str = r#"
import errno, os, sys
os.chdir('.fencefs-git')
def run(op, p, *a):
    try:
        if op == 'create': os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        elif op == 'append': os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
        elif op == 'creat-append': os.close(os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        elif op == 'truncate': os.truncate(p, 0)
        elif op == 'unlink': os.unlink(p)
        elif op == 'mkdir': os.mkdir(p)
        elif op == 'rename-over': os.rename(a[0], p)
        elif op == 'rename-away': os.rename(p, a[0])
        elif op == 'symlink': os.symlink('refs/heads/main', p)
        elif op == 'chmod': os.chmod(p, 0o666)
        elif op == 'link-to': os.link(a[0], p)
        elif op == 'link-away': os.link(p, a[0])
        r = 'ok'
    except OSError as e:
        r = errno.errorcode[e.errno]
    print(op, p, r)
for line in sys.stdin.read().split('\n'):
    if line.strip():
        run(*line.split())
"#;

/// `(op, path, extra argument, expected)`.
const CASES: &[(&str, &str, &str, &str)] = &[
    ("create", "MERGE_HEAD", "", "EROFS"),
    ("create", "MERGE_MSG", "", "EROFS"),
    ("create", "MERGE_MODE", "", "EROFS"),
    ("create", "CHERRY_PICK_HEAD", "", "EROFS"),
    ("create", "REVERT_HEAD", "", "EROFS"),
    ("create", "AUTO_MERGE", "", "EROFS"),
    ("create", "BISECT_START", "", "EROFS"),
    ("create", "BISECT_LOG", "", "EROFS"),
    ("create", "REBASE_HEAD", "", "EROFS"),
    ("create", "shallow", "", "EROFS"),
    ("create", "HEAD.lock", "", "EROFS"),
    ("create", "index.lock", "", "EROFS"),
    ("create", "info/grafts", "", "EROFS"),
    ("create", "info/attributes", "", "EROFS"),
    ("create", "info/sparse-checkout", "", "EROFS"),
    ("symlink", "ORIG_HEAD.new", "", "EROFS"),
    ("mkdir", "refs/worktree", "", "EROFS"),
    ("mkdir", "refs/rewritten", "", "EROFS"),
    ("create", "refs/bisect/good-x", "", "EROFS"),
    ("append", "ORIG_HEAD", "", "EROFS"),
    ("append", "FETCH_HEAD", "", "EROFS"),
    ("append", "HEAD", "", "EROFS"),
    ("append", "COMMIT_EDITMSG", "", "EROFS"),
    ("append", "description", "", "EROFS"),
    ("append", "info/exclude", "", "EROFS"),
    ("append", "refs/bisect/bad", "", "EROFS"),
    ("truncate", "ORIG_HEAD", "", "EROFS"),
    ("truncate", "info/exclude", "", "EROFS"),
    ("unlink", "FETCH_HEAD", "", "EROFS"),
    ("chmod", "ORIG_HEAD", "", "EROFS"),
    ("chmod", "info/exclude", "", "EROFS"),
    ("rename-over", "ORIG_HEAD", "refs/heads/main", "EROFS"),
    ("rename-over", "MERGE_HEAD", "refs/heads/main", "EROFS"),
    ("rename-away", "ORIG_HEAD", "refs/heads/evil", "EROFS"),
    ("link-to", "MERGE_HEAD", "refs/heads/main", "EROFS"),
    ("link-away", "ORIG_HEAD", "refs/heads/evil", "EROFS"),
    ("link-to", "info/attributes", "refs/heads/main", "EROFS"),
    // The main checkout's reflog of HEAD and its index: hidden.
    ("append", "logs/HEAD", "", "ENOENT"),
    ("creat-append", "logs/HEAD", "", "EACCES"),
    ("create", "logs/refs/bisect", "", "EACCES"),
    ("append", "index", "", "ENOENT"),
];

#[test]
fn the_main_checkout_s_state_and_history_settings_are_not_the_agent_s() {
    let (m, repo) = mount_worktree("wt-main-files", &[]);
    let git = repo.main.join(".git");
    // The main checkout's state after a fetch, an amend and a bisect on the host.
    let head = host_git(&repo.main, &["rev-parse", "HEAD"]).stdout;
    for (f, text) in [
        ("ORIG_HEAD", head.as_str()),
        (
            "FETCH_HEAD",
            &format!("{}\t\tbranch 'main' of .\n", head.trim()),
        ),
        ("COMMIT_EDITMSG", "init\n"),
        ("refs/bisect/bad", head.as_str()),
    ] {
        put(&git.join(f), text.as_bytes(), 0o644);
    }
    chown_r(&repo.main);
    let before = snapshot(&git);
    let input: String = CASES
        .iter()
        .map(|(op, p, a, _)| format!("{op} {p} {a}\n"))
        .collect();
    let o = sh_as_env(&m, &input);
    assert!(o.ok(), "{}{}", o.stdout, o.stderr);
    let got: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(got.len(), CASES.len(), "{}", o.stdout);
    for ((op, p, _, want), line) in CASES.iter().zip(&got) {
        assert_eq!(*line, format!("{op} {p} {want}"), "as uid {AGENT}");
    }
    assert_host_unchanged(&before, &git, "the main checkout's state");
    // Git in the worktree keeps its own: a fetch (FETCH_HEAD), a merge (ORIG_HEAD,
    // MERGE_HEAD while it runs) and gc (the main checkout's reflog is not its to expire).
    let o = agent(
        &m,
        "git fetch -q . hostbranch:refs/remotes/self/hostbranch && \
         git merge -q --no-ff --no-edit self/hostbranch && \
         git reflog expire --expire=now --all && git gc -q && git status --short && \
         git log --format=%s -1",
    );
    assert!(o.ok(), "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("Merge"), "{}", o.stdout);
    let private = git.join("worktrees/src");
    for f in ["FETCH_HEAD", "ORIG_HEAD"] {
        assert!(private.join(f).exists(), "{f} in the private dir");
    }
    for (f, e) in [
        "ORIG_HEAD",
        "FETCH_HEAD",
        "HEAD",
        "logs/HEAD",
        "info/exclude",
    ]
    .iter()
    .map(|f| (f, &before[f.as_bytes()]))
    {
        assert_eq!(fs::read(git.join(f)).unwrap(), e.data, "{f} on the host");
    }
    assert!(!git.join("MERGE_HEAD").exists() && !git.join("shallow").exists());
    let log = host_git(&repo.main, &["log", "--format=%s", "wt"]).stdout;
    assert!(log.contains("host commit") && log.contains("init"), "{log}");
    assert_records_unchanged(&m, &repo);
}

/// Runs [`PROBE`] as the agent with `input` on its stdin.
fn sh_as_env(m: &Mount, input: &str) -> Out {
    let script = format!(
        "python3 -c '{}' <<'EOF'\n{input}EOF\n",
        PROBE.replace('\'', "'\\''")
    );
    m.sh_as(AGENT, &script)
}
