//! SIGKILL in the middle of a real apply of thousands of staged files, offline (`stage
//! apply --dir DIR`, the process killed) and live (`stage apply SOCKET`, the daemon
//! killed), at several points: while the first batch's temporary files are being written,
//! while a later batch is renamed into place, among the deletions, and after a random
//! delay. After each kill a new daemon mounts DIR, and every path is either applied
//! (SOURCE's bytes are the staged ones) or still staged (SOURCE's bytes are the original
//! ones, and the merged view shows the staged ones): no file in SOURCE holds anything
//! else, no temporary entry is left in SOURCE, the merged view lost nothing; a last apply
//! finishes the rest. One staged file has a name in every directory (so in every batch):
//! its names land as hard links, at most one SOURCE file per apply that wrote some.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::stage::*;
use common::*;

const DIRS: usize = 24;
const PER_DIR: usize = 60;

/// What a path holds: in SOURCE before, and staged (`None`: deleted).
struct Plan {
    orig: BTreeMap<String, Vec<u8>>,
    staged: BTreeMap<String, Option<Vec<u8>>>,
}

fn rel(d: usize, f: usize) -> String {
    format!("d{d:02}/f{f:03}")
}

/// SOURCE: DIRS × PER_DIR files of 0 to 48 KiB.
fn populate(src: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut orig = BTreeMap::new();
    for d in 0..DIRS {
        for f in 0..PER_DIR {
            let seed = (d * PER_DIR + f) as u64;
            let data = pseudo_random((seed as usize * 7919) % (48 * 1024), seed + 1);
            put(&src.join(rel(d, f)), &data, 0o644);
            orig.insert(rel(d, f), data);
        }
    }
    orig
}

/// Through the mount: two thirds of the files rewritten (other sizes), one in twelve
/// deleted, and PER_DIR new files in every directory.
fn stage_changes(mnt: &Path, orig: BTreeMap<String, Vec<u8>>) -> Plan {
    let mut staged = BTreeMap::new();
    for (i, p) in orig.keys().enumerate() {
        if i % 12 == 5 {
            fs::remove_file(mnt.join(p)).unwrap();
            staged.insert(p.clone(), None);
        } else if i % 3 != 0 {
            let data = pseudo_random((i * 3331) % (40 * 1024) + 1, i as u64 + 10_000);
            fs::write(mnt.join(p), &data).unwrap();
            staged.insert(p.clone(), Some(data));
        }
    }
    for d in 0..DIRS {
        for f in 0..PER_DIR {
            let p = format!("d{d:02}/new{f:03}");
            let data = pseudo_random((f * 1237) % (24 * 1024), (d * 1000 + f) as u64);
            fs::write(mnt.join(&p), &data).unwrap();
            staged.insert(p, Some(data));
        }
    }
    // One file under DIRS + 1 names (`d00/new001`, `dNN/link`), in batches of their own.
    let data = staged[LINKED].clone();
    for d in 0..DIRS {
        let p = format!("d{d:02}/link");
        fs::hard_link(mnt.join(LINKED), mnt.join(&p)).unwrap();
        staged.insert(p, data.clone());
    }
    assert!(staged.len() >= 2000, "{} staged paths", staged.len());
    Plan { orig, staged }
}

/// The staged file that has more names (`dNN/link`).
const LINKED: &str = "d00/new001";

/// How many SOURCE files the names of [`LINKED`] are: at most one per apply that wrote
/// some of them (each links its names to the first it wrote; never one copy per name).
fn linked_files(src: &Path) -> usize {
    let mut inos: Vec<u64> = (0..DIRS)
        .map(|d| ino(&src.join(format!("d{d:02}/link"))))
        .collect();
    inos.push(ino(&src.join(LINKED)));
    inos.sort_unstable();
    inos.dedup();
    inos.len()
}

fn read(p: &Path) -> Option<Vec<u8>> {
    match fs::read(p) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("{}: {e}", p.display()),
    }
}

/// Every entry name under `dir` that is an apply's temporary entry.
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let n = e.file_name().to_string_lossy().into_owned();
        if n.contains(".fencefs-apply-") || n.contains(".fencefs-delete-") {
            out.push(e.path());
        }
        if e.file_type().unwrap().is_dir() {
            out.extend(temporaries(&e.path()));
        }
    }
    out
}

/// Whether DIR's staged tree has an entry (a file, or a deletion's whiteout) at `p`.
fn staged_entry(dir: &Path, p: &str) -> bool {
    fs::symlink_metadata(dir.join("upper").join(p)).is_ok()
}

