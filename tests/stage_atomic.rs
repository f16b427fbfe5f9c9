//! The daemon's merged view changes a name in one step (`src/host/union/remove.rs`,
//! `change.rs`, `copyup.rs`): a failure between two steps of a whiteout, an opaque
//! directory or a replaced directory never brings back what the agent deleted; a copy-up's
//! data copy holds up no one else's name change; the refusals answer their exact errno
//! and leave SOURCE byte for byte as it was.
//!
//! Failures are injected for real: DIR on a small ext4 image whose inodes run out (a
//! whiteout cannot be made), an upper directory made immutable (a rename fails EPERM), and
//! the daemon aborted between two steps of a name change (`FENCEFS_FAULT_UNION_ABORT`),
//! then a fresh daemon on the same DIR compared with kernel overlayfs.

mod common;

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::oracle::*;
use common::stage::*;
use common::*;

/// A small ext4 file system mounted from an image (loop device, freed on unmount) in a
/// test's root. Declared before the test's [`Mount`], so dropped after it: then it is
/// unmounted and the root (which the mount's clean-up could not remove while the image
/// was mounted in it) is removed.
struct Ext4 {
    root: PathBuf,
    at: PathBuf,
}

impl Ext4 {
    fn mount(root: &Path, inodes: u32) -> Ext4 {
        let img = root.join("dir.img");
        let at = root.join("dirfs");
        fs::create_dir_all(&at).unwrap();
        fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
        let mkfs = format!(
            "mkfs.ext4 -q -F -N {inodes} -O ^has_journal {}",
            img.display()
        );
        sh_in(root, &mkfs).assert_ok("mkfs.ext4");
        sh_in(
            root,
            &format!("mount -o loop {} {}", img.display(), at.display()),
        )
        .assert_ok("mount the ext4 image");
        Ext4 {
            root: root.to_path_buf(),
            at,
        }
    }

    /// Makes empty files under `at/fill` until the inodes run out; returns how many.
    fn fill(&self) -> usize {
        let d = self.at.join("fill");
        fs::create_dir_all(&d).unwrap();
        let mut n = 0;
        loop {
            match fs::File::create(d.join(n.to_string())) {
                Ok(_) => n += 1,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return n,
                Err(e) => panic!("filling the image: {e}"),
            }
        }
    }

    fn unfill(&self) {
        fs::remove_dir_all(self.at.join("fill")).unwrap();
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        if is_mounted(&self.at) {
            let ok = Command::new("umount")
                .arg(&self.at)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.at).status();
            }
        }
        let mnt = self.root.join("mp/mnt");
        if !is_mounted(&self.at) && !is_mounted(&mnt) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

