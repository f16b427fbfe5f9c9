//! The contents of `.fencefs/README`, `.fencefs/policy` and one `.fencefs/denials` line,
//! for one caller under one policy snapshot. PURE (no host, no clock: the time is passed in).
//!
//! Invariant (the no-oracle rule): nothing here names a path the caller cannot see. A
//! rule, `except`, `writable_roots` or `protected` entry is shown only when every literal
//! path prefix it names (each brace alternative expanded) is visible to the caller (see
//! [`names_visible`]); the others are only counted. A refusal of a path hidden from the
//! caller says `hidden` and nothing else, so the line does not depend on the host.

use std::fmt::Write as _;

use crate::policy::{Access, By, Caller, CeilingBy, Mode, Policy, RuleInfo, Verdict};

/// Brace expansions checked per pattern; a pattern with more is treated as hidden.
const MAX_EXPANSIONS: usize = 64;

/// The alternatives of `pattern`'s `{a,b}` groups (nested ones too), or `None` past
/// [`MAX_EXPANSIONS`] or on an unbalanced brace.
fn expand(pattern: &str) -> Option<Vec<String>> {
    let Some(open) = pattern.find('{') else {
        return Some(vec![pattern.to_string()]);
    };
    let mut depth = 0;
    let mut close = None;
    let mut commas = Vec::new();
    for (i, c) in pattern[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            ',' if depth == 1 => commas.push(open + i),
            _ => {}
        }
    }
    let close = close?;
    let (head, tail) = (&pattern[..open], &pattern[close + 1..]);
    let mut starts = vec![open + 1];
    starts.extend(commas.iter().map(|c| c + 1));
    let mut ends = commas.clone();
    ends.push(close);
    let mut out = Vec::new();
    for (s, e) in starts.into_iter().zip(ends) {
        for alt in expand(&format!("{head}{}{tail}", &pattern[s..e]))? {
            out.push(alt);
            if out.len() > MAX_EXPANSIONS {
                return None;
            }
        }
    }
    Some(out)
}

/// Whether every literal path prefix `pattern` names is visible to `caller`: the
/// components before the first one with a glob character, each alternative of a brace.
pub fn names_visible(policy: &Policy, caller: Caller, pattern: &str) -> bool {
    let Some(alts) = expand(pattern) else {
        return false;
    };
    alts.iter().all(|alt| {
        let mut prefix = String::new();
        for comp in alt.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if comp.contains(['*', '?', '[', ']', '\\']) {
                break;
            }
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(comp);
            let p = prefix.as_bytes();
            if [true, false]
                .iter()
                .any(|&d| policy.verdict_for(p, caller, d).effective == Access::None)
            {
                return false;
            }
        }
        true
    })
}

/// `.fencefs/README`.
pub fn readme(policy: &Policy, staged: bool) -> String {
    let mut s = String::from(
        "This directory is a file system mount made by fencefs. Every operation on it is\n\
         decided against a policy: per-path access (none, list, read, write) under a\n\
         sandbox mode. This .fencefs/ directory is not on the host; it is read-only and\n\
         generated for whoever reads it. It is not listed at the mount root (ls -a, git\n\
         add -A, tar, rsync and cp -a leave it out, so it never lands in a commit or an\n\
         archive) but is always there by name: cat .fencefs/README, .fencefs/policy,\n\
         .fencefs/denials at the root of the mount.\n\n\
         Files here:\n\
         \x20 README    this text\n\
         \x20 policy    the policy as your uid and gid see it\n\
         \x20 denials   your uid's last 100 refusals, newest last\n\
         \x20 feedback  staged mounts: the reviewer's decisions on your changes since\n\
         \x20           your last turn began (applied, or discarded with a note), newest last\n\n\
         What an error means on this mount:\n\
         \x20 ENOENT  no such file, or the path is hidden from you (the two look the same)\n\
         \x20 EACCES  a rule does not give you that access (see policy; a rule with ask\n\
         \x20         can be granted by a person while your request waits)\n\
         \x20 EROFS   the sandbox mode does not allow changes there (read-only mode,\n\
         \x20         outside writable_roots, or a protected entry)\n\
         \x20 EPERM   set-user/group-ID bits or device nodes are not allowed\n\n\
         Writes to a path whose rule has ask wait (up to the approval timeout) for a\n\
         person to allow or deny them: a slow write is not a hang. Retrying a refused\n\
         request unchanged gets the same answer; ask the person running this mount.\n",
    );
    let _ = write!(s, "\nMode: {}.\n", policy.mode());
    if staged {
        s.push_str(
            "Changes are staged: they land in a staging area for a person to review and\n\
             apply; the workspace itself is not modified until then.\n",
        );
    }
    s
}

