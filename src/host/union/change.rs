//! The name changes of the merged view, made in the upper only: a new name (over a
//! whiteout, an opaque directory over a lower one), a rename (a whiteout left behind, a
//! redirect on a directory with lower parts, so its lower entries follow it), an exchange.
//! Removals are in `remove.rs`.
//!
//! A new name over a whiteout, or one a lower layer holds, is made under a temporary name
//! in the same upper directory (by the caller's own create, as the caller: permissions,
//! owner and the directory's defaults are the same as at the name itself), marked opaque
//! there if a directory, and then renamed over the whiteout (a directory, which rename(2)
//! cannot put over a device, is swapped with it by `RENAME_EXCHANGE` and the whiteout
//! deleted) or into the free name. A directory renamed onto a whiteout is swapped with it
//! the same way; a merged-empty directory a rename replaces is first swapped with an
//! empty opaque copy (`remove.rs`).
//!
//! Invariants: the caller holds the parent directories in the upper (copied up) and the
//! moved or removed object copied up when it is a file; every change of a name that a
//! lower layer holds is one rename, so a failure or a crash at any step leaves the name
//! as it was or as it should be — a whiteout is never taken away before what replaces it
//! is complete (opaque included), and a rename that fails leaves every deletion in
//! place. A crash may leave a temporary `#fencefs-new.*` entry in an upper directory (the
//! agent's new object under its temporary name) or a whiteout under such a name (hidden).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::{Found, Stack, Union, crash_point, err, kind, temp_name};
use crate::host::sys::{self, Name};

/// What a new name needs (see [`Union::prepare_new`]).
pub struct NewName {
    /// Made under this temporary name first, then put in place by
    /// [`Union::finish_new`]; `None`: made at its own name.
    temp: Option<Name>,
    /// A lower layer holds this name: a new directory must be opaque.
    over_lower: bool,
    /// The sealed layer's directory whose whiteout the new name goes over (none in the
    /// upper): a new directory carries that whiteout's staged time (`staged.rs`).
    sealed_whiteout: Option<Arc<OwnedFd>>,
    /// SOURCE's part of the parent, if it has one: what a replacement that cannot carry
    /// the deletion's time is checked against (`staged.rs`).
    source: Option<Arc<OwnedFd>>,
}

impl NewName {
    /// Whether no layer held anything at the name when it was prepared (no entry, no
    /// whiteout): the object is made at the name itself, over nothing anyone staged.
    pub fn is_fresh(&self) -> bool {
        self.temp.is_none()
    }

    /// The name the new object is to be made at (in the same upper directory).
    pub fn at<'a>(&'a self, name: &'a Name) -> &'a Name {
        self.temp.as_ref().unwrap_or(name)
    }
}

impl Union {
    /// Before a new name `name` is made in merged directory `parent` (its upper part is
    /// `up`): `EEXIST` if the merged view shows it. Nothing changes yet; the object is
    /// to be made at [`NewName::at`].
    pub fn prepare_new(
        &self,
        parent: &Stack,
        up: BorrowedFd<'_>,
        name: &Name,
    ) -> io::Result<NewName> {
        self.writable()?;
        // One look at each part, top down, by attributes only: an entry of the upper
        // that is not a whiteout is shown; else the first lower part with an entry
        // decides — shown unless the upper's whiteout or its own hides it.
        let over_whiteout = match self.entry_at(0, up, name)? {
            Some(false) => return Err(err(libc::EEXIST)),
            Some(true) => true,
            None => false,
        };
        let mut over_lower = false;
        let mut sealed_whiteout = None;
        for p in parent.parts.iter().filter(|p| p.layer > 0) {
            if let Some(whiteout) = self.entry_at(p.layer, p.fd.as_fd(), name)? {
                if !over_whiteout && !whiteout {
                    return Err(err(libc::EEXIST));
                }
                if !over_whiteout && whiteout {
                    sealed_whiteout = Some(p.fd.clone());
                }
                over_lower = true;
                break;
            }
        }
        Ok(NewName {
            temp: (over_lower || over_whiteout).then(|| temp_name("new")),
            over_lower,
            sealed_whiteout,
            source: self.source_part(parent).map(|p| p.fd.clone()),
        })
    }

