//! Path-level access to one layer (SOURCE, or the staged tree `DIR/upper`) for the offline
//! commands: each path is walked from the layer's root handle one component at a time with
//! `O_PATH | O_NOFOLLOW`, so a symlink anywhere on the way is never followed (it is seen
//! as what it is: a symlink, not a directory), and overlayfs's markers are read here.
//!
//! Invariants: no write; every error keeps its errno; a missing path is `None`, not an error.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::host::sys::{self, Name, Xattr};

/// The xattr prefix of kernel overlayfs's markers as root (`trusted.overlay.`); an
/// ordinary user's staging area has them as `user.overlay.` ([`ovl`], [`Layer::xattr`]).
pub const OVL: &[u8] = b"trusted.overlay.";

/// A marker's name as this process writes it (`trusted.overlay.WHAT` with the host's
/// root, `user.overlay.WHAT` otherwise: [`crate::host::union::prefix`]).
pub fn ovl(what: &[u8]) -> Vec<u8> {
    [crate::host::union::prefix(), what].concat()
}

/// Removes marker `what` from the file behind `fd`, in both namespaces (absent: fine).
pub fn remove_marker(fd: BorrowedFd<'_>, what: &[u8]) {
    for p in [OVL, crate::host::union::USER] {
        let _ = sys::removexattr_fd(fd, &[p, what].concat());
    }
}

/// How deep the stage tools walk a tree (without recursion: `stage/walk.rs`): twice the
/// 4,096 levels the merged view lets an agent make (`host/inode/merged.rs`), so no tree
/// made through the mount, nor SOURCE's below it, locks a person out of status,
/// checkpoint, discard or apply; deeper trees are refused (ELOOP). A walk holds one
/// descriptor per level (`fencefs stage` raises its RLIMIT_NOFILE to the hard limit).
pub const MAX_DEPTH: usize = 8192;

/// `Err(ELOOP)` past [`MAX_DEPTH`] levels.
pub fn depth_ok(depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!(
            "deeper than {MAX_DEPTH} directory levels (ELOOP)"
        )));
    }
    Ok(())
}

/// The depth of a relative path (`b""` = 0).
pub fn depth_of(path: &[u8]) -> usize {
    if path.is_empty() {
        0
    } else {
        path.iter().filter(|&&b| b == b'/').count() + 1
    }
}

/// One layer, by its root handle.
pub struct Layer {
    /// The root directory handle (`O_PATH`).
    pub root: OwnedFd,
    /// `/proc/self/fd`, to reopen `O_PATH` handles.
    pub proc_fd: OwnedFd,
}

/// A file found in a layer.
pub struct Node {
    /// Its `O_PATH` handle.
    pub fd: OwnedFd,
    /// Its attributes (not following a symlink).
    pub st: libc::stat,
    /// A directory of a stacked view ([`super::lower::Lower`]): its parts in each layer,
    /// top first. `None` in a plain layer.
    pub merged: Option<std::sync::Arc<crate::host::union::Stack>>,
}

impl Node {
    /// A node of a plain layer.
    pub fn of(fd: OwnedFd, st: libc::stat) -> Node {
        Node {
            fd,
            st,
            merged: None,
        }
    }

    /// Another handle on the same file.
    pub fn try_clone(&self) -> io::Result<Node> {
        Ok(Node {
            fd: self.fd.try_clone()?,
            st: self.st,
            merged: self.merged.clone(),
        })
    }
}

/// `S_IFMT` of a stat.
pub fn kind(st: &libc::stat) -> u32 {
    st.st_mode & libc::S_IFMT
}

/// `path`'s parent and last component (`b""` is the root: no parent).
pub fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (b"", path),
    }
}

/// `a/b`, or `b` when `a` is empty.
pub fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    crate::host::path::join(a, b)
}

fn missing(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR))
}

impl Layer {
    /// A layer rooted at `root`.
    pub fn new(root: OwnedFd) -> io::Result<Layer> {
        Ok(Layer {
            root,
            proc_fd: sys::open_proc_self_fd()?,
        })
    }

    /// The file at `path` (relative, `b""` = root), or `None` if some component is
    /// missing or is not a directory.
    pub fn get(&self, path: &[u8]) -> io::Result<Option<Node>> {
        let mut fd = sys::reopen(self.proc_fd.as_fd(), self.root.as_fd(), libc::O_PATH)?;
        let mut st = sys::fstat(fd.as_fd())?;
        if path.is_empty() {
            return Ok(Some(Node::of(fd, st)));
        }
        for part in path.split(|&b| b == b'/') {
            if kind(&st) != libc::S_IFDIR {
                return Ok(None);
            }
            let name = Name::new(part)?;
            fd = match sys::open_path(fd.as_fd(), &name) {
                Ok(f) => f,
                Err(e) if missing(&e) => return Ok(None),
                Err(e) => return Err(e),
            };
            st = sys::fstat(fd.as_fd())?;
        }
        Ok(Some(Node::of(fd, st)))
    }

    /// The directory at `path`, if it is one.
    pub fn dir(&self, path: &[u8]) -> io::Result<Option<Node>> {
        Ok(self.get(path)?.filter(|n| kind(&n.st) == libc::S_IFDIR))
    }

