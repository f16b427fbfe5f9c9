//! `stage apply` and `stage discard` on a staging area no daemon serves.
//!
//! Apply carries each change into SOURCE, then unstages it (removes its staged entry), in
//! an order that never loses data: renamed directories first (a rename is applied whole),
//! then additions and modifications, deletions last. Every file is written beside its
//! destination (`.NAME.fencefs-apply`), given the staged mode, owner, xattrs and times,
//! synced, and renamed over it; a new directory is built whole under a temporary name and
//! renamed into place; the SOURCE directory is synced before the staged entry goes. So a
//! crash leaves each path applied (its staged entry then equals SOURCE: no change) or
//! still staged, never a half-written file in SOURCE.
//!
//! Invariants: SOURCE is reached only through directory handles walked without following
//! symlinks (a path whose SOURCE parent is not a directory is refused and stays staged);
//! a conflict is refused unless `force`; a staged entry under an opaque directory is kept
//! after apply (removing it would un-hide what the directory hides); discard refuses a
//! path it cannot drop alone (inside an opaque or renamed directory) and names the
//! directory to discard instead.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::changes::{Change, Kind, Layers};
use super::cli::status_line;
use super::diff::quote;
use super::tree::{Layer, Node, depth_of, depth_ok, kind, split};
use crate::host::sys::{self, Name, SetTime};

