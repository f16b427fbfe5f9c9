//! The staging engine's entry: what the daemon (`start`, `recover`), the CLI
//! (`fencefs stage … --dir`) and the control socket (`{"cmd":"stage"}`) call to open an
//! area's layers, repair and recover it, count what a checkpoint records, apply or
//! discard, and record what was done in `DIR/audit.jsonl`.
//!
//! Invariants: the front-ends (`cli.rs`, `control.rs`) call the engine through here and
//! no engine file imports a front-end; a change runs with DIR's lock held or the mount's
//! requests quiesced (`control::Live::swap`); an interrupted operation is finished or
//! rolled back (`recover`, `layers::recover`, `intent::recover`) before any other runs;
//! a failure to record in `DIR/audit.jsonl` is logged, never a reason to undo the work.

use super::StageError;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};

use crate::host::union::Union;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::Area;
use super::apply::{self, Report};
use super::changes::{Change, Layers};
use super::render::quote;
use super::tree::Layer;
use super::view;
use super::{discard, ids, intent, layers as ckpt, partial};

/// Opens, validates and locks `dir` for a mount of `src` at `mnt` (canonical), then builds
/// the merged view the daemon serves: a [`Union`] (no mount, no root needed). The lock is
/// held for the daemon's lifetime (its descriptor stays open until the process exits,
/// whatever way it exits).
pub fn start_union(
    dir: &Path,
    src: &Path,
    mnt: &Path,
    source: &OwnedFd,
) -> Result<std::sync::Arc<Union>, StageError> {
    let area = prepare(dir, src, mnt, source)?;
    // New names a crash left under their temporary name (`#fencefs-new.PID.N`).
    if let Err(e) = crate::host::union::sweep_new_leftovers(area.upper.as_fd()) {
        log::warn!(
            "stage '{}': looking for leftovers of new names: {e}",
            dir.display()
        );
    }
    let u = union_of(&area, source)?;
    // What a crash left in DIR/work (outside the view): only the union's own temporary
    // entries, a directory only if it holds nothing but whiteouts.
    if let Err(e) = u.sweep_work_leftovers() {
        log::warn!(
            "stage '{}': looking for leftovers in the work directory: {e}",
            dir.display()
        );
    }
    started(area, src);
    Ok(std::sync::Arc::new(u))
}

/// The merged view of `area` over `source` as the daemon serves it: the upper, the live
/// layers (newest first), SOURCE; markers in the daemon's namespace (`trusted.` as root,
/// `user.` otherwise).
pub fn union_of(area: &Area, source: &OwnedFd) -> Result<Union, StageError> {
    let fail = |e: std::io::Error| StageError::io(&area.dir)(e);
    let open = |fd: &OwnedFd| {
        crate::host::sys::reopen(
            crate::host::sys::open_proc_self_fd()?.as_fd(),
            fd.as_fd(),
            libc::O_PATH,
        )
    };
    let mut layers = vec![open(&area.upper).map_err(fail)?];
    let mut sealed = ckpt::open_layers(&area.dir)?;
    sealed.reverse();
    layers.extend(sealed);
    layers.push(open(source).map_err(fail)?);
    let work = crate::host::sys::open_root(&area.work()).map_err(fail)?;
    Union::new(layers, work, crate::host::union::prefix())
        .map(|u| u.reading_records(super::record::since_of))
        .map_err(fail)
}

/// What every start does before the merged view is built: DIR created or opened,
/// locked, recovered, matched to SOURCE and repaired.
fn prepare(dir: &Path, src: &Path, mnt: &Path, source: &OwnedFd) -> Result<Area, StageError> {
    let mut area = Area::create_or_open(dir, src, mnt)?;
    area.lock()?;
    area.mark_current()?;
    let area = recover(area)?;
    area.match_root(source)?;
    let l = layers(&area)?;
    repair(&l)?;
    if let Some(what) = intent::recover(&area.dir, &l)? {
        log::warn!("stage '{}': {what}", area.dir.display());
    }
    drop(l);
    // What a killed background removal left in DIR/trash (the mount need not wait).
    ckpt::empty_trash_later(&area.dir, true);
    Ok(area)
}

