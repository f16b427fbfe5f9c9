//! What a hostile caller can learn or plant through names it cannot see: a hidden entry
//! never shows through `rmdir`/`rename` errors or a directory's link count, and file
//! capabilities (`security.capability`) are set-ID bits that need `allow_setid`.
//!
//! Real processes (uid 1000 through `setpriv`, and an unprivileged user namespace) against
//! a real mount, exact errnos, and the host unchanged after every refusal.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, lchown};
use std::path::Path;
use std::time::Duration;

use common::*;
use libc::{EACCES, ENODATA, ENOENT, EPERM, EROFS};

/// `**/.env` hidden, everything else writable.
const HIDE_ENV: &str = "mode = \"workspace-write\"\ndefault = \"write\"\n\
                        [[rule]]\npath = \"**/.env\"\naccess = \"none\"\n";

/// [`HIDE_ENV`] with `allow_setid`.
fn hide_env_setid(setid: bool) -> String {
    format!("allow_setid = {setid}\n{HIDE_ENV}")
}

/// Runs one `os` call in python3 and prints `ok` or the errno's name. `setcap PATH HEX`
/// sets `security.capability` to the hex bytes, `setx PATH NAME HEX` any attribute,
/// `removex PATH NAME` removes one.
const OP_PY: &str = r#"
import errno, os, sys
op, args = sys.argv[1], sys.argv[2:]
try:
    if op == "setcap":
        os.setxattr(args[0], "security.capability", bytes.fromhex(args[1]))
    elif op == "setx":
        os.setxattr(args[0], args[1], bytes.fromhex(args[2]))
    elif op == "removex":
        os.removexattr(args[0], args[1])
    else:
        getattr(os, op)(*args)
    print("ok")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
"#;

/// A valid v2 `vfs_cap_data`: magic 0x02000000 | VFS_CAP_FLAGS_EFFECTIVE, permitted
/// CAP_NET_RAW (bit 13), nothing inheritable (`setcap cap_net_raw=ep`).
const CAP_V2: &str = "0100000200200000000000000000000000000000";

