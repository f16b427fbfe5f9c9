//! The calling thread's credentials while it works for a caller: file-system ids switched
//! to the caller's ([`FsIds`]), `CAP_FSETID` dropped ([`WithoutFsetid`]). Per thread, raw
//! syscalls (glibc's wrappers would switch every thread).
//!
//! Invariant: each guard restores exactly what it changed, in reverse order, on drop.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::io;

use super::cvt;

/// How many id pairs a thread remembers as switchable (see [`FsIds::assume`]).
const VERIFIED_MAX: usize = 16;

thread_local! {
    /// The (uid, gid) pairs this thread switched to and read back once.
    static VERIFIED: RefCell<Vec<(u32, u32)>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's file-system ids switched to a caller's for as long as the guard
/// lives (`setfsgid` then `setfsuid`; restored in reverse order on drop). Files created
/// meanwhile belong to the caller from the start, and the host's permission checks are made
/// as the caller. Per thread: the other workers keep the daemon's ids.
pub struct FsIds {
    uid: u32,
    gid: u32,
}

impl FsIds {
    /// Switches to `uid`/`gid`; fails with EPERM when the kernel refuses (not root, or an
    /// id the daemon's user namespace does not map). The syscalls report no error, so the
    /// ids are read back — the first time per thread and pair only: whether a switch
    /// succeeds depends on CAP_SETUID/CAP_SETGID, which the daemon keeps for its life, and
    /// on the namespace's id maps, which never change once written. The two read-backs are
    /// two of the six syscalls of a switch, each allocating a set of credentials.
    pub fn assume(uid: u32, gid: u32) -> io::Result<FsIds> {
        // SAFETY: setfsgid/setfsuid only change this thread's credentials; they return the
        // previous id and never fail in a way that leaves memory unsafe.
        let (old_uid, old_gid) = unsafe {
            let g = libc::setfsgid(gid) as u32;
            let u = libc::setfsuid(uid) as u32;
            (u, g)
        };
        let guard = FsIds {
            uid: old_uid,
            gid: old_gid,
        };
        if VERIFIED.with(|v| v.borrow().contains(&(uid, gid))) {
            return Ok(guard);
        }
        // The syscalls report no error: read the ids back (-1 changes nothing).
        // SAFETY: as above; -1 only queries.
        let (now_u, now_g) = unsafe {
            (
                libc::setfsuid(u32::MAX) as u32,
                libc::setfsgid(u32::MAX) as u32,
            )
        };
        if now_u != uid || now_g != gid {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        VERIFIED.with(|v| {
            let mut v = v.borrow_mut();
            if v.len() < VERIFIED_MAX {
                v.push((uid, gid));
            }
        });
        Ok(guard)
    }
}

impl Drop for FsIds {
    fn drop(&mut self) {
        // SAFETY: restores this thread's previous file-system ids.
        unsafe {
            libc::setfsuid(self.uid);
            libc::setfsgid(self.gid);
        }
    }
}

/// `CAP_FSETID` (linux/capability.h): keep set-ID bits when writing, truncating, chmod.
const CAP_FSETID: u32 = 4;
/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn caps(set: Option<&[CapData; 2]>) -> io::Result<[CapData; 2]> {
    let mut hdr = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = set.copied().unwrap_or_default();
    let nr = if set.is_some() {
        libc::SYS_capset
    } else {
        libc::SYS_capget
    };
    // SAFETY: capget/capset of the calling thread (pid 0) with a version-3 header and the
    // two data words that version reads or writes.
    cvt(unsafe { libc::syscall(nr, &mut hdr, data.as_mut_ptr()) } as libc::c_int)?;
    Ok(data)
}

/// The calling thread without `CAP_FSETID` in its effective set while the guard lives
/// (it stays permitted, and is raised again on drop). What the kernel captures of the
/// thread's credentials meanwhile — a passthrough backing file, whose writes then run
/// with them — keeps set-ID bits no better than an unprivileged writer: the host clears
/// them on every write and truncate through it, as a local disk does for a caller without
/// `CAP_FSETID`. A thread without the capability is left as it is.
pub struct WithoutFsetid {
    /// The sets read before the drop, written back as they were (`None`: nothing was
    /// dropped). Nothing between the drop and the restore changes this thread's
    /// capabilities, so the restore needs no second `capget`.
    restore: Option<[CapData; 2]>,
}

impl WithoutFsetid {
    /// Drops `CAP_FSETID` from this thread's effective set.
    pub fn new() -> io::Result<WithoutFsetid> {
        let bit = 1 << CAP_FSETID;
        let before = caps(None)?;
        if before[0].effective & bit == 0 {
            return Ok(WithoutFsetid { restore: None });
        }
        let mut d = before;
        d[0].effective &= !bit;
        caps(Some(&d))?;
        Ok(WithoutFsetid {
            restore: Some(before),
        })
    }
}

impl Drop for WithoutFsetid {
    fn drop(&mut self) {
        let Some(before) = self.restore else {
            return;
        };
        if let Err(e) = caps(Some(&before)) {
            log::error!("cannot raise CAP_FSETID again on this worker: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs_ids() -> (u32, u32) {
        // SAFETY: -1 only queries this thread's file-system ids.
        unsafe {
            (
                libc::setfsuid(u32::MAX) as u32,
                libc::setfsgid(u32::MAX) as u32,
            )
        }
    }

    /// A pair switched to once is switched to again without the read-back, and every
    /// guard restores the daemon's ids.
    #[test]
    fn a_verified_pair_switches_again_and_restores() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // As a plain user the kernel refuses: the guard says so every time.
            assert!(FsIds::assume(4242, 4242).is_err());
            assert!(FsIds::assume(4242, 4242).is_err());
            return;
        }
        let before = fs_ids();
        for _ in 0..3 {
            let g = FsIds::assume(4242, 4343).unwrap();
            assert_eq!(fs_ids(), (4242, 4343));
            drop(g);
            assert_eq!(fs_ids(), before);
        }
        assert!(VERIFIED.with(|v| v.borrow().contains(&(4242, 4343))));
    }

    /// The guard drops CAP_FSETID from the effective set and writes back exactly the sets
    /// it found; a thread without the capability (here: file-system ids not root's, which
    /// clears it) is left as it is.
    #[test]
    fn without_fsetid_drops_and_restores_the_sets_it_found() {
        let bit = 1 << CAP_FSETID;
        let before = caps(None).unwrap();
        {
            let _g = WithoutFsetid::new().unwrap();
            let during = caps(None).unwrap();
            assert_eq!(during[0].effective & bit, 0);
            assert_eq!(during[0].effective | bit, before[0].effective | bit);
            assert_eq!(during[0].permitted, before[0].permitted);
        }
        let after = caps(None).unwrap();
        assert_eq!(
            (after[0].effective, after[0].permitted, after[1].effective),
            (
                before[0].effective,
                before[0].permitted,
                before[1].effective
            )
        );
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let ids = FsIds::assume(4242, 4242).unwrap();
            let cleared = caps(None).unwrap();
            assert_eq!(cleared[0].effective & bit, 0, "a non-root fsuid clears it");
            let g = WithoutFsetid::new().unwrap();
            assert!(g.restore.is_none());
            drop(g);
            assert_eq!(caps(None).unwrap()[0].effective, cleared[0].effective);
            drop(ids);
            assert_eq!(caps(None).unwrap()[0].effective, before[0].effective);
        }
    }
}
