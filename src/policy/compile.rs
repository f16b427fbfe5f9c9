//! Semantic layer: validate the raw policy from `raw.rs`, compile it once into
//! [`Policy`], and decide requests.
//!
//! # File format
//!
//! ```toml
//! mode = "workspace-write"   # read-only | workspace-write | danger   (default read-only)
//! default = "write"          # none | list | read | write             (default write)
//! writable_roots = ["."]     # globs; "." is the whole workspace      (default ["."])
//! protected = [".git/hooks", ".git/config"]                          # (this is the default)
//! allow_setid = false
//! allow_devices = false
//!
//! [[rule]]
//! path = "secrets"           # glob, relative to the workspace root (required)
//! access = "none"            # none | list | read | write          (required)
//! except = ["secrets/pub"]   # optional globs: not covered by this rule
//! uid = [1000]               # optional, non-empty
//! gid = [100]                # optional, non-empty
//! ```
//!
//! Every path (rule `path` and `except`, `writable_roots`, `protected`) is normalized: a
//! leading `./`, a trailing `/`, empty and `.` components are dropped; `.` alone is the
//! workspace root. Empty paths, absolute paths, `..` components and invalid globs are
//! errors.
//!
//! # Matching
//!
//! Globs are anchored at the root and matched against the bytes of workspace-relative
//! paths (`*` stays within one name, `?` is one byte, `[...]` a byte class, `**` any
//! number of directories, `\` escapes). A pattern covers what it matches and everything
//! below. For a path P the deepest of P, its parent, …, the root that an applicable rule
//! matches decides; at that depth a rule with `uid`/`gid` beats one without and the most
//! restrictive access wins (file order never matters); no match → `default`. A rule with
//! `uid` applies only to listed uids, with `gid` only to listed gids, with both to callers
//! matching **either** list; a rule that does not apply is ignored for that caller. A rule
//! one of whose `except` globs matches P or an ancestor of P does not exist for P (whatever
//! depth the rule itself matches at). A `none` grant is lifted to `list`
//! ([`By::Visibility`]) when something strictly below P could get `list` or more (see
//! `Policy::visibility`). The mode is a ceiling over the grant.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{Candidate, GlobBuilder, GlobSet, GlobSetBuilder};

use super::raw::{self, Located, RawError};
use super::{
    Access, By, Caller, CeilingBy, Denial, Mode, Need, PolicyError, RuleInfo, Special, Verdict,
};

/// The `protected` list used when the file does not set one.
pub const DEFAULT_PROTECTED: &[&str] = &[".git/hooks", ".git/config"];

/// The `writable_roots` list used when the file does not set one.
pub const DEFAULT_WRITABLE_ROOTS: &[&str] = &["."];

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
struct Pattern {
    /// Component lists, one per brace alternative (`{a/b,c}` → `[a, b]`, `[c]`); empty
    /// for the root (`.`).
    alts: Vec<Vec<Comp>>,
    /// The pattern matches the root path `b""`: it is `.` or consists only of `**`.
    root: bool,
    /// `**/<one component>` (or only `**`s): matches by the last name alone, so it gives
    /// `old/s` and `new/s` the same answer for every `s` (see [`Policy::dir_rename_allowed`]).
    floating: bool,
    /// `alts` is exactly the pattern (no alternative or component was replaced by a
    /// conservative `**`), so the component automaton decides like the glob itself.
    exact: bool,
}

/// What a pattern string compiles to: the full glob (absent for the root) and its
/// component form.
struct CompiledPattern {
    glob: Option<globset::Glob>,
    pattern: Pattern,
}

