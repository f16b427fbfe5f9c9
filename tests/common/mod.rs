//! Shared fixture for the mount tests: a fresh workspace per test, the real daemon binary
//! mounted over it (this file), and helpers to assert exact errnos (`syscalls.rs`), an
//! unchanged host tree (`snapshot.rs`) and mount state (`mountinfo.rs`); shells as other
//! uids and host builders are here too.
//!
//! Layout of one fixture (under cargo's `CARGO_TARGET_TMPDIR`):
//!
//! ```text
//! ROOT/src        the host side (SOURCE), populated by the test
//! ROOT/mp/mnt     the mount point (one level deeper than src on purpose: a relative
//!                 symlink such as `../outside/x` resolves to ROOT/outside on the host but
//!                 to ROOT/mp/outside, which does not exist, through the mount)
//! ROOT/outside    host files outside the workspace
//! ROOT/policy.toml, ROOT/daemon.stderr
//! ```
//!
//! Rules the fixture keeps: it never skips (no /dev/fuse or fusermount3 → panic), it never
//! sleeps a fixed time for readiness (it polls /proc/self/mountinfo and fails early with the
//! daemon's stderr), it only signals the pid it spawned, and it never leaves a mount behind.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

// The helpers by topic; `common::name` paths stay as they were. Each test crate uses
// some of them (hence the allows).
mod control;
mod mountinfo;
pub mod oracle;
pub mod run;
mod snapshot;
pub mod stage;
mod syscalls;
pub mod user;
pub mod worktree;

#[allow(unused_imports)]
pub use control::*;
#[allow(unused_imports)]
pub use mountinfo::*;
#[allow(unused_imports)]
pub use snapshot::*;
#[allow(unused_imports)]
pub use syscalls::*;

/// The daemon binary cargo built for this test run.
pub const BIN: &str = env!("CARGO_BIN_EXE_fencefs");

/// How long a daemon may take to show up in mountinfo.
pub const READY_DEADLINE: Duration = Duration::from_secs(10);

