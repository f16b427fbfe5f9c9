//! 3. SOURCE emptied, renamed away and replaced, or deleted while mounted.

use super::*;

// ---------------------------------------------------------------- 3. SOURCE removed/replaced

/// What a caller may get once SOURCE is gone: the old data, or one of these.
const GONE: [i32; 2] = [libc::ENOENT, libc::ESTALE];

#[track_caller]
fn old_or_gone(r: io::Result<Vec<u8>>, old: &[u8], what: &str) {
    match r {
        Ok(v) => assert!(
            v == old,
            "{what}: got {:?}, expected the old content {:?} or ENOENT/ESTALE",
            String::from_utf8_lossy(&v),
            String::from_utf8_lossy(old)
        ),
        Err(e) => assert!(
            GONE.contains(&e.raw_os_error().unwrap_or(-1)),
            "{what}: unexpected error {e}"
        ),
    }
}

#[track_caller]
fn ok_or_gone<T: std::fmt::Debug>(r: &io::Result<T>, what: &str) {
    if let Err(e) = r {
        assert!(
            GONE.contains(&e.raw_os_error().unwrap_or(-1)),
            "{what}: unexpected error {e}"
        );
    }
}

#[test]
fn source_contents_removed_while_mounted() {
    let mut m = Mount::with("src-emptied", Some(POLICY_W), Some("danger"), |s| {
        put(&s.join("top.txt"), b"top\n", 0o644);
        put(&s.join("a/b/file"), b"deep\n", 0o644);
        for i in 0..50 {
            put(&s.join(format!("d/f{i:02}")), b"x", 0o644);
        }
    });
    // Warm every cache: names, attributes, the daemon's handles.
    assert_eq!(read_all(&m.mnt("top.txt")).unwrap(), b"top\n");
    assert_eq!(names(&m.mnt("d")).unwrap().len(), 50);
    let held = fs::File::open(m.mnt("a/b/file")).unwrap();
    let held_dir = fs::read_dir(m.mnt("d")).unwrap();

    for e in fs::read_dir(m.host("")).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            fs::remove_dir_all(&p).unwrap();
        } else {
            fs::remove_file(&p).unwrap();
        }
    }

    // Right away (kernel caches may still answer): old data or ENOENT/ESTALE.
    let r = read_all(&m.mnt("top.txt"));
    let seen_top = format!(
        "{:?}",
        r.as_ref().map(|v| String::from_utf8_lossy(v).into_owned())
    );
    old_or_gone(r, b"top\n", "read top.txt");
    let stat_ab = fs::metadata(m.mnt("a/b/file"));
    ok_or_gone(&stat_ab, "stat a/b/file");
    // The open handle keeps the unlinked file (as on a local disk) or answers an errno.
    let mut buf = [0u8; 16];
    let r = held.read_at(&mut buf, 0);
    let seen_held = format!(
        "{:?}",
        r.as_ref().map(|n| String::from_utf8_lossy(&buf[..*n]))
    );
    match r {
        Ok(n) => assert_eq!(&buf[..n], b"deep\n", "read through the held handle"),
        Err(e) => assert!(GONE.contains(&e.raw_os_error().unwrap_or(-1)), "{e}"),
    }
    let rest: Vec<_> = held_dir.collect();
    for r in &rest {
        ok_or_gone(r, "readdir of the held directory handle");
    }
    eprintln!(
        "emptied SOURCE, right after: read top.txt {seen_top}; stat a/b/file {:?}; read of a \
         held handle {seen_held}; rest of a held readdir: {} entries",
        stat_ab.as_ref().map(|_| "ok"),
        rest.len()
    );
    m.assert_alive("right after the host emptied SOURCE");

    // Soon every old name is gone through the mount.
    assert!(
        eventually(Duration::from_secs(5), || names(&m.mnt(""))
            .is_ok_and(|v| v.is_empty())),
        "root listing after the host emptied SOURCE: {:?}",
        names_str(&m.mnt(""))
    );
    for p in ["top.txt", "a/b/file", "d/f00", "d"] {
        assert!(
            eventually(Duration::from_secs(5), || errno_of(&fs::metadata(m.mnt(p)))
                == libc::ENOENT),
            "stat {p} after the host removed it: {:?}",
            fs::metadata(m.mnt(p)).map(|_| ())
        );
    }

    // The daemon keeps serving: new files, recreated paths.
    fs::write(m.mnt("new.txt"), b"new\n").unwrap();
    assert_eq!(fs::read(m.host("new.txt")).unwrap(), b"new\n");
    fs::create_dir_all(m.mnt("a/b")).unwrap();
    fs::write(m.mnt("a/b/file"), b"again\n").unwrap();
    assert_eq!(read_all(&m.mnt("a/b/file")).unwrap(), b"again\n");
    assert_eq!(fs::read(m.host("a/b/file")).unwrap(), b"again\n");
    // A name recreated on the host shows the new file, never the old one.
    fs::write(m.host("top.txt"), b"top v2\n").unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            let r = read_all(&m.mnt("top.txt"));
            if let Ok(v) = &r {
                assert_ne!(
                    v.as_slice(),
                    b"top\n",
                    "the removed file's content came back"
                );
            }
            r.is_ok_and(|v| v == b"top v2\n")
        }),
        "top.txt recreated on the host: {:?}",
        read_all(&m.mnt("top.txt"))
    );
    drop(held);
    m.assert_alive("after the host emptied SOURCE");
    assert!(m.is_mounted());
    let st = m.terminate().expect("no exit on SIGTERM");
    assert_eq!(st.code(), Some(0), "stderr:\n{}", m.stderr());
}

