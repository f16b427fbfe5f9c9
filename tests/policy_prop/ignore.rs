//! Ignore files (`ignore_files`), proven against a naive reference of gitignore's rules
//! as the SPEC and the book state them, written here without the `ignore` crate: a file
//! at D applies below D; a pattern without `/` matches the last component at any depth, a
//! leading `/` only D's own children, a trailing `/` only directories; `!` re-includes;
//! the last matching line of a file decides, the deepest file with a matching line
//! decides, the later name among files of one directory; each prefix of a path is checked
//! from the top and a hidden directory hides everything below it; an ignore file's own
//! name is never hidden by a pattern. A hidden path is `none` (ENOENT, EACCES to create)
//! whatever the layer says; every ignore file (found or not) is read-only (EROFS after
//! `none` and device/setid); otherwise the layer's reference decides unchanged.

use super::*;
use fencefs::policy::IgnoreSource;

const IGNORE_NAMES: &[&str] = &[".aiignore", ".cursorignore"];
/// Pattern names: literal names from the alphabet and three wildcards.
const IGNORE_WORDS: &[&str] = &["a", "b", ".env", "x.pem", "c", "*", "*.pem", ".e*"];

#[derive(Clone, Debug)]
struct GenLine {
    negate: bool,
    anchored: bool,
    dir_only: bool,
    word: &'static str,
}

impl GenLine {
    fn text(&self) -> String {
        format!(
            "{}{}{}{}",
            if self.negate { "!" } else { "" },
            if self.anchored { "/" } else { "" },
            self.word,
            if self.dir_only { "/" } else { "" }
        )
    }

    /// Whether this line matches `rel` (the path below the file's directory).
    fn matches(&self, rel: &[Vec<u8>], is_dir: bool) -> bool {
        if rel.is_empty() || (self.dir_only && !is_dir) || (self.anchored && rel.len() != 1) {
            return false;
        }
        let name = &rel[rel.len() - 1];
        match self.word {
            "*" => true,
            "*.pem" => name.ends_with(b".pem"),
            ".e*" => name.starts_with(b".e"),
            w => name.as_slice() == w.as_bytes(),
        }
    }
}

#[derive(Clone, Debug)]
struct GenIgnore {
    dir: Vec<u8>,
    name: usize,
    lines: Vec<GenLine>,
}

fn gen_ignore() -> impl Strategy<Value = GenIgnore> {
    let line = (
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.25),
        prop::bool::weighted(0.25),
        select(IGNORE_WORDS),
    )
        .prop_map(|(negate, anchored, dir_only, word)| GenLine {
            negate,
            anchored,
            dir_only,
            word,
        });
    (
        path(0..=2),
        0..IGNORE_NAMES.len(),
        prop::collection::vec(line, 1..=4),
    )
        .prop_map(|(dir, name, lines)| GenIgnore { dir, name, lines })
}

/// The reference: whether `path` is hidden by `files`.
fn ref_hidden(files: &[GenIgnore], path: &[Vec<u8>], is_dir: bool) -> bool {
    for end in 1..=path.len() {
        let last = end == path.len();
        if last
            && IGNORE_NAMES
                .iter()
                .any(|n| n.as_bytes() == path[end - 1].as_slice())
        {
            return false;
        }
        let prefix_is_dir = !last || is_dir;
        // The deepest directory above the prefix with a matching line decides.
        'depth: for d in (0..end).rev() {
            let mut here: Vec<&GenIgnore> = files
                .iter()
                .filter(|f| split(&f.dir) == path[..d])
                .collect();
            // Later names first; the last file of the same name wins (the engine reads one).
            here.sort_by_key(|f| std::cmp::Reverse(f.name));
            for f in here {
                let rel = &path[d..end];
                if let Some(line) = f.lines.iter().rev().find(|l| l.matches(rel, prefix_is_dir)) {
                    if line.negate {
                        break 'depth;
                    }
                    return true;
                }
            }
        }
    }
    false
}