fn unlink(p: &Path) -> std::io::Result<()> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::unlink(c.as_ptr()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `rm a` of a staged file SOURCE also holds must leave a whiteout. Before, the upper's
/// file was unlinked and then the whiteout made: when the whiteout could not be made
/// (ENOSPC here; a crash there), SOURCE's `a` was shown again. Now the whiteout is made
/// in DIR/work first and swapped in: no inode, no change.
#[test]
fn a_removal_whose_whiteout_cannot_be_made_changes_nothing() {
    let b = Mount::builder("atomic-rm-enospc").policy(WRITE);
    put(&b.host("a"), b"source\n", 0o644);
    let fsys = Ext4::mount(b.root(), 128);
    let dir = fsys.at.join("stage");
    let mut m = b.arg("--stage").arg(&dir).start();
    let before = snapshot(&m.host(""));
    // `b` links the staged copy: unlinking `a` then frees no inode.
    m.sh("echo agent > a && ln a b")
        .assert_ok("stage a, link it");
    let filled = fsys.fill();
    assert!(filled > 0, "the image had free inodes");
    let _ = assert_errno(
        unlink(&m.mnt("a")),
        libc::ENOSPC,
        "rm a without an inode left",
    );
    assert_eq!(read_all(&m.mnt("a")).unwrap(), b"agent\n", "a as staged");
    // What the next lookup (or the next mount) finds: the kernel's cached entry would
    // hide a resurrection.
    assert_eq!(
        fs::read(dir.join("upper/a")).unwrap(),
        b"agent\n",
        "the staged a is still in DIR/upper (else SOURCE's shows again)"
    );
    fsys.unfill();
    unlink(&m.mnt("a")).expect("rm a once there is room");
    assert!(!m.mnt("a").exists(), "a deleted");
    assert_eq!(read_all(&m.mnt("b")).unwrap(), b"agent\n");
    assert_host_unchanged(&before, &m.host(""), "staged removals");
    stop(&mut m);
}

/// `mv -T s/d t` where `t` is a directory whose entries the agent deleted: the rename
/// replaces `t`. Before, t's whiteouts were deleted first and the rename made after, so
/// a rename that failed (here: `s` immutable in DIR/upper, EPERM) showed SOURCE's `t/x`
/// and `t/y` again. Now `t` is first swapped with an empty opaque copy of itself.
#[test]
fn a_failed_rename_keeps_the_replaced_directorys_deletions() {
    let (mut m, dir) = staged("atomic-mv-fail", WRITE, |src| {
        put(&src.join("t/x"), b"x\n", 0o644);
        put(&src.join("t/y"), b"y\n", 0o644);
        put(&src.join("s/keep"), b"k\n", 0o644);
    });
    let before = snapshot(&m.host(""));
    m.sh("rm t/x t/y && mkdir s/d && echo n > s/d/n")
        .assert_ok("delete t's entries, make s/d");
    let s_up = dir.join("upper/s");
    sh_in(Path::new("/"), &format!("chattr +i {}", s_up.display())).assert_ok("chattr +i");
    let r = renameat2(&m.mnt("s/d"), &m.mnt("t"), 0);
    sh_in(Path::new("/"), &format!("chattr -i {}", s_up.display())).assert_ok("chattr -i");
    let _ = assert_errno(r, libc::EPERM, "rename out of an immutable upper directory");
    assert_eq!(
        names_str(&m.mnt("t")).unwrap(),
        Vec::<String>::new(),
        "t shows nothing"
    );
    assert_eq!(names_str(&m.mnt("s/d")).unwrap(), ["n"]);
    // And once it can, the rename is made.
    renameat2(&m.mnt("s/d"), &m.mnt("t"), 0).expect("rename");
    assert_eq!(names_str(&m.mnt("t")).unwrap(), ["n"]);
    assert_host_unchanged(&before, &m.host(""), "staged renames");
    stop(&mut m);
}

/// A new name over a deleted one replaces its whiteout in one rename: a directory made
/// where the agent deleted one is opaque from the start, a file made where it deleted
/// one shows its own bytes, and nothing is left under a temporary name.
#[test]
fn new_names_over_deleted_ones_replace_their_whiteouts() {
    let (mut m, dir) = staged("atomic-new-over-wh", WRITE, |src| {
        put(&src.join("d/old"), b"old\n", 0o644);
        put(&src.join("f"), b"source f\n", 0o644);
        put(&src.join("l"), b"source l\n", 0o644);
    });
    let before = snapshot(&m.host(""));
    m.sh("rm -r d f l && mkdir d && echo n > d/n && echo agent > f && ln -s f l")
        .assert_ok("new names over deleted ones");
    assert_eq!(names_str(&m.mnt("d")).unwrap(), ["n"]);
    assert_eq!(read_all(&m.mnt("f")).unwrap(), b"agent\n");
    assert_eq!(fs::read_link(m.mnt("l")).unwrap(), Path::new("f"));
    m.sh("rm -r d && mkdir d && rmdir d && mkdir d")
        .assert_ok("again");
    assert_eq!(names_str(&m.mnt("d")).unwrap(), Vec::<String>::new());
    let leftovers: Vec<String> = names_str(&dir.join("upper"))
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with("#fencefs"))
        .collect();
    assert!(leftovers.is_empty(), "temporary names left: {leftovers:?}");
    assert_host_unchanged(&before, &m.host(""), "new names");
    stop(&mut m);
}

/// RENAME_EXCHANGE of a directory with lower parts: EXDEV (`mv` copies instead), and
/// SOURCE and the view are as they were.
#[test]
fn exchanging_a_directory_with_lower_parts_is_exdev() {
    let (mut m, _dir) = staged("atomic-exdev", WRITE, |src| {
        put(&src.join("a/f"), b"a\n", 0o644);
        put(&src.join("b/g"), b"b\n", 0o644);
    });
    let before = snapshot(&m.host(""));
    let r = renameat2(&m.mnt("a"), &m.mnt("b"), libc::RENAME_EXCHANGE);
    let _ = assert_errno(r, libc::EXDEV, "exchange of two SOURCE directories");
    m.sh("mkdir c").assert_ok("mkdir c");
    let r = renameat2(&m.mnt("a"), &m.mnt("c"), libc::RENAME_EXCHANGE);
    let _ = assert_errno(
        r,
        libc::EXDEV,
        "exchange of a SOURCE directory with a new one",
    );
    assert_eq!(names_str(&m.mnt("a")).unwrap(), ["f"]);
    assert_eq!(names_str(&m.mnt("b")).unwrap(), ["g"]);
    assert_host_unchanged(&before, &m.host(""), "refused exchanges");
    stop(&mut m);
}

