//! Ignore files through a real mount (SPEC "Policy layers, presets and ignore files"):
//! `ignore_files` hide what they match for every process (ENOENT, unlisted, EACCES to
//! create), they and the workspace layer are read-only to every caller in danger mode too
//! (EROFS, the host unchanged), host edits written in place take effect like a reload
//! (debounced: never half-written), a broken edit keeps the old policy with its position
//! logged, and a repository over the scan's bounds is refused.

#[path = "common/mod.rs"]
mod common;

use common::*;
use libc::{EACCES, ENOENT, EROFS};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const POLICY: &str = "mode = \"danger\"\nworkspace_policy = \".fencefs.toml\"\n\
                      ignore_files = [\".aiignore\", \".cursorignore\"]\n";

fn gone(p: &Path) -> bool {
    matches!(fs::symlink_metadata(p), Err(e) if e.raw_os_error() == Some(ENOENT))
}

#[test]
fn ignore_files_hide_what_they_match_for_every_process() {
    let b = Mount::builder("ignore-hide").policy(POLICY);
    put(
        &b.host(".aiignore"),
        b"# keys\n*.key\n!pub.key\nbuild/\n/top\n",
        0o644,
    );
    put(&b.host("sub/.cursorignore"), b"!sub.key\n*.txt\n", 0o644);
    for f in [
        "a.key",
        "pub.key",
        "build/out",
        "d/build",
        "top",
        "d/top",
        "sub/sub.key",
    ] {
        put(&b.host(f), b"data\n", 0o644);
    }
    put(&b.host("sub/x.key"), b"secret\n", 0o600);
    put(&b.host("sub/n.txt"), b"n\n", 0o644);
    put(&b.host("n.txt"), b"n\n", 0o644);
    let m = b.start();

    for hidden in [
        "a.key",
        "build",
        "build/out",
        "top",
        "sub/x.key",
        "sub/n.txt",
    ] {
        assert_errno(fs::metadata(m.mnt(hidden)), ENOENT, hidden).ok();
    }
    for shown in [
        "pub.key",
        "d/build",
        "d/top",
        "sub/sub.key",
        "n.txt",
        ".aiignore",
    ] {
        assert!(
            fs::metadata(m.mnt(shown)).is_ok(),
            "{shown} should be visible"
        );
    }
    // Unlisted, and hidden for real programs too.
    let root = names(&m.mnt("")).unwrap();
    assert!(!root.contains(&b"a.key".to_vec()) && !root.contains(&b"build".to_vec()));
    assert!(root.contains(&b"pub.key".to_vec()));
    m.sh("cat a.key").assert_fail("cat a.key");
    let found = m
        .sh("find . -name '*.key' | sort")
        .assert_ok("find")
        .stdout
        .clone();
    assert_eq!(found, "./pub.key\n./sub/sub.key\n");
    // Creating a hidden name: EACCES, the host file untouched.
    assert_errno(fs::write(m.mnt("a.key"), b"over"), EACCES, "create a.key").ok();
    assert_errno(fs::write(m.mnt("new.key"), b"x"), EACCES, "create new.key").ok();
    assert_eq!(fs::read(m.host("a.key")).unwrap(), b"data\n");
    assert!(!m.host("new.key").exists());
    // The ignore files themselves stay readable.
    assert_eq!(
        read_all(&m.mnt("sub/.cursorignore")).unwrap(),
        b"!sub.key\n*.txt\n"
    );
}

