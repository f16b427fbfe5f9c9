//! Ignore files (`ignore_files`): gitignore's edge cases through the `ignore` crate, the
//! `none` they give, their pins, and their errors.

use super::*;

const DANGER: &str = "mode = \"danger\"\nignore_files = [\".aiignore\", \".cursorignore\"]\n";

fn src(dir: &str, name: &str, text: &str) -> IgnoreSource {
    IgnoreSource {
        dir: dir.as_bytes().to_vec(),
        name: name.into(),
        text: text.into(),
    }
}

fn with(files: &[IgnoreSource]) -> Policy {
    pol(DANGER)
        .with_ignores(files)
        .unwrap_or_else(|e| panic!("ignore files should compile: {e:?}"))
}

fn hidden(p: &Policy, path: &str, is_dir: bool) -> bool {
    p.verdict_for(path.as_bytes(), ME, is_dir).effective == Access::None
}

#[test]
fn gitignore_semantics() {
    let p = with(&[
        src(
            "",
            ".aiignore",
            "# comment\n\n*.key\n!public.key\n/build\nlogs/\ndeep/**/x\nsecret\n",
        ),
        src("sub", ".aiignore", "!secret\n*.txt\n/anch\n"),
        src("sub/inner", ".cursorignore", "!*.txt\n"),
    ]);
    // (path, is_dir, hidden)
    let table: &[(&str, bool, bool)] = &[
        ("a.key", false, true),
        ("d/e/a.key", false, true),
        ("public.key", false, false),
        ("d/public.key", false, false),
        // `/` anchors at the ignore file's directory.
        ("build", true, true),
        ("build/out.o", false, true),
        ("d/build", true, false),
        // A trailing `/`: directories only.
        ("logs", true, true),
        ("logs", false, false),
        ("d/logs/today", false, true),
        ("deep/a/b/x", false, true),
        ("deep/x", false, true),
        ("secret", false, true),
        // A nested file re-includes below its directory, not above.
        ("sub/secret", false, false),
        ("sub/a.txt", false, true),
        ("a.txt", false, false),
        ("sub/anch", false, true),
        ("sub/d/anch", false, false),
        ("anch", false, false),
        // Deeper still, another name re-includes again.
        ("sub/inner/a.txt", false, false),
        ("sub/inner/d/a.txt", false, false),
        // The ignore files themselves stay visible, even when a pattern names them.
        (".aiignore", false, false),
        ("sub/.aiignore", false, false),
        ("", true, false),
    ];
    for &(path, is_dir, want) in table {
        assert_eq!(hidden(&p, path, is_dir), want, "{path} (dir: {is_dir})");
    }
}

#[test]
fn a_hidden_directory_hides_everything_below_whatever_deeper_files_say() {
    let p = with(&[
        src("", ".aiignore", "vault/\n"),
        src("vault", ".aiignore", "!*\n"),
    ]);
    assert!(hidden(&p, "vault", true));
    assert!(hidden(&p, "vault/k", false));
    // Even the nested ignore file: its directory hides it.
    assert!(hidden(&p, "vault/.aiignore", false));
}

#[test]
fn hidden_is_none_with_enoent_eacces_for_create_and_names_the_file_and_line() {
    let p = with(&[src("d", ".aiignore", "x\n*.pem\n")]);
    for (need, errno) in [
        (Need::List, libc::ENOENT),
        (Need::Read, libc::ENOENT),
        (Need::Write, libc::ENOENT),
        (Need::Create, libc::EACCES),
    ] {
        let d = p
            .check_for(b"d/k.pem", ME, need, Special::default(), false)
            .expect_err("hidden");
        assert_eq!(d.errno, errno, "{need:?}");
        let By::Ignore(hit) = d.by else {
            panic!("decided by the ignore file, got {:?}", d.by)
        };
        assert_eq!(hit.line, 2);
        assert_eq!(
            p.ignore_set().describe(hit),
            ("d/.aiignore".to_string(), "*.pem".to_string())
        );
    }
    // Outside its directory, nothing.
    assert!(
        p.check(b"k.pem", ME, Need::Write, Special::default())
            .is_ok()
    );
    // An ignore file hides for every layer: a layer allowing write does not lift it.
    assert!(p.may_hide());
}

#[test]
fn ignore_files_are_pinned_wherever_they_stand_found_or_not() {
    let p = with(&[src("", ".aiignore", "x\n")]);
    for path in [".aiignore", "sub/.aiignore", "a/b/.cursorignore"] {
        for need in [Need::Write, Need::Create] {
            let d = p
                .check_for(path.as_bytes(), ME, need, Special::default(), false)
                .expect_err("pinned");
            assert_eq!(d.errno, libc::EROFS, "{path} {need:?}");
        }
        assert!(
            p.check(path.as_bytes(), ME, Need::Read, Special::default())
                .is_ok()
        );
    }
    assert!(
        p.check(b"other", ME, Need::Write, Special::default())
            .is_ok()
    );
}

