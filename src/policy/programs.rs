//! Program selectors: `exe = [...]` and `ancestor_exe = [...]` on a rule. PURE.
//!
//! The policy never looks at processes: the glue resolves the calling process's
//! executable (as that process sees it, in its own root) and its ancestors' and asks
//! [`Policy::match_programs`](super::Policy::match_programs) (`program_set.rs`) which
//! program rules they match; the answer is a bit set carried in
//! [`Caller::progs`](super::Caller), so a decision stays a pure function of (policy, path,
//! caller, need).
//!
//! Invariants: at most [`MAX_PROGRAM_RULES`] program rules in a policy set (a larger set
//! fails to load, never silently drops a rule); bit `i` is the `i`-th program rule in
//! layer order, then file order; globs are absolute paths, `*` never crosses a `/`.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::raw::{Located, RawError};

/// The most rules with `exe`/`ancestor_exe` a policy set may have (all layers together):
/// one bit each in [`Caller::progs`](super::Caller).
pub const MAX_PROGRAM_RULES: usize = 64;

/// A rule's program selector, compiled.
#[derive(Debug, Clone)]
pub(crate) struct ProgSel {
    /// `exe`: the process's own executable matches.
    exe: Option<GlobSet>,
    /// `ancestor_exe`: the process's or an ancestor's executable matches.
    pub(super) ancestor: Option<GlobSet>,
    /// The bit in [`Caller::progs`](super::Caller) (set when the layer joins a set).
    pub(crate) bit: Option<u8>,
}

impl ProgSel {
    /// Compiles a rule's `exe` and `ancestor_exe` lists (`None`: the rule has neither),
    /// recording errors: empty lists, relative paths, invalid globs.
    pub(crate) fn compile(
        exe: Option<&[Located<String>]>,
        ancestor: Option<&[Located<String>]>,
        header: &std::ops::Range<usize>,
        errors: &mut Vec<RawError>,
    ) -> Option<ProgSel> {
        if exe.is_none() && ancestor.is_none() {
            return None;
        }
        let exe = exe.map(|l| globs(l, "exe", header, errors));
        let ancestor = ancestor.map(|l| globs(l, "ancestor_exe", header, errors));
        Some(ProgSel {
            exe: exe.flatten(),
            ancestor: ancestor.flatten(),
            bit: None,
        })
    }

    /// Whether a process running `exe`, with `ancestors` (parent first), matches.
    pub(crate) fn matches(&self, exe: &[u8], ancestors: &[Vec<u8>]) -> bool {
        let hit = |set: &GlobSet, p: &[u8]| set.is_match(super::ancestors::as_path(p));
        self.exe.as_ref().is_some_and(|s| hit(s, exe))
            || self
                .ancestor
                .as_ref()
                .is_some_and(|s| hit(s, exe) || ancestors.iter().any(|a| hit(s, a)))
    }
}

fn globs(
    items: &[Located<String>],
    what: &str,
    header: &std::ops::Range<usize>,
    errors: &mut Vec<RawError>,
) -> Option<GlobSet> {
    let before = errors.len();
    if items.is_empty() {
        errors.push(RawError {
            span: header.clone(),
            message: format!("\"{what}\" must not be empty (remove the key instead)"),
        });
    }
    let mut b = GlobSetBuilder::new();
    for item in items {
        let v = &item.value;
        let err = |message: String| RawError {
            span: item.span.clone(),
            message,
        };
        if !v.starts_with('/') || v.contains('\0') {
            errors.push(err(format!(
                "{what} entry \"{v}\" must be an absolute path (the program as the process sees it)"
            )));
            continue;
        }
        match GlobBuilder::new(v)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
        {
            Ok(g) => {
                b.add(g);
            }
            Err(e) => errors.push(err(format!("invalid {what} glob \"{v}\": {e}"))),
        }
    }
    if errors.len() > before {
        return None;
    }
    b.build().ok()
}

/// Gives every program rule its bit, in layer order: `layers` yields each layer's
/// selectors, one per rule (none past the cap: [`Policy::check_limits`](super::Policy::check_limits)
/// refuses such a set).
pub(crate) fn assign_bits<'a>(layers: impl IntoIterator<Item = &'a mut Vec<Option<ProgSel>>>) {
    let mut next = 0usize;
    for prog in layers {
        for sel in prog.iter_mut().flatten() {
            sel.bit = (next < MAX_PROGRAM_RULES).then_some(next as u8);
            next += 1;
        }
    }
}
