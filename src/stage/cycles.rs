//! Cycles of file renames: `mv x t; mv y x; mv t y` (a swap of two names) and longer ones
//! (`x -> y -> z -> x`), listed as one `R old -> new` per path (`R y -> x`, `R x -> y`)
//! instead of an `M` at each path that shows the other's bytes.
//!
//! No path of a cycle is added or deleted, so `changes.rs`'s pairing of a `D` with an `A`
//! never sees one: here a changed file (`M` or `m`) is a rename of another changed
//! path when its staged entry's overlayfs origin (the SOURCE object it was copied up
//! from, which overlayfs keeps through renames) is SOURCE's object at that other path.
//! Following those links from path to path, a chain that comes back to where it began,
//! each path taken from exactly one other, is a cycle; anything else (a chain ending in
//! an added or deleted path, two staged files made from one object) stays as it was
//! listed.
//!
//! A rename of a cycle conflicts when SOURCE's object at its new path (carried away by
//! another rename of the cycle) or at its old path (the object that moved) changed since
//! it was staged, by the base record that names that path ([`mark`]), as a plain rename
//! takes the conflict of its `D`. Its review id covers both SOURCE objects
//! ([`Change::replaces`]).
//!
//! Apply and discard take a cycle whole: a PATH selects every rename of the cycles it
//! touches ([`close`]); a cycle not wholly in the list (a `PATH@ID` of one of its
//! renames), or with a rename refused, is refused whole. Apply writes each path's staged
//! file over SOURCE's as it writes a modified file (beside, synced, renamed, checked
//! against a host edit, named in the intent log), so a crash leaves each path applied or
//! still staged and loses nothing: the other paths' SOURCE objects stay where they are
//! until their own staged files replace them, and a path still staged keeps its bytes.
//!
//! Cost: one overlayfs origin decoded (`open_by_handle_at`) per changed file a listing
//! has, two or more of them (5000 modified files: about 0.1 s more in a debug build).
//!
//! Invariants: read-only; only ever turns `M`/`m` changes of non-directories into
//! renames, never drops or adds a change.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use super::StageError;
use super::base::{self, Base};
use super::changes::{Change, Kind, Layers, lower_ident};
use super::ids::Kept;
use super::sys as ssys;
use super::tree::{Node, split};
use crate::host::sys;

/// Whether `c` is a rename of a cycle.
pub fn member(c: &Change) -> bool {
    c.replaces.is_some() && !c.dir && matches!(c.kind, Kind::Renamed { .. })
}

fn from(c: &Change) -> &[u8] {
    match &c.kind {
        Kind::Renamed { from } => from,
        _ => &c.path,
    }
}

impl Layers {
    /// Every staged change, sorted by path ([`Layers::listed`], each cycle of file renames
    /// paired). Defined here, not in `changes.rs`, so that module never imports this one.
    pub fn changes(&self) -> io::Result<Vec<Change>> {
        let mut out = self.listed()?;
        pair(self, &mut out)?;
        Ok(out)
    }

    /// The changes that concern one of `paths` (all when empty), with every rename of a
    /// cycle one of them is part of (what `apply PATH` takes).
    pub fn selected(&self, paths: &[Vec<u8>]) -> Result<Vec<Change>, StageError> {
        let all = self
            .changes()
            .map_err(StageError::op("reading the staged tree"))?;
        if paths.is_empty() {
            return Ok(all);
        }
        let mut picked: Vec<Change> = all
            .iter()
            .filter(|c| paths.iter().any(|p| c.touches(p)))
            .cloned()
            .collect();
        close(&all, &mut picked);
        Ok(picked)
    }
}

/// Turns every cycle of file renames in `out` into `R` changes.
fn pair(l: &Layers, out: &mut [Change]) -> io::Result<()> {
    let cand: Vec<usize> = (0..out.len())
        .filter(|&i| {
            let c = &out[i];
            matches!(c.kind, Kind::Modified | Kind::Metadata)
                && !c.dir
                && !c.under_opaque
                && c.lower_st.is_some()
        })
        .collect();
    if cand.len() < 2 {
        return Ok(());
    }
    let mut by_ino: HashMap<i128, Vec<usize>> = HashMap::new();
    for &i in &cand {
        if let Some(s) = out[i].lower_st {
            by_ino.entry(s[0]).or_default().push(i);
        }
    }
    // came[i] = j: the staged file at i was copied up from SOURCE's object at j.
    let mut came: HashMap<usize, usize> = HashMap::new();
    let mut records: HashMap<usize, Base> = HashMap::new();
    let mut origins = Origins::new(l)?;
    // SOURCE's handles of the candidates, made once if an origin cannot be opened.
    let mut by_handle: Option<HashMap<Vec<u8>, usize>> = None;
    for &i in &cand {
        let Some((origin, record)) = origins.of(&out[i].path)? else {
            continue;
        };
        let j = match origin {
            Ok(st) => taken_from(l, out, i, &st, &by_ino)?,
            Err(h) => {
                if by_handle.is_none() {
                    by_handle = Some(source_handles(l, out, &cand)?);
                }
                // (Not from the object at its own path: see taken_from.)
                let own = l.lower.get(&out[i].path)?;
                let own = own.and_then(|n| crate::host::sys::file_handle(n.fd.as_fd()).ok());
                match by_handle.as_ref().and_then(|m| m.get(&h)) {
                    Some(&j) if j != i && own.as_ref() != Some(&h) => Some(j),
                    _ => None,
                }
            }
        };
        if let Some(j) = j {
            came.insert(i, j);
            records.extend(record.map(|r| (i, r)));
        }
    }
    for cyc in find(&cand, &came) {
        mark(l, out, &cyc, &came, &records)?;
    }
    Ok(())
}

