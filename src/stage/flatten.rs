//! Flattening a stack of staged layers (each in kernel overlayfs's upper-directory format,
//! oldest first) into one staged tree with the same merged view over the base below them:
//! what `status`/`diff` compare when checkpoints exist (into a scratch directory, then
//! deleted) and what `apply`/`discard` squash the stack into.
//!
//! Files (whiteouts included) are hard links to the layers' own inodes, so no data is
//! copied, an entry keeps its birth time (the conflict rule needs it) and the cost grows
//! with the number of staged paths, never with SOURCE or with file sizes. Directories are
//! made anew with their top-most layer's mode, owner, times and xattrs. The rules follow
//! overlayfs's lookup: a higher layer's non-directory or whiteout replaces what is below;
//! an opaque directory replaces it too; a plain directory merges with the directory below
//! (over a non-directory it becomes opaque); a redirected (renamed) directory takes the
//! tree below at its old path along and points at the base with an absolute redirect.
//!
//! Invariants: the layers are only read (and hard-linked); every walk is iterative and
//! bounded by [`MAX_DEPTH`](super::tree::MAX_DEPTH) ([`super::walk`]); a name that vanishes meanwhile (the live upper
//! changes under a status) is skipped, not an error.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;

use super::tree::{Layer, Node, OVL, join, kind};
use super::walk::{Event, Flow, walk};
use crate::host::sys::{self, Name, SetTime};

fn missing(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

fn tolerate(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if missing(&e) => Ok(()),
        r => r,
    }
}

/// Where a redirected directory of the layer being merged takes its contents from: the
/// flattened tree's directory stashed for it (if any), and the base path below it.
struct Taken {
    slot: Option<Vec<u8>>,
    lower: Option<Vec<u8>>,
}

/// Flattens `stack` (oldest first) into the empty directory `out`; `stash` is an empty
/// scratch directory on the same file system (left empty).
pub fn flatten(stack: &[Layer], out: &Layer, stash: &Layer) -> io::Result<()> {
    for h in stack {
        merge_layer(h, out, stash)?;
    }
    Ok(())
}

