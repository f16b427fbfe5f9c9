//! Apply's data copy: a staged regular file written to a new SOURCE file with its data
//! extents only (its holes stay holes), its owner, mode, xattrs and times; and the staged
//! names of one file that one apply writes made as hard links of one another ([`Links`]).
//!
//! Invariants: the destination is always a file made here (`O_CREAT | O_EXCL`) and sized
//! before any byte is written, so a range left unwritten reads as zeros: a hole of the
//! staged file (SEEK_DATA/SEEK_HOLE) is never written, and where the file system cannot
//! say where its holes are, the bytes are copied whole with the all-zero blocks skipped.
//! A link is made only to a file this apply wrote, through its descriptor (never by path),
//! and only for a staged file with more than one name; when it cannot be made the name is
//! copied instead.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::sys::file;
use crate::host::sys::{self, Name};

/// At most this many files written by one apply are held open to link later names to;
/// past it, a later name of another file is copied (correct, only not linked).
const MAX_HELD: usize = 128;

/// The staged files with more than one name this apply has written so far: staged
/// (st_dev, st_ino) → the SOURCE file written for it and how many of its staged names
/// are not written yet (it is let go when none is left).
#[derive(Default)]
pub struct Links {
    held: HashMap<(u64, u64), Held>,
}

struct Held {
    fd: OwnedFd,
    left: libc::nlink_t,
}

impl Links {
    /// Writes the staged regular file `src` (stat `st`) as the new `dir/t`: a hard link
    /// of the SOURCE file this apply already wrote for another name of the same staged
    /// file, else a copy ([`copy_file`]), held for its other names.
    pub fn write(
        &mut self,
        proc_fd: BorrowedFd<'_>,
        src: BorrowedFd<'_>,
        st: &libc::stat,
        dir: BorrowedFd<'_>,
        t: &Name,
    ) -> io::Result<()> {
        let key = (st.st_dev, st.st_ino);
        if st.st_nlink > 1
            && let Some(h) = self.held.get_mut(&key)
        {
            match sys::linkat_fd(proc_fd, h.fd.as_fd(), dir, t) {
                Ok(()) => {
                    h.left = h.left.saturating_sub(1);
                    if h.left == 0 {
                        self.held.remove(&key);
                    }
                    return Ok(());
                }
                // The file it would link to is gone (its name was refused and its
                // temporary entry removed), or SOURCE refuses the link (EXDEV, EMLINK):
                // this name is copied, and later ones link to the copy.
                Err(e) => {
                    log::debug!("stage apply: linking a second name: {e}; copying it");
                    self.held.remove(&key);
                }
            }
        }
        let dst = copy_file(src, st, dir, t)?;
        if st.st_nlink > 1 && self.held.len() < MAX_HELD {
            let left = st.st_nlink - 1;
            self.held.insert(key, Held { fd: dst, left });
        }
        Ok(())
    }
}

/// Copies the staged regular file `src` (stat `st`) to a new `dir/t`: its data
/// ([`crate::host::copy::copy_data`]), owner, mode (after chown, which clears set-ID bits), xattrs but
/// overlayfs's own, and times; all through the two descriptors. Returns the new file.
pub fn copy_file(
    src: BorrowedFd<'_>,
    st: &libc::stat,
    dir: BorrowedFd<'_>,
    t: &Name,
) -> io::Result<OwnedFd> {
    let dst = sys::openat(
        dir,
        t,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o600,
    )?;
    crate::host::copy::copy_data(src, dst.as_fd(), st.st_size as u64)?;
    sys::fchown_fd(dst.as_fd(), st.st_uid, st.st_gid)?;
    file::fchmod(dst.as_fd(), st.st_mode & 0o7777)?;
    let names = |fd| -> io::Result<Vec<Vec<u8>>> {
        Ok(file::list(fd)?
            .split(|&b| b == 0)
            .filter(|k| !k.is_empty() && !crate::host::union::is_marker(k))
            .map(<[u8]>::to_vec)
            .collect())
    };
    let want = names(src)?;
    // A new file may have inherited some (a default ACL): those the staged one lacks go.
    for k in names(dst.as_fd())? {
        if !want.contains(&k) {
            file::remove(dst.as_fd(), &k)?;
        }
    }
    for k in &want {
        file::set(dst.as_fd(), k, &file::get(src, k)?)?;
    }
    file::futimens(
        dst.as_fd(),
        (st.st_atime, st.st_atime_nsec),
        (st.st_mtime, st.st_mtime_nsec),
    )?;
    Ok(dst)
}
