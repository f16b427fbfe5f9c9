//! Matching: the deepest rule, id rules, file order, the visibility lift.

use super::*;

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
    let me_gid_only = Caller::new(5, 1000);
    let me_uid_only = Caller::new(1000, 5);
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
