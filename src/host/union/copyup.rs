//! Copy-up: an object of a lower layer (SOURCE or a sealed layer) made in the upper under
//! the same merged name, before its first change. The copy is made in `DIR/work` under a
//! temporary name — data (holes kept), owner, mode, xattrs but overlayfs's markers,
//! times — and renamed into place without replacing anything, so the upper never holds
//! half a copy and a crash leaves at most a stray temporary in `DIR/work`. The copy is
//! made without the union's names lock; the lock is taken for the rename only.
//!
//! Invariants: the object copied is the one the caller found *now* (its handle, never a
//! path walked again), and the copy is put in place only if that object was not written
//! while it was copied and the merged view still shows it at the name (checked under the
//! lock; else `ESTALE`); a caller that found the same copy in flight gets that copy —
//! checked by its device and inode when it opens the name after the copy landed — or
//! `ESTALE`, never another object at the name; directories are copied without their
//! entries (their lower parts stay merged below them); the owner is kept where the daemon
//! may set it (as root), else the copy is the daemon's.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::{Condvar, Mutex};

use super::{TRUSTED, USER, Union, kind, temp_name};
use crate::host::sys::{self, Name, SetTime, Xattr};

impl Union {
    /// Copies the lower object `fd` (stat `st`) into the upper directory `up` as `name`;
    /// returns the copy's `O_PATH` handle. `EEXIST` if the upper has `name` already. `layer`:
    /// the layer `fd` is in (a file of SOURCE is also checked by its change time).
    ///
    /// The copy is made in `DIR/work` without the names lock — a big file's data takes
    /// as long as it takes without holding up anyone else's name change — and the lock
    /// is taken only to put it in place: if `fd` was changed while it was copied, or
    /// `still` (the caller's check that the merged view shows `fd` at `name` yet) fails,
    /// the copy is discarded and the answer is `ESTALE` (the kernel looks the name up
    /// again and repeats the call on what it finds).
    pub fn copy_up(
        &self,
        up: BorrowedFd<'_>,
        name: &Name,
        (fd, st, layer): (BorrowedFd<'_>, &libc::stat, usize),
        still: &dyn Fn() -> io::Result<()>,
    ) -> io::Result<OwnedFd> {
        // One copy of an object to a name at a time: a follower waits for the copy in
        // flight and takes its result (the copy in place, or its errno) rather than copy
        // the same data again next to it. The copy is the object the leader put in place
        // (its device and inode): what the follower finds at the name afterwards may be
        // another (renamed or removed and made again by another request meanwhile), and is
        // then `ESTALE` (the kernel looks the name up again), never taken for the copy.
        let up_st = sys::fstat(up)?;
        let key = (
            up_st.st_dev,
            up_st.st_ino,
            name.bytes().to_vec(),
            st.st_dev,
            st.st_ino,
        );
        let flight = {
            let mut m = self.flights.lock();
            match m.get(&key) {
                Some(f) => Err(f.clone()),
                None => {
                    let f = Arc::new(Flight::default());
                    m.insert(key.clone(), f.clone());
                    Ok(f)
                }
            }
        };
        let flight = match flight {
            Err(leader) => {
                let copy = leader.wait().map_err(io::Error::from_raw_os_error)?;
                super::pause_point("copy-up-follow");
                return follow(up, name, copy);
            }
            Ok(f) => f,
        };
        // Ends the flight however the copy ends (an unwinding panic too: followers get EIO).
        let done = Landing {
            union: self,
            key,
            flight,
        };
        let res = self.copy_up_once(up, name, (fd, st, self.is_source(layer)), still);
        let copy = res.as_ref().map_err(errno).and_then(|f| {
            let c = sys::fstat(f.as_fd()).map_err(|e| errno(&e))?;
            Ok((c.st_dev, c.st_ino))
        });
        done.land(copy);
        res
    }

    fn copy_up_once(
        &self,
        up: BorrowedFd<'_>,
        name: &Name,
        (fd, st, source): (BorrowedFd<'_>, &libc::stat, bool),
        still: &dyn Fn() -> io::Result<()>,
    ) -> io::Result<OwnedFd> {
        let n = self.copies.fetch_add(1, Ordering::Relaxed) + 1;
        log::debug!(
            "stage: copy-up #{n} of {} ({} bytes)",
            String::from_utf8_lossy(name.bytes()),
            st.st_size
        );
        // A device of the stand-in's number the host made: its copy would read back as
        // 0/0 (`stage::standin`), as a caller's `mknod` of it is refused.
        if source && kind(st) == libc::S_IFCHR && st.st_rdev == super::STAND_IN {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        let tmp = temp_name("up");
        let work = self.work()?;
        let made = self.make_copy(work, &tmp, fd, st, true).and_then(|()| {
            // A sealed layer's file or directory: the copy stands for it since it was
            // staged (`staged.rs`), not since now.
            if source || !matches!(kind(st), libc::S_IFREG | libc::S_IFDIR) {
                return Ok(());
            }
            let new = sys::open_path(work, &tmp)?;
            self.carry_staged(new.as_fd(), Some(self.staged_time(fd, st)))
        });
        let res = made.and_then(|()| {
            super::pause_point("copy-up");
            unchanged(fd, st, source)?;
            let _g = self.names.lock();
            still()?;
            sys::renameat2(work, &tmp, up, name, libc::RENAME_NOREPLACE)?;
            if kind(st) == libc::S_IFDIR {
                self.bump();
            }
            sys::open_path(up, name)
        });
        if res.is_err() {
            let flags = if kind(st) == libc::S_IFDIR {
                libc::AT_REMOVEDIR
            } else {
                0
            };
            let _ = sys::unlinkat(work, &tmp, flags);
        }
        res
    }

    /// Makes `work/tmp` a copy of `fd` (stat `st`): a file's data, a directory without
    /// its entries, a symlink's target, a device; owner, mode, xattrs, times; overlayfs's
    /// `origin` (the handle of `fd`) if `origin`.
    pub(super) fn make_copy(
        &self,
        work: BorrowedFd<'_>,
        tmp: &Name,
        fd: BorrowedFd<'_>,
        st: &libc::stat,
        origin: bool,
    ) -> io::Result<()> {
        let proc_fd = self.proc_fd.as_fd();
        let k = kind(st);
        match k {
            libc::S_IFREG => {
                let src = sys::reopen(proc_fd, fd, libc::O_RDONLY)?;
                let dst = sys::openat(
                    work,
                    tmp,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                    0o600,
                )?;
                crate::host::copy::copy_data(src.as_fd(), dst.as_fd(), st.st_size as u64)?;
            }
            libc::S_IFDIR => sys::mkdirat(work, tmp, 0o700)?,
            libc::S_IFLNK => sys::symlinkat(&sys::readlink_fd(fd)?, work, tmp)?,
            // SOURCE's 0/0 device: copied as its stand-in (a 0/0 copy would be a whiteout,
            // and `apply` would delete the device the agent only changed).
            libc::S_IFCHR if st.st_rdev == 0 => {
                sys::mknodat(work, tmp, st.st_mode, super::STAND_IN)?
            }
            _ => sys::mknodat(work, tmp, st.st_mode, st.st_rdev)?,
        }
        let new = sys::open_path(work, tmp)?;
        // The owner, where the daemon may give it (as root); the xattrs and markers while
        // the copy is still writable (an ordinary user's daemon may not write a `user.*`
        // xattr on a read-only file); then the mode, which a chown may have cut its
        // set-ID bits from.
        match sys::fchownat_nofollow(work, tmp, st.st_uid, st.st_gid) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) && sys::geteuid() != 0 => {}
            r => r?,
        }
        if matches!(k, libc::S_IFREG | libc::S_IFDIR) {
            copy_xattrs(fd, new.as_fd())?;
            // Where it was copied from, in overlayfs's form: `stage status` tells a host
            // replacement of the original from the agent's own rename by it.
            if let Some(o) = origin.then(|| origin_of(fd)).flatten() {
                self.set_marker(new.as_fd(), b"origin", &o)?;
            }
        }
        if k != libc::S_IFLNK {
            sys::fchmod_fd(proc_fd, new.as_fd(), st.st_mode & 0o7777)?;
        }
        let at = SetTime::At(st.st_atime, st.st_atime_nsec);
        let mt = SetTime::At(st.st_mtime, st.st_mtime_nsec);
        if k == libc::S_IFLNK {
            sys::utimens_nofollow(work, tmp, at, mt)
        } else {
            sys::utimens_fd(proc_fd, new.as_fd(), at, mt)
        }
    }
}

/// A copy-up in flight: its result, once it has one (the copy's device and inode; `Err`:
/// its errno).
#[derive(Default)]
pub(super) struct Flight {
    done: Mutex<Option<Result<(u64, u64), i32>>>,
    cv: Condvar,
}

/// What a copy-up in flight is keyed by: the upper directory (device, inode), the name,
/// and the lower object (device, inode).
pub(super) type FlightKey = (u64, u64, Vec<u8>, u64, u64);

impl Flight {
    /// Waits for the copy's result. Bounded by the leader's copy: [`Landing`] gives a
    /// result however the leader's call ends.
    fn wait(&self) -> Result<(u64, u64), i32> {
        let mut d = self.done.lock();
        loop {
            if let Some(r) = *d {
                return r;
            }
            self.cv.wait(&mut d);
        }
    }
}

/// The leader's side of a [`Flight`]: removed from the union's table and its result
/// given to the followers when landed or dropped (EIO then).
struct Landing<'a> {
    union: &'a Union,
    key: FlightKey,
    flight: Arc<Flight>,
}

