//! Checkpoints on disk ("seal and stack"): `checkpoint` seals the live staged tree
//! `DIR/upper` as the read-only layer `DIR/layers/N` and opens an empty one; the merged
//! view is then `upper : layers/N : … : layers/1 : SOURCE` (the daemon's union), so a
//! checkpoint costs two renames, whatever the size of SOURCE or of the changes. `rewind N`
//! drops the upper and every layer above N; `squash` (run by `apply` and `discard`)
//! flattens every layer into one staged tree and ends the checkpoints as rewind targets.
//!
//! Layout: `DIR/layers/N/` (sealed layers), `DIR/checkpoints.json` (the log: one entry per
//! checkpoint, `ended` once an apply or discard squashed it), `DIR/intent` (the operation
//! in flight), `DIR/next/` (the tree that replaces `upper`), `DIR/trash/` (dropped layers,
//! deleted after the operation).
//!
//! Crash safety: `DIR/next` is prepared first; then the intent is written (synced); then
//! the renames; then the log; then the intent goes. [`recover`] (run before any mount,
//! command or live operation) finishes an operation whose intent exists and drops a
//! `DIR/next` without one, so a SIGKILL leaves the old state or the new one.
//!
//! Invariants: the caller holds the area's lock or quiesces the daemon's requests (no
//! overlay writes into `upper` while it is renamed); nothing outside DIR is touched.

use super::StageError;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::remove::sync_path;

/// At most this many live checkpoints (every layer costs each lookup a step; kernel
/// overlayfs, which reads DIR by hand, stacks at most 500).
pub const MAX_LAYERS: u64 = 100;

/// One checkpoint in the log.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Its number (1, 2, …; never reused).
    pub n: u64,
    /// When it was taken (RFC 3339, UTC).
    pub ts: String,
    /// The operator's message.
    #[serde(default)]
    pub message: String,
    /// The paths changed since the previous checkpoint.
    pub changes: u64,
    /// An apply or discard squashed it: no longer a rewind target.
    #[serde(default)]
    pub ended: bool,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Intent {
    Checkpoint {
        entry: Checkpoint,
    },
    Rewind {
        to: u64,
    },
    /// `from`: the squashed tree is the sealed layer N itself (every other layer and the
    /// upper empty), renamed to `DIR/next` by [`finish`]; absent: `DIR/next` was built.
    Squash {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<u64>,
    },
    /// An apply carried every staged path into SOURCE: the staged tree is replaced by
    /// the empty `DIR/next` (the old one goes to the trash whole).
    Drop,
}

fn err(p: &Path, e: impl std::fmt::Display) -> StageError {
    StageError::at(p, e)
}

fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

/// Writes `text` to `p` whole (beside, synced, renamed).
fn write_whole(p: &Path, text: &str) -> Result<(), StageError> {
    let tmp = p.with_extension("tmp");
    let mode = crate::private_file::FILE_MODE;
    crate::private_file::write_synced(&tmp, text.as_bytes(), mode, None)
        .map_err(StageError::io(&tmp))?;
    fs::rename(&tmp, p).map_err(StageError::io(p))?;
    let parent = p.parent().unwrap_or(Path::new("/"));
    sync_path(parent).map_err(StageError::io(parent))
}

fn mkdir(p: &Path) -> Result<(), StageError> {
    fs::DirBuilder::new()
        .mode(crate::private_file::DIR_MODE)
        .create(p)
        .map_err(StageError::io(p))
}

fn rename(a: &Path, b: &Path) -> Result<(), StageError> {
    fs::rename(a, b).map_err(|e| err(a, format!("rename to {}: {e}", b.display())))
}

fn log_path(a: &Path) -> PathBuf {
    a.join("checkpoints.json")
}

fn intent_path(a: &Path) -> PathBuf {
    a.join("intent")
}

/// `DIR/layers/N`.
pub fn layer_path(a: &Path, n: u64) -> PathBuf {
    a.join("layers").join(n.to_string())
}

/// `DIR/next`: the tree that replaces `upper` (prepared before the intent).
pub fn next_path(a: &Path) -> PathBuf {
    a.join("next")
}

