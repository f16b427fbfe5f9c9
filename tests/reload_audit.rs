//! Live policy (SIGHUP reload) and the audit trail, against a real mount.

mod common;

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const OPEN: &str = "mode = \"danger\"\ndefault = \"write\"\n";

fn hide(path: &str) -> String {
    format!("{OPEN}[[rule]]\npath = \"{path}\"\naccess = \"none\"\n")
}

#[test]
fn reload_hides_a_cached_path_within_one_second() {
    let m = Mount::with("reload-hide", Some(OPEN), None, |src| {
        mkdirp(&src.join("a"));
        put(&src.join("a/secret.txt"), b"s3cret", 0o644);
        put(&src.join("a/plain.txt"), b"plain", 0o644);
    });
    // Warm the kernel caches: entry, attributes and the listing.
    assert!(fs::metadata(m.mnt("a/secret.txt")).is_ok());
    assert_eq!(read_all(&m.mnt("a/secret.txt")).unwrap(), b"s3cret");
    assert!(
        names_str(&m.mnt("a"))
            .unwrap()
            .contains(&"secret.txt".to_string())
    );

    let start = Instant::now();
    m.reload_with(&hide("a/secret.txt"));
    // Requests the daemon answers see the new policy at once, the kernel's caches a moment
    // later (the notify thread): both the name and the listing must be gone within 1 s.
    let hidden = eventually(Duration::from_secs(1), || {
        errno_of(&fs::metadata(m.mnt("a/secret.txt"))) == libc::ENOENT
            && !names_str(&m.mnt("a"))
                .unwrap()
                .contains(&"secret.txt".to_string())
    });
    let took = start.elapsed();
    assert!(
        hidden,
        "still visible {took:?} after SIGHUP; stderr:\n{}",
        m.stderr()
    );
    eprintln!("reload: SIGHUP → hidden path ENOENT in {took:?}");
    assert!(
        !names_str(&m.mnt("a"))
            .unwrap()
            .contains(&"secret.txt".to_string())
    );
    let _ = assert_errno(
        read_all(&m.mnt("a/secret.txt")),
        libc::ENOENT,
        "open after reload",
    );
    assert_eq!(read_all(&m.mnt("a/plain.txt")).unwrap(), b"plain");
    assert!(m.stderr().contains("generation 1"), "{}", m.stderr());

    // And back: unhidden again after the next reload.
    m.reload_with(OPEN);
    assert!(eventually(Duration::from_secs(1), || fs::metadata(
        m.mnt("a/secret.txt")
    )
    .is_ok()));
}

#[test]
fn open_handles_keep_their_access_without_revoke() {
    let m = Mount::with("reload-keep", Some(OPEN), None, |src| {
        put(&src.join("f"), b"0123456789", 0o644);
    });
    let r = fs::File::open(m.mnt("f")).unwrap();
    let w = OpenOptions::new().write(true).open(m.mnt("f")).unwrap();
    m.reload_with("mode = \"read-only\"\n[[rule]]\npath = \"f\"\naccess = \"none\"\n");
    assert!(eventually(Duration::from_secs(1), || errno_of(
        &fs::metadata(m.mnt("f"))
    ) == libc::ENOENT));
    let mut buf = [0u8; 4];
    r.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"0123");
    w.write_all_at(b"AB", 0).unwrap();
    drop(w);
    assert_eq!(fs::read(m.host("f")).unwrap(), b"AB23456789");
}

#[test]
fn revoke_stops_io_on_handles_opened_before_a_reload() {
    let m = Mount::builder("reload-revoke").policy(OPEN).arg("--revoke");
    put(&m.host("hidden-later"), b"0123456789", 0o644);
    put(&m.host("ro-later"), b"abcdefghij", 0o644);
    let m = m.start();
    assert!(
        eventually(Duration::from_secs(2), || m.stderr().contains("--revoke")),
        "{}",
        m.stderr()
    );

    let mut r = fs::File::open(m.mnt("hidden-later")).unwrap();
    let mut w = OpenOptions::new()
        .write(true)
        .open(m.mnt("ro-later"))
        .unwrap();
    let mut buf = [0u8; 4];
    r.read_exact(&mut buf).unwrap();
    w.write_all(b"XY").unwrap();

    // Hide one file, make everything read-only.
    m.reload_with(
        "mode = \"read-only\"\ndefault = \"write\"\n[[rule]]\npath = \"hidden-later\"\naccess = \"none\"\n",
    );
    assert!(eventually(Duration::from_secs(1), || m
        .stderr()
        .contains("generation 1")));
    r.seek(SeekFrom::Start(0)).unwrap();
    let _ = assert_errno(
        r.read(&mut buf),
        libc::ENOENT,
        "read through a handle of a now hidden file",
    );
    let _ = assert_errno(
        w.write(b"ZZ"),
        libc::EROFS,
        "write through a handle after read-only reload",
    );
    assert_eq!(fs::read(m.host("ro-later")).unwrap(), b"XYcdefghij");
    assert_eq!(fs::read(m.host("hidden-later")).unwrap(), b"0123456789");
}

