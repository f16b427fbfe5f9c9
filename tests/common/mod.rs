//! Shared fixture for the mount tests: a fresh workspace per test, the real daemon binary
//! mounted over it, and helpers to assert exact errnos and an unchanged host tree.
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
        let child = Command::new(BIN)
            .envs(envs)
            .arg("mount")
            .args(&args)
            .arg(ws.src())
            .arg(&mnt)
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
}

impl Mount {
    pub fn builder(name: &str) -> MountBuilder {
        MountBuilder {
            ws: Workspace::new(name),
            policy: None,
            args: vec![],
            envs: vec![],
            watchdog: WATCHDOG,
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

// ---------------------------------------------------------------- mountinfo

fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The fstype of the last mount at exactly `mnt` (per /proc/self/mountinfo), if any.
pub fn mount_fstype(mnt: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mnt.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 5 || unescape_mountinfo(fields[4]) != want {
            continue;
        }
        let fstype = fields
            .iter()
            .position(|f| *f == "-")
            .and_then(|i| fields.get(i + 1))
            .map(|s| s.to_string())
            .unwrap_or_default();
        found = Some(fstype);
    }
    found
}

pub fn is_mounted(mnt: &Path) -> bool {
    mount_fstype(mnt).is_some()
}

/// The mount options (per-mount and super options) of the mount at `mnt`.
pub fn mount_options(mnt: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mnt.as_os_str().as_bytes();
    info.lines()
        .rfind(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.len() > 5 && unescape_mountinfo(f[4]) == want
        })
        .map(|l| l.to_string())
}

// ---------------------------------------------------------------- errno helpers

/// 0 for Ok, the raw errno for Err (-1 if the error has none).
pub fn errno_of<T>(r: &io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

/// Symbolic name of an errno (0 → "ok").
pub fn ename(e: i32) -> String {
    let s = match e {
        0 => "ok",
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EROFS => "EROFS",
        libc::EEXIST => "EEXIST",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EINVAL => "EINVAL",
        libc::EIO => "EIO",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ELOOP => "ELOOP",
        libc::ENOTCONN => "ENOTCONN",
        libc::EXDEV => "EXDEV",
        libc::EBADF => "EBADF",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESTALE => "ESTALE",
        libc::ETXTBSY => "ETXTBSY",
        -1 => "no-errno",
        _ => return format!("errno {e}"),
    };
    s.to_string()
}

/// Asserts `r` failed with exactly `want` (or succeeded, for want == 0).
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: io::Result<T>, want: i32, what: &str) -> io::Result<T> {
    let got = errno_of(&r);
    assert_eq!(
        ename(got),
        ename(want),
        "{what}: expected {}, got {} ({r:?})",
        ename(want),
        ename(got)
    );
    r
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn cvt_s(rc: libc::ssize_t) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// open(2) with raw flags and mode; the fd is closed again. Returns Ok on success.
pub fn open_flags(p: &Path, flags: i32, mode: u32) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path; the returned fd is closed right away.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open(2) and is owned here.
    unsafe { libc::close(fd) };
    Ok(())
}

/// mkdir(2) with a raw mode (no `mkdir -m` chmod afterwards).
pub fn mkdir_mode(p: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::mkdir(c.as_ptr(), mode as libc::mode_t) })
}

pub fn mknod(p: &Path, mode: u32, dev: u64) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, dev as libc::dev_t) })
}

pub fn chmod(p: &Path, mode: u32) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::chmod(c.as_ptr(), mode as libc::mode_t) })
}

pub fn lchown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::lchown(c.as_ptr(), uid, gid) })
}

pub fn truncate(p: &Path, len: i64) -> io::Result<()> {
    let c = cstr(p);
    // SAFETY: valid NUL-terminated path.
    cvt(unsafe { libc::truncate(c.as_ptr(), len) })
}

/// Sets atime and mtime to `secs` (no symlink follow).
pub fn utimes(p: &Path, secs: i64) -> io::Result<()> {
    let c = cstr(p);
    let ts = [
        libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
    ];
    // SAFETY: valid path and a 2-element timespec array.
    cvt(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

pub fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let a = cstr(from);
    let b = cstr(to);
    // SAFETY: valid NUL-terminated paths.
    cvt(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

pub fn setxattr(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    // SAFETY: valid path/name and a value buffer of the given length.
    cvt(unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

pub fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    // SAFETY: valid path and name.
    cvt(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) })
}

pub fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid path/name; buf is writable for its length.
    let len = cvt_s(unsafe {
        libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })?;
    buf.truncate(len);
    Ok(buf)
}

/// lgetxattr-based list of xattr names (no symlink follow).
pub fn llistxattr(p: &Path) -> io::Result<Vec<Vec<u8>>> {
    let c = cstr(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid path; buf is writable for its length.
    let len = cvt_s(unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    buf.truncate(len);
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| s.to_vec())
        .collect())
}

pub fn lgetxattr(p: &Path, name: &[u8]) -> io::Result<Vec<u8>> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid path/name; buf is writable for its length.
    let len = cvt_s(unsafe {
        libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    })?;
    buf.truncate(len);
    Ok(buf)
}

