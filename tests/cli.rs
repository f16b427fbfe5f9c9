//! The command line: `check`, `explain`, `mount` startup errors, signals, reload, audit.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

fn write_policy(ws: &Workspace, name: &str, text: &str) -> PathBuf {
    let p = ws.root.join(name);
    fs::write(&p, text).unwrap();
    p
}

// ------------------------------------------------------------------ check

#[test]
fn check_valid_policy() {
    let ws = Workspace::new("check-ok");
    let p = write_policy(
        &ws,
        "p.toml",
        r#"
mode = "workspace-write"
default = "write"
writable_roots = ["."]
allow_setid = false
allow_devices = false
protected = [".git/hooks", ".git/config"]

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "**/*.pem"
access = "none"

[[rule]]
path = "docs"
access = "read"

[[rule]]
path = "build/cache"
access = "write"
uid = [1000]
"#,
    );
    let o = run_fencefs([Path::new("check"), &p], T);
    assert_eq!(o.status.code(), Some(0), "check: {o:?}");
    assert_eq!(o.stdout.trim(), "ok: 4 rules", "{o:?}");

    // The shipped example policy is valid too.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy.example.toml");
    let o = run_fencefs([Path::new("check"), &example], T);
    assert_eq!(o.status.code(), Some(0), "check policy.example.toml: {o:?}");
    assert!(
        o.stdout.starts_with("ok: ") && o.stdout.trim_end().ends_with(" rules"),
        "{o:?}"
    );

    // An empty file is a valid policy with no rules.
    let e = write_policy(&ws, "empty.toml", "");
    let o = run_fencefs([Path::new("check"), &e], T);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(o.stdout.trim(), "ok: 0 rules");
}

