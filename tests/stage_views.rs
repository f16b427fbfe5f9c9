//! Merged views pinned by open files across live changes: a live checkpoint, rewind, apply
//! or discard replaces the view the daemon serves, and a file opened before stays with the
//! old (*retired*) view, which stays attached while such a file is open. A process that
//! holds files open across many swaps must not pin views without bound: a retired view
//! is held only by handles opened in it, at most 8 are kept, and past that the oldest
//! one's handles are revoked (their next request through the daemon answers EBADF) and it
//! is released. Counted on the control socket's `status` (`stage_views`) and in the
//! daemon's descriptors; SOURCE stays untouched.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

use common::stage::*;
use common::*;
use serde_json::json;

/// Retired views kept attached (the daemon's `restage::MAX_RETIRED`).
const MAX_RETIRED: u64 = 8;

/// `stage_views` of the control socket's `status`.
fn views(sock: &Path) -> u64 {
    let v = Peer::connect(sock).call(json!({"cmd": "status"}));
    v["stage_views"]
        .as_u64()
        .unwrap_or_else(|| panic!("no stage_views in {v}"))
}

fn checkpoint(sock: &Path) {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), "checkpoint".into()];
    v.push(sock.into());
    run_fencefs(v, LIMIT).assert_ok("live checkpoint");
}

