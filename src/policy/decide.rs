//! The decision: what a compiled [`Layer`] grants a caller at a path, what the mode's
//! ceiling is there, the errno a request gets, and whether a directory rename keeps every
//! path's policy. PURE (`&self` only; no I/O, no clock).
//!
//! # Matching
//!
//! For a path P the deepest of P, its parent, …, the root that an applicable rule
//! matches decides; at that depth a rule with `uid`/`gid` beats one without and the most
//! restrictive access wins (file order never matters); no match → `default`. A rule with
//! `uid` applies only to listed uids, with `gid` only to listed gids, with both to callers
//! matching **either** list; a rule that does not apply is ignored for that caller. A rule
//! one of whose `except` globs matches P or an ancestor of P does not exist for P (whatever
//! depth the rule itself matches at). A `none` grant is lifted to `list`
//! ([`By::Visibility`]) when something strictly below P could get `list` or more (see
//! `Layer::visibility`). The mode is a ceiling over the grant.
//!
//! Invariants: the same (policy, path, caller, need) always gets the same answer; errnos
//! come in the contract's order (ENOENT, EPERM, EROFS, EACCES); wherever a question is
//! answered from the rules rather than the host ("could match below"), the answer is
//! conservative: it may refuse a harmless rename, never allow a harmful one.

use super::glob::Pattern;

use super::build::Layer;
use super::memo;
use super::{Access, By, Caller, CeilingBy, Denial, Mode, Need, Refusal, Special, Verdict};

/// The rules that an `except` glob takes out at one path, computed on first need (most
/// decisions meet no rule with an `except` list and never compute it).
struct Exclusions<'a> {
    policy: &'a Layer,
    path: &'a [u8],
    /// Sorted rule indices, once computed.
    rules: Option<Vec<usize>>,
}

impl<'a> Exclusions<'a> {
    fn new(policy: &'a Layer, path: &'a [u8]) -> Self {
        Exclusions {
            policy,
            path,
            rules: None,
        }
    }

    /// Rule `rule` does not exist at the path: one of its `except` globs matches the path
    /// or one of its ancestors.
    fn takes_out(&mut self, rule: usize) -> bool {
        if self.policy.excepts[rule].is_empty() {
            return false;
        }
        let (policy, path) = (self.policy, self.path);
        self.rules
            .get_or_insert_with(|| {
                let mut v: Vec<usize> = policy.except_hits(path).iter().map(|h| h.0).collect();
                v.dedup();
                v
            })
            .binary_search(&rule)
            .is_ok()
    }
}

impl Layer {
    /// Whether rule `idx` applies to `caller`. A rule without `uid`/`gid` applies to
    /// everybody; with `uid` only, to callers whose uid is listed; with `gid` only, to
    /// callers whose gid is listed; with **both**, to callers whose uid **or** gid is
    /// listed (either match suffices). Panics when `idx` is out of range.
    ///
    /// A rule with `exe`/`ancestor_exe` applies only when the caller's process matches it
    /// ([`Caller::progs`]) **and** its `uid`/`gid` lists (if any) match as above.
    pub fn rule_applies(&self, idx: usize, caller: Caller) -> bool {
        let r = &self.rules[idx];
        let ids = (r.uids.is_empty() && r.gids.is_empty())
            || r.uids.contains(&caller.uid)
            || r.gids.contains(&caller.gid);
        let prog = match &self.prog[idx] {
            None => true,
            Some(sel) => sel.bit.is_some_and(|b| caller.progs & (1 << b) != 0),
        };
        ids && prog
    }

    /// The rule deciding at exactly one depth among `candidates`: id rules beat plain
    /// ones; among the winners the access is the meet of theirs (most restrictive; `create`
    /// and `append` together give `read`), decided by the lowest-index rule with exactly
    /// that access, or — when the meet is no rule's own (create ∧ append) — the lowest-index
    /// rule of them (only for a stable `By`).
    fn decide_among(
        &self,
        candidates: impl Iterator<Item = usize>,
        caller: Caller,
    ) -> Option<(Access, usize)> {
        // (has ids, meet, lowest index with access == meet, lowest index)
        let mut best: Option<(bool, Access, Option<usize>, usize)> = None;
        for idx in candidates {
            if !self.rule_applies(idx, caller) {
                continue;
            }
            let (ids, access) = (self.has_ids[idx], self.rules[idx].access);
            best = match best {
                Some(b) if b.0 && !ids => Some(b),
                Some((bids, meet, exact, low)) if bids == ids => {
                    let m = meet.meet(access);
                    let keep = |e: Option<usize>| e.filter(|&e| self.rules[e].access == m);
                    let exact = match (keep(exact), access == m) {
                        (Some(e), true) => Some(e.min(idx)),
                        (Some(e), false) => Some(e),
                        (None, true) => Some(idx),
                        (None, false) => None,
                    };
                    Some((ids, m, exact, low.min(idx)))
                }
                _ => Some((ids, access, Some(idx), idx)),
            };
        }
        best.map(|(_, access, exact, low)| (access, exact.unwrap_or(low)))
    }

