//! The policy engine, proven against a naive reference (issue 6, item 4).
//!
//! `engine_matches_reference` generates random policies (as TOML text, through
//! [`Policy::parse`]), paths and callers over a small alphabet, and checks
//! [`Policy::verdict_for`], [`Policy::check_for`] and [`Policy::dir_rename_allowed`]
//! against [`Reference`], a deliberately simple implementation written from SPEC.md's
//! words ("Policy file", "Paths and matching", "Access levels", "Sandbox modes", "Errors")
//! and the README's documented choices:
//!
//! - matching: its own component-wise glob matcher (`*` within a name, `?` one byte,
//!   `[ab]`/`[!a]` one byte, `**` any number of components), no globset;
//! - `except`: a rule one of whose except globs matches P or an ancestor of P does not exist
//!   for P (SPEC: "A path that one of those globs matches, or that lies below such a match,
//!   is not covered by that rule at all"), at whatever depth the rule itself matches;
//! - the decision: walk P and its ancestors from the deepest to the root; at the first depth
//!   where an applicable rule that exists for P matches, rules with `uid`/`gid` beat those
//!   without, then the most restrictive access wins; no match → `default`;
//! - the visibility lift, for directories: `none` becomes `list` when an applicable rule
//!   granting `list` or more (existing for P) could match a strict descendant, or when a
//!   `none` rule covering P has an except glob that could match a strict descendant (a
//!   hole) and below it a rule covering P or the default grants `list` or more; "could
//!   match" decided by *enumerating* descendants (see [`could_match_below`]);
//! - the mode ceiling and the errno order (none → ENOENT, EACCES for Create;
//!   device/setid → EPERM; mode → EROFS; rule → EACCES);
//! - directory renames: refused exactly when a non-floating rule (or, in workspace-write, a
//!   `writable_roots`/`protected` entry) could match below the old or the new name, or a
//!   rule's except globs fail the README's rename conditions; and, semantically, an allowed
//!   rename never changes which rules and entries match any path below the directory, and
//!   every caller's grant of every `old/s` equals that of `new/s` or each equals its own
//!   directory's (the subtree's policy moves with it).
//!
//! The case count is `PROPTEST_CASES` (default 2,000: about 10 s of CPU in a debug build).
//!
//! The file also runs the fuzz harness (`fuzz/harness.rs`, shared with the cargo-fuzz target)
//! on stable Rust: `fuzz_seeds_replay` replays the seed corpus (and `fuzz/corpus/policy`,
//! `fuzz/artifacts/policy` when present) in every test run, and the ignored
//! `fuzz_random_inputs` mutates the seeds for `FENCEFS_FUZZ_SECS` seconds (default 20).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use fencefs::policy::{Access, By, Caller, Denial, Mode, Need, Policy, Special, Verdict};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;

#[path = "../fuzz/harness.rs"]
mod harness;

// ------------------------------------------------------------------------ the alphabet

/// Names that patterns use literally (and paths use too).
const NAMES: &[&str] = &["a", "b", ".env", "x.pem", ".git", "hooks", "config"];
/// Glob components. Each is satisfied by some name in `NAMES` (see [`could_match_below`]).
const GLOBS: &[&str] = &["*", "?", "[ab]", "[!a]", "*.pem", ".e*", "**"];
/// Path names no pattern names literally: plain, multi-byte UTF-8 (`?` is one byte, so it
/// must not match `é`), and non-UTF-8.
const PATH_ONLY: &[&[u8]] = &[b"c", "\u{e9}".as_bytes(), b"\xff"];
/// uids/gids rules may list.
const ID_POOL: &[u32] = &[0, 1000, 2000, 3000];
/// The callers every case is checked for: nobody listed, uid match only, gid match only,
/// both, root.
const CALLERS: &[Caller] = &[
    Caller { uid: 0, gid: 0 },
    Caller {
        uid: 1000,
        gid: 1000,
    },
    Caller {
        uid: 1000,
        gid: 2000,
    },
    Caller {
        uid: 2000,
        gid: 1000,
    },
    Caller { uid: 5, gid: 5 },
];
const NEEDS: &[Need] = &[Need::List, Need::Read, Need::Write, Need::Create];
const SPECIALS: &[Special] = &[
    Special {
        device: false,
        setid: false,
    },
    Special {
        device: true,
        setid: false,
    },
    Special {
        device: false,
        setid: true,
    },
    Special {
        device: true,
        setid: true,
    },
];

/// globset (and so the engine) reads a *trailing* `/**` as "one or more components":
/// `a/**` matches `a/x` and `a/x/y` but not `a` itself, while a leading or inner `**`
/// matches zero or more (`**/x` matches `x`, `a/**/b` matches `a/b`). The SPEC says "`**`
/// any number of directories", which reads as zero or more everywhere. The reference
/// follows the engine here (an open question, pinned by `trailing_starstar_is_strict`);
/// set to `false` to check the literal reading.
const TRAILING_STARSTAR_NEEDS_ONE: bool = true;

// ------------------------------------------------------------------------ generated input

#[derive(Clone, Debug)]
struct GenRule {
    path: String,
    access: Access,
    /// `except = [...]`.
    except: Option<Vec<String>>,
    uids: Option<Vec<u32>>,
    gids: Option<Vec<u32>>,
}

#[derive(Clone, Debug)]
struct GenPolicy {
    mode: Option<Mode>,
    /// The CLI's `--mode`, applied with `set_mode` after parsing.
    override_mode: Option<Mode>,
    default: Option<Access>,
    writable_roots: Option<Vec<String>>,
    protected: Option<Vec<String>>,
    allow_setid: Option<bool>,
    allow_devices: Option<bool>,
    rules: Vec<GenRule>,
    /// `rule = [{...}, ...]` instead of `[[rule]]` tables.
    inline_rules: bool,
}

