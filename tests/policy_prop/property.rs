//! The properties: the engine equals the reference; directory renames keep every subtree grant tied.

use super::*;

// ------------------------------------------------------------------------ the property

pub(super) fn show(path: &[u8]) -> String {
    format!("\"{}\"", path.escape_ascii())
}

fn need_name(n: Need) -> &'static str {
    match n {
        Need::List => "List",
        Need::Read => "Read",
        Need::Write => "Write",
        Need::Create => "Create",
        Need::Append => "Append",
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
    let by_mode = !ge(r.ceiling, r.grant);
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

pub(super) fn run_case(case: &Case) -> Result<(), String> {
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

    check_listings(&policy, paths.iter().map(|(p, _)| p.as_slice()), CALLERS).map_err(ctx)?;

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

pub(super) fn config() -> ProptestConfig {
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

/// [`Policy::listing`] against [`Policy::verdict_for`]: for the parent directory of every
/// path, every name of the alphabet (and the path's own last name) as its entries, for
/// each caller, in two orders (files only forward; backward with every other name a
/// directory): a listing shows a name exactly when its verdict is not `none`. A listing
/// decides the file names no glob matches at their depth once, so the orders matter.
pub(super) fn check_listings<'a>(
    policy: &Policy,
    paths: impl Iterator<Item = &'a [u8]>,
    callers: &[Caller],
) -> Result<(), String> {
    for path in paths {
        let (dir, last) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        let mut names: Vec<&[u8]> = NAMES.iter().map(|n| n.as_bytes()).collect();
        names.extend(PATH_ONLY.iter().copied());
        if !last.is_empty() {
            names.push(last);
        }
        let child = |n: &[u8]| {
            if dir.is_empty() {
                n.to_vec()
            } else {
                [dir, b"/", n].concat()
            }
        };
        for &caller in callers {
            let forward = names.iter().map(|&n| (n, false));
            let backward = names
                .iter()
                .rev()
                .enumerate()
                .map(|(i, &n)| (n, i % 2 == 1));
            for order in [forward.collect::<Vec<_>>(), backward.collect()] {
                let mut listing = policy.listing(caller);
                for (name, is_dir) in order {
                    let p = child(name);
                    let want = policy.verdict_for(&p, caller, is_dir).effective != Access::None;
                    if listing.visible(&p, is_dir) != want {
                        return Err(format!(
                            "listing of {}: {} (is_dir {is_dir}, {caller:?}) shown {}, verdict_for says {want}",
                            show(dir),
                            show(&p),
                            !want
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}
