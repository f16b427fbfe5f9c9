//! Copying a regular file's bytes between two descriptors with its holes kept: what
//! `stage apply` writes to SOURCE and what a staged mount's copy-up writes to the upper.
//!
//! Invariants: the destination is a new, empty file; it is sized first, so a range never
//! written reads as zeros; only data extents (SEEK_DATA/SEEK_HOLE) are copied, and where
//! the file system cannot say where its holes are, all-zero blocks are skipped.

use std::io;
use std::os::fd::BorrowedFd;

use super::sys;

/// `lseek` cannot say where the holes are here (an old or odd file system).
fn no_seek_data(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)
    )
}

/// Copies the first `size` bytes of `src` into `dst`, a new empty file: `dst` is sized
/// first (a hole throughout), then each data extent of `src` (SEEK_DATA to SEEK_HOLE) is
/// copied to the same offset; past the last one, nothing. Where `src`'s file system has
/// no SEEK_DATA, the rest is copied whole (`copy_range`).
pub fn copy_data(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    sys::ftruncate(dst, size)?;
    let mut off = 0u64;
    while off < size {
        let at = i64::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let start = match sys::lseek(src, at, libc::SEEK_DATA) {
            Ok(s) => s as u64,
            // Only a hole is left.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(()),
            Err(e) if no_seek_data(&e) => return copy_range(src, dst, off, size),
            Err(e) => return Err(e),
        };
        if start >= size {
            return Ok(());
        }
        let end = match sys::lseek(src, start as i64, libc::SEEK_HOLE) {
            Ok(h) => (h as u64).clamp(start + 1, size),
            Err(e) if no_seek_data(&e) => size,
            Err(e) => return Err(e),
        };
        copy_range(src, dst, start, end)?;
        off = end;
    }
    Ok(())
}

/// Copies bytes `from..to` of `src` to the same offsets of `dst`: `copy_file_range` (a
/// clone or an in-kernel copy) where the two file systems allow it, else [`read_write`].
/// Stops early at `src`'s end.
fn copy_range(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, from: u64, to: u64) -> io::Result<()> {
    let mut off = from;
    while off < to {
        match sys::copy_file_range(src, off, dst, off, to - off) {
            Ok(0) => return Ok(()),
            Ok(n) => off += n as u64,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)
                ) =>
            {
                break;
            }
            Err(e) => return Err(e),
        }
    }
    read_write(src, dst, off, to)
}

/// Copies bytes `from..to` of `src` to `dst` by reads and writes, skipping every all-zero
/// block (`dst`, sized and unwritten there, reads zeros already). Stops at `src`'s end.
fn read_write(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, from: u64, to: u64) -> io::Result<()> {
    let mut off = from;
    let mut buf = vec![0u8; 256 * 1024];
    while off < to {
        let want = (to - off).min(buf.len() as u64) as usize;
        let n = sys::pread(src, &mut buf[..want], off)?;
        if n == 0 {
            break;
        }
        for (i, block) in buf[..n].chunks(BLOCK).enumerate() {
            if block.iter().any(|&b| b != 0) {
                write_all(dst, block, off + (i * BLOCK) as u64)?;
            }
        }
        off += n as u64;
    }
    Ok(())
}

/// The unit of the zero-block check of the read-and-write copy.
const BLOCK: usize = 4096;

fn write_all(dst: BorrowedFd<'_>, buf: &[u8], at: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match sys::pwrite(dst, &buf[done..], at + done as u64)? {
            0 => return Err(io::Error::from_raw_os_error(libc::EIO)),
            k => done += k,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("fencefs-copy-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&d);
        d
    }

    #[test]
    fn holes_stay_holes_and_the_bytes_are_the_same() {
        let (a, b) = (tmp("a"), tmp("b"));
        let mut f = std::fs::File::create(&a).unwrap();
        f.set_len(64 << 20).unwrap();
        f.seek(SeekFrom::Start(10 << 20)).unwrap();
        f.write_all(b"data in the middle").unwrap();
        f.seek(SeekFrom::Start((64 << 20) - 3)).unwrap();
        f.write_all(b"end").unwrap();
        f.sync_all().unwrap();
        let src = std::fs::File::open(&a).unwrap();
        let dst = std::fs::File::create(&b).unwrap();
        copy_data(src.as_fd(), dst.as_fd(), 64 << 20).unwrap();
        dst.sync_all().unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let m = std::fs::metadata(&b).unwrap();
        assert_eq!(m.len(), 64 << 20);
        assert!(m.blocks() * 512 < 1 << 20, "{} blocks", m.blocks());
        for p in [a, b] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn the_plain_copy_skips_zero_blocks_and_keeps_the_rest() {
        let (a, b) = (tmp("c"), tmp("d"));
        let mut data = vec![0u8; 3 * BLOCK + 100];
        data[BLOCK + 7] = 1;
        data[3 * BLOCK + 99] = 2;
        std::fs::write(&a, &data).unwrap();
        let src = std::fs::File::open(&a).unwrap();
        let dst = std::fs::File::create(&b).unwrap();
        dst.set_len(data.len() as u64).unwrap();
        // The read-and-write half alone (as when copy_file_range is refused).
        read_write(src.as_fd(), dst.as_fd(), 0, data.len() as u64).unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), data);
        // Only the two blocks holding a byte were written.
        dst.sync_all().unwrap();
        let m = std::fs::metadata(&b).unwrap();
        assert!(
            m.blocks() * 512 <= 2 * BLOCK as u64,
            "{} blocks",
            m.blocks()
        );
        for p in [a, b] {
            std::fs::remove_file(p).unwrap();
        }
    }
}
