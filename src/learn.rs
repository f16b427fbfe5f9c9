//! Drafting a policy from what a session used (`fencefs learn`). PURE: audit events in,
//! TOML text out.
//!
//! What is used: every audit line that was allowed (`--audit-allowed`) or would have been
//! refused in report-only form (`would-deny`), with the access level it needed (`need`).
//! Plain refusals are left out: the session did not get them.
//!
//! The draft: `default = "none"` (nothing unused is granted), one rule per path with the
//! join of the levels it needed, then folded — a directory whose recorded entries (two at
//! least, the directory itself listed or not) all needed the same level becomes one rule
//! for the directory. Paths only looked up on the way to others get no rule (the
//! visibility lift keeps them listable). Every rule says in a comment how many accesses
//! it covers. With a base policy, paths it hides (`none`) are never granted and its
//! `none` rules are copied, so a draft never lifts one. The mode is `workspace-write`
//! when something was changed, `read-only` otherwise.
//!
//! Invariants: the output parses as a policy (checked by the caller); it grants no path
//! that no line used, except what a folded directory covers; names that are not UTF-8
//! (TOML cannot hold them) are counted and left out.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::policy::{Access, Caller, Policy};

/// Distinct paths a [`Recorder`] keeps at most; accesses to further paths are counted and
/// named in the draft's header, not granted.
pub const RECORD_CAP: usize = 100_000;

/// What a `--learn` mount used: per path, the join of the needs and the count. Bounded
/// by [`RECORD_CAP`] paths.
#[derive(Debug, Default)]
pub struct Recorder {
    table: Mutex<(Table, u64)>,
}

impl Recorder {
    /// Records one use of `path` needing `need`.
    pub fn record(&self, path: &[u8], need: Access) {
        let Ok(mut g) = self.table.lock() else { return };
        let (t, dropped) = &mut *g;
        if let Some(e) = t.get_mut(path) {
            e.0 = e.0.join(need);
            e.1 += 1;
        } else if t.len() < RECORD_CAP && std::str::from_utf8(path).is_ok() {
            t.insert(path.to_vec(), (need, 1));
        } else {
            *dropped += 1;
        }
    }

    /// The draft for what was recorded, `base` being the mount's policy (its `none` rules
    /// are kept).
    pub fn draft(&self, base: &Policy) -> String {
        let (mut t, dropped) = match self.table.lock() {
            Ok(g) => g.clone(),
            Err(_) => return String::new(),
        };
        let total = t.values().map(|v| v.1).sum::<u64>() + dropped;
        drop_passages(&mut t);
        let folded = fold(&mut t);
        render(&t, &folded, Some(base), total, 0, dropped)
    }
}

/// One used access: path, what it needed, who asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    /// Workspace-relative path bytes (`b""`: the root).
    pub path: Vec<u8>,
    /// The level the operation needed.
    pub need: Access,
    /// The caller (a base policy is asked about this caller).
    pub caller: Caller,
}

/// Per path: the join of the needs and the number of accesses.
type Table = BTreeMap<Vec<u8>, (Access, u64)>;

/// The draft policy for `uses`, under `base` when given.
pub fn draft(uses: &[Use], base: Option<&Policy>) -> String {
    let mut table: Table = BTreeMap::new();
    let mut hidden = 0u64;
    let mut not_utf8 = 0u64;
    for u in uses {
        if base.is_some_and(|b| b.verdict(&u.path, u.caller).grant == Access::None) {
            hidden += 1;
            continue;
        }
        if std::str::from_utf8(&u.path).is_err() {
            not_utf8 += 1;
            continue;
        }
        let e = table.entry(u.path.clone()).or_insert((u.need, 0));
        e.0 = e.0.join(u.need);
        e.1 += 1;
    }
    drop_passages(&mut table);
    let folded = fold(&mut table);
    render(&table, &folded, base, uses.len() as u64, hidden, not_utf8)
}

/// Removes `list`-only paths that are ancestors of other recorded paths (the lift keeps
/// them visible), and the root's `list`.
fn drop_passages(t: &mut Table) {
    let keys: Vec<Vec<u8>> = t.keys().cloned().collect();
    for k in &keys {
        if t[k].0 != Access::List {
            continue;
        }
        let below = keys.iter().any(|o| o != k && is_below(o, k));
        if below || k.is_empty() {
            t.remove(k);
        }
    }
}

/// `p` lies strictly below directory `d`.
fn is_below(p: &[u8], d: &[u8]) -> bool {
    if d.is_empty() {
        return !p.is_empty();
    }
    p.len() > d.len() && p.starts_with(d) && p[d.len()] == b'/'
}

fn parent(p: &[u8]) -> Option<&[u8]> {
    p.iter().rposition(|&b| b == b'/').map(|i| &p[..i])
}

