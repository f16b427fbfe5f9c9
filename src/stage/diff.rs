//! `stage diff`: the staged changes as a unified diff in git's format, which `git apply`
//! and `patch -p1` accept in SOURCE (names quoted by `render.rs`'s rules).
//!
//! Invariants: no byte of a name or of binary contents reaches the output raw (names are
//! quoted as git quotes them with `core.quotePath`; a file with a NUL in its first 8000
//! bytes, or over 16 MiB, is `Binary files … differ`, with the staged file's size inside
//! that line when it is large or sparse). Read-only.

use std::collections::HashSet;
use std::io::{self, Write};

use super::changes::{Change, Kind, Layers};
use super::lower::Tree;
use super::render::quote;
use super::space::Space;
use super::tree::{Layer, Node, join, kind};
use super::walk::{Event, Flow, walk};
use crate::host::sys;

/// Past this size a file is shown as binary.
pub const MAX_TEXT: u64 = 16 << 20;

/// `prefix` + `p`, quoted as one name (git's `"a/x\ty"`).
pub fn quote_with(prefix: &[u8], p: &[u8]) -> String {
    let all: Vec<u8> = prefix.iter().chain(p).copied().collect();
    crate::quote::quote_git(&all).into_owned()
}

/// One side of a file diff: its path and node in a layer.
struct Side<'a> {
    path: Vec<u8>,
    node: Node,
    layer: &'a Layer,
}

fn git_mode(st: &libc::stat) -> Option<&'static str> {
    match kind(st) {
        libc::S_IFREG if st.st_mode & 0o100 != 0 => Some("100755"),
        libc::S_IFREG => Some("100644"),
        libc::S_IFLNK => Some("120000"),
        _ => None,
    }
}

/// A file's contents for the diff: a symlink's target, a regular file's bytes (`None`:
/// too big to show).
fn contents(s: &Side<'_>) -> io::Result<Option<Vec<u8>>> {
    match kind(&s.node.st) {
        libc::S_IFLNK => Ok(Some(sys::readlink_fd(std::os::fd::AsFd::as_fd(
            &s.node.fd,
        ))?)),
        _ => s.layer.read(&s.node, MAX_TEXT),
    }
}

fn binary(b: &[u8]) -> bool {
    b[..b.len().min(8000)].contains(&0)
}

/// Writes every change in `list` as git diff blocks.
pub fn write(l: &Layers, list: &[Change], out: &mut impl Write) -> io::Result<()> {
    let mut handled: HashSet<Vec<u8>> = HashSet::new();
    // Renamed directories first: their children's changes are written with the rename.
    for c in list {
        match &c.kind {
            Kind::Renamed { from } if c.dir => renamed(l, from, &c.path, list, &mut handled, out)?,
            Kind::Renamed { from } => {
                let old = l.lower.get(from)?.map(|node| Side {
                    path: from.clone(),
                    node,
                    layer: l.lower.reader(),
                });
                let new = l.upper.get(&c.path)?.map(|node| Side {
                    path: c.path.clone(),
                    node,
                    layer: &l.upper,
                });
                file(old, new, out)?;
            }
            _ => {}
        }
    }
    for c in list {
        if handled.contains(&c.path) || matches!(c.kind, Kind::Renamed { .. }) {
            continue;
        }
        let up = || l.upper.get(&c.path);
        let low = || l.lower.get(&c.path);
        let side = |layer, n: Option<Node>| {
            n.map(|node| Side {
                path: c.path.clone(),
                node,
                layer,
            })
        };
        match c.kind {
            Kind::Added if c.dir => tree(&l.upper, &c.path, true, out)?,
            Kind::Deleted if c.dir => tree(&l.lower, &c.path, false, out)?,
            Kind::Added => file(None, side(&l.upper, up()?), out)?,
            Kind::Deleted => file(side(l.lower.reader(), low()?), None, out)?,
            Kind::Type => {
                if l.lower.dir(&c.path)?.is_some() {
                    tree(&l.lower, &c.path, false, out)?;
                } else {
                    file(side(l.lower.reader(), low()?), None, out)?;
                }
                if l.upper.dir(&c.path)?.is_some() {
                    tree(&l.upper, &c.path, true, out)?;
                } else {
                    file(None, side(&l.upper, up()?), out)?;
                }
            }
            Kind::Modified | Kind::Metadata if !c.dir => {
                file(side(l.lower.reader(), low()?), side(&l.upper, up()?), out)?
            }
            _ => {}
        }
    }
    Ok(())
}