impl GenPolicy {
    fn toml(&self) -> String {
        let mut s = String::new();
        let list = |v: &[String]| {
            let items: Vec<String> = v.iter().map(|p| format!("'{p}'")).collect();
            format!("[{}]", items.join(", "))
        };
        let ids = |v: &[u32]| {
            let items: Vec<String> = v.iter().map(u32::to_string).collect();
            format!("[{}]", items.join(", "))
        };
        if let Some(m) = self.mode {
            writeln!(s, "mode = \"{m}\"").unwrap();
        }
        if let Some(a) = self.default {
            writeln!(s, "default = \"{a}\"").unwrap();
        }
        if let Some(v) = &self.writable_roots {
            writeln!(s, "writable_roots = {}", list(v)).unwrap();
        }
        if let Some(v) = &self.protected {
            writeln!(s, "protected = {}", list(v)).unwrap();
        }
        if let Some(b) = self.allow_setid {
            writeln!(s, "allow_setid = {b}").unwrap();
        }
        if let Some(b) = self.allow_devices {
            writeln!(s, "allow_devices = {b}").unwrap();
        }
        if self.inline_rules && self.rules.is_empty() {
            s.push_str("rule = []\n");
        } else if self.inline_rules {
            let tables: Vec<String> = self
                .rules
                .iter()
                .map(|r| {
                    let mut t = format!("{{ path = '{}', access = \"{}\"", r.path, r.access);
                    if let Some(x) = &r.except {
                        write!(t, ", except = {}", list(x)).unwrap();
                    }
                    if let Some(u) = &r.uids {
                        write!(t, ", uid = {}", ids(u)).unwrap();
                    }
                    if let Some(g) = &r.gids {
                        write!(t, ", gid = {}", ids(g)).unwrap();
                    }
                    t + " }"
                })
                .collect();
            writeln!(s, "rule = [\n  {},\n]", tables.join(",\n  ")).unwrap();
        } else {
            for r in &self.rules {
                write!(
                    s,
                    "\n[[rule]]\npath = '{}'\naccess = \"{}\"\n",
                    r.path, r.access
                )
                .unwrap();
                if let Some(x) = &r.except {
                    writeln!(s, "except = {}", list(x)).unwrap();
                }
                if let Some(u) = &r.uids {
                    writeln!(s, "uid = {}", ids(u)).unwrap();
                }
                if let Some(g) = &r.gids {
                    writeln!(s, "gid = {}", ids(g)).unwrap();
                }
            }
        }
        s
    }
}

#[derive(Clone, Debug)]
struct Case {
    policy: GenPolicy,
    /// Paths, each with the index in `CALLERS` of the caller whose every `check_for` is
    /// compared (the verdicts are compared for every caller).
    paths: Vec<(Vec<u8>, usize)>,
    /// A directory rename (old, new); both paths are also checked as above.
    rename: ((Vec<u8>, usize), (Vec<u8>, usize)),
}

fn access() -> impl Strategy<Value = Access> {
    select(vec![
        Access::None,
        Access::List,
        Access::Read,
        Access::Write,
    ])
}

fn mode() -> impl Strategy<Value = Mode> {
    select(vec![Mode::ReadOnly, Mode::WorkspaceWrite, Mode::Danger])
}

/// A valid pattern: 1–4 components from `NAMES` and `GLOBS`, sometimes written with the
/// spellings normalization removes (`./x`, `x/`, `a//b`, `a/./b`), sometimes `.`.
fn pattern() -> impl Strategy<Value = String> {
    let comp = prop_oneof![3 => select(NAMES), 2 => select(GLOBS)];
    (prop::collection::vec(comp, 1..=4), 0..14u8).prop_map(|(comps, deco)| {
        let body = comps.join("/");
        match deco {
            0 => ".".to_string(),
            1 => format!("./{body}"),
            2 => format!("{body}/"),
            3 => body.replacen('/', "//", 1),
            4 => body.replacen('/', "/./", 1),
            _ => body,
        }
    })
}

fn ids() -> impl Strategy<Value = Option<Vec<u32>>> {
    prop::option::weighted(0.25, prop::collection::vec(select(ID_POOL), 1..=2))
}

/// An `except` glob before it is placed: a free pattern, an *anywhere* glob (`**/N`,
/// `**/N/**`), or a pattern below the rule's own path (most interesting for the depth
/// rule: the rule matches at P, the except below P).
#[derive(Clone, Debug)]
enum GenExcept {
    Free(String),
    Child(String),
}

fn except_glob() -> impl Strategy<Value = GenExcept> {
    let name = || prop_oneof![3 => select(NAMES), 1 => select(GLOBS)];
    prop_oneof![
        2 => pattern().prop_map(GenExcept::Free),
        // anchored at a name that rename paths use: `a`, `a/**`, `.git/*`, ...
        1 => (select(NAMES), select(vec!["", "/**", "/*", "/a"]))
            .prop_map(|(n, tail)| GenExcept::Free(format!("{n}{tail}"))),
        2 => (name(), any::<bool>()).prop_map(|(n, trailing)| GenExcept::Free(if trailing {
            format!("**/{n}/**")
        } else {
            format!("**/{n}")
        })),
        3 => prop::collection::vec(prop_oneof![3 => select(NAMES), 2 => select(GLOBS)], 1..=2)
            .prop_map(|c| GenExcept::Child(c.join("/"))),
    ]
}