/// Every line of the output that looks like `FILE:LINE:COL: msg`, as (line, col, msg).
fn located_errors(out: &Out, file: &Path) -> Vec<(usize, usize, String)> {
    let prefix = format!("{}:", file.display());
    let mut v = vec![];
    for l in out.stdout.lines().chain(out.stderr.lines()) {
        let Some(pos) = l.find(&prefix) else { continue };
        let rest = &l[pos + prefix.len()..];
        let mut it = rest.splitn(3, ':');
        let (Some(a), Some(b), Some(msg)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if let (Ok(line), Ok(col)) = (a.trim().parse(), b.trim().parse()) {
            v.push((line, col, msg.trim().to_string()));
        }
    }
    v
}

#[test]
fn check_reports_errors_with_file_line_column() {
    let ws = Workspace::new("check-err");
    let cases: &[(&str, &str, usize)] = &[
        (
            "bad-access.toml",
            "mode = \"danger\"\n\n[[rule]]\npath = \"docs\"\naccess = \"reed\"\n",
            5,
        ),
        (
            "unknown-key.toml",
            "mode = \"danger\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\ncolour = \"blue\"\n",
            5,
        ),
        (
            "unknown-top.toml",
            "mode = \"danger\"\ndefualt = \"read\"\n",
            2,
        ),
        ("bad-mode.toml", "\nmode = \"yolo\"\n", 2),
        (
            "absolute.toml",
            "[[rule]]\npath = \"/etc\"\naccess = \"read\"\n",
            2,
        ),
        (
            "dotdot.toml",
            "[[rule]]\npath = \"a/../b\"\naccess = \"read\"\n",
            2,
        ),
        (
            "bad-glob.toml",
            "[[rule]]\naccess = \"read\"\npath = \"a/[b\"\n",
            3,
        ),
        ("syntax.toml", "mode = \"danger\"\n[[rule]\n", 2),
        (
            "except-glob.toml",
            "[[rule]]\npath = \"**/*.pem\"\naccess = \"none\"\nexcept = [\"ok/**\", \"a/[b\"]\n",
            4,
        ),
        (
            "except-type.toml",
            "[[rule]]\npath = \"**/*.pem\"\naccess = \"none\"\n\nexcept = \"vendor\"\n",
            5,
        ),
        (
            "except-abs.toml",
            "[[rule]]\npath = \"**/*.pem\"\naccess = \"none\"\nexcept = [\n  \"/vendor\",\n]\n",
            5,
        ),
        (
            "except-dotdot.toml",
            "[[rule]]\npath = \"**/*.pem\"\naccess = \"none\"\nexcept = [\"a/../b\"]\n",
            4,
        ),
        ("bad-default.toml", "default = \"everything\"\n", 1),
    ];
    for (name, text, line) in cases {
        let p = write_policy(&ws, name, text);
        let o = run_fencefs([Path::new("check"), &p], T);
        assert_eq!(o.status.code(), Some(1), "check {name}: exit code; {o:?}");
        let errs = located_errors(&o, &p);
        assert!(
            !errs.is_empty(),
            "check {name}: no `file:line:column: message` in output: {o:?}"
        );
        assert_eq!(errs[0].0, *line, "check {name}: line; {o:?}");
        assert!(
            errs[0].1 >= 1,
            "check {name}: column must be 1-based; {o:?}"
        );
        assert!(!errs[0].2.is_empty(), "check {name}: empty message");
        assert!(!o.stdout.contains("ok:"), "check {name}: said ok: {o:?}");
    }
    // The access word's column: `access = "reed"` → the value starts at column 10.
    let p = ws.root.join("bad-access.toml");
    let o = run_fencefs([Path::new("check"), &p], T);
    let errs = located_errors(&o, &p);
    assert!(
        matches!(errs[0].1, 10 | 11),
        "column of the bad access word: {errs:?}"
    );
    assert!(
        errs[0].2.contains("reed"),
        "the message names the bad value: {errs:?}"
    );

    // Every error, not just the first.
    let p = write_policy(
        &ws,
        "two.toml",
        "[[rule]]\npath = \"/abs\"\naccess = \"read\"\n\n[[rule]]\npath = \"x/../y\"\naccess = \"read\"\n",
    );
    let o = run_fencefs([Path::new("check"), &p], T);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let lines: Vec<usize> = located_errors(&o, &p).iter().map(|e| e.0).collect();
    assert!(
        lines.contains(&2) && lines.contains(&6),
        "both errors reported (lines 2 and 6): {o:?}"
    );

    // A missing file is an error (1), a missing argument a usage error (2).
    let o = run_fencefs([Path::new("check"), &ws.root.join("nope.toml")], T);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(o.stderr.contains("nope.toml"), "{o:?}");
    let o = run_fencefs(["check"], T);
    assert_eq!(o.status.code(), Some(2), "check without a file: {o:?}");
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec![],
        vec!["frobnicate"],
        vec!["mount"],
        vec!["mount", "only-one-arg"],
        vec!["mount", "--no-such-flag", "a", "b"],
        vec!["mount", "-m", "yolo", "/tmp", "/tmp"],
        vec!["explain"],
        vec!["explain", "--mode", "yolo", "x"],
        vec!["explain", "x", "fly"],
        vec!["mount", "--threads", "many", "a", "b"],
        vec!["mount", "--audit", "f", "--audit-max-size", "12X", "a", "b"],
        vec!["mount", "--audit", "f", "--audit-keep", "-1", "a", "b"],
        // Rotation options without --audit.
        vec!["mount", "--audit-max-size", "1M", "a", "b"],
        // A checkpoint number that is not one (before any DIR or SOCKET is touched).
        vec!["stage", "rewind", "--dir", "/nonexistent", "abc"],
        vec!["stage", "rewind", "/nonexistent.sock", "-1"],
    ] {
        let o = run_fencefs(&args, T);
        assert_eq!(o.status.code(), Some(2), "fencefs {args:?}: {o:?}");
    }
    let o = run_fencefs(["--help"], T);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        o.stdout.contains("mount") && o.stdout.contains("check") && o.stdout.contains("explain")
    );
}

// ------------------------------------------------------------------ explain

const EXPLAIN_POLICY: &str = r#"
mode = "workspace-write"
default = "write"

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "docs"
access = "read"

[[rule]]
path = "**/*.pem"
access = "none"

[[rule]]
path = "build/cache"
access = "write"
uid = [1000]

