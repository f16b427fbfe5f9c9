//! Where audit lines land: standard error, or a file rotated by size.
//!
//! Rotation (file targets with `max_size` > 0): when writing a line would make FILE exceed
//! `max_size`, FILE.(keep-1) → FILE.keep … FILE.1 → FILE.2, FILE → FILE.1 (the old
//! FILE.keep is replaced, i.e. deleted), a fresh FILE is opened and `header` (the
//! `rotated` line) is written first. With `keep` 0 the full FILE is deleted instead. The
//! disk used is bounded by about (keep + 1) × max_size.
//!
//! Invariants: never panics; every error is returned (the caller counts the line as
//! dropped) or logged, and the sink stays usable: a failed rotation is logged and retried
//! only after another `max_size` bytes (so a directory that refuses renames costs one
//! error line per `max_size`, not one per audit line); a file that cannot be (re)opened is
//! retried at the next line. A line never goes to a file that is not FILE, and a line
//! is never split across files. An empty FILE is never rotated (a line larger than
//! `max_size` gets a file of its own).

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::Target;

/// Size-based rotation of a file target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate before FILE would exceed this many bytes; 0 = never rotate.
    pub max_size: u64,
    /// Old files kept (FILE.1 … FILE.keep).
    pub keep: u32,
}

impl Default for Rotation {
    fn default() -> Rotation {
        Rotation {
            max_size: 64 << 20,
            keep: 4,
        }
    }
}

enum Out {
    Stderr,
    File(File),
    /// A file target that could not be (re)opened; retried at the next line.
    Closed,
}

/// The output of the writer thread.
pub struct Sink {
    target: Target,
    rotation: Rotation,
    out: Out,
    /// Bytes in FILE (what was there when opened plus what we wrote).
    size: u64,
    /// No rotation attempt before FILE reaches this size (set after a failed rotation).
    hold_until: u64,
}

impl Sink {
    /// Opens the target; an error here is a startup error.
    pub fn open(target: Target, rotation: Rotation) -> io::Result<Sink> {
        let mut s = Sink {
            target,
            rotation,
            out: Out::Closed,
            size: 0,
            hold_until: 0,
        };
        s.reopen()?;
        Ok(s)
    }

    /// Opens the target again (SIGHUP, after an external logrotate moved FILE away).
    pub fn reopen(&mut self) -> io::Result<()> {
        self.hold_until = 0;
        match &self.target {
            Target::Stderr => {
                self.out = Out::Stderr;
                Ok(())
            }
            Target::File(p) => match open_append(p) {
                Ok((f, size)) => {
                    self.out = Out::File(f);
                    self.size = size;
                    Ok(())
                }
                Err(e) => {
                    self.out = Out::Closed;
                    Err(e)
                }
            },
        }
    }

    /// Writes one whole line (with its newline). Rotates first when the line would not
    /// fit; `header` makes the first line of the fresh file.
    pub fn write_line(&mut self, line: &[u8], header: &dyn Fn() -> Vec<u8>) -> io::Result<()> {
        if matches!(self.out, Out::Closed) {
            self.reopen()?;
        }
        if self.must_rotate(line.len() as u64) {
            match self.rotate() {
                Ok(()) => {
                    // The header is informative: if it cannot be written the line still
                    // is tried (and its own error reported).
                    let _ = self.write_raw(&header());
                }
                Err(e) => {
                    self.hold_until = self.size.saturating_add(self.rotation.max_size);
                    log::error!(
                        "audit: cannot rotate {:?}: {e}; appending, next attempt after {} more bytes",
                        self.target,
                        self.rotation.max_size
                    );
                }
            }
        }
        self.write_raw(line)
    }

    fn must_rotate(&self, len: u64) -> bool {
        matches!(self.out, Out::File(_))
            && self.rotation.max_size > 0
            && self.size > 0
            && self.size >= self.hold_until
            && self.size.saturating_add(len) > self.rotation.max_size
    }

    fn rotate(&mut self) -> io::Result<()> {
        let Target::File(p) = &self.target else {
            return Ok(());
        };
        shift(p, self.rotation.keep)?;
        // FILE is gone now: whatever happens next, never write to the old descriptor.
        self.out = Out::Closed;
        let (f, size) = open_append(p)?;
        self.out = Out::File(f);
        self.size = size;
        Ok(())
    }