#[test]
fn a_directory_holding_an_ignore_file_cannot_be_renamed() {
    let p = with(&[src("a/b", ".aiignore", "x\n")]);
    assert!(!p.dir_rename_allowed(b"a", b"z"));
    assert!(!p.dir_rename_allowed(b"a/b", b"z"));
    assert!(!p.dir_rename_allowed(b"z", b"a/b"));
    assert!(p.dir_rename_allowed(b"a/c", b"z"));
    assert!(p.dir_rename_allowed(b"ab", b"z"));
}

#[test]
fn a_directory_rename_cannot_lift_a_hide() {
    // A pattern naming a path: renaming a directory on it re-includes what it hid.
    let p = with(&[src("", ".aiignore", "vault/keys\n/deep/a/b/\n*.pem\n")]);
    assert!(hidden(&p, "vault/keys", false));
    assert!(!p.dir_rename_allowed(b"vault", b"v2"));
    assert!(!p.dir_rename_allowed(b"deep", b"v2"));
    assert!(!p.dir_rename_allowed(b"deep/a", b"v2"));
    assert!(
        !p.dir_rename_allowed(b"x", b"vault"),
        "into the pattern's path"
    );
    // Patterns without a `/` stand alike under both names.
    assert!(p.dir_rename_allowed(b"src/a", b"lib/b"));
    let any_depth = with(&[src("", ".aiignore", "**/*.pem\n/**/id_rsa\n")]);
    assert!(any_depth.dir_rename_allowed(b"src/a", b"lib/b"));
    let inside = with(&[src("", ".aiignore", "keys/**\n")]);
    assert!(!inside.dir_rename_allowed(b"keys", b"k2"));
    assert!(inside.dir_rename_allowed(b"src/a", b"lib/b"));
    assert!(p.dir_rename_allowed(b"deep/z", b"lib/b"));
    // A move under a directory whose file re-includes (`!secret`): refused both ways.
    let p = with(&[
        src("", ".aiignore", "secret\n"),
        src("pub", ".aiignore", "!secret\n"),
    ]);
    assert!(hidden(&p, "x/secret", false) && !hidden(&p, "pub/x/secret", false));
    assert!(!p.dir_rename_allowed(b"x", b"pub/x"));
    assert!(!p.dir_rename_allowed(b"pub/x", b"x"));
    assert!(p.dir_rename_allowed(b"x", b"y/z"));
    assert!(p.dir_rename_allowed(b"pub/x", b"pub/y"));
}

#[test]
fn ignore_file_errors() {
    // An unparsable line: file and line.
    let e = pol(DANGER)
        .with_ignores(&[src("s", ".aiignore", "ok\na{b\n")])
        .expect_err("bad glob");
    assert_eq!((e[0].file.as_str(), e[0].line), ("SOURCE/s/.aiignore", 2));
    // Too many patterns together: refused, not compiled.
    let many = "x\n".repeat(crate::policy::ignore::MAX_PATTERNS / 2 + 1);
    let e = pol(DANGER)
        .with_ignores(&[src("", ".aiignore", &many), src("d", ".aiignore", &many)])
        .expect_err("too many patterns");
    assert!(e[0].message.contains("more than 10000 patterns"), "{e:?}");
    // Names are file names.
    for bad in ["", ".", "..", "a/b"] {
        let src = format!("ignore_files = [\"{bad}\"]\n");
        let e = Policy::parse(&src, "t.toml").expect_err(bad);
        assert_eq!((e[0].line, e[0].column), (1, 17), "{bad}: {e:?}");
    }
    // Without ignore_files nothing is hidden or pinned.
    let p = pol("mode = \"danger\"\n")
        .with_ignores(&[src("", ".aiignore", "*\n")])
        .expect("ok");
    assert!(!hidden(&p, "x", false));
    assert!(!p.pinned(b".aiignore"));
}

#[test]
fn names_from_every_layer_combine() {
    let p = Policy::from_layers(vec![
        Layer::parse("ignore_files = [\".aiignore\"]\n", "a.toml").expect("a"),
        Layer::parse(
            "ignore_files = [\".codexignore\", \".aiignore\"]\n",
            "b.toml",
        )
        .expect("b"),
    ]);
    assert_eq!(p.ignore_names(), [".aiignore", ".codexignore"]);
    let p = p
        .with_ignores(&[src("", ".codexignore", "c\n")])
        .expect("compiles");
    let v = p.verdict_for(b"c", ME, false);
    assert_eq!((v.effective, v.layer), (Access::None, 1));
}