    /// The names in directory `n`, sorted.
    pub fn list(&self, n: &Node) -> io::Result<Vec<Vec<u8>>> {
        let f = sys::reopen(
            self.proc_fd.as_fd(),
            n.fd.as_fd(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )?;
        let mut names: Vec<Vec<u8>> = sys::read_dir(f.as_fd())?
            .into_iter()
            .map(|e| e.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// The child `name` of directory `dir`.
    pub fn child(&self, dir: &Node, name: &[u8]) -> io::Result<Option<Node>> {
        let name = Name::new(name)?;
        match sys::open_path(dir.fd.as_fd(), &name) {
            Ok(fd) => {
                let st = sys::fstat(fd.as_fd())?;
                Ok(Some(Node::of(fd, st)))
            }
            Err(e) if missing(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One xattr of a regular file or directory (`None` when absent or unsupported); a
    /// marker is read in either namespace.
    pub fn xattr(&self, n: &Node, name: &[u8]) -> Option<Vec<u8>> {
        if !matches!(kind(&n.st), libc::S_IFREG | libc::S_IFDIR) {
            return None;
        }
        let get = |name: &[u8]| match sys::getxattr_fd(n.fd.as_fd(), name, 64 * 1024) {
            Ok(Xattr::Data(v)) => Some(v),
            _ => None,
        };
        get(name).or_else(|| get(&crate::host::union::other_form(name)?))
    }

    /// Every xattr but overlayfs's own markers, sorted by name (regular files and
    /// directories; other kinds have none here).
    pub fn xattrs(&self, n: &Node) -> Vec<(Vec<u8>, Vec<u8>)> {
        if !matches!(kind(&n.st), libc::S_IFREG | libc::S_IFDIR) {
            return Vec::new();
        }
        let Ok(Xattr::Data(list)) = sys::listxattr_fd(n.fd.as_fd(), 64 * 1024) else {
            return Vec::new();
        };
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = list
            .split(|&b| b == 0)
            .filter(|k| !k.is_empty() && !crate::host::union::is_marker(k))
            .filter_map(|k| self.xattr(n, k).map(|v| (k.to_vec(), v)))
            .collect();
        out.sort();
        out
    }

    /// Whether `n` is an overlayfs whiteout: a character device 0/0, or an empty regular
    /// file marked `trusted.overlay.whiteout`.
    pub fn is_whiteout(&self, n: &Node) -> bool {
        match kind(&n.st) {
            libc::S_IFCHR => n.st.st_rdev == 0,
            libc::S_IFREG => {
                n.st.st_size == 0 && self.xattr(n, b"trusted.overlay.whiteout").is_some()
            }
            _ => false,
        }
    }

    /// Whether directory `n` is opaque (hides everything below it in lower layers).
    pub fn is_opaque(&self, n: &Node) -> bool {
        self.xattr(n, b"trusted.overlay.opaque").as_deref() == Some(b"y")
    }

    /// The redirect of directory `n` (where its lower contents live), if any.
    pub fn redirect(&self, n: &Node) -> Option<Vec<u8>> {
        self.xattr(n, b"trusted.overlay.redirect")
    }

    /// The whole contents of regular file `n`, or `None` past `limit` bytes.
    pub fn read(&self, n: &Node, limit: u64) -> io::Result<Option<Vec<u8>>> {
        if n.st.st_size as u64 > limit {
            return Ok(None);
        }
        let f = sys::reopen(self.proc_fd.as_fd(), n.fd.as_fd(), libc::O_RDONLY)?;
        let mut out = vec![0u8; n.st.st_size as usize];
        let mut done = 0;
        while done < out.len() {
            let k = sys::pread(f.as_fd(), &mut out[done..], done as u64)?;
            if k == 0 {
                break;
            }
            done += k;
        }
        out.truncate(done);
        Ok(Some(out))
    }

    /// Whether two regular files hold the same bytes (compared in blocks; `b` may be of
    /// any layer).
    pub fn same_bytes(&self, a: &Node, b: &Node) -> io::Result<bool> {
        if a.st.st_size != b.st.st_size {
            return Ok(false);
        }
        let fa = sys::reopen(self.proc_fd.as_fd(), a.fd.as_fd(), libc::O_RDONLY)?;
        let fb = sys::reopen(self.proc_fd.as_fd(), b.fd.as_fd(), libc::O_RDONLY)?;
        let (mut ba, mut bb) = (vec![0u8; 256 * 1024], vec![0u8; 256 * 1024]);
        let mut off = 0u64;
        loop {
            let ka = sys::pread(fa.as_fd(), &mut ba, off)?;
            let mut kb = 0;
            while kb < ka {
                let k = sys::pread(fb.as_fd(), &mut bb[kb..ka], off + kb as u64)?;
                if k == 0 {
                    break;
                }
                kb += k;
            }
            if ka != kb || ba[..ka] != bb[..kb] {
                return Ok(false);
            }
            if ka == 0 {
                return Ok(true);
            }
            off += ka as u64;
        }
    }
}
