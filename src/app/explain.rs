//! The commands that read a policy without mounting: `check` (does it compile?) and
//! `explain` (what the policy decides for one path, and which rule or ceiling decided it;
//! with several layers, every layer's verdict and which layer decided).
//!
//! Invariants: pure reporting. Nothing here mounts, opens the workspace or changes a
//! verdict; the lines printed name the same rule, ceiling or default that the audit log's
//! `by`/`rule` fields would name for the same request.

use std::path::PathBuf;

use super::EXIT_ERR;
use crate::cli::ExplainArgs;
use crate::policy::{Access, By, Caller, CeilingBy, Need, Policy, PolicyError, Special};
use crate::{quote, reload};

fn print_errors(errs: &[PolicyError]) {
    for e in errs {
        eprintln!("{}", esc(&e.to_string()));
    }
}

/// Text from a policy or the command line, safe for a terminal (quote.rs).
fn esc(s: &str) -> std::borrow::Cow<'_, str> {
    quote::escape(s.as_bytes())
}

pub(super) fn check(paths: &[PathBuf]) -> i32 {
    match crate::policy::load_all(paths) {
        Ok(p) => {
            crate::outln!("ok: {} rules", p.rules().len());
            0
        }
        Err(errs) => {
            print_errors(&errs);
            EXIT_ERR
        }
    }
}

/// Normalizes a user-given workspace path: `./a//b/` → `a/b`; `..` is refused.
pub fn normalize(path: &str) -> Result<Vec<u8>, String> {
    let mut out: Vec<u8> = Vec::new();
    for comp in path.as_bytes().split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err(format!("path '{path}' must not contain '..'")),
            c => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(c);
            }
        }
    }
    Ok(out)
}

fn describe_by(p: &Policy, by: By, layer: usize) -> String {
    describe_by_at(p, by, layer, b"")
}

fn describe_rule(p: &Policy, i: usize) -> String {
    let r = p.rule(i);
    let file = p.layer_file(r.layer);
    let from = match r.preset {
        Some(name) => format!("preset \"{name}\", "),
        None => String::new(),
    };
    format!(
        "rule #{} path = \"{}\" access = {} ({from}{}:{})",
        i + 1,
        esc(&r.pattern),
        r.access,
        esc(file),
        r.line
    )
}

/// `fencefs presets`: every preset as TOML rules, each with its reason as a comment.
pub(super) fn presets() -> i32 {
    for (k, p) in crate::policy::presets::PRESETS.iter().enumerate() {
        if k > 0 {
            crate::outln!();
        }
        crate::outln!("# preset \"{}\": {}", p.name, p.about);
        for r in p.rules {
            crate::outln!(
                "\n# {}\n[[rule]]\npath = \"{}\"\naccess = \"{}\"",
                r.why,
                r.path,
                r.access
            );
            if !r.except.is_empty() {
                let list: Vec<String> = r.except.iter().map(|e| format!("\"{e}\"")).collect();
                crate::outln!("except = [{}]", list.join(", "));
            }
        }
    }
    0
}

/// What `by` names; `layer` is the layer of the verdict (it says whose `default`).
fn describe_by_at(p: &Policy, by: By, layer: usize, path: &[u8]) -> String {
    match by {
        By::Mode => describe_ceiling(p, path),
        By::Rule(i) => describe_rule(p, i),
        By::Visibility(i) => {
            let r = p.rule(i);
            let file = p.layer_file(r.layer);
            let why = if r.access == Access::None {
                "does not cover what its except globs match below"
            } else {
                "grants access below"
            };
            format!(
                "visibility: rule #{} path = \"{}\" ({}:{}) {why}, so the directory stays listable",
                i + 1,
                esc(&r.pattern),
                esc(file),
                r.line
            )
        }
        By::Default if p.layers().len() > 1 => format!(
            "default = {} ({})",
            p.layers()[layer].default_access(),
            esc(p.layer_file(layer))
        ),
        By::Default => format!("default = {}", p.layers()[layer].default_access()),
        By::Ignore(hit) => {
            let (file, glob) = p.ignore_set().describe(hit);
            format!(
                "ignore file SOURCE/{}:{} pattern \"{}\" (ignore_files: hidden)",
                esc(&file),
                hit.line,
                esc(&glob)
            )
        }
    }
}

/// What the mode's ceiling at `path` comes from, as the audit log's `by`/`rule` say it.
fn describe_ceiling(p: &Policy, path: &[u8]) -> String {
    let k = p.ceiling_layer_at(path);
    let file = p.layer_file(k);
    match p.ceiling_by(path) {
        CeilingBy::Protected(i) => {
            let (entry, line) = p.protected_entry(i);
            let at = match line {
                Some(l) => format!("{}:{l}", esc(file)),
                None => "built-in default".to_string(),
            };
            format!(
                "protected entry \"{}\" ({at}), mode {} (ceiling)",
                esc(entry),
                p.mode()
            )
        }
        CeilingBy::WritableRoots => format!(
            "writable_roots: outside every entry of {}, mode {} (ceiling)",
            esc(&format!("{:?}", p.layers()[k].writable_roots())),
            p.mode()
        ),
        CeilingBy::ReadOnly | CeilingBy::Open => {
            format!("mode {} ({})", p.mode(), p.ceiling_reason(path))
        }
    }
}

