//! The view a staged tree is compared against (`Layers::lower`): SOURCE alone, or the
//! view at checkpoint N — the sealed layers `DIR/layers/N … 1` over SOURCE — resolved in
//! user space, the way kernel overlayfs would show it, so `status`/`diff --since N`,
//! `apply --at N` and the review's last turn need no mount and no root.
//!
//! The stack is resolved by the daemon's own engine's lookup and listing
//! ([`crate::host::union::Union`], made read-only): a whiteout (a 0/0 character device,
//! or an empty file marked `*.overlay.whiteout`) hides what is below; a non-directory is
//! the topmost layer's; a directory merges its parts in every layer down to an opaque one,
//! a `redirect` (absolute or relative) naming where its lower parts are; markers are read
//! in both namespaces (`trusted.overlay.` and `user.overlay.`), whoever runs it. A node of
//! a merged directory carries its parts ([`Node::merged`]); its attributes are its top
//! part's, with the lowest part's device and inode number (kernel overlayfs reports the
//! topmost lower part's: nothing here compares that number with the kernel's). A
//! non-directory's node is the one real object it resolves to, so its bytes and xattrs
//! are read from it.
//!
//! Invariants: read-only (the union has no work directory: nothing can be made through
//! it); overlayfs's markers never show as a node's xattrs; with no sealed layer every
//! call is SOURCE's own [`Layer`] call, unchanged.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::tree::{Layer, Node, kind};
use crate::host::sys;
use crate::host::union::{Stack, Union};

/// SOURCE, or sealed layers over it.
pub struct Lower {
    source: Layer,
    stack: Option<Union>,
}

impl Lower {
    /// SOURCE alone.
    pub fn plain(source: Layer) -> Lower {
        Lower {
            source,
            stack: None,
        }
    }

    /// `layers` (top first) over `source`; SOURCE alone when `layers` is empty.
    pub fn stacked(layers: Vec<OwnedFd>, source: OwnedFd) -> io::Result<Lower> {
        let plain = Layer::new(source.try_clone()?)?;
        if layers.is_empty() {
            return Ok(Lower::plain(plain));
        }
        let mut all = layers;
        all.push(source);
        Ok(Lower {
            source: plain,
            stack: Some(Union::read_only(all, crate::host::union::prefix())?),
        })
    }

    /// SOURCE's layer: what `apply` writes and overlayfs origins are decoded against.
    pub fn source(&self) -> &Layer {
        &self.source
    }

    /// The node the merged view shows at `path` (relative, `b""` = root), or `None`.
    pub fn get(&self, path: &[u8]) -> io::Result<Option<Node>> {
        let Some(u) = &self.stack else {
            return self.source.get(path);
        };
        let mut node = root(u)?;
        if path.is_empty() {
            return Ok(Some(node));
        }
        for part in path.split(|&b| b == b'/') {
            match self.child(&node, part)? {
                Some(n) => node = n,
                None => return Ok(None),
            }
        }
        Ok(Some(node))
    }

    /// The directory at `path`, if the view shows one there.
    pub fn dir(&self, path: &[u8]) -> io::Result<Option<Node>> {
        Ok(self.get(path)?.filter(|n| kind(&n.st) == libc::S_IFDIR))
    }

    /// The child `name` of directory `dir` in the view.
    pub fn child(&self, dir: &Node, name: &[u8]) -> io::Result<Option<Node>> {
        let Some(u) = &self.stack else {
            return self.source.child(dir, name);
        };
        let Some(s) = &dir.merged else {
            return Ok(None);
        };
        Ok(match u.lookup(s, name)? {
            Some(f) => Some(Node {
                fd: f.fd.try_clone()?,
                st: f.st,
                merged: f.stack.map(Arc::new),
            }),
            None => None,
        })
    }

    /// The names directory `n` shows, sorted.
    pub fn list(&self, n: &Node) -> io::Result<Vec<Vec<u8>>> {
        let (Some(u), Some(s)) = (&self.stack, &n.merged) else {
            return self.source.list(n);
        };
        let mut names: Vec<Vec<u8>> = u.read_dir(s)?.into_iter().map(|e| e.name).collect();
        names.sort();
        Ok(names)
    }

    /// Every xattr of `n` but overlayfs's markers (a merged directory: its top part's).
    pub fn xattrs(&self, n: &Node) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.source.xattrs(n)
    }

    /// The whole contents of regular file `n`, or `None` past `limit` bytes.
    pub fn read(&self, n: &Node, limit: u64) -> io::Result<Option<Vec<u8>>> {
        self.source.read(n, limit)
    }
}

/// The merged root: its top part's attributes with its lowest part's identity.
fn root(u: &Union) -> io::Result<Node> {
    let s = u.root_stack()?;
    let (Some(top), Some(bottom)) = (s.parts.first(), s.parts.last()) else {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    };
    let mut st = sys::fstat(top.fd.as_fd())?;
    let b = sys::fstat(bottom.fd.as_fd())?;
    (st.st_dev, st.st_ino) = (b.st_dev, b.st_ino);
    Ok(Node {
        fd: top.fd.try_clone()?,
        st,
        merged: Some(Arc::new(Stack::clone(&s))),
    })
}

