//! Keeping a checkpoint sealed while files stay open for writing (the daemon's live
//! changes, `app/restage.rs`, call this with the request gate closed).
//!
//! A descriptor open for writing reaches one inode of DIR and nothing else, however it
//! writes: the daemon's own descriptor, or the kernel's passthrough backing file, which
//! the daemon cannot reopen or take back. When a checkpoint seals the upper as layer N,
//! such an inode would go on changing inside the sealed layer. So each one **moves to the
//! new upper** — linked there under every name it has in layer N — and layer N gets **a
//! copy made now** in its place under those names (the bytes, owner, mode, times and
//! every xattr, overlayfs's own included; holes stay holes). The writes that follow land
//! in the live upper: `status --since N` shows them, `rewind N` drops them, and layer N
//! never changes.
//!
//! Invariants: a layer's entry is replaced by one rename (it names the old inode or the
//! copy, never nothing); the original is never named in a layer and in the upper at once
//! (it holds a name in `DIR/scratch` while it moves: a crash leaves the layer with the
//! copy or the original, the upper with the original or nothing); temporary names live in
//! `DIR/scratch` (cleared at the next start); the copies and the directories touched are
//! synced. Cost: a copy of each file held open for writing (the changed files of that
//! turn), and a walk of the layer only when a file is no longer at the path it was last
//! seen at or has several names.

use super::StageError;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::remove::sync_dir;
use super::sys::{STAGED, file};
use super::tree::{Layer, Node, join, kind, split};
use super::walk::{Event, Flow};
use super::{Area, layers};
use crate::host::sys::{self, Name};

/// A file's identity in DIR (`st_dev`, `st_ino`).
pub type Key = (u64, u64);

/// A file held open for writing: its inode in DIR and the path it was last seen at.
#[derive(Clone, Debug)]
pub struct Writer {
    /// The inode.
    pub key: Key,
    /// Its path (relative to the layer root) when last seen.
    pub hint: Vec<u8>,
}

fn err(what: &str, e: io::Error) -> StageError {
    StageError::op(format!("stage: keeping the checkpoint sealed: {what}"))(e)
}

/// The regular file at `path` in DIR's upper, if there is one: its identity.
pub fn upper_key(area: &Area, path: &[u8]) -> Option<Key> {
    let up = Layer::new(area.upper.try_clone().ok()?).ok()?;
    let n = up.get(path).ok()??;
    (kind(&n.st) == libc::S_IFREG).then_some((n.st.st_dev, n.st.st_ino))
}

/// After a checkpoint sealed the upper as layer `n`: each file of `keep` moves to the
/// new upper and layer `n` gets a copy (module header). Returns the
/// path each file of `keep` found has in the upper now (those not found are in no layer:
/// nothing to keep sealed from them).
pub fn unseal(area: &Area, n: u64, keep: &[Writer]) -> Result<HashMap<Key, Vec<u8>>, StageError> {
    let path = layers::layer_path(&area.dir, n);
    let tree = sys::open_root(&path)
        .and_then(Layer::new)
        .map_err(|e| err("layer", e))?;
    let up = area
        .upper
        .try_clone()
        .and_then(Layer::new)
        .map_err(|e| err("upper", e))?;
    detach(&area.dir, &tree, Some(&up), keep).map_err(|e| err("moving", e))
}

/// Every name in `tree` of each writer's inode (by its hint, else by one walk).
fn find(tree: &Layer, ws: &[Writer]) -> io::Result<HashMap<Key, Vec<Vec<u8>>>> {
    let mut out: HashMap<Key, Vec<Vec<u8>>> = HashMap::new();
    let mut pending = HashSet::new();
    for w in ws {
        if out.contains_key(&w.key) || pending.contains(&w.key) {
            continue;
        }
        match tree.get(&w.hint)? {
            Some(n)
                if kind(&n.st) == libc::S_IFREG
                    && (n.st.st_dev, n.st.st_ino) == w.key
                    && n.st.st_nlink == 1 =>
            {
                out.insert(w.key, vec![w.hint.clone()]);
            }
            _ => {
                pending.insert(w.key);
            }
        }
    }
    if !pending.is_empty()
        && let Some(root) = tree.get(b"")?
    {
        walk(tree, root, &pending, &mut out)?;
    }
    Ok(out)
}