/// Folds, deepest directories first, into one rule for the directory (returned: the
/// folded directories, whose rules cover their subtrees):
/// - a directory (not the root) whose recorded entries below it number two or more and
///   all share one level (and the directory's own record, if any, is no more than that);
/// - a directory the session created or changed itself (its own record includes
///   `create`) with entries below it: what lies below a directory the session made was
///   made by the session (build trees, `node_modules`), so its subtree gets the join of
///   the levels used there and in it — names a tool picks at random there (temporary
///   files, `rustc`'s scratch directories, incremental caches) are covered on a re-run.
fn fold(t: &mut Table) -> std::collections::BTreeSet<Vec<u8>> {
    let mut folded = std::collections::BTreeSet::new();
    loop {
        // Every directory above a recorded path, not only the nearest.
        let mut dirs: Vec<Vec<u8>> = t
            .keys()
            .flat_map(|k| std::iter::successors(parent(k), |d| parent(d)))
            .map(<[u8]>::to_vec)
            .collect();
        let depth = |d: &[u8]| d.iter().filter(|&&b| b == b'/').count();
        dirs.sort_by(|a, b| depth(b).cmp(&depth(a)).then_with(|| a.cmp(b)));
        dirs.dedup();
        let mut changed = false;
        for d in dirs {
            let below: Vec<(Vec<u8>, (Access, u64))> = t
                .iter()
                .filter(|(k, _)| is_below(k, &d))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            let own = t.get(&d).copied();
            let made = !d.is_empty() && own.is_some_and(|(a, _)| a.includes(Access::Create));
            let level = if made {
                below
                    .iter()
                    .fold(own.map_or(Access::Create, |o| o.0), |l, (_, (a, _))| {
                        l.join(*a)
                    })
            } else {
                if below.len() < 2 {
                    continue;
                }
                let level = below[0].1.0;
                if below.iter().any(|(_, (a, _))| *a != level) {
                    continue;
                }
                if own.is_some_and(|(a, _)| !level.includes(a)) {
                    continue;
                }
                level
            };
            if below.is_empty() {
                continue;
            }
            let count = below.iter().map(|(_, (_, n))| n).sum::<u64>() + own.map_or(0, |o| o.1);
            for (k, _) in &below {
                t.remove(k);
                folded.remove(k);
            }
            folded.insert(d.clone());
            t.insert(d, (level, count));
            changed = true;
            break;
        }
        if !changed {
            return folded;
        }
    }
}