impl Landing<'_> {
    fn land(self, r: Result<(u64, u64), i32>) {
        *self.flight.done.lock() = Some(r);
    }
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        self.union.flights.lock().remove(&self.key);
        let mut d = self.flight.done.lock();
        if d.is_none() {
            *d = Some(Err(libc::EIO));
        }
        self.flight.cv.notify_all();
    }
}

/// A follower's copy: what `up` holds at `name` if it is the leader's `copy` (device,
/// inode), else `ESTALE` — also when the name is gone: the object the follower was to
/// change was renamed or removed meanwhile, and the kernel looks the name up again.
fn follow(up: BorrowedFd<'_>, name: &Name, copy: (u64, u64)) -> io::Result<OwnedFd> {
    let stale = || io::Error::from_raw_os_error(libc::ESTALE);
    let f = match sys::open_path(up, name) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT)) => return Err(stale()),
        r => r?,
    };
    let now = sys::fstat(f.as_fd())?;
    if (now.st_dev, now.st_ino) == copy {
        Ok(f)
    } else {
        Err(stale())
    }
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// `fd` is still the object `st` was read from, and a file's size and modification time
/// are as they were — and, for a file of SOURCE (`source`), its change time: else it was
/// written while it was copied (`ESTALE`: the copy may mix two versions). The change time
/// catches a host writer that restores the modification time (`touch -d`, `cp -p`,
/// `rsync -t`) or a same-size rewrite within one timestamp tick: no write leaves it as it
/// was. It is not compared for a sealed layer's file: a hard link made to it (`stage
/// status` flattening the layers) changes it, not the bytes.
fn unchanged(fd: BorrowedFd<'_>, st: &libc::stat, source: bool) -> io::Result<()> {
    let now = sys::fstat(fd)?;
    let file = kind(st) == libc::S_IFREG;
    let same = (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
        && (!file
            || (now.st_size, now.st_mtime, now.st_mtime_nsec)
                == (st.st_size, st.st_mtime, st.st_mtime_nsec))
        && (!file
            || !source
            || (now.st_ctime, now.st_ctime_nsec) == (st.st_ctime, st.st_ctime_nsec));
    if same {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::ESTALE))
    }
}

