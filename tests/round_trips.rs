//! Fewer FUSE round trips (issue 12), and that each saving keeps the file system's
//! behaviour and the policy's refusals exactly as they were:
//!
//! - `security.selinux` is not mirrored (EOPNOTSUPP everywhere, never listed), so `ls -l`
//!   stops asking after the first file; ACLs (`getfacl`/`setfacl`) and `user.*` attributes
//!   work as before, and are refused with the policy's errnos as before.
//!
//! Request counts and timings are measured by hand (see the README's Performance
//! section), never asserted here.

mod common;

use std::path::Path;

use common::*;

const EOPNOTSUPP: i32 = libc::EOPNOTSUPP;

fn run(prog: &str, args: &[&str]) -> Out {
    std::process::Command::new(prog)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .unwrap_or_else(|e| panic!("run {prog}: {e} (scripts/test.sh installs the acl package)"))
        .into()
}

fn getfacl(p: &Path) -> String {
    let o = run("getfacl", &["-c", "-n", p.to_str().unwrap()]);
    o.assert_ok("getfacl");
    o.stdout
}

const LABEL: &[u8] = b"system_u:object_r:etc_t:s0\0";

#[test]
fn selinux_labels_are_not_mirrored_while_acls_and_user_xattrs_are() {
    let b = Mount::builder("xattr-mirror")
        .policy(
            r#"
mode = "workspace-write"
default = "write"
writable_roots = ["w", "ro"]
[[rule]]
path = "ro"
access = "read"
[[rule]]
path = "ls"
access = "list"
[[rule]]
path = "hidden"
access = "none"
"#,
        )
        .arg("--allow-other");
    for d in ["w", "ro", "ls", "out", "hidden"] {
        let f = b.host(format!("{d}/f"));
        mkdirp(f.parent().unwrap());
        put(&f, b"data\n", 0o644);
        run("setfacl", &["-m", "u:1000:r", f.to_str().unwrap()]).assert_ok("host setfacl");
        setxattr(&f, "user.k", b"v").unwrap();
        // A label on the host: without SELinux in the kernel, just stored bytes.
        setxattr(&f, "security.selinux", LABEL).unwrap();
    }
    let m = b.start();
    let before = snapshot(&m.host("."));
    let acl_value = getxattr(&m.host("w/f"), "system.posix_acl_access").unwrap();

    // security.selinux: not supported, on every visible path whatever its access.
    for p in ["w/f", "ro/f", "ls/f", "out/f", "w"] {
        let mp = m.mnt(p);
        assert_errno(lgetxattr(&mp, b"security.selinux"), EOPNOTSUPP, p).ok();
        assert_errno(setxattr(&mp, "security.selinux", LABEL), EOPNOTSUPP, p).ok();
        assert_errno(removexattr(&mp, "security.selinux"), EOPNOTSUPP, p).ok();
    }
    // A hidden path stays absent first.
    assert_errno(
        lgetxattr(&m.mnt("hidden/f"), b"security.selinux"),
        libc::ENOENT,
        "hidden",
    )
    .ok();
    let mut names = llistxattr(&m.mnt("w/f")).unwrap();
    names.sort();
    assert_eq!(
        names,
        vec![b"system.posix_acl_access".to_vec(), b"user.k".to_vec()],
        "listed without security.selinux"
    );
    assert_host_unchanged(&before, &m.host("."), "security.selinux refusals");
    assert_eq!(
        getxattr(&m.host("w/f"), "security.selinux").unwrap(),
        LABEL,
        "host label untouched"
    );

    // user.* attributes: as before.
    assert_eq!(getxattr(&m.mnt("w/f"), "user.k").unwrap(), b"v");
    setxattr(&m.mnt("w/f"), "user.n", b"x").unwrap();
    assert_eq!(getxattr(&m.host("w/f"), "user.n").unwrap(), b"x");
    removexattr(&m.mnt("w/f"), "user.n").unwrap();
    assert_errno(getxattr(&m.mnt("w/f"), "user.n"), libc::ENODATA, "removed").ok();
    assert_eq!(getxattr(&m.mnt("ro/f"), "user.k").unwrap(), b"v");
    assert_errno(setxattr(&m.mnt("ro/f"), "user.n", b"x"), libc::EACCES, "ro").ok();
    assert_errno(
        setxattr(&m.mnt("out/f"), "user.n", b"x"),
        libc::EROFS,
        "out",
    )
    .ok();
    assert_errno(getxattr(&m.mnt("ls/f"), "user.k"), libc::EACCES, "ls").ok();

    // ACLs: getfacl and setfacl through the mount, as on the host.
    assert!(getfacl(&m.mnt("w/f")).contains("user:1000:r--"));
    run(
        "setfacl",
        &["-m", "u:1001:rw", m.mnt("w/f").to_str().unwrap()],
    )
    .assert_ok("setfacl through the mount");
    assert!(getfacl(&m.host("w/f")).contains("user:1001:rw-"));
    run("setfacl", &["-x", "u:1001", m.mnt("w/f").to_str().unwrap()])
        .assert_ok("setfacl -x through the mount");
    assert!(!getfacl(&m.host("w/f")).contains("user:1001"));
    assert!(getfacl(&m.mnt("ro/f")).contains("user:1000:r--"));
    // ... and refused with the policy's errnos, the host untouched.
    let before = snapshot(&m.host("."));
    let acl = "system.posix_acl_access";
    assert_errno(
        setxattr(&m.mnt("ro/f"), acl, &acl_value),
        libc::EACCES,
        "ro",
    )
    .ok();
    assert_errno(
        setxattr(&m.mnt("out/f"), acl, &acl_value),
        libc::EROFS,
        "out",
    )
    .ok();
    assert_errno(removexattr(&m.mnt("ro/f"), acl), libc::EACCES, "ro").ok();
    assert_errno(removexattr(&m.mnt("out/f"), acl), libc::EROFS, "out").ok();
    assert_errno(getxattr(&m.mnt("ls/f"), acl), libc::EACCES, "ls").ok();
    run(
        "setfacl",
        &["-m", "u:1001:rw", m.mnt("ro/f").to_str().unwrap()],
    )
    .assert_fail("setfacl on a read-only path");
    run("getfacl", &[m.mnt("ls/f").to_str().unwrap()]).assert_fail("getfacl on a list path");
    assert_host_unchanged(&before, &m.host("."), "ACL refusals");
    assert!(getfacl(&m.host("ro/f")).contains("user:1000:r--"));
    assert!(!getfacl(&m.host("ro/f")).contains("user:1001"));

    // `ls -l` still marks the ACL ('+'), and shows no label.
    let o = m.sh("ls -l w");
    o.assert_ok("ls -l");
    assert!(o.stdout.contains("-rw-r--r--+"), "{}", o.stdout);
}

