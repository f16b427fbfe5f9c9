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
