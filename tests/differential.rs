//! Differential test: the same syscall scenarios run against a plain host directory and
//! through an allow-all mount must give the same results — return values, errno, file
//! contents, modes, listings. Anything that differs is a fidelity bug of the mirror.

// Every unsafe block here is a plain libc call on a NUL-terminated path that lives across
// the call (documented once, on `steps`).
#![allow(clippy::undocumented_unsafe_blocks)]

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;

const ALLOW_ALL: &str = "mode = \"danger\"\ndefault = \"write\"\nallow_setid = true\n\
                         allow_devices = true\n";

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn rc(r: libc::c_int) -> String {
    if r < 0 {
        ename(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        "ok".to_string()
    }
}

/// One scenario step on a tree rooted at `d`; returns a printable outcome.
type Step = fn(&Path) -> String;

#[allow(unsafe_code)]
fn steps() -> Vec<(&'static str, Step)> {
    // SAFETY (all unsafe blocks below): plain libc calls with NUL-terminated paths that
    // live across the call and valid buffers.
    vec![
        ("mkdir a", |d| {
            rc(unsafe { libc::mkdir(c(&d.join("a")).as_ptr(), 0o755) })
        }),
        ("mkdir a again", |d| {
            rc(unsafe { libc::mkdir(c(&d.join("a")).as_ptr(), 0o755) })
        }),
        ("create a/f", |d| {
            let fd = unsafe {
                libc::open(
                    c(&d.join("a/f")).as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                    0o640,
                )
            };
            let r = rc(fd);
            if fd >= 0 {
                unsafe { libc::write(fd, b"hello".as_ptr().cast(), 5) };
                unsafe { libc::close(fd) };
            }
            r
        }),
        ("create a/f O_EXCL again", |d| {
            let fd = unsafe {
                libc::open(
                    c(&d.join("a/f")).as_ptr(),
                    libc::O_CREAT | libc::O_EXCL,
                    0o640,
                )
            };
            if fd >= 0 {
                unsafe { libc::close(fd) };
            }
            rc(fd)
        }),
        ("open missing", |d| {
            let fd = unsafe { libc::open(c(&d.join("nope")).as_ptr(), libc::O_RDONLY) };
            rc(fd)
        }),
        ("open a/f/x (ENOTDIR)", |d| {
            let fd = unsafe { libc::open(c(&d.join("a/f/x")).as_ptr(), libc::O_RDONLY) };
            rc(fd)
        }),
        ("rmdir non-empty a", |d| {
            rc(unsafe { libc::rmdir(c(&d.join("a")).as_ptr()) })
        }),
        ("unlink a dir", |d| {
            rc(unsafe { libc::unlink(c(&d.join("a")).as_ptr()) })
        }),
        ("rmdir a file", |d| {
            rc(unsafe { libc::rmdir(c(&d.join("a/f")).as_ptr()) })
        }),
        ("symlink l -> a/f", |d| {
            rc(unsafe { libc::symlink(c(Path::new("a/f")).as_ptr(), c(&d.join("l")).as_ptr()) })
        }),
        ("readlink l", |d| {
            fs::read_link(d.join("l")).map_or_else(
                |e| ename(e.raw_os_error().unwrap_or(0)),
                |t| t.display().to_string(),
            )
        }),
        ("read through l", |d| {
            String::from_utf8_lossy(&fs::read(d.join("l")).unwrap_or_default()).into_owned()
        }),
        ("open l O_NOFOLLOW", |d| {
            let fd =
                unsafe { libc::open(c(&d.join("l")).as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW) };
            rc(fd)
        }),
        ("link a/f h", |d| {
            rc(unsafe { libc::link(c(&d.join("a/f")).as_ptr(), c(&d.join("h")).as_ptr()) })
        }),
        ("nlink of h", |d| {
            fs::metadata(d.join("h")).map_or("err".into(), |m| m.nlink().to_string())
        }),
        ("link to existing", |d| {
            rc(unsafe { libc::link(c(&d.join("a/f")).as_ptr(), c(&d.join("h")).as_ptr()) })
        }),
        ("chmod h 0600", |d| {
            rc(unsafe { libc::chmod(c(&d.join("h")).as_ptr(), 0o600) })
        }),
        ("mode of a/f", |d| {
            format!(
                "{:o}",
                fs::metadata(d.join("a/f")).map_or(0, |m| m.permissions().mode())
            )
        }),
        ("truncate a/f 2", |d| {
            rc(unsafe { libc::truncate(c(&d.join("a/f")).as_ptr(), 2) })
        }),
        ("content a/f", |d| {
            String::from_utf8_lossy(&fs::read(d.join("a/f")).unwrap_or_default()).into_owned()
        }),
        ("rename h -> a/g", |d| {
            rc(unsafe { libc::rename(c(&d.join("h")).as_ptr(), c(&d.join("a/g")).as_ptr()) })
        }),
        ("rename missing", |d| {
            rc(unsafe { libc::rename(c(&d.join("zz")).as_ptr(), c(&d.join("yy")).as_ptr()) })
        }),
        ("rename dir into itself", |d| {
            rc(unsafe { libc::rename(c(&d.join("a")).as_ptr(), c(&d.join("a/sub")).as_ptr()) })
        }),
        ("mkdir b; rename a over non-empty?", |d| {
            unsafe { libc::mkdir(c(&d.join("b")).as_ptr(), 0o755) };
            unsafe { libc::mkdir(c(&d.join("b/x")).as_ptr(), 0o755) };
            rc(unsafe { libc::rename(c(&d.join("a")).as_ptr(), c(&d.join("b")).as_ptr()) })
        }),
        ("RENAME_NOREPLACE onto existing", |d| {
            rc(unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    c(&d.join("a/f")).as_ptr(),
                    libc::AT_FDCWD,
                    c(&d.join("a/g")).as_ptr(),
                    libc::RENAME_NOREPLACE,
                )
            })
        }),
        ("RENAME_EXCHANGE a/f <-> l", |d| {
            rc(unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    c(&d.join("a/f")).as_ptr(),
                    libc::AT_FDCWD,
                    c(&d.join("l")).as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            })
        }),
        ("lstat kinds", |d| {
            let k = |p: &str| {
                fs::symlink_metadata(d.join(p)).map_or("-".to_string(), |m| {
                    format!("{:o}", m.mode() & libc::S_IFMT)
                })
            };
            format!("a/f={} l={} a={}", k("a/f"), k("l"), k("a"))
        }),
        ("mkfifo p", |d| {
            rc(unsafe { libc::mkfifo(c(&d.join("p")).as_ptr(), 0o644) })
        }),
        ("setxattr user.k on a/g", |d| {
            setxattr(&d.join("a/g"), "user.k", b"v")
                .map_or_else(|e| ename(e.raw_os_error().unwrap_or(0)), |_| "ok".into())
        }),
        ("getxattr user.k", |d| {
            getxattr(&d.join("a/g"), "user.k").map_or_else(
                |e| ename(e.raw_os_error().unwrap_or(0)),
                |v| String::from_utf8_lossy(&v).into_owned(),
            )
        }),
        ("getxattr user.none", |d| {
            getxattr(&d.join("a/g"), "user.none").map_or_else(
                |e| ename(e.raw_os_error().unwrap_or(0)),
                |v| String::from_utf8_lossy(&v).into_owned(),
            )
        }),
        ("removexattr user.k", |d| {
            removexattr(&d.join("a/g"), "user.k")
                .map_or_else(|e| ename(e.raw_os_error().unwrap_or(0)), |_| "ok".into())
        }),
        ("utimes a/g", |d| {
            utimes(&d.join("a/g"), 1_000_000)
                .map_or_else(|e| ename(e.raw_os_error().unwrap_or(0)), |_| "ok".into())
        }),
        ("mtime a/g", |d| {
            fs::metadata(d.join("a/g")).map_or("err".into(), |m| m.mtime().to_string())
        }),
        ("long name", |d| {
            let n = "x".repeat(256);
            let fd = unsafe {
                libc::open(
                    c(&d.join(n)).as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY,
                    0o644,
                )
            };
            rc(fd)
        }),
        ("non-utf8 name", |d| {
            let p = d.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
            fs::write(&p, b"x")
                .map_or_else(|e| ename(e.raw_os_error().unwrap_or(0)), |_| "ok".into())
        }),
        ("unlink a/g", |d| {
            rc(unsafe { libc::unlink(c(&d.join("a/g")).as_ptr()) })
        }),
        ("rmdir b/x, b", |d| {
            let a = rc(unsafe { libc::rmdir(c(&d.join("b/x")).as_ptr()) });
            let b = rc(unsafe { libc::rmdir(c(&d.join("b")).as_ptr()) });
            format!("{a} {b}")
        }),
    ]
}

