//! The finer grants through a real mount, as uid 1000: a `create`-only inbox, an
//! `append`-only log, `exec = false` (SPEC "Finer grants and program rules"). Every
//! refusal is checked for its exact errno, its audit line and the host staying untouched.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

const UID: u32 = 1000;

/// Runs each step (`op,arg,...`) in one python3 process and prints `ok` (or what the step
/// read) or the errno's name, one line per step. Flags: `r` O_RDONLY, `w` O_WRONLY, `a`
/// O_WRONLY|O_APPEND, `ra` O_RDWR|O_APPEND, `wt` O_WRONLY|O_TRUNC, `at`
/// O_WRONLY|O_APPEND|O_TRUNC, `c` O_WRONLY|O_CREAT|O_EXCL, `ca` O_WRONLY|O_CREAT|O_APPEND.
const STEPS_PY: &str = r#"
import errno, fcntl, os, sys
FL = {"r": os.O_RDONLY, "w": os.O_WRONLY, "a": os.O_WRONLY | os.O_APPEND,
      "ra": os.O_RDWR | os.O_APPEND, "wt": os.O_WRONLY | os.O_TRUNC,
      "at": os.O_WRONLY | os.O_APPEND | os.O_TRUNC, "c": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
      "ca": os.O_WRONLY | os.O_CREAT | os.O_APPEND}
held = {}
def step(op, a):
    if op == "write":            # write PATH FLAGS DATA
        fd = os.open(a[0], FL[a[1]], 0o644)
        try: os.write(fd, a[2].encode())
        finally: os.close(fd)
    elif op == "pwrite":         # pwrite PATH FLAGS DATA OFFSET
        fd = os.open(a[0], FL[a[1]], 0o644)
        try: os.pwrite(fd, a[2].encode(), int(a[3]))
        finally: os.close(fd)
    elif op == "unappend":       # open with O_APPEND, clear it with F_SETFL, write
        fd = os.open(a[0], FL["a"])
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, 0)
            os.write(fd, a[1].encode())
        finally: os.close(fd)
    elif op == "ftruncate_a":    # ftruncate through an append handle
        fd = os.open(a[0], FL["a"])
        try: os.ftruncate(fd, int(a[1]))
        finally: os.close(fd)
    elif op == "hold":           # hold NAME PATH FLAGS: keep a descriptor open
        held[a[0]] = os.open(a[1], FL[a[2]], 0o644)
    elif op == "hwrite":         # hwrite NAME DATA
        os.write(held[a[0]], a[1].encode())
    elif op == "htruncate":      # htruncate NAME LEN
        os.ftruncate(held[a[0]], int(a[1]))
    elif op == "hchmod":         # hchmod NAME OCTAL
        os.fchmod(held[a[0]], int(a[1], 8))
    elif op == "close":
        os.close(held.pop(a[0]))
    elif op == "truncate": os.truncate(a[0], int(a[1]))
    elif op == "unlink": os.unlink(a[0])
    elif op == "rename": os.rename(a[0], a[1])
    elif op == "noreplace":      # renameat2(RENAME_NOREPLACE) through the shell's mv -n is racy
        os.link(a[0], a[1])
    elif op == "chmod": os.chmod(a[0], int(a[1], 8))
    elif op == "utime": os.utime(a[0], (1, 1))
    elif op == "mkdir": os.mkdir(a[0])
    elif op == "symlink": os.symlink(a[0], a[1])
    elif op == "setxattr": os.setxattr(a[0], "user.k", b"v")
    elif op == "access_x": return "ok" if os.access(a[0], os.X_OK) else "no"
    elif op == "mode": return oct(os.stat(a[0]).st_mode & 0o7777)
    elif op == "exec":
        pid = os.fork()
        if pid == 0:
            try: os.execv(a[0], [a[0]])
            except OSError as e: os._exit(100 + e.errno)
        _, st = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(st)
        return "ok" if code == 0 else errno.errorcode.get(code - 100, str(code))
    else: raise SystemExit("unknown step " + op)
    return "ok"
for s in sys.argv[1:]:
    op, *a = s.split(",")
    try: print(step(op, a))
    except OSError as e: print(errno.errorcode.get(e.errno, str(e.errno)))
    sys.stdout.flush()
"#;

