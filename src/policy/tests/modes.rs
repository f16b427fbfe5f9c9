//! Sandbox modes as a ceiling, the built-in default, accessors.

use super::*;

// ---------------------------------------------------------------- modes

/// (policy src, path, expected effective, expected by, expected grant)
type ModeCase<'a> = (&'a str, &'a [u8], Access, &'a str, Access);

#[test]
fn mode_ceiling_table() {
    let ro = "mode = 'read-only'\n";
    let ww = "mode = 'workspace-write'\n";
    let dg = "mode = 'danger'\n";
    let roots = "mode = 'workspace-write'\nwritable_roots = ['src', 'build/*', './out/']\n";
    let prot = "mode = 'workspace-write'\nprotected = ['src/gen', '**/*.lock']\n";
    #[rustfmt::skip]
    let cases: &[ModeCase] = &[
        // read-only: nothing above read
        (ro, b"", Read, "mode", Write),
        (ro, b"a/b", Read, "mode", Write),
        ("mode = 'read-only'\ndefault = 'read'", b"a", Read, "default", Read),
        ("mode = 'read-only'\ndefault = 'list'", b"a", List, "default", List),
        ("mode = 'read-only'\ndefault = 'none'", b"a", No, "default", No),
        ("", b"a", Read, "mode", Write), // read-only is the default mode
        // workspace-write, default roots ["."] and default protected
        (ww, b"", Write, "default", Write),
        (ww, b"a/b", Write, "default", Write),
        (ww, b".git", Write, "default", Write),
        (ww, b".git/HEAD", Write, "default", Write),
        (ww, b".git/hooks", Read, "mode", Write),
        (ww, b".git/hooks/pre-commit", Read, "mode", Write),
        (ww, b".git/config", Read, "mode", Write),
        (ww, b".git/config.d", Write, "default", Write),
        (ww, b"sub/.git/hooks", Write, "default", Write),
        // workspace-write, explicit roots
        (roots, b"src", Write, "default", Write),
        (roots, b"src/a/b", Write, "default", Write),
        (roots, b"srcx", Read, "mode", Write),
        (roots, b"", Read, "mode", Write),
        (roots, b"build", Read, "mode", Write),
        (roots, b"build/x", Write, "default", Write),
        (roots, b"build/x/y", Write, "default", Write),
        (roots, b"out/z", Write, "default", Write),
        (roots, b"other/src", Read, "mode", Write),
        // explicit protected replaces the default list
        (prot, b".git/hooks/x", Write, "default", Write),
        (prot, b"src/gen", Read, "mode", Write),
        (prot, b"src/gen/a.rs", Read, "mode", Write),
        (prot, b"src/genx", Write, "default", Write),
        (prot, b"a/b/Cargo.lock", Read, "mode", Write),
        ("mode = 'workspace-write'\nprotected = []", b".git/hooks/x", Write, "default", Write),
        ("mode = 'workspace-write'\nwritable_roots = []", b"a", Read, "mode", Write),
        // the ceiling only lowers: a read grant inside a root stays read
        ("mode = 'workspace-write'\n[[rule]]\npath='docs'\naccess='read'\n", b"docs/x", Read, "rule docs", Read),
        ("mode = 'workspace-write'\ndefault = 'none'", b".git/hooks", No, "default", No),
        // danger: roots and protected ignored, grants still apply
        (dg, b".git/hooks/pre-commit", Write, "default", Write),
        ("mode = 'danger'\nwritable_roots = ['src']", b"other", Write, "default", Write),
        ("mode = 'danger'\n[[rule]]\npath='docs'\naccess='read'\n", b"docs", Read, "rule docs", Read),
        ("mode = 'danger'\n[[rule]]\npath='s'\naccess='none'\n", b"s", No, "rule s", No),
    ];
    for (i, (src, path, eff, by, grant)) in cases.iter().enumerate() {
        let p = pol(src);
        let v = p.verdict(path, ME);
        assert_eq!(
            (v.effective, by_name(&p, v.by), v.grant),
            (*eff, by.to_string(), *grant),
            "case {i}: path {:?} with\n{src}",
            String::from_utf8_lossy(path)
        );
        assert_ne!(v.grant_by, By::Mode, "case {i}");
        assert_eq!(v.effective, v.grant.meet(p.ceiling(path)), "case {i}");
    }
}

#[test]
fn set_mode_overrides_file() {
    let mut p = pol("mode = 'read-only'\n");
    assert_eq!(p.mode(), Mode::ReadOnly);
    assert_eq!(p.verdict(b"a", ME).effective, Read);
    p.set_mode(Mode::Danger);
    assert_eq!(p.mode(), Mode::Danger);
    assert_eq!(p.verdict(b".git/hooks/x", ME).effective, Write);
    p.set_mode(Mode::WorkspaceWrite);
    assert_eq!(p.verdict(b".git/hooks/x", ME).effective, Read);
    assert_eq!(p.verdict(b"x", ME).effective, Write);
}

