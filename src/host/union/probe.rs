//! Attribute-only lookups in the merged view: what a name shows, when that is not a
//! directory, found with one `fstatat` per part of its parent and no handle opened — what
//! a `readdirplus` entry, a `stat` or a rename's check needs (the handle is opened, and
//! checked against this identity, only when an operation needs it).
//!
//! Invariants: the answer is [`Union::lookup`]'s for the same name at the same moment —
//! parts looked at top down, the first entry found decides: a whiteout hides the name,
//! an object is shown with its layer's attributes; whatever only a handle can tell (a
//! directory, whose parts merge; an empty file of a staged layer, which a marker may make
//! a whiteout) is left to `lookup`.

use std::io;
use std::os::fd::AsFd;

use super::{Stack, Union, kind, missing};
use crate::host::sys::{self, Name};

/// What [`Union::probe`] found.
pub enum Probed {
    /// The name shows this non-directory, from this layer.
    Shown(libc::stat, usize),
    /// The name shows nothing (absent, or whited out).
    Nothing,
    /// Only [`Union::lookup`] can tell.
    Ask,
}

impl Union {
    /// What merged directory `parent` shows at `name`, for its attributes (module header).
    pub fn probe(&self, parent: &Stack, name: &[u8]) -> io::Result<Probed> {
        let look = Name::new(name)?;
        for p in &parent.parts {
            let st = match sys::fstatat_nofollow(p.fd.as_fd(), &look) {
                Ok(st) => st,
                Err(e) if missing(&e) => continue,
                Err(e) => return Err(e),
            };
            return Ok(match kind(&st) {
                libc::S_IFDIR => Probed::Ask,
                _ if self.is_source(p.layer) => Probed::Shown(st, p.layer),
                libc::S_IFCHR if st.st_rdev == 0 => Probed::Nothing,
                libc::S_IFREG if st.st_size == 0 => Probed::Ask,
                _ => Probed::Shown(st, p.layer),
            });
        }
        Ok(Probed::Nothing)
    }
}

#[cfg(test)]
mod tests {
    use super::super::prefix;
    use super::*;
    use std::os::unix::fs::symlink;

    /// Where `probe` answers, it answers what `lookup` finds (layer and object); it
    /// leaves directories and empty staged files to `lookup`. (As root: a whiteout is a
    /// 0/0 character device; SOURCE's own 0/0 device is shown.)
    #[test]
    fn probe_answers_as_lookup_does() {
        let root = std::env::temp_dir().join(format!("fencefs-probe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["upper", "lower/dir", "work"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [
            "lower/low",
            "lower/gone",
            "lower/over",
            "upper/over",
            "upper/new",
        ] {
            std::fs::write(root.join(f), b"x").unwrap();
        }
        std::fs::write(root.join("upper/empty"), b"").unwrap();
        symlink("low", root.join("lower/link")).unwrap();
        let open = |d: &str| sys::open_root(&root.join(d)).unwrap();
        let u = Union::new(vec![open("upper"), open("lower")], open("work"), prefix()).unwrap();
        u.whiteout(open("upper").as_fd(), &Name::new(b"gone").unwrap())
            .unwrap();
        sys::mknodat(
            open("lower").as_fd(),
            &Name::new(b"dev").unwrap(),
            libc::S_IFCHR,
            0,
        )
        .unwrap();
        let s = u.root_stack().unwrap();
        let mut asked = Vec::new();
        for n in [
            "low", "gone", "over", "new", "empty", "link", "dev", "dir", "none",
        ] {
            let found = u.lookup(&s, n.as_bytes()).unwrap();
            let found = found.map(|f| (f.layer, f.st.st_ino));
            match u.probe(&s, n.as_bytes()).unwrap() {
                Probed::Shown(st, layer) => assert_eq!(Some((layer, st.st_ino)), found, "{n}"),
                Probed::Nothing => assert_eq!(found, None, "{n}"),
                Probed::Ask => asked.push(n),
            }
        }
        assert_eq!(asked, ["empty", "dir"]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
