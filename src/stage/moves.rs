//! Files the agent renamed (`mv a b`, `git mv`): listed as one `R a -> b` instead of
//! `D a` + `A b`, and applied as a rename in SOURCE (the file keeps its inode there, and a
//! large file is not copied), followed by the staged contents when the agent also changed
//! them.
//!
//! A staged file at `b` that SOURCE does not have is a rename of `a` when its base record
//! ([`super::base`]) was taken at `a`, and the staged tree deletes `a`, whose SOURCE object
//! is the one the record names. Anything else stays as it was listed: a rename over an
//! existing path is `D a` + `M b`, a file moved into a new directory is part of that
//! directory's `A dir/`; a swap of two names (`mv x t; mv y x; mv t y`) and longer cycles
//! have no added or deleted path, and are paired by [`super::cycles`].
//!
//! Invariants: pairing only merges two listed changes into one (a conflict of either is
//! the rename's); apply renames with `RENAME_NOREPLACE` and checks that what moved is the
//! object the listing saw, moving it back otherwise, so no host file is ever replaced or
//! carried off; the old name's whiteout is unstaged only after the rename.

use std::io;
use std::os::fd::AsFd;

use super::changes::{Change, Kind, Layers, lower_ident};
use super::remove::{sync_dir, unstage_path};
use super::tree::{Node, kind, split};
use crate::host::sys::{self, Name};

/// What an applied file rename leaves to do: the staged contents or metadata still
/// differ from the file that moved (`Some`: apply them as this change), or nothing.
pub type Rest = Option<Change>;

/// Renames SOURCE's `from` to `c.path` (a file rename `c`), checks that the object that
/// moved is the one listed, and unstages the old name's whiteout. Returns the change of
/// contents or metadata left to write at the new path.
pub fn apply(l: &Layers, c: &Change, from: &[u8]) -> io::Result<Rest> {
    let (fp, fl) = split(from);
    let (tp, tl) = split(&c.path);
    let src = dir(l, fp)?;
    let dst = dir(l, tp)?;
    let (fname, tname) = (Name::new(fl)?, Name::new(tl)?);
    // Still the object the listing saw, ctime included (an in-place edit that keeps the
    // size): the rename would carry the host's edit off under the staged bytes.
    let before = l.lower.child(&src, fl)?;
    if !c.conflict && before.map(|n| lower_ident(&n.st)) != c.lower_st {
        return Err(io::Error::other(
            "conflict (SOURCE changed while applying; --force applies the staged version)",
        ));
    }
    sys::renameat2(
        src.fd.as_fd(),
        &fname,
        dst.fd.as_fd(),
        &tname,
        libc::RENAME_NOREPLACE,
    )?;
    let moved = l.lower.child(&dst, tl)?;
    let expected = |n: &Node| {
        c.conflict
            || c.lower_st.is_some_and(|w| {
                let now = lower_ident(&n.st);
                // A rename changes ctime: the inode, size and mode say it is the same.
                w[0] == now[0] && w[2] == now[2] && w[3] == now[3]
            })
    };
    if !moved.as_ref().is_some_and(expected) {
        // The host replaced the file since the listing: put it back where it was.
        sys::renameat2(
            dst.fd.as_fd(),
            &tname,
            src.fd.as_fd(),
            &fname,
            libc::RENAME_NOREPLACE,
        )?;
        return Err(io::Error::other(
            "conflict (SOURCE changed while applying; --force applies the staged version)",
        ));
    }
    sync_dir(l.lower.source(), dst.fd.as_fd())?;
    sync_dir(l.lower.source(), src.fd.as_fd())?;
    if let Some(o) = l.upper.get(from)?
        && l.upper.is_whiteout(&o)
    {
        unstage_path(&l.upper, from)?;
    }
    let moved = moved.expect("checked above");
    let Some(u) = l.upper.get(&c.path)? else {
        return Ok(None);
    };
    if kind(&u.st) == kind(&moved.st) && !l.differs(&u, &moved)? {
        unstage_path(&l.upper, &c.path)?;
        return Ok(None);
    }
    Ok(Some(Change {
        kind: Kind::Modified,
        conflict: false,
        lower_st: Some(lower_ident(&moved.st)),
        ..c.clone()
    }))
}

fn dir(l: &Layers, path: &[u8]) -> io::Result<Node> {
    l.lower.dir(path)?.ok_or_else(|| {
        io::Error::other(format!(
            "SOURCE parent '{}' is not a directory",
            super::render::quote(path)
        ))
    })
}
