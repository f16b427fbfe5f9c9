//! Review ids: what `stage status --json` shows as each change's `id`, and what
//! `apply`/`discard PATH@ID` check, so that what is applied is what was shown.
//!
//! An id is a digest (SHA-256, 16 hex digits) of the change's kind and paths, of the
//! staged object — a file's bytes, mode, owner, mtime and xattrs; a symlink's target; a
//! device's number; a new directory's whole tree, entry by entry; a directory's mode, owner
//! and xattrs — and of the SOURCE object it is against (inode, ctime, size, mode; for a
//! rename of a cycle also the one it carries away at its new path). The
//! agent writing one more byte, a `touch`, a chmod, or a host edit of the SOURCE side
//! gives another id. Nothing of it depends on where the staged tree lives (the live
//! upper, a flattened scratch tree, the squashed one): files there are hard links of one
//! inode, and directory times are left out (they follow their entries).
//!
//! Invariants: read-only; every walk is iterative and bounded by
//! [`super::tree::MAX_DEPTH`] (`stage/walk.rs`).

use std::io;
use std::os::fd::AsFd;

use sha2::{Digest, Sha256};

use super::changes::{Change, Kind, Layers};
use super::tree::{Layer, Node, kind};
use super::walk::{Event, Flow, walk};
use crate::host::sys;

/// The length of an id in hex digits.
pub const LEN: usize = 16;

fn put(h: &mut Sha256, b: &[u8]) {
    h.update((b.len() as u64).to_le_bytes());
    h.update(b);
}

fn num(h: &mut Sha256, n: i128) {
    h.update(n.to_le_bytes());
}

/// The id of change `c` of `l`.
pub fn id(l: &Layers, c: &Change) -> io::Result<String> {
    let mut h = Sha256::new();
    put(&mut h, b"fencefs-review-id-1");
    put(&mut h, c.word().as_bytes());
    put(&mut h, &c.path);
    if let Kind::Renamed { from } = &c.kind {
        put(&mut h, from);
    }
    match c.lower_st {
        Some(s) => s.iter().for_each(|&n| num(&mut h, n)),
        None => put(&mut h, b"-"),
    }
    // A rename of a cycle: also what it carries away at its new path (nothing else has
    // this, so every other change keeps its id).
    if let Some(s) = c.replaces {
        put(&mut h, b"replaces");
        s.iter().for_each(|&n| num(&mut h, n));
    }
    match (&c.kind, l.upper.get(&c.path)?) {
        (Kind::Deleted, _) | (_, None) => put(&mut h, b"-"),
        (_, Some(u)) => staged(&l.upper, &u, c.entries.is_some(), &mut h, &c.path)?,
    }
    let d = h.finalize();
    Ok(d.iter().take(LEN / 2).map(|b| format!("{b:02x}")).collect())
}

/// The staged object `n` at `path` (with `tree`: a new directory, every entry below it
/// too, each name before its object, depth first: [`super::walk`]).
fn staged(up: &Layer, n: &Node, tree: bool, h: &mut Sha256, path: &[u8]) -> io::Result<()> {
    object(up, n, h)?;
    if !(tree && kind(&n.st) == libc::S_IFDIR) {
        return Ok(());
    }
    walk(up, n.try_clone()?, path, (), |ev| {
        let Event::Entry { dir, name, .. } = ev else {
            return Ok(Flow::Next);
        };
        let Some(c) = up.child(&dir.node, name)? else {
            return Ok(Flow::Next);
        };
        if up.is_whiteout(&c) {
            return Ok(Flow::Next);
        }
        put(h, name);
        object(up, &c, h)?;
        Ok(if kind(&c.st) == libc::S_IFDIR {
            Flow::Enter(c, ())
        } else {
            Flow::Next
        })
    })
    .map(drop)
}

/// One staged object without what is below it.
fn object(up: &Layer, n: &Node, h: &mut Sha256) -> io::Result<()> {
    let st = &n.st;
    for v in [st.st_mode as i128, st.st_uid as i128, st.st_gid as i128] {
        num(h, v);
    }
    for (k, v) in up.xattrs(n) {
        put(h, &k);
        put(h, &v);
    }
    match kind(st) {
        libc::S_IFREG => {
            num(h, st.st_size as i128);
            num(
                h,
                st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128,
            );
            contents(up, n, h)?;
        }
        libc::S_IFLNK => put(h, &sys::readlink_fd(n.fd.as_fd())?),
        libc::S_IFCHR | libc::S_IFBLK => num(h, st.st_rdev as i128),
        _ => {}
    }
    Ok(())
}

