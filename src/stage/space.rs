//! What a staged regular file takes: its size, the bytes allocated to it, and whether it
//! has holes. `status --json` and `diff` show it for a file of 1 MiB or more or with
//! holes, so a reviewer sees a 512 MiB file holding 8 KiB of data for what it is (apply
//! writes its data only: [`super::copy`]).
//!
//! Invariants: read-only; a file is opened (read-only, through its handle) only when its
//! allocation is below its size, to ask SEEK_HOLE whether that is a hole.

use std::os::fd::AsFd;

use super::changes::{Change, Kind, Layers};
use super::tree::{Layer, Node, kind};
use crate::host::sys;

/// Sizes from here on are shown even without holes.
const LARGE: u64 = 1 << 20;

/// The space of one regular file.
pub struct Space {
    /// `st_size`.
    pub size: u64,
    /// `st_blocks` in bytes.
    pub allocated: u64,
    /// It has a hole (SEEK_HOLE finds one before its end).
    pub sparse: bool,
}

impl Space {
    /// The space of `n` in `layer` (`None` unless a regular file).
    pub fn of(layer: &Layer, n: &Node) -> Option<Space> {
        if kind(&n.st) != libc::S_IFREG {
            return None;
        }
        let size = n.st.st_size as u64;
        let allocated = n.st.st_blocks as u64 * 512;
        let sparse = allocated < size && has_hole(layer, n, size);
        Some(Space {
            size,
            allocated,
            sparse,
        })
    }

    /// Worth showing: sparse, or 1 MiB or more.
    pub fn shown(&self) -> bool {
        self.sparse || self.size >= LARGE
    }

    /// `64 MiB` or `64 MiB, sparse: 8 KiB allocated`.
    pub fn note(&self) -> String {
        if self.sparse {
            format!(
                "{}, sparse: {} allocated",
                human(self.size),
                human(self.allocated)
            )
        } else {
            human(self.size)
        }
    }
}

fn has_hole(layer: &Layer, n: &Node, size: u64) -> bool {
    let Ok(f) = sys::reopen(layer.proc_fd.as_fd(), n.fd.as_fd(), libc::O_RDONLY) else {
        return false;
    };
    matches!(sys::lseek(f.as_fd(), 0, libc::SEEK_HOLE), Ok(h) if (h as u64) < size)
}

/// Bytes for a person: `512 B`, `8 KiB`, `1.5 MiB`.
pub fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut i) = (b as f64, 0);
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// Adds `"size"` and `"allocated"` (bytes) and, with holes, `"sparse": true` to the
/// `--json` object `v` of `c` when its staged entry is a regular file worth showing
/// ([`Space::shown`]); nothing otherwise (so the objects of small files stay as they were).
pub fn add_json(v: &mut serde_json::Value, l: &Layers, c: &Change) {
    if c.dir || c.kind == Kind::Deleted {
        return;
    }
    let Ok(Some(n)) = l.upper.get(&c.path) else {
        return;
    };
    let Some(s) = Space::of(&l.upper, &n).filter(Space::shown) else {
        return;
    };
    v["size"] = s.size.into();
    v["allocated"] = s.allocated.into();
    if s.sparse {
        v["sparse"] = true.into();
    }
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn sizes_for_a_person() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(8192), "8 KiB");
        assert_eq!(human(3 << 19), "1.5 MiB");
        assert_eq!(human(512 << 20), "512 MiB");
    }
}
