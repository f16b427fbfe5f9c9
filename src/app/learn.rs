//! `fencefs learn AUDIT.jsonl [--policy BASE]`: reads an audit log written with
//! `--audit-allowed` and prints a draft policy (the drafting itself is `learn.rs`).
//! A learning mount's draft file (`--learn OUT.toml`) is `learn_out.rs`.

use std::path::Path;

use crate::cli::LearnArgs;
use crate::learn::{Use, draft};
use crate::policy::{Access, Caller};

/// The access word of an audit line's `need`.
fn level(word: &str) -> Option<Access> {
    Access::ALL.into_iter().find(|a| a.as_str() == word)
}

/// The uses in audit text: allowed and would-deny lines with a `need`; (uses, lines
/// skipped because they do not parse).
pub fn uses(text: &str) -> (Vec<Use>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            bad += 1;
            continue;
        };
        if !matches!(v["decision"].as_str(), Some("allow" | "would-deny")) {
            continue;
        }
        let Some(need) = v["need"].as_str().and_then(level) else {
            continue;
        };
        let path = match (v["path"].as_str(), v["path_hex"].as_str()) {
            (_, Some(hex)) => (0..hex.len() / 2)
                .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
                .collect(),
            (Some(p), None) => p.as_bytes().to_vec(),
            (None, None) => {
                bad += 1;
                continue;
            }
        };
        let id = |k: &str| {
            v[k].as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0)
        };
        out.push(Use {
            path,
            need,
            caller: Caller::new(id("uid"), id("gid")),
        });
    }
    (out, bad)
}

/// Runs the command: the draft on stdout; 1 when the log cannot be read or the base
/// policy is invalid.
pub(super) fn learn(a: LearnArgs) -> i32 {
    let text = match std::fs::read_to_string(&a.audit) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("fencefs learn: {}: {e}", a.audit.display());
            return 1;
        }
    };
    let base = if a.policy.is_empty() {
        None
    } else {
        match crate::reload::load(&a.policy, None) {
            Ok(p) => Some(p),
            Err(errors) => {
                for e in errors {
                    eprintln!("{e}");
                }
                return 1;
            }
        }
    };
    let (uses, bad) = uses(&text);
    if bad > 0 {
        eprintln!(
            "fencefs learn: {bad} lines of {} are not audit lines; skipped",
            Path::new(&a.audit).display()
        );
    }
    let out = draft(&uses, base.as_ref());
    if let Err(e) = crate::policy::Policy::parse(&out, "<draft>") {
        eprintln!("fencefs learn: the draft does not parse (a bug): {e:?}");
        return 1;
    }
    crate::out!("{out}");
    0
}
