//! The mirror itself: lookup, stat, readdir, read, symlinks, odd names, big directories and
//! big files behave as on the host.

mod common;

use common::*;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

fn basic_tree(src: &Path) {
    put(&src.join("hello.txt"), b"hello world\n", 0o644);
    put(&src.join("exec.sh"), b"#!/bin/sh\necho ok\n", 0o755);
    put(&src.join("private"), b"mode 600\n", 0o600);
    put(&src.join("empty"), b"", 0o644);
    put(&src.join("dir/sub/deep.txt"), b"deep\n", 0o640);
    put(&src.join("dir/a"), b"a\n", 0o644);
    mkdirp(&src.join("emptydir"));
    symlink("hello.txt", &src.join("link_rel"));
    symlink("dir/sub", &src.join("link_dir"));
    symlink("does/not/exist", &src.join("dangling"));
    symlink("../../../../..//weird/../target", &src.join("odd_target"));
}

#[test]
fn mirror_lookup_stat_readdir_read() {
    let m = Mount::with("basic", None, None, basic_tree);
    let src = m.host("");
    let before = snapshot(&src);

    // readdir matches the host exactly, at every level.
    for d in ["", "dir", "dir/sub", "emptydir"] {
        assert_eq!(
            names(&m.mnt(d)).unwrap(),
            names(&m.host(d)).unwrap(),
            "readdir {d:?}"
        );
    }
    // stat: type, mode, size, mtime, nlink, uid/gid as on the host.
    for p in [
        "hello.txt",
        "exec.sh",
        "private",
        "empty",
        "dir",
        "dir/sub/deep.txt",
        "emptydir",
        "link_rel",
        "dangling",
    ] {
        let h = fs::symlink_metadata(m.host(p)).unwrap();
        let g = fs::symlink_metadata(m.mnt(p))
            .unwrap_or_else(|e| panic!("lstat {p} through the mount: {e}"));
        assert_eq!(g.file_type(), h.file_type(), "{p}: type");
        assert_eq!(g.mode(), h.mode(), "{p}: mode");
        assert_eq!(g.len(), h.len(), "{p}: size");
        assert_eq!(
            (g.mtime(), g.mtime_nsec()),
            (h.mtime(), h.mtime_nsec()),
            "{p}: mtime"
        );
        assert_eq!((g.uid(), g.gid()), (h.uid(), h.gid()), "{p}: owner");
        if !h.is_dir() {
            assert_eq!(g.nlink(), h.nlink(), "{p}: nlink");
        }
    }
    // read
    assert_eq!(read_all(&m.mnt("hello.txt")).unwrap(), b"hello world\n");
    assert_eq!(read_all(&m.mnt("dir/sub/deep.txt")).unwrap(), b"deep\n");
    assert_eq!(read_all(&m.mnt("empty")).unwrap(), b"");
    let mut f = fs::File::open(m.mnt("hello.txt")).unwrap();
    let mut buf = [0u8; 5];
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut buf, 6).unwrap();
    assert_eq!(&buf, b"world", "pread at an offset");
    f.read_to_end(&mut vec![]).unwrap();
    // Symlinks: mirrored as symlinks, readlink returns the stored target unchanged.
    for (l, t) in [
        ("link_rel", "hello.txt"),
        ("link_dir", "dir/sub"),
        ("dangling", "does/not/exist"),
        ("odd_target", "../../../../..//weird/../target"),
    ] {
        assert!(
            fs::symlink_metadata(m.mnt(l))
                .unwrap()
                .file_type()
                .is_symlink(),
            "{l} is a symlink"
        );
        assert_eq!(
            fs::read_link(m.mnt(l)).unwrap(),
            Path::new(t),
            "readlink {l}"
        );
    }
    assert_eq!(
        read_all(&m.mnt("link_rel")).unwrap(),
        b"hello world\n",
        "read through link_rel"
    );
    assert_eq!(
        names_str(&m.mnt("link_dir")).unwrap(),
        ["deep.txt"],
        "readdir through link_dir"
    );
    assert_errno(
        fs::read(m.mnt("dangling")),
        libc::ENOENT,
        "read through dangling",
    )
    .ok();
    // exec
    let o = m.sh("./exec.sh");
    o.assert_ok("exec ./exec.sh");
    assert_eq!(o.stdout, "ok\n");
    // Shell tools see the same thing.
    let o =
        m.sh("ls -la >/dev/null && find . | sort && du -s . >/dev/null && stat -c %s hello.txt");
    o.assert_ok("ls/find/du/stat");
    assert!(
        o.stdout.contains("./dir/sub/deep.txt") && o.stdout.ends_with("12\n"),
        "{}",
        o.stdout
    );
    // The mount itself.
    let opts = mount_options(&m.mnt("")).unwrap();
    assert!(
        opts.contains("nosuid") && opts.contains("nodev"),
        "mount must be nosuid,nodev: {opts}"
    );
    let st = nix::sys::statvfs::statvfs(&m.mnt("")).expect("statvfs through the mount");
    assert!(st.blocks() > 0, "statvfs reports no blocks");

    assert_host_unchanged(&before, &src, "reading the mirror");
}

