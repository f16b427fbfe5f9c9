//! fstab and `mount -t fuse.fencefs`: real mount(8), mount.fuse3 and umount(8), with real
//! `/etc/fstab` lines, in a private mount namespace.
//!
//! The test re-runs itself under `unshare -m --propagation private`, as init of a new pid
//! namespace (`--pid --fork --kill-child`): the daemon that mount(8)'s helper leaves
//! behind becomes its child, so the test sees its exit status after `umount`, and whatever
//! happens, nothing outlives the run. Inside, /etc is an
//! overlay (so /etc/fstab and /etc/fencefs/ can be written without touching the host's),
//! and /srv and /run are fresh tmpfs, so the very line of the README,
//! `/srv/work /run/fencefs/work fuse.fencefs policy=/etc/fencefs/work.toml,allow_other 0 0`,
//! is mounted with `mount /run/fencefs/work` and unmounted with `umount`. mount(8) drops
//! PATH from a helper's environment, so mount.fuse3's `sh -c fencefs ...` looks in the
//! default PATH: /usr/local/sbin (a tmpfs here) gets a `fencefs` link to the binary under
//! test, as the package puts it in /usr/bin.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const INNER: &str = "FENCEFS_MOUNT_HELPER_INNER";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `cmd` (stdin closed) and collects its output.
fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("spawn")
}

fn sh(script: &str) -> Output {
    run(Command::new("sh").arg("-c").arg(script))
}

/// The fencefs processes that are our children now (the daemons mount(8) left behind,
/// reparented to us as init of the pid namespace).
fn daemon_children() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = vec![];
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let comm = &stat[stat.find('(').unwrap() + 1..close];
        let ppid: i32 = stat[close + 2..]
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if ppid == me && comm == "fencefs" {
            out.push(pid);
        }
    }
    out
}

/// Waits (bounded) for child `pid` to exit; its exit code.
fn reap(pid: i32, within: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child (reparented to us as init), WNOHANG.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if start.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// On the way out (also on a failed assertion): stop daemons still left, so none keeps
/// the namespace alive.
struct Reaper;

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in daemon_children() {
            // SAFETY: kill(2) on our own child (a daemon reparented to us as init).
            unsafe { libc::kill(pid, libc::SIGTERM) };
            if reap(pid, Duration::from_secs(5)).is_none() {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                reap(pid, Duration::from_secs(5));
            }
        }
    }
}

fn mounted_type(mnt: &str) -> Option<(String, String)> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.get(4) != Some(&mnt) {
            return None;
        }
        let sep = f.iter().position(|x| *x == "-")?;
        Some((
            f[sep + 1].to_string(),
            format!("{},{}", f[5], f.get(sep + 3).unwrap_or(&"")),
        ))
    })
}

/// The source field of the last mount at `mnt` in /proc/self/mountinfo.
fn mounted_source(mnt: &str) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if f.get(4) != Some(&mnt) {
            return None;
        }
        let sep = f.iter().position(|x| *x == "-")?;
        f.get(sep + 2).map(|s| s.to_string())
    })
}

/// Nothing on stdout or stderr.
fn assert_silent(o: &Output, what: &str) {
    assert_eq!(
        (text(&o.stdout), text(&o.stderr)),
        (String::new(), String::new()),
        "{what} must print nothing on success"
    );
}

/// Exactly one line on stderr, nothing on stdout.
fn one_error_line(o: &Output, what: &str) -> String {
    let err = text(&o.stderr);
    assert_eq!(text(&o.stdout), "", "{what}: stdout");
    assert_eq!(
        err.lines().count(),
        1,
        "{what}: one error line, got {err:?}"
    );
    err
}

