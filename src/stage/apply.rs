//! `stage apply` on a staging area no daemon serves (or whose daemon is quiesced).
//!
//! Apply carries each change into SOURCE, then unstages it (removes its staged entry), in
//! an order that never loses data: renamed directories first (a rename is applied whole),
//! then renamed files, then additions and modifications, deletions last. A cycle of file
//! renames (`cycles.rs`) is written with the modifications, each path's staged file
//! over SOURCE's, or refused whole. Every file is written beside its
//! destination (`.NAME.fencefs-apply-PID`) with the staged mode, owner, xattrs and times
//! (its data extents only, holes left holes; a later name of a staged file with several
//! names made as a hard link of the SOURCE file written for its first: `copy.rs`),
//! and renamed over it; a new directory is built whole under a temporary name and renamed
//! into place. Durability is batched, [`BATCH`] paths at a time: every temporary entry of
//! the batch is written, then one `syncfs` of SOURCE's file system makes them durable,
//! then the renames, then a second `syncfs` (the renames), and only then are the staged
//! entries dropped (one `syncfs` of DIR's file system); an apply of every staged path
//! that refuses none keeps them all until the end and then replaces the whole staged tree
//! in one step ([`super::layers::drop_upper`]; removed in the background after the
//! command answered). Before the first temporary entry
//! exists, the intent log (`intent.rs`) names every path; recovery removes what a
//! crash left beside them. So a crash (SIGKILL, or power loss on a file system that keeps
//! `syncfs` order) leaves each path applied (its staged entry then equals SOURCE: no
//! change) or still staged, never a half-written file or a temporary entry in SOURCE.
//!
//! Invariants: SOURCE is reached only through directory handles walked without following
//! symlinks (a path whose SOURCE parent is not a directory is refused and stays staged);
//! a conflict is refused unless `force`; a staged entry under an opaque directory is kept
//! after apply (removing it would un-hide what the directory hides); a refused path leaves
//! no temporary entry behind; at most [`BATCH`] directory handles are held at once.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::changes::{Change, Kind, Layers};
use super::copy::Links;
use super::intent;
use super::remove::{drop_staged, remove_tree, sync_dir, unstage_path};
use super::render::{quote, status_line};
use super::standin;
use super::sys::file;
use super::tree::{Layer, Node, kind, split};
use super::walk::{Event, Flow, walk};
use crate::host::sys::{self, Name, SetTime};

/// Paths written (or deleted) between two `syncfs` of SOURCE: bounds the directory
/// handles held and the temporary entries in flight.
pub const BATCH: usize = 1024;

