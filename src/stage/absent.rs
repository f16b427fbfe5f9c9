//! The names a merged view shows as absent because of the staged trees: whiteouts (a
//! deleted file or directory) and what an opaque directory hides, in the live upper and
//! every live layer. A live change that replaces the view (discard, rewind, apply) hands
//! them to the kernel-cache pass: the kernel may hold a *negative* entry for each (a
//! process looked the deleted name up), which no pass over the names the daemon knows
//! reaches, and which would keep the name ENOENT after a discard brings it back.
//!
//! Invariants: read-only; bounded ([`MAX`] names, [`super::tree::MAX_DEPTH`] levels): past
//! the bound the rest is left to the kernel's entry timeout.

use std::path::Path;

use super::tree::{Layer, Node, join, kind};
use super::walk::{Event, Flow};

/// At most this many names are handed on.
pub const MAX: usize = 65_536;

/// Whiteout paths (an opaque directory: its own path, whose cached subtree the kernel
/// drops with it) of the live upper and layers of the staging area `dir`.
pub fn names(dir: &Path) -> Vec<Vec<u8>> {
    let mut roots = vec![dir.join("upper")];
    if let Ok(live) = super::layers::live(dir) {
        roots.extend(live.into_iter().map(|n| super::layers::layer_path(dir, n)));
    }
    let mut out = Vec::new();
    for r in roots {
        let Ok(l) = crate::host::sys::open_root(&r).and_then(Layer::new) else {
            continue;
        };
        if let Ok(Some(root)) = l.get(b"") {
            walk(&l, root, &mut out);
        }
    }
    out.sort();
    out.dedup();
    out
}

fn walk(l: &Layer, root: Node, out: &mut Vec<Vec<u8>>) {
    if out.len() >= MAX {
        return;
    }
    // Past the depth bound (or a directory that cannot be read) the walk ends: the rest
    // is left to the kernel's entry timeout.
    let _ = super::walk::walk(l, root, b"", (), |ev| {
        let Event::Entry { dir, path, name } = ev else {
            return Ok(Flow::Next);
        };
        let Ok(Some(c)) = l.child(&dir.node, name) else {
            return Ok(Flow::Next);
        };
        let mut flow = Flow::Next;
        if l.is_whiteout(&c) {
            out.push(join(path, name));
        } else if kind(&c.st) == libc::S_IFDIR {
            if l.is_opaque(&c) {
                out.push(join(path, name));
            }
            flow = Flow::Enter(c, ());
        }
        Ok(if out.len() >= MAX { Flow::Stop } else { flow })
    });
}