/// A path as an exact glob: the glob metacharacters escaped.
fn exact(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    if out.is_empty() { ".".into() } else { out }
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn render(
    t: &Table,
    folded: &std::collections::BTreeSet<Vec<u8>>,
    base: Option<&Policy>,
    total: u64,
    hidden: u64,
    not_utf8: u64,
) -> String {
    let mutates = t.values().any(|(a, _)| a.mutates());
    let mut s = String::new();
    s.push_str("# Drafted by `fencefs learn`: what the session used, and no more.\n");
    s.push_str(&format!("# {total} recorded accesses; {} rules.", t.len()));
    if hidden > 0 {
        s.push_str(&format!(
            " {hidden} accesses to paths the base policy hides were left out."
        ));
    }
    if not_utf8 > 0 {
        s.push_str(&format!(
            " {not_utf8} accesses to names that are not UTF-8 (or past the recording cap) were left out."
        ));
    }
    s.push_str("\n\n");
    s.push_str(if mutates {
        "mode = \"workspace-write\"\n"
    } else {
        "mode = \"read-only\"\n"
    });
    s.push_str("default = \"none\"\n");
    if let Some(b) = base {
        for r in b.rules().iter().filter(|r| r.access == Access::None) {
            s.push_str(&format!(
                "\n# kept from the base policy ({}:{})\n[[rule]]\npath = {}\naccess = \"none\"\n",
                b.layer_file(r.layer),
                r.line,
                quoted(&r.pattern)
            ));
            if !r.except.is_empty() {
                let list: Vec<String> = r.except.iter().map(|e| quoted(e)).collect();
                s.push_str(&format!("except = [{}]\n", list.join(", ")));
            }
            for (key, ids) in [("uid", &r.uids), ("gid", &r.gids)] {
                if !ids.is_empty() {
                    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
                    s.push_str(&format!("{key} = [{}]\n", list.join(", ")));
                }
            }
        }
    }
    for (path, (access, count)) in t {
        let p = String::from_utf8_lossy(path);
        let what = if *count == 1 { "access" } else { "accesses" };
        s.push_str(&format!(
            "\n# {count} {what}\n[[rule]]\npath = {}\naccess = \"{access}\"\n",
            quoted(&exact(&p))
        ));
        // A rule covers its subtree: one for a path used itself (a file, a directory
        // opened or listed) says so, so that nothing unused below it is granted; only a
        // folded directory's rule covers what lies below.
        if !folded.contains(path) {
            let below = if path.is_empty() {
                "*".to_string()
            } else {
                format!("{}/**", exact(&p))
            };
            s.push_str(&format!("except = [{}]\n", quoted(&below)));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(path: &str, need: Access) -> Use {
        Use {
            path: path.as_bytes().to_vec(),
            need,
            caller: Caller::new(1000, 1000),
        }
    }

    #[test]
    fn a_draft_folds_uniform_directories_and_keeps_the_rest_exact() {
        use Access::*;
        let uses = [
            u("", List),
            u("src", List),
            u("src/a.py", Read),
            u("src/b.py", Read),
            u("src/b.py", Read),
            u("out", List),
            u("out/x", Create),
            u("out/y", Create),
            u("README.md", Read),
            u("log/app.log", Append),
            u("mixed/r", Read),
            u("mixed/w", Write),
            u("odd[1].txt", Read),
            u("peeked", List),
        ];
        let text = draft(&uses, Option::None);
        let p = Policy::parse(&text, "draft").unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        let me = Caller::new(1000, 1000);
        let g = |path: &str| p.verdict(path.as_bytes(), me).effective;
        assert_eq!(g("src/a.py"), Read);
        assert_eq!(g("src/new.py"), Read, "folded: the directory");
        assert_eq!(g("out/z"), Create);
        assert_eq!(g("README.md"), Read);
        assert_eq!(g("log/app.log"), Append);
        assert_eq!(g("log/other.log"), None, "one entry: exact");
        assert_eq!(g("mixed/r"), Read);
        assert_eq!(g("mixed/w"), Write);
        assert_eq!(g("mixed/other"), None, "used unalike: exact");
        assert_eq!(g("odd[1].txt"), Read);
        assert_eq!(g("odd1.txt"), None, "escaped, not a class");
        assert_eq!(g("unused"), None);
        assert_eq!(g("peeked"), List);
        assert_eq!(g("peeked/inside"), None, "a look is not a look below");
        assert_eq!(p.verdict(b"src", me).effective, Read);
        assert_eq!(p.verdict(b"", me).effective, List, "reachable");
        assert_eq!(p.mode(), crate::policy::Mode::WorkspaceWrite);
        assert!(
            text.contains("# 3 accesses\n[[rule]]\npath = \"src\""),
            "{text}"
        );
    }

    #[test]
    fn a_directory_used_itself_grants_nothing_below_and_one_made_grants_its_tree() {
        use Access::*;
        // cargo's shape: the root and the crate opened, a target tree made by the build
        // with names picked at random, one file read.
        let uses = [
            u("", Read),
            u("crate", Read),
            u("crate/Cargo.toml", Read),
            u("crate/target/debug", Create),
            u("crate/target/debug/deps/rustcAb12", Write),
            u("crate/target/debug/.fingerprint/x", Create),
            u("crate/target/debug/incremental/s-1-working/a.o", Read),
        ];
        let text = draft(&uses, Option::None);
        let p = Policy::parse(&text, "draft").unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        let me = Caller::new(1000, 1000);
        let g = |path: &str| p.verdict_for(path.as_bytes(), me, false).effective;
        assert_eq!(p.verdict(b"", me).effective, Read, "{text}");
        assert_eq!(g("unused"), None, "the root's read is the root's: {text}");
        assert_eq!(g("crate/unused.rs"), None, "{text}");
        assert_eq!(g("crate/Cargo.toml"), Read);
        assert_eq!(
            g("crate/target/debug/deps/rustcZz99"),
            Write,
            "made: its tree"
        );
        assert_eq!(g("crate/target/debug/incremental/s-2-working/b.o"), Write);
        assert_eq!(g("crate/target/other"), None, "target itself was not made");
    }

    #[test]
    fn a_draft_never_lifts_a_base_none() {
        let base = Policy::parse(
            "[[rule]]\npath = \"**/.env\"\naccess = \"none\"\n",
            "base.toml",
        )
        .unwrap();
        let uses = [u("app/.env", Access::Read), u("app/main.py", Access::Read)];
        let text = draft(&uses, Some(&base));
        let p = Policy::parse(&text, "draft").unwrap();
        let me = Caller::new(1000, 1000);
        assert_eq!(p.verdict(b"app/.env", me).effective, Access::None);
        assert_eq!(p.verdict(b"app/main.py", me).effective, Access::Read);
        assert_eq!(p.mode(), crate::policy::Mode::ReadOnly);
        assert!(
            text.contains("1 accesses to paths the base policy hides"),
            "{text}"
        );
    }
}