/// Runs `steps` as uid 1000 in the mount; returns one answer per step.
fn steps(m: &Mount, steps: &[&str]) -> Vec<String> {
    let script = m.outside().join("steps.py");
    if !script.exists() {
        put(&script, STEPS_PY.as_bytes(), 0o644);
    }
    let args: Vec<String> = steps.iter().map(|s| format!("'{s}'")).collect();
    let o = m.sh_as(
        UID,
        &format!("/usr/bin/python3 {} {}", script.display(), args.join(" ")),
    );
    o.assert_ok("steps.py");
    assert!(o.stderr.is_empty(), "steps.py: {}", o.stderr);
    let out: Vec<String> = o.stdout.lines().map(str::to_string).collect();
    assert_eq!(out.len(), steps.len(), "one answer per step: {out:?}");
    out
}

/// Asserts each step's answer: `(step, expected)`.
#[track_caller]
fn expect(m: &Mount, cases: &[(&str, &str)]) {
    let list: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let got = steps(m, &list);
    for ((step, want), got) in cases.iter().zip(&got) {
        assert_eq!(got, want, "step {step}");
    }
}

fn chown_r(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
    if fs::symlink_metadata(p).unwrap().is_dir() {
        for e in fs::read_dir(p).unwrap() {
            chown_r(&e.unwrap().path(), uid);
        }
    }
}

fn audit_has(audit: &Path, op: &str, path: &str, errno: &str) -> bool {
    eventually(Duration::from_secs(5), || {
        fs::read_to_string(audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|v| v["op"] == op && v["path"] == path && v["errno"] == errno)
    })
}

const INBOX_POLICY: &str = r#"
mode = "danger"
default = "read"

[[rule]]
path = "inbox"
access = "create"

[[rule]]
path = "logs"
access = "append"
"#;

#[test]
fn create_only_inbox_adds_files_and_changes_nothing_that_existed() {
    let b = Mount::builder("grants-inbox").policy(INBOX_POLICY);
    put(&b.host("inbox/old.txt"), b"old\n", 0o644);
    mkdirp(&b.host("inbox/olddir"));
    chown_r(&b.host(""), UID);
    let audit = b.root().join("audit.jsonl");
    let m = b.arg("--allow-other").arg("--audit").arg(&audit).start();
    let before = snapshot(&m.host("inbox"));

    // Everything that would change an existing entry: EACCES.
    expect(
        &m,
        &[
            ("write,inbox/old.txt,w,X", "EACCES"),
            ("write,inbox/old.txt,wt,X", "EACCES"),
            ("write,inbox/old.txt,a,X", "EACCES"),
            ("truncate,inbox/old.txt,0", "EACCES"),
            ("unlink,inbox/old.txt", "EACCES"),
            ("rename,inbox/old.txt,inbox/moved.txt", "EACCES"),
            ("chmod,inbox/old.txt,600", "EACCES"),
            ("utime,inbox/old.txt", "EACCES"),
            ("setxattr,inbox/old.txt", "EACCES"),
            ("rename,inbox/olddir,inbox/d2", "EACCES"),
        ],
    );
    assert_eq!(snapshot(&m.host("inbox")), before, "host unchanged");
    assert!(audit_has(&audit, "open", "inbox/old.txt", "EACCES"));
    assert!(audit_has(&audit, "unlink", "inbox/old.txt", "EACCES"));

    // A new file: made, written, truncated, chmod-ed through its creating handle (and a
    // second handle while that one is open); once closed it is pre-existing.
    expect(
        &m,
        &[
            ("hold,f,inbox/new.txt,c", "ok"),
            ("hwrite,f,hello world\n", "ok"),
            ("htruncate,f,6", "ok"),
            ("hchmod,f,640", "ok"),
            ("write,inbox/new.txt,a,more", "ok"),
            ("close,f", "ok"),
            ("write,inbox/new.txt,a,again", "EACCES"),
            ("write,inbox/new.txt,wt,over", "EACCES"),
            ("unlink,inbox/new.txt", "EACCES"),
            ("write,inbox/new.txt,c,dup", "EEXIST"),
            ("mkdir,inbox/sub", "ok"),
            ("write,inbox/sub/deep.txt,c,deep", "ok"),
            ("symlink,new.txt,inbox/ln", "ok"),
            ("write,elsewhere.txt,c,x", "EACCES"),
        ],
    );
    assert_eq!(fs::read(m.host("inbox/new.txt")).unwrap(), b"hello more");
    let md = fs::metadata(m.host("inbox/new.txt")).unwrap();
    assert_eq!((md.mode() & 0o777, md.uid()), (0o640, UID));
    assert_eq!(fs::read(m.host("inbox/sub/deep.txt")).unwrap(), b"deep");
    assert_eq!(fs::read(m.host("inbox/old.txt")).unwrap(), b"old\n");
    assert!(!m.host("elsewhere.txt").exists());

    // The shell: `>` makes a new file; `>` over an existing one and `rm` are refused.
    m.sh_as(UID, "echo drop > inbox/drop.txt")
        .assert_ok("echo > new file");
    assert_eq!(fs::read(m.host("inbox/drop.txt")).unwrap(), b"drop\n");
    m.sh_as(UID, "echo again > inbox/drop.txt")
        .assert_fail("echo > existing");
    m.sh_as(UID, "rm -f inbox/drop.txt")
        .assert_fail("rm existing");
    assert_eq!(fs::read(m.host("inbox/drop.txt")).unwrap(), b"drop\n");

    // A rename from a writable place into the inbox is a create there: a new name is
    // fine, an existing one is never replaced.
    drop(m);
    let b = Mount::builder("grants-inbox-mv").policy(&format!(
        "{INBOX_POLICY}\n[[rule]]\npath = \"out\"\naccess = \"write\"\n"
    ));
    put(&b.host("inbox/taken"), b"taken\n", 0o644);
    put(&b.host("out/a"), b"a\n", 0o644);
    put(&b.host("out/b"), b"b\n", 0o644);
    chown_r(&b.host(""), UID);
    let m = b.arg("--allow-other").start();
    expect(
        &m,
        &[
            ("rename,out/a,inbox/a", "ok"),
            ("rename,out/b,inbox/taken", "EACCES"),
        ],
    );
    assert_eq!(fs::read(m.host("inbox/a")).unwrap(), b"a\n");
    assert_eq!(fs::read(m.host("inbox/taken")).unwrap(), b"taken\n");
    assert_eq!(fs::read(m.host("out/b")).unwrap(), b"b\n");
}

