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

/// A staged live mount (with `extra` mount arguments) of the sample SOURCE, served by
/// kernel overlayfs: the views retired and revoked here are that engine's (the daemon's
/// own engine keeps no view: an open file is a file of DIR or SOURCE).
fn mount(name: &str, extra: &[&str]) -> (Mount, std::path::PathBuf) {
    let mut b = Mount::builder(name)
        .policy(WRITE)
        .arg("--stage-engine")
        .arg("kernel");
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
    // newest not: their fsync works (with passthrough through the handle's pin to its
    // file in its view), and so does copy_file_range, which the daemon serves.
    for (i, f) in held.iter().enumerate() {
        // SAFETY: fsync(2) on a descriptor this test owns.
        let r = unsafe { libc::fsync(f.as_raw_fd()) };
        if i < 12 {
            assert_eq!(errno_of(r), libc::EBADF, "fsync of held file {i}");
        } else {
            assert_eq!(r, 0, "fsync of held file {i}");
        }
    }
    // Appends its first line: the newest held file writes into the live layer.
    let (mut oi, mut oo) = (0i64, 14i64);
    // SAFETY: copy_file_range(2) within a descriptor this test owns, local offsets.
    let n = unsafe {
        libc::copy_file_range(
            held[19].as_raw_fd(),
            &mut oi,
            held[19].as_raw_fd(),
            &mut oo,
            4,
            0,
        )
    };
    assert_eq!(
        n,
        4,
        "copy_file_range of a held file: {}",
        std::io::Error::last_os_error()
    );
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
    assert_eq!(s, "one\ntwo\nthree\none\n", "the newest held file reads");
    // The mount keeps working, and shows that write, no revoked one.
    fs::write(m.mnt("after.txt"), b"after\n").unwrap();
    assert_eq!(fs::read(m.mnt("after.txt")).unwrap(), b"after\n");
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"one\ntwo\nthree\none\n");
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

fn stage_cmd(sock: &Path, op: &str, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), op.into()];
    v.push(sock.into());
    v.extend(args.iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

/// A file opened for writing before checkpoint 1 and written after it: the write lands
/// in the live layer (`status --since 1` shows it, `rewind 1` drops it), and checkpoint
/// 1's layer in DIR keeps the bytes it had at the checkpoint, before and after the rewind
/// and whatever the old descriptor writes afterwards. A file open read-only across it
/// keeps reading.
fn held_writer_keeps_the_checkpoint_sealed(name: &str, extra: &[&str]) {
    use std::os::unix::fs::FileExt;
    let (m, sock) = mount(name, extra);
    let dir = sock.parent().unwrap().join("stage");
    let before = snapshot(&m.host(""));
    let w = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.mnt("a.txt"))
        .unwrap();
    w.write_all_at(b"ONE", 0).unwrap();
    let r = File::open(m.mnt("sub/b.txt")).unwrap();
    let c = stage_cmd(&sock, "checkpoint", &[]);
    c.assert_ok("checkpoint");
    assert_eq!(c.stdout, "checkpoint 1\n");
    let sealed = dir.join("layers/1/a.txt");
    let at_checkpoint = fs::read(&sealed).unwrap();
    assert_eq!(at_checkpoint, b"ONE\ntwo\nthree\n");
    // Written through the descriptor opened before the checkpoint.
    w.write_all_at(b"TWO", 4).unwrap();
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\nTWO\nthree\n");
    let st = stage_cmd(&sock, "status", &["--since", "1"]);
    st.assert_ok("status --since 1");
    assert_eq!(st.stdout, "M a.txt\n", "the write after checkpoint 1");
    assert_eq!(fs::read(&sealed).unwrap(), at_checkpoint, "layer 1 changed");
    let mut buf = [0u8; 4];
    r.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(
        &buf, b"bee\n",
        "a read-only file held across the checkpoint"
    );
    stage_cmd(&sock, "rewind", &["1"]).assert_ok("rewind 1");
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\ntwo\nthree\n");
    assert_eq!(
        fs::read(&sealed).unwrap(),
        at_checkpoint,
        "layer 1 after rewind"
    );
    // The old descriptor goes on writing, into nothing staged.
    w.write_all_at(b"THREE", 8).unwrap();
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\ntwo\nthree\n");
    assert_eq!(
        fs::read(&sealed).unwrap(),
        at_checkpoint,
        "layer 1 after more writes"
    );
    assert_eq!(stage_cmd(&sock, "status", &["--since", "1"]).stdout, "");
    // Held across a second checkpoint too: still the live layer's, layer 1 and 2 sealed.
    let w2 = OpenOptions::new().write(true).open(m.mnt("a.txt")).unwrap();
    stage_cmd(&sock, "checkpoint", &[]).assert_ok("checkpoint 2");
    stage_cmd(&sock, "checkpoint", &[]).assert_ok("checkpoint 3");
    w2.write_all_at(b"FOUR", 4).unwrap();
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\nFOURthree\n");
    assert_eq!(
        stage_cmd(&sock, "status", &["--since", "3"]).stdout,
        "M a.txt\n"
    );
    // Checkpoint 3's layer holds a.txt as it was then (a copy), untouched by that write.
    assert_eq!(
        fs::read(dir.join("layers/3/a.txt")).unwrap(),
        b"ONE\ntwo\nthree\n"
    );
    assert_eq!(fs::read(&sealed).unwrap(), at_checkpoint);
    drop((w, w2, r));
    released(&sock);
    assert_host_unchanged(&before, &m.host(""), "writes held across checkpoints");
}

