//! A live apply leaves staged every file some process holds open for writing through the
//! mount: the descriptor reaches the staged file's inode in DIR and nothing else, so were
//! the path applied (SOURCE gets a copy, the staged entry is dropped), every later write
//! through it would land in a file that is neither in SOURCE nor staged — lost. Refused
//! instead (`refused M a.txt: open for writing …`), the path stays staged with its inode,
//! the writes keep showing through the mount, and the next apply after the close carries
//! them.
//!
//! Invariants: a change is refused when its staged entry is such a file, or (a directory
//! applied whole: new, or replacing a file) holds one anywhere below it; the files are
//! the daemon's write handles recorded at the swap, with the request gate closed (no new
//! open meanwhile).

use std::collections::HashSet;
use std::io;

use super::changes::{Change, Kind, Layers};
use super::render::status_line;
use super::seal::Key;
use super::tree::{Node, kind};
use super::walk::{Event, Flow, walk};

/// Splits `list` into the changes to go on with and a `refused …` line for each one that
/// holds a file of `held` (inodes in DIR open for writing).
pub fn keep_open(l: &Layers, list: Vec<Change>, held: &HashSet<Key>) -> (Vec<Change>, Vec<String>) {
    if held.is_empty() {
        return (list, Vec::new());
    }
    let mut keep = Vec::new();
    let mut refused = Vec::new();
    for c in list {
        // Cannot tell: kept staged rather than risk the writer's bytes.
        if holds(l, &c, held).unwrap_or(true) {
            refused.push(format!(
                "refused {}: open for writing through the mount (what it writes after an apply would be lost): close it, then apply",
                status_line(&c)
            ));
        } else {
            keep.push(c);
        }
    }
    (keep, refused)
}

fn holds(l: &Layers, c: &Change, held: &HashSet<Key>) -> io::Result<bool> {
    if c.kind == Kind::Deleted {
        return Ok(false);
    }
    let Some(u) = l.upper.get(&c.path)? else {
        return Ok(false);
    };
    let key = |n: &Node| (n.st.st_dev, n.st.st_ino);
    if kind(&u.st) != libc::S_IFDIR {
        return Ok(held.contains(&key(&u)));
    }
    if !matches!(c.kind, Kind::Added | Kind::Type) {
        return Ok(false);
    }
    let mut hit = false;
    walk(&l.upper, u, &c.path, (), |ev| {
        let Event::Entry { dir, name, .. } = ev else {
            return Ok(Flow::Next);
        };
        let Some(n) = l.upper.child(&dir.node, name)? else {
            return Ok(Flow::Next);
        };
        if kind(&n.st) == libc::S_IFDIR {
            return Ok(Flow::Enter(n, ()));
        }
        if held.contains(&key(&n)) {
            hit = true;
            return Ok(Flow::Stop);
        }
        Ok(Flow::Next)
    })?;
    Ok(hit)
}
