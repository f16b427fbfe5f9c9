//! `fencefs run`: the real binary run as uid 1000 with no capabilities (setpriv), in a
//! private mount namespace of the test's own (`unshare -m`) where /dev/fuse is a 0666 node
//! bound over the host's (which is 0600 on the test machines; nothing of the host's /dev
//! changes). What COMMAND sees, what the host gets, exit statuses, SIGKILL, and the
//! one-line refusals when a prerequisite is missing. As root: the staged default.
//!
//! Every process here is ours and signalled by pid; the fences live in the run's private
//! namespace, so nothing can stay mounted (the SIGKILL test proves it for the worst case).

mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::run::*;
use common::*;

#[test]
fn live_reads_writes_and_refuses_as_an_ordinary_user() {
    let f = Fixture::new("run-live");
    let env_before = snapshot(&f.ws().join(".env"));
    let git_before = snapshot(&f.ws().join(".git"));
    let o = f.run(
        &["--live", "--home", "keep"],
        "exec 2>&1; id -u; pwd; cat a.txt; echo new > b.txt; echo more >> a.txt; \
         cat .env 2>&1; echo x > .env 2>&1; echo x >> .git/config 2>&1; \
         awk -v h=\"$HOME\" '$5 == ENVIRON[\"PWD\"] || $5 == h {print $5, $(NF-2)}' /proc/self/mountinfo",
    );
    o.assert_ok("fencefs run");
    let ws = f.ws();
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines[0], "1000", "COMMAND runs as the caller: {}", o.stdout);
    assert_eq!(lines[1], ws.to_str().unwrap(), "cwd preserved");
    assert_eq!(lines[2], "hello");
    assert!(
        o.stdout.contains("cat: .env: No such file or directory"),
        "a hidden .env answers ENOENT: {}",
        o.stdout
    );
    assert!(
        o.stdout.contains(".env: Permission denied"),
        "creating over the hidden .env: EACCES: {}",
        o.stdout
    );
    assert!(
        o.stdout.contains(".git/config: Read-only file system"),
        "agent-config's .git/config refuses writes with EROFS: {}",
        o.stdout
    );
    let fence = format!("{} fuse.fencefs", ws.display());
    assert_eq!(
        lines.last(),
        Some(&fence.as_str()),
        "one fence, home kept: {}",
        o.stdout
    );
    // The host: the writes landed, the refused ones did not.
    assert_eq!(fs::read(ws.join("b.txt")).unwrap(), b"new\n");
    assert_eq!(fs::read(ws.join("a.txt")).unwrap(), b"hello\nmore\n");
    assert_host_unchanged(&env_before, &ws.join(".env"), ".env");
    assert_host_unchanged(&git_before, &ws.join(".git"), ".git");
    let up: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(up.len(), 1, "one line on stderr: {}", o.stderr);
    assert!(up[0].starts_with(&format!("fencefs: fenced {} (", ws.display())));
    assert!(!is_mounted(&ws), "nothing mounted on the host");
}

#[test]
fn home_is_fenced_and_a_workspace_inside_it_keeps_its_policy() {
    let f = Fixture::new("run-home");
    // A second workspace inside HOME: served by the workspace policy, not `home`.
    let proj = f.home().join("proj");
    put(&proj.join("code.rs"), b"fn main() {}\n", 0o644);
    put(&proj.join(".env"), b"X=1\n", 0o600);
    chown_tree(&proj, AGENT);
    let home_before = snapshot(&f.home());
    let script = "exec 2>&1; ls ~/.ssh; cat ~/.ssh/id_ed25519 2>&1; echo c > ~/.cache/c && echo cache-ok; \
                  echo x >> ~/.bashrc 2>&1; cat ~/.bashrc; echo y > code2.rs && echo ws-ok; \
                  cat .env; echo z > ~/new; true";
    let o = run_bounded(
        f.cmd(
            &proj,
            &["--live", "--workspace", proj.to_str().unwrap()],
            script,
        ),
        LIMIT,
        "fencefs run in HOME",
    );
    o.assert_ok("fencefs run");
    let h = f.home();
    for want in [
        format!(
            "ls: cannot access '{}/.ssh': No such file or directory",
            h.display()
        ),
        format!(
            "cat: {}/.ssh/id_ed25519: No such file or directory",
            h.display()
        ),
        "cache-ok".into(),
        format!("{}/.bashrc: Permission denied", h.display()),
        "# rc".into(),
        "ws-ok".into(),
        "cat: .env: No such file or directory".into(),
        format!("{}/new: Permission denied", h.display()),
    ] {
        assert!(
            o.stdout.contains(&want),
            "missing {want:?} in:\n{}",
            o.stdout
        );
    }
    assert!(o.stderr.contains("fenced (preset home)"), "{}", o.stderr);
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    // The host: the cache and the workspace got their files; nothing else changed.
    assert_eq!(fs::read(h.join(".cache/c")).unwrap(), b"c\n");
    assert_eq!(fs::read(proj.join("code2.rs")).unwrap(), b"y\n");
    fs::remove_file(h.join(".cache/c")).unwrap();
    fs::remove_file(proj.join("code2.rs")).unwrap();
    let after = snapshot(&h);
    let d = snapshot_diff(&home_before, &after);
    // Directories' mtimes moved with the removals above; entries must be the same.
    let names = |s: &Snapshot| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&home_before), names(&after), "{d}");
}