/// Reads a whole file through `open(O_RDONLY)`.
pub fn read_all(p: &Path) -> io::Result<Vec<u8>> {
    let mut f = fs::File::open(p)?;
    let mut v = vec![];
    f.read_to_end(&mut v)?;
    Ok(v)
}

/// Sorted names in a directory (via read_dir, i.e. getdents), as raw bytes.
pub fn names(p: &Path) -> io::Result<Vec<Vec<u8>>> {
    let mut v = vec![];
    for e in fs::read_dir(p)? {
        v.push(e?.file_name().into_vec());
    }
    v.sort();
    Ok(v)
}

/// Sorted names as lossy strings, for readable assertions.
pub fn names_str(p: &Path) -> io::Result<Vec<String>> {
    Ok(names(p)?
        .into_iter()
        .map(|n| String::from_utf8_lossy(&n).into_owned())
        .collect())
}

// ---------------------------------------------------------------- host snapshots

/// One host entry, as far as "the host did not change" is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub mtime: (i64, i64),
    /// File contents (or a length+hash for large files), or the symlink target.
    pub data: Vec<u8>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

pub type Snapshot = BTreeMap<Vec<u8>, Entry>;

/// Recursively records every entry below `root` (never following symlinks).
pub fn snapshot(root: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    snap_into(root, Path::new(""), &mut out);
    out
}

fn snap_into(base: &Path, rel: &Path, out: &mut Snapshot) {
    let p = join_rel(base, rel);
    let md = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let ft = md.file_type();
    let kind = if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "special"
    };
    let data = if ft.is_file() {
        if md.len() <= 1 << 20 {
            fs::read(&p).unwrap()
        } else {
            use std::hash::{DefaultHasher, Hasher};
            let mut h = DefaultHasher::new();
            let mut f = fs::File::open(&p).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                h.write(&buf[..n]);
            }
            format!("len={} hash={:x}", md.len(), h.finish()).into_bytes()
        }
    } else if ft.is_symlink() {
        fs::read_link(&p).unwrap().into_os_string().into_vec()
    } else {
        vec![]
    };
    let mut xattrs = vec![];
    if !ft.is_symlink()
        && let Ok(ns) = llistxattr(&p)
    {
        for n in ns {
            if n.starts_with(b"user.") {
                let v = lgetxattr(&p, &n).unwrap_or_default();
                xattrs.push((n, v));
            }
        }
    }
    xattrs.sort();
    out.insert(
        rel.as_os_str().as_bytes().to_vec(),
        Entry {
            kind,
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev(),
            mtime: if ft.is_dir() {
                (0, 0)
            } else {
                (md.mtime(), md.mtime_nsec())
            },
            data,
            xattrs,
        },
    );
    if ft.is_dir() {
        let mut kids: Vec<OsString> = fs::read_dir(&p)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        kids.sort();
        for k in kids {
            snap_into(base, &rel.join(k), out);
        }
    }
}

/// Human-readable difference between two snapshots ("" when equal).
pub fn snapshot_diff(a: &Snapshot, b: &Snapshot) -> String {
    let mut s = String::new();
    for (k, v) in a {
        match b.get(k) {
            None => s += &format!("  removed: {}\n", String::from_utf8_lossy(k)),
            Some(w) if w != v => {
                s += &format!(
                    "  changed: {}\n    before {:?}\n    after  {:?}\n",
                    String::from_utf8_lossy(k),
                    short(v),
                    short(w)
                )
            }
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            s += &format!("  added:   {}\n", String::from_utf8_lossy(k));
        }
    }
    s
}

fn short(e: &Entry) -> String {
    let data = String::from_utf8_lossy(&e.data[..e.data.len().min(80)]).into_owned();
    format!(
        "{} mode={:o} uid={} gid={} rdev={} mtime={:?} data={:?} xattrs={}",
        e.kind,
        e.mode,
        e.uid,
        e.gid,
        e.rdev,
        e.mtime,
        data,
        e.xattrs.len()
    )
}

#[track_caller]
pub fn assert_host_unchanged(before: &Snapshot, root: &Path, what: &str) {
    let after = snapshot(root);
    let d = snapshot_diff(before, &after);
    assert!(
        d.is_empty(),
        "{what}: the host changed after a refused operation:\n{d}"
    );
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
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fencefs");
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
            // SAFETY: kill(2) on our own, not yet reaped, child.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
            panic!("fencefs did not exit within {limit:?}");
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
