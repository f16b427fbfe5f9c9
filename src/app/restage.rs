//! A staged mount's live changes (`fencefs stage checkpoint|rewind|apply|discard SOCKET`):
//! the daemon's side of [`crate::stage::control::Live`].
//!
//! One swap, in order: (1) the request gate closes and the requests in flight finish (at
//! most [`DRAIN`], else the change is refused and nothing happens); (2) the no-cache
//! window opens; (3) the change runs on DIR; (4) a new union (`host::union`) is built from
//! DIR as it is now and served: every node the kernel knows is re-found at its path in
//! the new view when next used (files open now keep their descriptors: real files of DIR
//! or SOURCE); (5) the gate opens; (6) the
//! kernel's names, attributes and cached pages are taken back (the same passes as a
//! policy reload) and the window closes. The command answers after (6): from then on
//! every process sees the new merged view. A checkpoint keeps every path's contents, so
//! it skips the window and (6) but for the names of the files open now, which the kernel
//! must look up again (a new open of one must not reach the old view's file: its writes
//! would land in the sealed layer).
//!
//! With the gate closed, before the change: the files open for writing are recorded (which
//! inode of DIR each write handle reaches) and the passthrough handles opened in the view
//! served are pinned to their files there. After it: if the change sealed the upper as a
//! layer (a checkpoint), those files move to the new upper and the layer keeps a copy
//! (`stage::seal`: a sealed layer never changes), before the new view is served.
//!
//! Invariants: one swap or reload at a time; a failed rebuild leaves the old view served
//! and says so, frozen (`Union::freeze`: EROFS for every change, reads served) until a
//! live change serves DIR again.
//!
//! Fault injection for tests/stage_live.rs: with `FENCEFS_FAULT_STAGE_REBUILD` set in the
//! daemon's environment every rebuild fails (after the change itself ran).

use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use crate::fs::ops::Shared;
use crate::stage::seal::{self, Writer};
use crate::stage::{Area, StageError, layers};

/// How long a swap waits for the requests in flight.
const DRAIN: Duration = Duration::from_secs(10);

pub(super) struct Restage {
    shared: Arc<Shared>,
    dir: PathBuf,
    /// The files open for writing, by handle, recorded at each swap (for the handles
    /// opened in the view served then: each one's inode in DIR and the path it was last
    /// seen at, `stage::seal`); dropped once closed or no longer staged.
    writers: Mutex<HashMap<u64, Writer>>,
}

impl Restage {
    pub(super) fn new(shared: Arc<Shared>, dir: PathBuf) -> Restage {
        Restage {
            shared,
            dir,
            writers: Mutex::new(HashMap::new()),
        }
    }

    /// Builds the merged view from DIR as it is now and serves it; returns the names of
    /// the files open now (they stay with the old view: the kernel must look those names
    /// up again).
    fn rebuild(&self) -> Result<Vec<(u64, Vec<u8>)>, String> {
        // Fault injection for tests/stage_live.rs (a test hook): the new view cannot be
        // built, so the union served is frozen.
        if std::env::var_os("FENCEFS_FAULT_STAGE_REBUILD").is_some() {
            return Err(
                "building the new view: fault injected (FENCEFS_FAULT_STAGE_REBUILD)".into(),
            );
        }
        let area = Area::open(&self.dir)?;
        let source = crate::stage::open_source(&area)?;
        area.match_root(&source)?;
        let s = &self.shared;
        if s.inodes.union().is_none() {
            return Err("this mount is not staged".into());
        }
        // A new union over DIR as it is now. Files open now keep their descriptors (real
        // files of DIR or SOURCE).
        let u = crate::stage::session::union_of(&area, &source)?;
        let keep = |id: u64, kind: u32| kind != libc::S_IFDIR && s.handles.any_on(id, |_| true);
        let kept = s
            .inodes
            .swap_union(Arc::new(u), &keep)
            .map_err(|e| format!("serving the new view: {e}"))?;
        s.handles.next_view();
        Ok(kept)
    }

    /// Records the files open for writing in the view served now (those of older views
    /// were recorded by the swaps before), and forgets the closed ones.
    fn record_writers(&self) {
        let s = &self.shared;
        let now = s.handles.view_now();
        let open = s.handles.writers();
        let fhs: HashSet<u64> = open.iter().map(|o| o.0).collect();
        let mut ws = self.writers.lock();
        ws.retain(|fh, _| fhs.contains(fh));
        let fresh: Vec<_> = open
            .into_iter()
            .filter(|&(fh, _, view)| view == now && !ws.contains_key(&fh))
            .collect();
        if fresh.is_empty() {
            return;
        }
        let Ok(area) = Area::open(&self.dir) else {
            return;
        };
        for (fh, ino, _) in fresh {
            // Unlinked through the mount (in no layer), or not the view's node.
            if s.inodes.alias(ino).is_none() || s.inodes.fd(ino).is_err() {
                continue;
            }
            let found = s
                .inodes
                .paths(ino)
                .unwrap_or_default()
                .into_iter()
                .find_map(|p| seal::upper_key(&area, &p).map(|key| Writer { key, hint: p }));
            if let Some(w) = found {
                ws.insert(fh, w);
            }
        }
    }

