//! Which entries of one directory listing a caller sees, decided once per class of names.
//!
//! A listing shows a name exactly when a lookup of it would not hide it:
//! `verdict_for(dir/name, caller, is_dir).effective != none`. Deciding that afresh for
//! every name runs every layer's globs over every prefix of the path, and the prefixes
//! above the name are the same for all the names of one directory. So for a *file* name
//! that no rule glob and no `except` glob of any layer matches at its own depth (the path
//! `dir/name` itself), the verdict cannot depend on the name:
//!
//! - a layer's deepest match is then found at `dir` or above, the same for every such
//!   name; the `except` globs that take a rule out at the path match `dir` or above, the
//!   same; the visibility lift applies to directories only;
//! - the mode's ceiling and the pinned paths can lower a mutating access to `read`, never
//!   to `none`, so they do not change visibility; the meet of the layers' accesses is
//!   `none` only when one of them is;
//! - ignore files are decided per name here, as everywhere (`IgnoreSet::hides`).
//!
//! Such a name is decided by the first one of its kind in the listing, through
//! [`Policy::verdict_for`], and the rest reuse that answer; every other name (a
//! directory, a name some glob matches at its depth) goes through `verdict_for` itself.
//! The property tests (`tests/policy_prop`) check this against `verdict_for` for
//! generated policies, layers and ignore files.
//!
//! Invariant: one [`Listing`] serves the names of one directory, for one caller, under
//! one policy (the borrow ties it to the policy; a reload makes a new one).

use super::ancestors::as_path;
use super::build::Layer;
use super::{Access, Caller, Policy};
use globset::Candidate;

/// The visibility of the names of one directory for one caller.
pub struct Listing<'a> {
    policy: &'a Policy,
    caller: Caller,
    /// The answer for a file name no glob matches at its depth, once one was decided.
    plain: Option<bool>,
}

impl Policy {
    /// A [`Listing`] for the names of one directory, as `caller` sees them.
    pub fn listing(&self, caller: Caller) -> Listing<'_> {
        Listing {
            policy: self,
            caller,
            plain: None,
        }
    }
}

impl Layer {
    /// No rule glob and no `except` glob of this layer matches the path `c` itself.
    fn unmatched_at(&self, c: &Candidate<'_>) -> bool {
        !self.set.is_match_candidate(c) && !self.except_set.is_match_candidate(c)
    }
}

impl Listing<'_> {
    /// Whether `path`, a direct child of this listing's directory, is listed: exactly
    /// `verdict_for(path, caller, is_dir).effective != Access::None`.
    pub fn visible(&mut self, path: &[u8], is_dir: bool) -> bool {
        let policy = self.policy;
        let full = |p: &[u8]| policy.verdict_for(p, self.caller, is_dir).effective != Access::None;
        if is_dir || path.is_empty() {
            return full(path);
        }
        // One candidate (globset normalises the path and splits off its name) for all layers.
        let c = Candidate::new(as_path(path));
        if !policy.layers().iter().all(|l| l.unmatched_at(&c)) {
            return full(path);
        }
        if policy.ignore_set().hides(path, false).is_some() {
            return false;
        }
        *self.plain.get_or_insert_with(|| full(path))
    }
}