#[test]
fn source_renamed_away_and_replaced_while_mounted() {
    let mut m = Mount::with("src-replaced", Some(POLICY_W), Some("danger"), |s| {
        put(&s.join("top.txt"), b"old top\n", 0o644);
        put(&s.join("sub/x"), b"old x\n", 0o644);
    });
    assert_eq!(read_all(&m.mnt("top.txt")).unwrap(), b"old top\n");
    assert_eq!(names_str(&m.mnt("")).unwrap(), ["sub", "top.txt"]);

    let src = m.host("");
    let old = m.root().join("src.old");
    fs::rename(&src, &old).unwrap();
    fs::create_dir(&src).unwrap();
    put(&src.join("top.txt"), b"NEW top\n", 0o644);
    put(&src.join("only-new"), b"n\n", 0o644);
    put(&src.join("sub/x"), b"NEW x\n", 0o644);

    // SOURCE is held by handle: the old directory keeps being served (or errnos come back);
    // the new directory at the same path is never served.
    let mut outcomes = vec![];
    for round in 0..2 {
        ok_or_gone(&fs::metadata(m.mnt("")), "stat of the mount root");
        match names_str(&m.mnt("")) {
            Ok(v) => assert_eq!(v, ["sub", "top.txt"], "root listing (round {round})"),
            Err(e) => assert!(GONE.contains(&e.raw_os_error().unwrap_or(-1)), "{e}"),
        }
        let r = read_all(&m.mnt("top.txt"));
        outcomes.push(format!("top.txt: {:?}", r.as_ref().map(|v| v.len())));
        old_or_gone(r, b"old top\n", "read top.txt");
        old_or_gone(read_all(&m.mnt("sub/x")), b"old x\n", "read sub/x");
        let r = fs::metadata(m.mnt("only-new"));
        assert!(
            r.is_err(),
            "only-new (a file of the replacement directory) is visible"
        );
        ok_or_gone(&r, "stat only-new");
        // After the kernel's TTL everything is asked of the daemon again.
        thread::sleep(Duration::from_millis(1200));
    }
    match fs::write(m.mnt("w.txt"), b"w\n") {
        Ok(()) => {
            assert_eq!(fs::read(old.join("w.txt")).unwrap(), b"w\n");
            assert!(
                !src.join("w.txt").exists(),
                "a write reached the new SOURCE"
            );
        }
        Err(e) => assert!(GONE.contains(&e.raw_os_error().unwrap_or(-1)), "{e}"),
    }
    eprintln!("renamed-away SOURCE: {outcomes:?}");
    m.assert_alive("after SOURCE was replaced");
    assert!(m.is_mounted());
    let st = m.terminate().expect("no exit on SIGTERM");
    assert_eq!(st.code(), Some(0), "stderr:\n{}", m.stderr());
}

#[test]
fn source_directory_deleted_while_mounted() {
    let mut m = Mount::with("src-deleted", Some(POLICY_W), Some("danger"), |s| {
        put(&s.join("top.txt"), b"top\n", 0o644);
        put(&s.join("sub/x"), b"x\n", 0o644);
    });
    assert_eq!(read_all(&m.mnt("top.txt")).unwrap(), b"top\n");
    assert_eq!(read_all(&m.mnt("sub/x")).unwrap(), b"x\n");
    fs::remove_dir_all(m.host("")).unwrap();

    let root_st = fs::metadata(m.mnt(""));
    ok_or_gone(&root_st, "stat of the mount root");
    let listing = names(&m.mnt(""));
    match &listing {
        Ok(v) => assert!(v.is_empty(), "listing of a deleted SOURCE: {v:?}"),
        Err(e) => assert!(GONE.contains(&e.raw_os_error().unwrap_or(-1)), "{e}"),
    }
    let top = read_all(&m.mnt("top.txt"));
    eprintln!(
        "deleted SOURCE: stat root {:?}; listing {:?}; read top.txt {:?}",
        root_st.as_ref().map(|_| "ok"),
        listing.as_ref().map(|v| v.len()),
        top.as_ref()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    );
    old_or_gone(top, b"top\n", "read top.txt");
    assert!(
        eventually(Duration::from_secs(5), || errno_of(&fs::metadata(
            m.mnt("top.txt")
        )) == libc::ENOENT),
        "stat top.txt in the deleted SOURCE: {:?}",
        fs::metadata(m.mnt("top.txt")).map(|_| ())
    );
    // Nothing can be created in a deleted directory.
    let r = fs::write(m.mnt("new.txt"), b"n");
    eprintln!("deleted SOURCE: create -> {r:?}");
    assert!(r.is_err(), "create in a deleted SOURCE succeeded");
    ok_or_gone(&r, "create in a deleted SOURCE");
    let r = fs::create_dir(m.mnt("newdir"));
    assert!(r.is_err(), "mkdir in a deleted SOURCE succeeded");
    ok_or_gone(&r, "mkdir in a deleted SOURCE");
    assert!(
        !m.host("").exists(),
        "the deleted SOURCE came back on the host"
    );
    m.assert_alive("after SOURCE was deleted");
    assert!(m.is_mounted());
    ok_or_gone(&fs::metadata(m.mnt("")), "stat of the mount root");
    let st = m.terminate().expect("no exit on SIGTERM");
    assert_eq!(st.code(), Some(0), "stderr:\n{}", m.stderr());
    assert!(!m.is_mounted());
}
