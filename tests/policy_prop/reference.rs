//! The reference: a naive implementation of the contract, matched against the engine.

use super::*;

// ------------------------------------------------------------------------ the reference

/// The reference's own lattice, independent of the engine's: each level is the set of
/// what it lets a caller do (l list, r read, c create, a append, w overwrite/delete); a
/// level includes another when its set is a superset, and the meet is the level of the
/// intersection (the SPEC: none < list < read < {create, append} < write).
pub(super) fn caps(a: Access) -> u8 {
    const L: u8 = 1;
    const R: u8 = 2;
    const C: u8 = 4;
    const A: u8 = 8;
    const W: u8 = 16;
    match a {
        Access::None => 0,
        Access::List => L,
        Access::Read => L | R,
        Access::Create => L | R | C,
        Access::Append => L | R | A,
        Access::Write => L | R | C | A | W,
    }
}

/// `a` allows everything `b` allows.
pub(super) fn ge(a: Access, b: Access) -> bool {
    caps(a) & caps(b) == caps(b)
}

/// The greatest level whose set lies inside both.
pub(super) fn meet(a: Access, b: Access) -> Access {
    let both = caps(a) & caps(b);
    Access::ALL
        .into_iter()
        .filter(|&x| caps(x) & both == caps(x))
        .max_by_key(|&x| caps(x).count_ones())
        .unwrap()
}

/// A normalized pattern: its components (`.` → no components, the root).
pub(super) type Pat = Vec<Vec<u8>>;
/// A path as its names (the root: none).
pub(super) type Path = Vec<Vec<u8>>;

/// Normalizes as the SPEC's paths are written: empty and `.` components dropped.
pub(super) fn normalize(pattern: &str) -> Pat {
    pattern
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(|c| c.as_bytes().to_vec())
        .collect()
}

/// Splits a workspace-relative path into its names (`b""` is the root: none).
pub(super) fn split(path: &[u8]) -> Vec<Vec<u8>> {
    if path.is_empty() {
        Vec::new()
    } else {
        path.split(|&b| b == b'/').map(<[u8]>::to_vec).collect()
    }
}

/// One glob component against one name, byte by byte: `*` any run of bytes, `?` one byte,
/// `[...]`/`[!...]` one byte in / not in the set, anything else itself.
fn name_matches(pat: &[u8], name: &[u8]) -> bool {
    match pat.first() {
        None => name.is_empty(),
        Some(b'*') => (0..=name.len()).any(|i| name_matches(&pat[1..], &name[i..])),
        Some(b'?') => !name.is_empty() && name_matches(&pat[1..], &name[1..]),
        Some(b'[') => {
            let close = pat.iter().position(|&b| b == b']').expect("closed class");
            let (negated, set) = match pat[1] {
                b'!' => (true, &pat[2..close]),
                _ => (false, &pat[1..close]),
            };
            !name.is_empty()
                && set.contains(&name[0]) != negated
                && name_matches(&pat[close + 1..], &name[1..])
        }
        Some(&c) => name.first() == Some(&c) && name_matches(&pat[1..], &name[1..]),
    }
}

/// Components against names: `**` absorbs any number (zero or more) of names.
fn comps_match(pat: &[Vec<u8>], path: &[Vec<u8>]) -> bool {
    match pat.split_first() {
        None => path.is_empty(),
        Some((c, rest)) if c == b"**" => (0..=path.len()).any(|i| comps_match(rest, &path[i..])),
        Some((c, rest)) => {
            !path.is_empty() && name_matches(c, &path[0]) && comps_match(rest, &path[1..])
        }
    }
}

/// Does the pattern match exactly this path?
pub(super) fn matches(pat: &Pat, path: &[Vec<u8>]) -> bool {
    let is_dstar = |c: &Vec<u8>| c == b"**";
    if TRAILING_STARSTAR_NEEDS_ONE && pat.last().is_some_and(is_dstar) && !pat.iter().all(is_dstar)
    {
        // `X/**` matches exactly the strict descendants of the matches of X.
        let keep = pat.len() - pat.iter().rev().take_while(|c| is_dstar(c)).count();
        return (0..path.len()).any(|j| comps_match(&pat[..keep], &path[..j]));
    }
    comps_match(pat, path)
}

