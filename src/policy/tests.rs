//! Table-driven tests of the policy engine: matching, modes, errnos, directory renames and
//! every error class with its position.

use super::*;

const ME: Caller = Caller {
    uid: 1000,
    gid: 1000,
};
const OTHER: Caller = Caller {
    uid: 2000,
    gid: 2000,
};

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
    }
}

use Access::{List, None as No, Read, Write};

// ---------------------------------------------------------------- matching

/// (policy head, rules, path, caller, expected grant, expected grant_by)
type MatchCase<'a> = (
    &'a str,
    &'a [(&'a str, &'a str)],
    &'a [u8],
    Caller,
    Access,
    &'a str,
);

#[test]
fn matching_table() {
    #[rustfmt::skip]
    let cases: &[MatchCase] = &[
        // default
        ("", &[], b"", ME, Write, "default"),
        ("", &[], b"a/b/c", ME, Write, "default"),
        ("default = 'read'", &[], b"a", ME, Read, "default"),
        ("default = 'list'", &[], b"a", ME, List, "default"),
        ("default = 'none'", &[], b"a", ME, No, "default"),
        // a rule covers its match and everything below it
        ("", &[("docs", "read")], b"docs", ME, Read, "rule docs"),
        ("", &[("docs", "read")], b"docs/a/b/c", ME, Read, "rule docs"),
        ("", &[("docs", "read")], b"docsx", ME, Write, "default"),
        ("", &[("docs", "read")], b"x/docs", ME, Write, "default"),
        ("", &[("docs", "read")], b"", ME, Write, "default"),
        // deepest wins, in both directions
        ("", &[("a", "none"), ("a/b", "write")], b"a/b/c", ME, Write, "rule a/b"),
        ("", &[("a", "write"), ("a/b", "none")], b"a/b/c", ME, No, "rule a/b"),
        ("", &[("a", "write"), ("a/b", "none")], b"a/c", ME, Write, "rule a"),
        ("", &[("a", "none"), ("a/b/c", "read")], b"a/b/c/d", ME, Read, "rule a/b/c"),
        ("", &[("a", "none"), ("a/b/c", "read")], b"a/x", ME, No, "rule a"),
        // same depth: most restrictive wins, whatever the order
        ("", &[("*.txt", "read"), ("a.txt", "write")], b"a.txt", ME, Read, "rule *.txt"),
        ("", &[("a.txt", "write"), ("*.txt", "read")], b"a.txt", ME, Read, "rule *.txt"),
        ("", &[("a.txt", "list"), ("*.txt", "read")], b"a.txt", ME, List, "rule a.txt"),
        ("", &[("a.txt", "list"), ("*.txt", "read")], b"b.txt", ME, Read, "rule *.txt"),
        // but a deeper permissive rule still beats a shallower restrictive one
        ("", &[("**/*.pem", "none"), ("keys", "read")], b"keys/x.pem", ME, No, "rule **/*.pem"),
        ("", &[("keys/*", "read"), ("**/*.pem", "none")], b"keys/x.pem", ME, No, "rule **/*.pem"),
        ("", &[("*", "none"), ("a/b", "read")], b"a/b", ME, Read, "rule a/b"),
        // `**` at any depth, including the top level
        ("", &[("**/*.pem", "none")], b"x.pem", ME, No, "rule **/*.pem"),
        ("", &[("**/*.pem", "none")], b"a/b/c/x.pem", ME, No, "rule **/*.pem"),
        ("", &[("**/*.pem", "none")], b"a/b/x.pem.txt", ME, Write, "default"),
        ("", &[("**/.env", "none")], b".env", ME, No, "rule **/.env"),
        ("", &[("**/.env", "none")], b"d/.env/inner", ME, No, "rule **/.env"),
        ("", &[("a/**/b", "none")], b"a/b", ME, No, "rule a/**/b"),
        ("", &[("a/**/b", "none")], b"a/x/y/b", ME, No, "rule a/**/b"),
        ("", &[("a/**/b", "none")], b"a/x/y/b/c", ME, No, "rule a/**/b"),
        ("", &[("a/**/b", "none")], b"a/x/y", ME, Write, "default"),
        ("", &[("a/**", "read")], b"a/x", ME, Read, "rule a/**"),
        ("", &[("a/**", "read")], b"a/x/y", ME, Read, "rule a/**"),
        ("", &[("**", "read")], b"", ME, Read, "rule **"),
        ("", &[("**", "read")], b"q/r", ME, Read, "rule **"),
        // `*` stays within one name
        ("", &[("*.txt", "none")], b"a.txt", ME, No, "rule *.txt"),
        ("", &[("*.txt", "none")], b"d/a.txt", ME, Write, "default"),
        ("", &[("src/*.rs", "none")], b"src/a/b.rs", ME, Write, "default"),
        ("", &[("src/*.rs", "none")], b"src/b.rs", ME, No, "rule src/*.rs"),
        ("", &[("*", "read")], b"", ME, Write, "default"),
        ("", &[("*", "read")], b"top", ME, Read, "rule *"),
        ("", &[("*", "read")], b"top/sub", ME, Read, "rule *"),
        ("", &[("*", "read")], b".hidden", ME, Read, "rule *"),
        // `?` is one character (byte), never '/'
        ("", &[("file?.log", "none")], b"file1.log", ME, No, "rule file?.log"),
        ("", &[("file?.log", "none")], b"file12.log", ME, Write, "default"),
        ("", &[("file?.log", "none")], b"file.log", ME, Write, "default"),
        ("", &[("a?b", "none")], b"a/b", ME, Write, "default"),
        // classes
        ("", &[("[ab].txt", "none")], b"a.txt", ME, No, "rule [ab].txt"),
        ("", &[("[ab].txt", "none")], b"c.txt", ME, Write, "default"),
        ("", &[("[!ab].txt", "none")], b"c.txt", ME, No, "rule [!ab].txt"),
        ("", &[("[!ab].txt", "none")], b"a.txt", ME, Write, "default"),
        ("", &[("v[0-9]", "none")], b"v7", ME, No, "rule v[0-9]"),
        // alternation and escapes
        ("", &[("{a,b}.txt", "none")], b"b.txt", ME, No, "rule {a,b}.txt"),
        ("", &[(r"a\*", "none")], b"a*", ME, No, r"rule a\*"),
        ("", &[(r"a\*", "none")], b"ab", ME, Write, "default"),
        // normalization: leading ./, trailing /, "." = root
        ("", &[("./docs/", "read")], b"docs/x", ME, Read, "rule ./docs/"),
        ("", &[("docs//api/./v1", "read")], b"docs/api/v1", ME, Read, "rule docs//api/./v1"),
        ("", &[(".", "read")], b"", ME, Read, "rule ."),
        ("", &[(".", "read")], b"any/where", ME, Read, "rule ."),
        ("", &[("./", "read"), ("x", "none")], b"y", ME, Read, "rule ./"),
        ("", &[(".", "read"), ("x", "none")], b"x/y", ME, No, "rule x"),
        // non-UTF-8 names are bytes
        ("", &[("caf*", "none")], b"caf\xe9", ME, No, "rule caf*"),
        ("", &[("*.pem", "none")], b"\xff\xfe.pem", ME, No, "rule *.pem"),
        ("", &[("**/*.pem", "none")], b"\xff\xfe/k.pem", ME, No, "rule **/*.pem"),
        ("", &[("?", "none")], b"\xff", ME, No, "rule ?"),
        ("", &[("[!a]x", "none")], b"\x80x", ME, No, "rule [!a]x"),
        ("", &[("d/*", "read")], b"d/\xff\xff/deeper", ME, Read, "rule d/*"),
        ("", &[("d", "read")], b"d\xff", ME, Write, "default"),
        ("", &[("é/*", "read")], "é/x".as_bytes(), ME, Read, "rule é/*"),
    ];
    for (i, (head, rs, path, caller, want, want_by)) in cases.iter().enumerate() {
        let src = format!("{head}\n{}", rules(rs));
        let p = pol(&src);
        let got = grant_of(&p, path, *caller);
        assert_eq!(
            got,
            (*want, want_by.to_string()),
            "case {i}: path {:?} with\n{src}",
            String::from_utf8_lossy(path)
        );
    }
}