#[test]
fn an_invalid_reload_keeps_the_old_policy() {
    let m = Mount::with("reload-invalid", Some(&hide("secret")), None, |src| {
        put(&src.join("secret"), b"x", 0o644);
        put(&src.join("open"), b"y", 0o644);
    });
    let _ = assert_errno(fs::metadata(m.mnt("secret")), libc::ENOENT, "hidden before");
    for bad in [
        "mode = \"danger\"\n[[rule]]\npath = \"/abs\"\naccess = \"none\"\n",
        "mode = \"danger\"\n[[rule]]\npath = \"secret\"\naccess = \"rw\"\n",
        "mode = \"danger\"\nbogus = 1\n",
        "mode = \"danger\"\n[[rule]]\npath = \"a/../b\"\naccess = \"none\"\n",
        "mode = \"danger\"\n[[rule]]\npath = \"a[\"\naccess = \"none\"\n",
        "this is not toml [",
    ] {
        let before = m.stderr().matches("reload refused").count();
        m.reload_with(bad);
        assert!(
            eventually(Duration::from_secs(2), || m
                .stderr()
                .matches("reload refused")
                .count()
                > before),
            "no refusal logged for {bad:?}:\n{}",
            m.stderr()
        );
        let _ = assert_errno(fs::metadata(m.mnt("secret")), libc::ENOENT, "still hidden");
        assert_eq!(read_all(&m.mnt("open")).unwrap(), b"y");
    }
    let log = m.stderr();
    let pol = m.policy_path().display().to_string();
    assert!(
        log.contains(&format!("{pol}:3:8")),
        "file:line:column missing:\n{log}"
    );
    assert!(!log.contains("generation 1"), "{log}");
    m.reload_with(OPEN);
    assert!(eventually(Duration::from_secs(1), || fs::metadata(
        m.mnt("secret")
    )
    .is_ok()));
}

#[test]
fn a_sighup_storm_under_load_never_fails_an_allowed_operation() {
    let a = format!(
        "{}[[rule]]\npath = \"docs\"\naccess = \"read\"\n",
        hide("secret")
    );
    let b = format!(
        "{}[[rule]]\npath = \"other\"\naccess = \"none\"\n",
        hide("secret")
    );
    let m = Mount::with("reload-storm", Some(&a), None, |src| {
        put(&src.join("secret"), b"never", 0o644);
        mkdirp(&src.join("work"));
        for i in 0..4 {
            put(&src.join(format!("work/f{i}")), b"start", 0o644);
        }
    });
    let mnt = m.mnt("");
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for i in 0..4 {
        let (stop, ops, mnt) = (stop.clone(), ops.clone(), mnt.clone());
        workers.push(thread::spawn(move || -> Result<(), String> {
            let p = mnt.join(format!("work/f{i}"));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let data = format!("round {n} of worker {i}");
                fs::write(&p, &data).map_err(|e| format!("write {}: {e}", p.display()))?;
                let back = fs::read(&p).map_err(|e| format!("read {}: {e}", p.display()))?;
                if back != data.as_bytes() {
                    return Err(format!("read back {:?}", String::from_utf8_lossy(&back)));
                }
                match fs::read(mnt.join("secret")) {
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    other => return Err(format!("secret read gave {other:?}")),
                }
                n += 1;
                ops.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }));
    }
    for i in 0..300 {
        // Replace the file atomically, as an operator's tooling should.
        let tmp = m.root().join("policy.tmp");
        fs::write(&tmp, if i % 2 == 0 { &b } else { &a }).unwrap();
        fs::rename(&tmp, m.policy_path()).unwrap();
        m.reload();
        thread::sleep(Duration::from_millis(3));
    }
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap().unwrap();
    }
    assert!(ops.load(Ordering::Relaxed) > 100, "too little work done");
    assert!(m.is_mounted());
    assert!(m.stderr().contains("policy reloaded"), "{}", m.stderr());
}

