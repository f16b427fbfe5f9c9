//! Patterns: the policy's globs, normalized and compiled once, and what is precomputed
//! for them. PURE (no I/O).
//!
//! Job: turn one pattern string (a rule's `path` or `except`, a `writable_roots` or
//! `protected` entry) into a glob for matching and a component form (one list per brace
//! alternative) for the question "could this pattern match something strictly below
//! this path?" (the visibility lift, directory renames); [`CoverSet`] is a compiled
//! "covers" list.
//!
//! Globs are anchored at the root and matched against the bytes of workspace-relative
//! paths (`*` stays within one name, `?` is one byte, `[...]` a byte class, `**` any
//! number of directories, `\` escapes). A pattern covers what it matches and everything
//! below.
//!
//! Invariants: every path is normalized before compiling (a leading `./`, a trailing `/`,
//! empty and `.` components dropped; `.` alone is the root; empty, absolute and `..` are
//! errors). The component form is conservative: where it cannot be exact it says "could
//! match" (`**`) and clears [`Pattern`]'s `exact`, so a caller may refuse more, never less.
//! Compiling a pattern never panics (bounded brace expansion, one-glob sets).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::ancestors::{PrefixSet, as_path};

/// One component of a pattern, for the prefix-feasibility check.
#[derive(Clone, Debug)]
enum Comp {
    /// `**`: zero or more components. Also used, conservatively, for a component that
    /// merely contains `**` or cannot be compiled on its own (e.g. `{a,b/c}` split at `/`).
    AnyDirs,
    /// A name without glob metacharacters, compared as bytes (fast path).
    Literal(Box<[u8]>),
    /// A glob matching exactly one name (a one-glob set: compiling it cannot panic).
    Name(GlobSet),
}

/// A normalized pattern with what is precomputed for it.
#[derive(Clone, Debug)]
pub(super) struct Pattern {
    /// Component lists, one per brace alternative (`{a/b,c}` → `[a, b]`, `[c]`); empty
    /// for the root (`.`).
    alts: Vec<Vec<Comp>>,
    /// The pattern matches the root path `b""`: it is `.` or consists only of `**`.
    pub(super) root: bool,
    /// `**/<one component>` (or only `**`s): matches by the last name alone, so it gives
    /// `old/s` and `new/s` the same answer for every `s` (see [`Policy::dir_rename_allowed`](super::Policy::dir_rename_allowed)).
    pub(super) floating: bool,
    /// `alts` is exactly the pattern (no alternative or component was replaced by a
    /// conservative `**`), so the component automaton decides like the glob itself.
    exact: bool,
}

/// What a pattern string compiles to: the full glob (absent for the root) and its
/// component form.
pub(super) struct CompiledPattern {
    pub(super) glob: Option<globset::Glob>,
    pub(super) pattern: Pattern,
}

impl Pattern {
    /// Whether the pattern could match a strict descendant of `path`: some non-empty
    /// `rest` such that the pattern matches `path/rest`.
    pub(super) fn could_match_below(&self, path: &[u8]) -> bool {
        self.alts.iter().any(|comps| could_match_below(comps, path))
    }

    /// Whether the pattern stands at the same place after reading `old` as after reading
    /// `new`, component by component: then for every `s` it matches `old/s` exactly when
    /// it matches `new/s`, and matches a prefix of `old/s` reaching into `s` exactly when
    /// it matches such a prefix of `new/s`. (Whether it matches `old` or an ancestor of
    /// it is a separate question.) `false` for a pattern that is not [`Pattern::exact`].
    ///
    /// Examples: `**/node_modules/**` stands alike after `src/a` and `lib/b` (nothing
    /// read yet) and after `node_modules/a` and `x/node_modules` (inside), but not after
    /// `keys` and `node_modules/keys`; `a/*/c` stands alike after `a/p` and `a/q`.
    pub(super) fn stands_alike(&self, old: &[u8], new: &[u8]) -> bool {
        self.exact
            && self
                .alts
                .iter()
                .all(|comps| states_after(comps, old) == states_after(comps, new))
    }
}

/// The automaton's states after reading every name of `path` (see [`run_states`]).
fn states_after(comps: &[Comp], path: &[u8]) -> Vec<bool> {
    let m = comps.len();
    let (mut cur, mut next) = (vec![false; m + 1], vec![false; m + 1]);
    cur[0] = true;
    close(comps, &mut cur);
    if !path.is_empty() {
        for name in path.split(|&b| b == b'/') {
            next.fill(false);
            for i in 0..m {
                if cur[i] && comp_matches(&comps[i], name) {
                    let to = if matches!(comps[i], Comp::AnyDirs) {
                        i
                    } else {
                        i + 1
                    };
                    next[to] = true;
                }
            }
            close(comps, &mut next);
            std::mem::swap(&mut cur, &mut next);
        }
    }
    cur
}

/// One component glob against one name.
fn comp_matches(comp: &Comp, name: &[u8]) -> bool {
    match comp {
        Comp::AnyDirs => true,
        Comp::Literal(lit) => **lit == *name,
        Comp::Name(set) => set.is_match(as_path(name)),
    }
}