#[test]
fn append_only_log_takes_appends_and_nothing_else() {
    let b = Mount::builder("grants-append").policy(INBOX_POLICY);
    put(&b.host("logs/app.log"), b"line1\n", 0o644);
    chown_r(&b.host(""), UID);
    let audit = b.root().join("audit.jsonl");
    let m = b.arg("--allow-other").arg("--audit").arg(&audit).start();

    m.sh_as(UID, "echo line2 >> logs/app.log")
        .assert_ok(">> appends");
    expect(
        &m,
        &[
            ("write,logs/app.log,a,line3\n", "ok"),
            // pwrite through an O_APPEND descriptor appends (Linux ignores the offset).
            ("pwrite,logs/app.log,ra,line4\n,0", "ok"),
            ("write,logs/app.log,w,X", "EACCES"),
            ("pwrite,logs/app.log,w,X,0", "EACCES"),
            ("write,logs/app.log,wt,X", "EACCES"),
            ("write,logs/app.log,at,X", "EACCES"),
            ("unappend,logs/app.log,OVER", "EACCES"),
            ("ftruncate_a,logs/app.log,0", "EACCES"),
            ("truncate,logs/app.log,0", "EACCES"),
            ("unlink,logs/app.log", "EACCES"),
            ("rename,logs/app.log,logs/x.log", "EACCES"),
            ("chmod,logs/app.log,600", "EACCES"),
            ("write,logs/new.log,ca,X", "EACCES"),
        ],
    );
    m.sh_as(UID, "echo over > logs/app.log")
        .assert_fail("> truncates");
    assert_eq!(
        fs::read_to_string(m.host("logs/app.log")).unwrap(),
        "line1\nline2\nline3\nline4\n"
    );
    assert_eq!(
        fs::metadata(m.host("logs/app.log")).unwrap().mode() & 0o777,
        0o644
    );
    assert!(!m.host("logs/x.log").exists() && !m.host("logs/new.log").exists());
    assert!(audit_has(&audit, "write", "logs/app.log", "EACCES"));
    assert!(audit_has(&audit, "open", "logs/app.log", "EACCES"));
    // A shared writable map of an append-only file does not exist (direct I/O).
    let o = m.sh_as(
        UID,
        "/usr/bin/python3 -c \"import mmap,os;fd=os.open('logs/app.log',os.O_RDWR|os.O_APPEND);mmap.mmap(fd,4)\"",
    );
    assert!(!o.ok(), "shared map of an append-only file: {o:?}");
    assert_eq!(
        fs::read_to_string(m.host("logs/app.log")).unwrap(),
        "line1\nline2\nline3\nline4\n"
    );
}

