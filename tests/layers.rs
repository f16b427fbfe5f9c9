//! Policy layers through a real mount (SPEC "Policy layers, presets and ignore files"):
//! an organisation's file and a user's file combine so that neither lifts what the other
//! forbids (exact errnos, the host unchanged), audit lines name the deciding layer, a
//! reload re-reads every layer and one broken layer keeps the whole old set; `check` and
//! `explain` take the set.

#[path = "common/mod.rs"]
mod common;

use common::*;
use libc::{EACCES, ENOENT, EROFS};
use std::fs;
use std::path::Path;
use std::time::Duration;

/// The organisation's floor: hides `secrets`, mode workspace-write.
const ORG: &str = "mode = \"workspace-write\"\n[[rule]]\npath = \"secrets\"\naccess = \"none\"\n";
/// The user's file: asks for danger (the org's workspace-write wins), grants secrets write
/// (cannot lift the org's none), and makes docs read-only.
const USER: &str = "mode = \"danger\"\n[[rule]]\npath = \"secrets\"\naccess = \"write\"\n\
                    [[rule]]\npath = \"docs\"\naccess = \"read\"\n";

fn audit_lines(p: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn two_layers_only_tighten_and_reload_keeps_the_whole_set_on_a_broken_layer() {
    let b = Mount::builder("layers-mount").policy(USER);
    let org = b.root().join("org.toml");
    let audit = b.root().join("audit.jsonl");
    fs::write(&org, ORG).unwrap();
    put(&b.host("secrets/key"), b"k\n", 0o644);
    put(&b.host("docs/a"), b"a\n", 0o644);
    put(&b.host(".git/hooks/pre-commit"), b"#!/bin/sh\n", 0o755);
    put(&b.host("src/main.rs"), b"main\n", 0o644);
    let mut m = b.arg("-p").arg(&org).arg("--audit").arg(&audit).start();

    // The org's none beats the user's write: hidden, creating inside refused EACCES.
    assert_errno(fs::read(m.mnt("secrets/key")), ENOENT, "read secrets/key").ok();
    assert_errno(
        fs::write(m.mnt("secrets/new"), b"x"),
        ENOENT,
        "create under a hidden dir",
    )
    .ok();
    // The user's read beats the org's default write.
    assert_eq!(read_all(&m.mnt("docs/a")).unwrap(), b"a\n");
    assert_errno(fs::write(m.mnt("docs/a"), b"x"), EACCES, "write docs/a").ok();
    assert_errno(fs::remove_file(m.mnt("docs/a")), EACCES, "unlink docs/a").ok();
    // The mode is the org's workspace-write, not the user's danger: hooks are protected.
    assert_errno(
        fs::write(m.mnt(".git/hooks/pre-commit"), b"evil"),
        EROFS,
        "write a protected hook",
    )
    .ok();
    fs::write(m.mnt("src/new.rs"), b"n").expect("write inside the writable roots");
    assert_eq!(fs::read(m.host("secrets/key")).unwrap(), b"k\n");
    assert_eq!(fs::read(m.host("docs/a")).unwrap(), b"a\n");
    assert_eq!(
        fs::read(m.host(".git/hooks/pre-commit")).unwrap(),
        b"#!/bin/sh\n"
    );
    assert!(!m.host("secrets/new").exists());

    // Audit lines name the layer that decided.
    let org_s = fs::canonicalize(&org).unwrap().display().to_string();
    let user_s = fs::canonicalize(m.policy_path())
        .unwrap()
        .display()
        .to_string();
    assert!(
        eventually(Duration::from_secs(5), || {
            let lines = audit_lines(&audit);
            let layer_of = |path: &str| {
                lines
                    .iter()
                    .find(|l| l["path"] == path && l["decision"] == "deny")
                    .map(|l| l["layer"].clone())
            };
            layer_of("secrets") == Some(org_s.clone().into())
                && layer_of("docs/a") == Some(user_s.clone().into())
        }),
        "audit lines do not name the deciding layer:\n{}",
        fs::read_to_string(&audit).unwrap_or_default()
    );

    // A broken org layer: the whole old set stays, the error names org.toml:line:column.
    let before = m.stderr().len();
    fs::write(m.policy_path(), "mode = \"danger\"\n").unwrap(); // valid, lifts docs
    fs::write(
        &org,
        "mode = \"workspace-write\"\n[[rule]]\npath = \"secrets\"\naccess = \"nope\"\n",
    )
    .unwrap();
    m.reload();
    let want = format!("{org_s}:4:10:");
    assert!(
        eventually(Duration::from_secs(10), || m.stderr()[before..]
            .contains(&want)),
        "the broken layer's error ({want}) was not logged:\n{}",
        m.stderr()
    );
    m.assert_alive("reload with a broken layer");
    // The user's layer was valid but not taken alone: docs stays read, secrets hidden.
    assert_errno(
        fs::write(m.mnt("docs/a"), b"x"),
        EACCES,
        "docs after the broken reload",
    )
    .ok();
    assert_errno(
        fs::read(m.mnt("secrets/key")),
        ENOENT,
        "secrets after the broken reload",
    )
    .ok();

    // Fixed: both layers are re-read, the user's new file lifts its own docs rule.
    fs::write(&org, ORG).unwrap();
    m.reload();
    assert!(
        eventually(Duration::from_secs(10), || fs::write(
            m.mnt("docs/a"),
            b"new\n"
        )
        .is_ok()),
        "the valid set was not taken on reload:\n{}",
        m.stderr()
    );
    assert_eq!(fs::read(m.host("docs/a")).unwrap(), b"new\n");
    assert_errno(
        fs::read(m.mnt("secrets/key")),
        ENOENT,
        "secrets stays hidden",
    )
    .ok();
    m.terminate();
}

#[test]
fn check_and_explain_take_a_set_of_layers() {
    let ws = Workspace::new("layers-cli");
    let org = ws.root.join("org.toml");
    let user = ws.root.join("user.toml");
    let bad = ws.root.join("bad.toml");
    fs::write(&org, ORG).unwrap();
    fs::write(&user, USER).unwrap();
    fs::write(&bad, "[[rule]]\npath = \"/abs\"\naccess = \"read\"\n").unwrap();
    let t = Duration::from_secs(20);

    let o = run_fencefs(["check".as_ref(), org.as_os_str(), user.as_os_str()], t);
    assert!(o.ok() && o.stdout.contains("ok: 3 rules"), "{o:?}");
    let o = run_fencefs(["check".as_ref(), org.as_os_str(), bad.as_os_str()], t);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        o.stderr.contains(&format!("{}:2:8:", bad.display())),
        "{o:?}"
    );

    let o = run_fencefs(
        [
            "explain".as_ref(),
            "-p".as_ref(),
            org.as_os_str(),
            "-p".as_ref(),
            user.as_os_str(),
            "secrets/key".as_ref(),
            "read".as_ref(),
        ],
        t,
    );
    assert!(o.ok(), "{o:?}");
    for want in [
        "access: none".to_string(),
        format!("decided by layer: {}", org.display()),
        format!("layer 1 {}: none by rule #1", org.display()),
        format!("layer 2 {}: write by rule #2", user.display()),
        "read: deny ENOENT".to_string(),
        "mode: workspace-write".to_string(),
    ] {
        assert!(
            o.stdout.contains(&want),
            "missing {want:?} in\n{}",
            o.stdout
        );
    }
}