[[rule]]
path = "build"
access = "list"
"#;

fn explain(p: &Path, extra: &[&str]) -> Out {
    let mut args: Vec<String> = vec!["explain".into(), "--policy".into(), p.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let o = run_fencefs(&args, T);
    assert_eq!(o.status.code(), Some(0), "fencefs {args:?}: {o:?}");
    o
}

fn has(o: &Out, words: &[&str]) {
    let all = format!("{}{}", o.stdout, o.stderr).to_lowercase();
    for w in words {
        assert!(
            all.contains(&w.to_lowercase()),
            "explain output lacks {w:?}:\n{}{}",
            o.stdout,
            o.stderr
        );
    }
}

/// `explain` names the rule an except glob took out, and what set the mode's ceiling
/// (the same words the audit log uses: `protected` with the entry, `writable_roots`).
#[test]
fn explain_shows_excepts_and_what_set_the_ceiling() {
    let ws = Workspace::new("explain-except");
    let p = write_policy(
        &ws,
        "p.toml",
        "mode = \"workspace-write\"\nwritable_roots = [\"src\", \".git\"]\n\
         protected = [\".git/hooks\",\n  \".git/config\"]\n\n\
         [[rule]]\npath = \"docs\"\naccess = \"read\"\n\n\
         [[rule]]\npath = \"**/*.pem\"\naccess = \"none\"\n\
         except = [\"**/node_modules/**\", \"**/site-packages/**\"]\n",
    );
    let file = p.display().to_string();
    let o = explain(&p, &["src/.venv/site-packages/certifi/cacert.pem", "read"]);
    has(
        &o,
        &[
            "decided by: default",
            &format!(
                "excepted: rule #2 path = \"**/*.pem\" access = none ({file}:10) \
                 except \"**/site-packages/**\": not covered"
            ),
            "read: allow",
        ],
    );
    let o = explain(&p, &["src/keys/server.pem", "read"]);
    has(&o, &["deny ENOENT", "rule #2 path = \"**/*.pem\""]);
    assert!(!o.stdout.contains("excepted"), "{o:?}");
    has(
        &explain(&p, &[".git/hooks/x", "create"]),
        &[
            &format!("decided by: protected entry \".git/hooks\" ({file}:3)"),
            &format!("create: deny EROFS (by protected entry \".git/hooks\" ({file}:3)"),
        ],
    );
    has(
        &explain(&p, &[".git/config", "write"]),
        &[&format!("protected entry \".git/config\" ({file}:4)")],
    );
    has(
        &explain(&p, &["README.md", "write"]),
        &[
            "decided by: writable_roots: outside every entry",
            "deny EROFS",
        ],
    );
    has(
        &explain(&p, &["--mode", "read-only", "src/a.rs", "write"]),
        &["mode read-only (no mutations anywhere)", "deny EROFS"],
    );
    // the built-in protected list has no line in the file
    let q = write_policy(&ws, "q.toml", "mode = \"workspace-write\"\n");
    has(
        &explain(&q, &[".git/hooks/pre-commit", "write"]),
        &["protected entry \".git/hooks\" (built-in default)"],
    );
}

#[test]
fn explain_names_the_deciding_rule() {
    let ws = Workspace::new("explain");
    let p = write_policy(&ws, "p.toml", EXPLAIN_POLICY);
    has(&explain(&p, &["secrets/key"]), &["none", "secrets"]);
    has(
        &explain(&p, &["secrets/key", "read"]),
        &["deny", "ENOENT", "secrets"],
    );
    has(
        &explain(&p, &["secrets/new", "create"]),
        &["deny", "EACCES"],
    );
    has(&explain(&p, &["docs/guide.md"]), &["read", "docs"]);
    has(&explain(&p, &["docs/guide.md", "read"]), &["allow"]);
    has(
        &explain(&p, &["docs/guide.md", "write"]),
        &["deny", "EACCES", "docs"],
    );
    has(
        &explain(&p, &["src/deep/key.pem", "read"]),
        &["deny", "ENOENT", "*.pem"],
    );
    has(
        &explain(&p, &["src/main.rs", "write"]),
        &["allow", "default"],
    );
    has(
        &explain(&p, &[".git/hooks/pre-commit", "write"]),
        &["deny", "EROFS"],
    );
    has(
        &explain(&p, &["--mode", "read-only", "src/main.rs", "write"]),
        &["deny", "EROFS", "read-only"],
    );
    has(
        &explain(&p, &["--mode", "danger", ".git/hooks/pre-commit", "write"]),
        &["allow"],
    );
    has(
        &explain(&p, &["build/cache/x", "write"]),
        &["deny", "EACCES", "build"],
    );
    has(
        &explain(&p, &["--uid", "1000", "build/cache/x", "write"]),
        &["allow", "build/cache"],
    );
    has(&explain(&p, &["build/out", "list"]), &["allow"]);
    has(&explain(&p, &["build/out", "read"]), &["deny", "EACCES"]);
    // Without a policy: read-only mode, default read.
    let o = run_fencefs(["explain", "anything", "read"], T);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    has(&o, &["allow"]);
    let o = run_fencefs(["explain", "anything", "write"], T);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    has(&o, &["deny", "EROFS"]);
}

// ------------------------------------------------------------------ mount startup errors

fn assert_startup_error(args: &[&std::ffi::OsStr], mnt: &Path, what: &str) -> Out {
    let o = run_fencefs(args, T);
    assert!(!o.status.success(), "{what}: must fail: {o:?}");
    assert_ne!(o.status.code(), Some(0), "{what}: {o:?}");
    let lines: Vec<&str> = o.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "{what}: expected exactly one line on stderr, got:\n{}",
        o.stderr
    );
    assert!(
        !is_mounted(mnt),
        "{what}: something is mounted at {}",
        mnt.display()
    );
    o
}