/// Runs one component list as an NFA over the path's components (state i = "the first i
/// pattern components are consumed"); O(components × depth), no allocation for patterns
/// under 64 components.
fn could_match_below(comps: &[Comp], path: &[u8]) -> bool {
    let m = comps.len();
    if m == 0 {
        return false;
    }
    const STACK: usize = 64;
    if m < STACK {
        let (mut a, mut b) = ([false; STACK + 1], [false; STACK + 1]);
        run_states(comps, path, &mut a[..=m], &mut b[..=m])
    } else {
        let (mut a, mut b) = (vec![false; m + 1], vec![false; m + 1]);
        run_states(comps, path, &mut a, &mut b)
    }
}

fn run_states<'s>(
    comps: &[Comp],
    path: &[u8],
    mut cur: &'s mut [bool],
    mut next: &'s mut [bool],
) -> bool {
    let m = comps.len();
    cur.fill(false);
    cur[0] = true;
    close(comps, cur);
    if !path.is_empty() {
        for name in path.split(|&b| b == b'/') {
            next.fill(false);
            let name = Path::new(OsStr::from_bytes(name));
            let mut any = false;
            for i in 0..m {
                if !cur[i] {
                    continue;
                }
                match &comps[i] {
                    Comp::AnyDirs => {
                        next[i] = true;
                        any = true;
                    }
                    Comp::Literal(lit) => {
                        if **lit == *name.as_os_str().as_bytes() {
                            next[i + 1] = true;
                            any = true;
                        }
                    }
                    Comp::Name(set) => {
                        if set.is_match(name) {
                            next[i + 1] = true;
                            any = true;
                        }
                    }
                }
            }
            if !any {
                return false;
            }
            close(comps, next);
            std::mem::swap(&mut cur, &mut next);
        }
    }
    // A state with pattern components left can consume at least one more name (any
    // remaining `**` or name glob matches some non-empty sequence of names).
    cur[..m].iter().any(|&s| s)
}

/// Epsilon closure: a `**` may match zero components.
fn close(comps: &[Comp], states: &mut [bool]) {
    for i in 0..comps.len() {
        if states[i] && matches!(comps[i], Comp::AnyDirs) {
            states[i + 1] = true;
        }
    }
}

/// Most brace alternatives a pattern may expand to for the component form.
const MAX_ALTS: usize = 256;

/// Expands `{a,b}` groups (nested, `\` escapes and `[...]` classes respected) into every
/// alternative; `None` when there would be more than [`MAX_ALTS`].
fn expand_braces(s: &str) -> Option<Vec<String>> {
    let b = s.as_bytes();
    let (mut i, mut class) = (0, false);
    let mut open = None;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'[' if !class => class = true,
            b']' if class => class = false,
            b'{' if !class => {
                open = Some(i);
                break;
            }
            _ => {}
        }
        i += 1;
    }
    let Some(start) = open else {
        return Some(vec![s.to_string()]);
    };
    // Find the matching close brace and the top-level commas.
    let (mut depth, mut j, mut class) = (0usize, start, false);
    let mut cuts = vec![start];
    let mut end = None;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 1,
            b'[' if !class => class = true,
            b']' if class => class = false,
            b'{' if !class => depth += 1,
            b'}' if !class => {
                depth -= 1;
                if depth == 0 {
                    end = Some(j);
                    break;
                }
            }
            b',' if !class && depth == 1 => cuts.push(j),
            _ => {}
        }
        j += 1;
    }
    let end = end?;
    cuts.push(end);
    let (pre, post) = (&s[..start], &s[end + 1..]);
    let mut out = Vec::new();
    for w in cuts.windows(2) {
        let alt = &s[w[0] + 1..w[1]];
        for e in expand_braces(&format!("{pre}{alt}{post}"))? {
            out.push(e);
            if out.len() > MAX_ALTS {
                return None;
            }
        }
    }
    Some(out)
}