/// rmdir of a merged directory whose only entries are SOURCE's: ENOTEMPTY, nothing
/// whited out.
#[test]
fn removing_a_directory_with_only_lower_entries_is_enotempty() {
    let (mut m, dir) = staged("atomic-enotempty", WRITE, |src| {
        put(&src.join("d/f"), b"f\n", 0o644);
    });
    let before = snapshot(&m.host(""));
    let r = fs::remove_dir(m.mnt("d"));
    let _ = assert_errno(
        r,
        libc::ENOTEMPTY,
        "rmdir of a SOURCE directory with a file",
    );
    m.sh("touch d/g && rm d/g")
        .assert_ok("d copied up, still merged");
    let r = fs::remove_dir(m.mnt("d"));
    let _ = assert_errno(
        r,
        libc::ENOTEMPTY,
        "rmdir of a copied-up directory with a lower file",
    );
    assert_eq!(names_str(&m.mnt("d")).unwrap(), ["f"]);
    assert!(!dir.join("upper/d/f").exists(), "no whiteout of d/f");
    assert_host_unchanged(&before, &m.host(""), "refused rmdir");
    stop(&mut m);
}

/// `rm -rf` of host trees: each directory is decided (swapped out, seen to hold only
/// whiteouts) before the agent is answered and its whiteouts are deleted off the request
/// (`union/purge.rs`): the view shows the trees gone at once, SOURCE is untouched, the
/// work directory empties soon after, and what still waits at a clean stop is deleted
/// before the daemon exits — nothing left in DIR/work.
#[test]
fn removed_directories_leave_nothing_in_the_work_directory() {
    let (mut m, dir) = staged("atomic-purge", WRITE, |src| {
        for t in ["t", "u"] {
            for d in 0..4 {
                for f in 0..40 {
                    put(&src.join(format!("{t}/d{d}/f{f}")), b"x\n", 0o644);
                }
            }
        }
    });
    let before = snapshot(&m.host(""));
    let temp = |n: &String| n.starts_with("#fencefs-");
    m.sh("rm -rf t").assert_ok("rm -rf t");
    assert!(!m.mnt("t").exists(), "t gone from the view");
    let _ = assert_errno(fs::metadata(m.mnt("t/d0/f0")), libc::ENOENT, "t/d0/f0");
    let emptied = eventually(Duration::from_secs(10), || {
        !names_str(&dir.join("work")).unwrap().iter().any(temp)
    });
    assert!(
        emptied,
        "the work directory emptied: {:?}",
        names_str(&dir.join("work"))
    );
    m.sh("mkdir t && ls -A t")
        .assert_ok("a new t over the deleted one");
    assert_eq!(names_str(&m.mnt("t")).unwrap(), Vec::<String>::new());
    m.sh("rm -rf u").assert_ok("rm -rf u");
    stop(&mut m);
    let left = names_str(&dir.join("work")).unwrap();
    assert!(!left.iter().any(temp), "nothing left in DIR/work: {left:?}");
    assert_host_unchanged(&before, &m.host(""), "staged rm -rf");
}