fn merge_layer(h: &Layer, f: &Layer, stash: &Layer) -> io::Result<()> {
    let Some(root) = h.get(b"")? else {
        return Ok(());
    };
    // Renamed directories: where each one's old contents are in the flattened tree so far.
    let mut redirects = Vec::new();
    collect(h, root.try_clone()?, &mut redirects)?;
    // (redirected dir, its old contents' path if the flattened tree has them, base path)
    type Resolved = (Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>);
    let mut resolved: Vec<Resolved> = Vec::new();
    for (path, target) in redirects {
        let (has, lower) = match &target {
            Some(t) => resolve(f, t)?,
            None => (false, None),
        };
        resolved.push((path, if has { target } else { None }, lower));
    }
    // Deepest first, so a stashed directory never carries another one's target along.
    let mut order: Vec<usize> = (0..resolved.len()).collect();
    order.sort_by_key(|&i| {
        std::cmp::Reverse(
            resolved[i]
                .1
                .as_ref()
                .map_or(0, |t| t.split(|&b| b == b'/').count()),
        )
    });
    let mut taken: HashMap<Vec<u8>, Taken> = HashMap::new();
    for (k, i) in order.into_iter().enumerate() {
        let (path, target, lower) = &resolved[i];
        let mut slot = None;
        if let Some(t) = target {
            let (parent, last) = super::tree::split(t);
            if let Some(pd) = f.dir(parent)? {
                let s = format!("s{k}").into_bytes();
                match sys::renameat2(
                    pd.fd.as_fd(),
                    &Name::new(last)?,
                    stash.root.as_fd(),
                    &Name::new(&s)?,
                    libc::RENAME_NOREPLACE,
                ) {
                    Ok(()) => slot = Some(s),
                    Err(e) if missing(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        taken.insert(
            path.clone(),
            Taken {
                slot,
                lower: lower.clone(),
            },
        );
    }
    let froot = f
        .get(b"")?
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
    merge_dir(h, root, f, froot, stash, &mut taken)?;
    // Stashed trees whose redirected directory vanished meanwhile.
    let sroot = stash
        .get(b"")?
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
    for n in stash.list(&sroot)? {
        super::remove::remove_tree(stash, sroot.fd.as_fd(), &Name::new(&n)?)?;
    }
    Ok(())
}

/// The redirected directories of layer `h` below `d` (at `path`; `below`: the path its
/// contents have in the view under `h`, `None` when nothing is below it), with the path
/// of each one's old contents in that view.
fn collect(h: &Layer, d: Node, out: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>) -> io::Result<()> {
    walk(h, d, b"", Some(Vec::new()), |ev| {
        let Event::Entry { dir, path, name } = ev else {
            return Ok(Flow::Next);
        };
        let Some(c) = h.child(&dir.node, name)? else {
            return Ok(Flow::Next);
        };
        if kind(&c.st) != libc::S_IFDIR {
            return Ok(Flow::Next);
        }
        let below = &dir.state;
        let b = if h.is_opaque(&c) {
            None
        } else if let Some(r) = h.redirect(&c) {
            let t = match r.strip_prefix(b"/") {
                Some(abs) => Some(abs.to_vec()),
                None => below.as_ref().map(|b| join(b, &r)),
            };
            out.push((join(path, name), t.clone()));
            t
        } else {
            below.as_ref().map(|b| join(b, name))
        };
        Ok(Flow::Enter(c, b))
    })
    .map(drop)
}

/// Walks `target` in the flattened tree `f` the way overlayfs's lookup does: whether `f`
/// has a directory there, and the base path below it (`None`: nothing below).
fn resolve(f: &Layer, target: &[u8]) -> io::Result<(bool, Option<Vec<u8>>)> {
    let mut node = f.get(b"")?;
    let mut lower = Some(Vec::new());
    for comp in target.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        let child = match &node {
            Some(d) => f.child(d, comp)?,
            None => None,
        };
        match child {
            Some(c) if kind(&c.st) == libc::S_IFDIR => {
                lower = if f.is_opaque(&c) {
                    None
                } else if let Some(r) = f.redirect(&c) {
                    match r.strip_prefix(b"/") {
                        Some(abs) => Some(abs.to_vec()),
                        None => {
                            let parent = lower.as_ref().map(|l| super::tree::split(l).0.to_vec());
                            parent.map(|p| join(&p, &r))
                        }
                    }
                } else {
                    lower.map(|l| join(&l, comp))
                };
                node = Some(c);
            }
            Some(_) => {
                node = None;
                lower = None;
            }
            None => {
                node = None;
                lower = lower.map(|l| join(&l, comp));
            }
        }
    }
    Ok((node.is_some(), lower))
}

fn remove_entry(f: &Layer, d: &Node, name: &Name) -> io::Result<()> {
    match sys::fstatat_nofollow(d.fd.as_fd(), name) {
        Ok(_) => super::remove::remove_tree(f, d.fd.as_fd(), name),
        Err(e) if missing(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Merges layer `h`'s tree (`root`) into the flattened tree `f` (`froot`): its
/// non-directories linked over, its directories made, renamed back from the stash or
/// kept, with their markers and attributes ([`super::walk`]: no recursion).
fn merge_dir(
    h: &Layer,
    root: Node,
    f: &Layer,
    froot: Node,
    stash: &Layer,
    taken: &mut HashMap<Vec<u8>, Taken>,
) -> io::Result<()> {
    walk(h, root, b"", froot, |ev| {
        let Event::Entry { dir, path, name } = ev else {
            return Ok(Flow::Next);
        };
        let (hd, fd) = (&dir.node, &dir.state);
        let Some(hn) = h.child(hd, name)? else {
            return Ok(Flow::Next);
        };
        let p = join(path, name);
        let n = Name::new(name)?;
        if kind(&hn.st) != libc::S_IFDIR {
            remove_entry(f, fd, &n)?;
            tolerate(sys::linkat_fd(
                h.proc_fd.as_fd(),
                hn.fd.as_fd(),
                fd.fd.as_fd(),
                &n,
            ))?;
            return Ok(Flow::Next);
        }
        let fe = f.child(fd, name)?;
        let mut made = true;
        // (fresh directory, its marker: Some(Some(lower)) redirect, Some(None) opaque)
        let marker: Option<Option<Vec<u8>>> = if let Some(t) = taken.remove(&p) {
            remove_entry(f, fd, &n)?;
            match &t.slot {
                Some(s) => {
                    made = false;
                    sys::renameat2(
                        stash.root.as_fd(),
                        &Name::new(s)?,
                        fd.fd.as_fd(),
                        &n,
                        libc::RENAME_NOREPLACE,
                    )?
                }
                None => sys::mkdirat(fd.fd.as_fd(), &n, 0o700)?,
            }
            Some(t.lower)
        } else if h.is_opaque(&hn) {
            remove_entry(f, fd, &n)?;
            sys::mkdirat(fd.fd.as_fd(), &n, 0o700)?;
            Some(None)
        } else {
            match &fe {
                Some(e) if kind(&e.st) == libc::S_IFDIR => {
                    made = false;
                    None
                }
                Some(_) => {
                    // A non-directory below hid the base's entry: keep it hidden.
                    remove_entry(f, fd, &n)?;
                    sys::mkdirat(fd.fd.as_fd(), &n, 0o700)?;
                    Some(None)
                }
                None => {
                    sys::mkdirat(fd.fd.as_fd(), &n, 0o700)?;
                    None
                }
            }
        };
        let Some(nd) = f.child(fd, name)? else {
            return Ok(Flow::Next);
        };
        if let Some(m) = &marker {
            set_marker(&nd, m.as_deref())?;
        }
        dir_attrs(h, &hn, f, &nd, made)?;
        Ok(Flow::Enter(hn, nd))
    })
    .map(drop)
}

/// Marks the fresh flattened directory `nd` redirected to `lower` (absolute), or opaque
/// (`None`), instead of whatever it had.
fn set_marker(nd: &Node, lower: Option<&[u8]>) -> io::Result<()> {
    super::tree::remove_marker(nd.fd.as_fd(), b"redirect");
    super::tree::remove_marker(nd.fd.as_fd(), b"opaque");
    match lower {
        Some(lower) => {
            let mut v = b"/".to_vec();
            v.extend_from_slice(lower);
            sys::setxattr_fd(nd.fd.as_fd(), &super::tree::ovl(b"redirect"), &v, 0)
        }
        None => sys::setxattr_fd(nd.fd.as_fd(), &super::tree::ovl(b"opaque"), b"y", 0),
    }
}

/// Gives the flattened directory `nd` the layer directory `hn`'s owner, mode, times and
/// xattrs (overlayfs's own markers stay as set; a new one also takes `hn`'s origin, so the
/// merged view keeps its inode number).
fn dir_attrs(h: &Layer, hn: &Node, f: &Layer, nd: &Node, fresh: bool) -> io::Result<()> {
    sys::fchown_fd(nd.fd.as_fd(), hn.st.st_uid, hn.st.st_gid)?;
    sys::fchmod_fd(f.proc_fd.as_fd(), nd.fd.as_fd(), hn.st.st_mode & 0o7777)?;
    let want = h.xattrs(hn);
    for (k, _) in f.xattrs(nd) {
        if !want.iter().any(|(w, _)| *w == k) {
            sys::removexattr_fd(nd.fd.as_fd(), &k)?;
        }
    }
    for (k, v) in &want {
        sys::setxattr_fd(nd.fd.as_fd(), k, v, 0)?;
    }
    if fresh {
        let origin = [OVL, b"origin".as_slice()].concat();
        if let Some(o) = h.xattr(hn, &origin) {
            let _ = sys::setxattr_fd(nd.fd.as_fd(), &super::tree::ovl(b"origin"), &o, 0);
        }
        // Made now, but the conflict rule reads when the layer's directory was made (an
        // opaque one: when the agent deleted what it hides).
        let made = super::sys::dir_staged_at(h, hn);
        sys::setxattr_fd(
            nd.fd.as_fd(),
            &super::tree::ovl(super::sys::STAGED),
            made.to_string().as_bytes(),
            0,
        )?;
    }
    sys::utimens_fd(
        f.proc_fd.as_fd(),
        nd.fd.as_fd(),
        SetTime::At(hn.st.st_atime, hn.st.st_atime_nsec),
        SetTime::At(hn.st.st_mtime, hn.st.st_mtime_nsec),
    )
}