    /// After the new object was made (`made`) at [`NewName::at`], or not: one made under a
    /// temporary name is put in place — a directory over a lower name opaque first — over
    /// the whiteout if one is there, else only if the name is still free (`EEXIST`). If
    /// that fails the object is deleted again and the error returned; the whiteout stays.
    pub fn finish_new(
        &self,
        up: BorrowedFd<'_>,
        name: &Name,
        n: &NewName,
        made: bool,
        dir: bool,
    ) -> io::Result<()> {
        self.writable()?;
        let Some(tmp) = &n.temp else { return Ok(()) };
        if !made {
            return Ok(());
        }
        crash_point("new-made");
        let _g = self.names.lock();
        let r = self.put_new(up, tmp, name, n, dir);
        if r.is_err() {
            let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
            if let Err(e) = sys::unlinkat(up, tmp, flags) {
                log::error!("stage: deleting a new name that could not be put in place: {e}");
            }
        }
        if dir {
            self.bump();
        }
        r
    }

    /// Renames `up/tmp` to `up/name`: over a whiteout, or into the free name. A directory
    /// over a lower name is made opaque first, and carries the staged time of the
    /// whiteout it goes over (`rm -rf d; mkdir d`: a host edit below `d` after the
    /// removal stays a conflict).
    fn put_new(
        &self,
        up: BorrowedFd<'_>,
        tmp: &Name,
        name: &Name,
        n: &NewName,
        dir: bool,
    ) -> io::Result<()> {
        if dir && n.over_lower {
            let d = sys::open_path(up, tmp)?;
            self.set_marker(d.as_fd(), b"opaque", b"y")?;
        }
        let replaced = || match &n.sealed_whiteout {
            Some(at) => self.whiteout_time(at.as_fd(), name),
            None => self.whiteout_time(up, name),
        };
        let k = match dir {
            true => libc::S_IFDIR,
            false => kind(&sys::fstatat_nofollow(up, tmp)?),
        };
        if self.can_carry(k) {
            let d = sys::open_path(up, tmp)?;
            self.carry_staged(d.as_fd(), replaced()?)?;
        } else {
            self.refuse_uncarried(k, replaced()?, n.source.as_deref(), name)?;
        }
        if !self.upper_whiteout(up, name)? {
            return sys::renameat2(up, tmp, up, name, libc::RENAME_NOREPLACE);
        }
        if !dir {
            return sys::renameat2(up, tmp, up, name, 0);
        }
        sys::renameat2(up, tmp, up, name, libc::RENAME_EXCHANGE)?;
        // The whiteout is under the temporary name now, hiding nothing.
        if let Err(e) = sys::unlinkat(up, tmp, 0) {
            log::warn!("stage: deleting a replaced whiteout: {e}");
        }
        Ok(())
    }

