//! The fence against a hostile agent (issue 9): attacks by an untrusted uid 1000 that must
//! neither hang the mount for others, nor exhaust the daemon, nor tell hidden names from
//! absent ones by timing. Each test runs the attack with real processes against a real
//! mount, and checks that a well-behaved uid (1001, or root) keeps working throughout.
//!
//! - FIFO create wedge: `open(O_CREAT)` of a name the kernel believes absent but which is a
//!   FIFO on the host used to block a worker in `openat` until a reader came.
//! - Creation ownership: entries made through the mount belong to the caller from the start,
//!   even while the daemon is short of descriptors.
//! - Descriptor flood: several processes of one uid holding thousands of opens.
//! - Timing oracle: repeated and first lookups of hidden vs absent names.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const AGENT: u32 = 1000;
const OTHER: u32 = 1001;

/// Debian's python3 (a pyenv shim on PATH may live where uid 1000 cannot reach it).
const PY: &str = "/usr/bin/python3";

const ALLOW_ALL: &str = "mode = \"danger\"\ndefault = \"write\"\n";

/// `python3 -c code` as `uid` (no supplementary groups) in `dir`, stdout piped.
fn spawn_py(uid: u32, dir: &Path, code: &str) -> Child {
    Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(PY)
        .arg("-c")
        .arg(code)
        .current_dir(dir)
        .env("HOME", "/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn setpriv python3")
}

/// Waits up to `d` for a child; kills it (our own child, by pid) when it overstays.
fn wait_or_kill(c: &mut Child, d: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < d {
        if let Ok(Some(st)) = c.try_wait() {
            return Some(st);
        }
        thread::sleep(Duration::from_millis(10));
    }
    let _ = c.kill();
    let _ = c.wait();
    None
}

fn read_line(c: &mut Child) -> String {
    let mut line = String::new();
    let out = c.stdout.as_mut().expect("piped stdout");
    BufReader::new(out).read_line(&mut line).unwrap();
    line.trim().to_string()
}

/// `ls` by another uid answers within `limit`; returns how long it took.
fn other_uid_ls(m: &Mount, limit: Duration) -> Duration {
    let start = Instant::now();
    let mut c = Command::new("setpriv")
        .args([
            format!("--reuid={OTHER}"),
            format!("--regid={OTHER}"),
            "--clear-groups".into(),
            "ls".into(),
            "-la".into(),
        ])
        .arg(m.mnt("."))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let st = wait_or_kill(&mut c, limit);
    assert!(
        st.is_some_and(|s| s.success()),
        "ls by uid {OTHER} did not answer within {limit:?} ({st:?})"
    );
    start.elapsed()
}

