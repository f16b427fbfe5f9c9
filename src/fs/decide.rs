//! Deciding one request against its policy snapshot: the check, the audit line, and —
//! for a refusal a rule's `ask` could lift — the question to put to an approver.
//!
//! Invariants:
//! - Every decision is counted (`status`) and, where the audit settings say so, logged
//!   exactly once: a refusal that will be asked is not logged here (the glue logs `ask`
//!   when it holds the request, or the refusal when it cannot).
//! - A refusal is lifted only when it is a rule's EACCES whose `ask` covers the need, and
//!   only for an approved re-run (`Ctx::approved`) or a remembered answer of this uid for
//!   this path; `none`, device/setid and the mode are never lifted.
//! - `--learn` reports instead of refusing only what a grant, the mode or an `ask` would
//!   refuse: `none`, device/setid (EPERM) and the pinned policy files (EROFS) stay
//!   refused and are audited as refusals (`reports_only`).

use std::sync::atomic::Ordering;

use super::ctx::{Ask, Ctx, Error, Res};
use super::ops::Shared;
use crate::approvals::Outcome;
use crate::audit::{Event, errno_name};
use crate::host::roots::Fence;
use crate::policy::{Access, By, CeilingBy, Denial, Need, Refusal, Special, Verdict};

/// The errno a layout fence (`host/roots.rs`) gives `need`, if it refuses it: a hidden
/// path is absent (EACCES for a create, as for `none`), a read-only one is EROFS, a kept
/// one EROFS for any change but its creation.
fn fenced(fence: Option<Fence>, need: Need) -> Option<i32> {
    let r = match (fence?, need) {
        (Fence::Hidden, _) => Refusal::Hidden,
        // Every mutation: `append` and `create` as much as `write`.
        (Fence::ReadOnly, n) if n.mutates() => Refusal::Mode,
        (Fence::ReadOnly, _) => return None,
        // Made once, never changed nor removed afterwards.
        (Fence::Kept, Need::Write | Need::Append) => Refusal::Mode,
        (Fence::Kept, _) => return None,
    };
    Some(r.errno(need))
}

/// One refusal an approver could lift: path, is_dir, need, the denial, the `ask` level.
type Refused<'a> = (&'a [u8], bool, Need, Denial, Access);

fn by_word(by: By) -> &'static str {
    match by {
        By::Rule(_) | By::Visibility(_) => "rule",
        By::Default => "default",
        By::Mode => "mode",
        By::Ignore(_) => "ignore",
    }
}

/// How an audit line is written.
#[derive(Clone, Copy)]
pub(super) enum Line {
    /// An ordinary allow (only with --audit-allowed) or refusal (errno).
    Plain(Option<i32>),
    /// Held for an approver.
    Held,
    /// The end of a held request (always logged).
    Outcome(Outcome),
    /// `--learn`: what the policy refuses, allowed (always logged).
    WouldDeny(i32),
}

