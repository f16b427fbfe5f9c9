//! Staging's edge cases and hostile input, on real mounts: names with control characters
//! quoted as git quotes them, the control socket's status/diff, an apply stopped midway,
//! links/FIFOs/renames over files, a directory deleted and made again, ENOSPC in DIR, a
//! daemon without root, type changes, a staged tree too deep to walk, hostile names and
//! contents kept off the operator's terminal, and a huge diff refused on the socket.
//! (tests/stage.rs has the main flows; tests/stage_live.rs the live operations.)

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::stage::*;
use common::*;

#[test]
fn names_with_control_characters_are_quoted_as_git_quotes_them() {
    let (m, dir) = staged("stage-names", WRITE, |_| {});
    fs::write(m.mnt("tab\there"), b"t\n").unwrap();
    fs::write(m.mnt("esc\x1b[31m"), b"e\n").unwrap();
    fs::write(m.mnt("").join(bpath(b"raw\xff")), b"\x00\x01bin").unwrap();
    let st = stage(&["status"], &dir);
    assert_eq!(
        st.stdout,
        "A \"esc\\033[31m\"\nA \"raw\\377\"\nA \"tab\\there\"\n"
    );
    let d = stage(&["diff"], &dir).stdout;
    assert!(
        d.contains("diff --git \"a/tab\\there\" \"b/tab\\there\"\n"),
        "{d}"
    );
    assert!(
        d.contains("Binary files /dev/null and \"b/raw\\377\" differ\n"),
        "{d}"
    );
    assert!(
        !d.bytes().any(|b| b == 0x1b || b == 0),
        "no raw control bytes: {d:?}"
    );
}

/// One command on the control socket; the answer.
fn ctl(sock: &Path, cmd: serde_json::Value) -> serde_json::Value {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap(); // greeting
    writeln!(s, "{cmd}").unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}

#[test]
fn the_control_socket_serves_status_and_diff_of_a_running_mount() {
    let (m, _dir, sock) = staged_live("stage-control", staged_sample);
    fs::write(m.mnt("a.txt"), b"staged\n").unwrap();
    fs::write(m.mnt("new.txt"), b"n\n").unwrap();
    let st = ctl(&sock, serde_json::json!({"cmd":"status"}));
    assert_eq!(st["ok"], true);
    assert_eq!(st["staged"], 2, "{st}");
    let mut s = ctl(&sock, serde_json::json!({"cmd":"stage","op":"status"}));
    for e in s["changes"].as_array_mut().unwrap() {
        let id = e.as_object_mut().unwrap().remove("id").unwrap();
        assert_eq!(id.as_str().unwrap().len(), 16, "{id}");
    }
    assert_eq!(
        s["changes"],
        serde_json::json!([
            {"path":"a.txt","change":"modified","conflict":false},
            {"path":"new.txt","change":"added","conflict":false}
        ])
    );
    let cli = run_fencefs(
        ["stage".as_ref(), "status".as_ref(), sock.as_os_str()],
        LIMIT,
    );
    cli.assert_ok("stage status SOCKET");
    assert_eq!(cli.stdout, "M a.txt\nA new.txt\n");
    let d = run_fencefs(
        [
            "stage".as_ref(),
            "diff".as_ref(),
            sock.as_os_str(),
            "a.txt".as_ref(),
        ],
        LIMIT,
    );
    assert!(
        d.stdout.starts_with("diff --git a/a.txt b/a.txt\n"),
        "{}",
        d.stdout
    );
    assert!(!d.stdout.contains("new.txt"), "PATH filter: {}", d.stdout);
    // An unknown op is refused, and nothing changes (live apply: tests/stage_live.rs).
    let a = ctl(&sock, serde_json::json!({"cmd":"stage","op":"bogus"}));
    assert_eq!(a["ok"], false);
    assert!(
        a["error"].as_str().unwrap().contains("unknown stage op"),
        "{a}"
    );
    assert_eq!(fs::read(m.host("a.txt")).unwrap(), b"one\ntwo\nthree\n");
    let bad = ctl(
        &sock,
        serde_json::json!({"cmd":"stage","op":"status","bogus":1}),
    );
    assert_eq!(bad["ok"], false, "{bad}");
}