const NOEXEC_POLICY: &str = r#"
mode = "danger"
default = "write"

[[rule]]
path = "downloads"
access = "write"
exec = false
"#;

#[test]
fn no_exec_refuses_execve_masks_the_bits_and_lets_sh_read_scripts() {
    let b = Mount::builder("grants-noexec").policy(NOEXEC_POLICY);
    let true_bin = fs::read("/bin/true").unwrap();
    put(&b.host("downloads/true"), &true_bin, 0o755);
    put(
        &b.host("downloads/script.sh"),
        b"#!/bin/sh\necho ran\n",
        0o755,
    );
    put(&b.host("bin/true"), &true_bin, 0o755);
    chown_r(&b.host(""), UID);
    let audit = b.root().join("audit.jsonl");
    let m = b.arg("--allow-other").arg("--audit").arg(&audit).start();

    expect(
        &m,
        &[
            ("exec,downloads/true", "EACCES"),
            ("exec,downloads/script.sh", "EACCES"),
            ("exec,bin/true", "ok"),
            ("mode,downloads/true", "0o644"),
            ("mode,bin/true", "0o755"),
            ("access_x,downloads/true", "no"),
            ("access_x,bin/true", "ok"),
            // chmod +x goes to the host; the mount still shows no execute bit.
            ("chmod,downloads/script.sh,775", "ok"),
            ("mode,downloads/script.sh", "0o664"),
        ],
    );
    let o = m.sh_as(UID, "sh downloads/script.sh");
    o.assert_ok("sh script.sh");
    assert_eq!(o.stdout, "ran\n");
    // The documented limit (policy.md, `exec = false`): the dynamic loader opens the
    // binary for a plain read, as `cat` does, and maps it executable in the caller's
    // kernel, so run through it the fenced binary runs.
    #[cfg(target_arch = "x86_64")]
    m.sh_as(UID, "/lib64/ld-linux-x86-64.so.2 downloads/true")
        .assert_ok("ld.so runs a fenced binary (a stated limit)");
    assert_eq!(
        fs::metadata(m.host("downloads/true")).unwrap().mode() & 0o777,
        0o755,
        "host mode unchanged"
    );
    assert_eq!(
        fs::metadata(m.host("downloads/script.sh")).unwrap().mode() & 0o777,
        0o775
    );
    // A file made there through the mount is fenced too.
    m.sh_as(
        UID,
        "cp bin/true downloads/copied && chmod +x downloads/copied",
    )
    .assert_ok("cp + chmod +x");
    assert_eq!(steps(&m, &["exec,downloads/copied"]), ["EACCES"]);
    assert_eq!(
        fs::metadata(m.host("downloads/copied"))
            .unwrap()
            .permissions()
            .mode()
            & 0o111,
        0o111
    );
    // Kernel cache: after the fence is lifted by a reload, the bits show and exec works.
    m.reload_with("mode = \"danger\"\ndefault = \"write\"\n");
    assert!(
        eventually(Duration::from_secs(5), || {
            steps(&m, &["exec,downloads/true"]) == ["ok"]
        }),
        "exec after the reload"
    );
    // And back: the reload that fences again takes the kernel's cached attributes back.
    m.sh_as(UID, "ls -l downloads/true")
        .assert_ok("cache the attributes");
    m.reload_with(NOEXEC_POLICY);
    assert!(
        eventually(Duration::from_secs(5), || {
            steps(&m, &["exec,downloads/true", "mode,downloads/true"]) == ["EACCES", "0o644"]
        }),
        "exec refused again after the reload"
    );
    assert!(audit.exists());
}

