//! Views of a staging area's layer stack: the view `status`/`diff`/`apply` compare
//! against (SOURCE, or with `--since N`/`--at N` the sealed layers 1..=N over SOURCE,
//! resolved in user space by [`Lower`]: no kernel overlay is mounted, so none of it needs
//! root), and the flattened staged tree they work on when checkpoints exist.
//!
//! Invariants: read-only on SOURCE and on the sealed layers; scratch trees live under
//! `DIR/scratch/` and are deleted when their [`Staged`] is dropped (and at the next
//! start after a crash).

use super::StageError;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::changes::Layers;
use super::lower::Lower;
use super::tree::Layer;
use super::{Area, layers, sys};

/// The view at checkpoint position `upto` (the first `upto` live layers over SOURCE; 0 is
/// SOURCE itself), resolved in user space ([`Lower`]: no mount, no root).
fn view(source: OwnedFd, ls: Vec<OwnedFd>, upto: usize) -> Result<Lower, StageError> {
    let mut below: Vec<OwnedFd> = ls.into_iter().take(upto).collect();
    below.reverse();
    Lower::stacked(below, source).map_err(StageError::Sys)
}

/// A scratch directory under `DIR/scratch`, deleted on drop.
pub(super) struct Scratch {
    area_dir: PathBuf,
    path: PathBuf,
}

impl Scratch {
    /// Where it is.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = remove(&self.area_dir, &self.path) {
            log::warn!("stage: removing {}: {e}", self.path.display());
        }
    }
}

fn remove(area_dir: &Path, p: &Path) -> Result<(), StageError> {
    if std::fs::symlink_metadata(p).is_err() {
        return Ok(());
    }
    let parent = p.parent().unwrap_or(area_dir);
    let d = crate::host::sys::open_root(parent).map_err(StageError::Sys)?;
    let layer = Layer::new(d).map_err(StageError::Sys)?;
    let n = crate::host::sys::Name::from_os(p.file_name().unwrap_or_default())
        .map_err(StageError::Sys)?;
    super::remove::remove_tree(&layer, layer.root.as_fd(), &n).map_err(StageError::Sys)
}

/// Drops every scratch tree (a crash may leave some).
pub fn clear_scratch(area: &Area) -> Result<(), StageError> {
    remove(&area.dir, &area.dir.join("scratch"))
}

fn scratch(area: &Area) -> Result<Scratch, StageError> {
    scratch_dir(&area.dir)
}