/// The request lines of the audit file at `p` (a reload's own `policy_reload` line left
/// out).
fn audit_lines(p: &Path) -> Vec<serde_json::Value> {
    let text = fs::read_to_string(p).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter(|l: &serde_json::Value| l["event"] != "policy_reload")
        .collect()
}

#[test]
fn audit_lines_name_the_deciding_rule_for_each_refusal_class() {
    let policy = "mode = \"workspace-write\"\ndefault = \"write\"\nwritable_roots = [\"work\"]\n\
                  [[rule]]\npath = \"secrets\"\naccess = \"none\"\n\
                  [[rule]]\npath = \"work/docs\"\naccess = \"read\"\n";
    let mut b = Mount::builder("audit-classes").policy(policy);
    let audit = b.root().join("audit.jsonl");
    b = b.arg("--audit").arg(&audit);
    mkdirp(&b.host("secrets"));
    put(&b.host("secrets/key"), b"k", 0o600);
    mkdirp(&b.host("work/docs"));
    put(&b.host("work/docs/d.md"), b"d", 0o644);
    put(&b.host("top.txt"), b"t", 0o644);
    let m = b.start();

    let _ = assert_errno(read_all(&m.mnt("secrets/key")), libc::ENOENT, "hidden");
    let _ = assert_errno(
        fs::write(m.mnt("top.txt"), b"x"),
        libc::EROFS,
        "outside roots",
    );
    let _ = assert_errno(
        fs::write(m.mnt("work/docs/d.md"), b"x"),
        libc::EACCES,
        "rule read",
    );
    let _ = assert_errno(
        mknod(&m.mnt("work/dev"), libc::S_IFCHR | 0o600, 0x0103),
        libc::EPERM,
        "device",
    );
    assert!(eventually(Duration::from_secs(3), || audit_lines(&audit)
        .len()
        >= 4));
    let lines = audit_lines(&audit);
    let find = |errno: &str| {
        lines
            .iter()
            .find(|l| l["errno"] == errno)
            .unwrap_or_else(|| panic!("no {errno} line in {lines:#?}"))
            .clone()
    };
    let l = find("ENOENT");
    assert_eq!(l["decision"], "deny");
    // The kernel looks up the hidden directory first: that lookup is refused.
    assert_eq!(l["path"], "secrets");
    assert_eq!(l["op"], "lookup");
    assert_eq!(l["by"], "rule");
    assert_eq!(l["rule"], "secrets");
    assert_eq!(l["access"], "none");
    assert_eq!(l["mode"], "workspace-write");
    assert_eq!(l["uid"], 0);
    assert!(l["pid"].as_u64().unwrap() > 0);
    assert_eq!(l["generation"], 0);
    assert!(l["ts"].as_str().unwrap().ends_with('Z'));
    // The first refusal of a key is written at once, standing for itself.
    assert_eq!(l["repeat"], 1);
    let l = find("EROFS");
    assert_eq!(l["path"], "top.txt");
    // The mode refused because the path is outside every writable_roots entry.
    assert_eq!(l["by"], "writable_roots");
    // Every key is present; what does not apply is null.
    assert!(l["rule"].is_null() && l.get("rule").is_some(), "{l}");
    assert!(
        l["rule_line"].is_null() && l.get("rule_line").is_some(),
        "{l}"
    );
    let l = find("EACCES");
    assert_eq!(l["path"], "work/docs/d.md");
    assert_eq!(l["rule"], "work/docs");
    assert_eq!(l["access"], "read");
    let l = find("EPERM");
    assert_eq!(l["path"], "work/dev");
    assert_eq!(l["by"], "mode");
    // Refusals only, by default.
    assert!(lines.iter().all(|l| l["decision"] == "deny"), "{lines:#?}");

    // SIGHUP bumps the generation and reopens the file (logrotate).
    let rotated = m.root().join("audit.jsonl.1");
    fs::rename(&audit, &rotated).unwrap();
    m.reload();
    // Once the kernel has dropped its caches (the hidden name's negative entry among them),
    // the next lookup reaches the daemon again.
    assert!(
        eventually(Duration::from_secs(2), || m
            .stderr()
            .contains("policy reloaded")),
        "{}",
        m.stderr()
    );
    assert!(m.stderr().contains("generation 1"), "{}", m.stderr());
    let _ = assert_errno(
        read_all(&m.mnt("secrets/key")),
        libc::ENOENT,
        "hidden after reload",
    );
    // The same refusal as the first one above (uid, op, path, errno): if it came within
    // 1 s of that one it is coalesced, and its line comes when the window ends (≤ 1 s)
    // with the fields of the last refusal. Either way it lands in the reopened file and
    // says generation 1.
    assert!(eventually(Duration::from_secs(3), || !audit_lines(&audit).is_empty()));
    let l = &audit_lines(&audit)[0];
    assert_eq!(l["generation"], 1, "{l}");
    assert_eq!(l["path"], "secrets", "{l}");
    assert_eq!(l["repeat"], 1, "{l}");
    // The old lines stayed in the renamed file.
    assert!(audit_lines(&rotated).iter().all(|l| l["generation"] == 0));
}