/// Checks SOURCE (`src`) and the merged view (`view`) of the staging area `dir` after a
/// kill and a restart (whose recovery unstaged every applied path); returns the paths
/// still staged.
fn check(plan: &Plan, dir: &Path, src: &Path, view: &Path, what: &str) -> Vec<String> {
    let temps = temporaries(src);
    assert!(
        temps.is_empty(),
        "{what}: temporary entries left in SOURCE: {temps:?}"
    );
    let mut pending = Vec::new();
    for (p, want) in &plan.staged {
        let now = read(&src.join(p));
        if now == *want {
            assert!(
                !staged_entry(dir, p),
                "{what}: {p} is applied but still staged (it would hide host edits)"
            );
            continue;
        }
        assert_eq!(
            now.as_deref(),
            plan.orig.get(p).map(Vec::as_slice),
            "{what}: SOURCE {p} is neither the staged nor the original version ({} bytes)",
            now.as_ref().map_or(0, Vec::len)
        );
        pending.push(p.clone());
    }
    for (p, want) in &plan.staged {
        assert!(
            read(&view.join(p)) == *want,
            "{what}: the merged view lost the staged {p}"
        );
    }
    for (p, data) in &plan.orig {
        if !plan.staged.contains_key(p) {
            assert_eq!(read(&src.join(p)).as_ref(), Some(data), "{what}: {p}");
        }
    }
    pending
}

/// A pseudo-random number from the clock (the kill points differ between runs).
fn clock_random(bound: u64) -> u64 {
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    (n ^ (n >> 7)).wrapping_mul(0x9e37_79b9_7f4a_7c15) % bound.max(1)
}

/// Where to kill: once SOURCE shows the `i`th pending write being applied (its temporary
/// entry, or its new state), the first pending deletion done, or after a random delay.
enum Point {
    At(usize),
    FirstDeletion,
    Random,
}

