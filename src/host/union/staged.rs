//! Staged times carried across replacements: when an entry of a layer above SOURCE was
//! made, as the stage tools judge it — a host change below a path at or after that time
//! is a conflict for `apply` (`stage::changes`, for entries that carry no base record:
//! directories, whiteouts of directories, new files).
//!
//! A replacement makes a new entry stand for an older one: a directory removed (its
//! whiteout stands for every deletion made inside it), a name made again over a whiteout
//! (`rm -rf d; mkdir d`), a directory renamed or swapped onto a deleted name. The new
//! entry's own birth time is later than the deletions it stands for, so a host edit made
//! in between would pass as older than the agent's change and `apply` would delete it
//! unasked. Each replacement therefore carries the older time over:
//! - a directory or file gets the overlayfs-namespaced marker [`STAGED`] (decimal ns);
//! - a whiteout, which cannot carry a `user.` xattr (an ordinary user's), gets the time
//!   as its modification time (a whiteout's own times mean nothing else).
//!
//! - a file made, linked, renamed or exchanged onto a deletion or a staged entry gets the
//!   marker too (a record alone is not enough: a deletion sealed in a checkpoint has none);
//! - as root a symlink, FIFO, socket or device takes the base record of what it replaces
//!   (`trusted.*`); an ordinary user's can carry nothing (`user.*` xattrs are refused on
//!   those, and a whiteout's trick, its modification time, would misdate an entry `tar`
//!   made): such a replacement is refused (`EPERM`) when SOURCE's entry at that name — a
//!   directory: anything below it — changed at or after the time it would have to carry
//!   ([`Union::refuse_uncarried`]), and otherwise goes with its own time, which no host
//!   change then precedes unseen. The new entry exists before that look, so a host change
//!   after the look is later than the entry: a conflict by its own time.
//!
//! Invariants: a carried time is never later than a deletion the entry stands for (a
//! whiteout's own time, the record it carries, or — for a removed directory — the oldest
//! whiteout in it or the time it was made over a deletion: its earliest deletion, not its
//! copy-up); it is set on the new entry before the rename that puts it in place (the
//! whiteout a rename leaves: right after it), and a time that cannot be set fails the
//! change before anything moved; SOURCE is never marked.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use std::os::fd::OwnedFd;

use super::{Stack, Union, err, kind, missing};
use crate::host::sys::{self, Name, SetTime};

/// The marker (in the union's xattr namespace, `trusted.overlay.` or `user.overlay.`) that
/// holds when a staged directory or file stands in for changes made since (ns since the
/// epoch, decimal).
pub const STAGED: &[u8] = b"fencefs.staged_at";

/// The marker a staged entry's base record is kept under (`stage::record::XATTR`).
const RECORD: &[u8] = b"fencefs-base";

/// Entries a look at a SOURCE tree ([`Union::refuse_uncarried`]) reads, and directories
/// deep it goes, at most: past either the tree counts as changed (the replacement is
/// refused; nothing is lost by that).
const MAX_LOOK: (usize, usize) = (100_000, 256);

/// How much older than now a record must be to date a whiteout made now (the coarse clock
/// records are taken on ticks a few milliseconds apart: a deletion's own record is not).
pub(super) const OLDER: i128 = 10_000_000;

/// Now, in ns since the epoch.
pub(super) fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

pub(super) fn ns(sec: i64, nsec: i64) -> i128 {
    sec as i128 * 1_000_000_000 + nsec as i128
}

/// Whether `st` is a whiteout device (0/0).
fn is_whiteout_dev(st: &libc::stat) -> bool {
    kind(st) == libc::S_IFCHR && st.st_rdev == 0
}

impl Union {
    /// When the staged entry behind `fd` (attributes `st`) was made, as the stage tools
    /// judge it: the earliest of its [`STAGED`] marker, its birth time (else its ctime),
    /// its base record's time (read when the union reads records) and, for a whiteout,
    /// its modification time.
    pub(super) fn staged_time(&self, fd: BorrowedFd<'_>, st: &libc::stat) -> i128 {
        let born = sys::fstat_btime(fd)
            .ok()
            .and_then(|(_, b)| b)
            .unwrap_or_else(|| ns(st.st_ctime, st.st_ctime_nsec));
        let mut t = born;
        if is_whiteout_dev(st) {
            t = t.min(ns(st.st_mtime, st.st_mtime_nsec));
        }
        let [mark, record] = self.markers(fd, [STAGED, RECORD]);
        if !is_whiteout_dev(st)
            && let Some(m) = mark.and_then(|v| std::str::from_utf8(&v).ok()?.parse::<i128>().ok())
        {
            t = t.min(m);
        }
        if let (Some(v), Some(since)) = (record, self.record_since)
            && let Some(r) = since(&v)
        {
            t = t.min(r);
        }
        t
    }

