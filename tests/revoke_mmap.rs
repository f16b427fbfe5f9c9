//! `--revoke` and shared memory maps: SQLite in WAL mode (its `-shm` index is a shared
//! writable map) works with two concurrent writers, shared maps read and write the host
//! file, and a reload that revokes a path makes its existing map fault instead of serving
//! the old pages.

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