impl Pattern {
    /// Whether the pattern could match a strict descendant of `path`: some non-empty
    /// `rest` such that the pattern matches `path/rest`.
    fn could_match_below(&self, path: &[u8]) -> bool {
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
    fn stands_alike(&self, old: &[u8], new: &[u8]) -> bool {
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
fn compile_pattern(text: &str, what: &str) -> Result<CompiledPattern, String> {
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

/// Splits `path` into its prefixes, deepest first, ending with the root `b""`.
struct Prefixes<'a> {
    path: &'a [u8],
    end: Option<usize>,
}

fn prefixes(path: &[u8]) -> Prefixes<'_> {
    Prefixes {
        path,
        end: Some(path.len()),
    }
}

impl<'a> Iterator for Prefixes<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let end = self.end?;
        let prefix = &self.path[..end];
        self.end = if end == 0 {
            None
        } else {
            Some(prefix.iter().rposition(|&b| b == b'/').unwrap_or(0))
        };
        Some(prefix)
    }
}

fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

/// A compiled list of "covers" patterns (`writable_roots`, `protected`).
#[derive(Clone, Debug)]
struct CoverSet {
    set: GlobSet,
    /// Glob index in `set` → entry index.
    set_to_entry: Vec<usize>,
    /// Some entry matches the root, hence covers everything.
    root: bool,
    patterns: Vec<Pattern>,
}

impl CoverSet {
    fn build(items: Vec<CompiledPattern>) -> Result<CoverSet, globset::Error> {
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
            set: builder.build()?,
            set_to_entry,
            root,
            patterns,
        })
    }

    /// The entry that covers `path`: the one matching the deepest of `path` and its
    /// ancestors (the root last); among several at that depth, the first in the file.
    fn covering_entry(&self, path: &[u8]) -> Option<usize> {
        for prefix in prefixes(path).filter(|p| !p.is_empty()) {
            let hits = self.set.matches_candidate(&Candidate::new(as_path(prefix)));
            if let Some(first) = hits.iter().map(|&g| self.set_to_entry[g]).min() {
                return Some(first);
            }
        }
        self.patterns.iter().position(|p| p.root)
    }

    /// `path` is equal to or below a match of some entry.
    fn covers(&self, path: &[u8]) -> bool {
        self.root
            || prefixes(path)
                .filter(|p| !p.is_empty())
                .any(|p| self.set.is_match_candidate(&Candidate::new(as_path(p))))
    }

    /// Some non-floating entry could match a strict descendant of `path`.
    fn pins_below(&self, path: &[u8]) -> bool {
        self.patterns
            .iter()
            .any(|p| !p.floating && p.could_match_below(path))
    }
}

/// The rules that an `except` glob takes out at one path, computed on first need (most
/// decisions meet no rule with an `except` list and never compute it).
struct Exclusions<'a> {
    policy: &'a Policy,
    path: &'a [u8],
    /// Sorted rule indices, once computed.
    rules: Option<Vec<usize>>,
}