    /// When a merged-empty staged directory `f` stands for changes made since, for the
    /// whiteout its removal leaves: its earliest deletion (`oldest`, the oldest whiteout
    /// in its parts) or the time it was made over one (its [`STAGED`] marker), whichever
    /// is older; with neither, its own staged time. (Not its copy-up: a host change made
    /// between the agent's first change in it and its deletions was shown to the agent
    /// before it deleted.)
    pub(super) fn dir_since(&self, f: &super::Found, oldest: Option<i128>) -> i128 {
        let mark = self
            .marker(f.fd.as_fd(), STAGED)
            .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<i128>().ok());
        match (oldest, mark) {
            (Some(a), Some(b)) => a.min(b),
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => self.staged_time(f.fd.as_fd(), &f.st),
        }
    }

    /// The staged time of the whiteout or entry a new name replaces in merged directory
    /// `parent` (upper part `up`): the upper's whiteout there, else the first sealed
    /// layer's whiteout; `None` when no whiteout stands at the name.
    pub(super) fn replaced_time(
        &self,
        parent: &Stack,
        up: BorrowedFd<'_>,
        name: &Name,
    ) -> io::Result<Option<i128>> {
        let layers = std::iter::once((0, up)).chain(
            parent
                .parts
                .iter()
                .filter(|p| p.layer > 0 && !self.is_source(p.layer))
                .map(|p| (p.layer, p.fd.as_fd())),
        );
        for (layer, dir) in layers {
            match self.entry_at(layer, dir, name)? {
                Some(true) => return self.whiteout_time(dir, name),
                Some(false) => return Ok(None),
                None => {}
            }
        }
        Ok(None)
    }

    /// The staged time of the whiteout `dir/name`, if a whiteout stands there.
    pub(super) fn whiteout_time(
        &self,
        dir: BorrowedFd<'_>,
        name: &Name,
    ) -> io::Result<Option<i128>> {
        let fd = match sys::open_path(dir, name) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let st = sys::fstat(fd.as_fd())?;
        let whiteout = is_whiteout_dev(&st)
            || (kind(&st) == libc::S_IFREG
                && st.st_size == 0
                && self.marker(fd.as_fd(), b"whiteout").is_some());
        Ok(whiteout.then(|| self.staged_time(fd.as_fd(), &st)))
    }

    /// Marks the staged directory or file behind `fd` as standing for changes made since
    /// `t`, when that is earlier than what it says now.
    pub(super) fn carry_staged(&self, fd: BorrowedFd<'_>, t: Option<i128>) -> io::Result<()> {
        let Some(t) = t else { return Ok(()) };
        let st = sys::fstat(fd)?;
        if t >= self.staged_time(fd, &st) {
            return Ok(());
        }
        let v = t.to_string();
        match self.set_marker(fd, STAGED, v.as_bytes()) {
            // A read-only file of an ordinary user's daemon (no CAP_DAC_OVERRIDE: a
            // `user.*` xattr needs write permission): write permission lent for the
            // marker, the mode given back. (A new entry is not in the view yet; a file
            // renamed, exchanged or linked is, and a concurrent getattr may see `u+w`
            // for that moment, or a chmod in it be undone: the agent's own race.)
            Err(e)
                if e.raw_os_error() == Some(libc::EACCES)
                    && kind(&st) == libc::S_IFREG
                    && st.st_mode & 0o200 == 0 =>
            {
                let mode = st.st_mode & 0o7777;
                sys::fchmod_fd(self.proc_fd.as_fd(), fd, mode | 0o200)?;
                let r = self.set_marker(fd, STAGED, v.as_bytes());
                r.and(sys::fchmod_fd(self.proc_fd.as_fd(), fd, mode))
            }
            r => r,
        }
    }

    /// Dates the whiteout a rename left at `dir/name` (`RENAME_WHITEOUT`, or the deleted
    /// name's whiteout swapped there) no later than `t`. Made by the rename itself, it
    /// stood for a moment with its own time: a crash in between leaves it so (logged
    /// failures likewise; the rename went through).
    /// (One `fstatat` of it: `date_whiteout` never dates later than it says.)
    pub(super) fn date_left(&self, dir: BorrowedFd<'_>, name: &Name, t: i128) {
        if let Err(e) = self.date_whiteout(dir, name, t) {
            log::error!(
                "stage: dating the whiteout left at {}: {e}",
                String::from_utf8_lossy(name.bytes())
            );
        }
    }

    /// Dates the whiteout `dir/name` (just made, not yet in place) at `t`: its
    /// modification time.
    pub(super) fn date_whiteout(
        &self,
        dir: BorrowedFd<'_>,
        name: &Name,
        t: i128,
    ) -> io::Result<()> {
        // Never later than it says now (a label may have dated it at an older record),
        // and only a whiteout (a rename leaves one; nothing else is dated by its mtime).
        let st = sys::fstatat_nofollow(dir, name)?;
        if !is_whiteout_dev(&st) || t >= ns(st.st_mtime, st.st_mtime_nsec) {
            return Ok(());
        }
        let secs = t.div_euclid(1_000_000_000) as i64;
        let nsec = t.rem_euclid(1_000_000_000) as i64;
        sys::utimens_nofollow(dir, name, SetTime::Omit, SetTime::At(secs, nsec))
    }

    /// Whether an entry of kind `k` can carry a staged time: a directory or a file (the
    /// [`STAGED`] marker); as root anything (a symlink, FIFO, socket or device takes the
    /// base record of what it replaces, in `trusted.*`); for an ordinary user nothing
    /// else (`user.*` xattrs are refused on those).
    pub(super) fn can_carry(&self, k: u32) -> bool {
        matches!(k, libc::S_IFDIR | libc::S_IFREG) || !self.xa.starts_with(b"user.")
    }

    /// `EPERM` for an entry of kind `k`, made already, that is to go over a deletion dated
    /// `t` (`None`: none) and cannot carry that time, when SOURCE's entry at `name` of
    /// `source` (SOURCE's part of the parent, if it has one) changed at or after `t`
    /// (module header).
    pub(super) fn refuse_uncarried(
        &self,
        k: u32,
        t: Option<i128>,
        source: Option<&OwnedFd>,
        name: &Name,
    ) -> io::Result<()> {
        let (Some(t), Some(src)) = (t, source) else {
            return Ok(());
        };
        if self.can_carry(k) || !self.changed_since(src.as_fd(), name, t, 0, &mut 0)? {
            return Ok(());
        }
        log::warn!(
            "stage: {} was changed on the host after the agent deleted it; a symlink, FIFO \
             or socket made there cannot keep that deletion's time (no root): refused \
             (EPERM); apply or discard the deletion first",
            String::from_utf8_lossy(name.bytes())
        );
        Err(err(libc::EPERM))
    }

    /// Whether `dir/name` (SOURCE's), or anything below it, changed at or after `t`
    /// (`looked`: entries read so far; past [`MAX_LOOK`]: changed).
    fn changed_since(
        &self,
        dir: BorrowedFd<'_>,
        name: &Name,
        t: i128,
        depth: usize,
        looked: &mut usize,
    ) -> io::Result<bool> {
        let st = match sys::fstatat_nofollow(dir, name) {
            Ok(st) => st,
            // Gone since it was listed: a change (at the top: nothing there to keep).
            Err(e) if missing(&e) => return Ok(depth > 0),
            Err(e) => return Err(e),
        };
        if ns(st.st_ctime, st.st_ctime_nsec) >= t {
            return Ok(true);
        }
        if kind(&st) != libc::S_IFDIR {
            return Ok(false);
        }
        if depth >= MAX_LOOK.1 {
            return Ok(true);
        }
        let d = sys::open_path(dir, name)?;
        let rd = sys::reopen_dir(self.proc_fd.as_fd(), d.as_fd())?;
        let entries = sys::read_dir(rd.as_fd())?;
        drop(rd);
        for e in entries {
            *looked += 1;
            if *looked > MAX_LOOK.0
                || self.changed_since(d.as_fd(), &Name::new(&e.name)?, t, depth + 1, looked)?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Before a copy-up of `fd` (attributes `st`, in `layer`) to `name` of merged
    /// directory `parent` (asked for only when needed): a sealed layer's symlink, FIFO, socket or device stands for
    /// what it stood for since it was staged, which its copy cannot carry —
    /// `Union::refuse_uncarried` with that time (a SOURCE entry, a file or a directory:
    /// nothing to check).
    pub fn refuse_uncarried_copy(
        &self,
        parent: impl FnOnce() -> io::Result<std::sync::Arc<Stack>>,
        name: &Name,
        (fd, st, layer): (BorrowedFd<'_>, &libc::stat, usize),
    ) -> io::Result<()> {
        if self.is_source(layer) || self.can_carry(kind(st)) {
            return Ok(());
        }
        let t = Some(self.staged_time(fd, st));
        let parent = parent()?;
        let source = self.source_part(&parent).map(|p| &*p.fd);
        self.refuse_uncarried(kind(st), t, source, name)
    }
}
