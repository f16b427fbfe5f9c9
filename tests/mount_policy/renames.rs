//! Renames, open flags and handles, uid rules.

use super::*;

// ------------------------------------------------------------------ renames

const RENAME_POLICY: &str = r#"
default = "write"

[[rule]]
path = "tree/inner"
access = "read"

[[rule]]
path = "moved/inner"
access = "read"

[[rule]]
path = "ro"
access = "read"

[[rule]]
path = "hid"
access = "none"
"#;

fn rename_layout(src: &Path) {
    put(&src.join("tree/inner/f"), b"tf\n", 0o644);
    put(&src.join("tree/other"), b"to\n", 0o644);
    put(&src.join("plain/inner/f"), b"pf\n", 0o644);
    put(&src.join("plain2/x"), b"p2\n", 0o644);
    put(&src.join("a"), b"A\n", 0o644);
    put(&src.join("b"), b"B\n", 0o644);
    put(&src.join("ro/c"), b"C\n", 0o644);
    put(&src.join("hid/h"), b"H\n", 0o644);
}

#[test]
fn directory_rename_never_changes_a_paths_policy() {
    let m = Mount::with(
        "rename-dir",
        Some(RENAME_POLICY),
        Some("danger"),
        rename_layout,
    );
    let src = m.host("");
    let before = snapshot(&src);
    assert_errno(
        fs::rename(m.mnt("tree"), m.mnt("tree2")),
        EACCES,
        "rename tree (has a read rule below)",
    )
    .ok();
    assert_host_unchanged(&before, &src, "rename tree");
    assert_errno(
        fs::rename(m.mnt("plain"), m.mnt("moved")),
        EACCES,
        "rename plain → moved (a rule below the new name)",
    )
    .ok();
    assert_host_unchanged(&before, &src, "rename plain → moved");
    assert_errno(
        fs::rename(m.mnt("plain"), m.mnt("tree/inner/p")),
        EACCES,
        "rename dir into a read area",
    )
    .ok();
    assert_host_unchanged(&before, &src, "rename plain → tree/inner/p");
    fs::rename(m.mnt("plain2"), m.mnt("plain3")).expect("rename a dir with no rule below");
    fs::rename(m.mnt("tree/other"), m.mnt("tree/other2")).expect("rename a file beside a rule");
    assert!(m.host("plain3/x").exists() && m.host("tree/other2").exists());
}

#[test]
fn rename_and_link_check_both_sides() {
    let m = Mount::with(
        "rename-sides",
        Some(RENAME_POLICY),
        Some("danger"),
        rename_layout,
    );
    let src = m.host("");
    let before = snapshot(&src);
    let e = |r: io::Result<()>, want: i32, what: &str| {
        assert_errno(r, want, what).ok();
        assert_host_unchanged(&before, &src, what);
    };
    e(
        fs::rename(m.mnt("a"), m.mnt("ro/c")),
        EACCES,
        "rename a over ro/c",
    );
    e(
        fs::rename(m.mnt("a"), m.mnt("ro/new")),
        EACCES,
        "rename a into ro/",
    );
    e(
        fs::rename(m.mnt("ro/c"), m.mnt("c")),
        EACCES,
        "rename ro/c out",
    );
    e(
        fs::rename(m.mnt("a"), m.mnt("hid/x")),
        ENOENT,
        "rename a into hidden dir",
    );
    e(
        fs::hard_link(m.mnt("ro/c"), m.mnt("c_link")),
        EACCES,
        "link from a read path",
    );
    e(
        fs::hard_link(m.mnt("a"), m.mnt("ro/a_link")),
        EACCES,
        "link into a read dir",
    );
    e(
        renameat2(&m.mnt("a"), &m.mnt("ro/c"), libc::RENAME_EXCHANGE),
        EACCES,
        "RENAME_EXCHANGE a <-> ro/c",
    );
    e(
        renameat2(&m.mnt("ro/c"), &m.mnt("a"), libc::RENAME_EXCHANGE),
        EACCES,
        "RENAME_EXCHANGE ro/c <-> a",
    );
    e(
        renameat2(&m.mnt("a"), &m.mnt("hid/h"), libc::RENAME_EXCHANGE),
        ENOENT,
        "RENAME_EXCHANGE with hidden",
    );
    e(
        renameat2(&m.mnt("a"), &m.mnt("b"), libc::RENAME_NOREPLACE),
        EEXIST,
        "RENAME_NOREPLACE onto existing b",
    );
    e(
        renameat2(&m.mnt("a"), &m.mnt("ro/new"), libc::RENAME_NOREPLACE),
        EACCES,
        "RENAME_NOREPLACE into ro/",
    );

    renameat2(&m.mnt("a"), &m.mnt("b"), libc::RENAME_EXCHANGE).expect("RENAME_EXCHANGE a <-> b");
    assert_eq!(fs::read(m.host("a")).unwrap(), b"B\n");
    assert_eq!(fs::read(m.host("b")).unwrap(), b"A\n");
    assert_eq!(
        read_all(&m.mnt("a")).unwrap(),
        b"B\n",
        "mount view after exchange"
    );
    renameat2(&m.mnt("a"), &m.mnt("n"), libc::RENAME_NOREPLACE)
        .expect("RENAME_NOREPLACE to a new name");
    assert_eq!(fs::read(m.host("n")).unwrap(), b"B\n");
    assert!(!m.host("a").exists());
    fs::hard_link(m.mnt("n"), m.mnt("n2")).expect("link between write paths");
    assert_eq!(fs::metadata(m.host("n")).unwrap().nlink(), 2);
}