/// The log, oldest first (empty when no checkpoint was ever taken).
pub fn log(a: &Path) -> Result<Vec<Checkpoint>, StageError> {
    let p = log_path(a);
    match fs::read_to_string(&p) {
        Ok(t) => serde_json::from_str(&t).map_err(|e| err(&p, format!("damaged: {e}"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StageError::io(&p)(e)),
    }
}

fn write_log(a: &Path, log: &[Checkpoint]) -> Result<(), StageError> {
    let text = serde_json::to_string_pretty(log).map_err(|e| StageError::Invalid(e.to_string()))?;
    write_whole(&log_path(a), &text)
}

/// The live checkpoints' numbers, oldest first, each checked to have its layer.
pub fn live(a: &Path) -> Result<Vec<u64>, StageError> {
    let mut out = Vec::new();
    for c in log(a)?.iter().filter(|c| !c.ended) {
        let p = layer_path(a, c.n);
        if !fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            return Err(err(
                &p,
                "damaged: checkpoint layer missing (or not a directory); nothing was changed",
            ));
        }
        out.push(c.n);
    }
    Ok(out)
}

/// Handles of the live layers, oldest first.
pub fn open_layers(a: &Path) -> Result<Vec<OwnedFd>, StageError> {
    live(a)?
        .into_iter()
        .map(|n| {
            let p = layer_path(a, n);
            crate::host::sys::open_root(&p).map_err(StageError::io(&p))
        })
        .collect()
}

fn trash(a: &Path, what: &Path) -> Result<(), StageError> {
    let t = a.join("trash");
    if !exists(&t) {
        mkdir(&t)?;
    }
    let mut i = 0u32;
    let name = what.file_name().unwrap_or_default().to_string_lossy();
    let dst = loop {
        let d = t.join(format!("{name}.{}.{i}", std::process::id()));
        if !exists(&d) {
            break d;
        }
        i += 1;
    };
    rename(what, &dst)
}

/// Deletes what the operations dropped (`DIR/trash`): cost grows with the dropped changes.
pub fn empty_trash(a: &Path) -> Result<(), StageError> {
    let t = a.join("trash");
    if !exists(&t) {
        return Ok(());
    }
    let root = crate::host::sys::open_root(a).map_err(StageError::io(a))?;
    let layer = super::tree::Layer::new(root).map_err(StageError::io(a))?;
    let n = crate::host::sys::Name::new(b"trash").map_err(StageError::io(&t))?;
    super::remove::remove_tree(&layer, layer.root.as_fd(), &n).map_err(StageError::io(&t))
}

/// Removes what is in `DIR/trash` now, entry by entry, leaving the directory (so that an
/// operation trashing something meanwhile never finds it gone): what runs in the
/// background after an apply, without DIR's lock. A concurrent removal of the same
/// entries (another one, or the recovery of a later command) is harmless: an entry
/// already gone is skipped. Only entries of the trash are touched.
pub fn empty_trash_entries(a: &Path) -> Result<usize, StageError> {
    let t = a.join("trash");
    if !exists(&t) {
        return Ok(0);
    }
    let root = crate::host::sys::open_root(&t).map_err(StageError::io(&t))?;
    let layer = super::tree::Layer::new(root).map_err(StageError::io(&t))?;
    let top = super::tree::Node::of(
        layer.root.try_clone().map_err(StageError::io(&t))?,
        crate::host::sys::fstat(layer.root.as_fd()).map_err(StageError::io(&t))?,
    );
    let names = layer.list(&top).map_err(StageError::io(&t))?;
    for n in &names {
        let n = crate::host::sys::Name::new(n).map_err(StageError::io(&t))?;
        super::remove::remove_tree(&layer, layer.root.as_fd(), &n).map_err(StageError::io(&t))?;
    }
    Ok(names.len())
}

/// Starts removing the trash's entries ([`empty_trash_entries`]) in the background, after
/// the command answered: in the daemon (`in_daemon`) on one thread at most (a request while
/// it runs asks it for another pass); in
/// a `--dir` command a child process (`fencefs stage empty-trash --dir DIR`, not waited
/// for) so that the command exits at once. What a crash or a kill leaves there is removed
/// by the next one, or at the next daemon start.
pub fn empty_trash_later(a: &Path, in_daemon: bool) {
    // At most one removal thread: a request while it runs asks it for one more pass.
    static RUNNING: AtomicBool = AtomicBool::new(false);
    static AGAIN: AtomicBool = AtomicBool::new(false);
    let full = fs::read_dir(a.join("trash")).is_ok_and(|mut d| d.next().is_some());
    if !full {
        return;
    }
    let a = a.to_path_buf();
    if in_daemon {
        AGAIN.store(true, Ordering::SeqCst);
        if RUNNING.swap(true, Ordering::SeqCst) {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("fencefs-trash".into())
            .spawn(move || {
                loop {
                    while AGAIN.swap(false, Ordering::SeqCst) {
                        if let Err(e) = empty_trash_entries(&a) {
                            log::warn!("stage: emptying the trash: {e}");
                        }
                    }
                    RUNNING.store(false, Ordering::SeqCst);
                    // A request between the last pass and the store above found RUNNING
                    // set and left its pass to this thread: take it back if nobody did.
                    if !AGAIN.load(Ordering::SeqCst) || RUNNING.swap(true, Ordering::SeqCst) {
                        break;
                    }
                }
            });
        if let Err(e) = spawned {
            RUNNING.store(false, Ordering::SeqCst);
            log::warn!("stage: emptying the trash: {e}");
        }
        return;
    }
    let spawned = std::env::current_exe().and_then(|exe| {
        crate::host::sys::private_umask(&mut std::process::Command::new(exe))
            .args(["stage", "empty-trash", "--dir"])
            .arg(&a)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
    });
    if let Err(e) = spawned {
        log::warn!("stage: emptying the trash in the background: {e}; now instead");
        let _ = empty_trash_entries(&a);
    }
}

/// Replaces the staged tree by an empty one, once an apply carried every staged path into
/// SOURCE (and made that durable): one rename of the old tree into `DIR/trash`, so its
/// removal ([`empty_trash_entries`]) can run after the command answered. Crash-safe as a
/// rewind: the intent is written first and recovery finishes it. Refused (nothing done)
/// while checkpoint layers exist (an apply squashes them first).
pub fn drop_upper(a: &Path) -> Result<(), StageError> {
    if !live(a)?.is_empty() {
        return Err(err(a, "checkpoint layers exist"));
    }
    let next = fresh_next(a)?;
    copy_root_attrs(&a.join("upper"), &next)?;
    run(a, Intent::Drop)
}

/// A fresh, empty `DIR/next` (any leftover one, never named by an intent, goes first).
pub fn fresh_next(a: &Path) -> Result<PathBuf, StageError> {
    let next = next_path(a);
    if exists(&next) {
        trash(a, &next)?;
    }
    mkdir(&next)?;
    Ok(next)
}

fn write_intent(a: &Path, i: &Intent) -> Result<(), StageError> {
    write_whole(
        &intent_path(a),
        &serde_json::to_string(i).map_err(|e| StageError::Invalid(e.to_string()))?,
    )
}

/// Replaces `upper` by `next` (the old one goes to `to`, or the trash): idempotent.
fn swap_upper(a: &Path, to: Option<&Path>) -> Result<(), StageError> {
    let (up, next) = (a.join("upper"), next_path(a));
    if exists(&next) {
        if exists(&up) {
            match to {
                Some(t) if !exists(t) => rename(&up, t)?,
                _ => trash(a, &up)?,
            }
        }
        rename(&next, &up)?;
    }
    Ok(())
}

/// Finishes the operation a crash interrupted (its intent exists), or drops a `DIR/next`
/// that no intent names. Returns what it did, for the log.
pub fn recover(a: &Path) -> Result<Option<String>, StageError> {
    let ip = intent_path(a);
    let text = match fs::read_to_string(&ip) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if exists(&next_path(a)) {
                trash(a, &next_path(a))?;
                empty_trash(a)?;
                return Ok(Some("dropped an unfinished DIR/next".into()));
            }
            return Ok(None);
        }
        Err(e) => return Err(StageError::io(&ip)(e)),
    };
    let intent: Intent =
        serde_json::from_str(&text).map_err(|e| err(&ip, format!("damaged: {e}")))?;
    let what = finish(a, &intent)?;
    fs::remove_file(&ip).map_err(StageError::io(&ip))?;
    sync_path(a).map_err(StageError::io(a))?;
    empty_trash(a)?;
    Ok(Some(what))
}

