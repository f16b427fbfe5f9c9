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
