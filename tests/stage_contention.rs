//! Many callers at once on a staged mount (`src/host/union/copyup.rs`,
//! `src/transport/pool.rs`): concurrent opens for writing of one big SOURCE file make one
//! copy-up, which every writer then shares; one uid's slow copy-ups do not hold up
//! another caller's rename.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::stage::*;
use common::*;

const MIB: u64 = 1 << 20;

/// A SOURCE file of `mib` MiB of real data (no holes: its copy takes its time).
fn big_file(p: &Path, mib: u64, seed: u64) -> Vec<u8> {
    let chunk = pseudo_random(MIB as usize, seed);
    let mut f = fs::File::create(p).unwrap();
    for _ in 0..mib {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    chunk
}

/// Bytes held by the entries of `dir` (one level: copies are files made there).
fn held(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.path().symlink_metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Samples `held(dir)` every 2 ms until stopped; gives the peak.
struct Peak {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    t: Option<std::thread::JoinHandle<()>>,
}

impl Peak {
    fn watch(dir: &Path) -> Peak {
        let (stop, peak) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (s, p, d) = (stop.clone(), peak.clone(), dir.to_path_buf());
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                p.fetch_max(held(&d), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Peak {
            stop,
            peak,
            t: Some(t),
        }
    }
    fn end(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.t.take().unwrap().join().unwrap();
        self.peak.load(Ordering::SeqCst)
    }
}

/// Eight threads open one 256 MiB SOURCE file for writing at once: one copy-up is made
/// (the copy-up log line appears once; `DIR/work` never holds more than one copy), every
/// writer writes the same staged file, and SOURCE is untouched.
#[test]
fn concurrent_writers_of_one_file_share_one_copy_up() {
    const N: usize = 8;
    const SIZE: u64 = 256;
    let b = Mount::builder("copyup_once")
        .policy(WRITE)
        .env("RUST_LOG", "warn,fencefs::host::union::copyup=debug");
    let chunk = big_file(&b.host("big"), SIZE, 11);
    let dir = stage_dir(&b);
    let m = b.arg("--stage").arg(&dir).start();
    let peak = Peak::watch(&dir.join("work"));
    let gate = Arc::new(Barrier::new(N));
    let writers: Vec<_> = (0..N)
        .map(|i| {
            let (gate, path) = (gate.clone(), m.mnt("big"));
            std::thread::spawn(move || {
                gate.wait();
                let mut f = fs::OpenOptions::new().write(true).open(&path).unwrap();
                f.seek(SeekFrom::Start(i as u64 * 4096)).unwrap();
                f.write_all(format!("writer {i}").as_bytes()).unwrap();
                f.sync_all().unwrap();
                f.metadata().unwrap().ino()
            })
        })
        .collect();
    let inos: Vec<u64> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    let peak = peak.end();
    assert!(
        peak <= (SIZE + SIZE / 4) * MIB,
        "DIR/work held {} MiB at its peak: more than one copy in flight",
        peak / MIB
    );
    let copies = m.stderr().matches("stage: copy-up #").count();
    assert_eq!(copies, 1, "copy-ups made; daemon log:\n{}", m.stderr());
    assert!(
        inos.iter().all(|&i| i == inos[0]),
        "every writer has the same file: {inos:?}"
    );
    // The staged file holds every writer's bytes over SOURCE's data.
    let mut staged = fs::File::open(dir.join("upper/big")).unwrap();
    assert_eq!(staged.metadata().unwrap().len(), SIZE * MIB);
    let mut first = vec![0u8; MIB as usize];
    staged.read_exact(&mut first).unwrap();
    let mut want = chunk.clone();
    for i in 0..N {
        let s = format!("writer {i}");
        want[i * 4096..i * 4096 + s.len()].copy_from_slice(s.as_bytes());
    }
    assert!(first == want, "the staged file's first MiB");
    let mut rest = vec![0u8; MIB as usize];
    for _ in 1..SIZE {
        staged.read_exact(&mut rest).unwrap();
        assert!(rest == chunk, "the staged file's data past the writes");
    }
    // SOURCE byte for byte as it was.
    let mut src = fs::File::open(m.host("big")).unwrap();
    for _ in 0..SIZE {
        src.read_exact(&mut rest).unwrap();
        assert!(rest == chunk, "SOURCE changed");
    }
    assert_eq!(held(&dir.join("work")), 0, "a copy left in DIR/work");
}

/// The attack on the slow-request workers (FUSE over io_uring, where the queue threads
/// hand copy-ups to them): uid 1000 opens 16 big SOURCE files for writing at once (a
/// copy-up each); a rename by root made while they are copied completes well before they
/// all are, instead of waiting in one queue behind them.
#[test]
fn one_uids_copy_ups_do_not_hold_up_anothers_rename() {
    const FILES: usize = 16;
    const SIZE: u64 = 128;
    let b = Mount::builder("pool_fair").policy(WRITE);
    for i in 0..FILES {
        let p = b.host(format!("big{i}"));
        big_file(&p, SIZE, i as u64);
        std::os::unix::fs::chown(&p, Some(USER), Some(USER)).unwrap();
    }
    put(&b.host("x"), b"root's\n", 0o644);
    let dir = stage_dir(&b);
    let m = b
        .arg("--allow-other")
        .arg("--transport")
        .arg("io-uring")
        .arg("--stage")
        .arg(&dir)
        .start();
    let before = fs::read(m.host("big0")).unwrap();
    let t0 = std::time::Instant::now();
    let script = format!(
        "for i in $(seq 0 {}); do (: 1<>big$i) & done; wait",
        FILES - 1
    );
    let mnt = m.mnt("");
    let hostile = std::thread::spawn(move || {
        let out = sh_as(USER, &mnt, &script);
        (out, t0.elapsed())
    });
    // The opens are in the daemon's hands (copying, or queued for a worker).
    assert!(
        eventually(Duration::from_secs(10), || held(&dir.join("work")) > 0),
        "no copy-up started"
    );
    // ... and all sixteen opens with it (forked at once by the shell).
    std::thread::sleep(Duration::from_millis(100));
    let t = std::time::Instant::now();
    fs::rename(m.mnt("x"), m.mnt("y")).unwrap();
    let rename = t.elapsed();
    let renamed_at = t0.elapsed();
    let (out, all) = hostile.join().unwrap();
    eprintln!("rename {rename:?} done at {renamed_at:?}; copy-ups {all:?}");
    out.assert_ok("uid 1000's opens");
    assert_eq!(fs::read(m.mnt("y")).unwrap(), b"root's\n");
    // The rename started while the copy-ups ran, and took a small part of what was left
    // of them (queued behind them, it would have waited about all of it).
    let started = renamed_at - rename;
    assert!(
        started < all && rename * 3 < all - started,
        "root's rename took {rename:?} (started at {started:?}); uid 1000's copy-ups took {all:?}"
    );
    // Every copy made, SOURCE untouched.
    for i in 0..FILES {
        let st = fs::metadata(dir.join(format!("upper/big{i}"))).unwrap();
        assert_eq!(st.len(), SIZE * MIB);
    }
    assert!(fs::read(m.host("big0")).unwrap() == before);
    assert!(m.host("x").exists() && !m.host("y").exists());
}

/// Runs the calling thread on CPU 0 only (FUSE over io_uring serves a request on the
/// queue of the CPU its caller runs on).
fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t is an empty set; the call reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// A flood past one uid's share of the slow-request workers (FUSE over io_uring): uid
/// 1000, pinned to CPU 0, opens 40 SOURCE files for writing at once, each copy-up made
/// slow by the test-only pause `FENCEFS_FAULT_UNION_PAUSE=copy-up:600` — far past the
/// workers it may hold (3) and what once waited for one (16). Root, on the same CPU (so
/// the same ring queue), looks up names meanwhile: each answered at once (before: the
/// copy-ups past the bound ran on the queue thread itself, and root's lookups waited
/// behind them), and every one of uid 1000's opens succeeds in its turn.
#[test]
fn a_flood_past_one_uids_share_does_not_stall_anothers_requests_on_its_queue() {
    const FILES: usize = 40;
    let b = Mount::builder("pool_flood")
        .policy(WRITE)
        .env("FENCEFS_FAULT_UNION_PAUSE", "copy-up:600");
    for i in 0..FILES {
        let p = b.host(format!("f{i}"));
        put(&p, b"uid 1000's\n", 0o644);
        std::os::unix::fs::chown(&p, Some(USER), Some(USER)).unwrap();
    }
    for i in 0..8 {
        put(&b.host(format!("n{i}")), b"root's\n", 0o644);
    }
    let dir = stage_dir(&b);
    let m = b
        .arg("--allow-other")
        .arg("--transport")
        .arg("io-uring")
        .arg("--stage")
        .arg(&dir)
        .start();
    pin_to_cpu0();
    let script = format!(
        "taskset -c 0 sh -c 'for i in $(seq 0 {}); do (: 1<>f$i) & done; wait'",
        FILES - 1
    );
    let mnt = m.mnt("");
    let t0 = std::time::Instant::now();
    let hostile = std::thread::spawn(move || {
        let out = sh_as(USER, &mnt, &script);
        (out, t0.elapsed())
    });
    // Its copy-ups hold the workers it may hold, and the rest of its opens have arrived.
    assert!(
        eventually(Duration::from_secs(10), || m
            .stderr()
            .matches("pause of 600 ms at copy-up")
            .count()
            >= 3),
        "the copy-ups did not start:\n{}",
        m.stderr()
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut took = Vec::new();
    for i in 0..8 {
        let t = std::time::Instant::now();
        let md = fs::metadata(m.mnt(format!("n{i}"))).unwrap();
        took.push(t.elapsed());
        assert_eq!(md.len(), 7);
        std::thread::sleep(Duration::from_millis(50));
    }
    let looked_at = t0.elapsed();
    let (out, all) = hostile.join().unwrap();
    eprintln!("root's lookups took {took:?} (done at {looked_at:?}); uid 1000's opens {all:?}");
    out.assert_ok("uid 1000's opens");
    assert!(
        looked_at < all,
        "the lookups were made while the flood lasted"
    );
    let slowest = took.iter().max().unwrap();
    assert!(
        *slowest < Duration::from_millis(300),
        "root's lookups on uid 1000's queue took {took:?} while its copy-ups ran"
    );
    for i in 0..FILES {
        assert!(
            dir.join(format!("upper/f{i}")).is_file(),
            "f{i} was not copied up"
        );
    }
}

/// A removal of SOURCE's file, and a copy-up of that name landing before the removal
/// takes the union's names lock (made wide by the test-only pause
/// `FENCEFS_FAULT_UNION_PAUSE=remove:MS`): the one-look removal's whiteout finds the name
/// taken (EEXIST, nothing done), and the removal looks the name up again and removes the
/// copy (before: its whiteout collided with the copy, `rm: File exists`). On `/dev/fuse`,
/// whose session threads serve the open while the removal's thread pauses.
#[test]
fn a_removal_removes_the_copy_up_that_landed_after_its_lookup() {
    let b = Mount::builder("rm_race")
        .policy(WRITE)
        .env("FENCEFS_FAULT_UNION_PAUSE", "remove:1500");
    put(&b.host("f"), b"source\n", 0o644);
    let (m, dir) = staged_on_dev_fuse(b);
    let p = m.mnt("f");
    let rm = std::thread::spawn(move || fs::remove_file(&p));
    reaches(
        &m,
        "pause of 1500 ms at remove",
        "the removal did not reach its pause",
    );
    // Opened for writing in the removal's window: the copy-up lands. (Not written: a
    // write, and the close's flush, wait for the inode lock the unlink holds.)
    let w = fs::OpenOptions::new().write(true).open(m.mnt("f")).unwrap();
    assert!(
        fs::symlink_metadata(dir.join("upper/f"))
            .unwrap()
            .file_type()
            .is_file(),
        "the copy-up landed while the removal paused"
    );
    rm.join().unwrap().expect("rm f");
    drop(w);
    assert_eq!(
        fs::symlink_metadata(m.mnt("f"))
            .map_err(|e| e.raw_os_error())
            .err(),
        Some(Some(libc::ENOENT))
    );
    // A whiteout stands for it in the upper, swapped in with the deletion's record on it
    // (set in `DIR/work` before the swap); SOURCE is untouched.
    let st = fs::symlink_metadata(dir.join("upper/f")).unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(st.file_type().is_char_device() && st.rdev() == 0);
    let rec = lgetxattr(&dir.join("upper/f"), b"trusted.overlay.fencefs-base")
        .expect("the whiteout's record");
    assert!(rec.len() <= 52 && rec[0] == 2, "a compact record: {rec:?}");
    assert_eq!(fs::read(m.host("f")).unwrap(), b"source\n");
}

/// A removal of SOURCE's file that the host changed before the removal took the names
/// lock (the pause `remove:MS` holds it there): the host deleting the file makes it
/// ENOENT, the host replacing it with a directory EISDIR, as on a local disk (the one-look
/// removal finds no file under the lock, and the removal the general way finds what
/// stands there now) — and in both cases no whiteout is made and nothing of SOURCE or
/// DIR/upper is changed by the removal.
#[test]
fn a_removal_whose_source_entry_changed_meanwhile_is_refused() {
    for (case, host_change, errno) in [
        ("gone", "rm f", libc::ENOENT),
        (
            "a directory now",
            "rm f && mkdir f && echo k > f/k",
            libc::EISDIR,
        ),
    ] {
        let b = Mount::builder(&format!("rm_race_{}", case.len()))
            .policy(WRITE)
            .env("FENCEFS_FAULT_UNION_PAUSE", "remove:1500");
        put(&b.host("f"), b"source\n", 0o644);
        let (m, dir) = staged_on_dev_fuse(b);
        let p = m.mnt("f");
        let rm = std::thread::spawn(move || fs::remove_file(&p));
        reaches(
            &m,
            "pause of 1500 ms at remove",
            "the removal did not reach its pause",
        );
        sh_in(&m.host(""), host_change).assert_ok("the host's change");
        let source = snapshot(&m.host(""));
        let upper = snapshot(&dir.join("upper"));
        let r = rm.join().unwrap();
        assert_eq!(r.map_err(|e| e.raw_os_error()), Err(Some(errno)), "{case}");
        assert_host_unchanged(&source, &m.host(""), case);
        assert_host_unchanged(&upper, &dir.join("upper"), case);
    }
}

/// The host replacing SOURCE's file with another file (`mv g f`: same kind, another
/// inode) after the agent looked it up, while the removal waits before the names lock
/// (the pause `remove:MS`): the removal goes through (the agent deleted what it saw), and
/// its whiteout — made and given its record under the lock — names the file the agent
/// saw (the kernel's node for the name), not the host's new one it found there: `stage
/// status` shows the deletion as a conflict and `apply` leaves the host's file alone.
#[test]
fn a_removal_records_the_file_it_saw_when_the_host_replaced_it_meanwhile() {
    let b = Mount::builder("rm_race_replaced")
        .policy(WRITE)
        .env("FENCEFS_FAULT_UNION_PAUSE", "remove:1500");
    put(&b.host("f"), b"source\n", 0o644);
    let (mut m, dir) = staged_on_dev_fuse(b);
    let p = m.mnt("f");
    let rm = std::thread::spawn(move || fs::remove_file(&p));
    reaches(
        &m,
        "pause of 1500 ms at remove",
        "the removal did not reach its pause",
    );
    sh_in(&m.host(""), "printf 'the host\\n' > g && mv g f").assert_ok("the host's mv");
    rm.join().unwrap().expect("rm f");
    let rec = lgetxattr(&dir.join("upper/f"), b"trusted.overlay.fencefs-base")
        .expect("the whiteout's record");
    assert!(rec.len() <= 52 && rec[0] == 2, "a compact record: {rec:?}");
    stop(&mut m);
    assert_eq!(stage(&["status"], &dir).stdout, "CD f\n");
    stage(&["apply"], &dir).assert_fail("the conflict is refused");
    assert_eq!(fs::read(m.host("f")).unwrap(), b"the host\n");
}

/// A host writer that rewrites a SOURCE file (same size) and restores its modification
/// time (`touch -d`) while the agent's copy-up of it is made (after the data was copied:
/// the test-only pause `FENCEFS_FAULT_UNION_PAUSE=copy-up:MS`): the copy is refused by its
/// change time (ESTALE, on which the kernel repeats the open on the host's bytes), so
/// the staged file is the host's new bytes plus the agent's write — never the old bytes
/// (before: size and mtime matched, and the stale copy was staged).
#[test]
fn a_copy_up_raced_by_a_host_write_that_restores_mtime_is_made_again() {
    let b = Mount::builder("copyup_ctime")
        .policy(WRITE)
        .env("FENCEFS_FAULT_UNION_PAUSE", "copy-up:1000");
    put(&b.host("f"), b"old content AAAA\n", 0o644);
    sh_in(&b.host(""), "touch -d '2020-01-01 00:00:00' f").assert_ok("touch");
    let (m, dir) = staged_on_dev_fuse(b);
    let p = m.mnt("f");
    let agent = std::thread::spawn(move || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new().append(true).open(&p)?;
        f.write_all(b"agent\n")
    });
    reaches(
        &m,
        "pause of 1000 ms at copy-up",
        "the copy-up did not reach its pause",
    );
    // The host rewrites it in place, same size, and puts the old mtime back.
    sh_in(
        &m.host(""),
        "printf 'new content BBBB\\n' 1<>f && touch -d '2020-01-01 00:00:00' f",
    )
    .assert_ok("host rewrite");
    agent.join().unwrap().expect("the agent's append");
    assert_eq!(
        fs::read(dir.join("upper/f")).unwrap(),
        b"new content BBBB\nagent\n"
    );
    assert_eq!(fs::read(m.mnt("f")).unwrap(), b"new content BBBB\nagent\n");
    assert_eq!(fs::read(m.host("f")).unwrap(), b"new content BBBB\n");
}

/// A follower of a copy-up in flight (a second open for writing of the same SOURCE file
/// while the first one's copy is made: the test-only pause
/// `FENCEFS_FAULT_UNION_PAUSE=copy-up:MS`) that, once the copy landed, finds another
/// object at the name (`copy-up-follow:MS`: the copy renamed away and a new file made
/// there by other requests meanwhile) does not take that object for the copy: it answers
/// ESTALE, the kernel looks the name up again and opens what is there now, so what the
/// follower writes lands in the file its descriptor is (before: the descriptor was the
/// renamed copy's node while its writes went to the new file).
#[test]
fn a_copy_up_follower_does_not_take_another_object_at_the_name_for_the_copy() {
    let b = Mount::builder("copyup_follow").policy(WRITE).env(
        "FENCEFS_FAULT_UNION_PAUSE",
        "copy-up:800,copy-up-follow:1500",
    );
    put(&b.host("f"), b"source\n", 0o644);
    let (m, dir) = staged_on_dev_fuse(b);
    // The leader: its copy-up pauses after the data.
    let p = m.mnt("f");
    let leader = std::thread::spawn(move || fs::OpenOptions::new().write(true).open(&p).map(drop));
    reaches(
        &m,
        "pause of 800 ms at copy-up",
        "the leader's copy-up did not reach its pause",
    );
    // The follower waits for it, then pauses before it opens the copy by name.
    let p = m.mnt("f");
    let follower = std::thread::spawn(move || -> std::io::Result<(u64, u64)> {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&p)?;
        f.write_all_at(b"FOLLOWER\n", 0)?;
        f.sync_all()?;
        let st = f.metadata()?;
        Ok((st.ino(), st.len()))
    });
    reaches(
        &m,
        "pause of 1500 ms at copy-up-follow",
        "the follower did not reach its pause",
    );
    leader.join().unwrap().expect("the leader's open");
    // The copy is renamed away and a new file made at its name.
    fs::rename(m.mnt("f"), m.mnt("g")).unwrap();
    fs::write(m.mnt("f"), b"new\n").unwrap();
    let (ino, _) = follower
        .join()
        .unwrap()
        .expect("the follower's open and write");
    // The follower's descriptor is the file its bytes are in.
    let (f, g) = (
        fs::metadata(m.mnt("f")).unwrap(),
        fs::metadata(m.mnt("g")).unwrap(),
    );
    let (mine, other) = if ino == f.ino() {
        ("f", "g")
    } else {
        assert_eq!(ino, g.ino(), "the follower's descriptor is neither f nor g");
        ("g", "f")
    };
    // In the staged tree: the follower's bytes are in the file at that name, and only there.
    let staged = |n: &str| fs::read(dir.join("upper").join(n)).unwrap();
    let (mine_staged, other_staged) = (staged(mine), staged(other));
    assert!(
        mine_staged.starts_with(b"FOLLOWER\n") && !other_staged.starts_with(b"FOLLOWER"),
        "the follower's descriptor is {mine}; staged {mine} holds {:?}, staged {other} {:?}",
        String::from_utf8_lossy(&mine_staged),
        String::from_utf8_lossy(&other_staged)
    );
    // And through the mount.
    let mine_bytes = fs::read(m.mnt(mine)).unwrap();
    let other_bytes = fs::read(m.mnt(other)).unwrap();
    assert!(
        mine_bytes.starts_with(b"FOLLOWER\n"),
        "{mine}: {mine_bytes:?}"
    );
    assert!(
        !other_bytes.starts_with(b"FOLLOWER"),
        "{other}: {other_bytes:?}"
    );
    assert_eq!(
        fs::read(m.host("f")).unwrap(),
        b"source\n",
        "SOURCE changed"
    );
}

/// Starts `b` staged (a fresh DIR) over `/dev/fuse`, whose session threads serve other
/// requests while one pauses: the mount and DIR.
fn staged_on_dev_fuse(b: MountBuilder) -> (Mount, std::path::PathBuf) {
    let dir = stage_dir(&b);
    let m = b
        .arg("--transport")
        .arg("dev-fuse")
        .arg("--stage")
        .arg(&dir)
        .start();
    (m, dir)
}

/// Waits until the daemon logged `pause` (a test-only pause reached); `what` is the
/// failure's message.
fn reaches(m: &Mount, pause: &str, what: &str) {
    assert!(
        eventually(Duration::from_secs(5), || m.stderr().contains(pause)),
        "{what}:\n{}",
        m.stderr()
    );
}