    /// The deepest-matching rule for `path` (before the visibility lift), ignoring the
    /// rules `excl` takes out at `path`.
    fn deepest(
        &self,
        path: &[u8],
        caller: Caller,
        excl: &mut Exclusions<'_>,
    ) -> Option<(Access, usize)> {
        // The path and its ancestors with a match, deepest first, then the root.
        for hits in self.set.hits(path).iter() {
            let found = self.decide_among(
                hits.iter()
                    .map(|&g| self.set_to_rule[g])
                    .filter(|&i| !excl.takes_out(i)),
                caller,
            );
            if found.is_some() {
                return found;
            }
        }
        self.decide_among(
            self.root_rules
                .iter()
                .copied()
                .filter(|&i| !excl.takes_out(i)),
            caller,
        )
    }

    /// What the grants give `path` (after the visibility lift when `lift`, before the mode).
    ///
    /// For a caller whose program is unknown ([`Caller::program_unknown`]) this is the
    /// meet of what the caller would get running any program: over "no program rule
    /// matches" and "exactly program rule `i` matches", for each program rule `i` of the
    /// layer. That is the meet over every combination of matches, too: at the deciding
    /// depth more matching rules only meet more accesses (each already met alone), a
    /// match deeper or shallower than another decides alone, and a match that lifts a
    /// `none` directory to `list` only adds access. `By` is the rule of a combination
    /// that gives exactly the meet (the "no match" one when none does: create ∧ append).
    fn grant(&self, path: &[u8], caller: Caller, lift: bool) -> (Access, By) {
        let known = Caller {
            program_unknown: false,
            ..caller
        };
        if !caller.program_unknown {
            return self.grant_known(path, known, lift);
        }
        let none = Caller { progs: 0, ..known };
        let mut out = self.grant_known(path, none, lift);
        for bit in self.prog.iter().flatten().filter_map(|s| s.bit) {
            let one = self.grant_known(
                path,
                Caller {
                    progs: 1 << bit,
                    ..none
                },
                lift,
            );
            let m = out.0.meet(one.0);
            if m != out.0 {
                out = if one.0 == m { one } else { (m, out.1) };
            }
        }
        out
    }

    /// [`Layer::grant`] for a caller whose program rules are known (`caller.progs`).
    fn grant_known(&self, path: &[u8], caller: Caller, lift: bool) -> (Access, By) {
        let mut excl = Exclusions::new(self, path);
        let (access, by) = match self.deepest(path, caller, &mut excl) {
            Some((access, idx)) => (access, By::Rule(idx)),
            None => (self.default, By::Default),
        };
        if lift
            && access == Access::None
            && let Some(idx) = self.visibility(path, caller, &mut excl)
        {
            return (Access::List, By::Visibility(idx));
        }
        (access, by)
    }

    /// Why a `none` directory `path` stays visible as `list`, if it does: something
    /// strictly below it could get `list` or more.
    ///
    /// 1. An applicable rule granting `list` or more, not taken out at `path` by its own
    ///    `except`, could match below `path` → that rule.
    /// 2. Otherwise, when an applicable `none` rule that covers `path` (and is not taken out
    ///    there) has an `except` glob that could match below `path` — a hole: below it that
    ///    rule does not exist and the rules covering `path` from above, or the default,
    ///    decide — then an applicable rule granting `list` or more that covers `path` and is
    ///    not taken out there → that rule; failing that, `default` granting `list` or more →
    ///    the `none` rule with the hole.
    ///
    /// Like the rest of the lift this is decided from the rules, conservatively: "could".
    fn visibility(&self, path: &[u8], caller: Caller, excl: &mut Exclusions<'_>) -> Option<usize> {
        let below = self.lift_rules.iter().copied().find(|&idx| {
            self.rule_applies(idx, caller)
                && self.patterns[idx].could_match_below(path)
                && !excl.takes_out(idx)
        });
        if below.is_some() || self.hole_rules.is_empty() {
            return below;
        }
        let covering = self.covering_rules(path);
        let covers = |i: usize| covering.binary_search(&i).is_ok();
        let hole = self.hole_rules.iter().copied().find(|&i| {
            self.rule_applies(i, caller)
                && covers(i)
                && !excl.takes_out(i)
                && self.excepts[i].iter().any(|e| e.could_match_below(path))
        })?;
        let from_above = self
            .lift_rules
            .iter()
            .copied()
            .find(|&i| self.rule_applies(i, caller) && covers(i) && !excl.takes_out(i));
        match from_above {
            Some(i) => Some(i),
            None if self.default.includes(Access::List) => Some(hole),
            None => None,
        }
    }

