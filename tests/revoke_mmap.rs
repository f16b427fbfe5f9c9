//! `--revoke` and shared memory maps: SQLite in WAL mode (its `-shm` index is a shared
//! writable map) works with two concurrent writers, shared maps read and write the host
//! file, and a reload that revokes a path makes its existing map fault instead of serving
//! the old pages. The kernel's writeback carries no caller: it is decided for the uid that
//! opened the file, both ways (a revoked uid's map stops reaching the host; a write only a
//! uid rule grants is not refused as root's).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

const PY: &str = "/usr/bin/python3";
const OPEN: &str = "mode = \"danger\"\ndefault = \"write\"\n";

fn py(m: &Mount, code: &str) -> Out {
    Command::new(PY)
        .arg("-c")
        .arg(code)
        .current_dir(m.mnt("."))
        .output()
        .expect("run python3")
        .into()
}

#[test]
fn sqlite_wal_with_two_writers_under_revoke() {
    let b = Mount::builder("revoke-wal").policy(OPEN).arg("--revoke");
    mkdirp(&b.host("db"));
    let m = b.start();
    // The INIT reply (and its log line) may come a moment after the mount appears.
    eventually(Duration::from_secs(5), || m.stderr().contains("file I/O"));
    assert!(
        m.stderr().contains("shared mmap allowed"),
        "stderr: {}",
        m.stderr()
    );
    let setup = py(
        &m,
        "import sqlite3\n\
         c = sqlite3.connect('db/t.sqlite')\n\
         print(c.execute('pragma journal_mode=wal').fetchone()[0])\n\
         c.execute('create table t (w int, i int)'); c.commit()\n",
    );
    setup.assert_ok("create a WAL database");
    assert_eq!(setup.stdout.trim(), "wal");
    // Two writers at once, each 300 single-row transactions.
    let writer = |w: u32| {
        Command::new(PY)
            .arg("-c")
            .arg(format!(
                "import sqlite3\n\
                 c = sqlite3.connect('db/t.sqlite', timeout=30)\n\
                 for i in range(300):\n    c.execute('insert into t values ({w}, ?)', (i,)); c.commit()\n"
            ))
            .current_dir(m.mnt("."))
            .spawn()
            .unwrap()
    };
    let mut a = writer(1);
    let mut b = writer(2);
    assert!(a.wait().unwrap().success(), "writer 1 failed");
    assert!(b.wait().unwrap().success(), "writer 2 failed");
    let check = py(
        &m,
        "import sqlite3\n\
         import os\n\
         c = sqlite3.connect('db/t.sqlite')\n\
         print(c.execute('select w, count(*) from t group by w').fetchall(), \
         c.execute('pragma integrity_check').fetchone()[0], \
         os.path.exists('db/t.sqlite-shm'))\n",
    );
    check.assert_ok("read back");
    // While a connection is open, its WAL index is the shared map of `-shm`.
    assert_eq!(check.stdout.trim(), "[(1, 300), (2, 300)] ok True");
    // The host copy is the same database.
    let o = Command::new("sqlite3")
        .arg(m.host("db/t.sqlite"))
        .arg("select count(*) from t")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "600");
}

#[test]
fn shared_maps_under_revoke_write_through_and_fault_once_revoked() {
    let b = Mount::builder("revoke-mmap").policy(OPEN).arg("--revoke");
    put(&b.host("f"), &vec![b'a'; 8192], 0o644);
    put(&b.host("g"), &vec![b'r'; 8192], 0o644);
    let m = b.start();
    // A shared writable map: a store lands in the host file.
    let o = py(
        &m,
        "import mmap, os\n\
         fd = os.open('f', os.O_RDWR)\n\
         mm = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)\n\
         mm[0:5] = b'hello'; mm.flush(); mm.close(); print('ok')\n",
    );
    o.assert_ok("shared writable mmap under --revoke");
    assert_eq!(&std::fs::read(m.host("f")).unwrap()[..6], b"helloa");
    // A shared read-only map held across a reload that hides the file: the next touch
    // faults (SIGBUS) instead of serving the old pages.
    let mut holder = Command::new(PY)
        .arg("-c")
        .arg(
            "import mmap, os, sys\n\
             fd = os.open('g', os.O_RDONLY)\n\
             mm = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ)\n\
             print(mm[0:3].decode(), flush=True)\n\
             sys.stdin.readline()\n\
             print(mm[4096:4099].decode(), flush=True)\n",
        )
        .current_dir(m.mnt("."))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "rrr", "the map reads the file");
    m.reload_with("mode = \"danger\"\n[[rule]]\npath = \"g\"\naccess = \"none\"\n");
    assert!(
        eventually(Duration::from_secs(2), || m
            .stderr()
            .contains("policy reloaded")),
        "reload: {}",
        m.stderr()
    );
    std::io::Write::write_all(holder.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let st = holder.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        st.signal(),
        Some(libc::SIGBUS),
        "a revoked shared map faults ({st})"
    );
}