#[test]
fn symlink_outside_the_workspace_is_mirrored_not_followed_by_the_daemon() {
    let mut b = Mount::builder("outside-link");
    put(&b.outside().join("o.txt"), b"outside content\n", 0o644);
    let abs = b.outside().join("o.txt");
    symlink(&abs, &b.host("abs_out"));
    // Resolves to ROOT/outside/o.txt on the host, but to ROOT/mp/outside/o.txt (absent) when
    // the caller's kernel resolves it through the mount at ROOT/mp/mnt.
    symlink("../outside/o.txt", &b.host("rel_out"));
    b = b.mode("read-only");
    let m = b.start();

    for (l, t) in [
        ("abs_out", abs.as_os_str().as_bytes().to_vec()),
        ("rel_out", b"../outside/o.txt".to_vec()),
    ] {
        let md = fs::symlink_metadata(m.mnt(l)).unwrap();
        assert!(
            md.file_type().is_symlink(),
            "{l}: lstat through the mount must show a symlink"
        );
        assert_eq!(md.len() as usize, t.len(), "{l}: symlink size");
        assert_eq!(
            fs::read_link(m.mnt(l)).unwrap().as_os_str().as_bytes(),
            &t[..],
            "{l}: readlink"
        );
    }
    // The caller's kernel follows the absolute one (that is the caller's own view).
    assert_eq!(read_all(&m.mnt("abs_out")).unwrap(), b"outside content\n");
    // The relative one resolves through the mount, where nothing is there: had the daemon
    // followed it on the host, this would return the outside content.
    assert_errno(
        fs::read(m.mnt("rel_out")),
        libc::ENOENT,
        "read through rel_out",
    )
    .ok();
    assert_errno(
        fs::metadata(m.mnt("rel_out")),
        libc::ENOENT,
        "stat through rel_out",
    )
    .ok();
    // O_NOFOLLOW on the link itself: ELOOP, as on any filesystem.
    assert_errno(
        open_flags(&m.mnt("abs_out"), libc::O_RDONLY | libc::O_NOFOLLOW, 0),
        libc::ELOOP,
        "O_NOFOLLOW open of a symlink",
    )
    .ok();
}

#[test]
fn non_utf8_names() {
    let names_raw: [&[u8]; 3] = [b"caf\xe9.txt", b"\xff\xfe", b"ok-\x80-name"];
    let m = Mount::with(
        "nonutf8",
        Some("default = \"write\"\n"),
        Some("danger"),
        |src| {
            for (i, n) in names_raw.iter().enumerate() {
                put(
                    &src.join(bpath(n)),
                    format!("content {i}\n").as_bytes(),
                    0o644,
                );
            }
            put(
                &src.join(bpath(b"dir\xe9")).join("inner"),
                b"inner\n",
                0o644,
            );
        },
    );
    let mut want: Vec<Vec<u8>> = names_raw.iter().map(|n| n.to_vec()).collect();
    want.push(b"dir\xe9".to_vec());
    want.sort();
    assert_eq!(
        names(&m.mnt("")).unwrap(),
        want,
        "readdir returns the raw bytes"
    );
    for (i, n) in names_raw.iter().enumerate() {
        assert_eq!(
            read_all(&m.mnt(bpath(n))).unwrap(),
            format!("content {i}\n").as_bytes(),
            "open {:?}",
            String::from_utf8_lossy(n)
        );
    }
    assert_eq!(
        read_all(&m.mnt(bpath(b"dir\xe9/inner"))).unwrap(),
        b"inner\n"
    );
    // Create one through the mount: the host gets the same bytes.
    fs::write(m.mnt(bpath(b"new-\xe9\xff")), b"new\n").unwrap();
    assert_eq!(fs::read(m.host(bpath(b"new-\xe9\xff"))).unwrap(), b"new\n");
    fs::rename(m.mnt(bpath(b"new-\xe9\xff")), m.mnt(bpath(b"ren-\xfe"))).unwrap();
    assert!(m.host(bpath(b"ren-\xfe")).exists());
}

