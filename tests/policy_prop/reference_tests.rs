//! The reference's own tests: hand-written cases it must get right.

use super::*;

// ------------------------------------------------------------------------ the reference's own tests

pub(super) fn pat(s: &str) -> Pat {
    normalize(s)
}

pub(super) fn p(s: &str) -> Vec<Vec<u8>> {
    split(s.as_bytes())
}

/// The reference matcher on the SPEC's and README's examples (it must be right before it can
/// judge the engine).
#[test]
fn reference_matcher_examples() {
    let yes: &[(&str, &[u8])] = &[
        ("**/*.pem", b"x.pem"),
        ("**/*.pem", b"a/b/x.pem"),
        ("**/.env", b".env"),
        ("a/**/b", b"a/b"),
        ("a/**/b", b"a/x/y/b"),
        ("*", b".env"),
        ("?", b"\xff"),
        ("??", "\u{e9}".as_bytes()),
        ("[ab]", b"b"),
        ("[!a]", b"c"),
        ("**", b""),
        ("**", b"a/b"),
        (".", b""),
        ("./a/", b"a"),
        ("a//b", b"a/b"),
        ("a/**", b"a/x/y"),
    ];
    let no: &[(&str, &[u8])] = &[
        ("*", b""),
        ("*", b"a/b"),
        ("**/*.pem", b"a/x.pem.b"),
        ("?", "\u{e9}".as_bytes()),
        ("[!a]", b"a"),
        ("[!a]", "\u{e9}".as_bytes()),
        ("a?b", b"a/b"),
        ("a", b"a/b"),
        ("a/**", b"a"),
        ("a/**/**", b"a"),
        (".", b"a"),
    ];
    for (g, path) in yes {
        assert!(matches(&pat(g), &split(path)), "{g} should match {path:?}");
    }
    for (g, path) in no {
        assert!(
            !matches(&pat(g), &split(path)),
            "{g} should not match {path:?}"
        );
    }
    assert!(covers(&pat("a"), &p("a/b/c")));
    assert!(!covers(&pat("a/b"), &p("a")));
    assert!(could_match_below(&pat("a/*/x.pem"), &p("a")));
    assert!(could_match_below(&pat("a/**"), &p("a")));
    assert!(could_match_below(&pat("**"), &p("")));
    assert!(could_match_below(&pat("a/**/.e*"), &p("a/b/c")));
    assert!(!could_match_below(&pat("a/*/x.pem"), &p("b")));
    assert!(!could_match_below(&pat("a"), &p("a")));
    assert!(!could_match_below(&pat("."), &p("")));
    assert!(floating(&pat("**/*.pem")) && floating(&pat("**")) && floating(&pat("**/**/a")));
    assert!(!floating(&pat("**/a/**")) && !floating(&pat("a")) && !floating(&pat(".")));
}

