//! A reload as the kernel's caches show it (issue 17, findings 10, 6 and 11): a reload is
//! one instant for every caller of the mount — once any path shows the new policy, every
//! other path does too; a held directory change does not delay the invalidation of the
//! rest; and link/unlink/rename/stat under reloads and load never wait forever.

mod common;

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const OPEN: &str = "mode = \"danger\"\ndefault = \"write\"\n";

fn hiding(paths: &[&str]) -> String {
    let mut p = OPEN.to_string();
    for h in paths {
        p.push_str(&format!("[[rule]]\npath = \"{h}\"\naccess = \"none\"\n"));
    }
    p
}

/// Replaces the policy file atomically (as the README asks: a half-written file that
/// parses is a valid policy too) and sends SIGHUP.
fn reload_atomic(m: &Mount, toml: &str) {
    let tmp = m.policy_path().with_extension("new");
    fs::write(&tmp, toml).unwrap();
    fs::rename(&tmp, m.policy_path()).unwrap();
    m.reload();
}

/// Paths the two policies disagree on: visible under A, hidden under B, and the reverse.
const A_ONLY: &[&str] = &[
    "d", "d/c0", "d/c1", "d/c2", "d/c3", "d/sub", "d/sub/s0", "v0", "v1", "w/x",
];
const B_ONLY: &[&str] = &["h0", "h1", "w/y", "w/z"];

fn visible(m: &Mount, p: &str) -> bool {
    match fs::symlink_metadata(m.mnt(p)) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::NotFound => false,
        Err(e) => panic!("stat {p}: unexpected {e}"),
    }
}

/// Whether `p` shows policy A (`true`) or B.
fn shows_a(m: &Mount, p: &str) -> bool {
    visible(m, p) == A_ONLY.contains(&p)
}

#[test]
fn once_one_path_shows_a_reload_every_other_path_does() {
    let a = hiding(B_ONLY);
    let b = hiding(&["d", "v0", "v1", "w/x"]);
    let m = Mount::with("reload-order", Some(&a), None, |src| {
        for p in ["d/sub", "w"] {
            mkdirp(&src.join(p));
        }
        for p in A_ONLY.iter().chain(B_ONLY) {
            if *p != "d" && *p != "d/sub" {
                put(&src.join(p), b"x", 0o644);
            }
        }
        put(&src.join("stays"), b"y", 0o644);
        // Unchanged names the kernel caches too: the reload's invalidations take longer.
        for i in 0..300 {
            put(&src.join(format!("plain/p{i}")), b"p", 0o644);
        }
    });
    let changed: Vec<&str> = A_ONLY.iter().chain(B_ONLY).copied().collect();
    let rounds = 40;
    let mut halves = Vec::new();
    let mut to_a = false;
    for round in 0..rounds {
        let now_a = !to_a;
        // Settled on the policy in force, and every name and attribute cached by the
        // kernel (positive and negative entries, listings).
        assert!(
            eventually(Duration::from_secs(15), || changed
                .iter()
                .all(|p| shows_a(&m, p) == now_a)),
            "round {round}: never settled on {}",
            if now_a { "A" } else { "B" }
        );
        let _ = names(&m.mnt(""));
        let _ = names(&m.mnt("w"));
        let _ = names(&m.mnt("d"));
        for p in names(&m.mnt("plain")).unwrap() {
            let _ = fs::symlink_metadata(m.mnt("plain").join(bpath(&p)));
        }
        let canary = changed[round % changed.len()];
        reload_atomic(&m, if to_a { &a } else { &b });
        let t = Instant::now();
        while shows_a(&m, canary) != to_a {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "round {round}: {canary} never showed the reload; stderr:\n{}",
                m.stderr()
            );
            thread::yield_now();
        }
        let mut stale: Vec<String> = changed
            .iter()
            .filter(|p| shows_a(&m, p) != to_a)
            .map(|p| p.to_string())
            .collect();
        // Listings too (the kernel may keep them across opens).
        for p in &changed {
            let (dir, base) = p.rsplit_once('/').unwrap_or(("", p));
            let listed = names_str(&m.mnt(dir)).is_ok_and(|n| n.iter().any(|x| x == base));
            let in_a = A_ONLY.contains(p);
            // d/ itself is hidden under B: its listing cannot be read.
            let parent_shown = dir.is_empty() || !dir.starts_with('d') || to_a;
            if parent_shown && listed != (in_a == to_a) {
                stale.push(format!("ls {dir}: {base}"));
            }
        }
        if !stale.is_empty() {
            halves.push(format!(
                "round {round} (to {}): {canary} showed it, still old: {stale:?}",
                if to_a { "A" } else { "B" }
            ));
        }
        to_a = !to_a;
    }
    assert!(
        halves.is_empty(),
        "half a policy in {} of {rounds} reloads:\n{}",
        halves.len(),
        halves.join("\n")
    );
    assert!(visible(&m, "stays"));
}