#[test]
fn non_utf8_names_match_rules_as_bytes() {
    // A glob matches the raw bytes: `*.pem` hides a non-UTF-8 name ending in .pem.
    let policy = "default = \"read\"\n[[rule]]\npath = \"*.pem\"\naccess = \"none\"\n";
    let m = Mount::with("nonutf8-rules", Some(policy), None, |src| {
        put(&src.join(bpath(b"k\xe9y.pem")), b"SECRET\n", 0o644);
        put(&src.join(bpath(b"k\xe9y.txt")), b"open\n", 0o644);
    });
    assert_eq!(names(&m.mnt("")).unwrap(), vec![b"k\xe9y.txt".to_vec()]);
    assert_errno(
        fs::read(m.mnt(bpath(b"k\xe9y.pem"))),
        libc::ENOENT,
        "open hidden non-UTF-8 .pem",
    )
    .ok();
}

#[test]
fn five_thousand_entries() {
    const N: usize = 5000;
    let m = Mount::with("bigdir", None, None, |src| {
        let d = src.join("big");
        fs::create_dir(&d).unwrap();
        for i in 0..N {
            fs::write(d.join(format!("entry-{i:05}")), b"").unwrap();
        }
    });
    let got = names(&m.mnt("big")).unwrap();
    assert_eq!(got.len(), N, "readdir count");
    let want: Vec<Vec<u8>> = (0..N)
        .map(|i| format!("entry-{i:05}").into_bytes())
        .collect();
    assert_eq!(got, want, "readdir names");
    // Through a shell too (readdir + stat of every entry).
    let o = m.sh("ls -l big | tail -n +2 | wc -l; find big -type f | wc -l");
    o.assert_ok("ls -l big");
    assert_eq!(o.stdout, format!("{N}\n{N}\n"));
    // Each entry can be looked up.
    for i in (0..N).step_by(97) {
        fs::metadata(m.mnt(format!("big/entry-{i:05}"))).unwrap();
    }
}

const BIG: usize = 100 << 20;

fn compare_big(p: &Path, want: &[u8]) {
    let mut f = fs::File::open(p).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert!(
            off + n <= want.len(),
            "{}: longer than expected",
            p.display()
        );
        if buf[..n] != want[off..off + n] {
            let i = (0..n).find(|&i| buf[i] != want[off + i]).unwrap();
            panic!("{}: byte {} differs", p.display(), off + i);
        }
        off += n;
    }
    assert_eq!(off, want.len(), "{}: length", p.display());
}

