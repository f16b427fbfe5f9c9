//! At daemon start: the new names a crash left under their temporary name. A name made
//! over a lower one is created as `#fencefs-new.PID.N` in its upper directory and renamed
//! into place ([`super::change`]); a crash in between leaves it there, shown and listed
//! as added. The daemon's engine deletes these before it serves the area: only entries of
//! `DIR/upper` (at any depth) whose name is exactly `#fencefs-new.<PID>.<N>` (decimal)
//! and whose PID is not a live fencefs other than this one (`/proc/PID/comm`); a file
//! goes, a directory only if empty (one that holds something stays, with a warning).
//!
//! Invariants: walked one `O_PATH|O_NOFOLLOW` step at a time from the upper's root
//! (symlinks never followed); holds one directory's descriptors at a time (pending
//! directories are kept as paths); nothing but such a leftover is deleted.
//!
//! And what a crash left in `DIR/work` (outside the view): an entry named exactly
//! `#fencefs-{up,rm,empty,probe}.<PID>.<N>` whose PID is not a live fencefs — a copy-up
//! never renamed into place (its SOURCE object is still there), a removed object not yet
//! deleted, a directory swapped out before a rename, a probe's scratch file. A file goes;
//! a directory only if it holds nothing but whiteouts (a removed directory's); one that
//! holds anything else stays, with a warning — it is what a log line may have pointed a
//! person to (a directory that could not be put back).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::host::path::join;
use crate::host::sys::{self, Name};

/// The PID of a leftover's name `#fencefs-new.PID.N`, if `name` is exactly one.
pub fn leftover_pid(name: &[u8]) -> Option<u32> {
    let rest = name.strip_prefix(b"#fencefs-new.")?;
    let dot = rest.iter().position(|&b| b == b'.')?;
    let (pid, n) = (&rest[..dot], &rest[dot + 1..]);
    let digits = |s: &[u8]| !s.is_empty() && s.len() <= 20 && s.iter().all(u8::is_ascii_digit);
    if !digits(pid) || !digits(n) {
        return None;
    }
    std::str::from_utf8(pid).ok()?.parse().ok()
}

/// A name the merged view never lets a caller make (EINVAL): the form of a new name's
/// temporary name, which the sweep at the next start would take for a crash's leftover.
pub fn reserved(name: &[u8]) -> bool {
    leftover_pid(name).is_some()
}

/// Whether `pid` is a live fencefs process other than this one.
fn live_fencefs(pid: u32) -> bool {
    pid != std::process::id()
        && std::fs::read(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_ascii() == b"fencefs")
}

/// Deletes the leftovers of new names in the staged tree `upper`; returns how many.
pub fn sweep_new_leftovers(upper: BorrowedFd<'_>) -> io::Result<usize> {
    let proc_fd = sys::open_proc_self_fd()?;
    let mut pending: Vec<Vec<u8>> = vec![Vec::new()];
    let mut swept = 0;
    while let Some(path) = pending.pop() {
        let Some(dir) = walk_dir(proc_fd.as_fd(), upper, &path)? else {
            continue;
        };
        let d = sys::reopen_dir(proc_fd.as_fd(), dir.as_fd())?;
        for e in sys::read_dir(d.as_fd())? {
            let pid = leftover_pid(&e.name);
            // The entry's type from the listing; a stat only where it says nothing.
            let is_dir = match e.dtype {
                libc::DT_DIR => true,
                libc::DT_UNKNOWN => {
                    match sys::fstatat_nofollow(dir.as_fd(), &Name::new(&e.name)?) {
                        Ok(st) => st.st_mode & libc::S_IFMT == libc::S_IFDIR,
                        Err(_) => continue,
                    }
                }
                _ => false,
            };
            let name = Name::new(&e.name)?;
            match pid {
                Some(pid) if !live_fencefs(pid) => {
                    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
                    let shown = String::from_utf8_lossy(&join(&path, &e.name)).into_owned();
                    match sys::unlinkat(dir.as_fd(), &name, flags) {
                        Ok(()) => {
                            log::warn!("stage: removed {shown}, left by a crash before its rename");
                            swept += 1;
                        }
                        Err(err) => log::warn!(
                            "stage: {shown}, left by a crash before its rename, stays: {err}"
                        ),
                    }
                }
                _ if is_dir => pending.push(join(&path, &e.name)),
                _ => {}
            }
        }
    }
    Ok(swept)
}