/// What apply or discard did, as printed lines.
#[derive(Default)]
pub struct Report {
    /// `applied …` / `refused …: why` lines.
    pub lines: Vec<String>,
    /// How many paths were refused.
    pub refused: usize,
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

/// Directory renames first (shallowest first), then file renames, then writes, then
/// deletions (deepest first).
fn rank(c: &Change) -> u8 {
    match c.kind {
        Kind::Renamed { .. } if c.dir => 0,
        Kind::Renamed { .. } => 1,
        Kind::Deleted => 3,
        _ => 2,
    }
}

/// The result lines of an apply, in the order the changes were taken.
struct Lines {
    lines: Vec<(String, bool)>,
}

impl Lines {
    fn applied(&mut self, line: &str) {
        self.lines.push((format!("applied {line}"), false));
    }
    fn refused(&mut self, line: &str, why: impl std::fmt::Display) {
        self.lines.push((format!("refused {line}: {why}"), true));
    }
}

/// Applies `list` (changes of `l`) to SOURCE; `dir` is the staging area (its intent log).
/// `all`: `list` is every staged change (no PATH was given), so when none is refused the
/// staged tree is dropped whole at the end (`unstage_all`) instead of path by path.
/// `listed`: when `list` was taken (a host change below a directory it deletes made since
/// refuses that deletion: `guard::below_changed`).
pub fn apply(
    l: &Layers,
    list: &[Change],
    (force, all): (bool, bool),
    dir: &Path,
    listed: i128,
) -> Report {
    let mut since = super::guard::Since::new(listed);
    let mut out = Lines { lines: Vec::new() };
    let mut order: Vec<&Change> = list.iter().collect();
    // Renames shallowest first; deletions deepest first.
    order.sort_by(|a, b| {
        rank(a).cmp(&rank(b)).then_with(|| {
            if rank(a) == 3 {
                b.path.cmp(&a.path)
            } else {
                a.path.cmp(&b.path)
            }
        })
    });
    // Cycles of file renames go after the other renames, whole ([`super::cycles`]).
    let (cycle, order): (Vec<&Change>, Vec<&Change>) =
        order.into_iter().partition(|c| super::cycles::member(c));
    // Renames refused: what lies below them stays staged too.
    let mut refused_renames: Vec<&Change> = Vec::new();
    // Renames applied so far (SOURCE path, new path): a rename inside a renamed directory
    // names its SOURCE path as it was before the outer one.
    let mut moved: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut rest: Vec<Change> = Vec::new();
    // SOURCE files moved into a new directory refused below: their deletions stay staged.
    let kept_in_new = super::moved_in::KeptInNew::of(l, &order);
    for c in order {
        let line = status_line(c);
        if c.conflict && !force {
            out.refused(&line, CONFLICT);
            if matches!(c.kind, Kind::Renamed { .. }) {
                refused_renames.push(c);
            }
            continue;
        }
        if refused_renames.iter().any(|x| depends_on(c, x)) {
            out.refused(&line, "its directory's rename was refused");
            continue;
        }
        if let Some(q) = kept_in_new.holds(c) {
            out.refused(
                &line,
                format!(
                    "moved into {}/, a new directory kept staged: kept staged",
                    String::from_utf8_lossy(q)
                ),
            );
            continue;
        }
        if let Some(from) = kept_in_new.refused(c) {
            out.refused(
                &line,
                format!(
                    "it holds SOURCE's {}/, moved into it, which a new directory (copied whole) cannot carry: kept staged",
                    String::from_utf8_lossy(from)
                ),
            );
            continue;
        }
        let Kind::Renamed { from } = &c.kind else {
            rest.push(c.clone());
            continue;
        };
        let from = match moved
            .iter()
            .find(|(f, _)| from.starts_with(f) && from.get(f.len()) == Some(&b'/'))
        {
            Some((f, t)) => [t.as_slice(), &from[f.len()..]].concat(),
            None => from.clone(),
        };
        if !c.dir {
            match super::moves::apply(l, c, &from) {
                Ok(left) => {
                    since.moved_out_of(l, &from);
                    out.applied(&line);
                    rest.extend(left);
                }
                Err(e) => {
                    out.refused(&line, e);
                    refused_renames.push(c);
                }
            }
            continue;
        }
        match rename_one(l, c, &from) {
            Ok(()) => {
                since.moved_out_of(l, &from);
                moved.push((from, c.path.clone()));
                out.applied(&line);
            }
            Err(e) => {
                out.refused(&line, e);
                refused_renames.push(c);
            }
        }
    }
    cycles(&cycle, force, &mut refused_renames, &mut out, &mut rest);
    if !rest.is_empty() {
        let paths: Vec<&[u8]> = rest.iter().map(|c| c.path.as_slice()).collect();
        match intent::write(dir, &paths) {
            Ok(()) => {
                let (dels, writes): (Vec<&Change>, Vec<&Change>) =
                    rest.iter().partition(|c| c.kind == Kind::Deleted);
                let mut pending = all.then(|| Pending {
                    done: Vec::new(),
                    stand_ins: false,
                });
                let mut links = Links::default();
                for chunk in writes.chunks(BATCH) {
                    write_batch(l, chunk, &mut out, (pending.as_mut(), &since), &mut links);
                }
                for chunk in dels.chunks(BATCH) {
                    delete_batch(l, chunk, &mut out, pending.as_mut(), &since);
                }
                if let Some(p) = pending {
                    unstage_all(l, dir, p, &mut out);
                }
                if let Err(e) = intent::clear(dir) {
                    out.lines.push((format!("refused: {e}"), true));
                }
            }
            Err(e) => {
                for c in &rest {
                    out.refused(&status_line(c), &e);
                }
            }
        }
    }
    Report {
        refused: out.lines.iter().filter(|(_, r)| *r).count(),
        lines: out.lines.into_iter().map(|(s, _)| s).collect(),
    }
}

const CONFLICT: &str =
    "conflict (SOURCE changed after it was staged; --force applies the staged version)";

/// The renames of cycles in `list` ([`super::cycles`]): each cycle goes on to `rest` as
/// the files it writes (each over its path's SOURCE file, checked against the object its
/// [`Change::replaces`] names; listed by its rename), or is refused whole — a conflict of
/// one of its renames (without `force`), a rename it depends on refused, or only part of
/// it in `list`.
fn cycles<'a>(
    list: &[&'a Change],
    force: bool,
    refused: &mut Vec<&'a Change>,
    out: &mut Lines,
    rest: &mut Vec<Change>,
) {
    let (whole, part) = super::cycles::cycles_in(list);
    for c in part {
        out.refused(
            &status_line(c),
            "part of a cycle of renames: apply all of its paths together",
        );
        refused.push(c);
    }
    for cyc in whole {
        let why: Vec<Option<&str>> = cyc
            .iter()
            .map(|c| {
                if c.conflict && !force {
                    Some(CONFLICT)
                } else if refused.iter().any(|x| depends_on(c, x)) {
                    Some("its directory's rename was refused")
                } else {
                    None
                }
            })
            .collect();
        if why.iter().all(Option::is_none) {
            rest.extend(cyc.iter().map(|c| Change {
                lower_st: c.replaces,
                ..(*c).clone()
            }));
            continue;
        }
        for (c, w) in cyc.iter().zip(why) {
            out.refused(
                &status_line(c),
                w.unwrap_or("another rename of its cycle was refused"),
            );
        }
        refused.extend(cyc);
    }
}

/// `a` is `b` or below it.
fn under(a: &[u8], b: &[u8]) -> bool {
    a == b || (a.starts_with(b) && a.get(b.len()) == Some(&b'/'))
}

/// Whether change `c` depends on the refused rename `r`: it lies below the rename's new
/// path, or at or below its old one (the directory's SOURCE contents are still there and
/// whatever stands at the old path now is staged over them), or it is itself a rename
/// out of either. Such a change stays staged, at both paths, so nothing the rename would
/// have carried is deleted or overwritten.
fn depends_on(c: &Change, r: &Change) -> bool {
    let Kind::Renamed { from: rf } = &r.kind else {
        return false;
    };
    let below_new = c.path.starts_with(&r.path) && c.path.get(r.path.len()) == Some(&b'/');
    let from_dep =
        matches!(&c.kind, Kind::Renamed { from } if under(from, rf) || under(from, &r.path));
    below_new || under(&c.path, rf) || from_dep
}

/// The SOURCE directory `path`, walked without following symlinks.
fn lower_dir(l: &Layers, path: &[u8]) -> io::Result<OwnedFd> {
    match l.lower.dir(path)? {
        Some(n) => Ok(n.fd),
        None => Err(io::Error::other(format!(
            "SOURCE parent '{}' is not a directory",
            quote(path)
        ))),
    }
}

fn name(n: &[u8]) -> io::Result<Name> {
    Name::new(n)
}

fn tmp_name(n: &[u8], what: &str) -> io::Result<Name> {
    intent::tmp_name(n, what, std::process::id())
}

/// One `syncfs` of the file system holding `layer`.
fn sync_fs(layer: &Layer) -> io::Result<()> {
    let f = sys::reopen(
        layer.proc_fd.as_fd(),
        layer.root.as_fd(),
        libc::O_RDONLY | libc::O_DIRECTORY,
    )?;
    super::sys::syncfs(f.as_fd())
}

/// A renamed directory (`from`: its SOURCE path now): moved whole, synced at once.
fn rename_one(l: &Layers, c: &Change, from: &[u8]) -> io::Result<()> {
    let (parent, last) = split(&c.path);
    let (fp, fl) = split(from);
    let src = lower_dir(l, fp)?;
    let dst = lower_dir(l, parent)?;
    sys::renameat2(
        src.as_fd(),
        &name(fl)?,
        dst.as_fd(),
        &name(last)?,
        libc::RENAME_NOREPLACE,
    )?;
    sync_dir(l.lower.source(), dst.as_fd())?;
    sync_dir(l.lower.source(), src.as_fd())?;
    // The staged directory now sits over its own SOURCE path: no redirect, and the
    // whiteout over the old name goes.
    if let Some(u) = l.upper.get(&c.path)? {
        super::tree::remove_marker(u.fd.as_fd(), b"redirect");
    }
    // The whiteout over the old name goes; anything else made there since (`mv d d2;
    // mkdir d`) is a change of its own, applied on its own, and stays staged.
    match l.upper.get(from)? {
        Some(o) if l.upper.is_whiteout(&o) => unstage_path(&l.upper, from),
        _ => Ok(()),
    }
}

/// A change of a batch, its SOURCE side done or prepared.
struct Ready<'a> {
    c: &'a Change,
    dir: OwnedFd,
    /// The temporary entry to rename over the path (`None`: done in place).
    tmp: Option<Name>,
    /// The staged entry is a stand-in for a character device 0/0 ([`standin`]): its
    /// staged entry must stay after the apply, so the staged tree is not dropped whole.
    stand_in: bool,
}

