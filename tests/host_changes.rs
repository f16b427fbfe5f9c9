//! Edits made on the host by other processes show up through the mount: within
//! milliseconds when SOURCE is watched (fanotify; the kernel then caches names and
//! attributes for 10 s), within the 1 s cache lifetime when it is not (--no-watch).

mod common;

use std::fs;
use std::time::{Duration, Instant};

use common::*;

const OPEN: &str = "mode = \"danger\"\n";

/// Warms the kernel caches, edits the host, and returns how long until every change is
/// visible through the mount (None: not within `limit`).
fn edit_and_measure(m: &Mount, limit: Duration) -> Option<Duration> {
    // Warm: entry + attributes of f, a negative lookup of g, the listing.
    assert_eq!(fs::metadata(m.mnt("d/f")).unwrap().len(), 2);
    assert!(
        names_str(&m.mnt("d"))
            .unwrap()
            .contains(&"gone".to_string())
    );
    assert!(fs::metadata(m.mnt("d/gone")).is_ok());
    assert!(fs::metadata(m.mnt("d/new")).is_err());
    let t = Instant::now();
    fs::write(m.host("d/f"), b"longer content").unwrap();
    fs::remove_file(m.host("d/gone")).unwrap();
    fs::write(m.host("d/new"), b"n").unwrap();
    fs::rename(m.host("d/moved-from"), m.host("d/moved-to")).unwrap();
    let ok = eventually(limit, || {
        fs::metadata(m.mnt("d/f")).is_ok_and(|md| md.len() == 14)
            && errno_of(&fs::metadata(m.mnt("d/gone"))) == libc::ENOENT
            && fs::read(m.mnt("d/new")).is_ok_and(|c| c == b"n")
            && errno_of(&fs::metadata(m.mnt("d/moved-from"))) == libc::ENOENT
            && fs::metadata(m.mnt("d/moved-to")).is_ok()
            && names_str(&m.mnt("d")).is_ok_and(|n| {
                n.contains(&"new".to_string())
                    && n.contains(&"moved-to".to_string())
                    && !n.contains(&"gone".to_string())
                    && !n.contains(&"moved-from".to_string())
            })
    });
    ok.then(|| t.elapsed())
}

fn setup(src: &std::path::Path) {
    mkdirp(&src.join("d"));
    put(&src.join("d/f"), b"v1", 0o644);
    put(&src.join("d/gone"), b"x", 0o644);
    put(&src.join("d/moved-from"), b"x", 0o644);
}

#[test]
fn watched_host_edits_are_visible_long_before_the_cache_expires() {
    let m = Mount::with("watched", Some(OPEN), None, setup);
    assert!(
        eventually(Duration::from_secs(2), || m
            .stderr()
            .contains("host changes: watched (fanotify)")),
        "{}",
        m.stderr()
    );
    // Warm the stat of moved-from too, so its cached entry must be dropped.
    assert!(fs::metadata(m.mnt("d/moved-from")).is_ok());
    let took = edit_and_measure(&m, Duration::from_secs(2))
        .unwrap_or_else(|| panic!("host edits not visible within 2 s:\n{}", m.stderr()));
    eprintln!("watched: host edits visible through the mount after {took:?} (cache TTL 10 s)");
    assert!(took < Duration::from_secs(2));
}

#[test]
fn unwatched_host_edits_are_visible_within_the_cache_lifetime() {
    let m = Mount::builder("unwatched").policy(OPEN).arg("--no-watch");
    setup(&m.host(""));
    let m = m.start();
    assert!(
        eventually(Duration::from_secs(2), || m
            .stderr()
            .contains("host changes: not watched")),
        "{}",
        m.stderr()
    );
    assert!(fs::metadata(m.mnt("d/moved-from")).is_ok());
    let took = edit_and_measure(&m, Duration::from_secs(3))
        .unwrap_or_else(|| panic!("host edits not visible within 3 s:\n{}", m.stderr()));
    eprintln!("unwatched: host edits visible after {took:?} (cache TTL 1 s)");
}

#[test]
fn the_mounts_own_changes_are_not_echoed_back() {
    // Changes made through the mount are the daemon's own: the kernel already knows
    // them, and they must stay consistent with no invalidation race.
    let m = Mount::with("own-changes", Some(OPEN), None, setup);
    for i in 0..200 {
        let p = m.mnt(format!("d/own{i}"));
        fs::write(&p, format!("{i}")).unwrap();
        assert_eq!(fs::read(&p).unwrap(), format!("{i}").as_bytes());
        fs::rename(&p, m.mnt(format!("d/ren{i}"))).unwrap();
        assert!(fs::metadata(m.mnt(format!("d/ren{i}"))).is_ok());
        assert_eq!(errno_of(&fs::metadata(&p)), libc::ENOENT);
    }
    let names = names_str(&m.mnt("d")).unwrap();
    assert_eq!(names.iter().filter(|n| n.starts_with("ren")).count(), 200);
}

/// The voluntary context switches of the daemon's thread named `comm` so far.
fn thread_switches(pid: i32, comm: &str) -> u64 {
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = t.unwrap().path();
        if fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim() == comm) {
            let status = fs::read_to_string(dir.join("status")).unwrap();
            let line = status
                .lines()
                .find(|l| l.starts_with("voluntary_ctxt_switches:"))
                .unwrap();
            return line.split_whitespace().nth(1).unwrap().parse().unwrap();
        }
    }
    panic!("no thread {comm} in daemon {pid}");
}

/// 3,000 unlinks through the mount queue 3,000 fanotify events, all the daemon's own:
/// the watch reads them in batches (at most one read per `watch::COALESCE`, 5 ms), not
/// with one wake-up each. A read cycle is two voluntary switches (the read, the pause),
/// so at most 2 per 5 ms of the run, whatever the machine's load; one wake-up per event
/// would be about one switch per unlink.
#[test]
fn the_watch_reads_a_burst_of_the_daemons_own_events_in_few_wakeups() {
    const N: usize = 3000;
    let m = Mount::with("watch-burst", Some(OPEN), None, |src| {
        mkdirp(&src.join("d"));
        for i in 0..N {
            put(&src.join(format!("d/f{i}")), b"", 0o644);
        }
    });
    assert!(
        eventually(Duration::from_secs(2), || m
            .stderr()
            .contains("host changes: watched (fanotify)")),
        "{}",
        m.stderr()
    );
    // Names known first, so that the timed part is the unlinks alone.
    assert_eq!(names_str(&m.mnt("d")).unwrap().len(), N);
    std::thread::sleep(Duration::from_millis(50));
    let before = thread_switches(m.pid(), "fencefs-watch");
    let t = Instant::now();
    for i in 0..N {
        fs::remove_file(m.mnt(format!("d/f{i}"))).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    let took = t.elapsed();
    let switches = thread_switches(m.pid(), "fencefs-watch") - before;
    let bound = 2 * (took.as_millis() as u64 / 5) + 10;
    eprintln!(
        "{N} unlinks in {took:?}: the watch thread switched {switches} times (bound {bound})"
    );
    assert!(
        switches <= bound,
        "{switches} wake-ups of the watch for {N} unlinks in {took:?} (bound {bound})"
    );
    // Every file is gone on the host; a host change is still seen at once.
    assert_eq!(fs::read_dir(m.host("d")).unwrap().count(), 0);
    fs::write(m.host("d/late"), b"x").unwrap();
    assert!(eventually(Duration::from_secs(2), || fs::metadata(
        m.mnt("d/late")
    )
    .is_ok()));
}