/// Copies every xattr of `from` to `to` but overlayfs's markers (either namespace).
fn copy_xattrs(from: BorrowedFd<'_>, to: BorrowedFd<'_>) -> io::Result<()> {
    let list = match sys::listxattr_fd(from, 64 * 1024) {
        Ok(Xattr::Data(l)) => l,
        Ok(Xattr::Size(_)) => return Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTSUP)) => return Ok(()),
        Err(e) => return Err(e),
    };
    for k in list.split(|&b| b == 0) {
        if k.is_empty() || k.starts_with(TRUSTED) || k.starts_with(USER) {
            continue;
        }
        if let Ok(Xattr::Data(v)) = sys::getxattr_fd(from, k, 64 * 1024) {
            match sys::setxattr_fd(to, k, &v, 0) {
                // A namespace the daemon may not write (trusted.* when not root): the copy
                // goes without it rather than not at all.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::ENOTSUP)) => {}
                r => r?,
            }
        }
    }
    Ok(())
}

/// The overlayfs origin of `fd`: version 0, magic 0xfb, length, flags, the handle type,
/// a (null) file system uuid, then the file handle. `None` where the file system gives
/// no handle.
fn origin_of(fd: BorrowedFd<'_>) -> Option<Vec<u8>> {
    let h = sys::file_handle(fd).ok()?;
    let (kind, fid) = h.split_at(4);
    let kind = i32::from_ne_bytes(kind.try_into().ok()?);
    let len = 5 + 16 + fid.len();
    let mut o = Vec::with_capacity(len);
    o.extend_from_slice(&[
        0,
        0xfb,
        u8::try_from(len).ok()?,
        0,
        u8::try_from(kind).ok()?,
    ]);
    o.extend_from_slice(&[0; 16]);
    o.extend_from_slice(fid);
    Some(o)
}