/// The cycles of `came` (each path taken from `came[path]`) whose every path is taken
/// from exactly once.
fn find(cand: &[usize], came: &HashMap<usize, usize>) -> Vec<Vec<usize>> {
    let mut taken: HashMap<usize, usize> = HashMap::new();
    for &j in came.values() {
        *taken.entry(j).or_default() += 1;
    }
    let mut seen = HashSet::new();
    let mut cycles = Vec::new();
    for &start in cand {
        let mut walked = Vec::new();
        let mut at = start;
        while !seen.contains(&at) {
            seen.insert(at);
            walked.push(at);
            match came.get(&at) {
                Some(&j) => at = j,
                None => break,
            }
        }
        // The walk ran into a path it took itself: from there on, a cycle.
        if let Some(k) = walked.iter().position(|&w| w == at)
            && came.contains_key(&at)
        {
            let cyc = walked[k..].to_vec();
            if cyc.len() >= 2 && cyc.iter().all(|i| taken.get(i) == Some(&1)) {
                cycles.push(cyc);
            }
        }
    }
    cycles
}

/// Turns the cycle `cyc` of `out` into renames. Whether SOURCE's object at a path of the
/// cycle changed is judged by the base record that names that path — the daemon's engine
/// keeps it on the staged file at the path (a rename over a whiteout takes the whiteout's
/// record over), the kernel engine moves it along with the file to where it went; a path
/// no record names keeps its listed conflict. A rename conflicts when its old or its new
/// path does.
fn mark(
    l: &Layers,
    out: &mut [Change],
    cyc: &[usize],
    came: &HashMap<usize, usize>,
    records: &HashMap<usize, Base>,
) -> io::Result<()> {
    let mut bad: HashMap<usize, bool> = HashMap::new();
    for &q in cyc {
        let p = &out[q].path;
        let named: Vec<&Base> = cyc
            .iter()
            .filter_map(|k| records.get(k))
            .filter(|r| r.path.is(p))
            .collect();
        let b = if named.is_empty() {
            out[q].conflict
        } else {
            let low = l.lower.get(p)?;
            let now = low.as_ref().map(|n| {
                let bt = ssys::btime_fd(n.fd.as_fd()).ok().flatten().unwrap_or(0);
                (&n.st, bt)
            });
            named.iter().any(|r| r.conflicts(p, now))
        };
        bad.insert(q, b);
    }
    let was: HashMap<usize, Change> = cyc.iter().map(|&i| (i, out[i].clone())).collect();
    for &i in cyc {
        let j = came[&i];
        let (own, src) = (&was[&i], &was[&j]);
        let c = &mut out[i];
        c.kind = Kind::Renamed {
            from: src.path.clone(),
        };
        c.conflict = bad[&i] || bad[&j];
        c.replaces = own.lower_st;
        c.lower_st = src.lower_st;
    }
    Ok(())
}

/// The SOURCE objects staged files were copied up from (their overlayfs origins), read
/// with one handle on SOURCE and each staged directory opened once for its files in a row
/// (candidates come in the walk's order).
struct Origins<'a> {
    l: &'a Layers,
    root: OwnedFd,
    parent: Option<(Vec<u8>, Option<Node>)>,
}