impl Shared {
    pub(super) fn audit_line(
        &self,
        ctx: &Ctx,
        op: &'static str,
        path: &[u8],
        v: &Verdict,
        by: By,
        line: Line,
    ) {
        // A re-run that a reload allowed outright is that held request's end: always
        // audited, by reload (an approver's allow is audited where it lifts the refusal).
        let line = match (line, ctx.approved) {
            (Line::Plain(None), Some(o)) if o.by == "reload" => Line::Outcome(o),
            _ => line,
        };
        let would_deny = matches!(line, Line::WouldDeny(_));
        let (allowed, errno, by_s, held, approver) = match line {
            Line::WouldDeny(e) => (true, Some(e), by_word(by), false, None),
            Line::Plain(err) => (err.is_none(), err, by_word(by), false, None),
            Line::Held => (false, None, by_word(by), true, None),
            Line::Outcome(o) => (
                o.allow,
                (!o.allow).then_some(libc::EACCES),
                o.by,
                false,
                o.approver,
            ),
        };
        let counter = if allowed {
            &self.stats.allowed
        } else {
            &self.stats.denied
        };
        if !held {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if !allowed && !held {
            let asked = match line {
                Line::Outcome(o) => Some(o),
                _ => None,
            };
            let e = errno.unwrap_or(libc::EACCES);
            self.notes.record(ctx, op, path, v, by, e, asked.as_ref());
        }
        let Some(a) = &self.audit else { return };
        if matches!(line, Line::Plain(None)) && !a.allowed {
            return;
        }
        let policy = &ctx.snap.policy;
        let (by_s, rule) = match by {
            By::Rule(i) | By::Visibility(i) => {
                let r = policy.rule(i);
                (by_s, Some((r.pattern.clone(), Some(r.line))))
            }
            // The ignore file and the pattern of its deciding line.
            By::Ignore(hit) => {
                let (file, glob) = policy.ignore_set().describe(hit);
                (by_s, Some((format!("{file}: {glob}"), Some(hit.line))))
            }
            // What set the ceiling; an EPERM (device/setid) refusal stays "mode".
            By::Mode
                if errno != Some(libc::EPERM)
                    && matches!(line, Line::Plain(_) | Line::WouldDeny(_)) =>
            {
                match policy.ceiling_by(path) {
                    CeilingBy::Protected(i) => {
                        let (entry, line) = policy.protected_entry(i);
                        ("protected", Some((entry.to_string(), line)))
                    }
                    CeilingBy::WritableRoots => ("writable_roots", None),
                    CeilingBy::ReadOnly | CeilingBy::Open => (by_s, None),
                }
            }
            _ => (by_s, None),
        };
        a.log(Event {
            op,
            path: path.to_vec(),
            uid: ctx.caller.uid,
            gid: ctx.caller.gid,
            pid: ctx.pid,
            allowed,
            held,
            would_deny,
            approver,
            errno: errno.map(errno_name),
            access: v.effective.as_str(),
            by: by_s,
            rule,
            layer: policy.layer_name(v.layer).map(str::to_string),
            root: self
                .inodes
                .roots()
                .root_of(path)
                .map(|r| String::from_utf8_lossy(&r.path).into_owned()),
            mode: ctx.snap.policy.mode().as_str(),
            generation: ctx.snap.generation,
            need: ctx.need.get().map(|n| n.access().as_str()),
            program_unknown: ctx.caller.program_unknown,
        });
    }

    /// Audits `path`'s plain decision.
    pub(super) fn audit(
        &self,
        ctx: &Ctx,
        op: &'static str,
        path: &[u8],
        v: &Verdict,
        by: By,
        err: Option<i32>,
    ) {
        self.audit_line(ctx, op, path, v, by, Line::Plain(err));
    }

    /// Audits every path of a held request (`Held`) or of its end (`Outcome`).
    pub(super) fn audit_ask(&self, ctx: &Ctx, ask: &Ask, line: Line) {
        for (path, v, by) in &ask.paths {
            self.audit_line(ctx, ask.op, path, v, *by, line);
        }
    }

    /// A refusal the caller's approver could lift: lifted for an approved re-run or a
    /// remembered answer (`Ok`); else, for a request the glue can hold, `None` after
    /// recording what to ask; else (access(2), …) `Some(Err)` after auditing the refusal.
    fn lift(&self, ctx: &Ctx, op: &'static str, refused: &[Refused<'_>]) -> Option<Res<()>> {
        // The caller's own provisional file of an atomic save (`fs/ops/saves.rs`): lifted,
        // and left out of what is asked (a `save` asks about its target alone).
        let (temps, rest): (Vec<Refused<'_>>, Vec<Refused<'_>>) = refused
            .iter()
            .copied()
            .partition(|(p, ..)| self.provisional(ctx, p));
        let provisional = Outcome {
            allow: true,
            by: "provisional",
            approver: None,
        };
        for (path, _, _, d, _) in &temps {
            self.audit_line(ctx, op, path, &d.verdict, d.by, Line::Outcome(provisional));
        }
        if rest.is_empty() {
            return Some(Ok(()));
        }
        let save = (op == "save")
            .then(|| temps.first().map(|t| t.0.to_vec()))
            .flatten();
        let refused = &rest[..];
        let remembered = || {
            refused
                .iter()
                .all(|(p, _, _, _, _)| self.approvals.remembered(ctx.caller.uid, p))
        };
        // `--answers`: consulted before anyone is asked; a refusal there is final.
        let answered = || {
            let file = self.approvals.answers()?;
            let paths = refused.iter().map(|(p, _, _, _, a)| (*p, a.mutates()));
            file.lookup(ctx.caller.uid, paths).map(|allow| Outcome {
                allow,
                by: "answers",
                approver: None,
            })
        };
        let lifted = ctx.approved.or_else(|| {
            remembered()
                .then_some(Outcome {
                    allow: true,
                    by: "remembered",
                    approver: None,
                })
                .or_else(answered)
        });
        if let Some(o) = lifted.filter(|o| !o.allow) {
            for (path, _, _, d, _) in refused {
                self.audit_line(ctx, op, path, &d.verdict, d.by, Line::Outcome(o));
            }
            return Some(Err(Error(libc::EACCES)));
        }
        if let Some(o) = lifted {
            for (path, _, _, d, _) in refused {
                self.audit_line(ctx, op, path, &d.verdict, d.by, Line::Outcome(o));
            }
            return Some(Ok(()));
        }
        if !ctx.may_hold {
            for (path, _, _, d, _) in refused {
                self.audit(ctx, op, path, &d.verdict, d.by, Some(d.errno));
            }
            return Some(Err(Error(libc::EACCES)));
        }
        *ctx.ask.borrow_mut() = Some(Ask {
            op,
            paths: refused
                .iter()
                .map(|(p, _, _, d, _)| (p.to_vec(), d.verdict, d.by))
                .collect(),
            checks: refused.iter().map(|(_, dir, n, _, _)| (*dir, *n)).collect(),
            need: refused
                .iter()
                .map(|(_, _, _, _, a)| *a)
                .reduce(Access::join)
                .unwrap_or(Access::Write),
            save,
        });
        None
    }