/// The reference's except semantics on the SPEC's example and the depth rule.
#[test]
fn reference_except_examples() {
    let rule = |path: &str, access, except: &[&str]| GenRule {
        path: path.into(),
        access,
        except: Some(except.iter().map(|e| e.to_string()).collect()),
        uids: None,
        gids: None,
    };
    let g = GenPolicy {
        mode: Some(Mode::Danger),
        override_mode: None,
        default: None,
        writable_roots: None,
        protected: None,
        allow_setid: None,
        allow_devices: None,
        rules: vec![
            rule(
                "**/*.pem",
                Access::None,
                &["**/site-packages/**", "**/node_modules/**"],
            ),
            rule("a", Access::Read, &[]),
            rule("a/b", Access::None, &["a/b/c"]),
        ],
        inline_rules: false,
    };
    let r = Reference::new(&g);
    let me = CALLERS[1];
    let grant = |path: &str, is_dir| r.verdict(&p(path), me, is_dir).grant;
    assert_eq!(grant("k.pem", false), Access::None);
    assert_eq!(
        grant("x/site-packages/certifi/cacert.pem", false),
        Access::Write
    );
    assert_eq!(grant("node_modules/t/k.pem", false), Access::Write);
    assert_eq!(grant("x/site-packages.pem", false), Access::None);
    // the rule at `a/b` does not exist below `a/b/c`: the one at `a` decides
    assert_eq!(grant("a/b/x", false), Access::None);
    assert_eq!(grant("a/b/c", false), Access::Read);
    assert_eq!(grant("a/b/c/d/e", false), Access::Read);
    // ... and the pem rule below both
    assert_eq!(grant("a/b/c/k.pem", false), Access::None);
    // directories needed to reach what the excepts uncover stay visible
    assert_eq!(grant("a/b", true), Access::List);
    assert_eq!(grant("k.pem", true), Access::List);
    assert!(r.dir_rename_allowed(&p("x/a"), &p("x/b")));
    assert!(!r.dir_rename_allowed(&p("keys"), &p("node_modules/keys")));
    assert!(r.rename_preserves_policy(&p("x/a"), &p("x/b")).is_ok());
    assert_eq!(
        stands(&pat("**/a/**"), &p("x/y")),
        stands(&pat("**/a/**"), &p("z"))
    );
    assert_ne!(
        stands(&pat("**/a/**"), &p("x/a")),
        stands(&pat("**/a/**"), &p("z"))
    );
    assert_eq!(
        stands(&pat("**/a/**"), &p("x/a")),
        stands(&pat("**/a/**"), &p("a"))
    );
    assert_eq!(stands(&pat("a/*/c"), &p("a/p")), vec![2]);
    assert_eq!(stands(&pat("a/*/c"), &p("b")), Vec::<usize>::new());
}

/// The reference decides the SPEC's own examples as the SPEC says.
#[test]
fn reference_decides_spec_examples() {
    let g = GenPolicy {
        mode: Some(Mode::WorkspaceWrite),
        override_mode: None,
        default: None,
        writable_roots: None,
        protected: None,
        allow_setid: None,
        allow_devices: None,
        rules: [
            ("secrets", Access::None, None),
            ("secrets/pub", Access::Read, None),
            ("**/*.pem", Access::None, None),
            ("docs", Access::Read, None),
            ("build/cache", Access::Write, Some(vec![1000])),
            ("build/cache", Access::Read, None),
        ]
        .into_iter()
        .map(|(path, access, uids)| GenRule {
            path: path.into(),
            access,
            except: None,
            uids,
            gids: None,
        })
        .collect(),
        inline_rules: false,
    };
    let r = Reference::new(&g);
    let me = Caller::new(1000, 1000);
    let other = Caller::new(5, 5);
    let eff = |path: &str, c: Caller, is_dir: bool| r.verdict(&p(path), c, is_dir).effective;
    assert_eq!(eff("secrets", me, true), Access::List);
    assert_eq!(eff("secrets", me, false), Access::None);
    assert_eq!(eff("secrets/x", me, true), Access::None);
    assert_eq!(eff("secrets/pub/a", me, false), Access::Read);
    assert_eq!(eff("docs/x.pem", me, false), Access::None);
    assert_eq!(eff("docs/x", me, false), Access::Read);
    assert_eq!(eff("build/cache/o", me, false), Access::Write);
    assert_eq!(eff("build/cache/o", other, false), Access::Read);
    assert_eq!(eff(".git/hooks/pre-commit", me, false), Access::Read);
    assert_eq!(eff("src/main.rs", me, false), Access::Write);
    let v = r.verdict(&p("docs/x"), me, false);
    assert_eq!(r.check(&v, Need::Write, SPECIALS[1]), Err(libc::EPERM));
    assert_eq!(r.check(&v, Need::Write, SPECIALS[0]), Err(libc::EACCES));
    let v = r.verdict(&p("secrets/x"), me, false);
    assert_eq!(r.check(&v, Need::Create, SPECIALS[3]), Err(libc::EACCES));
    assert_eq!(r.check(&v, Need::Read, SPECIALS[3]), Err(libc::ENOENT));
    let v = r.verdict(&p(".git/config"), me, false);
    assert_eq!(r.check(&v, Need::Write, SPECIALS[0]), Err(libc::EROFS));
    assert!(!r.dir_rename_allowed(&p("secrets"), &p("s2")));
    assert!(!r.dir_rename_allowed(&p("x"), &p(".git")));
    assert!(r.dir_rename_allowed(&p("x"), &p("y")));
}