/// Either kind of tree, for the code that goes down both a staged layer and the view
/// below it (`stage::walk`, `diff`'s trees).
pub trait Tree {
    /// The names in directory `n`, sorted.
    fn names(&self, n: &Node) -> io::Result<Vec<Vec<u8>>>;
    /// The node at `path`.
    fn at(&self, path: &[u8]) -> io::Result<Option<Node>>;
    /// The child `name` of directory `dir`.
    fn entry(&self, dir: &Node, name: &[u8]) -> io::Result<Option<Node>>;
    /// A layer to read a node's bytes with (any node's: it reopens by descriptor).
    fn reader(&self) -> &Layer;
}

impl Tree for Layer {
    fn names(&self, n: &Node) -> io::Result<Vec<Vec<u8>>> {
        self.list(n)
    }
    fn at(&self, path: &[u8]) -> io::Result<Option<Node>> {
        self.get(path)
    }
    fn entry(&self, dir: &Node, name: &[u8]) -> io::Result<Option<Node>> {
        self.child(dir, name)
    }
    fn reader(&self) -> &Layer {
        self
    }
}

impl Tree for Lower {
    fn names(&self, n: &Node) -> io::Result<Vec<Vec<u8>>> {
        self.list(n)
    }
    fn at(&self, path: &[u8]) -> io::Result<Option<Node>> {
        self.get(path)
    }
    fn entry(&self, dir: &Node, name: &[u8]) -> io::Result<Option<Node>> {
        self.child(dir, name)
    }
    fn reader(&self) -> &Layer {
        &self.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::sys::Name;
    use std::path::{Path, PathBuf};

    fn temp() -> PathBuf {
        let p = std::env::temp_dir().join(format!("fencefs-lower-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn put(p: &Path, b: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    }

    fn mark(p: &Path, what: &str, v: &[u8]) {
        let fd = sys::open_path_abs(p).unwrap();
        let name = format!("user.overlay.{what}");
        sys::setxattr_fd(fd.as_fd(), name.as_bytes(), v, 0).unwrap();
    }

    fn whiteout(dir: &Path, name: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let d = sys::open_root(dir).unwrap();
        sys::mknodat(
            d.as_fd(),
            &Name::new(name.as_bytes()).unwrap(),
            libc::S_IFCHR,
            0,
        )
        .unwrap();
    }

    fn names(l: &Lower, path: &str) -> Vec<String> {
        let d = l.dir(path.as_bytes()).unwrap().unwrap();
        let n = l.list(&d).unwrap();
        n.iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect()
    }

    fn text(l: &Lower, path: &str) -> Option<String> {
        let n = l.get(path.as_bytes()).unwrap()?;
        let b = l.read(&n, 1 << 20).unwrap()?;
        Some(String::from_utf8(b).unwrap())
    }

    /// Two sealed layers over SOURCE, made by hand: a relative redirect (`mv a b`), an
    /// absolute one (`mv keep c`), whiteouts as 0/0 devices and as marked empty files, an
    /// opaque directory; resolved as overlayfs would.
    #[test]
    fn a_stack_resolves_whiteouts_opaque_directories_and_redirects() {
        let t = temp();
        let (src, l1, l2) = (t.join("src"), t.join("l1"), t.join("l2"));
        put(&src.join("a/f1"), "f1");
        put(&src.join("a/f2"), "f2");
        put(&src.join("keep/k"), "k");
        put(&src.join("w.txt"), "w");
        put(&src.join("o/old"), "old");
        // Layer 1: `mv a b` (relative redirect), a new b/f3, `rm w.txt` (a marked empty
        // file), `rm -r o; mkdir o` (opaque) with o/new.
        put(&l1.join("b/f3"), "f3");
        mark(&l1.join("b"), "redirect", b"a");
        whiteout(&l1, "a");
        put(&l1.join("w.txt"), "");
        mark(&l1.join("w.txt"), "whiteout", b"y");
        put(&l1.join("o/new"), "new");
        mark(&l1.join("o"), "opaque", b"y");
        // Layer 2: `rm b/f1`, `mv keep c` (absolute redirect).
        whiteout(&l2.join("b"), "f1");
        std::fs::create_dir_all(l2.join("c")).unwrap();
        mark(&l2.join("c"), "redirect", b"/keep");
        whiteout(&l2, "keep");
        let open = |p: &Path| sys::open_root(p).unwrap();
        let l = Lower::stacked(vec![open(&l2), open(&l1)], open(&src)).unwrap();
        assert_eq!(names(&l, ""), ["b", "c", "o"]);
        assert_eq!(names(&l, "b"), ["f2", "f3"]);
        assert_eq!(names(&l, "c"), ["k"]);
        assert_eq!(names(&l, "o"), ["new"]);
        assert_eq!(text(&l, "b/f2").as_deref(), Some("f2"));
        assert_eq!(text(&l, "b/f3").as_deref(), Some("f3"));
        assert_eq!(text(&l, "c/k").as_deref(), Some("k"));
        for gone in ["a", "a/f2", "b/f1", "keep", "w.txt", "o/old"] {
            assert!(l.get(gone.as_bytes()).unwrap().is_none(), "{gone}");
        }
        // A merged directory: its top part's attributes, its lowest part's identity.
        let b = l.dir(b"b").unwrap().unwrap();
        let a = std::fs::metadata(src.join("a")).unwrap();
        assert_eq!(b.st.st_ino, std::os::unix::fs::MetadataExt::ino(&a));
        assert!(l.xattrs(&b).is_empty(), "no marker shows");
        // SOURCE alone: SOURCE's own tree.
        let plain = Lower::stacked(Vec::new(), open(&src)).unwrap();
        assert_eq!(names(&plain, ""), ["a", "keep", "o", "w.txt"]);
        let _ = std::fs::remove_dir_all(&t);
    }
}
