//! The shipped `policy.example.toml`, mounted as it is in the repository (the daemon reads
//! the file itself), lets real development tools work while private keys, dotenv files and
//! `secrets/` stay invisible (issue 10).
//!
//! Before `except`, the example's `**/*.pem` rule hid pip's own CA bundle: `python3 -m venv`
//! failed with `[Errno 13] Permission denied: '…/site-packages/pip/_vendor/certifi/cacert.pem'`.
//!
//! Needs `/usr/bin/python3` with `venv`/`ensurepip` (Debian: `python3-venv`), git, make,
//! cc, meson + ninja, sqlite3, npm and cargo (`scripts/test.sh` installs them); runs offline (ensurepip's bundled wheels, a local wheel and a
//! local npm tarball, a crate without dependencies).

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// The agent's uid (with `--allow-other` the kernel checks the mirrored permissions).
const AGENT: u32 = 1000;

fn example_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policy.example.toml")
}

/// A mount of a fresh workspace with the repository's example policy and an audit log.
fn builder(name: &str) -> (MountBuilder, PathBuf) {
    let b = Mount::builder(name);
    let audit = b.root().join("audit.jsonl");
    let b = b
        .arg("-p")
        .arg(example_policy())
        .arg("--allow-other")
        .arg("--audit")
        .arg(&audit);
    (b, audit)
}

fn chown_tree(p: &Path, uid: u32) {
    let out = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{uid}"))
        .arg(p)
        .output()
        .expect("run chown");
    assert!(out.status.success(), "chown -R: {out:?}");
}

/// Builds a minimal `certifi` wheel (the package `requests` takes its CA bundle from):
/// `certifi/__init__.py` with `where()` and `certifi/cacert.pem`, a copy of pip's bundle.
const MAKE_WHEEL: &str = r#"
import base64, hashlib, os, sys, zipfile
import pip._vendor.certifi as vendored
bundle = os.path.join(os.path.dirname(vendored.__file__), "cacert.pem")
files = {
    "certifi/__init__.py": b"import os\n\ndef where():\n    return os.path.join(os.path.dirname(__file__), 'cacert.pem')\n",
    "certifi/cacert.pem": open(bundle, "rb").read(),
    "certifi-2099.1.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: certifi\nVersion: 2099.1.1\n",
    "certifi-2099.1.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: fencefs-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append("certifi-2099.1.1.dist-info/RECORD,,")
files["certifi-2099.1.1.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
"#;

/// `python3 -m venv` (pip from ensurepip's bundled wheel), pip's vendored certifi bundle,
/// a `certifi` wheel installed and uninstalled with pip, all as the agent's uid.
#[test]
fn python_venv_pip_and_certifi_work() {
    let (b, audit) = builder("example-venv");
    chown_tree(&b.host(""), AGENT);
    let m = b.watchdog(Duration::from_secs(400)).start();
    fs::write(m.outside().join("mkwheel.py"), MAKE_WHEEL).unwrap();
    let mkwheel = m.outside().join("mkwheel.py");
    let mnt = m.mnt("");

    m.sh_as(AGENT, "/usr/bin/python3 -m venv .venv")
        .assert_ok("python3 -m venv .venv (with pip, through ensurepip)");
    // The command of issue 10: pip's vendored certifi (Debian's pip points `where()` at
    // the system bundle) ...
    m.sh_as(
        AGENT,
        ".venv/bin/python -c 'import pip._vendor.certifi as c, ssl; \
         ssl.create_default_context(cafile=c.where())'",
    )
    .assert_ok("load pip's certifi bundle");
    // ... and the cacert.pem file that pip installed into the venv, through the mount.
    let o = m.sh_as(
        AGENT,
        ".venv/bin/python -c 'import os, ssl, pip._vendor.certifi as c; \
         p = os.path.join(os.path.dirname(c.__file__), \"cacert.pem\"); \
         print(p, len(ssl.create_default_context(cafile=p).get_ca_certs()))'",
    );
    o.assert_ok("load the venv's pip/_vendor/certifi/cacert.pem");
    let (path, count) = o.stdout.trim().rsplit_once(' ').unwrap();
    assert!(
        path.starts_with(&format!("{}/.venv/", mnt.display()))
            && path.ends_with("site-packages/pip/_vendor/certifi/cacert.pem"),
        "{o:?}"
    );
    assert!(count.parse::<usize>().unwrap() > 50, "{o:?}");

    // requests' certifi: a wheel with certifi/cacert.pem, installed by pip (offline).
    let pip = "PIP_NO_INDEX=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 .venv/bin/pip";
    m.sh_as(
        AGENT,
        &format!(
            ".venv/bin/python {} dist/certifi-2099.1.1-py3-none-any.whl",
            mkwheel.display()
        ),
    )
    .assert_ok("build a certifi wheel");
    m.sh_as(
        AGENT,
        &format!("{pip} install dist/certifi-2099.1.1-py3-none-any.whl"),
    )
    .assert_ok("pip install certifi");
    let o = m.sh_as(
        AGENT,
        ".venv/bin/python -c 'import certifi, ssl; \
         ctx = ssl.create_default_context(cafile=certifi.where()); \
         print(certifi.where(), len(ctx.get_ca_certs()))'",
    );
    o.assert_ok("requests-style certifi.where()");
    assert!(
        o.stdout.contains("/site-packages/certifi/cacert.pem"),
        "{o:?}"
    );
    // pip uninstall stashes directories by renaming them inside site-packages: a rename
    // between two names in the same package tree is allowed.
    m.sh_as(AGENT, &format!("{pip} uninstall -y certifi"))
        .assert_ok("pip uninstall certifi");
    m.sh_as(AGENT, ".venv/bin/python -c 'import certifi'")
        .assert_fail("certifi is gone");

    // Nothing on the way was refused.
    let refusals: Vec<String> = fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"deny\"") && l.contains("\"path\":\".venv/"))
        .map(str::to_string)
        .collect();
    assert!(refusals.is_empty(), "refused in the venv: {refusals:#?}");
}

