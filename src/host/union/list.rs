//! The listing of a merged directory: the names of each of its parts, top first, a name
//! counted once (the topmost shows), whiteouts hiding the name below them and never
//! listed themselves.
//!
//! Invariants: a listing is bounded by what its parts hold (no entry is made up); the
//! entry's inode number is the object's own in the layer that shows it.

use std::collections::HashSet;
use std::io;
use std::os::fd::AsFd;

use super::{Stack, Union};
use crate::host::sys::{self, DirEntry, Name};

/// A listed entry, with the layer that shows it.
pub type MergedEntry = (DirEntry, usize);

impl Union {
    /// The entries the merged directory `s` shows.
    pub fn read_dir(&self, s: &Stack) -> io::Result<Vec<DirEntry>> {
        Ok(self
            .read_dir_layers(s)?
            .into_iter()
            .map(|(e, _)| e)
            .collect())
    }

    /// The same, each with its layer.
    pub fn read_dir_layers(&self, s: &Stack) -> io::Result<Vec<MergedEntry>> {
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut out = Vec::new();
        let n = s.parts.len();
        for (i, p) in s.parts.iter().enumerate() {
            let d = sys::reopen_dir(self.proc_fd.as_fd(), p.fd.as_fd())?;
            for e in sys::read_dir(d.as_fd())? {
                if seen.contains(&e.name) {
                    continue;
                }
                // Only a character device or an empty regular file may be a whiteout.
                let maybe_whiteout = !self.is_source(p.layer)
                    && matches!(e.dtype, libc::DT_CHR | libc::DT_REG | libc::DT_UNKNOWN);
                if maybe_whiteout {
                    let name = Name::new(&e.name)?;
                    if self.entry_at(p.layer, p.fd.as_fd(), &name)? == Some(true) {
                        if i + 1 < n {
                            seen.insert(e.name);
                        }
                        continue;
                    }
                }
                if i + 1 < n {
                    seen.insert(e.name.clone());
                }
                out.push((e, p.layer));
            }
        }
        Ok(out)
    }
}