/// The pattern matches the path or one of its ancestors (the root included).
pub(super) fn covers(pat: &Pat, path: &[Vec<u8>]) -> bool {
    (0..=path.len()).any(|d| matches(pat, &path[..d]))
}

/// Could the pattern match some strict descendant of `path`? By brute force: try every
/// `path/rest` with `rest` of 1 to `max(1, components)` names from a small alphabet of
/// witnesses, plus `a`: each literal component itself, and for each glob component the
/// first name of `NAMES`/`PATH_ONLY` it matches.
///
/// Why that is exhaustive: every non-`**` component matches exactly one name, independently
/// of the others, so in any match of `path/rest` the names of `rest` can be replaced by the
/// witnesses of the components they matched (or by `a` when a `**` absorbed them), and
/// names a `**` absorbed can be dropped down to the one a trailing `**` needs; so if some
/// `rest` works, one of at most `components` witness names works.
pub(super) fn could_match_below(pat: &Pat, path: &[Vec<u8>]) -> bool {
    let candidates: Vec<&[u8]> = NAMES
        .iter()
        .map(|n| n.as_bytes())
        .chain(PATH_ONLY.iter().copied())
        .collect();
    let mut alphabet: BTreeSet<Vec<u8>> = BTreeSet::from([b"a".to_vec()]);
    for c in pat.iter().filter(|c| *c != b"**") {
        let literal = !c.iter().any(|b| b"*?[".contains(b));
        let witness = if literal {
            Some(&c[..])
        } else {
            candidates.iter().copied().find(|n| name_matches(c, n))
        };
        alphabet.insert(
            witness
                .expect("every generated component is satisfiable")
                .to_vec(),
        );
    }
    fn dfs(pat: &Pat, alphabet: &BTreeSet<Vec<u8>>, buf: &mut Vec<Vec<u8>>, left: usize) -> bool {
        left > 0
            && alphabet.iter().any(|name| {
                buf.push(name.clone());
                let hit = matches(pat, buf) || dfs(pat, alphabet, buf, left - 1);
                buf.pop();
                hit
            })
    }
    dfs(pat, &alphabet, &mut path.to_vec(), pat.len().max(1))
}

/// `**/<one component>` (or only `**`s): decides by a path's last name alone (README,
/// "Directory renames").
pub(super) fn floating(pat: &Pat) -> bool {
    !pat.is_empty() && pat[..pat.len() - 1].iter().all(|c| c == b"**") && pat[0] == b"**"
}

/// Where a pattern stands after reading `path` (README, "Directory renames"): the
/// positions `i` the pattern can be at, `pat[..i]` consumed, each `**` taking zero or more
/// names: `pat[..i]` matches `path` exactly, or `pat[i]` is a `**` that has already
/// absorbed the last names (`pat[..=i]` matches `path`) and may absorb more. Two paths after
/// which a pattern stands alike get the same answer for every continuation.
///
/// (Only the exact prefix matches is too fine: `*/**/.env` would stand at {1, 2} after `a`
/// but at {2} after `a/a`, though both continue exactly alike. It refused renames that
/// change nothing, e.g. `a/a` to `a` under `**/.env` except `*/**/.env`.)
pub(super) fn stands(pat: &Pat, path: &[Vec<u8>]) -> Vec<usize> {
    (0..=pat.len())
        .filter(|&i| {
            comps_match(&pat[..i], path)
                || (pat.get(i).is_some_and(|c| c == b"**") && comps_match(&pat[..=i], path))
        })
        .collect()
}

pub(super) struct RefRule {
    pub(super) pat: Pat,
    pub(super) access: Access,
    /// `except` globs.
    pub(super) except: Vec<Pat>,
    pub(super) uids: Vec<u32>,
    pub(super) gids: Vec<u32>,
}

impl RefRule {
    /// SPEC: "A path that one of those globs matches, or that lies below such a match, is
    /// not covered by that rule at all".
    fn taken_out(&self, path: &[Vec<u8>]) -> bool {
        self.except.iter().any(|e| covers(e, path))
    }

    pub(super) fn has_ids(&self) -> bool {
        !self.uids.is_empty() || !self.gids.is_empty()
    }

    /// No lists: everybody; otherwise a listed uid or a listed gid.
    fn applies(&self, c: Caller) -> bool {
        !self.has_ids() || self.uids.contains(&c.uid) || self.gids.contains(&c.gid)
    }
}