/// python3 as `uid` (and gid), in the mount.
fn py_as(m: &Mount, uid: u32, code: &str) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    Command::new(PY)
        .arg("-c")
        .arg(code)
        .current_dir(m.mnt("."))
        .uid(uid)
        .gid(uid)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run python3")
}

/// Maps `f` shared and writable, stores `hello` at 0 and msyncs; prints `first: ok` (or
/// the error); then waits for a line on stdin, stores `world` at 0, msyncs and prints
/// `second: ok` (or the error). The kernel writes dirty shared pages back on its own,
/// with no caller in the request (uid 0, pid 0).
const MAP_WRITER: &str = r#"
import mmap, os, sys
fd = os.open('f', os.O_RDWR)
mm = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
def store(what, data):
    try:
        mm[0:5] = data; mm.flush(); print(what + ': ok', flush=True)
    except OSError as e:
        print(what + ': ' + os.strerror(e.errno), flush=True)
store('first', b'hello')
sys.stdin.readline()
store('second', b'world')
try:
    os.close(fd)
except OSError:
    pass
"#;

/// The writer's next line; at its end of output, what it wrote to stderr.
fn line(w: &mut std::process::Child, r: &mut impl std::io::BufRead) -> String {
    let mut s = String::new();
    r.read_line(&mut s).unwrap();
    if s.is_empty() {
        let mut e = String::new();
        let _ = std::io::Read::read_to_string(w.stderr.as_mut().unwrap(), &mut e);
        return format!("(no output; stderr: {e})");
    }
    s.trim().to_string()
}