    /// Whether any layer below the upper holds `name` in `parent` at all (whiteouts of a
    /// sealed layer included: a directory made there must hide what is below).
    fn lower_positive_any(&self, parent: &Stack, name: &Name) -> io::Result<bool> {
        for p in parent.parts.iter().filter(|p| p.layer > 0) {
            if self.entry_at(p.layer, p.fd.as_fd(), name)?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Makes a whiteout `name` in directory `dir` (the upper, or `DIR/work`).
    pub fn whiteout(&self, dir: BorrowedFd<'_>, name: &Name) -> io::Result<()> {
        self.writable()?;
        sys::mknodat(dir, name, libc::S_IFCHR, 0)
    }

    /// Renames `name` of merged directory `parent` (upper part `up`, the entry copied up
    /// already: `src`) to `newname` of `newparent` (upper part `nup`), replacing what the
    /// merged view shows there (`dst`) unless `noreplace`. A directory with lower parts
    /// gets a redirect to where they are; a name a lower layer shows is left a whiteout.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        (parent, up, name): (&Stack, BorrowedFd<'_>, &Name),
        (newparent, nup, newname): (&Stack, BorrowedFd<'_>, &Name),
        src: &Found,
        dst: Option<&Found>,
        noreplace: bool,
    ) -> io::Result<()> {
        self.writable()?;
        let _g = self.names.lock();
        let src_dir = kind(&src.st) == libc::S_IFDIR;
        let mut swapped = None;
        // The oldest deletion in a merged-empty directory the rename replaces.
        let mut dst_oldest = None;
        if let Some(d) = dst {
            if noreplace {
                return Err(err(libc::EEXIST));
            }
            let dst_dir = kind(&d.st) == libc::S_IFDIR;
            match (src_dir, dst_dir) {
                (false, true) => return Err(err(libc::EISDIR)),
                (true, false) => return Err(err(libc::ENOTDIR)),
                (true, true) => {
                    let s = d.stack.as_ref().ok_or_else(|| err(libc::EIO))?;
                    let entries;
                    (entries, dst_oldest) = self.read_dir_dated(s)?;
                    if !entries.is_empty() {
                        return Err(err(libc::ENOTEMPTY));
                    }
                    if d.layer == 0 {
                        swapped = self.empty_in_place(nup, newname, d)?;
                    }
                }
                (false, false) => {}
            }
        }
        if swapped.is_some() {
            crash_point("emptied");
        }
        let r = self.rename_in(
            (parent, up, name),
            (newparent, nup, newname),
            src,
            (dst, dst_oldest),
        );
        if let Some(tmp) = swapped {
            self.after_replace(nup, newname, &tmp, r.is_ok());
        }
        r?;
        if src_dir || dst.is_some_and(|d| kind(&d.st) == libc::S_IFDIR) {
            self.bump();
        }
        Ok(())
    }

    /// The rename itself, once what it replaces is known to be replaceable: markers on a
    /// moved directory, then one rename (or exchange with a whiteout).
    fn rename_in(
        &self,
        (parent, up, name): (&Stack, BorrowedFd<'_>, &Name),
        (newparent, nup, newname): (&Stack, BorrowedFd<'_>, &Name),
        src: &Found,
        (dst, dst_oldest): (Option<&Found>, Option<i128>),
    ) -> io::Result<()> {
        let src_dir = kind(&src.st) == libc::S_IFDIR;
        let old_lower = self.lower_positive(parent, name)?;
        // What the moved entry stood for since it was staged, before it takes on what it
        // replaces: the whiteout it leaves at its old name (if a lower layer shows that
        // name) stands for it now.
        let since = old_lower.then(|| self.staged_time(src.fd.as_fd(), &src.st));
        if !src_dir {
            // What the moved entry replaces stood for changes since its staged time (a
            // deletion's whiteout, a staged entry): a file carries it, anything else that
            // cannot is refused where SOURCE changed since (`staged.rs`).
            let t = match dst {
                Some(d) if !self.is_source(d.layer) => Some(self.staged_time(d.fd.as_fd(), &d.st)),
                Some(_) => None,
                None => self.replaced_time(newparent, nup, newname)?,
            };
            self.carry_or_refuse((up, name), kind(&src.st), t, newparent, newname)?;
        }
        let redirect = match src.stack.as_ref() {
            Some(s) if s.has_lower() => {
                s.parts.iter().find(|p| p.layer > 0).map(|p| p.path.clone())
            }
            _ => None,
        };
        let up_dir = || sys::open_path(up, name);
        if let Some(r) = &redirect {
            let d = up_dir()?;
            self.set_marker(d.as_fd(), b"redirect", &[b"/".as_slice(), r].concat())?;
        }
        let new_lower = self.lower_positive_any(newparent, newname)?;
        // An upper-only directory moved over a name a lower layer holds hides what is
        // below it there.
        if src_dir && redirect.is_none() && new_lower {
            let d = up_dir()?;
            self.set_marker(d.as_fd(), b"opaque", b"y")?;
        }
        // A directory moved onto a deleted name, or over a staged directory, stands for
        // what that one stood for since its staged time.
        if src_dir {
            let replaced = match dst {
                // (A sealed layer's too: `mv -T x d` over a `d` a checkpoint emptied.)
                Some(d) if !self.is_source(d.layer) => Some(self.dir_since(d, dst_oldest)),
                Some(_) => None,
                None => self.replaced_time(newparent, nup, newname)?,
            };
            let d = up_dir()?;
            self.carry_staged(d.as_fd(), replaced)?;
        }
        // A directory cannot replace the whiteout a deleted name left (ENOTDIR): it is
        // swapped with it, and the whiteout lands on the old name — kept there if a lower
        // layer shows that name, else deleted.
        if src_dir && dst.is_none() && self.upper_whiteout(nup, newname)? {
            sys::renameat2(up, name, nup, newname, libc::RENAME_EXCHANGE)?;
            if !old_lower && let Err(e) = sys::unlinkat(up, name, 0) {
                log::warn!("stage: deleting a replaced whiteout: {e}");
            }
        } else {
            self.move_entry((up, name), (nup, newname), old_lower)?;
        }
        if let Some(t) = since {
            self.date_left(up, name, t);
        }
        Ok(())
    }

    /// `up/name` renamed to `nup/newname`, leaving a whiteout behind if `whiteout`
    /// (`RENAME_WHITEOUT`, one step: a staging area whose file system has none is refused
    /// at start, as overlayfs refuses such an upper).
    fn move_entry(
        &self,
        (up, name): (BorrowedFd<'_>, &Name),
        (nup, newname): (BorrowedFd<'_>, &Name),
        whiteout: bool,
    ) -> io::Result<()> {
        let flags = if whiteout { libc::RENAME_WHITEOUT } else { 0 };
        sys::renameat2(up, name, nup, newname, flags)
    }

    /// `RENAME_EXCHANGE` of two merged entries, both copied up: allowed when neither is a
    /// directory with lower parts (those would need their redirects swapped: `EXDEV`, as
    /// overlayfs without redirects answers, and `mv` copies instead). A directory moved
    /// onto a name a lower layer holds is made opaque first (as [`Union::rename`] does),
    /// or what the agent deleted there would show through it again.
    pub fn exchange(
        &self,
        (parent, up, name): (&Stack, BorrowedFd<'_>, &Name),
        (newparent, nup, newname): (&Stack, BorrowedFd<'_>, &Name),
        a: &Found,
        b: &Found,
    ) -> io::Result<()> {
        self.writable()?;
        let _g = self.names.lock();
        let lower_dir = |f: &Found| f.stack.as_ref().is_some_and(Stack::has_lower);
        if lower_dir(a) || lower_dir(b) {
            return Err(err(libc::EXDEV));
        }
        let is_dir = |f: &Found| kind(&f.st) == libc::S_IFDIR;
        // A directory moved onto a name a lower layer holds hides it (opaque), and stands
        // for what the entry there stood for since its staged time.
        // (Both read before either is marked.)
        let staged = |f: &Found| (f.layer == 0).then(|| self.staged_time(f.fd.as_fd(), &f.st));
        let (ta, tb) = (staged(a), staged(b));
        // A non-directory takes the other's place: it stands for what that one stood for
        // (both refusals checked first: a refusal changes nothing).
        let sides = [
            (a, (up, name), tb, newparent, newname),
            (b, (nup, newname), ta, parent, name),
        ];
        for (f, _, t, at, at_name) in sides {
            if !is_dir(f) && !self.can_carry(kind(&f.st)) {
                let source = self.source_part(at).map(|p| &*p.fd);
                self.refuse_uncarried(kind(&f.st), t, source, at_name)?;
            }
        }
        for (f, here, t, at, at_name) in sides {
            if !is_dir(f) && self.can_carry(kind(&f.st)) {
                self.carry_or_refuse(here, kind(&f.st), t, at, at_name)?;
            }
        }
        if is_dir(a) && self.lower_positive_any(newparent, newname)? {
            let d = sys::open_path(up, name)?;
            self.set_marker(d.as_fd(), b"opaque", b"y")?;
            self.carry_staged(d.as_fd(), tb)?;
        }
        if is_dir(b) && self.lower_positive_any(parent, name)? {
            let d = sys::open_path(nup, newname)?;
            self.set_marker(d.as_fd(), b"opaque", b"y")?;
            self.carry_staged(d.as_fd(), ta)?;
        }
        sys::renameat2(up, name, nup, newname, libc::RENAME_EXCHANGE)?;
        if is_dir(a) || is_dir(b) {
            self.bump();
        }
        Ok(())
    }

    /// The staged non-directory `dir/name` (kind `k`) is to stand at `at_name` of merged
    /// directory `at` for what stood there since `t`: a file carries `t`; anything else,
    /// which cannot, is refused where SOURCE changed since (`staged.rs`).
    fn carry_or_refuse(
        &self,
        (dir, name): (BorrowedFd<'_>, &Name),
        k: u32,
        t: Option<i128>,
        at: &Stack,
        at_name: &Name,
    ) -> io::Result<()> {
        if self.can_carry(k) {
            if t.is_some() {
                let f = sys::open_path(dir, name)?;
                self.carry_staged(f.as_fd(), t)?;
            }
            return Ok(());
        }
        let source = self.source_part(at).map(|p| &*p.fd);
        self.refuse_uncarried(k, t, source, at_name)
    }
}