fn finish(a: &Path, intent: &Intent) -> Result<String, StageError> {
    let mut log = log(a)?;
    match intent {
        Intent::Checkpoint { entry } => {
            let layers = a.join("layers");
            if !exists(&layers) {
                mkdir(&layers)?;
            }
            swap_upper(a, Some(&layer_path(a, entry.n)))?;
            if !log.iter().any(|c| c.n == entry.n) {
                log.push(entry.clone());
                write_log(a, &log)?;
            }
            Ok(format!("checkpoint {} finished", entry.n))
        }
        Intent::Rewind { to } => {
            swap_upper(a, None)?;
            for c in log.iter().filter(|c| c.n > *to) {
                let p = layer_path(a, c.n);
                if exists(&p) {
                    trash(a, &p)?;
                }
            }
            log.retain(|c| c.n <= *to);
            write_log(a, &log)?;
            Ok(format!("rewind to {to} finished"))
        }
        Intent::Drop => {
            swap_upper(a, None)?;
            Ok("the applied staged tree dropped".into())
        }
        Intent::Squash { from } => {
            // Layer N becomes the tree that replaces the upper (with the upper's root
            // owner and mode); an interrupted run finds it renamed already, or swapped.
            if let Some(n) = from {
                let p = layer_path(a, *n);
                if exists(&p) && !exists(&next_path(a)) {
                    copy_root_attrs(&a.join("upper"), &p)?;
                    rename(&p, &next_path(a))?;
                }
            }
            swap_upper(a, None)?;
            for c in log.iter_mut() {
                let p = layer_path(a, c.n);
                if exists(&p) {
                    trash(a, &p)?;
                }
                c.ended = true;
            }
            write_log(a, &log)?;
            Ok("squash finished".into())
        }
    }
}

