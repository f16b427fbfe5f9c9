//! Table-driven tests of the policy engine: matching, modes, errnos, directory renames and
//! every error class with its position. The helpers and constants shared by the topics
//! live here; each topic is a submodule.

use super::*;

const ME: Caller = Caller::new(1000, 1000);
const OTHER: Caller = Caller::new(2000, 2000);

fn pol(src: &str) -> Policy {
    Policy::parse(src, "t.toml").unwrap_or_else(|e| panic!("policy should parse: {e:?}\n{src}"))
}

/// `[[rule]]` tables from (path, access).
fn rules(list: &[(&str, &str)]) -> String {
    list.iter()
        .map(|(p, a)| format!("[[rule]]\npath = '{p}'\naccess = \"{a}\"\n"))
        .collect()
}

/// `grant` and `grant_by`, with `By::Rule`/`By::Visibility` mapped to the rule's pattern so
/// that tables stay readable and independent of rule order.
fn grant_of(p: &Policy, path: &[u8], caller: Caller) -> (Access, String) {
    let v = p.verdict(path, caller);
    (v.grant, by_name(p, v.grant_by))
}

fn by_name(p: &Policy, by: By) -> String {
    match by {
        By::Rule(i) => format!("rule {}", p.rule(i).pattern),
        By::Visibility(i) => format!("visibility {}", p.rule(i).pattern),
        By::Default => "default".to_string(),
        By::Mode => "mode".to_string(),
        By::Ignore(h) => format!("ignore:{}", h.line),
    }
}

use Access::{List, None as No, Read, Write};

/// (policy head, rules, path, caller, expected grant, expected grant_by)
type MatchCase<'a> = (
    &'a str,
    &'a [(&'a str, &'a str)],
    &'a [u8],
    Caller,
    Access,
    &'a str,
);

mod check;
mod errors;
mod except;
mod grants;
mod ignore;
mod layers;
mod matching;
mod modes;
mod presets;
mod unknown_program;