#[test]
fn builtin_default_policy() {
    let p = Policy::builtin_default();
    assert_eq!(p.mode(), Mode::ReadOnly);
    assert_eq!(p.default_access(), Read);
    assert!(p.rules().is_empty());
    assert!(!p.has_id_rules() && !p.allow_setid() && !p.allow_devices());
    assert_eq!(p.layers()[0].writable_roots(), ["."]);
    assert_eq!(p.layers()[0].protected(), [".git/hooks", ".git/config"]);
    let v = p.verdict(b"a/b", ME);
    assert_eq!((v.grant, v.effective, v.by), (Read, Read, By::Default));
    let mut p = p;
    p.set_mode(Mode::WorkspaceWrite);
    // default read: the mode does not raise anything
    assert_eq!(p.verdict(b"a", ME).effective, Read);
    assert_eq!(p.ceiling(b"a"), Write);
    assert_eq!(p.ceiling(b".git/hooks/x"), Read);
}

#[test]
fn may_hide_table() {
    let uid_rule = "[[rule]]\npath = 'x'\naccess = 'none'\nuid = [1]\n";
    let cases: &[(String, bool)] = &[
        (String::new(), false),
        ("default = 'read'\n".into(), false),
        ("default = 'list'\n".into(), false),
        ("default = 'none'\n".into(), true),
        // the visibility lift does not matter: something below `a` stays hidden
        (
            format!("default = 'none'\n{}", rules(&[("a/b", "read")])),
            true,
        ),
        (rules(&[("docs", "read"), ("src", "list")]), false),
        (rules(&[("**/.env", "none")]), true),
        (rules(&[("secrets", "none"), ("secrets/pub", "read")]), true),
        // a rule for one uid only still hides from that uid
        (uid_rule.to_string(), true),
        // the mode never hides
        (
            format!("mode = 'read-only'\n{}", rules(&[("a", "read")])),
            false,
        ),
    ];
    for (src, want) in cases {
        assert_eq!(pol(src).may_hide(), *want, "{src}");
    }
    assert!(!Policy::builtin_default().may_hide());
    let mut p = pol("default = 'none'\n");
    p.set_mode(Mode::Danger);
    assert!(p.may_hide(), "a mode override keeps what the rules hide");
}

#[test]
fn defaults_and_accessors_of_a_parsed_policy() {
    let p = pol("");
    assert_eq!(p.mode(), Mode::ReadOnly);
    assert_eq!(p.default_access(), Write);
    assert_eq!(p.layers()[0].writable_roots(), ["."]);
    assert_eq!(p.layers()[0].protected(), [".git/hooks", ".git/config"]);
    assert!(!p.allow_setid() && !p.allow_devices());

    let p = pol(
        "mode = \"danger\"\ndefault = \"list\"\nallow_setid = true\nallow_devices = true\n\
         writable_roots = [\"./src/\"]\nprotected = []\n\n[[rule]]\npath = \"./a/\"\naccess = \"read\"\n\
         uid = [1, 2]\n\n[[rule]]\npath = \"b\"\naccess = \"none\"\ngid = [3]\n",
    );
    assert_eq!(p.mode(), Mode::Danger);
    assert_eq!(p.default_access(), List);
    assert!(p.allow_setid() && p.allow_devices() && p.has_id_rules());
    assert_eq!(p.layers()[0].writable_roots(), ["./src/"]);
    assert!(p.layers()[0].protected().is_empty());
    assert_eq!(p.rules().len(), 2);
    let r = p.rule(0);
    assert_eq!(
        (
            r.pattern.as_str(),
            r.access,
            r.line,
            r.uids.as_slice(),
            r.gids.as_slice()
        ),
        ("./a/", Read, 8, &[1, 2][..], &[][..])
    );
    let r = p.rule(1);
    assert_eq!(
        (
            r.pattern.as_str(),
            r.access,
            r.line,
            r.uids.as_slice(),
            r.gids.as_slice()
        ),
        ("b", No, 13, &[][..], &[3][..])
    );
}

#[test]
fn spec_example_parses() {
    let src = r#"
mode = "workspace-write"     # read-only | workspace-write | danger   (default read-only)
default = "write"            # access of paths no rule matches         (default "write")
writable_roots = ["."]       # workspace-write: where writes may happen (default ["."])
allow_setid = false          # setuid/setgid bits may be set through the mount
allow_devices = false        # device nodes may be created through the mount
protected = [".git/hooks", ".git/config"]

[[rule]]
path = "secrets"             # relative to the workspace root
access = "none"

[[rule]]
path = "**/*.pem"
access = "none"

[[rule]]
path = "docs"
access = "read"

[[rule]]
path = "build/cache"
access = "write"
uid = [1000]                 # optional: only for requests from these uids (or gid = [...])
"#;
    let p = pol(src);
    assert_eq!(p.rules().len(), 4);
    assert_eq!(p.rule(3).line, 21);
    assert_eq!(p.verdict(b"secrets/k", ME).effective, No);
    assert_eq!(p.verdict(b"src/x.pem", ME).effective, No);
    assert_eq!(p.verdict(b"docs/x.pem", ME).effective, No);
    assert_eq!(p.verdict(b"docs/a.md", ME).effective, Read);
    assert_eq!(p.verdict(b"build/cache/o", ME).effective, Write);
    assert_eq!(p.verdict(b"src/main.rs", ME).effective, Write);
    assert_eq!(p.verdict(b".git/hooks/pre-push", ME).effective, Read);
}

