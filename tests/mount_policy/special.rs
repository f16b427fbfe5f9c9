//! EPERM for devices and set-ID bits, and the mode ceiling.

use super::*;

// ------------------------------------------------------------------ EPERM: devices, setid

const SETID_POLICY: &str = r#"
default = "write"

[[rule]]
path = "ro"
access = "read"

[[rule]]
path = "hid"
access = "none"
"#;

fn setid_layout(src: &Path) {
    put(&src.join("f"), b"f\n", 0o755);
    mkdirp(&src.join("d"));
    put(&src.join("ro/f"), b"ro\n", 0o755);
    put(&src.join("hid/f"), b"hid\n", 0o755);
}

#[test]
fn devices_and_setid_are_eperm() {
    for mode in ["danger", "workspace-write", "read-only"] {
        let m = Mount::with(
            &format!("eperm-{mode}"),
            Some(SETID_POLICY),
            Some(mode),
            setid_layout,
        );
        let src = m.host("");
        let before = snapshot(&src);
        let e = |r: io::Result<()>, want: i32, what: &str| {
            assert_errno(r, want, &format!("[{mode}] {what}")).ok();
            assert_host_unchanged(&before, &src, &format!("[{mode}] {what}"));
        };
        e(
            open_flags(
                &m.mnt("suid"),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                0o4755,
            ),
            EPERM,
            "create 04755",
        );
        e(
            open_flags(
                &m.mnt("sgid"),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                0o2755,
            ),
            EPERM,
            "create 02755",
        );
        e(chmod(&m.mnt("f"), 0o4755), EPERM, "chmod 04755 f");
        e(chmod(&m.mnt("f"), 0o2755), EPERM, "chmod 02755 f");
        e(chmod(&m.mnt("d"), 0o2755), EPERM, "chmod 02755 d");
        e(
            mknod(&m.mnt("cdev"), libc::S_IFCHR | 0o644, libc::makedev(1, 3)),
            EPERM,
            "mknod char 1,3",
        );
        e(
            mknod(&m.mnt("bdev"), libc::S_IFBLK | 0o644, libc::makedev(7, 0)),
            EPERM,
            "mknod block 7,0",
        );
        // Order: EPERM comes before EROFS (mode) and EACCES (rule), after ENOENT (none).
        e(
            chmod(&m.mnt("ro/f"), 0o4755),
            EPERM,
            "chmod 04755 on a read path",
        );
        e(
            mknod(
                &m.mnt("ro/cdev"),
                libc::S_IFCHR | 0o644,
                libc::makedev(1, 3),
            ),
            EPERM,
            "mknod char in a read dir",
        );
        e(
            chmod(&m.mnt("hid/f"), 0o4755),
            ENOENT,
            "chmod 04755 on a hidden path",
        );
        // mkdir: the VFS strips S_ISGID/S_ISUID from mkdir's mode before FUSE sees it; either
        // way, no setgid directory may appear on the host.
        let r = mkdir_mode(&m.mnt("sgdir"), 0o2755);
        if mode == "danger" || mode == "workspace-write" {
            match r {
                Ok(()) => {
                    let md = fs::symlink_metadata(m.host("sgdir")).unwrap();
                    assert_eq!(
                        md.mode() & 0o6000,
                        0,
                        "[{mode}] mkdir 02755 left setid bits on the host: {:o}",
                        md.mode()
                    );
                    fs::remove_dir(m.mnt("sgdir")).unwrap();
                }
                Err(err) => assert_eq!(
                    err.raw_os_error(),
                    Some(EPERM),
                    "[{mode}] mkdir 02755: {err}"
                ),
            }
        } else {
            assert_errno(r, EROFS, "[read-only] mkdir 02755").ok();
        }
        assert_host_unchanged(&before, &src, &format!("[{mode}] all EPERM cases"));
        if mode != "read-only" {
            // A FIFO is not a device, and plain modes are fine.
            mknod(&m.mnt("fifo"), libc::S_IFIFO | 0o644, 0).expect("mknod fifo");
            assert!(
                fs::symlink_metadata(m.host("fifo"))
                    .unwrap()
                    .file_type()
                    .is_fifo()
            );
            chmod(&m.mnt("f"), 0o700).expect("plain chmod");
            assert_eq!(fs::metadata(m.host("f")).unwrap().mode() & 0o7777, 0o700);
        }
    }
}

