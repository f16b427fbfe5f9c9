//! Behaviour the conformance runs (pjdfstest, fsx, probing) found missing; each case is
//! checked against what the plain host directory does.

mod common;

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const OPEN: &str = "mode = \"danger\"\n";

#[test]
fn truncating_a_running_program_is_text_busy_and_leaves_the_host_file_intact() {
    let m = Mount::with("etxtbsy", Some(OPEN), None, |src| {
        fs::copy("/bin/sleep", src.join("sl")).unwrap();
        fs::set_permissions(src.join("sl"), fs::Permissions::from_mode(0o755)).unwrap();
    });
    let size = fs::metadata(m.host("sl")).unwrap().len();
    let mut child = Command::new(m.mnt("sl"))
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let r = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_TRUNC)
        .open(m.mnt("sl"));
    let w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.mnt("sl"));
    let _ = child.kill();
    let _ = child.wait();
    let _ = assert_errno(r, libc::ETXTBSY, "O_RDONLY|O_TRUNC on a running program");
    let _ = assert_errno(w, libc::ETXTBSY, "O_WRONLY|O_TRUNC on a running program");
    assert_eq!(
        fs::metadata(m.host("sl")).unwrap().len(),
        size,
        "host file truncated"
    );
}

fn unlinked_file_keeps_working(name: &str, extra: &[&str]) {
    let mut b = Mount::builder(name).policy(OPEN);
    for a in extra {
        b = b.arg(*a);
    }
    let m = b.start();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.mnt("tmp"))
        .unwrap();
    f.write_all(b"hello").unwrap();
    fs::remove_file(m.mnt("tmp")).unwrap();
    // Writes, reads, truncate, chmod and xattrs through the handle, as on a local disk.
    f.write_all(b" world").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello world");
    f.set_len(5).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 5);
    f.set_permissions(fs::Permissions::from_mode(0o600))
        .unwrap();
    assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
    assert!(!m.host("tmp").exists());
}

#[test]
fn an_open_unlinked_file_keeps_working() {
    unlinked_file_keeps_working("unlinked", &[]);
}

#[test]
fn an_open_unlinked_file_keeps_working_with_revoke() {
    unlinked_file_keeps_working("unlinked-revoke", &["--revoke"]);
}

#[test]
fn o_direct_works_through_the_daemon() {
    for extra in [&[][..], &["--no-passthrough"][..], &["--revoke"][..]] {
        let mut b = Mount::builder("odirect").policy(OPEN);
        for a in extra {
            b = b.arg(*a);
        }
        put(&b.host("existing"), &vec![7u8; 8192], 0o644);
        let m = b.start();
        let o = m.sh("dd if=/dev/zero of=d bs=4096 count=2 oflag=direct 2>&1 && \
             dd if=existing of=/dev/null bs=4096 iflag=direct 2>&1");
        o.assert_ok(&format!("O_DIRECT with {extra:?}"));
        assert_eq!(fs::metadata(m.host("d")).unwrap().len(), 8192);
    }
}

#[test]
fn rename_and_link_onto_a_hidden_name_are_eacces_even_when_the_mode_also_refuses() {
    // SPEC: `none` comes first in the errno order, and creating a none path is EACCES.
    let policy = "mode = \"read-only\"\n[[rule]]\npath = \"**/*.pem\"\naccess = \"none\"\n";
    let m = Mount::with("pair-order", Some(policy), None, |src| {
        mkdirp(&src.join("w"));
        put(&src.join("w/f"), b"x", 0o644);
        mkdirp(&src.join("w/d"));
    });
    let before = snapshot(&m.host(""));
    let _ = assert_errno(
        fs::rename(m.mnt("w/f"), m.mnt("w/n.pem")),
        libc::EACCES,
        "rename onto a hidden name",
    );
    let _ = assert_errno(
        fs::hard_link(m.mnt("w/f"), m.mnt("w/n.pem")),
        libc::EACCES,
        "link onto a hidden name",
    );
    let _ = assert_errno(
        fs::rename(m.mnt("w/d"), m.mnt("w/d.pem")),
        libc::EACCES,
        "rename a directory onto a hidden name",
    );
    // Without a hidden target the mode decides.
    let _ = assert_errno(
        fs::rename(m.mnt("w/f"), m.mnt("w/g")),
        libc::EROFS,
        "rename in read-only mode",
    );
    assert_host_unchanged(&before, &m.host(""), "refused renames and links");
}

fn access(p: &std::path::Path, mode: i32) -> std::io::Result<()> {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str())).unwrap();
    // SAFETY: NUL-terminated path that lives across the call.
    if unsafe { libc::access(c.as_ptr(), mode) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn access_answers_from_the_policy_with_the_spec_errnos() {
    let policy = "mode = \"workspace-write\"\nwritable_roots = [\"w\"]\n\
                  [[rule]]\npath = \"w/ro\"\naccess = \"read\"\n\
                  [[rule]]\npath = \"w/ls\"\naccess = \"list\"\n";
    let m = Mount::with("access", Some(policy), None, |src| {
        mkdirp(&src.join("w"));
        put(&src.join("w/rw"), b"x", 0o755);
        put(&src.join("w/ro"), b"x", 0o755);
        put(&src.join("w/ls"), b"x", 0o755);
        put(&src.join("outside"), b"x", 0o755);
    });
    let before = snapshot(&m.host(""));
    access(&m.mnt("w/rw"), libc::R_OK | libc::W_OK | libc::X_OK).unwrap();
    access(&m.mnt("w/ro"), libc::R_OK | libc::X_OK).unwrap();
    let _ = assert_errno(
        access(&m.mnt("w/ro"), libc::W_OK),
        libc::EACCES,
        "W_OK on read",
    );
    access(&m.mnt("w/ls"), libc::F_OK).unwrap();
    let _ = assert_errno(
        access(&m.mnt("w/ls"), libc::R_OK),
        libc::EACCES,
        "R_OK on list",
    );
    let _ = assert_errno(
        access(&m.mnt("outside"), libc::W_OK),
        libc::EROFS,
        "W_OK outside writable_roots",
    );
    assert_host_unchanged(&before, &m.host(""), "access(2) probes");
}
