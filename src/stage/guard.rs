//! The last look before `apply` replaces or deletes a SOURCE entry: the entry must still
//! be the one the conflict check saw ([`Change::lower_st`]), so a host edit made while an
//! apply runs (between `status`'s look and the rename) is refused as a conflict instead of
//! being overwritten.
//!
//! A file is replaced with `RENAME_EXCHANGE` and what came out is checked (inode, mtime,
//! size: a rename changes ctime, not those); if the host replaced or wrote it meanwhile,
//! the exchange is undone. What remains is a window of microseconds between the exchange
//! and an in-place write by a process that already held the old file open. A change
//! already known to conflict (applied with `--force`) is not checked.
//!
//! Invariants: never leaves SOURCE's name missing; the old file, once out, is removed only
//! when it is the one checked (a crash leaves it at the temporary name the intent log
//! names, and recovery removes it).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use std::collections::HashSet;

use super::changes::{Change, Layers, lower_ident};
use super::tree::{Layer, Node, kind, split};
use super::walk::{Event, Flow, walk};
use crate::host::sys::{self, Name};

fn changed() -> io::Error {
    io::Error::other("conflict (SOURCE changed while applying; --force applies the staged version)")
}

/// Whether `now` (SOURCE's entry at the path now) is the entry the check saw.
pub fn unchanged(c: &Change, now: Option<&Node>) -> bool {
    c.conflict
        || match (c.lower_st, now) {
            (None, None) => true,
            (Some(was), Some(n)) => was == lower_ident(&n.st),
            _ => false,
        }
}

/// Puts `dir/t` at `dir/n` (SOURCE's entry there now: `old`), refusing if that entry is
/// not the one the check saw.
pub fn replace(
    c: &Change,
    dir: BorrowedFd<'_>,
    t: &Name,
    n: &Name,
    old: Option<&Node>,
) -> io::Result<()> {
    if !unchanged(c, old) {
        return Err(changed());
    }
    match old {
        None if !c.conflict => match sys::renameat2(dir, t, dir, n, libc::RENAME_NOREPLACE) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Err(changed()),
            r => r,
        },
        Some(o) if !c.conflict && kind(&o.st) != libc::S_IFDIR => {
            sys::renameat2(dir, t, dir, n, libc::RENAME_EXCHANGE)?;
            let out = sys::fstatat_nofollow(dir, t)?;
            let same = out.st_ino == o.st.st_ino
                && (out.st_mtime, out.st_mtime_nsec) == (o.st.st_mtime, o.st.st_mtime_nsec)
                && out.st_size == o.st.st_size;
            if !same {
                sys::renameat2(dir, t, dir, n, libc::RENAME_EXCHANGE)?;
                return Err(changed());
            }
            sys::unlinkat(dir, t, 0)
        }
        _ => sys::renameat2(dir, t, dir, n, 0),
    }
}

/// Why `apply` kept a directory it was to remove or replace ([`below_changed`]).
pub const CHANGED_BELOW: &str =
    "conflict (SOURCE changed below it while applying: kept; the next status lists it)";

/// What `apply` checks a directory it removes against ([`below_changed`]): when the change
/// list was taken, and the SOURCE directories this apply itself renamed entries out of
/// (their ctime moved with those renames: not a host change).
pub struct Since {
    listed: i128,
    moved_from: HashSet<(u64, u64)>,
}

impl Since {
    /// Checks against the change list taken at `listed`.
    pub fn new(listed: i128) -> Since {
        Since {
            listed,
            moved_from: HashSet::new(),
        }
    }

    /// This apply renamed SOURCE's `from` away: its directory's ctime is the apply's.
    pub fn moved_out_of(&mut self, l: &Layers, from: &[u8]) {
        if let Ok(Some(d)) = l.lower.dir(split(from).0) {
            self.moved_from.insert((d.st.st_dev, d.st.st_ino));
        }
    }