/// An unlink in a directory with nothing below the upper goes in one step
/// (`Union::remove_upper_only`): the agent's own files and symlinks go and leave no
/// whiteout; a whiteout left there (SOURCE's directory deleted on the host after the agent
/// deleted a file in it) is not something shown: unlinking its name is ENOENT, and it
/// stays.
#[test]
fn an_unlink_where_nothing_is_below_removes_only_what_is_shown() {
    let (mut m, dir) = staged("atomic-upper-only", WRITE, |src| {
        put(&src.join("d/f"), b"f\n", 0o644);
        put(&src.join("d/g"), b"g\n", 0o644);
    });
    m.sh("mkdir n && echo a > n/a && ln -s a n/l && : > n/e && rm n/a n/l n/e")
        .assert_ok("the agent's own files");
    assert_eq!(
        names_str(&dir.join("upper/n")).unwrap(),
        Vec::<String>::new()
    );
    m.sh("rm d/f").assert_ok("rm d/f");
    fs::remove_dir_all(m.host("d")).unwrap();
    let w = dir.join("upper/d/f");
    let before = fs::symlink_metadata(&w).expect("d/f's whiteout");
    let _ = assert_errno(
        unlink(&m.mnt("d/f")),
        libc::ENOENT,
        "unlink of a whiteout's name",
    );
    let after = fs::symlink_metadata(&w).expect("the whiteout stays");
    assert_eq!(before.ino(), after.ino());
    assert!(!m.host("d").exists(), "SOURCE's d stays gone");
    stop(&mut m);
}

/// The host replaces a file by rename (an editor's save) after the mount looked it up:
/// a change through a descriptor opened before answers ESTALE (raw: a descriptor's call
/// is not retried by the kernel) and stages nothing; a change by path is retried by the
/// kernel on ESTALE and lands on the host's new file. SOURCE keeps the host's bytes.
#[test]
fn a_change_of_a_file_the_host_replaced_is_estale_or_lands_on_the_new_one() {
    let (mut m, dir) = staged("atomic-estale", WRITE, |src| {
        put(&src.join("f"), b"old\n", 0o644);
    });
    let held = fs::File::open(m.mnt("f")).unwrap();
    assert_eq!(read_all(&m.mnt("f")).unwrap(), b"old\n");
    put(&m.host("f.new"), b"new\n", 0o644);
    fs::rename(m.host("f.new"), m.host("f")).unwrap();
    let before = snapshot(&m.host(""));
    let r = held.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600));
    let _ = assert_errno(
        r,
        libc::ESTALE,
        "fchmod through a descriptor of the replaced file",
    );
    assert!(!dir.join("upper/f").exists(), "nothing staged");
    drop(held);
    let mut w = fs::OpenOptions::new()
        .append(true)
        .open(m.mnt("f"))
        .expect("open by path: retried on ESTALE");
    w.write_all(b"agent\n").unwrap();
    drop(w);
    assert_eq!(read_all(&m.mnt("f")).unwrap(), b"new\nagent\n");
    assert_eq!(fs::read(dir.join("upper/f")).unwrap(), b"new\nagent\n");
    assert_host_unchanged(&before, &m.host(""), "staged changes");
    stop(&mut m);
}

/// A copy-up of a 1 GiB file (real data, from SOURCE) takes a while; the names lock is
/// not held meanwhile, so another process's create, rename and unlink in another
/// directory finish before it does.
#[test]
fn a_big_copy_up_holds_up_no_other_name_change() {
    const MIB: usize = 1 << 20;
    let b = Mount::builder("atomic-big-copyup").policy(WRITE);
    let mut f = fs::File::create(b.host("big")).unwrap();
    let chunk: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 + 1).collect();
    for _ in 0..1024 {
        f.write_all(&chunk).unwrap();
    }
    drop(f);
    put(&b.host("other/x"), b"x\n", 0o644);
    let dir = stage_dir(&b);
    // More workers than the two cores: one serves the copy-up, the others the rest.
    let mut m = b.arg("--stage").arg(&dir).arg("--threads").arg("4").start();
    let before = snapshot(&m.host("other"));
    let done = Arc::new(AtomicBool::new(false));
    let big = m.mnt("big");
    let flag = done.clone();
    let t0 = Instant::now();
    let writer = std::thread::spawn(move || {
        let f = fs::OpenOptions::new().write(true).open(big);
        flag.store(true, Ordering::SeqCst);
        f.map(|_| t0.elapsed())
    });
    // The copy has started once its temporary file is in DIR/work.
    let started = eventually(Duration::from_secs(30), || {
        fs::read_dir(dir.join("work")).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .as_bytes()
                .starts_with(b"#fencefs-up")
        })
    });
    assert!(started, "the copy-up started");
    let t = Instant::now();
    fs::create_dir(m.mnt("other/dd")).unwrap();
    fs::write(m.mnt("other/new"), b"n\n").unwrap();
    fs::rename(m.mnt("other/x"), m.mnt("other/y")).unwrap();
    unlink(&m.mnt("other/y")).unwrap();
    let others = t.elapsed();
    let copy_done = done.load(Ordering::SeqCst);
    let at = t.duration_since(t0);
    let copy = writer
        .join()
        .unwrap()
        .expect("open for writing: the copy-up");
    eprintln!("copy-up: {copy:?}; the other changes: from {at:?}, {others:?}");
    assert!(
        !copy_done,
        "the other name changes (from {at:?}, {others:?}) waited for the copy-up ({copy:?})"
    );
    assert_eq!(fs::metadata(m.mnt("big")).unwrap().len(), 1 << 30);
    assert_host_unchanged(&before, &m.host("other"), "other/");
    stop(&mut m);
    let _ = fs::remove_file(m.host("big"));
    let _ = fs::remove_file(dir.join("upper/big"));
}