/// The changes an apply of everything carried into SOURCE, their staged entries kept
/// until the end ([`unstage_all`]).
struct Pending<'a> {
    done: Vec<&'a Change>,
    /// One of them is a stand-in that must stay staged ([`Ready::stand_in`]).
    stand_ins: bool,
}

/// Writes every change of `chunk` beside its destination, one `syncfs`, renames them
/// over their destinations, then ([`finish`]) one `syncfs` and drops their staged
/// entries — or, with `pending`, leaves that to the end of the apply ([`unstage_all`]).
fn write_batch<'a>(
    l: &Layers,
    chunk: &[&'a Change],
    out: &mut Lines,
    (pending, since): (Option<&mut Pending<'a>>, &super::guard::Since),
    links: &mut Links,
) {
    let mut ready = Vec::new();
    for &c in chunk {
        match prepare(l, c, links) {
            Ok(r) => ready.push(r),
            Err(e) => out.refused(&status_line(c), e),
        }
    }
    if let Err(e) = sync_fs(l.lower.source()) {
        for r in ready {
            drop_tmp(l, &r);
            out.refused(&status_line(r.c), format!("syncfs of SOURCE: {e}"));
        }
        return;
    }
    let mut placed = Vec::new();
    for r in ready {
        match place(l, &r, since) {
            Ok(()) => placed.push(r),
            Err(e) => {
                drop_tmp(l, &r);
                out.refused(&status_line(r.c), e);
            }
        }
    }
    match pending {
        Some(p) => {
            p.stand_ins |= placed.iter().any(|r| r.stand_in);
            p.done.extend(placed.iter().map(|r| r.c));
        }
        None => finish(l, placed.iter().map(|r| r.c), out),
    }
}

/// The end of an apply of every staged path (`done`: the ones carried into SOURCE, their
/// staged entries still there): when nothing was refused, one `syncfs` of SOURCE makes
/// them durable and the staged tree is replaced by an empty one in one step
/// ([`super::layers::drop_upper`]: its removal runs after the command answers) — every
/// staged entry then is one of them, or equal to SOURCE, or below a directory whose whole
/// contents were applied. Otherwise — something refused, a stand-in among them (it must
/// stay staged), or the drop failing — each is unstaged as a batch's are ([`finish`]). A crash before the drop leaves them staged and equal to SOURCE, and
/// recovery unstages them ([`super::intent`]).
fn unstage_all(l: &Layers, dir: &Path, p: Pending<'_>, out: &mut Lines) {
    let done = p.done;
    if done.is_empty() || p.stand_ins || out.lines.iter().any(|(_, refused)| *refused) {
        return finish(l, done.into_iter(), out);
    }
    if let Err(e) = sync_fs(l.lower.source()) {
        for c in done {
            out.refused(&status_line(c), format!("syncfs of SOURCE: {e}"));
        }
        return;
    }
    match super::layers::drop_upper(dir) {
        Ok(()) => {
            for c in done {
                out.applied(&status_line(c));
            }
        }
        Err(e) => {
            log::warn!("stage apply: dropping the staged tree whole: {e}; path by path instead");
            finish(l, done.into_iter(), out);
        }
    }
}

/// After the batch's SOURCE changes: one `syncfs` of SOURCE (they are durable), then each
/// staged entry dropped, then one `syncfs` of DIR.
fn finish<'a>(l: &Layers, done: impl Iterator<Item = &'a Change>, out: &mut Lines) {
    let done: Vec<&Change> = done.collect();
    if done.is_empty() {
        return;
    }
    if let Err(e) = sync_fs(l.lower.source()) {
        for c in done {
            out.refused(&status_line(c), format!("syncfs of SOURCE: {e}"));
        }
        return;
    }
    let mut dropped = Vec::new();
    for c in done {
        match if c.under_opaque || (c.kind == Kind::Metadata && c.dir) {
            Ok(())
        } else {
            drop_staged(&l.upper, &c.path)
        } {
            Ok(()) => dropped.push(c),
            Err(e) => out.refused(&status_line(c), format!("unstaging: {e}")),
        }
    }
    if let Err(e) = sync_fs(&l.upper) {
        // Applied either way: SOURCE holds them, and a staged entry a crash brings back
        // equals SOURCE (no change).
        log::warn!("stage apply: syncfs of DIR: {e}");
    }
    for c in dropped {
        out.applied(&status_line(c));
    }
}

