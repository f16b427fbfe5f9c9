//! Program rules (`exe`, `ancestor_exe`) against callers that try to be taken for another
//! program (SPEC "Finer grants and program rules"): a process that execs between its
//! request and the decision, a pid reused by another program, the tricks a container's
//! root allows (a symlink named git, `exec -a git /proc/self/exe`, a file at the rule's
//! path), and a caller whose program cannot be known (fail closed). Each checks the exact
//! errno and the host staying untouched.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};

/// The real python (not a wrapper script), the program rules below name it.
fn python() -> PathBuf {
    fs::canonicalize("/usr/bin/python3").expect("/usr/bin/python3")
}

fn git() -> PathBuf {
    let out = std::process::Command::new("sh")
        .args(["-c", "command -v git"])
        .output()
        .expect("sh");
    fs::canonicalize(String::from_utf8(out.stdout).unwrap().trim()).expect("git")
}

/// Only git and python write `.git`; only processes under `privsh` write `out/`; python
/// may only read `downloads/` (a rule restricting a program); the rest is writable.
fn policy(privsh: &Path) -> String {
    format!(
        "mode = \"danger\"\ndefault = \"write\"\n\n\
         [[rule]]\npath = \".git\"\naccess = \"read\"\n\n\
         [[rule]]\npath = \".git\"\naccess = \"write\"\nexe = [\"{g}\", \"{py}\", \"/opt/tools/git\"]\n\n\
         [[rule]]\npath = \"out\"\naccess = \"read\"\n\n\
         [[rule]]\npath = \"out\"\naccess = \"write\"\nancestor_exe = [\"{s}\"]\n\n\
         [[rule]]\npath = \"downloads\"\naccess = \"read\"\nexe = [\"{py}\"]\n",
        g = git().display(),
        py = python().display(),
        s = privsh.display(),
    )
}

/// A mount of that policy with `.git`, `out/` and `downloads/` made; `privsh` is a copy
/// of dash outside the workspace (a program only its own path tells apart).
fn mount(name: &str) -> (Mount, PathBuf) {
    let b = Mount::builder(name);
    let privsh = b.outside().join("privsh");
    fs::copy(fs::canonicalize("/bin/sh").unwrap(), &privsh).unwrap();
    let b = b.policy(&policy(&privsh));
    for d in [".git", "out", "downloads"] {
        mkdirp(&b.host(d));
    }
    put(&b.host("downloads/seen"), b"s\n", 0o644);
    chown_tree(&b.host(""), 1000);
    let audit = b.root().join("audit.jsonl");
    let m = b
        .arg("--allow-other")
        .arg("--audit")
        .arg(&audit)
        .arg("--audit-allowed")
        .start();
    (m, privsh)
}

