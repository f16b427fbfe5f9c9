//! Removing staged entries and temporary trees: [`remove_tree`] (a tree, no symlink
//! followed, an entry already gone counting as removed) and the unstaging of one path
//! ([`unstage_path`], [`drop_staged`]), shared by apply, discard, recovery and the trash;
//! and the engine's one place to sync a directory ([`sync_dir`] for a layer's node,
//! [`sync_path`] for a directory of DIR). Every engine file imports these from here.
//!
//! Invariants: directories are entered by `O_PATH | O_NOFOLLOW` handles and symlinks are
//! removed themselves, never followed; trees are walked without recursion
//! ([`super::walk`]), to the staged tree's depth limit.
//! A primitive: it depends on the tree and stand-in helpers only, never on the engine's
//! operations.

use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use super::tree::{Layer, Node, split};
use super::walk::{Event, Flow, walk};
use crate::host::sys::{self, Name};

fn name_of(n: &[u8]) -> io::Result<Name> {
    Name::new(n)
}

/// fsync of the directory `fd` of `layer` (reopened for reading: `fd` may be `O_PATH`).
pub(super) fn sync_dir(layer: &Layer, fd: BorrowedFd<'_>) -> io::Result<()> {
    let f = sys::reopen(
        layer.proc_fd.as_fd(),
        fd,
        libc::O_RDONLY | libc::O_DIRECTORY,
    )?;
    sys::fsync(f.as_fd(), false)
}

/// fsync of the directory at `p` (a directory of the staging area, such as DIR itself).
pub(super) fn sync_path(p: &Path) -> io::Result<()> {
    fs::File::open(p)?.sync_all()
}

/// Removes `dir/n` and everything below it (no symlink followed: `unlinkat` removes a
/// symlink itself, and directories are entered by `O_PATH | O_NOFOLLOW` handles).
/// An entry already gone counts as removed (a concurrent removal of the same tree, such
/// as the background removal of the trash and a later command's recovery, is harmless).
pub(super) fn remove_tree(layer: &Layer, dir: BorrowedFd<'_>, n: &Name) -> io::Result<()> {
    let gone = |r: io::Result<()>| match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    };
    let Some(top) = open_dir(dir, n)? else {
        return gone(sys::unlinkat(dir, n, 0));
    };
    // Each directory is removed once its entries are: on leaving it, from its parent.
    walk(layer, top, b"", (), |ev| {
        match ev {
            Event::Entry { dir: d, name, .. } => {
                let n = name_of(name)?;
                match open_dir(d.node.fd.as_fd(), &n)? {
                    Some(c) => return Ok(Flow::Enter(c, ())),
                    None => gone(sys::unlinkat(d.node.fd.as_fd(), &n, 0))?,
                }
            }
            Event::Leave {
                path,
                parent: Some(p),
                ..
            } => {
                let n = name_of(split(path).1)?;
                gone(sys::unlinkat(p.node.fd.as_fd(), &n, libc::AT_REMOVEDIR))?;
            }
            Event::Leave { parent: None, .. } => {}
        }
        Ok(Flow::Next)
    })?;
    gone(sys::unlinkat(dir, n, libc::AT_REMOVEDIR))
}

/// `dir/n` when it is a directory (`Ok(None)`: it is something else, or gone; a stat
/// that finds it gone counts as a non-directory, whose removal then finds it gone too).
fn open_dir(dir: BorrowedFd<'_>, n: &Name) -> io::Result<Option<Node>> {
    let st = match sys::fstatat_nofollow(dir, n) {
        Ok(st) => st,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Ok(None);
    }
    let d = match sys::open_path(dir, n) {
        Ok(d) => d,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = sys::fstat(d.as_fd())?;
    Ok(Some(Node::of(d, st)))
}

/// Drops the staged entry at `path` of the staged tree `upper` (a whole tree for a
/// directory) and syncs its parent.
pub(super) fn unstage_path(upper: &Layer, path: &[u8]) -> io::Result<()> {
    if let Some(d) = drop_staged_in(upper, path, false)? {
        sync_dir(upper, d.fd.as_fd())?;
    }
    Ok(())
}

/// Drops the applied staged entry at `path`, not synced (a batch ends with one `syncfs`).
/// A stand-in for a character device 0/0 stays: SOURCE's real 0/0 device is a whiteout to
/// overlayfs, hidden from the merged view, and the stand-in equals it now (no change:
/// `status` does not list it).
pub(super) fn drop_staged(upper: &Layer, path: &[u8]) -> io::Result<()> {
    drop_staged_in(upper, path, true).map(drop)
}

/// Drops the staged entry at `path` (a stand-in too, unless `keep_stand_in`); its staged
/// parent when there was one.
fn drop_staged_in(upper: &Layer, path: &[u8], keep_stand_in: bool) -> io::Result<Option<Node>> {
    let (parent, last) = split(path);
    let Some(d) = upper.dir(parent)? else {
        return Ok(None);
    };
    let n = name_of(last)?;
    match sys::fstatat_nofollow(d.fd.as_fd(), &n) {
        Ok(st) if keep_stand_in && super::standin::is_stand_in(&st) => return Ok(None),
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    }
    remove_tree(upper, d.fd.as_fd(), &n)?;
    Ok(Some(d))
}
