//! The base record itself: what it holds ([`Base`]), how it is kept on a staged entry (the
//! xattr [`XATTR`], text or compact: [`RecPath`]) and read back, and the conflict rule it
//! decides (`Base::conflicts`). What is recorded when, and on which entry, is
//! [`super::base`]'s.
//!
//! Invariants: a value this module did not write decodes to `None` (never to a record of
//! another object); a record's path is only ever compared, so its compact form (a hash of
//! the path it was taken at) judges exactly as the path would.

use std::os::fd::{AsFd, BorrowedFd};

use super::tree::{Node, kind};
use crate::host::sys::{self, Xattr};

/// The xattr a staged entry's base record is kept in (as root; an ordinary user's is
/// `user.overlay.fencefs-base`: [`xattr_name`]).
pub const XATTR: &[u8] = b"trusted.overlay.fencefs-base";

/// The name this process writes base records under.
pub fn xattr_name() -> Vec<u8> {
    super::tree::ovl(b"fencefs-base")
}

/// The identity of the SOURCE object a staged entry was made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    /// Its inode number.
    pub ino: u64,
    /// Its birth time (ns), 0 when the file system keeps none.
    pub btime: i128,
    /// When the record was taken (ns): a change of the object at or after it conflicts.
    pub since: i128,
    /// The merged-view path it was recorded at.
    pub path: RecPath,
}

/// Where a record was taken: the path itself, or — on a whiteout recorded at its own path,
/// the one record written per deleted file — a 128-bit hash of it, which keeps the record
/// small enough for ext4 to hold in the inode (no 4 KiB xattr block to allocate, journal
/// and free). The path of a record is only ever compared ([`RecPath::is`]); a hash equal
/// for two paths could only add a conflict, or pair a rename whose inode also matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecPath {
    /// The path.
    Plain(Vec<u8>),
    /// Its [`path_hash`].
    Hashed([u8; 16]),
}

impl RecPath {
    /// Whether the record was taken at `path`.
    pub fn is(&self, path: &[u8]) -> bool {
        match self {
            RecPath::Plain(p) => p == path,
            RecPath::Hashed(h) => *h == path_hash(path),
        }
    }
}

impl From<&[u8]> for RecPath {
    fn from(p: &[u8]) -> RecPath {
        RecPath::Plain(p.to_vec())
    }
}

/// The hash a compact record keeps of its path: SipHash-2-4 under two fixed keys (the
/// on-disk format: never change them; `compact_records_round_trip` pins one value).
pub fn path_hash(path: &[u8]) -> [u8; 16] {
    #[allow(deprecated)]
    let half = |k0: u64, k1: u64| {
        use std::hash::Hasher;
        let mut h = std::hash::SipHasher::new_with_keys(k0, k1);
        h.write(path);
        h.finish().to_le_bytes()
    };
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&half(0x6665_6e63_6566_7331, 0x7265_636f_7264_7061));
    out[8..].copy_from_slice(&half(0x7468_2d68_6173_6832, 0x6261_7365_2d76_3200));
    out
}

/// The first byte of a compact record (a text record starts with `1`).
const COMPACT: u8 = 2;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Nanoseconds since the epoch of a stat time.
pub fn ns(sec: i64, nsec: i64) -> i128 {
    sec as i128 * 1_000_000_000 + nsec as i128
}

impl Base {
    /// A record of the object with `ino`/`btime` shown at `path`, taken now.
    pub fn now(ino: u64, btime: i128, path: &[u8]) -> Base {
        // The coarse clock file times come from: an edit after this carries a time at or
        // after it (an edit in the same tick counts too, erring towards a conflict).
        let t = super::sys::coarse_now_ns();
        Base {
            ino,
            btime,
            since: t,
            path: path.into(),
        }
    }

    /// The record of a whiteout that carries none (an ordinary user's: `user.*` xattrs
    /// cannot be set on a device), for the entry that replaces it: SOURCE's object at
    /// `path`, whichever it is (inode 0), unchanged since the whiteout was made — the
    /// deletion's conflict judged by times, carried over to what replaces it (a swap's
    /// `mv y x` over `x`'s whiteout). `None` for anything but a whiteout.
    pub fn deleted(st: &libc::stat, path: &[u8]) -> Option<Base> {
        (kind(st) == libc::S_IFCHR && st.st_rdev == 0).then(|| Base {
            ino: 0,
            btime: 0,
            // The whiteout's modification time: when what it stands for was staged, if
            // older than the whiteout (a removed directory's, `host::union`'s staged
            // times).
            since: ns(st.st_ctime, st.st_ctime_nsec).min(ns(st.st_mtime, st.st_mtime_nsec)),
            path: path.into(),
        })
    }