#[test]
fn id_rules_table() {
    let me_gid_only = Caller { uid: 5, gid: 1000 };
    let me_uid_only = Caller { uid: 1000, gid: 5 };
    // (rules src, path, caller, want, want_by)
    #[rustfmt::skip]
    let cases: &[(&str, &[u8], Caller, Access, &str)] = &[
        // uid rule beats a plain rule at the same depth, even a more restrictive one
        ("[[rule]]\npath='build'\naccess='none'\n[[rule]]\npath='build'\naccess='write'\nuid=[1000]\n", b"build/x", ME, Write, "rule build"),
        ("[[rule]]\npath='build'\naccess='write'\nuid=[1000]\n[[rule]]\npath='build'\naccess='none'\n", b"build", ME, Write, "rule build"),
        // ... but only for the listed uid
        ("[[rule]]\npath='build'\naccess='none'\n[[rule]]\npath='build'\naccess='write'\nuid=[1000]\n", b"build/x", OTHER, No, "rule build"),
        // a non-applicable id rule is ignored: the shallower / default decides
        ("[[rule]]\npath='a'\naccess='read'\n[[rule]]\npath='a/b'\naccess='none'\nuid=[1]\n", b"a/b/c", ME, Read, "rule a"),
        ("[[rule]]\npath='a'\naccess='none'\nuid=[1]\n", b"a", ME, Write, "default"),
        ("[[rule]]\npath='a'\naccess='none'\nuid=[1000]\n", b"a", ME, No, "rule a"),
        // deeper plain rule still beats a shallower id rule
        ("[[rule]]\npath='a'\naccess='write'\nuid=[1000]\n[[rule]]\npath='a/b'\naccess='read'\n", b"a/b", ME, Read, "rule a/b"),
        // two id rules at one depth: most restrictive
        ("[[rule]]\npath='a'\naccess='write'\nuid=[1000]\n[[rule]]\npath='a'\naccess='list'\ngid=[1000]\n", b"a", ME, List, "rule a"),
        // gid
        ("[[rule]]\npath='a'\naccess='none'\ngid=[1000]\n", b"a", me_gid_only, No, "rule a"),
        ("[[rule]]\npath='a'\naccess='none'\ngid=[1000]\n", b"a", me_uid_only, Write, "default"),
        // uid and gid: either matches
        ("[[rule]]\npath='a'\naccess='none'\nuid=[1000]\ngid=[1000]\n", b"a", me_gid_only, No, "rule a"),
        ("[[rule]]\npath='a'\naccess='none'\nuid=[1000]\ngid=[1000]\n", b"a", me_uid_only, No, "rule a"),
        ("[[rule]]\npath='a'\naccess='none'\nuid=[1000]\ngid=[1000]\n", b"a", OTHER, Write, "default"),
        ("[[rule]]\npath='a'\naccess='none'\nuid=[1, 2, 2000]\n", b"a", OTHER, No, "rule a"),
    ];
    for (i, (src, path, caller, want, want_by)) in cases.iter().enumerate() {
        let p = pol(src);
        assert!(p.has_id_rules(), "case {i}");
        assert_eq!(
            grant_of(&p, path, *caller),
            (*want, want_by.to_string()),
            "case {i}: {src}"
        );
    }
    assert!(!pol(&rules(&[("a", "none")])).has_id_rules());
}

fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut tail in permutations(&rest) {
            tail.insert(0, first.clone());
            out.push(tail);
        }
    }
    out
}

#[test]
fn order_never_matters() {
    let set = [
        ("**/*.pem", "none"),
        ("keys/*", "read"),
        ("keys", "list"),
        ("keys/pub.pem", "write"),
        ("*", "read"),
    ];
    let paths: &[&[u8]] = &[
        b"",
        b"keys",
        b"keys/pub.pem",
        b"keys/a",
        b"keys/a/b.pem",
        b"top",
        b"top/x.pem",
        b"deep/er/x",
    ];
    let perms = permutations(&set);
    assert_eq!(perms.len(), 120);
    let reference = pol(&rules(&set));
    for perm in &perms {
        let p = pol(&rules(perm));
        for path in paths {
            for caller in [ME, OTHER] {
                assert_eq!(
                    grant_of(&p, path, caller),
                    grant_of(&reference, path, caller),
                    "path {:?}, order {perm:?}",
                    String::from_utf8_lossy(path)
                );
            }
        }
    }
    assert_eq!(
        grant_of(&reference, b"keys/pub.pem", ME),
        (No, "rule **/*.pem".into())
    );
    assert_eq!(
        grant_of(&reference, b"keys/a", ME),
        (Read, "rule keys/*".into())
    );
    assert_eq!(
        grant_of(&reference, b"keys", ME),
        (List, "rule keys".into())
    );
}

#[test]
fn visibility_lift_table() {
    #[rustfmt::skip]
    let cases: &[MatchCase] = &[
        // below a none rule
        ("", &[("secrets", "none"), ("secrets/pub", "read")], b"secrets", ME, List, "visibility secrets/pub"),
        ("", &[("secrets", "none"), ("secrets/pub", "read")], b"secrets/pub", ME, Read, "rule secrets/pub"),
        ("", &[("secrets", "none"), ("secrets/pub", "read")], b"secrets/pub/x", ME, Read, "rule secrets/pub"),
        ("", &[("secrets", "none"), ("secrets/pub", "read")], b"secrets/other", ME, No, "rule secrets"),
        ("", &[("secrets", "none"), ("secrets/a/b/c", "list")], b"secrets/a/b", ME, List, "visibility secrets/a/b/c"),
        ("", &[("secrets", "none"), ("secrets/a/b/c", "list")], b"secrets/a/x", ME, No, "rule secrets"),
        // a lift needs list or more: a none rule below does not lift
        ("", &[("s", "none"), ("s/t", "none")], b"s", ME, No, "rule s"),
        // globs below
        ("", &[("s", "none"), ("s/*/pub", "read")], b"s/anything", ME, List, "visibility s/*/pub"),
        ("", &[("s", "none"), ("s/*/pub", "read")], b"s/a/priv", ME, No, "rule s"),
        ("", &[("s", "none"), ("s/**/pub", "read")], b"s/a/b/c", ME, List, "visibility s/**/pub"),
        ("", &[("s", "none"), ("s/a*/pub", "read")], b"s/b", ME, No, "rule s"),
        ("", &[("s", "none"), ("s/a*/pub", "read")], b"s/ab", ME, List, "visibility s/a*/pub"),
        // with default none, from the root down
        ("default = 'none'", &[("src/lib", "read")], b"", ME, List, "visibility src/lib"),
        ("default = 'none'", &[("src/lib", "read")], b"src", ME, List, "visibility src/lib"),
        ("default = 'none'", &[("src/lib", "read")], b"src/lib", ME, Read, "rule src/lib"),
        ("default = 'none'", &[("src/lib", "read")], b"src/lib/a/b", ME, Read, "rule src/lib"),
        ("default = 'none'", &[("src/lib", "read")], b"src/other", ME, No, "default"),
        ("default = 'none'", &[("src/lib", "read")], b"other", ME, No, "default"),
        ("default = 'none'", &[("**/*.rs", "read")], b"a/b", ME, List, "visibility **/*.rs"),
        ("default = 'none'", &[("**/*.rs", "read")], b"a/b/c.rs", ME, Read, "rule **/*.rs"),
        ("default = 'none'", &[("**/*.rs", "read")], b"", ME, List, "visibility **/*.rs"),
        // a root none rule is lifted too
        ("", &[(".", "none"), ("docs", "read")], b"", ME, List, "visibility docs"),
        ("", &[(".", "none"), ("docs", "read")], b"x", ME, No, "rule ."),
        // non-UTF-8 on the way
        ("", &[("s", "none"), ("s/\u{e9}/k", "read")], b"s/\xc3\xa9", ME, List, "visibility s/\u{e9}/k"),
        ("", &[("s", "none"), ("s/*/k", "read")], b"s/\xff", ME, List, "visibility s/*/k"),
        ("", &[("s", "none"), ("s/?/k", "read")], b"s/\xff", ME, List, "visibility s/?/k"),
    ];
    for (i, (head, rs, path, caller, want, want_by)) in cases.iter().enumerate() {
        let src = format!("{head}\n{}", rules(rs));
        let p = pol(&src);
        assert_eq!(
            grant_of(&p, path, *caller),
            (*want, want_by.to_string()),
            "case {i}: path {:?} with\n{src}",
            String::from_utf8_lossy(path)
        );
    }
}