#[test]
fn exit_status_and_signals_pass_through() {
    let f = Fixture::new("run-status");
    let o = f.run(&["--live", "--home", "keep"], "exit 7");
    assert_eq!(o.status.code(), Some(7), "{}", o.stderr);
    let o = f.run(&["--live", "--home", "keep"], "kill -TERM $$");
    assert_eq!(o.status.code(), Some(128 + 15), "{} {}", o.stderr, o.stdout);
    let o = f.run(&["--live", "--home", "keep", "--", "/nonexistent/cmd"], "");
    assert_eq!(o.status.code(), Some(127), "{}", o.stderr);
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// The live processes (host pids) whose command line is exactly `argv`.
fn running(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == want) && alive(p))
        .collect()
}

#[test]
fn what_command_leaves_running_ends_with_it() {
    let f = Fixture::new("run-orphans");
    // A background job and a double-forked, setsid one (reparented to COMMAND's init);
    // their pids inside are the PID namespace's, so they are found by command line.
    let o = f.run(
        &["--live", "--home", "keep"],
        "sleep 60.0123 & echo $!; (setsid sleep 61.0456 & echo $!); echo done",
    );
    o.assert_ok("fencefs run");
    let pids: Vec<i32> = o.stdout.lines().filter_map(|l| l.parse().ok()).collect();
    assert_eq!(pids.len(), 2, "{}", o.stdout);
    for argv in [["sleep", "60.0123"], ["sleep", "61.0456"]] {
        assert_eq!(
            running(&argv),
            Vec::<i32>::new(),
            "{argv:?} outlived the run"
        );
    }
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
}

#[test]
fn sigkill_of_run_leaves_no_mount_and_no_process() {
    let f = Fixture::new("run-kill");
    let mut c = f.cmd(&f.ws(), &["--live"], "echo $$; exec sleep 60.0789");
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn fencefs run");
    let run_pid = child.id() as i32;
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // COMMAND is pid 2 of its PID namespace, under its init (pid 1).
    assert_eq!(line.trim(), "2", "COMMAND's pid in its namespace");
    // fencefs run is the process we spawned (unshare, sh and setpriv exec into it); its
    // children are the daemons and COMMAND's init, whose child is COMMAND.
    let children = |p: i32| -> Vec<i32> {
        fs::read_to_string(format!("/proc/{p}/task/{p}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect()
    };
    let mut kids = children(run_pid);
    assert_eq!(
        kids.len(),
        3,
        "two daemons (workspace, home) and COMMAND's init: {kids:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || running(&["sleep", "60.0789"])
            .len()
            == 1),
        "COMMAND never ran"
    );
    let cmd = running(&["sleep", "60.0789"]);
    let init = *kids
        .iter()
        .find(|&&k| children(k) == cmd)
        .expect("COMMAND's parent is one of fencefs run's children");
    assert_eq!(
        fs::read_to_string(format!("/proc/{init}/comm")).unwrap(),
        "fencefs-init\n"
    );
    kids.extend(cmd);
    assert!(kids.iter().all(|&p| alive(p)));
    // SAFETY: kill(2) on our own child, by pid.
    assert_eq!(unsafe { libc::kill(run_pid, libc::SIGKILL) }, 0);
    let st = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(9));
    assert!(
        eventually(Duration::from_secs(5), || kids.iter().all(|&p| !alive(p))),
        "still alive after fencefs run was killed: {:?}",
        kids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
    );
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    for dir in [f.ws(), f.home()] {
        assert!(
            !info.contains(&format!(" {} ", dir.display())),
            "{} appears in the host's mountinfo",
            dir.display()
        );
    }
}