/// A control-socket approver (just enough for these tests).
struct Approver {
    w: std::os::unix::net::UnixStream,
    r: std::io::BufReader<std::os::unix::net::UnixStream>,
}

impl Approver {
    fn subscribe(sock: &Path) -> Approver {
        let s = std::os::unix::net::UnixStream::connect(sock).expect("control socket");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let r = std::io::BufReader::new(s.try_clone().unwrap());
        let mut a = Approver { w: s, r };
        let _hello = a.line();
        a.send(serde_json::json!({"cmd": "subscribe"}));
        assert_eq!(a.next(None)["ok"], true);
        a
    }
    fn send(&mut self, v: serde_json::Value) {
        use std::io::Write;
        let mut b = serde_json::to_vec(&v).unwrap();
        b.push(b'\n');
        self.w.write_all(&b).unwrap();
    }
    fn line(&mut self) -> serde_json::Value {
        use std::io::BufRead;
        let mut l = String::new();
        self.r.read_line(&mut l).expect("a line from the daemon");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}"))
    }
    /// The next event `ev`, or (None) the next answer.
    fn next(&mut self, ev: Option<&str>) -> serde_json::Value {
        loop {
            let v = self.line();
            match (ev, v.get("event").and_then(|e| e.as_str())) {
                (None, None) => return v,
                (Some(e), Some(x)) if e == x => return v,
                _ => {}
            }
        }
    }
}

/// `python3 -c code` as uid 1000 in the mount.
fn agent(m: &Mount, code: &str) -> Child {
    Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups"])
        .args(["/usr/bin/python3", "-c", code])
        .current_dir(m.mnt("."))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

const ASK_DOCS: &str = "[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\n";

#[test]
fn a_held_directory_change_does_not_delay_a_reload() {
    let base = format!("{OPEN}{ASK_DOCS}");
    let mut b = Mount::builder("reload-held")
        .policy(&format!(
            "{base}[[rule]]\npath = \"docs/shown\"\naccess = \"none\"\n"
        ))
        .arg("--allow-other")
        .arg("--revoke")
        .arg("--ask-timeout")
        .arg("60");
    let sock = b.root().join("ctl.sock");
    b = b.arg("--control").arg(&sock);
    for d in ["docs", "other", "other2"] {
        mkdirp(&b.host(d));
        put(&b.host(format!("{d}/f")), b"x", 0o644);
    }
    put(&b.host("docs/shown"), b"s", 0o644);
    put(&b.host("other2/m"), &[b'm'; 8192], 0o644);
    let st = Command::new("chown")
        .args(["-R", "1000:1000"])
        .arg(b.host("."))
        .status()
        .unwrap();
    assert!(st.success());
    let m = b.start();
    let mut approver = Approver::subscribe(&sock);
    // Everything cached: names, attributes, listings — docs/f too, whose entry the
    // reload must take back from a directory the held create keeps locked.
    for p in ["docs/f", "other/f", "other2/f"] {
        assert!(visible(&m, p));
    }
    // A hidden name, cached as a negative entry in docs/: the reloads show it, but its
    // directory stays locked by the held create, so its invalidation waits in the lane.
    assert!(!visible(&m, "docs/shown"));
    let _ = names(&m.mnt(""));
    // A shared map of other2/m, which the second reload hides: --revoke must stop it
    // (its next fault gets SIGBUS) although a held request locks docs/.
    let mut holder = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            "import mmap, os, sys\n\
             fd = os.open('other2/m', os.O_RDONLY)\n\
             mm = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ)\n\
             print(mm[0:3].decode(), flush=True)\n\
             sys.stdin.readline()\n\
             print(mm[4096:4099].decode(), flush=True)\n",
        )
        .current_dir(m.mnt("."))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut mapped = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut mapped, &mut line).unwrap();
    assert_eq!(line.trim(), "mmm", "the map reads the file");
    let create = agent(
        &m,
        "import os, errno\n\
         try:\n    os.open('docs/new', os.O_CREAT | os.O_WRONLY, 0o644); print('created')\n\
         except OSError as e:\n    print(errno.errorcode[e.errno])\n",
    );
    let ask = approver.next(Some("ask"));
    assert_eq!(ask["paths"][0], "docs/new", "{ask}");
    let id = ask["id"].as_u64().unwrap();

    // Two reloads while the create is held: each takes effect at once.
    for (round, (hide, shown)) in [("other", "other2"), ("other2", "other")]
        .into_iter()
        .enumerate()
    {
        let before = m.stderr().matches("policy reloaded").count();
        let t = Instant::now();
        reload_atomic(
            &m,
            &format!("{base}[[rule]]\npath = \"{hide}\"\naccess = \"none\"\n"),
        );
        let mut took = None;
        while t.elapsed() < Duration::from_secs(20) {
            if m.stderr().matches("policy reloaded").count() > before
                && !visible(&m, hide)
                && !visible(&m, &format!("{hide}/f"))
                && visible(&m, &format!("{shown}/f"))
                && !names_str(&m.mnt("")).unwrap().contains(&hide.to_string())
            {
                took = Some(t.elapsed());
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        let took = took.unwrap_or_else(|| {
            panic!(
                "reload {round} never took effect while a create was held:\n{}",
                m.stderr()
            )
        });
        eprintln!("reload {round} with a create held in docs/: {hide}/ hidden in {took:?}");
        assert!(
            took < Duration::from_secs(3),
            "reload {round}: {hide}/ still reachable {took:?} after SIGHUP (a held create in docs/)\n{}",
            m.stderr()
        );
    }
    let log = m.stderr();
    assert!(log.contains("deferred"), "docs/ entries deferred:\n{log}");
    std::io::Write::write_all(holder.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let st = holder.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        st.signal(),
        Some(libc::SIGBUS),
        "the map of other2/m, hidden by the reload, still reads ({st})"
    );

    // The create is still held (the policy still asks) until the approver says no.
    approver.send(serde_json::json!({"cmd": "decide", "id": id, "allow": false}));
    assert_eq!(approver.next(None)["ok"], true);
    let out = create.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "EACCES");
    assert!(!m.host("docs/new").exists(), "refused create left no file");
    // Once docs/ is free the lane takes the stale negative entry back (well before the
    // 10 s entry TTL would).
    let t = Instant::now();
    assert!(
        eventually(Duration::from_secs(2), || visible(&m, "docs/shown")),
        "docs/shown still ENOENT {:?} after the hold ended:\n{}",
        t.elapsed(),
        m.stderr()
    );
    eprintln!("docs/shown visible {:?} after the hold ended", t.elapsed());
}

