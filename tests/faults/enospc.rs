//! 2. ENOSPC from a full host file system reaches the caller unchanged.

use super::*;

// ---------------------------------------------------------------- 2. ENOSPC

/// SOURCE on a tmpfs. Drop order: stop the daemon, unmount the tmpfs, then let the fixture
/// remove the directories.
struct TmpfsSource {
    m: Option<Mount>,
    dir: PathBuf,
    root: PathBuf,
    mnt: PathBuf,
}

impl TmpfsSource {
    fn mount(dir: &Path, root: &Path, opts: &str) -> TmpfsSource {
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", opts, "fencefs-faults"])
                .arg(dir),
            "mount -t tmpfs",
        );
        TmpfsSource {
            m: None,
            dir: dir.to_path_buf(),
            root: root.to_path_buf(),
            mnt: root.join("mp/mnt"),
        }
    }
    fn m(&mut self) -> &mut Mount {
        self.m.as_mut().unwrap()
    }
}

impl Drop for TmpfsSource {
    fn drop(&mut self) {
        let m = self.m.take();
        if let Some(mut m) = m {
            m.terminate();
            if m.is_mounted() {
                let _ = Command::new("fusermount3")
                    .arg("-u")
                    .arg("-z")
                    .arg(m.mnt(""))
                    .status();
            }
            self.umount();
            drop(m);
        } else {
            self.umount();
            if self.root.exists() && !is_mounted(&self.mnt) && !is_mounted(&self.dir) {
                let _ = fs::remove_dir_all(&self.root);
            }
        }
    }
}

impl TmpfsSource {
    fn umount(&self) {
        if !is_mounted(&self.dir) {
            return;
        }
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

fn enospc(name: &str, extra: &[&str]) {
    let mut b = Mount::builder(name).policy(POLICY_W).mode("danger");
    for a in extra {
        b = b.arg(*a);
    }
    let src = b.host("");
    let root = b.root().to_path_buf();
    let mut t = TmpfsSource::mount(&src, &root, "size=1m,nr_inodes=64,mode=0755");
    put(&b.host("keep.txt"), b"keep\n", 0o644);
    t.m = Some(b.start());
    let io_path = if t.m().stderr().contains("file I/O: kernel passthrough") {
        "kernel passthrough"
    } else {
        "through the daemon"
    };
    if extra.contains(&"--no-passthrough") {
        assert_eq!(
            io_path, "through the daemon",
            "--no-passthrough was ignored"
        );
    }
    eprintln!("{name}: file I/O {io_path}");
    let m = t.m();

    // Data: write until the tmpfs is full.
    let chunk = vec![0x5au8; 64 * 1024];
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.mnt("fill"))
        .unwrap();
    let mut written = 0usize;
    let err = loop {
        match f.write(&chunk) {
            Ok(0) => panic!("write returned 0"),
            Ok(n) => written += n,
            Err(e) => break e,
        }
        assert!(
            written <= 64 << 20,
            "no error after 64 MiB written to a 1 MiB tmpfs"
        );
    };
    eprintln!("{name}: write failed with {err} after {written} bytes");
    assert_eq!(
        ename2(err.raw_os_error().unwrap_or(-1)),
        "ENOSPC",
        "write to a full host file system ({err})"
    );
    assert!(written <= 1 << 20, "{written} bytes fit on a 1 MiB tmpfs?");
    assert!(written >= 512 << 10, "only {written} bytes before ENOSPC");
    assert_eq!(
        fs::metadata(m.host("fill")).unwrap().len(),
        written as u64,
        "host size of the filled file = bytes the caller was told were written"
    );
    // A second write after ENOSPC fails the same way (no hang, no other errno).
    assert_eq!(
        ename2(errno_of(&f.write_all(&chunk))),
        "ENOSPC",
        "second write to the full file system"
    );
    drop(f);

    // fallocate beyond the free space.
    let f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.mnt("falloc"))
        .unwrap();
    // SAFETY: fallocate(2) on an fd we own.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 4 << 20) };
    let fe = if rc == 0 { 0 } else { errno() };
    assert_eq!(ename2(fe), "ENOSPC", "fallocate 4 MiB on a full tmpfs");
    drop(f);

    // Inodes: create until the tmpfs has none left (nr_inodes=64).
    let mut created = 0;
    let ierr = loop {
        match fs::File::create(m.mnt(format!("i{created:03}"))) {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
        assert!(created <= 100, "created {created} files with nr_inodes=64");
    };
    assert_eq!(
        ename2(ierr.raw_os_error().unwrap_or(-1)),
        "ENOSPC",
        "create with no inode left ({ierr})"
    );
    assert_eq!(
        ename2(errno_of(&fs::create_dir(m.mnt("newdir")))),
        "ENOSPC",
        "mkdir with no inode left"
    );
    assert_eq!(
        ename2(errno_of(&std::os::unix::fs::symlink(
            "keep.txt",
            m.mnt("newlink")
        ))),
        "ENOSPC",
        "symlink with no inode left"
    );
    eprintln!("{name}: {created} files created before ENOSPC (inodes)");

    // The daemon keeps serving.
    m.assert_alive("after ENOSPC");
    assert!(m.is_mounted());
    assert_eq!(read_all(&m.mnt("keep.txt")).unwrap(), b"keep\n");
    fs::remove_file(m.mnt("fill")).unwrap();
    fs::remove_file(m.mnt("falloc")).unwrap();
    for i in 0..created {
        fs::remove_file(m.mnt(format!("i{i:03}"))).unwrap();
    }
    assert_eq!(names_str(&m.mnt("")).unwrap(), ["keep.txt"]);
    let data = pseudo_random(300 << 10, 3);
    // The removed files' blocks are freed when the daemon closes its last handle of them,
    // at the kernel's FORGET, which a loaded machine may send a little later.
    let mut last = None;
    let written = eventually(Duration::from_secs(10), || {
        match fs::write(m.mnt("after.bin"), &data) {
            Ok(()) => true,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                last = Some(e);
                false
            }
        }
    });
    assert!(written, "space never came back: {last:?}");
    assert!(read_all(&m.mnt("after.bin")).unwrap() == data);
    assert!(fs::read(m.host("after.bin")).unwrap() == data);
    // The removed files' inodes come back the same way (CI saw a mkdir right after the
    // write still find none).
    let mut last = None;
    let made = eventually(Duration::from_secs(10), || {
        match fs::create_dir(m.mnt("newdir")) {
            Ok(()) => true,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                last = Some(e);
                false
            }
        }
    });
    assert!(made, "inodes never came back: {last:?}");
    let st = m.terminate().expect("daemon did not exit on SIGTERM");
    assert_eq!(st.code(), Some(0), "stderr:\n{}", m.stderr());
}

#[test]
fn enospc_passes_through_passthrough() {
    enospc("enospc-pt", &[]);
}

#[test]
fn enospc_passes_through_no_passthrough() {
    enospc("enospc-nopt", &["--no-passthrough"]);
}
