//! The policy fuzz harness: arbitrary bytes → policy text + paths → parse, compile, decide.
//!
//! Shared, via `#[path]`, by the cargo-fuzz target (`fuzz/fuzz_targets/policy.rs`, libFuzzer,
//! nightly features) and by the stable-Rust replay/random tests in `tests/policy_prop/`, so
//! a crash found by either is reproduced by the same code.
//!
//! Input layout: the bytes up to the first NUL are the policy (UTF-8, lossily); the bytes
//! after it are NUL-separated paths. To these the harness adds fixed paths and paths
//! derived from the policy text (every quoted string, as written and normalized), so that
//! inputs mentioning a pattern also query paths the pattern is likely to match.
//!
//! Besides "no panic", it asserts invariants that hold for every policy and every path:
//! `effective == min(grant, ceiling)`, `verdict == verdict_for(.., true)`, every `By` index
//! in range, `check_for` consistent with the verdict, `ceiling_by` agreeing with `ceiling`,
//! a rule that an `except` glob takes out never deciding (`excepted`), and errors carrying
//! a position.

use fencefs::policy::{Access, By, Caller, CeilingBy, Mode, Need, Policy, Special};

/// Upper bound on paths queried per input (keeps one execution fast).
const MAX_PATHS: usize = 16;
/// Upper bound on the path length used (longer ones are cut, at a byte boundary).
const MAX_PATH_LEN: usize = 512;

const CALLERS: [Caller; 3] = [
    Caller::new(0, 0),
    Caller::new(1000, 1000),
    Caller::new(2000, 100),
];

const FIXED_PATHS: [&[u8]; 10] = [
    b"",
    b"a",
    b"a/b",
    b"secrets/x.pem",
    b"a/site-packages/certifi/cacert.pem",
    b".git/hooks/pre-commit",
    b".git/config",
    b"docs/a/b/c/d",
    b"\xff/\xfe",
    b"a//b/./../c/",
];

const NEEDS: [Need; 5] = [
    Need::List,
    Need::Read,
    Need::Write,
    Need::Create,
    Need::Append,
];

const SPECIALS: [Special; 3] = [
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
];