#[test]
fn rename_in_read_only_mode_is_erofs() {
    let m = Mount::with(
        "rename-ro",
        Some(RENAME_POLICY),
        Some("read-only"),
        rename_layout,
    );
    let src = m.host("");
    let before = snapshot(&src);
    assert_errno(
        fs::rename(m.mnt("a"), m.mnt("z")),
        EROFS,
        "rename in read-only",
    )
    .ok();
    assert_errno(
        fs::rename(m.mnt("a"), m.mnt("ro/c")),
        EROFS,
        "rename onto read path in read-only",
    )
    .ok();
    assert_errno(
        renameat2(&m.mnt("a"), &m.mnt("b"), libc::RENAME_EXCHANGE),
        EROFS,
        "exchange in read-only",
    )
    .ok();
    assert_errno(
        fs::rename(m.mnt("a"), m.mnt("hid/z")),
        ENOENT,
        "rename into hidden in read-only",
    )
    .ok();
    assert_host_unchanged(&before, &src, "renames in read-only");
}

// ------------------------------------------------------------------ open flags & handles

#[test]
fn open_flags_on_a_read_path() {
    let policy = "default = \"read\"\n[[rule]]\npath = \"w\"\naccess = \"write\"\n";
    let m = Mount::with("openflags", Some(policy), Some("danger"), |s| {
        put(&s.join("r"), b"keep me\n", 0o644);
        put(&s.join("run.sh"), b"#!/bin/sh\necho script-ran\n", 0o755);
        put(&s.join("w"), b"w\n", 0o644);
    });
    let src = m.host("");
    let before = snapshot(&src);
    open_flags(&m.mnt("r"), libc::O_RDONLY, 0).expect("O_RDONLY on read");
    for (flags, what) in [
        (libc::O_WRONLY, "O_WRONLY"),
        (libc::O_RDWR, "O_RDWR"),
        (libc::O_WRONLY | libc::O_TRUNC, "O_WRONLY|O_TRUNC"),
        (libc::O_RDONLY | libc::O_TRUNC, "O_RDONLY|O_TRUNC"),
        (libc::O_WRONLY | libc::O_APPEND, "O_WRONLY|O_APPEND"),
        (libc::O_RDWR | libc::O_APPEND, "O_RDWR|O_APPEND"),
        (
            libc::O_CREAT | libc::O_WRONLY,
            "O_CREAT|O_WRONLY on existing",
        ),
    ] {
        assert_errno(
            open_flags(&m.mnt("r"), flags, 0o644),
            EACCES,
            &format!("{what} on a read path"),
        )
        .ok();
        assert_host_unchanged(&before, &src, what);
    }
    assert_eq!(
        fs::read(m.host("r")).unwrap(),
        b"keep me\n",
        "content intact after refused O_TRUNC"
    );
    let o = Command::new(m.mnt("run.sh"))
        .output()
        .expect("exec a read script");
    assert_eq!(o.stdout, b"script-ran\n");
    // A handle opened for reading cannot be used to write.
    let mut f = fs::File::open(m.mnt("r")).unwrap();
    assert_errno(
        f.write_all(b"x"),
        libc::EBADF,
        "write on an O_RDONLY handle",
    )
    .ok();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "keep me\n");
    // O_APPEND on a write path works and appends.
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(m.mnt("w"))
        .unwrap();
    f.write_all(b"more\n").unwrap();
    drop(f);
    assert_eq!(fs::read(m.host("w")).unwrap(), b"w\nmore\n");
}