/// Every file below `path` in `layer`, as added (`new`) or deleted files.
fn tree(layer: &impl Tree, path: &[u8], new: bool, out: &mut impl Write) -> io::Result<()> {
    let Some(d) = layer.at(path)?.filter(|d| kind(&d.st) == libc::S_IFDIR) else {
        return Ok(());
    };
    walk(layer, d, path, (), |ev| {
        let Event::Entry { dir, path, name } = ev else {
            return Ok(Flow::Next);
        };
        let Some(n) = layer.entry(&dir.node, name)? else {
            return Ok(Flow::Next);
        };
        if new && layer.reader().is_whiteout(&n) {
            return Ok(Flow::Next);
        }
        if kind(&n.st) == libc::S_IFDIR {
            return Ok(Flow::Enter(n, ()));
        }
        let s = Some(Side {
            path: join(path, name),
            node: n,
            layer: layer.reader(),
        });
        if new {
            file(None, s, out)?;
        } else {
            file(s, None, out)?;
        }
        Ok(Flow::Next)
    })
    .map(drop)
}

/// A directory renamed `from` → `to`: every file it had, renamed (with its changes) or
/// deleted; the changes below `to` written here are marked `handled`. Each directory's
/// deletions are written once its entries are (as the recursive walk this was did).
fn renamed(
    l: &Layers,
    from: &[u8],
    to: &[u8],
    list: &[Change],
    handled: &mut HashSet<Vec<u8>>,
    out: &mut impl Write,
) -> io::Result<()> {
    let Some(d) = l.lower.dir(from)? else {
        return Ok(());
    };
    let to_of = |pf: &[u8]| [to, &pf[from.len()..]].concat();
    walk(&l.lower, d, from, (), |ev| match ev {
        Event::Entry { dir, path, name } => {
            let (pf, pt) = (join(path, name), to_of(&join(path, name)));
            let Some(n) = l.lower.child(&dir.node, name)? else {
                return Ok(Flow::Next);
            };
            let changed = list.iter().find(|c| c.path == pt);
            if matches!(changed.map(|c| &c.kind), Some(Kind::Deleted)) {
                return Ok(Flow::Next); // written as a deletion by the main loop
            }
            if kind(&n.st) == libc::S_IFDIR {
                return Ok(Flow::Enter(n, ()));
            }
            moved_file(l, &pf, &pt, n, changed.is_some(), handled, out)?;
            Ok(Flow::Next)
        }
        Event::Leave { path, .. } => {
            deleted_inside(l, path, &to_of(path), list, handled, out)?;
            Ok(Flow::Next)
        }
    })
    .map(drop)
}

/// SOURCE's file `n` at `pf`, renamed to `pt` with the rename of a directory above it
/// (`changed`: staged there too).
fn moved_file(
    l: &Layers,
    pf: &[u8],
    pt: &[u8],
    n: Node,
    changed: bool,
    handled: &mut HashSet<Vec<u8>>,
    out: &mut impl Write,
) -> io::Result<()> {
    let new = if changed {
        handled.insert(pt.to_vec());
        l.upper.get(pt)?.map(|node| Side {
            path: pt.to_vec(),
            node,
            layer: &l.upper,
        })
    } else {
        Some(Side {
            path: pt.to_vec(),
            node: l.lower.get(pf)?.unwrap_or(n),
            layer: l.lower.reader(),
        })
    };
    let old = l.lower.get(pf)?.map(|node| Side {
        path: pf.to_vec(),
        node,
        layer: l.lower.reader(),
    });
    file(old, new, out)
}