#[test]
fn allow_setid_and_allow_devices() {
    let policy = "default = \"write\"\nallow_setid = true\nallow_devices = true\n";
    let m = Mount::with("eperm-allowed", Some(policy), Some("danger"), setid_layout);
    chmod(&m.mnt("f"), 0o4755).expect("chmod 04755 with allow_setid");
    assert_eq!(fs::metadata(m.host("f")).unwrap().mode() & 0o7777, 0o4755);
    open_flags(
        &m.mnt("suid"),
        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
        0o4755,
    )
    .expect("create 04755 with allow_setid");
    assert_eq!(
        fs::metadata(m.host("suid")).unwrap().mode() & 0o4000,
        0o4000,
        "host lost the setuid bit"
    );
    mknod(&m.mnt("cdev"), libc::S_IFCHR | 0o644, libc::makedev(1, 3))
        .expect("mknod with allow_devices");
    let md = fs::symlink_metadata(m.host("cdev")).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), libc::makedev(1, 3));
    // The mount itself stays nosuid,nodev: the device cannot be opened through it.
    let opts = mount_options(&m.mnt("")).unwrap();
    assert!(
        opts.contains("nosuid") && opts.contains("nodev"),
        "mount options: {opts}"
    );
    assert_errno(
        fs::File::open(m.mnt("cdev")),
        libc::EACCES,
        "open a device on a nodev mount",
    )
    .ok();
}

// ------------------------------------------------------------------ mode ceiling

fn git_like(src: &Path) {
    put(
        &src.join(".git/hooks/pre-commit.sample"),
        b"#!/bin/sh\n",
        0o755,
    );
    put(&src.join(".git/config"), b"[core]\n\tbare = false\n", 0o644);
    put(&src.join(".git/HEAD"), b"ref: refs/heads/main\n", 0o644);
    put(&src.join("src/main.rs"), b"fn main() {}\n", 0o644);
    put(&src.join("ci/build.sh"), b"#!/bin/sh\n", 0o755);
    mkdirp(&src.join("out"));
    put(&src.join("x"), b"x\n", 0o644);
}

#[test]
fn workspace_write_protects_git_hooks_and_config_by_default() {
    let m = Mount::with(
        "protected",
        Some("mode = \"workspace-write\"\n"),
        None,
        git_like,
    );
    let src = m.host("");
    let before = snapshot(&src);
    let e = |r: io::Result<()>, want: i32, what: &str| {
        assert_errno(r, want, what).ok();
        assert_host_unchanged(&before, &src, what);
    };
    e(
        open_flags(
            &m.mnt(".git/hooks/pre-commit"),
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            0o755,
        ),
        EROFS,
        "create .git/hooks/pre-commit",
    );
    e(
        open_flags(&m.mnt(".git/hooks/pre-commit.sample"), libc::O_WRONLY, 0),
        EROFS,
        "open hook sample O_WRONLY",
    );
    e(
        chmod(&m.mnt(".git/hooks/pre-commit.sample"), 0o700),
        EROFS,
        "chmod hook sample",
    );
    e(
        fs::remove_file(m.mnt(".git/hooks/pre-commit.sample")),
        EROFS,
        "unlink hook sample",
    );
    e(
        fs::rename(
            m.mnt(".git/hooks/pre-commit.sample"),
            m.mnt(".git/hooks/pre-commit"),
        ),
        EROFS,
        "rename inside hooks",
    );
    e(
        fs::rename(m.mnt(".git/hooks"), m.mnt(".git/hooks.old")),
        EROFS,
        "rename .git/hooks away",
    );
    e(
        open_flags(&m.mnt(".git/config"), libc::O_WRONLY | libc::O_APPEND, 0),
        EROFS,
        "append to .git/config",
    );
    e(
        open_flags(&m.mnt(".git/config"), libc::O_WRONLY | libc::O_TRUNC, 0),
        EROFS,
        "truncate .git/config",
    );
    e(
        fs::rename(m.mnt("x"), m.mnt(".git/config")),
        EROFS,
        "rename over .git/config",
    );
    e(
        fs::rename(m.mnt(".git/config"), m.mnt(".git/config.old")),
        EROFS,
        "rename .git/config away",
    );
    e(
        fs::remove_file(m.mnt(".git/config")),
        EROFS,
        "unlink .git/config",
    );
    e(
        fs::hard_link(m.mnt("x"), m.mnt(".git/hooks/post-checkout")),
        EROFS,
        "link into hooks",
    );
    e(
        std::os::unix::fs::symlink("/bin/true", m.mnt(".git/hooks/pre-push")),
        EROFS,
        "symlink into hooks",
    );
    // Renaming .git would move the protected paths out from under their protection.
    let r = fs::rename(m.mnt(".git"), m.mnt("dotgit"));
    assert!(
        matches!(errno_of(&r), EROFS | EACCES),
        "rename .git → dotgit must be refused (EROFS or EACCES), got {}",
        ename(errno_of(&r))
    );
    assert_host_unchanged(&before, &src, "rename .git");
    // Reading them is fine.
    assert_eq!(
        read_all(&m.mnt(".git/config")).unwrap(),
        b"[core]\n\tbare = false\n"
    );
    // Everything else in the workspace is writable.
    fs::write(m.mnt(".git/HEAD"), b"ref: refs/heads/dev\n").expect("write .git/HEAD");
    fs::write(m.mnt(".git/config.lock"), b"lock").expect("create .git/config.lock");
    fs::write(m.mnt("src/main.rs"), b"fn main() { }\n").expect("write src/main.rs");
    assert_eq!(
        fs::read(m.host(".git/HEAD")).unwrap(),
        b"ref: refs/heads/dev\n"
    );
}

