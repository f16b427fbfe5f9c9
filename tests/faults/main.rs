//! Fault injection and resource bounds (issue 6, items 5 and 6), against the real daemon:
//!
//! 1. `kill -9` of the daemon in the middle of a writer's fsync'd loop: every chunk whose
//!    fsync returned success is on the host, the host files are "old content or a prefix of
//!    the new stream" byte for byte, the writer gets an errno (never hangs), and the mount
//!    point can be unmounted and mounted again by a fresh daemon.
//! 2. ENOSPC from a full host file system (SOURCE on a 1 MiB tmpfs) reaches the caller
//!    unchanged, for data, fallocate and inodes, with and without passthrough; the daemon
//!    keeps serving. EDQUOT is not covered: this kernel has neither CONFIG_TMPFS_QUOTA nor
//!    CONFIG_QFMT_V2 (ext4 quota) nor CONFIG_XFS_QUOTA, btrfs qgroups need btrfs-progs, and
//!    a root daemon with CAP_SYS_RESOURCE ignores hard quota limits anyway (it would have to
//!    run with that capability dropped, e.g. `setpriv --bounding-set=-sys_resource`).
//! 3. SOURCE emptied, renamed away and replaced, or deleted while mounted: errnos or the
//!    old directory's data, never the new directory's, never a crash; SIGTERM exits 0.
//! 4. A caller SIGKILLed mid-read / mid-write / mid-readdir leaves no handle behind in the
//!    daemon (`/proc/<pid>/fd` returns to its baseline).
//! 5. Resource bounds: a walk of 200,000 files keeps the daemon's fds under its cache bound
//!    and gives fds and memory back once the kernel forgets the inodes (drop_caches); a
//!    100,000-entry directory lists exactly; running the daemon out of fds yields
//!    EMFILE/ENFILE to callers, never a crash.
//!
//! Writers/readers that must be killed mid-operation are forked children of the test that
//! make raw syscalls only (no allocation, no locks, no panics between fork and _exit).
//! Where the shared fixture cannot express a case (wrapping the daemon in `prlimit`, a
//! second daemon on the same mount point), a local mini-fixture [`Daemon`] follows the same
//! rules: never skip, poll mountinfo for readiness, signal only its own pid, never leave a
//! mount behind.

#[path = "../common/mod.rs"]
mod common;

use common::*;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsString};
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const POLICY_W: &str = "default = \"write\"\n";

// ---------------------------------------------------------------- local helpers