/// Mode bits of `p` as `stat -c %a` sees them: a statx for the mode alone, which the kernel
/// answers from its cache unless that was invalidated.
fn mode_seen(p: &Path) -> String {
    let o = run("stat", &["-c", "%a", p.to_str().unwrap()]);
    o.assert_ok("stat");
    o.stdout.trim().to_string()
}

fn host_mode(p: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    format!(
        "{:o}",
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    )
}

/// What uid 1000 does to the file `f` (cwd: the mount).
const AS_1000: [(&str, &str); 4] = [
    (
        "write",
        "/usr/bin/python3 -c \"import os; f=os.open('f', os.O_WRONLY); os.pwrite(f, b'x', 0)\"",
    ),
    ("truncate", "truncate -s 2 f"),
    (
        "O_TRUNC",
        "/usr/bin/python3 -c \"import os; os.open('f', os.O_WRONLY | os.O_TRUNC)\"",
    ),
    (
        "fallocate",
        "/usr/bin/python3 -c \"import os; f=os.open('f', os.O_WRONLY); os.posix_fallocate(f, 0, 8192)\"",
    ),
];

/// (mode before, mode after an unprivileged write or truncate), as on a local disk: the
/// set-user-ID bit always goes, the set-group-ID bit only from a group-executable file
/// (the writer is in the file's group).
const KILLS: [(u32, &str); 4] = [
    (0o4755, "755"),
    (0o2755, "755"),
    (0o6711, "711"),
    (0o2745, "2745"),
];