#[test]
fn ignore_files_and_the_workspace_layer_are_read_only_in_danger_mode() {
    use std::os::unix::fs::symlink as ln_s;
    let b = Mount::builder("ignore-ro").policy(POLICY);
    let layer = b"[[rule]]\npath = \"docs\"\naccess = \"read\"\n";
    put(&b.host(".fencefs.toml"), layer, 0o644);
    put(&b.host(".aiignore"), b"*.key\n", 0o644);
    put(&b.host("sub/.aiignore"), b"*.pem\n", 0o644);
    put(&b.host("a/b/.cursorignore"), b"x\n", 0o644);
    put(&b.host("evil"), b"!*\n", 0o644);
    fs::create_dir_all(b.host("empty")).unwrap();
    let m = b.start();
    let pinned: Vec<(&str, Vec<u8>)> = [
        ".fencefs.toml",
        ".aiignore",
        "sub/.aiignore",
        "a/b/.cursorignore",
    ]
    .iter()
    .map(|p| (*p, fs::read(m.host(p)).unwrap()))
    .collect();
    for (p, _) in &pinned {
        let f = m.mnt(p);
        assert_errno(fs::write(&f, b"!*\n"), EROFS, &format!("write {p}")).ok();
        assert_errno(
            fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .and_then(|f| f.set_len(0)),
            EROFS,
            &format!("truncate {p}"),
        )
        .ok();
        assert_errno(
            fs::OpenOptions::new().append(true).open(&f),
            EROFS,
            &format!("open {p} for append"),
        )
        .ok();
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
        assert_errno(
            fs::set_permissions(&f, fs::Permissions::from_mode(0o666)),
            EROFS,
            &format!("chmod {p}"),
        )
        .ok();
        // A second name would be a way to write it.
        assert_errno(
            fs::hard_link(&f, m.mnt("alias")),
            EROFS,
            &format!("link {p}"),
        )
        .ok();
    }
    // A new ignore file anywhere (it could re-include with `!`): refused, a symlink too.
    fs::write(m.mnt("d.aiignore-no"), b"").expect("an ordinary name");
    fs::create_dir(m.mnt("newdir")).unwrap();
    assert_errno(
        fs::write(m.mnt("newdir/.aiignore"), b"!*\n"),
        EROFS,
        "create nested",
    )
    .ok();
    assert_errno(
        ln_s("/etc/passwd", m.mnt("newdir/.cursorignore")),
        EROFS,
        "symlink",
    )
    .ok();
    // Replacing the directory holding one: moved away, renamed over, or an ancestor moved.
    assert_errno(fs::rename(m.mnt("sub"), m.mnt("sub2")), EROFS, "rename sub").ok();
    assert_errno(
        fs::rename(m.mnt("a"), m.mnt("z")),
        EROFS,
        "rename a (holds a/b)",
    )
    .ok();
    assert_errno(
        fs::rename(m.mnt("empty"), m.mnt("sub")),
        EROFS,
        "rename over sub",
    )
    .ok();
    assert_errno(fs::remove_dir(m.mnt("sub")), libc::ENOTEMPTY, "rmdir sub").ok();
    // The host is unchanged.
    for (p, bytes) in &pinned {
        assert_eq!(
            &fs::read(m.host(p)).unwrap(),
            bytes,
            "{p} changed on the host"
        );
        let mode = fs::metadata(m.host(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{p} mode changed on the host");
    }
    for p in [
        "moved",
        "alias",
        "newdir/.aiignore",
        "newdir/.cursorignore",
        "sub2",
        "z",
    ] {
        assert!(
            !m.host(p).exists() && fs::symlink_metadata(m.host(p)).is_err(),
            "{p} exists on the host"
        );
    }
    assert!(m.host("empty").is_dir() && m.host("sub/.aiignore").is_file());
}

#[test]
fn host_edits_written_in_place_reload_whole_and_a_broken_edit_keeps_the_old_policy() {
    let b = Mount::builder("ignore-edit").policy(POLICY);
    put(&b.host(".aiignore"), b"*.key\n", 0o644);
    put(
        &b.host(".fencefs.toml"),
        b"[[rule]]\npath = \"docs\"\naccess = \"none\"\n",
        0o644,
    );
    for f in ["a.key", "b.pem", "docs/a", "deep/er/c.pem", "deep/er/d.txt"] {
        put(&b.host(f), b"data\n", 0o644);
    }
    let m = b.start();
    assert!(gone(&m.mnt("a.key")) && gone(&m.mnt("docs/a")));
    // Cached by the kernel before the edit.
    assert!(fs::metadata(m.mnt("b.pem")).is_ok());

    // A plain fs::write (truncate, then write) of the ignore file: picked up whole.
    fs::write(m.host(".aiignore"), b"*.key\n*.pem\n").unwrap();
    assert!(
        eventually(Duration::from_secs(10), || gone(&m.mnt("b.pem"))),
        "the in-place edit of .aiignore did not take effect:\n{}",
        m.stderr()
    );
    assert!(gone(&m.mnt("a.key")) && gone(&m.mnt("deep/er/c.pem")));
    // A new nested ignore file in a directory the mount never looked at.
    fs::write(m.host("deep/er/.cursorignore"), b"*.txt\n").unwrap();
    assert!(
        eventually(Duration::from_secs(10), || gone(&m.mnt("deep/er/d.txt"))),
        "a new nested ignore file did not take effect:\n{}",
        m.stderr()
    );

    // A slow in-place write of the workspace layer (truncated, a pause, then written):
    // never loaded half-written, so docs stays hidden the whole time.
    let seen = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let (seen, stop, p) = (seen.clone(), stop.clone(), m.mnt("docs/a"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if fs::metadata(&p).is_ok() {
                    seen.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let next = b"[[rule]]\npath = \"docs\"\naccess = \"none\"\n[[rule]]\npath = \"n.txt\"\naccess = \"read\"\n";
    put(&m.host("n.txt"), b"n\n", 0o644);
    {
        use std::io::Write;
        let mut f = fs::File::create(m.host(".fencefs.toml")).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        f.write_all(next).unwrap();
    }
    let took = eventually(
        Duration::from_secs(10),
        || matches!(fs::write(m.mnt("n.txt"), b"x"), Err(e) if e.raw_os_error() == Some(EACCES)),
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    probe.join().unwrap();
    assert!(
        took,
        "the in-place edit of .fencefs.toml did not take effect:\n{}",
        m.stderr()
    );
    assert!(
        !seen.load(Ordering::Relaxed),
        "docs/a was visible during the edit: the half-written (empty) layer was loaded"
    );

    // A broken edit (in place) keeps the old policy; the error names file:line:column.
    for (file, text, at) in [
        (
            ".aiignore",
            &b"*.key\nok\na{b\n"[..],
            "SOURCE/.aiignore:3:1:",
        ),
        (
            ".fencefs.toml",
            &b"[[rule]]\npath = \"docs\"\naccess = \"nope\"\n"[..],
            "SOURCE/.fencefs.toml:3:10:",
        ),
    ] {
        let before = m.stderr().len();
        fs::write(m.host(file), text).unwrap();
        assert!(
            eventually(Duration::from_secs(10), || m.stderr()[before..]
                .contains(at)),
            "the broken {file}'s error was not logged:\n{}",
            m.stderr()
        );
        assert!(
            gone(&m.mnt("b.pem")) && gone(&m.mnt("docs/a")),
            "the old policy stays after a broken {file}"
        );
    }
}

#[test]
fn a_storm_of_host_edits_is_coalesced_and_the_last_state_wins() {
    let b = Mount::builder("ignore-storm").policy(POLICY);
    put(&b.host(".aiignore"), b"x0\n", 0o644);
    for f in ["x0", "x1", "last"] {
        put(&b.host(f), b"data\n", 0o644);
    }
    let m = b.start();
    let before = m.stderr().matches("policy reloaded").count();
    // 3 s of rewrites as fast as the host can: the watch must not reload each one.
    let t0 = std::time::Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_secs(3) {
        fs::write(m.host(".aiignore"), format!("x{}\n", n % 2)).unwrap();
        n += 1;
    }
    fs::write(m.host(".aiignore"), b"last\n").unwrap();
    assert!(
        eventually(Duration::from_secs(10), || gone(&m.mnt("last"))),
        "the last edit of the storm did not take effect:\n{}",
        m.stderr()
    );
    // The mount answered all along and afterwards.
    assert!(fs::metadata(m.mnt("x0")).is_ok() && fs::metadata(m.mnt("x1")).is_ok());
    std::thread::sleep(Duration::from_millis(1500));
    let reloads = m.stderr().matches("policy reloaded").count() - before;
    // At most one reload a second (MIN_GAP), plus the last one: well below the edits.
    assert!(n > 50, "the storm wrote only {n} times");
    assert!(reloads <= 8, "{reloads} reloads for {n} host edits in 3 s");
    assert!(reloads >= 1);
}

#[test]
fn a_repository_over_the_ignore_file_bound_is_refused() {
    let ws = Workspace::new("ignore-bound");
    for k in 0..1001 {
        put(&ws.src().join(format!("d{k}/.aiignore")), b"x\n", 0o644);
    }
    fs::write(ws.policy_path(), POLICY).unwrap();
    let mnt = ws.mnt_dir();
    let out = run_fencefs(
        [
            "mount".as_ref(),
            "-p".as_ref(),
            ws.policy_path().as_os_str(),
            ws.src().as_os_str(),
            mnt.as_os_str(),
        ],
        Duration::from_secs(60),
    );
    // Never leave a mount behind, whatever happened.
    let _ = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status();
    assert!(!out.ok(), "the mount should be refused:\n{}", out.stderr);
    assert!(
        out.stderr.contains("more than 1000 ignore files"),
        "the refusal should say why:\n{}",
        out.stderr
    );
}

#[test]
fn explain_with_source_names_the_ignore_file_and_line() {
    let ws = Workspace::new("ignore-explain");
    put(&ws.src().join("d/.aiignore"), b"# keys\n*.pem\n", 0o644);
    put(
        &ws.src().join(".fencefs.toml"),
        b"[[rule]]\npath = \"docs\"\naccess = \"read\"\n",
        0o644,
    );
    fs::write(ws.policy_path(), POLICY).unwrap();
    let explain = |path: &str, with_source: bool| {
        let mut args = vec![
            "explain".into(),
            "-p".into(),
            ws.policy_path().into_os_string(),
        ];
        if with_source {
            args.push("--source".into());
            args.push(ws.src().into_os_string());
        }
        args.push(path.into());
        run_fencefs(args, Duration::from_secs(30))
    };
    let out = explain("d/k.pem", true);
    assert!(out.ok(), "{out:?}");
    assert!(
        out.stdout.contains("none")
            && out
                .stdout
                .contains("SOURCE/d/.aiignore:2 pattern \"*.pem\""),
        "{}",
        out.stdout
    );
    // The workspace layer is read too.
    let out = explain("docs/a", true);
    assert!(
        out.stdout.contains("SOURCE/.fencefs.toml"),
        "{}",
        out.stdout
    );
    // Without --source: no SOURCE, no ignore files.
    let out = explain("d/k.pem", false);
    assert!(
        out.ok() && !out.stdout.contains(".aiignore:"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_directory_rename_cannot_lift_a_hide() {
    let b = Mount::builder("ignore-rename").policy(POLICY);
    put(&b.host(".aiignore"), b"vault/keys\nsecret\n", 0o644);
    put(&b.host("pub/.aiignore"), b"!secret\n", 0o644);
    put(&b.host("vault/keys"), b"hidden key\n", 0o600);
    put(&b.host("x/secret"), b"hidden secret\n", 0o600);
    put(&b.host("src/a/f"), b"f\n", 0o644);
    let m = b.start();
    assert_errno(fs::metadata(m.mnt("vault/keys")), ENOENT, "vault/keys").ok();
    assert_errno(fs::metadata(m.mnt("x/secret")), ENOENT, "x/secret").ok();
    // Renaming the directory on the pattern's path, or moving one under the directory
    // whose ignore file re-includes: EACCES, the host unchanged, still hidden.
    assert_errno(
        fs::rename(m.mnt("vault"), m.mnt("v2")),
        EACCES,
        "mv vault v2",
    )
    .ok();
    assert_errno(fs::rename(m.mnt("x"), m.mnt("pub/x")), EACCES, "mv x pub/x").ok();
    m.sh("mv vault v3").assert_fail("mv vault v3");
    assert!(m.host("vault/keys").exists() && m.host("x/secret").exists());
    assert!(!m.host("v2").exists() && !m.host("v3").exists() && !m.host("pub/x").exists());
    assert_errno(
        fs::metadata(m.mnt("vault/keys")),
        ENOENT,
        "vault/keys after",
    )
    .ok();
    assert!(!m.sh("cat v2/keys v3/keys pub/x/secret").ok());
    // Renames the ignore files answer alike for still work.
    fs::rename(m.mnt("src/a"), m.mnt("src/b")).unwrap();
    assert_eq!(fs::read(m.host("src/b/f")).unwrap(), b"f\n");
}

#[test]
fn a_tree_deeper_than_the_scan_bound_is_hidden_and_reloads_still_work() {
    let b = Mount::builder("ignore-deep").policy(POLICY);
    put(&b.host(".aiignore"), b"*.key\n", 0o644);
    put(&b.host("b.pem"), b"data\n", 0o644);
    let m = b.start();
    // The agent makes a tree deeper than the scan walks (256 levels): two of 200 and 100,
    // one moved into the other (a reload in between cannot stop it) ...
    let at = |n: usize| vec!["d"; n].join("/");
    let script = format!("mkdir -p {} t/{} && mv t/d {}/", at(200), at(100), at(200));
    m.sh(&script).assert_ok("make 300 levels");
    assert!(m.host(at(300)).is_dir());
    // ... and the operator then adds a hide: it takes effect (the reload is not refused).
    fs::write(m.host(".aiignore"), b"*.key\n*.pem\n").unwrap();
    assert!(
        eventually(Duration::from_secs(20), || gone(&m.mnt("b.pem"))),
        "the new hide never took effect: {}",
        m.stderr()
    );
    assert!(!m.stderr().contains("reload refused"), "{}", m.stderr());
    // What the walk did not look inside is hidden; the level above it is not.
    assert!(fs::metadata(m.mnt(at(255))).is_ok(), "255 levels visible");
    assert_errno(fs::metadata(m.mnt(at(256))), ENOENT, "256 levels").ok();
    assert_errno(fs::metadata(m.mnt(at(300))), ENOENT, "300 levels").ok();
    assert_errno(fs::create_dir(m.mnt(at(257))), ENOENT, "mkdir below").ok();
    assert!(m.host(at(300)).is_dir(), "the host tree untouched");
    // Meanwhile no directory moves (a move could lift what lies unwalked).
    fs::create_dir(m.mnt("x1")).unwrap();
    assert_errno(fs::rename(m.mnt("x1"), m.mnt("x2")), EACCES, "mv x1 x2").ok();
    assert!(m.host("x1").is_dir() && !m.host("x2").exists());
}

#[test]
fn a_scan_that_fails_on_reload_keeps_the_ignore_files_and_loads_the_new_policy() {
    let b = Mount::builder("ignore-keep").policy(POLICY);
    put(&b.host(".aiignore"), b"*.key\n", 0o644);
    put(&b.host("a.key"), b"k\n", 0o644);
    put(&b.host("b.txt"), b"b\n", 0o644);
    let m = b.start();
    assert!(fs::metadata(m.mnt("b.txt")).is_ok());
    // The scan now fails (here: an ignore file that is a symlink, made on the host; the
    // bounds on directories and entries walked, which any caller can exceed, fail it
    // alike). The operator's tightened policy still takes effect.
    std::os::unix::fs::symlink("/dev/null", m.host("sub/.aiignore"))
        .or_else(|_| {
            fs::create_dir_all(m.host("sub"))?;
            std::os::unix::fs::symlink("/dev/null", m.host("sub/.aiignore"))
        })
        .unwrap();
    m.reload_with(&format!(
        "{POLICY}[[rule]]\npath = \"b.txt\"\naccess = \"none\"\n"
    ));
    assert!(
        eventually(Duration::from_secs(10), || gone(&m.mnt("b.txt"))),
        "the new rule never took effect: {}",
        m.stderr()
    );
    assert_errno(fs::metadata(m.mnt("a.key")), ENOENT, "a.key still hidden").ok();
    assert!(
        m.stderr().contains("the ignore files in force are kept"),
        "{}",
        m.stderr()
    );
    assert_eq!(fs::read(m.host("b.txt")).unwrap(), b"b\n");
}