/// A deletion inside the directory renamed `from` → `to` names the file at its SOURCE
/// path.
fn deleted_inside(
    l: &Layers,
    from: &[u8],
    to: &[u8],
    list: &[Change],
    handled: &mut HashSet<Vec<u8>>,
    out: &mut impl Write,
) -> io::Result<()> {
    for c in list {
        if c.kind == Kind::Deleted && !c.dir && c.path.starts_with(to) {
            let rest = &c.path[to.len()..];
            if rest.first() == Some(&b'/') {
                let pf = [from, rest].concat();
                if let Some(node) = l.lower.get(&pf)? {
                    handled.insert(c.path.clone());
                    file(
                        Some(Side {
                            path: pf,
                            node,
                            layer: l.lower.reader(),
                        }),
                        None,
                        out,
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// One `diff --git` block (nothing when git would show nothing: times or owner only).
fn file(old: Option<Side<'_>>, new: Option<Side<'_>>, out: &mut impl Write) -> io::Result<()> {
    let om = old.as_ref().and_then(|s| git_mode(&s.node.st));
    let nm = new.as_ref().and_then(|s| git_mode(&s.node.st));
    if (old.is_some() && om.is_none()) || (new.is_some() && nm.is_none()) {
        return Ok(()); // fifos, devices, sockets: git has no way to say them
    }
    let (ap, bp) = match (&old, &new) {
        (Some(o), Some(n)) => (o.path.clone(), n.path.clone()),
        (Some(o), None) => (o.path.clone(), o.path.clone()),
        (None, Some(n)) => (n.path.clone(), n.path.clone()),
        (None, None) => return Ok(()),
    };
    let a = match &old {
        Some(s) => contents(s)?,
        None => Some(Vec::new()),
    };
    let b = match &new {
        Some(s) => contents(s)?,
        None => Some(Vec::new()),
    };
    let same = a.is_some() && a == b;
    let mut head = format!(
        "diff --git {} {}\n",
        quote_with(b"a/", &ap),
        quote_with(b"b/", &bp)
    );
    match (om, nm) {
        (None, Some(m)) => head.push_str(&format!("new file mode {m}\n")),
        (Some(m), None) => head.push_str(&format!("deleted file mode {m}\n")),
        (Some(x), Some(y)) if x != y => head.push_str(&format!("old mode {x}\nnew mode {y}\n")),
        _ => {}
    }
    if ap != bp {
        head.push_str(&format!(
            "rename from {}\nrename to {}\n",
            quote(&ap),
            quote(&bp)
        ));
    }
    let header_only = om.is_some() && nm.is_some() && om == nm && ap == bp;
    if same && header_only {
        return Ok(());
    }
    out.write_all(head.as_bytes())?;
    if same {
        return Ok(());
    }
    let aname = if old.is_some() {
        quote_with(b"a/", &ap)
    } else {
        "/dev/null".into()
    };
    let bname = if new.is_some() {
        quote_with(b"b/", &bp)
    } else {
        "/dev/null".into()
    };
    match (a, b) {
        (Some(a), Some(b)) if !binary(&a) && !binary(&b) => {
            if a.is_empty() && b.is_empty() {
                return Ok(());
            }
            writeln!(out, "--- {aname}\n+++ {bname}")?;
            hunks(&a, &b, out)
        }
        _ => {
            let an = if old.is_some() {
                quote_with(b"a/", &ap)
            } else {
                "/dev/null".into()
            };
            let bn = if new.is_some() {
                quote_with(b"b/", &bp)
            } else {
                "/dev/null".into()
            };
            // The staged file's size when large or sparse, inside the line (git reads
            // only its `Binary files ` start and ` differ` end).
            let note = new
                .as_ref()
                .and_then(|s| Space::of(s.layer, &s.node))
                .filter(Space::shown)
                .map(|s| format!(" ({})", s.note()))
                .unwrap_or_default();
            writeln!(out, "Binary files {an} and {bn}{note} differ")
        }
    }
}

/// The `@@` hunks turning `a` into `b`, with three lines of context ([`super::hunks`]).
fn hunks(a: &[u8], b: &[u8], out: &mut impl Write) -> io::Result<()> {
    super::hunks::FileDiff::new(a, b).write_all(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_quoted_as_git_quotes_them() {
        assert_eq!(quote_with(b"a/", b"x\x1b[31m"), "\"a/x\\033[31m\"");
        assert_eq!(quote_with(b"a/", b"b"), "a/b");
    }
}