#[test]
fn a_file_written_across_a_checkpoint_leaves_the_sealed_layer_unchanged() {
    held_writer_keeps_the_checkpoint_sealed("stage-views-sealed", &[]);
}

#[test]
fn without_passthrough_a_file_written_across_a_checkpoint_leaves_it_sealed() {
    held_writer_keeps_the_checkpoint_sealed("stage-views-sealed-np", &["--no-passthrough"]);
}

/// A passthrough file written through a handle the view bound revoked (the kernel keeps
/// writing its backing file on its own): at the revocation its file is cut off the
/// staged tree — the live layer gets a copy — so what it writes afterwards shows nowhere,
/// and no sealed layer changes.
#[test]
fn a_revoked_passthrough_writer_is_cut_off_the_staged_tree() {
    use std::os::unix::fs::FileExt;
    let (m, sock) = mount("stage-views-cut", &[]);
    let dir = sock.parent().unwrap().join("stage");
    let before = snapshot(&m.host(""));
    let x = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.mnt("a.txt"))
        .unwrap();
    x.write_all_at(b"ONE", 0).unwrap();
    let mut held = Vec::new();
    for i in 1..=MAX_RETIRED + 1 {
        checkpoint(&sock);
        if i <= MAX_RETIRED {
            // One more view held (by a file written in it).
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(m.mnt(format!("f{i}.txt")))
                .unwrap();
            f.write_all_at(format!("{i}\n").as_bytes(), 0).unwrap();
            held.push(f);
        }
    }
    // The ninth swap revoked a.txt's view: its handle is cut off.
    assert_eq!(views(&sock), 1 + MAX_RETIRED);
    let sealed = fs::read(dir.join("layers/1/a.txt")).unwrap();
    assert_eq!(sealed, b"ONE\ntwo\nthree\n");
    x.write_all_at(b"TWO", 4).unwrap();
    assert_eq!(fs::read(m.mnt("a.txt")).unwrap(), b"ONE\ntwo\nthree\n");
    assert_eq!(fs::read(dir.join("layers/1/a.txt")).unwrap(), sealed);
    for n in 2..=MAX_RETIRED + 1 {
        let p = dir.join(format!("layers/{n}/a.txt"));
        assert!(
            !p.exists() || fs::read(&p).unwrap() == sealed,
            "layer {n} changed"
        );
    }
    let st = stage_cmd(&sock, "status", &["--since", "1"]);
    assert!(!st.stdout.contains("a.txt"), "{}", st.stdout);
    // The files of the views kept still write into the live layer.
    held[7].write_all_at(b"eight\n", 0).unwrap();
    assert_eq!(fs::read(m.mnt("f8.txt")).unwrap(), b"eight\n");
    drop((x, held));
    released(&sock);
    assert_host_unchanged(&before, &m.host(""), "a revoked writer cut off");
}