impl<'a> Exclusions<'a> {
    fn new(policy: &'a Policy, path: &'a [u8]) -> Self {
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

/// A compiled policy. Cheap to query from many threads (`&self` only); compile once per
/// load/reload.
#[derive(Debug, Clone)]
pub struct Policy {
    mode: Mode,
    default: Access,
    allow_setid: bool,
    allow_devices: bool,
    rules: Vec<RuleInfo>,
    /// Parallel to `rules`.
    patterns: Vec<Pattern>,
    /// Parallel to `rules`: the rule has a `uid` or `gid` list.
    has_ids: Vec<bool>,
    /// All rules except root-only ones (`.`), one `matches()` per depth.
    set: GlobSet,
    /// Glob index in `set` → rule index.
    set_to_rule: Vec<usize>,
    /// Rules that match the root `b""`.
    root_rules: Vec<usize>,
    /// Rules granting `list` or more (candidates for the visibility lift).
    lift_rules: Vec<usize>,
    /// Parallel to `rules`: the component forms of the rule's `except` globs.
    excepts: Vec<Vec<Pattern>>,
    /// Every `except` glob of every rule, except root-only ones (`.`).
    except_set: GlobSet,
    /// Glob index in `except_set` → (rule index, index in the rule's `except`).
    except_to: Vec<(usize, usize)>,
    /// Rules with an `except` glob that matches the root: they cover nothing at all.
    dead_rules: Vec<usize>,
    /// Rules with access `none` and an `except` list: below a directory they hide, what an
    /// except glob matches falls to other rules (see the visibility lift).
    hole_rules: Vec<usize>,
    has_id_rules: bool,
    /// `default` or some rule is `none` (see [`Policy::may_hide`]).
    may_hide: bool,
    writable_roots: Vec<String>,
    protected: Vec<String>,
    /// Parallel to `protected`: the entry's line in the file (`None` for the default list).
    protected_lines: Vec<Option<usize>>,
    roots: CoverSet,
    protect: CoverSet,
}

fn parse_access(word: &str) -> Option<Access> {
    match word {
        "none" => Some(Access::None),
        "list" => Some(Access::List),
        "read" => Some(Access::Read),
        "write" => Some(Access::Write),
        _ => None,
    }
}

/// `ask` is `read` or `write`, above the rule's `access`, which is at least `list` (a
/// hidden path cannot be asked for).
fn check_ask(
    word: &Located<String>,
    access: Option<Access>,
    errors: &mut Vec<RawError>,
) -> Option<Access> {
    let err = |message: String| RawError {
        span: word.span.clone(),
        message,
    };
    let ask = match parse_access(&word.value) {
        Some(a @ (Access::Read | Access::Write)) => a,
        _ => {
            errors.push(err(format!(
                "unknown ask \"{}\" (expected read or write)",
                word.value
            )));
            return None;
        }
    };
    match access {
        Some(Access::None) => {
            errors.push(err(
                "ask on an access = \"none\" rule: a hidden path cannot be asked for".into(),
            ));
            None
        }
        Some(a) if ask <= a => {
            errors.push(err(format!(
                "ask = \"{ask}\" must be higher than access = \"{a}\""
            )));
            None
        }
        _ => Some(ask),
    }
}

fn bad_access(word: &Located<String>, what: &str) -> RawError {
    RawError {
        span: word.span.clone(),
        message: format!(
            "unknown {what} \"{}\" (expected none, list, read or write)",
            word.value
        ),
    }
}

/// 1-based line and column (in characters) of byte `offset` in `src`.
fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(src.len());
    while !src.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &src[..offset];
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

fn to_policy_errors(src: &str, file: &str, mut errors: Vec<RawError>) -> Vec<PolicyError> {
    errors.sort_by_key(|e| e.span.start);
    errors
        .into_iter()
        .map(|e| {
            let (line, column) = line_col(src, e.span.start);
            PolicyError {
                file: file.to_string(),
                line,
                column,
                message: e.message,
            }
        })
        .collect()
}

/// Compiles a list of located pattern strings, recording errors.
fn compile_list(
    items: &[Located<String>],
    what: &str,
    errors: &mut Vec<RawError>,
) -> Vec<CompiledPattern> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match compile_pattern(&item.value, what) {
            Ok(c) => out.push(c),
            Err(message) => errors.push(RawError {
                span: item.span.clone(),
                message,
            }),
        }
    }
    out
}

fn defaults(list: &[&str], what: &str) -> Vec<CompiledPattern> {
    // Constants, known to compile (tested); an impossible failure just drops the entry.
    list.iter()
        .filter_map(|s| compile_pattern(s, what).ok())
        .collect()
}