/// Once every file is closed, a swap (retried while the kernel's releases are still
/// on their way) leaves the one view served.
fn released(sock: &Path) {
    let t = std::time::Instant::now();
    loop {
        checkpoint(sock);
        let v = views(sock);
        if v == 1 {
            return;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{v} views still attached with every file closed"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The daemon's open descriptors but sockets (control connections close on their own
/// time).
fn daemon_fds(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter(|e| {
            let l = e.as_ref().ok().and_then(|e| fs::read_link(e.path()).ok());
            !l.is_some_and(|l| l.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

/// The views (`gN` on the daemon's private mount tree) of the files the daemon holds open.
fn view_files(pid: i32) -> Vec<String> {
    let mut v = Vec::new();
    for e in fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let Ok(l) = fs::read_link(e.unwrap().path()) else {
            continue;
        };
        let l = l.to_string_lossy().into_owned();
        let mut parts = l.splitn(3, '/');
        if let (Some(""), Some(g), Some(_)) = (parts.next(), parts.next(), parts.next())
            && g.len() > 1
            && g.starts_with('g')
            && g[1..].bytes().all(|b| b.is_ascii_digit())
        {
            v.push(g.to_string());
        }
    }
    v.sort();
    v
}

fn errno_of(r: i32) -> i32 {
    assert_eq!(r, -1, "the call succeeded");
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// A staged live mount (with `extra` mount arguments) of the sample SOURCE.
fn mount(name: &str, extra: &[&str]) -> (Mount, std::path::PathBuf) {
    let mut b = Mount::builder(name).policy(WRITE);
    sample(&b.host(""));
    let dir = stage_dir(&b);
    let sock = b.root().join("ctl.sock");
    for a in extra {
        b = b.arg(a);
    }
    let m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(&sock)
        .start();
    (m, sock)
}

#[test]
fn one_file_held_across_many_swaps_pins_one_view() {
    let (m, sock) = mount("stage-views-one", &[]);
    let before = snapshot(&m.host(""));
    let mut held = OpenOptions::new()
        .append(true)
        .open(m.mnt("a.txt"))
        .unwrap();
    held.write_all(b"four\n").unwrap();
    assert_eq!(views(&sock), 1);
    let fds = daemon_fds(m.pid());
    for i in 0..20 {
        checkpoint(&sock);
        // Its own view, and the one served: the later views it was never opened in go.
        assert!(views(&sock) <= 2, "after swap {i}: {} views", views(&sock));
        fs::write(m.mnt(format!("new{i}.txt")), format!("{i}\n")).unwrap();
    }
    assert!(
        daemon_fds(m.pid()) <= fds + 2,
        "{} -> {}",
        fds,
        daemon_fds(m.pid())
    );
    // Within the bound, it is never revoked: it still writes.
    held.write_all(b"five\n").unwrap();
    drop(held);
    released(&sock);
    assert_eq!(fs::read(m.mnt("new19.txt")).unwrap(), b"19\n");
    assert_host_unchanged(&before, &m.host(""), "views held across checkpoints");
}

/// Opens a new file after each of 20 swaps and holds them all: views stay bounded, the
/// oldest handles are revoked (EBADF on fsync, and without passthrough on read and
/// write), the newest keep working, the mount keeps working.
fn many_held(name: &str, extra: &[&str]) {
    let (m, sock) = mount(name, extra);
    let before = snapshot(&m.host(""));
    let passthrough = extra.is_empty();
    let fds = daemon_fds(m.pid());
    let mut held: Vec<File> = Vec::new();
    for i in 0..20u64 {
        held.push(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(m.mnt("a.txt"))
                .unwrap(),
        );
        checkpoint(&sock);
        let v = views(&sock);
        assert!(v <= 1 + MAX_RETIRED, "after swap {i}: {v} views attached");
        assert_eq!(v, 1 + (i + 1).min(MAX_RETIRED), "after swap {i}");
    }
    // Without passthrough each handle holds a daemon descriptor: only the kept ones do
    // (20 more without the bound).
    let now = daemon_fds(m.pid());
    assert!(
        now <= fds + MAX_RETIRED as usize + 8,
        "daemon descriptors {fds} -> {now}"
    );
    let files = view_files(m.pid());
    assert!(
        files.len() <= MAX_RETIRED as usize,
        "the daemon holds files of the views {files:?}"
    );
    if !passthrough {
        assert_eq!(files.len(), MAX_RETIRED as usize, "{files:?}");
    }
    // The 12 oldest were revoked (fsync reaches the daemon, passthrough or not), the 8
    // newest not (without passthrough their fsync works; with it, see the chapter).
    for (i, f) in held.iter().enumerate() {
        // SAFETY: fsync(2) on a descriptor this test owns.
        let r = unsafe { libc::fsync(f.as_raw_fd()) };
        if i < 12 {
            assert_eq!(errno_of(r), libc::EBADF, "fsync of held file {i}");
        } else if !passthrough {
            assert_eq!(r, 0, "fsync of held file {i}");
        } else if r != 0 {
            assert_ne!(errno_of(r), libc::EBADF, "fsync of held file {i}");
        }
    }
    let mut buf = [0u8; 4];
    if !passthrough {
        // SAFETY: read(2)/write(2) on a descriptor this test owns, into a local buffer.
        let r = unsafe { libc::pread(held[0].as_raw_fd(), buf.as_mut_ptr().cast(), 4, 0) };
        assert_eq!(errno_of(r as i32), libc::EBADF, "read of a revoked file");
        // SAFETY: as above.
        let w = unsafe { libc::pwrite(held[0].as_raw_fd(), b"x".as_ptr().cast(), 1, 0) };
        assert_eq!(errno_of(w as i32), libc::EBADF, "write of a revoked file");
    }
    let mut newest = &held[19];
    let mut s = String::new();
    newest.read_to_string(&mut s).unwrap();
    assert_eq!(s, "one\ntwo\nthree\n", "the newest held file reads");
    // The mount keeps working, and shows no revoked write.
    fs::write(m.mnt("after.txt"), b"after\n").unwrap();
    assert_eq!(fs::read(m.mnt("after.txt")).unwrap(), b"after\n");
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"one\ntwo\nthree\n");
    // Closing a revoked file succeeds; once all are closed (the kernel sends its
    // releases in the background) a swap releases every retired view.
    for f in held {
        let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
        // SAFETY: close(2) of a descriptor this test owns, taken out of its File.
        let r = unsafe { libc::close(fd) };
        assert_eq!(r, 0, "close of a held file");
    }
    released(&sock);
    assert_host_unchanged(&before, &m.host(""), "views revoked");
}

#[test]
fn files_held_in_many_views_keep_at_most_eight_and_the_oldest_are_revoked() {
    many_held("stage-views-many", &[]);
}

#[test]
fn without_passthrough_a_revoked_file_answers_ebadf_to_read_and_write() {
    many_held("stage-views-many-np", &["--no-passthrough"]);
}