impl<'a> Origins<'a> {
    fn new(l: &'a Layers) -> io::Result<Origins<'a>> {
        // open_by_handle_at takes no `O_PATH` descriptor.
        let root = sys::reopen(
            l.lower.source().proc_fd.as_fd(),
            l.lower.source().root.as_fd(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )?;
        Ok(Origins {
            l,
            root,
            parent: None,
        })
    }

    /// The attributes of the SOURCE object the staged file at `path` was copied up from
    /// (or, where that object cannot be opened by its handle, the handle), and the
    /// file's base record.
    #[allow(clippy::type_complexity)]
    fn of(
        &mut self,
        path: &[u8],
    ) -> io::Result<Option<(Result<libc::stat, Vec<u8>>, Option<Base>)>> {
        let (dir, name) = split(path);
        if self.parent.as_ref().is_none_or(|(p, _)| p != dir) {
            self.parent = Some((dir.to_vec(), self.l.upper.dir(dir)?));
        }
        let Some((_, Some(d))) = &self.parent else {
            return Ok(None);
        };
        let Some(u) = self.l.upper.child(d, name)? else {
            return Ok(None);
        };
        let Some(o) = self.l.upper.xattr(&u, b"trusted.overlay.origin") else {
            return Ok(None);
        };
        let origin = match ssys::origin_stat(self.root.as_fd(), &o) {
            Some(st) => Ok(st),
            None => match ssys::origin_handle(&o) {
                Some(h) => Err(h),
                None => return Ok(None),
            },
        };
        Ok(Some((origin, base::of(&u))))
    }
}

/// SOURCE's object at each candidate's path, by its kernel file handle (the one listed
/// for it: its identity is the change's).
fn source_handles(
    l: &Layers,
    out: &[Change],
    cand: &[usize],
) -> io::Result<HashMap<Vec<u8>, usize>> {
    let mut m = HashMap::new();
    for &j in cand {
        let Some(low) = l.lower.get(&out[j].path)? else {
            continue;
        };
        if Some(lower_ident(&low.st)) != out[j].lower_st {
            continue;
        }
        if let Ok(h) = crate::host::sys::file_handle(low.fd.as_fd()) {
            m.insert(h, j);
        }
    }
    Ok(m)
}

/// The candidate (other than `i`) whose SOURCE object `st` (the one the staged file at
/// `out[i]` was copied up from) is, if any.
fn taken_from(
    l: &Layers,
    out: &[Change],
    i: usize,
    st: &libc::stat,
    by_ino: &HashMap<i128, Vec<usize>>,
) -> io::Result<Option<usize>> {
    // Copied from the object at its own path (two hard links of one SOURCE file, both
    // changed, share their origin): not moved from anywhere.
    if let Some(own) = l.lower.get(&out[i].path)?
        && (own.st.st_dev, own.st.st_ino) == (st.st_dev, st.st_ino)
    {
        return Ok(None);
    }
    for &j in by_ino.get(&(st.st_ino as i128)).into_iter().flatten() {
        if j == i {
            continue;
        }
        let Some(low) = l.lower.get(&out[j].path)? else {
            continue;
        };
        if (low.st.st_dev, low.st.st_ino) == (st.st_dev, st.st_ino)
            && Some(lower_ident(&low.st)) == out[j].lower_st
        {
            return Ok(Some(j));
        }
    }
    Ok(None)
}

/// The cycles of renames in `list`: each cycle `list` has whole, and the renames of the
/// cycles it has only part of.
pub fn cycles_in<'a>(list: &[&'a Change]) -> (Vec<Vec<&'a Change>>, Vec<&'a Change>) {
    let members: Vec<&Change> = list.iter().copied().filter(|c| member(c)).collect();
    let at_path: HashMap<&[u8], &Change> =
        members.iter().map(|c| (c.path.as_slice(), *c)).collect();
    let mut whole = Vec::new();
    let mut part = Vec::new();
    let mut done: HashSet<&[u8]> = HashSet::new();
    for &c in &members {
        if done.contains(c.path.as_slice()) {
            continue;
        }
        // Follow from → the rename whose new path it is, back to `c`.
        let mut cyc = vec![c];
        let mut at = c;
        let closed = loop {
            match at_path.get(from(at)) {
                Some(&m) if std::ptr::eq(m, c) => break true,
                Some(&m)
                    if !done.contains(m.path.as_slice())
                        && !cyc.iter().any(|x| std::ptr::eq(*x, m)) =>
                {
                    cyc.push(m);
                    at = m;
                }
                _ => break false,
            }
        };
        for m in &cyc {
            done.insert(m.path.as_slice());
        }
        if closed {
            whole.push(cyc);
        } else {
            part.extend(cyc);
        }
    }
    (whole, part)
}

