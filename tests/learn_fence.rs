//! What a learning mount (`--learn`) still refuses, and where its draft goes (issue 32):
//! the policy files (`.fencefs.toml`, the ignore files) stay read-only (EROFS) and their
//! hides stay in force; set-ID bits and device nodes get the EPERM they get without
//! `--learn`; a symlink planted at OUT.toml is replaced by the draft, its target never
//! written. Real mounts, exact errnos, the host unchanged after every refusal.

mod common;

use common::*;
use libc::{ENOENT, EPERM, EROFS};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

const PINNED: [&str; 2] = [".aiignore", ".fencefs.toml"];

fn audit_has(audit: &Path, f: impl Fn(&serde_json::Value) -> bool) -> bool {
    fs::read_to_string(audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|v| f(&v))
}

#[test]
fn a_learning_mount_keeps_the_policy_files_read_only_and_their_hides() {
    let policy = "mode = \"read-only\"\ndefault = \"read\"\n\
                  workspace_policy = \".fencefs.toml\"\nignore_files = [\".aiignore\"]\n";
    let b = Mount::builder("learn-pins").policy(policy);
    put(&b.host(".aiignore"), b"secret.txt\n", 0o644);
    put(
        &b.host(".fencefs.toml"),
        b"[[rule]]\npath = \"vault\"\naccess = \"none\"\n",
        0o644,
    );
    put(&b.host("secret.txt"), b"hidden\n", 0o644);
    put(&b.host("vault/key"), b"hidden too\n", 0o644);
    put(&b.host("evil"), b"", 0o644);
    put(&b.host("plain.txt"), b"old\n", 0o644);
    put(&b.host("deep/.aiignore"), b"x\n", 0o644);
    let audit = b.root().join("audit.jsonl");
    let out = b.root().join("learned.toml");
    let mut m = b
        .arg("--audit")
        .arg(&audit)
        .arg("--learn")
        .arg(&out)
        .start();
    // Report-only: the read-only mode's refusal of an ordinary write is reported.
    fs::write(m.mnt("plain.txt"), b"new\n").expect("report-only write");
    assert_eq!(fs::read(m.host("plain.txt")).unwrap(), b"new\n");
    let before = snapshot(&m.host(""));
    for p in PINNED {
        let f = m.mnt(p);
        assert_errno(fs::write(&f, b""), EROFS, &format!("write {p}")).ok();
        assert_errno(
            fs::OpenOptions::new().append(true).open(&f),
            EROFS,
            &format!("append {p}"),
        )
        .ok();
        assert_errno(truncate(&f, 0), EROFS, &format!("truncate {p}")).ok();
        assert_errno(
            fs::rename(m.mnt("evil"), &f),
            EROFS,
            &format!("rename over {p}"),
        )
        .ok();
        assert_errno(
            fs::rename(&f, m.mnt("moved")),
            EROFS,
            &format!("rename {p} away"),
        )
        .ok();
        assert_errno(fs::remove_file(&f), EROFS, &format!("unlink {p}")).ok();
        assert_errno(chmod(&f, 0o666), EROFS, &format!("chmod {p}")).ok();
    }
    // A directory holding one is not moved away (its patterns would go with it).
    assert_errno(
        fs::rename(m.mnt("deep"), m.mnt("deep2")),
        EROFS,
        "rename deep",
    )
    .ok();
    // A new ignore file that would re-include everything: refused too.
    fs::create_dir(m.mnt("sub")).expect("report-only mkdir");
    let before_sub = snapshot(&m.host(""));
    assert_errno(fs::write(m.mnt("sub/.aiignore"), b"!*\n"), EROFS, "nested").ok();
    assert_host_unchanged(&before_sub, &m.host(""), "a nested ignore file");
    // The hides are still in force, for every read.
    assert_errno(fs::metadata(m.mnt("secret.txt")), ENOENT, "secret.txt").ok();
    assert_errno(fs::read(m.mnt("vault/key")), ENOENT, "vault/key").ok();
    for p in PINNED {
        assert!(
            audit_has(&audit, |v| v["path"] == p
                && v["decision"] == "deny"
                && v["errno"] == "EROFS"),
            "no EROFS refusal of {p} audited"
        );
        assert!(
            !audit_has(&audit, |v| v["path"] == p && v["decision"] == "would-deny"),
            "{p} reported as would-deny"
        );
    }
    m.terminate();
    let sub = m.host("sub");
    fs::remove_dir(&sub).unwrap();
    assert_host_unchanged(&before, &m.host(""), "the policy files through --learn");
    for p in PINNED {
        let mode = fs::metadata(m.host(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{p} mode on the host");
    }
    // The draft grants no change of them either.
    let draft = fs::read_to_string(&out).expect("the draft at unmount");
    let p = fencefs::policy::Policy::parse(&draft, "learned").unwrap();
    let me = fencefs::policy::Caller::new(0, 0);
    for f in PINNED {
        assert!(
            !p.verdict(f.as_bytes(), me).effective.mutates(),
            "{f}\n{draft}"
        );
    }
}

/// chmod with set-ID bits, a set-ID create and device nodes through `m`: their errnos.
fn special_ops(m: &Mount) -> Vec<i32> {
    let dev = |kind: u32| mknod(&m.mnt("dev"), kind | 0o644, libc::makedev(1, 3));
    [
        chmod(&m.mnt("tool"), 0o6755),
        chmod(&m.mnt("tool"), 0o4755),
        chmod(&m.mnt("tool"), 0o2755),
        open_flags(&m.mnt("new"), libc::O_CREAT | libc::O_WRONLY, 0o4755),
        dev(libc::S_IFCHR),
        dev(libc::S_IFBLK),
    ]
    .iter()
    .map(errno_of)
    .collect()
}

#[test]
fn set_id_bits_and_device_nodes_get_the_same_eperm_with_and_without_learn() {
    let mut got = Vec::new();
    for learn in [false, true] {
        let name = format!("learn-setid-{learn}");
        let b = Mount::builder(&name).policy("mode = \"read-only\"\ndefault = \"read\"\n");
        put(&b.host("tool"), b"#!/bin/sh\n", 0o755);
        let out = b.root().join("learned.toml");
        let b = if learn { b.arg("--learn").arg(&out) } else { b };
        let m = b.start();
        let before = snapshot(&m.host(""));
        let errnos = special_ops(&m);
        assert_eq!(errnos, vec![EPERM; errnos.len()], "learn {learn}");
        assert_host_unchanged(&before, &m.host(""), &format!("learn {learn}"));
        assert_eq!(fs::metadata(m.host("tool")).unwrap().mode() & 0o7777, 0o755);
        // Without set-ID bits the same chmod is only reported on the learning mount.
        let plain = chmod(&m.mnt("tool"), 0o700);
        if learn {
            plain.expect("report-only chmod");
        } else {
            assert_errno(plain, EROFS, "read-only chmod").ok();
        }
        got.push(errnos);
    }
    assert_eq!(got[0], got[1]);
}

#[test]
fn a_symlink_at_out_is_replaced_by_the_draft_and_its_target_untouched() {
    let b =
        Mount::builder("learn-out-symlink").policy("mode = \"read-only\"\ndefault = \"read\"\n");
    put(&b.host("a.txt"), b"a\n", 0o644);
    let victims = [b.outside().join("victim1"), b.outside().join("victim2")];
    for v in &victims {
        put(v, b"root's file\n", 0o644);
    }
    // Planted by an earlier session: OUT.toml, inside SOURCE, is a symlink.
    let out = b.host("learned.toml");
    symlink(&victims[0], &out);
    let sock = b.outside().join("ctl.sock");
    let mut m = b
        .arg("--learn")
        .arg(&out)
        .arg("--control")
        .arg(&sock)
        .start();
    fs::read(m.mnt("a.txt")).unwrap();
    let untouched = |what: &str| {
        for v in &victims {
            assert_eq!(fs::read(v).unwrap(), b"root's file\n", "{what}: {v:?}");
        }
    };
    untouched("at mount");
    // `{"cmd":"learn"}`: the draft replaces the symlink.
    let a = Peer::connect(&sock).call(serde_json::json!({"cmd": "learn"}));
    assert_eq!(a["ok"], true, "{a}");
    untouched("after learn");
    let draft_at = |what: &str| {
        let md = fs::symlink_metadata(&out).unwrap();
        assert!(md.file_type().is_file(), "{what}: OUT a regular file");
        assert_eq!(md.mode() & 0o7777, 0o600, "{what}: OUT's mode");
        let text = fs::read_to_string(&out).unwrap();
        fencefs::policy::Policy::parse(&text, "learned").unwrap_or_else(|e| panic!("{e:?}"));
        assert!(text.contains("a.txt"), "{what}: {text}");
    };
    draft_at("after learn");
    assert_eq!(
        a["bytes"].as_u64().unwrap(),
        fs::metadata(&out).unwrap().len()
    );
    // The agent plants one again through the mount (report-only lets it): replaced again.
    m.sh("ln -sfn \"$1\" learned.toml"
        .replace("$1", victims[1].to_str().unwrap())
        .as_str())
        .assert_ok("plant a symlink through the mount");
    assert!(fs::symlink_metadata(&out).unwrap().file_type().is_symlink());
    m.terminate();
    untouched("after unmount");
    draft_at("after unmount");
    let left: Vec<_> = fs::read_dir(m.host(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".fencefs-learn"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}