/// Waits until `point` is reached by the apply `apply_pid` (or it exits); true when it
/// was reached while the apply ran.
fn wait_for(
    plan: &Plan,
    src: &Path,
    pending: &[String],
    point: &Point,
    apply_pid: u32,
    done: &mut dyn FnMut() -> bool,
) -> bool {
    let target = match point {
        Point::At(i) => {
            let writes: Vec<&String> = pending
                .iter()
                .filter(|p| plan.staged[*p].is_some())
                .collect();
            writes
                .get((*i).min(writes.len().saturating_sub(1)))
                .map(|p| (*p).clone())
        }
        Point::FirstDeletion => pending.iter().find(|p| plan.staged[*p].is_none()).cloned(),
        Point::Random => {
            let until = Instant::now() + Duration::from_millis(clock_random(400));
            while Instant::now() < until {
                if done() {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            return true;
        }
    };
    let target = target.expect("a pending path to wait for");
    let p = src.join(&target);
    let (parent, name) = (
        p.parent().unwrap(),
        p.file_name().unwrap().to_string_lossy(),
    );
    let tmp = parent.join(format!(".{name}.fencefs-apply-{apply_pid}"));
    let t = Instant::now();
    loop {
        if fs::symlink_metadata(&tmp).is_ok() || read(&p) == plan.staged[&target] {
            return true;
        }
        if done() {
            return false;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "apply never reached {target}"
        );
        std::thread::sleep(Duration::from_micros(300));
    }
}

const POINTS: [Point; 4] = [
    Point::At(3),
    Point::At(1300),
    Point::FirstDeletion,
    Point::Random,
];

fn exited(c: &mut Child) -> bool {
    matches!(c.try_wait(), Ok(Some(_)))
}

#[test]
fn sigkill_of_an_offline_apply_of_thousands_of_files_loses_nothing() {
    let mut orig = BTreeMap::new();
    let (mut m, dir) = staged("stage-crash-offline", WRITE, |s| orig = populate(s));
    let plan = stage_changes(&m.mnt(""), orig);
    stop(&mut m);
    let mut pending: Vec<String> = plan.staged.keys().cloned().collect();
    let (mut killed, mut partial) = (0, 0);
    for point in &POINTS {
        let mut child = Command::new(BIN)
            .args(["stage", "apply", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let reached = wait_for(&plan, &m.host(""), &pending, point, pid, &mut || {
            exited(&mut child)
        });
        if reached && !exited(&mut child) {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            killed += 1;
        }
        let st = child.wait();
        let second = Second::start(&m, &dir, &m.policy_path());
        let before = pending.len();
        pending = check(
            &plan,
            &dir,
            &m.host(""),
            &second.mnt,
            "after a killed offline apply",
        );
        eprintln!(
            "offline: reached {reached}, {st:?}, {before} -> {} pending",
            pending.len()
        );
        if pending.len() < before && !pending.is_empty() {
            partial += 1;
        }
        drop(second);
        if pending.is_empty() {
            break;
        }
    }
    assert!(
        killed >= 2,
        "only {killed} applies were killed while running"
    );
    assert!(partial >= 1, "no kill left a partly applied stage");
    let out = offline(&dir, "apply", &[]);
    out.assert_ok("the last apply");
    let second = Second::start(&m, &dir, &m.policy_path());
    assert!(
        check(
            &plan,
            &dir,
            &m.host(""),
            &second.mnt,
            "after the last apply"
        )
        .is_empty()
    );
    drop(second);
    let st = offline(&dir, "status", &[]);
    st.assert_ok("status");
    assert_eq!(st.stdout, "", "nothing staged after the last apply");
    let files = linked_files(&m.host(""));
    assert!(
        files <= POINTS.len() + 1,
        "{} names in {files} files",
        DIRS + 1
    );
}

#[test]
fn sigkill_of_the_daemon_mid_live_apply_of_thousands_of_files_loses_nothing() {
    let mut orig = BTreeMap::new();
    let (mut m, dir, sock) = staged_live("stage-crash-live", |s| orig = populate(s));
    let plan = stage_changes(&m.mnt(""), orig);
    let mut pending: Vec<String> = plan.staged.keys().cloned().collect();
    let daemon = m.pid() as u32;
    let mut client = apply_client(&sock);
    let reached = wait_for(
        &plan,
        &m.host(""),
        &pending,
        &POINTS[0],
        daemon,
        &mut || false,
    );
    assert!(reached);
    m.signal(libc::SIGKILL);
    assert!(
        m.wait_exit(Duration::from_secs(10)).is_some(),
        "daemon died"
    );
    let _ = client.wait();
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(m.mnt(""))
        .status();
    let (mut killed, mut partial) = (1, 0);
    let sock2 = m.root().join("ctl2.sock");
    let extra = [OsStr::new("--control"), sock2.as_os_str()];
    for point in &POINTS[1..] {
        let second = Second::start_with(&m, &dir, &m.policy_path(), &extra);
        let before = pending.len();
        pending = check(
            &plan,
            &dir,
            &m.host(""),
            &second.mnt,
            "after a killed live apply",
        );
        if pending.len() < before && !pending.is_empty() {
            partial += 1;
        }
        if pending.is_empty() {
            drop(second);
            break;
        }
        let pid = second.pid();
        let mut client = apply_client(&sock2);
        let reached = wait_for(&plan, &m.host(""), &pending, point, pid, &mut || {
            exited(&mut client)
        });
        if reached && !exited(&mut client) {
            killed += 1;
        }
        second.kill();
        let _ = client.wait();
    }
    assert!(
        killed >= 2,
        "only {killed} live applies were killed while running"
    );
    let second = Second::start_with(&m, &dir, &m.policy_path(), &extra);
    let p = check(
        &plan,
        &dir,
        &m.host(""),
        &second.mnt,
        "after the killed live applies",
    );
    assert!(
        partial >= 1 || p.len() < plan.staged.len(),
        "no kill left a partly applied stage"
    );
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), "apply".into()];
    v.push(sock2.clone().into());
    run_fencefs(v, LIMIT).assert_ok("the last live apply");
    assert!(
        check(
            &plan,
            &dir,
            &m.host(""),
            &second.mnt,
            "after the last live apply"
        )
        .is_empty()
    );
    drop(second);
    let st = offline(&dir, "status", &[]);
    st.assert_ok("status");
    assert_eq!(st.stdout, "", "nothing staged after the last apply");
    let files = linked_files(&m.host(""));
    assert!(
        files <= POINTS.len() + 1,
        "{} names in {files} files",
        DIRS + 1
    );
}

#[test]
fn an_apply_killed_after_its_renames_is_unstaged_at_restart_so_host_edits_show() {
    let mut orig = BTreeMap::new();
    let (mut m, dir) = staged("stage-crash-unstage", WRITE, |s| orig = populate(s));
    let plan = stage_changes(&m.mnt(""), orig);
    stop(&mut m);
    let src = m.host("");
    let writes: Vec<&String> = plan
        .staged
        .iter()
        .filter(|(_, w)| w.is_some())
        .map(|(p, _)| p)
        .collect();
    // Killed once the 4th write of the first batch is renamed into SOURCE: its batch's
    // staged entries are dropped only after every rename and a syncfs.
    let mut child = Command::new(BIN)
        .args(["stage", "apply", "--dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let target = writes[3];
    let t = Instant::now();
    while read(&src.join(target)) != plan.staged[target] {
        assert!(!exited(&mut child), "the apply ended before it was killed");
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "apply never reached {target}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let held: Vec<&String> = writes
        .iter()
        .copied()
        .filter(|p| read(&src.join(p)) == plan.staged[*p] && staged_entry(&dir, p))
        .collect();
    assert!(
        held.contains(&target),
        "the kill did not land between the renames and the unstaging"
    );
    let second = Second::start(&m, &dir, &m.policy_path());
    let pending = check(&plan, &dir, &src, &second.mnt, "after the restart");
    assert!(!pending.is_empty(), "the first batch alone was applied");
    for p in &held {
        assert!(!staged_entry(&dir, p), "{p} still staged after the restart");
    }
    // A host edit of an applied path shows through the mount, and is not a change.
    let edit = b"the host's edit after the crash\n";
    fs::write(src.join(target), edit).unwrap();
    assert_eq!(read(&second.mnt.join(target)).as_deref(), Some(&edit[..]));
    let st = offline(&dir, "status", &[]);
    st.assert_ok("status");
    assert!(
        !st.stdout.contains(target.as_str()),
        "{target} listed: {}",
        st.stdout
    );
    for (p, want) in plan.staged.iter().filter(|(p, _)| *p != target) {
        assert!(
            read(&second.mnt.join(p)) == *want,
            "the merged view lost {p}"
        );
    }
    drop(second);
    offline(&dir, "apply", &[]).assert_ok("the last apply");
    assert_eq!(
        read(&src.join(target)).as_deref(),
        Some(&edit[..]),
        "host edit kept"
    );
    assert_eq!(offline(&dir, "status", &[]).stdout, "");
}

/// `fencefs stage apply SOCKET`, running.
fn apply_client(sock: &Path) -> Child {
    Command::new(BIN)
        .args(["stage", "apply"])
        .arg(sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The inode number of `p` (not following symlinks).
fn ino(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn a_squash_of_one_checkpoint_renames_its_layer_and_a_crash_in_it_is_finished() {
    let (mut m, dir) = staged("stage-squash-one", WRITE, staged_sample);
    m.sh("set -e; mkdir -p made/in; echo m > made/in/m.txt; rm -rf gone; mv sub moved; echo x >> a.txt")
        .assert_ok("a turn");
    stop(&mut m);
    offline(&dir, "checkpoint", &["-m", "turn"]).assert_ok("checkpoint");
    let status = offline(&dir, "status", &[]).stdout;
    assert!(status.contains("A made/"), "{status}");
    let before = snapshot(&m.host(""));
    let made = ino(&dir.join("layers/1/made/in"));
    // The states a SIGKILL between the steps of such a squash leaves: (1) the intent
    // written; (2) layers/1 renamed to next; (3) the old upper gone to the trash too.
    let intent = serde_json::json!({"op":"squash","from":1}).to_string();
    for step in 1..=3 {
        let work = m.root().join(format!("squash{step}"));
        let cp = Command::new("cp").arg("-a").arg(&dir).arg(&work).status();
        assert!(cp.unwrap().success());
        let _ = fs::remove_file(work.join("lock"));
        fs::write(work.join("intent"), &intent).unwrap();
        if step >= 2 {
            fs::rename(work.join("layers/1"), work.join("next")).unwrap();
        }
        if step == 3 {
            fs::create_dir(work.join("trash")).unwrap();
            fs::rename(work.join("upper"), work.join("trash/upper.1.0")).unwrap();
        }
        let second = Second::start(&m, &work, &m.policy_path());
        assert_eq!(
            fs::read(second.mnt("made/in/m.txt")).unwrap(),
            b"m\n",
            "step {step}"
        );
        assert_eq!(
            fs::read(second.mnt("moved/b.txt")).unwrap(),
            b"bee\n",
            "step {step}"
        );
        assert!(!second.mnt("gone").exists() && !second.mnt("sub").exists());
        drop(second);
        assert!(
            !work.join("intent").exists(),
            "step {step}: intent finished"
        );
        assert!(!work.join("layers/1").exists() && !work.join("trash").exists());
        assert_eq!(offline(&work, "status", &[]).stdout, status, "step {step}");
        let r = offline(&work, "rewind", &["1"]);
        assert!(
            r.stderr.contains("ended by an apply or discard"),
            "step {step}: {}",
            r.stderr
        );
    }
    assert_host_unchanged(&before, &m.host(""), "squash crash states");
    // The real one: the layer itself becomes the staged tree (a flatten would have made
    // its directories anew), then apply makes SOURCE the merged view.
    let d = offline(&dir, "discard", &["no-such-path"]);
    assert!(d.stdout.contains("refused no-such-path"), "{}", d.stdout);
    assert_eq!(
        ino(&dir.join("upper/made/in")),
        made,
        "squashed by a rename"
    );
    assert!(!dir.join("layers/1").exists());
    offline(&dir, "apply", &[]).assert_ok("apply");
    assert_eq!(fs::read(m.host("made/in/m.txt")).unwrap(), b"m\n");
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"one\ntwo\nthree\nx\n");
    assert!(!m.host("sub").exists() && !m.host("gone").exists());
    assert_eq!(offline(&dir, "status", &[]).stdout, "");
}

/// Waits (at most 30 s) until `DIR/trash` holds nothing: its removal runs after the
/// command answered.
fn trash_emptied(dir: &Path, what: &str) {
    let t = Instant::now();
    loop {
        let left = fs::read_dir(dir.join("trash")).map_or(0, |d| d.count());
        if left == 0 {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what}: {left} entries still in the trash"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_apply_of_everything_drops_the_staged_tree_whole_and_a_crash_in_that_is_finished() {
    let mut orig = BTreeMap::new();
    let (mut m, dir) = staged("stage-drop-whole", WRITE, |s| orig = populate(s));
    let plan = stage_changes(&m.mnt(""), orig);
    stop(&mut m);
    // The states a SIGKILL leaves once every path is in SOURCE (taken before the apply:
    // the same staged tree): (1) the drop's intent and an empty DIR/next written; (2) the
    // old tree in the trash, the new one in place, the intent not yet removed; (3) no
    // intent, a removal of the trash killed halfway.
    let mut works = Vec::new();
    for step in 1..=3 {
        let work = m.root().join(format!("drop{step}"));
        let cp = Command::new("cp").arg("-a").arg(&dir).arg(&work).status();
        assert!(cp.unwrap().success());
        let _ = fs::remove_file(work.join("lock"));
        works.push(work);
    }
    let upper = ino(&dir.join("upper"));
    let out = offline(&dir, "apply", &[]);
    out.assert_ok("apply of everything");
    assert_eq!(
        out.stdout.lines().count(),
        plan.staged.len(),
        "one line per path"
    );
    for (p, want) in &plan.staged {
        assert!(read(&m.host("").join(p)) == *want, "SOURCE {p}");
    }
    assert!(temporaries(&m.host("")).is_empty());
    // One apply: every name of the linked file is one SOURCE file.
    assert_eq!(linked_files(&m.host("")), 1);
    // One new, empty staged tree; the old one is removed after apply answered.
    assert_ne!(
        ino(&dir.join("upper")),
        upper,
        "the staged tree was replaced"
    );
    assert_eq!(fs::read_dir(dir.join("upper")).unwrap().count(), 0);
    trash_emptied(&dir, "after apply");
    assert_eq!(offline(&dir, "status", &[]).stdout, "");
    let src = snapshot(&m.host(""));
    for (step, work) in works.iter().enumerate() {
        let step = step + 1;
        if step <= 2 {
            fs::write(work.join("intent"), r#"{"op":"drop"}"#).unwrap();
        }
        if step == 1 {
            fs::create_dir(work.join("next")).unwrap();
        } else {
            fs::create_dir(work.join("trash")).unwrap();
            let old = work.join("trash/upper.1.0");
            fs::rename(work.join("upper"), &old).unwrap();
            fs::create_dir(work.join("upper")).unwrap();
            if step == 3 {
                fs::remove_dir_all(old.join("d00")).unwrap();
            }
        }
        let second = Second::start(&m, work, &m.policy_path());
        for (p, want) in &plan.staged {
            assert!(
                read(&second.mnt.join(p)) == *want,
                "step {step}: the view of {p}"
            );
        }
        assert!(
            !work.join("intent").exists(),
            "step {step}: intent finished"
        );
        assert_eq!(
            fs::read_dir(work.join("upper")).unwrap().count(),
            0,
            "step {step}"
        );
        trash_emptied(work, &format!("step {step}"));
        drop(second);
        assert_eq!(offline(work, "status", &[]).stdout, "", "step {step}");
    }
    assert_host_unchanged(&src, &m.host(""), "drop crash states");
}