pub(super) fn explain(a: ExplainArgs) -> i32 {
    let source = match a
        .source
        .as_deref()
        .map(crate::host::sys::open_root)
        .transpose()
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fencefs: --source: {e}");
            return EXIT_ERR;
        }
    };
    let loaded = reload::load_in(
        &a.policy,
        a.mode,
        source.as_ref().map(std::os::fd::AsFd::as_fd),
    );
    let policy = match loaded {
        Ok(p) => p,
        Err(errs) => {
            print_errors(&errs);
            return EXIT_ERR;
        }
    };
    let path = match normalize(&a.path) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fencefs: {}", esc(&e));
            return 2;
        }
    };
    let caller = Caller::new(a.uid, a.gid);
    // PATH is taken as a file unless it ends with '/', is the root, or OP is `list`: only
    // directories are lifted to `list` to reach granted paths below them.
    let as_dir = a.path.ends_with('/') || path.is_empty() || a.op.as_deref() == Some("list");
    let v = policy.verdict_for(&path, caller, as_dir);
    let shown = if path.is_empty() {
        ".".to_string()
    } else {
        quote::quote(&path).into_owned()
    };
    crate::outln!("path: {shown}");
    match super::roots::describe(&a.root, &path) {
        Ok(root) => {
            crate::outln!("root: {}", esc(&root));
            if let Some(alias) = super::roots::git_alias(&path) {
                let va = policy.verdict_for(&alias, caller, as_dir);
                crate::outln!(
                    "also decided as {}: {} by {}",
                    quote::quote(&alias),
                    va.effective,
                    describe_by_at(&policy, va.by, va.layer, &alias)
                );
            }
        }
        Err(e) => {
            eprintln!("fencefs: {}", esc(&e));
            return 2;
        }
    }
    crate::outln!("access: {}", v.effective);
    crate::outln!(
        "decided by: {}",
        describe_by_at(&policy, v.by, v.layer, &path)
    );
    if policy.layers().len() > 1 {
        crate::outln!("decided by layer: {}", esc(policy.layer_file(v.layer)));
        for (k, lv) in policy
            .layer_verdicts(&path, caller, as_dir)
            .iter()
            .enumerate()
        {
            crate::outln!(
                "layer {} {}: {} by {}",
                k + 1,
                esc(policy.layer_file(k)),
                lv.effective,
                describe_by_at(&policy, lv.by, k, &path)
            );
        }
    }
    for (rule, k) in policy.excepted(&path, caller) {
        crate::outln!(
            "excepted: {} except \"{}\": not covered",
            describe_rule(&policy, rule),
            esc(&policy.rule(rule).except[k])
        );
    }
    if v.by == By::Mode {
        crate::outln!(
            "grant: {} by {}",
            v.grant,
            describe_by(&policy, v.grant_by, v.layer)
        );
    }
    if !as_dir {
        let vd = policy.verdict_for(&path, caller, true);
        if vd.effective != v.effective {
            crate::outln!(
                "as a directory: {} ({})",
                vd.effective,
                describe_by_at(&policy, vd.by, vd.layer, &path)
            );
        }
    }
    if let By::Rule(i) = v.grant_by
        && let Some(ask) = policy.rule(i).ask
    {
        crate::outln!("ask: {ask}");
    }
    crate::outln!("mode: {}", policy.mode());
    if let Some(op) = a.op {
        print_op(&policy, &path, caller, as_dir, &op);
    }
    0
}

/// The `explain` line for OP: what the policy answers to that request on `path`.
fn print_op(policy: &Policy, path: &[u8], caller: Caller, as_dir: bool, op: &str) {
    let need = match op {
        "read" => Need::Read,
        "list" => Need::List,
        "create" => Need::Create,
        "append" => Need::Append,
        _ => Need::Write,
    };
    let answer = policy.check_for(path, caller, need, Special::default(), as_dir);
    crate::outln!(
        "{}: {}",
        esc(op),
        describe_answer(policy, path, need, &answer)
    );
    if policy.layers().len() > 1 {
        let decided = match &answer {
            Ok(v) => v.layer,
            Err(d) => d.verdict.layer,
        };
        crate::outln!(
            "{} decided by layer: {}",
            esc(op),
            esc(policy.layer_file(decided))
        );
        let each = policy.layer_checks(path, caller, need, Special::default(), as_dir);
        for (k, a) in each.iter().enumerate() {
            crate::outln!(
                "{} layer {} {}: {}",
                esc(op),
                k + 1,
                esc(policy.layer_file(k)),
                describe_answer(policy, path, need, a)
            );
        }
    }
}

/// `allow`, `ask (…) (by …)` or `deny ERRNO (by …)`.
fn describe_answer(
    policy: &Policy,
    path: &[u8],
    need: Need,
    answer: &Result<crate::policy::Verdict, crate::policy::Denial>,
) -> String {
    match answer {
        Ok(_) => "allow".to_string(),
        Err(d) if d.askable(policy, need).is_some() => format!(
            "ask (held for an approver; EACCES if refused, timed out or none is connected) (by {})",
            describe_by_at(policy, d.by, d.verdict.layer, path)
        ),
        Err(d) => format!(
            "deny {} (by {})",
            crate::audit::errno_name(d.errno),
            describe_by_at(policy, d.by, d.verdict.layer, path)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_paths_are_normalized() {
        assert_eq!(normalize("./a//b/").unwrap(), b"a/b");
        assert_eq!(normalize("/").unwrap(), b"");
        assert!(normalize("a/../b").is_err());
    }
}
