//! Directories: opendir and the listing behind readdir / readdirplus.
//!
//! Invariants: a listing holds only the entries the caller may see (the same verdicts a
//! lookup would give; an entry of unknown type counts as a directory); it is read for the
//! caller of the first readdir and again on a rewind (offset 0), and kept in the handle
//! between; readdirplus answers each entry through the ordinary lookup.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use fuser::FileAttr;

use super::{Ctx, Error, Lookup, Res, Shared};
use crate::fs::attr;
use crate::host::handle::{Handle, ListEntry};
use crate::host::inode::ROOT;
use crate::host::path::join;
use crate::host::roots::Fence;
use crate::host::sys::Name;
use crate::policy::{Access, Need, Special};

impl Shared {
    /// opendir: `list`; the listing shows only what the caller may see.
    pub fn do_opendir(&self, ctx: &Ctx, ino: u64) -> Res<u64> {
        self.allow_ino(ctx, "opendir", ino, Need::List, Special::default())?;
        if self.inodes.kind(ino)? != libc::S_IFDIR {
            return Err(Error(libc::ENOTDIR));
        }
        let fd = self.inodes.fd(ino)?;
        let slots = self.handles.reserve(ctx.caller.uid, self.root_id(ino))?;
        // The listing is read by the first readdir (and again on rewind), for its caller,
        // through the node's handle kept here.
        Ok(self.handles.insert(Handle {
            ino,
            file: None,
            node: Some(fd),
            opener: (ctx.caller.uid, ctx.caller.gid),
            read: true,
            write: false,
            exec: false,
            fresh: false,
            append_only: false,
            entries: Some(parking_lot::Mutex::new(None)),
            slots,
            view: 0,
            kept: OnceLock::new(),
            pin: OnceLock::new(),
        }))
    }

    fn list(&self, ctx: &Ctx, ino: u64, node: Option<&Arc<OwnedFd>>) -> Res<Vec<ListEntry>> {
        let node = node.ok_or(Error(libc::EBADF))?;
        let dir = self.inodes.path(ino)?;
        let mut raw = self.inodes.list(ino, node.as_fd())?;
        let mut path = join(&dir, b"");
        let base = path.len();
        // A directory with a second name (`host/roots.rs`): entries hidden under it go too.
        let alias = self.inodes.roots().alias_of(&dir);
        // Names alike to the policy are decided once a listing (`policy/listing.rs`).
        let mut here = ctx.snap.policy.listing(ctx.caller);
        let mut there = ctx.snap.policy.listing(ctx.caller);
        raw.retain(|e| {
            // One buffer for every entry's path; DT_UNKNOWN counts as a directory.
            path.truncate(base);
            path.extend_from_slice(&e.name);
            let is_dir = e.dtype == libc::DT_DIR || e.dtype == libc::DT_UNKNOWN;
            here.visible(&path, is_dir)
                && alias
                    .as_ref()
                    .is_none_or(|a| there.visible(&join(a, &e.name), is_dir))
        });
        let ids = self.inodes.ids_for(raw.iter().map(|e| e.ino));
        let mut listing: Vec<ListEntry> = raw
            .into_iter()
            .zip(ids)
            .map(|(e, (ino, known))| ListEntry {
                ino,
                known,
                kind: attr::dtype_to_mode(e.dtype),
                name: e.name,
            })
            .collect();
        self.splice_roots(ctx, &dir, &mut listing);
        if ino == ROOT {
            self.notes.root_listing(ctx, &mut listing);
        }
        Ok(listing)
    }

    /// The roots' share of a listing of `dir`: a fenced-off entry is dropped, a root's
    /// point shows the root (whatever the host holds under that name), a hidden root's
    /// point is not listed.
    fn splice_roots(&self, ctx: &Ctx, dir: &[u8], out: &mut Vec<ListEntry>) {
        let roots = self.inodes.roots();
        if roots.is_empty() || !roots.may_change_listing(dir) {
            return;
        }
        out.retain(|e| {
            let path = join(dir, &e.name);
            roots.fence_at(&path) != Some(Fence::Hidden) && roots.at(&path).is_none()
        });
        for r in roots.listed_in(dir) {
            let name = r.path.rsplit(|&b| b == b'/').next().unwrap_or(&r.path);
            let visible = ctx
                .snap
                .policy
                .verdict_for(&r.path, ctx.caller, r.kind == libc::S_IFDIR)
                .effective
                != Access::None;
            if visible {
                let (ino, known) = self.inodes.ids_for(std::iter::once(r.key.1))[0];
                out.push(ListEntry {
                    ino,
                    kind: r.kind,
                    name: name.to_vec(),
                    known,
                });
            }
        }
    }

    /// The listing for a readdir at `offset` (0 re-reads the directory, like rewinddir).
    pub fn dir_entries(
        &self,
        ctx: &Ctx,
        fh: u64,
        offset: u64,
    ) -> Res<(Arc<Handle>, Arc<Vec<ListEntry>>)> {
        let h = self.handle(fh)?;
        let Some(entries) = &h.entries else {
            return Err(Error(libc::EBADF));
        };
        let mut cur = entries.lock();
        let listing = match &*cur {
            Some(l) if offset != 0 => l.clone(),
            _ => {
                let fresh = Arc::new(self.list(ctx, h.ino, h.node.as_ref())?);
                *cur = Some(fresh.clone());
                fresh
            }
        };
        drop(cur);
        Ok((h, listing))
    }

    /// Parent id of a directory node (for `..`).
    pub fn parent_ino(&self, ino: u64) -> u64 {
        self.inodes.alias(ino).map_or(ROOT, |(parent, _)| parent)
    }

    /// readdirplus: a lookup for one listed entry.
    pub fn plus_lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Res<FileAttr> {
        let name = Name::new(name)?;
        match self.do_lookup(ctx, parent, &name)? {
            Lookup::Found(a) => Ok(a),
            Lookup::Absent | Lookup::Hidden => Err(Error(libc::ENOENT)),
        }
    }
}