fn names(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

#[test]
fn an_exec_between_request_and_decision_never_carries_a_rule_to_another_program() {
    let (m, _) = mount("progs-exec");
    let py = python();
    // git → sh: python (allowed) writes, then execs sh in the same process (same pid,
    // same start time): sh's write is decided for sh.
    let o = m.sh(&format!(
        "for i in $(seq 1 30); do {py} -c \"import os; open('.git/ok-$i','w').close(); \
         os.execv('/bin/sh', ['sh', '-c', 'echo x > .git/evil-$i 2>/dev/null && echo LANDED || echo refused'])\"; done",
        py = py.display()
    ));
    o.assert_ok("python then sh");
    assert_eq!(o.stdout, "refused\n".repeat(30), "{o:?}");
    assert_eq!(names(&m.host(".git"), "ok-").len(), 30);
    assert_eq!(names(&m.host(".git"), "evil-"), Vec::<String>::new());

    // sh → python: the shell is refused, the python it becomes is allowed.
    let o = m.sh(&format!(
        "echo x > .git/pre 2>/dev/null && echo LANDED || echo refused; \
         exec {py} -c \"open('.git/post', 'w').write('y')\"",
        py = py.display()
    ));
    o.assert_ok("sh then python");
    assert_eq!(o.stdout, "refused\n");
    assert!(!m.host(".git/pre").exists());
    assert_eq!(fs::read(m.host(".git/post")).unwrap(), b"y");

    // A request in flight while another thread execs: the main thread of an
    // unprivileged copy of python creates `.git` files in a loop while a second thread
    // execs the real python (allowed). The kernel finishes the exec only after every
    // other thread has left its system call, so the requests in flight are decided for
    // the copy; what the exec'd python writes, for python.
    let copy = m.outside().join("py");
    fs::copy(&py, &copy).unwrap();
    let script = m.outside().join("race.py");
    let race = r#"import os, sys, threading, time
i = sys.argv[1]
def other():
    time.sleep(0.003)
    os.execv('PY', ['python3', '-c', "open('.git/after-" + i + "', 'w').close()"])
threading.Thread(target=other, daemon=True).start()
n = 0
while True:
    try:
        os.close(os.open('.git/evil-%s-%d' % (i, n), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        print('LANDED', flush=True)
    except PermissionError:
        pass
    n += 1
"#;
    put(
        &script,
        race.replace("PY", py.to_str().unwrap()).as_bytes(),
        0o644,
    );
    let o = m.sh(&format!(
        "for i in $(seq 1 40); do PYTHONHOME=/usr {copy} {script} $i || exit 1; done",
        copy = copy.display(),
        script = script.display()
    ));
    o.assert_ok("the exec race");
    assert!(!o.stdout.contains("LANDED"), "{o:?}");
    assert_eq!(names(&m.host(".git"), "evil-"), Vec::<String>::new());
    assert_eq!(
        names(&m.host(".git"), "after-").len(),
        40,
        "the exec'd python writes"
    );
}

#[test]
fn a_reused_pid_never_gets_the_old_processs_ancestor_rule() {
    let (m, privsh) = mount("progs-pid-reuse");
    // P = privsh starts a shell that writes out/c1-i (allowed: an ancestor is privsh),
    // exits; its pid is handed to Q (plain sh) through ns_last_pid, and Q's shell writes
    // out/c2-i: refused, though the resolver cached P's ancestors for that pid (printed:
    // how often Q started within P's clock tick, i.e. with the same /proc start time).
    let script = m.outside().join("reuse.py");
    put(
        &script,
        br#"import os, sys
privsh, n = sys.argv[1], int(sys.argv[2])
def start(pid):
    with open('/proc/%d/stat' % pid) as f:
        return f.read().rsplit(')', 1)[1].split()[19]
reused = same_tick = first = 0
for i in range(n):
    p = os.fork()
    if p == 0:
        os.execv(privsh, ['privsh', '-c', 'sh -c "echo a > out/c1-%d"; true' % i])
    os.waitid(os.P_PID, p, os.WEXITED | os.WNOWAIT)
    t1 = start(p)
    os.waitpid(p, 0)
    first += os.path.exists('out/c1-%d' % i)
    for attempt in range(100):
        with open('/proc/sys/kernel/ns_last_pid', 'w') as f:
            f.write(str(p - 1))
        q = os.fork()
        if q == 0:
            if os.getpid() != p:
                os._exit(0)
            os.execv('/bin/sh', ['sh', '-c',
                'sh -c "echo b > out/c2-%d" 2>/dev/null && echo LANDED || echo refused; true' % i])
        if q == p:
            break
        os.waitpid(q, 0)
    else:
        continue
    reused += 1
    os.waitid(os.P_PID, q, os.WEXITED | os.WNOWAIT)
    same_tick += start(q) == t1
    os.waitpid(q, 0)
print('reused', reused, 'same_tick', same_tick, 'first', first)
"#,
        0o644,
    );
    let n = 60;
    let o = m.sh(&format!(
        "{py} {script} {privsh} {n}",
        py = python().display(),
        script = script.display(),
        privsh = privsh.display()
    ));
    o.assert_ok("the pid reuse driver");
    eprintln!("{}", o.stdout.lines().last().unwrap_or(""));
    let last = o.stdout.lines().last().unwrap_or("").to_string();
    let field = |k: &str| -> usize {
        let w: Vec<&str> = last.split_whitespace().collect();
        let i = w.iter().position(|x| *x == k).expect(&last);
        w[i + 1].parse().unwrap()
    };
    assert_eq!(field("first"), n, "privsh's children write out/: {o:?}");
    assert!(
        field("reused") >= n / 2,
        "pids were not reused often enough to test anything: {o:?}"
    );
    assert!(!o.stdout.contains("LANDED"), "{o:?}");
    assert_eq!(names(&m.host("out"), "c2-"), Vec::<String>::new());
}

#[test]
fn a_containers_tricks_do_not_make_a_program_git() {
    let (m, _) = mount("progs-container");
    let dash = fs::canonicalize("/bin/sh").unwrap();
    let dash = dash.to_str().unwrap();
    let try_write = |extra: &[&str], run: &str, name: &str| -> String {
        let o = in_bwrap_with(
            &m,
            extra,
            &format!("{run} -c 'echo x > .git/{name}' 2>/dev/null && echo LANDED || echo refused"),
        );
        assert!(o.ok(), "bwrap {extra:?} {run}: {o:?}");
        o.stdout.trim().to_string()
    };
    let tools = ["--tmpfs", "/opt", "--dir", "/opt/tools"];
    // A symlink named git at the rule's path in the container's root: the kernel runs
    // its target, and the target is what the process runs.
    let link = [&tools[..], &["--symlink", dash, "/opt/tools/git"]].concat();
    assert_eq!(try_write(&link, "/opt/tools/git", "link"), "refused");
    // A symlink named git anywhere, and argv[0] "git" through /proc/self/exe.
    assert_eq!(
        try_write(&[], "ln -s /bin/sh /tmp/git && /tmp/git", "link2"),
        "refused"
    );
    let o = in_bwrap(
        &m,
        "bash -c 'exec -a git /proc/self/exe -c \"echo x > .git/selfexe\"' 2>/dev/null \
         && echo LANDED || echo refused",
    );
    assert_eq!(o.stdout.trim(), "refused", "{o:?}");
    // The real git reached through a magic link is git (the file run, not the name used).
    let o = in_bwrap(
        &m,
        &format!(
            "/proc/self/root{} -c init.defaultBranch=main init -q . && echo ok",
            git().display()
        ),
    );
    assert_eq!(o.stdout.trim(), "ok", "{o:?}");
    assert!(m.host(".git/HEAD").exists());
    // The contract is the path in the process's own root: a container whose root puts
    // another program at /opt/tools/git runs "git" as far as the rules go (whoever builds
    // the root decides), and so does a process that can make itself a mount namespace
    // (an unprivileged user namespace) and bind a shell there. Inside a container that
    // forbids user namespaces (`bwrap --disable-userns`) the agent cannot.
    let copy = m.outside().join("true-copy");
    fs::copy(fs::canonicalize("/bin/true").unwrap(), &copy).unwrap();
    let bound = [
        &tools[..],
        &["--ro-bind", copy.to_str().unwrap(), "/opt/tools/git"],
    ]
    .concat();
    let nested = |name: &str| {
        format!(
            "unshare -rm sh -c 'mount --bind /bin/sh /opt/tools/git && \
             /opt/tools/git -c \"echo x > .git/{name}\"' 2>/dev/null && echo LANDED || echo refused"
        )
    };
    let o = in_bwrap_with(&m, &bound, &nested("nested"));
    assert_eq!(o.stdout.trim(), "LANDED", "the limit the docs name: {o:?}");
    let no_userns = [&bound[..], &["--unshare-user", "--disable-userns"]].concat();
    let o = in_bwrap_with(&m, &no_userns, &nested("ns"));
    assert_eq!(o.stdout.trim(), "refused", "{o:?}");
    let mut left = names(&m.host(".git"), "");
    left.retain(|n| ["link", "link2", "selfexe", "ns"].contains(&n.as_str()));
    assert_eq!(left, Vec::<String>::new(), "host .git untouched");
    assert!(m.host(".git/nested").exists());
}

#[test]
fn a_caller_whose_program_is_unknown_gets_the_most_restrictive_answer() {
    let (m, _) = mount("progs-unknown");
    let py = python();
    // python may only read downloads/ (known: EACCES, host unchanged).
    let o = m.sh(&format!(
        "{py} -c \"open('downloads/known', 'w')\" 2>&1 | grep -c PermissionError",
        py = py.display()
    ));
    assert_eq!(o.stdout.trim(), "1", "{o:?}");
    // The same python, chrooted away from its executable (its program can no longer be
    // named in its own root): unknown, so the restricting rule still applies.
    let inside = m.mnt(".").strip_prefix(m.root()).unwrap().to_path_buf();
    let o = m.sh(&format!(
        "{py} -c \"import errno, os\nos.chroot('{root}')\nos.chdir('/{inside}')\n\
         try:\n    open('downloads/unknown', 'w')\n    print('LANDED')\n\
         except OSError as e:\n    print(errno.errorcode[e.errno])\n\
         print(open('downloads/seen').read().strip())\"",
        py = py.display(),
        root = m.root().display(),
        inside = inside.display()
    ));
    o.assert_ok("chrooted python");
    assert_eq!(o.stdout, "EACCES\ns\n", "{o:?}");
    assert!(!m.host("downloads/unknown").exists());
    assert!(!m.host("downloads/known").exists());
    // The audit line says why.
    let audit = m.root().join("audit.jsonl");
    let logged = || {
        fs::read_to_string(&audit)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                l.contains("\"path\":\"downloads/unknown\"")
                    && l.contains("\"errno\":\"EACCES\"")
                    && l.contains("\"program\":\"unknown\"")
                    && l.contains("\"rule\":\"downloads\"")
            })
    };
    assert!(
        eventually(std::time::Duration::from_secs(5), logged),
        "{}",
        fs::read_to_string(&audit).unwrap_or_default()
    );
}