fn daemon_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn chown_tree(p: &Path, uid: u32) {
    let st = std::process::Command::new("chown")
        .args(["-R", &format!("{uid}:{uid}")])
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn fifo_create_wedge_never_blocks_a_worker() {
    // No watch and a long TTL: the kernel keeps the negative entries it learns, so the
    // FIFOs made on the host afterwards are exactly the stale state the attack needs.
    let b = Mount::builder("fifo-wedge")
        .policy(ALLOW_ALL)
        .arg("--allow-other")
        .arg("--no-watch")
        .arg("--cache-ttl")
        .arg("60")
        .arg("--threads")
        .arg("2");
    for d in ["w1", "w2"] {
        mkdirp(&b.host(d));
    }
    chown_tree(&b.host("."), AGENT);
    let m = b.start();
    // The agent learns "absent" for both names; then they become FIFOs on the host.
    let o = m.sh_as(AGENT, "stat w1/p; stat w2/p; exit 0");
    assert!(
        o.stderr.matches("No such file").count() == 2,
        "{}",
        o.stderr
    );
    for d in ["w1", "w2"] {
        let p = m.host(format!("{d}/p"));
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        // Writable by the agent: the open gets past the permission check to the type.
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    }
    let before = snapshot(m.root().join("src").as_path());
    // Two openers: one per worker thread, each in its own directory (each holds that
    // directory's lock in the kernel while its create is in flight).
    let code = "import os, sys, errno\n\
        try:\n    os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644); print('opened')\n\
        except OSError as e:\n    print(errno.errorcode[e.errno])\n";
    let mut openers: Vec<Child> = ["w1/p", "w2/p"]
        .iter()
        .map(|p| {
            Command::new("setpriv")
                .args([
                    format!("--reuid={AGENT}"),
                    format!("--regid={AGENT}"),
                    "--clear-groups".into(),
                    PY.into(),
                    "-c".into(),
                    code.into(),
                    (*p).into(),
                ])
                .current_dir(m.mnt("."))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Throughout, another uid's ls answers within 1 s.
    for _ in 0..5 {
        other_uid_ls(&m, Duration::from_secs(1));
        thread::sleep(Duration::from_millis(50));
    }
    let mut answers = Vec::new();
    for c in &mut openers {
        let st = wait_or_kill(c, Duration::from_secs(3));
        if st.is_none() {
            // Release a wedged daemon before failing (open the FIFOs for reading), so
            // the unmount does not hang.
            for d in ["w1", "w2"] {
                let _ = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(m.host(format!("{d}/p")));
            }
            panic!("open(O_CREAT) of a host FIFO blocked: a worker waits for a reader");
        }
        answers.push(read_line(c));
    }
    assert_eq!(
        answers,
        vec!["EEXIST", "EEXIST"],
        "a create that finds a non-file answers EEXIST"
    );
    assert_host_unchanged(&before, m.root().join("src").as_path(), "FIFO create");
    // The stale negative entry was taken back: the FIFO is visible now.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match std::fs::symlink_metadata(m.mnt("w1/p")) {
            Ok(md) if md.file_type().is_fifo() => break,
            r if Instant::now() > deadline => panic!("FIFO not visible after EEXIST: {r:?}"),
            _ => thread::sleep(Duration::from_millis(20)),
        }
    }
    other_uid_ls(&m, Duration::from_secs(1));
}

use std::os::unix::fs::OpenOptionsExt;

#[test]
fn entries_belong_to_the_caller_from_the_start_even_without_descriptors() {
    let b = Mount::builder("owner")
        .policy(ALLOW_ALL)
        .arg("--allow-other")
        .arg("--no-passthrough")
        .arg("--max-open-per-uid")
        .arg("64");
    mkdirp(&b.host("w"));
    put(&b.host("w/f"), b"x", 0o644);
    chown_tree(&b.host("."), AGENT);
    let m = b.start();
    // The agent holds every descriptor it may, then creates one of each kind.
    let mut holder = spawn_py(
        AGENT,
        &m.mnt("."),
        "import os, sys\nfds = []\n\
         try:\n    while True: fds.append(os.open('w/f', os.O_RDONLY))\n\
         except OSError as e: print(len(fds), e.errno, flush=True)\n\
         sys.stdin.read()\n",
    );
    let held = read_line(&mut holder);
    assert_eq!(
        held,
        format!("64 {}", libc::EMFILE),
        "the agent's share is 64"
    );
    let o = m.sh_as(
        AGENT,
        "mkfifo w/p && mkdir w/d && ln -s f w/l && mknod w/q p && echo ok",
    );
    o.assert_ok("creates while the agent's descriptor share is used up");
    // A create that opens needs a descriptor: refused before anything lands on the host.
    let o = m.sh_as(AGENT, ": > w/n");
    assert!(o.stderr.contains("Too many open files"), "{}", o.stderr);
    assert!(!m.host("w/n").exists(), "a refused create leaves no file");
    for name in ["p", "d", "l", "q"] {
        let md = std::fs::symlink_metadata(m.host(format!("w/{name}"))).unwrap();
        assert_eq!(
            (md.uid(), md.gid()),
            (AGENT, AGENT),
            "w/{name} belongs to the caller on the host"
        );
    }
    // A create the host refuses to the caller leaves nothing behind, and no root-owned entry
    // appears anywhere.
    std::fs::set_permissions(
        m.host("w/d"),
        std::os::unix::fs::PermissionsExt::from_mode(0o555),
    )
    .unwrap();
    let o = m.sh_as(AGENT, "mkfifo w/d/p 2>&1; mkdir w/d/x 2>&1; exit 0");
    assert!(o.stdout.contains("Permission denied"), "{}", o.stdout);
    assert_eq!(std::fs::read_dir(m.host("w/d")).unwrap().count(), 0);
    drop(holder.stdin.take());
    assert!(wait_or_kill(&mut holder, Duration::from_secs(5)).is_some());
    let mut root_owned = Vec::new();
    for e in walk(&m.host(".")) {
        if std::fs::symlink_metadata(&e).unwrap().uid() == 0 {
            root_owned.push(e);
        }
    }
    assert!(
        root_owned.is_empty(),
        "root-owned leftovers: {root_owned:?}"
    );
}

fn walk(p: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap() {
        let e = e.unwrap().path();
        if e.symlink_metadata().unwrap().is_dir() {
            out.extend(walk(&e));
        }
        out.push(e);
    }
    out
}

/// Holders of uid AGENT: `n` processes each opening `file` until refused or `each` are held.
fn flood(m: &Mount, n: usize, each: usize, file: &str) -> (Vec<Child>, Vec<(usize, i32)>) {
    let code = format!(
        "import os, sys, resource\n\
         resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))\n\
         fds = []; err = 0\n\
         try:\n    while len(fds) < {each}: fds.append(os.open('{file}', os.O_RDONLY))\n\
         except OSError as e: err = e.errno\n\
         print(len(fds), err, flush=True)\nsys.stdin.read()\n"
    );
    let mut kids: Vec<Child> = (0..n)
        .map(|_| spawn_py(AGENT, &m.mnt("."), &code))
        .collect();
    let counts = kids
        .iter_mut()
        .map(|c| {
            let l = read_line(c);
            let parsed: Vec<i64> = l.split(' ').filter_map(|x| x.parse().ok()).collect();
            assert_eq!(
                parsed.len(),
                2,
                "a flooding child's report {l:?} (status {:?})",
                c.try_wait()
            );
            (parsed[0] as usize, parsed[1] as i32)
        })
        .collect();
    (kids, counts)
}

fn others_keep_working(m: &Mount) {
    let o = m.sh_as(
        OTHER,
        "cat pub/readme >/dev/null && ls -la pub >/dev/null && touch pub/t1001 && rm pub/t1001 && echo fine",
    );
    o.assert_ok("uid 1001 during the flood");
    assert_eq!(o.stdout.trim(), "fine");
    let o = m.sh("cat pub/readme >/dev/null && ls pub >/dev/null && echo fine");
    o.assert_ok("root during the flood");
}

fn flood_mount(name: &str, extra: &[&str]) -> Mount {
    let mut b = Mount::builder(name).policy(ALLOW_ALL).arg("--allow-other");
    for a in extra {
        b = b.arg(*a);
    }
    mkdirp(&b.host("pub"));
    put(&b.host("pub/readme"), b"hello\n", 0o644);
    put(&b.host("pub/big"), b"data\n", 0o644);
    std::fs::set_permissions(
        b.host("pub"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    b.start()
}

#[test]
fn descriptor_flood_by_one_uid_leaves_the_others_working() {
    // Daemon-served I/O: every open holds a daemon descriptor, so the per-uid share decides.
    let m = flood_mount(
        "fd-flood",
        &["--no-passthrough", "--max-open-per-uid", "1500"],
    );
    let base = daemon_fds(m.pid());
    let (mut kids, counts) = flood(&m, 3, 1000, "pub/big");
    let total: usize = counts.iter().map(|c| c.0).sum();
    assert_eq!(
        total, 1500,
        "uid {AGENT} holds exactly its share: {counts:?}"
    );
    assert!(
        counts.iter().any(|c| c.1 == libc::EMFILE),
        "past the share the agent gets EMFILE: {counts:?}"
    );
    let fds = daemon_fds(m.pid());
    assert!(
        fds <= base + 1500 + 64,
        "daemon fds {fds} (baseline {base}) bounded by the share"
    );
    others_keep_working(&m);
    for c in &mut kids {
        drop(c.stdin.take());
        assert!(wait_or_kill(c, Duration::from_secs(10)).is_some());
    }
    // Released handles give their descriptors and budget back. (RELEASE is asynchronous: on a
    // loaded machine the kernel can take seconds to send a thousand of them.)
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemon_fds(m.pid()) > base + 16 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    assert!(daemon_fds(m.pid()) <= base + 16, "fds back to the baseline");
    let (mut kids, counts) = flood(&m, 1, 1000, "pub/big");
    assert_eq!(counts[0].0, 1000, "the share is free again: {counts:?}");
    for c in &mut kids {
        drop(c.stdin.take());
        wait_or_kill(c, Duration::from_secs(10));
    }
}

#[test]
fn passthrough_opens_hold_no_daemon_descriptor() {
    let m = flood_mount("fd-passthrough", &[]);
    // The INIT reply (and its log line) may come a moment after the mount appears.
    eventually(Duration::from_secs(5), || m.stderr().contains("file I/O"));
    assert!(
        m.stderr().contains("kernel passthrough"),
        "this test needs kernel passthrough (root, kernel ≥ 6.9): {}",
        m.stderr()
    );
    let base = daemon_fds(m.pid());
    // Far more opens than a per-uid descriptor share: none holds a daemon fd.
    let (mut kids, counts) = flood(&m, 3, 4000, "pub/big");
    assert!(
        counts.iter().all(|c| c.0 == 4000),
        "every open succeeds: {counts:?}"
    );
    let fds = daemon_fds(m.pid());
    assert!(
        fds < base + 64,
        "12,000 passthrough opens, daemon fds {fds} (baseline {base})"
    );
    // The handles still work for what the daemon serves: fsync, fstat, seek.
    let o = m.sh_as(
        AGENT,
        "/usr/bin/python3 -c \"import os; f=os.open('pub/readme', os.O_RDONLY); os.fsync(f); \
         print(os.fstat(f).st_size, os.lseek(f, 0, os.SEEK_END), os.read(os.open('pub/readme', os.O_RDONLY), 5))\"",
    );
    o.assert_ok("fsync/fstat/lseek on a passthrough handle");
    assert_eq!(o.stdout.trim(), "6 6 b'hello'");
    others_keep_working(&m);
    for c in &mut kids {
        drop(c.stdin.take());
        wait_or_kill(c, Duration::from_secs(10));
    }
}

/// Real opens (not `O_PATH`) the daemon `pid` holds of files under `under`.
fn daemon_real_opens(pid: i32, under: &Path) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(under)))
        .filter(|e| {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
                .unwrap_or(0);
            flags & libc::O_PATH as u32 == 0
        })
        .count()
}

