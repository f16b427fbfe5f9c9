//! Whether a FUSE caller holds host privilege: CAP_SYS_ADMIN, effective, in the daemon's
//! own user namespace — what the kernel asks of a process that changes a `trusted.*`
//! attribute, or a `security.*` one other than file capabilities, on a local disk.
//!
//! Invariants: anything unknown is "no": a caller the daemon cannot see (pid 0: a
//! vhost-user guest, whose pids are not host pids, or a process outside the daemon's pid
//! namespace), a process gone, a user namespace that cannot be read. Read through `/proc`
//! (readlink of `/proc/PID/ns/user`, then capget(2)); reading another process's namespace
//! is ptrace access, which the workers' Landlock domain forbids, so a mount asks on the
//! programs thread (`Programs::host_admin`). The caller's thread is blocked in its
//! request meanwhile, so its credentials cannot change under it.

use std::os::fd::AsFd;

use super::sys;

/// `CAP_SYS_ADMIN`'s bit.
const CAP_SYS_ADMIN: u32 = 21;

/// Whether thread `pid` holds CAP_SYS_ADMIN in the daemon's user namespace.
pub fn host_admin(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let Ok(proc) = sys::open_proc() else {
        return false;
    };
    let ns = |p: u32| sys::proc_link(proc.as_fd(), p, "ns/user").ok();
    let same_ns = match (ns(pid), ns(std::process::id())) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    };
    same_ns && sys::effective_caps(pid).is_ok_and(|c| c & (1 << CAP_SYS_ADMIN) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// Starts `argv` (ending in `sleep 30`) and waits until its pid runs `sleep`.
    fn sleeper(argv: &[&str]) -> Child {
        let child = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let comm = format!("/proc/{}/comm", child.id());
        let t = Instant::now();
        while std::fs::read_to_string(&comm).unwrap_or_default().trim() != "sleep" {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{argv:?} never ran sleep"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    #[test]
    fn root_here_is_admin_and_a_user_namespace_root_or_another_uid_is_not() {
        if crate::host::sys::geteuid() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        assert!(host_admin(std::process::id()), "the test itself, as root");
        assert!(
            !host_admin(0),
            "pid 0: a guest, or a caller the daemon cannot see"
        );
        assert!(!host_admin(u32::MAX), "no such process");
        for argv in [
            &["unshare", "-U", "-r", "sleep", "30"][..],
            &[
                "setpriv",
                "--reuid",
                "1000",
                "--regid",
                "1000",
                "--clear-groups",
                "sleep",
                "30",
            ],
        ] {
            let mut c = sleeper(argv);
            let admin = host_admin(c.id());
            c.kill().unwrap();
            c.wait().unwrap();
            assert!(!admin, "{argv:?}");
        }
    }
}