/// The PID of a work directory's leftover `#fencefs-{up,rm,empty,probe}.PID.N`.
fn work_leftover_pid(name: &[u8]) -> Option<u32> {
    ["up", "rm", "empty", "probe"].iter().find_map(|k| {
        let rest = name.strip_prefix(format!("#fencefs-{k}.").as_bytes())?;
        leftover_pid(&[b"#fencefs-new.".as_slice(), rest].concat())
    })
}

impl super::Union {
    /// Deletes what a crash left in `DIR/work` (see the module header) — a directory
    /// through `delete_dir`, the removal's own deletion of a directory
    /// of whiteouts; returns how many entries went. Called before the union serves.
    pub fn sweep_work_leftovers(&self) -> io::Result<usize> {
        let work = self.work()?;
        let d = sys::reopen_dir(self.proc_fd.as_fd(), work)?;
        let mut swept = 0;
        for e in sys::read_dir(d.as_fd())? {
            match work_leftover_pid(&e.name) {
                Some(pid) if !live_fencefs(pid) => {}
                _ => continue,
            }
            let name = Name::new(&e.name)?;
            let shown = String::from_utf8_lossy(&e.name).into_owned();
            let Ok(st) = sys::fstatat_nofollow(work, &name) else {
                continue;
            };
            let r = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                self.delete_dir(work, &name)
            } else {
                sys::unlinkat(work, &name, 0)
            };
            match r {
                Ok(()) => swept += 1,
                Err(err) if err.raw_os_error() == Some(libc::ENOTEMPTY) => log::warn!(
                    "stage: the work directory's {shown}, left by a crash, holds more than \
                     whiteouts: it stays (look through it, then delete it)"
                ),
                Err(err) => {
                    log::warn!("stage: the work directory's {shown}, left by a crash, stays: {err}")
                }
            }
        }
        if swept > 0 {
            log::warn!("stage: removed {swept} entries a crash left in the work directory");
        }
        Ok(swept)
    }
}

/// The directory at relative `path` under `root` (`None`: not a directory any more).
fn walk_dir(
    proc_fd: BorrowedFd<'_>,
    root: BorrowedFd<'_>,
    path: &[u8],
) -> io::Result<Option<OwnedFd>> {
    let mut cur = sys::reopen(proc_fd, root, libc::O_PATH)?;
    if path.is_empty() {
        return Ok(Some(cur));
    }
    for part in path.split(|&b| b == b'/') {
        match sys::open_path(cur.as_fd(), &Name::new(part)?) {
            Ok(f) => cur = f,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
        if sys::fstat(cur.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Ok(None);
        }
    }
    Ok(Some(cur))
}

#[cfg(test)]
mod tests {
    use super::{leftover_pid, work_leftover_pid};

    #[test]
    fn a_work_leftover_is_one_of_the_unions_own_temporary_names() {
        assert_eq!(work_leftover_pid(b"#fencefs-up.123.0"), Some(123));
        assert_eq!(work_leftover_pid(b"#fencefs-rm.9.42"), Some(9));
        assert_eq!(work_leftover_pid(b"#fencefs-empty.7.1"), Some(7));
        assert_eq!(work_leftover_pid(b"#fencefs-probe.7.1"), Some(7));
        for n in [
            &b"#fencefs-new.1.2"[..],
            b"#fencefs-up.1",
            b"#fencefs-rm.1.2.3",
            b"#fencefs-trash.1.2",
            b"work",
            b"index",
        ] {
            assert_eq!(work_leftover_pid(n), None, "{}", String::from_utf8_lossy(n));
        }
    }

    #[test]
    fn only_the_exact_pattern_is_a_leftover() {
        assert_eq!(leftover_pid(b"#fencefs-new.123.0"), Some(123));
        assert_eq!(leftover_pid(b"#fencefs-new.9.42"), Some(9));
        for n in [
            &b"#fencefs-new.123"[..],
            b"#fencefs-new.123.",
            b"#fencefs-new..1",
            b"#fencefs-new.12a.1",
            b"#fencefs-new.1.2.3",
            b"#fencefs-up.1.2",
            b"x#fencefs-new.1.2",
            b"#fencefs-new.1.2 ",
        ] {
            assert_eq!(leftover_pid(n), None, "{}", String::from_utf8_lossy(n));
        }
    }
}