fn rule_line(policy: &Policy, caller: Caller, r: &RuleInfo, layers: bool) -> String {
    let mut s = format!("{}  {}", r.pattern, r.access);
    if let Some(a) = r.ask {
        let _ = write!(s, "  ask={a}");
    }
    let (shown, hidden): (Vec<&String>, Vec<&String>) = r
        .except
        .iter()
        .partition(|e| names_visible(policy, caller, e));
    if !shown.is_empty() {
        let list: Vec<&str> = shown.iter().map(|e| e.as_str()).collect();
        let _ = write!(s, "  except={}", list.join(","));
    }
    if !hidden.is_empty() {
        let _ = write!(s, "  ({} hidden exceptions)", hidden.len());
    }
    if layers {
        let _ = write!(s, "  [layer {}]", policy.layer_file(r.layer));
    }
    s
}

/// The entries of `list` the caller may see, comma-separated, and how many were left out.
fn entries(policy: &Policy, caller: Caller, list: &[String]) -> (String, usize) {
    let shown: Vec<&str> = list
        .iter()
        .filter(|e| names_visible(policy, caller, e))
        .map(String::as_str)
        .collect();
    (shown.join(", "), list.len() - shown.len())
}

/// `.fencefs/policy` for `caller`.
pub fn policy(policy: &Policy, caller: Caller, generation: u64, staged: bool) -> String {
    let mut s = format!(
        "# The policy of this mount as uid {} (gid {}) sees it; policy generation {generation}.\n\
         # Rules are listed in file order; a rule hidden from you is only counted.\n",
        caller.uid, caller.gid
    );
    let layers = policy.layers();
    let many = layers.len() > 1;
    let _ = writeln!(s, "mode = {}", policy.mode());
    if staged {
        s.push_str("staging = on (changes wait in a staging area for review)\n");
    }
    if many {
        let _ = writeln!(
            s,
            "layers = {} (a request must pass every layer; the lowest access wins)",
            layers.len()
        );
    }
    for (k, l) in layers.iter().enumerate() {
        let tag = if many {
            format!("[layer {}] ", policy.layer_file(k))
        } else {
            String::new()
        };
        let _ = writeln!(s, "{tag}default = {}", l.default_access());
        if policy.mode() == Mode::WorkspaceWrite {
            for (key, list) in [
                ("writable_roots", l.writable_roots()),
                ("protected", l.protected()),
            ] {
                let (shown, left) = entries(policy, caller, list);
                let _ = write!(s, "{tag}{key} = {shown}");
                if left > 0 {
                    let _ = write!(s, " ({left} hidden)");
                }
                s.push('\n');
            }
        }
    }
    let _ = writeln!(
        s,
        "allow_setid = {}\nallow_devices = {}",
        policy.allow_setid(),
        policy.allow_devices()
    );
    s.push_str("\n# path  access  [ask=LEVEL]  [except=...]\n");
    let (mut hidden, mut others) = (0, 0);
    for (i, r) in policy.rules().iter().enumerate() {
        if !policy.rule_applies(i, caller) {
            others += 1;
        } else if r.access == Access::None || !names_visible(policy, caller, &r.pattern) {
            hidden += 1;
        } else {
            s.push_str(&rule_line(policy, caller, r, many));
            s.push('\n');
        }
    }
    let _ = writeln!(s, "{hidden} hidden rules");
    if others > 0 {
        let _ = writeln!(s, "{others} rules for other uids or gids");
    }
    s
}