fn listing(d: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = fs::read_dir(d.join(&rel)) else {
            continue;
        };
        for e in rd.flatten() {
            let r = rel.join(e.file_name());
            let md = fs::symlink_metadata(d.join(&r)).unwrap();
            let kind = md.mode() & libc::S_IFMT;
            let content = if md.is_file() {
                String::from_utf8_lossy(&fs::read(d.join(&r)).unwrap_or_default()).into_owned()
            } else {
                String::new()
            };
            out.push(format!(
                "{} {:o} {:o} {} {content}",
                r.display(),
                kind,
                md.mode() & 0o7777,
                if md.is_dir() { 0 } else { md.len() }
            ));
            if md.is_dir() {
                stack.push(r);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn allow_all_mount_behaves_like_the_plain_directory() {
    let plain = Workspace::new("diff-plain");
    let m = Mount::with("diff-mount", Some(ALLOW_ALL), None, |_| {});
    let mut diffs = Vec::new();
    let mut plain_out = std::collections::HashMap::new();
    for (what, step) in steps() {
        let a = step(&plain.src());
        let b = step(&m.mnt(""));
        if a != b {
            diffs.push(format!("{what}: plain {a:?} vs mount {b:?}"));
        }
        plain_out.insert(what, a);
    }
    // The scenarios really exercise error paths (the comparison is not vacuous).
    assert_eq!(plain_out["mkdir a again"], "EEXIST");
    assert_eq!(plain_out["rmdir non-empty a"], "ENOTEMPTY");
    assert_eq!(plain_out["open a/f/x (ENOTDIR)"], "ENOTDIR");
    assert_eq!(plain_out["long name"], ename(libc::ENAMETOOLONG));
    assert_eq!(plain_out["RENAME_NOREPLACE onto existing"], "EEXIST");
    let (la, lb) = (listing(&plain.src()), listing(&m.mnt("")));
    if la != lb {
        diffs.push(format!("final tree differs:\nplain {la:#?}\nmount {lb:#?}"));
    }
    // And what the mount did is really on the host.
    assert_eq!(
        listing(&m.host("")),
        lb,
        "host tree vs what the mount shows"
    );
    assert!(diffs.is_empty(), "differences:\n{}", diffs.join("\n"));
}
