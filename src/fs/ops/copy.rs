//! copy_file_range served in bounded steps: one request never runs long on the host.
//!
//! A caller may ask for up to 4 GiB in one call, and the host's in-kernel copy writes
//! every byte (holes included, as zeros, on a file system that cannot clone): seconds to
//! minutes inside one request, which a staged mount's view swap would wait for (its gate
//! gives up after 10 s). So the copy goes in steps of at most [`STEP`] bytes of data and
//! answers a short count — which the kernel passes on and every caller of
//! copy_file_range(2) loops on — once [`DATA`] bytes of data were copied, [`TIME`] has
//! passed, [`STEPS`] steps were made, or a swap waits at the gate (`stop`). Holes of the
//! source (`SEEK_DATA`/`SEEK_HOLE`) are not copied: the destination's range is made to
//! read as zeros instead (nothing to do past its end, else a punched hole; where the file
//! system cannot punch, the hole is copied as data), so a sparse copy costs no disk.
//!
//! Invariants: at least one step is made (a call answers 0 only at the source's end); the
//! bytes answered are exactly the source's range `[off_in, off_in + n)`, holes as zeros;
//! an error after some bytes were copied answers those bytes (the caller's next call sees
//! the error).

use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use crate::host::sys;

/// Data bytes one step copies at most.
pub const STEP: u64 = 8 << 20;
/// Data bytes one request copies at most.
pub const DATA: u64 = 64 << 20;
/// How long one request copies at most (it stops after the step that passes it).
pub const TIME: Duration = Duration::from_millis(500);
/// Steps (a data run or a hole) one request makes at most.
pub const STEPS: usize = 1024;

/// Copies `fi[off_in, off_in + len)` to `fo` at `off_out` in bounded steps (module header);
/// returns the bytes copied. `stop`: a swap waits (stop at the next step).
pub fn bounded(
    fi: BorrowedFd<'_>,
    off_in: u64,
    fo: BorrowedFd<'_>,
    off_out: u64,
    len: u64,
    stop: &dyn Fn() -> bool,
) -> io::Result<u64> {
    let size = sys::fstat(fi)?.st_size.max(0) as u64;
    let end = off_in.saturating_add(len).min(size);
    let started = Instant::now();
    let (mut pos, mut data, mut steps) = (off_in, 0u64, 0usize);
    while pos < end {
        if steps > 0 && (data >= DATA || steps >= STEPS || started.elapsed() >= TIME || stop()) {
            break;
        }
        steps += 1;
        let r = step(
            fi,
            pos,
            end,
            fo,
            off_out + (pos - off_in),
            DATA - data.min(DATA),
        );
        match r {
            Ok((0, _)) => break,
            Ok((n, copied)) => {
                pos += n;
                data += copied;
            }
            Err(e) if pos == off_in => return Err(e),
            Err(e) => {
                log::debug!("copy_file_range: short after {} bytes: {e}", pos - off_in);
                break;
            }
        }
    }
    let done = pos - off_in;
    // A copy that ended in a hole past the destination's end: its size still grows.
    if done > 0 {
        let want = off_out + done;
        if (sys::fstat(fo)?.st_size.max(0) as u64) < want {
            sys::ftruncate(fo, want)?;
        }
    }
    Ok(done)
}

/// One step at `pos` (< `end`): a hole made zeros in the destination, or up to [`STEP`]
/// (and `room`) bytes of data copied. Returns (bytes of the source done, data bytes copied).
fn step(
    fi: BorrowedFd<'_>,
    pos: u64,
    end: u64,
    fo: BorrowedFd<'_>,
    at: u64,
    room: u64,
) -> io::Result<(u64, u64)> {
    let data_at = match sys::lseek(fi, pos as i64, libc::SEEK_DATA) {
        Ok(d) => (d.max(0) as u64).min(end),
        // Only holes up to the end of the file.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => end,
        // No hole support: all data.
        Err(_) => pos,
    };
    if data_at > pos && zeroed(fo, at, data_at - pos)? {
        return Ok((data_at - pos, 0));
    }
    let hole_at = if data_at > pos {
        data_at
    } else {
        match sys::lseek(fi, pos as i64, libc::SEEK_HOLE) {
            Ok(h) => (h.max(0) as u64).min(end),
            Err(_) => end,
        }
    };
    let want = (hole_at - pos).min(STEP).min(room.max(1));
    let n = sys::copy_file_range(fi, pos, fo, at, want)? as u64;
    Ok((n, n))
}

/// Makes `fo[at, at + len)` read as zeros without writing them: nothing to do where it
/// has no data (past its end, or a hole already), else a punched hole. `false`: the file
/// system cannot punch (the caller copies the range as data).
fn zeroed(fo: BorrowedFd<'_>, at: u64, len: u64) -> io::Result<bool> {
    let size = sys::fstat(fo)?.st_size.max(0) as u64;
    if at >= size {
        return Ok(true);
    }
    let upto = (at + len).min(size);
    match sys::lseek(fo, at as i64, libc::SEEK_DATA) {
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(true),
        Ok(d) if d.max(0) as u64 >= upto => return Ok(true),
        _ => {}
    }
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    match sys::fallocate(fo, mode, at, upto - at) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};
    use std::os::fd::AsFd;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("fencefs-ops-copy-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        d
    }

    const SIZE: u64 = 256 << 20;

    #[test]
    fn a_sparse_copy_skips_holes_and_stops_short() {
        let (a, b) = (tmp("a"), tmp("b"));
        let mut f = std::fs::File::create(&a).unwrap();
        // 1 MiB of data every 32 MiB of a 256 MiB file.
        for i in 0..8u64 {
            f.seek(SeekFrom::Start(i << 25)).unwrap();
            f.write_all(&vec![i as u8 + 1; 1 << 20]).unwrap();
        }
        f.set_len(SIZE).unwrap();
        // The destination had data where the source has holes: it reads zeros after.
        let mut g = std::fs::File::create(&b).unwrap();
        g.write_all(&vec![0xee; 4 << 20]).unwrap();
        let src = std::fs::File::open(&a).unwrap();
        let dst = std::fs::OpenOptions::new().write(true).open(&b).unwrap();
        let mut off = 0;
        let mut calls = 0;
        while off < SIZE {
            let n = bounded(src.as_fd(), off, dst.as_fd(), off, SIZE - off, &|| false).unwrap();
            assert!(n > 0);
            off += n;
            calls += 1;
        }
        assert!(calls >= 1);
        let got = std::fs::read(&b).unwrap();
        assert_eq!(got.len() as u64, SIZE);
        for i in 0..8usize {
            let at = i << 25;
            assert!(got[at..at + (1 << 20)].iter().all(|&x| x == i as u8 + 1));
            assert!(got[at + (1 << 20)..at + (2 << 20)].iter().all(|&x| x == 0));
        }
        // Cheap: about the data's blocks, not the whole size.
        let blocks = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&b).unwrap());
        assert!(blocks * 512 < 32 << 20, "{blocks} blocks");
        // A stop asked for ends the call after one step (the first 1 MiB of data).
        let n = bounded(src.as_fd(), 0, dst.as_fd(), 0, SIZE, &|| true).unwrap();
        assert_eq!(n, 1 << 20);
        std::fs::remove_file(&a).unwrap();
        std::fs::remove_file(&b).unwrap();
    }
}