/// SPEC "Audit": a mode refusal names what in the mode refused — the `protected` entry
/// (with its line), `writable_roots`, or the read-only mode itself.
#[test]
fn audit_names_the_protected_entry_or_writable_roots() {
    let policy = "mode = \"workspace-write\"\nwritable_roots = [\"work\", \".git\"]\n\
                  protected = [\n    \".git/hooks\",\n    \".git/config\",\n]\n";
    let mut b = Mount::builder("audit-ceiling").policy(policy);
    let audit = b.root().join("audit.jsonl");
    b = b.arg("--audit").arg(&audit);
    mkdirp(&b.host(".git/hooks"));
    put(&b.host(".git/config"), b"[core]\n", 0o644);
    mkdirp(&b.host("work"));
    put(&b.host("top.txt"), b"t", 0o644);
    let m = b.start();
    let before = snapshot(&m.host(""));

    let _ = assert_errno(
        fs::create_dir(m.mnt(".git/hooks/x")),
        libc::EROFS,
        "mkdir .git/hooks/x",
    );
    let _ = assert_errno(
        fs::write(m.mnt(".git/config"), b"[core]\nhooksPath = /tmp\n"),
        libc::EROFS,
        "write .git/config",
    );
    let _ = assert_errno(
        fs::write(m.mnt("top.txt"), b"x"),
        libc::EROFS,
        "write outside writable_roots",
    );
    let _ = assert_errno(
        fs::write(m.mnt("new.txt"), b"x"),
        libc::EROFS,
        "create outside writable_roots",
    );
    assert!(eventually(Duration::from_secs(3), || audit_lines(&audit)
        .len()
        >= 4));
    let lines = audit_lines(&audit);
    let find = |path: &str| {
        lines
            .iter()
            .find(|l| l["path"] == path && l["errno"] == "EROFS")
            .unwrap_or_else(|| panic!("no EROFS line for {path} in {lines:#?}"))
            .clone()
    };
    let l = find(".git/hooks/x");
    assert_eq!(l["op"], "mkdir", "{l}");
    assert_eq!(l["by"], "protected", "{l}");
    assert_eq!(l["rule"], ".git/hooks", "{l}");
    assert_eq!(l["rule_line"], 4, "{l}");
    assert_eq!(l["access"], "read", "{l}");
    let l = find(".git/config");
    assert_eq!(
        (&l["by"], &l["rule"], &l["rule_line"]),
        (&"protected".into(), &".git/config".into(), &5.into()),
        "{l}"
    );
    for path in ["top.txt", "new.txt"] {
        let l = find(path);
        assert_eq!(l["by"], "writable_roots", "{l}");
        assert!(l["rule"].is_null() && l["rule_line"].is_null(), "{l}");
    }
    assert_host_unchanged(&before, &m.host(""), "after the mode refusals");

    // The built-in protected list has no line in the file: rule_line is null. Read-only
    // mode says "mode".
    m.reload_with("mode = \"workspace-write\"\n");
    assert!(eventually(Duration::from_secs(2), || m
        .stderr()
        .contains("generation 1")));
    let _ = assert_errno(
        fs::create_dir(m.mnt(".git/hooks/y")),
        libc::EROFS,
        "mkdir under the default protected list",
    );
    m.reload_with("mode = \"read-only\"\n");
    assert!(eventually(Duration::from_secs(2), || m
        .stderr()
        .contains("generation 2")));
    let _ = assert_errno(
        fs::write(m.mnt("work/ro.txt"), b"x"),
        libc::EROFS,
        "create in read-only mode",
    );
    assert!(eventually(Duration::from_secs(3), || audit_lines(&audit)
        .iter()
        .any(|l| l["path"] == "work/ro.txt")));
    let lines = audit_lines(&audit);
    let l = lines
        .iter()
        .find(|l| l["path"] == ".git/hooks/y")
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert_eq!(
        (&l["by"], &l["rule"]),
        (&"protected".into(), &".git/hooks".into()),
        "{l}"
    );
    assert!(l["rule_line"].is_null(), "{l}");
    let l = lines.iter().find(|l| l["path"] == "work/ro.txt").unwrap();
    assert_eq!(
        (&l["by"], &l["errno"]),
        (&"mode".into(), &"EROFS".into()),
        "{l}"
    );
    assert!(l["rule"].is_null(), "{l}");
}

