//! Host snapshots: every entry under a root with its type, mode, owner, size, contents
//! and xattrs, to prove that a refused operation left the host exactly as it was.

use super::*;

/// One host entry, as far as "the host did not change" is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub mtime: (i64, i64),
    /// File contents (or a length+hash for large files), or the symlink target.
    pub data: Vec<u8>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

pub type Snapshot = BTreeMap<Vec<u8>, Entry>;

/// Recursively records every entry below `root` (never following symlinks).
pub fn snapshot(root: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    snap_into(root, Path::new(""), &mut out);
    out
}

fn snap_into(base: &Path, rel: &Path, out: &mut Snapshot) {
    let p = join_rel(base, rel);
    let md = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
    let ft = md.file_type();
    let kind = if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_symlink() {
        "symlink"
    } else {
        "special"
    };
    let data = if ft.is_file() {
        if md.len() <= 1 << 20 {
            fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        } else {
            use std::hash::{DefaultHasher, Hasher};
            let mut h = DefaultHasher::new();
            let mut f = fs::File::open(&p).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                h.write(&buf[..n]);
            }
            format!("len={} hash={:x}", md.len(), h.finish()).into_bytes()
        }
    } else if ft.is_symlink() {
        fs::read_link(&p).unwrap().into_os_string().into_vec()
    } else {
        vec![]
    };
    let mut xattrs = vec![];
    if !ft.is_symlink()
        && let Ok(ns) = llistxattr(&p)
    {
        for n in ns {
            if n.starts_with(b"user.") {
                let v = lgetxattr(&p, &n).unwrap_or_default();
                xattrs.push((n, v));
            }
        }
    }
    xattrs.sort();
    out.insert(
        rel.as_os_str().as_bytes().to_vec(),
        Entry {
            kind,
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev(),
            mtime: if ft.is_dir() {
                (0, 0)
            } else {
                (md.mtime(), md.mtime_nsec())
            },
            data,
            xattrs,
        },
    );
    if ft.is_dir() {
        let mut kids: Vec<OsString> = fs::read_dir(&p)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        kids.sort();
        for k in kids {
            snap_into(base, &rel.join(k), out);
        }
    }
}

/// Human-readable difference between two snapshots ("" when equal).
pub fn snapshot_diff(a: &Snapshot, b: &Snapshot) -> String {
    let mut s = String::new();
    for (k, v) in a {
        match b.get(k) {
            None => s += &format!("  removed: {}\n", String::from_utf8_lossy(k)),
            Some(w) if w != v => {
                s += &format!(
                    "  changed: {}\n    before {:?}\n    after  {:?}\n",
                    String::from_utf8_lossy(k),
                    short(v),
                    short(w)
                )
            }
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            s += &format!("  added:   {}\n", String::from_utf8_lossy(k));
        }
    }
    s
}

fn short(e: &Entry) -> String {
    let data = String::from_utf8_lossy(&e.data[..e.data.len().min(80)]).into_owned();
    format!(
        "{} mode={:o} uid={} gid={} rdev={} mtime={:?} data={:?} xattrs={}",
        e.kind,
        e.mode,
        e.uid,
        e.gid,
        e.rdev,
        e.mtime,
        data,
        e.xattrs.len()
    )
}

#[track_caller]
pub fn assert_host_unchanged(before: &Snapshot, root: &Path, what: &str) {
    let after = snapshot(root);
    let d = snapshot_diff(before, &after);
    assert!(
        d.is_empty(),
        "{what}: the host changed after a refused operation:\n{d}"
    );
}
