//! Generated input: random policies, paths and callers (proptest strategies).

use super::*;

// ------------------------------------------------------------------------ generated input

#[derive(Clone, Debug)]
pub(super) struct GenRule {
    pub(super) path: String,
    pub(super) access: Access,
    /// `except = [...]`.
    pub(super) except: Option<Vec<String>>,
    pub(super) uids: Option<Vec<u32>>,
    pub(super) gids: Option<Vec<u32>>,
}

#[derive(Clone, Debug)]
pub(super) struct GenPolicy {
    pub(super) mode: Option<Mode>,
    /// The CLI's `--mode`, applied with `set_mode` after parsing.
    pub(super) override_mode: Option<Mode>,
    pub(super) default: Option<Access>,
    pub(super) writable_roots: Option<Vec<String>>,
    pub(super) protected: Option<Vec<String>>,
    pub(super) allow_setid: Option<bool>,
    pub(super) allow_devices: Option<bool>,
    pub(super) rules: Vec<GenRule>,
    /// `rule = [{...}, ...]` instead of `[[rule]]` tables.
    pub(super) inline_rules: bool,
}

impl GenPolicy {
    pub(super) fn toml(&self) -> String {
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
pub(super) struct Case {
    pub(super) policy: GenPolicy,
    /// Paths, each with the index in `CALLERS` of the caller whose every `check_for` is
    /// compared (the verdicts are compared for every caller).
    pub(super) paths: Vec<(Vec<u8>, usize)>,
    /// A directory rename (old, new); both paths are also checked as above.
    pub(super) rename: ((Vec<u8>, usize), (Vec<u8>, usize)),
}

pub(super) fn access() -> impl Strategy<Value = Access> {
    select(vec![
        Access::None,
        Access::List,
        Access::Read,
        Access::Create,
        Access::Append,
        Access::Write,
    ])
}

pub(super) fn mode() -> impl Strategy<Value = Mode> {
    select(vec![Mode::ReadOnly, Mode::WorkspaceWrite, Mode::Danger])
}

/// A valid pattern: 1–4 components from `NAMES` and `GLOBS`, sometimes written with the
/// spellings normalization removes (`./x`, `x/`, `a//b`, `a/./b`), sometimes `.`.
pub(super) fn pattern() -> impl Strategy<Value = String> {
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

pub(super) fn rule() -> impl Strategy<Value = GenRule> {
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

pub(super) fn gen_policy() -> impl Strategy<Value = GenPolicy> {
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

pub(super) fn path(depth: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<u8>> {
    let mut names: Vec<&'static [u8]> = NAMES.iter().map(|n| n.as_bytes()).collect();
    names.extend_from_slice(PATH_ONLY);
    prop::collection::vec(select(names), depth).prop_map(|comps| comps.join(&b'/'))
}

pub(super) fn case() -> impl Strategy<Value = Case> {
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