/// Only git (its own binary and its helpers, wherever this system installed them)
/// writes `.git`; the rest of the workspace is writable by everyone.
fn git_policy() -> String {
    let git = fs::canonicalize(
        String::from_utf8(
            std::process::Command::new("sh")
                .args(["-c", "command -v git"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap()
        .trim(),
    )
    .unwrap();
    let exec_path = String::from_utf8(
        std::process::Command::new("git")
            .arg("--exec-path")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    format!(
        "mode = \"danger\"\ndefault = \"write\"\n\n\
         [[rule]]\npath = \".git\"\naccess = \"read\"\n\n\
         [[rule]]\npath = \".git\"\naccess = \"write\"\nexe = [\"{g}\", \"{x}/*\"]\n\n\
         [[rule]]\npath = \"out\"\naccess = \"read\"\n\n\
         [[rule]]\npath = \"out\"\naccess = \"write\"\nancestor_exe = [\"{g}\"]\n",
        g = git.display(),
        x = exec_path.trim()
    )
}

const GIT: &str = "git -c user.name=t -c user.email=t@t.invalid -c init.defaultBranch=main -c commit.gpgsign=false";

#[test]
fn only_git_writes_dot_git_inside_a_container() {
    let b = Mount::builder("grants-git").policy(&git_policy());
    put(&b.host("a.txt"), b"a\n", 0o644);
    chown_r(&b.host(""), UID);
    let audit = b.root().join("audit.jsonl");
    let m = b.arg("--allow-other").arg("--audit").arg(&audit).start();

    in_bwrap(
        &m,
        &format!("{GIT} init -q && {GIT} add a.txt && {GIT} commit -qm one && {GIT} log --oneline"),
    )
    .assert_ok("git init/add/commit");
    assert!(m.host(".git/HEAD").exists());
    let before = snapshot(&m.host(".git"));

    // The agent's shell, and programs pretending to be git, cannot.
    let o = in_bwrap(
        &m,
        "for c in 'echo x > .git/evil' 'echo x >> .git/HEAD' 'rm .git/HEAD' \
                  'cp /bin/sh /tmp/git && /tmp/git -c \"echo x > .git/evil2\"' \
                  'ln -s /bin/sh /tmp/git2 && /tmp/git2 -c \"echo x > .git/evil3\"'; do \
             sh -c \"$c\" 2>/dev/null && echo ok || echo refused; done",
    );
    o.assert_ok("attempts ran");
    assert_eq!(
        o.stdout, "refused\nrefused\nrefused\nrefused\nrefused\n",
        "{o:?}"
    );
    assert_eq!(snapshot(&m.host(".git")), before, "host .git unchanged");
    assert!(audit_has(&audit, "create", ".git/evil", "EACCES"));
    // The rest of the workspace stays writable for everyone.
    in_bwrap(
        &m,
        &format!("echo b > b.txt && {GIT} status --short >/dev/null"),
    )
    .assert_ok("write outside .git");
    in_bwrap(&m, &format!("{GIT} add b.txt && {GIT} commit -qm two")).assert_ok("git commit again");

    // ancestor_exe: a shell git starts (an alias, a hook) may write out/; the same shell
    // started by anything else may not.
    mkdirp(&m.host("out"));
    chown_r(&m.host("out"), UID);
    in_bwrap(
        &m,
        &format!("{GIT} -c 'alias.w=!sh -c \"echo from-git > out/f\"' w"),
    )
    .assert_ok("a shell under git writes out/");
    assert_eq!(fs::read(m.host("out/f")).unwrap(), b"from-git\n");
    let o = in_bwrap(&m, "sh -c 'echo x > out/g'");
    assert!(!o.ok() && o.stderr.contains("Permission denied"), "{o:?}");
    assert!(!m.host("out/g").exists());
}

#[test]
fn ask_append_above_read_lifts_an_append_and_never_a_truncation() {
    let policy = "mode = \"danger\"\ndefault = \"read\"\n\n\
                  [[rule]]\npath = \"logs\"\naccess = \"read\"\nask = \"append\"\n";
    let b = Mount::builder("grants-ask-append").policy(policy);
    put(&b.host("logs/app.log"), b"one\n", 0o644);
    chown_r(&b.host(""), UID);
    let sock = b.root().join("ctl.sock");
    let m = b.arg("--allow-other").arg("--control").arg(&sock).start();
    let mut approver = std::process::Command::new(BIN)
        .arg("approve")
        .arg(&sock)
        .args(["--auto", "allow"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (mut peer, _) = Peer::connect_hello(&sock);
    assert!(
        eventually(Duration::from_secs(5), || {
            peer.call(serde_json::json!({"cmd": "status"}))["approvers"] == 1
        }),
        "the approver connected"
    );
    // An append is asked and allowed; the handle it gets is append-only.
    expect(
        &m,
        &[
            ("write,logs/app.log,a,two\n", "ok"),
            ("unappend,logs/app.log,X", "EACCES"),
            // Not what `ask = "append"` can lift: refused at once, never asked.
            ("write,logs/app.log,wt,X", "EACCES"),
            ("truncate,logs/app.log,0", "EACCES"),
        ],
    );
    approver.kill().unwrap();
    let _ = approver.wait();
    assert_eq!(fs::read(m.host("logs/app.log")).unwrap(), b"one\ntwo\n");
}
