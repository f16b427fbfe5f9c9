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
