//! The transports themselves: `--transport io-uring` really serves requests on the rings
//! (the queue threads do the work, fuser's workers stay idle), `--transport dev-fuse` never
//! starts a ring, and an io_uring mount unmounts and exits cleanly with requests in
//! flight. (Every other mount test runs on both transports: scripts/test.sh.)

mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

const ALLOW_ALL: &str = "mode = \"danger\"\ndefault = \"write\"\n";

/// The daemon's log, once it contains `what` (the transport line follows "mounted").
fn log_with(m: &Mount, what: &str) -> String {
    eventually(Duration::from_secs(5), || m.stderr().contains(what));
    m.stderr()
}

/// Voluntary context switches of each of the daemon's threads, by thread name.
fn switches(pid: i32) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let p = t.path();
        let Ok(comm) = fs::read_to_string(p.join("comm")) else {
            continue;
        };
        let Ok(status) = fs::read_to_string(p.join("status")) else {
            continue;
        };
        let n = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        out.push((comm.trim().to_string(), n));
    }
    out
}

fn sum(v: &[(String, u64)], pred: impl Fn(&str) -> bool) -> u64 {
    v.iter().filter(|(n, _)| pred(n)).map(|(_, c)| c).sum()
}

fn stat_many(dir: &Path, n: usize) {
    for i in 0..n {
        // Names that do not exist: a negative lookup each (cached after the first, so
        // every round uses fresh names).
        let _ = fs::symlink_metadata(dir.join(format!("absent-{i}-{:?}", Instant::now())));
    }
}

#[test]
fn io_uring_queues_serve_the_requests() {
    let m = Mount::builder("uring-serves")
        .policy(ALLOW_ALL)
        .arg("--transport")
        .arg("io-uring")
        .start();
    let log = log_with(&m, "transport: FUSE over io_uring");
    assert!(
        log.contains("transport: FUSE over io_uring"),
        "no io_uring transport in the log:\n{log}"
    );
    let before = switches(m.pid());
    let queues = before
        .iter()
        .filter(|(n, _)| n.starts_with("fencefs-uring"))
        .count();
    assert!(queues >= 1, "no queue threads: {before:?}");
    stat_many(&m.mnt("."), 2000);
    // The same work through every kind of request on the rings, checked against the host.
    fs::create_dir(m.mnt("d")).unwrap();
    fs::write(m.mnt("d/f"), b"ring").unwrap();
    fs::rename(m.mnt("d/f"), m.mnt("d/g")).unwrap();
    assert_eq!(fs::read(m.host("d/g")).unwrap(), b"ring");
    assert_eq!(names_str(&m.mnt("d")).unwrap(), vec!["g".to_string()]);
    let after = switches(m.pid());
    let ring = sum(&after, |n| n.starts_with("fencefs-uring"))
        - sum(&before, |n| n.starts_with("fencefs-uring"));
    let workers =
        sum(&after, |n| !n.starts_with("fencefs-")) - sum(&before, |n| !n.starts_with("fencefs-"));
    eprintln!("2,000 lookups: queue threads woke {ring} times, other threads {workers}");
    // Each lookup is a round trip that wakes a queue thread (several may be batched).
    assert!(ring >= 500, "queue threads barely ran: {ring}");
    assert!(
        workers < ring / 10,
        "fuser's workers did the work ({workers} vs {ring})"
    );
}

#[test]
fn dev_fuse_transport_starts_no_ring() {
    let m = Mount::builder("devfuse")
        .policy(ALLOW_ALL)
        .arg("--transport")
        .arg("dev-fuse")
        .start();
    stat_many(&m.mnt("."), 200);
    fs::write(m.mnt("f"), b"x").unwrap();
    assert_eq!(fs::read(m.host("f")).unwrap(), b"x");
    let log = log_with(&m, "transport: /dev/fuse");
    assert!(
        log.contains("transport: /dev/fuse (--transport dev-fuse)"),
        "{log}"
    );
    let t = switches(m.pid());
    assert!(
        !t.iter().any(|(n, _)| n.starts_with("fencefs-uring")),
        "{t:?}"
    );
}

