//! Removals from the upper, made atomic through `DIR/work` as overlayfs makes them
//! (`ovl_remove_and_whiteout`, `ovl_clear_empty`): an upper object that must leave a
//! whiteout is swapped with a whiteout made in `DIR/work` (`RENAME_EXCHANGE`), an object
//! that leaves none is renamed into `DIR/work`, and only then is it deleted there — its
//! whiteouts with it, for a directory. A merged-empty directory about to be replaced by a
//! rename is first swapped with an empty opaque copy of itself.
//!
//! Invariants: a removal acts on what the merged view shows at the name under the names
//! lock (SOURCE's non-directory right below an upper part is looked at only there —
//! `Union::remove_below`; a lower non-directory found before it is looked at again there —
//! one `fstatat` of the layer below the upper, and the whiteout's `mknod` failing `EEXIST`
//! if the upper gained the name — and anything else looked up again in full); the merged view changes
//! in one step — a crash or a failure at any step
//! shows either the name as it was or the name removed, never SOURCE's entry in between
//! (what the agent deleted is never shown again) and never a directory emptied of its
//! whiteouts; a directory taken out that turns out to hold more than whiteouts is put
//! back; what a crash leaves in `DIR/work` is outside the view. A whiteout a removal makes
//! gets the caller's label (a staged deletion's record) before the names lock is let go:
//! nothing can stand at the name between the two.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::{Found, Stack, Union, crash_point, err, kind, purge, staged, temp_name};
use crate::host::sys::{self, Name};

/// An extended attribute (name, value) a whiteout made by [`Union::remove`] carries from
/// the moment it stands at the name.
pub type Label<'a> = (&'a [u8], &'a [u8]);

/// What a removal left at the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// Nothing: no lower layer shows the name.
    Nothing,
    /// A whiteout; `labelled`: it carries the label asked for.
    Whiteout { labelled: bool },
}