/// The SOURCE side of a write: a directory's metadata set in place, else the staged entry
/// copied whole to its temporary name (removed again if that fails).
fn prepare<'a>(l: &Layers, c: &'a Change, links: &mut Links) -> io::Result<Ready<'a>> {
    let (parent, last) = split(&c.path);
    let u = l.upper.get(&c.path)?.ok_or_else(einval)?;
    if c.kind == Kind::Metadata && c.dir {
        let low = l.lower.dir(&c.path)?.ok_or_else(einval)?;
        set_meta(&l.upper, &u, l.lower.source(), low.fd.as_fd(), None, false)?;
        return Ok(Ready {
            c,
            dir: low.fd,
            tmp: None,
            stand_in: false,
        });
    }
    let dir = lower_dir(l, parent)?;
    let t = tmp_name(last, "apply")?;
    if let Err(e) = copy_entry(l, &u, dir.as_fd(), &t, &c.path, links) {
        remove_tmp(l, dir.as_fd(), &t);
        return Err(e);
    }
    Ok(Ready {
        c,
        dir,
        tmp: Some(t),
        stand_in: standin::is_stand_in(&u.st),
    })
}

/// Removes a temporary entry a failed step left (best effort: the intent log names it
/// for recovery otherwise).
fn remove_tmp(l: &Layers, dir: BorrowedFd<'_>, t: &Name) {
    if sys::fstatat_nofollow(dir, t).is_ok()
        && let Err(e) = remove_tree(l.lower.source(), dir, t)
    {
        log::warn!("stage apply: removing a temporary entry: {e}");
    }
}