/// What apply or discard did, as printed lines.
#[derive(Default)]
pub struct Report {
    /// `applied …` / `refused …: why` lines.
    pub lines: Vec<String>,
    /// How many paths were refused.
    pub refused: usize,
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

fn rank(c: &Change) -> u8 {
    match c.kind {
        Kind::Renamed { .. } => 0,
        Kind::Deleted => 2,
        _ => 1,
    }
}

/// Applies `list` (changes of `l`) to SOURCE.
pub fn apply(l: &Layers, list: &[Change], force: bool) -> Report {
    let mut r = Report::default();
    let mut order: Vec<&Change> = list.iter().collect();
    // Renames shallowest first; deletions deepest first.
    order.sort_by(|a, b| {
        rank(a).cmp(&rank(b)).then_with(|| {
            if rank(a) == 2 {
                b.path.cmp(&a.path)
            } else {
                a.path.cmp(&b.path)
            }
        })
    });
    let renamed_refused = |c: &Change, r: &Report| {
        r.lines.iter().any(|line| {
            line.starts_with("refused R")
                && list.iter().any(|x| {
                    matches!(x.kind, Kind::Renamed { .. })
                        && c.path.starts_with(&x.path)
                        && c.path.get(x.path.len()) == Some(&b'/')
                        && line.contains(&status_line(x))
                })
        })
    };
    // Renames applied so far (SOURCE path, new path): a rename inside a renamed directory
    // names its SOURCE path as it was before the outer one.
    let mut moved: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for c in order {
        let line = status_line(c);
        let rewritten;
        let c = match &c.kind {
            Kind::Renamed { from } => match moved
                .iter()
                .find(|(f, _)| from.starts_with(f) && from.get(f.len()) == Some(&b'/'))
            {
                Some((f, t)) => {
                    let mut nf = t.clone();
                    nf.extend_from_slice(&from[f.len()..]);
                    rewritten = Change {
                        kind: Kind::Renamed { from: nf },
                        ..c.clone()
                    };
                    &rewritten
                }
                None => c,
            },
            _ => c,
        };
        if c.conflict && !force {
            r.lines.push(format!(
                "refused {line}: conflict (SOURCE changed after it was staged; --force applies the staged version)"
            ));
            r.refused += 1;
            continue;
        }
        if renamed_refused(c, &r) {
            r.lines.push(format!(
                "refused {line}: its directory's rename was refused"
            ));
            r.refused += 1;
            continue;
        }
        match apply_one(l, c) {
            Ok(()) => {
                if let Kind::Renamed { from } = &c.kind {
                    moved.push((from.clone(), c.path.clone()));
                }
                r.lines.push(format!("applied {line}"))
            }
            Err(e) => {
                r.lines.push(format!("refused {line}: {e}"));
                r.refused += 1;
            }
        }
    }
    r
}

/// The SOURCE directory `path`, walked without following symlinks.
fn lower_dir(l: &Layers, path: &[u8]) -> io::Result<OwnedFd> {
    match l.lower.dir(path)? {
        Some(n) => Ok(n.fd),
        None => Err(io::Error::other(format!(
            "SOURCE parent '{}' is not a directory",
            quote(path)
        ))),
    }
}

fn name(n: &[u8]) -> io::Result<Name> {
    Name::new(n)
}

fn tmp_name(n: &[u8], what: &str) -> io::Result<Name> {
    let mut t = b".".to_vec();
    t.extend_from_slice(&n[..n.len().min(200)]);
    t.extend_from_slice(format!(".fencefs-{what}-{}", std::process::id()).as_bytes());
    name(&t)
}

fn sync_dir(layer: &Layer, fd: BorrowedFd<'_>) -> io::Result<()> {
    let f = sys::reopen(
        layer.proc_fd.as_fd(),
        fd,
        libc::O_RDONLY | libc::O_DIRECTORY,
    )?;
    sys::fsync(f.as_fd(), false)
}

fn apply_one(l: &Layers, c: &Change) -> io::Result<()> {
    let (parent, last) = split(&c.path);
    match &c.kind {
        Kind::Renamed { from } => {
            let (fp, fl) = split(from);
            let src = lower_dir(l, fp)?;
            let dst = lower_dir(l, parent)?;
            sys::renameat2(
                src.as_fd(),
                &name(fl)?,
                dst.as_fd(),
                &name(last)?,
                libc::RENAME_NOREPLACE,
            )?;
            sync_dir(&l.lower, dst.as_fd())?;
            sync_dir(&l.lower, src.as_fd())?;
            // The staged directory now sits over its own SOURCE path: no redirect, and
            // the whiteout over the old name goes.
            if let Some(u) = l.upper.get(&c.path)? {
                let _ = sys::removexattr_fd(u.fd.as_fd(), b"trusted.overlay.redirect");
            }
            unstage_path(l, from)?;
            Ok(())
        }
        Kind::Deleted => {
            let dir = lower_dir(l, parent)?;
            let n = name(last)?;
            if let Some(ln) = l.lower.child(&Node::from_fd(&dir)?, last)? {
                if kind(&ln.st) == libc::S_IFDIR {
                    // Renamed away first, so the name goes at once; then emptied.
                    let t = tmp_name(last, "delete")?;
                    sys::renameat2(dir.as_fd(), &n, dir.as_fd(), &t, libc::RENAME_NOREPLACE)?;
                    sync_dir(&l.lower, dir.as_fd())?;
                    remove_tree(&l.lower, dir.as_fd(), &t)?;
                } else {
                    sys::unlinkat(dir.as_fd(), &n, 0)?;
                }
                sync_dir(&l.lower, dir.as_fd())?;
            }
            if !c.under_opaque {
                unstage_path(l, &c.path)?;
            }
            Ok(())
        }
        Kind::Metadata if c.dir => {
            let u = l.upper.get(&c.path)?.ok_or_else(einval)?;
            let low = l.lower.dir(&c.path)?.ok_or_else(einval)?;
            set_meta(&l.upper, &u, &l.lower, low.fd.as_fd(), None, false)
        }
        _ => {
            let u = l.upper.get(&c.path)?.ok_or_else(einval)?;
            let dir = lower_dir(l, parent)?;
            let n = name(last)?;
            let t = tmp_name(last, "apply")?;
            copy_entry(l, &u, dir.as_fd(), &t, (true, depth_of(&c.path)))?;
            // What is in the way of a type change (a directory for a file, or a file for a
            // directory: rename(2) replaces neither) is swapped out atomically with
            // RENAME_EXCHANGE (the name never goes missing), then removed.
            let old = l.lower.child(&Node::from_fd(&dir)?, last)?;
            let new_dir = kind(&u.st) == libc::S_IFDIR;
            match old {
                Some(o) if (kind(&o.st) == libc::S_IFDIR) != new_dir => {
                    sys::renameat2(dir.as_fd(), &t, dir.as_fd(), &n, libc::RENAME_EXCHANGE)?;
                    sync_dir(&l.lower, dir.as_fd())?;
                    remove_tree(&l.lower, dir.as_fd(), &t)?;
                }
                _ => {
                    sys::renameat2(dir.as_fd(), &t, dir.as_fd(), &n, 0)?;
                }
            }
            sync_dir(&l.lower, dir.as_fd())?;
            if !c.under_opaque {
                unstage_path(l, &c.path)?;
            }
            Ok(())
        }
    }
}

impl Node {
    fn from_fd(fd: &OwnedFd) -> io::Result<Node> {
        Ok(Node {
            fd: fd.try_clone()?,
            st: sys::fstat(fd.as_fd())?,
        })
    }
}

/// Copies the staged entry `u` (a whole tree for a directory) to `dir/t` in SOURCE, with
/// its mode, owner, xattrs and times. `top` (the entry to be renamed into place) is
/// synced: a file with fsync, a directory tree with one syncfs once it is complete (its
/// files are not synced one by one: none of them is visible before the rename).
fn copy_entry(
    l: &Layers,
    u: &Node,
    dir: BorrowedFd<'_>,
    t: &Name,
    (top, depth): (bool, usize),
) -> io::Result<()> {
    depth_ok(depth)?;
    let mode = u.st.st_mode & 0o7777;
    match kind(&u.st) {
        libc::S_IFREG => {
            let src = sys::reopen(l.upper.proc_fd.as_fd(), u.fd.as_fd(), libc::O_RDONLY)?;
            let dst = sys::openat(
                dir,
                t,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
                0o600,
            )?;
            copy_bytes(src.as_fd(), dst.as_fd(), u.st.st_size as u64)?;
            let node = sys::open_path(dir, t)?;
            set_meta(&l.upper, u, &l.lower, node.as_fd(), Some(mode), true)?;
            if top {
                sys::fsync(dst.as_fd(), false)?;
            }
            Ok(())
        }
        libc::S_IFLNK => {
            let target = sys::readlink_fd(u.fd.as_fd())?;
            sys::symlinkat(&target, dir, t)?;
            sys::fchownat_nofollow(dir, t, u.st.st_uid, u.st.st_gid)?;
            let at = |s: i64, n: i64| SetTime::At(s, n);
            sys::utimens_nofollow(
                dir,
                t,
                at(u.st.st_atime, u.st.st_atime_nsec),
                at(u.st.st_mtime, u.st.st_mtime_nsec),
            )
        }
        libc::S_IFDIR => {
            sys::mkdirat(dir, t, 0o700)?;
            let d = sys::open_path(dir, t)?;
            for child in l.upper.list(u)? {
                let Some(cn) = l.upper.child(u, &child)? else {
                    continue;
                };
                if l.upper.is_whiteout(&cn) {
                    continue;
                }
                copy_entry(l, &cn, d.as_fd(), &name(&child)?, (false, depth + 1))?;
            }
            set_meta(&l.upper, u, &l.lower, d.as_fd(), Some(mode), true)?;
            if top {
                let f = sys::reopen(
                    l.lower.proc_fd.as_fd(),
                    d.as_fd(),
                    libc::O_RDONLY | libc::O_DIRECTORY,
                )?;
                super::sys::syncfs(f.as_fd())?;
            }
            Ok(())
        }
        _ => {
            sys::mknodat(dir, t, u.st.st_mode, u.st.st_rdev)?;
            sys::fchownat_nofollow(dir, t, u.st.st_uid, u.st.st_gid)
        }
    }
}

/// Copies `size` bytes: `copy_file_range` (a clone or in-kernel copy) where the two file
/// systems allow it, else reads and writes (DIR on another file system type).
fn copy_bytes(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    let mut off = 0u64;
    while off < size {
        match sys::copy_file_range(src, off, dst, off, size - off) {
            Ok(0) => return Ok(()),
            Ok(n) => off += n as u64,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)
                ) =>
            {
                break;
            }
            Err(e) => return Err(e),
        }
    }
    let mut buf = vec![0u8; 256 * 1024];
    while off < size {
        let n = sys::pread(src, &mut buf, off)?;
        if n == 0 {
            break;
        }
        let mut done = 0;
        while done < n {
            match sys::pwrite(dst, &buf[done..n], off + done as u64)? {
                0 => return Err(io::Error::from_raw_os_error(libc::EIO)),
                k => done += k,
            }
        }
        off += n as u64;
    }
    Ok(())
}