/// Private keys (PEM, *.key, *.p12, SSH identities), dotenv files and `secrets/` do not
/// exist through the mount, their host files are untouched, and they cannot be carried
/// into a package tree (where key files are visible) by renaming their directory.
#[test]
fn private_keys_dotenv_and_secrets_stay_hidden() {
    let (b, _audit) = builder("example-keys");
    let hidden: &[&str] = &[
        "keys/server.pem",
        "keys/x.key",
        "keys/client.p12",
        "id_ed25519",
        "home/.ssh/id_rsa",
        "src/app/tls.pem",
        ".env",
        ".env.local",
        "web/.env.production",
        "secrets/token.txt",
    ];
    let visible: &[&str] = &[
        "id_ed25519.pub",
        ".env.example",
        "src/main.rs",
        "node_modules/pkg/test/fixture.pem",
        "venv/lib/python3.11/site-packages/certifi/cacert.pem",
        "lib/site-packages/x/k.key",
    ];
    for p in hidden.iter().chain(visible) {
        let h = b.host(p);
        mkdirp(h.parent().unwrap());
        put(&h, format!("content of {p}\n").as_bytes(), 0o644);
    }
    chown_tree(&b.host(""), AGENT);
    let m = b.start();
    let before: Vec<(Vec<u8>, i64)> = hidden
        .iter()
        .map(|p| {
            let h = m.host(p);
            (fs::read(&h).unwrap(), fs::metadata(&h).unwrap().mtime())
        })
        .collect();

    for p in hidden {
        let _ = assert_errno(fs::metadata(m.mnt(p)), libc::ENOENT, &format!("stat {p}"));
        let _ = assert_errno(read_all(&m.mnt(p)), libc::ENOENT, &format!("read {p}"));
    }
    let _ = assert_errno(
        fs::read_dir(m.mnt("secrets")),
        libc::ENOENT,
        "list secrets/",
    );
    for p in visible {
        assert_eq!(
            read_all(&m.mnt(p)).unwrap(),
            format!("content of {p}\n").as_bytes(),
            "{p}"
        );
    }
    // Listings show none of them, for the agent too.
    // (`.ssh/` itself is hidden by the `secrets` preset, so `home` lists nothing.)
    let o = m.sh_as(AGENT, "ls -A . keys web home");
    o.assert_ok("ls");
    for name in [
        "server.pem",
        "x.key",
        "client.p12",
        "id_ed25519\n",
        "id_rsa",
        ".env\n",
        ".env.local",
        ".env.production",
        "secrets",
        ".ssh",
    ] {
        assert!(!o.stdout.contains(name), "{name:?} listed: {}", o.stdout);
    }
    assert!(o.stdout.contains("id_ed25519.pub") && o.stdout.contains(".env.example"));
    // Creating a key file is refused before the host is touched.
    let _ = assert_errno(
        fs::write(m.mnt("keys/new.pem"), b"k"),
        libc::EACCES,
        "create keys/new.pem",
    );
    let _ = assert_errno(
        fs::write(m.mnt(".env"), b"X=1"),
        libc::EACCES,
        "overwrite .env",
    );
    assert!(!m.host("keys/new.pem").exists());
    // Moving the directory that holds keys into a package tree would make them visible:
    // the rename is refused.
    mkdirp(&m.mnt("node_modules/evil"));
    for (from, to) in [
        ("keys", "node_modules/keys"),
        ("keys", ".venv"),
        ("src/app", "venv/lib/python3.11/site-packages/app"),
    ] {
        let o = m.sh_as(AGENT, &format!("mv {from} {to}"));
        o.assert_fail(&format!("mv {from} {to}"));
        assert!(o.stderr.contains("Permission denied"), "{o:?}");
    }
    let o = m.sh_as(
        AGENT,
        "cat node_modules/keys/server.pem .venv/server.pem 2>&1; ls node_modules",
    );
    assert!(!o.stdout.contains("content of"), "{o:?}");
    // ... while ordinary directory renames work.
    m.sh_as(AGENT, "mv src/app src/app2 && mv src/app2 src/app")
        .assert_ok("rename a directory that holds a hidden key");
    let _ = assert_errno(
        read_all(&m.mnt("src/app/tls.pem")),
        libc::ENOENT,
        "still hidden after the round trip",
    );

    let after: Vec<(Vec<u8>, i64)> = hidden
        .iter()
        .map(|p| {
            let h = m.host(p);
            (fs::read(&h).unwrap(), fs::metadata(&h).unwrap().mtime())
        })
        .collect();
    assert_eq!(before, after, "hidden host files changed");
}