fn must(o: Output, what: &str) -> Output {
    assert!(
        o.status.success(),
        "{what}: {:?}\nstdout: {}\nstderr: {}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
    o
}

#[test]
fn fstab_lines_mount_and_umount_in_a_private_namespace() {
    if std::env::var_os(INNER).is_some() {
        inner();
        return;
    }
    require_fuse();
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    // Bounded: a hung inner run is killed (and with it the namespace and its mounts).
    let o = Command::new("timeout")
        .args([
            "-k",
            "5",
            "180",
            "unshare",
            "-m",
            "--propagation",
            "private",
        ])
        .args(["--pid", "--fork", "--kill-child", "--mount-proc", "--"])
        .arg(exe)
        .args([
            "--exact",
            "fstab_lines_mount_and_umount_in_a_private_namespace",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INNER, "1")
        .stdin(Stdio::null())
        .output()
        .expect("unshare (util-linux)");
    let out = text(&o.stdout) + &text(&o.stderr);
    eprintln!("{out}");
    assert!(o.status.success(), "inner run failed: {:?}", o.status);
    assert!(
        out.contains("test result: ok. 1 passed"),
        "the inner test did not run"
    );
    eprintln!("whole namespace run: {:?}", started.elapsed());
}

/// Runs inside the private mount namespace.
fn inner() {
    assert_eq!(
        std::process::id(),
        1,
        "runs as init of its own pid namespace"
    );
    let _reaper = Reaper;
    let ws = Workspace::new("fstab");
    let root = ws.root.clone();
    // /etc as an overlay: fstab and /etc/fencefs are written in the upper layer only.
    for d in ["etc-upper", "etc-work"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    must(
        sh(&format!(
            "mount -t overlay overlay -o lowerdir=/etc,upperdir={r}/etc-upper,workdir={r}/etc-work /etc \
             && mount -t tmpfs -o mode=0755 tmpfs /srv && mount -t tmpfs -o mode=0755 tmpfs /run \
             && mount -t tmpfs -o mode=0755 tmpfs /usr/local/sbin \
             && ln -s {bin} /usr/local/sbin/fencefs",
            r = root.display(),
            bin = BIN,
        )),
        "namespace setup",
    );
    fs::create_dir_all("/etc/fencefs").unwrap();
    fs::write(
        "/etc/fencefs/work.toml",
        "mode = \"workspace-write\"\n\n[[rule]]\npath = \"secrets\"\naccess = \"none\"\n\n\
         [[rule]]\npath = \"docs\"\naccess = \"read\"\n",
    )
    .unwrap();
    fs::write(
        "/etc/fencefs/broken.toml",
        "mode = \"workspace-write\"\nbogus = 1\n",
    )
    .unwrap();
    for w in ["work", "work2"] {
        fs::create_dir_all(format!("/srv/{w}/secrets")).unwrap();
        fs::create_dir_all(format!("/srv/{w}/docs")).unwrap();
        fs::write(format!("/srv/{w}/README.md"), "hello\n").unwrap();
        fs::write(format!("/srv/{w}/secrets/key"), "TOKEN\n").unwrap();
        fs::write(format!("/srv/{w}/docs/a.md"), "doc\n").unwrap();
        must(sh(&format!("chown -R 1000:1000 /srv/{w}")), "chown");
    }
    // work2's mount point is made by mount(8) itself (x-mount.mkdir), as at boot, where
    // /run is empty.
    for m in ["work", "bad", "broken", "cli"] {
        fs::create_dir_all(format!("/run/fencefs/{m}")).unwrap();
    }
    let fstab = "\
/srv/work /run/fencefs/work fuse.fencefs policy=/etc/fencefs/work.toml,allow_other 0 0
/srv/work2 /run/fencefs/work2 fuse.fencefs policy=/etc/fencefs/work.toml,mode=read-only,allow_other,audit=/run/fencefs/work2.jsonl,audit_max_size=1M,audit_keep=2,_netdev,nofail,x-mount.mkdir,x-systemd.requires=local-fs.target,x-systemd.mount-timeout=30 0 0
/srv/work /run/fencefs/bad fuse.fencefs policy=/etc/fencefs/work.toml,allow_other,bogus_opt 0 0
/srv/work /run/fencefs/broken fuse.fencefs policy=/etc/fencefs/broken.toml 0 0
";
    let mut etc_fstab = fs::read_to_string("/etc/fstab").unwrap_or_default();
    etc_fstab.push_str(fstab);
    fs::write("/etc/fstab", etc_fstab).unwrap();
    assert!(
        root.join("etc-upper/fstab").exists(),
        "the overlay's upper layer holds the changed fstab"
    );

    // ---- the README's line: `mount MOUNTPOINT` ----------------------------------------
    let t = Instant::now();
    let o = must(
        run(Command::new("mount").arg("/run/fencefs/work")),
        "mount /run/fencefs/work",
    );
    eprintln!("mount /run/fencefs/work returned after {:?}", t.elapsed());
    // A mount helper is silent on success (boot logs, `mount -a`): no INFO line.
    assert_silent(&o, "mount /run/fencefs/work");
    // mount(8) returned: the mount is there and answers at once.
    let (fstype, opts) = mounted_type("/run/fencefs/work").expect("mounted after mount(8)");
    assert_eq!(fstype, "fuse.fencefs");
    // The mount table names SOURCE, as bindfs and sshfs do; findmnt and df agree.
    assert_eq!(
        mounted_source("/run/fencefs/work").as_deref(),
        Some("/srv/work")
    );
    let o = must(
        run(Command::new("findmnt").args(["-n", "-o", "SOURCE", "/run/fencefs/work"])),
        "findmnt",
    );
    assert_eq!(text(&o.stdout).trim(), "/srv/work");
    let o = must(
        run(Command::new("df").args(["--output=source", "/run/fencefs/work"])),
        "df",
    );
    assert_eq!(
        text(&o.stdout).lines().nth(1).map(str::trim),
        Some("/srv/work")
    );
    for o in ["nosuid", "nodev", "allow_other", "default_permissions"] {
        assert!(opts.split(',').any(|x| x == o), "{o} missing in {opts}");
    }
    let mut names: Vec<String> = fs::read_dir("/run/fencefs/work")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["README.md", "docs"]);
    // allow_other: uid 1000 uses it; the policy decides (docs read, new files allowed).
    let o = sh("setpriv --reuid 1000 --regid 1000 --clear-groups sh -c '\
         cat /run/fencefs/work/README.md; \
         echo x > /run/fencefs/work/docs/a.md || echo docs:refused; \
         echo new > /run/fencefs/work/new.txt && echo new:ok; \
         cat /run/fencefs/work/secrets/key || echo secrets:hidden' 2>&1");
    let out = text(&o.stdout);
    assert!(out.starts_with("hello\n"), "{out}");
    assert!(
        out.contains("Permission denied") && out.contains("docs:refused"),
        "{out}"
    );
    assert!(out.contains("new:ok"), "{out}");
    assert!(
        out.contains("No such file or directory") && out.contains("secrets:hidden"),
        "{out}"
    );
    let md = fs::metadata("/srv/work/new.txt").unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 1000), "created as the caller");
    assert_eq!(fs::read_to_string("/srv/work/docs/a.md").unwrap(), "doc\n");
    // The daemon: one, in its own session, stdio let go (this process's pipes).
    let daemons = daemon_children();
    assert_eq!(daemons.len(), 1, "{daemons:?}");
    let pid = daemons[0];
    for fd in 0..3 {
        let target = fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
        assert_eq!(target, PathBuf::from("/dev/null"), "fd {fd}");
    }
    // SAFETY: getsid on a pid; no pointers.
    let sid = unsafe { libc::getsid(pid) };
    assert_eq!(sid, pid, "daemon leads its own session");
    must(
        run(Command::new("umount").arg("/run/fencefs/work")),
        "umount",
    );
    assert_eq!(
        reap(pid, Duration::from_secs(10)),
        Some(0),
        "daemon exit after umount"
    );
    assert_eq!(mounted_type("/run/fencefs/work"), None);

    // ---- options mount(8) and systemd use, mode= and audit= -----------------------------
    must(
        run(Command::new("mount").arg("/run/fencefs/work2")),
        "mount /run/fencefs/work2",
    );
    let pid = *daemon_children().first().expect("daemon");
    let o = sh("echo x > /run/fencefs/work2/new.txt");
    assert!(
        text(&o.stderr).contains("Read-only file system"),
        "mode=read-only: {}",
        text(&o.stderr)
    );
    assert!(!Path::new("/srv/work2/new.txt").exists());
    must(
        run(Command::new("umount").arg("/run/fencefs/work2")),
        "umount work2",
    );
    assert_eq!(reap(pid, Duration::from_secs(10)), Some(0));
    let audit = fs::read_to_string("/run/fencefs/work2.jsonl").unwrap();
    assert!(
        audit.contains("\"path\":\"new.txt\"") && audit.contains("\"errno\":\"EROFS\""),
        "{audit}"
    );

    // ---- an unknown option: an error naming it, nothing mounted, no daemon --------------
    let o = run(Command::new("mount").arg("/run/fencefs/bad"));
    assert!(!o.status.success());
    let err = one_error_line(&o, "mount /run/fencefs/bad");
    assert!(
        err.contains("fencefs: unknown mount option 'bogus_opt'; fencefs options: policy=FILE"),
        "{err}"
    );
    assert_eq!(mounted_type("/run/fencefs/bad"), None);
    assert_eq!(daemon_children(), Vec::<i32>::new());

    // ---- an invalid policy: mount(8) fails with the daemon's error ----------------------
    let o = run(Command::new("mount").arg("/run/fencefs/broken"));
    assert!(!o.status.success());
    let err = one_error_line(&o, "mount /run/fencefs/broken");
    assert!(
        err.contains(
            "fencefs: invalid policy: /etc/fencefs/broken.toml:2:1: unknown key \"bogus\""
        ),
        "{err}"
    );
    assert_eq!(mounted_type("/run/fencefs/broken"), None);
    assert_eq!(daemon_children(), Vec::<i32>::new());

    // ---- mount -t fuse.fencefs without fstab ---------------------------------------------
    let o = must(
        run(Command::new("mount").args([
            "-t",
            "fuse.fencefs",
            "/srv/work",
            "/run/fencefs/cli",
            "-o",
            "policy=/etc/fencefs/work.toml,ro",
        ])),
        "mount -t fuse.fencefs",
    );
    assert_silent(&o, "mount -t fuse.fencefs");
    assert_eq!(
        mounted_source("/run/fencefs/cli").as_deref(),
        Some("/srv/work")
    );
    let pid = *daemon_children().first().expect("daemon");
    assert_eq!(
        fs::read_to_string("/run/fencefs/cli/README.md").unwrap(),
        "hello\n"
    );
    must(
        run(Command::new("umount").arg("/run/fencefs/cli")),
        "umount cli",
    );
    assert_eq!(reap(pid, Duration::from_secs(10)), Some(0));

    // ---- RUST_LOG brings the INFO lines back (mount(8) passes it on) ------------------------
    let o = must(
        run(Command::new("mount")
            .args(["-t", "fuse.fencefs", "/srv/work", "/run/fencefs/cli"])
            .args(["-o", "policy=/etc/fencefs/work.toml,ro"])
            .env("RUST_LOG", "info")),
        "RUST_LOG=info mount -t fuse.fencefs",
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("mounted /srv/work at /run/fencefs/cli") && err.contains("transport: "),
        "RUST_LOG=info: {err}"
    );
    let pid = *daemon_children().first().expect("daemon");
    must(
        run(Command::new("umount").arg("/run/fencefs/cli")),
        "umount cli (RUST_LOG)",
    );
    assert_eq!(reap(pid, Duration::from_secs(10)), Some(0));

    must(
        sh("umount /usr/local/sbin /run /srv /etc"),
        "namespace teardown",
    );
}