/// A scratch directory of the staging area `dir` (under `DIR/scratch`, on DIR's file
/// system), deleted on drop.
pub(super) fn scratch_dir(dir: &Path) -> Result<Scratch, StageError> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = dir.join("scratch");
    let mk = |p: &Path| {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(p)
            .map_err(StageError::io(p))
    };
    if std::fs::symlink_metadata(&base).is_err() {
        mk(&base)?;
        // Root working on a person's area (`fencefs stage ... --dir`) leaves `scratch`
        // theirs: else their own later commands could not make their scratch trees.
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::symlink_metadata(dir).map_err(StageError::io(dir))?;
        if owner.uid() != nix::unistd::geteuid().as_raw() {
            std::os::unix::fs::lchown(&base, Some(owner.uid()), Some(owner.gid()))
                .map_err(StageError::io(&base))?;
        }
    }
    let path = base.join(format!(
        "{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    mk(&path)?;
    let s = Scratch {
        area_dir: dir.to_path_buf(),
        path,
    };
    mk(&s.path.join("tree"))?;
    mk(&s.path.join("stash"))?;
    Ok(s)
}

fn open_layer(p: &Path) -> Result<Layer, StageError> {
    crate::host::sys::open_root(p)
        .and_then(Layer::new)
        .map_err(StageError::io(p))
}

/// The staged changes to compare: one staged tree over the view it applies to.
pub struct Staged {
    /// The staged tree (`upper`, or a flattened scratch copy) and the view below it.
    pub layers: Layers,
    /// With `--since`: the paths that are conflicts against SOURCE (a conflict is a host
    /// edit; the view at a checkpoint is not the host).
    conflicts: Option<std::collections::HashSet<Vec<u8>>>,
    _scratch: Option<Scratch>,
}

impl Staged {
    /// The changes concerning one of `paths` (all when empty), sorted.
    pub fn selected(&self, paths: &[Vec<u8>]) -> Result<Vec<super::changes::Change>, StageError> {
        let mut list = self.layers.selected(paths)?;
        if let Some(c) = &self.conflicts {
            for ch in &mut list {
                ch.conflict = c.contains(&ch.path);
            }
        }
        Ok(list)
    }
}

/// `status --json`'s objects for `list` (changes of `st`), each with its review id. Ids
/// are always against SOURCE, as `apply` checks them: with `--since` they are taken from
/// the whole staged state (a path the whole state does not change has none: `""`).
pub fn json_list(
    area: &Area,
    st: &Staged,
    list: &[super::changes::Change],
    since: Option<u64>,
) -> Result<Vec<serde_json::Value>, StageError> {
    let id_err = |e| StageError::op("review id")(e);
    let full = match since {
        Some(_) => Some(staged(area, None)?),
        None => None,
    };
    let whole = full.as_ref().unwrap_or(st);
    let all = match &full {
        Some(f) => f.selected(&[])?,
        None => Vec::new(),
    };
    list.iter()
        .map(|c| {
            let id = match &full {
                None => super::ids::id(&whole.layers, c).map_err(id_err)?,
                Some(_) => match all.iter().find(|a| a.path == c.path) {
                    Some(a) => super::ids::id(&whole.layers, a).map_err(id_err)?,
                    None => String::new(),
                },
            };
            Ok(super::render::json_in(&st.layers, c, &id))
        })
        .collect()
}

/// Where live checkpoint `n` is in `live`, or why it is not a live one.
fn position(area: &Area, live: &[u64], n: u64) -> Result<usize, StageError> {
    if let Some(i) = live.iter().position(|&c| c == n) {
        return Ok(i);
    }
    let ended = layers::log(&area.dir)?.iter().any(|c| c.n == n && c.ended);
    Err(if ended {
        format!("checkpoint {n} was ended by an apply or discard").into()
    } else {
        StageError::NoSuchCheckpoint(n)
    })
}

/// The staged state since checkpoint `since` (`None`: since SOURCE), as one staged tree
/// over the view at that checkpoint.
pub fn staged(area: &Area, since: Option<u64>) -> Result<Staged, StageError> {
    let live = layers::live(&area.dir)?;
    let base = match since {
        None => 0,
        Some(n) => position(area, &live, n)? + 1,
    };
    let source = super::open_source(area)?;
    let ls = layers::open_layers(&area.dir)?;
    let lower = view(source, ls, base)?;
    let up = || area.upper.try_clone().map_err(StageError::Sys);
    if base == live.len() {
        return Ok(Staged {
            layers: Layers {
                upper: Layer::new(up()?).map_err(StageError::Sys)?,
                lower,
            },
            conflicts: conflicts(area, base)?,
            _scratch: None,
        });
    }
    let s = scratch(area)?;
    let mut stack = Vec::new();
    for n in &live[base..] {
        stack.push(open_layer(&layers::layer_path(&area.dir, *n))?);
    }
    stack.push(Layer::new(up()?).map_err(StageError::Sys)?);
    let tree = open_layer(&s.path.join("tree"))?;
    let stash = open_layer(&s.path.join("stash"))?;
    super::flatten::flatten(&stack, &tree, &stash)
        .map_err(StageError::op("flattening the checkpoints"))?;
    Ok(Staged {
        layers: Layers { upper: tree, lower },
        conflicts: conflicts(area, base)?,
        _scratch: Some(s),
    })
}

/// `apply --at N`: each change checkpoint `n` sealed (layers 1..=N over SOURCE) that
/// concerns one of `paths` (all when empty), as a `PATH@ID` argument: what a diff at N
/// showed, which the apply then checks against the whole staged state.
pub fn sealed_args(area: &Area, n: u64, paths: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, StageError> {
    let live = layers::live(&area.dir)?;
    let i = position(area, &live, n)?;
    let source = super::open_source(area)?;
    let s = scratch(area)?;
    let mut stack = Vec::new();
    for c in &live[..=i] {
        stack.push(open_layer(&layers::layer_path(&area.dir, *c))?);
    }
    let tree = open_layer(&s.path.join("tree"))?;
    let stash = open_layer(&s.path.join("stash"))?;
    super::flatten::flatten(&stack, &tree, &stash)
        .map_err(StageError::op("flattening the checkpoints"))?;
    let l = Layers {
        upper: tree,
        lower: Lower::plain(Layer::new(source).map_err(StageError::Sys)?),
    };
    let id_err = |e| StageError::op("review id")(e);
    l.selected(paths)?
        .iter()
        .map(|c| {
            let id = super::ids::id(&l, c).map_err(id_err)?;
            Ok([c.path.as_slice(), b"@", id.as_bytes()].concat())
        })
        .collect()
}

/// For a view above SOURCE (`base` > 0): the conflicts of the whole stage.
fn conflicts(
    area: &Area,
    base: usize,
) -> Result<Option<std::collections::HashSet<Vec<u8>>>, StageError> {
    if base == 0 {
        return Ok(None);
    }
    let all = staged(area, None)?
        .layers
        .changes()
        .map_err(StageError::op("reading the staged tree"))?;
    Ok(Some(
        all.into_iter()
            .filter(|c| c.conflict)
            .map(|c| c.path)
            .collect(),
    ))
}

/// Flattens every layer and the upper into one staged tree that replaces them, ending
/// every checkpoint as a rewind target (what `apply` and `discard` start with). Nothing
/// to do without checkpoints. The caller holds the lock or has quiesced the mount.
pub fn squash(area: &Area) -> Result<bool, StageError> {
    let live = layers::live(&area.dir)?;
    if live.is_empty() {
        return Ok(false);
    }
    if layers::squash_trivial(&area.dir)? {
        return Ok(true);
    }
    let s = scratch(area)?;
    let next = layers::fresh_next(&area.dir)?;
    let mut stack = Vec::new();
    for n in &live {
        stack.push(open_layer(&layers::layer_path(&area.dir, *n))?);
    }
    stack.push(
        Layer::new(area.upper.try_clone().map_err(StageError::Sys)?).map_err(StageError::Sys)?,
    );
    let tree = open_layer(&next)?;
    let stash = open_layer(&s.path.join("stash"))?;
    super::flatten::flatten(&stack, &tree, &stash)
        .map_err(StageError::op("flattening the checkpoints"))?;
    layers::copy_root_attrs(&area.dir.join("upper"), &next)?;
    std::fs::File::open(&next)
        .and_then(|f| sys::syncfs(f.as_fd()))
        .map_err(StageError::op("syncfs"))?;
    layers::squash(&area.dir)?;
    layers::empty_trash(&area.dir)?;
    Ok(true)
}