#[test]
fn mount_startup_errors() {
    require_fuse();
    let ws = Workspace::new("startup");
    let mnt = ws.mnt_dir();
    let src = ws.src();
    let os = |s: &str| std::ffi::OsString::from(s);
    let mount = std::ffi::OsStr::new("mount");
    let dash_p = std::ffi::OsStr::new("-p");

    let missing = ws.root.join("no-such-source");
    let o = assert_startup_error(
        &[mount, missing.as_os_str(), mnt.as_os_str()],
        &mnt,
        "missing source",
    );
    assert!(
        o.stderr.contains("no-such-source"),
        "names the missing source: {}",
        o.stderr
    );

    let file_src = ws.root.join("a-file");
    fs::write(&file_src, b"x").unwrap();
    assert_startup_error(
        &[mount, file_src.as_os_str(), mnt.as_os_str()],
        &mnt,
        "source is a file",
    );

    let file_mnt = ws.root.join("mnt-file");
    fs::write(&file_mnt, b"x").unwrap();
    assert_startup_error(
        &[mount, src.as_os_str(), file_mnt.as_os_str()],
        &file_mnt,
        "mount point is a file",
    );
    let missing_mnt = ws.root.join("no-such-mnt");
    assert_startup_error(
        &[mount, src.as_os_str(), missing_mnt.as_os_str()],
        &missing_mnt,
        "mount point missing",
    );

    let bad = write_policy(
        &ws,
        "bad.toml",
        "[[rule]]\npath = \"x\"\naccess = \"sometimes\"\n",
    );
    let o = assert_startup_error(
        &[
            mount,
            dash_p,
            bad.as_os_str(),
            src.as_os_str(),
            mnt.as_os_str(),
        ],
        &mnt,
        "invalid policy",
    );
    assert!(
        o.stderr.contains(&format!("{}:3:", bad.display())),
        "file:line:column of the bad policy: {}",
        o.stderr
    );
    let o = run_fencefs(
        [
            os("mount"),
            os("-p"),
            ws.root.join("nope.toml").into_os_string(),
            src.clone().into_os_string(),
            mnt.clone().into_os_string(),
        ],
        T,
    );
    assert!(
        !o.status.success() && !is_mounted(&mnt),
        "missing policy file: {o:?}"
    );
}

