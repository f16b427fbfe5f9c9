//! SPEC "Safety": a symlink swapped in on the host never redirects the daemon outside
//! SOURCE, and hidden content never leaks through caches.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const MARKER_IN: &[u8] = b"inside\n";
const MARKER_OUT: &[u8] = b"OUTSIDE-SECRET\n";

/// Layout: SOURCE/a/dir/marker ("inside") and SOURCE/a/dir.swap → ../../outside/dir, a
/// relative symlink that, on the host, reaches ROOT/outside/dir/marker ("OUTSIDE-SECRET");
/// resolved by the caller's kernel through the mount (ROOT/mp/mnt), it reaches
/// ROOT/mp/outside, which does not exist. So the secret can only come back if the daemon
/// itself followed a host symlink. Same for SOURCE/a/file ↔ a/file.swap → ../../outside/file.
fn race_layout(src: &Path, outside: &Path) {
    put(&outside.join("dir/marker"), MARKER_OUT, 0o644);
    put(&outside.join("file"), MARKER_OUT, 0o644);
    put(&src.join("a/dir/marker"), MARKER_IN, 0o644);
    put(&src.join("a/file"), MARKER_IN, 0o644);
    symlink("../../outside/dir", &src.join("a/dir.swap"));
    symlink("../../outside/file", &src.join("a/file.swap"));
}

/// Default caching (the kernel revalidates names after the daemon's TTL).
#[test]
fn host_symlink_swap_race_never_leaks_outside_content() {
    swap_race("swap-race", "default = \"write\"\n", false);
}

/// With a uid rule in the policy, names may not be cached across callers (SPEC Safety), so
/// practically every lookup reaches the daemon while the host swaps: the hardest case.
#[test]
fn host_symlink_swap_race_with_uncached_lookups() {
    let policy =
        "default = \"write\"\n[[rule]]\npath = \"unrelated\"\naccess = \"read\"\nuid = [4242]\n";
    swap_race("swap-race-uid", policy, true);
}

