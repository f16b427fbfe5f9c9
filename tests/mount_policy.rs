//! The policy through a real mount: mode × access level × operation → exact errno, and the
//! host never changes after a refusal (SPEC "Access levels", "Sandbox modes", "Errors").

mod common;

use common::*;
use libc::{EACCES, EEXIST, ENOENT, EPERM, EROFS};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

// ------------------------------------------------------------------ the table

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    None,
    List,
    Read,
    Write,
    /// No rule: `default = "write"`, but outside `writable_roots` in workspace-write.
    Free,
}

const LEVELS: [Level; 5] = [
    Level::None,
    Level::List,
    Level::Read,
    Level::Write,
    Level::Free,
];

impl Level {
    fn dir(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::List => "list",
            Level::Read => "read",
            Level::Write => "write",
            Level::Free => "free",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Class {
    /// lookup, stat, readdir, readlink: needs `list`.
    Observe,
    /// open for read, exec, getxattr: needs `read`.
    Read,
    /// any mutation or creation: needs `write` and the mode.
    Mutate,
}

const TABLE_POLICY: &str = r#"
default = "write"
writable_roots = ["list", "read", "write"]

[[rule]]
path = "none"
access = "none"

[[rule]]
path = "list"
access = "list"

[[rule]]
path = "read"
access = "read"

[[rule]]
path = "write"
access = "write"
"#;

/// SPEC: none → ENOENT (the parent is hidden, so even creations see ENOENT), then the
/// mode (EROFS), then the rule (EACCES).
fn expected(mode: &str, l: Level, c: Class) -> i32 {
    if l == Level::None {
        return ENOENT;
    }
    match c {
        Class::Observe => 0,
        Class::Read => {
            if l >= Level::Read {
                0
            } else {
                EACCES
            }
        }
        Class::Mutate => {
            if mode == "read-only" {
                EROFS
            } else if l == Level::Free {
                if mode == "workspace-write" { EROFS } else { 0 }
            } else if l < Level::Write {
                EACCES
            } else {
                0
            }
        }
    }
}

const FILES: &[&str] = &[
    "file", "file_w", "file_rw", "file_t", "file_rt", "file_a", "file_tr", "file_u", "file_rn",
    "file_c", "file_ch", "file_ut", "file_l", "file_x", "file_xr", "file_xrm",
];

fn table_layout(src: &Path) {
    for l in LEVELS {
        let d = src.join(l.dir());
        for f in FILES {
            put(&d.join(f), format!("{}/{f}\n", l.dir()).as_bytes(), 0o644);
        }
        put(&d.join("script.sh"), b"#!/bin/sh\necho ran\n", 0o755);
        symlink("file", &d.join("link"));
        put(&d.join("sub/g"), b"g\n", 0o644);
        mkdirp(&d.join("dir_r"));
        put(&d.join("dir_rn/inner"), b"inner\n", 0o644);
        setxattr(&d.join("file_xr"), "user.k", b"v").expect("host user xattrs");
        setxattr(&d.join("file_xrm"), "user.k", b"v").unwrap();
    }
}

type OpFn = fn(&Path) -> io::Result<()>;
type BoxedOp<'a> = Box<dyn Fn() -> io::Result<()> + 'a>;

fn check(cond: bool, msg: &str) -> io::Result<()> {
    if cond {
        Ok(())
    } else {
        Err(io::Error::other(msg.to_string()))
    }
}

fn ops() -> Vec<(&'static str, Class, OpFn)> {
    vec![
        ("lstat file", Class::Observe, |d| {
            fs::symlink_metadata(d.join("file")).map(|_| ())
        }),
        ("stat dir", Class::Observe, |d| {
            let m = fs::metadata(d.join("sub"))?;
            check(m.is_dir(), "sub is not a dir")
        }),
        ("readdir", Class::Observe, |d| {
            let n = names_str(&d.join("sub"))?;
            check(n == ["g"], &format!("readdir sub = {n:?}"))
        }),
        ("readlink", Class::Observe, |d| {
            let t = fs::read_link(d.join("link"))?;
            check(t == Path::new("file"), &format!("readlink = {t:?}"))
        }),
        ("lstat symlink", Class::Observe, |d| {
            let m = fs::symlink_metadata(d.join("link"))?;
            check(m.file_type().is_symlink(), "link is not a symlink")
        }),
        ("open O_RDONLY+read", Class::Read, |d| {
            let v = read_all(&d.join("file"))?;
            let want = format!("{}/file\n", d.file_name().unwrap().to_string_lossy());
            check(
                v == want.as_bytes(),
                &format!("content {:?}", String::from_utf8_lossy(&v)),
            )
        }),
        ("open dir O_RDONLY", Class::Observe, |d| {
            open_flags(&d.join("sub"), libc::O_RDONLY | libc::O_DIRECTORY, 0)
        }),
        ("exec script", Class::Read, |d| {
            let o = Command::new(d.join("script.sh")).output()?;
            check(
                o.status.success() && o.stdout == b"ran\n",
                &format!("exec: {o:?}"),
            )
        }),
        ("getxattr", Class::Read, |d| {
            let v = getxattr(&d.join("file_xr"), "user.k")?;
            check(v == b"v", "xattr value")
        }),
        ("open O_WRONLY", Class::Mutate, |d| {
            open_flags(&d.join("file_w"), libc::O_WRONLY, 0)
        }),
        ("open O_RDWR", Class::Mutate, |d| {
            open_flags(&d.join("file_rw"), libc::O_RDWR, 0)
        }),
        ("open O_WRONLY|O_TRUNC", Class::Mutate, |d| {
            open_flags(&d.join("file_t"), libc::O_WRONLY | libc::O_TRUNC, 0)
        }),
        ("open O_RDONLY|O_TRUNC", Class::Mutate, |d| {
            open_flags(&d.join("file_rt"), libc::O_RDONLY | libc::O_TRUNC, 0)
        }),
        ("open O_WRONLY|O_APPEND", Class::Mutate, |d| {
            let mut f = fs::OpenOptions::new().append(true).open(d.join("file_a"))?;
            f.write_all(b"appended\n")
        }),
        ("truncate()", Class::Mutate, |d| {
            truncate(&d.join("file_tr"), 1)
        }),
        ("create O_EXCL", Class::Mutate, |d| {
            open_flags(
                &d.join("new_file"),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                0o644,
            )
        }),
        ("mkdir", Class::Mutate, |d| {
            mkdir_mode(&d.join("new_dir"), 0o755)
        }),
        ("mknod fifo", Class::Mutate, |d| {
            mknod(&d.join("new_fifo"), libc::S_IFIFO | 0o644, 0)
        }),
        ("symlink", Class::Mutate, |d| {
            std::os::unix::fs::symlink("file", d.join("new_link"))
        }),
        ("link", Class::Mutate, |d| {
            fs::hard_link(d.join("file_l"), d.join("new_hard"))
        }),
        ("unlink", Class::Mutate, |d| {
            fs::remove_file(d.join("file_u"))
        }),
        ("rmdir", Class::Mutate, |d| fs::remove_dir(d.join("dir_r"))),
        ("rename file", Class::Mutate, |d| {
            fs::rename(d.join("file_rn"), d.join("file_rn2"))
        }),
        ("rename dir", Class::Mutate, |d| {
            fs::rename(d.join("dir_rn"), d.join("dir_rn2"))
        }),
        ("chmod", Class::Mutate, |d| chmod(&d.join("file_c"), 0o600)),
        ("chown", Class::Mutate, |d| {
            lchown(&d.join("file_ch"), 1000, 1000)
        }),
        ("utimens", Class::Mutate, |d| {
            utimes(&d.join("file_ut"), 1_000_000)
        }),
        ("setxattr", Class::Mutate, |d| {
            setxattr(&d.join("file_x"), "user.new", b"1")
        }),
        ("removexattr", Class::Mutate, |d| {
            removexattr(&d.join("file_xrm"), "user.k")
        }),
    ]
}

fn run_table(mode: &str) {
    let m = Mount::with(
        &format!("table-{mode}"),
        Some(TABLE_POLICY),
        Some(mode),
        table_layout,
    );
    let src = m.host("");
    let mut failures = vec![];
    let mut count = 0;
    for l in LEVELS {
        for (name, class, op) in ops() {
            count += 1;
            let want = expected(mode, l, class);
            let before = snapshot(&src);
            let r = op(&m.mnt(l.dir()));
            let got = errno_of(&r);
            if got != want {
                failures.push(format!(
                    "{mode:>15} {:>5} {name:<24} expected {:<6} got {:<6} {:?}",
                    l.dir(),
                    ename(want),
                    ename(got),
                    r.err()
                ));
            }
            if want != 0 {
                let d = snapshot_diff(&before, &snapshot(&src));
                if !d.is_empty() {
                    failures.push(format!(
                        "{mode:>15} {:>5} {name:<24} refused but the host changed:\n{d}",
                        l.dir()
                    ));
                }
            }
        }
    }
    // The refused truncations left their files intact.
    for l in [Level::List, Level::Read] {
        for f in ["file_t", "file_rt", "file_tr"] {
            let v = fs::read(m.host(format!("{}/{f}", l.dir()))).unwrap();
            if v != format!("{}/{f}\n", l.dir()).as_bytes() {
                failures.push(format!("{mode} {}/{f}: content changed to {v:?}", l.dir()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} table cells wrong in mode {mode}:\n{}\ndaemon stderr:\n{}",
        failures.len(),
        failures.join("\n"),
        m.stderr()
    );
}

#[test]
fn table_read_only() {
    run_table("read-only");
}

#[test]
fn table_workspace_write() {
    run_table("workspace-write");
}

#[test]
fn table_danger() {
    run_table("danger");
}

// ------------------------------------------------------------------ hidden paths

const HIDDEN_POLICY: &str = r#"
default = "write"

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "**/*.pem"
access = "none"

[[rule]]
path = "**/.env"
access = "none"

[[rule]]
path = "vault"
access = "none"

[[rule]]
path = "vault/public"
access = "read"
"#;

fn hidden_layout(src: &Path) {
    put(&src.join("secrets/key"), b"SECRET-KEY\n", 0o644);
    put(&src.join("a/b/c.pem"), b"SECRET-PEM\n", 0o644);
    put(&src.join("a/plain"), b"plain\n", 0o644);
    put(&src.join("a/.env"), b"SECRET-ENV-A\n", 0o644);
    put(&src.join(".env"), b"SECRET-ENV\n", 0o644);
    put(&src.join("top.pem"), b"SECRET-TOP\n", 0o644);
    put(&src.join("vault/secret.txt"), b"SECRET-VAULT\n", 0o644);
    put(&src.join("vault/deeper/x"), b"SECRET-DEEP\n", 0o644);
    put(&src.join("vault/public/readme"), b"public\n", 0o644);
    put(&src.join("README"), b"readme\n", 0o644);
    symlink("../secrets/key", &src.join("a/tosecret"));
}

#[test]
fn hidden_paths_are_enoent_and_unlisted() {
    let m = Mount::with("hidden", Some(HIDDEN_POLICY), Some("danger"), hidden_layout);
    let before = snapshot(&m.host(""));

    for p in [
        "secrets",
        "secrets/key",
        "a/b/c.pem",
        "a/.env",
        ".env",
        "top.pem",
        "vault/secret.txt",
        "vault/deeper",
        "vault/deeper/x",
    ] {
        assert_errno(
            fs::symlink_metadata(m.mnt(p)),
            ENOENT,
            &format!("lstat {p}"),
        )
        .ok();
        assert_errno(fs::File::open(m.mnt(p)), ENOENT, &format!("open {p}")).ok();
    }
    assert_errno(fs::read_dir(m.mnt("secrets")), ENOENT, "opendir secrets").ok();

    let root = names_str(&m.mnt("")).unwrap();
    assert_eq!(root, ["README", "a", "vault"], "root listing");
    assert_eq!(
        names_str(&m.mnt("a")).unwrap(),
        ["b", "plain", "tosecret"],
        "a/ listing"
    );
    assert!(
        names_str(&m.mnt("a/b")).unwrap().is_empty(),
        "a/b should list as empty"
    );

    // `none` dir with a deeper `read` rule: listable, only the visible entry.
    let md = fs::metadata(m.mnt("vault")).expect("vault stays visible (as list)");
    assert!(md.is_dir());
    assert_eq!(
        names_str(&m.mnt("vault")).unwrap(),
        ["public"],
        "vault listing"
    );
    assert_eq!(
        read_all(&m.mnt("vault/public/readme")).unwrap(),
        b"public\n"
    );
    // vault itself is only `list`: creating in it is a none path → EACCES.
    assert_errno(
        open_flags(
            &m.mnt("vault/new"),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            0o644,
        ),
        EACCES,
        "create vault/new",
    )
    .ok();

    // A symlink into a hidden place is mirrored; resolving it (through the mount) fails.
    assert_eq!(
        fs::read_link(m.mnt("a/tosecret")).unwrap(),
        Path::new("../secrets/key")
    );
    assert_errno(
        fs::read(m.mnt("a/tosecret")),
        ENOENT,
        "read through a/tosecret",
    )
    .ok();

    let ls = m.sh("ls -a . a a/b vault");
    ls.assert_ok("ls -a");
    let find = m.sh("find .");
    find.assert_ok("find .");
    for out in [&ls.stdout, &find.stdout] {
        for bad in ["secrets", ".pem", ".env", "secret.txt", "deeper"] {
            assert!(!out.contains(bad), "{bad:?} leaked into listing:\n{out}");
        }
    }
    assert!(
        find.stdout.lines().any(|l| l == "./vault/public/readme"),
        "find misses vault/public/readme:\n{}",
        find.stdout
    );
    let grep = m.sh("grep -r SECRET . ; true");
    assert!(
        !grep.stdout.contains("SECRET"),
        "grep -r found hidden content:\n{}",
        grep.stdout
    );

    assert_host_unchanged(&before, &m.host(""), "reads of hidden paths");
}

/// Creating a `none` path fails with EACCES and never touches the host, in every mode,
/// whether or not a hidden file of that name exists on the host.
#[test]
fn creating_hidden_paths_is_eacces() {
    for mode in ["read-only", "workspace-write", "danger"] {
        let m = Mount::with(
            &format!("hidden-create-{mode}"),
            Some(HIDDEN_POLICY),
            Some(mode),
            hidden_layout,
        );
        let src = m.host("");
        let before = snapshot(&src);
        let cases: Vec<(&str, BoxedOp)> = vec![
            (
                "create a/new.pem",
                Box::new(|| {
                    open_flags(
                        &m.mnt("a/new.pem"),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                        0o644,
                    )
                }),
            ),
            (
                "create O_EXCL existing hidden top.pem",
                Box::new(|| {
                    open_flags(
                        &m.mnt("top.pem"),
                        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                        0o644,
                    )
                }),
            ),
            (
                "create O_TRUNC existing hidden .env",
                Box::new(|| {
                    open_flags(
                        &m.mnt(".env"),
                        libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY,
                        0o644,
                    )
                }),
            ),
            (
                "create O_TRUNC existing hidden a/.env",
                Box::new(|| {
                    open_flags(
                        &m.mnt("a/.env"),
                        libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY,
                        0o644,
                    )
                }),
            ),
            (
                "create existing hidden dir name secrets",
                Box::new(|| open_flags(&m.mnt("secrets"), libc::O_CREAT | libc::O_WRONLY, 0o644)),
            ),
            (
                "mkdir secrets (exists on host)",
                Box::new(|| mkdir_mode(&m.mnt("secrets"), 0o755)),
            ),
            (
                "mkdir a/d.pem",
                Box::new(|| mkdir_mode(&m.mnt("a/d.pem"), 0o755)),
            ),
            (
                "symlink a/l.pem",
                Box::new(|| std::os::unix::fs::symlink("plain", m.mnt("a/l.pem"))),
            ),
            (
                "mknod fifo a/f.pem",
                Box::new(|| mknod(&m.mnt("a/f.pem"), libc::S_IFIFO | 0o644, 0)),
            ),
        ];
        for (what, f) in cases {
            let r = f();
            assert_errno(r, EACCES, &format!("[{mode}] {what}")).ok();
            assert_host_unchanged(&before, &src, &format!("[{mode}] {what}"));
        }
        if mode == "danger" {
            assert_errno(
                fs::rename(m.mnt("a/plain"), m.mnt("a/b/c.pem")),
                EACCES,
                "rename over hidden a/b/c.pem",
            )
            .ok();
            assert_host_unchanged(&before, &src, "rename over hidden");
            assert_errno(
                fs::rename(m.mnt("a/plain"), m.mnt("a/new.pem")),
                EACCES,
                "rename to hidden name",
            )
            .ok();
            assert_errno(
                fs::hard_link(m.mnt("a/plain"), m.mnt("a/h.pem")),
                EACCES,
                "link to hidden name",
            )
            .ok();
            assert_errno(
                fs::hard_link(m.mnt("a/plain"), m.mnt(".env")),
                EACCES,
                "link over hidden .env",
            )
            .ok();
            assert_errno(
                renameat2(&m.mnt("a/plain"), &m.mnt("top.pem"), libc::RENAME_EXCHANGE),
                // RENAME_EXCHANGE needs an existing target: a hidden one does not exist.
                ENOENT,
                "exchange with hidden top.pem",
            )
            .ok();
            assert_host_unchanged(&before, &src, "rename/link to hidden names");
            // And the visible file itself is still fine to rename.
            fs::rename(m.mnt("a/plain"), m.mnt("a/plain2"))
                .expect("rename a visible file in danger");
            assert!(m.host("a/plain2").exists());
        }
    }
}

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