#[test]
fn io_uring_mount_unmounts_with_requests_in_flight() {
    let mut m = Mount::builder("uring-unmount")
        .policy(ALLOW_ALL)
        .arg("--transport")
        .arg("io-uring")
        .start();
    fs::create_dir(m.mnt("d")).unwrap();
    // Readers keep requests flowing on every CPU while the mount goes away.
    let mnt = m.mnt("d");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let kids: Vec<_> = (0..4)
        .map(|k| {
            let (mnt, stop) = (mnt.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = fs::write(mnt.join(format!("{k}-{}", i % 50)), b"x");
                    let _ = fs::read_dir(&mnt).map(|d| d.count());
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let status = m.terminate();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for k in kids {
        k.join().unwrap();
    }
    assert!(
        status.is_some_and(|s| s.success()),
        "daemon exit: {status:?}\n{}",
        m.stderr()
    );
    assert!(!m.is_mounted(), "still mounted");
}

#[test]
fn queues_that_fail_after_init_send_the_mount_back_to_dev_fuse() {
    // The kernel took io_uring at INIT and holds every request until the queues are
    // registered; when they cannot be, the daemon must hand the connection back to
    // /dev/fuse rather than leave every caller waiting.
    let m = Mount::builder("uring-fails")
        .policy(ALLOW_ALL)
        .env("FENCEFS_FAULT_URING_QUEUES", "1")
        .arg("--transport")
        .arg("io-uring")
        .start();
    let log = log_with(&m, "serves the mount through /dev/fuse");
    assert!(log.contains("fault injected"), "{log}");
    let t = Instant::now();
    fs::write(m.mnt("f"), b"served").unwrap();
    assert_eq!(fs::read(m.mnt("f")).unwrap(), b"served");
    assert_eq!(fs::read(m.host("f")).unwrap(), b"served");
    stat_many(&m.mnt("."), 100);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "requests waited {:?}",
        t.elapsed()
    );
}

extern "C" fn on_usr2(_: libc::c_int) {}

/// Four threads of this process make requests (lookups of fresh names) for `secs` while
/// another signals them without pause (SIGUSR2, a handler that does nothing, SA_RESTART):
/// every signal that lands while a thread waits in FUSE makes the kernel send an
/// INTERRUPT. Returns the signals sent.
fn interrupt_flood(dir: &Path, secs: u64) -> u64 {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    // SAFETY: installs a handler that does nothing for SIGUSR2 (async-signal-safe); no
    // other test of this binary uses SIGUSR2.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr2 as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..4)
        .map(|k| {
            let (dir, stop, tx) = (dir.to_path_buf(), stop.clone(), tx.clone());
            std::thread::spawn(move || {
                // SAFETY: pthread_self has no preconditions.
                tx.send(unsafe { libc::pthread_self() }).unwrap();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = fs::symlink_metadata(dir.join(format!("int-{k}-{i}")));
                    i += 1;
                }
            })
        })
        .collect();
    let threads: Vec<libc::pthread_t> = (0..4).map(|_| rx.recv().unwrap()).collect();
    let sent = AtomicU64::new(0);
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        for &t in &threads {
            // SAFETY: the threads are alive until `stop` is set and they are joined below.
            if unsafe { libc::pthread_kill(t, libc::SIGUSR2) } == 0 {
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }
        std::thread::yield_now();
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    sent.into_inner()
}

#[test]
fn an_interrupt_flood_does_not_flood_the_log() {
    // Issue 17, finding 9: fuser logged "Failed to send FUSE reply: No such file or
    // directory" at error level for every interrupt whose request was answered first
    // (always over io_uring, where the kernel never finds the request on /dev/fuse),
    // ~140 KB a second, so journald then dropped the lines that matter.
    for transport in ["dev-fuse", "io-uring"] {
        // Default logging: the spurious ENOENT is debug-level, nothing shows.
        let m = Mount::builder("int-flood")
            .policy(ALLOW_ALL)
            .arg("--transport")
            .arg(transport)
            .start();
        log_with(&m, "transport:");
        let before = m.stderr().len();
        let sent = interrupt_flood(&m.mnt("."), 3);
        let log = m.stderr();
        let grown = log.len() - before;
        eprintln!("{transport}: {sent} signals, log grew {grown} bytes");
        assert!(sent > 10_000, "{transport}: only {sent} signals sent");
        assert!(
            grown < 20_000,
            "{transport}: the log grew {grown} bytes during the flood:\n{}",
            &log[before..before + grown.min(2000)]
        );
        assert!(
            !log.contains("Failed to send FUSE reply: No such file or directory"),
            "{transport}: the spurious ENOENT is still logged above debug level"
        );
        let mut m = m;
        m.assert_alive("after the interrupt flood");
        drop(m);
        // With that message's debug level switched on, the flood shows — rate-limited,
        // with the count of what was left out.
        let m = Mount::builder("int-flood-debug")
            .policy(ALLOW_ALL)
            .env("RUST_LOG", "info,fuser::reply=debug")
            .arg("--transport")
            .arg(transport)
            .start();
        log_with(&m, "transport:");
        let before = m.stderr().len();
        interrupt_flood(&m.mnt("."), 3);
        // The count of what was suppressed is logged with the next line or at exit.
        let mut m = m;
        m.terminate();
        let log = m.stderr();
        let grown = log.len() - before;
        eprintln!("{transport}, debug: log grew {grown} bytes");
        assert!(
            log.contains("Failed to send FUSE reply: No such file or directory"),
            "{transport}: no interrupt was answered late (the flood did not happen?)"
        );
        assert!(
            log.contains("similar messages suppressed"),
            "{transport}: the flood was not rate-limited:\n{}",
            &log[before..before + grown.min(2000)]
        );
        assert!(grown < 20_000, "{transport}: the log grew {grown} bytes");
    }
}