#[test]
fn writeback_of_a_revoked_uids_shared_map_is_refused() {
    // Everyone may write; a reload then cuts uid 1000 to read. Its pwrite fails, and so
    // must the kernel's writeback of what it stores through a map it already holds: the
    // writeback carries no caller and is decided for the uid that opened the file.
    let b = Mount::builder("revoke-wb-cut")
        .policy(OPEN)
        .arg("--revoke")
        .arg("--allow-other");
    put(&b.host("f"), &vec![b'a'; 8192], 0o666);
    let m = b.start();
    let mut w = py_as(&m, 1000, MAP_WRITER);
    let mut out = std::io::BufReader::new(w.stdout.take().unwrap());
    assert_eq!(
        line(&mut w, &mut out),
        "first: ok",
        "a granted shared-map write"
    );
    assert_eq!(&std::fs::read(m.host("f")).unwrap()[..6], b"helloa");
    m.reload_with(
        "mode = \"danger\"\ndefault = \"write\"\n[[rule]]\npath = \"f\"\naccess = \"read\"\nuid = [1000]\n",
    );
    assert!(
        eventually(Duration::from_secs(5), || m
            .stderr()
            .contains("policy reloaded")),
        "reload: {}",
        m.stderr()
    );
    // The same uid's write is refused now (the reference for the writeback below).
    let o = m.sh_as(1000, "printf x | dd of=f conv=notrunc status=none");
    o.assert_fail("write by the revoked uid");
    assert!(o.stderr.contains("Permission denied"), "{}", o.stderr);
    std::io::Write::write_all(w.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let second = line(&mut w, &mut out);
    let _ = w.wait();
    let host = std::fs::read(m.host("f")).unwrap();
    assert_eq!(
        &host[..6],
        b"helloa",
        "the revoked uid's store through its map reached the host (msync: {second})"
    );
    assert_eq!(
        second, "second: Permission denied",
        "msync of a refused writeback"
    );
}

#[test]
fn writeback_through_another_uids_later_map_is_still_decided_for_the_revoked_uid() {
    // The kernel writes a file's dirty shared pages back through the newest shared
    // writable map's handle, whoever dirtied them: here uid 2000's (never revoked), mapped
    // after uid 1000's. The writeback of uid 1000's store after the reload cut it to read
    // must not be decided for uid 2000.
    let b = Mount::builder("revoke-wb-other")
        .policy(OPEN)
        .arg("--revoke")
        .arg("--allow-other");
    put(&b.host("f"), &vec![b'a'; 8192], 0o666);
    let m = b.start();
    let mut w = py_as(&m, 1000, MAP_WRITER);
    let mut out = std::io::BufReader::new(w.stdout.take().unwrap());
    assert_eq!(line(&mut w, &mut out), "first: ok");
    let mut other = py_as(&m, 2000, MAP_WRITER);
    let mut other_out = std::io::BufReader::new(other.stdout.take().unwrap());
    assert_eq!(
        line(&mut other, &mut other_out),
        "first: ok",
        "uid 2000 maps f"
    );
    m.reload_with(
        "mode = \"danger\"\ndefault = \"write\"\n[[rule]]\npath = \"f\"\naccess = \"read\"\nuid = [1000]\n",
    );
    assert!(
        eventually(Duration::from_secs(5), || m
            .stderr()
            .contains("policy reloaded")),
        "reload: {}",
        m.stderr()
    );
    std::io::Write::write_all(w.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let second = line(&mut w, &mut out);
    let _ = w.wait();
    let host = std::fs::read(m.host("f")).unwrap();
    drop(other.stdin.take());
    let _ = other.wait();
    assert_eq!(
        &host[..6],
        b"helloa",
        "the revoked uid's store reached the host through uid 2000's map (msync: {second})"
    );
    assert_eq!(second, "second: Permission denied");
}

#[test]
fn writeback_granted_only_to_the_opener_is_not_refused() {
    // Only uid 1000 may write `f` (a uid rule); the kernel's writeback of its shared map
    // (no caller: uid 0) is that uid's write, not root's, and must reach the host.
    let b = Mount::builder("revoke-wb-owner")
        .policy(
            "mode = \"danger\"\ndefault = \"read\"\n[[rule]]\npath = \"f\"\naccess = \"write\"\nuid = [1000]\n",
        )
        .arg("--revoke")
        .arg("--allow-other");
    put(&b.host("f"), &vec![b'a'; 8192], 0o666);
    let m = b.start();
    let mut w = py_as(&m, 1000, MAP_WRITER);
    let mut out = std::io::BufReader::new(w.stdout.take().unwrap());
    assert_eq!(
        line(&mut w, &mut out),
        "first: ok",
        "the opener's writeback was refused"
    );
    assert_eq!(&std::fs::read(m.host("f")).unwrap()[..6], b"helloa");
    std::io::Write::write_all(w.stdin.as_mut().unwrap(), b"go\n").unwrap();
    assert_eq!(line(&mut w, &mut out), "second: ok");
    assert!(w.wait().unwrap().success());
    assert_eq!(&std::fs::read(m.host("f")).unwrap()[..6], b"worlda");
    // Root itself still cannot write it.
    let r = std::fs::OpenOptions::new().write(true).open(m.mnt("f"));
    let _ = assert_errno(r, libc::EACCES, "root opens f for writing");
}

#[test]
fn sqlite_wal_of_a_uid_granted_by_a_uid_rule_under_revoke() {
    // SQLite's WAL index (`-shm`) is a shared writable map; the kernel writes it back with
    // no caller. Only uid 1000 may write `db` here: none of its writes, the writeback
    // included, may be refused (they were, as root's, and the index pages lost).
    let b = Mount::builder("revoke-wal-uid")
        .policy(
            "mode = \"danger\"\ndefault = \"read\"\n[[rule]]\npath = \"db\"\naccess = \"write\"\nuid = [1000]\n",
        )
        .arg("--revoke")
        .arg("--allow-other");
    mkdirp(&b.host("db"));
    let audit = b.root().join("audit.jsonl");
    std::fs::set_permissions(
        b.host("db"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let m = b.arg("--audit").arg(&audit).start();
    let run = |code: &str| {
        let mut c = py_as(&m, 1000, code);
        let st = c.wait().unwrap();
        let mut e = String::new();
        let _ = std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut e);
        let mut o = String::new();
        let _ = std::io::Read::read_to_string(c.stdout.as_mut().unwrap(), &mut o);
        assert!(st.success(), "{code}: {e}");
        o
    };
    run("import sqlite3\n\
         c = sqlite3.connect('db/t.sqlite')\n\
         c.execute('pragma journal_mode=wal')\n\
         c.execute('create table t (i int)'); c.commit()\n\
         for i in range(200):\n    c.execute('insert into t values (?)', (i,)); c.commit()\n\
         c.close()\n");
    let out = run("import sqlite3\n\
         c = sqlite3.connect('db/t.sqlite')\n\
         print(c.execute('select count(*) from t').fetchone()[0], \
         c.execute('pragma integrity_check').fetchone()[0])\n");
    assert_eq!(out.trim(), "200 ok");
    // The audit writer flushes on its timer.
    std::thread::sleep(Duration::from_millis(1500));
    let log = std::fs::read_to_string(&audit).unwrap_or_default();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("\"decision\":\"deny\""))
        .collect();
    assert!(refused.is_empty(), "refused: {refused:#?}");
}