/// A staged mount whose daemon aborts (as `kill -9` ends it) at `step` of a name change
/// (`FENCEFS_FAULT_UNION_ABORT`, see `src/host/union/mod.rs`): `before` is run, then `op`
/// (which the abort fails), then a fresh daemon serves the same DIR. Returns the first
/// mount (for its paths), DIR and the second daemon, whose view matched kernel overlayfs.
fn crash_at(
    name: &str,
    step: &str,
    setup: impl FnOnce(&Path),
    before: &str,
    op: &str,
) -> (Mount, PathBuf, Second) {
    let b = Mount::builder(name).policy(WRITE);
    setup(&b.host(""));
    let dir = stage_dir(&b);
    let mut m = b
        .arg("--stage")
        .arg(&dir)
        .env("FENCEFS_FAULT_UNION_ABORT", step)
        .start();
    let src = snapshot(&m.host(""));
    m.sh(before).assert_ok("before the crash");
    m.sh(op).assert_fail("the name change the daemon dies in");
    let st = m
        .wait_exit(Duration::from_secs(10))
        .expect("the daemon ended");
    assert!(!st.success(), "aborted: {st}");
    assert!(
        m.stderr().contains(&format!("abort at {step}")),
        "the daemon died at {step}: {}",
        m.stderr()
    );
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(m.mnt(""))
        .status();
    let second = Second::start(&m, &dir, &m.policy_path());
    let want = Oracle::view_of(&m, &dir);
    let got = view(&second.mnt(""));
    assert!(got == want, "after the crash: {}", view_diff(&got, &want));
    assert_host_unchanged(&src, &m.host(""), "a crash between steps");
    (m, dir, second)
}

/// `rm a` dies once the whiteout is swapped in (the staged file is in DIR/work): `a` is
/// deleted, SOURCE's never shows, and the next daemon deletes the removed file from
/// DIR/work before it serves (a removal's leftover, `#fencefs-rm.PID.N`).
#[test]
fn a_crash_in_a_removal_leaves_the_name_deleted() {
    let (_m, dir, s) = crash_at(
        "atomic-crash-rm",
        "removed",
        |src| put(&src.join("a"), b"source\n", 0o644),
        "echo agent > a",
        "rm a",
    );
    assert!(!s.mnt("a").exists(), "a deleted, not SOURCE's again");
    let work = names_str(&dir.join("work")).unwrap();
    assert!(
        !work.iter().any(|n| n.starts_with("#fencefs-rm.")),
        "the removed a swept from DIR/work: {work:?}"
    );
}

/// `mkdir d` over a deleted `d` dies once the new directory is made under its temporary
/// name: `d` is still deleted (its whiteout never went), and the next daemon sweeps the
/// new directory left under the temporary name (before: shown, and listed as added).
#[test]
fn a_crash_in_a_new_name_over_a_deleted_one_keeps_the_deletion() {
    let (_m, dir, s) = crash_at(
        "atomic-crash-mkdir",
        "new-made",
        |src| put(&src.join("d/old"), b"old\n", 0o644),
        "rm -r d",
        "mkdir d",
    );
    assert!(!s.mnt("d").exists(), "d still deleted");
    let left: Vec<String> = names_str(&s.mnt("")).unwrap();
    assert!(left.is_empty(), "the temporary name swept: {left:?}");
    assert_eq!(
        names_str(&dir.join("upper")).unwrap(),
        ["d"],
        "d's whiteout only"
    );
}

