//! The table: 3 modes × 5 access places × 29 operations, exact errno, host unchanged.

use super::*;

// ------------------------------------------------------------------ the table

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    None,
    List,
    Read,
    Write,
    /// No rule: `default = "write"`, but outside `writable_roots` in workspace-write.
    Free,
}

const LEVELS: [Level; 5] = [
    Level::None,
    Level::List,
    Level::Read,
    Level::Write,
    Level::Free,
];

impl Level {
    fn dir(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::List => "list",
            Level::Read => "read",
            Level::Write => "write",
            Level::Free => "free",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Class {
    /// lookup, stat, readdir, readlink: needs `list`.
    Observe,
    /// open for read, exec, getxattr: needs `read`.
    Read,
    /// any mutation or creation: needs `write` and the mode.
    Mutate,
}

const TABLE_POLICY: &str = r#"
default = "write"
writable_roots = ["list", "read", "write"]

[[rule]]
path = "none"
access = "none"

[[rule]]
path = "list"
access = "list"

[[rule]]
path = "read"
access = "read"

[[rule]]
path = "write"
access = "write"
"#;

/// SPEC: none → ENOENT (the parent is hidden, so even creations see ENOENT), then the
/// mode (EROFS), then the rule (EACCES).
fn expected(mode: &str, l: Level, c: Class) -> i32 {
    if l == Level::None {
        return ENOENT;
    }
    match c {
        Class::Observe => 0,
        Class::Read => {
            if l >= Level::Read {
                0
            } else {
                EACCES
            }
        }
        Class::Mutate => {
            if mode == "read-only" {
                EROFS
            } else if l == Level::Free {
                if mode == "workspace-write" { EROFS } else { 0 }
            } else if l < Level::Write {
                EACCES
            } else {
                0
            }
        }
    }
}

const FILES: &[&str] = &[
    "file", "file_w", "file_rw", "file_t", "file_rt", "file_a", "file_tr", "file_u", "file_rn",
    "file_c", "file_ch", "file_ut", "file_l", "file_x", "file_xr", "file_xrm",
];

fn table_layout(src: &Path) {
    for l in LEVELS {
        let d = src.join(l.dir());
        for f in FILES {
            put(&d.join(f), format!("{}/{f}\n", l.dir()).as_bytes(), 0o644);
        }
        put(&d.join("script.sh"), b"#!/bin/sh\necho ran\n", 0o755);
        symlink("file", &d.join("link"));
        put(&d.join("sub/g"), b"g\n", 0o644);
        mkdirp(&d.join("dir_r"));
        put(&d.join("dir_rn/inner"), b"inner\n", 0o644);
        setxattr(&d.join("file_xr"), "user.k", b"v").expect("host user xattrs");
        setxattr(&d.join("file_xrm"), "user.k", b"v").unwrap();
    }
}

type OpFn = fn(&Path) -> io::Result<()>;
pub(super) type BoxedOp<'a> = Box<dyn Fn() -> io::Result<()> + 'a>;

fn check(cond: bool, msg: &str) -> io::Result<()> {
    if cond {
        Ok(())
    } else {
        Err(io::Error::other(msg.to_string()))
    }
}

fn ops() -> Vec<(&'static str, Class, OpFn)> {
    vec![
        ("lstat file", Class::Observe, |d| {
            fs::symlink_metadata(d.join("file")).map(|_| ())
        }),
        ("stat dir", Class::Observe, |d| {
            let m = fs::metadata(d.join("sub"))?;
            check(m.is_dir(), "sub is not a dir")
        }),
        ("readdir", Class::Observe, |d| {
            let n = names_str(&d.join("sub"))?;
            check(n == ["g"], &format!("readdir sub = {n:?}"))
        }),
        ("readlink", Class::Observe, |d| {
            let t = fs::read_link(d.join("link"))?;
            check(t == Path::new("file"), &format!("readlink = {t:?}"))
        }),
        ("lstat symlink", Class::Observe, |d| {
            let m = fs::symlink_metadata(d.join("link"))?;
            check(m.file_type().is_symlink(), "link is not a symlink")
        }),
        ("open O_RDONLY+read", Class::Read, |d| {
            let v = read_all(&d.join("file"))?;
            let want = format!("{}/file\n", d.file_name().unwrap().to_string_lossy());
            check(
                v == want.as_bytes(),
                &format!("content {:?}", String::from_utf8_lossy(&v)),
            )
        }),
        ("open dir O_RDONLY", Class::Observe, |d| {
            open_flags(&d.join("sub"), libc::O_RDONLY | libc::O_DIRECTORY, 0)
        }),
        ("exec script", Class::Read, |d| {
            let o = Command::new(d.join("script.sh")).output()?;
            check(
                o.status.success() && o.stdout == b"ran\n",
                &format!("exec: {o:?}"),
            )
        }),
        ("getxattr", Class::Read, |d| {
            let v = getxattr(&d.join("file_xr"), "user.k")?;
            check(v == b"v", "xattr value")
        }),
        ("open O_WRONLY", Class::Mutate, |d| {
            open_flags(&d.join("file_w"), libc::O_WRONLY, 0)
        }),
        ("open O_RDWR", Class::Mutate, |d| {
            open_flags(&d.join("file_rw"), libc::O_RDWR, 0)
        }),
        ("open O_WRONLY|O_TRUNC", Class::Mutate, |d| {
            open_flags(&d.join("file_t"), libc::O_WRONLY | libc::O_TRUNC, 0)
        }),
        ("open O_RDONLY|O_TRUNC", Class::Mutate, |d| {
            open_flags(&d.join("file_rt"), libc::O_RDONLY | libc::O_TRUNC, 0)
        }),
        ("open O_WRONLY|O_APPEND", Class::Mutate, |d| {
            let mut f = fs::OpenOptions::new().append(true).open(d.join("file_a"))?;
            f.write_all(b"appended\n")
        }),
        ("truncate()", Class::Mutate, |d| {
            truncate(&d.join("file_tr"), 1)
        }),
        ("create O_EXCL", Class::Mutate, |d| {
            open_flags(
                &d.join("new_file"),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                0o644,
            )
        }),
        ("mkdir", Class::Mutate, |d| {
            mkdir_mode(&d.join("new_dir"), 0o755)
        }),
        ("mknod fifo", Class::Mutate, |d| {
            mknod(&d.join("new_fifo"), libc::S_IFIFO | 0o644, 0)
        }),
        ("symlink", Class::Mutate, |d| {
            std::os::unix::fs::symlink("file", d.join("new_link"))
        }),
        ("link", Class::Mutate, |d| {
            fs::hard_link(d.join("file_l"), d.join("new_hard"))
        }),
        ("unlink", Class::Mutate, |d| {
            fs::remove_file(d.join("file_u"))
        }),
        ("rmdir", Class::Mutate, |d| fs::remove_dir(d.join("dir_r"))),
        ("rename file", Class::Mutate, |d| {
            fs::rename(d.join("file_rn"), d.join("file_rn2"))
        }),
        ("rename dir", Class::Mutate, |d| {
            fs::rename(d.join("dir_rn"), d.join("dir_rn2"))
        }),
        ("chmod", Class::Mutate, |d| chmod(&d.join("file_c"), 0o600)),
        ("chown", Class::Mutate, |d| {
            lchown(&d.join("file_ch"), 1000, 1000)
        }),
        ("utimens", Class::Mutate, |d| {
            utimes(&d.join("file_ut"), 1_000_000)
        }),
        ("setxattr", Class::Mutate, |d| {
            setxattr(&d.join("file_x"), "user.new", b"1")
        }),
        ("removexattr", Class::Mutate, |d| {
            removexattr(&d.join("file_xrm"), "user.k")
        }),
    ]
}

fn run_table(mode: &str) {
    let m = Mount::with(
        &format!("table-{mode}"),
        Some(TABLE_POLICY),
        Some(mode),
        table_layout,
    );
    let src = m.host("");
    let mut failures = vec![];
    let mut count = 0;
    for l in LEVELS {
        for (name, class, op) in ops() {
            count += 1;
            let want = expected(mode, l, class);
            let before = snapshot(&src);
            let r = op(&m.mnt(l.dir()));
            let got = errno_of(&r);
            if got != want {
                failures.push(format!(
                    "{mode:>15} {:>5} {name:<24} expected {:<6} got {:<6} {:?}",
                    l.dir(),
                    ename(want),
                    ename(got),
                    r.err()
                ));
            }
            if want != 0 {
                let d = snapshot_diff(&before, &snapshot(&src));
                if !d.is_empty() {
                    failures.push(format!(
                        "{mode:>15} {:>5} {name:<24} refused but the host changed:\n{d}",
                        l.dir()
                    ));
                }
            }
        }
    }
    // The refused truncations left their files intact.
    for l in [Level::List, Level::Read] {
        for f in ["file_t", "file_rt", "file_tr"] {
            let v = fs::read(m.host(format!("{}/{f}", l.dir()))).unwrap();
            if v != format!("{}/{f}\n", l.dir()).as_bytes() {
                failures.push(format!("{mode} {}/{f}: content changed to {v:?}", l.dir()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} table cells wrong in mode {mode}:\n{}\ndaemon stderr:\n{}",
        failures.len(),
        failures.join("\n"),
        m.stderr()
    );
}

#[test]
fn table_read_only() {
    run_table("read-only");
}

#[test]
fn table_workspace_write() {
    run_table("workspace-write");
}

#[test]
fn table_danger() {
    run_table("danger");
}