/// Splits at `/` outside `[...]` classes (a class never matches `/` here anyway).
fn split_components(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let (mut out, mut from, mut i, mut class, mut class_start) = (Vec::new(), 0, 0, false, 0);
    while i < b.len() {
        match b[i] {
            b'\\' => i += 1,
            b'[' if !class => {
                class = true;
                class_start = i;
            }
            // `]` right after `[` or `[!` is a literal member of the class.
            b']' if class && i > class_start + 1 && !(i == class_start + 2 && b[i - 1] == b'!') => {
                class = false
            }
            b'/' if !class => {
                out.push(&s[from..i]);
                from = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(&s[from..]);
    out.retain(|p| !p.is_empty() && *p != ".");
    out
}

/// The component form of one (brace-free) alternative; clears `exact` when a component
/// had to be replaced by a conservative `**`.
fn components(alt: &str, exact: &mut bool) -> Vec<Comp> {
    split_components(alt)
        .into_iter()
        .map(|part| {
            if part == "**" {
                return Comp::AnyDirs;
            }
            if !part.contains(['*', '?', '[', ']', '{', '}', '\\']) {
                return Comp::Literal(part.as_bytes().into());
            }
            // `**` inside a name (`src**`, `**a`) matches like `*` (globset's rule).
            let part = part.replace("**", "*");
            glob_builder(&part)
                .build()
                .ok()
                .and_then(|g| GlobSetBuilder::new().add(g).build().ok())
                .map_or_else(
                    || {
                        *exact = false;
                        Comp::AnyDirs
                    },
                    Comp::Name,
                )
        })
        .collect()
}

fn glob_builder(glob: &str) -> GlobBuilder<'_> {
    let mut b = GlobBuilder::new(glob);
    b.literal_separator(true).backslash_escape(true);
    b
}

/// Normalizes and compiles one pattern string; `what` names it in error messages.
pub(super) fn compile_pattern(text: &str, what: &str) -> Result<CompiledPattern, String> {
    if text.is_empty() {
        return Err(format!("empty {what} (use \".\" for the workspace root)"));
    }
    if text.starts_with('/') {
        return Err(format!(
            "absolute {what} \"{text}\" (paths are relative to the workspace root)"
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(format!("\"..\" is not allowed in {what} \"{text}\""));
            }
            _ => parts.push(part),
        }
    }
    if parts.is_empty() {
        return Ok(CompiledPattern {
            glob: None,
            pattern: Pattern {
                alts: Vec::new(),
                root: true,
                floating: false,
                exact: true,
            },
        });
    }
    let normalized = parts.join("/");
    let glob = glob_builder(&normalized)
        .build()
        .map_err(|e| format!("invalid glob \"{text}\" in {what}: {}", e.kind()))?;
    // The full glob must also compile to a matcher (a regex can be too big).
    GlobSetBuilder::new()
        .add(glob.clone())
        .build()
        .map_err(|e| format!("invalid glob \"{text}\" in {what}: {}", e.kind()))?;
    // The component form, one list per brace alternative; a pattern with too many
    // alternatives keeps one conservative list (`**`: could match anywhere below).
    // `exact`: no brace explosion; `all_exact`: no component replaced either.
    let mut all_exact = true;
    let (alts, exact): (Vec<Vec<Comp>>, bool) = match expand_braces(&normalized) {
        Some(list) => (
            list.iter().map(|a| components(a, &mut all_exact)).collect(),
            true,
        ),
        None => (vec![vec![Comp::AnyDirs]], false),
    };
    let root = parts.iter().all(|p| *p == "**");
    // Floating: every alternative is `**/…/**/<one name>` (or only `**`).
    let floating = exact
        && alts.iter().all(|c| {
            !c.is_empty()
                && matches!(c[0], Comp::AnyDirs)
                && c[..c.len() - 1].iter().all(|x| matches!(x, Comp::AnyDirs))
        });
    Ok(CompiledPattern {
        glob: Some(glob),
        pattern: Pattern {
            alts,
            root,
            floating,
            exact: exact && all_exact,
        },
    })
}

/// A compiled list of "covers" patterns (`writable_roots`, `protected`).
#[derive(Clone, Debug)]
pub(super) struct CoverSet {
    set: PrefixSet,
    /// Glob index in `set` → entry index.
    set_to_entry: Vec<usize>,
    /// Some entry matches the root, hence covers everything.
    root: bool,
    patterns: Vec<Pattern>,
}

impl CoverSet {
    pub(super) fn build(items: Vec<CompiledPattern>) -> Result<CoverSet, globset::Error> {
        let mut builder = GlobSetBuilder::new();
        let mut set_to_entry = Vec::new();
        let mut root = false;
        let mut patterns = Vec::with_capacity(items.len());
        for (idx, item) in items.into_iter().enumerate() {
            if let Some(glob) = item.glob {
                builder.add(glob);
                set_to_entry.push(idx);
            }
            root |= item.pattern.root;
            patterns.push(item.pattern);
        }
        Ok(CoverSet {
            set: PrefixSet::new(builder.build()?),
            set_to_entry,
            root,
            patterns,
        })
    }

    /// The entry that covers `path`: the one matching the deepest of `path` and its
    /// ancestors (the root last); among several at that depth, the first in the file.
    pub(super) fn covering_entry(&self, path: &[u8]) -> Option<usize> {
        if let Some(hits) = self.set.hits(path).iter().next() {
            return hits.iter().map(|&g| self.set_to_entry[g]).min();
        }
        self.patterns.iter().position(|p| p.root)
    }

    /// `path` is equal to or below a match of some entry.
    pub(super) fn covers(&self, path: &[u8]) -> bool {
        self.root || !self.set.hits(path).is_empty()
    }

    /// Some non-floating entry could match a strict descendant of `path`.
    pub(super) fn pins_below(&self, path: &[u8]) -> bool {
        self.patterns
            .iter()
            .any(|p| !p.floating && p.could_match_below(path))
    }
}