fn setid_mount(name: &str, io: &[&str]) -> Mount {
    let mut b = Mount::builder(name)
        .policy("mode = \"danger\"\ndefault = \"write\"\nallow_setid = true\n")
        .arg("--allow-other");
    for a in io {
        b = b.arg(*a);
    }
    put(&b.host("f"), b"hello\n", 0o644);
    std::fs::set_permissions(
        b.host("."),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    b.start()
}

#[test]
fn unprivileged_writes_and_truncates_clear_setid_bits_on_every_io_path() {
    // FUSE_HANDLE_KILLPRIV_V2: the kernel leaves clearing set-ID bits to the daemon. For
    // each file I/O path (kernel passthrough, the page cache, --revoke's direct I/O), every
    // way uid 1000 modifies its own set-ID file clears the bits on the host and in what the
    // mount shows at once, exactly as the native directory does.
    let native = Workspace::new("setid-native");
    let nf = native.src().join("f");
    for (io, args) in [
        ("passthrough", &[][..]),
        ("page cache", &["--no-passthrough"][..]),
        ("revoke", &["--revoke"][..]),
    ] {
        let m = setid_mount("setid-kill", args);
        for (op, script) in AS_1000 {
            for (before, after) in KILLS {
                for (f, dir) in [(m.host("f"), m.mnt(".")), (nf.clone(), native.src())] {
                    put(&f, b"hello\n", 0o644);
                    lchown(&f, 1000, 1000).unwrap();
                    chmod(&f, before).unwrap();
                    sh_as(1000, &dir, script).assert_ok(op);
                }
                let what = format!("{io}: {op} of a {before:o} file by uid 1000");
                assert_eq!(host_mode(&nf), after, "native, {what}");
                assert_eq!(host_mode(&m.host("f")), after, "host, {what}");
                assert_eq!(mode_seen(&m.mnt("f")), after, "through the mount, {what}");
            }
        }
        // chown(f, -1, -1): the owner's clears the bits, anyone else's changes nothing
        // (a local disk refuses it with EPERM; the kernel asks fencefs for nothing).
        let chown_keep = "/usr/bin/python3 -c \"import os\ntry: os.chown('f', -1, -1)\nexcept PermissionError: pass\"";
        for (who, after) in [(1001, "4757"), (1000, "757")] {
            for (f, dir) in [(m.host("f"), m.mnt(".")), (nf.clone(), native.src())] {
                put(&f, b"hello\n", 0o644);
                lchown(&f, 1000, 1000).unwrap();
                chmod(&f, 0o4757).unwrap();
                sh_as(who, &dir, chown_keep).assert_ok("chown -1 -1");
            }
            assert_eq!(host_mode(&nf), after, "native, chown(-1, -1) by {who}");
            assert_eq!(
                host_mode(&m.host("f")),
                after,
                "{io}: chown(-1, -1) by {who}"
            );
            assert_eq!(
                mode_seen(&m.mnt("f")),
                after,
                "{io}: chown(-1, -1) by {who}"
            );
        }
        // chmod u+s through the mount (allow_setid), then a write: cleared again.
        put(&m.host("f"), b"hello\n", 0o644);
        lchown(&m.host("f"), 1000, 1000).unwrap();
        m.sh_as(
            1000,
            "chmod 4755 f && stat -c %a f && echo x >> f && stat -c %a f",
        )
        .assert_ok("chmod u+s, then append");
        assert_eq!(
            host_mode(&m.host("f")),
            "755",
            "{io}: append after chmod u+s"
        );
    }
}

#[test]
fn setid_bits_set_behind_the_kernels_back_are_cleared_by_passthrough_writes() {
    // The kernel asks the daemon to clear bits only when its cached mode shows them. A bit
    // set on the host while the kernel caches the old mode (no watch, long TTL) is cleared
    // by the write itself: the backing file writes with the opener's ids and no CAP_FSETID.
    // The same when root opened the file first (one backing file serves both handles).
    let m = setid_mount("setid-stale", &["--no-watch", "--cache-ttl", "3600"]);
    lchown(&m.host("f"), 1000, 1000).unwrap();
    assert_eq!(mode_seen(&m.mnt("f")), "644");
    chmod(&m.host("f"), 0o4755).unwrap();
    assert_eq!(
        mode_seen(&m.mnt("f")),
        "644",
        "the kernel still caches the old mode"
    );
    m.sh_as(1000, AS_1000[0].1).assert_ok("write");
    assert_eq!(host_mode(&m.host("f")), "755");

    chmod(&m.host("f"), 0o6755).unwrap();
    let mut root = std::fs::OpenOptions::new()
        .write(true)
        .open(m.mnt("f"))
        .unwrap();
    m.sh_as(1000, AS_1000[0].1)
        .assert_ok("write beside root's handle");
    assert_eq!(host_mode(&m.host("f")), "755", "root opened it first");
    drop(std::io::Write::write_all(&mut root, b"r"));
}

#[test]
fn writes_drop_file_capabilities() {
    // security.capability goes on every write and truncate, whoever writes (the host does it;
    // the kernel no longer asks for it before each write).
    let m = setid_mount("setid-caps", &[]);
    for (op, script) in AS_1000.iter().take(2) {
        put(&m.host("f"), b"hello\n", 0o755);
        lchown(&m.host("f"), 1000, 1000).unwrap();
        run("setcap", &["cap_net_raw=ep", m.host("f").to_str().unwrap()]).assert_ok("setcap");
        assert!(lgetxattr(&m.host("f"), b"security.capability").is_ok());
        m.sh_as(1000, script).assert_ok(op);
        assert_errno(
            lgetxattr(&m.host("f"), b"security.capability"),
            libc::ENODATA,
            op,
        )
        .ok();
    }
}

fn audit_lines(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The paths the daemon decided a lookup for (each READDIRPLUS entry with attributes is
/// one, as is each LOOKUP), in `t/`.
fn lookups(audit: &Path) -> Vec<String> {
    audit_lines(audit)
        .iter()
        .filter(|v| v["op"] == "lookup")
        .filter_map(|v| v["path"].as_str().map(str::to_string))
        .collect()
}

/// A cold walk that never looks at attributes (`find`) costs the daemon no `fstatat`
/// and no lookup decision per file: over io_uring a directory's first READDIRPLUS batch
/// goes without attributes (node id 0) until readers show they stat what they list
/// (`fs/plus.rs`). What the walk sees is unchanged: every visible name, none of the
/// hidden ones, each with its real `d_ino`; `ls -l` afterwards gets every attribute
/// (by LOOKUP), and the hidden names stay ENOENT.
#[test]
fn a_cold_walk_over_io_uring_decides_no_lookup_for_what_it_does_not_stat() {
    let b = Mount::builder("plain-walk");
    let audit = b.root().join("audit.jsonl");
    let b = b
        .policy(
            "mode = \"danger\"\ndefault = \"write\"\n[[rule]]\npath = \"t/*/secret*\"\naccess = \"none\"\n",
        )
        .arg("--audit")
        .arg(&audit)
        .arg("--audit-allowed")
        .arg("--transport")
        .arg("io-uring");
    for d in 0..20 {
        for f in 0..10 {
            put(&b.host(format!("t/d{d}/f{f}")), b"12345", 0o640);
        }
        put(&b.host(format!("t/d{d}/secret")), b"s", 0o600);
    }
    let m = b.start();
    let found = m.sh("find t | sort");
    found.assert_ok("find");
    let names: Vec<&str> = found.stdout.lines().collect();
    assert_eq!(names.len(), 1 + 20 + 200, "{names:?}");
    assert!(!found.stdout.contains("secret"), "{}", found.stdout);
    assert!(
        eventually(std::time::Duration::from_secs(5), || audit_lines(&audit)
            .iter()
            .filter(|v| v["op"] == "opendir")
            .count()
            >= 21),
        "{:#?}",
        audit_lines(&audit)
    );
    // Only the directories it descends into are looked up (to open them).
    let walked: Vec<String> = lookups(&audit)
        .into_iter()
        .filter(|p| p.starts_with("t/") && p.matches('/').count() > 1)
        .collect();
    assert!(
        walked.is_empty(),
        "find decided {} lookups of files: {walked:?}",
        walked.len()
    );
    // The entries' inode numbers are the files' own (a program that skips d_ino 0, as
    // Go's does, still sees every name).
    let py = m.sh(
        "python3 -c 'import os\nfor e in os.scandir(\"t/d3\"):\n assert e.inode() != 0 and e.inode() == os.lstat(e.path).st_ino, e.name\nprint(len(list(os.scandir(\"t/d3\"))))'",
    );
    py.assert_ok("scandir");
    assert_eq!(py.stdout.trim(), "10");
    // `ls -l` gets every attribute and still no hidden name.
    let ls = m.sh("ls -ln t/d7");
    ls.assert_ok("ls -l");
    let rows: Vec<&str> = ls.stdout.lines().filter(|l| l.starts_with('-')).collect();
    assert_eq!(rows.len(), 10, "{}", ls.stdout);
    assert!(
        rows.iter().all(|r| r.starts_with("-rw-r----- 1 0 0 5 ")),
        "{}",
        ls.stdout
    );
    assert_eq!(
        errno_of(&std::fs::metadata(m.mnt("t/d7/secret"))),
        libc::ENOENT
    );
    assert!(m.host("t/d7/secret").exists());
}

/// An access ACL set or removed through the mount changes the mode's group bits on the
/// host (the ACL's mask): the mode seen through the mount follows at once, not after the
/// kernel's 10 s attribute lifetime (the watch skips the daemon's own changes, and the
/// kernel does not drop its cached mode on a SETXATTR).
#[test]
fn an_acl_changed_through_the_mount_shows_in_the_mode() {
    let m = Mount::with("acl-mode", Some("mode = \"danger\"\n"), None, |src| {
        put(&src.join("f"), b"x\n", 0o644)
    });
    let f = m.mnt("f");
    assert_eq!(mode_seen(&f), "644");
    run("setfacl", &["-m", "u:1001:rw", f.to_str().unwrap()]).assert_ok("setfacl -m");
    assert_eq!(host_mode(&m.host("f")), "664");
    assert!(
        eventually(std::time::Duration::from_secs(2), || mode_seen(&f) == "664"),
        "mode through the mount after setfacl -m: {}",
        mode_seen(&f)
    );
    run("setfacl", &["-b", f.to_str().unwrap()]).assert_ok("setfacl -b");
    assert_eq!(host_mode(&m.host("f")), "644");
    assert!(
        eventually(std::time::Duration::from_secs(2), || mode_seen(&f) == "644"),
        "mode through the mount after setfacl -b: {}",
        mode_seen(&f)
    );
}

/// The descriptors of `pid`: what each names, and its open flags.
fn fds_of(pid: i32) -> Vec<(std::path::PathBuf, u32)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            let fd = e.file_name().to_string_lossy().into_owned();
            let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())?;
            Some((target, flags))
        })
        .collect()
}

