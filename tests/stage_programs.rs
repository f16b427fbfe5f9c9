//! Staging with the build tools an agent runs (issue 19's list beside `tests/stage.rs`'s git,
//! tar and sqlite): `python3 -m venv` and `pip install` of a local wheel as uid 1000, and
//! `cargo new` + `cargo build` (as root: the toolchain lives in root's home), through a
//! staged mount. SOURCE stays snapshot-identical until `apply`; after it SOURCE equals the
//! merged view, and the venv and the binary work from SOURCE itself.
//!
//! Needs `/usr/bin/python3` with `venv` (Debian: `python3-venv`) and cargo; runs offline
//! (ensurepip's bundled wheels, a wheel built here, a crate without dependencies).

mod common;

use common::stage::*;
use common::*;

/// Builds a one-module wheel (`stagedpkg`, a module with `VALUE = 42`) at `argv[1]`.
const MAKE_WHEEL: &str = r#"
import base64, hashlib, os, sys, zipfile
files = {
    "stagedpkg/__init__.py": b"VALUE = 42\n",
    "stagedpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: stagedpkg\nVersion: 1.0\n",
    "stagedpkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: fencefs-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append("stagedpkg-1.0.dist-info/RECORD,,")
files["stagedpkg-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, data in files.items():
        z.writestr(name, data)
"#;

#[test]
fn pip_into_a_venv_and_cargo_build_stay_staged_until_apply() {
    let b = Mount::builder("stage-pip-cargo")
        .policy(WRITE)
        .arg("--allow-other");
    let src = b.host("");
    put(&src.join("README"), b"readme\n", 0o644);
    sh_in(&src, "chown -R 1000:1000 .").assert_ok("chown");
    // The wheel lives outside the mount, readable by uid 1000.
    let wheels = b.outside().join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    let mk = b.outside().join("mkwheel.py");
    std::fs::write(&mk, MAKE_WHEEL).unwrap();
    let whl = wheels.join("stagedpkg-1.0-py3-none-any.whl");
    sh_in(
        &b.outside(),
        &format!(
            "/usr/bin/python3 {} {} && chmod -R a+rX {}",
            mk.display(),
            whl.display(),
            b.outside().display()
        ),
    )
    .assert_ok("build the wheel");
    let dir = stage_dir(&b);
    let mut m = b.arg("--stage").arg(&dir).start();
    let before = snapshot(&m.host(""));

    let pip = "PIP_NO_INDEX=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 .venv/bin/pip";
    let o = m.sh_as(
        1000,
        &format!(
            "set -e; /usr/bin/python3 -m venv .venv; {pip} install -q {whl}; \
             .venv/bin/python -c 'import stagedpkg; print(stagedpkg.VALUE)'",
            whl = whl.display()
        ),
    );
    o.assert_ok("venv + pip install as uid 1000 through the staged mount");
    assert_eq!(o.stdout.trim(), "42", "{o:?}");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = m.sh(&format!(
        "set -e; unset CARGO_TARGET_DIR; '{cargo}' new --quiet --vcs none hello; cd hello; \
         '{cargo}' build --quiet --offline; ./target/debug/hello"
    ));
    o.assert_ok("cargo new + build + run through the staged mount");
    assert!(o.stdout.contains("Hello, world!"), "{o:?}");
    assert_host_unchanged(&before, &m.host(""), "pip and cargo through the stage");

    let st = stage(&["status"], &dir);
    st.assert_ok("stage status");
    for p in ["A .venv/", "A hello/"] {
        assert!(
            st.stdout.lines().any(|l| l.starts_with(p)),
            "status lists {p}:\n{}",
            st.stdout
        );
    }

    let merged = snapshot(&m.mnt(""));
    stop(&mut m);
    stage(&["apply"], &dir).assert_ok("apply");
    let d = snapshot_diff(&merged, &snapshot(&m.host("")));
    assert!(d.is_empty(), "SOURCE after apply:\n{d}");
    assert_eq!(
        stage(&["status"], &dir).stdout,
        "",
        "nothing staged after apply"
    );
    // The applied venv and binary work from SOURCE itself.
    let h = sh_in(
        &m.host(""),
        ".venv/bin/python -c 'import stagedpkg; print(stagedpkg.VALUE)' && ./hello/target/debug/hello",
    );
    h.assert_ok("the venv and the binary in SOURCE after apply");
    assert_eq!(h.stdout, "42\nHello, world!\n", "{h:?}");
}
