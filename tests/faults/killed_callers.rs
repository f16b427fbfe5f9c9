//! 4. Callers SIGKILLed mid-operation leave no handle behind.

use super::*;

// ---------------------------------------------------------------- 4. killed callers

const BIGF: usize = 32 << 20;
const IOB: usize = 256 << 10;
const REC_OPEN: u64 = 1;
const REC_IO: u64 = 2;

/// Forked caller: opens the big file twice, `w.bin` for writing and the directory `d`, then
/// reads / writes / lists forever (dropping cached pages so reads reach the file system).
fn caller_child(
    big: &CStr,
    w: &CStr,
    d: &CStr,
    buf: &mut [u8],
    dents: &mut [u8],
    out: i32,
    write_mode: bool,
) -> i32 {
    // SAFETY: open(2) on NUL-terminated paths prepared before the fork.
    let fds = unsafe {
        [
            libc::open(big.as_ptr(), libc::O_RDONLY),
            libc::open(big.as_ptr(), libc::O_RDONLY),
            libc::open(w.as_ptr(), libc::O_RDWR),
            libc::open(d.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY),
        ]
    };
    if fds.iter().any(|&f| f < 0) {
        report(out, [REC_ERR, 0, errno() as u64]);
        return 1;
    }
    report(out, [REC_OPEN, 0, 0]);
    let mut off = 0usize;
    let mut n = 0u64;
    loop {
        // SAFETY: raw syscalls on fds this child opened and on buffers prepared before the
        // fork, each given its true length.
        unsafe {
            if write_mode {
                libc::pwrite(fds[2], buf.as_ptr().cast(), buf.len(), off as libc::off_t);
                if n.is_multiple_of(8) {
                    libc::fsync(fds[2]);
                }
                off = (off + buf.len()) % (8 << 20);
            } else {
                let r = libc::pread(fds[0], buf.as_mut_ptr().cast(), buf.len(), off as i64);
                libc::pread(fds[1], buf.as_mut_ptr().cast(), 4096, 0);
                off += buf.len();
                if r <= 0 || off >= BIGF {
                    off = 0;
                    libc::posix_fadvise(fds[0], 0, 0, libc::POSIX_FADV_DONTNEED);
                }
            }
            libc::lseek(fds[3], 0, libc::SEEK_SET);
            libc::syscall(
                libc::SYS_getdents64,
                fds[3],
                dents.as_mut_ptr(),
                dents.len(),
            );
        }
        if n < 8 {
            report(out, [REC_IO, n, 0]);
        }
        n += 1;
    }
}

/// `held`: host files the daemon holds open while the caller has its four files open: the
/// regular files without kernel passthrough, none with it (the kernel holds their backing
/// files); an open directory is read through the node's `O_PATH` handle, opened for reading
/// only while a listing is read.
fn killed_callers(name: &str, extra: &[&str], held: usize) {
    let mut b = Mount::builder(name).policy(POLICY_W).mode("danger");
    for a in extra {
        b = b.arg(*a);
    }
    put(&b.host("big.bin"), &pseudo_random(BIGF, 11), 0o644);
    put(&b.host("w.bin"), &vec![0u8; 1 << 20], 0o644);
    for i in 0..20 {
        put(&b.host(format!("d/f{i:02}")), b"x", 0o644);
    }
    let mut m = b.start();
    let pid = m.pid();
    let src = m.host("");
    // Look every name up once, so the baseline has the same cached O_PATH handles.
    let mut f = fs::File::open(m.mnt("big.bin")).unwrap();
    let mut head = [0u8; 4096];
    f.read_exact(&mut head).unwrap();
    drop(f);
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.mnt("w.bin"))
        .unwrap();
    assert_eq!(names(&m.mnt("d")).unwrap().len(), 20);
    assert!(
        eventually(Duration::from_secs(5), || open_host_files(pid, &src)
            .is_empty()),
        "handles still open before the test: {:?}",
        open_host_files(pid, &src)
    );
    let base = fd_count(pid);

    let big_c = cpath(&m.mnt("big.bin"));
    let w_c = cpath(&m.mnt("w.bin"));
    let d_c = cpath(&m.mnt("d"));
    let mut buf = vec![0x42u8; IOB];
    let mut dents = vec![0u8; 64 << 10];
    let mut peak = 0;
    for round in 0..12u64 {
        let write_mode = round % 2 == 1;
        let (rd, wr) = pipe();
        let wfd = wr.as_raw_fd();
        let mut child = Forked::spawn(|| {
            caller_child(&big_c, &w_c, &d_c, &mut buf, &mut dents, wfd, write_mode)
        });
        drop(wr);
        let rx = records(rd);
        // Wait until the child holds its four files and has done some I/O.
        let start = Instant::now();
        let mut ios = 0;
        while ios < 3 {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok([REC_OPEN, ..]) => {}
                Ok([REC_IO, ..]) => ios += 1,
                Ok(r) => panic!(
                    "round {round}: caller failed: {r:?} ({})",
                    ename2(r[2] as i32)
                ),
                Err(e) => panic!("round {round}: caller silent: {e:?}"),
            }
            assert!(start.elapsed() < Duration::from_secs(20));
        }
        let during = open_host_files(pid, &src);
        peak = peak.max(fd_count(pid));
        assert!(
            during.len() >= held,
            "round {round}: the daemon should hold {held} of the caller's 4 open files: {during:?}"
        );
        // Vary the moment of the kill within the I/O loop.
        thread::sleep(Duration::from_millis((round % 4) * 7));
        child.kill();
        let st = child
            .wait_timeout(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("round {round}: the killed caller did not exit"));
        assert!(
            libc::WIFSIGNALED(st) && libc::WTERMSIG(st) == libc::SIGKILL,
            "caller status {st:#x}"
        );
        drop(child);
        let released = eventually(Duration::from_secs(10), || {
            open_host_files(pid, &src).is_empty() && fd_count(pid) <= base
        });
        assert!(
            released,
            "round {round} ({}): 10 s after SIGKILL of the caller the daemon still holds \
             {:?}; fds {} vs baseline {base}",
            if write_mode { "mid-write" } else { "mid-read" },
            open_host_files(pid, &src),
            fd_count(pid)
        );
        m.assert_alive("after a killed caller");
    }
    eprintln!(
        "{name}: daemon fds baseline {base}, peak {peak} with a caller, {} at the end",
        fd_count(pid)
    );
    // Still serving.
    assert_eq!(read_all(&m.mnt("d/f00")).unwrap(), b"x");
    let st = m.terminate().expect("no exit on SIGTERM");
    assert_eq!(st.code(), Some(0), "stderr:\n{}", m.stderr());
}

#[test]
fn killed_callers_leak_no_handles_passthrough() {
    killed_callers("killed-callers-pt", &[], 0);
}

#[test]
fn killed_callers_leak_no_handles_no_passthrough() {
    killed_callers("killed-callers-nopt", &["--no-passthrough"], 3);
}