/// Descriptors of `pid` that name a deleted file.
fn deleted_fds(pid: i32) -> Vec<String> {
    fds_of(pid)
        .into_iter()
        .map(|(t, _)| t.to_string_lossy().into_owned())
        .filter(|t| t.ends_with("(deleted)"))
        .collect()
}

/// An unlink through the mount keeps a handle of the host file cached until the kernel's
/// FORGET, so the host frees it (blocks, journal, discard) after the caller has its
/// answer; that handle is closed then: files made on the host and removed through the mount leave no descriptor
/// behind and give their space back, a file still open through the mount stays readable,
/// and every removal's errno and host effect is what it was.
#[test]
fn removed_files_are_freed_after_the_forget_and_no_descriptor_stays() {
    let b = Mount::builder("unlink-frees")
        .policy("mode = \"workspace-write\"\ndefault = \"write\"\nwritable_roots = [\".\"]\n");
    for i in 0..200 {
        put(&b.host(format!("t/d{}/f{i}", i % 10)), &[b'x'; 9000], 0o644);
    }
    put(&b.host("keep/open.txt"), b"still here\n", 0o644);
    let m = b.start();
    // Looked up through a listing (no handle opened for them), then removed.
    m.sh("find t >/dev/null && rm -rf t")
        .assert_ok("rm -rf through the mount");
    assert!(!m.host("t").exists(), "the tree is gone on the host");
    // A file open through the mount outlives its name.
    let mut f = std::fs::File::open(m.mnt("keep/open.txt")).expect("open through the mount");
    std::fs::remove_file(m.mnt("keep/open.txt")).expect("unlink through the mount");
    assert!(!m.host("keep/open.txt").exists());
    let mut s = String::new();
    std::io::Read::read_to_string(&mut f, &mut s).expect("read the unlinked file");
    assert_eq!(s, "still here\n");
    drop(f);
    // Removing again: ENOENT, as before.
    let e = std::fs::remove_file(m.mnt("keep/open.txt")).expect_err("a second unlink");
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    // A file held through the mount by an O_PATH descriptor (no OPEN: the daemon holds no
    // handle for it) and removed: the daemon keeps exactly that one deleted file open
    // while the kernel holds its inode (the host frees it later, off the unlink), and
    // closes it once the kernel forgets the inode.
    let pid = m.pid();
    put(&m.host("held/big.bin"), &[b'y'; 70_000], 0o644);
    let held = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(m.mnt("held/big.bin"))
            .expect("O_PATH open through the mount")
    };
    // The tree's FORGETs come in batches: wait until they are all handled.
    assert!(
        eventually(std::time::Duration::from_secs(10), || deleted_fds(pid)
            .is_empty()),
        "descriptors of the removed tree still held: {:?}",
        deleted_fds(pid)
    );
    std::fs::remove_file(m.mnt("held/big.bin")).expect("unlink through the mount");
    assert!(!m.host("held/big.bin").exists());
    let one = deleted_fds(pid);
    assert_eq!(
        one.len(),
        1,
        "the removed file's handle, held until the FORGET: {one:?}"
    );
    assert!(one[0].contains("big.bin"), "{one:?}");
    drop(held);
    assert!(
        eventually(std::time::Duration::from_secs(10), || deleted_fds(pid)
            .is_empty()),
        "the unlinked file is still held after its FORGET: {:?}",
        deleted_fds(pid)
    );
    // The same for a file a rename replaces (the editor's save): the old file is freed
    // after the answer, the new one is in place, and its content is the new one.
    put(&m.host("held/dst.bin"), &[b'z'; 70_000], 0o644);
    let held = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(m.mnt("held/dst.bin"))
            .expect("O_PATH open through the mount")
    };
    std::fs::write(m.mnt("held/new.tmp"), b"saved\n").expect("write through the mount");
    std::fs::rename(m.mnt("held/new.tmp"), m.mnt("held/dst.bin")).expect("rename over");
    assert_eq!(std::fs::read(m.host("held/dst.bin")).unwrap(), b"saved\n");
    let one = deleted_fds(pid);
    assert_eq!(
        one.len(),
        1,
        "the replaced file's handle, held until the FORGET: {one:?}"
    );
    assert!(one[0].contains("dst.bin"), "{one:?}");
    drop(held);
    // The kernel forgets what it dropped: nothing deleted stays open in the daemon.
    assert!(
        eventually(std::time::Duration::from_secs(10), || deleted_fds(pid)
            .is_empty()),
        "descriptors of deleted files still held: {:?}",
        deleted_fds(pid)
    );
}