#[test]
fn an_apply_stopped_after_a_directory_rename_loses_nothing() {
    let (mut m, dir) = staged("stage-rename-crash", WRITE, staged_sample);
    m.sh("set -e; echo changed > sub/b.txt; mv sub moved")
        .assert_ok("stage a dir rename");
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    // What an apply killed right after its SOURCE rename leaves: SOURCE renamed, the
    // staged directory still redirected to the old name.
    fs::rename(m.host("sub"), m.host("moved")).unwrap();
    assert_eq!(stage(&["status"], &dir).stdout, "M moved/b.txt\n");
    // A new daemon shows the same merged view (the redirect is repaired at startup).
    let second = Second::start(&m, &dir, &m.policy_path());
    let d = snapshot_diff(&merged, &snapshot(&second.mnt));
    assert!(
        d.is_empty(),
        "merged view after the interrupted apply:\n{d}"
    );
    drop(second);
    stage(&["apply"], &dir).assert_ok("apply the rest");
    assert_eq!(fs::read(m.host("moved/b.txt")).unwrap(), b"changed\n");
    assert_eq!(fs::read(m.host("moved/deep/c.txt")).unwrap(), b"sea\n");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

#[test]
fn links_fifos_and_renames_over_files_land_in_the_stage() {
    let (mut m, dir) = staged("stage-links", WRITE, staged_sample);
    let before = snapshot(&m.host(""));
    m.sh("set -e; ln a.txt hard; mkfifo pipe; echo r > repl; mv repl sub/b.txt; mv run.sh run2.sh")
        .assert_ok("link, mkfifo, rename over a file, rename a file");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(m.mnt("hard")).unwrap().nlink(),
        2,
        "a link of a host file"
    );
    assert_eq!(fs::read(m.mnt("hard")).unwrap(), b"one\ntwo\nthree\n");
    assert_host_unchanged(&before, &m.host(""), "links, fifos, renames");
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "A hard\nA pipe\nR run.sh -> run2.sh\nM sub/b.txt\n"
    );
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(fs::read(m.host("hard")).unwrap(), b"one\ntwo\nthree\n");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        fs::symlink_metadata(m.host("pipe"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(!m.host("run.sh").exists());
    assert_eq!(fs::read(m.host("sub/b.txt")).unwrap(), b"r\n");
}

#[test]
fn a_directory_deleted_and_made_again_applies_as_such() {
    let (mut m, dir) = staged("stage-opaque", WRITE, staged_sample);
    m.sh("set -e; rm -rf sub; mkdir sub; echo n > sub/new")
        .assert_ok("rm -rf, mkdir");
    assert_eq!(names_str(&m.mnt("sub")).unwrap(), vec!["new"]);
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "D sub/b.txt\nD sub/deep/\nA sub/new\n"
    );
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    // One entry inside cannot be discarded alone (SOURCE's would come back half-way).
    let d = stage(&["discard", "sub/new"], &dir);
    d.assert_fail("discard inside an opaque directory");
    assert!(d.stdout.contains("discard that directory"), "{}", d.stdout);
    // The directory itself can be discarded, and can be made again the same way.
    let backup = m.root().join("stage-copy");
    sh_in(
        m.root(),
        &format!("cp -a {} {}", dir.display(), backup.display()),
    )
    .assert_ok("cp");
    stage(&["discard", "sub"], &dir).assert_ok("discard the directory");
    assert_eq!(stage(&["status"], &dir).stdout, "");
    fs::remove_dir_all(&dir).unwrap();
    fs::rename(&backup, &dir).unwrap();
    stage(&["apply"], &dir).assert_ok("apply");
    let dd = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(dd.is_empty(), "SOURCE after apply:\n{dd}");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

/// A small tmpfs for DIR, unmounted on drop.
struct SmallFs(PathBuf);

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn enospc_in_dir_fails_the_write_and_keeps_the_stage_consistent() {
    let b = Mount::builder("stage-enospc").policy(WRITE);
    staged_sample(&b.host(""));
    let tm = b.root().join("tm");
    fs::create_dir_all(&tm).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&tm)
        .status()
        .unwrap();
    assert!(ok.success(), "mount a 1 MiB tmpfs");
    let _small = SmallFs(tm.clone());
    let dir = tm.join("stage");
    let mut m = b.arg("--stage").arg(&dir).start();
    let before = snapshot(&m.host(""));
    fs::write(m.mnt("small.txt"), b"fits\n").unwrap();
    let big = pseudo_random(4 << 20, 7);
    assert_errno(
        fs::write(m.mnt("big.bin"), &big),
        libc::ENOSPC,
        "write past DIR's space",
    )
    .ok();
    assert_eq!(fs::read(m.mnt("small.txt")).unwrap(), b"fits\n");
    assert_host_unchanged(&before, &m.host(""), "ENOSPC in DIR");
    m.sh("rm -f big.bin").assert_ok("rm the partial file");
    assert_eq!(stage(&["status"], &dir).stdout, "A small.txt\n");
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    assert_eq!(fs::read(m.host("small.txt")).unwrap(), b"fits\n");
}