/// Where the reference's grant came from.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Source {
    Default,
    /// The rules that may be named as the decider (all tie for the win).
    Rules(BTreeSet<usize>),
    /// Lifted to `list`; the rules that justify it.
    Lift(BTreeSet<usize>),
}

#[derive(Debug, Clone)]
pub(super) struct RefVerdict {
    pub(super) grant: Access,
    pub(super) ceiling: Access,
    pub(super) effective: Access,
    pub(super) source: Source,
}

pub(super) struct Reference {
    pub(super) mode: Mode,
    pub(super) default: Access,
    pub(super) allow_setid: bool,
    pub(super) allow_devices: bool,
    pub(super) rules: Vec<RefRule>,
    pub(super) roots: Vec<Pat>,
    pub(super) protected: Vec<Pat>,
    /// Memo of [`could_match_below`] (the enumeration is the reference's slow part).
    pub(super) below_memo: RefCell<HashMap<(Pat, Path), bool>>,
}

impl Reference {
    pub(super) fn new(g: &GenPolicy) -> Reference {
        let pats = |v: &Option<Vec<String>>, dflt: &[&str]| -> Vec<Pat> {
            match v {
                Some(v) => v.iter().map(|p| normalize(p)).collect(),
                None => dflt.iter().map(|p| normalize(p)).collect(),
            }
        };
        Reference {
            mode: g.override_mode.or(g.mode).unwrap_or(Mode::ReadOnly),
            default: g.default.unwrap_or(Access::Write),
            allow_setid: g.allow_setid.unwrap_or(false),
            allow_devices: g.allow_devices.unwrap_or(false),
            rules: g
                .rules
                .iter()
                .map(|r| RefRule {
                    pat: normalize(&r.path),
                    access: r.access,
                    except: r.except.iter().flatten().map(|e| normalize(e)).collect(),
                    uids: r.uids.clone().unwrap_or_default(),
                    gids: r.gids.clone().unwrap_or_default(),
                })
                .collect(),
            roots: pats(&g.writable_roots, &["."]),
            protected: pats(&g.protected, &[".git/hooks", ".git/config"]),
            below_memo: RefCell::default(),
        }
    }

    /// [`could_match_below`], memoized.
    pub(super) fn below(&self, pat: &Pat, path: &[Vec<u8>]) -> bool {
        let key = (pat.clone(), path.to_vec());
        if let Some(&hit) = self.below_memo.borrow().get(&key) {
            return hit;
        }
        let hit = could_match_below(pat, path);
        self.below_memo.borrow_mut().insert(key, hit);
        hit
    }

    pub(super) fn ceiling(&self, path: &[Vec<u8>]) -> Access {
        match self.mode {
            Mode::ReadOnly => Access::Read,
            Mode::Danger => Access::Write,
            Mode::WorkspaceWrite => {
                let inside = self.roots.iter().any(|p| covers(p, path));
                let protected = self.protected.iter().any(|p| covers(p, path));
                if inside && !protected {
                    Access::Write
                } else {
                    Access::Read
                }
            }
        }
    }