    /// Decides `need` on one path; audits; refusals become the spec's errno.
    pub(super) fn allow(
        &self,
        ctx: &Ctx,
        op: &'static str,
        path: &[u8],
        is_dir: bool,
        need: Need,
        sp: Special,
    ) -> Res<Verdict> {
        ctx.need.set(Some(need));
        self.fence(ctx, op, path, is_dir, need)?;
        match ctx
            .snap
            .policy
            .check_for(path, ctx.caller, need, sp, is_dir)
        {
            Ok(v) => {
                self.learned(path, need);
                self.audit(ctx, op, path, &v, v.by, None);
                Ok(v)
            }
            Err(d) if self.reports_only(ctx, path, need, &d) => {
                self.learned(path, need);
                self.audit_line(ctx, op, path, &d.verdict, d.by, Line::WouldDeny(d.errno));
                Ok(d.verdict)
            }
            Err(d) => {
                if let Some(ask) = d.askable(&ctx.snap.policy, need) {
                    return match self.lift(ctx, op, &[(path, is_dir, need, d, ask)]) {
                        Some(Ok(())) => Ok(d.verdict),
                        _ => Err(Error(d.errno)),
                    };
                }
                self.audit(ctx, op, path, &d.verdict, d.by, Some(d.errno));
                Err(Error(d.errno))
            }
        }
    }

    /// `--learn`: records a use of `path`.
    fn learned(&self, path: &[u8], need: Need) {
        if let Some(r) = &self.settings.learn {
            r.record(path, need.access());
        }
    }

    /// `--learn` and a refusal the report-only form allows: anything but a `none` path
    /// (which still hides and still refuses), a device node or set-ID bit (EPERM: the
    /// file would land on the host outside `nodev,nosuid`) and a change of a pinned
    /// policy file (the workspace layer's, an ignore file: EROFS), so that a learning
    /// session can neither plant what the host runs nor rewrite the policy deciding it.
    fn reports_only(&self, ctx: &Ctx, path: &[u8], need: Need, d: &Denial) -> bool {
        self.learning()
            && !matches!(d.refusal, Refusal::Hidden | Refusal::Special)
            && !(need.mutates() && ctx.snap.policy.pinned(path))
    }

    /// Whether this mount learns (report-only): fs-level refusals stand aside too.
    pub(super) fn learning(&self) -> bool {
        self.settings.learn.is_some()
    }