/// A name of a temporary name's form (`#fencefs-new.PID.N`, which the sweep at the next
/// start deletes from DIR/upper) is never made through a staged mount: create, mkdir,
/// symlink, link and a rename to it answer EINVAL, and neither SOURCE nor DIR/upper gets
/// it (an agent's file so named would be lost at the next start).
#[test]
fn a_temporary_names_form_is_refused_as_a_new_name() {
    let (mut m, dir) = staged("atomic-reserved", WRITE, |src| {
        put(&src.join("a"), b"a\n", 0o644)
    });
    m.sh("echo b > b").assert_ok("agent");
    let source = snapshot(&m.host(""));
    let upper = snapshot(&dir.join("upper"));
    let bad = m.mnt("#fencefs-new.1.2");
    let einval = |r: std::io::Result<()>, what: &str| {
        assert_eq!(
            r.map_err(|e| e.raw_os_error()),
            Err(Some(libc::EINVAL)),
            "{what}"
        )
    };
    einval(fs::File::create(&bad).map(drop), "create");
    einval(fs::create_dir(&bad), "mkdir");
    einval(std::os::unix::fs::symlink("a", &bad), "symlink");
    einval(fs::hard_link(m.mnt("b"), &bad), "link");
    einval(fs::rename(m.mnt("b"), &bad), "rename of a staged file");
    einval(fs::rename(m.mnt("a"), &bad), "rename of a SOURCE file");
    // Names not exactly of the form are ordinary.
    fs::write(m.mnt("#fencefs-new.1.x"), b"ok\n").unwrap();
    fs::remove_file(m.mnt("#fencefs-new.1.x")).unwrap();
    stop(&mut m);
    assert_host_unchanged(&source, &m.host(""), "refused temporary-name forms");
    assert_host_unchanged(&upper, &dir.join("upper"), "DIR/upper after the refusals");
}

/// Leftovers `#fencefs-new.PID.N` in DIR/upper (made by hand) at a daemon's start: those
/// whose PID is no live fencefs are deleted (a file; an empty directory), one whose PID is
/// a live fencefs (another mount's daemon) and names not exactly of the pattern stay.
#[test]
fn leftovers_of_new_names_are_swept_at_start() {
    let (mut m, dir) = staged("atomic-sweep", WRITE, |src| {
        put(&src.join("sub/a"), b"a\n", 0o644)
    });
    m.sh("echo n > sub/new").assert_ok("agent");
    stop(&mut m);
    let other = Mount::with("atomic-sweep-other", Some(WRITE), None, |_| {});
    let sub = dir.join("upper/sub");
    let me = std::process::id();
    let gone_file = format!("#fencefs-new.{me}.3");
    let gone_dir = "#fencefs-new.4194305.0";
    let live = format!("#fencefs-new.{}.0", other.pid());
    let odd = "#fencefs-new.5.x";
    for n in [&gone_file, &live, &odd.to_string()] {
        put(&sub.join(n), b"left\n", 0o644);
    }
    fs::create_dir(sub.join(gone_dir)).unwrap();
    let src = snapshot(&m.host(""));
    let s = Second::start(&m, &dir, &m.policy_path());
    let mut want = vec!["#fencefs-new.5.x".to_string(), live.clone(), "new".into()];
    want.sort();
    assert_eq!(
        names_str(&sub).unwrap(),
        want,
        "DIR/upper/sub after the sweep"
    );
    let mut shown = want.clone();
    shown.push("a".into());
    shown.sort();
    assert_eq!(names_str(&s.mnt("sub")).unwrap(), shown);
    assert_host_unchanged(&src, &m.host(""), "a sweep");
    drop(other);
}