// ---------------------------------------------------------------- what set the ceiling

#[test]
fn ceiling_by_table() {
    let ww = "mode = 'workspace-write'\n";
    // (policy src, path, expected)
    #[rustfmt::skip]
    let cases: &[(String, &[u8], CeilingBy)] = &[
        ("mode = 'read-only'".into(), b"a", CeilingBy::ReadOnly),
        ("mode = 'danger'".into(), b".git/hooks/x", CeilingBy::Open),
        (ww.into(), b"src/a", CeilingBy::Open),
        (ww.into(), b".git/hooks", CeilingBy::Protected(0)),
        (ww.into(), b".git/hooks/pre-commit", CeilingBy::Protected(0)),
        (ww.into(), b".git/config", CeilingBy::Protected(1)),
        (format!("{ww}writable_roots = ['src']"), b"other/x", CeilingBy::WritableRoots),
        (format!("{ww}writable_roots = ['src']"), b"", CeilingBy::WritableRoots),
        // outside the roots is said first, even where a protected entry matches too
        (format!("{ww}writable_roots = ['src']\nprotected = ['**/*.lock']"), b"a.lock", CeilingBy::WritableRoots),
        (format!("{ww}writable_roots = ['src']\nprotected = ['**/*.lock']"), b"src/a.lock", CeilingBy::Protected(0)),
        // several protected entries: the deepest match, then file order
        (format!("{ww}protected = ['.git', '.git/hooks']"), b".git/hooks/x", CeilingBy::Protected(1)),
        (format!("{ww}protected = ['.git', '.git/hooks']"), b".git/x", CeilingBy::Protected(0)),
        (format!("{ww}protected = ['a', '**/*.lock']"), b"a/b.lock", CeilingBy::Protected(1)),
        (format!("{ww}protected = ['**/*.lock', 'a/*.lock']"), b"a/b.lock", CeilingBy::Protected(0)),
        (format!("{ww}protected = ['x', '.']"), b"y", CeilingBy::Protected(1)),
        (format!("{ww}protected = ['x', '.']"), b"x/y", CeilingBy::Protected(0)),
    ];
    for (i, (src, path, want)) in cases.iter().enumerate() {
        let p = pol(src);
        let got = p.ceiling_by(path);
        assert_eq!(
            got,
            *want,
            "case {i}: {:?}\n{src}",
            String::from_utf8_lossy(path)
        );
        assert_eq!(
            got == CeilingBy::Open,
            p.ceiling(path) == Write,
            "case {i}: ceiling_by agrees with ceiling"
        );
    }
}

#[test]
fn protected_entries_know_their_line() {
    let p =
        pol("mode = 'workspace-write'\n\nprotected = [\n  '.git/hooks',\n  '.git/config',\n]\n");
    assert_eq!(p.protected_entry(0), (".git/hooks", Some(4)));
    assert_eq!(p.protected_entry(1), (".git/config", Some(5)));
    // the built-in list is not in the file
    let p = pol("mode = 'workspace-write'\n");
    assert_eq!(p.protected_entry(0), (".git/hooks", None));
    assert_eq!(p.ceiling_reason(b".git/hooks/x"), "protected path");
}

/// The shipped example policy: which directory renames it allows (the package-tree
/// `except` lists must not block ordinary renames).
#[test]
fn example_policy_dir_renames() {
    let p = Policy::parse(
        include_str!("../../../policy.example.toml"),
        "policy.example.toml",
    )
    .unwrap();
    #[rustfmt::skip]
    let cases: &[(&[u8], &[u8], bool)] = &[
        (b"src/app", b"src/app2", true),
        (b"build", b"build.old", true),
        (b"hello/targetAbC123", b"hello/target", true), // cargo creates target/ this way
        (b".venv/lib/python3.11/site-packages/pip", b".venv/lib/python3.11/site-packages/~ip", true),
        (b"node_modules/a", b"node_modules/.a-x", true),
        (b"keys", b"node_modules/keys", false),
        (b"keys", b".venv", false),
        (b"src/app", b"venv/lib/python3.11/site-packages/app", false),
        (b".venv", b"env2", false),
        // multi-name except globs: alike while both names leave them at the same place
        (b".cargo/registry/src/a", b".cargo/registry/src/b", true),
        (b"x/.cargo", b"y/.cargo", true),
        (b"src/a/.cargo", b"src/b", false),
    ];
    for (old, new, want) in cases {
        assert_eq!(
            p.dir_rename_allowed(old, new),
            *want,
            "{:?} -> {:?}",
            String::from_utf8_lossy(old),
            String::from_utf8_lossy(new)
        );
    }
}
