//! The files the daemon makes for the operator are the operator's alone, although the
//! daemon runs with umask 0 (so that what FUSE callers create gets exactly their modes):
//! a new `--answers` file is 0600 after the first "always", an existing one keeps its mode
//! and owner; what a staged mount makes in its staging area DIR (the marker, the lock,
//! `checkpoints.json`, `audit.jsonl`, `layers/`, `trash/`, `work/`) is 0600 for files and
//! 0700 for directories (a staged tree's root keeps SOURCE's root mode); a `--learn` draft
//! is 0600; `--ask-exec` programs run with umask 0077.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::stage::*;
use common::*;
use serde_json::json;

const ASK: &str =
    "mode = \"danger\"\n[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\n";

/// A mount with `ASK`, a control socket and `extra`; `docs/a.md` owned by uid 1000.
fn mount(name: &str, extra: &[&std::ffi::OsStr]) -> (Mount, PathBuf) {
    let mut b = Mount::builder(name).policy(ASK).arg("--allow-other");
    let sock = b.root().join("ctl.sock");
    b = b.arg("--control").arg(&sock);
    for a in extra {
        b = b.arg(*a);
    }
    put(&b.host("docs/a.md"), b"alpha\n", 0o644);
    chown_tree(&b.host("docs"), 1000);
    (b.start(), sock)
}