fn walk(
    tree: &Layer,
    root: Node,
    want: &HashSet<Key>,
    out: &mut HashMap<Key, Vec<Vec<u8>>>,
) -> io::Result<()> {
    super::walk::walk(tree, root, b"", (), |ev| {
        let Event::Entry { dir, path, name } = ev else {
            return Ok(Flow::Next);
        };
        let Some(c) = tree.child(&dir.node, name)? else {
            return Ok(Flow::Next);
        };
        let key = (c.st.st_dev, c.st.st_ino);
        Ok(match kind(&c.st) {
            libc::S_IFREG if want.contains(&key) => {
                out.entry(key).or_default().push(join(path, name));
                Flow::Next
            }
            libc::S_IFDIR => Flow::Enter(c, ()),
            _ => Flow::Next,
        })
    })
    .map(drop)
}

/// `DIR/scratch` (made if missing).
fn scratch(dir: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::DirBuilderExt;
    let p = dir.join("scratch");
    match std::fs::DirBuilder::new().mode(0o700).create(&p) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    sys::open_root(&p)
}

fn temp_name() -> io::Result<Name> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Name::new(format!("seal.{}.{n}", std::process::id()).as_bytes())
}

/// For each writer's inode in `tree`: linked under all its names into `into` (if given),
/// then replaced in `tree` by a copy. Returns the first name of each one moved.
fn detach(
    dir: &Path,
    tree: &Layer,
    into: Option<&Layer>,
    ws: &[Writer],
) -> io::Result<HashMap<Key, Vec<u8>>> {
    let mut moved = HashMap::new();
    if ws.is_empty() {
        return Ok(moved);
    }
    let names = find(tree, ws)?;
    if names.is_empty() {
        return Ok(moved);
    }
    let tmp_dir = scratch(dir)?;
    for (key, paths) in names {
        let Some(orig) = tree.get(&paths[0])? else {
            continue;
        };
        if (orig.st.st_dev, orig.st.st_ino) != key {
            continue;
        }
        let src = sys::reopen(tree.proc_fd.as_fd(), orig.fd.as_fd(), libc::O_RDONLY)?;
        let tmp = temp_name()?;
        let copy = copy_file(src.as_fd(), &orig.st, tmp_dir.as_fd(), &tmp)?;
        let sub = |what: &str| {
            Name::new(format!("{}.{what}", String::from_utf8_lossy(tmp.bytes())).as_bytes())
        };
        // Moving: the original keeps a name in the scratch directory meanwhile, never one
        // in the layer and one in the upper at once (a crash then would leave the two
        // sharing an inode: a later write in the upper would change the layer).
        let held = sub("orig")?;
        if into.is_some() {
            sys::linkat_fd(
                tree.proc_fd.as_fd(),
                orig.fd.as_fd(),
                tmp_dir.as_fd(),
                &held,
            )?;
        }
        for (i, p) in paths.iter().enumerate() {
            let (pd, leaf) = split(p);
            let Some(d) = tree.dir(pd)? else {
                continue;
            };
            let t = sub(&i.to_string())?;
            sys::linkat_fd(tree.proc_fd.as_fd(), copy.as_fd(), tmp_dir.as_fd(), &t)?;
            sys::renameat2(tmp_dir.as_fd(), &t, d.fd.as_fd(), &Name::new(leaf)?, 0)?;
            sync_dir(tree, d.fd.as_fd())?;
        }
        if let Some(up) = into {
            let mut made = Vec::new();
            for (i, p) in paths.iter().enumerate() {
                let (pd, leaf) = split(p);
                let d = dirs(tree, up, pd, &mut made)?;
                let leaf = Name::new(leaf)?;
                if i + 1 < paths.len() {
                    sys::linkat_fd(up.proc_fd.as_fd(), orig.fd.as_fd(), d.as_fd(), &leaf)?;
                } else {
                    sys::renameat2(tmp_dir.as_fd(), &held, d.as_fd(), &leaf, 0)?;
                }
                sync_dir(up, d.as_fd())?;
            }
            dir_times(&made)?;
            moved.insert(key, paths[0].clone());
        }
        sys::unlinkat(tmp_dir.as_fd(), &tmp, 0)?;
    }
    Ok(moved)
}