    pub(super) fn verdict(&self, path: &[Vec<u8>], caller: Caller, is_dir: bool) -> RefVerdict {
        let mut decided = None;
        // The rules that exist for this path: applicable, and no except glob of theirs
        // matches the path or one of its ancestors.
        let exists = |i: usize| self.rules[i].applies(caller) && !self.rules[i].taken_out(path);
        for depth in (0..=path.len()).rev() {
            let hits: Vec<usize> = (0..self.rules.len())
                .filter(|&i| exists(i) && matches(&self.rules[i].pat, &path[..depth]))
                .collect();
            if hits.is_empty() {
                continue;
            }
            let with_ids: Vec<usize> = hits
                .iter()
                .copied()
                .filter(|&i| self.rules[i].has_ids())
                .collect();
            let pool = if with_ids.is_empty() { hits } else { with_ids };
            let min = pool
                .iter()
                .map(|&i| self.rules[i].access)
                .reduce(meet)
                .unwrap();
            // The rules whose access is the meet decide; when none has it (create and
            // append together give read), any of them may be named.
            let exact: BTreeSet<usize> = pool
                .iter()
                .copied()
                .filter(|&i| self.rules[i].access == min)
                .collect();
            let winners = if exact.is_empty() {
                pool.into_iter().collect()
            } else {
                exact
            };
            decided = Some((min, Source::Rules(winners)));
            break;
        }
        let (mut grant, mut source) = decided.unwrap_or((self.default, Source::Default));
        if is_dir && grant == Access::None {
            // 1. a rule granting list or more could match below, and exists here
            let mut lifters: BTreeSet<usize> = (0..self.rules.len())
                .filter(|&i| {
                    let r = &self.rules[i];
                    ge(r.access, Access::List) && exists(i) && self.below(&r.pat, path)
                })
                .collect();
            // 2. a hole: a `none` rule that covers the directory and exists here has an
            //    except glob that could match below it; below that, a rule granting list
            //    or more that covers the directory (and exists here), or the default,
            //    decides.
            let holes: BTreeSet<usize> = (0..self.rules.len())
                .filter(|&i| {
                    let r = &self.rules[i];
                    r.access == Access::None
                        && exists(i)
                        && covers(&r.pat, path)
                        && r.except.iter().any(|e| self.below(e, path))
                })
                .collect();
            if !holes.is_empty() {
                lifters.extend((0..self.rules.len()).filter(|&i| {
                    let r = &self.rules[i];
                    ge(r.access, Access::List) && exists(i) && covers(&r.pat, path)
                }));
                if ge(self.default, Access::List) {
                    lifters.extend(holes);
                }
            }
            if !lifters.is_empty() {
                grant = Access::List;
                source = Source::Lift(lifters);
            }
        }
        let ceiling = self.ceiling(path);
        RefVerdict {
            grant,
            ceiling,
            effective: meet(grant, ceiling),
            source,
        }
    }

    /// `Ok` or the errno, in the SPEC's order.
    pub(super) fn check(&self, v: &RefVerdict, need: Need, special: Special) -> Result<(), i32> {
        let needed = match need {
            Need::List => Access::List,
            Need::Read => Access::Read,
            Need::Create => Access::Create,
            Need::Append => Access::Append,
            Need::Write => Access::Write,
        };
        let mutation = matches!(need, Need::Create | Need::Append | Need::Write);
        if v.grant == Access::None {
            return Err(if need == Need::Create {
                libc::EACCES
            } else {
                libc::ENOENT
            });
        }
        if (special.device && !self.allow_devices) || (special.setid && !self.allow_setid) {
            return Err(libc::EPERM);
        }
        if mutation && !ge(v.ceiling, needed) {
            return Err(libc::EROFS);
        }
        if !ge(v.grant, needed) {
            return Err(libc::EACCES);
        }
        Ok(())
    }

    /// Every pattern that takes part in a rename decision: the rules' and, in
    /// workspace-write, the `writable_roots` and `protected` entries.
    fn rename_patterns(&self) -> Vec<&Pat> {
        let mut v: Vec<&Pat> = self.rules.iter().map(|r| &r.pat).collect();
        if self.mode == Mode::WorkspaceWrite {
            v.extend(self.roots.iter().chain(&self.protected));
        }
        v
    }

    /// The documented rule: refused iff a non-floating pattern could match below either,
    /// or a rule's except globs could make it exist differently below the two names (or
    /// unevenly below one of them).
    pub(super) fn dir_rename_allowed(&self, old: &[Vec<u8>], new: &[Vec<u8>]) -> bool {
        let pinned = self
            .rename_patterns()
            .into_iter()
            .any(|p| !floating(p) && (self.below(p, old) || self.below(p, new)));
        !pinned
            && self
                .rules
                .iter()
                .all(|r| self.except_rename_ok(r, old, new))
    }

    /// README "Directory renames", for one rule's `except` list.
    fn except_rename_ok(&self, r: &RefRule, old: &[Vec<u8>], new: &[Vec<u8>]) -> bool {
        if r.except.is_empty() {
            return true;
        }
        // Where the rule covers a name and exists there, it must exist in the whole
        // subtree: no except glob may match below that name.
        for d in [old, new] {
            if covers(&r.pat, d) && !r.taken_out(d) && r.except.iter().any(|e| self.below(e, d)) {
                return false;
            }
        }
        // Where it could match below (it is floating), it must exist alike below both.
        if !self.below(&r.pat, old) && !self.below(&r.pat, new) {
            return true;
        }
        match (r.taken_out(old), r.taken_out(new)) {
            (true, true) => true,
            (false, false) => r.except.iter().all(|e| stands(e, old) == stands(e, new)),
            _ => false,
        }
    }