/// Why a refusal happened, as the `denials` line says it.
pub fn why(
    policy: &Policy,
    caller: Caller,
    path: &[u8],
    v: &Verdict,
    by: By,
    errno: i32,
) -> String {
    if v.effective == Access::None {
        return "hidden".into();
    }
    let layer = |k: usize| {
        if policy.layers().len() > 1 {
            format!(" [layer {}]", policy.layer_file(k))
        } else {
            String::new()
        }
    };
    let rule = |i: usize| {
        let r = policy.rule(i);
        if names_visible(policy, caller, &r.pattern) {
            let ask = r.ask.map(|a| format!(" ask={a}")).unwrap_or_default();
            format!("rule {} {}{ask}{}", r.pattern, r.access, layer(r.layer))
        } else {
            format!("a rule{}", layer(r.layer))
        }
    };
    match (errno, by) {
        (libc::EPERM, _) => "set-id bits or device nodes are not allowed".into(),
        (libc::EROFS, By::Mode) if policy.ignore_set().is_ignore_file(path) => {
            "ignore files are read-only".into()
        }
        (libc::EROFS, By::Mode) if policy.pinned(path) => {
            "the workspace policy file is read-only".into()
        }
        (_, By::Mode) => match policy.ceiling_by(path) {
            CeilingBy::Protected(i) => {
                let e = policy.protected_entry(i).0;
                let e = if names_visible(policy, caller, e) {
                    e
                } else {
                    "(an entry)"
                };
                format!("mode {}: protected {e}", policy.mode())
            }
            CeilingBy::WritableRoots => format!("mode {}: outside writable_roots", policy.mode()),
            _ => format!("mode {}", policy.mode()),
        },
        (_, By::Rule(i)) => rule(i),
        (_, By::Visibility(i)) => format!("{} (only listed)", rule(i)),
        (_, By::Default) => format!("default {}{}", v.grant, layer(v.layer)),
        // Always `none` (answered above); never names the ignore file's pattern.
        (_, By::Ignore(_)) => "hidden".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(src: &str) -> Policy {
        Policy::parse(src, "p.toml").unwrap()
    }

    const AGENT: Caller = Caller::new(1000, 1000);

    #[test]
    fn braces_expand_nested_and_bounded() {
        assert_eq!(expand("a/{b,c}/d").unwrap(), vec!["a/b/d", "a/c/d"]);
        assert_eq!(
            expand("{x,{y,z}w}").unwrap(),
            vec!["x".to_string(), "yw".into(), "zw".into()]
        );
        assert!(expand("{a,b").is_none());
        let many = "{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}";
        assert!(expand(many).is_none(), "2^7 alternatives is past the bound");
    }

    #[test]
    fn a_rule_naming_a_hidden_path_is_only_counted() {
        let p = policy(
            "default = \"read\"\n\
             [[rule]]\npath = \"vault\"\naccess = \"none\"\n\
             [[rule]]\npath = \"{docs,vault}/*.md\"\naccess = \"none\"\n\
             [[rule]]\npath = \"src/**\"\naccess = \"write\"\nexcept = [\"src/vault-key\"]\n\
             [[rule]]\npath = \"src/vault-key\"\naccess = \"none\"\n\
             [[rule]]\npath = \"vault/deep/**\"\naccess = \"none\"\n",
        );
        let text = super::policy(&p, AGENT, 1, false);
        assert!(!text.contains("vault"), "{text}");
        assert!(
            text.contains("src/**  write  (1 hidden exceptions)\n"),
            "{text}"
        );
        assert!(text.contains("\n4 hidden rules\n"), "{text}");
        assert!(names_visible(&p, AGENT, "src/**"));
        assert!(!names_visible(&p, AGENT, "{src,vault}/x"));
        assert!(!names_visible(&p, AGENT, "vault/**"));
    }

    #[test]
    fn mode_refusals_say_which_part_of_the_mode() {
        let p = policy(
            "mode = \"workspace-write\"\nwritable_roots = [\"src\"]\nprotected = [\"src/gen\"]\n\
             workspace_policy = \".fencefs.toml\"\n",
        );
        let erofs = |path: &[u8]| {
            let v = p.verdict_for(path, AGENT, false);
            why(&p, AGENT, path, &v, By::Mode, libc::EROFS)
        };
        assert_eq!(
            erofs(b"README"),
            "mode workspace-write: outside writable_roots"
        );
        assert_eq!(
            erofs(b"src/gen/x"),
            "mode workspace-write: protected src/gen"
        );
        assert_eq!(
            erofs(b".fencefs.toml"),
            "the workspace policy file is read-only"
        );
    }

    #[test]
    fn a_hidden_path_is_only_hidden() {
        let p = policy("default = \"read\"\n[[rule]]\npath = \"s*\"\naccess = \"none\"\n");
        for path in [&b"secret"[..], b"s-absent"] {
            let v = p.verdict_for(path, AGENT, false);
            assert_eq!(why(&p, AGENT, path, &v, v.by, libc::ENOENT), "hidden");
            assert_eq!(why(&p, AGENT, path, &v, v.by, libc::EACCES), "hidden");
        }
    }
}