/// Gives SOURCE's `dst` (a regular file or directory handle) the staged entry's owner,
/// mode (`mode`, or the staged one), xattrs (those it lacks removed), and with `times`
/// its atime and mtime.
fn set_meta(
    up: &Layer,
    u: &Node,
    low: &Layer,
    dst: BorrowedFd<'_>,
    mode: Option<u32>,
    times: bool,
) -> io::Result<()> {
    sys::fchown_fd(dst, u.st.st_uid, u.st.st_gid)?;
    // After chown, which clears set-ID bits.
    sys::fchmod_fd(
        low.proc_fd.as_fd(),
        dst,
        mode.unwrap_or(u.st.st_mode & 0o7777),
    )?;
    let want = up.xattrs(u);
    let have = low.xattrs(&Node {
        fd: sys::reopen(low.proc_fd.as_fd(), dst, libc::O_PATH)?,
        st: sys::fstat(dst)?,
    });
    for (k, _) in &have {
        if !want.iter().any(|(w, _)| w == k) {
            sys::removexattr_fd(dst, k)?;
        }
    }
    for (k, v) in &want {
        sys::setxattr_fd(dst, k, v, 0)?;
    }
    if times {
        let at = |s: i64, n: i64| SetTime::At(s, n);
        sys::utimens_fd(
            low.proc_fd.as_fd(),
            dst,
            at(u.st.st_atime, u.st.st_atime_nsec),
            at(u.st.st_mtime, u.st.st_mtime_nsec),
        )?;
    }
    Ok(())
}