/// A rule path: mostly [`pattern`], sometimes a floating `**/<name>` like the example
/// policy's `**/*.pem` (the rules `except` is mostly written for).
fn rule_path() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => pattern(),
        1 => prop_oneof![3 => select(NAMES), 2 => select(GLOBS)].prop_map(|n| format!("**/{n}")),
    ]
}

fn rule() -> impl Strategy<Value = GenRule> {
    (
        rule_path(),
        access(),
        prop::option::weighted(0.35, prop::collection::vec(except_glob(), 0..=2)),
        ids(),
        ids(),
    )
        .prop_map(|(path, access, except, uids, gids)| {
            let except = except.map(|list| {
                list.into_iter()
                    .map(|e| match e {
                        GenExcept::Free(g) => g,
                        GenExcept::Child(c) if normalize(&path).is_empty() => c,
                        GenExcept::Child(c) => format!("{path}/{c}"),
                    })
                    .collect()
            });
            GenRule {
                path,
                access,
                except,
                uids,
                gids,
            }
        })
}

fn gen_policy() -> impl Strategy<Value = GenPolicy> {
    let patterns = || prop::option::weighted(0.6, prop::collection::vec(pattern(), 0..=3));
    (
        (
            prop::option::of(mode()),
            prop::option::weighted(0.2, mode()),
            prop::option::weighted(0.7, access()),
        ),
        (patterns(), patterns()),
        (
            prop::option::of(any::<bool>()),
            prop::option::of(any::<bool>()),
        ),
        prop::collection::vec(rule(), 0..=8),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(
                (mode, override_mode, default),
                (writable_roots, protected),
                (allow_setid, allow_devices),
                rules,
                inline_rules,
            )| GenPolicy {
                mode,
                override_mode,
                default,
                writable_roots,
                protected,
                allow_setid,
                allow_devices,
                rules,
                inline_rules,
            },
        )
}