#[test]
fn missing_prerequisites_are_one_line_and_exit_1() {
    let f = Fixture::new("run-prereq");
    // A workspace that does not exist.
    let o = f.run(&["--live", "--workspace", "/nonexistent/ws"], "true");
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        o.stderr,
        "fencefs: workspace '/nonexistent/ws': No such file or directory (os error 2)\n"
    );
    // The host's /dev/fuse (0600 root) as uid 1000.
    let o = run_bounded(
        {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=1000", "--regid=1000", "--clear-groups", BIN])
                .args(["run", "--live", "--home", "keep", "--", "true"])
                .current_dir(f.ws())
                .env("XDG_RUNTIME_DIR", f.w.root.join("run"));
            c
        },
        LIMIT,
        "fencefs run without /dev/fuse",
    );
    if fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o006 != 0o006 {
        assert_eq!(o.status.code(), Some(1));
        assert!(
            o.stderr
                .starts_with("fencefs: /dev/fuse: Permission denied"),
            "{}",
            o.stderr
        );
        assert!(o.stderr.contains("chmod 0666 /dev/fuse"));
        assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    }
    // User namespaces used up: a user namespace (root mapped) allowing one more, in which
    // uid 1000 (mapped to root: /dev/fuse opens) runs fencefs run, whose own is refused.
    let o = run_bounded(
        {
            let mut c = Command::new("unshare");
            c.args(["-Ur", "sh", "-c"])
                .arg(
                    "echo 1 > /proc/sys/user/max_user_namespaces && \
                     exec unshare -U --map-user=1000 --map-group=1000 \"$BIN\" run --live --home keep -- true",
                )
                .current_dir(f.ws())
                .env("BIN", BIN)
                // Root's (uid 1000 is root outside): the one above is the real 1000's.
                .env("XDG_RUNTIME_DIR", f.w.root.join("dev"));
            c
        },
        LIMIT,
        "fencefs run without user namespaces",
    );
    assert_eq!(o.status.code(), Some(1), "{}", o.stderr);
    assert_eq!(
        o.stderr,
        "fencefs: cannot make a private user namespace: No space left on device (os error 28): \
         user namespaces are off or used up: sysctl -w user.max_user_namespaces=15000\n"
    );
    // An invalid policy: the daemon's one line, COMMAND never runs.
    let bad = f.w.root.join("outside/bad.toml");
    put(&bad, b"mode = \"bogus\"\n", 0o644);
    let o = f.run(&["--live", "--policy", bad.to_str().unwrap()], "echo ran");
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(o.stdout, "");
    assert_eq!(
        o.stderr,
        format!(
            "fencefs: invalid policy: {}:1:8: unknown mode \"bogus\" \
             (expected read-only, workspace-write or danger)\n",
            bad.display()
        )
    );
}

/// The staging area of a run of `f` (under its HOME's `.local/state/fencefs`).
fn stage_of(f: &Fixture) -> std::path::PathBuf {
    let state = f.home().join(".local/state/fencefs");
    fs::read_dir(&state)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("stage")
}

#[test]
fn staged_by_default_as_an_ordinary_user() {
    let f = Fixture::new("run-staged-user");
    put(&f.ws().join("notes.txt"), b"n\n", 0o644);
    put(&f.ws().join("dir1/f"), b"f\n", 0o644);
    chown_tree(&f.ws(), AGENT);
    let before = snapshot(&f.ws());
    let o = f.run(
        &[],
        "set -e; echo one > s.txt; echo more >> a.txt; mkdir d; echo x > d/x; \
         mv d d2; rm notes.txt; mv dir1 dir2; cat a.txt d2/x",
    );
    o.assert_ok("an ordinary user's staged run");
    assert_eq!(o.stdout, "hello\nmore\nx\n");
    assert_host_unchanged(&before, &f.ws(), "an ordinary user's staged run");
    // No root anywhere: the markers are the unprivileged ones, and the stage reads them.
    let stage = stage_of(&f);
    let st = run_fencefs(["stage", "status", "--dir", stage.to_str().unwrap()], LIMIT);
    assert_eq!(
        st.stdout, "M a.txt\nA d2/ (1 entry)\nR dir1/ -> dir2/\nD notes.txt\nA s.txt\n",
        "{}",
        st.stderr
    );
    // The next run continues them: what the first one deleted stays deleted.
    let o = f.run(&[], "cat s.txt; ls -A | grep -c notes || true");
    o.assert_ok("second run");
    assert_eq!(o.stdout, "one\n0\n");
    assert_host_unchanged(&before, &f.ws(), "a second staged run");
    // The user applies them, without root.
    let a = sh_as(
        1000,
        &f.ws(),
        &format!("{BIN} stage apply --dir {}", stage.display()),
    );
    a.assert_ok("apply as uid 1000");
    assert_eq!(fs::read(f.ws().join("dir2/f")).unwrap(), b"f\n");
    assert_eq!(fs::read(f.ws().join("d2/x")).unwrap(), b"x\n");
    assert_eq!(fs::read(f.ws().join("a.txt")).unwrap(), b"hello\nmore\n");
    assert!(!f.ws().join("dir1").exists() && !f.ws().join("notes.txt").exists());
}