    fn write_raw(&mut self, line: &[u8]) -> io::Result<()> {
        match &mut self.out {
            Out::Stderr => {
                let mut e = io::stderr().lock();
                e.write_all(line).and_then(|()| e.flush())
            }
            Out::File(f) => {
                let r = f.write_all(line);
                match &r {
                    Ok(()) => self.size = self.size.saturating_add(line.len() as u64),
                    // A partial write (ENOSPC) still took room: ask the file.
                    Err(_) => {
                        if let Ok(m) = f.metadata() {
                            self.size = m.len();
                        }
                    }
                }
                r
            }
            Out::Closed => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "audit file is not open",
            )),
        }
    }
}

/// Mode of a new audit file: the daemon runs with umask 0 (files created through the
/// mount get exactly the caller's mode), so the default 0666 would make the log writable
/// by every user who can reach its directory.
const AUDIT_FILE_MODE: u32 = 0o600;

fn open_append(p: &Path) -> io::Result<(File, u64)> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(AUDIT_FILE_MODE)
        .open(p)?;
    let size = f.metadata()?.len();
    Ok((f, size))
}

/// `FILE.n`.
pub fn numbered(p: &Path, n: u32) -> PathBuf {
    let mut s = OsString::from(p.as_os_str());
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

fn ignore_missing(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Moves FILE to FILE.1 after shifting FILE.i to FILE.(i+1) and deleting FILE.keep;
/// with `keep` 0 deletes FILE. Missing numbered files are fine (a young log).
pub fn shift(p: &Path, keep: u32) -> io::Result<()> {
    if keep == 0 {
        return ignore_missing(fs::remove_file(p));
    }
    ignore_missing(fs::remove_file(numbered(p, keep)))?;
    for i in (1..keep).rev() {
        ignore_missing(fs::rename(numbered(p, i), numbered(p, i + 1)))?;
    }
    fs::rename(p, numbered(p, 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fresh empty directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let d = std::env::temp_dir().join(format!(
                "fencefs-audit-{name}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(&d).unwrap();
            TempDir(d)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn header() -> Vec<u8> {
        b"H\n".to_vec()
    }

    fn read(p: &Path) -> String {
        fs::read_to_string(p).unwrap()
    }

    #[test]
    fn rotates_before_a_line_would_exceed_the_size_and_keeps_n_files() {
        let d = TempDir::new("rot");
        let f = d.0.join("a.log");
        let mut s = Sink::open(
            Target::File(f.clone()),
            Rotation {
                max_size: 10,
                keep: 2,
            },
        )
        .unwrap();
        // Lines of 4 bytes: "L0\n" style would be 3; use 4 for round numbers.
        for i in 0..8 {
            s.write_line(format!("L{i}x\n").as_bytes(), &header)
                .unwrap();
        }
        // FILE: L0 L1 (8 bytes; L2 would make 12) → rotate; fresh file: H L2 (6), L3 → 10
        // fits; L4 would make 14 → rotate; H L4 L5; rotate; H L6 L7.
        assert_eq!(read(&f), "H\nL6x\nL7x\n");
        assert_eq!(read(&numbered(&f, 1)), "H\nL4x\nL5x\n");
        assert_eq!(read(&numbered(&f, 2)), "H\nL2x\nL3x\n");
        // The oldest (L0 L1) was deleted: only keep = 2 old files.
        assert!(!numbered(&f, 3).exists());
        for p in [f.clone(), numbered(&f, 1), numbered(&f, 2)] {
            assert!(fs::metadata(&p).unwrap().len() <= 10, "{}", p.display());
        }
    }

    #[test]
    fn an_existing_file_counts_and_a_huge_line_gets_a_file_of_its_own() {
        let d = TempDir::new("big");
        let f = d.0.join("a.log");
        fs::write(&f, "old-contents\n").unwrap(); // 13 bytes, already over 10
        let rot = Rotation {
            max_size: 10,
            keep: 1,
        };
        let mut s = Sink::open(Target::File(f.clone()), rot).unwrap();
        s.write_line(b"0123456789ABCDEF\n", &header).unwrap();
        assert_eq!(read(&numbered(&f, 1)), "old-contents\n");
        // Header + the oversized line: the file is not rotated again for the same line.
        assert_eq!(read(&f), "H\n0123456789ABCDEF\n");
        s.write_line(b"z\n", &header).unwrap();
        assert_eq!(read(&numbered(&f, 1)), "H\n0123456789ABCDEF\n");
        assert_eq!(read(&f), "H\nz\n");
    }

    #[test]
    fn size_zero_never_rotates_and_keep_zero_deletes() {
        let d = TempDir::new("zero");
        let f = d.0.join("a.log");
        let mut s = Sink::open(
            Target::File(f.clone()),
            Rotation {
                max_size: 0,
                keep: 3,
            },
        )
        .unwrap();
        for _ in 0..100 {
            s.write_line(b"0123456789\n", &header).unwrap();
        }
        assert_eq!(fs::metadata(&f).unwrap().len(), 1100);
        assert!(!numbered(&f, 1).exists());

        let g = d.0.join("b.log");
        let mut s = Sink::open(
            Target::File(g.clone()),
            Rotation {
                max_size: 12,
                keep: 0,
            },
        )
        .unwrap();
        for i in 0..5 {
            s.write_line(format!("{i}{i}{i}{i}{i}\n").as_bytes(), &header)
                .unwrap();
        }
        assert_eq!(read(&g), "H\n44444\n");
        assert!(!numbered(&g, 1).exists());
    }

    #[test]
    fn new_audit_files_are_0600() {
        use std::os::unix::fs::PermissionsExt;
        // The daemon's umask is 0 while it serves; the test's (usually 022) is left alone
        // (other tests run in parallel): 0600 is neither 0666 & !022 nor 0666.
        let d = TempDir::new("mode");
        let f = d.0.join("a.log");
        let rot = Rotation {
            max_size: 10,
            keep: 1,
        };
        let mut s = Sink::open(Target::File(f.clone()), rot).unwrap();
        s.write_line(b"12345678\n", &header).unwrap();
        s.write_line(b"12345678\n", &header).unwrap(); // rotates: a new FILE
        fs::rename(&f, d.0.join("moved")).unwrap();
        s.reopen().unwrap(); // logrotate's SIGHUP: a new FILE
        for p in [f.clone(), numbered(&f, 1), d.0.join("moved")] {
            let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", p.display());
        }
    }

    #[test]
    fn reopen_follows_an_external_rename_and_counts_the_new_file() {
        let d = TempDir::new("reopen");
        let f = d.0.join("a.log");
        let rot = Rotation {
            max_size: 20,
            keep: 4,
        };
        let mut s = Sink::open(Target::File(f.clone()), rot).unwrap();
        s.write_line(b"before\n", &header).unwrap();
        fs::rename(&f, d.0.join("moved")).unwrap();
        s.write_line(b"still-old\n", &header).unwrap();
        s.reopen().unwrap();
        s.write_line(b"after\n", &header).unwrap();
        assert_eq!(read(&d.0.join("moved")), "before\nstill-old\n");
        assert_eq!(read(&f), "after\n");
        // The size restarted from the new file: 6 + 7 = 13 ≤ 20, no rotation.
        s.write_line(b"again!\n", &header).unwrap();
        assert_eq!(read(&f), "after\nagain!\n");
        assert!(!numbered(&f, 1).exists());
    }

    #[test]
    fn a_failed_rotation_is_retried_after_another_max_size_and_never_loses_the_line() {
        let d = TempDir::new("fail");
        let f = d.0.join("a.log");
        let rot = Rotation {
            max_size: 10,
            keep: 1,
        };
        let mut s = Sink::open(Target::File(f.clone()), rot).unwrap();
        s.write_line(b"aaaaaaaa\n", &header).unwrap(); // 9
        // FILE.1 is a non-empty directory: removing it fails (EISDIR / ENOTEMPTY).
        fs::create_dir_all(numbered(&f, 1).join("x")).unwrap();
        s.write_line(b"bbbb\n", &header).unwrap(); // 14 > 10: rotation fails, appended
        fs::remove_dir_all(numbered(&f, 1)).unwrap();
        s.write_line(b"cccc\n", &header).unwrap(); // held until 9 + 10 = 19: appended
        assert_eq!(read(&f), "aaaaaaaa\nbbbb\ncccc\n");
        s.write_line(b"dddd\n", &header).unwrap(); // size 19 ≥ 19: rotates now
        assert_eq!(read(&numbered(&f, 1)), "aaaaaaaa\nbbbb\ncccc\n");
        assert_eq!(read(&f), "H\ndddd\n");
    }

    #[test]
    fn stderr_is_never_rotated() {
        let mut s = Sink::open(
            Target::Stderr,
            Rotation {
                max_size: 1,
                keep: 1,
            },
        )
        .unwrap();
        assert!(!s.must_rotate(100));
        s.write_line(b"", &header).unwrap();
    }
}
