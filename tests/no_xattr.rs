//! `--no-xattr`: every xattr call through the mount fails EOPNOTSUPP (the daemon answers
//! ENOSYS, the kernel remembers it), whatever the policy would have said, the host's
//! attributes stay as they were, and the switch opens nothing: a hidden name is still
//! ENOENT, a read-only file still refuses writes, the rest of the mount works as without it.

mod common;

use common::*;
use std::fs;
use std::path::Path;

const POLICY: &str = r#"
mode = "workspace-write"
default = "write"

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "docs"
access = "read"
"#;

fn tree(src: &Path) {
    put(&src.join("f"), b"f\n", 0o666);
    put(&src.join("docs/r"), b"r\n", 0o666);
    put(&src.join("secrets/s"), b"s\n", 0o666);
    for p in ["f", "docs/r", "secrets/s"] {
        setxattr(&src.join(p), "user.tag", b"host").unwrap();
    }
}

fn mount(name: &str) -> Mount {
    let b = Mount::builder(name).policy(POLICY).arg("--no-xattr");
    tree(&b.host(""));
    b.start()
}

#[test]
fn every_xattr_call_is_eopnotsupp_and_the_host_keeps_its_attributes() {
    let m = mount("noxattr-calls");
    let before = snapshot(&m.host(""));
    for p in ["f", "docs/r", "", "docs"] {
        let at = m.mnt(p);
        assert_errno(
            getxattr(&at, "user.tag"),
            libc::EOPNOTSUPP,
            &format!("get {p}"),
        )
        .ok();
        assert_errno(llistxattr(&at), libc::EOPNOTSUPP, &format!("list {p}")).ok();
        assert_errno(
            setxattr(&at, "user.new", b"v"),
            libc::EOPNOTSUPP,
            &format!("set {p}"),
        )
        .ok();
        assert_errno(
            removexattr(&at, "user.tag"),
            libc::EOPNOTSUPP,
            &format!("rm {p}"),
        )
        .ok();
        // Also the names the kernel itself asks for (capabilities, ACLs).
        assert_errno(
            getxattr(&at, "security.capability"),
            libc::EOPNOTSUPP,
            &format!("get security.capability {p}"),
        )
        .ok();
        assert_errno(
            setxattr(&at, "system.posix_acl_access", b"\x02\0\0\0"),
            libc::EOPNOTSUPP,
            &format!("set acl {p}"),
        )
        .ok();
    }
    assert_eq!(snapshot(&m.host("")), before, "the host changed");
    assert_eq!(lgetxattr(&m.host("f"), b"user.tag").unwrap(), b"host");
    assert_eq!(lgetxattr(&m.host("docs/r"), b"user.tag").unwrap(), b"host");
}

#[test]
fn hidden_stays_hidden_and_refused_stays_refused() {
    let m = mount("noxattr-policy");
    let before = snapshot(&m.host(""));
    // A hidden name: ENOENT before any xattr question, listed nowhere.
    assert_errno(
        getxattr(&m.mnt("secrets/s"), "user.tag"),
        libc::ENOENT,
        "get hidden",
    )
    .ok();
    assert_errno(
        setxattr(&m.mnt("secrets/s"), "user.x", b"v"),
        libc::ENOENT,
        "set hidden",
    )
    .ok();
    assert_errno(
        llistxattr(&m.mnt("secrets")),
        libc::ENOENT,
        "list hidden dir",
    )
    .ok();
    assert!(!names(&m.mnt("")).unwrap().iter().any(|n| n == b"secrets"));
    // A read-only file: its writes are still refused.
    assert_errno(
        fs::OpenOptions::new().write(true).open(m.mnt("docs/r")),
        libc::EACCES,
        "write read-only",
    )
    .ok();
    assert_errno(
        fs::write(m.mnt("docs/new"), b"n"),
        libc::EACCES,
        "create read-only",
    )
    .ok();
    assert_eq!(snapshot(&m.host("")), before, "the host changed");
    // Everything else is served as without the switch.
    assert_eq!(fs::read(m.mnt("docs/r")).unwrap(), b"r\n");
    fs::write(m.mnt("f"), b"written\n").unwrap();
    fs::write(m.mnt("g"), b"new\n").unwrap();
    assert_eq!(fs::read(m.host("f")).unwrap(), b"written\n");
    assert_eq!(fs::read(m.host("g")).unwrap(), b"new\n");
    // The write kept the host's attribute (the daemon's write, not an xattr call).
    assert_eq!(lgetxattr(&m.host("f"), b"user.tag").unwrap(), b"host");
}