/// `presets = ["secrets", "agent-config"]` in danger mode, with real tools: git commits
/// (its hooks and config read-only, EACCES), npm runs with the project's `.npmrc` hidden,
/// Python reads a venv's certifi bundle while the workspace's `server.key` is hidden,
/// `.claude/settings.json` reads but cannot be written, truncated, replaced or removed;
/// the host stays unchanged.
#[test]
fn presets_hide_secrets_and_keep_agent_config_read_only_with_real_tools() {
    let b = Mount::builder("layers-presets")
        .policy("mode = \"danger\"\npresets = [\"secrets\", \"agent-config\"]\n");
    let src = b.host("");
    let git = |args: &str| {
        sh_in(&src, &format!("git {args}")).assert_ok(&format!("git {args}"));
    };
    git("init -q .");
    put(
        &b.host(".git/hooks/pre-commit"),
        b"#!/bin/sh\nexit 0\n",
        0o755,
    );
    put(
        &b.host(".claude/settings.json"),
        b"{\"permissions\":{}}\n",
        0o644,
    );
    put(
        &b.host(".npmrc"),
        b"//registry.example.invalid/:_authToken=SECRET\n",
        0o600,
    );
    put(
        &b.host(".aws/credentials"),
        b"[default]\nkey=SECRET\n",
        0o600,
    );
    put(
        &b.host("package.json"),
        b"{\"name\":\"p\",\"version\":\"1.0.0\"}\n",
        0o644,
    );
    // A virtualenv's certifi (its CA bundle is a .pem the preset must leave alone) and a
    // private key at the top of the workspace (which it must hide).
    let certifi = ".venv/lib/python3/site-packages/certifi";
    put(
        &b.host(format!("{certifi}/__init__.py")),
        b"import os\ndef where():\n    return os.path.join(os.path.dirname(__file__), 'cacert.pem')\n",
        0o644,
    );
    put(
        &b.host(format!("{certifi}/cacert.pem")),
        b"-----BEGIN CERTIFICATE-----\n",
        0o644,
    );
    put(&b.host("server.key"), b"PRIVATE\n", 0o600);
    let m = b.start();

    // git works through the mount; its hooks and config are read-only in danger mode.
    m.sh("echo x > a.txt && git add a.txt && git -c user.name=a -c user.email=a@example.invalid commit -qm one && git log --oneline | grep -q one")
        .assert_ok("git commit with the presets");
    assert_errno(
        fs::write(m.mnt(".git/hooks/pre-commit"), b"evil"),
        EACCES,
        "write a hook",
    )
    .ok();
    assert_errno(
        fs::write(m.mnt(".git/hooks/post-checkout"), b"evil"),
        EACCES,
        "plant a hook",
    )
    .ok();
    assert_errno(
        fs::OpenOptions::new()
            .append(true)
            .open(m.mnt(".git/config")),
        EACCES,
        "append to .git/config",
    )
    .ok();
    // npm runs; the token file does not exist for it.
    let o = m.sh("npm pkg get name 2>&1");
    o.assert_ok("npm pkg get name");
    assert!(o.stdout.contains("\"p\""), "{o:?}");
    assert_errno(fs::read(m.mnt(".npmrc")), ENOENT, "read .npmrc").ok();
    assert_errno(fs::read(m.mnt(".aws/credentials")), ENOENT, "read .aws").ok();
    assert_errno(fs::write(m.mnt(".npmrc"), b"x"), EACCES, "replace .npmrc").ok();
    // Python finds certifi's bundle in the venv; the workspace's key does not exist for it.
    let o = m.sh(
        "python3 -B -c 'import sys; sys.path.insert(0, \".venv/lib/python3/site-packages\"); sys.modules.pop(\"certifi\", None); \
         import certifi; print(certifi.__file__); print(open(certifi.where()).read().strip())' && \
         python3 -B -c 'open(\"server.key\")' 2>&1 | grep -q FileNotFoundError && echo hidden",
    );
    o.assert_ok("certifi in a venv, server.key hidden");
    assert_eq!(
        o.stdout,
        format!(
            "{}/__init__.py\n-----BEGIN CERTIFICATE-----\nhidden\n",
            m.mnt(certifi).display()
        ),
        "{o:?}"
    );
    assert_errno(fs::read(m.mnt("server.key")), ENOENT, "read server.key").ok();
    // The agent's settings: readable, never changed.
    assert_eq!(
        read_all(&m.mnt(".claude/settings.json")).unwrap(),
        b"{\"permissions\":{}}\n"
    );
    let s = m.mnt(".claude/settings.json");
    assert_errno(fs::write(&s, b"{}"), EACCES, "write settings.json").ok();
    assert_errno(
        fs::OpenOptions::new()
            .write(true)
            .open(&s)
            .and_then(|f| f.set_len(0)),
        EACCES,
        "truncate settings.json",
    )
    .ok();
    fs::write(m.mnt("evil.json"), b"{\"allow\":\"*\"}").unwrap();
    assert_errno(
        fs::rename(m.mnt("evil.json"), &s),
        EACCES,
        "rename over settings.json",
    )
    .ok();
    assert_errno(fs::remove_file(&s), EACCES, "unlink settings.json").ok();
    assert_errno(
        fs::rename(m.mnt(".claude"), m.mnt("claude.old")),
        EACCES,
        "rename .claude away",
    )
    .ok();
    assert_errno(
        fs::write(m.mnt(".claude/settings.local.json"), b"{}"),
        EACCES,
        "create in .claude",
    )
    .ok();
    assert_eq!(
        fs::read(m.host(".claude/settings.json")).unwrap(),
        b"{\"permissions\":{}}\n"
    );
    assert_eq!(
        fs::read(m.host(".git/hooks/pre-commit")).unwrap(),
        b"#!/bin/sh\nexit 0\n"
    );
    assert!(!m.host(".git/hooks/post-checkout").exists());
    assert!(!m.host(".claude/settings.local.json").exists());
    assert!(m.host(".npmrc").exists() && m.host("evil.json").exists());
}

