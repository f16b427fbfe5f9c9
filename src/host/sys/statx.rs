//! One `statx` for what `fstat` gives and the birth time: the staged mount's lookup that
//! notes a change (`Union::lookup_in` asked for birth times) learns the entry's identity
//! — inode and birth time, what a base record holds — in the call that stats it, instead
//! of a second call; a staged unlink of SOURCE's file learns it by name, under the
//! union's names lock (`Union::remove_below`).
//!
//! Invariant: the `libc::stat` returned is field for field what `fstatat` returns for the
//! same object (device numbers encoded as glibc's `makedev`, which is the kernel's
//! `new_encode_dev` for `stat`), so it may stand wherever [`super::fstat`]'s does.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use std::ffi::CStr;

use super::{Name, cvt};

/// `fstat` of an `O_PATH` handle and its birth time in ns since the epoch (`None` where
/// the file system keeps none).
pub fn fstat_btime(fd: BorrowedFd<'_>) -> io::Result<(libc::stat, Option<i128>)> {
    statx(fd, c"", libc::AT_EMPTY_PATH)
}

/// [`fstat_btime`] of entry `name` of directory `dir`, not followed if a symlink.
pub fn fstatat_btime(dir: BorrowedFd<'_>, name: &Name) -> io::Result<(libc::stat, Option<i128>)> {
    statx(dir, name.c(), 0)
}

fn statx(
    at: BorrowedFd<'_>,
    path: &CStr,
    flags: libc::c_int,
) -> io::Result<(libc::stat, Option<i128>)> {
    let mut sx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: valid fd and NUL-terminated path; sx points to a writable statx.
    cvt(unsafe {
        libc::statx(
            at.as_raw_fd(),
            path.as_ptr(),
            flags | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            sx.as_mut_ptr(),
        )
    })?;
    // SAFETY: statx succeeded, so it filled the struct (zeroed before).
    let sx = unsafe { sx.assume_init() };
    // SAFETY: `stat` is plain data; all-zero is a valid value of it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_dev = libc::makedev(sx.stx_dev_major, sx.stx_dev_minor);
    st.st_ino = sx.stx_ino;
    st.st_nlink = sx.stx_nlink as _;
    st.st_mode = sx.stx_mode as _;
    st.st_uid = sx.stx_uid;
    st.st_gid = sx.stx_gid;
    st.st_rdev = libc::makedev(sx.stx_rdev_major, sx.stx_rdev_minor);
    st.st_size = sx.stx_size as libc::off_t;
    st.st_blksize = sx.stx_blksize as _;
    st.st_blocks = sx.stx_blocks as libc::blkcnt_t;
    st.st_atime = sx.stx_atime.tv_sec as libc::time_t;
    st.st_atime_nsec = sx.stx_atime.tv_nsec as _;
    st.st_mtime = sx.stx_mtime.tv_sec as libc::time_t;
    st.st_mtime_nsec = sx.stx_mtime.tv_nsec as _;
    st.st_ctime = sx.stx_ctime.tv_sec as libc::time_t;
    st.st_ctime_nsec = sx.stx_ctime.tv_nsec as _;
    let btime = (sx.stx_mask & libc::STATX_BTIME != 0)
        .then(|| sx.stx_btime.tv_sec as i128 * 1_000_000_000 + sx.stx_btime.tv_nsec as i128);
    Ok((st, btime))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn same(a: &libc::stat, b: &libc::stat) -> bool {
        (
            a.st_dev,
            a.st_ino,
            a.st_nlink,
            a.st_mode,
            a.st_uid,
            a.st_gid,
            a.st_rdev,
            a.st_size,
            a.st_blksize,
            a.st_blocks,
        ) == (
            b.st_dev,
            b.st_ino,
            b.st_nlink,
            b.st_mode,
            b.st_uid,
            b.st_gid,
            b.st_rdev,
            b.st_size,
            b.st_blksize,
            b.st_blocks,
        ) && (a.st_atime, a.st_atime_nsec, a.st_mtime, a.st_mtime_nsec)
            == (b.st_atime, b.st_atime_nsec, b.st_mtime, b.st_mtime_nsec)
            && (a.st_ctime, a.st_ctime_nsec) == (b.st_ctime, b.st_ctime_nsec)
    }

    /// A file, a directory, a symlink (not followed) and /dev/null (a device number):
    /// every field as `fstatat` gives it; the birth time is the one `statx` alone gives.
    #[test]
    fn its_stat_is_fstats_field_for_field() {
        let p = std::env::temp_dir().join(format!("fencefs-statx-{}", std::process::id()));
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("f"), b"some bytes").unwrap();
        std::os::unix::fs::symlink("f", p.join("l")).unwrap();
        let d = super::super::open_root(&p).unwrap();
        let dev = super::super::open_root(std::path::Path::new("/dev")).unwrap();
        let name = |n: &str| super::super::Name::new(n.as_bytes()).unwrap();
        let fds = [
            (
                super::super::open_path(d.as_fd(), &name("f")).unwrap(),
                p.join("f"),
            ),
            (
                super::super::open_path(d.as_fd(), &name("l")).unwrap(),
                p.join("l"),
            ),
            (
                super::super::open_path(dev.as_fd(), &name("null")).unwrap(),
                "/dev/null".into(),
            ),
        ];
        let dir = (d.try_clone().unwrap(), p.clone());
        for (fd, path) in fds.iter().chain([&dir]) {
            let want = super::super::fstat(fd.as_fd()).unwrap();
            let (got, btime) = fstat_btime(fd.as_fd()).unwrap();
            assert!(same(&want, &got), "{path:?}\n{want:?}\n{got:?}");
            // By name in its directory: the same, a symlink not followed.
            let at = super::super::open_root(path.parent().unwrap()).unwrap();
            let n = name(path.file_name().unwrap().to_str().unwrap());
            let (by_name, btime_by_name) = fstatat_btime(at.as_fd(), &n).unwrap();
            assert!(
                same(&want, &by_name),
                "{path:?} by name\n{want:?}\n{by_name:?}"
            );
            assert_eq!(btime, btime_by_name, "{path:?} by name");
            // std's own statx, by path: the same birth time, or none.
            let created = std::fs::symlink_metadata(path).unwrap().created().ok();
            let ns = created.map(|t| {
                let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
                d.as_secs() as i128 * 1_000_000_000 + d.subsec_nanos() as i128
            });
            assert_eq!(btime, ns, "{path:?}");
        }
        std::fs::remove_dir_all(&p).unwrap();
    }
}
