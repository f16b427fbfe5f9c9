//! The name changes of the merged view, made in the upper only: a new name (over a
//! whiteout, an opaque directory over a lower one), a removal (a whiteout where a lower
//! layer shows the name), a rename (a whiteout left behind, a redirect on a directory
//! with lower parts, so its lower entries follow it).
//!
//! Invariants: the caller holds the parent directories in the upper (copied up) and the
//! moved or removed object copied up when it is a file; a directory is removed only when
//! the merged view shows nothing in it; a whiteout taken away for a new name is put back
//! when the new name could not be made.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use super::{Found, Stack, Union, kind};
use crate::host::sys::{self, Name};

fn err(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

/// What a new name needs once made (see [`Union::prepare_new`]).
pub struct NewName {
    /// A whiteout was taken away for it (put back if the name is not made).
    pub over_whiteout: bool,
    /// A lower layer shows this name: a new directory must be opaque.
    pub over_lower: bool,
}

impl Union {
    /// Before a new name `name` is made in merged directory `parent` (its upper part is
    /// `up`): `EEXIST` if the merged view shows it, and a whiteout there is taken away.
    pub fn prepare_new(
        &self,
        parent: &Stack,
        up: BorrowedFd<'_>,
        name: &Name,
    ) -> io::Result<NewName> {
        // One look at each part, top down, by attributes only: an entry of the upper
        // that is not a whiteout is shown; else the first lower part with an entry
        // decides — shown unless the upper's whiteout or its own hides it.
        let over_whiteout = match self.entry_at(0, up, name)? {
            Some(false) => return Err(err(libc::EEXIST)),
            Some(true) => true,
            None => false,
        };
        let mut over_lower = false;
        for p in parent.parts.iter().filter(|p| p.layer > 0) {
            if let Some(whiteout) = self.entry_at(p.layer, p.fd.as_fd(), name)? {
                if !over_whiteout && !whiteout {
                    return Err(err(libc::EEXIST));
                }
                over_lower = true;
                break;
            }
        }
        if over_whiteout {
            sys::unlinkat(up, name, 0)?;
        }
        Ok(NewName {
            over_whiteout,
            over_lower,
        })
    }

    /// After the new name was made (`made`) or not: a new directory over a lower name is
    /// made opaque; a whiteout taken away for a name not made is put back.
    pub fn finish_new(&self, up: BorrowedFd<'_>, name: &Name, n: &NewName, made: bool, dir: bool) {
        if !made {
            if n.over_whiteout
                && let Err(e) = self.whiteout(up, name)
            {
                log::error!("stage: putting a whiteout back: {e}");
            }
            return;
        }
        if dir && n.over_lower {
            let r =
                sys::open_path(up, name).and_then(|d| self.set_marker(d.as_fd(), b"opaque", b"y"));
            if let Err(e) = r {
                log::error!("stage: marking a new directory opaque: {e}");
            }
            self.bump();
        }
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

    /// Makes a whiteout `name` in upper directory `up`.
    pub fn whiteout(&self, up: BorrowedFd<'_>, name: &Name) -> io::Result<()> {
        sys::mknodat(up, name, libc::S_IFCHR, 0)
    }

    /// Removes `name` (found as `f`) from merged directory `parent` (upper part `up`):
    /// the upper's entry goes, and a whiteout stands where a lower layer shows the name.
    /// A directory must show nothing (`ENOTEMPTY`); the whiteouts in its upper part go
    /// with it.
    pub fn remove(
        &self,
        parent: &Stack,
        up: BorrowedFd<'_>,
        name: &Name,
        f: &Found,
    ) -> io::Result<()> {
        let _g = self.names.lock();
        let dir = kind(&f.st) == libc::S_IFDIR;
        let mut whiteouts = Vec::new();
        if dir {
            let stack = f.stack.as_ref().ok_or_else(|| err(libc::EIO))?;
            if !self.read_dir_whiteouts(stack, &mut whiteouts)?.is_empty() {
                return Err(err(libc::ENOTEMPTY));
            }
        }
        let lower = self.lower_positive(parent, name)?;
        if f.layer == 0 {
            if dir {
                for w in &whiteouts {
                    sys::unlinkat(f.fd.as_fd(), &Name::new(w)?, 0)?;
                }
                // A directory with lower parts: a stack cached for it (a process's cwd)
                // must not show them. One in the upper only shows nothing once removed.
                if f.stack.as_ref().is_some_and(Stack::has_lower) {
                    self.bump();
                }
            }
            let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
            sys::unlinkat(up, name, flags)?;
        }
        if lower {
            self.whiteout(up, name)?;
        }
        Ok(())
    }

    /// Removes the whiteouts a merged-empty directory's upper part holds.
    fn clear_whiteouts(&self, dir: BorrowedFd<'_>) -> io::Result<()> {
        let d = sys::reopen_dir(self.proc_fd.as_fd(), dir)?;
        for e in sys::read_dir(d.as_fd())? {
            let n = Name::new(&e.name)?;
            if self.entry_at(0, dir, &n)? == Some(true) {
                sys::unlinkat(dir, &n, 0)?;
            }
        }
        Ok(())
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
        let _g = self.names.lock();
        let src_dir = kind(&src.st) == libc::S_IFDIR;
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
                    if !self.read_dir(s)?.is_empty() {
                        return Err(err(libc::ENOTEMPTY));
                    }
                    if d.layer == 0 {
                        self.clear_whiteouts(d.fd.as_fd())?;
                    }
                }
                (false, false) => {}
            }
        }
        let src_stack = src.stack.as_ref();
        let redirect = match src_stack {
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
        let old_lower = self.lower_positive(parent, name)?;
        // An upper-only directory moved over a name a lower layer holds hides what is
        // below it there.
        if src_dir && redirect.is_none() && new_lower {
            let d = up_dir()?;
            self.set_marker(d.as_fd(), b"opaque", b"y")?;
        }
        let flags = if old_lower { libc::RENAME_WHITEOUT } else { 0 };
        // A lower-only destination has no upper entry; an upper whiteout there is replaced
        // — by a file in the rename itself; a directory cannot replace a device (ENOTDIR),
        // so the whiteout goes first (the directory is opaque if it must be, set above)
        // and is put back if the rename fails.
        let over_whiteout = src_dir && dst.is_none() && self.upper_whiteout(nup, newname)?;
        if over_whiteout {
            sys::unlinkat(nup, newname, 0)?;
        }
        let moved = match sys::renameat2(up, name, nup, newname, flags) {
            Err(e) if flags != 0 && e.raw_os_error() == Some(libc::EINVAL) => {
                sys::renameat2(up, name, nup, newname, 0).map(|()| true)
            }
            r => r.map(|()| false),
        };
        match moved {
            Ok(true) => self.whiteout(up, name)?,
            Ok(false) => {}
            Err(e) => {
                if over_whiteout && let Err(e2) = self.whiteout(nup, newname) {
                    log::error!("stage: putting a whiteout back: {e2}");
                }
                return Err(e);
            }
        }
        if src_dir || dst.is_some_and(|d| kind(&d.st) == libc::S_IFDIR) {
            self.bump();
        }
        Ok(())
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
        let _g = self.names.lock();
        let lower_dir = |f: &Found| f.stack.as_ref().is_some_and(Stack::has_lower);
        if lower_dir(a) || lower_dir(b) {
            return Err(err(libc::EXDEV));
        }
        let is_dir = |f: &Found| kind(&f.st) == libc::S_IFDIR;
        if is_dir(a) && self.lower_positive_any(newparent, newname)? {
            let d = sys::open_path(up, name)?;
            self.set_marker(d.as_fd(), b"opaque", b"y")?;
        }
        if is_dir(b) && self.lower_positive_any(parent, name)? {
            let d = sys::open_path(nup, newname)?;
            self.set_marker(d.as_fd(), b"opaque", b"y")?;
        }
        sys::renameat2(up, name, nup, newname, libc::RENAME_EXCHANGE)?;
        if is_dir(a) || is_dir(b) {
            self.bump();
        }
        Ok(())
    }
}