impl Policy {
    /// Reads and compiles a policy file. A read error is one error with line 0; otherwise
    /// see [`Policy::parse`] (with `file` = `path.display()`).
    pub fn load(path: &Path) -> Result<Policy, Vec<PolicyError>> {
        let file = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(src) => Policy::parse(&src, &file),
            Err(e) => Err(vec![PolicyError {
                file,
                line: 0,
                column: 0,
                message: format!("cannot read policy file: {e}"),
            }]),
        }
    }

    /// Parses and compiles policy text. On failure returns every error found (a TOML
    /// syntax error stops parsing, so it comes alone), sorted by position, each with a
    /// 1-based line and column pointing at the offending key or value (or at the
    /// `[[rule]]` header for a missing key).
    pub fn parse(src: &str, file: &str) -> Result<Policy, Vec<PolicyError>> {
        let (raw, mut errors) = match raw::parse(src) {
            Ok(parsed) => parsed,
            Err(e) => return Err(to_policy_errors(src, file, vec![e])),
        };

        let mode = match &raw.mode {
            None => Mode::ReadOnly,
            Some(word) => word.value.parse::<Mode>().unwrap_or_else(|_| {
                errors.push(RawError {
                    span: word.span.clone(),
                    message: format!(
                        "unknown mode \"{}\" (expected read-only, workspace-write or danger)",
                        word.value
                    ),
                });
                Mode::ReadOnly
            }),
        };
        let default = match &raw.default {
            None => Access::Write,
            Some(word) => parse_access(&word.value).unwrap_or_else(|| {
                errors.push(bad_access(word, "default access"));
                Access::Write
            }),
        };

        let writable_roots: Vec<String> = match &raw.writable_roots {
            None => DEFAULT_WRITABLE_ROOTS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            Some(items) => items.iter().map(|l| l.value.clone()).collect(),
        };
        let roots = match &raw.writable_roots {
            None => defaults(DEFAULT_WRITABLE_ROOTS, "writable_roots entry"),
            Some(items) => compile_list(items, "writable_roots entry", &mut errors),
        };
        let protected: Vec<String> = match &raw.protected {
            None => DEFAULT_PROTECTED.iter().map(|s| s.to_string()).collect(),
            Some(items) => items.iter().map(|l| l.value.clone()).collect(),
        };
        let protect = match &raw.protected {
            None => defaults(DEFAULT_PROTECTED, "protected entry"),
            Some(items) => compile_list(items, "protected entry", &mut errors),
        };
        let protected_lines: Vec<Option<usize>> = match &raw.protected {
            None => vec![None; protected.len()],
            Some(items) => items
                .iter()
                .map(|l| Some(line_col(src, l.span.start).0))
                .collect(),
        };

        let mut rules = Vec::with_capacity(raw.rules.len());
        let mut compiled = Vec::with_capacity(raw.rules.len());
        let mut excepts = Vec::with_capacity(raw.rules.len());
        for r in &raw.rules {
            let except = r.except.as_deref().unwrap_or_default();
            let except_compiled = compile_list(except, "except entry", &mut errors);
            let pattern = r.path.as_ref().and_then(|p| {
                compile_pattern(&p.value, "rule path")
                    .map_err(|message| {
                        errors.push(RawError {
                            span: p.span.clone(),
                            message,
                        })
                    })
                    .ok()
            });
            let access = r.access.as_ref().and_then(|a| {
                let access = parse_access(&a.value);
                if access.is_none() {
                    errors.push(bad_access(a, "access"));
                }
                access
            });
            let ask = r
                .ask
                .as_ref()
                .and_then(|a| check_ask(a, access, &mut errors));
            if let (Some(path), Some(pattern), Some(access)) = (&r.path, pattern, access) {
                rules.push(RuleInfo {
                    pattern: path.value.clone(),
                    access,
                    ask,
                    line: line_col(src, r.header.start).0,
                    except: except.iter().map(|l| l.value.clone()).collect(),
                    uids: r.uid.clone().unwrap_or_default(),
                    gids: r.gid.clone().unwrap_or_default(),
                });
                compiled.push(pattern);
                excepts.push(except_compiled);
            }
        }

        if !errors.is_empty() {
            return Err(to_policy_errors(src, file, errors));
        }
        let mut policy = Policy::build(
            mode,
            default,
            (rules, compiled, excepts),
            (writable_roots, roots),
            (protected, protect, protected_lines),
        )
        .map_err(|e| {
            to_policy_errors(
                src,
                file,
                vec![RawError {
                    span: 0..0,
                    message: format!("the policy's globs are too complex to compile: {e}"),
                }],
            )
        })?;
        policy.allow_setid = raw.allow_setid.unwrap_or(false);
        policy.allow_devices = raw.allow_devices.unwrap_or(false);
        Ok(policy)
    }

    fn build(
        mode: Mode,
        default: Access,
        (rules, compiled, except_compiled): (
            Vec<RuleInfo>,
            Vec<CompiledPattern>,
            Vec<Vec<CompiledPattern>>,
        ),
        (writable_roots, roots): (Vec<String>, Vec<CompiledPattern>),
        (protected, protect, protected_lines): (
            Vec<String>,
            Vec<CompiledPattern>,
            Vec<Option<usize>>,
        ),
    ) -> Result<Policy, globset::Error> {
        let mut builder = GlobSetBuilder::new();
        let mut set_to_rule = Vec::new();
        let mut root_rules = Vec::new();
        let mut patterns = Vec::with_capacity(compiled.len());
        for (idx, c) in compiled.into_iter().enumerate() {
            if let Some(glob) = c.glob {
                builder.add(glob);
                set_to_rule.push(idx);
            }
            if c.pattern.root {
                root_rules.push(idx);
            }
            patterns.push(c.pattern);
        }
        let has_ids: Vec<bool> = rules
            .iter()
            .map(|r| !r.uids.is_empty() || !r.gids.is_empty())
            .collect();
        let mut except_builder = GlobSetBuilder::new();
        let mut except_to = Vec::new();
        let mut dead_rules = Vec::new();
        let mut excepts = Vec::with_capacity(except_compiled.len());
        for (rule, list) in except_compiled.into_iter().enumerate() {
            let mut patterns = Vec::with_capacity(list.len());
            for (k, c) in list.into_iter().enumerate() {
                if let Some(glob) = c.glob {
                    except_builder.add(glob);
                    except_to.push((rule, k));
                }
                if c.pattern.root && dead_rules.last() != Some(&rule) {
                    dead_rules.push(rule);
                }
                patterns.push(c.pattern);
            }
            excepts.push(patterns);
        }
        let lift_rules = (0..rules.len())
            .filter(|&i| rules[i].access >= Access::List)
            .collect();
        let hole_rules = (0..rules.len())
            .filter(|&i| rules[i].access == Access::None && !excepts[i].is_empty())
            .collect();
        // A rule that an except glob takes out at the root covers nothing, so it hides
        // nothing either.
        let may_hide = default == Access::None
            || (0..rules.len())
                .any(|i| rules[i].access == Access::None && dead_rules.binary_search(&i).is_err());
        Ok(Policy {
            mode,
            default,
            may_hide,
            excepts,
            except_set: except_builder.build()?,
            except_to,
            dead_rules,
            hole_rules,
            protected_lines,
            allow_setid: false,
            allow_devices: false,
            has_id_rules: has_ids.iter().any(|&b| b),
            has_ids,
            patterns,
            set: builder.build()?,
            set_to_rule,
            root_rules,
            lift_rules,
            rules,
            writable_roots,
            protected,
            roots: CoverSet::build(roots)?,
            protect: CoverSet::build(protect)?,
        })
    }

    /// The policy used without `--policy`: mode read-only, default `read`, no rules,
    /// every other setting at its default.
    pub fn builtin_default() -> Policy {
        // A constant, not user data; `tests::builtin_default_policy` proves it compiles.
        Policy::parse(
            "mode = \"read-only\"\ndefault = \"read\"\n",
            "<built-in policy>",
        )
        .expect("the built-in policy compiles")
    }

    /// Overrides the mode (the CLI's `--mode`).
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// The mode in force.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The access of paths no rule matches.
    pub fn default_access(&self) -> Access {
        self.default
    }

    /// The rules, in file order; [`By::Rule`] and [`By::Visibility`] index into this.
    pub fn rules(&self) -> &[RuleInfo] {
        &self.rules
    }

    /// Rule `idx` (as found in [`By::Rule`] / [`By::Visibility`]). Panics when out of range,
    /// like slice indexing: only pass indices this policy produced.
    pub fn rule(&self, idx: usize) -> &RuleInfo {
        &self.rules[idx]
    }

    /// Some rule has a `uid` or `gid` list (answers may differ between callers).
    pub fn has_id_rules(&self) -> bool {
        self.has_id_rules
    }

    /// Whether some path could be hidden from some caller: `default` is `none`, or some
    /// rule — whatever its `uid`/`gid` or the visibility lift — has access `none`.
    /// When false, every caller sees every host entry (listings, link counts are exact).
    pub fn may_hide(&self) -> bool {
        self.may_hide
    }

    /// `allow_setid = true`.
    pub fn allow_setid(&self) -> bool {
        self.allow_setid
    }

    /// `allow_devices = true`.
    pub fn allow_devices(&self) -> bool {
        self.allow_devices
    }

    /// `writable_roots` as written (`["."]` when absent).
    pub fn writable_roots(&self) -> &[String] {
        &self.writable_roots
    }

    /// `protected` as written (`[".git/hooks", ".git/config"]` when absent).
    pub fn protected(&self) -> &[String] {
        &self.protected
    }

    /// Whether rule `idx` applies to `caller`. A rule without `uid`/`gid` applies to
    /// everybody; with `uid` only, to callers whose uid is listed; with `gid` only, to
    /// callers whose gid is listed; with **both**, to callers whose uid **or** gid is
    /// listed (either match suffices). Panics when `idx` is out of range.
    pub fn rule_applies(&self, idx: usize, caller: Caller) -> bool {
        let r = &self.rules[idx];
        !self.has_ids[idx] || r.uids.contains(&caller.uid) || r.gids.contains(&caller.gid)
    }

    /// The rule deciding at exactly one depth among `candidates`: id rules beat plain
    /// ones, then the lowest access, then the lowest index (only for a stable `By`).
    fn decide_among(
        &self,
        candidates: impl Iterator<Item = usize>,
        caller: Caller,
    ) -> Option<(Access, usize)> {
        let mut best: Option<(bool, Access, usize)> = None;
        for idx in candidates {
            if !self.rule_applies(idx, caller) {
                continue;
            }
            let cand = (self.has_ids[idx], self.rules[idx].access, idx);
            best = match best {
                None => Some(cand),
                Some(b) => {
                    let better =
                        (cand.0 && !b.0) || (cand.0 == b.0 && (cand.1, cand.2) < (b.1, b.2));
                    Some(if better { cand } else { b })
                }
            };
        }
        best.map(|(_, access, idx)| (access, idx))
    }

    /// The deepest-matching rule for `path` (before the visibility lift), ignoring the
    /// rules `excl` takes out at `path`.
    fn deepest(
        &self,
        path: &[u8],
        caller: Caller,
        excl: &mut Exclusions<'_>,
    ) -> Option<(Access, usize)> {
        let mut hits = Vec::new();
        for prefix in prefixes(path) {
            let found = if prefix.is_empty() {
                self.decide_among(
                    self.root_rules
                        .iter()
                        .copied()
                        .filter(|&i| !excl.takes_out(i)),
                    caller,
                )
            } else {
                // `hits` allocates only on a first match, i.e. at most once per call.
                self.set
                    .matches_candidate_into(&Candidate::new(as_path(prefix)), &mut hits);
                if hits.is_empty() {
                    continue;
                }
                self.decide_among(
                    hits.iter()
                        .map(|&g| self.set_to_rule[g])
                        .filter(|&i| !excl.takes_out(i)),
                    caller,
                )
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// What the grants give `path` (after the visibility lift when `lift`, before the mode).
    fn grant(&self, path: &[u8], caller: Caller, lift: bool) -> (Access, By) {
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
            None if self.default >= Access::List => Some(hole),
            None => None,
        }
    }

    /// The rules whose `path` matches `path` or one of its ancestors (whatever their
    /// `uid`/`gid` and `except`), sorted.
    fn covering_rules(&self, path: &[u8]) -> Vec<usize> {
        let mut out = self.root_rules.clone();
        let mut hits = Vec::new();
        for prefix in prefixes(path).filter(|p| !p.is_empty()) {
            self.set
                .matches_candidate_into(&Candidate::new(as_path(prefix)), &mut hits);
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
        let mut hits = Vec::new();
        for prefix in prefixes(path).filter(|p| !p.is_empty()) {
            self.except_set
                .matches_candidate_into(&Candidate::new(as_path(prefix)), &mut hits);
            out.extend(hits.iter().map(|&g| self.except_to[g]));
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The rules applying to `caller` that cover `path` (their `path` matches it or an
    /// ancestor) but that one of their `except` globs takes out there, each with the index
    /// (in [`RuleInfo::except`]) of the first such glob. For `explain`.
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

    /// What sets the mode's ceiling at `path`: agrees with [`Policy::ceiling`] (`Open`
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

    /// Combines a grant with the ceiling.
    fn combine(grant: Access, grant_by: By, ceiling: Access) -> Verdict {
        if ceiling < grant {
            Verdict {
                grant,
                effective: ceiling,
                by: By::Mode,
                grant_by,
            }
        } else {
            Verdict {
                grant,
                effective: grant,
                by: grant_by,
                grant_by,
            }
        }
    }

    /// The access `path` gets for `caller`, with what decided it. The visibility lift
    /// applies (as for a directory); see [`Policy::verdict_for`].
    pub fn verdict(&self, path: &[u8], caller: Caller) -> Verdict {
        self.verdict_for(path, caller, true)
    }

    /// Like [`Policy::verdict`], knowing whether `path` is a directory. The visibility
    /// lift only exists to reach things *below* a path, so for a non-directory
    /// (`is_dir == false`) it is skipped: a file under a `none` rule stays `none` even when
    /// some rule (say `**/*.md`) could match "below" it. Use this when the type is known.
    pub fn verdict_for(&self, path: &[u8], caller: Caller, is_dir: bool) -> Verdict {
        let (grant, grant_by) = self.grant(path, caller, is_dir);
        // The ceiling is never below Read: only a Write grant can be lowered.
        let ceiling = if grant == Access::Write {
            self.ceiling(path)
        } else {
            Access::Read
        };
        Self::combine(grant, grant_by, ceiling)
    }

    /// Decides one request on one path, errno in the spec's order:
    /// grant `none` → ENOENT (EACCES for [`Need::Create`]), by the grant;
    /// a device node / setid bit not allowed → EPERM, by [`By::Mode`] (the refusal comes from
    /// the policy's global switches, not from a path's rule);
    /// `Write`/`Create` above the mode ceiling → EROFS, by [`By::Mode`];
    /// grant below the need (`List` < `Read` < `Write`; `Create` needs `Write`) → EACCES,
    /// by the grant. The visibility lift applies (as for a directory); see
    /// [`Policy::check_for`].
    pub fn check(
        &self,
        path: &[u8],
        caller: Caller,
        need: Need,
        special: Special,
    ) -> Result<Verdict, Denial> {
        self.check_for(path, caller, need, special, true)
    }

    /// Like [`Policy::check`], knowing whether `path` is a directory (see
    /// [`Policy::verdict_for`]); for a path that does not exist yet either answer gives
    /// the same errno.
    pub fn check_for(
        &self,
        path: &[u8],
        caller: Caller,
        need: Need,
        special: Special,
        is_dir: bool,
    ) -> Result<Verdict, Denial> {
        let needed = match need {
            Need::List => Access::List,
            Need::Read => Access::Read,
            Need::Write | Need::Create => Access::Write,
        };
        let (grant, grant_by) = self.grant(path, caller, is_dir);
        let ceiling = if grant == Access::Write || needed == Access::Write {
            self.ceiling(path)
        } else {
            Access::Read // the ceiling is never lower, so this cannot change the result
        };
        let verdict = Self::combine(grant, grant_by, ceiling);
        let deny = |errno, by| Err(Denial { errno, verdict, by });
        if grant == Access::None {
            let errno = if need == Need::Create {
                libc::EACCES
            } else {
                libc::ENOENT
            };
            return deny(errno, grant_by);
        }
        if (special.device && !self.allow_devices) || (special.setid && !self.allow_setid) {
            return deny(libc::EPERM, By::Mode);
        }
        if needed == Access::Write && ceiling < Access::Write {
            return deny(libc::EROFS, By::Mode);
        }
        if grant < needed {
            return deny(libc::EACCES, grant_by);
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

    /// The `except` part of [`Policy::dir_rename_allowed`] for rule `r` (whatever its
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