/// `fencefs run` as root (the test's own uid); HOME the fake one, XDG_STATE_HOME unset.
fn root_run(f: &Fixture, args: &[&str], script: &str) -> Out {
    let mut c = Command::new(BIN);
    c.arg("run")
        .args(args)
        .args(["--", "sh", "-c", script])
        .current_dir(f.ws())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C")
        .env("HOME", f.home())
        // Root's own: uid 1000's run/ is refused to root (not its directory).
        .env("XDG_RUNTIME_DIR", f.w.root.join("run-root"));
    run_bounded(c, LIMIT, "fencefs run as root")
}

#[test]
fn staged_by_default_as_root_and_continued_by_the_next_run() {
    let f = Fixture::new("run-staged");
    let before = snapshot(&f.ws());
    let o = root_run(
        &f,
        &[],
        "exec 2>&1; echo one > s.txt; echo more >> a.txt; cat .env; \
                               ls -A ~/.local/state | wc -l",
    );
    o.assert_ok("first run");
    assert_eq!(
        o.stdout, "cat: .env: No such file or directory\n0\n",
        "the staging area is out of reach"
    );
    assert_host_unchanged(&before, &f.ws(), "a staged run");
    // The default: under $HOME, which is fenced too (the daemon still reaches it).
    let stage = f.home().join(".local/state/fencefs");
    let stage = fs::read_dir(&stage)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("stage");
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{}", o.stderr);
    assert!(
        lines[0].contains(&format!("; staged in {}", stage.display())),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("fencefs: changes kept staged in "),
        "without a terminal: {}",
        lines[1]
    );
    // The next run sees the staged changes, and says it continues them.
    let o = root_run(&f, &[], "cat s.txt a.txt; echo two > t.txt");
    o.assert_ok("second run");
    assert_eq!(o.stdout, "one\nhello\nmore\n");
    assert!(
        o.stderr.contains("continuing an earlier run's changes"),
        "{}",
        o.stderr
    );
    assert_host_unchanged(&before, &f.ws(), "a second staged run");
    let st = run_fencefs(["stage", "status", "--dir", stage.to_str().unwrap()], LIMIT);
    assert_eq!(st.stdout, "M a.txt\nA s.txt\nA t.txt\n", "{}", st.stderr);
}