/// Default watchdog: a test whose mount is still up after this is considered hung; the
/// daemon (our child) is killed so that blocked syscalls return ENOTCONN and the test fails.
pub const WATCHDOG: Duration = Duration::from_secs(240);

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Kills daemon `pid` (our own child) with SIGKILL if the mount is still up after
/// `after`, so that blocked syscalls return ENOTCONN and the test fails instead of hanging.
/// The owner sets the flag in `dog` (under its lock) before reaping the child, so the pid
/// cannot have been reused when the watchdog fires.
pub fn spawn_watchdog(dog: Arc<(Mutex<bool>, Condvar)>, pid: i32, after: Duration) {
    thread::spawn(move || {
        let (lock, cv) = &*dog;
        let g = lock.lock().unwrap();
        let (g, _) = cv
            .wait_timeout_while(g, after, |stopped| !*stopped)
            .unwrap();
        if !*g {
            eprintln!(
                "fencefs test watchdog: mount still up after {after:?}; killing daemon {pid}"
            );
            // SAFETY: kill(2) on the caller's own, not yet reaped child (see above).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
}

/// Panics (never skips) when the machine cannot run FUSE mount tests.
pub fn require_fuse() {
    if !Path::new("/dev/fuse").exists() {
        panic!(
            "/dev/fuse is missing: the mount tests need FUSE (modprobe fuse / --device /dev/fuse)"
        );
    }
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").is_file()))
        .unwrap_or(false);
    if !found {
        panic!("fusermount3 is not on PATH: install the `fuse3` package (scripts/test.sh does)");
    }
}

/// A fresh, empty directory tree for one test: ROOT/{src,mp/mnt,outside}.
pub struct Workspace {
    pub root: PathBuf,
}

impl Workspace {
    pub fn new(name: &str) -> Workspace {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fencefs-tests");
        fs::create_dir_all(&base).expect("create test base dir");
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let root = base.join(format!("{name}-{}-{n}", std::process::id()));
        if root.exists() {
            fs::remove_dir_all(&root).expect("remove stale test dir");
        }
        fs::create_dir_all(root.join("src")).unwrap();
        fs::create_dir_all(root.join("mp/mnt")).unwrap();
        fs::create_dir_all(root.join("outside")).unwrap();
        let root = fs::canonicalize(&root).unwrap();
        // Other uids (setpriv tests) must be able to walk down to the mount.
        for p in [
            root.clone(),
            root.join("src"),
            root.join("mp"),
            root.join("mp/mnt"),
            root.join("outside"),
        ] {
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
        // target/tmp may be 0700 on some setups: other uids must reach the mount.
        let _ = fs::set_permissions(&base, fs::Permissions::from_mode(0o755));
        let _ = fs::set_permissions(
            env!("CARGO_TARGET_TMPDIR"),
            fs::Permissions::from_mode(0o755),
        );
        Workspace { root }
    }
    pub fn src(&self) -> PathBuf {
        self.root.join("src")
    }
    pub fn mnt_dir(&self) -> PathBuf {
        self.root.join("mp/mnt")
    }
    pub fn outside(&self) -> PathBuf {
        self.root.join("outside")
    }
    pub fn policy_path(&self) -> PathBuf {
        self.root.join("policy.toml")
    }
}

/// Builder for a mounted daemon.
pub struct MountBuilder {
    ws: Workspace,
    policy: Option<String>,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    watchdog: Duration,
    user: Option<u32>,
}

impl MountBuilder {
    /// The policy file contents (written to ROOT/policy.toml and passed with `-p`).
    pub fn policy(mut self, toml: &str) -> Self {
        self.policy = Some(toml.to_string());
        self
    }
    /// `-m MODE`.
    pub fn mode(mut self, mode: &str) -> Self {
        self.args.push("-m".into());
        self.args.push(mode.into());
        self
    }
    /// Any extra daemon argument (e.g. `--allow-other`).
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }
    /// An environment variable for the daemon only.
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Self {
        self.envs.push((k.into(), v.into()));
        self
    }
    pub fn watchdog(mut self, d: Duration) -> Self {
        self.watchdog = d;
        self
    }
    /// The daemon as `uid`, an ordinary user with no capabilities, mounting through
    /// fusermount3 with `--allow-other` (so the test reads the mount as root): see
    /// `user.rs`. The workspace root, SOURCE and the mount point become the user's.
    pub fn daemon_as_user(mut self, uid: u32) -> Self {
        self.user = Some(uid);
        self.args.push("--allow-other".into());
        self
    }
    /// Host path under SOURCE, to populate before mounting.
    pub fn host(&self, rel: impl AsRef<Path>) -> PathBuf {
        join_rel(&self.ws.src(), rel.as_ref())
    }
    pub fn outside(&self) -> PathBuf {
        self.ws.outside()
    }
    pub fn root(&self) -> &Path {
        &self.ws.root
    }
    /// Spawns the daemon and waits until the mount is live.
    pub fn start(self) -> Mount {
        require_fuse();
        let MountBuilder {
            ws,
            policy,
            mut args,
            envs,
            watchdog,
            user,
        } = self;
        // scripts/test.sh runs the mount tests once per transport.
        if let Ok(t) = std::env::var("FENCEFS_TEST_TRANSPORT")
            && !args.iter().any(|a| a == "--transport")
        {
            args.push("--transport".into());
            args.push(t.into());
        }
        if let Some(p) = &policy {
            fs::write(ws.policy_path(), p).unwrap();
            let mut pre: Vec<OsString> = vec!["-p".into(), ws.policy_path().into_os_string()];
            pre.append(&mut args);
            args = pre;
        }
        let stderr_path = ws.root.join("daemon.stderr");
        let stderr = fs::File::create(&stderr_path).unwrap();
        let mnt = ws.mnt_dir();
        let mut cmd = match user {
            Some(uid) => {
                let mut all = args.clone();
                all.extend([ws.src().into_os_string(), mnt.clone().into_os_string()]);
                user::daemon_command(&ws.root, uid, &all)
            }
            None => {
                let mut c = Command::new(BIN);
                c.arg("mount").args(&args).arg(ws.src()).arg(&mnt);
                c
            }
        };
        let child = cmd
            .envs(envs)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn fencefs daemon");
        let pid = child.id() as i32;
        let mut m = Mount {
            ws: Some(ws),
            child: Some(child),
            pid,
            stderr_path,
            mnt,
            dog: Arc::new((Mutex::new(false), Condvar::new())),
            shared_bind: user.is_some(),
        };
        m.wait_ready(&args);
        m.start_watchdog(watchdog);
        m
    }
}

/// A live mount of the daemon over a fresh workspace.
pub struct Mount {
    ws: Option<Workspace>,
    child: Option<Child>,
    pid: i32,
    stderr_path: PathBuf,
    mnt: PathBuf,
    /// (stopped, cv) shared with the watchdog thread.
    dog: Arc<(Mutex<bool>, Condvar)>,
    /// A daemon as an ordinary user: `ROOT/mp` is a shared bind to undo (`user.rs`).
    shared_bind: bool,
}

impl Mount {
    pub fn builder(name: &str) -> MountBuilder {
        MountBuilder {
            ws: Workspace::new(name),
            policy: None,
            args: vec![],
            envs: vec![],
            watchdog: WATCHDOG,
            user: None,
        }
    }

    /// A mount with the given policy/mode and a host tree made by `setup(src)`.
    pub fn with(
        name: &str,
        policy: Option<&str>,
        mode: Option<&str>,
        setup: impl FnOnce(&Path),
    ) -> Mount {
        let mut b = Mount::builder(name);
        if let Some(p) = policy {
            b = b.policy(p);
        }
        if let Some(m) = mode {
            b = b.mode(m);
        }
        setup(&b.ws.src());
        b.start()
    }

    fn ws(&self) -> &Workspace {
        self.ws.as_ref().unwrap()
    }
    pub fn root(&self) -> &Path {
        &self.ws().root
    }
    /// Path on the host side (under SOURCE).
    pub fn host(&self, rel: impl AsRef<Path>) -> PathBuf {
        join_rel(&self.ws().src(), rel.as_ref())
    }
    /// Path through the mount.
    pub fn mnt(&self, rel: impl AsRef<Path>) -> PathBuf {
        join_rel(&self.mnt, rel.as_ref())
    }
    pub fn outside(&self) -> PathBuf {
        self.ws().outside()
    }
    pub fn policy_path(&self) -> PathBuf {
        self.ws().policy_path()
    }
    pub fn pid(&self) -> i32 {
        self.pid
    }
    /// What the daemon wrote to stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.stderr_path).unwrap_or_default()).into_owned()
    }
    /// SIGHUP to the daemon (by pid).
    pub fn reload(&self) {
        self.signal(libc::SIGHUP);
    }
    /// Rewrites the policy file and sends SIGHUP.
    pub fn reload_with(&self, toml: &str) {
        fs::write(self.policy_path(), toml).unwrap();
        self.reload();
    }
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: plain kill(2) on the pid of our own, not yet reaped, child.
            let rc = unsafe { libc::kill(c.id() as i32, sig) };
            assert_eq!(
                rc,
                0,
                "kill({}, {sig}) failed: {}",
                c.id(),
                io::Error::last_os_error()
            );
        }
    }
    pub fn is_mounted(&self) -> bool {
        is_mounted(&self.mnt)
    }
    /// Panics (with the daemon's stderr) if the daemon has exited.
    #[track_caller]
    pub fn assert_alive(&mut self, what: &str) {
        let st = self.child.as_mut().map(|c| c.try_wait());
        if let Some(Ok(Some(st))) = st {
            panic!("{what}: the daemon died ({st}); stderr:\n{}", self.stderr());
        }
    }

    fn wait_ready(&mut self, args: &[OsString]) {
        let start = Instant::now();
        loop {
            // The exact fstype ("fuse.fencefs") is asserted by its own test (cli.rs), so
            // that a missing subtype does not hide every other result.
            if matches!(
                mount_fstype(&self.mnt).as_deref(),
                Some("fuse.fencefs" | "fuse")
            ) {
                return;
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "fencefs mount {:?} exited ({st}) before mounting; stderr:\n{}",
                    args,
                    self.stderr()
                );
            }
            if start.elapsed() > READY_DEADLINE {
                let other = mount_fstype(&self.mnt);
                panic!(
                    "fencefs did not mount within {READY_DEADLINE:?} (mountinfo fstype there: \
                     {other:?}); stderr:\n{}",
                    self.stderr()
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn start_watchdog(&self, after: Duration) {
        spawn_watchdog(self.dog.clone(), self.pid, after);
    }

    fn stop_watchdog(&self) {
        let (lock, cv) = &*self.dog;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }

    /// SIGTERM the daemon and wait (bounded) for it; returns its exit status.
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        self.stop_watchdog();
        let mut child = self.child.take()?;
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        wait_bounded(&mut child, Duration::from_secs(10))
    }

    /// Waits (bounded) for the daemon to exit on its own (e.g. after an external unmount).
    pub fn wait_exit(&mut self, d: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let start = Instant::now();
        while start.elapsed() < d {
            if let Ok(Some(st)) = child.try_wait() {
                self.stop_watchdog();
                return Some(st);
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
        None
    }

    /// Runs `sh -c script` with the mount point as cwd (LC_ALL=C).
    pub fn sh(&self, script: &str) -> Out {
        sh_in(&self.mnt, script)
    }
    /// Runs `sh -c script` in the mount as `uid:uid` with no supplementary groups.
    pub fn sh_as(&self, uid: u32, script: &str) -> Out {
        sh_as(uid, &self.mnt, script)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.stop_watchdog();
        if let Some(mut child) = self.child.take()
            && !matches!(child.try_wait(), Ok(Some(_)))
        {
            {
                // SAFETY: kill(2) on our own, not yet reaped, child.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                if wait_bounded(&mut child, Duration::from_secs(10)).is_none() {
                    eprintln!(
                        "fencefs daemon {} ignored SIGTERM for 10 s; SIGKILL",
                        child.id()
                    );
                    // SAFETY: as above.
                    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                    let _ = child.wait();
                }
            }
        }
        if is_mounted(&self.mnt) {
            eprintln!(
                "{} still mounted after the daemon exited: fusermount3 -u -z",
                self.mnt.display()
            );
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.mnt)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Some(ws) = self.ws.take() {
            if self.shared_bind && !is_mounted(&self.mnt) {
                user::undo(&ws.root);
            }
            drop(ws);
        }
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let mnt = self.mnt_dir();
        if is_mounted(&mnt) {
            // Never recurse into a live mount.
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&mnt)
                .status();
        }
        if is_mounted(&mnt) {
            eprintln!("not removing {}: still mounted", self.root.display());
            return;
        }
        if std::env::var_os("FENCEFS_KEEP_TEST_DIRS").is_none() {
            let _ = make_removable(&self.root);
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// Tests chmod things to 0 or 0o444; give the owner rwx back so removal works.
fn make_removable(p: &Path) -> io::Result<()> {
    let md = fs::symlink_metadata(p)?;
    if md.is_dir() {
        let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o700));
        for e in fs::read_dir(p)? {
            let _ = make_removable(&e?.path());
        }
    }
    Ok(())
}

fn wait_bounded(child: &mut Child, d: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if start.elapsed() < d => thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

/// `base.join(rel)`, where an empty rel means base itself.
pub fn join_rel(base: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() {
        base.to_path_buf()
    } else {
        base.join(rel)
    }
}

// ---------------------------------------------------------------- shell helpers

/// Captured result of a command.
#[derive(Debug)]
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.status.success()
    }
    #[track_caller]
    pub fn assert_ok(&self, what: &str) -> &Self {
        assert!(
            self.ok(),
            "{what}: failed ({})\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
    #[track_caller]
    pub fn assert_fail(&self, what: &str) -> &Self {
        assert!(
            !self.ok(),
            "{what}: expected failure, but it succeeded\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

impl From<Output> for Out {
    fn from(o: Output) -> Out {
        Out {
            status: o.status,
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

fn base_cmd(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env("LC_ALL", "C")
        .env("LANG", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
        .stdin(Stdio::null());
    c
}

/// `sh -c script` in `dir`.
pub fn sh_in(dir: &Path, script: &str) -> Out {
    base_cmd("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("run sh")
        .into()
}

/// `setpriv --reuid U --regid U --clear-groups sh -c script` in `dir`.
pub fn sh_as(uid: u32, dir: &Path, script: &str) -> Out {
    base_cmd("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("HOME", "/")
        .output()
        .expect("run setpriv (util-linux)")
        .into()
}

/// Runs the fencefs binary with `args` and a bounded wait; returns its output.
pub fn run_fencefs<I, S>(args: I, limit: Duration) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    run_bounded(cmd, limit, "fencefs")
}

/// Runs `cmd` with its output captured; kills it (by its own pid) after `limit` and
/// panics with what it printed.
pub fn run_bounded(mut cmd: Command, limit: Duration, what: &str) -> Out {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: spawn failed: {e}"));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t1 = thread::spawn(move || {
        let mut v = vec![];
        let _ = so.read_to_end(&mut v);
        v
    });
    let t2 = thread::spawn(move || {
        let mut v = vec![];
        let _ = se.read_to_end(&mut v);
        v
    });
    let status = match wait_bounded(&mut child, limit) {
        Some(s) => s,
        None => {
            // SAFETY: kill(2) on our own, not yet reaped, child (bwrap --die-with-parent
            // takes a sandbox down with it).
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
            let out = String::from_utf8_lossy(&t1.join().unwrap()).into_owned();
            let err = String::from_utf8_lossy(&t2.join().unwrap()).into_owned();
            panic!("{what}: still running after {limit:?}; stdout:\n{out}\nstderr:\n{err}");
        }
    };
    Out {
        status,
        stdout: String::from_utf8_lossy(&t1.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&t2.join().unwrap()).into_owned(),
    }
}

// ---------------------------------------------------------------- host builders

/// Writes a file (creating parents) with a mode.
pub fn put(p: &Path, content: &[u8], mode: u32) {
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).unwrap();
    }
    fs::write(p, content).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

pub fn mkdirp(p: &Path) {
    fs::create_dir_all(p).unwrap();
}

pub fn symlink(target: impl AsRef<Path>, link: &Path) {
    if let Some(d) = link.parent() {
        fs::create_dir_all(d).unwrap();
    }
    std::os::unix::fs::symlink(target, link).unwrap();
}

/// Polls `f` until it returns true or `d` passes; returns the last result.
pub fn eventually(d: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if f() {
            return true;
        }
        if start.elapsed() > d {
            return false;
        }
        thread::sleep(Duration::from_millis(25));
    }
}

/// Deterministic pseudo-random bytes (xorshift64*), for large-file tests.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// A byte path (for non-UTF-8 names).
pub fn bpath(b: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(b))
}

/// `lchown -R`: `p` and everything below it owned by `uid:uid`.
pub fn chown_tree(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
    if fs::symlink_metadata(p).unwrap().is_dir() {
        for e in fs::read_dir(p).unwrap() {
            chown_tree(&e.unwrap().path(), uid);
        }
    }
}

/// Runs `sh -c script` as uid 1000 inside bubblewrap (the host's root read-only, the
/// mount at /mnt, a private /tmp, its own pid namespace), with `extra` bwrap arguments
/// before the command (binds, symlinks, `--disable-userns`).
pub fn in_bwrap_with(m: &Mount, extra: &[&str], script: &str) -> Out {
    Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", "bwrap"])
        .args(["--ro-bind", "/", "/", "--bind"])
        .arg(m.mnt("."))
        .args([
            "/mnt", "--chdir", "/mnt", "--dev", "/dev", "--proc", "/proc",
        ])
        .args(["--tmpfs", "/tmp", "--setenv", "HOME", "/tmp"])
        .args(extra)
        .args(["--unshare-pid", "--die-with-parent", "sh", "-c", script])
        .output()
        .expect("run setpriv bwrap")
        .into()
}

/// [`in_bwrap_with`] without extra arguments.
pub fn in_bwrap(m: &Mount, script: &str) -> Out {
    in_bwrap_with(m, &[], script)
}