/// `selected` (changes of `all`) with every rename of each cycle one of them is part of:
/// a cycle is applied or discarded whole, whichever of its paths is named.
pub fn close(all: &[Change], selected: &mut Vec<Change>) {
    let at_path: HashMap<&[u8], &Change> = all
        .iter()
        .filter(|c| member(c))
        .map(|c| (c.path.as_slice(), c))
        .collect();
    if at_path.is_empty() {
        return;
    }
    let at_from: HashMap<&[u8], &Change> = at_path.values().map(|c| (from(c), *c)).collect();
    let mut have: HashSet<Vec<u8>> = selected.iter().map(|c| c.path.clone()).collect();
    let mut todo: Vec<&Change> = selected
        .iter()
        .filter_map(|c| at_path.get(c.path.as_slice()).copied())
        .collect();
    let mut more = Vec::new();
    while let Some(c) = todo.pop() {
        // The rename out of its new path, and the one into its old path.
        for n in [at_from.get(c.path.as_slice()), at_path.get(from(c))]
            .into_iter()
            .flatten()
        {
            if have.insert(n.path.clone()) {
                more.push((*n).clone());
                todo.push(n);
            }
        }
    }
    if !more.is_empty() {
        selected.extend(more);
        selected.sort_by(|a, b| a.path.cmp(&b.path));
    }
}

/// The changes of `all` that the arguments `kept` of an apply select (all when none): a
/// PATH@ID the change it names, a PATH every change it touches and every rename of each
/// cycle one of those is part of.
pub fn pick(all: &[Change], kept: &[Kept]) -> Vec<Change> {
    let mut picked: Vec<Change> = all
        .iter()
        .filter(|c| kept.is_empty() || kept.iter().any(|k| !k.exact && k.selects(c)))
        .cloned()
        .collect();
    close(all, &mut picked);
    if kept.iter().any(|k| k.exact) {
        let have: HashSet<Vec<u8>> = picked.iter().map(|c| c.path.clone()).collect();
        picked.extend(
            all.iter()
                .filter(|c| kept.iter().any(|k| k.exact && k.selects(c)) && !have.contains(&c.path))
                .cloned(),
        );
    }
    picked
}

/// For a discard: the PATH@ID arguments of `kept` that name a rename of a cycle the
/// arguments do not name whole, each with its `refused …` line (discarding one staged
/// file of a swap would leave the other name's bytes at both).
pub fn part_by_ids(all: &[Change], kept: &[Kept]) -> Vec<(Vec<u8>, String)> {
    if !kept.iter().any(|k| k.exact) {
        return Vec::new();
    }
    let picked = pick(all, kept);
    let refs: Vec<&Change> = picked.iter().collect();
    let (_, part) = cycles_in(&refs);
    part.into_iter()
        .filter(|c| kept.iter().any(|k| k.exact && k.path == c.path))
        .map(|c| {
            (
                c.path.clone(),
                format!(
                    "refused {}: part of a cycle of renames: discard all of its paths together",
                    super::render::status_line(c)
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `R from -> path`, a rename of a cycle.
    fn r(from: &str, path: &str) -> Change {
        Change {
            path: path.as_bytes().to_vec(),
            kind: Kind::Renamed {
                from: from.as_bytes().to_vec(),
            },
            conflict: false,
            dir: false,
            entries: None,
            under_opaque: false,
            lower_id: None,
            lower_st: Some([1, 0, 0, 0]),
            replaces: Some([2, 0, 0, 0]),
            moved_in: None,
        }
    }

    fn paths(v: &[&Change]) -> Vec<String> {
        v.iter()
            .map(|c| String::from_utf8_lossy(&c.path).into_owned())
            .collect()
    }

    #[test]
    fn whole_cycles_and_parts_are_told_apart() {
        let all = [
            r("c", "a"),
            r("a", "b"),
            r("b", "c"),
            r("y", "x"),
            r("x", "y"),
        ];
        let refs: Vec<&Change> = all.iter().collect();
        let (whole, part) = cycles_in(&refs);
        assert_eq!(whole.len(), 2);
        assert!(part.is_empty());
        // Without `R b -> c` the other two of that cycle are a part, in one place each.
        let some: Vec<&Change> = [0, 1, 3, 4].iter().map(|&i| &all[i]).collect();
        let (whole, part) = cycles_in(&some);
        assert_eq!(whole.len(), 1);
        assert_eq!(paths(&whole[0]), ["x", "y"]);
        let mut p = paths(&part);
        p.sort();
        assert_eq!(p, ["a", "b"]);
    }

    #[test]
    fn a_selection_is_closed_over_its_cycles() {
        let all = [
            r("c", "a"),
            r("a", "b"),
            r("b", "c"),
            r("y", "x"),
            r("x", "y"),
        ];
        let mut sel = vec![all[1].clone()];
        close(&all, &mut sel);
        let refs: Vec<&Change> = sel.iter().collect();
        assert_eq!(paths(&refs), ["a", "b", "c"]);
        // A plain rename is not a cycle's and takes nothing along.
        let mut plain = r("k", "k2");
        plain.replaces = None;
        let mut sel = vec![plain.clone()];
        close(&[plain], &mut sel);
        assert_eq!(sel.len(), 1);
    }
}
