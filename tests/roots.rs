//! Several roots in one mount (SPEC "Several roots, and git linked worktrees"):
//! `--root PATH=DIR` serves DIR at PATH; policy paths are paths in the mount whichever
//! root they land in; rename and link across roots fail with EXDEV (both ways) and the
//! root's point cannot be removed or renamed (EBUSY); statfs is the root's own; bad
//! `--root` values fail with one line before anything is mounted; the fstab form
//! (`-o root=PATH:DIR`); and the symlink-swap race of tests/mount_safety.rs, run in the
//! second root: a symlink swapped in on the host never leads the daemon outside it.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const POLICY: &str = r#"
mode = "danger"
default = "write"

[[rule]]
path = "data/ro"
access = "read"

[[rule]]
path = "data/hidden"
access = "none"
"#;

/// ROOT/r2, the second root's host directory (outside SOURCE).
fn second(root: &Path) -> PathBuf {
    root.join("r2")
}

fn mount_two(name: &str) -> (Mount, PathBuf) {
    let b = Mount::builder(name).policy(POLICY);
    put(&b.host("a.txt"), b"source\n", 0o644);
    let r2 = second(b.root());
    put(&r2.join("d.txt"), b"data\n", 0o644);
    put(&r2.join("ro/r.txt"), b"read only\n", 0o644);
    put(&r2.join("hidden/h.txt"), b"hidden\n", 0o644);
    let r2 = fs::canonicalize(&r2).unwrap();
    let arg = format!("data={}", r2.display());
    (b.arg("--root").arg(arg).start(), r2)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn a_second_root_is_served_at_its_path_with_the_mount_s_policy() {
    let (m, r2) = mount_two("roots-basic");
    assert_eq!(names(&m.mnt("")), vec!["a.txt", "data"]);
    assert_eq!(names(&m.mnt("data")), vec!["d.txt", "ro"]);
    assert_eq!(fs::read(m.mnt("data/d.txt")).unwrap(), b"data\n");
    // Policy paths are paths in the mount.
    let ro = fs::OpenOptions::new()
        .append(true)
        .open(m.mnt("data/ro/r.txt"));
    assert_eq!(errno_of(&ro), libc::EACCES);
    assert_eq!(
        errno_of(&fs::metadata(m.mnt("data/hidden/h.txt"))),
        libc::ENOENT
    );
    assert_eq!(
        errno_of(&fs::remove_file(m.mnt("data/ro/r.txt"))),
        libc::EACCES
    );
    // Writes land in the second root, nowhere in SOURCE.
    fs::write(m.mnt("data/new.txt"), "new\n").unwrap();
    fs::create_dir(m.mnt("data/sub")).unwrap();
    fs::rename(m.mnt("data/new.txt"), m.mnt("data/sub/moved.txt")).unwrap();
    assert_eq!(fs::read(r2.join("sub/moved.txt")).unwrap(), b"new\n");
    assert!(!m.host("data").exists(), "nothing appears in SOURCE");
    assert_eq!(fs::read(r2.join("ro/r.txt")).unwrap(), b"read only\n");
    assert_eq!(fs::read(r2.join("hidden/h.txt")).unwrap(), b"hidden\n");
    // Node ids: one per host file, none shared across the roots.
    let a = fs::metadata(m.mnt("a.txt")).unwrap();
    let d = fs::metadata(m.mnt("data/d.txt")).unwrap();
    assert_ne!(a.ino(), d.ino());
    assert_eq!(d.ino(), fs::metadata(r2.join("d.txt")).unwrap().ino());
    // statfs is the root's own.
    let via = statvfs(&m.mnt("data"));
    let host = statvfs(&r2);
    assert_eq!((via.f_bsize, via.f_blocks), (host.f_bsize, host.f_blocks));
    // The confinement covers the second root (the reads above ran confined).
    let log = m.stderr();
    assert!(
        log.contains("limited by Landlock") && log.contains("(and 1 more roots)"),
        "{log}"
    );
    // Sanity: nothing else changed in SOURCE.
    assert_eq!(names(&m.host("")), vec!["a.txt"]);
}

fn statvfs(p: &Path) -> libc::statvfs {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: valid path and out pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) }, 0);
    // SAFETY: statvfs succeeded.
    unsafe { st.assume_init() }
}