fn drop_tmp(l: &Layers, r: &Ready<'_>) {
    if let Some(t) = &r.tmp {
        remove_tmp(l, r.dir.as_fd(), t);
    }
}

/// Renames a prepared temporary entry over its destination. What is in the way of a
/// type change (a directory for a file, or a file for a directory: rename(2) replaces
/// neither) is swapped out atomically with RENAME_EXCHANGE (the name never goes
/// missing), then removed.
fn place(l: &Layers, r: &Ready<'_>, since: &super::guard::Since) -> io::Result<()> {
    let Some(t) = &r.tmp else {
        return Ok(());
    };
    let last = split(&r.c.path).1;
    let n = name(last)?;
    let old = l.lower.child(&Node::from_fd(&r.dir)?, last)?;
    let new_dir = kind(&sys::fstatat_nofollow(r.dir.as_fd(), t)?) == libc::S_IFDIR;
    match old {
        Some(o) if (kind(&o.st) == libc::S_IFDIR) != new_dir => {
            if !super::guard::unchanged(r.c, Some(&o)) {
                return Err(io::Error::other("conflict (SOURCE changed while applying)"));
            }
            sys::renameat2(r.dir.as_fd(), t, r.dir.as_fd(), &n, libc::RENAME_EXCHANGE)?;
            // SOURCE's old entry is at `t` now (a directory unless `new_dir`): gone
            // only when nothing below it changed since the listing (a failure to tell
            // counts as a change).
            let keep = !new_dir
                && !r.c.conflict
                && super::guard::below_changed(l.lower.source(), r.dir.as_fd(), t, since)
                    .unwrap_or(true);
            if !keep {
                return remove_tree(l.lower.source(), r.dir.as_fd(), t);
            }
            match sys::renameat2(r.dir.as_fd(), t, r.dir.as_fd(), &n, libc::RENAME_EXCHANGE) {
                Ok(()) => Err(io::Error::other(super::guard::CHANGED_BELOW)),
                // The staged file stays in place (applied); the host's directory is kept,
                // never removed, out of the temporary names' way.
                Err(e) => super::guard::keep_aside(r.dir.as_fd(), t, &r.c.path, &e),
            }
        }
        o => super::guard::replace(r.c, r.dir.as_fd(), t, &n, o.as_ref()),
    }
}