/// Removes `dir/n` and everything below it (no symlink followed: `unlinkat` removes a
/// symlink itself, and directories are entered by `O_PATH | O_NOFOLLOW` handles).
pub(super) fn remove_tree(layer: &Layer, dir: BorrowedFd<'_>, n: &Name) -> io::Result<()> {
    remove_tree_at(layer, dir, n, 0)
}

fn remove_tree_at(layer: &Layer, dir: BorrowedFd<'_>, n: &Name, depth: usize) -> io::Result<()> {
    depth_ok(depth)?;
    let st = sys::fstatat_nofollow(dir, n)?;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let d = sys::open_path(dir, n)?;
        let node = Node {
            st: sys::fstat(d.as_fd())?,
            fd: d,
        };
        for child in layer.list(&node)? {
            remove_tree_at(layer, node.fd.as_fd(), &name(&child)?, depth + 1)?;
        }
        sys::unlinkat(dir, n, libc::AT_REMOVEDIR)
    } else {
        sys::unlinkat(dir, n, 0)
    }
}

/// Drops the staged entry at `path` (a whole tree for a directory) and syncs its parent.
fn unstage_path(l: &Layers, path: &[u8]) -> io::Result<()> {
    let (parent, last) = split(path);
    let Some(d) = l.upper.dir(parent)? else {
        return Ok(());
    };
    let n = name(last)?;
    match sys::fstatat_nofollow(d.fd.as_fd(), &n) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    }
    remove_tree(&l.upper, d.fd.as_fd(), &n)?;
    sync_dir(&l.upper, d.fd.as_fd())
}

/// Drops the staged changes at or below each of `paths` (`all`: the whole staged tree).
/// A path inside a new or renamed directory drops just that part of it.
pub fn discard(l: &Layers, list: &[Change], paths: &[Vec<u8>]) -> Report {
    let mut r = Report::default();
    if paths.is_empty() {
        let res = (|| {
            let root = l.upper.get(b"")?.ok_or_else(einval)?;
            for child in l.upper.list(&root)? {
                remove_tree(&l.upper, root.fd.as_fd(), &name(&child)?)?;
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
    for p in paths {
        // A directory deleted and made again goes whole (SOURCE's contents come back).
        if let Ok(Some(n)) = l.upper.dir(p)
            && l.upper.is_opaque(&n)
            && !list.iter().any(|c| c.path == *p && c.under_opaque)
        {
            match unstage_path(l, p) {
                Ok(()) => r.lines.push(format!("discarded {}/", quote(p))),
                Err(e) => {
                    r.lines.push(format!("refused {}/: {e}", quote(p)));
                    r.refused += 1;
                }
            }
            continue;
        }
        let inside: Vec<&Change> = list.iter().filter(|c| c.within(p)).collect();
        if inside.is_empty() {
            // Part of a new, renamed or retyped directory: drop that part only.
            match list.iter().find(|c| c.touches(p)) {
                Some(c) if !c.under_opaque && matches!(l.upper.get(p), Ok(Some(_))) => {
                    match unstage_path(l, p) {
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
                Kind::Renamed { from } => {
                    unstage_path(l, &c.path).and_then(|_| unstage_path(l, from))
                }
                _ => unstage_path(l, &c.path),
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