/// Uid 1000 opens `docs/a.md` for writing (an `ask`): the child, held until decided.
fn held_write(m: &Mount) -> std::process::Child {
    Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
        .args(["sh", "-c", "echo changed > docs/a.md && echo ok"])
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Answers the next question "always" (allow) and waits for the write to land.
fn answer_always(m: &Mount, sock: &Path) {
    let mut ap = Peer::subscribe(sock);
    let c = held_write(m);
    let ev = ap.next(Some("ask"));
    let a = ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": true, "remember": "always"}));
    assert_eq!(a["ok"], true, "{a}");
    let o = c.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ok");
}

fn mode_owner(p: &Path) -> (u32, u32, u32) {
    let md = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (md.mode() & 0o7777, md.uid(), md.gid())
}

#[test]
fn a_new_answers_file_is_0600_and_an_existing_one_keeps_its_mode_and_owner() {
    let ws = Workspace::new("answers-modes");
    let file = ws.root.join("answers.toml");
    let (m, sock) = mount("answers-new", &[ws_arg("--answers"), file.as_os_str()]);
    answer_always(&m, &sock);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("path = \"docs/a.md\""), "{text}");
    assert_eq!(mode_owner(&file), (0o600, 0, 0), "a new answers file");
    drop(m);

    // An operator's file, 0640 and owned by uid 1001: rewritten, it stays so.
    let mine = ws.root.join("mine.toml");
    std::fs::write(&mine, "# the operator's answers\n").unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(&mine, Some(1001), Some(1001)).unwrap();
    let (m, sock) = mount("answers-kept", &[ws_arg("--answers"), mine.as_os_str()]);
    answer_always(&m, &sock);
    let text = std::fs::read_to_string(&mine).unwrap();
    assert!(
        text.starts_with("# the operator's answers\n") && text.contains("allow = true"),
        "{text}"
    );
    assert_eq!(mode_owner(&mine), (0o640, 1001, 1001), "an existing file");
    let left: Vec<_> = std::fs::read_dir(&ws.root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("fencefs-tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

fn ws_arg(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

#[test]
fn ask_exec_programs_run_with_umask_0077() {
    let ws = Workspace::new("ask-exec-umask");
    let out = ws.root.join("notes");
    mkdirp(&out);
    let script = ws.root.join("notify.sh");
    put(
        &script,
        b"cat > /dev/null\numask > \"$1/umask.tmp\"\necho made > \"$1/made\"\nmv \"$1/umask.tmp\" \"$1/umask\"\n",
        0o755,
    );
    let cmd = format!("/bin/sh {} {}", script.display(), out.display());
    let (m, sock) = mount("ask-exec-umask", &[ws_arg("--ask-exec"), ws_arg(&cmd)]);
    let mut ap = Peer::subscribe(&sock);
    let c = held_write(&m);
    let ev = ap.next(Some("ask"));
    let said = out.join("umask");
    assert!(
        eventually(Duration::from_secs(10), || said.exists()),
        "{}",
        m.stderr()
    );
    assert_eq!(std::fs::read_to_string(&said).unwrap(), "0077\n");
    assert_eq!(mode_owner(&out.join("made")).0, 0o600, "what it creates");
    ap.call(json!({"cmd": "decide", "id": ev["id"], "allow": false}));
    let o = c.wait_with_output().unwrap();
    assert!(!o.status.success(), "refused");
    assert_eq!(std::fs::read(m.host("docs/a.md")).unwrap(), b"alpha\n");
}

/// Checks every entry the daemon made in DIR (not DIR, the operator's): its parts (`work/`, `layers/`,
/// `trash/`, `scratch/`) 0700, its records 0600. A staged tree's root (`upper/`, `next/`,
/// `layers/N/`, what is in `trash/` and `scratch/`) has SOURCE's root's mode `root_mode`
/// (the overlay shows it as the mount's root) or 0700; what the trees hold keeps their
/// callers' modes: not checked.
fn assert_private(dir: &Path, root_mode: u32) -> Vec<String> {
    let mut seen = Vec::new();
    let mut check = |p: &Path, tree: bool| {
        // The trash is emptied in the background: what is gone was not left behind.
        let Ok(md) = std::fs::symlink_metadata(p) else {
            return;
        };
        let mode = md.mode() & 0o7777;
        let ok = match (md.is_dir(), tree) {
            (true, true) => mode == 0o700 || mode == root_mode,
            (true, false) => mode == 0o700,
            (false, _) => mode == 0o600,
        };
        assert!(ok, "{} ({mode:o})", p.display());
        assert_eq!(md.uid(), 0, "{}", p.display());
        seen.push(p.strip_prefix(dir).unwrap().display().to_string());
    };
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        check(&p, ["upper", "next"].contains(&name.as_str()));
        if ["layers", "trash", "scratch"].contains(&name.as_str()) {
            for e in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                check(&e.path(), true);
            }
        }
    }
    seen.sort();
    seen
}

#[test]
fn a_staging_area_s_records_and_parts_are_the_operator_s() {
    // SOURCE's root 0750: neither 0700 nor what umask 0 would give. DIR made by the
    // operator, 0755 and empty: fencefs leaves its mode as it is.
    let (m, dir, sock) = staged_live("stage-modes", |src| {
        staged_sample(src);
        std::fs::set_permissions(src, std::fs::Permissions::from_mode(0o750)).unwrap();
        let dir = src.parent().unwrap().join("stage");
        mkdirp(&dir);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    });
    let via = |op: &str, args: &[&str]| {
        let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), op.into(), sock.clone().into()];
        v.extend(args.iter().map(Into::into));
        run_fencefs(v, LIMIT)
    };
    std::fs::write(m.mnt("a.txt"), "staged\n").unwrap();
    std::fs::write(m.mnt("new.txt"), "new\n").unwrap();
    via("checkpoint", &["-m", "turn 1"]).assert_ok("checkpoint");
    std::fs::write(m.mnt("sub/b.txt"), "changed\n").unwrap();
    via("status", &[]).assert_ok("status");
    let seen = assert_private(&dir, 0o750);
    for want in [
        "fencefs-stage",
        "lock",
        "checkpoints.json",
        "upper",
        "work",
        "layers/1",
    ] {
        assert!(seen.iter().any(|s| s == want), "{want} in {seen:?}");
    }
    via("apply", &["new.txt"]).assert_ok("apply");
    let seen = assert_private(&dir, 0o750);
    for want in [
        "fencefs-stage",
        "lock",
        "checkpoints.json",
        "audit.jsonl",
        "upper",
    ] {
        assert!(seen.iter().any(|s| s == want), "{want} in {seen:?}");
    }
    assert_eq!(mode_owner(&dir).0, 0o755, "the operator's DIR");
    assert_eq!(std::fs::read(m.host("new.txt")).unwrap(), b"new\n");
}

/// A `--learn` draft the daemon creates is the operator's too (0600), before and after
/// the draft is written at unmount.
#[test]
fn a_learn_draft_is_0600() {
    let b = Mount::builder("learn-mode").policy("mode = \"read-only\"\ndefault = \"read\"\n");
    put(&b.host("a.txt"), b"a\n", 0o644);
    let out = b.root().join("learned.toml");
    let mut m = b.arg("--allow-other").arg("--learn").arg(&out).start();
    // OUT is written only with a draft (beside it, then renamed: app/learn_out.rs).
    assert!(!out.exists(), "no OUT before the first draft");
    m.sh_as(1000, "cat a.txt > /dev/null").assert_ok("read");
    let st = m.terminate().expect("daemon exits on SIGTERM");
    assert!(st.success(), "{}", m.stderr());
    assert!(std::fs::metadata(&out).unwrap().len() > 0, "the draft");
    assert_eq!(mode_owner(&out), (0o600, 0, 0), "after the draft");
}