#[test]
fn visibility_lift_respects_uid() {
    let p = pol(
        "[[rule]]\npath='s'\naccess='none'\n[[rule]]\npath='s/mine'\naccess='read'\nuid=[1000]\n",
    );
    assert_eq!(grant_of(&p, b"s", ME), (List, "visibility s/mine".into()));
    assert_eq!(grant_of(&p, b"s", OTHER), (No, "rule s".into()));
    assert_eq!(grant_of(&p, b"s/mine", OTHER), (No, "rule s".into()));
}

#[test]
fn no_visibility_lift_for_non_directories() {
    let p = pol(&rules(&[("secrets", "none"), ("**/*.md", "read")]));
    // as a directory, secrets/key.txt could contain a readable *.md: lifted
    assert_eq!(
        grant_of(&p, b"secrets/key.txt", ME),
        (List, "visibility **/*.md".into())
    );
    // as a file it cannot: it stays none, and so does its errno
    let v = p.verdict_for(b"secrets/key.txt", ME, false);
    assert_eq!((v.grant, v.effective, v.by), (No, No, By::Rule(0)));
    assert_eq!(p.verdict_for(b"secrets", ME, true).grant, List);
    let d = p
        .check_for(
            b"secrets/key.txt",
            ME,
            Need::Read,
            Special::default(),
            false,
        )
        .unwrap_err();
    assert_eq!((d.errno, d.by), (libc::ENOENT, By::Rule(0)));
    let d = p
        .check_for(b"secrets/key.txt", ME, Need::Read, Special::default(), true)
        .unwrap_err();
    assert_eq!((d.errno, d.by), (libc::EACCES, By::Visibility(1)));
    // a file's own grant is untouched
    assert_eq!(p.verdict_for(b"secrets/a.md", ME, false).grant, Read);
    assert_eq!(p.verdict_for(b"x", ME, false), p.verdict(b"x", ME));
}

#[test]
fn policy_is_shareable_between_threads() {
    fn assert_send_sync<T: Send + Sync + Clone + std::fmt::Debug>() {}
    assert_send_sync::<Policy>();
}

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
        assert_eq!(v.effective, v.grant.min(p.ceiling(path)), "case {i}");
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
    assert_eq!(p.writable_roots(), ["."]);
    assert_eq!(p.protected(), [".git/hooks", ".git/config"]);
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
    assert_eq!(p.writable_roots(), ["."]);
    assert_eq!(p.protected(), [".git/hooks", ".git/config"]);
    assert!(!p.allow_setid() && !p.allow_devices());

    let p = pol(
        "mode = \"danger\"\ndefault = \"list\"\nallow_setid = true\nallow_devices = true\n\
         writable_roots = [\"./src/\"]\nprotected = []\n\n[[rule]]\npath = \"./a/\"\naccess = \"read\"\n\
         uid = [1, 2]\n\n[[rule]]\npath = \"b\"\naccess = \"none\"\ngid = [3]\n",
    );
    assert_eq!(p.mode(), Mode::Danger);
    assert_eq!(p.default_access(), List);
    assert!(p.allow_setid() && p.allow_devices() && p.has_id_rules());
    assert_eq!(p.writable_roots(), ["./src/"]);
    assert!(p.protected().is_empty());
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

// ---------------------------------------------------------------- check()

const NO_SPECIAL: Special = Special {
    device: false,
    setid: false,
};
const DEVICE: Special = Special {
    device: true,
    setid: false,
};
const SETID: Special = Special {
    device: false,
    setid: true,
};

/// (policy src, path, need, special, expected: Ok(()) or Err((errno, by)))
type CheckCase<'a> = (&'a str, &'a [u8], Need, Special, Result<(), (i32, &'a str)>);