fn path(depth: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<u8>> {
    let mut names: Vec<&'static [u8]> = NAMES.iter().map(|n| n.as_bytes()).collect();
    names.extend_from_slice(PATH_ONLY);
    prop::collection::vec(select(names), depth).prop_map(|comps| comps.join(&b'/'))
}

fn case() -> impl Strategy<Value = Case> {
    let caller = || 0..CALLERS.len();
    (
        gen_policy(),
        prop::collection::vec((path(0..=4), caller()), 1..=4),
        ((path(1..=3), caller()), (path(1..=3), caller())),
    )
        .prop_map(|(policy, paths, rename)| Case {
            policy,
            paths,
            rename,
        })
}

// ------------------------------------------------------------------------ the reference

/// A normalized pattern: its components (`.` → no components, the root).
type Pat = Vec<Vec<u8>>;
/// A path as its names (the root: none).
type Path = Vec<Vec<u8>>;

/// Normalizes as the SPEC's paths are written: empty and `.` components dropped.
fn normalize(pattern: &str) -> Pat {
    pattern
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(|c| c.as_bytes().to_vec())
        .collect()
}

/// Splits a workspace-relative path into its names (`b""` is the root: none).
fn split(path: &[u8]) -> Vec<Vec<u8>> {
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
fn matches(pat: &Pat, path: &[Vec<u8>]) -> bool {
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
fn covers(pat: &Pat, path: &[Vec<u8>]) -> bool {
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
fn could_match_below(pat: &Pat, path: &[Vec<u8>]) -> bool {
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
fn floating(pat: &Pat) -> bool {
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
fn stands(pat: &Pat, path: &[Vec<u8>]) -> Vec<usize> {
    (0..=pat.len())
        .filter(|&i| {
            comps_match(&pat[..i], path)
                || (pat.get(i).is_some_and(|c| c == b"**") && comps_match(&pat[..=i], path))
        })
        .collect()
}

struct RefRule {
    pat: Pat,
    access: Access,
    /// `except` globs.
    except: Vec<Pat>,
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl RefRule {
    /// SPEC: "A path that one of those globs matches, or that lies below such a match, is
    /// not covered by that rule at all".
    fn taken_out(&self, path: &[Vec<u8>]) -> bool {
        self.except.iter().any(|e| covers(e, path))
    }

    fn has_ids(&self) -> bool {
        !self.uids.is_empty() || !self.gids.is_empty()
    }

    /// No lists: everybody; otherwise a listed uid or a listed gid.
    fn applies(&self, c: Caller) -> bool {
        !self.has_ids() || self.uids.contains(&c.uid) || self.gids.contains(&c.gid)
    }
}

/// Where the reference's grant came from.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    Default,
    /// The rules that may be named as the decider (all tie for the win).
    Rules(BTreeSet<usize>),
    /// Lifted to `list`; the rules that justify it.
    Lift(BTreeSet<usize>),
}

#[derive(Debug, Clone)]
struct RefVerdict {
    grant: Access,
    ceiling: Access,
    effective: Access,
    source: Source,
}

struct Reference {
    mode: Mode,
    default: Access,
    allow_setid: bool,
    allow_devices: bool,
    rules: Vec<RefRule>,
    roots: Vec<Pat>,
    protected: Vec<Pat>,
    /// Memo of [`could_match_below`] (the enumeration is the reference's slow part).
    below_memo: RefCell<HashMap<(Pat, Path), bool>>,
}

impl Reference {
    fn new(g: &GenPolicy) -> Reference {
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
    fn below(&self, pat: &Pat, path: &[Vec<u8>]) -> bool {
        let key = (pat.clone(), path.to_vec());
        if let Some(&hit) = self.below_memo.borrow().get(&key) {
            return hit;
        }
        let hit = could_match_below(pat, path);
        self.below_memo.borrow_mut().insert(key, hit);
        hit
    }

    fn ceiling(&self, path: &[Vec<u8>]) -> Access {
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

    fn verdict(&self, path: &[Vec<u8>], caller: Caller, is_dir: bool) -> RefVerdict {
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
            let min = pool.iter().map(|&i| self.rules[i].access).min().unwrap();
            let winners = pool
                .into_iter()
                .filter(|&i| self.rules[i].access == min)
                .collect();
            decided = Some((min, Source::Rules(winners)));
            break;
        }
        let (mut grant, mut source) = decided.unwrap_or((self.default, Source::Default));
        if is_dir && grant == Access::None {
            // 1. a rule granting list or more could match below, and exists here
            let mut lifters: BTreeSet<usize> = (0..self.rules.len())
                .filter(|&i| {
                    let r = &self.rules[i];
                    r.access >= Access::List && exists(i) && self.below(&r.pat, path)
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
                    r.access >= Access::List && exists(i) && covers(&r.pat, path)
                }));
                if self.default >= Access::List {
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
            effective: grant.min(ceiling),
            source,
        }
    }

    /// `Ok` or the errno, in the SPEC's order.
    fn check(&self, v: &RefVerdict, need: Need, special: Special) -> Result<(), i32> {
        let needed = match need {
            Need::List => Access::List,
            Need::Read => Access::Read,
            Need::Write | Need::Create => Access::Write,
        };
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
        if needed == Access::Write && v.ceiling < Access::Write {
            return Err(libc::EROFS);
        }
        if v.grant < needed {
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
    fn dir_rename_allowed(&self, old: &[Vec<u8>], new: &[Vec<u8>]) -> bool {
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
    fn rename_preserves_policy(&self, old: &[Vec<u8>], new: &[Vec<u8>]) -> Result<(), String> {
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

// ------------------------------------------------------------------------ the property

fn show(path: &[u8]) -> String {
    format!("\"{}\"", path.escape_ascii())
}

fn need_name(n: Need) -> &'static str {
    match n {
        Need::List => "List",
        Need::Read => "Read",
        Need::Write => "Write",
        Need::Create => "Create",
    }
}

/// Checks the engine's verdict (and its provenance) against the reference's.
fn check_verdict(v: &Verdict, r: &RefVerdict, p: &Policy) -> Result<(), String> {
    if (v.grant, v.effective) != (r.grant, r.effective) {
        return Err(format!(
            "grant/effective: engine {:?}/{:?}, reference {:?}/{:?} ({:?})",
            v.grant, v.effective, r.grant, r.effective, r.source
        ));
    }
    let by_mode = r.ceiling < r.grant;
    if (v.by == By::Mode) != by_mode || (!by_mode && v.by != v.grant_by) {
        return Err(format!(
            "by: engine {:?}, reference ceiling {:?} under grant {:?}",
            v.by, r.ceiling, r.grant
        ));
    }
    let ok = match (&r.source, v.grant_by) {
        (Source::Default, By::Default) => true,
        (Source::Rules(set), By::Rule(i)) | (Source::Lift(set), By::Visibility(i)) => {
            set.contains(&i)
        }
        _ => false,
    };
    if !ok {
        return Err(format!(
            "grant_by: engine {:?} ({:?}), reference {:?}",
            v.grant_by,
            match v.grant_by {
                By::Rule(i) | By::Visibility(i) => Some(&p.rule(i).pattern),
                _ => None,
            },
            r.source
        ));
    }
    Ok(())
}

fn check_denial(
    got: &Result<Verdict, Denial>,
    want: Result<(), i32>,
    verdict: &Verdict,
) -> Result<(), String> {
    match (got, want) {
        (Ok(v), Ok(())) if v == verdict => Ok(()),
        (Err(d), Err(errno)) if d.errno == errno => {
            let by = if errno == libc::EPERM || errno == libc::EROFS {
                By::Mode
            } else {
                verdict.grant_by
            };
            if d.verdict != *verdict || d.by != by {
                return Err(format!(
                    "denial {d:?}: expected verdict {verdict:?} and by {by:?}"
                ));
            }
            Ok(())
        }
        _ => Err(format!(
            "engine {:?}, reference {:?}",
            got.as_ref().map_err(|d| d.errno),
            want
        )),
    }
}

fn run_case(case: &Case) -> Result<(), String> {
    let text = case.policy.toml();
    let mut policy = Policy::parse(&text, "prop.toml")
        .map_err(|e| format!("generated policy does not parse: {e:?}\n{text}"))?;
    if let Some(m) = case.policy.override_mode {
        policy.set_mode(m);
    }
    let r = Reference::new(&case.policy);
    let ctx = |what: String| format!("{what}\n--- prop.toml (mode {})\n{text}", r.mode);

    if policy.mode() != r.mode
        || policy.default_access() != r.default
        || policy.allow_setid() != r.allow_setid
        || policy.allow_devices() != r.allow_devices
        || policy.rules().len() != r.rules.len()
        || policy.has_id_rules() != r.rules.iter().any(RefRule::has_ids)
    {
        return Err(ctx("accessors disagree with the file".into()));
    }

    let mut paths = case.paths.clone();
    paths.push(case.rename.0.clone());
    paths.push(case.rename.1.clone());
    for (path, checked) in &paths {
        let comps = split(path);
        let ceiling = policy.ceiling(path);
        if ceiling != r.ceiling(&comps) {
            return Err(ctx(format!(
                "ceiling({}): engine {ceiling:?}, reference {:?}",
                show(path),
                r.ceiling(&comps)
            )));
        }
        for (ci, &caller) in CALLERS.iter().enumerate() {
            for is_dir in [true, false] {
                let want = r.verdict(&comps, caller, is_dir);
                let v = policy.verdict_for(path, caller, is_dir);
                let at = || format!("path {}, {caller:?}, is_dir {is_dir}", show(path));
                check_verdict(&v, &want, &policy)
                    .map_err(|e| ctx(format!("verdict_for({}): {e}", at())))?;
                if is_dir && policy.verdict(path, caller) != v {
                    return Err(ctx(format!("verdict != verdict_for(.., true) at {}", at())));
                }
                // Every need and special for the case's own caller of this path; the
                // verdict alone for the others (globset is slow in a debug build).
                if ci != *checked {
                    continue;
                }
                for &need in NEEDS {
                    for &special in SPECIALS {
                        let got = policy.check_for(path, caller, need, special, is_dir);
                        check_denial(&got, r.check(&want, need, special), &v).map_err(|e| {
                            ctx(format!(
                                "check_for({}, {}, {special:?}): {e}",
                                at(),
                                need_name(need)
                            ))
                        })?;
                        if is_dir
                            && special == SPECIALS[0]
                            && policy.check(path, caller, need, special) != got
                        {
                            return Err(ctx(format!("check != check_for(.., true) at {}", at())));
                        }
                    }
                }
            }
        }
    }

    let ((old, _), (new, _)) = &case.rename;
    let (o, n) = (split(old), split(new));
    let got = policy.dir_rename_allowed(old, new);
    let want = r.dir_rename_allowed(&o, &n);
    if got != want {
        return Err(ctx(format!(
            "dir_rename_allowed({}, {}): engine {got}, reference {want}",
            show(old),
            show(new)
        )));
    }
    if got {
        r.rename_preserves_policy(&o, &n).map_err(|e| {
            ctx(format!(
                "dir_rename_allowed({}, {}) but the rename changes a policy: {e}",
                show(old),
                show(new)
            ))
        })?;
    }
    Ok(())
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    ProptestConfig {
        cases,
        // Failures print the minimal case; no regression files written into tests/.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// The property: on every generated case, the engine decides as the reference does.
    #[test]
    fn engine_matches_reference(case in case()) {
        run_case(&case).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    // Parsing-only cases: a quarter of PROPTEST_CASES is plenty.
    #![proptest_config(ProptestConfig { cases: config().cases.div_ceil(4), ..config() })]

    /// An invalid entry anywhere makes the whole file an error (never a silently ignored
    /// rule), exactly one error, at the entry's line and column.
    #[test]
    fn invalid_entries_are_rejected(
        policy in gen_policy(),
        bad in select(vec!["", "/a", "/", "a/../b", "..", "./..", "[ab", "x/[!a"]),
        place in 0..4u8,
    ) {
        let mut g = policy;
        let key = match place {
            0 => {
                g.rules.push(GenRule { path: bad.to_string(), access: Access::Read, except: None, uids: None, gids: None });
                "path = "
            }
            3 => {
                g.rules.push(GenRule {
                    path: "a".to_string(),
                    access: Access::Read,
                    except: Some(vec!["b".to_string(), bad.to_string()]),
                    uids: None,
                    gids: None,
                });
                "except = "
            }
            1 => {
                g.writable_roots.get_or_insert_with(Vec::new).push(bad.to_string());
                "writable_roots = "
            }
            _ => {
                g.protected.get_or_insert_with(Vec::new).push(bad.to_string());
                "protected = "
            }
        };
        let text = g.toml();
        // The entry is the last one written with its key.
        let quoted = format!("'{bad}'");
        let (line, line_text) = text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(key) && l.contains(&quoted))
            .last()
            .expect("the bad entry is in the text");
        let column = line_text.rfind(&quoted).unwrap() + 1;
        let errors = Policy::parse(&text, "prop.toml").err().unwrap_or_default();
        prop_assert_eq!(errors.len(), 1, "{:?} for\n{}", errors, text);
        prop_assert_eq!((errors[0].line, errors[0].column), (line + 1, column), "{:?} for\n{}", errors, text);
    }
}

// ------------------------------------------------------------------------ the reference's own tests

fn pat(s: &str) -> Pat {
    normalize(s)
}

fn p(s: &str) -> Vec<Vec<u8>> {
    split(s.as_bytes())
}

/// The reference matcher on the SPEC's and README's examples (it must be right before it can
/// judge the engine).
#[test]
fn reference_matcher_examples() {
    let yes: &[(&str, &[u8])] = &[
        ("**/*.pem", b"x.pem"),
        ("**/*.pem", b"a/b/x.pem"),
        ("**/.env", b".env"),
        ("a/**/b", b"a/b"),
        ("a/**/b", b"a/x/y/b"),
        ("*", b".env"),
        ("?", b"\xff"),
        ("??", "\u{e9}".as_bytes()),
        ("[ab]", b"b"),
        ("[!a]", b"c"),
        ("**", b""),
        ("**", b"a/b"),
        (".", b""),
        ("./a/", b"a"),
        ("a//b", b"a/b"),
        ("a/**", b"a/x/y"),
    ];
    let no: &[(&str, &[u8])] = &[
        ("*", b""),
        ("*", b"a/b"),
        ("**/*.pem", b"a/x.pem.b"),
        ("?", "\u{e9}".as_bytes()),
        ("[!a]", b"a"),
        ("[!a]", "\u{e9}".as_bytes()),
        ("a?b", b"a/b"),
        ("a", b"a/b"),
        ("a/**", b"a"),
        ("a/**/**", b"a"),
        (".", b"a"),
    ];
    for (g, path) in yes {
        assert!(matches(&pat(g), &split(path)), "{g} should match {path:?}");
    }
    for (g, path) in no {
        assert!(
            !matches(&pat(g), &split(path)),
            "{g} should not match {path:?}"
        );
    }
    assert!(covers(&pat("a"), &p("a/b/c")));
    assert!(!covers(&pat("a/b"), &p("a")));
    assert!(could_match_below(&pat("a/*/x.pem"), &p("a")));
    assert!(could_match_below(&pat("a/**"), &p("a")));
    assert!(could_match_below(&pat("**"), &p("")));
    assert!(could_match_below(&pat("a/**/.e*"), &p("a/b/c")));
    assert!(!could_match_below(&pat("a/*/x.pem"), &p("b")));
    assert!(!could_match_below(&pat("a"), &p("a")));
    assert!(!could_match_below(&pat("."), &p("")));
    assert!(floating(&pat("**/*.pem")) && floating(&pat("**")) && floating(&pat("**/**/a")));
    assert!(!floating(&pat("**/a/**")) && !floating(&pat("a")) && !floating(&pat(".")));
}

/// The reference's except semantics on the SPEC's example and the depth rule.
#[test]
fn reference_except_examples() {
    let rule = |path: &str, access, except: &[&str]| GenRule {
        path: path.into(),
        access,
        except: Some(except.iter().map(|e| e.to_string()).collect()),
        uids: None,
        gids: None,
    };
    let g = GenPolicy {
        mode: Some(Mode::Danger),
        override_mode: None,
        default: None,
        writable_roots: None,
        protected: None,
        allow_setid: None,
        allow_devices: None,
        rules: vec![
            rule(
                "**/*.pem",
                Access::None,
                &["**/site-packages/**", "**/node_modules/**"],
            ),
            rule("a", Access::Read, &[]),
            rule("a/b", Access::None, &["a/b/c"]),
        ],
        inline_rules: false,
    };
    let r = Reference::new(&g);
    let me = CALLERS[1];
    let grant = |path: &str, is_dir| r.verdict(&p(path), me, is_dir).grant;
    assert_eq!(grant("k.pem", false), Access::None);
    assert_eq!(
        grant("x/site-packages/certifi/cacert.pem", false),
        Access::Write
    );
    assert_eq!(grant("node_modules/t/k.pem", false), Access::Write);
    assert_eq!(grant("x/site-packages.pem", false), Access::None);
    // the rule at `a/b` does not exist below `a/b/c`: the one at `a` decides
    assert_eq!(grant("a/b/x", false), Access::None);
    assert_eq!(grant("a/b/c", false), Access::Read);
    assert_eq!(grant("a/b/c/d/e", false), Access::Read);
    // ... and the pem rule below both
    assert_eq!(grant("a/b/c/k.pem", false), Access::None);
    // directories needed to reach what the excepts uncover stay visible
    assert_eq!(grant("a/b", true), Access::List);
    assert_eq!(grant("k.pem", true), Access::List);
    assert!(r.dir_rename_allowed(&p("x/a"), &p("x/b")));
    assert!(!r.dir_rename_allowed(&p("keys"), &p("node_modules/keys")));
    assert!(r.rename_preserves_policy(&p("x/a"), &p("x/b")).is_ok());
    assert_eq!(
        stands(&pat("**/a/**"), &p("x/y")),
        stands(&pat("**/a/**"), &p("z"))
    );
    assert_ne!(
        stands(&pat("**/a/**"), &p("x/a")),
        stands(&pat("**/a/**"), &p("z"))
    );
    assert_eq!(
        stands(&pat("**/a/**"), &p("x/a")),
        stands(&pat("**/a/**"), &p("a"))
    );
    assert_eq!(stands(&pat("a/*/c"), &p("a/p")), vec![2]);
    assert_eq!(stands(&pat("a/*/c"), &p("b")), Vec::<usize>::new());
}

/// The reference decides the SPEC's own examples as the SPEC says.
#[test]
fn reference_decides_spec_examples() {
    let g = GenPolicy {
        mode: Some(Mode::WorkspaceWrite),
        override_mode: None,
        default: None,
        writable_roots: None,
        protected: None,
        allow_setid: None,
        allow_devices: None,
        rules: [
            ("secrets", Access::None, None),
            ("secrets/pub", Access::Read, None),
            ("**/*.pem", Access::None, None),
            ("docs", Access::Read, None),
            ("build/cache", Access::Write, Some(vec![1000])),
            ("build/cache", Access::Read, None),
        ]
        .into_iter()
        .map(|(path, access, uids)| GenRule {
            path: path.into(),
            access,
            except: None,
            uids,
            gids: None,
        })
        .collect(),
        inline_rules: false,
    };
    let r = Reference::new(&g);
    let me = Caller {
        uid: 1000,
        gid: 1000,
    };
    let other = Caller { uid: 5, gid: 5 };
    let eff = |path: &str, c: Caller, is_dir: bool| r.verdict(&p(path), c, is_dir).effective;
    assert_eq!(eff("secrets", me, true), Access::List);
    assert_eq!(eff("secrets", me, false), Access::None);
    assert_eq!(eff("secrets/x", me, true), Access::None);
    assert_eq!(eff("secrets/pub/a", me, false), Access::Read);
    assert_eq!(eff("docs/x.pem", me, false), Access::None);
    assert_eq!(eff("docs/x", me, false), Access::Read);
    assert_eq!(eff("build/cache/o", me, false), Access::Write);
    assert_eq!(eff("build/cache/o", other, false), Access::Read);
    assert_eq!(eff(".git/hooks/pre-commit", me, false), Access::Read);
    assert_eq!(eff("src/main.rs", me, false), Access::Write);
    let v = r.verdict(&p("docs/x"), me, false);
    assert_eq!(r.check(&v, Need::Write, SPECIALS[1]), Err(libc::EPERM));
    assert_eq!(r.check(&v, Need::Write, SPECIALS[0]), Err(libc::EACCES));
    let v = r.verdict(&p("secrets/x"), me, false);
    assert_eq!(r.check(&v, Need::Create, SPECIALS[3]), Err(libc::EACCES));
    assert_eq!(r.check(&v, Need::Read, SPECIALS[3]), Err(libc::ENOENT));
    let v = r.verdict(&p(".git/config"), me, false);
    assert_eq!(r.check(&v, Need::Write, SPECIALS[0]), Err(libc::EROFS));
    assert!(!r.dir_rename_allowed(&p("secrets"), &p("s2")));
    assert!(!r.dir_rename_allowed(&p("x"), &p(".git")));
    assert!(r.dir_rename_allowed(&p("x"), &p("y")));
}

// ------------------------------------------------------------------------ fuzz harness on stable

fn fuzz_dir(sub: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(sub)
}

fn files_in(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Every seed, plus crash artifacts and (up to `FENCEFS_FUZZ_REPLAY_MAX`, default 100) corpus
/// entries when a local fuzzing run left them: no panic, no broken invariant.
#[test]
fn fuzz_seeds_replay() {
    let seeds = files_in(&fuzz_dir("seeds/policy"));
    assert!(!seeds.is_empty(), "fuzz/seeds/policy is empty");
    let max = std::env::var("FENCEFS_FUZZ_REPLAY_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut corpus = files_in(&fuzz_dir("corpus/policy"));
    corpus.truncate(max);
    for file in seeds
        .iter()
        .chain(&files_in(&fuzz_dir("artifacts/policy")))
        .chain(&corpus)
    {
        // A running fuzzer may delete corpus entries under our feet.
        let Ok(data) = std::fs::read(file) else {
            continue;
        };
        let result = std::panic::catch_unwind(|| harness::run(&data));
        assert!(result.is_ok(), "fuzz input {} fails", file.display());
    }
}

/// A stable-Rust stand-in for `cargo fuzz`: mutates the seeds (byte flips, splices,
/// dictionary words) with an xorshift generator for `FENCEFS_FUZZ_SECS` seconds (default 20)
/// and runs the harness on each input. `FENCEFS_FUZZ_SEED` fixes the generator's seed.
#[test]
#[ignore = "long-running fuzzing; run with --ignored"]
fn fuzz_random_inputs() {
    let secs: u64 = std::env::var("FENCEFS_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("FENCEFS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("fuzz_random_inputs: seed {seed} (FENCEFS_FUZZ_SEED), {secs} s");
    let mut rng = XorShift(seed | 1);
    let seeds: Vec<Vec<u8>> = files_in(&fuzz_dir("seeds/policy"))
        .iter()
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    const WORDS: &[&[u8]] = &[
        b"mode",
        b"default",
        b"writable_roots",
        b"protected",
        b"allow_setid",
        b"allow_devices",
        b"[[rule]]\n",
        b"path = ",
        b"access = ",
        b"uid = [",
        b"gid = [",
        b"except = [",
        b"except",
        b"**/node_modules/**",
        b"/**'",
        b"\"read-only\"",
        b"\"workspace-write\"",
        b"'danger'",
        b"'none'",
        b"'list'",
        b"'read'",
        b"'write'",
        b"true",
        b"**",
        b"**/",
        b"/**",
        b"*",
        b"?",
        b"[!",
        b"[",
        b"]",
        b"{",
        b"}",
        b",",
        b"\\",
        b".",
        b"./",
        b"..",
        b"/",
        b"'",
        b"\"",
        b"\n",
        b"\0",
        b"4294967296",
        b"\xff",
    ];
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut execs = 0u64;
    while Instant::now() < deadline {
        let mut data = seeds[rng.below(seeds.len())].clone();
        for _ in 0..=rng.below(8) {
            let at = rng.below(data.len() + 1);
            match rng.below(6) {
                0 if !data.is_empty() => {
                    let i = rng.below(data.len());
                    data[i] ^= 1 << rng.below(8);
                }
                1 if !data.is_empty() => {
                    let end = (at + rng.below(16)).min(data.len());
                    data.drain(at.min(end)..end);
                }
                2 => {
                    let word = WORDS[rng.below(WORDS.len())];
                    data.splice(at..at, word.iter().copied());
                }
                3 => {
                    let other = &seeds[rng.below(seeds.len())];
                    let from = rng.below(other.len() + 1);
                    let end = (from + rng.below(64)).min(other.len());
                    data.splice(at..at, other[from..end].iter().copied());
                }
                4 => data.insert(at, rng.next() as u8),
                _ => {
                    if data.len() > 1 {
                        let i = rng.below(data.len());
                        let j = rng.below(data.len());
                        data.swap(i, j);
                    }
                }
            }
        }
        let result = std::panic::catch_unwind(|| harness::run(&data));
        assert!(
            result.is_ok(),
            "fuzz input fails (seed {seed}, exec {execs}): {:?}",
            data.escape_ascii().to_string()
        );
        execs += 1;
    }
    eprintln!("fuzz_random_inputs: {execs} executions, no failure");
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Pins the engine's current reading of a trailing `/**` (see
/// [`TRAILING_STARSTAR_NEEDS_ONE`]): `secrets/**` hides everything below `secrets` but not
/// the directory itself (`secrets` would hide both).
#[test]
fn trailing_starstar_is_strict() {
    let p = Policy::parse(
        "mode = 'danger'\n[[rule]]\npath = 'secrets/**'\naccess = 'none'\n",
        "prop.toml",
    )
    .unwrap();
    let me = CALLERS[1];
    assert_eq!(
        p.verdict_for(b"secrets/k", me, false).effective,
        Access::None
    );
    assert_eq!(
        p.verdict_for(b"secrets/a/k", me, false).effective,
        Access::None
    );
    assert_eq!(p.verdict_for(b"secrets", me, true).effective, Access::Write);
    assert!(!p.dir_rename_allowed(b"secrets", b"s2"));
}

/// Was a bug (fixed): brace alternatives with `/`, `[/]` classes and `**` inside a name
/// fell back to "could match anywhere below".
#[test]
fn visibility_lift_does_not_leak_unrelated_directories() {
    let me = CALLERS[1];
    #[rustfmt::skip]
    let cases: &[(&str, &[u8])] = &[
        // a realistic policy: only src/lib and docs are readable
        ("default = 'none'\n[[rule]]\npath = '{src/lib,docs}'\naccess = 'read'\n", b"private"),
        ("default = 'none'\n[[rule]]\npath = '{src/lib,docs}'\naccess = 'read'\n", b"private/deeper"),
        ("default = 'none'\n[[rule]]\npath = 'src**'\naccess = 'read'\n", b"private"),
        ("default = 'none'\n[[rule]]\npath = '**a/x'\naccess = 'read'\n", b"b/c"),
        ("default = 'none'\n[[rule]]\npath = 'a/**b'\naccess = 'read'\n", b"a/c"),
        ("default = 'none'\n[[rule]]\npath = '[/]x'\naccess = 'read'\n", b"q"),
    ];
    for (src, path) in cases {
        let p = Policy::parse(src, "prop.toml").unwrap();
        let v = p.verdict_for(path, me, true);
        assert_eq!(
            (v.grant, v.grant_by),
            (Access::None, By::Default),
            "directory {} with\n{src}",
            show(path)
        );
    }
    // ... while the directories needed to reach a match still are lifted.
    let p = Policy::parse(
        "default = 'none'\n[[rule]]\npath = '{src/lib,docs}'\naccess = 'read'\n",
        "prop.toml",
    )
    .unwrap();
    assert_eq!(p.verdict_for(b"src", me, true).grant, Access::List);
    assert_eq!(
        p.verdict_for(b"src/lib/x.rs", me, false).grant,
        Access::Read
    );
    assert_eq!(p.verdict_for(b"src/other", me, true).grant, Access::None);
}

/// Was a failure of `engine_matches_reference` (random seed, not persisted), fixed in the
/// reference: `**/.env` `none` except `*/**/.env` (so only the root's `.env` is hidden), and
/// the directory `a/a` renamed to `a`. The rule exists nowhere below either name (every
/// `.env` there is at depth 2 or more), so the rename changes no path's policy and the
/// engine allows it. The reference refused it because its "place" of an except glob after
/// reading a path ([`stands`]) was only the pattern prefixes matching the path exactly: for
/// `*/**/.env` that is {1, 2} after `a` but {2} after `a/a`, although a `**` that has
/// already absorbed names stands where it stood before (it may absorb more), as in the
/// engine's automaton; the README's "stands at a different place ... component by
/// component" means that state.
#[test]
fn dir_rename_except_starstar_absorbing_regression() {
    let case = Case {
        policy: GenPolicy {
            mode: None,
            override_mode: None,
            default: None,
            writable_roots: None,
            protected: None,
            allow_setid: None,
            allow_devices: None,
            rules: vec![GenRule {
                path: "./**/.env".into(),
                access: Access::None,
                except: Some(vec!["./*/**/.env".into()]),
                uids: None,
                gids: None,
            }],
            inline_rules: false,
        },
        paths: vec![(b"a/a/.env".to_vec(), 1), (b".env".to_vec(), 1)],
        rename: ((b"a/a".to_vec(), 1), (b"a".to_vec(), 1)),
    };
    // in every mode (the mode plays no role in this rename: no non-floating pattern)
    for mode in [Mode::ReadOnly, Mode::WorkspaceWrite, Mode::Danger] {
        let mut c = case.clone();
        c.policy.mode = Some(mode);
        run_case(&c).unwrap();
    }
    run_case(&case).unwrap();
    // and the other direction, and between other places of the same kind
    for (old, new) in [(&b"a"[..], &b"a/a"[..]), (b"a/b", b"b/a/c"), (b"a", b"b")] {
        let mut c = case.clone();
        c.rename = ((old.to_vec(), 0), (new.to_vec(), 0));
        run_case(&c).unwrap();
    }
    let r = Reference::new(&case.policy);
    assert_eq!(
        stands(&pat("*/**/.env"), &p("a")),
        stands(&pat("*/**/.env"), &p("a/a"))
    );
    assert!(r.dir_rename_allowed(&p("a/a"), &p("a")));
    // a `**` that has absorbed nothing yet is not that place: before `*` is read
    assert_ne!(
        stands(&pat("*/**/.env"), &p("")),
        stands(&pat("*/**/.env"), &p("a"))
    );
    // the same rename where the except does tell the names apart: `*/*/**/.env` leaves
    // `.env` hidden at depth 1 and 2, so `a/a/.env` (visible) would become `a/.env`
    // (hidden); both sides refuse
    let mut c = case.clone();
    c.policy.rules[0].except = Some(vec!["*/*/**/.env".into()]);
    run_case(&c).unwrap();
    assert!(!Reference::new(&c.policy).dir_rename_allowed(&p("a/a"), &p("a")));
    assert!(
        !Policy::parse(&c.policy.toml(), "prop.toml")
            .unwrap()
            .dir_rename_allowed(b"a/a", b"a")
    );
}