// ------------------------------------------------------------------ uid rules

#[test]
fn uid_and_gid_rules_with_allow_other() {
    let policy = r#"
default = "write"

[[rule]]
path = "private"
access = "none"

[[rule]]
path = "private"
access = "read"
uid = [1000]

[[rule]]
path = "team"
access = "read"

[[rule]]
path = "team"
access = "write"
gid = [1000]
"#;
    let mut b = Mount::builder("uid")
        .policy(policy)
        .mode("danger")
        .arg("--allow-other");
    put(&b.host("private/f"), b"private-data\n", 0o644);
    put(&b.host("team/f"), b"team\n", 0o666);
    put(&b.host("pub/f"), b"pub\n", 0o644);
    for d in ["private", "team", "pub"] {
        fs::set_permissions(b.host(d), fs::Permissions::from_mode(0o777)).unwrap();
    }
    b = b.arg("--threads").arg("2");
    let m = b.start();
    let src = m.host("");

    // root: private is none.
    assert_errno(
        fs::symlink_metadata(m.mnt("private")),
        ENOENT,
        "root: lstat private",
    )
    .ok();
    // uid 1000 reads it.
    let o = m.sh_as(1000, "cat private/f");
    o.assert_ok("uid 1000: cat private/f");
    assert_eq!(o.stdout, "private-data\n");
    // Caches must not serve uid 1000's view to root, nor root's to uid 1000.
    for _ in 0..3 {
        assert_errno(
            fs::read(m.mnt("private/f")),
            ENOENT,
            "root after uid 1000 read private/f",
        )
        .ok();
        assert!(
            !names_str(&m.mnt(""))
                .unwrap()
                .contains(&"private".to_string()),
            "root sees private in listing"
        );
        let o = m.sh_as(1000, "cat private/f && ls");
        o.assert_ok("uid 1000 after root lookups");
        assert!(
            o.stdout.contains("private-data") && o.stdout.contains("private\n"),
            "{o:?}"
        );
    }
    // Other uids: no rule for them → none.
    let o = m.sh_as(1001, "cat private/f");
    o.assert_fail("uid 1001: cat private/f");
    assert!(
        o.stderr.contains("No such file or directory"),
        "uid 1001: {}",
        o.stderr
    );

    // gid rule: uid/gid 1000 may write team/, root (gid 0) only reads.
    let before = snapshot(&src);
    assert_errno(
        open_flags(&m.mnt("team/f"), libc::O_WRONLY | libc::O_APPEND, 0),
        EACCES,
        "root: append team/f",
    )
    .ok();
    assert_errno(
        fs::write(m.mnt("team/new"), b"x"),
        EACCES,
        "root: create in team/",
    )
    .ok();
    assert_host_unchanged(&before, &src, "root writes in team/");
    m.sh_as(1000, "echo more >> team/f && echo new > team/by1000")
        .assert_ok("uid 1000 writes team/");
    assert_eq!(fs::read(m.host("team/f")).unwrap(), b"team\nmore\n");
    let md = fs::metadata(m.host("team/by1000")).unwrap();
    assert_eq!(
        (md.uid(), md.gid()),
        (1000, 1000),
        "files created by uid 1000 belong to 1000:1000 on the host"
    );
    // default_permissions: the kernel also checks Unix perms for other uids.
    let o = m.sh_as(1000, "echo x >> pub/f");
    o.assert_fail("uid 1000 appending to a 0644 root file");
    assert!(o.stderr.contains("Permission denied"), "{}", o.stderr);
}

#[test]
fn without_allow_other_only_root_uses_the_mount() {
    let m = Mount::with(
        "no-allow-other",
        Some("default = \"write\"\n"),
        Some("danger"),
        |s| {
            put(&s.join("f"), b"f\n", 0o666);
        },
    );
    let o = m.sh_as(1000, "cat f");
    o.assert_fail("uid 1000 without --allow-other");
    assert!(o.stderr.contains("Permission denied"), "{}", o.stderr);
    assert_eq!(read_all(&m.mnt("f")).unwrap(), b"f\n");
}
