//! What is staged: the staged tree (`DIR/upper`, overlayfs format) compared with SOURCE,
//! as the list of changes `stage status` prints and `apply`/`discard` work on.
//!
//! Rules (README, "Staging"): a path whose staged entry equals SOURCE (a copy-up nothing
//! changed) is not a change; a directory is `m` only for mode, owner or xattrs (its times
//! follow its entries); a new directory is one `A dir/ (N entries)`; a deleted directory
//! one `D dir/`; a directory renamed with a redirect is `R old -> new`, its old name's
//! whiteout not listed again; what a rename took along is never listed as deleted; a
//! file rename is paired here (applied by `moves.rs`), a cycle of them by `cycles.rs`
//! (which defines [`Layers::changes`] over [`Layers::listed`], and `selected`). A
//! change is a **conflict** when, by the staged entry's base record ([`super::base`]),
//! SOURCE's object at the path is not the one it was made from, changed since, or is
//! gone; without a record (a directory, a path made new), when SOURCE's entry changed
//! (ctime) after the staged entry was made (its birth time), appeared since (an added
//! path that SOURCE now has), or is gone (a copied-up file whose SOURCE original no
//! longer exists anywhere: its overlayfs origin is stale).
//!
//! Invariants: read-only; paths are workspace-relative bytes; the list is sorted by path.

use std::collections::HashSet;
use std::io;
use std::os::fd::AsFd;

use super::base;
use super::lower::Lower;
use super::standin;
use super::sys as ssys;
use super::tree::{Layer, Node, join, kind, split};
use super::walk::{Event, Flow, Frame, walk};
use crate::host::sys::{self, Name};

/// The kind of one change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A new path.
    Added,
    /// Contents changed (maybe metadata too).
    Modified,
    /// Only mode, owner, times or xattrs.
    Metadata,
    /// Removed.
    Deleted,
    /// A directory or file moved (`from` is its SOURCE path; a file: `stage::moves`).
    Renamed {
        /// The path it had in SOURCE.
        from: Vec<u8>,
    },
    /// File type changed (a file became a symlink, a directory a file, …).
    Type,
}

/// One changed path.
#[derive(Debug, Clone)]
pub struct Change {
    /// Workspace-relative path.
    pub path: Vec<u8>,
    /// What changed.
    pub kind: Kind,
    /// SOURCE changed after staging began for this path.
    pub conflict: bool,
    /// The staged (or, deleted, the SOURCE) entry is a directory.
    pub dir: bool,
    /// For a new directory: the entries below it.
    pub entries: Option<u64>,
    /// Some directory above it in the staged tree is opaque (its SOURCE contents hidden):
    /// the staged entry must stay after an apply.
    pub under_opaque: bool,
    /// For a deletion: the SOURCE entry's identity (st_dev, st_ino). A directory a rename
    /// took along is not deleted, whatever name its whiteout has.
    pub lower_id: Option<(u64, u64)>,
    /// SOURCE's entry this change is against (a rename: its old directory), as
    /// [`lower_ident`] takes it: part of the change's review id ([`super::ids`]).
    pub lower_st: Option<[i128; 4]>,
    /// A file rename of a cycle (`mv x t; mv y x; mv t y`: `cycles.rs`): SOURCE's
    /// entry at the new path, which another rename of the cycle carries away, as
    /// [`lower_ident`] takes it. `None` for every other change.
    pub replaces: Option<[i128; 4]>,
    /// A new directory holding a directory the agent moved in from SOURCE: that
    /// directory's SOURCE path (the first found; [`Layers::moved_in`]). `apply` refuses
    /// such a directory (`stage/moved_in.rs`).
    pub moved_in: Option<Vec<u8>>,
}

/// What of SOURCE's entry a change's review id covers: inode, ctime (every change of it),
/// size and mode.
pub fn lower_ident(st: &libc::stat) -> [i128; 4] {
    [
        st.st_ino as i128,
        ctime_ns(st),
        st.st_size as i128,
        st.st_mode as i128,
    ]
}

/// What [`Layers::copies_in`] found: the SOURCE files copied (inode, path), and whether
/// some copy's SOURCE file cannot be told.
pub type Copies = (Vec<(u64, base::RecPath)>, bool);