/// Runs one input. Panics (an assertion) only on an engine bug.
pub fn run(data: &[u8]) {
    let (text, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let text = String::from_utf8_lossy(text);
    let policy = match Policy::parse(&text, "fuzz.toml") {
        Ok(p) => p,
        Err(errors) => {
            assert!(!errors.is_empty(), "Err(vec![]) for {text:?}");
            for e in &errors {
                assert_eq!(e.file, "fuzz.toml");
                assert!(
                    e.line >= 1 && e.column >= 1,
                    "error without position: {e:?}"
                );
                let _ = e.to_string();
            }
            return;
        }
    };
    let paths = derive_paths(&text, rest);
    // The file's own mode, then one `--mode` override picked by the input.
    let modes = [Mode::ReadOnly, Mode::WorkspaceWrite, Mode::Danger];
    for mode in [None, Some(modes[data.len() % 3])] {
        let mut p = policy.clone();
        if let Some(mode) = mode {
            p.set_mode(mode);
            assert_eq!(p.mode(), mode);
        }
        for path in &paths {
            for caller in CALLERS {
                decide(&p, path, caller);
            }
        }
        for (i, old) in paths.iter().enumerate().take(8) {
            for new in paths.iter().skip(i).take(4) {
                let _ = p.dir_rename_allowed(old, new);
                let _ = p.dir_rename_allowed(new, old);
            }
        }
    }
}

fn check_by(p: &Policy, by: By) {
    match by {
        By::Rule(i) | By::Visibility(i) => {
            assert!(i < p.rules().len(), "{by:?} out of range");
            let _ = p.rule(i);
        }
        By::Ignore(hit) => {
            assert!(hit.file < p.ignore_set().len(), "{by:?} out of range");
            let _ = p.ignore_set().describe(hit);
        }
        By::Default | By::Mode => {}
    }
}

fn decide(p: &Policy, path: &[u8], caller: Caller) {
    let ceiling = p.ceiling(path);
    assert!(
        ceiling.includes(Access::Read),
        "ceiling below read at {path:?}"
    );
    let ceiling_by = p.ceiling_by(path);
    assert_eq!(
        ceiling_by == CeilingBy::Open,
        ceiling == Access::Write,
        "{ceiling_by:?} at {path:?}"
    );
    if let CeilingBy::Protected(i) = ceiling_by {
        assert!(i < p.protected().len(), "{ceiling_by:?} out of range");
        let _ = p.protected_entry(i);
    }
    let excepted = p.excepted(path, caller);
    for is_dir in [true, false] {
        let v = p.verdict_for(path, caller, is_dir);
        assert_eq!(v.effective, v.grant.meet(ceiling), "{v:?} at {path:?}");
        assert_eq!(
            v.by == By::Mode,
            v.grant.above(v.effective),
            "{v:?} at {path:?}"
        );
        assert_ne!(v.grant_by, By::Mode, "{v:?} at {path:?}");
        if matches!(v.grant_by, By::Visibility(_)) {
            assert_eq!(v.grant, Access::List, "{v:?} at {path:?}");
        }
        if !is_dir {
            assert!(
                !matches!(v.grant_by, By::Visibility(_)),
                "{v:?} at {path:?}"
            );
        }
        check_by(p, v.by);
        check_by(p, v.grant_by);
        for &(rule, k) in &excepted {
            assert!(rule < p.rules().len() && k < p.rule(rule).except.len());
            assert!(p.rule_applies(rule, caller));
            assert_ne!(
                v.grant_by,
                By::Rule(rule),
                "taken out, yet decides at {path:?}"
            );
        }
        if is_dir {
            assert_eq!(v, p.verdict(path, caller));
        }
        for need in NEEDS {
            for special in SPECIALS {
                let got = p.check_for(path, caller, need, special, is_dir);
                if is_dir {
                    assert_eq!(got, p.check(path, caller, need, special));
                }
                match got {
                    Ok(ok) => {
                        assert_eq!(ok, v);
                        assert!(
                            v.effective.includes(need.access()),
                            "{need:?} allowed with {v:?}"
                        );
                    }
                    Err(d) => {
                        assert_eq!(d.verdict, v);
                        check_by(p, d.by);
                        assert!(
                            [libc::ENOENT, libc::EACCES, libc::EPERM, libc::EROFS]
                                .contains(&d.errno),
                            "errno {} for {need:?}",
                            d.errno
                        );
                    }
                }
            }
        }
    }
}

/// Fixed paths, the NUL-separated paths after the policy, and every quoted string of the
/// policy text (raw and normalized), each also with a child `x` below it.
fn derive_paths(text: &str, rest: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = FIXED_PATHS.iter().map(|p| p.to_vec()).collect();
    if !rest.is_empty() {
        out.extend(rest.split(|&b| b == 0).map(<[u8]>::to_vec));
    }
    for quoted in quoted_strings(text) {
        let normalized = normalize(quoted.as_bytes());
        let mut child = normalized.clone();
        if !child.is_empty() {
            child.push(b'/');
        }
        child.push(b'x');
        out.push(quoted.into_bytes());
        out.push(normalized);
        out.push(child);
    }
    for p in &mut out {
        p.truncate(MAX_PATH_LEN);
    }
    out.truncate(MAX_PATHS);
    out
}

/// The contents of '...' and "..." strings (no escape handling: a heuristic, not TOML).
fn quoted_strings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = text.char_indices();
    while let Some((start, c)) = chars.next() {
        if c != '\'' && c != '"' {
            continue;
        }
        let body_start = start + c.len_utf8();
        let mut end = None;
        for (i, d) in chars.by_ref() {
            if d == c || d == '\n' {
                end = Some(i);
                break;
            }
        }
        let body = &text[body_start..end.unwrap_or(text.len())];
        out.push(body.to_string());
        if out.len() >= MAX_PATHS {
            break;
        }
    }
    out
}

/// A path as the daemon passes it: no empty, `.` or `..` components.
fn normalize(path: &[u8]) -> Vec<u8> {
    let parts: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b"." && *c != b"..")
        .collect();
    parts.join(&b'/')
}