    /// The rules whose `path` matches `path` or one of its ancestors (whatever their
    /// `uid`/`gid` and `except`), sorted.
    fn covering_rules(&self, path: &[u8]) -> Vec<usize> {
        let mut out = self.root_rules.clone();
        for hits in self.set.hits(path).iter() {
            out.extend(hits.iter().map(|&g| self.set_to_rule[g]));
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Every (rule, except index) whose `except` glob matches `path` or one of its
    /// ancestors, sorted: those rules do not exist for `path`.
    fn except_hits(&self, path: &[u8]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for &rule in &self.dead_rules {
            if let Some(k) = self.excepts[rule].iter().position(|e| e.root) {
                out.push((rule, k));
            }
        }
        for hits in self.except_set.hits(path).iter() {
            out.extend(hits.iter().map(|&g| self.except_to[g]));
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The rules applying to `caller` that cover `path` (their `path` matches it or an
    /// ancestor) but that one of their `except` globs takes out there, each with the index
    /// (in [`RuleInfo::except`](super::RuleInfo::except)) of the first such glob. For `explain`.
    pub fn excepted(&self, path: &[u8], caller: Caller) -> Vec<(usize, usize)> {
        if self.except_to.is_empty() && self.dead_rules.is_empty() {
            return Vec::new();
        }
        let covering = self.covering_rules(path);
        let mut out: Vec<(usize, usize)> = Vec::new();
        for (rule, k) in self.except_hits(path) {
            if out.last().is_some_and(|&(r, _)| r == rule) {
                continue; // sorted: the first glob of this rule is already in
            }
            if self.rule_applies(rule, caller) && covering.binary_search(&rule).is_ok() {
                out.push((rule, k));
            }
        }
        out
    }

    /// Whether files at `path` cannot be executed by `caller`: some `exec = false` rule
    /// that applies to the caller covers `path` (its `path` matches `path` or an
    /// ancestor) and is not taken out there by its own `except`. Unlike access, this is
    /// not decided by the deepest rule alone: a fence against executing is additive, so a
    /// deeper rule (say `**/*.sh` granting `read`) never lifts an `exec = false` above it.
    /// The returned index is the first such rule (for `explain` and audit). A caller whose
    /// program is unknown is fenced by every `exec = false` rule any program could meet.
    pub fn exec_denied(&self, path: &[u8], caller: Caller) -> Option<usize> {
        if self.noexec_rules.is_empty() {
            return None;
        }
        let caller = if caller.program_unknown {
            Caller {
                progs: u64::MAX,
                program_unknown: false,
                ..caller
            }
        } else {
            caller
        };
        let covering = self.covering_rules(path);
        let mut excl = Exclusions::new(self, path);
        self.noexec_rules.iter().copied().find(|&i| {
            self.rule_applies(i, caller) && covering.binary_search(&i).is_ok() && !excl.takes_out(i)
        })
    }

    /// Why the mode caps `path` at `read` (for `explain` and logs).
    pub fn ceiling_reason(&self, path: &[u8]) -> &'static str {
        match self.ceiling_by(path) {
            CeilingBy::ReadOnly => "no mutations anywhere",
            CeilingBy::WritableRoots => "outside writable_roots",
            CeilingBy::Protected(_) => "protected path",
            CeilingBy::Open if self.mode == Mode::Danger => "no ceiling",
            CeilingBy::Open => "inside writable_roots",
        }
    }

    /// What sets the mode's ceiling at `path`: agrees with [`Layer::ceiling`] (`Open`
    /// exactly when the ceiling is `write`). Outside every `writable_roots` entry is
    /// reported before `protected`; of several `protected` entries covering `path`, the
    /// one matching the deepest of `path` and its ancestors, the first in the file among
    /// equals.
    pub fn ceiling_by(&self, path: &[u8]) -> CeilingBy {
        match self.mode {
            Mode::ReadOnly => CeilingBy::ReadOnly,
            Mode::Danger => CeilingBy::Open,
            Mode::WorkspaceWrite => {
                if !self.roots.covers(path) {
                    CeilingBy::WritableRoots
                } else if let Some(i) = self.protect.covering_entry(path) {
                    CeilingBy::Protected(i)
                } else {
                    CeilingBy::Open
                }
            }
        }
    }

    /// `protected` entry `idx` (as in [`CeilingBy::Protected`]) as written, with its line in
    /// the policy file (`None` for the built-in default list). Panics when out of range.
    pub fn protected_entry(&self, idx: usize) -> (&str, Option<usize>) {
        (&self.protected[idx], self.protected_lines[idx])
    }

    /// The mode's ceiling at `path`: `Write` or `Read` (never lower).
    pub fn ceiling(&self, path: &[u8]) -> Access {
        match self.mode {
            Mode::ReadOnly => Access::Read,
            Mode::Danger => Access::Write,
            Mode::WorkspaceWrite => {
                if self.roots.covers(path) && !self.protect.covers(path) {
                    Access::Write
                } else {
                    Access::Read
                }
            }
        }
    }

    /// Combines a grant with the ceiling (`Write` or `Read`): the effective access is
    /// their meet.
    fn combine(grant: Access, grant_by: By, ceiling: Access) -> Verdict {
        if !ceiling.includes(grant) {
            Verdict {
                grant,
                effective: grant.meet(ceiling),
                by: By::Mode,
                grant_by,
                layer: 0,
            }
        } else {
            Verdict {
                grant,
                effective: grant,
                by: grant_by,
                grant_by,
                layer: 0,
            }
        }
    }

    /// The access `path` gets for `caller`, with what decided it. The visibility lift
    /// applies (as for a directory); see [`Layer::verdict_for`].
    pub fn verdict(&self, path: &[u8], caller: Caller) -> Verdict {
        self.verdict_for(path, caller, true)
    }

    /// Like [`Layer::verdict`], knowing whether `path` is a directory. The visibility
    /// lift only exists to reach things *below* a path, so for a non-directory
    /// (`is_dir == false`) it is skipped: a file under a `none` rule stays `none` even when
    /// some rule (say `**/*.md`) could match "below" it. Use this when the type is known.
    pub fn verdict_for(&self, path: &[u8], caller: Caller, is_dir: bool) -> Verdict {
        // The ceiling is never below Read: only a mutating grant can be lowered.
        let (grant, grant_by, ceiling) = self.decided(path, caller, is_dir, false);
        Self::combine(grant, grant_by, ceiling)
    }

    /// The grant at `path` for `caller` and the mode's ceiling there — computed only when
    /// the grant mutates or `mutating` (the need does), else `Read` (the ceiling is never
    /// lower) — through the layer's memo of the last few answers (`memo.rs`).
    fn decided(
        &self,
        path: &[u8],
        caller: Caller,
        is_dir: bool,
        mutating: bool,
    ) -> (Access, By, Access) {
        let key = memo::Key {
            layer: &self.memo,
            caller,
            is_dir,
            path,
        };
        memo::decided(
            &self.answers,
            &key,
            || self.grant(path, caller, is_dir),
            |grant| grant.mutates() || mutating,
            || self.ceiling(path),
        )
    }

    /// Decides one request on one path, errno in the spec's order:
    /// grant `none` → ENOENT (EACCES for [`Need::Create`]), by the grant;
    /// a device node / setid bit not allowed → EPERM, by [`By::Mode`] (the refusal comes from
    /// the policy's global switches, not from a path's rule);
    /// `Write`/`Create` above the mode ceiling → EROFS, by [`By::Mode`];
    /// grant not including the need's level (`Create` needs `create` or `write`, `Append`
    /// `append` or `write`) → EACCES,
    /// by the grant. The visibility lift applies (as for a directory); see
    /// [`Layer::check_for`].
    pub fn check(
        &self,
        path: &[u8],
        caller: Caller,
        need: Need,
        special: Special,
    ) -> Result<Verdict, Denial> {
        self.check_for(path, caller, need, special, true)
    }

    /// Like [`Layer::check`], knowing whether `path` is a directory (see
    /// [`Layer::verdict_for`]); for a path that does not exist yet either answer gives
    /// the same errno.
    pub fn check_for(
        &self,
        path: &[u8],
        caller: Caller,
        need: Need,
        special: Special,
        is_dir: bool,
    ) -> Result<Verdict, Denial> {
        let needed = need.access();
        let (grant, grant_by, ceiling) = self.decided(path, caller, is_dir, need.mutates());
        let verdict = Self::combine(grant, grant_by, ceiling);
        let deny = |r, by| Err(Denial::new(r, need, verdict, by));
        if grant == Access::None {
            return deny(Refusal::Hidden, grant_by);
        }
        if (special.device && !self.allow_devices) || (special.setid && !self.allow_setid) {
            return deny(Refusal::Special, By::Mode);
        }
        if need.mutates() && !ceiling.includes(needed) {
            return deny(Refusal::Mode, By::Mode);
        }
        if !grant.includes(needed) {
            return deny(Refusal::Rule, grant_by);
        }
        Ok(verdict)
    }

    /// Whether a directory may be renamed from `old` to `new` without changing any path's
    /// policy. Assumes the caller has already checked `write` on `old` and on `new`.
    ///
    /// Refused when
    /// (a) any rule — whatever its `uid`/`gid` — could match a strict descendant of `old`
    /// or of `new`, unless it is *floating*: `**/<one name glob>` (e.g. `**/*.pem`,
    /// `**/.env`) or only `**`s, which decide by the last name alone and so give `old/s`
    /// and `new/s` the same answer for every `s`; or
    /// (b) in mode workspace-write, any non-floating `writable_roots` or `protected` entry
    /// could match a strict descendant of `old` or `new` (floating ones are exempt for the
    /// same reason). In the other modes those lists play no role; or
    /// (c) a rule's `except` globs could make the rule exist differently below the two
    /// names, or non-uniformly below one of them (see `except_rename_ok`). An except glob
    /// like `**/site-packages/**` blocks nothing as long as it cannot tell the two names
    /// apart.
    ///
    /// "Could match" is a component-wise prefix check, conservative (it may refuse a
    /// rename that would in fact be harmless, never the reverse).
    pub fn dir_rename_allowed(&self, old: &[u8], new: &[u8]) -> bool {
        let pinned =
            |p: &Pattern| !p.floating && (p.could_match_below(old) || p.could_match_below(new));
        if self.patterns.iter().any(pinned) {
            return false;
        }
        if self.mode == Mode::WorkspaceWrite
            && (self.roots.pins_below(old)
                || self.roots.pins_below(new)
                || self.protect.pins_below(old)
                || self.protect.pins_below(new))
        {
            return false;
        }
        if self.excepts.iter().all(Vec::is_empty) {
            return true;
        }
        let side = |d: &[u8]| {
            let mut out: Vec<usize> = self.except_hits(d).iter().map(|h| h.0).collect();
            out.dedup();
            (self.covering_rules(d), out)
        };
        let (old_side, new_side) = (side(old), side(new));
        (0..self.rules.len())
            .filter(|&r| !self.excepts[r].is_empty())
            .all(|r| self.except_rename_ok(r, (old, &old_side), (new, &new_side)))
    }

    /// The `except` part of [`Layer::dir_rename_allowed`] for rule `r` (whatever its
    /// `uid`/`gid`); each side is (path, (rules covering it, rules taken out at it)).
    ///
    /// - Where `r` covers a side's directory and is not taken out there, no `except` glob
    ///   of `r` may match below it: `r` must exist uniformly in that subtree, as it does at
    ///   the directory itself.
    /// - Where `r` could match below either name (it is floating: any other rule that
    ///   could is refused above), it must exist alike at every `old/s` and `new/s`: taken
    ///   out at both directories (so everywhere below both), or at neither and then every
    ///   except glob stands alike after reading either name ([`Pattern::stands_alike`]:
    ///   `**/node_modules/**` between `src/a` and `lib/b`, not between `keys` and
    ///   `node_modules/keys`).
    fn except_rename_ok(
        &self,
        r: usize,
        (old, (old_cov, old_out)): (&[u8], &(Vec<usize>, Vec<usize>)),
        (new, (new_cov, new_out)): (&[u8], &(Vec<usize>, Vec<usize>)),
    ) -> bool {
        let excepts = &self.excepts[r];
        let has = |v: &Vec<usize>| v.binary_search(&r).is_ok();
        let (out_old, out_new) = (has(old_out), has(new_out));
        for (d, cov, out) in [(old, has(old_cov), out_old), (new, has(new_cov), out_new)] {
            if cov && !out && excepts.iter().any(|e| e.could_match_below(d)) {
                return false;
            }
        }
        let p = &self.patterns[r];
        if !p.could_match_below(old) && !p.could_match_below(new) {
            return true;
        }
        match (out_old, out_new) {
            (true, true) => true,
            (false, false) => excepts.iter().all(|e| e.stands_alike(old, new)),
            _ => false,
        }
    }
}