/// `workspace_policy = ".fencefs.toml"`: the repository's file is one more layer; callers
/// read it but never change, create, replace, rename or remove it (EROFS, danger mode);
/// host edits take effect within the watch delay (a broken edit keeps the whole old set,
/// its error at SOURCE/.fencefs.toml:line:column).
#[test]
fn the_workspace_layer_tightens_is_read_only_and_follows_host_edits() {
    use std::os::unix::fs::symlink as ln_s;
    let b = Mount::builder("layers-workspace")
        .policy("mode = \"danger\"\nworkspace_policy = \".fencefs.toml\"\n");
    let repo = b"[[rule]]\npath = \"docs\"\naccess = \"read\"\n";
    put(&b.host(".fencefs.toml"), repo, 0o644);
    put(&b.host("docs/a"), b"a\n", 0o644);
    put(&b.host("src/x"), b"x\n", 0o644);
    let m = b.start();
    let ws = m.mnt(".fencefs.toml");

    // The repository's layer tightens: docs is read-only; the rest stays writable.
    assert_errno(fs::write(m.mnt("docs/a"), b"x"), EACCES, "write docs/a").ok();
    fs::write(m.mnt("src/x"), b"y\n").expect("src stays writable");
    // Its file: readable, read-only to every caller in danger mode.
    assert_eq!(read_all(&ws).unwrap(), repo);
    assert_errno(
        fs::write(&ws, b"default = \"write\"\n"),
        EROFS,
        "write .fencefs.toml",
    )
    .ok();
    assert_errno(
        fs::OpenOptions::new()
            .write(true)
            .open(&ws)
            .and_then(|f| f.set_len(0)),
        EROFS,
        "truncate .fencefs.toml",
    )
    .ok();
    fs::write(m.mnt("evil.toml"), b"").unwrap();
    assert_errno(fs::rename(m.mnt("evil.toml"), &ws), EROFS, "rename over").ok();
    assert_errno(fs::rename(&ws, m.mnt("moved.toml")), EROFS, "rename away").ok();
    assert_errno(fs::remove_file(&ws), EROFS, "unlink").ok();
    // link(2) and a directory renamed over a file never replace a name: the kernel
    // answers those itself (EEXIST, ENOTDIR) before asking the daemon.
    assert_errno(
        fs::hard_link(m.mnt("evil.toml"), &ws),
        libc::EEXIST,
        "link over",
    )
    .ok();
    fs::create_dir(m.mnt("d")).unwrap();
    assert_errno(
        fs::rename(m.mnt("d"), &ws),
        libc::ENOTDIR,
        "a directory over it",
    )
    .ok();
    assert_eq!(fs::read(m.host(".fencefs.toml")).unwrap(), repo);
    assert!(!m.host("moved.toml").exists());

    // A host edit takes effect within the watch delay: docs becomes hidden.
    // Written as editors save (a new file renamed over the old); in-place writes are
    // tested in tests/ignore_files.rs (the reload is debounced).
    replace_on_host(
        &m.host(".fencefs.toml"),
        b"[[rule]]\npath = \"docs\"\naccess = \"none\"\n",
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            matches!(fs::metadata(m.mnt("docs/a")), Err(e) if e.raw_os_error() == Some(ENOENT))
        }),
        "the host edit of .fencefs.toml did not take effect:\n{}",
        m.stderr()
    );
    // A broken host edit keeps the whole old set, the error names the file's position.
    let before = m.stderr().len();
    replace_on_host(
        &m.host(".fencefs.toml"),
        b"[[rule]]\npath = \"docs\"\naccess = \"nope\"\n",
    );
    assert!(
        eventually(Duration::from_secs(10), || m.stderr()[before..]
            .contains("SOURCE/.fencefs.toml:3:10:")),
        "the broken workspace layer's error was not logged:\n{}",
        m.stderr()
    );
    assert_errno(fs::metadata(m.mnt("docs/a")), ENOENT, "docs stays hidden").ok();
    // Removed on the host: the layer is gone at the next change, docs comes back.
    fs::remove_file(m.host(".fencefs.toml")).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || fs::metadata(m.mnt("docs/a"))
            .is_ok()),
        "removing .fencefs.toml on the host did not take effect:\n{}",
        m.stderr()
    );
    // And creating it through the mount is refused too (a symlink included).
    assert_errno(fs::write(&ws, b""), EROFS, "create .fencefs.toml").ok();
    assert_errno(ln_s("/etc/passwd", &ws), EROFS, "symlink .fencefs.toml").ok();
    assert!(!m.host(".fencefs.toml").exists());
}

/// Replaces `path` on the host at once: a temporary file beside it, renamed over it.
fn replace_on_host(path: &std::path::Path, data: &[u8]) {
    let tmp = path.with_extension("tmp-edit");
    fs::write(&tmp, data).unwrap();
    fs::rename(&tmp, path).unwrap();
}
