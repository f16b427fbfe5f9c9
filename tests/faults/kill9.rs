//! 1. `kill -9` of the daemon mid-write: acknowledged chunks on the host, the rest old content or a prefix.

use super::*;

// ---------------------------------------------------------------- 1. kill -9 mid-write

const CH: usize = 16 * 1024;
/// The target file's old content: 64 chunks (1 MiB).
const OLD_CHUNKS: usize = 64;
/// SIGKILL the daemon once this many chunks are fsync'd (inside the old content's range).
const KILL_AFTER: u64 = 40;
const MAX_CHUNKS: u64 = 4096;

const STEPS: [&str; 7] = [
    "-",
    "open target",
    "create new",
    "write target",
    "write new",
    "fsync target",
    "fsync new",
];

/// New bytes are all >= 0x80 and old bytes all < 0x80: any byte tells which one it is.
fn fill_new(buf: &mut [u8], chunk: u64) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = 0x80 | ((chunk.wrapping_mul(131).wrapping_add(j as u64 * 7)) % 127) as u8;
    }
}

fn new_stream(chunks: usize) -> Vec<u8> {
    let mut v = vec![0u8; chunks * CH];
    for (i, c) in v.chunks_mut(CH).enumerate() {
        fill_new(c, i as u64);
    }
    v
}

fn old_content(len: usize) -> Vec<u8> {
    (0..len).map(|j| 0x20 + (j % 95) as u8).collect()
}