fn swap_race(name: &str, policy: &str, must_see_both_sides: bool) {
    let b = Mount::builder(name).policy(policy).mode("danger");
    race_layout(&b.host(""), &b.outside());
    assert_eq!(
        fs::read(b.host("a/dir.swap/marker")).unwrap(),
        MARKER_OUT,
        "host-side sanity: the swap target leads outside"
    );
    let m = b.start();

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let stop = stop.clone();
        let swaps = swaps.clone();
        let a = m.host("a");
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for (x, y) in [("dir", "dir.swap"), ("file", "file.swap")] {
                    renameat2(&a.join(x), &a.join(y), libc::RENAME_EXCHANGE)
                        .expect("host RENAME_EXCHANGE");
                }
                swaps.fetch_add(1, Ordering::Relaxed);
            }
            // Leave the real directory and file in place.
            for (x, y) in [("dir", "dir.swap"), ("file", "file.swap")] {
                if fs::symlink_metadata(a.join(x))
                    .unwrap()
                    .file_type()
                    .is_symlink()
                {
                    renameat2(&a.join(x), &a.join(y), libc::RENAME_EXCHANGE).unwrap();
                }
            }
        })
    };

    // Bounded: at least 2,000 iterations or 4 s (whichever is later, so that the kernel's
    // name cache expires several times), never more than 10 s or 200,000 iterations.
    let start = Instant::now();
    let (mut iterations, mut inside, mut errors) = (0u64, 0u64, 0u64);
    // How often each name showed the "other" side of the swap (proves the race ran).
    let mut flips = 0u64;
    let mut leaks = vec![];
    while (iterations < 2000 || start.elapsed() < Duration::from_secs(4))
        && start.elapsed() < Duration::from_secs(10)
        && iterations < 200_000
    {
        iterations += 1;
        for p in ["a/dir/marker", "a/file", "a/dir.swap/marker", "a/file.swap"] {
            match fs::read(m.mnt(p)) {
                Ok(v) if v == MARKER_IN => {
                    inside += 1;
                    if p.contains(".swap") {
                        flips += 1;
                    }
                }
                Ok(v) if v.is_empty() => {}
                Ok(v) => leaks.push(format!("{p}: {:?}", String::from_utf8_lossy(&v))),
                Err(_) => {
                    errors += 1;
                    if !p.contains(".swap") {
                        flips += 1;
                    }
                }
            }
        }
        if iterations % 50 == 0 {
            // Also walk the dir through readdir + open of each entry.
            if let Ok(rd) = fs::read_dir(m.mnt("a/dir")) {
                for e in rd.flatten() {
                    if let Ok(v) = fs::read(e.path())
                        && v == MARKER_OUT
                    {
                        leaks.push(format!("readdir walk: {}", e.path().display()));
                    }
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    eprintln!(
        "{name}: {iterations} iterations, {} host swaps, {inside} inside reads, {errors} errors, \
         {flips} reads saw the other side, {:?}",
        swaps.load(Ordering::Relaxed),
        start.elapsed()
    );
    assert!(
        leaks.is_empty(),
        "content from OUTSIDE the workspace came back through the mount:\n{}",
        leaks.join("\n")
    );
    assert!(
        swaps.load(Ordering::Relaxed) > 0,
        "the host swapper never ran"
    );
    assert!(
        inside > 0,
        "no read ever succeeded, the race was not exercised"
    );
    if must_see_both_sides {
        assert!(
            flips > 0,
            "no lookup ever saw a swapped name: the race was not exercised"
        );
    }
    // After the race the mount still works.
    assert!(
        eventually(Duration::from_secs(5), || fs::read(m.mnt("a/dir/marker"))
            .ok()
            .as_deref()
            == Some(MARKER_IN)),
        "mount broken after the race; stderr:\n{}",
        m.stderr()
    );
}

#[test]
fn host_symlinks_are_symlinks_for_every_daemon_operation() {
    // In danger mode with default write, mutations through a host symlink must act on the
    // link (or fail), never on its outside target.
    let b = Mount::builder("symlink-ops")
        .policy("default = \"write\"\n")
        .mode("danger");
    race_layout(&b.host(""), &b.outside());
    symlink(b.outside().join("file"), &b.host("abs"));
    let m = b.start();
    let outside_before = snapshot(&m.outside());

    assert!(
        fs::symlink_metadata(m.mnt("a/file.swap"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(
        fs::symlink_metadata(m.mnt("abs"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // chmod/chown/utimens/truncate follow symlinks in the caller's kernel: for the
    // relative one that leads to a missing path through the mount.
    assert_errno(
        chmod(&m.mnt("a/file.swap"), 0o600),
        libc::ENOENT,
        "chmod through a/file.swap",
    )
    .ok();
    assert_errno(
        truncate(&m.mnt("a/file.swap"), 0),
        libc::ENOENT,
        "truncate through a/file.swap",
    )
    .ok();
    assert_errno(
        fs::write(m.mnt("a/file.swap"), b"x"),
        libc::ENOENT,
        "write through a/file.swap",
    )
    .ok();
    assert_errno(
        fs::read_dir(m.mnt("a/dir.swap")),
        libc::ENOENT,
        "readdir through a/dir.swap",
    )
    .ok();
    // Operations on the link itself act on the link.
    lchown(&m.mnt("a/file.swap"), 1000, 1000).expect("lchown the link itself");
    utimes(&m.mnt("a/file.swap"), 1_000_000).expect("utimens(AT_SYMLINK_NOFOLLOW) the link itself");
    fs::rename(m.mnt("a/file.swap"), m.mnt("a/moved.swap")).expect("rename the link");
    fs::remove_file(m.mnt("a/moved.swap")).expect("unlink the link");
    assert!(fs::symlink_metadata(m.host("a/moved.swap")).is_err());
    assert_host_unchanged(&outside_before, &m.outside(), "operations on host symlinks");
}

#[test]
fn reload_hides_already_cached_and_open_paths() {
    let m = Mount::with(
        "reload-cache",
        Some("default = \"write\"\n"),
        Some("danger"),
        |s| {
            put(&s.join("docs/a"), b"a\n", 0o644);
            put(&s.join("docs/sub/b"), b"b\n", 0o644);
            put(&s.join("keep"), b"k\n", 0o644);
        },
    );
    // Warm every cache: entries, attrs, page cache, directory listing.
    for _ in 0..3 {
        read_all(&m.mnt("docs/a")).unwrap();
        read_all(&m.mnt("docs/sub/b")).unwrap();
        names(&m.mnt("docs")).unwrap();
    }
    m.reload_with("default = \"write\"\n[[rule]]\npath = \"docs\"\naccess = \"none\"\n");
    assert!(
        eventually(Duration::from_secs(5), || fs::symlink_metadata(
            m.mnt("docs")
        )
        .is_err()),
        "docs still visible 5 s after SIGHUP; stderr:\n{}",
        m.stderr()
    );
    // Nothing hidden stays reachable through a cache, by any path.
    for p in ["docs", "docs/a", "docs/sub", "docs/sub/b"] {
        assert_errno(
            fs::symlink_metadata(m.mnt(p)),
            libc::ENOENT,
            &format!("lstat {p} after reload"),
        )
        .ok();
        assert_errno(
            fs::read(m.mnt(p)),
            libc::ENOENT,
            &format!("read {p} after reload"),
        )
        .ok();
    }
    assert_eq!(names_str(&m.mnt("")).unwrap(), ["keep"]);
    assert_eq!(read_all(&m.mnt("keep")).unwrap(), b"k\n");
}

#[test]
fn revoke_stops_io_on_handles_opened_before_a_reload() {
    let m = Mount::builder("revoke")
        .policy("default = \"write\"\n")
        .mode("danger")
        .arg("--revoke");
    put(&m.host("docs/a"), b"0123456789\n", 0o644);
    let m = m.start();
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut r = fs::File::open(m.mnt("docs/a")).unwrap();
    let mut w = fs::OpenOptions::new()
        .write(true)
        .open(m.mnt("docs/a"))
        .unwrap();
    let mut buf = [0u8; 4];
    r.read_exact(&mut buf).unwrap();
    m.reload_with("default = \"write\"\n[[rule]]\npath = \"docs\"\naccess = \"none\"\n");
    assert!(
        eventually(Duration::from_secs(5), || fs::symlink_metadata(
            m.mnt("docs")
        )
        .is_err()),
        "reload did not take effect"
    );
    r.seek(SeekFrom::Start(0)).unwrap();
    let res = r.read(&mut buf);
    assert_errno(
        res,
        libc::ENOENT,
        "read on a handle opened before the reload, with --revoke",
    )
    .ok();
    let res = w.write_all(b"X").and_then(|_| w.sync_all());
    assert_errno(
        res,
        libc::ENOENT,
        "write on a handle opened before the reload, with --revoke",
    )
    .ok();
    assert_eq!(fs::read(m.host("docs/a")).unwrap(), b"0123456789\n");
}

/// The FUSE workers run confined (Landlock to SOURCE + /dev/fuse, no_new_privs): a bug in
/// path handling could not reach the host outside SOURCE. The log says what was applied.
#[test]
fn fuse_workers_are_confined_to_the_source() {
    let m = Mount::with("confined", Some("mode = \"danger\"\n"), None, |src| {
        put(&src.join("f"), b"x", 0o644);
    });
    assert_eq!(read_all(&m.mnt("f")).unwrap(), b"x");
    // The line is logged just before the workers start; the mount may show up first.
    assert!(
        eventually(std::time::Duration::from_secs(2), || m
            .stderr()
            .contains("self-confinement: FUSE workers limited by Landlock")),
        "no Landlock line in:\n{}",
        m.stderr()
    );
    // Every thread that serves requests — fuser-N (the /dev/fuse workers), and with io_uring
    // fencefs-uringN (the queues) and fencefs-slowN (their workers) — has no_new_privs
    // set. (fuser's workers start once the io_uring queues have registered.)
    let serving = |comm: &str| {
        ["fuser-", "fencefs-uring", "fencefs-slow"]
            .iter()
            .any(|p| comm.starts_with(p))
    };
    let threads = || -> Vec<(String, String)> {
        std::fs::read_dir(format!("/proc/{}/task", m.pid()))
            .unwrap()
            .flatten()
            .map(|t| {
                let t = t.path();
                let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
                let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
                (comm.trim().to_string(), status)
            })
            .collect()
    };
    eventually(std::time::Duration::from_secs(5), || {
        threads().iter().any(|(c, _)| c.starts_with("fuser-"))
    });
    let mut workers = 0;
    for (comm, status) in threads() {
        if serving(&comm) {
            workers += 1;
            assert!(status.contains("NoNewPrivs:\t1"), "{comm}: {status}");
        }
    }
    assert!(workers >= 1, "no fuser worker threads found");
}