fn ename2(e: i32) -> String {
    match e {
        libc::ENOSPC => "ENOSPC".into(),
        libc::EDQUOT => "EDQUOT".into(),
        libc::EMFILE => "EMFILE".into(),
        libc::ENFILE => "ENFILE".into(),
        libc::ECONNABORTED => "ECONNABORTED".into(),
        _ => ename(e),
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Number of open descriptors of `pid`.
fn fd_count(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Descriptors of `pid` that are real opens (not `O_PATH`) of something under `under`:
/// the daemon's per-handle host files. `fd -> target`.
fn open_host_files(pid: i32, under: &Path) -> Vec<String> {
    let mut out = vec![];
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return out;
    };
    for e in dir.flatten() {
        let fd = e.file_name().to_string_lossy().into_owned();
        let Ok(target) = fs::read_link(e.path()) else {
            continue;
        };
        if !target.starts_with(under) {
            continue;
        }
        let Ok(info) = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else {
            continue;
        };
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
            .unwrap_or(0);
        if flags & libc::O_PATH as u32 == 0 {
            out.push(format!("{fd} -> {} (flags {flags:o})", target.display()));
        }
    }
    out
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: i32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Soft RLIMIT_NOFILE of `pid`.
fn nofile_soft(pid: i32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = s.lines().find(|l| l.starts_with("Max open files")).unwrap();
    line["Max open files".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The daemon's O_PATH cache bound (README "Bounded descriptors").
fn fd_cache_cap(nofile: u64) -> u64 {
    (nofile / 3).clamp(64, 16_384)
}

fn drop_caches() {
    for v in ["2", "3"] {
        fs::write("/proc/sys/vm/drop_caches", v).expect("write /proc/sys/vm/drop_caches");
    }
}

fn run_ok(cmd: &mut Command, what: &str) {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        o.status.success(),
        "{what}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

fn wait_child_bounded(child: &mut Child, d: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if start.elapsed() < d => thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

/// A pipe (read end, write end), both close-on-exec.
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-element out-array.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", io::Error::last_os_error());
    // SAFETY: both fds were just returned by pipe2 and are owned here.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// A fixed-size record a forked child sends to the test: `[kind, a, b]`.
type Rec = [u64; 3];

/// In a forked child: one atomic write of a record (24 bytes < PIPE_BUF).
fn report(fd: i32, rec: Rec) {
    // SAFETY: rec is 24 readable bytes; fd is the inherited write end of the pipe.
    unsafe { libc::write(fd, rec.as_ptr().cast(), std::mem::size_of::<Rec>()) };
}

/// Records from a child, via a reader thread; the channel closes at EOF.
fn records(read_end: OwnedFd) -> Receiver<Rec> {
    let (tx, rx) = channel();
    let mut f = fs::File::from(read_end);
    thread::spawn(move || {
        let mut b = [0u8; 24];
        while f.read_exact(&mut b).is_ok() {
            let r = [
                u64::from_ne_bytes(b[0..8].try_into().unwrap()),
                u64::from_ne_bytes(b[8..16].try_into().unwrap()),
                u64::from_ne_bytes(b[16..24].try_into().unwrap()),
            ];
            if tx.send(r).is_err() {
                break;
            }
        }
    });
    rx
}

/// A forked child of the test process. Dropping it SIGKILLs and reaps it (bounded).
struct Forked {
    pid: i32,
    status: Option<i32>,
}

impl Forked {
    /// fork(2); the child runs `child` and `_exit`s with its result. `child` must only make
    /// raw syscalls (no allocation, locks, printing or panics): the test process has threads.
    fn spawn(child: impl FnOnce() -> i32) -> Forked {
        // SAFETY: fork(2); the child only runs `child`, which makes async-signal-safe
        // syscalls on memory prepared before the fork, then _exit(2)s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let code = child();
            // SAFETY: _exit(2) in the child: no destructors, no atexit handlers.
            unsafe { libc::_exit(code) };
        }
        Forked { pid, status: None }
    }
    fn try_wait(&mut self) -> Option<i32> {
        if self.status.is_none() {
            let mut st = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut st, libc::WNOHANG) };
            if r == self.pid {
                self.status = Some(st);
            }
        }
        self.status
    }
    fn wait_timeout(&mut self, d: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.try_wait() {
                return Some(st);
            }
            if start.elapsed() > d {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
    fn kill(&mut self) {
        if self.try_wait().is_none() {
            // SAFETY: kill(2) on our own child, not yet reaped (so the pid is still ours).
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        self.kill();
        if self.wait_timeout(Duration::from_secs(10)).is_none() {
            eprintln!("forked child {} did not exit 10 s after SIGKILL", self.pid);
        }
    }
}

/// Local mini-fixture: a daemon this file spawns itself (optionally through a wrapper that
/// execs it, like `prlimit`), on a mount point it does not own the directories of.
struct Daemon {
    child: Option<Child>,
    pid: i32,
    mnt: PathBuf,
    stderr_path: PathBuf,
    dog: Arc<(Mutex<bool>, Condvar)>,
}

impl Daemon {
    fn spawn(
        wrapper: &[&str],
        opts: &[OsString],
        src: &Path,
        mnt: &Path,
        stderr_path: PathBuf,
        watchdog: Duration,
    ) -> Daemon {
        require_fuse();
        assert!(
            !is_mounted(mnt),
            "{} is already a mount point",
            mnt.display()
        );
        let stderr = fs::File::create(&stderr_path).unwrap();
        let mut cmd = match wrapper.split_first() {
            None => Command::new(BIN),
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(BIN);
                c
            }
        };
        cmd.arg("mount")
            .args(opts)
            .arg(src)
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = cmd.spawn().expect("spawn fencefs daemon");
        let pid = child.id() as i32;
        let mut d = Daemon {
            child: Some(child),
            pid,
            mnt: mnt.to_path_buf(),
            stderr_path,
            dog: Arc::new((Mutex::new(false), Condvar::new())),
        };
        let start = Instant::now();
        loop {
            if matches!(mount_fstype(mnt).as_deref(), Some("fuse.fencefs" | "fuse")) {
                break;
            }
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                d.child = None;
                panic!(
                    "{wrapper:?} fencefs mount {opts:?} exited ({st}) before mounting; stderr:\n{}",
                    d.stderr()
                );
            }
            assert!(
                start.elapsed() < READY_DEADLINE,
                "fencefs did not mount within {READY_DEADLINE:?}; stderr:\n{}",
                d.stderr()
            );
            thread::sleep(Duration::from_millis(10));
        }
        // The wrapper must have exec'd the daemon: signals go to this very pid.
        assert_eq!(
            fs::read_link(format!("/proc/{pid}/exe")).unwrap(),
            fs::canonicalize(BIN).unwrap(),
            "pid {pid} is not the daemon (wrapper {wrapper:?} did not exec it)"
        );
        d.start_watchdog(watchdog);
        d
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.stderr_path).unwrap_or_default()).into_owned()
    }
    fn start_watchdog(&self, after: Duration) {
        spawn_watchdog(self.dog.clone(), self.pid, after);
    }
    fn stop_watchdog(&self) {
        let (lock, cv) = &*self.dog;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
    #[track_caller]
    fn assert_alive(&mut self, what: &str) {
        if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
            panic!("{what}: the daemon died ({st}); stderr:\n{}", self.stderr());
        }
        assert!(is_mounted(&self.mnt), "{what}: no longer mounted");
    }
    /// SIGTERM and a bounded wait; the exit status.
    fn terminate(&mut self) -> Option<ExitStatus> {
        self.stop_watchdog();
        let mut child = self.child.take()?;
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.pid, libc::SIGTERM) };
        let st = wait_child_bounded(&mut child, Duration::from_secs(10));
        if st.is_none() {
            self.child = Some(child);
        }
        st
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop_watchdog();
        if let Some(mut child) = self.child.take()
            && !matches!(child.try_wait(), Ok(Some(_)))
        {
            // SAFETY: kill(2) on our own, not yet reaped, child.
            unsafe { libc::kill(self.pid, libc::SIGTERM) };
            if wait_child_bounded(&mut child, Duration::from_secs(10)).is_none() {
                // SAFETY: as above.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                let _ = child.wait();
            }
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(&self.mnt)
                .status();
        }
    }
}

/// Record kinds a forked child reports through [`report`]: a chunk acknowledged, an
/// errno, done.
const REC_ACK: u64 = 1;
const REC_ERR: u64 = 2;
const REC_DONE: u64 = 3;

mod bounds;
mod enospc;
mod kill9;
mod killed_callers;
mod source_gone;