/// Deletes every change of `chunk` from SOURCE (a directory renamed away first, so its
/// name goes at once, then emptied), then [`finish`] (with `pending`: at the end).
fn delete_batch<'a>(
    l: &Layers,
    chunk: &[&'a Change],
    out: &mut Lines,
    pending: Option<&mut Pending<'a>>,
    since: &super::guard::Since,
) {
    let mut done = Vec::new();
    for &c in chunk {
        match delete_one(l, c, since) {
            Ok(()) => done.push(c),
            Err(e) => out.refused(&status_line(c), e),
        }
    }
    match pending {
        Some(p) => p.done.extend(done),
        None => finish(l, done.into_iter(), out),
    }
}

fn delete_one(l: &Layers, c: &Change, since: &super::guard::Since) -> io::Result<()> {
    let (parent, last) = split(&c.path);
    let dir = lower_dir(l, parent)?;
    let n = name(last)?;
    if let Some(ln) = l.lower.child(&Node::from_fd(&dir)?, last)? {
        if !super::guard::unchanged(c, Some(&ln)) {
            return Err(io::Error::other(
                "conflict (SOURCE changed while applying; --force applies the staged version)",
            ));
        }
        if kind(&ln.st) == libc::S_IFDIR {
            let t = tmp_name(last, "delete")?;
            sys::renameat2(dir.as_fd(), &n, dir.as_fd(), &t, libc::RENAME_NOREPLACE)?;
            // A failure to tell counts as a change: the tree goes back, never removed.
            if !c.conflict
                && super::guard::below_changed(l.lower.source(), dir.as_fd(), &t, since)
                    .unwrap_or(true)
            {
                return Err(super::guard::put_back(dir.as_fd(), &t, &n));
            }
            remove_tree(l.lower.source(), dir.as_fd(), &t)?;
        } else {
            sys::unlinkat(dir.as_fd(), &n, 0)?;
        }
    }
    Ok(())
}

impl Node {
    fn from_fd(fd: &OwnedFd) -> io::Result<Node> {
        Ok(Node::of(fd.try_clone()?, sys::fstat(fd.as_fd())?))
    }
}

/// Copies the staged entry `u` at `path` (a whole tree for a directory, walked without
/// recursion: [`super::walk`]) to `dir/t` in SOURCE, with its mode, owner, xattrs and
/// times; not synced (the batch's `syncfs` does that before the rename makes it visible).
fn copy_entry(
    l: &Layers,
    u: &Node,
    dir: BorrowedFd<'_>,
    t: &Name,
    path: &[u8],
    links: &mut Links,
) -> io::Result<()> {
    let Some(d) = copy_one(l, u, dir, t, links)? else {
        return Ok(());
    };
    let proc_fd = l.upper.proc_fd.as_fd();
    walk(&l.upper, u.try_clone()?, path, d, |ev| match ev {
        Event::Entry {
            dir, name: child, ..
        } => {
            let (u, d) = (&dir.node, &dir.state);
            let cname = name(child)?;
            // A regular file (most of a new tree) is copied through descriptors.
            if let Some((src, st)) = open_regular(u.fd.as_fd(), &cname)? {
                let marked = |n: &[u8]| file::get(src.as_fd(), n).is_ok();
                // Only an empty file may be a whiteout (its marker asked only then).
                let whiteout = || marked(WHITEOUT) || marked(b"user.overlay.whiteout");
                if !(st.st_size == 0 && whiteout()) {
                    links.write(proc_fd, src.as_fd(), &st, d.as_fd(), &cname)?;
                }
                return Ok(Flow::Next);
            }
            let Some(cn) = l.upper.child(u, child)? else {
                return Ok(Flow::Next);
            };
            if l.upper.is_whiteout(&cn) {
                return Ok(Flow::Next);
            }
            Ok(match copy_one(l, &cn, d.as_fd(), &cname, links)? {
                Some(nd) => Flow::Enter(cn, nd),
                None => Flow::Next,
            })
        }
        // A directory's own metadata once its entries are in.
        Event::Leave { dir, .. } => {
            let mode = dir.node.st.st_mode & 0o7777;
            set_meta(
                &l.upper,
                &dir.node,
                l.lower.source(),
                dir.state.as_fd(),
                Some(mode),
                true,
            )?;
            Ok(Flow::Next)
        }
    })
    .map(drop)
}