#[test]
fn a_held_request_says_how_to_approve_times_out_or_is_approved() {
    let f = Fixture::new("run-ask");
    put(
        &f.ws().join(".fencefs.toml"),
        b"[[rule]]\npath = \"docs\"\naccess = \"read\"\nask = \"write\"\n",
        0o644,
    );
    put(&f.ws().join("docs/x.md"), b"x\n", 0o644);
    chown_tree(&f.ws(), AGENT);
    let before = snapshot(&f.ws().join("docs"));
    let o = f.run(
        &["--live", "--home", "keep", "--ask-timeout", "1"],
        "exec 2>&1; echo y >> docs/x.md; cat docs/x.md",
    );
    o.assert_ok("fencefs run");
    assert!(
        o.stdout.contains("docs/x.md: Permission denied"),
        "timed out: EACCES: {}",
        o.stdout
    );
    let lines: Vec<&str> = o.stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 2, "{}", o.stderr);
    let sock = lines[0].rsplit("control socket ").next().unwrap();
    assert_eq!(
        lines[1].trim_end_matches('\r'),
        format!(
            "fencefs: a request waits for your approval: run `fencefs approve {sock}` in another terminal"
        )
    );
    assert_host_unchanged(&before, &f.ws().join("docs"), "a held write that timed out");

    // With --ask-exec the request waits too, the program is told, nothing is printed.
    let asks = f.w.root.join("outside/asks");
    mkdirp(&asks);
    chown_tree(&asks, AGENT);
    let notify = f.w.root.join("outside/notify.sh");
    put(
        &notify,
        format!("#!/bin/sh\ncat >> {}/events.jsonl\n", asks.display()).as_bytes(),
        0o755,
    );
    let o = f.run(
        &[
            "--live",
            "--home",
            "keep",
            "--ask-timeout",
            "1",
            "--ask-exec",
            notify.to_str().unwrap(),
        ],
        "exec 2>&1; echo y >> docs/x.md; true",
    );
    o.assert_ok("fencefs run --ask-exec");
    assert!(
        o.stdout.contains("docs/x.md: Permission denied"),
        "{}",
        o.stdout
    );
    assert_eq!(
        o.stderr.lines().count(),
        1,
        "only the fence line: {}",
        o.stderr
    );
    let events = fs::read_to_string(asks.join("events.jsonl")).unwrap_or_default();
    assert!(
        events.contains("docs/x.md"),
        "--ask-exec was not told: {events:?}"
    );

    // Answered from another terminal (the host, as uid 1000): the write goes through.
    let mut c = f.cmd(
        &f.ws(),
        &["--live", "--home", "keep"],
        "echo y >> docs/x.md && echo approved",
    );
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut run = c.spawn().expect("spawn fencefs run");
    let mut err = BufReader::new(run.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("fencefs approve") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no approval line");
    }
    let sock = line
        .split('`')
        .nth(1)
        .unwrap()
        .trim_start_matches("fencefs approve ");
    let mut approver = Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", BIN])
        .args(["approve", "--auto", "allow", sock])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fencefs approve");
    let mut out = String::new();
    std::io::Read::read_to_string(run.stdout.as_mut().unwrap(), &mut out).unwrap();
    let st = run.wait().unwrap();
    // SAFETY: kill(2) on our own approver (it reconnects forever), by pid.
    unsafe { libc::kill(approver.id() as i32, libc::SIGKILL) };
    let _ = approver.wait();
    assert!(st.success() && out == "approved\n", "{st} {out:?}");
    assert_eq!(fs::read(f.ws().join("docs/x.md")).unwrap(), b"x\ny\n");
}

#[test]
fn command_cannot_reach_the_workspace_beneath_the_fence() {
    let f = Fixture::new("run-escape");
    let ws = f.ws();
    // umount2(2) of the workspace, printing LABEL, the result and the errno's text.
    let probe = f.w.root.join("outside/umount.py");
    put(
        &probe,
        format!(
            "import ctypes, os, sys\nl = ctypes.CDLL(None, use_errno=True)\n\
             r = l.umount2({:?}.encode(), 2)\nprint(sys.argv[1], r, os.strerror(ctypes.get_errno()))\n",
            ws.display().to_string()
        )
        .as_bytes(),
        0o644,
    );
    // Through its init's /proc entries (fencefs run and the daemons, whose cwd is the real
    // workspace, are outside COMMAND's PID namespace: see the next test), by unmounting,
    // and by unmounting in a user namespace of its own.
    let script = format!(
        "exec 2>&1; for p in $PPID $(cat /proc/$PPID/task/$PPID/children); do \
           [ $p = $$ ] && continue; cat /proc/$p/cwd/.env || echo refused-$p; \
           ls /proc/$p/root/ >/dev/null || echo root-refused-$p; done; \
         {py} umount; unshare -Urm sh -c '{py} nested-umount; cat {ws}/.env'; \
         cat .env; true",
        ws = ws.display(),
        py = format!("/usr/bin/python3 {}", probe.display())
    );
    let o = f.run(&["--live"], &script);
    o.assert_ok("fencefs run");
    assert!(
        !o.stdout.contains("TOKEN=secret"),
        "the secret leaked:\n{}",
        o.stdout
    );
    assert_eq!(
        o.stdout.matches("refused-").count() - o.stdout.matches("root-refused-").count(),
        1,
        "COMMAND's init:\n{}",
        o.stdout
    );
    assert!(o.stdout.contains("root-refused-1\n"), "{}", o.stdout);
    // No capability in the run's namespace: EPERM; in a namespace of its own, the fence
    // it inherited is locked: EINVAL.
    for want in [
        "umount -1 Operation not permitted",
        "nested-umount -1 Invalid argument",
    ] {
        assert!(o.stdout.contains(want), "{want}:\n{}", o.stdout);
    }
    assert_eq!(
        o.stdout.matches(".env: No such file or directory").count(),
        2,
        "{}",
        o.stdout
    );
    // As root, COMMAND keeps its capabilities in a user namespace of its own, where the
    // fence is locked.
    let o = root_run(
        &f,
        &["--live"],
        &format!(
            "exec 2>&1; /usr/bin/python3 {} root-umount; cat .env; cat /proc/$PPID/cwd/.env; true",
            probe.display()
        ),
    );
    o.assert_ok("fencefs run as root");
    assert!(
        !o.stdout.contains("TOKEN=secret"),
        "the secret leaked:\n{}",
        o.stdout
    );
    for want in [
        "root-umount -1 Invalid argument",
        "cat: .env: No such file or directory",
        "/cwd/.env: Permission denied",
    ] {
        assert!(o.stdout.contains(want), "{want}:\n{}", o.stdout);
    }
}

