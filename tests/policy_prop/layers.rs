//! Layers (SPEC "Policy layers, presets and ignore files"), proven against the reference:
//! a set of 1–3 generated policies, compiled as layers, decides as the naive combination
//! of one [`Reference`] per layer does — every layer decides on its own; refused if any
//! refuses, the errno by the contract's order across layers (`none` first, then
//! device/setid, the mode, a rule); the access is the meet of the layers'; the mode is the most
//! restrictive of the modes the files set (read-only when none sets one), `--mode` over
//! all; a directory rename is allowed only when every layer allows it.

use super::*;
use fencefs::policy::Layer;

/// The combined mode as the SPEC says it, from the generated files.
fn combined_mode(layers: &[GenPolicy], over: Option<Mode>) -> Mode {
    let rank = |m: &Mode| match m {
        Mode::ReadOnly => 0,
        Mode::WorkspaceWrite => 1,
        Mode::Danger => 2,
    };
    over.or_else(|| layers.iter().filter_map(|g| g.mode).min_by_key(rank))
        .unwrap_or(Mode::ReadOnly)
}

/// The naive combination of the layers' answers to one request.
fn reference_check(
    refs: &[Reference],
    comps: &[Vec<u8>],
    caller: Caller,
    need: Need,
    special: Special,
    is_dir: bool,
) -> Result<(), i32> {
    let mut worst: Option<(u8, i32)> = None;
    for r in refs {
        let v = r.verdict(comps, caller, is_dir);
        if let Err(errno) = r.check(&v, need, special) {
            let rank = if v.grant == Access::None {
                0
            } else {
                match errno {
                    libc::EPERM => 1,
                    libc::EROFS => 2,
                    _ => 3,
                }
            };
            if worst.is_none_or(|(w, _)| rank < w) {
                worst = Some((rank, errno));
            }
        }
    }
    match worst {
        Some((_, errno)) => Err(errno),
        None => Ok(()),
    }
}

fn run_layers(layers: &[GenPolicy], over: Option<Mode>, case: &Case) -> Result<(), String> {
    let texts: Vec<String> = layers.iter().map(GenPolicy::toml).collect();
    let mut compiled = Vec::new();
    for (k, t) in texts.iter().enumerate() {
        compiled.push(
            Layer::parse(t, &format!("layer{k}.toml"))
                .map_err(|e| format!("generated layer does not parse: {e:?}\n{t}"))?,
        );
    }
    let mut policy = Policy::from_layers(compiled);
    if let Some(m) = over {
        policy.set_mode(m);
    }
    let mode = combined_mode(layers, over);
    let refs: Vec<Reference> = layers
        .iter()
        .map(|g| {
            let mut r = Reference::new(g);
            r.mode = mode;
            r
        })
        .collect();
    let ctx = |what: String| {
        let mut s = format!("{what}\n(combined mode {mode})");
        for (k, t) in texts.iter().enumerate() {
            let _ = write!(s, "\n--- layer{k}.toml\n{t}");
        }
        s
    };
    if policy.mode() != mode || policy.layers().len() != layers.len() {
        return Err(ctx(format!("mode: engine {}", policy.mode())));
    }
    let mut paths = case.paths.clone();
    paths.push(case.rename.0.clone());
    paths.push(case.rename.1.clone());
    for (path, checked) in &paths {
        let comps = split(path);
        let caller = CALLERS[*checked];
        for is_dir in [true, false] {
            let want = refs
                .iter()
                .map(|r| r.verdict(&comps, caller, is_dir).effective)
                .reduce(meet)
                .unwrap();
            let v = policy.verdict_for(path, caller, is_dir);
            let at = || format!("path {}, {caller:?}, is_dir {is_dir}", show(path));
            if v.effective != want {
                return Err(ctx(format!(
                    "verdict_for({}): engine {:?} (layer {}), reference {want:?}",
                    at(),
                    v.effective,
                    v.layer
                )));
            }
            for &need in NEEDS {
                for &special in SPECIALS {
                    let got = policy
                        .check_for(path, caller, need, special, is_dir)
                        .map(|_| ())
                        .map_err(|d| d.errno);
                    let want = reference_check(&refs, &comps, caller, need, special, is_dir);
                    if got != want {
                        return Err(ctx(format!(
                            "check_for({}, {need:?}, {special:?}): engine {got:?}, reference {want:?}",
                            at()
                        )));
                    }
                }
            }
        }
    }
    let ((old, _), (new, _)) = &case.rename;
    let got = policy.dir_rename_allowed(old, new);
    let want = refs
        .iter()
        .all(|r| r.dir_rename_allowed(&split(old), &split(new)));
    if got != want {
        return Err(ctx(format!(
            "dir_rename_allowed({}, {}): engine {got}, reference {want}",
            show(old),
            show(new)
        )));
    }
    check_listings(&policy, paths.iter().map(|(p, _)| p.as_slice()), CALLERS).map_err(ctx)?;
    Ok(())
}

proptest! {
    // Each case decides against up to three references: a third of PROPTEST_CASES.
    #![proptest_config(ProptestConfig { cases: config().cases.div_ceil(3), ..config() })]

    /// The layered engine decides as the naive combination of the layers' references.
    #[test]
    fn layers_match_the_reference_combination(
        layers in prop::collection::vec(gen_policy(), 1..=3),
        over in prop::option::weighted(0.2, mode()),
        case in case(),
    ) {
        run_layers(&layers, over, &case).map_err(TestCaseError::fail)?;
    }
}