#[test]
fn type_changes_are_t_and_apply_replaces_what_is_in_the_way() {
    let (mut m, dir) = staged("stage-type", WRITE, staged_sample);
    m.sh("set -e; rm a.txt; mkdir a.txt; echo in > a.txt/inner; rm -rf gone; ln -s sub gone")
        .assert_ok("a file becomes a directory, a directory a symlink");
    assert_eq!(stage(&["status"], &dir).stdout, "T a.txt/\nT gone\n");
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    let d = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(d.is_empty(), "SOURCE after apply:\n{d}");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

/// A staged tree deeper than the stage tools once walked (400 levels): status answers on
/// the socket and offline, and the daemon lives (the walks have no recursion; past
/// `stage::tree::MAX_DEPTH`, 8,192 levels, more than the mount lets anyone make, they
/// refuse with ELOOP: the unit tests in `src/stage/deep_tests.rs`).
#[test]
fn a_deep_staged_tree_is_walked_and_the_daemon_lives() {
    let b = Mount::builder("stage-deep").policy(WRITE);
    let dir = stage_dir(&b);
    let sock = b.root().join("ctl.sock");
    let mut m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(&sock)
        .start();
    let deep = vec!["d"; 450].join("/");
    m.sh(&format!("mkdir -p {deep} && echo x > {deep}/f"))
        .assert_ok("a 450-level tree");
    let s = ctl(&sock, serde_json::json!({"cmd":"stage","op":"status"}));
    assert_eq!(s["ok"], true, "{s}");
    assert_eq!(s["lines"], serde_json::json!(["A d/ (450 entries)"]), "{s}");
    assert_eq!(
        ctl(&sock, serde_json::json!({"cmd":"status"}))["staged"],
        serde_json::json!(1)
    );
    m.assert_alive("after walking a deep staged tree");
    let o = stage(&["status"], &dir);
    o.assert_ok("offline status");
    assert_eq!(o.stdout, "A d/ (450 entries)\n");
    assert_eq!(fs::read(m.mnt(format!("{deep}/f"))).unwrap(), b"x\n");
}

/// `cmd` run with its stdout on a terminal (`script` gives it a pty); what the terminal got.
fn on_a_tty(cmd: &[&std::ffi::OsStr]) -> String {
    let line: Vec<String> = cmd
        .iter()
        .map(|a| format!("'{}'", a.to_string_lossy().replace('\'', "'\\''")))
        .collect();
    let o = std::process::Command::new("timeout")
        .args(["60", "script", "-qec", &line.join(" "), "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script(1)");
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Nothing a terminal acts on: printable ASCII, newlines (and the pty's carriage returns
/// before them), tabs, and printable non-ASCII that is neither a C1 control nor bidi.
fn inert(s: &str, what: &str) {
    let bad: Vec<char> = s
        .chars()
        .filter(|&c| c != '\n' && c != '\t' && fencefs::quote::unsafe_char(c))
        .filter(|&c| c != '\r')
        .collect();
    assert!(bad.is_empty(), "{what}: raw {bad:?} in {s:?}");
}

#[test]
fn hostile_names_and_contents_never_reach_the_operators_terminal_raw() {
    let (m, dir) = staged("stage-tty", WRITE, |_| {});
    // A name that reads "abcexe.pdf" through U+202E, one with a C1 CSI (U+009B).
    fs::write(m.mnt("abc\u{202e}fdp.exe"), b"x\n").unwrap();
    fs::write(m.mnt("csi\u{9b}31m"), b"y\n").unwrap();
    // Contents that, printed raw, erase the line above and redraw what the operator reads.
    let payload = "rm -rf ~ # \x1b[1A\x1b[2K\rharmless\n\u{9b}2K\u{202e}x\n";
    fs::write(m.mnt("run.sh"), payload).unwrap();
    let js = stage(&["status", "--json"], &dir);
    js.assert_ok("stage status --json");
    inert(&js.stdout, "status --json");
    let v: serde_json::Value = serde_json::from_str(&js.stdout).expect("still JSON");
    assert_eq!(v[0]["path"], "abc\u{202e}fdp.exe", "the same JSON: {v}");
    // Piped, the diff is the exact patch (git apply needs the bytes).
    let piped = stage(&["diff"], &dir);
    assert!(
        piped.stdout.contains(payload.lines().next().unwrap()),
        "{}",
        piped.stdout
    );
    // On a terminal, every byte a terminal would act on is escaped.
    let bin: &std::ffi::OsStr = BIN.as_ref();
    let tty = on_a_tty(&[
        bin,
        "stage".as_ref(),
        "diff".as_ref(),
        "--dir".as_ref(),
        dir.as_os_str(),
    ]);
    inert(&tty, "stage diff on a tty");
    assert!(!tty.contains('\x1b'), "{tty:?}");
    assert!(
        tty.contains("+rm -rf ~ # \\033[1A\\033[2K\\rharmless"),
        "{tty:?}"
    );
    assert!(tty.contains("+\\302\\2332K\\342\\200\\256x"), "{tty:?}");
    drop(m);
}

/// The daemon's peak resident memory (VmHWM), in bytes.
fn peak_rss(pid: i32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let l = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn a_huge_staged_diff_on_the_socket_is_refused_without_rendering_it_all() {
    // The agent decides how big the staged tree is: 8 text files of 15 MiB. The socket's
    // diff is refused past 32 MiB, and the daemon stops rendering there, so its memory
    // does not grow with the tree (before: the whole 120 MiB diff was built first).
    let (m, _dir, sock) = staged_live("stage-bigdiff", |_| {});
    let line = format!("{}\n", "x".repeat(1023));
    let text = line.repeat(15 * 1024);
    for i in 0..8 {
        fs::write(m.mnt(format!("big{i}.txt")), &text).unwrap();
    }
    let before = peak_rss(m.pid());
    let a = ctl(&sock, serde_json::json!({"cmd":"stage","op":"diff"}));
    let grew = peak_rss(m.pid()).saturating_sub(before);
    eprintln!(
        "daemon peak RSS growth for a refused 120 MiB diff: {} MiB",
        grew >> 20
    );
    assert_eq!(a["ok"], false, "{}", a.to_string().len());
    assert!(
        a["error"].as_str().unwrap_or("").contains("over 32 MiB"),
        "{a}"
    );
    assert!(grew < 100 << 20, "the daemon grew {} MiB", grew >> 20);
    // And it still answers.
    assert_eq!(ctl(&sock, serde_json::json!({"cmd":"status"}))["ok"], true);
}

#[test]
fn long_names_sharing_a_long_prefix_apply_together() {
    // An apply writes a batch's files beside their destinations under temporary names
    // before renaming any: two names alike in their first 200 bytes must not share one.
    let (mut m, dir) = staged("stage-long-names", WRITE, staged_sample);
    let stem = "n".repeat(210);
    let (a, b) = (format!("{stem}-a"), format!("{stem}-b"));
    fs::write(m.mnt(&a), b"first\n").unwrap();
    fs::write(m.mnt(&b), b"second\n").unwrap();
    fs::write(m.mnt("a.txt"), b"changed\n").unwrap();
    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    let out = stage(&["apply"], &dir);
    out.assert_ok("apply of two long names and a short one");
    assert_eq!(fs::read(m.host(&a)).unwrap(), b"first\n");
    assert_eq!(fs::read(m.host(&b)).unwrap(), b"second\n");
    let d = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(d.is_empty(), "SOURCE after apply:\n{d}");
    assert_eq!(stage(&["status"], &dir).stdout, "");
}

/// `stat -c '%F %t:%T %a'` of each path, one line each.
fn dev_stat(dir: &Path, paths: &str) -> String {
    sh_in(dir, &format!("stat -c '%n %F %t:%T %a' {paths}"))
        .assert_ok("stat")
        .stdout
        .clone()
}

#[test]
fn a_character_device_0_0_is_staged_reported_as_0_0_and_applied_as_one() {
    let b = Mount::builder("stage-cdev0").policy(&format!("{WRITE}allow_devices = true\n"));
    staged_sample(&b.host(""));
    let dir = stage_dir(&b);
    let sock = b.root().join("ctl.sock");
    let mut m = b
        .arg("--stage")
        .arg(&dir)
        .arg("--control")
        .arg(&sock)
        .start();
    let before = snapshot(&m.host(""));
    // mknod's own reply (the stat right after it), then lookup/getattr, then READDIRPLUS.
    let made = m.sh(
        "set -e; mknod -m 640 z c 0 0; stat -c '%t:%T %a' z; mknod sub/z2 c 0 0; \
                     mknod keep c 1 3; mknod rm0 c 0 0; rm rm0; mknod mv0 c 0 0; mv mv0 moved",
    );
    made.assert_ok("mknod c 0 0 through a staged mount");
    assert_eq!(made.stdout, "0:0 640\n", "the create reply");
    assert_eq!(
        dev_stat(&m.mnt(""), "z sub/z2 keep moved"),
        "z character special file 0:0 640\nsub/z2 character special file 0:0 644\n\
         keep character special file 1:3 644\nmoved character special file 0:0 644\n"
    );
    let ls = m.sh("ls -ln sub | grep z2").stdout;
    assert!(
        ls.starts_with("crw-r--r--") && ls.contains(" 0, 0 "),
        "readdirplus: {ls}"
    );
    // The reserved number itself cannot be made through the mount (nor can its label be
    // set or read: special files have no xattrs through the mount).
    let r = m.sh("mknod res c 0 262143");
    r.assert_fail("mknod of the stand-in's number");
    assert!(
        r.stderr.contains("Operation not permitted"),
        "EPERM: {}",
        r.stderr
    );
    assert!(!m.mnt("res").exists());
    assert_host_unchanged(&before, &m.host(""), "0/0 devices staged");
    // In DIR: a stand-in (major 0, minor 0x3ffff), labelled.
    let up = dev_stat(&dir.join("upper"), "z sub/z2");
    assert_eq!(
        up,
        "z character special file 0:3ffff 640\nsub/z2 character special file 0:3ffff 644\n"
    );
    let label = sh_in(
        &dir.join("upper"),
        "python3 -c \"import os; print(os.getxattr('z', 'trusted.fencefs.dev'))\"",
    );
    assert_eq!(label.stdout, "b'0:0'\n", "{}", label.stderr);
    let st = run_fencefs(
        ["stage".as_ref(), "status".as_ref(), sock.as_os_str()],
        LIMIT,
    );
    st.assert_ok("status");
    assert_eq!(st.stdout, "A keep\nA moved\nA sub/z2\nA z\n");
    // Apply: real 0/0 devices in SOURCE with the staged mode and owner; the merged view is
    // the same, and nothing is listed any more.
    let ap = run_fencefs(
        ["stage".as_ref(), "apply".as_ref(), sock.as_os_str()],
        LIMIT,
    );
    ap.assert_ok("apply");
    assert_eq!(
        dev_stat(&m.host(""), "z sub/z2 keep moved"),
        "z character special file 0:0 640\nsub/z2 character special file 0:0 644\n\
         keep character special file 1:3 644\nmoved character special file 0:0 644\n"
    );
    assert_eq!(
        dev_stat(&m.mnt(""), "z sub/z2 keep moved"),
        "z character special file 0:0 640\nsub/z2 character special file 0:0 644\n\
         keep character special file 1:3 644\nmoved character special file 0:0 644\n",
        "the merged view after apply"
    );
    assert!(!m.host("rm0").exists() && !m.host("mv0").exists());
    let st = run_fencefs(
        ["stage".as_ref(), "status".as_ref(), sock.as_os_str()],
        LIMIT,
    );
    assert_eq!(st.stdout, "", "nothing staged after apply");
    stop(&mut m);
    // After a restart on the same DIR the applied devices still show (their stand-ins
    // stay in DIR: SOURCE's 0/0 is a whiteout to overlayfs).
    let st = stage(&["status"], &dir);
    assert_eq!(st.stdout, "", "offline status after apply");
    // The offline oracle (a read-only `mount -t overlay` of DIR over SOURCE) shows the
    // stand-in's own number.
    let o = m.root().join("oracle");
    fs::create_dir_all(&o).unwrap();
    let opts = format!(
        "ro,lowerdir={}:{}",
        dir.join("upper").display(),
        m.host("").display()
    );
    let r = sh_in(
        m.root(),
        &format!(
            "mount -t overlay overlay -o {opts} {0} && stat -c '%t:%T' {0}/z; umount {0}",
            o.display()
        ),
    );
    assert_eq!(r.stdout, "0:3ffff\n", "{}", r.stderr);
}

/// A character device 0/0 the host holds, changed through a staged mount (`chmod`): its
/// copy-up is a stand-in, not a 0/0 device in DIR/upper — which is a whiteout, so `status`
/// listed the device deleted and `apply` would have deleted the host's device (before).
/// The mount shows it changed, `status` lists a metadata change, `apply` gives SOURCE's
/// device the new mode and keeps it 0/0.
#[test]
fn a_source_0_0_device_changed_through_the_mount_stays_a_device() {
    let b = Mount::builder("stage-cdev0-up").policy(&format!("{WRITE}allow_devices = true\n"));
    sh_in(
        &b.host(""),
        "mknod -m 644 dev c 0 0 && mknod -m 644 res c 0 262143 && touch -d '2020-01-01' dev res",
    )
    .assert_ok("the host's 0/0 device, and one of the stand-in's number");
    let (m, dir, sock) = start_staged_live(b);
    let before = snapshot(&m.host(""));
    m.sh("chmod 600 dev").assert_ok("chmod through the mount");
    assert_eq!(
        dev_stat(&m.mnt(""), "dev"),
        "dev character special file 0:0 600\n"
    );
    // The host's device of the stand-in's number is not copied up (it would read back
    // as 0/0): EPERM, nothing staged.
    let r = m.sh("chmod 600 res");
    r.assert_fail("chmod of the host's 0:0x3ffff device");
    assert!(r.stderr.contains("Operation not permitted"), "{}", r.stderr);
    assert!(fs::symlink_metadata(dir.join("upper/res")).is_err());
    assert_host_unchanged(&before, &m.host(""), "the chmod is staged");
    assert_eq!(
        dev_stat(&dir.join("upper"), "dev"),
        "dev character special file 0:3ffff 600\n",
        "a stand-in in DIR, not a whiteout"
    );
    let st = run_fencefs(
        ["stage".as_ref(), "status".as_ref(), sock.as_os_str()],
        LIMIT,
    );
    st.assert_ok("status");
    assert_eq!(st.stdout, "m dev\n");
    run_fencefs(
        ["stage".as_ref(), "apply".as_ref(), sock.as_os_str()],
        LIMIT,
    )
    .assert_ok("apply");
    assert_eq!(
        dev_stat(&m.host(""), "dev"),
        "dev character special file 0:0 600\n",
        "SOURCE's device kept, with the new mode"
    );
    assert_eq!(
        dev_stat(&m.mnt(""), "dev"),
        "dev character special file 0:0 600\n"
    );
}