#[test]
fn fsync_of_passthrough_handles_keeps_descriptors_only_within_half_the_share() {
    // A passthrough handle keeps the descriptor its first fsync opens, from a spare unit of
    // its uid's descriptor share (at most half of it: 8 → 4); past that, fsync reopens the
    // file for each call and still works. Closing gives every kept descriptor back.
    let m = flood_mount("fd-fsync", &["--max-open-per-uid", "8"]);
    eventually(Duration::from_secs(5), || m.stderr().contains("file I/O"));
    assert!(
        m.stderr().contains("kernel passthrough"),
        "this test needs kernel passthrough: {}",
        m.stderr()
    );
    let src = m.host(".");
    assert_eq!(daemon_real_opens(m.pid(), &src), 0);
    let code = "import os, sys\n\
         fds = [os.open('pub/f%d' % i, os.O_RDWR | os.O_CREAT, 0o644) for i in range(10)]\n\
         for r in range(3):\n    for f in fds:\n        os.pwrite(f, b'x%d' % r, 0); os.fsync(f); os.fdatasync(f)\n\
         print(len(fds), flush=True)\nsys.stdin.read()\n\
         print(b''.join(os.pread(f, 2, 0) for f in fds).decode(), flush=True)\n";
    let mut kid = spawn_py(AGENT, &m.mnt("."), code);
    assert_eq!(read_line(&mut kid), "10", "every open and fsync succeeded");
    let held = daemon_real_opens(m.pid(), &src);
    assert_eq!(held, 4, "kept descriptors: half of the share of 8");
    // The other half of the share is still there for opens that need a descriptor.
    let o = m.sh_as(
        AGENT,
        "ls pub >/dev/null && ls pub >/dev/null && ls -la pub >/dev/null && echo ok",
    );
    o.assert_ok("directory opens by the same uid");
    others_keep_working(&m);
    drop(kid.stdin.take());
    assert_eq!(read_line(&mut kid), "x2".repeat(10));
    assert!(wait_or_kill(&mut kid, Duration::from_secs(10)).is_some_and(|s| s.success()));
    assert!(
        eventually(Duration::from_secs(5), || daemon_real_opens(m.pid(), &src)
            == 0),
        "closing the handles closes what they kept: {} left",
        daemon_real_opens(m.pid(), &src)
    );
}

