//! `stage discard`: drops staged changes (all, or those at or below each PATH) from the
//! staged tree; SOURCE is never touched.
//!
//! Invariants: a path that cannot be dropped alone (inside a directory deleted and made
//! again: dropping it would un-hide what the directory hides) is refused, naming the
//! directory to discard instead; each removal syncs its staged parent.

use std::os::fd::AsFd;

use super::apply::Report;
use super::changes::{Change, Kind, Layers};
use super::remove::{remove_tree, sync_dir, unstage_path};
use super::render::{quote, status_line};
use crate::host::sys::Name;

fn einval() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EINVAL)
}

/// Drops the staged changes at or below each of `paths` (`all`: the whole staged tree).
/// A path inside a new or renamed directory drops just that part of it.
pub fn discard(l: &Layers, list: &[Change], paths: &[Vec<u8>]) -> Report {
    let mut r = Report::default();
    if paths.is_empty() {
        let res = (|| {
            let root = l.upper.get(b"")?.ok_or_else(einval)?;
            for child in l.upper.list(&root)? {
                remove_tree(&l.upper, root.fd.as_fd(), &Name::new(&child)?)?;
            }
            sync_dir(&l.upper, root.fd.as_fd())
        })();
        match res {
            Ok(()) => r
                .lines
                .extend(list.iter().map(|c| format!("discarded {}", status_line(c)))),
            Err(e) => {
                r.lines
                    .push(format!("refused: emptying the staged tree: {e}"));
                r.refused += 1;
            }
        }
        return r;
    }
    let mut cycles_done: Vec<Vec<u8>> = Vec::new();
    for p in paths {
        // A directory deleted and made again goes whole (SOURCE's contents come back).
        if let Ok(Some(n)) = l.upper.dir(p)
            && l.upper.is_opaque(&n)
            && !list.iter().any(|c| c.path == *p && c.under_opaque)
        {
            match unstage_path(&l.upper, p) {
                Ok(()) => r.lines.push(format!("discarded {}/", quote(p))),
                Err(e) => {
                    r.lines.push(format!("refused {}/: {e}", quote(p)));
                    r.refused += 1;
                }
            }
            continue;
        }
        // A cycle of renames goes whole, whichever of its paths is named (once).
        let mut inside: Vec<Change> = list.iter().filter(|c| c.within(p)).cloned().collect();
        super::cycles::close(list, &mut inside);
        let named = !inside.is_empty();
        inside.retain(|c| !cycles_done.contains(&c.path));
        if named && inside.is_empty() {
            continue;
        }
        cycles_done.extend(
            inside
                .iter()
                .filter(|c| super::cycles::member(c))
                .map(|c| c.path.clone()),
        );
        if inside.is_empty() {
            // Part of a new, renamed or retyped directory: drop that part only.
            match list.iter().find(|c| c.touches(p)) {
                Some(c) if !c.under_opaque && matches!(l.upper.get(p), Ok(Some(_))) => {
                    match unstage_path(&l.upper, p) {
                        Ok(()) => r.lines.push(format!("discarded {}", quote(p))),
                        Err(e) => {
                            r.lines.push(format!("refused {}: {e}", quote(p)));
                            r.refused += 1;
                        }
                    }
                }
                _ => {
                    r.lines
                        .push(format!("refused {}: nothing staged there", quote(p)));
                    r.refused += 1;
                }
            }
            continue;
        }
        for c in &inside {
            let line = status_line(c);
            if c.under_opaque {
                r.lines.push(format!(
                    "refused {line}: inside a directory that was deleted and made again; discard that directory"
                ));
                r.refused += 1;
                continue;
            }
            let res = match &c.kind {
                // Its old name is another rename of the cycle, discarded on its own.
                Kind::Renamed { .. } if super::cycles::member(c) => unstage_path(&l.upper, &c.path),
                // Something made at the old name since (`mv d d2; mkdir d`) is staged work
                // of its own: the rename goes back only once that is discarded.
                Kind::Renamed { from } => match l.upper.get(from) {
                    Ok(Some(o)) if !l.upper.is_whiteout(&o) => Err(std::io::Error::other(format!(
                        "'{}' was made again since; discard it first",
                        quote(from)
                    ))),
                    _ => unstage_path(&l.upper, &c.path).and_then(|_| unstage_path(&l.upper, from)),
                },
                _ => unstage_path(&l.upper, &c.path),
            };
            match res {
                Ok(()) => r.lines.push(format!("discarded {line}")),
                Err(e) => {
                    r.lines.push(format!("refused {line}: {e}"));
                    r.refused += 1;
                }
            }
        }
    }
    r
}