#[test]
fn mount_point_busy_is_a_startup_error() {
    let m = Mount::with("busy", None, None, |s| put(&s.join("f"), b"f\n", 0o644));
    let mnt = m.mnt("");
    let o = run_fencefs(
        [
            std::ffi::OsStr::new("mount"),
            m.host("").as_os_str(),
            mnt.as_os_str(),
        ],
        T,
    );
    assert!(
        !o.status.success(),
        "second mount on a busy mount point must fail: {o:?}"
    );
    assert_eq!(
        o.stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "one line: {}",
        o.stderr
    );
    // The first mount is intact.
    assert_eq!(read_all(&m.mnt("f")).unwrap(), b"f\n");
    assert!(is_mounted(&mnt));
}

// ------------------------------------------------------------------ signals

#[test]
fn mount_shows_as_fuse_fencefs_nosuid_nodev() {
    let m = Mount::with("fstype", None, None, |_| {});
    assert_eq!(
        mount_fstype(&m.mnt("")).as_deref(),
        Some("fuse.fencefs"),
        "fstype in /proc/self/mountinfo"
    );
    let opts = mount_options(&m.mnt("")).unwrap();
    assert!(opts.contains("nosuid") && opts.contains("nodev"), "{opts}");
    // The mount's source is SOURCE (canonical), as bindfs and sshfs show theirs.
    let f: Vec<&str> = opts.split(' ').collect();
    let sep = f.iter().position(|x| *x == "-").unwrap();
    let src = m.host("").canonicalize().unwrap();
    assert_eq!(f[sep + 2], src.to_str().unwrap(), "source in {opts}");
}

#[test]
fn sigterm_and_sigint_unmount_and_exit_0() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut m = Mount::with("sigterm", None, None, |s| put(&s.join("f"), b"f\n", 0o644));
        assert_eq!(read_all(&m.mnt("f")).unwrap(), b"f\n");
        m.signal(sig);
        let st = m
            .wait_exit(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("daemon did not exit within 10 s of signal {sig}"));
        assert_eq!(
            st.code(),
            Some(0),
            "exit status after signal {sig}; stderr:\n{}",
            m.stderr()
        );
        assert!(!m.is_mounted(), "still mounted after signal {sig}");
        assert!(m.host("f").exists(), "host lost files");
    }
}

#[test]
fn sigterm_with_an_open_file_still_exits_0() {
    let mut m = Mount::with("sigterm-busy", None, None, |s| {
        put(&s.join("f"), b"f\n", 0o644)
    });
    // A caller still holds a file open in the mount: the daemon must not hang.
    let f = fs::File::open(m.mnt("f")).unwrap();
    m.signal(libc::SIGTERM);
    let st = m.wait_exit(Duration::from_secs(10));
    drop(f);
    let st = st.expect("daemon did not exit within 10 s of SIGTERM while a file was open");
    assert_eq!(st.code(), Some(0), "stderr:\n{}", m.stderr());
    assert!(
        eventually(Duration::from_secs(5), || !m.is_mounted()),
        "still mounted after SIGTERM (with an open file)"
    );
}

#[test]
fn external_unmount_ends_the_daemon() {
    let mut m = Mount::with("fusermount", None, None, |s| {
        put(&s.join("f"), b"f\n", 0o644)
    });
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(m.mnt(""))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "fusermount3 -u: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    let st = m
        .wait_exit(Duration::from_secs(10))
        .expect("daemon still running 10 s after fusermount3 -u");
    assert_eq!(st.code(), Some(0), "stderr:\n{}", m.stderr());
}

