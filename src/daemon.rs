//! Daemonizing for mount(8): the helper it runs must return once the file system is
//! mounted, with status 0, or with an error and a non-zero status if it could not be.
//!
//! [`fork_and_wait`] forks before any thread exists. The parent waits on a pipe: the child
//! mounts with the pipe's write end as its `--ready-fd`, so "ready" arrives once the mount
//! serves requests (parent exits 0), and end-of-file without it means the child failed
//! (parent exits with the child's status; the child printed its error on the stderr they
//! still share). The child runs in its own session, from `/`; once ready it detaches from
//! the caller's stdio ([`detach_stdio`]) so that `out=$(mount ...)` does not wait for it.
//!
//! A syscall module: `fork` and `dup2`, each with its `// SAFETY:` line.
#![allow(unsafe_code)]

use std::io::Read;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork, pipe2, setsid};

/// Forks. Returns in the child only, with the readiness descriptor to pass as `ready_fd`;
/// the parent never returns (it exits with the child's outcome). Call while the process
/// has a single thread.
pub fn fork_and_wait() -> Result<i32, String> {
    let (r, w) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    // SAFETY: the process is single-threaded here (called from main before any thread is
    // spawned), so the child may run arbitrary code after fork.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Parent { child } => {
            drop(w);
            let mut got = Vec::new();
            let _ = std::fs::File::from(r).read_to_end(&mut got);
            if got.starts_with(b"ready") {
                std::process::exit(0);
            }
            let code = match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, 0)) => 1, // exited "successfully" without a mount
                Ok(WaitStatus::Exited(_, c)) => c,
                _ => 1,
            };
            std::process::exit(code);
        }
        ForkResult::Child => {
            drop(r);
            // A session of its own: the terminal's ^C and hangup no longer reach it.
            setsid().map_err(|e| format!("setsid: {e}"))?;
            std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
            let null = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map_err(|e| format!("/dev/null: {e}"))?;
            let _ = DEV_NULL.set(OwnedFd::from(null));
            redirect(0);
            Ok(w.into_raw_fd())
        }
    }
}

/// /dev/null, opened in the child right after the fork: by the time stdio is let go the
/// thread doing it is confined by Landlock (SOURCE and /dev/fuse only) and could not open
/// it any more.
static DEV_NULL: OnceLock<OwnedFd> = OnceLock::new();

/// Points `fd` at /dev/null.
fn redirect(fd: i32) {
    if let Some(null) = DEV_NULL.get() {
        // SAFETY: dup2 onto a standard descriptor number; both descriptors are valid.
        unsafe {
            libc::dup2(null.as_raw_fd(), fd);
        }
    }
}

/// After readiness: stdout goes to /dev/null, and so does stderr unless it is systemd's
/// journal stream (`$JOURNAL_STREAM`, as for a mount unit started from fstab at boot) or
/// a regular file, where the daemon's log keeps going. A terminal or a pipe is let go.
pub fn detach_stdio() {
    redirect(1);
    if !stderr_is_a_log() {
        redirect(2);
    }
}

/// Whether stderr is a log rather than a person: systemd's journal stream
/// (`$JOURNAL_STREAM`) or a regular file. The mount helper logs at INFO only there; on a
/// terminal or a pipe it prints warnings and errors only (mount helpers are silent on
/// success).
pub fn stderr_is_a_log() -> bool {
    // /proc/self/fd/2 resolves to stderr's file, socket or pipe, whatever it is.
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| {
        m.file_type().is_file()
            || std::env::var("JOURNAL_STREAM")
                .is_ok_and(|j| j == format!("{}:{}", m.dev(), m.ino()))
    })
}
