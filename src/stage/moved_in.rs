//! A directory the agent moved into a directory it made (`mkdir q; mv w/a q/a`): the new
//! directory is applied by copying its staged tree whole, which holds only the moved
//! directory's rename marker, not what the move carried (that is still SOURCE's `w/a`).
//! So such a new directory is refused and stays staged (its move can be applied once `q`
//! exists in SOURCE: then it is an ordinary `R w/a/ -> q/a/`), the moved directory's old
//! path is never listed deleted (`changes.rs`), and a file moved in beside it
//! (`mv w/b q/b`) keeps its deletion at `w/b` staged too: applied alone it would leave
//! the only copy in the refused directory, which a discard drops.
//!
//! Invariants: a deletion is kept staged when a refused new directory holds a copy of the
//! SOURCE file it deletes (its base record names the inode and path), or when a refused
//! new directory holds a copy whose SOURCE file cannot be told (every file deletion then
//! stays staged); when what a new directory holds cannot be read, it is refused.

use std::io;

use super::base;
use super::changes::{Change, Copies, Kind, Layers, redirect_path};
use super::tree::{Node, join, kind};
use super::walk::Flow;

/// A new directory (or one replacing a file) that holds a directory the agent moved in
/// from SOURCE: its old path (the first one found, when the change was listed). Copied
/// whole, it would land without what the move carried (its staged tree has none of it),
/// so it is refused and stays staged, and the moved directory's old path is never listed
/// as deleted (`changes.rs`).
fn moved_into_new(c: &Change) -> Option<&[u8]> {
    if !c.dir || !matches!(c.kind, Kind::Added | Kind::Type) {
        return None;
    }
    c.moved_in.as_deref()
}

/// The SOURCE files copied into the new directories [`moved_into_new`] refuses.
#[derive(Default)]
pub(super) struct KeptInNew {
    /// The refused new directories, each with the SOURCE directory moved into it.
    dirs: Vec<(Vec<u8>, Vec<u8>)>,
    /// (inode, SOURCE path as its record keeps it, the new directory).
    files: Vec<(u64, super::base::RecPath, Vec<u8>)>,
    /// A refused new directory holds a copy of an unknown SOURCE file: every file's
    /// deletion stays staged (the new directory it names).
    unknown: Option<Vec<u8>>,
}

impl KeptInNew {
    /// The SOURCE directory moved into `c`, when `c` is a refused new directory.
    pub(super) fn refused(&self, c: &Change) -> Option<&[u8]> {
        self.dirs
            .iter()
            .find(|(p, _)| *p == c.path)
            .map(|(_, from)| from.as_slice())
    }

    /// The refused new directory that holds a copy of the file `c` deletes.
    pub(super) fn holds(&self, c: &Change) -> Option<&[u8]> {
        if c.kind != Kind::Deleted || c.dir {
            return None;
        }
        if let Some(q) = &self.unknown {
            return Some(q);
        }
        let (_, ino) = c.lower_id?;
        self.files
            .iter()
            .find(|(i, p, _)| *i == ino && p.is(&c.path))
            .map(|(_, _, q)| q.as_slice())
    }
}

impl KeptInNew {
    /// The new directories of `order` to refuse, and what they hold of SOURCE.
    pub(super) fn of(l: &Layers, order: &[&Change]) -> KeptInNew {
        let mut k = KeptInNew::default();
        for c in order {
            let Some(from) = moved_into_new(c) else {
                continue;
            };
            k.dirs.push((c.path.clone(), from.to_vec()));
            let got = l
                .upper
                .dir(&c.path)
                .ok()
                .flatten()
                .map(|u| l.copies_in(&u, &c.path));
            match got {
                Some(Ok((files, unknown))) => {
                    k.files
                        .extend(files.into_iter().map(|(i, p)| (i, p, c.path.clone())));
                    if unknown {
                        k.unknown.get_or_insert_with(|| c.path.clone());
                    }
                }
                // Cannot tell: every deletion stays staged.
                _ => {
                    k.unknown.get_or_insert_with(|| c.path.clone());
                }
            }
        }
        k
    }
}

impl Layers {
    /// The renamed directories below the staged directory `d` at `path` whose SOURCE
    /// directory is still there (each one's old path and that directory): a new
    /// directory holding such a rename (`mkdir q; mv w/a q/a`) cannot be copied into
    /// SOURCE whole, as its staged tree has none of what the rename carried.
    pub fn moved_in(&self, d: &Node, path: &[u8]) -> io::Result<Vec<(Vec<u8>, Node)>> {
        let mut found = Vec::new();
        self.each_below(d.try_clone()?, path, |path, name, c| {
            if kind(&c.st) != libc::S_IFDIR {
                return Ok(Flow::Next);
            }
            if let Some(r) = self.upper.redirect(&c) {
                let from = redirect_path(&join(path, name), &r);
                if let Some(o) = self.lower.dir(&from)? {
                    found.push((from, o));
                }
            }
            Ok(Flow::Enter(c, ()))
        })?;
        Ok(found)
    }

    /// The SOURCE files whose copies lie below the staged directory `d` at `path` (a file
    /// the agent moved in: `mv w/b q/b`), as (inode, path) from their base records, and
    /// whether some copy below has an overlayfs origin but no record (then which SOURCE
    /// file it is cannot be told).
    pub fn copies_in(&self, d: &Node, path: &[u8]) -> io::Result<Copies> {
        let (mut found, mut unknown) = (Vec::new(), false);
        self.each_below(d.try_clone()?, path, |_, _, c| {
            match kind(&c.st) {
                libc::S_IFDIR => return Ok(Flow::Enter(c, ())),
                libc::S_IFREG => match base::of(&c) {
                    Some(b) => found.push((b.ino, b.path)),
                    None => unknown |= self.upper.xattr(&c, &super::tree::ovl(b"origin")).is_some(),
                },
                _ => {}
            }
            Ok(Flow::Next)
        })?;
        Ok((found, unknown))
    }
}