    /// The same record kept compact when it was taken at `path`, the place it is written
    /// to (a whiteout's: see [`RecPath`]); as it is otherwise.
    pub fn compact_at(self, path: &[u8]) -> Base {
        match &self.path {
            RecPath::Plain(p) if p == path => Base {
                path: RecPath::Hashed(path_hash(path)),
                ..self
            },
            _ => self,
        }
    }

    /// The xattr value: `1 INO BTIME SINCE PATH-HEX` (text), or compact: the byte 2, the
    /// inode as a LEB128 varint, birth and record times as little-endian i64 nanoseconds,
    /// the 16-byte path hash — at most 43 bytes, which ext4 keeps in a 256-byte inode
    /// beside this name (52 bytes of value fit there).
    pub fn encode(&self) -> Vec<u8> {
        match &self.path {
            RecPath::Plain(p) => {
                format!("1 {} {} {} {}", self.ino, self.btime, self.since, hex(p)).into_bytes()
            }
            RecPath::Hashed(h) => {
                let mut v = vec![COMPACT];
                let mut ino = self.ino;
                loop {
                    let b = (ino & 0x7f) as u8;
                    ino >>= 7;
                    if ino == 0 {
                        v.push(b);
                        break;
                    }
                    v.push(b | 0x80);
                }
                // Out of an i64's range (centuries away): clamped, which only moves a
                // time further from any file's, never hides a change.
                let clamp = |t: i128| t.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
                v.extend_from_slice(&clamp(self.btime).to_le_bytes());
                v.extend_from_slice(&clamp(self.since).to_le_bytes());
                v.extend_from_slice(h);
                v
            }
        }
    }

    /// Reads a value [`Base::encode`] made (`None` for anything else).
    pub fn decode(v: &[u8]) -> Option<Base> {
        if v.first() == Some(&COMPACT) {
            return Base::decode_compact(&v[1..]);
        }
        let s = std::str::from_utf8(v).ok()?;
        let mut it = s.split(' ');
        if it.next()? != "1" {
            return None;
        }
        let b = Base {
            ino: it.next()?.parse().ok()?,
            btime: it.next()?.parse().ok()?,
            since: it.next()?.parse().ok()?,
            path: RecPath::Plain(unhex(it.next()?)?),
        };
        it.next().is_none().then_some(b)
    }

    fn decode_compact(v: &[u8]) -> Option<Base> {
        let mut ino = 0u64;
        let mut n = 0;
        loop {
            let b = *v.get(n)?;
            let bits = u64::from(b & 0x7f);
            if n == 9 && (b > 1) {
                return None;
            }
            ino |= bits << (7 * n);
            n += 1;
            if b & 0x80 == 0 {
                break;
            }
        }
        let rest = v.get(n..)?;
        if rest.len() != 32 {
            return None;
        }
        let i64_at = |i: usize| i64::from_le_bytes(rest[i..i + 8].try_into().unwrap_or([0; 8]));
        Some(Base {
            ino,
            btime: i64_at(0) as i128,
            since: i64_at(8) as i128,
            path: RecPath::Hashed(rest[16..32].try_into().ok()?),
        })
    }

    /// Whether the staged entry at `path` with this record conflicts with SOURCE's entry
    /// there now: `now` is its attributes and birth time (`None`: SOURCE has nothing).
    /// Gone: a conflict when the record was taken at this very path (the host removed
    /// what the agent built on); a record carried here by the agent's own rename is not.
    pub fn conflicts(&self, path: &[u8], now: Option<(&libc::stat, i128)>) -> bool {
        match now {
            None => self.path.is(path),
            Some((st, btime)) => {
                // Inode 0: any object ([`Base::deleted`]).
                let same = self.ino == 0
                    || (st.st_ino == self.ino && (self.btime == 0 || btime == self.btime));
                !same || ns(st.st_ctime, st.st_ctime_nsec) >= self.since
            }
        }
    }
}

/// The time of the record a value [`Base::encode`] made (`None` for anything else): what
/// the merged view folds into a staged entry's staged time (`Union::reading_records`).
pub fn since_of(v: &[u8]) -> Option<i128> {
    Base::decode(v).map(|b| b.since)
}

/// The record on a staged entry, if it has one.
pub fn read(fd: BorrowedFd<'_>) -> Option<Base> {
    let get = |n: &[u8]| match sys::getxattr_fd(fd, n, 4096) {
        Ok(Xattr::Data(v)) => Base::decode(&v),
        _ => None,
    };
    get(XATTR).or_else(|| get(b"user.overlay.fencefs-base"))
}