/// What a crash leaves in DIR/work at a daemon's start: the union's own temporary entries
/// whose PID is no live fencefs go — a file (a copy-up never renamed into place), a
/// directory holding only whiteouts (a removed directory), an empty one — while a
/// directory holding anything else (what a log line may have pointed a person to), an
/// entry of a live fencefs's PID and any other name stay, untouched.
#[test]
fn leftovers_in_the_work_directory_are_swept_at_start() {
    let (mut m, dir) = staged("atomic-work-sweep", WRITE, |src| {
        put(&src.join("a"), b"a\n", 0o644)
    });
    m.sh("echo n > new").assert_ok("agent");
    stop(&mut m);
    let other = Mount::with("atomic-work-sweep-other", Some(WRITE), None, |_| {});
    let work = dir.join("work");
    // Above any pid_max: no process has it.
    let dead = 4_194_305;
    let copy = format!("#fencefs-up.{dead}.1");
    let removed = format!("#fencefs-rm.{dead}.2");
    let emptied = format!("#fencefs-empty.{dead}.3");
    let kept = format!("#fencefs-rm.{dead}.4");
    let live = format!("#fencefs-up.{}.5", other.pid());
    put(&work.join(&copy), b"partial\n", 0o644);
    fs::create_dir(work.join(&removed)).unwrap();
    sh_in(&work.join(&removed), "mknod w1 c 0 0 && mknod w2 c 0 0").assert_ok("whiteouts");
    fs::create_dir(work.join(&emptied)).unwrap();
    put(&work.join(&kept).join("data"), b"the agent's\n", 0o644);
    sh_in(&work.join(&kept), "mknod w c 0 0").assert_ok("a whiteout beside it");
    put(&work.join(&live), b"in flight\n", 0o644);
    put(&work.join("notes"), b"a person's\n", 0o644);
    let s = Second::start(&m, &dir, &m.policy_path());
    let left = names_str(&work).unwrap();
    for gone in [&copy, &removed, &emptied] {
        assert!(!left.contains(gone), "{gone} swept: {left:?}");
    }
    for stays in [&kept, &live, &"notes".to_string()] {
        assert!(left.contains(stays), "{stays} kept: {left:?}");
    }
    assert_eq!(
        fs::read(work.join(&kept).join("data")).unwrap(),
        b"the agent's\n"
    );
    assert_eq!(names_str(&work.join(&kept)).unwrap(), ["data", "w"]);
    assert_eq!(fs::read(work.join(&live)).unwrap(), b"in flight\n");
    assert_eq!(fs::read(s.mnt("new")).unwrap(), b"n\n");
    drop(other);
}

/// `mv -T s/d t` over a merged-empty `t` dies once `t` is swapped with its empty opaque
/// copy: `t` shows nothing (its deletions hold), `s/d` is where it was.
#[test]
fn a_crash_in_a_rename_over_an_emptied_directory_keeps_its_deletions() {
    let (_m, _dir, s) = crash_at(
        "atomic-crash-mv",
        "emptied",
        |src| {
            put(&src.join("t/x"), b"x\n", 0o644);
            put(&src.join("s/keep"), b"k\n", 0o644);
        },
        "rm t/x && mkdir s/d && echo n > s/d/n",
        "mv -T s/d t",
    );
    assert_eq!(names_str(&s.mnt("t")).unwrap(), Vec::<String>::new());
    assert_eq!(names_str(&s.mnt("s/d")).unwrap(), ["n"]);
}

/// A staging area on a file system that cannot leave a whiteout in a rename (ramfs:
/// `renameat2(RENAME_WHITEOUT)` answers EINVAL) is refused at start with an error that
/// says so — nothing mounted, SOURCE untouched — instead of renames away from SOURCE
/// names made in two steps.
#[test]
fn a_staging_area_without_rename_whiteout_is_refused() {
    struct Ramfs(PathBuf);
    impl Drop for Ramfs {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let b = Mount::builder("atomic-ramfs").policy(WRITE);
    put(&b.host("a"), b"source\n", 0o644);
    let ram = b.root().join("ram");
    fs::create_dir_all(&ram).unwrap();
    sh_in(b.root(), &format!("mount -t ramfs ramfs {}", ram.display())).assert_ok("mount ramfs");
    let _ram = Ramfs(ram.clone());
    let policy = b.root().join("policy.toml");
    fs::write(&policy, WRITE).unwrap();
    let src = snapshot(&b.host(""));
    let mnt = b.root().join("mp/mnt");
    let out = run_fencefs(
        [
            "mount".as_ref(),
            "-p".as_ref(),
            policy.as_os_str(),
            "--stage".as_ref(),
            ram.join("st").as_os_str(),
            b.host("").as_os_str(),
            mnt.as_os_str(),
        ],
        LIMIT,
    );
    out.assert_fail("a mount staged on ramfs");
    assert!(
        out.stderr.contains("cannot leave a whiteout in a rename")
            && out.stderr.contains("RENAME_WHITEOUT"),
        "the refusal says why: {}",
        out.stderr
    );
    assert!(!is_mounted(&mnt));
    assert_host_unchanged(&src, &b.host(""), "a refused staging area");
    assert_eq!(fs::read_dir(ram.join("st/work")).unwrap().count(), 0);
}
