//! Staging helpers shared by tests/stage.rs, tests/stage_edges.rs and tests/stage_live.rs:
//! a workspace-write policy, a small SOURCE, `fencefs stage OP --dir DIR`, a clean stop.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{BIN, Mount, MountBuilder, Out, READY_DEADLINE, is_mounted, put, run_fencefs, sh_in};

/// Everything writable, in workspace-write mode.
pub const WRITE: &str = "mode = \"workspace-write\"\ndefault = \"write\"\n";
/// How long a `fencefs stage` command may take.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A small SOURCE: files at three depths and a directory to delete.
pub fn sample(src: &Path) {
    put(&src.join("a.txt"), b"one\ntwo\nthree\n", 0o644);
    put(&src.join("sub/b.txt"), b"bee\n", 0o644);
    put(&src.join("sub/deep/c.txt"), b"sea\n", 0o644);
    put(&src.join("gone/x"), b"x\n", 0o644);
    put(&src.join("gone/y"), b"y\n", 0o644);
}

/// `fencefs stage OP --dir DIR ARGS…`.
/// A copy of `m`'s SOURCE (beside it, a git work tree) with `diff` applied by
/// `git apply`: what a reviewer's tools make of a `stage diff`.
pub fn git_applied(m: &Mount, diff: &str) -> PathBuf {
    let copy = m.host("../gitcopy");
    sh_in(
        &m.host(""),
        &format!(
            "mkdir -p {0} && cp -a . {0}/ && cd {0} && git init -q .",
            copy.display()
        ),
    )
    .assert_ok("copy");
    std::fs::write(copy.join("p.diff"), diff).unwrap();
    sh_in(&copy, "git apply p.diff && rm p.diff").assert_ok("git apply");
    copy
}

pub fn offline(dir: &Path, op: &str, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), op.into(), "--dir".into()];
    v.push(dir.into());
    v.extend(args.iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// The daemon was told to unmount and has exited 0, unmounted.
pub fn stop(m: &mut Mount) {
    let st = m.terminate().expect("daemon exits on SIGTERM");
    assert!(st.success(), "daemon exit: {st}; stderr:\n{}", m.stderr());
    assert!(!m.is_mounted());
}

/// A small SOURCE as [`sample`], with a script (`run.sh`, not executable).
pub fn staged_sample(src: &Path) {
    sample(src);
    put(&src.join("run.sh"), b"#!/bin/sh\necho hi\n", 0o644);
}

/// The staging area of a mount being built.
pub fn stage_dir(b: &MountBuilder) -> PathBuf {
    b.root().join("stage")
}

/// A staged mount with `policy`, SOURCE populated by `setup`; returns it and DIR.
pub fn staged(name: &str, policy: &str, setup: impl FnOnce(&Path)) -> (Mount, PathBuf) {
    let b = Mount::builder(name).policy(policy);
    setup(&b.host(""));
    let dir = stage_dir(&b);
    let m = b.arg("--stage").arg(&dir).start();
    (m, dir)
}

/// A staged mount with a control socket, SOURCE populated by `setup`; returns it, DIR and
/// SOCKET.
pub fn staged_live(name: &str, setup: impl FnOnce(&Path)) -> (Mount, PathBuf, PathBuf) {
    staged_live_as(Who::Root, name, setup)
}

/// Who runs the daemon, the agent's commands and the host's edits: root, or an ordinary
/// user ([`USER`]) for all three, as a person running `fencefs run` in their own
/// workspace (the daemon then writes `user.overlay.*` markers; `common/user.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Root,
    User,
}

/// The ordinary user's uid.
pub const USER: u32 = 1000;