fn contents(up: &Layer, n: &Node, h: &mut Sha256) -> io::Result<()> {
    let f = sys::reopen(up.proc_fd.as_fd(), n.fd.as_fd(), libc::O_RDONLY)?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut off = 0u64;
    loop {
        let got = sys::pread(f.as_fd(), &mut buf, off)?;
        if got == 0 {
            return Ok(());
        }
        h.update(&buf[..got]);
        off += got as u64;
    }
}

/// `PATH@ID` split: the id when the argument ends in `@` and [`LEN`] lowercase hex
/// digits (a path that itself ends so is taken as one with an id).
pub fn split_arg(arg: &[u8]) -> (&[u8], Option<&str>) {
    if arg.len() > LEN + 1 && arg[arg.len() - LEN - 1] == b'@' {
        let tail = &arg[arg.len() - LEN..];
        if tail
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            let id = std::str::from_utf8(tail).ok();
            return (&arg[..arg.len() - LEN - 1], id);
        }
    }
    (arg, None)
}

/// A PATH argument of an apply or discard, its id checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// The path (id taken off).
    pub path: Vec<u8>,
    /// It carried an id: it selects the one change it names, never what lies below it
    /// (a directory's `m`, `R` or `T` id covers that directory's own change only, so
    /// changes below it were not shown by that id: each needs its own).
    pub exact: bool,
}

impl Kept {
    /// Whether change `c` is selected by this argument.
    pub fn selects(&self, c: &Change) -> bool {
        if self.exact {
            c.path == self.path
        } else {
            c.touches(&self.path)
        }
    }
}

/// For a discard: a `refused …` line when `k` (a PATH@ID) names a directory's own change
/// — its metadata (`m`) or its rename (`R`) — while other changes lie below it. Discarding
/// that change takes the staged directory back whole, with what lies below, which that id
/// did not show: each needs its own id, or the directory is discarded without one.
pub fn too_wide_to_discard(k: &Kept, list: &[Change]) -> Option<String> {
    if !k.exact {
        return None;
    }
    let c = list.iter().find(|c| c.path == k.path)?;
    if !c.dir || !matches!(c.kind, Kind::Metadata | Kind::Renamed { .. }) {
        return None;
    }
    let below =
        |p: &[u8]| p.len() > k.path.len() && p.starts_with(&k.path) && p[k.path.len()] == b'/';
    let n = list.iter().filter(|o| below(&o.path)).count();
    (n > 0).then(|| {
        format!(
            "refused {}: {n} change(s) below it are staged and this id does not cover them: discard them first, or the directory without an id",
            super::render::status_line(c)
        )
    })
}

/// The PATH arguments of an apply or discard with their ids checked against the staged
/// tree now: the paths to go on with (ids taken off) and a `refused …` line for each path
/// whose change is not the one shown (another id, or nothing staged there any more).
/// `why` says what a refused id means (`changed since it was shown`).
pub fn check(l: &Layers, args: &[Vec<u8>], why: &str) -> (Vec<Kept>, Vec<String>) {
    let mut keep = Vec::new();
    let mut refused = Vec::new();
    let mut all: Option<io::Result<Vec<Change>>> = None;
    for a in args {
        let (path, want) = split_arg(a);
        let Some(want) = want else {
            keep.push(Kept {
                path: a.clone(),
                exact: false,
            });
            continue;
        };
        let shown = super::render::quote(path);
        let found = match all.get_or_insert_with(|| l.changes()) {
            Ok(list) => Ok(list.iter().find(|c| c.path == path).cloned()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        };
        match found {
            Ok(Some(c)) => match id(l, &c) {
                Ok(now) if now == want => keep.push(Kept {
                    path: path.to_vec(),
                    exact: true,
                }),
                Ok(now) => refused.push(format!(
                    "refused {}@{want}: {why} (now @{now}): review it again",
                    super::render::status_line(&c)
                )),
                Err(e) => refused.push(format!("refused {shown}@{want}: {e}")),
            },
            Ok(None) => refused.push(format!(
                "refused {shown}@{want}: no longer staged as shown: review it again"
            )),
            Err(e) => refused.push(format!("refused {shown}@{want}: {e}")),
        }
    }
    (keep, refused)
}

#[cfg(test)]
mod tests {
    use super::split_arg;

    #[test]
    fn path_at_id() {
        assert_eq!(
            split_arg(b"src/a.rs@0123456789abcdef"),
            (&b"src/a.rs"[..], Some("0123456789abcdef"))
        );
        assert_eq!(
            split_arg(b"node_modules/@types/x"),
            (&b"node_modules/@types/x"[..], None)
        );
        assert_eq!(
            split_arg(b"a@0123456789ABCDEF"),
            (&b"a@0123456789ABCDEF"[..], None)
        );
        assert_eq!(split_arg(b"a@0123"), (&b"a@0123"[..], None));
        assert_eq!(
            split_arg(b"@0123456789abcdef"),
            (&b"@0123456789abcdef"[..], None)
        );
    }
}