    /// Pins each passthrough handle opened in the view served now to its file there (see
    /// [`crate::host::handle::Handle::pin`]), while the budget has spare units.
    fn pin_passthrough(&self) {
        let s = &self.shared;
        for h in s.handles.unpinned_in(s.handles.view_now()) {
            let fd = s.inodes.fd(h.ino).and_then(|n| {
                crate::host::sys::reopen(s.inodes.proc_fd.as_fd(), n.as_fd(), libc::O_PATH)
            });
            if let Ok(fd) = fd
                && !h.pin_to(&s.handles.fds, fd)
            {
                break;
            }
        }
    }

    /// Keeps every sealed layer sealed from the files still open for writing: after a
    /// checkpoint sealed layer `sealed`, their inodes move to the new upper (a copy stays
    /// in the layer). Failures are logged (the checkpoint is made).
    fn keep_sealed(&self, sealed: Option<u64>) {
        let Some(n) = sealed else { return };
        let mut ws = self.writers.lock();
        let mut seen = HashSet::new();
        let keep: Vec<Writer> = ws
            .values()
            .filter(|r| seen.insert(r.key))
            .cloned()
            .collect();
        if keep.is_empty() {
            return;
        }
        match Area::open(&self.dir).and_then(|area| seal::unseal(&area, n, &keep)) {
            Ok(moved) => {
                // Found and moved: the path in the upper now; not found: in no layer.
                ws.retain(|_, r| moved.contains_key(&r.key));
                for r in ws.values_mut() {
                    if let Some(p) = moved.get(&r.key) {
                        r.hint = p.clone();
                    }
                }
                if !moved.is_empty() {
                    log::info!(
                        "stage: checkpoint {n}: {} files open for writing moved to the live layer (the checkpoint keeps a copy)",
                        moved.len()
                    );
                }
            }
            Err(e) => log::error!("{e}"),
        }
    }
}

impl Restage {
    /// `(parent, name)` of each path whose parent directory the kernel knows (a name under
    /// an unknown directory has no dentry to drop).
    fn known_parents(&self, paths: &[Vec<u8>]) -> Vec<(u64, Vec<u8>)> {
        let inodes = &self.shared.inodes;
        paths
            .iter()
            .filter_map(|p| {
                let (parent, name) = crate::stage::tree::split(p);
                let mut ino = crate::host::inode::ROOT;
                if !parent.is_empty() {
                    for part in parent.split(|&b| b == b'/') {
                        ino = inodes.child(ino, part)?;
                    }
                }
                Some((ino, name.to_vec()))
            })
            .collect()
    }
}

impl crate::stage::control::Live for Restage {
    fn writers(&self) -> HashSet<crate::stage::seal::Key> {
        self.writers.lock().values().map(|w| w.key).collect()
    }

    fn swap(
        &self,
        same_view: bool,
        change: &mut dyn FnMut() -> Result<Value, StageError>,
    ) -> Result<Value, StageError> {
        let mut swap = self.shared.kcache.swap();
        let started = Instant::now();
        let Some(gate) = self.shared.gate.as_ref() else {
            return Err("this mount has no request gate (not staged)".into());
        };
        if !gate.close(DRAIN) {
            return Err(format!(
                "requests stayed in flight for {} s (held in the kernel?); nothing was changed, try again",
                DRAIN.as_secs()
            )
            .into());
        }
        if !same_view {
            swap.open_window();
        }
        self.record_writers();
        self.pin_passthrough();
        let before = layers::live(&self.dir).unwrap_or_default();
        // Names the old view shows absent (the kernel may cache them so): told after.
        let absent = if same_view {
            Vec::new()
        } else {
            if let Some(b) = &self.shared.bases {
                b.forget_staged_reads();
            }
            crate::stage::absent::names(&self.dir)
        };
        let res = change();
        // Whatever the change did (or left half done: finished by recovery), serve DIR.
        let recovered = crate::stage::layers::recover(&self.dir);
        // A layer sealed now (a checkpoint): the files still open for writing leave it.
        let sealed = layers::live(&self.dir)
            .unwrap_or_default()
            .into_iter()
            .filter(|n| !before.contains(n))
            .max();
        self.keep_sealed(sealed);
        let rebuilt = recovered.and_then(|_| self.rebuild().map_err(StageError::from));
        if rebuilt.is_err() {
            // The view served may no longer be DIR's (its upper sealed as a checkpoint's
            // layer, or moved to the trash by a rewind): frozen before any request may
            // change it, so nothing lands in a sealed layer or a discarded upper.
            if let Some(u) = self.shared.inodes.union() {
                u.freeze();
            }
        }
        gate.open();
        if same_view && res.is_ok() && rebuilt.is_ok() {
            // The same contents at every path: what the kernel holds stays true.
            log::info!(
                "stage: merged view rebuilt in {:?} (same contents)",
                started.elapsed()
            );
            return res;
        }
        let first = swap.take_back(self.known_parents(&absent));
        let second = swap.finish(true);
        log::info!(
            "stage: merged view replaced in {:?} (kernel caches: {} names, {} inodes invalidated)",
            started.elapsed(),
            first.names,
            first.inodes + second.inodes
        );
        if let Err(e) = rebuilt {
            // Frozen above: it stays readable, and nothing changes through it until a live
            // change serves DIR again.
            log::error!("stage: {e}; the previous view is still served, read-only");
            return Err(format!("{e}; the previous view is still served, read-only").into());
        }
        res
    }
}