#[test]
fn hundred_mib_file_reads_and_writes_back_identical() {
    let data = pseudo_random(BIG, 0x5eed);
    let m = Mount::with(
        "bigfile",
        Some("default = \"write\"\n"),
        Some("workspace-write"),
        |src| {
            fs::write(src.join("big.bin"), &data).unwrap();
        },
    );
    let t = Instant::now();
    compare_big(&m.mnt("big.bin"), &data);
    let read_time = t.elapsed();
    // Write it through the mount.
    let t = Instant::now();
    {
        let mut f = fs::File::create(m.mnt("copy.bin")).unwrap();
        for chunk in data.chunks(1 << 20) {
            f.write_all(chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    let write_time = t.elapsed();
    compare_big(&m.host("copy.bin"), &data);
    compare_big(&m.mnt("copy.bin"), &data);
    // cp and sha256sum through a shell agree with the host.
    let o = m.sh("cp big.bin copy2.bin && sha256sum big.bin copy2.bin");
    o.assert_ok("cp + sha256sum");
    let h = sh_in(&m.host(""), "sha256sum big.bin");
    let host_sum = h.stdout.split_whitespace().next().unwrap().to_string();
    assert_eq!(
        o.stdout
            .lines()
            .filter(|l| l.starts_with(&host_sum))
            .count(),
        2,
        "{}\nhost: {}",
        o.stdout,
        h.stdout
    );
    eprintln!("100 MiB: read {read_time:?}, write {write_time:?}");
    assert!(read_time < Duration::from_secs(60) && write_time < Duration::from_secs(60));
}

#[test]
fn host_changes_show_up_through_the_mount() {
    let m = Mount::with("hostchange", None, None, |src| {
        put(&src.join("f"), b"one\n", 0o644)
    });
    assert_eq!(read_all(&m.mnt("f")).unwrap(), b"one\n");
    fs::write(m.host("f"), b"two, longer\n").unwrap();
    put(&m.host("g"), b"g\n", 0o644);
    fs::remove_file(m.host("f")).unwrap();
    put(&m.host("f"), b"three\n", 0o644);
    assert!(
        eventually(Duration::from_secs(5), || read_all(&m.mnt("f"))
            .ok()
            .as_deref()
            == Some(&b"three\n"[..])),
        "host edits never became visible through the mount"
    );
    assert!(
        eventually(Duration::from_secs(5), || m.mnt("g").exists()),
        "new host file never appeared"
    );
    fs::remove_file(m.host("g")).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !m.mnt("g").exists()),
        "removed host file never disappeared"
    );
}

#[test]
fn mutations_through_the_mount_land_on_the_host() {
    let m = Mount::with(
        "mutate",
        Some("default = \"write\"\n"),
        Some("danger"),
        |src| {
            put(&src.join("f"), b"f\n", 0o644);
        },
    );
    fs::create_dir(m.mnt("d")).unwrap();
    fs::write(m.mnt("d/x"), b"x\n").unwrap();
    std::os::unix::fs::symlink("x", m.mnt("d/lx")).unwrap();
    fs::hard_link(m.mnt("f"), m.mnt("d/hf")).unwrap();
    fs::set_permissions(m.mnt("d/x"), fs::Permissions::from_mode(0o600)).unwrap();
    truncate(&m.mnt("f"), 1).unwrap();
    utimes(&m.mnt("d/x"), 1_000_000).unwrap();
    setxattr(&m.mnt("d/x"), "user.tag", b"t").unwrap();
    assert_eq!(getxattr(&m.mnt("d/x"), "user.tag").unwrap(), b"t");
    assert_eq!(fs::read(m.host("d/x")).unwrap(), b"x\n");
    assert_eq!(fs::read_link(m.host("d/lx")).unwrap(), Path::new("x"));
    assert_eq!(fs::metadata(m.host("f")).unwrap().nlink(), 2);
    assert_eq!(fs::read(m.host("f")).unwrap(), b"f");
    let md = fs::metadata(m.host("d/x")).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o600);
    assert_eq!(md.mtime(), 1_000_000);
    assert_eq!(lgetxattr(&m.host("d/x"), b"user.tag").unwrap(), b"t");
    fs::remove_file(m.mnt("d/hf")).unwrap();
    fs::remove_file(m.mnt("d/lx")).unwrap();
    fs::remove_file(m.mnt("d/x")).unwrap();
    fs::remove_dir(m.mnt("d")).unwrap();
    assert!(!m.host("d").exists());
    // Host errors pass through unchanged.
    fs::create_dir(m.mnt("ne")).unwrap();
    fs::write(m.mnt("ne/x"), b"").unwrap();
    assert_errno(
        fs::remove_dir(m.mnt("ne")),
        libc::ENOTEMPTY,
        "rmdir non-empty",
    )
    .ok();
    assert_errno(fs::create_dir(m.mnt("ne")), libc::EEXIST, "mkdir existing").ok();
    assert_errno(
        open_flags(
            &m.mnt("f"),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            0o644,
        ),
        libc::EEXIST,
        "O_EXCL existing",
    )
    .ok();
    assert_errno(
        fs::remove_file(m.mnt("nonexistent")),
        libc::ENOENT,
        "unlink missing",
    )
    .ok();
}

/// A directory without search permission lists as on the host: root lists a mode-000
/// directory natively, and so through the mount, before and after a host chmod. The
/// daemon opens a listing with `openat(node, ".")`, which needs search permission on the
/// directory (a root daemon has it through CAP_DAC_READ_SEARCH; one without it falls
/// back to the `/proc/self/fd` reopen, which this root-run test does not reach).
#[test]
fn directories_without_search_permission_list_as_on_the_host() {
    let m = Mount::with("noexec-dirs", None, None, |src| {
        put(&src.join("locked/a"), b"a\n", 0o644);
        put(&src.join("locked/b"), b"b\n", 0o644);
        mkdirp(&src.join("readonly/sub"));
        chmod(&src.join("locked"), 0o000).unwrap();
        chmod(&src.join("readonly"), 0o444).unwrap();
    });
    let before = snapshot(&m.host(""));
    for d in ["locked", "readonly"] {
        let want = names(&m.host(d)).unwrap();
        assert!(!want.is_empty(), "{d}: the host lists it");
        assert_eq!(names(&m.mnt(d)).unwrap(), want, "{d}");
    }
    chmod(&m.host("locked"), 0o100).unwrap();
    assert_eq!(
        names(&m.mnt("locked")).unwrap(),
        names(&m.host("locked")).unwrap(),
        "locked, mode 100"
    );
    chmod(&m.host("locked"), 0o000).unwrap();
    assert_eq!(
        snapshot(&m.host("")),
        before,
        "listing changed nothing on the host"
    );
    chmod(&m.host("locked"), 0o755).unwrap();
    chmod(&m.host("readonly"), 0o755).unwrap();
}
