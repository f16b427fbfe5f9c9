//! Red-team tests of the daemon's own merged view (`src/host/union`): corner cases of
//! renames, exchanges, whiteouts and opaque directories where the merged view must keep
//! what kernel overlayfs (the oracle, as in tests/stage_fresh.rs) shows — never bring
//! back what the agent deleted, never refuse what overlayfs allows.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::stage::*;
use common::*;

/// The same DIR (upper and live layers) over SOURCE, mounted read-only by kernel
/// overlayfs at `at` (as tests/stage_fresh.rs).
struct Oracle {
    at: PathBuf,
}

impl Oracle {
    fn mount(dir: &Path, src: &Path, at: &Path) -> Oracle {
        fs::create_dir_all(at).unwrap();
        let mut lowers = vec![dir.join("upper")];
        let mut layers: Vec<u64> = fs::read_dir(dir.join("layers"))
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        layers.sort_unstable_by(|a, b| b.cmp(a));
        lowers.extend(
            layers
                .iter()
                .map(|n| dir.join("layers").join(n.to_string())),
        );
        lowers.push(src.to_path_buf());
        let lower: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
        sh_in(
            Path::new("/"),
            &format!(
                "mount -t overlay overlay -o ro,lowerdir={},redirect_dir=follow,index=off,metacopy=off {}",
                lower.join(":"),
                at.display()
            ),
        )
        .assert_ok("kernel overlayfs oracle");
        Oracle {
            at: at.to_path_buf(),
        }
    }
}

impl Drop for Oracle {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.at).status();
    }
}

/// Entries as both views are compared: type, mode, size and contents, symlink targets.
fn view(root: &Path) -> Vec<(Vec<u8>, String)> {
    snapshot(root)
        .into_iter()
        .map(|(p, e)| (p, format!("{} {:o} {:?}", e.kind, e.mode, e.data)))
        .collect()
}

/// The mount shows what kernel overlayfs shows over the same DIR.
fn matches_oracle(m: &Mount, dir: &Path) -> Result<(), String> {
    let at = m.host("").parent().unwrap().join("oracle");
    let want = {
        let o = Oracle::mount(dir, &m.host(""), &at);
        view(&o.at)
    };
    let got = view(&m.mnt(""));
    if got == want {
        return Ok(());
    }
    let only = |a: &[(Vec<u8>, String)], b: &[(Vec<u8>, String)]| -> Vec<String> {
        a.iter()
            .filter(|x| !b.contains(x))
            .map(|(p, e)| format!("{} {e}", String::from_utf8_lossy(p)))
            .collect()
    };
    Err(format!(
        "mount only: {:#?}\noracle only: {:#?}",
        only(&got, &want),
        only(&want, &got)
    ))
}