    /// The semantic promise of an allowed rename: for every suffix `s` (one name, or two
    /// with the first `a` or `.git`),
    /// the same rules, roots and protected entries match `old/s` and `new/s`, and (for a
    /// one-name `s`) the same rules could match below them. `Err` describes a difference.
    pub(super) fn rename_preserves_policy(
        &self,
        old: &[Vec<u8>],
        new: &[Vec<u8>],
    ) -> Result<(), String> {
        self.subtree_follows(old, new)?;
        let mut names: Vec<Vec<u8>> = NAMES.iter().map(|n| n.as_bytes().to_vec()).collect();
        names.extend(PATH_ONLY.iter().map(|n| n.to_vec()));
        let pats = self.rename_patterns();
        let under = |dir: &[Vec<u8>], s: &[Vec<u8>]| [dir, s].concat();
        let matching = |p: &[Vec<u8>]| -> Vec<usize> {
            (0..pats.len()).filter(|&i| matches(pats[i], p)).collect()
        };
        let below = |p: &[Vec<u8>]| -> Vec<usize> {
            (0..pats.len())
                .filter(|&i| self.below(pats[i], p))
                .collect()
        };
        let mut suffixes: Vec<Vec<Vec<u8>>> = names.iter().map(|n| vec![n.clone()]).collect();
        for a in [b"a".to_vec(), b".git".to_vec()] {
            for b in &names {
                suffixes.push(vec![a.clone(), b.clone()]);
            }
        }
        for s in &suffixes {
            let (o, n) = (under(old, s), under(new, s));
            if matching(&o) != matching(&n) {
                return Err(format!(
                    "patterns matching {} {:?} but {} {:?}",
                    show(&o.join(&b'/')),
                    matching(&o),
                    show(&n.join(&b'/')),
                    matching(&n)
                ));
            }
            if s.len() == 1 && below(&o) != below(&n) {
                return Err(format!(
                    "patterns that could match below {} {:?} but below {} {:?}",
                    show(&o.join(&b'/')),
                    below(&o),
                    show(&n.join(&b'/')),
                    below(&n)
                ));
            }
        }
        Ok(())
    }
}

impl Reference {
    /// The subtree's policy moves with the directory, for every caller: for every suffix
    /// `s`, `old/s` and `new/s` get the same grant, or each gets what its directory gets
    /// (SPEC: a rename is refused "when a rule could give any path below its old or its
    /// new name a different access than the directory itself gets"; floating rules, which
    /// give `old/s` and `new/s` the same answer, are the documented exception). Grants
    /// without the visibility lift.
    fn subtree_follows(&self, old: &[Vec<u8>], new: &[Vec<u8>]) -> Result<(), String> {
        let mut names: Vec<Vec<u8>> = NAMES.iter().map(|n| n.as_bytes().to_vec()).collect();
        names.extend(PATH_ONLY.iter().map(|n| n.to_vec()));
        let mut suffixes: Vec<Vec<Vec<u8>>> = names.iter().map(|n| vec![n.clone()]).collect();
        for a in [b"a".to_vec(), b".git".to_vec(), b"x.pem".to_vec()] {
            for b in &names {
                suffixes.push(vec![a.clone(), b.clone()]);
            }
        }
        for &c in CALLERS {
            let grant = |p: &[Vec<u8>]| self.verdict(p, c, false).grant;
            let (g_old, g_new) = (grant(old), grant(new));
            for s in &suffixes {
                let (o, n) = ([old, s].concat(), [new, s].concat());
                let (go, gn) = (grant(&o), grant(&n));
                if go != gn && !(go == g_old && gn == g_new) {
                    return Err(format!(
                        "{c:?}: {} gets {go:?} (its directory {g_old:?}) but {} gets {gn:?} \
                         (its directory {g_new:?})",
                        show(&o.join(&b'/')),
                        show(&n.join(&b'/')),
                    ));
                }
            }
        }
        Ok(())
    }
}