/// Copies the staged entry `u` alone to `dir/t`: a directory is made (empty, mode 0700,
/// its handle returned for its entries), anything else copied whole.
fn copy_one(
    l: &Layers,
    u: &Node,
    dir: BorrowedFd<'_>,
    t: &Name,
    links: &mut Links,
) -> io::Result<Option<OwnedFd>> {
    let proc_fd = l.upper.proc_fd.as_fd();
    let at = |s: i64, n: i64| SetTime::At(s, n);
    match kind(&u.st) {
        libc::S_IFREG => {
            let src = sys::reopen(proc_fd, u.fd.as_fd(), libc::O_RDONLY)?;
            links.write(proc_fd, src.as_fd(), &u.st, dir, t)?;
        }
        libc::S_IFLNK => {
            let target = sys::readlink_fd(u.fd.as_fd())?;
            sys::symlinkat(&target, dir, t)?;
            sys::fchownat_nofollow(dir, t, u.st.st_uid, u.st.st_gid)?;
            sys::utimens_nofollow(
                dir,
                t,
                at(u.st.st_atime, u.st.st_atime_nsec),
                at(u.st.st_mtime, u.st.st_mtime_nsec),
            )?;
        }
        libc::S_IFDIR => {
            sys::mkdirat(dir, t, 0o700)?;
            return sys::open_path(dir, t).map(Some);
        }
        _ => {
            // A stand-in becomes the character device 0/0 it stands for.
            sys::mknodat(dir, t, u.st.st_mode, standin::rdev(&u.st))?;
            sys::fchownat_nofollow(dir, t, u.st.st_uid, u.st.st_gid)?;
            sys::utimens_nofollow(
                dir,
                t,
                at(u.st.st_atime, u.st.st_atime_nsec),
                at(u.st.st_mtime, u.st.st_mtime_nsec),
            )?;
        }
    }
    Ok(None)
}

const WHITEOUT: &[u8] = b"trusted.overlay.whiteout";

/// The staged `dir/n` opened for reading when it is a regular file (`None` otherwise or
/// when gone: the caller looks again); never follows a symlink, never opens a device.
fn open_regular(dir: BorrowedFd<'_>, n: &Name) -> io::Result<Option<(OwnedFd, libc::stat)>> {
    let st = match sys::fstatat_nofollow(dir, n) {
        Ok(st) if kind(&st) == libc::S_IFREG => st,
        Ok(_) => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let fd = sys::openat(dir, n, libc::O_RDONLY, 0)?;
    let now = sys::fstat(fd.as_fd())?;
    if kind(&now) != libc::S_IFREG || (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Ok(None);
    }
    Ok(Some((fd, now)))
}

/// Gives SOURCE's `dst` (a regular file or directory handle) the staged entry's owner,
/// mode (`mode`, or the staged one), xattrs (those it lacks removed), and with `times`
/// its atime and mtime.
fn set_meta(
    up: &Layer,
    u: &Node,
    low: &Layer,
    dst: BorrowedFd<'_>,
    mode: Option<u32>,
    times: bool,
) -> io::Result<()> {
    sys::fchown_fd(dst, u.st.st_uid, u.st.st_gid)?;
    // After chown, which clears set-ID bits.
    sys::fchmod_fd(
        low.proc_fd.as_fd(),
        dst,
        mode.unwrap_or(u.st.st_mode & 0o7777),
    )?;
    let want = up.xattrs(u);
    let have = low.xattrs(&Node::of(
        sys::reopen(low.proc_fd.as_fd(), dst, libc::O_PATH)?,
        sys::fstat(dst)?,
    ));
    for (k, _) in &have {
        if !want.iter().any(|(w, _)| w == k) {
            sys::removexattr_fd(dst, k)?;
        }
    }
    for (k, v) in &want {
        sys::setxattr_fd(dst, k, v, 0)?;
    }
    if times {
        let at = |s: i64, n: i64| SetTime::At(s, n);
        sys::utimens_fd(
            low.proc_fd.as_fd(),
            dst,
            at(u.st.st_atime, u.st.st_atime_nsec),
            at(u.st.st_mtime, u.st.st_mtime_nsec),
        )?;
    }
    Ok(())
}