/// The conflict rule after a rewind to a checkpoint that copied a file held open for
/// writing: the copy is born at the checkpoint, but it stands for the entry staged
/// before, so a host edit made between the two is still a conflict.
#[test]
fn a_host_edit_before_the_checkpoint_of_a_held_file_stays_a_conflict_after_rewind() {
    use std::os::unix::fs::FileExt;
    let (m, sock) = mount("stage-views-conflict", &[]);
    let pause = || std::thread::sleep(std::time::Duration::from_millis(50));
    let w = OpenOptions::new().write(true).open(m.mnt("a.txt")).unwrap();
    w.write_all_at(b"ONE", 0).unwrap();
    pause();
    // The host edits SOURCE's a.txt after it was staged.
    fs::write(m.host("a.txt"), b"host edit\n").unwrap();
    pause();
    checkpoint(&sock);
    let st = stage_cmd(&sock, "status", &[]);
    assert_eq!(st.stdout, "CM a.txt\n", "before the rewind");
    drop(w);
    stage_cmd(&sock, "rewind", &["1"]).assert_ok("rewind 1");
    let st = stage_cmd(&sock, "status", &[]);
    assert_eq!(
        st.stdout, "CM a.txt\n",
        "after the rewind (the sealed copy)"
    );
    released(&sock);
}

/// A file held open for writing that has two names (a hard link made through the mount),
/// then is renamed after a checkpoint: each checkpoint finds it under every name it has
/// then (a walk of the layer) and keeps them all sealed.
#[test]
fn a_held_file_with_two_names_then_renamed_stays_out_of_every_sealed_layer() {
    use std::os::unix::fs::FileExt;
    let (m, sock) = mount("stage-views-links", &[]);
    let dir = sock.parent().unwrap().join("stage");
    let w = OpenOptions::new()
        .write(true)
        .open(m.mnt("sub/b.txt"))
        .unwrap();
    w.write_all_at(b"BEE", 0).unwrap();
    fs::hard_link(m.mnt("sub/b.txt"), m.mnt("b2.txt")).unwrap();
    checkpoint(&sock);
    let l1 = |p: &str| fs::read(dir.join("layers/1").join(p)).unwrap();
    w.write_all_at(b"ONE", 0).unwrap();
    assert_eq!(l1("sub/b.txt"), b"BEE\n");
    assert_eq!(l1("b2.txt"), b"BEE\n");
    assert_eq!(fs::read(m.mnt("sub/b.txt")).unwrap(), b"ONE\n");
    assert_eq!(fs::read(m.mnt("b2.txt")).unwrap(), b"ONE\n");
    // Renamed in the live view: the next checkpoint finds it under its new name.
    fs::rename(m.mnt("b2.txt"), m.mnt("sub/deep/moved.txt")).unwrap();
    checkpoint(&sock);
    w.write_all_at(b"TWO", 0).unwrap();
    let l2 = |p: &str| fs::read(dir.join("layers/2").join(p)).unwrap();
    assert_eq!(l2("sub/deep/moved.txt"), b"ONE\n");
    assert_eq!(l2("sub/b.txt"), b"ONE\n");
    assert_eq!(l1("sub/b.txt"), b"BEE\n");
    assert_eq!(fs::read(m.mnt("sub/deep/moved.txt")).unwrap(), b"TWO\n");
    let st = stage_cmd(&sock, "status", &["--since", "2"]);
    assert_eq!(st.stdout, "M sub/b.txt\nM sub/deep/moved.txt\n");
    stage_cmd(&sock, "rewind", &["2"]).assert_ok("rewind 2");
    assert_eq!(fs::read(m.mnt("sub/deep/moved.txt")).unwrap(), b"ONE\n");
    drop(w);
    released(&sock);
}