    /// Decides several `(path, is_dir, need)` checks of one request (rename, link) against
    /// the same snapshot; when more than one refuses, the spec's order picks the errno:
    /// `none` first, then device/setid, then the mode, then a rule. Audits the answer.
    /// When every refusal is one an approver could lift, the request is asked as one.
    pub(super) fn allow_all(
        &self,
        ctx: &Ctx,
        op: &'static str,
        checks: &[(&[u8], bool, Need)],
    ) -> Res<()> {
        for &(path, is_dir, need) in checks {
            self.fence(ctx, op, path, is_dir, need)?;
        }
        let mut worst: Option<(&[u8], Need, Denial)> = None;
        let mut refused: Vec<(&[u8], Need, Denial)> = Vec::new();
        let mut oks = Vec::new();
        let mut askable = Vec::new();
        let mut all_askable = true;
        for &(path, is_dir, need) in checks {
            match ctx
                .snap
                .policy
                .check_for(path, ctx.caller, need, Special::default(), is_dir)
            {
                Ok(v) => oks.push((path, need, v)),
                Err(d) => {
                    refused.push((path, need, d));
                    match d.askable(&ctx.snap.policy, need) {
                        Some(a) => askable.push((path, is_dir, need, d, a)),
                        None => all_askable = false,
                    }
                    // The spec's order: the first kind of refusal decides.
                    if worst.as_ref().is_none_or(|(_, _, w)| d.refusal < w.refusal) {
                        worst = Some((path, need, d));
                    }
                }
            }
        }
        let reported =
            |(path, need, d): &(&[u8], Need, Denial)| self.reports_only(ctx, path, *need, d);
        if self.learning() && worst.as_ref().is_some_and(reported) && refused.iter().all(reported) {
            for (path, need, d) in &refused {
                ctx.need.set(Some(*need));
                self.learned(path, *need);
                let line = Line::WouldDeny(d.errno);
                self.audit_line(ctx, op, path, &d.verdict, d.by, line);
            }
            for (path, need, v) in oks {
                ctx.need.set(Some(need));
                self.learned(path, need);
                self.audit(ctx, op, path, &v, v.by, None);
            }
            return Ok(());
        }
        for (path, need, _) in &oks {
            self.learned(path, *need);
        }
        match worst {
            Some((_, need, d)) if all_askable => {
                ctx.need.set(Some(need));
                match self.lift(ctx, op, &askable) {
                    Some(Ok(())) => {
                        for (path, need, v) in oks {
                            ctx.need.set(Some(need));
                            self.audit(ctx, op, path, &v, v.by, None);
                        }
                        Ok(())
                    }
                    _ => Err(Error(d.errno)),
                }
            }
            Some((path, need, d)) => {
                ctx.need.set(Some(need));
                self.audit(ctx, op, path, &d.verdict, d.by, Some(d.errno));
                Err(Error(d.errno))
            }
            None => {
                for (path, need, v) in oks {
                    ctx.need.set(Some(need));
                    self.audit(ctx, op, path, &v, v.by, None);
                }
                Ok(())
            }
        }
    }

    /// Refuses (and audits) what the layout's fences forbid at `path`, before the policy
    /// is asked: no rule and no approver lifts a fence.
    pub(super) fn fence(
        &self,
        ctx: &Ctx,
        op: &'static str,
        path: &[u8],
        is_dir: bool,
        need: Need,
    ) -> Res<()> {
        let roots = self.inodes.roots();
        if roots.is_empty() {
            return Ok(());
        }
        let fence = roots.fence_at(path);
        if let Some(errno) = fenced(fence, need) {
            let mut v = ctx.snap.policy.verdict_for(path, ctx.caller, is_dir);
            // A hidden path is `none` to everyone: its audit line and `.fencefs/denials`
            // say so (`hidden`), the same as for a missing name there (`do_lookup`).
            if fence == Some(Fence::Hidden) {
                v.effective = Access::None;
            }
            self.audit(ctx, op, path, &v, By::Mode, Some(errno));
            return Err(Error(errno));
        }
        // A path with a second name (a worktree's repository, also `.git/...`): what the
        // policy refuses under that name is refused here too, no approver asked.
        if let Some(alias) = roots.alias_of(path)
            && let Err(d) =
                ctx.snap
                    .policy
                    .check_for(&alias, ctx.caller, need, Special::default(), is_dir)
        {
            self.audit(ctx, op, path, &d.verdict, d.by, Some(d.errno));
            return Err(Error(d.errno));
        }
        Ok(())
    }

    /// Decides `need` on every path a node is known under (a hard link never widens
    /// access). A node unlinked through the mount has no path: only `List` passes (stat
    /// of an open file).
    pub(super) fn allow_ino(
        &self,
        ctx: &Ctx,
        op: &'static str,
        ino: u64,
        need: Need,
        sp: Special,
    ) -> Res<()> {
        let (paths, kind) = self.inodes.paths_kind(ino)?;
        if paths.is_empty() {
            return match need {
                Need::List => Ok(()),
                _ => Err(Error(libc::ENOENT)),
            };
        }
        for p in &paths {
            self.allow(ctx, op, p, kind == libc::S_IFDIR, need, sp)?;
        }
        Ok(())
    }
}