/// What every start does once the merged view is built: says so, marks this daemon as
/// serving a staged mount, and keeps DIR's lock for the daemon's lifetime.
fn started(area: Area, src: &Path) {
    log::info!(
        "staging: every change lands in {} (SOURCE {} untouched until `fencefs stage apply`)",
        area.dir.display(),
        src.display()
    );
    super::set_active();
    // The lock lives exactly as long as the daemon.
    std::mem::forget(area);
}

/// Finishes what a crash interrupted (a checkpoint, rewind or squash: see
/// [`super::layers`]) and drops scratch trees; returns the area reopened (its `upper` may
/// have been replaced).
pub fn recover(area: Area) -> Result<Area, StageError> {
    view::clear_scratch(&area)?;
    match ckpt::recover(&area.dir)? {
        Some(what) => {
            log::warn!(
                "stage '{}': {what} (interrupted before)",
                area.dir.display()
            );
            area.reopen()
        }
        None => Ok(area),
    }
}

/// The layers of an area: its staged tree and the SOURCE it records.
pub fn layers(a: &Area) -> Result<Layers, StageError> {
    let src = super::open_source(a)?;
    let up = a.upper.try_clone().map_err(StageError::Sys)?;
    Ok(Layers {
        upper: Layer::new(up).map_err(StageError::Sys)?,
        lower: super::lower::Lower::plain(Layer::new(src).map_err(StageError::Sys)?),
    })
}

/// Repairs what an interrupted apply left (see [`Layers::repair`]), saying so.
pub fn repair(l: &Layers) -> Result<(), StageError> {
    for p in l
        .repair()
        .map_err(StageError::op("repairing the staged tree"))?
    {
        log::warn!(
            "stage: the rename of {} was already in SOURCE (an apply stopped midway): redirect dropped",
            quote(&p)
        );
    }
    Ok(())
}

/// Appends what an apply or discard did to `DIR/audit.jsonl` (one JSON line: time, op,
/// the operator's uid and pid, the paths asked for, each result line), synced. A failure
/// to record is logged, never a reason to undo the work.
fn record(area: &Area, op: &str, uid: u32, paths: &[Vec<u8>], report: &Report) {
    let extra = serde_json::json!({"results": report.lines, "refused": report.refused});
    record_line(area, op, uid, paths, &extra);
}