#[test]
fn audit_allowed_logs_allowed_operations_too() {
    let mut b = Mount::builder("audit-allowed").policy(OPEN);
    let audit = b.root().join("audit.jsonl");
    b = b.arg("--audit").arg(&audit).arg("--audit-allowed");
    put(&b.host("f"), b"x", 0o644);
    let m = b.start();
    assert_eq!(read_all(&m.mnt("f")).unwrap(), b"x");
    assert!(eventually(Duration::from_secs(3), || audit_lines(&audit)
        .iter()
        .any(|l| l["op"] == "open"
            && l["decision"] == "allow"
            && l["path"] == "f")));
}

#[test]
fn audit_to_a_full_file_system_never_stalls_the_mount() {
    let mut b = Mount::builder("audit-full").policy(OPEN);
    let full = b.root().join("tiny");
    fs::create_dir_all(&full).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&full)
        .status()
        .expect("mount tmpfs");
    assert!(st.success(), "mounting a tiny tmpfs failed");
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _guard = Umount(full.clone());
    // Fill it up.
    let mut filler = fs::File::create(full.join("filler")).unwrap();
    let chunk = vec![0u8; 4096];
    while filler.write_all(&chunk).is_ok() {}
    drop(filler);
    b = b
        .arg("--audit")
        .arg(full.join("audit.jsonl"))
        .arg("--audit-allowed");
    for i in 0..200 {
        put(&b.host(format!("f{i}")), b"x", 0o644);
    }
    let mut m = b.start();
    let start = Instant::now();
    for round in 0..25 {
        for i in 0..200 {
            let p = m.mnt(format!("f{i}"));
            assert_eq!(read_all(&p).unwrap(), b"x", "round {round}");
        }
    }
    let took = start.elapsed();
    assert!(m.is_mounted());
    assert!(took < Duration::from_secs(60), "5,000 opens took {took:?}");
    // Stop the daemon, unmount the tmpfs, then let the fixture remove the workspace.
    m.terminate();
    drop(_guard);
    drop(m);
}

/// Symlink targets are cached by the kernel (FUSE_CACHE_SYMLINKS); a reload that hides a
/// symlink takes the cached target back with everything else.
#[test]
fn reload_hides_a_cached_symlink_target() {
    let m = Mount::with("reload-symlink", Some(OPEN), None, |src| {
        mkdirp(&src.join("a"));
        std::os::unix::fs::symlink("target-name", src.join("a/link")).unwrap();
    });
    // Through a handle of the symlink itself: no lookup stands between it and the cache.
    let c = std::ffi::CString::new(m.mnt("a/link").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0, "open O_PATH: {}", std::io::Error::last_os_error());
    let readlink = || -> std::io::Result<Vec<u8>> {
        let mut buf = [0u8; 256];
        // SAFETY: a valid fd, an empty NUL-terminated path, a buffer of the given length.
        let n = unsafe { libc::readlinkat(fd, c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(buf[..n as usize].to_vec())
    };
    for _ in 0..3 {
        assert_eq!(readlink().unwrap(), b"target-name");
    }
    m.reload_with(&hide("a/link"));
    let gone = eventually(Duration::from_secs(1), || {
        errno_of(&readlink()) == libc::ENOENT
            && errno_of(&fs::read_link(m.mnt("a/link"))) == libc::ENOENT
    });
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    assert!(
        gone,
        "readlink still answered after the reload: {}",
        m.stderr()
    );
}