fn run(a: &Path, intent: Intent) -> Result<(), StageError> {
    write_intent(a, &intent)?;
    finish(a, &intent)?;
    fs::remove_file(intent_path(a)).map_err(StageError::io(&intent_path(a)))?;
    sync_path(a).map_err(StageError::io(a))
}

/// Seals `upper` as checkpoint N (`changes`: the paths it changed) and opens an empty
/// one. The caller prepared nothing; no write may reach `upper` meanwhile.
pub fn checkpoint(a: &Path, message: &str, changes: u64) -> Result<Checkpoint, StageError> {
    let log = log(a)?;
    if live(a)?.len() as u64 >= MAX_LAYERS {
        return Err(StageError::TooManyLayers(MAX_LAYERS));
    }
    let n = log.iter().map(|c| c.n).max().unwrap_or(0) + 1;
    let entry = Checkpoint {
        n,
        ts: crate::audit::timestamp(std::time::SystemTime::now()),
        message: message.to_string(),
        changes,
        ended: false,
    };
    let next = fresh_next(a)?;
    copy_root_attrs(&a.join("upper"), &next)?;
    run(
        a,
        Intent::Checkpoint {
            entry: entry.clone(),
        },
    )?;
    Ok(entry)
}

/// Makes the staged state what it was at checkpoint `to`: the upper and every layer above
/// it are dropped (moved to the trash; the caller empties it).
pub fn rewind(a: &Path, to: u64) -> Result<(), StageError> {
    let log = log(a)?;
    match log.iter().find(|c| c.n == to) {
        None => {
            return Err(StageError::NoSuchCheckpoint(to));
        }
        Some(c) if c.ended => {
            return Err(StageError::Ended(to));
        }
        Some(_) => {}
    }
    live(a)?;
    let next = fresh_next(a)?;
    copy_root_attrs(&a.join("upper"), &next)?;
    run(a, Intent::Rewind { to })
}

/// Replaces the whole stack by `DIR/next` (a flattened tree the caller built there) and
/// ends every checkpoint as a rewind target.
pub fn squash(a: &Path) -> Result<(), StageError> {
    run(a, Intent::Squash { from: None })
}

/// Squashes without flattening when at most one of the upper and the live layers holds
/// anything (the usual case: a turn ended with a checkpoint, then `apply`): that one is
/// already the squashed tree, so the squash is a few renames whatever the number of
/// staged paths. Returns false (nothing done) when a flatten is needed.
pub fn squash_trivial(a: &Path) -> Result<bool, StageError> {
    let empty = |p: &Path| {
        fs::read_dir(p)
            .map(|mut d| d.next().is_none())
            .map_err(StageError::io(p))
    };
    let live = live(a)?;
    if live.is_empty() {
        return Ok(false);
    }
    let mut full = Vec::new();
    for n in &live {
        if !empty(&layer_path(a, *n))? {
            full.push(*n);
        }
    }
    let upper_full = !empty(&a.join("upper"))?;
    let from = match (full.as_slice(), upper_full) {
        ([], _) => None,
        ([n], false) => Some(*n),
        _ => return Ok(false),
    };
    if exists(&next_path(a)) {
        trash(a, &next_path(a))?;
    }
    run(a, Intent::Squash { from })?;
    empty_trash(a)?;
    Ok(true)
}

/// The new upper root gets the old one's owner and mode (the overlay shows them for the
/// mount's root).
pub fn copy_root_attrs(from: &Path, to: &Path) -> Result<(), StageError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let md = fs::metadata(from).map_err(StageError::io(from))?;
    std::os::unix::fs::chown(to, Some(md.uid()), Some(md.gid())).map_err(StageError::io(to))?;
    fs::set_permissions(to, fs::Permissions::from_mode(md.mode() & 0o7777))
        .map_err(StageError::io(to))
}