#[test]
fn sighup_reloads_valid_policy_and_keeps_old_on_invalid() {
    let mut m = Mount::with(
        "sighup",
        Some("default = \"write\"\n"),
        Some("danger"),
        |s| {
            put(&s.join("docs/a"), b"a\n", 0o644);
            put(&s.join("src/main.rs"), b"main\n", 0o644);
        },
    );
    assert_eq!(read_all(&m.mnt("docs/a")).unwrap(), b"a\n");

    // Valid: docs becomes none.
    m.reload_with("default = \"write\"\n[[rule]]\npath = \"docs\"\naccess = \"none\"\n");
    assert!(
        eventually(Duration::from_secs(5), || errno_of(&fs::symlink_metadata(
            m.mnt("docs/a")
        )) == libc::ENOENT),
        "SIGHUP with a valid policy did not hide docs/a; stderr:\n{}",
        m.stderr()
    );
    assert_errno(
        fs::read(m.mnt("docs/a")),
        libc::ENOENT,
        "read docs/a after reload",
    )
    .ok();

    // Invalid: nothing changes; the error is logged with file:line:column.
    let stderr_len = m.stderr().len();
    m.reload_with("default = \"write\"\n[[rule]]\npath = \"docs\"\naccess = \"bogus\"\n");
    let pol = m.policy_path();
    let logged = eventually(Duration::from_secs(5), || {
        m.stderr()[stderr_len..].contains(&format!("{}:4:", pol.display()))
    });
    m.assert_alive("SIGHUP with an invalid policy");
    assert!(
        logged,
        "the invalid policy's error (file:line:column) was not logged; stderr:\n{}",
        m.stderr()
    );
    assert_errno(
        fs::symlink_metadata(m.mnt("docs/a")),
        libc::ENOENT,
        "docs/a after an invalid reload",
    )
    .ok();
    assert_eq!(read_all(&m.mnt("src/main.rs")).unwrap(), b"main\n");
    fs::write(m.mnt("src/new"), b"n").expect("old policy (write) still in force");

    // And a later valid reload still works: docs comes back, src becomes read.
    m.reload_with("default = \"write\"\n[[rule]]\npath = \"src\"\naccess = \"read\"\n");
    assert!(
        eventually(Duration::from_secs(5), || read_all(&m.mnt("docs/a"))
            .is_ok()),
        "docs/a did not come back after a valid reload"
    );
    assert_errno(
        fs::write(m.mnt("src/new2"), b"n"),
        libc::EACCES,
        "src is read after reload",
    )
    .ok();
}

#[test]
fn mode_flag_overrides_the_file_also_after_reload() {
    let m = Mount::with(
        "mode-override",
        Some("mode = \"danger\"\ndefault = \"write\"\n"),
        Some("read-only"),
        |s| {
            put(&s.join("f"), b"f\n", 0o644);
        },
    );
    assert_errno(
        fs::write(m.mnt("g"), b"g"),
        libc::EROFS,
        "-m read-only beats mode = danger",
    )
    .ok();
    m.reload_with(
        "mode = \"danger\"\ndefault = \"write\"\n[[rule]]\npath = \"x\"\naccess = \"none\"\n",
    );
    // Wait until the new policy is visibly in force (x hidden), then check the mode again.
    put(&m.host("x"), b"x\n", 0o644);
    assert!(
        eventually(Duration::from_secs(5), || fs::symlink_metadata(m.mnt("x"))
            .is_err()),
        "reload not applied"
    );
    assert_errno(
        fs::write(m.mnt("g"), b"g"),
        libc::EROFS,
        "-m read-only after reload",
    )
    .ok();
    assert!(!m.host("g").exists());
}

// ------------------------------------------------------------------ audit

fn audit_lines(p: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line is not JSON ({e}): {l}"))
        })
        .collect()
}