#[test]
fn check_errno_table() {
    let none_ro = "mode = 'read-only'\n[[rule]]\npath='s'\naccess='none'\n";
    let read_ro = "mode = 'read-only'\n[[rule]]\npath='d'\naccess='read'\n";
    let ro = "mode = 'read-only'\n";
    let ro_allow = "mode = 'read-only'\nallow_devices = true\nallow_setid = true\n";
    let dg = "mode = 'danger'\n[[rule]]\npath='d'\naccess='read'\n[[rule]]\npath='l'\naccess='list'\n\
              [[rule]]\npath='s'\naccess='none'\n[[rule]]\npath='s/pub'\naccess='read'\n";
    let dg_allow = "mode = 'danger'\nallow_devices = true\nallow_setid = true\n";
    let ww = "mode = 'workspace-write'\nwritable_roots = ['src']\n[[rule]]\npath='src/ro'\naccess='read'\n";
    use Need::{Create, List as NList, Read as NRead, Write as NWrite};
    #[rustfmt::skip]
    let cases: &[CheckCase] = &[
        // none: ENOENT for everything except Create (EACCES); beats EPERM, EROFS
        (none_ro, b"s", NList, NO_SPECIAL, Err((libc::ENOENT, "rule s"))),
        (none_ro, b"s/x", NRead, NO_SPECIAL, Err((libc::ENOENT, "rule s"))),
        (none_ro, b"s/x", NWrite, NO_SPECIAL, Err((libc::ENOENT, "rule s"))),
        (none_ro, b"s/x", Create, NO_SPECIAL, Err((libc::EACCES, "rule s"))),
        (none_ro, b"s/x", NWrite, DEVICE, Err((libc::ENOENT, "rule s"))),
        (none_ro, b"s/x", Create, SETID, Err((libc::EACCES, "rule s"))),
        ("default='none'", b"x", NRead, NO_SPECIAL, Err((libc::ENOENT, "default"))),
        ("default='none'", b"x", Create, NO_SPECIAL, Err((libc::EACCES, "default"))),
        // EPERM beats EROFS and EACCES
        (ro, b"a", Create, DEVICE, Err((libc::EPERM, "mode"))),
        (ro, b"a", Create, SETID, Err((libc::EPERM, "mode"))),
        (read_ro, b"d/a", NWrite, SETID, Err((libc::EPERM, "mode"))),
        (dg, b"d/a", Create, DEVICE, Err((libc::EPERM, "mode"))),
        (dg, b"x", Create, DEVICE, Err((libc::EPERM, "mode"))),
        (dg, b"x", NWrite, SETID, Err((libc::EPERM, "mode"))),
        // allowed specials fall through to the next checks
        (ro_allow, b"a", Create, DEVICE, Err((libc::EROFS, "mode"))),
        (ro_allow, b"a", NWrite, SETID, Err((libc::EROFS, "mode"))),
        (dg_allow, b"a", Create, DEVICE, Ok(())),
        (dg_allow, b"a", NWrite, Special { device: true, setid: true, }, Ok(())),
        // EROFS beats EACCES
        (read_ro, b"d/a", NWrite, NO_SPECIAL, Err((libc::EROFS, "mode"))),
        (read_ro, b"d/a", Create, NO_SPECIAL, Err((libc::EROFS, "mode"))),
        (ro, b"a", NWrite, NO_SPECIAL, Err((libc::EROFS, "mode"))),
        (ww, b"other", NWrite, NO_SPECIAL, Err((libc::EROFS, "mode"))),
        (ww, b"src/ro/x", NWrite, NO_SPECIAL, Err((libc::EACCES, "rule src/ro"))),
        (ww, b"src/x", Create, NO_SPECIAL, Ok(())),
        ("mode='workspace-write'", b".git/hooks/post-commit", Create, NO_SPECIAL, Err((libc::EROFS, "mode"))),
        ("mode='workspace-write'", b".git/config", NWrite, NO_SPECIAL, Err((libc::EROFS, "mode"))),
        ("mode='workspace-write'", b".git/config", NRead, NO_SPECIAL, Ok(())),
        // EACCES: a grant below the need
        (dg, b"d/a", NWrite, NO_SPECIAL, Err((libc::EACCES, "rule d"))),
        (dg, b"d/a", Create, NO_SPECIAL, Err((libc::EACCES, "rule d"))),
        (dg, b"l", NRead, NO_SPECIAL, Err((libc::EACCES, "rule l"))),
        (dg, b"l/x", NWrite, NO_SPECIAL, Err((libc::EACCES, "rule l"))),
        (dg, b"s", NRead, NO_SPECIAL, Err((libc::EACCES, "visibility s/pub"))),
        (dg, b"s", Create, NO_SPECIAL, Err((libc::EACCES, "visibility s/pub"))),
        // allowed
        (dg, b"s", NList, NO_SPECIAL, Ok(())),
        (dg, b"s/pub", NRead, NO_SPECIAL, Ok(())),
        (dg, b"l", NList, NO_SPECIAL, Ok(())),
        (dg, b"d", NRead, NO_SPECIAL, Ok(())),
        (dg, b"x", NWrite, NO_SPECIAL, Ok(())),
        (dg, b"x", Create, NO_SPECIAL, Ok(())),
        (ro, b"a", NRead, NO_SPECIAL, Ok(())),
        (ro, b"a", NList, NO_SPECIAL, Ok(())),
        (ro, b"", NList, NO_SPECIAL, Ok(())),
    ];
    for (i, (src, path, need, special, want)) in cases.iter().enumerate() {
        let p = pol(src);
        let got = p.check(path, ME, *need, *special);
        let verdict = p.verdict(path, ME);
        match (got, want) {
            (Ok(v), Ok(())) => assert_eq!(v, verdict, "case {i}"),
            (Err(d), Err((errno, by))) => {
                assert_eq!(
                    (d.errno, by_name(&p, d.by)),
                    (*errno, by.to_string()),
                    "case {i}: {need:?} {special:?} on {:?} with\n{src}",
                    String::from_utf8_lossy(path)
                );
                assert_eq!(d.verdict, verdict, "case {i}");
            }
            (got, want) => panic!(
                "case {i}: {need:?} {special:?} on {:?}: got {got:?}, want {want:?}\n{src}",
                String::from_utf8_lossy(path)
            ),
        }
    }
}

#[test]
fn check_depends_on_caller() {
    let p = pol(
        "mode='danger'\n[[rule]]\npath='b'\naccess='none'\n[[rule]]\npath='b'\naccess='write'\nuid=[1000]\n",
    );
    assert!(p.check(b"b/x", ME, Need::Create, NO_SPECIAL).is_ok());
    let d = p.check(b"b/x", OTHER, Need::Read, NO_SPECIAL).unwrap_err();
    assert_eq!((d.errno, d.by), (libc::ENOENT, By::Rule(0)));
}

// ---------------------------------------------------------------- dir renames

#[test]
fn dir_rename_table() {
    let ww = "mode = 'workspace-write'\n";
    // (policy src, old, new, allowed)
    #[rustfmt::skip]
    let cases: &[(String, &[u8], &[u8], bool)] = &[
        (String::new(), b"a", b"b", true),
        (rules(&[("secrets", "none")]), b"a", b"b", true),
        (rules(&[("secrets", "none")]), b"a", b"secrets", true), // the dir's own grant: check()
        (rules(&[("secrets", "none")]), b"secrets", b"a", true),
        (rules(&[("x/secrets", "none")]), b"x", b"y", false),
        (rules(&[("x/secrets", "none")]), b"y", b"x", false),
        (rules(&[("x/secrets", "none")]), b"x/a", b"x/b", true),
        (rules(&[("x/secrets", "none")]), b"y/x", b"z", true),
        (rules(&[("a/b/c", "write")]), b"a", b"z", false), // any access, not only none
        (rules(&[("*/foo", "read")]), b"any", b"other", false),
        (rules(&[("*/foo", "read")]), b"a/b", b"a/c", true),
        (rules(&[("a*/foo", "read")]), b"bcd", b"efg", true),
        (rules(&[("a*/foo", "read")]), b"bcd", b"abc", false),
        (rules(&[("x/**/k", "read")]), b"x/a/b", b"z", false),
        (rules(&[("x/**/k", "read")]), b"y/a/b", b"z", true),
        (rules(&[("**/x/**", "read")]), b"a", b"b", false), // not floating
        (rules(&[("**/.git/*", "read")]), b"a", b"b", false), // not floating
        // floating rules give old/s and new/s the same answer
        (rules(&[("**/*.pem", "none")]), b"a", b"b", true),
        (rules(&[("**/.env", "none"), ("**/**/*.key", "none")]), b"a/b", b"c", true),
        (rules(&[("**", "read")]), b"a", b"b", true),
        // the root rule never pins anything below
        (rules(&[(".", "read")]), b"a", b"b", true),
        // id rules count whatever the caller
        ("[[rule]]\npath='a/b'\naccess='write'\nuid=[1]\n".to_string(), b"a", b"c", false),
        // workspace-write: protected / roots below old or new
        (ww.to_string(), b".git", b"g", false),
        (ww.to_string(), b"g", b".git", false),
        (ww.to_string(), b"src", b"lib", true),
        (ww.to_string(), b".git/refs", b".git/r", true),
        (format!("{ww}writable_roots = ['src/lib']"), b"src", b"source", false),
        (format!("{ww}writable_roots = ['src/lib']"), b"src/lib", b"src/lib2", true),
        (format!("{ww}protected = ['**/*.lock']"), b"a", b"b", true),
        (format!("{ww}protected = ['a/**/x']"), b"a", b"b", false),
        // other modes ignore roots and protected
        ("mode = 'danger'".to_string(), b".git", b"g", true),
        ("mode = 'read-only'".to_string(), b".git", b"g", true),
        // non-UTF-8
        (rules(&[("\u{e9}/x", "read")]), b"\xc3\xa9", b"z", false),
        (rules(&[("*/x", "read")]), b"\xff", b"\xfe", false),
        (rules(&[("a/x", "read")]), b"\xff", b"\xfe", true),
    ];
    for (i, (src, old, new, want)) in cases.iter().enumerate() {
        let p = pol(src);
        assert_eq!(
            p.dir_rename_allowed(old, new),
            *want,
            "case {i}: {:?} -> {:?} with\n{src}",
            String::from_utf8_lossy(old),
            String::from_utf8_lossy(new)
        );
    }
}