/// git (in a repository created before mounting), make, meson + ninja, sqlite3, npm (a
/// package with `.pem`/`.key` test fixtures) and cargo work through the mount.
#[test]
fn git_make_meson_sqlite_npm_and_cargo_work() {
    let (b, audit) = builder("example-tools");
    // The repository exists before the mount: the agent commits, hooks and config stay
    // read-only (see the README on `git init` at the workspace root).
    let src = b.host("");
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .arg("-C")
            .arg(&src)
            .args(args)
            .output()
            .expect("run git");
        assert!(o.status.success(), "git {args:?}: {o:?}");
    };
    git(&["-c", "init.defaultBranch=main", "init", "-q"]);
    put(
        &b.host("Makefile"),
        b"out/hello.txt:\n\tmkdir -p out\n\techo hello > out/hello.txt\n",
        0o644,
    );
    put(
        &b.host("meson.build"),
        b"project('hello', 'c')\nexecutable('hello', 'hello.c')\n",
        0o644,
    );
    put(
        &b.host("hello.c"),
        b"#include <stdio.h>\nint main(void) { puts(\"meson ok\"); return 0; }\n",
        0o644,
    );
    // npm: a local package tarball carrying test certificates and keys.
    let pkg = b.outside().join("pkg");
    mkdirp(&pkg.join("test/fixtures"));
    put(
        &pkg.join("package.json"),
        br#"{"name":"fixturepkg","version":"1.0.0"}"#,
        0o644,
    );
    put(
        &pkg.join("test/fixtures/ca.pem"),
        b"-----BEGIN CERTIFICATE-----\n",
        0o644,
    );
    put(&pkg.join("test/fixtures/server.key"), b"key\n", 0o644);
    sh_in(&pkg, "npm pack --silent >/dev/null").assert_ok("npm pack");
    let tarball = pkg.join("fixturepkg-1.0.0.tgz");
    put(
        &b.host("package.json"),
        br#"{"name":"app","version":"1.0.0","private":true}"#,
        0o644,
    );
    chown_tree(&b.host(""), AGENT);
    let m = b.watchdog(Duration::from_secs(400)).start();

    // git as the agent
    m.sh_as(
        AGENT,
        "echo 'fn main() {}' > main.rs && git add -A \
         && git -c user.name=agent -c user.email=a@example.invalid commit -qm agent \
         && git log --oneline | grep -q agent && git status --porcelain",
    )
    .assert_ok("git add/commit/log");
    // The protected .git/hooks stays read-only (that is why `git init` at the workspace
    // root fails through the mount); a repository below the root can be created.
    let _ = assert_errno(
        fs::create_dir(m.mnt(".git/hooks/x")),
        libc::EROFS,
        "mkdir .git/hooks/x",
    );
    m.sh_as(AGENT, "git init -q sub").assert_ok("git init sub");
    // make
    m.sh_as(AGENT, "make -s && cat out/hello.txt")
        .assert_ok("make");
    // meson + ninja (into build/, which the example grants write explicitly)
    let o = m.sh_as(
        AGENT,
        "meson setup build >/dev/null && ninja -C build >/dev/null && ./build/hello",
    );
    o.assert_ok("meson setup + ninja");
    assert_eq!(o.stdout.trim(), "meson ok");
    // sqlite3 (journal files next to the database)
    let o = m.sh_as(
        AGENT,
        "sqlite3 data.db 'create table t(x); insert into t values (42);' \
         && sqlite3 data.db 'select x from t;'",
    );
    o.assert_ok("sqlite3");
    assert_eq!(o.stdout.trim(), "42");
    // npm (as root: its cache lives in root's home)
    let o = sh_in(
        &m.mnt(""),
        &format!(
            "npm install --offline --no-audit --no-fund {} 2>&1",
            tarball.display()
        ),
    );
    o.assert_ok("npm install of a package with .pem/.key fixtures");
    assert_eq!(
        read_all(&m.mnt("node_modules/fixturepkg/test/fixtures/server.key")).unwrap(),
        b"key\n"
    );
    // cargo (as root: the toolchain lives in root's home), a crate without dependencies
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = sh_in(
        &m.mnt(""),
        &format!(
            "'{cargo}' new --quiet --vcs none hello && cd hello && '{cargo}' build --quiet \
             --offline && ./target/debug/hello"
        ),
    );
    o.assert_ok("cargo new + build + run");
    assert!(o.stdout.contains("Hello, world!"), "{o:?}");

    let lines = fs::read_to_string(&audit).unwrap_or_default();
    let refused: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("\"deny\""))
        .filter(|l| !l.contains("\"path\":\".git/hooks"))
        .collect();
    assert!(refused.is_empty(), "unexpected refusals: {refused:#?}");
}