/// The directory `path` of `up`, made where missing with the mode, owner and xattrs of
/// `tree`'s directory there — of overlayfs's own only its origin: it merges with the
/// layer's, neither opaque nor redirected —; the ones made are added to `made` (their
/// times are set once the links are in).
fn dirs(
    tree: &Layer,
    up: &Layer,
    path: &[u8],
    made: &mut Vec<(OwnedFd, libc::stat)>,
) -> io::Result<OwnedFd> {
    let mut cur = sys::reopen(up.proc_fd.as_fd(), up.root.as_fd(), libc::O_PATH)?;
    if path.is_empty() {
        return Ok(cur);
    }
    let mut sofar: Vec<u8> = Vec::new();
    for part in path.split(|&b| b == b'/') {
        sofar = join(&sofar, part);
        let name = Name::new(part)?;
        match sys::open_path(cur.as_fd(), &name) {
            Ok(f) if kind(&sys::fstat(f.as_fd())?) == libc::S_IFDIR => {
                cur = f;
                continue;
            }
            Ok(_) => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        let t = tree
            .dir(&sofar)?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        sys::mkdirat(cur.as_fd(), &name, 0o700)?;
        let f = sys::open_path(cur.as_fd(), &name)?;
        let d = sys::reopen(
            up.proc_fd.as_fd(),
            f.as_fd(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )?;
        sys::fchown_fd(d.as_fd(), t.st.st_uid, t.st.st_gid)?;
        file::fchmod(d.as_fd(), t.st.st_mode & 0o7777)?;
        for (k, v) in tree.xattrs(&t) {
            file::set(d.as_fd(), &k, &v)?;
        }
        // The SOURCE directory it merges with, as overlayfs records it (its inode number).
        let origin = [super::tree::OVL, b"origin".as_slice()].concat();
        if let Some(o) = tree.xattr(&t, &origin) {
            file::set(d.as_fd(), &super::tree::ovl(b"origin"), &o)?;
        }
        sync_dir(up, cur.as_fd())?;
        made.push((d, t.st));
        cur = f;
    }
    Ok(cur)
}

fn dir_times(made: &[(OwnedFd, libc::stat)]) -> io::Result<()> {
    for (d, st) in made.iter().rev() {
        file::futimens(
            d.as_fd(),
            (st.st_atime, st.st_atime_nsec),
            (st.st_mtime, st.st_mtime_nsec),
        )?;
    }
    Ok(())
}

/// A new file `dir/name`: a copy of `src` (stat `st`) — its bytes (holes kept), owner,
/// mode, every xattr (overlayfs's own included: the copy stands for the same staged entry)
/// and times, marked with when `src` was staged ([`super::sys::STAGED_AT`]: the conflict rule reads
/// it) — synced. Returns it (open for writing).
fn copy_file(
    src: BorrowedFd<'_>,
    st: &libc::stat,
    dir: BorrowedFd<'_>,
    name: &Name,
) -> io::Result<OwnedFd> {
    let dst = sys::openat(
        dir,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        0o600,
    )?;
    let size = st.st_size.max(0) as u64;
    // Holes stay holes (apply's copy: stage/copy.rs).
    crate::host::copy::copy_data(src, dst.as_fd(), size)?;
    sys::ftruncate(dst.as_fd(), size)?;
    sys::fchown_fd(dst.as_fd(), st.st_uid, st.st_gid)?;
    file::fchmod(dst.as_fd(), st.st_mode & 0o7777)?;
    for k in file::list(src)?
        .split(|&b| b == 0)
        .filter(|k| !k.is_empty())
    {
        file::set(dst.as_fd(), k, &file::get(src, k)?)?;
    }
    // The conflict rule reads when the staged entry was made: the copy's birth is now.
    let made = super::sys::staged_at_fd(src)?;
    file::set(
        dst.as_fd(),
        &super::tree::ovl(STAGED),
        made.to_string().as_bytes(),
    )?;
    file::futimens(
        dst.as_fd(),
        (st.st_atime, st.st_atime_nsec),
        (st.st_mtime, st.st_mtime_nsec),
    )?;
    sys::fsync(dst.as_fd(), false)?;
    Ok(dst)
}