// ---------------------------------------------------------------- errors

/// (source, expected errors as (line, column, message fragment))
type ErrorCase<'a> = (&'a str, &'a [(usize, usize, &'a str)]);

#[test]
fn error_table() {
    #[rustfmt::skip]
    let cases: &[ErrorCase] = &[
        // TOML syntax
        ("mode = \n", &[(1, 8, "TOML syntax error")]),
        ("mode = \"read-only\"\n[[rule]\n", &[(2, 8, "TOML syntax error: unclosed array table")]),
        ("a = 1\na = 2\n", &[(2, 1, "duplicate key")]),
        // unknown keys
        ("modes = \"danger\"\n", &[(1, 1, "unknown key \"modes\"")]),
        ("mode = \"danger\"\n[extra]\nx = 1\n", &[(2, 2, "unknown key \"extra\"")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nuids = [1]\n", &[(4, 1, "unknown key \"uids\" (expected one of: path, access, ask, except, uid, gid)", )]),
        // wrong types
        ("mode = 1\n", &[(1, 8, "\"mode\" must be a string, found integer")]),
        ("allow_setid = \"yes\"\n", &[(1, 15, "\"allow_setid\" must be a boolean")]),
        ("allow_devices = 1\n", &[(1, 17, "\"allow_devices\" must be a boolean")]),
        ("writable_roots = \".\"\n", &[(1, 18, "\"writable_roots\" must be an array of strings")]),
        ("protected = [\"a\", 2]\n", &[(1, 19, "an element of \"protected\" must be a string")]),
        ("default = true\n", &[(1, 11, "\"default\" must be a string, found boolean")]),
        ("rule = 5\n", &[(1, 8, "\"rule\" must be an array of tables")]),
        ("[rule]\npath = \"a\"\naccess = \"none\"\n", &[(1, 1, "\"rule\" must be an array of tables")]),
        ("rule = [1]\n", &[(1, 9, "a rule must be a table")]),
        ("[[rule]]\npath = 1\naccess = \"none\"\n", &[(2, 8, "\"path\" must be a string")]),
        ("[[rule]]\npath = \"a\"\naccess = 3\n", &[(3, 10, "\"access\" must be a string")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nuid = 1000\n", &[(4, 7, "\"uid\" must be an array of integers")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\ngid = [\"x\"]\n", &[(4, 8, "an element of \"gid\" must be an integer")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nuid = [1, -1]\n", &[(4, 11, "uid -1 is out of range")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nuid = [4294967296]\n", &[(4, 8, "out of range")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\ngid = []\n", &[(4, 7, "\"gid\" must not be empty")]),
        // missing keys: at the [[rule]] header
        ("\n[[rule]]\naccess = \"none\"\n", &[(2, 1, "rule is missing \"path\"")]),
        ("[[rule]]\npath = \"a\"\n", &[(1, 1, "rule is missing \"access\"")]),
        ("rule = [{ path = \"a\" }]\n", &[(1, 9, "rule is missing \"access\"")]),
        ("[[rule]]\n", &[(1, 1, "rule is missing \"path\""), (1, 1, "rule is missing \"access\""),]),
        // words
        ("[[rule]]\npath = \"a\"\naccess = \"rw\"\n", &[(3, 10, "unknown access \"rw\" (expected none, list, read or write)", )]),
        ("[[rule]]\npath = \"a\"\naccess = \"Read\"\n", &[(3, 10, "unknown access \"Read\"")]),
        ("default = \"all\"\n", &[(1, 11, "unknown default access \"all\"")]),
        ("mode = \"ro\"\n", &[(1, 8, "unknown mode \"ro\" (expected read-only, workspace-write or danger)", )]),
        // paths
        ("[[rule]]\npath = \"/etc\"\naccess = \"none\"\n", &[(2, 8, "absolute rule path \"/etc\"")]),
        ("[[rule]]\npath = \"a/../b\"\naccess = \"none\"\n", &[(2, 8, "\"..\" is not allowed in rule path")]),
        ("[[rule]]\npath = \"..\"\naccess = \"none\"\n", &[(2, 8, "\"..\" is not allowed")]),
        ("[[rule]]\npath = \"a/..\"\naccess = \"none\"\n", &[(2, 8, "\"..\" is not allowed")]),
        ("[[rule]]\npath = \"\"\naccess = \"none\"\n", &[(2, 8, "empty rule path")]),
        ("[[rule]]\npath = \"a[\"\naccess = \"none\"\n", &[(2, 8, "invalid glob \"a[\" in rule path: unclosed character class", )]),
        ("[[rule]]\npath = \"{a\"\naccess = \"none\"\n", &[(2, 8, "invalid glob \"{a\"")]),
        ("writable_roots = [\".\", \"/src\"]\n", &[(1, 24, "absolute writable_roots entry \"/src\"")]),
        ("writable_roots = [\"src/../..\"]\n", &[(1, 19, "\"..\" is not allowed in writable_roots entry")]),
        ("writable_roots = [\"\"]\n", &[(1, 19, "empty writable_roots entry")]),
        ("writable_roots = [\"b[\"]\n", &[(1, 19, "invalid glob \"b[\" in writable_roots entry")]),
        ("protected = [\"/x\"]\n", &[(1, 14, "absolute protected entry")]),
        ("protected = [\"x/..\"]\n", &[(1, 14, "\"..\" is not allowed in protected entry")]),
        ("protected = [\"\"]\n", &[(1, 14, "empty protected entry")]),
        ("protected = [\"[z\"]\n", &[(1, 14, "invalid glob \"[z\" in protected entry")]),
        // except: same checks as path, at the element
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nexcept = \"a/b\"\n", &[(4, 10, "\"except\" must be an array of strings, found string")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nexcept = [\"a/b\", 7]\n", &[(4, 18, "an element of \"except\" must be a string")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nexcept = [\"a/b\", \"/etc\"]\n", &[(4, 18, "absolute except entry \"/etc\"")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nexcept = [\"a/../b\"]\n", &[(4, 11, "\"..\" is not allowed in except entry \"a/../b\"")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nexcept = [\"\"]\n", &[(4, 11, "empty except entry")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nexcept = [\"a[\"]\n", &[(4, 11, "invalid glob \"a[\" in except entry")]),
        ("rule = [{ path = \"a\", access = \"none\", except = [\"..\"] }]\n", &[(1, 50, "\"..\" is not allowed in except entry")]),
        // a bad except entry is reported even when the rule has other errors
        ("[[rule]]\npath = \"/a\"\naccess = \"none\"\nexcept = [\"/b\"]\n", &[(2, 8, "absolute rule path"), (4, 11, "absolute except entry")]),
        // columns count characters, not bytes
        ("[[rule]]\npath = \"é\"\naccess = \"none\"\n\"né\" = 1\n", &[(4, 1, "unknown key \"né\"")]),
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nuid = [\"é\", \"x\"]\n", &[(4, 8, "must be an integer"), (4, 13, "must be an integer")]),
        ("x = \"é\"; y = 1\n", &[(1, 8, "TOML syntax error")]),
        ("# é\n[[rule]]\npath = \"é/../x\"\naccess = \"none\"\n", &[(3, 8, "\"..\" is not allowed")]),
    ];
    for (i, (src, want)) in cases.iter().enumerate() {
        let errs = match Policy::parse(src, "t.toml") {
            Ok(_) => panic!("case {i}: should fail:\n{src}"),
            Err(errs) => errs,
        };
        let got: Vec<(usize, usize)> = errs.iter().map(|e| (e.line, e.column)).collect();
        let wanted: Vec<(usize, usize)> = want.iter().map(|(l, c, _)| (*l, *c)).collect();
        assert_eq!(got, wanted, "case {i}: {errs:?}\n{src}");
        for (e, (_, _, fragment)) in errs.iter().zip(want.iter()) {
            assert!(
                e.message.contains(fragment),
                "case {i}: {:?} should contain {fragment:?}",
                e.message
            );
            assert_eq!(e.file, "t.toml");
        }
    }
}

#[test]
fn all_errors_are_reported_in_order() {
    let src = "\
mode = \"sometimes\"
default = \"rw\"
colour = \"blue\"
writable_roots = [\"/abs\", \"ok\", \"a/../b\"]
protected = [\"p[\"]
allow_setid = \"no\"

[[rule]]
path = \"/etc\"
access = \"nope\"
extra = 1

[[rule]]
path = \"fine\"

[[rule]]
path = \"\"
access = \"read\"
uid = []

[[rule]]
path = \"good\"
access = \"read\"
";
    let errs = Policy::parse(src, "all.toml").unwrap_err();
    let got: Vec<(usize, usize)> = errs.iter().map(|e| (e.line, e.column)).collect();
    assert_eq!(
        got,
        [
            (1, 8),   // unknown mode
            (2, 11),  // unknown default access
            (3, 1),   // unknown key colour
            (4, 19),  // absolute "/abs"
            (4, 33),  // ".." in "a/../b"
            (5, 14),  // invalid glob "p["
            (6, 15),  // allow_setid not a boolean
            (9, 8),   // absolute "/etc"
            (10, 10), // unknown access "nope"
            (11, 1),  // unknown rule key extra
            (13, 1),  // rule without access
            (17, 8),  // empty path
            (19, 7),  // empty uid list
        ],
        "{errs:#?}"
    );
    assert!(errs[10].message.contains("missing \"access\""));
    assert_eq!(
        errs[0].to_string(),
        "all.toml:1:8: unknown mode \"sometimes\" (expected read-only, workspace-write or danger)"
    );
}

#[test]
fn load_reports_unreadable_file_and_uses_path_as_file() {
    let missing = std::path::Path::new("/nonexistent/fencefs/policy.toml");
    let errs = Policy::load(missing).unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].line, errs[0].column), (0, 0));
    assert_eq!(errs[0].file, "/nonexistent/fencefs/policy.toml");
    assert!(
        errs[0]
            .to_string()
            .starts_with("/nonexistent/fencefs/policy.toml: cannot read")
    );

    let dir = std::env::temp_dir().join(format!("fencefs-policy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("p.toml");
    std::fs::write(
        &file,
        "mode = \"danger\"\n[[rule]]\npath = \"x\"\naccess = \"bad\"\n",
    )
    .unwrap();
    let errs = load(&file).unwrap_err();
    assert_eq!(
        errs[0].to_string(),
        format!(
            "{}:4:10: unknown access \"bad\" (expected none, list, read or write)",
            file.display()
        )
    );
    std::fs::write(&file, "mode = \"danger\"\n").unwrap();
    assert_eq!(load(&file).unwrap().mode(), Mode::Danger);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------- robustness

#[test]
fn never_panics_on_odd_input() {
    let sources = [
        "",
        "\u{feff}",
        "[[rule]]\npath='**/**/**/**/**/**/**/**/**/**/**/**/x'\naccess='read'\n",
        "[[rule]]\npath='{a,b/c}/d'\naccess='read'\n[[rule]]\npath='x'\naccess='none'\n",
        "[[rule]]\npath='a**b/c'\naccess='list'\ndefault='none'\n",
        "default='none'\n[[rule]]\npath='[/]x'\naccess='read'\n",
        "rule = []\n",
        "x = 1979-05-27T07:32:00Z\n",
        "mode = 1979-05-27\n",
        "rule = [[1, 2]]\n",
        "[[rule]]\npath = { a = 1 }\naccess = []\n",
        "\"\" = 1\n",
        "[[rule]]\npath='a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t/u/v/w/x/y/z/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t/u/v/w/x/y/z/a/b/c/d/e/f/g/h/i/j/k/l/m/n'\naccess='read'\ndefault='none'\n",
    ];
    let paths: &[&[u8]] = &[
        b"",
        b"a",
        b"/",
        b"//",
        b"a//b",
        b"a/",
        b"/a",
        b".",
        b"..",
        b"a/../b",
        b"\xff\xfe\x00",
        b"a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t/u/v/w/x/y/z/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p",
    ];
    for src in sources {
        let Ok(p) = Policy::parse(src, "odd.toml") else {
            continue;
        };
        for mode in [Mode::ReadOnly, Mode::WorkspaceWrite, Mode::Danger] {
            let mut p = p.clone();
            p.set_mode(mode);
            for path in paths {
                let v = p.verdict(path, ME);
                assert!(v.effective <= v.grant);
                for need in [Need::List, Need::Read, Need::Write, Need::Create] {
                    let _ = p.check(path, OTHER, need, DEVICE);
                }
                for other in paths {
                    let _ = p.dir_rename_allowed(path, other);
                }
            }
        }
    }
    // Many `**` against a deep path: polynomial, and answers sensibly.
    let p = pol(
        "default='none'\n[[rule]]\npath='**/a/**/a/**/a/**/a/**/a/**/a/**/a/**/a/**/b'\naccess='read'\n",
    );
    let deep = vec!["a"; 60].join("/");
    assert_eq!(p.verdict(deep.as_bytes(), ME).grant, List);
}

#[test]
fn long_patterns_use_the_heap_path() {
    let comps: Vec<String> = (0..80).map(|i| format!("d{i}")).collect();
    let pattern = comps.join("/");
    let p = pol(&format!(
        "default='none'\n[[rule]]\npath='{pattern}'\naccess='read'\n"
    ));
    let prefix = comps[..40].join("/");
    assert_eq!(p.verdict(prefix.as_bytes(), ME).grant, List);
    assert_eq!(p.verdict(b"d0/x", ME).grant, No);
    assert_eq!(p.verdict(pattern.as_bytes(), ME).grant, Read);
    assert!(!p.dir_rename_allowed(b"d0", b"z"));
}

// ---------------------------------------------------------------- except

/// `[[rule]]` tables from (path, access, except globs).
fn xrules(list: &[(&str, &str, &[&str])]) -> String {
    list.iter()
        .map(|(p, a, x)| {
            let items: Vec<String> = x.iter().map(|e| format!("'{e}'")).collect();
            format!(
                "[[rule]]\npath = '{p}'\naccess = \"{a}\"\nexcept = [{}]\n",
                items.join(", ")
            )
        })
        .collect()
}

/// The shape of the example policy's key rule.
const PKG: &[&str] = &["**/site-packages/**", "**/node_modules/**", "**/.venv/**"];

/// (rules, path, expected grant, expected grant_by); `verdict_for(.., false)`: no lift.
type ExceptCase<'a> = (String, &'a [u8], Access, &'a str);

#[test]
fn except_matching_table() {
    let pem = xrules(&[("**/*.pem", "none", PKG)]);
    let deep = xrules(&[("a", "none", &["a/b/c"])]);
    let shallower = format!(
        "{}{}",
        rules(&[("a", "read")]),
        xrules(&[("a/b", "none", &["a/b/pub"])])
    );
    let same_depth = format!(
        "{}{}",
        rules(&[("a", "read")]),
        xrules(&[("a", "none", &["a/x"])])
    );
    #[rustfmt::skip]
    let cases: &[ExceptCase] = &[
        // the example: key files hidden, package trees not covered
        (pem.clone(), b"keys/server.pem", No, "rule **/*.pem"),
        (pem.clone(), b"x.pem", No, "rule **/*.pem"),
        (pem.clone(), b".venv/lib/python3.11/site-packages/pip/_vendor/certifi/cacert.pem", Write, "default"),
        (pem.clone(), b"lib/site-packages/certifi/cacert.pem", Write, "default"),
        (pem.clone(), b"site-packages/x.pem", Write, "default"),
        (pem.clone(), b"node_modules/pkg/test/key.pem", Write, "default"),
        // `**/x/**` needs a name below x: a file named like the tree is still covered
        (pem.clone(), b"a/site-packages.pem", No, "rule **/*.pem"),
        // covered below the rule's match, and below the except's match: not covered
        (pem.clone(), b"a.pem/b", No, "rule **/*.pem"),
        (pem.clone(), b"a.pem/node_modules/b", Write, "default"),
        // the depth rule: the rule matches at `a`, the except at `a/b/c`
        (deep.clone(), b"a", No, "rule a"),
        (deep.clone(), b"a/b", No, "rule a"),
        (deep.clone(), b"a/b/c", Write, "default"),
        (deep.clone(), b"a/b/c/d/e", Write, "default"),
        (deep.clone(), b"a/b/cd", No, "rule a"),
        // where the deeper rule does not exist, the shallower one decides
        (shallower.clone(), b"a/b/pub/x", Read, "rule a"),
        (shallower.clone(), b"a/b/pub", Read, "rule a"),
        (shallower.clone(), b"a/b/x", No, "rule a/b"),
        // ... and at one depth, the most restrictive of the rules that still exist
        (same_depth.clone(), b"a/x/y", Read, "rule a"),
        (same_depth.clone(), b"a/y", No, "rule a"),
        // an except glob matching an ancestor of the rule's own match
        (xrules(&[("a/b", "none", &["a"])]), b"a/b/c", Write, "default"),
        // an except glob matching the root: the rule covers nothing
        (xrules(&[("a", "none", &["."])]), b"a/b", Write, "default"),
        (xrules(&[("a", "none", &["**"])]), b"a", Write, "default"),
        // trailing /**: what is inside, not the directory itself
        (xrules(&[("s", "none", &["s/pub/**"])]), b"s/pub", No, "rule s"),
        (xrules(&[("s", "none", &["s/pub/**"])]), b"s/pub/k", Write, "default"),
        // an unrelated except glob changes nothing
        (xrules(&[("a", "none", &["b"])]), b"a/x", No, "rule a"),
        (xrules(&[("a", "none", &["b"])]), b"b", Write, "default"),
        // the root rule with an except
        (xrules(&[(".", "read", &["src"])]), b"src/main.rs", Write, "default"),
        (xrules(&[(".", "read", &["src"])]), b"docs/x", Read, "rule ."),
        (xrules(&[(".", "read", &["src"])]), b"", Read, "rule ."),
        // braces, non-UTF-8
        (xrules(&[("**/*.key", "none", &["{vendor,third_party}/**"])]), b"third_party/a/x.key", Write, "default"),
        (xrules(&[("**/*.key", "none", &["{vendor,third_party}/**"])]), b"src/x.key", No, "rule **/*.key"),
        (xrules(&[("**/*.key", "none", &["\u{e9}/**"])]), b"\xc3\xa9/x.key", Write, "default"),
        (xrules(&[("**/*.key", "none", &["?/**"])]), b"\xff/x.key", Write, "default"),
    ];
    for (i, (src, path, want, want_by)) in cases.iter().enumerate() {
        let p = pol(src);
        let v = p.verdict_for(path, ME, false);
        assert_eq!(
            (v.grant, by_name(&p, v.grant_by)),
            (*want, want_by.to_string()),
            "case {i}: path {:?} with\n{src}",
            String::from_utf8_lossy(path)
        );
    }
}

#[test]
fn except_with_uid_rules() {
    // The id rule beats the plain one at its depth, but where its except takes it out,
    // it does not exist and the plain rule decides.
    let src = format!(
        "{}uid = [1000]\n{}",
        xrules(&[("a", "write", &["a/pub"])]),
        rules(&[("a", "read")])
    );
    let p = pol(&src);
    assert_eq!(grant_of(&p, b"a/f", ME), (Write, "rule a".into()));
    assert_eq!(p.verdict(b"a/f", ME).grant_by, By::Rule(0));
    assert_eq!(p.verdict(b"a/pub/f", ME).grant_by, By::Rule(1));
    assert_eq!(p.verdict(b"a/f", OTHER).grant_by, By::Rule(1));
    // explain's view: the rule matched, the except took it out (only for callers it
    // applies to)
    assert_eq!(p.excepted(b"a/pub/f", ME), vec![(0, 0)]);
    assert_eq!(p.excepted(b"a/pub/f", OTHER), vec![]);
    assert_eq!(p.excepted(b"a/f", ME), vec![]);
}

#[test]
fn excepted_names_the_first_covering_glob() {
    let p = pol(&xrules(&[("**/*.pem", "none", PKG), ("x", "read", &["y"])]));
    assert_eq!(
        p.excepted(b"a/node_modules/b/site-packages/c.pem", ME),
        vec![(0, 0)]
    );
    assert_eq!(p.excepted(b"a/node_modules/c.pem", ME), vec![(0, 1)]);
    assert_eq!(p.rule(0).except[1], "**/node_modules/**");
    // the rule did not match: nothing to say, even though an except glob matches
    assert_eq!(p.excepted(b"a/node_modules/c.txt", ME), vec![]);
    assert_eq!(p.excepted(b"y", ME), vec![]);
    assert!(p.rule(1).except == ["y"] && pol(&rules(&[("a", "read")])).rule(0).except.is_empty());
}

#[test]
fn except_visibility_lift_table() {
    let hole = xrules(&[("s", "none", &["s/pub"])]);
    let from_above = format!(
        "{}{}",
        rules(&[("a", "read")]),
        xrules(&[("a/b", "none", &["a/b/pub"])])
    );
    let lifter_taken_out = format!(
        "{}{}",
        rules(&[("s", "none")]),
        xrules(&[("s/**/pub", "read", &["s/x"])])
    );
    #[rustfmt::skip]
    let cases: &[MatchCase] = &[
        // below `s`, `s/pub` falls to the default (write): `s` is needed to reach it
        (hole.as_str(), &[], b"s", ME, List, "visibility s"),
        (hole.as_str(), &[], b"s/pub", ME, Write, "default"),
        (hole.as_str(), &[], b"s/pub/x", ME, Write, "default"),
        (hole.as_str(), &[], b"s/other", ME, No, "rule s"),
        // ... unless the default hides it too
        (&format!("default = 'none'\n{hole}"), &[], b"s", ME, No, "rule s"),
        // a rule from above decides below the hole
        (from_above.as_str(), &[], b"a/b", ME, List, "visibility a"),
        (from_above.as_str(), &[], b"a/b/pub/x", ME, Read, "rule a"),
        (from_above.as_str(), &[], b"a/b/c", ME, No, "rule a/b"),
        (&format!("default = 'none'\n{from_above}"), &[], b"a/b", ME, List, "visibility a"),
        // a rule that its own except takes out at the directory lifts nothing there
        (lifter_taken_out.as_str(), &[], b"s/x", ME, No, "rule s"),
        (lifter_taken_out.as_str(), &[], b"s/y", ME, List, "visibility s/**/pub"),
        // a directory named like a key file in the example: what is below it in a
        // package tree is not covered, so it stays listable
        (&xrules(&[("**/*.pem", "none", PKG)]), &[], b"k.pem", ME, List, "visibility **/*.pem"),
        (&xrules(&[("**/*.pem", "none", &["vendor"])]), &[], b"k.pem", ME, No, "rule **/*.pem"),
        (&xrules(&[("**/*.pem", "none", &["vendor"])]), &[], b"vendor", ME, Write, "default"),
        (&xrules(&[("**/*.pem", "none", &["vendor"])]), &[], b"vendor.pem", ME, No, "rule **/*.pem"),
    ];
    for (i, (head, rs, path, caller, want, want_by)) in cases.iter().enumerate() {
        let src = format!("{head}\n{}", rules(rs));
        let p = pol(&src);
        assert_eq!(
            grant_of(&p, path, *caller),
            (*want, want_by.to_string()),
            "case {i}: path {:?} with\n{src}",
            String::from_utf8_lossy(path)
        );
    }
    // only directories are lifted
    let p = pol(&xrules(&[("**/*.pem", "none", PKG)]));
    assert_eq!(p.verdict_for(b"k.pem", ME, false).grant, No);
    // a hole of a rule that does not apply to the caller lifts nothing
    let p = pol(&format!(
        "{}uid = [2000]\n",
        xrules(&[("s", "none", &["s/pub"])])
    ));
    assert_eq!(grant_of(&p, b"s", OTHER), (List, "visibility s".into()));
    assert_eq!(grant_of(&p, b"s", ME), (Write, "default".into()));
}

#[test]
fn except_may_hide() {
    assert!(pol(&xrules(&[("a", "none", &["a/b"])])).may_hide());
    assert!(!pol(&xrules(&[("a", "none", &["."])])).may_hide());
    assert!(!pol(&xrules(&[("a", "none", &["./**"])])).may_hide());
    assert!(!pol(&xrules(&[("a", "read", &["a/b"])])).may_hide());
    // what an except leaves to a `none` default is hidden by the default
    assert!(
        pol(&format!(
            "default = 'none'\n{}",
            xrules(&[("a", "read", &["."])])
        ))
        .may_hide()
    );
}

#[test]
fn except_dir_rename_table() {
    let pem = xrules(&[("**/*.pem", "none", PKG)]);
    let vendor = xrules(&[("**/*.pem", "none", &["vendor"])]);
    let inside = xrules(&[("**/*.pem", "none", &["x/**"])]);
    let secrets = xrules(&[("secrets", "none", &["secrets/pub"])]);
    // (policy src, old, new, allowed)
    #[rustfmt::skip]
    let cases: &[(String, &[u8], &[u8], bool)] = &[
        // anywhere except globs: fine while both names agree on them
        (pem.clone(), b"build", b"build2", true),
        (pem.clone(), b"src/a", b"lib/b", true),
        (pem.clone(), b"lib/site-packages/a", b"lib/site-packages/~a", true),
        (pem.clone(), b"node_modules/a", b"x/node_modules/a", true),
        (pem.clone(), b".venv/lib", b"y/.venv/lib", true),
        // ... and refused when a directory would move into or out of a package tree:
        // hidden keys inside would become visible (or visible ones hidden)
        (pem.clone(), b"keys", b".venv/keys", false),
        (pem.clone(), b"keys", b"node_modules", false),
        (pem.clone(), b"node_modules/a", b"a", false),
        (pem.clone(), b"site-packages", b"sp", false),
        // from one package tree into another: the rule covers neither
        (pem.clone(), b"a/node_modules/x", b"a/site-packages/x", true),
        // a literal except glob: only where it cannot match below either name, and
        // both names are taken out alike
        (vendor.clone(), b"a", b"b", true),
        (vendor.clone(), b"vendor/x", b"vendor/y", true),
        (vendor.clone(), b"vendor/x", b"y", false),
        (vendor.clone(), b"y", b"vendor/x", false),
        (vendor.clone(), b"vendor", b"v2", false),
        (inside.clone(), b"x/a", b"x/b", true),
        (inside.clone(), b"x", b"y", false),
        (inside.clone(), b"y", b"z", true),
        // a non-floating rule: its except may not make it differ inside the subtree
        (secrets.clone(), b"secrets/pub/a", b"b", true),
        (secrets.clone(), b"secrets/pub", b"p", true),
        (secrets.clone(), b"p", b"secrets/pub/p", true),
        (secrets.clone(), b"secrets", b"s2", false),
        (secrets.clone(), b"a", b"b", true),
        // a rule covering the directory with an except that could match below it: what
        // the except uncovers depends on the rules above each name
        (format!("default = 'read'\n{}", xrules(&[("src", "write", &["**/gen"])])), b"src/a", b"src/b", false),
        (format!("default = 'read'\n{}", xrules(&[("src", "write", &["**/gen"])])), b"x/a", b"x/b", true),
        // id rules count whatever the caller
        (format!("{}uid = [1]\n", xrules(&[("**/*.pem", "none", &["x/**"])])), b"x/a", b"b", false),
        // still: a non-floating rule path below either name refuses, as before
        (xrules(&[("a/b", "none", &["a/b/c"])]), b"a", b"z", false),
        // an except `**` that has absorbed names stands where it stood: `*/**/.env` takes
        // out every `.env` below the root's, alike below `a/a` and `a` (was a proptest
        // failure: the reference refused this, the engine rightly allows it)
        (xrules(&[("./**/.env", "none", &["./*/**/.env"])]), b"a/a", b"a", true),
        (xrules(&[("**/.env", "none", &["*/**/.env"])]), b"a", b"a/a", true),
        (xrules(&[("**/.env", "none", &["*/**/.env"])]), b"a/b", b"c/d/e", true),
        // ... but `*/*/**/.env` hides `.env` at depth 1 and 2 only: `a/a/.env` (visible)
        // would become `a/.env` (hidden)
        (xrules(&[("**/.env", "none", &["*/*/**/.env"])]), b"a/a", b"a", false),
        (xrules(&[("**/.env", "none", &["*/*/**/.env"])]), b"a/a", b"b/b", true),
    ];
    for (i, (src, old, new, want)) in cases.iter().enumerate() {
        let p = pol(src);
        assert_eq!(
            p.dir_rename_allowed(old, new),
            *want,
            "case {i}: {:?} -> {:?} with\n{src}",
            String::from_utf8_lossy(old),
            String::from_utf8_lossy(new)
        );
    }
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
        include_str!("../../policy.example.toml"),
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