    /// Whether `n`'s ctime says it changed after the listing (and not by this apply).
    fn changed(&self, n: &Node) -> bool {
        ctime_ns(&n.st) >= self.listed
            && !(kind(&n.st) == libc::S_IFDIR
                && self.moved_from.contains(&(n.st.st_dev, n.st.st_ino)))
    }
}

/// Puts SOURCE's directory that `apply` renamed aside to `dir/t` back at `dir/n`, something
/// below it having changed: the refusal to report (naming where the tree is kept when it
/// could not go back: never removed).
pub fn put_back(dir: BorrowedFd<'_>, t: &Name, n: &Name) -> io::Error {
    match sys::renameat2(dir, t, dir, n, libc::RENAME_NOREPLACE) {
        Ok(()) => io::Error::other(CHANGED_BELOW),
        Err(e) => {
            let _ = keep_aside(dir, t, n.bytes(), &e);
            io::Error::other(format!("{CHANGED_BELOW}; putting it back failed ({e})"))
        }
    }
}

/// Moves what `apply` could not put back from its temporary name `dir/t` (which a later
/// apply would take for its own and remove) to `.NAME.fencefs-kept-PID-NS`, and logs where
/// the host's entry for `path` is kept.
pub fn keep_aside(dir: BorrowedFd<'_>, t: &Name, path: &[u8], e: &io::Error) -> io::Result<()> {
    let ns = crate::stage::sys::coarse_now_ns();
    let last = split(path).1;
    let tail = format!(".fencefs-kept-{}-{ns}", std::process::id());
    let kept = [&b"."[..], last, tail.as_bytes()].concat();
    let at = match Name::new(&kept)
        .and_then(|k| sys::renameat2(dir, t, dir, &k, libc::RENAME_NOREPLACE))
    {
        Ok(()) => kept,
        Err(_) => t.bytes().to_vec(),
    };
    log::error!(
        "apply: {} changed below while applying and could not be put back ({e}): the host's \
         entry is kept as {}",
        String::from_utf8_lossy(path),
        String::from_utf8_lossy(&at)
    );
    Ok(())
}

/// Whether anything below SOURCE's directory `dir/t` — renamed there by `apply` to be
/// deleted (or swapped out for a file) — changed (ctime) since the change list was taken:
/// a host edit, a new file or a directory moved in while the apply ran, below a directory
/// whose own identity such a change leaves as it was (a directory this apply renamed an
/// entry out of does not count by its own ctime). Walked one level's handle at a time
/// (`stage::walk`).
pub fn below_changed(
    source: &Layer,
    dir: BorrowedFd<'_>,
    t: &Name,
    since: &Since,
) -> io::Result<bool> {
    let fd = sys::open_path(dir, t)?;
    let st = sys::fstat(fd.as_fd())?;
    let all_before = walk(source, Node::of(fd, st), b"", (), |ev| {
        let Event::Entry { dir, name, .. } = ev else {
            return Ok(Flow::Next);
        };
        Ok(match source.child(&dir.node, name)? {
            Some(c) if since.changed(&c) => Flow::Stop,
            Some(c) if kind(&c.st) == libc::S_IFDIR => Flow::Enter(c, ()),
            _ => Flow::Next,
        })
    })?;
    Ok(!all_before)
}