fn cap_v2() -> Vec<u8> {
    hex(CAP_V2)
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `chown -R uid:uid` without following symlinks.
fn chown_r(p: &Path, uid: u32) {
    lchown(p, Some(uid), Some(uid)).unwrap();
    if fs::symlink_metadata(p).unwrap().is_dir() {
        for e in fs::read_dir(p).unwrap() {
            chown_r(&e.unwrap().path(), uid);
        }
    }
}

/// Runs `OP_PY` with `args` as `uid` (cwd: the mount point), through `wrap` (e.g.
/// `unshare -U -r`); returns what it printed.
fn py_as(m: &Mount, uid: u32, wrap: &str, args: &str) -> String {
    let script = m.outside().join("op.py");
    if !script.exists() {
        put(&script, OP_PY.as_bytes(), 0o644);
    }
    let o = m.sh_as(
        uid,
        &format!("{wrap} /usr/bin/python3 {} {args}", script.display()),
    );
    o.assert_ok(&format!("python3 {args} as {uid}"));
    assert!(o.stderr.is_empty(), "python3 {args}: {}", o.stderr);
    o.stdout.trim().to_string()
}

fn audit_lines(p: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line ({e}): {l}")))
        .collect()
}

#[track_caller]
fn assert_audited(audit: &Path, op: &str, path: &str, errno: &str) {
    let found = eventually(Duration::from_secs(5), || {
        audit_lines(audit).iter().any(|v| {
            v["op"] == op && v["path"] == path && v["errno"] == errno && v["decision"] == "deny"
        })
    });
    assert!(
        found,
        "no {op} {path} {errno} refusal in the audit log:\n{:#?}",
        audit_lines(audit)
    );
}

/// The capability on the host file, read directly (ENODATA when there is none).
fn host_cap(p: &Path) -> std::io::Result<Vec<u8>> {
    lgetxattr(p, b"security.capability")
}

/// Waits until the daemon logged reload `generation`.
fn reloaded(m: &Mount, generation: u64) {
    let want = format!("generation {generation}");
    assert!(
        eventually(Duration::from_secs(5), || m.stderr().contains(&want)),
        "policy reload {generation} not applied; stderr:\n{}",
        m.stderr()
    );
}

// ---------------------------------------------------------------- C1: rmdir and rename

#[test]
fn rmdir_and_rename_onto_a_dir_holding_only_hidden_entries_are_eacces() {
    let b = Mount::builder("hidden-notempty");
    let audit = b.root().join("audit.jsonl");
    put(&b.host("only_file/.env"), b"SECRET=1\n", 0o600);
    put(&b.host("only_dir/.env/key"), b"k\n", 0o600);
    put(&b.host("mixed/.env"), b"SECRET=1\n", 0o600);
    put(&b.host("mixed/visible"), b"v\n", 0o644);
    mkdirp(&b.host("empty"));
    put(&b.host("moving/a"), b"a\n", 0o644);
    put(&b.host("onto/.env"), b"SECRET=1\n", 0o600);
    put(&b.host("onto_mixed/.env"), b"SECRET=1\n", 0o600);
    put(&b.host("onto_mixed/v"), b"v\n", 0o644);
    chown_r(&b.host(""), 1000);
    let m = b
        .policy(HIDE_ENV)
        .arg("--allow-other")
        .arg("--audit")
        .arg(&audit)
        .start();

    // The caller sees these directories as empty.
    for d in ["only_file", "only_dir", "onto"] {
        let o = m.sh_as(1000, &format!("ls -A {d}"));
        o.assert_ok(&format!("ls -A {d}"));
        assert_eq!(o.stdout, "", "{d} lists as empty");
    }
    let before = snapshot(&m.host(""));
    for (args, want) in [
        ("rmdir only_file", "EACCES"),
        ("rmdir only_dir", "EACCES"),
        ("rename moving onto", "EACCES"),
        // A visible entry: the ordinary answer.
        ("rmdir mixed", "ENOTEMPTY"),
        ("rename moving onto_mixed", "ENOTEMPTY"),
    ] {
        assert_eq!(py_as(&m, 1000, "", args), want, "{args} as uid 1000");
        assert_host_unchanged(&before, &m.host(""), args);
    }
    assert_audited(&audit, "rmdir", "only_file", "EACCES");
    assert_audited(&audit, "rmdir", "only_dir", "EACCES");
    assert_audited(&audit, "rename", "onto", "EACCES");
    assert!(
        audit_lines(&audit)
            .iter()
            .filter(|v| v["errno"] == "EACCES")
            .all(|v| v["uid"] == 1000),
        "refusals are audited as uid 1000"
    );

    // A really empty directory goes; so does a rename onto one.
    assert_eq!(py_as(&m, 1000, "", "rmdir empty"), "ok");
    assert!(!m.host("empty").exists(), "rmdir empty reached the host");
    mkdirp(&m.host("empty2"));
    lchown(m.host("empty2"), Some(1000), Some(1000)).unwrap();
    assert_eq!(py_as(&m, 1000, "", "rename moving empty2"), "ok");
    assert_eq!(fs::read(m.host("empty2/a")).unwrap(), b"a\n");
    assert!(!m.host("moving").exists());
}

// ---------------------------------------------------------------- C2: link counts

#[test]
fn directory_link_counts_do_not_count_hidden_subdirectories() {
    let m = Mount::with("hidden-nlink", Some(HIDE_ENV), None, |src| {
        mkdirp(&src.join("p/a"));
        put(&src.join("p/.env/key"), b"k\n", 0o600);
        put(&src.join("p/f"), b"f\n", 0o644);
        fs::hard_link(src.join("p/f"), src.join("p/f2")).unwrap();
    });
    assert_eq!(
        fs::metadata(m.host("p")).unwrap().nlink(),
        4,
        "host: p, a, .env"
    );
    // lookup / getattr: 1 ("unknown") for every directory, the root included.
    for d in ["", "p", "p/a"] {
        assert_eq!(fs::metadata(m.mnt(d)).unwrap().nlink(), 1, "nlink of {d:?}");
    }
    // Files keep their link count.
    assert_eq!(
        fs::metadata(m.mnt("p/f")).unwrap().nlink(),
        2,
        "nlink of p/f"
    );
    // mkdir's own reply, and readdirplus.
    fs::create_dir(m.mnt("p/new")).unwrap();
    assert_eq!(fs::metadata(m.mnt("p/new")).unwrap().nlink(), 1);
    let o = m.sh("ls -l p >/dev/null && stat -c %h p/a p/new p/f");
    o.assert_ok("ls -l; stat");
    assert_eq!(o.stdout, "1\n1\n2\n");
    // find takes 1 as "unknown" and still finds every visible directory.
    let o = m.sh("find . -type d | sort");
    o.assert_ok("find");
    assert_eq!(o.stdout, ".\n./p\n./p/a\n./p/new\n");
}

#[test]
fn an_allow_all_policy_keeps_the_hosts_link_counts_until_a_reload_hides_something() {
    let allow_all = "mode = \"danger\"\ndefault = \"write\"\n";
    let m = Mount::with("allow-all-nlink", Some(allow_all), None, |src| {
        mkdirp(&src.join("p/a"));
        mkdirp(&src.join("p/.env"));
    });
    assert_eq!(fs::metadata(m.host("p")).unwrap().nlink(), 4);
    assert_eq!(
        fs::metadata(m.mnt("p")).unwrap().nlink(),
        4,
        "allow-all: exact"
    );
    assert_eq!(
        fs::metadata(m.mnt("")).unwrap().nlink(),
        fs::metadata(m.host("")).unwrap().nlink()
    );
    // A reload invalidates cached attributes: the count is 1 at once.
    m.reload_with(HIDE_ENV);
    reloaded(&m, 1);
    assert!(
        eventually(Duration::from_secs(2), || fs::metadata(m.mnt("p"))
            .unwrap()
            .nlink()
            == 1),
        "nlink after the reload: {}",
        fs::metadata(m.mnt("p")).unwrap().nlink()
    );
}

// ---------------------------------------------------------------- D: file capabilities

#[test]
fn setting_file_capabilities_needs_allow_setid_in_the_specs_errno_order() {
    let policy = |setid: bool| {
        format!(
            "mode = \"workspace-write\"\ndefault = \"write\"\nwritable_roots = [\"w\"]\n\
             allow_setid = {setid}\n\
             [[rule]]\npath = \"**/.env\"\naccess = \"none\"\n\
             [[rule]]\npath = \"w/r\"\naccess = \"read\"\n"
        )
    };
    let m = Mount::with("setcap-root", Some(&policy(false)), None, |src| {
        put(&src.join("w/f"), b"#!/bin/sh\n", 0o755);
        put(&src.join("w/.env"), b"SECRET=1\n", 0o600);
        put(&src.join("w/r/f"), b"r\n", 0o755);
        put(&src.join("o/f"), b"o\n", 0o755);
        put(&src.join("w/capped"), b"c\n", 0o755);
        setxattr(&src.join("w/capped"), "security.capability", &cap_v2())
            .expect("host supports file capabilities");
    });
    let cap = cap_v2();
    let before = snapshot(&m.host(""));
    for (p, want, why) in [
        ("w/.env", ENOENT, "hidden: ENOENT first"),
        ("o/f", EPERM, "EPERM before the mode's EROFS"),
        ("w/r/f", EPERM, "EPERM before the rule's EACCES"),
        ("w/f", EPERM, "allowed write, but no allow_setid"),
    ] {
        assert_errno(setxattr(&m.mnt(p), "security.capability", &cap), want, why).ok();
        assert_errno(host_cap(&m.host(p)), ENODATA, &format!("host {p}")).ok();
        assert_host_unchanged(&before, &m.host(""), p);
    }
    // Other attributes are ordinary writes; removing a capability only lowers privilege.
    setxattr(&m.mnt("w/f"), "user.k", b"v").expect("user xattr on a writable file");
    removexattr(&m.mnt("w/capped"), "security.capability").expect("remove a capability");
    assert_errno(host_cap(&m.host("w/capped")), ENODATA, "capability removed").ok();

    m.reload_with(&policy(true));
    reloaded(&m, 1);
    for (p, want, why) in [
        ("w/.env", ENOENT, "hidden"),
        ("o/f", EROFS, "the mode"),
        ("w/r/f", EACCES, "the rule"),
    ] {
        assert_errno(setxattr(&m.mnt(p), "security.capability", &cap), want, why).ok();
        assert_errno(host_cap(&m.host(p)), ENODATA, &format!("host {p}")).ok();
    }
    // With allow_setid the request reaches the host unchanged.
    setxattr(&m.mnt("w/f"), "security.capability", &cap).expect("allow_setid = true");
    assert_eq!(host_cap(&m.host("w/f")).unwrap(), cap);
}

#[test]
fn file_capabilities_from_an_unprivileged_user_namespace() {
    assert_ne!(
        fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .unwrap()
            .trim(),
        "0",
        "this test needs unprivileged user namespaces"
    );
    let b = Mount::builder("setcap-userns");
    let audit = b.root().join("audit.jsonl");
    put(&b.host("tool"), b"#!/bin/sh\n", 0o755);
    chown_r(&b.host(""), 1000);
    let m = b
        .policy(&hide_env_setid(false))
        .arg("--allow-other")
        .arg("--audit")
        .arg(&audit)
        .start();
    let unshare = "unshare -U -r";
    // Root of a new user namespace owned by uid 1000: the kernel lets it set a
    // capability on a file 1000 owns, converted to v3 with rootid 1000.
    assert_eq!(py_as(&m, 1000, unshare, "getuid"), "ok");
    let before = snapshot(&m.host(""));
    assert_eq!(
        py_as(&m, 1000, unshare, &format!("setcap tool {CAP_V2}")),
        "EPERM"
    );
    assert_errno(host_cap(&m.host("tool")), ENODATA, "host tool after EPERM").ok();
    assert_host_unchanged(&before, &m.host(""), "setcap from a user namespace");
    // The daemon refused it (the kernel let it through).
    assert_audited(&audit, "setxattr", "tool", "EPERM");

    // With allow_setid the host gets the namespaced capability: v3, rootid 1000, which
    // takes effect in every user namespace whose root is host uid 1000.
    m.reload_with(&hide_env_setid(true));
    reloaded(&m, 1);
    assert_eq!(
        py_as(&m, 1000, unshare, &format!("setcap tool {CAP_V2}")),
        "ok"
    );
    let v3 = hex("0100000300200000000000000000000000000000e8030000");
    assert_eq!(
        host_cap(&m.host("tool")).unwrap(),
        v3,
        "v3 with rootid 1000"
    );
}

/// `trusted.*` and `security.*` (but file capabilities) need host privilege: root of a
/// user namespace and an ordinary uid get EPERM under a policy that allows every write
/// (the kernel refuses them first on this transport; the daemon would too: vhost-user's
/// unit test), the host unchanged; root here sets one; `user.*` works from the namespace.
#[test]
fn trusted_and_security_attributes_need_host_privilege() {
    let b = Mount::builder("xattr-userns");
    let audit = b.root().join("audit.jsonl");
    put(&b.host("tool"), b"#!/bin/sh\n", 0o755);
    chown_r(&b.host(""), 1000);
    setxattr(&b.host("tool"), "trusted.pre", b"host").expect("host trusted.pre");
    let m = b
        .policy(HIDE_ENV)
        .arg("--allow-other")
        .arg("--audit")
        .arg(&audit)
        .start();
    let unshare = "unshare -U -r";
    let before = snapshot(&m.host(""));
    for wrap in [unshare, ""] {
        for name in ["trusted.x", "security.ima", "security.evm"] {
            let got = py_as(&m, 1000, wrap, &format!("setx tool {name} 0401"));
            assert_eq!(got, "EPERM", "{wrap:?} set {name}");
        }
        let got = py_as(&m, 1000, wrap, "removex tool trusted.pre");
        assert_eq!(got, "EPERM", "{wrap:?} remove trusted.pre");
    }
    assert_host_unchanged(&before, &m.host(""), "trusted/security from uid 1000");
    assert_eq!(lgetxattr(&m.host("tool"), b"trusted.pre").unwrap(), b"host");
    // Root here (CAP_SYS_ADMIN in the daemon's namespace) is asked about by the FUSE
    // workers inside their Landlock domain, and let through.
    setxattr(&m.mnt("tool"), "trusted.root", b"1").expect("root sets trusted.*");
    assert_eq!(lgetxattr(&m.host("tool"), b"trusted.root").unwrap(), b"1");
    assert_eq!(getxattr(&m.mnt("tool"), "trusted.pre").unwrap(), b"host");
    // An owner's own namespace stays open.
    assert_eq!(py_as(&m, 1000, unshare, "setx tool user.ok 01"), "ok");
    assert_eq!(lgetxattr(&m.host("tool"), b"user.ok").unwrap(), [1]);
}