fn prefix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Forked writer: overwrites `target` and appends to the new file `newf`, chunk by chunk,
/// fsyncs both and only then reports the chunk as acknowledged. Stops at the first error.
fn writer_child(target: &CStr, newf: &CStr, buf: &mut [u8], out: i32) -> i32 {
    // SAFETY: open(2) on a NUL-terminated path prepared before the fork.
    let fa = unsafe { libc::open(target.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fa < 0 {
        report(out, [REC_ERR, 1, errno() as u64]);
        return 0;
    }
    // SAFETY: as above.
    let fb = unsafe {
        libc::open(
            newf.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if fb < 0 {
        report(out, [REC_ERR, 2, errno() as u64]);
        return 0;
    }
    for i in 0..MAX_CHUNKS {
        fill_new(buf, i);
        for (step, fd) in [(3u64, fa), (4u64, fb)] {
            let mut off = 0usize;
            while off < buf.len() {
                // SAFETY: buf[off..] is readable for buf.len() - off bytes.
                let n = unsafe {
                    libc::pwrite(
                        fd,
                        buf.as_ptr().add(off).cast(),
                        buf.len() - off,
                        (i as usize * CH + off) as libc::off_t,
                    )
                };
                if n < 0 {
                    let e = errno();
                    if e == libc::EINTR {
                        continue;
                    }
                    report(out, [REC_ERR, step, e as u64]);
                    return 0;
                }
                if n == 0 {
                    report(out, [REC_ERR, step, 0]);
                    return 0;
                }
                off += n as usize;
            }
        }
        for (step, fd) in [(5u64, fa), (6u64, fb)] {
            // SAFETY: fsync(2) on an fd this child opened.
            if unsafe { libc::fsync(fd) } != 0 {
                report(out, [REC_ERR, step, errno() as u64]);
                return 0;
            }
        }
        report(out, [REC_ACK, i, 0]);
    }
    report(out, [REC_DONE, 0, 0]);
    0
}

fn kill9_mid_write(name: &str, extra: &[&str]) {
    let mut b = Mount::builder(name).policy(POLICY_W).mode("danger");
    for a in extra {
        b = b.arg(*a);
    }
    let old = old_content(OLD_CHUNKS * CH);
    put(&b.host("target.bin"), &old, 0o644);
    put(&b.host("untouched/a.txt"), b"a\n", 0o644);
    put(
        &b.host("untouched/deep/b.bin"),
        &pseudo_random(100_000, 7),
        0o600,
    );
    let mut m = b.start();
    let untouched = snapshot(&m.host("untouched"));
    let target_c = cpath(&m.mnt("target.bin"));
    let new_c = cpath(&m.mnt("new.bin"));
    let mut buf = vec![0u8; CH];

    let (rd, wr) = pipe();
    let wfd = wr.as_raw_fd();
    let mut writer = Forked::spawn(|| writer_child(&target_c, &new_c, &mut buf, wfd));
    drop(wr);
    let rx = records(rd);

    // `acked` chunks (0..acked) had both fsyncs return success.
    let mut acked = 0u64;
    let mut last_err: Option<(u64, u64)> = None;
    let mut done = false;
    let start = Instant::now();
    let mut killed_at: Option<Instant> = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok([REC_ACK, i, _]) => {
                assert_eq!(i, acked, "acks out of order");
                acked = i + 1;
            }
            Ok([REC_ERR, step, e]) => last_err = Some((step, e)),
            Ok([REC_DONE, ..]) => done = true,
            Ok(r) => panic!("bad record from the writer: {r:?}"),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if killed_at.is_none() && acked >= KILL_AFTER {
            m.signal(libc::SIGKILL);
            killed_at = Some(Instant::now());
        }
        if killed_at.is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "writer fsync'd only {acked} chunks in 60 s (error {last_err:?}); stderr:\n{}",
                m.stderr()
            );
        }
        if let Some(t) = killed_at {
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "the writer still runs 15 s after SIGKILL of the daemon (hung in the dead mount?) \
                 acked={acked} last_err={last_err:?}"
            );
        }
    }
    let when = killed_at.unwrap_or_else(|| {
        panic!(
            "the writer ended before the daemon was killed: acked={acked} done={done} \
             error={last_err:?} ({}); stderr:\n{}",
            last_err.map(|(_, e)| ename2(e as i32)).unwrap_or_default(),
            m.stderr()
        )
    });
    let ended_after = when.elapsed();
    assert!(!done, "the writer finished all {MAX_CHUNKS} chunks");
    let (step, e) =
        last_err.expect("the writer exited after the daemon's death without reporting an error");
    let e = e as i32;
    eprintln!(
        "{name}: daemon SIGKILLed after {acked} fsync'd chunks; writer got {} at '{}' \
         (writer gone within {ended_after:?})",
        ename2(e),
        STEPS[step as usize]
    );
    // Over io_uring the kernel fails a request that was with the dead daemon's queue with
    // ECANCELED (its task is gone) instead of ECONNABORTED.
    // io_uring is what the test asks for, or what the daemon's default picks when the
    // kernel offers it (the transport is not pinned to /dev/fuse).
    let uring = match std::env::var("FENCEFS_TEST_TRANSPORT").as_deref() {
        Ok("io-uring") => true,
        Ok("dev-fuse") => false,
        _ => std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
            .is_ok_and(|v| v.trim() == "Y"),
    };
    let mut expected = vec![libc::ENOTCONN, libc::EIO, libc::ECONNABORTED];
    if uring {
        expected.push(libc::ECANCELED);
    }
    assert!(
        expected.contains(&e),
        "writer's error after the daemon died: expected ENOTCONN/EIO/ECONNABORTED (or ECANCELED over io_uring), got {} at '{}'",
        ename2(e),
        STEPS[step as usize]
    );
    let ws = writer
        .wait_timeout(Duration::from_secs(10))
        .expect("writer did not exit");
    assert!(
        libc::WIFEXITED(ws) && libc::WEXITSTATUS(ws) == 0,
        "writer status {ws:#x}"
    );
    let st = m
        .wait_exit(Duration::from_secs(10))
        .expect("daemon still alive 10 s after SIGKILL");
    assert_eq!(st.signal(), Some(libc::SIGKILL), "daemon status {st}");

    // --- the host: every fsync'd chunk is there; old content or a prefix of the new stream.
    let stream = new_stream(acked as usize + 1);
    let host = fs::read(m.host("target.bin")).unwrap();
    let l = prefix_len(&host, &stream);
    assert!(
        l >= acked as usize * CH,
        "target.bin: only {l} bytes of the new stream on the host, but {acked} chunks \
         ({} bytes) were fsync'd successfully",
        acked as usize * CH
    );
    assert_eq!(
        host.len(),
        l.max(old.len()),
        "target.bin: length is not max(new prefix {l}, old length {})",
        old.len()
    );
    if l < old.len() {
        assert!(
            host[l..] == old[l..],
            "target.bin: after the new prefix ({l} bytes) the host holds neither old nor new \
             bytes (first mismatch at {})",
            l + prefix_len(&host[l..], &old[l..])
        );
    }
    let host_new = fs::read(m.host("new.bin")).unwrap();
    let l2 = prefix_len(&host_new, &stream);
    assert_eq!(
        l2,
        host_new.len(),
        "new.bin: the host holds bytes that were never written (mismatch at {l2})"
    );
    assert!(
        l2 >= acked as usize * CH && l2 <= (acked as usize + 1) * CH,
        "new.bin: {l2} bytes on the host; {acked} chunks were fsync'd (at most one more was \
         written)"
    );
    eprintln!(
        "{name}: host target.bin = {l} new bytes + {} old bytes; new.bin = {l2} bytes \
         ({acked} chunks = {} bytes acknowledged)",
        host.len() - l,
        acked as usize * CH
    );
    assert_host_unchanged(&untouched, &m.host("untouched"), "untouched files");

    // --- the dead mount: ENOTCONN, then unmountable with fusermount3 -u.
    let mnt = m.mnt("");
    assert_eq!(
        ename(errno_of(&fs::metadata(&mnt))),
        "ENOTCONN",
        "stat of the dead mount point"
    );
    let o = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "fusermount3 -u of the dead mount: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!is_mounted(&mnt), "still mounted after fusermount3 -u");
    assert!(
        names(&mnt).unwrap().is_empty(),
        "the bare mount point is not empty"
    );

    // --- a fresh daemon mounts the same mount point and serves the files.
    let mut opts: Vec<OsString> = vec![
        "-p".into(),
        m.policy_path().into(),
        "-m".into(),
        "danger".into(),
    ];
    opts.extend(extra.iter().map(OsString::from));
    let mut d = Daemon::spawn(
        &[],
        &opts,
        &m.host(""),
        &mnt,
        m.root().join("daemon2.stderr"),
        WATCHDOG,
    );
    assert!(
        fs::read(mnt.join("target.bin")).unwrap() == host,
        "target.bin through the new mount differs from the host"
    );
    assert!(
        fs::read(mnt.join("new.bin")).unwrap() == host_new,
        "new.bin through the new mount differs from the host"
    );
    assert_eq!(
        fs::read(mnt.join("untouched/a.txt")).unwrap(),
        b"a\n",
        "untouched/a.txt through the new mount"
    );
    let mut f = fs::File::create(mnt.join("after.txt")).unwrap();
    f.write_all(b"after the crash\n").unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::read(m.host("after.txt")).unwrap(), b"after the crash\n");
    assert_eq!(
        names_str(&mnt).unwrap(),
        ["after.txt", "new.bin", "target.bin", "untouched"]
    );
    d.assert_alive("second daemon");
    let st = d
        .terminate()
        .expect("second daemon did not exit on SIGTERM");
    assert_eq!(st.code(), Some(0), "second daemon: stderr:\n{}", d.stderr());
    assert!(
        !is_mounted(&mnt),
        "still mounted after the second daemon exited"
    );
}

#[test]
fn sigkill_daemon_mid_write_passthrough() {
    kill9_mid_write("kill9-pt", &[]);
}

#[test]
fn sigkill_daemon_mid_write_no_passthrough() {
    kill9_mid_write("kill9-nopt", &["--no-passthrough"]);
}