#[test]
fn command_cannot_name_a_process_outside() {
    let f = Fixture::new("run-pidns");
    // A process of the same user outside the run (the person's editor, say).
    let mut outside = Command::new("sleep")
        .arg("300")
        .uid(1000)
        .gid(1000)
        .spawn()
        .expect("spawn a process as uid 1000");
    let pid = outside.id();
    let probe = f.w.root.join("outside/reach.py");
    put(
        &probe,
        b"import ctypes, os, signal, sys\n\
          l = ctypes.CDLL(None, use_errno=True)\n\
          pid = int(sys.argv[1])\n\
          r = l.ptrace(16, pid, 0, 0)\n\
          print('ptrace', r, os.strerror(ctypes.get_errno()))\n\
          try:\n    os.kill(pid, signal.SIGKILL); print('kill ok')\n\
          except OSError as e:\n    print('kill', e.strerror)\n\
          try:\n    open('/proc/%d/mem' % pid, 'rb'); print('mem ok')\n\
          except OSError as e:\n    print('mem', e.strerror)\n",
        0o644,
    );
    let o = f.run(
        &["--live", "--home", "keep"],
        &format!(
            "exec 2>&1; /usr/bin/python3 {} {pid}; echo pid1=$(cat /proc/1/comm); \
             echo seen=$(ls -d /proc/[0-9]* | wc -l)",
            probe.display()
        ),
    );
    let alive_after = alive(pid as i32);
    // SAFETY: kill(2) of our own child, by pid.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = outside.wait();
    o.assert_ok("fencefs run");
    for want in [
        "ptrace -1 No such process",
        "kill No such process",
        "mem No such file or directory",
        "pid1=fencefs-init",
    ] {
        assert!(o.stdout.contains(want), "{want}:\n{}", o.stdout);
    }
    assert!(alive_after, "the outside process survived");
    // The init, the shell, and the few processes of the pipeline: nothing else is listed.
    let seen: usize = o
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("seen="))
        .and_then(|n| n.trim().parse().ok())
        .expect("a count");
    assert!(
        seen <= 6,
        "/proc lists only the run's processes: {}",
        o.stdout
    );
}

#[test]
fn command_cannot_reach_another_runs_control_socket() {
    let f = Fixture::new("run-others");
    // Another run of the same user: its directory beside this run's, with its socket.
    let other = f.w.root.join("run/fencefs/0123456789abcdef");
    fs::create_dir_all(&other).unwrap();
    put(&other.join("control.4242"), b"", 0o600);
    sh_in(
        &f.w.root,
        "chown -R 1000:1000 run && chmod 700 run run/fencefs run/fencefs/*",
    )
    .assert_ok("chown");
    let o = f.run(
        &["--live", "--home", "keep"],
        "exec 2>&1; ls -A \"$XDG_RUNTIME_DIR/fencefs\" | wc -l; \
         ls \"$XDG_RUNTIME_DIR/fencefs/0123456789abcdef/control.4242\"; \
         touch \"$XDG_RUNTIME_DIR/fencefs/x\"; true",
    );
    o.assert_ok("fencefs run");
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines[0], "0",
        "every run's directory is covered: {}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains("control.4242': No such file or directory"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("Read-only file system"), "{}", o.stdout);
    assert!(
        other.join("control.4242").exists(),
        "the other run's files stay"
    );
}