/// Median seconds of one stat of a hidden and of an absent name, measured in one process
/// as uid AGENT, alternating hidden and absent call by call so that both see the same
/// machine noise: `(hidden, absent)`. Each name is stat'ed `rounds` times (1: first
/// lookups only).
fn stat_medians(m: &Mount, n: usize, rounds: usize) -> (f64, f64) {
    let code = format!(
        "import os, time, statistics as st\n\
         def t(p):\n    s = time.perf_counter()\n    \
         try: os.stat(p)\n    except FileNotFoundError: pass\n    \
         return time.perf_counter() - s\n\
         for i in range(50): t('d/warm%d' % i)\n\
         h, a = [], []\n\
         for r in range({rounds}):\n    for i in range({n}):\n        \
         h.append(t('d/hidden%d' % i)); a.append(t('d/absent%d' % i))\n\
         print(st.median(h), st.median(a))\n"
    );
    let o = m.sh_as(AGENT, &format!("{PY} -c \"{code}\""));
    o.assert_ok("stat loop");
    let v: Vec<f64> = o
        .stdout
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0], v[1])
}

#[test]
fn hidden_and_absent_names_cost_the_same() {
    let b = Mount::builder("oracle")
        .policy("mode = \"danger\"\n[[rule]]\npath = \"d/hidden*\"\naccess = \"none\"\n")
        .arg("--allow-other");
    mkdirp(&b.host("d"));
    for i in 0..400 {
        put(&b.host(format!("d/hidden{i}")), b"s", 0o644);
    }
    chown_tree(&b.host("."), AGENT);
    let m = b.start();
    // First lookups (each name once), then repeated ones (the kernel's negative entries).
    let (first_h, first_a) = stat_medians(&m, 300, 1);
    let (rh, ra) = stat_medians(&m, 300, 20);
    eprintln!(
        "first lookup: hidden {:.1} µs, absent {:.1} µs; repeated: hidden {:.2} µs, absent {:.2} µs",
        first_h * 1e6,
        first_a * 1e6,
        rh * 1e6,
        ra * 1e6
    );
    assert!(
        rh < 3.0 * ra && ra < 3.0 * rh,
        "repeated lookups: hidden {rh:e} s vs absent {ra:e} s"
    );
    assert!(
        first_h < 3.0 * first_a && first_a < 3.0 * first_h,
        "first lookups: hidden {first_h:e} s vs absent {first_a:e} s"
    );
    // Cached as absent, but a reload that shows the names takes the entries back at once.
    m.reload_with("mode = \"danger\"\n");
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let o = m.sh_as(AGENT, "cat d/hidden7");
        if o.ok() {
            assert_eq!(o.stdout, "s");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a reload that unhides a cached hidden name takes effect within 1 s"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn supplementary_group_creates_still_belong_to_the_caller() {
    // A directory writable through a group the caller has only as a supplementary group:
    // the kernel allows it (default_permissions sees the caller's groups), the host would
    // not for the caller's fs ids alone; the entry is made and given to the caller.
    const TEAM: u32 = 2000;
    let b = Mount::builder("suppl-group")
        .policy(ALLOW_ALL)
        .arg("--allow-other");
    mkdirp(&b.host("team"));
    std::os::unix::fs::chown(b.host("team"), Some(0), Some(TEAM)).unwrap();
    std::fs::set_permissions(
        b.host("team"),
        std::os::unix::fs::PermissionsExt::from_mode(0o775),
    )
    .unwrap();
    let m = b.start();
    let o: Out = Command::new("setpriv")
        .args([
            format!("--reuid={AGENT}"),
            format!("--regid={AGENT}"),
            format!("--groups={TEAM}"),
            "sh".into(),
            "-c".into(),
            "mkdir team/d && : > team/f && mkfifo team/p && echo ok".into(),
        ])
        .current_dir(m.mnt("."))
        .output()
        .unwrap()
        .into();
    o.assert_ok("creates through a supplementary group");
    for name in ["d", "f", "p"] {
        let md = std::fs::symlink_metadata(m.host(format!("team/{name}"))).unwrap();
        assert_eq!((md.uid(), md.gid()), (AGENT, AGENT), "team/{name}");
    }
    // Without the group the kernel refuses, and nothing lands on the host.
    let o = m.sh_as(AGENT, "mkdir team/x");
    o.assert_fail("mkdir without the group");
    assert!(!m.host("team/x").exists());
}

#[test]
fn an_exclusive_create_of_a_name_the_kernel_thinks_absent_is_eexist_and_forgotten() {
    let b = Mount::builder("excl-stale")
        .policy(ALLOW_ALL)
        .arg("--no-watch")
        .arg("--cache-ttl")
        .arg("60");
    mkdirp(&b.host("w"));
    let m = b.start();
    // The kernel learns "absent"; then the name appears on the host behind its back.
    assert_eq!(errno_of(&std::fs::metadata(m.mnt("w/f"))), libc::ENOENT);
    put(&m.host("w/f"), b"host", 0o644);
    let before = snapshot(m.root().join("src").as_path());
    let r = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.mnt("w/f"));
    assert_eq!(errno_of(&r), libc::EEXIST, "O_CREAT|O_EXCL");
    assert_host_unchanged(&before, m.root().join("src").as_path(), "exclusive create");
    // The stale entry was dropped (the kernel does so itself on EEXIST): the file shows
    // without waiting for the 60 s TTL.
    assert!(
        eventually(Duration::from_secs(2), || std::fs::read(m.mnt("w/f"))
            .is_ok_and(|c| c == b"host")),
        "the kernel still believes w/f absent"
    );
}