#[test]
fn rename_and_link_across_roots_fail_with_exdev() {
    let (m, r2) = mount_two("roots-exdev");
    let exdev = |r: std::io::Result<()>| errno_of(&r);
    assert_eq!(
        exdev(fs::rename(m.mnt("a.txt"), m.mnt("data/a.txt"))),
        libc::EXDEV
    );
    assert_eq!(
        exdev(fs::rename(m.mnt("data/d.txt"), m.mnt("d.txt"))),
        libc::EXDEV
    );
    assert_eq!(
        exdev(fs::hard_link(m.mnt("a.txt"), m.mnt("data/a.txt"))),
        libc::EXDEV
    );
    assert_eq!(
        exdev(fs::hard_link(m.mnt("data/d.txt"), m.mnt("d.txt"))),
        libc::EXDEV
    );
    let swap = renameat2(&m.mnt("a.txt"), &m.mnt("data/d.txt"), libc::RENAME_EXCHANGE);
    assert_eq!(errno_of(&swap), libc::EXDEV);
    // `mv` falls back to copy + unlink, as across file systems.
    let o = m.sh("mv a.txt data/a.txt");
    assert!(o.ok(), "{}", o.stderr);
    assert_eq!(fs::read(r2.join("a.txt")).unwrap(), b"source\n");
    assert!(!m.host("a.txt").exists());
    // The root's point stays where it is.
    assert_eq!(errno_of(&fs::remove_dir(m.mnt("data"))), libc::EBUSY);
    assert_eq!(
        errno_of(&fs::rename(m.mnt("data"), m.mnt("d2"))),
        libc::EBUSY
    );
    fs::create_dir(m.mnt("other")).unwrap();
    assert_eq!(
        errno_of(&fs::rename(m.mnt("other"), m.mnt("data"))),
        libc::EBUSY
    );
    assert_eq!(fs::read(r2.join("d.txt")).unwrap(), b"data\n");
    assert!(!m.host("data").exists() && !m.host("d.txt").exists());
}