/// The key of a renamed directory's SOURCE identity in `changes`'s set of rename sources
/// (never a path: paths have no NUL).
fn id_key(st: &libc::stat) -> Vec<u8> {
    format!("\0{}:{}", st.st_dev, st.st_ino).into_bytes()
}

impl Change {
    /// The status letters (`A`, `M`, `m`, `D`, `R`, `T`, with `C` in front for a conflict).
    pub fn letters(&self) -> String {
        let l = match self.kind {
            Kind::Added => "A",
            Kind::Modified => "M",
            Kind::Metadata => "m",
            Kind::Deleted => "D",
            Kind::Renamed { .. } => "R",
            Kind::Type => "T",
        };
        if self.conflict {
            format!("C{l}")
        } else {
            l.to_string()
        }
    }

    /// The `--json` name of the change.
    pub fn word(&self) -> &'static str {
        match self.kind {
            Kind::Added => "added",
            Kind::Modified => "modified",
            Kind::Metadata => "metadata",
            Kind::Deleted => "deleted",
            Kind::Renamed { .. } => "renamed",
            Kind::Type => "type",
        }
    }

    /// Whether this change is `p` or below it (a rename: either of its names).
    pub fn within(&self, p: &[u8]) -> bool {
        let below = |a: &[u8]| {
            p.is_empty() || a == p || (a.starts_with(p) && a.get(p.len()) == Some(&b'/'))
        };
        below(&self.path) || matches!(&self.kind, Kind::Renamed { from } if below(from))
    }

    /// Whether this change concerns `p` or something below `p` (or `p` is below it).
    pub fn touches(&self, p: &[u8]) -> bool {
        let rel = |a: &[u8]| {
            p.is_empty()
                || a == p
                || (a.starts_with(p) && a.get(p.len()) == Some(&b'/'))
                || (p.starts_with(a) && p.get(a.len()) == Some(&b'/'))
        };
        rel(&self.path) || matches!(&self.kind, Kind::Renamed { from } if rel(from))
    }
}

/// The SOURCE path a redirect of the staged directory at `path` names.
pub fn redirect_path(path: &[u8], r: &[u8]) -> Vec<u8> {
    match r.strip_prefix(b"/") {
        Some(abs) => abs.to_vec(),
        None => join(split(path).0, r),
    }
}

/// The two layers a staging area compares.
pub struct Layers {
    /// The staged tree.
    pub upper: Layer,
    /// What it is compared against: SOURCE, or the view at a checkpoint (sealed layers
    /// over SOURCE, [`Lower`]).
    pub lower: Lower,
}

fn ctime_ns(st: &libc::stat) -> i128 {
    st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128
}

/// Whether the staged entry `u` at `path` (made at `at`) conflicts with SOURCE's entry
/// `l` there. With a base record (`base`): SOURCE's object is not the one the staged
/// entry was made from, or changed since. Without one (a directory, a path the agent
/// made new, a stage older than the records): SOURCE's entry changed at or after `at`
/// (`>=`: times tick coarsely, so a host edit in the copy-up's tick counts; that errs on
/// the side of never overwriting a host edit).
fn conflict(path: &[u8], rec: Option<base::Base>, l: Option<&Node>, at: i128) -> bool {
    match rec {
        Some(b) => b.conflicts(
            path,
            l.map(|l| {
                let bt = ssys::btime_fd(l.fd.as_fd()).ok().flatten().unwrap_or(0);
                (&l.st, bt)
            }),
        ),
        None => l.is_some_and(|l| ctime_ns(&l.st) >= at),
    }
}

/// The walk's state for a staged directory: its SOURCE counterpart, whether it is or
/// lies below an opaque directory, and the staged time of the oldest such one (`since`):
/// an opaque directory replaced SOURCE's whole directory then (`rm -rf d; mkdir d`), so
/// a host change below it after that time went unseen, whatever the agent made there
/// later — every entry below it is judged no later than that.
struct Counterpart {
    low: Option<Node>,
    under: bool,
    since: Option<i128>,
}