#[test]
fn audit_logs_refusals_as_json_lines() {
    let b = Mount::builder("audit");
    let audit = b.root().join("audit.jsonl");
    let policy = "mode = \"workspace-write\"\ndefault = \"write\"\n[[rule]]\npath = \"secrets\"\naccess = \"none\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\n";
    let b = b.policy(policy).arg("--audit").arg(&audit);
    put(&b.host("secrets/key"), b"k\n", 0o644);
    put(&b.host("docs/d"), b"d\n", 0o644);
    put(&b.host("ok"), b"ok\n", 0o644);
    let mut m = b.start();
    let _ = fs::read(m.mnt("secrets/key"));
    let _ = fs::write(m.mnt("docs/d"), b"x");
    read_all(&m.mnt("ok")).unwrap();
    let found = eventually(Duration::from_secs(5), || {
        let l = audit_lines(&audit);
        l.iter()
            .any(|v| v["path"] == "secrets" || v["path"] == "secrets/key")
            && l.iter()
                .any(|v| v["path"] == "docs/d" && v["errno"] == "EACCES")
    });
    let lines = audit_lines(&audit);
    assert!(
        found,
        "refusals missing from the audit log:\n{lines:#?}\nstderr:\n{}",
        m.stderr()
    );
    for v in &lines {
        for k in [
            "ts",
            "op",
            "path",
            "uid",
            "pid",
            "decision",
            "mode",
            "generation",
            "repeat",
        ] {
            assert!(v.get(k).is_some(), "audit record lacks {k:?}: {v}");
        }
        assert_eq!(
            v["decision"], "deny",
            "allowed ops are not logged without --audit-allowed: {v}"
        );
        assert_eq!(v["uid"], 0);
        assert!(
            !v["path"].as_str().unwrap().starts_with('/'),
            "path must be workspace-relative: {v}"
        );
    }
    let s = lines
        .iter()
        .find(|v| v["path"] == "secrets" || v["path"] == "secrets/key")
        .unwrap();
    assert_eq!(s["errno"], "ENOENT", "{s}");
    let d = lines.iter().find(|v| v["path"] == "docs/d").unwrap();
    assert_eq!(d["rule"], "docs", "{d}");
    assert_eq!(d["access"], "read", "{d}");
    assert_eq!(d["mode"], "workspace-write", "{d}");
    let gen0 = d["generation"].as_u64().expect("generation is a number");

    // After a reload the generation goes up.
    m.reload_with(&format!(
        "{policy}[[rule]]\npath = \"ok\"\naccess = \"none\"\n"
    ));
    std::thread::sleep(Duration::from_millis(300));
    m.assert_alive("SIGHUP with --audit");
    assert!(
        eventually(Duration::from_secs(5), || fs::read(m.mnt("ok")).is_err()),
        "reload not applied"
    );
    let _ = fs::write(m.mnt("docs/d"), b"y");
    assert!(
        eventually(Duration::from_secs(5), || audit_lines(&audit).iter().any(
            |v| v["path"] == "docs/d" && v["generation"].as_u64() > Some(gen0)
        )),
        "no audit record with a higher generation after reload:\n{:#?}",
        audit_lines(&audit)
    );
}

#[test]
fn audit_allowed_logs_allowed_operations_too() {
    let b = Mount::builder("audit-allowed");
    let audit = b.root().join("audit.jsonl");
    let b = b
        .policy("default = \"write\"\n")
        .mode("danger")
        .arg("--audit")
        .arg(&audit)
        .arg("--audit-allowed");
    put(&b.host("f"), b"f\n", 0o644);
    let m = b.start();
    read_all(&m.mnt("f")).unwrap();
    fs::write(m.mnt("g"), b"g").unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            let l = audit_lines(&audit);
            l.iter()
                .any(|v| v["decision"] == "allow" && v["path"] == "f")
                && l.iter()
                    .any(|v| v["decision"] == "allow" && v["path"] == "g")
        }),
        "allowed operations missing with --audit-allowed:\n{:#?}",
        audit_lines(&audit)
    );
}

#[test]
fn threads_option_and_concurrent_readers() {
    let m = Mount::builder("threads").arg("--threads").arg("4");
    for i in 0..50 {
        put(
            &m.host(format!("d/f{i}")),
            format!("{i}\n").as_bytes(),
            0o644,
        );
    }
    let m = m.start();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..4 {
            let m = &m;
            s.spawn(move || {
                for round in 0..20 {
                    for i in 0..50 {
                        let v = read_all(&m.mnt(format!("d/f{i}"))).unwrap();
                        assert_eq!(v, format!("{i}\n").as_bytes(), "thread {t} round {round}");
                    }
                }
            });
        }
    });
    assert!(start.elapsed() < Duration::from_secs(60));
}