/// `fencefs mount` with these args; returns (exit code, stderr). Bounded.
fn mount_fails(src: &Path, mnt: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .arg("mount")
        .args(args)
        .arg(src)
        .arg(mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(mnt)
                .status();
            panic!("fencefs mount {args:?} did not fail");
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_root_values_fail_with_one_line_and_nothing_mounted() {
    let ws = Workspace::new("roots-bad");
    let (src, mnt) = (ws.src(), ws.mnt_dir());
    put(&src.join("a.txt"), b"x\n", 0o644);
    put(&src.join("sub/f"), b"x\n", 0o644);
    let dir = ws.outside();
    let file = dir.join("plain");
    put(&file, b"x\n", 0o644);
    let d = dir.display().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["nodir".into()], "expected PATH=DIR"),
        (vec![format!("={d}")], "expected PATH=DIR"),
        (vec!["data=/nonexistent/fencefs".into()], "No such file"),
        (vec![format!("/abs={d}")], "relative"),
        (vec![format!("../up={d}")], "'..'"),
        (vec![format!("a.txt={d}")], "exists in SOURCE"),
        (vec![format!("x={}", file.display())], "not a directory"),
        (vec![format!("x={}", src.join("sub").display())], "nested"),
        (vec![format!("no/parent={d}")], "parent"),
        (vec![format!("x={d}"), format!("x={d}")], "twice"),
        (vec![format!(".fencefs={d}")], "keeps for itself"),
        (
            vec![format!("up={}", mnt.parent().unwrap().display())],
            "mount point",
        ),
        (vec![format!(".fencefs-git/x={d}")], "keeps for itself"),
    ];
    for (values, why) in cases {
        let mut args = vec![];
        for v in &values {
            args.push("--root");
            args.push(v.as_str());
        }
        let (code, err) = mount_fails(&src, &mnt, &args);
        assert_eq!(code, Some(1), "{values:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.contains(" INFO ")).collect();
        assert_eq!(lines.len(), 1, "{values:?}: one error line: {err}");
        assert!(lines[0].starts_with("fencefs: --root"), "{values:?}: {err}");
        assert!(lines[0].contains(why), "{values:?}: wants {why:?}: {err}");
        assert!(!is_mounted(&mnt), "{values:?}: nothing is mounted");
    }
    assert!(!src.join("x").exists() && !src.join("data").exists());
}

#[test]
fn the_fstab_form_takes_root_options() {
    require_fuse();
    let ws = Workspace::new("roots-fstab");
    let (src, mnt) = (ws.src(), ws.mnt_dir());
    put(&src.join("a.txt"), b"source\n", 0o644);
    let r2 = ws.outside();
    put(&r2.join("d.txt"), b"data\n", 0o644);
    let opt = format!("root=data:{},mode=danger", r2.display());
    // mount.fuse3's call: `fencefs SOURCE MOUNTPOINT -o OPTIONS`; it returns once mounted.
    let st = Command::new(BIN)
        .arg(&src)
        .arg(&mnt)
        .arg("-o")
        .arg(&opt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    let read = fs::read(mnt.join("data/d.txt"));
    let listed = fs::read_dir(&mnt).map(|rd| rd.count());
    // Unmounting ends the daemon (mount.fuse3's way; the daemon is not our child).
    let _ = Command::new("fusermount3").arg("-u").arg(&mnt).status();
    let start = Instant::now();
    while is_mounted(&mnt) && start.elapsed() < Duration::from_secs(10) {
        thread::sleep(Duration::from_millis(50));
    }
    assert!(st.success(), "fencefs SOURCE MNT -o {opt}");
    assert_eq!(read.unwrap(), b"data\n");
    assert_eq!(listed.unwrap(), 2);
    assert!(!is_mounted(&mnt));
    // A bad root in the fstab form: an error, nothing mounted.
    let out = Command::new(BIN)
        .arg(&src)
        .arg(&mnt)
        .arg("-o")
        .arg("root=oops")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected PATH=DIR"));
    assert!(!is_mounted(&mnt));
}

const MARKER_IN: &[u8] = b"inside\n";
const MARKER_OUT: &[u8] = b"OUTSIDE-SECRET\n";

/// tests/mount_safety.rs's race, in the second root: ROOT/r2/a/dir ↔ a/dir.swap, a relative
/// symlink that reaches ROOT/secret on the host and nothing through the mount (data/a/.. /..
/// is the mount's root, which has no `secret`). The secret can only come back if the
/// daemon itself followed a host symlink in the second root.
#[test]
fn host_symlink_swap_race_in_a_second_root_never_leaks() {
    let b = Mount::builder("roots-race")
        .policy("default = \"write\"\n")
        .mode("danger");
    let root = b.root().to_path_buf();
    let r2 = second(&root);
    put(&root.join("secret/dir/marker"), MARKER_OUT, 0o644);
    put(&root.join("secret/file"), MARKER_OUT, 0o644);
    put(&r2.join("a/dir/marker"), MARKER_IN, 0o644);
    put(&r2.join("a/file"), MARKER_IN, 0o644);
    symlink("../../secret/dir", &r2.join("a/dir.swap"));
    symlink("../../secret/file", &r2.join("a/file.swap"));
    assert_eq!(fs::read(r2.join("a/dir.swap/marker")).unwrap(), MARKER_OUT);
    let m = b
        .arg("--root")
        .arg(format!("data={}", r2.display()))
        .start();
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, a) = (stop.clone(), swaps.clone(), r2.join("a"));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for (x, y) in [("dir", "dir.swap"), ("file", "file.swap")] {
                    renameat2(&a.join(x), &a.join(y), libc::RENAME_EXCHANGE).unwrap();
                }
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let start = Instant::now();
    let (mut iterations, mut leaks) = (0u64, vec![]);
    while (iterations < 2000 || start.elapsed() < Duration::from_secs(4))
        && start.elapsed() < Duration::from_secs(10)
    {
        iterations += 1;
        for p in ["a/dir/marker", "a/file", "a/dir.swap/marker", "a/file.swap"] {
            if let Ok(v) = fs::read(m.mnt("data").join(p))
                && v != MARKER_IN
                && !v.is_empty()
            {
                leaks.push(format!("{p}: {:?}", String::from_utf8_lossy(&v)));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    eprintln!(
        "second-root race: {iterations} iterations, {} host swaps",
        swaps.load(Ordering::Relaxed)
    );
    assert!(swaps.load(Ordering::Relaxed) > 0, "the race ran");
    assert!(leaks.is_empty(), "outside content came back: {leaks:?}");
}

#[test]
fn explain_and_audit_lines_name_the_root() {
    let run = |args: &[&str]| {
        let o = Command::new(BIN)
            .arg("explain")
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "explain {args:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let o = run(&["--root", "data=/srv/data", "data/sub/x.txt"]);
    assert!(o.lines().any(|l| l == "root: data (/srv/data)"), "{o}");
    let o = run(&["--root", "data=/srv/data", "database/x"]);
    assert!(o.lines().any(|l| l == "root: SOURCE"), "{o}");
    let o = run(&[".fencefs-git/hooks/pre-commit"]);
    assert!(
        o.contains("root: .fencefs-git (the repository of a linked worktree"),
        "{o}"
    );
    assert!(o.contains("also decided as .git/hooks/pre-commit: "), "{o}");
    // Audit lines: "root" is the root's path in the mount, null for SOURCE.
    let b = Mount::builder("roots-audit").policy(POLICY);
    put(&b.host("a.txt"), b"source\n", 0o644);
    let r2 = second(b.root());
    put(&r2.join("ro/r.txt"), b"read only\n", 0o644);
    let audit = b.root().join("audit.jsonl");
    let m = b
        .arg("--audit")
        .arg(&audit)
        .arg("--root")
        .arg(format!("data={}", r2.display()))
        .start();
    assert!(
        fs::OpenOptions::new()
            .append(true)
            .open(m.mnt("data/ro/r.txt"))
            .is_err()
    );
    assert!(fs::metadata(m.mnt("nothing-here")).is_err());
    let start = Instant::now();
    while !fs::read_to_string(&audit)
        .unwrap_or_default()
        .contains("data/ro")
        && start.elapsed() < Duration::from_secs(10)
    {
        thread::sleep(Duration::from_millis(50));
    }
    // (Read before the mount is dropped: that removes the workspace.)
    let lines = audit_lines(&audit);
    drop(m);
    let ro = lines
        .iter()
        .find(|v| v["path"] == "data/ro/r.txt")
        .unwrap_or_else(|| panic!("no data/ro line: {lines:?}"));
    assert_eq!(ro["root"], "data", "{ro}");
    assert_eq!(ro["errno"], "EACCES", "{ro}");
    for v in lines
        .iter()
        .filter(|v| !v["path"].as_str().unwrap_or("").starts_with("data"))
    {
        assert!(v["root"].is_null(), "{v}");
    }
}

fn audit_lines(p: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// With `--stage` only SOURCE is staged: the other roots are read-only (EROFS), so no
/// change bypasses the review, and SOURCE's changes are staged as ever.
#[test]
fn with_staging_the_other_roots_are_read_only() {
    let b = Mount::builder("roots-stage").policy(POLICY);
    put(&b.host("a.txt"), b"source\n", 0o644);
    let r2 = second(b.root());
    put(&r2.join("d.txt"), b"data\n", 0o644);
    let stage = b.root().join("stage");
    let m = b
        .arg("--stage")
        .arg(&stage)
        .arg("--root")
        .arg(format!("data={}", r2.display()))
        .start();
    assert_eq!(fs::read(m.mnt("data/d.txt")).unwrap(), b"data\n");
    assert_eq!(errno_of(&fs::write(m.mnt("data/d.txt"), "x")), libc::EROFS);
    assert_eq!(errno_of(&fs::write(m.mnt("data/new"), "x")), libc::EROFS);
    assert_eq!(errno_of(&fs::remove_file(m.mnt("data/d.txt"))), libc::EROFS);
    fs::write(m.mnt("a.txt"), "staged\n").unwrap();
    assert_eq!(
        fs::read(m.host("a.txt")).unwrap(),
        b"source\n",
        "SOURCE is staged"
    );
    assert_eq!(fs::read(r2.join("d.txt")).unwrap(), b"data\n");
    assert!(!r2.join("new").exists());
}

/// Unmounts the tmpfs it mounted (declared before the fencefs mount, so dropped after it).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Tmpfs {
        fs::create_dir_all(at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m,mode=0755", "fencefs-test"])
            .arg(at)
            .status()
            .unwrap();
        assert!(st.success(), "mount -t tmpfs {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A root on another file system: its statfs, its own node ids (synthetic: no clash with
/// SOURCE's inode numbers), its own confinement rule and watch mark (files created on the
/// host there are seen through the mount).
#[test]
fn a_root_on_another_file_system_stands_alone() {
    let b = Mount::builder("roots-tmpfs").policy(POLICY);
    put(&b.host("a.txt"), b"source\n", 0o644);
    let t = Tmpfs::mount(&b.outside().join("t"));
    put(&t.0.join("x.txt"), b"on tmpfs\n", 0o644);
    let m = b
        .arg("--root")
        .arg(format!("data={}", t.0.display()))
        .start();
    assert_eq!(fs::read(m.mnt("data/x.txt")).unwrap(), b"on tmpfs\n");
    let via = statvfs(&m.mnt("data"));
    let host = statvfs(&t.0);
    let source = statvfs(&m.host(""));
    assert_eq!((via.f_bsize, via.f_blocks), (host.f_bsize, host.f_blocks));
    assert_ne!(
        via.f_blocks, source.f_blocks,
        "statfs is the root's, not SOURCE's"
    );
    let ids: Vec<u64> = ["a.txt", "data", "data/x.txt", ""]
        .iter()
        .map(|p| fs::metadata(m.mnt(p)).unwrap().ino())
        .collect();
    let mut uniq = ids.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), ids.len(), "node ids are distinct: {ids:?}");
    fs::write(m.mnt("data/new.txt"), "new\n").unwrap();
    assert_eq!(fs::read(t.0.join("new.txt")).unwrap(), b"new\n");
    assert_eq!(
        errno_of(&fs::rename(m.mnt("data/new.txt"), m.mnt("new.txt"))),
        libc::EXDEV
    );
    put(&t.0.join("late.txt"), b"late\n", 0o644);
    assert_eq!(fs::read(m.mnt("data/late.txt")).unwrap(), b"late\n");
    drop(m);
}

/// A root's point below a directory of SOURCE (`cfg/data`): that directory cannot be
/// renamed, replaced or removed (EBUSY) either, else the root's files would be reached
/// under another path (`cfg2/data/...`) that is SOURCE's, and move into SOURCE.
#[test]
fn an_ancestor_of_a_root_point_stays_where_it_is() {
    let b = Mount::builder("roots-ancestor").policy(POLICY);
    mkdirp(&b.host("cfg"));
    mkdirp(&b.host("other"));
    let r2 = second(b.root());
    put(&r2.join("d.txt"), b"data\n", 0o644);
    let r2 = fs::canonicalize(&r2).unwrap();
    let m = b
        .arg("--root")
        .arg(format!("cfg/data={}", r2.display()))
        .start();
    assert_eq!(
        errno_of(&fs::rename(m.mnt("cfg/data/d.txt"), m.mnt("cfg/d.txt"))),
        libc::EXDEV
    );
    assert_eq!(
        errno_of(&fs::rename(m.mnt("cfg"), m.mnt("cfg2"))),
        libc::EBUSY
    );
    assert_eq!(
        errno_of(&fs::rename(m.mnt("other"), m.mnt("cfg"))),
        libc::EBUSY
    );
    let swap = renameat2(&m.mnt("other"), &m.mnt("cfg"), libc::RENAME_EXCHANGE);
    assert_eq!(errno_of(&swap), libc::EBUSY);
    assert_eq!(errno_of(&fs::remove_dir(m.mnt("cfg"))), libc::EBUSY);
    // Whatever got through, nothing of the root moved into SOURCE.
    let _ = fs::rename(m.mnt("cfg2/data/d.txt"), m.mnt("cfg2/d.txt"));
    let _ = fs::rename(m.mnt("other/data/d.txt"), m.mnt("other/d.txt"));
    assert_eq!(fs::read(r2.join("d.txt")).unwrap(), b"data\n");
    assert!(m.host("cfg").is_dir() && m.host("other").is_dir());
    assert!(!m.host("cfg2").exists() && !m.host("other/d.txt").exists());
}

/// Opens of `rel` held until one fails: how many succeeded, and the errno that stopped them.
fn hold_opens(m: &Mount, rel: &str, held: &mut Vec<fs::File>) -> (usize, Option<i32>) {
    let before = held.len();
    loop {
        match fs::File::open(m.mnt(rel)) {
            Ok(f) => held.push(f),
            Err(e) => return (held.len() - before, e.raw_os_error()),
        }
        assert!(held.len() < 10_000, "no limit reached opening {rel}");
    }
}

/// Each root has its own share of the descriptor budget: a caller flooding one root with
/// opens gets EMFILE (as past its share) at three quarters of its share, and another root
/// still serves its opens; the host files stay as they were.
#[test]
fn a_flood_of_opens_in_one_root_leaves_another_root_serving() {
    let b = Mount::builder("roots-budget")
        .policy(POLICY)
        .arg("--no-passthrough")
        .arg("--max-open-per-uid")
        .arg("40");
    put(&b.host("a.txt"), b"source\n", 0o644);
    let r2 = second(b.root());
    put(&r2.join("d.txt"), b"data\n", 0o644);
    let r2 = fs::canonicalize(&r2).unwrap();
    let m = b
        .arg("--root")
        .arg(format!("data={}", r2.display()))
        .start();
    let mut held = Vec::new();
    let flood = hold_opens(&m, "data/d.txt", &mut held);
    assert_eq!(
        flood,
        (30, Some(libc::EMFILE)),
        "the flooder's share in one root is 3/4 of 40"
    );
    let rest = hold_opens(&m, "a.txt", &mut held);
    assert_eq!(
        rest,
        (10, Some(libc::EMFILE)),
        "SOURCE still serves the rest of the uid's share"
    );
    drop(held);
    // Released handles give their units back (RELEASE is asynchronous).
    assert!(
        eventually(Duration::from_secs(20), || fs::File::open(
            m.mnt("data/d.txt")
        )
        .is_ok()),
        "the flooded root serves again once the files are closed"
    );
    assert_eq!(fs::read(r2.join("d.txt")).unwrap(), b"data\n");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"source\n");
}