impl Union {
    /// Removes `name` (found as `f`) from merged directory `parent` (upper part `up`):
    /// the upper's entry goes, and a whiteout stands where a lower layer shows the name —
    /// in one step. A directory must show nothing (`ENOTEMPTY`); the whiteouts in its
    /// upper part go with it. A whiteout made gets `label` if it can (a failure to set it
    /// is the caller's to report: `labelled: false`).
    pub fn remove(
        &self,
        parent: &Stack,
        up: BorrowedFd<'_>,
        name: &Name,
        f: &Found,
        label: Option<Label<'_>>,
    ) -> io::Result<Left> {
        let _g = self.names.lock();
        if f.layer != 0
            && self.is_source(f.layer)
            && kind(&f.st) != libc::S_IFDIR
            && let Some(left) = self.hide_found(parent, up, name, f, label)?
        {
            return Ok(left);
        }
        // Found again under the lock when it was a lower layer's (and `hide_found` could
        // not tell that nothing changed): a copy-up of the name may have landed since `f`
        // was found (then it is the copy that goes; a whiteout made over it would fail
        // EEXIST).
        let again;
        let f = if f.layer != 0 {
            again = self
                .lookup(parent, name.bytes())?
                .ok_or_else(|| err(libc::ENOENT))?;
            if kind(&again.st) != kind(&f.st) {
                return Err(err(libc::ESTALE));
            }
            &again
        } else {
            f
        };
        let dir = kind(&f.st) == libc::S_IFDIR;
        let mut oldest = None;
        if dir {
            let stack = f.stack.as_ref().ok_or_else(|| err(libc::EIO))?;
            let entries;
            (entries, oldest) = self.read_dir_dated(stack)?;
            if !entries.is_empty() {
                return Err(err(libc::ENOTEMPTY));
            }
        }
        // When what a whiteout left here stands for was staged (`staged.rs`).
        let since = || match dir {
            true => self.dir_since(f, oldest),
            false => self.staged_time(f.fd.as_fd(), &f.st),
        };
        if f.layer != 0 && self.is_source(f.layer) {
            // Nothing of it in the upper, and SOURCE shows it: one mknod hides it.
            self.whiteout(up, name)?;
            let labelled = self.label(up, name, label);
            return Ok(Left::Whiteout { labelled });
        }
        if f.layer != 0 {
            // A sealed layer's entry: its whiteout stands for what that entry stood for
            // since it was staged (`staged.rs`), dated before it is put in place.
            return self.hide_dated(up, name, label, since());
        }
        let lower = self.lower_positive(parent, name)?;
        // A stack cached for a directory with lower parts (a process's cwd) must not
        // show them once it is gone; one in the upper only shows nothing then anyway.
        let has_lower = f.stack.as_ref().is_some_and(Stack::has_lower);
        if !lower {
            if !dir {
                return sys::unlinkat(up, name, 0).map(|()| Left::Nothing);
            }
            // An empty directory goes in one rmdir; one holding whiteouts, through work.
            match sys::unlinkat(up, name, libc::AT_REMOVEDIR) {
                Ok(()) => {
                    if has_lower {
                        self.bump();
                    }
                    return Ok(Left::Nothing);
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {}
                Err(e) => return Err(e),
            }
        }
        let tmp = temp_name("rm");
        // Taken before anything moves: once the entry is out, what follows must not fail
        // for want of it.
        let work = self.work()?;
        // The whiteout left stands for what the removed entry stood for since it was
        // staged (a directory: every deletion made in it).
        let labelled = self.take_out(up, name, &tmp, lower.then(|| (label, since())))?;
        crash_point("removed");
        if dir && has_lower {
            self.bump();
        }
        let left = match lower {
            true => Left::Whiteout { labelled },
            false => Left::Nothing,
        };
        if !dir {
            if let Err(e) = sys::unlinkat(work, &tmp, 0) {
                log::warn!("stage: deleting a removed file from the work directory: {e}");
            }
            return Ok(left);
        }
        if let Err(e) = self.discard_dir(work, tmp) {
            // Something was made in it meanwhile: it stays, with what it holds.
            self.put_back(up, name, &e.1, lower.then_some(0));
            return Err(e.0);
        }
        Ok(left)
    }

    /// A removal of SOURCE's non-directory `name` from merged directory `parent` in one
    /// look, under the names lock (a staged unlink's common case: `rm -rf` of a tree the
    /// host holds): when the upper part of `parent` exists and the layer right below it is
    /// SOURCE (no sealed layer between), the entry is stated there by name (`statx`, its
    /// birth time with it) and hidden with one mknod — which fails `EEXIST`, and nothing
    /// is done, if the upper holds anything at the name. `note` is given what was hidden
    /// (attributes, birth time: 0 where none is kept) once the whiteout stands and returns
    /// the caller's note of it with the label the whiteout gets at once. `None`: not that
    /// case (a directory, nothing in SOURCE, something in the upper, no upper part yet):
    /// nothing was changed and `note` was not called; the caller takes the general way.
    pub fn remove_below<N>(
        &self,
        parent: &Stack,
        name: &Name,
        note: impl FnOnce(&libc::stat, i128) -> (N, Option<(Vec<u8>, Vec<u8>)>),
    ) -> io::Result<Option<(Left, N)>> {
        let [top, below, ..] = parent.parts.as_slice() else {
            return Ok(None);
        };
        if top.layer != 0 || !self.is_source(below.layer) {
            return Ok(None);
        }
        let up = top.fd.as_fd();
        let _g = self.names.lock();
        let (st, btime) = match sys::fstatat_btime(below.fd.as_fd(), name) {
            Ok(x) if kind(&x.0) != libc::S_IFDIR => x,
            _ => return Ok(None),
        };
        match self.whiteout(up, name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Ok(None),
            Err(e) => return Err(e),
        }
        let (n, label) = note(&st, btime.unwrap_or(0));
        let label = label.as_ref().map(|(k, v)| (k.as_slice(), v.as_slice()));
        let labelled = self.label(up, name, label);
        Ok(Some((Left::Whiteout { labelled }, n)))
    }

    /// A removal of the non-directory `name` from merged directory `parent` when `parent`
    /// has no part below the upper (a directory the agent made, or made again over a
    /// deleted one): nothing below can show through it, so the entry goes in one
    /// `unlinkat`, after one `fstatat` under the names lock that it is an object — not
    /// a whiteout, nor an empty file that could be one (those take the general way, as
    /// does a directory). `None`: not that case, nothing done.
    pub fn remove_upper_only(&self, parent: &Stack, name: &Name) -> io::Result<Option<Left>> {
        let [top] = parent.parts.as_slice() else {
            return Ok(None);
        };
        if top.layer != 0 {
            return Ok(None);
        }
        self.writable()?;
        let up = top.fd.as_fd();
        super::pause_point("remove");
        let _g = self.names.lock();
        match sys::fstatat_nofollow(up, name) {
            Ok(st) => match kind(&st) {
                libc::S_IFDIR => return Ok(None),
                libc::S_IFCHR if st.st_rdev == 0 => return Ok(None),
                libc::S_IFREG if st.st_size == 0 => return Ok(None),
                _ => {}
            },
            Err(_) => return Ok(None),
        }
        sys::unlinkat(up, name, 0).map(|()| Some(Left::Nothing))
    }

    /// A lower layer's non-directory `f`, found before the names lock was taken, hidden
    /// with one mknod when nothing changed at the name since (the common case): the
    /// upper still holds nothing there (the mknod fails `EEXIST` otherwise) and the layer
    /// right below the upper in `parent` — no sealed layer between them could show
    /// something else — still shows an entry of `f`'s kind there. `None`: something may
    /// have changed, nothing was done; the caller looks the name up again.
    fn hide_found(
        &self,
        parent: &Stack,
        up: BorrowedFd<'_>,
        name: &Name,
        f: &Found,
        label: Option<Label<'_>>,
    ) -> io::Result<Option<Left>> {
        let [top, below, ..] = parent.parts.as_slice() else {
            return Ok(None);
        };
        if top.layer != 0 || below.layer != f.layer {
            return Ok(None);
        }
        match sys::fstatat_nofollow(below.fd.as_fd(), name) {
            Ok(st) if kind(&st) == kind(&f.st) => {}
            _ => return Ok(None),
        }
        match self.whiteout(up, name) {
            Ok(()) => Ok(Some(Left::Whiteout {
                labelled: self.label(up, name, label),
            })),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Hides what a sealed layer shows at `name` with a whiteout made in `DIR/work`,
    /// labelled, dated at `since` and renamed into the free name of the upper.
    fn hide_dated(
        &self,
        up: BorrowedFd<'_>,
        name: &Name,
        label: Option<Label<'_>>,
        since: i128,
    ) -> io::Result<Left> {
        let work = self.work()?;
        let tmp = temp_name("rm");
        self.whiteout(work, &tmp)?;
        let labelled = self.label(work, &tmp, label);
        let r = self
            .date_whiteout(work, &tmp, since)
            .and_then(|()| sys::renameat2(work, &tmp, up, name, libc::RENAME_NOREPLACE));
        if let Err(e) = r {
            let _ = sys::unlinkat(work, &tmp, 0);
            return Err(e);
        }
        Ok(Left::Whiteout { labelled })
    }

    /// Sets `label` on the whiteout `dir/name` just made; whether it was set.
    /// A record older than the whiteout (taken at the agent's read of what it deletes)
    /// also dates it (`staged.rs`): what stands for the deletion later — the removed
    /// directory's whiteout, a name made again — carries the read's time.
    fn label(&self, dir: BorrowedFd<'_>, name: &Name, label: Option<Label<'_>>) -> bool {
        let Some((n, v)) = label else { return false };
        let set = sys::lsetxattr_at(dir, name, n, v, 0).is_ok();
        if let Some(t) = self.record_since.and_then(|since| since(v))
            && t < staged::now_ns() - staged::OLDER
            && let Err(e) = self.date_whiteout(dir, name, t)
        {
            log::warn!("stage: dating a whiteout at its record: {e}");
        }
        set
    }

    /// Moves upper entry `up/name` to `DIR/work/tmp`, leaving a whiteout in its place if
    /// `whiteout` is given (made in `DIR/work` with the label it holds, dated at the
    /// staged time it holds — `staged.rs` — and swapped in with `RENAME_EXCHANGE`), else
    /// nothing. One rename: if it fails, nothing changed. Returns whether the whiteout
    /// carries its label.
    fn take_out(
        &self,
        up: BorrowedFd<'_>,
        name: &Name,
        tmp: &Name,
        whiteout: Option<(Option<Label<'_>>, i128)>,
    ) -> io::Result<bool> {
        let work = self.work()?;
        let Some((label, since)) = whiteout else {
            return sys::renameat2(up, name, work, tmp, libc::RENAME_NOREPLACE).map(|()| false);
        };
        self.whiteout(work, tmp)?;
        let labelled = self.label(work, tmp, label);
        let r = self
            .date_whiteout(work, tmp, since)
            .and_then(|()| sys::renameat2(work, tmp, up, name, libc::RENAME_EXCHANGE));
        if r.is_err() {
            let _ = sys::unlinkat(work, tmp, 0);
        }
        r.map(|()| labelled)
    }

    /// Undoes [`Union::take_out`] (or [`Union::empty_in_place`]) of a directory that
    /// could not be deleted: `DIR/work/tmp` goes back to `up/name`, swapped with what
    /// stands there now when `swapped` (then deleted with `unlinkat` flags `swapped`).
    fn put_back(&self, up: BorrowedFd<'_>, name: &Name, tmp: &Name, swapped: Option<i32>) {
        // An undo: taken whether or not the union was frozen meanwhile.
        let Some(work) = self.work.as_ref().map(|w| w.as_fd()) else {
            return;
        };
        let flags = match swapped {
            Some(_) => libc::RENAME_EXCHANGE,
            None => libc::RENAME_NOREPLACE,
        };
        match sys::renameat2(work, tmp, up, name, flags) {
            Ok(()) => {
                if let Some(f) = swapped {
                    let _ = sys::unlinkat(work, tmp, f);
                }
            }
            Err(e) => log::error!(
                "stage: putting back a directory that is not empty failed ({e}); it is in \
                 the staging area's work directory as {}",
                String::from_utf8_lossy(tmp.bytes())
            ),
        }
        self.bump();
    }

    /// Deletes directory `at/name` if it holds whiteouts only (`ENOTEMPTY` otherwise,
    /// before anything is deleted).
    pub(super) fn delete_dir(&self, at: BorrowedFd<'_>, name: &Name) -> io::Result<()> {
        let (d, whiteouts) = self.of_whiteouts(at, name)?;
        self.delete_whiteouts(at, name, d.as_fd(), &whiteouts)
    }

    /// Deletes whiteouts `whiteouts` of directory `d` (`at/name`), then the directory; if
    /// that fails (something landed in it), the whiteouts are put back.
    fn delete_whiteouts(
        &self,
        at: BorrowedFd<'_>,
        name: &Name,
        d: BorrowedFd<'_>,
        whiteouts: &[Name],
    ) -> io::Result<()> {
        let r = whiteouts
            .iter()
            .try_for_each(|w| sys::unlinkat(d, w, 0))
            .and_then(|()| sys::unlinkat(at, name, libc::AT_REMOVEDIR));
        if r.is_err() {
            // Something landed in it after it was read, or a whiteout could not go: its
            // whiteouts go back before the caller puts it back, or SOURCE's entries would
            // show through it again.
            for w in whiteouts {
                match self.whiteout(d, w) {
                    Err(e) if e.raw_os_error() != Some(libc::EEXIST) => {
                        log::error!("stage: putting a whiteout back: {e}")
                    }
                    _ => {}
                }
            }
        }
        r
    }

    /// Directory `at/name` open, with the whiteouts it holds (`ENOTEMPTY` if it holds
    /// anything else).
    fn of_whiteouts(&self, at: BorrowedFd<'_>, name: &Name) -> io::Result<(OwnedFd, Vec<Name>)> {
        let d = sys::open_path(at, name)?;
        let whiteouts = self
            .only_whiteouts(d.as_fd())?
            .ok_or_else(|| err(libc::ENOTEMPTY))?;
        Ok((d, whiteouts))
    }

    /// [`Union::delete_dir`] of `DIR/work/tmp`, a directory out of the view, once it is
    /// seen to hold whiteouts only: the deletion itself is left to the union's deleting
    /// thread when it has room (`purge.rs`). On an error nothing was deleted (`tmp` given
    /// back for the caller to put the directory back).
    fn discard_dir(&self, work: BorrowedFd<'_>, tmp: Name) -> Result<(), (io::Error, Name)> {
        let (dir, names) = match self.of_whiteouts(work, &tmp) {
            Ok(x) => x,
            Err(e) => return Err((e, tmp)),
        };
        match self.purger.later(work, purge::Job { tmp, dir, names }) {
            Ok(()) => Ok(()),
            Err(j) => self
                .delete_whiteouts(work, &j.tmp, j.dir.as_fd(), &j.names)
                .map_err(|e| (e, j.tmp)),
        }
    }

    /// The whiteouts upper directory `dir` holds, if it holds nothing else (one read of
    /// it; each entry told by its attributes).
    fn only_whiteouts(&self, dir: BorrowedFd<'_>) -> io::Result<Option<Vec<Name>>> {
        let d = sys::reopen_dir(self.proc_fd.as_fd(), dir)?;
        let mut out = Vec::new();
        for e in sys::read_dir(d.as_fd())? {
            let n = Name::new(&e.name)?;
            match self.entry_at(0, dir, &n)? {
                Some(false) => return Ok(None),
                Some(true) => out.push(n),
                None => {}
            }
        }
        Ok(Some(out))
    }

    /// Before a rename replaces the merged-empty upper directory `nup/newname` (found as
    /// `d`): if it holds whiteouts, it is swapped with an empty opaque directory of the
    /// same attributes made in `DIR/work` — the view is the same (a directory showing
    /// nothing), and the rename that follows replaces an empty directory. Returns where
    /// the old directory is in `DIR/work`, for [`Union::after_replace`].
    pub(super) fn empty_in_place(
        &self,
        nup: BorrowedFd<'_>,
        newname: &Name,
        d: &Found,
    ) -> io::Result<Option<Name>> {
        if self.is_empty_dir(d.fd.as_fd())? {
            return Ok(None);
        }
        let work = self.work()?;
        let tmp = temp_name("empty");
        let made = self.make_copy(work, &tmp, d.fd.as_fd(), &d.st, false);
        let r = made.and_then(|()| {
            let new = sys::open_path(work, &tmp)?;
            if let Some(o) = self.marker(d.fd.as_fd(), b"origin") {
                self.set_marker(new.as_fd(), b"origin", &o)?;
            }
            self.set_marker(new.as_fd(), b"opaque", b"y")?;
            sys::renameat2(work, &tmp, nup, newname, libc::RENAME_EXCHANGE)
        });
        if let Err(e) = r {
            let _ = sys::unlinkat(work, &tmp, libc::AT_REMOVEDIR);
            return Err(e);
        }
        self.bump();
        Ok(Some(tmp))
    }

    /// After the rename that replaced `nup/newname` (`renamed`), given what
    /// [`Union::empty_in_place`] swapped out to `DIR/work/tmp`: deleted if the rename was
    /// made, else swapped back (the agent's directory, with its identity and whiteouts,
    /// as it was).
    pub(super) fn after_replace(
        &self,
        nup: BorrowedFd<'_>,
        newname: &Name,
        tmp: &Name,
        renamed: bool,
    ) {
        if !renamed {
            self.put_back(nup, newname, tmp, Some(libc::AT_REMOVEDIR));
        } else if let Err((e, _)) = self
            .work()
            .map_err(|e| (e, tmp.clone()))
            .and_then(|w| self.discard_dir(w, tmp.clone()))
        {
            log::error!(
                "stage: deleting a replaced directory from the work directory: {e}; it is \
                 there as {}",
                String::from_utf8_lossy(tmp.bytes())
            );
        }
    }

    /// Whether upper directory `dir` has no entry at all.
    fn is_empty_dir(&self, dir: BorrowedFd<'_>) -> io::Result<bool> {
        let d = sys::reopen_dir(self.proc_fd.as_fd(), dir)?;
        Ok(sys::read_dir(d.as_fd())?.is_empty())
    }
}