impl Layers {
    /// Every staged change, sorted by path, without cycles of renames paired (those are
    /// `M`: [`Layers::changes`] pairs them).
    pub fn listed(&self) -> io::Result<Vec<Change>> {
        let mut out = Vec::new();
        let mut sources = HashSet::new();
        let root = self
            .upper
            .get(b"")?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let lower = self.lower.get(b"")?;
        self.walk(root, lower, &mut out, &mut sources)?;
        // A SOURCE entry a rename took along (it or a directory above it is a rename's
        // source) is not deleted, whatever whiteout or opaque directory now stands at its
        // old path: `mv w/a w/x; mkdir w/a` hides SOURCE's `w/a/*` but deletes none of it.
        let below_source = |p: &[u8]| {
            sources.iter().any(|s| {
                !s.starts_with(b"\0")
                    && (p == s.as_slice() || (p.starts_with(s) && p.get(s.len()) == Some(&b'/')))
            })
        };
        out.retain(|c| {
            let moved = |(d, i): (u64, u64)| sources.contains(&format!("\0{d}:{i}").into_bytes());
            !(c.kind == Kind::Deleted && (below_source(&c.path) || c.lower_id.is_some_and(moved)))
        });
        for s in sources.iter().filter(|s| !s.starts_with(b"\0")) {
            self.new_where_moved(s, &mut out)?;
        }
        self.pair_file_renames(&mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Merges each `D a` + `A b` that is one file's rename into `R a -> b` (at `b`): the
    /// staged file at `b` has the base record taken at `a` of SOURCE's object there
    /// ([`super::moves`] applies it).
    fn pair_file_renames(&self, out: &mut Vec<Change>) -> io::Result<()> {
        let deleted: Vec<(usize, u64)> = out
            .iter()
            .enumerate()
            .filter(|(_, c)| c.kind == Kind::Deleted && !c.dir)
            .filter_map(|(i, c)| c.lower_id.map(|(_, ino)| (i, ino)))
            .collect();
        if deleted.is_empty() {
            return Ok(());
        }
        let mut gone = Vec::new();
        for i in 0..out.len() {
            let c = &out[i];
            if c.kind != Kind::Added || c.dir || c.entries.is_some() || c.under_opaque {
                continue;
            }
            let Some(u) = self.upper.get(&c.path)? else {
                continue;
            };
            let Some(b) = base::of(&u) else { continue };
            let Some(&(j, _)) = deleted
                .iter()
                .find(|&&(j, ino)| ino == b.ino && b.path.is(&out[j].path) && !gone.contains(&j))
            else {
                continue;
            };
            let d = out[j].clone();
            let c = &mut out[i];
            c.kind = Kind::Renamed { from: d.path };
            c.conflict |= d.conflict;
            c.lower_st = d.lower_st;
            gone.push(j);
        }
        let mut k = 0;
        out.retain(|_| {
            k += 1;
            !gone.contains(&(k - 1))
        });
        Ok(())
    }

    /// A directory made where a renamed one was (`mv d d2; mkdir d`): its SOURCE
    /// counterpart moved away, so it is new — one `A d/ (N entries)` instead of changes
    /// against what moved (an apply renames `d` first, and then has to make `d` whole).
    /// Left as it is when a rename lies below it (`mv w/a w/x; mkdir w/a; mv w/x w/a/x`:
    /// that rename is refused, and what depends on it stays staged).
    fn new_where_moved(&self, s: &[u8], out: &mut Vec<Change>) -> io::Result<()> {
        let Some(u) = self.upper.dir(s)? else {
            return Ok(());
        };
        if !self.upper.is_opaque(&u) || self.upper.redirect(&u).is_some() {
            return Ok(());
        }
        let under = |p: &[u8]| p == s || (p.starts_with(s) && p.get(s.len()) == Some(&b'/'));
        if out
            .iter()
            .any(|c| matches!(c.kind, Kind::Renamed { .. }) && under(&c.path))
        {
            return Ok(());
        }
        let at = out.iter().find(|c| c.path == s).cloned();
        out.retain(|c| !under(&c.path));
        out.push(Change {
            path: s.to_vec(),
            kind: Kind::Added,
            conflict: at.as_ref().is_some_and(|c| c.conflict),
            dir: true,
            entries: Some(self.count(&u, s)?),
            under_opaque: at.as_ref().is_some_and(|c| c.under_opaque),
            lower_id: None,
            lower_st: None,
            replaces: None,
            moved_in: self
                .moved_in(&u, s)?
                .into_iter()
                .next()
                .map(|(from, _)| from),
        });
        Ok(())
    }

    /// Compares the staged tree `root` with SOURCE's `low`, each staged directory with
    /// its SOURCE counterpart ([`super::walk`]: no recursion, whatever the depth).
    fn walk(
        &self,
        root: Node,
        low: Option<Node>,
        out: &mut Vec<Change>,
        sources: &mut HashSet<Vec<u8>>,
    ) -> io::Result<()> {
        let under = self.upper.is_opaque(&root);
        let since = under.then(|| ssys::dir_staged_at(&self.upper, &root));
        walk(
            &self.upper,
            root,
            b"",
            Counterpart { low, under, since },
            |ev| match ev {
                Event::Entry { dir, path, name } => self.entry(dir, path, name, out, sources),
                Event::Leave { dir, path, .. } => {
                    // An opaque directory hides what SOURCE has there.
                    if self.upper.is_opaque(&dir.node)
                        && let Some(low) = dir.state.low.filter(|l| kind(&l.st) == libc::S_IFDIR)
                    {
                        let names = self.upper.list(&dir.node)?;
                        let at = ssys::dir_staged_at(&self.upper, &dir.node)
                            .min(dir.state.since.unwrap_or(i128::MAX));
                        self.hidden_by_opaque(path, &low, &names, at, out)?;
                    }
                    Ok(Flow::Next)
                }
            },
        )
        .map(drop)
    }

    /// Entry `name` of staged directory `dir` (at `path`) against SOURCE's counterpart.
    fn entry(
        &self,
        dir: &Frame<Counterpart>,
        path: &[u8],
        name: &[u8],
        out: &mut Vec<Change>,
        sources: &mut HashSet<Vec<u8>>,
    ) -> io::Result<Flow<Counterpart>> {
        let (up, under) = (&dir.node, dir.state.under);
        let Some(u) = self.upper.child(up, name)? else {
            return Ok(Flow::Next);
        };
        let l = self.lower_at(dir.state.low.as_ref(), name)?;
        let rec = base::of(&u);
        // A record taken before the entry was made (a read, a deletion the entry took
        // over) dates what the entry stands for.
        let at = ssys::staged_at(up.fd.as_fd(), name, &u.st)
            .min(rec.as_ref().map_or(i128::MAX, |b| b.since))
            .min(dir.state.since.unwrap_or(i128::MAX));
        let p = join(path, name);
        // A SOURCE directory the staged entry deletes or replaces (a whiteout, a
        // file): what the host changed below it counts (its own ctime does not move).
        let gone_dir = l.as_ref().is_some_and(|l| kind(&l.st) == libc::S_IFDIR)
            && kind(&u.st) != libc::S_IFDIR;
        let conflict = conflict(&p, rec, l.as_ref(), at)
            || (gone_dir
                && match &l {
                    Some(l) => self.changed_since(l, at, &p)?,
                    None => false,
                });
        let base = Change {
            path: p,
            kind: Kind::Added,
            conflict,
            dir: false,
            entries: None,
            under_opaque: under,
            lower_id: None,
            lower_st: l.as_ref().map(|l| lower_ident(&l.st)),
            replaces: None,
            moved_in: None,
        };
        if self.upper.is_whiteout(&u) {
            if let Some(l) = &l {
                out.push(Change {
                    kind: Kind::Deleted,
                    dir: kind(&l.st) == libc::S_IFDIR,
                    lower_id: Some((l.st.st_dev, l.st.st_ino)),
                    ..base
                });
            }
        } else if kind(&u.st) == libc::S_IFDIR {
            let opaque = self.upper.is_opaque(&u);
            // (A directory moved in is compared with where it came from, which the agent
            // saw until the move: the cap of the opaque directory around it ends there.)
            let since = match opaque {
                true => Some(
                    ssys::dir_staged_at(&self.upper, &u).min(dir.state.since.unwrap_or(i128::MAX)),
                ),
                false if dir.state.since.is_some() && self.upper.redirect(&u).is_some() => None,
                false => dir.state.since,
            };
            if let Some(o) = self.dir_entry(base, &u, l, out, sources)? {
                return Ok(Flow::Enter(
                    u,
                    Counterpart {
                        low: Some(o),
                        under: under || opaque,
                        since,
                    },
                ));
            }
        } else if let Some(c) = self.file_entry(base, &u, l.as_ref())? {
            out.push(c);
        }
        Ok(Flow::Next)
    }

    /// A staged directory: renamed (a redirect names its SOURCE contents), changed in
    /// place (then walked: its SOURCE counterpart is returned), or new / replacing a
    /// non-directory (one line).
    fn dir_entry(
        &self,
        base: Change,
        u: &Node,
        l: Option<Node>,
        out: &mut Vec<Change>,
        sources: &mut HashSet<Vec<u8>>,
    ) -> io::Result<Option<Node>> {
        let ldir = |l: Option<Node>| l.filter(|l| kind(&l.st) == libc::S_IFDIR);
        let lower_here = l.is_some();
        let (origin, from) = match self.upper.redirect(u) {
            Some(r) => {
                let from = redirect_path(&base.path, &r);
                match self.lower.dir(&from)? {
                    Some(o) => {
                        sources.insert(from.clone());
                        sources.insert(id_key(&o.st));
                        (Some(o), Some(from))
                    }
                    // The rename was carried into SOURCE (an apply that stopped before it
                    // dropped the redirect): a plain directory.
                    None => (ldir(l), None),
                }
            }
            None => (ldir(l), None),
        };
        let p = base.path.clone();
        match (origin, from) {
            (Some(o), Some(from)) => {
                // The host replaced the directory the agent moved (`mv d d.old; mkdir d`):
                // the rename would carry the host's new one away.
                let replaced = self.origin_other(u, &o);
                out.push(Change {
                    kind: Kind::Renamed { from },
                    dir: true,
                    conflict: base.conflict || replaced,
                    lower_st: Some(lower_ident(&o.st)),
                    ..base
                });
                Ok(Some(o))
            }
            (Some(o), None) => {
                if self.dir_meta_differs(u, &o) {
                    out.push(Change {
                        kind: Kind::Metadata,
                        dir: true,
                        ..base
                    });
                }
                Ok(Some(o))
            }
            (None, _) => {
                // Directories the agent moved into the new one (`mkdir q; mv w/a q/a`):
                // what they carried is not deleted from SOURCE (`apply` refuses the new
                // directory while it holds them: [`Layers::moved_in`]).
                let moved = self.moved_in(u, &p)?;
                let first = moved.first().map(|(from, _)| from.clone());
                for (from, o) in moved {
                    sources.insert(from);
                    sources.insert(id_key(&o.st));
                }
                out.push(Change {
                    kind: if lower_here { Kind::Type } else { Kind::Added },
                    dir: true,
                    entries: Some(self.count(u, &p)?),
                    moved_in: first,
                    ..base
                });
                Ok(None)
            }
        }
    }

    /// A staged non-directory against its SOURCE entry `l` (`None`: no change).
    fn file_entry(&self, base: Change, u: &Node, l: Option<&Node>) -> io::Result<Option<Change>> {
        let kind_of = |k| Change {
            kind: k,
            ..base.clone()
        };
        Ok(match l {
            // Copied up from a SOURCE file that is gone now (not moved by the agent: its
            // origin no longer exists): the host deleted what was staged.
            None => Some(Change {
                conflict: base.conflict || self.origin_gone(u),
                ..kind_of(Kind::Added)
            }),
            Some(l) if kind(&l.st) != kind(&u.st) => Some(kind_of(Kind::Type)),
            Some(l) if !self.same_contents(u, l)? => Some(kind_of(Kind::Modified)),
            Some(l) if self.meta_differs(u, l) => Some(kind_of(Kind::Metadata)),
            Some(_) => None,
        })
    }

    /// Staged `u`'s overlayfs origin and a SOURCE root handle to decode it with
    /// (open_by_handle_at takes no `O_PATH` descriptor); `None` without one.
    fn origin(&self, u: &Node) -> Option<(Vec<u8>, std::os::fd::OwnedFd)> {
        let o = self.upper.xattr(u, b"trusted.overlay.origin")?;
        let d = sys::reopen(
            self.lower.source().proc_fd.as_fd(),
            self.lower.source().root.as_fd(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )
        .ok()?;
        Some((o, d))
    }

    /// Whether staged `u`'s overlayfs origin is another SOURCE object than `l` (false
    /// when it has none, or one that cannot be read).
    fn origin_other(&self, u: &Node, l: &Node) -> bool {
        self.origin(u)
            .is_some_and(|(o, d)| ssys::origin_is(d.as_fd(), &o, &l.st) == Some(false))
    }

    /// Whether staged `u` was copied up from a SOURCE file that no longer exists.
    fn origin_gone(&self, u: &Node) -> bool {
        self.origin(u)
            .is_some_and(|(o, d)| ssys::origin_exists(d.as_fd(), &o) == Some(false))
    }

    /// Whether SOURCE's entry `l`, or anything below it, changed (ctime) at or after `at`:
    /// a host edit or a new file below a directory changes none of the directory's times.
    fn changed_since(&self, l: &Node, at: i128, path: &[u8]) -> io::Result<bool> {
        if ctime_ns(&l.st) >= at {
            return Ok(true);
        }
        if kind(&l.st) != libc::S_IFDIR {
            return Ok(false);
        }
        let all_before = walk(&self.lower, l.try_clone()?, path, (), |ev| {
            let Event::Entry { dir, name, .. } = ev else {
                return Ok(Flow::Next);
            };
            Ok(match self.lower.child(&dir.node, name)? {
                Some(c) if ctime_ns(&c.st) >= at => Flow::Stop,
                Some(c) if kind(&c.st) == libc::S_IFDIR => Flow::Enter(c, ()),
                _ => Flow::Next,
            })
        })?;
        Ok(!all_before)
    }

    /// SOURCE entries an opaque staged directory (made at `at`) hides: deleted; a
    /// conflict when the host changed one (or anything below it) since, or made it.
    fn hidden_by_opaque(
        &self,
        path: &[u8],
        low: &Node,
        staged: &[Vec<u8>],
        at: i128,
        out: &mut Vec<Change>,
    ) -> io::Result<()> {
        let staged: HashSet<&Vec<u8>> = staged.iter().collect();
        for name in self.lower.list(low)? {
            if staged.contains(&name) {
                continue;
            }
            if let Some(l) = self.lower.child(low, &name)? {
                out.push(Change {
                    path: join(path, &name),
                    kind: Kind::Deleted,
                    conflict: self.changed_since(&l, at, &join(path, &name))?,
                    dir: kind(&l.st) == libc::S_IFDIR,
                    entries: None,
                    under_opaque: true,
                    lower_id: None,
                    lower_st: Some(lower_ident(&l.st)),
                    replaces: None,
                    moved_in: None,
                });
            }
        }
        Ok(())
    }

    /// Whether the staged entry at `path` can go without changing the merged view: it
    /// equals SOURCE's (a whiteout over nothing; else the same type, and for a directory
    /// every entry below it too, by the rules of [`Layers::changes`], which `all` is),
    /// and no staged directory above it is opaque (dropping it would un-hide SOURCE's) or
    /// redirected (its SOURCE counterpart is elsewhere).
    /// `Ok(false)` when there is no staged entry.
    pub fn equals_source(&self, path: &[u8], all: &[Change]) -> io::Result<bool> {
        let Some(u) = self.upper.get(path)? else {
            return Ok(false);
        };
        if all.iter().any(|c| c.within(path)) {
            return Ok(false);
        }
        let mut at: &[u8] = path;
        while !at.is_empty() {
            at = split(at).0;
            let above = self.upper.get(at)?;
            // A redirect above: the merged view shows another SOURCE path there.
            if above.is_some_and(|d| self.upper.is_opaque(&d) || self.upper.redirect(&d).is_some())
            {
                return Ok(false);
            }
        }
        let l = self.lower.get(path)?;
        if self.upper.is_whiteout(&u) {
            return Ok(l.is_none());
        }
        let Some(l) = l else {
            return Ok(false);
        };
        if kind(&l.st) != kind(&u.st) {
            return Ok(false);
        }
        Ok(kind(&u.st) == libc::S_IFDIR
            || (self.same_contents(&u, &l)? && !self.meta_differs(&u, &l)))
    }

    /// Drops the redirect of every staged directory whose rename is already in SOURCE
    /// (its old path gone, its own path a directory): what an apply stopped between the
    /// SOURCE rename and the redirect's removal leaves. Run before the overlay is mounted
    /// and before apply/discard; returns the paths repaired.
    pub fn repair(&self) -> io::Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        let Some(root) = self.upper.get(b"")? else {
            return Ok(out);
        };
        self.each_below(root, b"", |path, name, c| {
            if kind(&c.st) != libc::S_IFDIR {
                return Ok(Flow::Next);
            }
            let p = join(path, name);
            if let Some(r) = self.upper.redirect(&c)
                && self.lower.dir(&redirect_path(&p, &r))?.is_none()
                && self.lower.dir(&p)?.is_some()
            {
                super::tree::remove_marker(c.fd.as_fd(), b"redirect");
                out.push(p);
            }
            Ok(Flow::Enter(c, ()))
        })?;
        Ok(out)
    }

    /// Every staged entry below `d` at `path`, looked up: `f(its directory's path, name,
    /// entry)`, depth first; `f` returns [`Flow::Enter`] to walk into a directory.
    pub(super) fn each_below(
        &self,
        d: Node,
        path: &[u8],
        mut f: impl FnMut(&[u8], &[u8], Node) -> io::Result<Flow<()>>,
    ) -> io::Result<()> {
        walk(&self.upper, d, path, (), |ev| {
            let Event::Entry { dir, path, name } = ev else {
                return Ok(Flow::Next);
            };
            match self.upper.child(&dir.node, name)? {
                Some(c) => f(path, name, c),
                None => Ok(Flow::Next),
            }
        })
        .map(drop)
    }

    fn lower_at(&self, low: Option<&Node>, name: &[u8]) -> io::Result<Option<Node>> {
        match low {
            Some(d) if kind(&d.st) == libc::S_IFDIR => self.lower.child(d, name),
            _ => Ok(None),
        }
    }

    /// Entries below staged directory `d` (whiteouts not counted). An entry that can be
    /// neither a directory nor a whiteout is counted from its `fstatat` alone (no open:
    /// a new tree of 10,000 files costs 10,000 fewer opens).
    fn count(&self, d: &Node, path: &[u8]) -> io::Result<u64> {
        let mut n = 0;
        walk(&self.upper, d.try_clone()?, path, (), |ev| {
            let Event::Entry { dir, name, .. } = ev else {
                return Ok(Flow::Next);
            };
            let st = match sys::fstatat_nofollow(dir.node.fd.as_fd(), &Name::new(name)?) {
                Ok(st) => st,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Flow::Next),
                Err(e) => return Err(e),
            };
            let plain = match kind(&st) {
                libc::S_IFDIR => false,
                libc::S_IFCHR => st.st_rdev != 0,
                libc::S_IFREG => st.st_size != 0,
                _ => true,
            };
            if plain {
                n += 1;
                return Ok(Flow::Next);
            }
            let Some(c) = self.upper.child(&dir.node, name)? else {
                return Ok(Flow::Next);
            };
            if self.upper.is_whiteout(&c) {
                return Ok(Flow::Next);
            }
            n += 1;
            Ok(if kind(&c.st) == libc::S_IFDIR {
                Flow::Enter(c, ())
            } else {
                Flow::Next
            })
        })?;
        Ok(n)
    }

    /// Whether staged `u` differs from SOURCE's `l` in contents or metadata.
    pub(super) fn differs(&self, u: &Node, l: &Node) -> io::Result<bool> {
        Ok(!self.same_contents(u, l)? || self.meta_differs(u, l))
    }

    fn same_contents(&self, u: &Node, l: &Node) -> io::Result<bool> {
        match kind(&u.st) {
            libc::S_IFREG => self.upper.same_bytes(u, l),
            libc::S_IFLNK => Ok(sys::readlink_fd(u.fd.as_fd())? == sys::readlink_fd(l.fd.as_fd())?),
            libc::S_IFCHR | libc::S_IFBLK => Ok(standin::rdev(&u.st) == standin::rdev(&l.st)),
            _ => Ok(true),
        }
    }

    fn dir_meta_differs(&self, u: &Node, l: &Node) -> bool {
        u.st.st_mode != l.st.st_mode
            || u.st.st_uid != l.st.st_uid
            || u.st.st_gid != l.st.st_gid
            || self.upper.xattrs(u) != self.lower.xattrs(l)
    }

    fn meta_differs(&self, u: &Node, l: &Node) -> bool {
        self.dir_meta_differs(u, l)
            || (kind(&u.st) != libc::S_IFLNK
                && (u.st.st_mtime, u.st.st_mtime_nsec) != (l.st.st_mtime, l.st.st_mtime_nsec))
    }
}