/// The host directories the daemon holds open for reading (`O_PATH` handles left out).
fn dirs_open_for_reading(pid: i32, under: &Path) -> Vec<String> {
    fds_of(pid)
        .into_iter()
        .filter(|(t, flags)| t.starts_with(under) && t.is_dir() && flags & libc::O_PATH as u32 == 0)
        .map(|(t, _)| t.to_string_lossy().into_owned())
        .collect()
}

/// An open directory costs the daemon no open descriptor until it is read: OPENDIR keeps
/// the node's handle, and a listing opens the directory only while it is read. What a
/// reader sees is unchanged: the entries, a rewind that lists again what is there now, and
/// ENOENT from a directory removed while open — as on the host.
#[test]
fn an_open_directory_is_opened_on_the_host_only_while_it_is_listed() {
    let b = Mount::builder("rt-opendir")
        .policy("mode = \"workspace-write\"\ndefault = \"write\"\nwritable_roots = [\".\"]\n");
    for i in 0..5 {
        put(&b.host(format!("d/f{i}")), b"x", 0o644);
    }
    std::fs::create_dir_all(b.host("gone")).unwrap();
    let m = b.start();
    let (pid, src) = (m.pid(), m.host(""));
    let list = |d: &mut std::fs::ReadDir| -> Vec<String> {
        let mut v: Vec<String> = d
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let mut d = std::fs::read_dir(m.mnt("d")).unwrap();
    assert_eq!(
        dirs_open_for_reading(pid, &src),
        Vec::<String>::new(),
        "an open directory not read yet holds nothing open"
    );
    assert_eq!(list(&mut d), ["f0", "f1", "f2", "f3", "f4"]);
    assert!(dirs_open_for_reading(pid, &src).is_empty(), "nor once read");
    // A rewind lists again what is there now.
    put(&m.host("d/f5"), b"x", 0o644);
    let mut again = std::fs::read_dir(m.mnt("d")).unwrap();
    assert_eq!(list(&mut again).len(), 6);
    // Removed while open, before its first read: ENOENT, as on the host.
    let gone = std::ffi::CString::new(m.mnt("gone").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(gone.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    assert!(fd >= 0);
    std::fs::remove_dir(m.mnt("gone")).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` is writable for its length; `fd` is open.
    let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
    let e = std::io::Error::last_os_error().raw_os_error();
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
    assert_eq!((n, e), (-1, Some(libc::ENOENT)));
    assert!(!m.host("gone").exists());
}
