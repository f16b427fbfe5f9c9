//! Mounting over SOURCE itself: the daemon opens SOURCE before mounting, so the mount can
//! hide the raw directory in place (and the Landlock domain must follow that handle, not
//! the path, which then leads to the mount itself).

mod common;

use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[test]
fn mounting_over_the_source_itself_serves_the_underlying_directory() {
    require_fuse();
    let ws = Workspace::new("over-source");
    let src = ws.src();
    put(&src.join("a"), b"hi", 0o644);
    mkdirp(&src.join("secrets"));
    put(&src.join("secrets/k"), b"key", 0o600);
    fs::write(
        ws.policy_path(),
        "mode = \"danger\"\n[[rule]]\npath = \"secrets\"\naccess = \"none\"\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .arg("mount")
        .arg("-p")
        .arg(ws.policy_path())
        .arg(&src)
        .arg(&src)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(ws.root.join("daemon.stderr")).unwrap())
        .spawn()
        .unwrap();
    let mounted = eventually(Duration::from_secs(10), || is_mounted(&src));
    let result = std::panic::catch_unwind(|| {
        assert!(mounted, "not mounted");
        assert_eq!(fs::read(src.join("a")).unwrap(), b"hi");
        let _ = assert_errno(
            fs::read(src.join("secrets/k")),
            libc::ENOENT,
            "hidden in place",
        );
        fs::write(src.join("b"), b"new").unwrap();
        assert_eq!(fs::read(src.join("b")).unwrap(), b"new");
    });
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    if is_mounted(&src) {
        let _ = Command::new("fusermount3").arg("-uz").arg(&src).status();
    }
    let log = fs::read_to_string(ws.root.join("daemon.stderr")).unwrap_or_default();
    if let Err(e) = result {
        panic!("{e:?}\ndaemon stderr:\n{log}");
    }
    assert!(status.success(), "exit {status}: {log}");
    // Underneath, the raw directory got the file written through the mount.
    assert_eq!(fs::read(src.join("b")).unwrap(), b"new");
    assert_eq!(fs::read(src.join("secrets/k")).unwrap(), b"key");
}