fn names_in(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `rm -rf build && mkdir tmp && mv -T tmp build`: a directory renamed onto a name the
/// agent deleted (a whiteout in the upper). rename(2) of a directory onto the upper's
/// whiteout (a character device) is ENOTDIR on the host; overlayfs replaces the whiteout.
#[test]
fn a_directory_renamed_onto_a_deleted_name_replaces_its_whiteout() {
    let (mut m, dir, _sock) = staged_live("red-dir-over-wh", |src| {
        put(&src.join("build/old.o"), b"old\n", 0o644);
        put(&src.join("f"), b"f\n", 0o644);
    });
    m.sh("rm -rf build && mkdir tmp && echo new > tmp/new.o && mv -T tmp build")
        .assert_ok("a directory renamed onto a deleted directory's name");
    assert_eq!(names_in(&m.mnt("build")), ["new.o"]);
    m.sh("rm f && mkdir t2 && mv -T t2 f")
        .assert_ok("a directory renamed onto a deleted file's name");
    assert!(m.mnt("f").is_dir());
    matches_oracle(&m, &dir).unwrap();
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(names_in(&m.host("build")), ["new.o"]);
    assert!(m.host("f").is_dir());
}

/// RENAME_EXCHANGE of a new (upper-only) directory with an opaque one made over a deleted
/// lower directory: the directory moved to the deleted name must hide what SOURCE has
/// there (overlayfs marks it opaque), or the deleted entries come back.
#[test]
fn an_exchange_never_brings_back_a_deleted_directorys_entries() {
    let (mut m, dir, _sock) = staged_live("red-xchg-opaque", |src| {
        put(&src.join("d/secret"), b"deleted by the agent\n", 0o644);
        put(&src.join("e/gone"), b"deleted too\n", 0o644);
    });
    // d: deleted and made again (opaque); a: new.
    m.sh("rm -rf d && mkdir d && mkdir a")
        .assert_ok("rm -rf d; mkdir d a");
    renameat2(&m.mnt("a"), &m.mnt("d"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(
        names_in(&m.mnt("d")),
        Vec::<String>::new(),
        "d shows a deleted entry"
    );
    assert_eq!(names_in(&m.mnt("a")), Vec::<String>::new());
    // e: deleted, a file made at its name; b: new directory, swapped in.
    m.sh("rm -rf e && touch e && mkdir b")
        .assert_ok("rm -rf e; touch e; mkdir b");
    renameat2(&m.mnt("b"), &m.mnt("e"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(
        names_in(&m.mnt("e")),
        Vec::<String>::new(),
        "e shows a deleted entry"
    );
    matches_oracle(&m, &dir).unwrap();
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    assert!(!m.host("d/secret").exists(), "apply keeps the deletion");
    assert!(!m.host("e/gone").exists(), "apply keeps the deletion");
}

/// renameat2 with RENAME_WHITEOUT: overlayfs refuses it (EINVAL); the merged view must
/// not do a plain rename that leaves no whiteout behind.
#[test]
fn rename_whiteout_is_refused_as_overlayfs_does() {
    let (m, _dir, _sock) = staged_live("red-rename-wh", |src| {
        put(&src.join("a"), b"a\n", 0o644);
    });
    let r = renameat2(&m.mnt("a"), &m.mnt("b"), libc::RENAME_WHITEOUT);
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(Some(libc::EINVAL)));
    assert_eq!(fs::read(m.mnt("a")).unwrap(), b"a\n");
    assert!(fs::symlink_metadata(m.mnt("b")).is_err());
}

/// A deep tree the agent makes one directory at a time (no path is ever longer than a
/// name): after a directory change anywhere (the union's generation moves), the next
/// change deep down finds every parent's parts again — without running the worker out
/// of stack.
#[test]
fn a_deep_tree_does_not_crash_the_daemon() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let (mut m, _dir, _sock) = staged_live("red-deep", |src| {
        put(&src.join("lower/x"), b"x\n", 0o644);
    });
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    let root = fs::File::open(m.mnt("")).unwrap();
    // SAFETY: plain syscalls on descriptors this test owns; results checked.
    let mut cur: OwnedFd = unsafe { OwnedFd::from_raw_fd(libc::dup(root.as_raw_fd())) };
    let depth = 4000;
    for i in 0..depth {
        let n = c("d");
        let r = unsafe { libc::mkdirat(cur.as_raw_fd(), n.as_ptr(), 0o755) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            let st = m.wait_exit(std::time::Duration::from_secs(3));
            panic!("mkdir at depth {i}: {e}; daemon {st:?}: {}", m.stderr());
        }
        let fd = unsafe {
            libc::openat(
                cur.as_raw_fd(),
                n.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            let st = m.wait_exit(std::time::Duration::from_secs(3));
            panic!("open at depth {i}: {e}; daemon {st:?}: {}", m.stderr());
        }
        cur = unsafe { OwnedFd::from_raw_fd(fd) };
    }
    // A directory change at the top: every cached stack is of an older generation.
    m.sh("mv lower lower2").assert_ok("mv lower lower2");
    let n = c("f");
    let fd = unsafe {
        libc::openat(
            cur.as_raw_fd(),
            n.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY,
            0o644,
        )
    };
    let err = std::io::Error::last_os_error();
    m.assert_alive("after a create at depth 4000");
    assert!(fd >= 0, "create at depth {depth}: {err}");
    unsafe { libc::close(fd) };
    drop(cur);
    drop(root);
    stop(&mut m);
}