/// Kernel stacks of the daemon's threads (root reads them): where a hang waits.
fn stacks(pid: i32) -> String {
    let mut out = String::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let p = t.path();
            let comm = fs::read_to_string(p.join("comm")).unwrap_or_default();
            let stack = fs::read_to_string(p.join("stack")).unwrap_or_default();
            out.push_str(&format!(
                "--- {} {}{stack}",
                t.file_name().to_string_lossy(),
                comm
            ));
        }
    }
    out
}

/// Issue 17 finding 11: xfstests generic/236 (create, sleep 1 s, link, the ctime changed)
/// once hung past a 60 s watchdog on a loaded machine. The same workload, with many
/// threads creating, linking, renaming, unlinking and stat-ing, host-side churn in SOURCE
/// (fanotify events) and a reload every 50 ms; every thread must make progress.
#[test]
fn link_rename_unlink_stat_under_reloads_and_load_never_hang() {
    const THREADS: usize = 8;
    const RUN: Duration = Duration::from_secs(12);
    const STUCK: Duration = Duration::from_secs(20);
    let pa = hiding(&["secret"]);
    let pb = hiding(&["secret", "w0/hidden*"]);
    let m = Mount::builder("reload-hang")
        .policy(&pa)
        .watchdog(Duration::from_secs(120));
    for i in 0..THREADS {
        mkdirp(&m.host(format!("w{i}")));
    }
    mkdirp(&m.host("churn"));
    put(&m.host("secret"), b"s", 0o600);
    let m = Arc::new(m.start());
    let stop = Arc::new(AtomicBool::new(false));
    let progress: Arc<Vec<AtomicU64>> =
        Arc::new((0..THREADS + 3).map(|_| AtomicU64::new(0)).collect());
    let t0 = Instant::now();
    let now_ms = move || t0.elapsed().as_millis() as u64;
    let mut workers = Vec::new();
    for i in 0..THREADS {
        let (m, stop, progress) = (m.clone(), stop.clone(), progress.clone());
        workers.push(thread::spawn(move || -> Result<u64, String> {
            // Odd threads work like a process whose cwd is its directory (no walk from the
            // root: through /proc/self/fd/N, the open directory itself).
            let held = fs::File::open(m.mnt(format!("w{i}"))).map_err(|e| e.to_string())?;
            let dir = if i % 2 == 1 {
                std::path::PathBuf::from(format!(
                    "/proc/self/fd/{}",
                    std::os::fd::AsRawFd::as_raw_fd(&held)
                ))
            } else {
                m.mnt(format!("w{i}"))
            };
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let f = dir.join(format!("f{n}"));
                let l = dir.join(format!("l{n}"));
                let r = dir.join(format!("r{n}"));
                let e = |what: &str, e: std::io::Error| format!("w{i} {what} #{n}: {e}");
                fs::write(&f, b"data").map_err(|x| e("create", x))?;
                let before = fs::metadata(&f).map_err(|x| e("stat", x))?;
                if i == 0 {
                    // generic/236 itself: the link must change the ctime.
                    thread::sleep(Duration::from_millis(1100));
                }
                fs::hard_link(&f, &l).map_err(|x| e("link", x))?;
                let after = fs::metadata(&f).map_err(|x| e("stat after link", x))?;
                if i == 0
                    && (after.ctime(), after.ctime_nsec()) <= (before.ctime(), before.ctime_nsec())
                {
                    return Err(format!("w0 #{n}: link kept the ctime ({})", before.ctime()));
                }
                if after.nlink() != 2 {
                    return Err(format!("w{i} #{n}: nlink {} after link", after.nlink()));
                }
                fs::rename(&l, &r).map_err(|x| e("rename", x))?;
                fs::remove_file(&f).map_err(|x| e("unlink", x))?;
                fs::remove_file(&r).map_err(|x| e("unlink renamed", x))?;
                let _ = fs::metadata(m.mnt("secret"));
                let _ = names(&dir);
                n += 1;
                progress[i].store(now_ms(), Ordering::Relaxed);
            }
            Ok(n)
        }));
    }
    // At the root: names never seen before (each lookup takes the root's lock) and a
    // create + unlink there.
    let prober = {
        let (m, stop, progress) = (m.clone(), stop.clone(), progress.clone());
        thread::spawn(move || -> Result<u64, String> {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = fs::symlink_metadata(m.mnt(format!("absent{k}")));
                let p = m.mnt(format!("top{}", k % 4));
                fs::write(&p, b"t").map_err(|e| format!("root create #{k}: {e}"))?;
                fs::remove_file(&p).map_err(|e| format!("root unlink #{k}: {e}"))?;
                k += 1;
                progress[THREADS + 2].store(now_ms(), Ordering::Relaxed);
            }
            Ok(k)
        })
    };
    // Reloads, and another process changing SOURCE behind the mount.
    let reloader = {
        let (m, stop, progress) = (m.clone(), stop.clone(), progress.clone());
        thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                reload_atomic(&m, if k.is_multiple_of(2) { &pb } else { &pa });
                k += 1;
                progress[THREADS].store(now_ms(), Ordering::Relaxed);
                thread::sleep(Duration::from_millis(50));
            }
            k
        })
    };
    let churn = {
        let (m, stop, progress) = (m.clone(), stop.clone(), progress.clone());
        thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = m.host(format!("churn/c{}", k % 64));
                let _ = fs::write(&p, b"c");
                let _ = fs::remove_file(&p);
                let _ = fs::write(
                    m.host(format!("w{}/host{}", k % THREADS as u64, k % 8)),
                    b"h",
                );
                k += 1;
                progress[THREADS + 1].store(now_ms(), Ordering::Relaxed);
            }
        })
    };
    let mut hung = None;
    while t0.elapsed() < RUN + STUCK {
        thread::sleep(Duration::from_millis(500));
        let done = t0.elapsed() >= RUN;
        if done && !stop.swap(true, Ordering::Relaxed) {
            eprintln!("load: stopping after {RUN:?}");
        }
        if workers.iter().all(|w| w.is_finished()) {
            break;
        }
        let now = now_ms();
        if let Some((who, _)) = progress
            .iter()
            .enumerate()
            .find(|(_, p)| now.saturating_sub(p.load(Ordering::Relaxed)) > STUCK.as_millis() as u64)
        {
            hung = Some((who, stacks(m.pid())));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some((who, st)) = hung {
        // End the daemon (our child) so that every blocked syscall returns and the
        // threads let the mount go (it is unmounted when the last of them is done).
        let log = m.stderr();
        m.signal(libc::SIGKILL);
        for w in workers {
            let _ = w.join();
        }
        let _ = (reloader.join(), churn.join(), prober.join());
        panic!(
            "thread {who} made no progress for {STUCK:?}; daemon threads' kernel stacks:\n{st}\nstderr:\n{log}"
        );
    }
    let mut total = 0;
    for w in workers {
        match w.join().unwrap() {
            Ok(n) => total += n,
            Err(e) => panic!("{e}\nstderr:\n{}", m.stderr()),
        }
    }
    let reloads = reloader.join().unwrap();
    churn.join().unwrap();
    let probes = prober
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}\nstderr:\n{}", m.stderr()));
    eprintln!(
        "load: {total} create/link/rename/unlink rounds, {probes} root probes, {reloads} reloads, no thread stuck"
    );
    assert!(total > THREADS as u64, "hardly any progress: {total}");
    assert!(reloads > 10, "{reloads} reloads");
}
