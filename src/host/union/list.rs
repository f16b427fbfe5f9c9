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
        self.list_parts(s, None)
    }

    /// [`Union::read_dir`], and the oldest modification time of the whiteouts its parts
    /// hold (`None`: none) — when the earliest deletion in it was made, as a whiteout is
    /// dated (`staged.rs`).
    pub(super) fn read_dir_dated(&self, s: &Stack) -> io::Result<(Vec<DirEntry>, Option<i128>)> {
        let mut oldest = None;
        let entries = self.list_parts(s, Some(&mut oldest))?;
        Ok((entries.into_iter().map(|(e, _)| e).collect(), oldest))
    }

    fn list_parts(
        &self,
        s: &Stack,
        mut oldest: Option<&mut Option<i128>>,
    ) -> io::Result<Vec<MergedEntry>> {
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
                    if let Some((true, st)) = self.entry_stat(p.layer, p.fd.as_fd(), &name)? {
                        if let Some(o) = oldest.as_deref_mut() {
                            let t = super::staged::ns(st.st_mtime, st.st_mtime_nsec);
                            *o = Some(o.map_or(t, |x: i128| x.min(t)));
                        }
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
