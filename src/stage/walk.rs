//! The stage tools' one way down a tree: a depth-first walk of a layer's directory with an
//! explicit stack instead of recursion, so a tree as deep as the merged view lets an agent
//! make (4,096 levels, `host/inode/merged.rs`) is walked by `status`, `checkpoint`,
//! `discard` and `apply` on any thread, whatever its stack.
//!
//! Entries come in the order a recursive walk gives them: a directory's entries in name
//! order, each directory entered (its own entries walked) before its next sibling, and
//! left once they are done.
//!
//! Invariants: one frame per level entered (the directory's `O_PATH` handle, its path, the
//! names not yet visited and the walker's state for it): memory and descriptors are
//! bounded by the tree's depth and its directories' sizes, never by the thread's stack;
//! past [`MAX_DEPTH`](super::tree::MAX_DEPTH) levels the walk fails with ELOOP. No write
//! here: what an entry means is the caller's.

use std::io;

use super::lower::Tree;
use super::tree::{Node, depth_of, depth_ok};

/// A directory being walked.
pub struct Frame<T> {
    /// Its handle.
    pub node: Node,
    /// The caller's state for it (what [`Flow::Enter`] gave).
    pub state: T,
    names: std::vec::IntoIter<Vec<u8>>,
    /// The walk's path before this directory's name was added.
    cut: usize,
}

/// What the walk tells the caller.
pub enum Event<'a, T> {
    /// Entry `name` of directory `dir` at `path` (not yet opened: the caller looks it up).
    Entry {
        /// The directory.
        dir: &'a Frame<T>,
        /// Its path in the layer.
        path: &'a [u8],
        /// The entry's name.
        name: &'a [u8],
    },
    /// Every entry of `dir` at `path` was visited; `parent` is the directory it is in
    /// (`None` for the walk's top).
    Leave {
        /// The directory.
        dir: Frame<T>,
        /// Its path in the layer.
        path: &'a [u8],
        /// The directory it is in.
        parent: Option<&'a Frame<T>>,
    },
}

/// What the caller does with an [`Event::Entry`] (ignored for a `Leave`).
pub enum Flow<T> {
    /// On with the next entry.
    Next,
    /// Walk into this directory (the entry's handle) with this state, before the next
    /// entry.
    Enter(Node, T),
    /// End the walk here.
    Stop,
}

/// Walks the directory `top` of `layer` (a layer, or a stacked view) at `path` (with the caller's `state` for it):
/// `f` gets every entry below it and every directory's leave, top's last. Returns
/// `Ok(false)` when `f` stopped the walk (no leave follows a stop). One path buffer for
/// the whole walk: a frame holds its directory's names, not its path.
pub fn walk<T, L: Tree + ?Sized>(
    layer: &L,
    top: Node,
    path: &[u8],
    state: T,
    mut f: impl FnMut(Event<'_, T>) -> io::Result<Flow<T>>,
) -> io::Result<bool> {
    let base = depth_of(path);
    depth_ok(base)?;
    let names = layer.names(&top)?.into_iter();
    let mut path = path.to_vec();
    let mut stack = vec![Frame {
        node: top,
        state,
        names,
        cut: path.len(),
    }];
    while let Some(dir) = stack.last_mut() {
        let Some(name) = dir.names.next() else {
            let dir = stack.pop().expect("a frame");
            let cut = dir.cut;
            f(Event::Leave {
                dir,
                path: &path,
                parent: stack.last(),
            })?;
            path.truncate(cut);
            continue;
        };
        let dir = stack.last().expect("a frame");
        let flow = f(Event::Entry {
            dir,
            path: &path,
            name: &name,
        })?;
        match flow {
            Flow::Next => {}
            Flow::Stop => return Ok(false),
            Flow::Enter(node, state) => {
                depth_ok(base + stack.len())?;
                let names = layer.names(&node)?.into_iter();
                let cut = path.len();
                if !path.is_empty() {
                    path.push(b'/');
                }
                path.extend_from_slice(&name);
                stack.push(Frame {
                    node,
                    state,
                    names,
                    cut,
                });
            }
        }
    }
    Ok(true)
}
