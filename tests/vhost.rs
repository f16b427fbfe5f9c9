//! `fencefs vhost-user` serving a real VM: QEMU (TCG, or KVM where kvm_intel/kvm_amd is
//! loaded) boots the guest scripts/vm-guest.sh prepares (cached under target/vm), with
//! shared memfd memory and a vhost-user-fs-pci device on the daemon's socket. The guest's
//! /test.sh (appended to the initramfs as a second cpio segment) mounts the tag with
//! `mount -t virtiofs` and runs the policy checks as guest root and guest uid 1000, printing
//! one `R name: result` line each; the host side checks those lines, the host tree, a
//! reload seen by the guest, the audit file, and the daemon exiting 0 once the VM stops.
//! Never skips: without QEMU or the kernel it fails (scripts/vm-guest.sh installs them).

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fencefs");

/// The whole VM run (boot, checks, power-off) must end within this.
const VM_DEADLINE: Duration = Duration::from_secs(150);

/// A child killed (by pid, ours) if the test ends early.
struct Reap(Option<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `fencefs vhost-user` daemon serving `SOURCE` on `DIR/fs.sock`, its log in
/// `DIR/daemon.stderr`; killed (by pid, ours) if the test ends early.
struct Daemon {
    child: Reap,
    pid: i32,
    sock: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Starts the daemon with `args` before SOURCE and waits for its socket.
    fn start(dir: &Path, args: &[&std::ffi::OsStr], src: &Path) -> Daemon {
        let sock = dir.join("fs.sock");
        let log = dir.join("daemon.stderr");
        let child = Command::new(BIN)
            .args(["vhost-user", "--socket"])
            .arg(&sock)
            .args(args)
            .arg(src)
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("start fencefs vhost-user");
        let d = Daemon {
            pid: child.id() as i32,
            child: Reap(Some(child)),
            sock,
            log,
        };
        let t = Instant::now();
        while !d.sock.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "no socket; daemon: {}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// What the daemon logged so far.
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's exit status, once it exits by itself (within 20 s, or the test fails
    /// and the daemon is killed); `when` says what it should have exited after. Its
    /// socket file must be gone.
    fn exit(&mut self, when: &str) -> std::process::ExitStatus {
        let mut d = self.child.0.take().unwrap();
        let t = Instant::now();
        let st = loop {
            if let Some(st) = d.try_wait().unwrap() {
                break st;
            }
            if t.elapsed() > Duration::from_secs(20) {
                let _ = d.kill();
                let _ = d.wait();
                panic!("the daemon did not exit {when}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(!self.sock.exists(), "the socket file stays behind");
        st
    }
}

fn guest_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target/vm");
    let st = Command::new("sh")
        .arg(root.join("scripts/vm-guest.sh"))
        .arg(&out)
        .status()
        .expect("run scripts/vm-guest.sh");
    assert!(st.success(), "scripts/vm-guest.sh failed: {st}");
    out
}

const POLICY: &str = r#"
mode = "workspace-write"
default = "write"
writable_roots = ["."]
protected = ["prot"]

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "ro"
access = "read"

[[rule]]
path = "docs"
access = "read"
ask = "write"
"#;

/// The guest's checks. Each prints `R name: ok` or `R name: <the error message>`.
const GUEST: &str = r#"#!/bin/sh
W=/workspace
r() { name=$1; shift; if out=$("$@" 2>&1); then echo "R $name: ok $out"; else echo "R $name: ${out##*: }"; fi; }
mkdir -p $W
r mount mount -t virtiofs fencefs $W
r read cat $W/open.txt
r listed sh -c "ls $W | tr '\\n' ' '"
r hidden_stat stat $W/secrets
r hidden_read cat $W/secrets/key
r root_write sh -c "echo written-by-guest > $W/open.txt"
r rule_write runas 1000 1000 sh -c "echo changed > $W/ro/locked.txt"
r rule_read runas 1000 1000 cat $W/ro/locked.txt
r protected_write sh -c "echo changed > $W/prot/file.txt"
r uid_create runas 1000 1000 sh -c "echo mine > $W/work/mine.txt"
r uid_owner stat -c %u:%g $W/work/mine.txt
r big_write sh -c "dd if=/dev/urandom of=$W/work/big bs=1M count=4 2>/dev/null && sync && sha256sum $W/work/big | cut -d' ' -f1"
echo 3 > /proc/sys/vm/drop_caches
r big_read sh -c "sha256sum $W/work/big | cut -d' ' -f1"
now() { cut -d' ' -f1 /proc/uptime; }
(out=$(sh -c "echo x > $W/docs/a.md" 2>&1); echo "R held: ${out##*: } $(now)") &
sleep 1
r during_hold cat $W/open.txt
echo "R during_hold_at: $(now)"
wait
r before_reload cat $W/later.txt
echo "GUEST: reload-please"
i=0
while cat $W/later.txt >/dev/null 2>&1 && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
r after_reload cat $W/later.txt
r after_reload_listed sh -c "ls $W | tr '\\n' ' '"
r umount umount $W
"#;

fn accel() -> &'static str {
    if Path::new("/sys/module/kvm_intel").exists() || Path::new("/sys/module/kvm_amd").exists() {
        "kvm"
    } else {
        "tcg,thread=multi"
    }
}

fn write_file(p: &Path, body: &str, mode: u32) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, body).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_vm_gets_its_workspace_from_fencefs_with_the_policy() {
    let started = Instant::now();
    let vm = guest_dir();
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("vhost-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let src = dir.join("src");
    write_file(&src.join("open.txt"), "open\n", 0o666);
    write_file(&src.join("ro/locked.txt"), "locked\n", 0o666);
    write_file(&src.join("prot/file.txt"), "protected\n", 0o666);
    write_file(&src.join("secrets/key"), "sk-123\n", 0o644);
    write_file(&src.join("later.txt"), "later\n", 0o644);
    write_file(&src.join("docs/a.md"), "doc\n", 0o666);
    fs::create_dir_all(src.join("work")).unwrap();
    fs::set_permissions(src.join("work"), fs::Permissions::from_mode(0o777)).unwrap();
    let policy = dir.join("policy.toml");
    fs::write(&policy, POLICY).unwrap();
    let audit = dir.join("audit.jsonl");
    let mut daemon = Daemon::start(
        &dir,
        &[
            "--policy".as_ref(),
            policy.as_os_str(),
            "--audit".as_ref(),
            audit.as_os_str(),
            "--map-uid".as_ref(),
            "1000:4242".as_ref(),
            "--map-gid".as_ref(),
            "1000:4343".as_ref(),
            "--control".as_ref(),
            dir.join("ctl.sock").as_os_str(),
            "--ask-timeout".as_ref(),
            "6".as_ref(),
        ],
        &src,
    );
    let (pid, sock) = (daemon.pid, daemon.sock.clone());
    let t = Instant::now();

    // An approver that never answers: the guest's write to docs/ is held until
    // --ask-timeout.
    let mut approver = std::os::unix::net::UnixStream::connect(dir.join("ctl.sock")).unwrap();
    std::io::Write::write_all(&mut approver, b"{\"cmd\":\"subscribe\"}\n").unwrap();
    // The greeting, then the subscription's answer.
    let mut lines = BufReader::new(approver.try_clone().unwrap()).lines();
    let ack = (0..2)
        .filter_map(|_| lines.next().and_then(Result::ok))
        .find(|l| l.contains("\"ok\""))
        .unwrap_or_default();
    assert!(ack.contains("true"), "{ack}");
    let (qemu, rx) = boot(&dir, &vm, &sock, GUEST, "main");

    let mut results = BTreeMap::new();
    let mut console = String::new();
    let mut reloaded = None;
    loop {
        let left = VM_DEADLINE.saturating_sub(t.elapsed());
        let line = match rx.recv_timeout(left) {
            Ok(l) => l,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(_) => panic!("the VM did not finish in {VM_DEADLINE:?}:\n{console}"),
        };
        console.push_str(&line);
        console.push('\n');
        if let Some(r) = line.trim().strip_prefix("R ")
            && let Some((k, v)) = r.split_once(": ")
        {
            results.insert(k.to_string(), v.trim().to_string());
        }
        if line.contains("GUEST: reload-please") {
            // A rule that hides later.txt, taken in with SIGHUP.
            let more = "\n[[rule]]\npath = \"later.txt\"\naccess = \"none\"\n";
            fs::write(&policy, format!("{POLICY}{more}")).unwrap();
            // SAFETY-free: kill(2) through nix on our own child.
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGHUP,
            )
            .unwrap();
            reloaded = Some(Instant::now());
        }
    }
    let mut qemu = qemu;
    let qs = qemu.0.take().unwrap().wait().unwrap();
    assert!(qs.success(), "qemu: {qs}\n{console}");
    let get = |k: &str| {
        results
            .get(k)
            .cloned()
            .unwrap_or_else(|| panic!("no result for {k}:\n{console}"))
    };
    assert!(get("mount").starts_with("ok"), "{console}");
    assert_eq!(get("read"), "ok open");
    // Hidden: not listed, ENOENT.
    let listed = get("listed");
    for n in ["open.txt", "ro", "prot", "work", "later.txt"] {
        assert!(listed.contains(n), "{n} not listed: {listed}");
    }
    assert!(!listed.contains("secrets"), "secrets listed: {listed}");
    assert_eq!(get("hidden_stat"), "No such file or directory");
    assert_eq!(get("hidden_read"), "No such file or directory");
    // The allowed write reached the host.
    assert!(get("root_write").starts_with("ok"), "{console}");
    assert_eq!(
        fs::read_to_string(src.join("open.txt")).unwrap(),
        "written-by-guest\n"
    );
    // The rule's EACCES (the file's mode allows the write), host unchanged; reads allowed.
    assert_eq!(get("rule_write"), "Permission denied");
    assert_eq!(get("rule_read"), "ok locked");
    assert_eq!(
        fs::read_to_string(src.join("ro/locked.txt")).unwrap(),
        "locked\n"
    );
    // The mode's EROFS (protected), host unchanged.
    assert_eq!(get("protected_write"), "Read-only file system");
    assert_eq!(
        fs::read_to_string(src.join("prot/file.txt")).unwrap(),
        "protected\n"
    );
    // Guest uid 1000's file: host ids as --map-uid/--map-gid say; the guest sees its own.
    assert!(get("uid_create").starts_with("ok"), "{console}");
    let md = fs::metadata(src.join("work/mine.txt")).unwrap();
    assert_eq!((md.uid(), md.gid()), (4242, 4343));
    assert_eq!(get("uid_owner"), "ok 1000:1000");
    // 1 MiB writes and reads (INIT's max_write): the host has the guest's bytes, and the
    // guest reads them back from the host (its page cache dropped).
    let host_sum = Command::new("sha256sum")
        .arg(src.join("work/big"))
        .output()
        .unwrap();
    let host_sum = String::from_utf8_lossy(&host_sum.stdout);
    let host_sum = host_sum.split(' ').next().unwrap();
    assert_eq!(fs::metadata(src.join("work/big")).unwrap().len(), 4 << 20);
    assert_eq!(get("big_write"), format!("ok {host_sum}"));
    assert_eq!(get("big_read"), format!("ok {host_sum}"));
    // A held request does not hold up the queue: the read during the hold finished
    // before the held write ended (EACCES at --ask-timeout, host unchanged).
    let held = get("held");
    let (what, held_end) = held.rsplit_once(' ').unwrap();
    assert_eq!(what, "Permission denied", "{console}");
    assert_eq!(get("during_hold"), "ok written-by-guest");
    let during: f64 = get("during_hold_at").parse().unwrap();
    let held_end: f64 = held_end.parse().unwrap();
    assert!(
        during + 2.0 < held_end,
        "read at {during}, held write ended at {held_end}"
    );
    assert_eq!(fs::read_to_string(src.join("docs/a.md")).unwrap(), "doc\n");
    drop(approver);
    // The reload, seen by the guest (its caches expire within the 1 s TTL).
    assert_eq!(get("before_reload"), "ok later");
    assert!(reloaded.is_some(), "{console}");
    assert_eq!(get("after_reload"), "No such file or directory");
    assert!(!get("after_reload_listed").contains("later.txt"));
    assert!(src.join("later.txt").exists());
    assert!(get("umount").starts_with("ok"), "{console}");

    // The backend exits 0 once the VM has stopped.
    let st = daemon.exit("after the VM stopped");
    let log = daemon.log();
    assert!(st.success(), "daemon: {st}\n{log}");
    assert!(log.contains("policy reloaded: generation 1"), "{log}");
    // An audit line for the guest's refused write, with the guest's uid.
    let audit = fs::read_to_string(&audit).unwrap();
    let line = audit
        .lines()
        .find(|l| l.contains("\"path\":\"ro/locked.txt\"") && l.contains("\"decision\":\"deny\""))
        .unwrap_or_else(|| panic!("no audit line for ro/locked.txt:\n{audit}"));
    assert!(
        line.contains("\"errno\":\"EACCES\"") && line.contains("\"uid\":1000"),
        "{line}"
    );
    eprintln!("VM test: {:?} in all", started.elapsed());
    let _ = fs::remove_dir_all(&dir);
}

/// Boots a VM whose /test.sh is `script` on `sock`; its console lines go to the returned
/// receiver.
fn boot(
    dir: &Path,
    vm: &Path,
    sock: &Path,
    script: &str,
    name: &str,
) -> (Reap, std::sync::mpsc::Receiver<String>) {
    let seg = dir.join(format!("seg-{name}"));
    fs::create_dir_all(&seg).unwrap();
    fs::write(seg.join("test.sh"), script).unwrap();
    fs::set_permissions(seg.join("test.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("echo test.sh | busybox cpio -o -H newc 2>/dev/null")
        .current_dir(&seg)
        .output()
        .unwrap();
    let mut img = fs::read(vm.join("initramfs.gz")).unwrap();
    img.extend(out.stdout);
    let initrd = dir.join(format!("initrd-{name}"));
    fs::write(&initrd, img).unwrap();
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-accel", accel(), "-cpu", "max", "-m", "512M", "-smp", "2"])
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(vm.join("vmlinuz"))
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 quiet panic=-1"])
        .args(["-object", "memory-backend-memfd,id=mem,size=512M,share=on"])
        .args(["-numa", "node,memdev=mem"])
        .arg("-chardev")
        .arg(format!("socket,id=fs,path={}", sock.display()))
        .args(["-device", "vhost-user-fs-pci,chardev=fs,tag=fencefs"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qemu-system-x86_64");
    let out = qemu.stdout.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (Reap(Some(qemu)), rx)
}

/// Console lines until one contains `what` (panics after the VM deadline).
fn wait_for(rx: &std::sync::mpsc::Receiver<String>, what: &str) -> String {
    let t = Instant::now();
    let mut seen = String::new();
    loop {
        let left = VM_DEADLINE.saturating_sub(t.elapsed());
        match rx.recv_timeout(left) {
            Ok(l) => {
                seen.push_str(&l);
                seen.push('\n');
                if l.contains(what) {
                    return seen;
                }
            }
            Err(_) => panic!("no {what:?} from the VM:\n{seen}"),
        }
    }
}

#[test]
fn keep_serving_takes_the_next_vm_and_sigterm_ends_it_with_0() {
    let vm = guest_dir();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("vhost-keep-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let src = dir.join("src");
    write_file(&src.join("f.txt"), "one\n", 0o644);
    for i in 0..40 {
        write_file(&src.join(format!("d/f{i}")), "x\n", 0o644);
    }
    let mut daemon = Daemon::start(&dir, &["--keep-serving".as_ref()], &src);
    let (pid, sock) = (daemon.pid, daemon.sock.clone());
    let baseline = steady_fds(pid);
    // The first VM looks up every file, keeps three open and powers off without
    // unmounting: no RELEASE, no FORGET ever comes for them. The daemon stays.
    let first = "#!/bin/sh\nmkdir -p /w; mount -t virtiofs fencefs /w && echo \"R first: $(cat /w/f.txt)\"\n\
        ls -lR /w >/dev/null\nfor f in f.txt d/f1 d/f2; do sleep 600 < /w/$f & done\nsleep 1\necho \"R held-open\"\nsleep 3\n";
    let (mut q1, rx1) = boot(&dir, &vm, &sock, first, "1");
    let seen = wait_for(&rx1, "R held-open");
    assert!(seen.contains("R first: one"), "{seen}");
    let during = fds(pid);
    let seen = wait_for(&rx1, "GUEST: done");
    assert!(q1.0.take().unwrap().wait().unwrap().success(), "{seen}");
    // The second guest starts clean: the first one's handles are closed and its lookups
    // forgotten (their cached descriptors closed), back to what the daemon held before.
    let t = Instant::now();
    while !daemon.log().contains("waiting for the next connection") {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the first connection did not end"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = steady_fds(pid);
    let links: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            Some((
                e.as_ref().ok()?.file_name(),
                fs::read_link(e.ok()?.path()).ok()?,
            ))
        })
        .map(|(n, p)| format!("{n:?}={}", p.display()))
        .collect();
    let log = daemon.log();
    assert!(
        during >= baseline + 3,
        "the first guest held no descriptors: {baseline} before, {during} during"
    );
    assert_eq!(
        after, baseline,
        "descriptors: {baseline} before the first guest, {during} during, {after} after: {links:?}\n{log}"
    );
    assert!(log.contains("closed 3 handles"), "{log}");
    assert!(
        daemon
            .child
            .0
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
            .is_none(),
        "exited after the first VM"
    );
    // The second one is served too, and is still connected when SIGTERM comes.
    let second = "#!/bin/sh\nmkdir -p /w; mount -t virtiofs fencefs /w && echo \"R second: $(cat /w/f.txt)\"\nsleep 600\n";
    let (_q2, rx2) = boot(&dir, &vm, &sock, second, "2");
    let seen = wait_for(&rx2, "R second:");
    assert!(seen.contains("R second: one"), "{seen}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = daemon.exit("after SIGTERM");
    let log = daemon.log();
    assert!(st.success(), "{st}\n{log}");
    assert!(log.contains("connection 2"), "{log}");
    let _ = fs::remove_dir_all(&dir);
}

/// The guest of the staging test: changes three files, waits until the host has applied
/// one and discarded another (the discarded file reads as SOURCE's again), then reads
/// what it sees.
const STAGED_GUEST: &str = r#"#!/bin/sh
W=/workspace
r() { name=$1; shift; if out=$("$@" 2>&1); then echo "R $name: ok $out"; else echo "R $name: ${out##*: }"; fi; }
mkdir -p $W
r mount mount -t virtiofs fencefs $W
r new sh -c "echo staged > $W/new.txt"
r edit sh -c "echo edited > $W/f.txt"
r remove rm $W/gone.txt
r read_edit cat $W/f.txt
echo "GUEST: staged"
i=0
while [ "$(cat $W/f.txt)" != one ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
r after_discard cat $W/f.txt
r after_new cat $W/new.txt
r after_remove stat $W/gone.txt
r umount umount $W
"#;

#[test]
fn a_staged_vm_changes_nothing_until_applied() {
    let vm = guest_dir();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("vhost-stage-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let src = dir.join("src");
    write_file(&src.join("f.txt"), "one\n", 0o666);
    write_file(&src.join("gone.txt"), "gone\n", 0o666);
    let policy = dir.join("policy.toml");
    fs::write(&policy, "mode = \"workspace-write\"\ndefault = \"write\"\n").unwrap();
    let (stage, ctl) = (dir.join("stage"), dir.join("ctl.sock"));
    let mut daemon = Daemon::start(
        &dir,
        &[
            "--policy".as_ref(),
            policy.as_os_str(),
            "--stage".as_ref(),
            stage.as_os_str(),
            "--control".as_ref(),
            ctl.as_os_str(),
        ],
        &src,
    );
    let stage_cmd = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("stage")
            .arg(args[0])
            .arg(&ctl)
            .args(&args[1..])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "stage {args:?}: {text}{err}");
        text
    };
    let (qemu, rx) = boot(&dir, &vm, &daemon.sock, STAGED_GUEST, "stage");
    let mut qemu = qemu;
    let seen = wait_for(&rx, "GUEST: staged");
    // The guest's changes are staged: SOURCE as it was, `stage status` lists them.
    assert!(seen.contains("R new: ok"), "{seen}");
    assert!(seen.contains("R edit: ok"), "{seen}");
    assert!(seen.contains("R remove: ok"), "{seen}");
    assert!(seen.contains("R read_edit: ok edited"), "{seen}");
    assert!(
        !src.join("new.txt").exists(),
        "a staged create reached SOURCE"
    );
    assert_eq!(fs::read_to_string(src.join("f.txt")).unwrap(), "one\n");
    assert_eq!(fs::read_to_string(src.join("gone.txt")).unwrap(), "gone\n");
    let status = stage_cmd(&["status"]);
    for line in ["A new.txt", "M f.txt", "D gone.txt"] {
        assert!(status.lines().any(|l| l == line), "{line}: {status}");
    }
    // Apply one, discard another, while the guest runs.
    stage_cmd(&["apply", "new.txt"]);
    stage_cmd(&["discard", "f.txt"]);
    assert_eq!(fs::read_to_string(src.join("new.txt")).unwrap(), "staged\n");
    assert_eq!(fs::read_to_string(src.join("f.txt")).unwrap(), "one\n");
    let seen = wait_for(&rx, "GUEST: done");
    assert!(qemu.0.take().unwrap().wait().unwrap().success(), "{seen}");
    // The guest sees the applied file, SOURCE's version of the discarded one, and the
    // deletion still staged.
    assert!(seen.contains("R after_new: ok staged"), "{seen}");
    assert!(seen.contains("R after_discard: ok one"), "{seen}");
    assert!(
        seen.contains("R after_remove: No such file or directory"),
        "{seen}"
    );
    assert!(seen.contains("R umount: ok"), "{seen}");
    assert_eq!(fs::read_to_string(src.join("gone.txt")).unwrap(), "gone\n");
    let st = daemon.exit("after the VM stopped");
    assert!(st.success(), "daemon: {st}\n{}", daemon.log());
    let out = Command::new(BIN)
        .args(["stage", "status", "--dir"])
        .arg(&stage)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "D gone.txt\n");
    let _ = fs::remove_dir_all(&dir);
}

/// The daemon's open descriptors.
fn fds(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// The daemon's open descriptors once the count has not changed for half a second (at
/// most 10 s).
fn steady_fds(pid: i32) -> usize {
    let t = Instant::now();
    let mut last = fds(pid);
    let mut since = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
        let n = fds(pid);
        if n != last {
            (last, since) = (n, Instant::now());
        } else if since.elapsed() > Duration::from_millis(500) {
            break;
        }
    }
    last
}
