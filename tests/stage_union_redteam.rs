//! Red-team tests of the daemon's own merged view (`src/host/union`): corner cases of
//! renames, exchanges, whiteouts and opaque directories where the merged view must keep
//! what kernel overlayfs (the oracle, tests/common/oracle.rs) shows — never bring
//! back what the agent deleted, never refuse what overlayfs allows.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::oracle::*;
use common::stage::*;
use common::*;

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
    // The test's own clean-up of a 4,000-level tree recurses (a debug build's frames
    // overflow the default 2 MiB test thread): the body runs on a thread with room.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(deep_tree)
        .unwrap()
        .join()
        .unwrap();
}

fn deep_tree() {
    use std::os::fd::AsRawFd;
    let (mut m, _dir, _sock) = staged_live("red-deep", |src| {
        put(&src.join("lower/x"), b"x\n", 0o644);
    });
    // Each level through the descriptor of the one above (`/proc/self/fd/N/d`): no
    // path is longer than a few names.
    let at =
        |f: &fs::File, name: &str| PathBuf::from(format!("/proc/self/fd/{}/{name}", f.as_raw_fd()));
    let mut cur = fs::File::open(m.mnt("")).unwrap();
    let depth = 4000;
    for i in 0..depth {
        let next = fs::create_dir(at(&cur, "d")).and_then(|()| fs::File::open(at(&cur, "d")));
        match next {
            Ok(f) => cur = f,
            Err(e) => {
                let st = m.wait_exit(std::time::Duration::from_secs(3));
                panic!("mkdir at depth {i}: {e}; daemon {st:?}: {}", m.stderr());
            }
        }
    }
    // A directory change at the top: every cached stack is of an older generation.
    m.sh("mv lower lower2").assert_ok("mv lower lower2");
    let made = fs::write(at(&cur, "f"), b"deep\n");
    m.assert_alive("after a create at depth 4000");
    made.unwrap();
    drop(cur);
    stop(&mut m);
}

/// One random step of the agent's, heavy on names: renames of directories onto deleted
/// names, exchanges, rmdir of emptied directories, directories made again.
fn step(r: &mut Rng, m: &Mount, i: usize) -> String {
    let names = [
        "a", "b", "d", "e", "d/a", "d/b", "e/a", "e/d", "d/e", "d/e/a",
    ];
    let n = r.pick(&names);
    let k = r.pick(&names);
    let cmd = match r.next() % 12 {
        0 => format!("echo w{i} > {n}"),
        1 => format!("mkdir {n}"),
        2 | 3 => format!("mv -T {n} {k}"),
        4 => format!("rm -f {n}"),
        5 => format!("rmdir {n}"),
        6 => format!("rm -rf {n}"),
        7 => format!("mkdir -p {n} && echo x{i} > {n}/x{i}"),
        8 | 9 => {
            let res = renameat2(&m.mnt(n), &m.mnt(k), libc::RENAME_EXCHANGE);
            return format!("agent: exchange {n} {k} -> {res:?}");
        }
        10 => format!("mv -T --no-clobber {n} {k}"),
        _ => format!("touch {n}"),
    };
    let o = m.sh(&format!("{cmd} 2>/dev/null"));
    format!("agent: {cmd} -> {}", o.status)
}

fn oracle_run(name: &str, seed: u64, rounds: usize) -> Result<(), String> {
    let (mut m, dir, sock) = staged_live(name, |src| {
        put(&src.join("a"), b"a\n", 0o644);
        put(&src.join("d/a"), b"da\n", 0o644);
        put(&src.join("d/e/a"), b"dea\n", 0o644);
        put(&src.join("e/a"), b"ea\n", 0o644);
        put(&src.join("e/d/z"), b"edz\n", 0o644);
    });
    let mut r = Rng(seed);
    let mut log = Vec::new();
    let mut res = Ok(());
    'out: for round in 0..rounds {
        for i in 0..6 {
            log.push(step(&mut r, &m, round * 100 + i));
            if let Err(e) = matches_oracle(&m, &dir) {
                res = Err(format!("round {round}: {e}\nsteps: {log:#?}"));
                break 'out;
            }
        }
        if round % 3 == 2 {
            let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), "checkpoint".into()];
            v.push(sock.clone().into());
            run_fencefs(v, LIMIT).assert_ok("checkpoint");
            log.push("checkpoint".into());
        }
    }
    stop(&mut m);
    if std::env::var_os("RED_LOG").is_some() {
        eprintln!("{log:#?}");
    }
    res
}

#[test]
fn random_name_changes_match_kernel_overlayfs() {
    let seeds: Vec<u64> = match std::env::var("RED_SEEDS") {
        Ok(s) => s.split(',').map(|x| x.parse().unwrap()).collect(),
        Err(_) => vec![1, 2, 3],
    };
    for seed in seeds {
        oracle_run(&format!("red-oracle-{seed}"), seed, 12).unwrap();
    }
}

/// The agent nests directories past the staging tools' old depth bound (400: `mkdir -p`
/// of 450 levels, which the merged view allows, as overlayfs does; the tools now walk
/// without recursion to `stage::tree::MAX_DEPTH`, 8,192): `stage status`, `checkpoint`,
/// `discard` and `apply` — live and offline — must
/// still work, or an agent can take review, its checkpoints and the person's way back
/// away with one command.
#[test]
fn a_tree_deeper_than_the_tools_bound_does_not_lock_the_person_out() {
    let (mut m, dir, sock) = staged_live("red-deep-ctl", |src| {
        put(&src.join("a"), b"a\n", 0o644);
    });
    let deep = "d/".repeat(450);
    m.sh(&format!(
        "mkdir -p {deep} && echo x > {deep}f && echo b > b"
    ))
    .assert_ok("mkdir -p of 450 levels");
    let ctl = |op: &str| {
        let v: Vec<std::ffi::OsString> = vec!["stage".into(), op.into(), sock.clone().into()];
        run_fencefs(v, LIMIT)
    };
    ctl("status").assert_ok("status");
    ctl("checkpoint").assert_ok("checkpoint");
    ctl("discard").assert_ok("discard");
    assert!(fs::symlink_metadata(m.mnt("d")).is_err(), "discarded");
    m.sh(&format!("mkdir -p {deep} && echo b > b"))
        .assert_ok("mkdir -p again");
    stop(&mut m);
    stage(&["discard"], &dir).assert_ok("offline discard");
}

/// A workspace of 9000 directories, a file written in each (a build's outputs, `touch
/// */stamp`): each copied-up directory's parts (upper + SOURCE) are cached as `O_PATH`
/// descriptors, 8192 directories' worth, outside the descriptor budget — the daemon
/// reached RLIMIT_NOFILE and every request failed EMFILE from then on.
#[test]
fn copied_up_directories_do_not_exhaust_the_daemons_descriptors() {
    let (mut m, _dir, _sock) = staged_live("red-fds", |src| {
        for i in 0..9000 {
            fs::create_dir_all(src.join(format!("d{i}"))).unwrap();
        }
    });
    m.sh("for d in d*; do : > $d/new || exit 1; done")
        .assert_ok("a file in each directory");
    let o = m.sh("ls -R . | wc -l && echo more > last && cat last");
    o.assert_ok("the mount still serves");
    assert_eq!(o.stdout.lines().last(), Some("more"));
    m.assert_alive("after the copy-ups");
    stop(&mut m);
}
