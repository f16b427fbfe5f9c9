//! Linked-worktree fixtures shared by tests/worktree.rs and tests/worktree_main.rs: a
//! repository made on the host (main checkout, the worktree at SOURCE, another worktree),
//! the agent (real git as uid 1000 in bubblewrap with only the mount), host-side git.

use super::*;

pub const AGENT: u32 = 1000;

pub const POLICY: &str = r#"
mode = "workspace-write"
default = "write"
writable_roots = ["."]
"#;

pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Panics (never skips) when bwrap, setpriv or git is missing.
pub fn require_programs() {
    for prog in ["bwrap", "setpriv", "git"] {
        let found = std::env::split_paths(SANDBOX_PATH).any(|d| d.join(prog).is_file());
        assert!(found, "tests/worktree.rs needs {prog} in {SANDBOX_PATH}");
    }
}

/// A command with a fixed environment (no user git config, C locale, fixed identity).
pub fn clean_cmd(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .env("PATH", SANDBOX_PATH)
        .env("LC_ALL", "C")
        .env("HOME", "/tmp")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "agent")
        .env("GIT_AUTHOR_EMAIL", "agent@example.com")
        .env("GIT_COMMITTER_NAME", "agent")
        .env("GIT_COMMITTER_EMAIL", "agent@example.com");
    c
}

/// `setpriv … bwrap … sh -c script` as host uid/gid 1000 with only the system dirs
/// (read-only) and the mount at /workspace (see tests/container.rs for why setpriv).
pub fn bwrap(mnt: &Path, script: &str) -> Command {
    let mut c = clean_cmd("setpriv");
    c.arg(format!("--reuid={AGENT}"))
        .arg(format!("--regid={AGENT}"))
        .arg("--clear-groups")
        .arg("bwrap")
        .args(["--unshare-user", "--uid", "1000", "--gid", "1000"])
        .args(["--unshare-pid", "--unshare-net", "--die-with-parent"]);
    for name in ["usr", "etc", "bin", "sbin", "lib", "lib32", "lib64"] {
        let p = Path::new("/").join(name);
        match fs::symlink_metadata(&p) {
            Ok(md) if md.file_type().is_symlink() => {
                c.arg("--symlink").arg(fs::read_link(&p).unwrap()).arg(&p);
            }
            Ok(md) if md.is_dir() => {
                c.arg("--ro-bind").arg(&p).arg(&p);
            }
            _ => {}
        }
    }
    c.arg("--bind")
        .arg(mnt)
        .arg("/workspace")
        .args(["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"])
        .args(["--chdir", "/workspace", "sh", "-c", script]);
    c
}

/// Runs the agent's script in the sandbox.
pub fn agent(m: &Mount, script: &str) -> Out {
    run_bounded(bwrap(&m.mnt(""), script), Duration::from_secs(120), "agent")
}

/// Host-side git as root (trusting the agent-owned repository).
pub fn host_git(dir: &Path, args: &[&str]) -> Out {
    let mut c = clean_cmd("git");
    c.arg("-c")
        .arg("safe.directory=*")
        .arg("-C")
        .arg(dir)
        .args(args);
    let o = run_bounded(c, Duration::from_secs(60), "host git");
    assert!(o.ok(), "host git {args:?}: {}{}", o.stdout, o.stderr);
    o
}

pub fn chown_r(p: &Path) {
    let st = Command::new("chown")
        .arg("-R")
        .arg(format!("{AGENT}:{AGENT}"))
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success(), "chown -R {}", p.display());
}

/// The repository of a test: main checkout ROOT/outside/repo, worktree `src` (branch
/// `wt`) at SOURCE,
/// another worktree `other` at ROOT/outside/other, a host-made branch `hostbranch`.
pub struct Repo {
    pub main: PathBuf,
    pub dotgit: Vec<u8>,
    pub gitdir: Vec<u8>,
    pub commondir: Vec<u8>,
}

pub fn make_repo(root: &Path, src: &Path) -> Repo {
    let main = root.join("outside/repo");
    fs::create_dir_all(&main).unwrap();
    host_git(&main, &["init", "-q", "-b", "main"]);
    fs::write(main.join("a.txt"), "one\n").unwrap();
    fs::write(main.join("main-only.txt"), "the main checkout's own file\n").unwrap();
    host_git(&main, &["add", "."]);
    host_git(&main, &["commit", "-q", "-m", "init"]);
    let s = src.to_str().unwrap();
    host_git(&main, &["worktree", "add", "-q", s, "-b", "wt"]);
    let other = root.join("outside/other");
    host_git(
        &main,
        &[
            "worktree",
            "add",
            "-q",
            other.to_str().unwrap(),
            "-b",
            "other",
        ],
    );
    // A branch made on the host, for the agent to rebase onto.
    host_git(&main, &["branch", "hostbranch", "main"]);
    host_git(&other, &["switch", "-q", "hostbranch"]);
    fs::write(other.join("host.txt"), "from the host\n").unwrap();
    host_git(&other, &["add", "host.txt"]);
    host_git(&other, &["commit", "-q", "-m", "host commit"]);
    host_git(&other, &["switch", "-q", "other"]);
    fs::create_dir_all(main.join(".git/hooks")).unwrap();
    fs::write(main.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n").unwrap();
    chown_r(&main);
    chown_r(&other);
    chown_r(src);
    let private = main.join(".git/worktrees/src");
    Repo {
        dotgit: fs::read(src.join(".git")).unwrap(),
        gitdir: fs::read(private.join("gitdir")).unwrap(),
        commondir: fs::read(private.join("commondir")).unwrap(),
        main,
    }
}

pub fn mount_worktree(name: &str, extra: &[&str]) -> (Mount, Repo) {
    require_programs();
    let mut b = Mount::builder(name).policy(POLICY).arg("--allow-other");
    for a in extra {
        b = b.arg(*a);
    }
    let src = b.host("");
    let repo = make_repo(b.root(), &src);
    (b.start(), repo)
}

pub fn assert_records_unchanged(m: &Mount, repo: &Repo) {
    let private = repo.main.join(".git/worktrees/src");
    assert_eq!(
        fs::read(m.host(".git")).unwrap(),
        repo.dotgit,
        "host .git file"
    );
    assert_eq!(fs::read(private.join("gitdir")).unwrap(), repo.gitdir);
    assert_eq!(fs::read(private.join("commondir")).unwrap(), repo.commondir);
}