fn ctime_ns(st: &libc::stat) -> i128 {
    st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::changes::Kind;
    use std::os::fd::AsFd;

    fn node(dir: BorrowedFd<'_>, n: &Name) -> Option<Node> {
        let fd = sys::open_path(dir, n).ok()?;
        let st = sys::fstat(fd.as_fd()).ok()?;
        Some(Node::of(fd, st))
    }

    fn change(was: Option<&Node>) -> Change {
        Change {
            path: b"a.txt".to_vec(),
            kind: Kind::Modified,
            conflict: false,
            dir: false,
            entries: None,
            under_opaque: false,
            lower_id: None,
            lower_st: was.map(|n| lower_ident(&n.st)),
            replaces: None,
            moved_in: None,
        }
    }

    /// An edit deep below a directory apply is deleting, made after the change list was
    /// taken, is seen once the directory is renamed aside (its own ctime moved with the
    /// rename and is not what counts); an untouched tree is not.
    #[test]
    fn a_host_edit_below_a_directory_being_deleted_is_seen() {
        let root = std::env::temp_dir().join(format!("fencefs-below-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("d/sub")).unwrap();
        std::fs::write(root.join("d/sub/f"), b"old\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let source = Layer::new(sys::open_root(&root).unwrap()).unwrap();
        let dir = sys::open_root(&root).unwrap();
        let since = Since::new(crate::stage::sys::coarse_now_ns());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::rename(root.join("d"), root.join("t")).unwrap();
        let t = Name::new(b"t").unwrap();
        assert!(!below_changed(&source, dir.as_fd(), &t, &since).unwrap());
        // A directory moved in from elsewhere (its files keep their old ctimes).
        std::fs::create_dir_all(root.join("other/x")).unwrap();
        std::fs::write(root.join("other/x/old"), b"host's\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let since = Since::new(crate::stage::sys::coarse_now_ns());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::rename(root.join("other/x"), root.join("t/sub/x")).unwrap();
        assert!(below_changed(&source, dir.as_fd(), &t, &since).unwrap());
        std::fs::remove_dir_all(root.join("t/sub/x")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let since = Since::new(crate::stage::sys::coarse_now_ns());
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!below_changed(&source, dir.as_fd(), &t, &since).unwrap());
        std::fs::write(root.join("t/sub/f"), b"host\n").unwrap();
        assert!(below_changed(&source, dir.as_fd(), &t, &since).unwrap());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_host_save_between_the_check_and_the_rename_is_refused_and_kept() {
        let root = std::env::temp_dir().join(format!("fencefs-guard-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("a.txt"), b"old\n").unwrap();
        let dir = sys::open_root(&root).unwrap();
        let (a, t) = (Name::new(b"a.txt").unwrap(), Name::new(b".a.tmp").unwrap());
        let checked = node(dir.as_fd(), &a);
        let c = change(checked.as_ref());
        // The host saves (a new file renamed over) after the check.
        std::fs::write(root.join("a.swp"), b"host\n").unwrap();
        std::fs::rename(root.join("a.swp"), root.join("a.txt")).unwrap();
        std::fs::write(root.join(".a.tmp"), b"staged\n").unwrap();
        let now = node(dir.as_fd(), &a);
        let e = replace(&c, dir.as_fd(), &t, &a, now.as_ref()).unwrap_err();
        assert!(e.to_string().contains("conflict"), "{e}");
        assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"host\n");
        // Unchanged since the check: replaced, the old file gone.
        let c = change(now.as_ref());
        replace(&c, dir.as_fd(), &t, &a, now.as_ref()).unwrap();
        assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"staged\n");
        assert!(!root.join(".a.tmp").exists());
        // An in-place write between our look and the exchange: undone, refused.
        std::fs::write(root.join(".a.tmp"), b"staged 2\n").unwrap();
        let looked = node(dir.as_fd(), &a);
        let c = change(looked.as_ref());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(root.join("a.txt"), b"host in place, longer\n").unwrap();
        let e = replace(&c, dir.as_fd(), &t, &a, looked.as_ref()).unwrap_err();
        assert!(e.to_string().contains("conflict"), "{e}");
        assert_eq!(
            std::fs::read(root.join("a.txt")).unwrap(),
            b"host in place, longer\n"
        );
        assert_eq!(std::fs::read(root.join(".a.tmp")).unwrap(), b"staged 2\n");
        // A path SOURCE did not have, made by the host meanwhile: refused.
        let (b, bt) = (Name::new(b"b.txt").unwrap(), Name::new(b".b.tmp").unwrap());
        std::fs::write(root.join(".b.tmp"), b"staged\n").unwrap();
        let c = Change {
            kind: Kind::Added,
            ..change(None)
        };
        std::fs::write(root.join("b.txt"), b"host new\n").unwrap();
        assert!(replace(&c, dir.as_fd(), &bt, &b, None).is_err());
        assert_eq!(std::fs::read(root.join("b.txt")).unwrap(), b"host new\n");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