fn run_ignore(g: &GenPolicy, files: &[GenIgnore], case: &Case) -> Result<(), String> {
    let names: Vec<String> = IGNORE_NAMES.iter().map(|n| format!("\"{n}\"")).collect();
    let text = format!("ignore_files = [{}]\n{}", names.join(", "), g.toml());
    let sources: Vec<IgnoreSource> = files
        .iter()
        .map(|f| IgnoreSource {
            dir: f.dir.clone(),
            name: IGNORE_NAMES[f.name].to_string(),
            text: f.lines.iter().map(|l| l.text() + "\n").collect(),
        })
        .collect();
    let mut policy = Policy::parse(&text, "t.toml")
        .map_err(|e| format!("generated policy does not parse: {e:?}\n{text}"))?
        .with_ignores(&sources)
        .map_err(|e| format!("generated ignore files do not compile: {e:?}"))?;
    if let Some(m) = g.override_mode {
        policy.set_mode(m);
    }
    let mut r = Reference::new(g);
    if let Some(m) = g.override_mode {
        r.mode = m;
    }
    let ctx = |what: String| {
        let mut s = format!("{what}\n--- t.toml\n{text}");
        for src in &sources {
            let _ = write!(s, "\n--- {}\n{}", show(&src.path()), src.text);
        }
        s
    };
    let mut paths: Vec<Vec<u8>> = case.paths.iter().map(|(p, _)| p.clone()).collect();
    // Ignore files' own paths, and paths below their directories.
    for f in files {
        paths.push(f.dir.clone());
        let below = |n: &[u8]| [f.dir.as_slice(), n].concat_path();
        paths.push(below(IGNORE_NAMES[f.name].as_bytes()));
        for n in ["a", "x.pem", ".env", "c"] {
            paths.push(below(n.as_bytes()));
        }
    }
    for path in &paths {
        let comps = split(path);
        for (ci, &caller) in CALLERS.iter().enumerate() {
            if ci > 1 {
                break;
            }
            for is_dir in [true, false] {
                let hidden = ref_hidden(files, &comps, is_dir);
                let pinned = comps
                    .last()
                    .is_some_and(|n| IGNORE_NAMES.iter().any(|i| i.as_bytes() == n.as_slice()));
                let rv = r.verdict(&comps, caller, is_dir);
                let want = if hidden {
                    Access::None
                } else if pinned {
                    meet(rv.effective, Access::Read)
                } else {
                    rv.effective
                };
                let at = || format!("path {}, {caller:?}, is_dir {is_dir}", show(path));
                let v = policy.verdict_for(path, caller, is_dir);
                if v.effective != want {
                    return Err(ctx(format!(
                        "verdict_for({}): engine {:?} ({:?}), reference {want:?} (hidden {hidden})",
                        at(),
                        v.effective,
                        v.by
                    )));
                }
                for &need in NEEDS {
                    for &special in SPECIALS {
                        let got = policy
                            .check_for(path, caller, need, special, is_dir)
                            .map(|_| ())
                            .map_err(|d| d.errno);
                        let base = r.check(&rv, need, special);
                        let want = if hidden {
                            Err(if need == Need::Create {
                                libc::EACCES
                            } else {
                                libc::ENOENT
                            })
                        } else if pinned
                            && matches!(need, Need::Write | Need::Create | Need::Append)
                        {
                            match base {
                                Err(e) if rv.grant == Access::None || e == libc::EPERM => Err(e),
                                _ => Err(libc::EROFS),
                            }
                        } else {
                            base
                        };
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
    }
    check_listings(&policy, paths.iter().map(Vec::as_slice), &CALLERS[..2]).map_err(ctx)?;
    Ok(())
}

/// `dir` joined with `name` as a workspace path.
trait ConcatPath {
    fn concat_path(&self) -> Vec<u8>;
}

impl ConcatPath for [&[u8]; 2] {
    fn concat_path(&self) -> Vec<u8> {
        let [dir, name] = *self;
        if dir.is_empty() {
            name.to_vec()
        } else {
            [dir, b"/", name].concat()
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: config().cases.div_ceil(4), ..config() })]

    /// Ignore files hide as the naive gitignore reference says, over any layer.
    #[test]
    fn ignore_files_match_the_reference(
        files in prop::collection::vec(gen_ignore(), 0..=4),
        case in case(),
    ) {
        // One file per (directory, name), as on a real file system.
        let mut seen = BTreeSet::new();
        let files: Vec<GenIgnore> = files
            .into_iter()
            .filter(|f| seen.insert((f.dir.clone(), f.name)))
            .collect();
        run_ignore(&case.policy, &files, &case).map_err(TestCaseError::fail)?;
    }
}