impl Who {
    /// `sh -c script` as this one through the mount (the agent).
    pub fn agent(self, m: &Mount, script: &str) -> Out {
        match self {
            Who::Root => m.sh(script),
            Who::User => m.sh_as(USER, script),
        }
    }
    /// `sh -c script` as this one in SOURCE (the person at the host).
    pub fn host(self, m: &Mount, script: &str) -> Out {
        match self {
            Who::Root => sh_in(&m.host(""), script),
            Who::User => super::sh_as(USER, &m.host(""), script),
        }
    }
    /// Gives what the test wrote at `p` on the host (as root) to this one.
    pub fn own(self, p: &Path) {
        if self == Who::User {
            std::os::unix::fs::lchown(p, Some(USER), Some(USER)).unwrap();
        }
    }
    /// `fencefs stage ARGS[0] --dir DIR ARGS[1..]` as this one.
    pub fn stage(self, args: &[&str], dir: &Path) -> Out {
        let mut cmd = Command::new(BIN);
        cmd.args(["stage", args[0], "--dir"])
            .arg(dir)
            .args(&args[1..]);
        if self == Who::User {
            use std::os::unix::process::CommandExt;
            cmd.uid(USER).gid(USER);
        }
        super::run_bounded(cmd, LIMIT, "fencefs stage")
    }
}

/// [`staged_live`] with the daemon run by `who`.
pub fn staged_live_as(
    who: Who,
    name: &str,
    setup: impl FnOnce(&Path),
) -> (Mount, PathBuf, PathBuf) {
    let mut b = Mount::builder(name).policy(WRITE);
    if who == Who::User {
        b = b.daemon_as_user(USER);
    }
    setup(&b.host(""));
    start_staged_live(b)
}

/// Starts `b` staged (a fresh DIR) with a control socket: the mount, DIR and the socket.
pub fn start_staged_live(b: MountBuilder) -> (Mount, PathBuf, PathBuf) {
    let dir = stage_dir(&b);
    let sock = b.root().join("ctl.sock");
    let m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(&sock)
        .start();
    (m, dir, sock)
}

/// `fencefs stage ARGS[0] --dir DIR ARGS[1..]`.
pub fn stage(args: &[&str], dir: &Path) -> Out {
    offline(dir, args[0], &args[1..])
}

/// A second daemon on the same SOURCE and DIR (no control socket), at its own mount
/// point; stopped (SIGTERM, then a lazy unmount if needed) when dropped.
pub struct Second {
    child: Child,
    reaped: bool,
    pub mnt: PathBuf,
}

impl Second {
    pub fn start(m: &Mount, dir: &Path, policy: &Path) -> Second {
        Second::start_with(m, dir, policy, &[])
    }

    /// As [`Second::start`], with more `mount` arguments (a `--control SOCKET`, say);
    /// on the transport the tests run on.
    pub fn start_with(m: &Mount, dir: &Path, policy: &Path, extra: &[&std::ffi::OsStr]) -> Second {
        let mnt = m
            .root()
            .join(format!("mp-{}", dir.file_name().unwrap().to_string_lossy()));
        std::fs::create_dir_all(&mnt).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("mount").arg("-p").arg(policy).args(extra);
        if let Ok(t) = std::env::var("FENCEFS_TEST_TRANSPORT") {
            cmd.arg("--transport").arg(t);
        }
        let mut child = cmd
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
                child.stderr.take().unwrap().read_to_string(&mut e).unwrap();
                panic!("second daemon exited ({st}): {e}");
            }
            assert!(t.elapsed() < READY_DEADLINE, "second daemon did not mount");
            std::thread::sleep(Duration::from_millis(10));
        }
        Second {
            child,
            reaped: false,
            mnt,
        }
    }

    /// SIGKILLs the daemon, waits for it and detaches its mount point.
    pub fn kill(mut self) {
        // SAFETY: kill(2) on our own, not yet reaped, child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
        self.reaped = true;
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.mnt)
            .status();
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A path under its mount point.
    pub fn mnt(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// `sh -c SCRIPT` as root in its mount point.
    pub fn sh(&self, script: &str) -> Out {
        sh_in(&self.mnt, script)
    }
}

impl Drop for Second {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: kill(2) on our own, not yet reaped, child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.mnt)
                .status();
        }
    }
}

/// Each function named here is a test twice: `as_root::NAME` and `as_a_user::NAME`
/// (`crate::as_root_and_as_a_user!(a, b)` in a test file that has `Who` in scope).
#[macro_export]
macro_rules! as_root_and_as_a_user {
    ($($name:ident),* $(,)?) => {
        mod as_root {
            $( #[test] fn $name() { super::$name(super::Who::Root) } )*
        }
        mod as_a_user {
            $( #[test] fn $name() { super::$name(super::Who::User) } )*
        }
    };
}