/// The record on staged node `n` (a whiteout included).
pub fn of(n: &Node) -> Option<Base> {
    of_entry(n.fd.as_fd(), &n.st)
}

/// The record on the staged entry held by `fd`, whose attributes are `st`.
pub(super) fn of_entry(fd: BorrowedFd<'_>, st: &libc::stat) -> Option<Base> {
    if kind(st) == libc::S_IFDIR {
        return None;
    }
    read(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn records_round_trip_and_reject_garbage() {
        let b = Base {
            ino: 42,
            btime: 1_700_000_000_123_456_789,
            since: 1_700_000_001_000_000_000,
            path: RecPath::Plain(b"dir/a b\n\xff".to_vec()),
        };
        assert_eq!(Base::decode(&b.encode()), Some(b.clone()));
        for bad in [
            &b""[..],
            b"2 1 2 3 61",
            b"1 x 2 3 61",
            b"1 1 2 3 6",
            b"1 1 2 3 61 extra",
        ] {
            assert_eq!(Base::decode(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    fn st(ino: u64, ctime: i64) -> libc::stat {
        let root = sys::open_root(Path::new("/")).unwrap();
        let mut s = sys::fstat(root.as_fd()).unwrap();
        s.st_ctime_nsec = 0;
        s.st_ino = ino;
        s.st_ctime = ctime;
        s
    }

    #[test]
    fn conflict_by_identity_time_and_absence() {
        let b = Base {
            ino: 7,
            btime: 100,
            since: 50 * 1_000_000_000,
            path: b"a.txt"[..].into(),
        };
        // The same object, untouched since: no conflict.
        assert!(!b.conflicts(b"a.txt", Some((&st(7, 40), 100))));
        // Changed in place at or after the record.
        assert!(b.conflicts(b"a.txt", Some((&st(7, 50), 100))));
        // Another object (a rename over it), even an older-looking one.
        assert!(b.conflicts(b"a.txt", Some((&st(8, 10), 100))));
        // The same inode number reused by a newer file.
        assert!(b.conflicts(b"a.txt", Some((&st(7, 40), 101))));
        // Gone: a conflict at the recorded path, not where the agent moved it.
        assert!(b.conflicts(b"a.txt", None));
        assert!(!b.conflicts(b"moved.txt", None));
        // The compact form judges alike.
        let c = b.clone().compact_at(b"a.txt");
        assert!(matches!(c.path, RecPath::Hashed(_)));
        assert!(!c.conflicts(b"a.txt", Some((&st(7, 40), 100))));
        assert!(c.conflicts(b"a.txt", Some((&st(8, 10), 100))));
        assert!(c.conflicts(b"a.txt", None));
        assert!(!c.conflicts(b"moved.txt", None));
    }

    #[test]
    fn compact_records_round_trip() {
        let plain = Base {
            ino: u64::MAX,
            btime: 1_700_000_000_123_456_789,
            since: -5,
            path: b"src/lib.rs"[..].into(),
        };
        // Only a record taken where it is written becomes compact.
        assert_eq!(plain.clone().compact_at(b"src/main.rs"), plain);
        let c = plain.clone().compact_at(b"src/lib.rs");
        let v = c.encode();
        assert_eq!(v.len(), 43, "the longest inode number");
        assert_eq!(Base::decode(&v), Some(c.clone()));
        assert!(c.path.is(b"src/lib.rs") && !c.path.is(b"src/lib.r"));
        let small = Base {
            ino: 300,
            ..c.clone()
        };
        assert_eq!(small.encode().len(), 35);
        assert_eq!(Base::decode(&small.encode()), Some(small.clone()));
        // The hash is the on-disk format: pinned.
        let h: String = path_hash(b"src/lib.rs")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(h, PINNED);
        // Truncated, padded, or an inode number longer than 64 bits: nothing.
        let mut long = v.clone();
        long.push(0);
        let mut wide = vec![COMPACT];
        wide.extend_from_slice(&[0xff; 9]);
        wide.push(0x02);
        wide.extend_from_slice(&[0; 32]);
        for bad in [
            &v[..v.len() - 1],
            &long[..],
            &[COMPACT][..],
            &[COMPACT, 0x80][..],
            &wide[..],
        ] {
            assert_eq!(Base::decode(bad), None, "{bad:?}");
        }
    }

    const PINNED: &str = "cf036d95baf31b75a7fca44b20bda9ec";
}