#[test]
fn workspace_write_writable_roots_and_custom_protected() {
    let policy = "mode = \"workspace-write\"\nwritable_roots = [\"out\", \"src\"]\nprotected = [\"src/gen\"]\n";
    let m = Mount::with("roots", Some(policy), None, git_like);
    let src = m.host("");
    let before = snapshot(&src);
    let e = |r: io::Result<()>, want: i32, what: &str| {
        assert_errno(r, want, what).ok();
        assert_host_unchanged(&before, &src, what);
    };
    e(
        fs::write(m.mnt("new"), b"n"),
        EROFS,
        "create at root (outside writable roots)",
    );
    e(
        fs::write(m.mnt("ci/build.sh"), b"n"),
        EROFS,
        "write ci/build.sh (outside writable roots)",
    );
    e(
        mkdir_mode(&m.mnt("ci/d"), 0o755),
        EROFS,
        "mkdir outside writable roots",
    );
    e(
        fs::rename(m.mnt("out"), m.mnt("out2")),
        EROFS,
        "rename a writable root itself from outside",
    );
    e(
        fs::write(m.mnt("src/gen"), b"n"),
        EROFS,
        "create protected src/gen",
    );
    e(
        fs::rename(m.mnt("src/main.rs"), m.mnt("x2")),
        EROFS,
        "rename out of a writable root",
    );
    e(
        fs::rename(m.mnt("x"), m.mnt("out/x")),
        EROFS,
        "rename into a writable root from outside",
    );
    fs::write(m.mnt("out/a"), b"a").expect("create in writable root out/");
    fs::write(m.mnt("src/main.rs"), b"//\n").expect("write in writable root src/");
    fs::rename(m.mnt("out/a"), m.mnt("src/a")).expect("rename between writable roots");
    assert_eq!(fs::read(m.host("src/a")).unwrap(), b"a");

    // An explicit `protected` replaces the default: .git/hooks is writable when "." is a root.
    let policy = "mode = \"workspace-write\"\nprotected = [\"ci\"]\n";
    let m = Mount::with("roots-protected", Some(policy), None, git_like);
    fs::write(m.mnt(".git/hooks/pre-commit"), b"#!/bin/sh\n")
        .expect("explicit protected list replaces the default");
    assert_errno(
        fs::write(m.mnt("ci/build.sh"), b"n"),
        EROFS,
        "write protected ci/build.sh",
    )
    .ok();
}

#[test]
fn danger_ignores_writable_roots_and_protected() {
    let policy = "mode = \"workspace-write\"\nwritable_roots = [\"out\"]\n";
    let m = Mount::with("danger-ceiling", Some(policy), Some("danger"), git_like);
    fs::write(m.mnt(".git/hooks/pre-commit"), b"#!/bin/sh\n").expect("danger: write hook");
    fs::write(m.mnt(".git/config"), b"[core]\n").expect("danger: write config");
    fs::write(m.mnt("new"), b"n").expect("danger: write outside writable roots");
    assert_eq!(
        fs::read(m.host(".git/hooks/pre-commit")).unwrap(),
        b"#!/bin/sh\n"
    );
}

#[test]
fn no_policy_means_read_only_default_read() {
    let m = Mount::with("nopolicy", None, None, git_like);
    let src = m.host("");
    let before = snapshot(&src);
    assert_eq!(read_all(&m.mnt("src/main.rs")).unwrap(), b"fn main() {}\n");
    assert_errno(
        fs::write(m.mnt("new"), b"n"),
        EROFS,
        "create without policy",
    )
    .ok();
    assert_errno(
        open_flags(&m.mnt("x"), libc::O_WRONLY, 0),
        EROFS,
        "open O_WRONLY without policy",
    )
    .ok();
    assert_errno(fs::remove_file(m.mnt("x")), EROFS, "unlink without policy").ok();
    assert_host_unchanged(&before, &src, "no policy");
}