/// Appends one audit line to `DIR/audit.jsonl`: time, `op`, the operator's `uid`, this
/// process's pid, the paths, and `extra`'s fields.
pub fn record_line(area: &Area, op: &str, uid: u32, paths: &[Vec<u8>], extra: &serde_json::Value) {
    let mut line = serde_json::json!({
        "ts": crate::audit::timestamp(std::time::SystemTime::now()),
        "op": op,
        "uid": uid,
        "pid": std::process::id(),
        "paths": paths.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect::<Vec<_>>(),
    });
    if let (Some(m), Some(e)) = (line.as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    let path = area.dir.join("audit.jsonl");
    let res = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .and_then(|mut f| {
            writeln!(f, "{line}")?;
            f.sync_all()
        });
    if let Err(e) = res {
        log::warn!("{}: {e}", path.display());
    }
}

/// The paths changed since the last live checkpoint (since SOURCE when none): what a new
/// checkpoint records in the log. The view at the last checkpoint is resolved in user
/// space (`stage::lower`), so this is the same count as root's for an ordinary user.
pub fn count_since_last(area: &Area) -> Result<u64, StageError> {
    let last = ckpt::live(&area.dir)?.last().copied();
    let read = |e| StageError::op("reading the staged tree")(e);
    let st = view::staged(area, last)?;
    Ok(st.layers.changes().map_err(read)?.len() as u64)
}

/// The same for a checkpoint about to be taken: `None` (logged) when the count fails — a
/// tree the agent made too deep or too wide to compare never stops the operator's
/// checkpoints; the log then records no count (0).
///
/// Fault injection for tests/stage_live.rs: with `FENCEFS_FAULT_STAGE_COUNT` set in the
/// environment (a test hook) the count fails.
pub fn count_for_checkpoint(area: &Area) -> Option<u64> {
    let counted = if std::env::var_os("FENCEFS_FAULT_STAGE_COUNT").is_some() {
        Err(StageError::from(
            "fault injected (FENCEFS_FAULT_STAGE_COUNT)",
        ))
    } else {
        count_since_last(area)
    };
    counted
        .inspect_err(|e| log::warn!("stage: counting the changes for a checkpoint: {e}"))
        .ok()
}

/// What an apply is asked for besides its paths.
#[derive(Clone, Default)]
pub struct Opts {
    /// `--force`: conflicts too.
    pub force: bool,
    /// `--at N`: only what checkpoint N sealed.
    pub at: Option<u64>,
    /// `--note TEXT`: the reviewer's note, recorded with each decision for the agent
    /// (`DIR/feedback.jsonl`).
    pub note: Option<String>,
    /// The files (inodes in DIR) open for writing through the live mount: an apply
    /// leaves their paths staged (`stage/held.rs`).
    pub held: std::collections::HashSet<super::seal::Key>,
}

/// `apply` or `discard` of `paths` on the area `dir` (its lock held, or the mount
/// quiesced): checkpoints are squashed first (and so ended as rewind targets), then the
/// staged tree is worked on; recorded in `DIR/audit.jsonl` with the operator's `uid`.
pub fn apply_or_discard(
    dir: &std::path::Path,
    op: &str,
    ps: &[Vec<u8>],
    o: Opts,
    uid: u32,
) -> Result<Report, StageError> {
    let force = o.force;
    let area = Area::open(dir)?;
    if let Some(what) = ckpt::recover(&area.dir)? {
        log::warn!("stage: {what}");
    }
    let area = area.reopen()?;
    // `--at N`: what N sealed, as PATH@ID arguments, taken before the squash ends N.
    let (at_args, why);
    let ps = match o.at {
        Some(n) => {
            at_args = view::sealed_args(&area, n, ps)?;
            why = format!("changed after checkpoint {n}");
            if at_args.is_empty() {
                return Ok(Report::default());
            }
            &at_args[..]
        }
        None => {
            why = "changed since it was shown".to_string();
            ps
        }
    };
    let area = if view::squash(&area)? {
        area.reopen()?
    } else {
        area
    };
    let l = layers(&area)?;
    repair(&l)?;
    if let Some(what) = intent::recover(&area.dir, &l)? {
        log::warn!("stage: {what}");
    }
    // PATH#N[@ID]: those hunks only; every other argument as a path.
    // (`--at N` arguments are the sealed changes' own `PATH@ID`s: whole paths, whatever
    // their names.)
    let (hunk_args, plain) = match o.at {
        Some(_) => (Vec::new(), ps.to_vec()),
        None => split_hunks(ps),
    };
    let mut report = hunks(&l, &area.dir, op == "apply", &hunk_args, force)?;
    // PATH@ID: refused unless the change is still the one shown; none left: nothing to do.
    let (kept, refused) = ids::check(&l, &plain, &why);
    let only_hunks = !hunk_args.is_empty() && plain.is_empty();
    let mut before = Vec::new();
    if !only_hunks && (plain.is_empty() || !kept.is_empty()) {
        let (r, list) = whole(&l, &area.dir, op, kept, force, &o.held)?;
        merge(&mut report, r);
        before = list;
    }
    // What was carried out, for the agent's feedback (hunks: `fencefs review` writes its
    // own lines with their numbers).
    let ds = super::feedback::decided(&before, &report, op, o.note.as_deref());
    super::feedback::append(&area.dir, &ds);
    report.refused += refused.len();
    report.lines.splice(0..0, refused);
    record(
        &area,
        if op == "apply" {
            "stage-apply"
        } else {
            "stage-discard"
        },
        uid,
        ps,
        &report,
    );
    Ok(report)
}

/// Applies or discards the paths `kept` names (all when empty).
fn whole(
    l: &Layers,
    dir: &Path,
    op: &str,
    kept: Vec<ids::Kept>,
    force: bool,
    held: &std::collections::HashSet<super::seal::Key>,
) -> Result<(Report, Vec<Change>), StageError> {
    let listed = super::sys::coarse_now_ns();
    let list = l
        .changes()
        .map_err(StageError::op("reading the staged tree"))?;
    if op == "apply" {
        // A PATH@ID applies the change it names and nothing below it (`--at N`: a later
        // write below a directory N changed is not N's); a PATH, every rename of a cycle
        // it touches (a cycle named only in part by ids is refused: `cycles`).
        let list = super::cycles::pick(&list, &kept);
        // A file open for writing stays staged (its later writes would be lost).
        let (list, open) = super::held::keep_open(l, list, held);
        // The staged tree is dropped whole only when no file in it is open for writing:
        // a file copied up and not changed yet is no change, yet its writer's next bytes
        // go to its staged inode (dropped whole, they would be lost).
        let all = kept.is_empty() && held.is_empty();
        let mut r = apply::apply(l, &list, (force, all), dir, listed);
        r.refused += open.len();
        r.lines.extend(open);
        Ok((r, list))
    } else {
        // A directory's m or R id with changes below it is refused (it would take the
        // staged directory back whole, with agent work that id never showed).
        let part = super::cycles::part_by_ids(&list, &kept);
        let mut wide: Vec<String> = part.iter().map(|(_, line)| line.clone()).collect();
        let kept: Vec<Vec<u8>> = kept
            .into_iter()
            .filter(|k| !(k.exact && part.iter().any(|(p, _)| *p == k.path)))
            .filter(|k| match ids::too_wide_to_discard(k, &list) {
                Some(line) => {
                    wide.push(line);
                    false
                }
                None => true,
            })
            .map(|k| k.path)
            .collect();
        let mut r = if kept.is_empty() && !wide.is_empty() {
            Report::default()
        } else {
            discard::discard(l, &list, &kept)
        };
        r.refused += wide.len();
        r.lines.extend(wide);
        Ok((r, list))
    }
}

fn merge(into: &mut Report, r: Report) {
    into.lines.extend(r.lines);
    into.refused += r.refused;
}

/// The `PATH#N[,M…][@ID]` arguments of `ps` ([`partial::parse`]) and the others.
fn split_hunks(ps: &[Vec<u8>]) -> (Vec<partial::HunkArg>, Vec<Vec<u8>>) {
    let mut hunks = Vec::new();
    let mut rest = Vec::new();
    for p in ps {
        match partial::parse(p) {
            Some(h) => hunks.push(h),
            None => rest.push(p.clone()),
        }
    }
    (hunks, rest)
}

/// Applies or discards the hunks each of `args` names (every hunk of a path: that path
/// whole, as a plain PATH).
fn hunks(
    l: &Layers,
    dir: &Path,
    apply: bool,
    args: &[partial::HunkArg],
    force: bool,
) -> Result<Report, StageError> {
    let mut report = Report::default();
    for a in args {
        let listed = super::sys::coarse_now_ns();
        match partial::run(l, dir, apply, a, force) {
            partial::Outcome::Done(line) => report.lines.push(line),
            partial::Outcome::Refused(line) => {
                report.lines.push(line);
                report.refused += 1;
            }
            partial::Outcome::Whole(c) if apply => {
                merge(
                    &mut report,
                    apply::apply(l, &[*c], (force, false), dir, listed),
                );
            }
            partial::Outcome::Whole(c) => {
                let list = l
                    .changes()
                    .map_err(StageError::op("reading the staged tree"))?;
                merge(&mut report, discard::discard(l, &list, &[c.path]));
            }
        }
    }
    Ok(report)
}
