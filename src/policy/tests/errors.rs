//! Every error class with its position; robustness on odd input.

use super::check::DEVICE;
use super::*;

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
        ("[[rule]]\npath = \"a\"\naccess = \"none\"\nuids = [1]\n", &[(4, 1, "unknown key \"uids\" (expected one of: path, access, ask, except, uid, gid, exec, exe, ancestor_exe)", )]),
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
        ("[[rule]]\npath = \"a\"\naccess = \"rw\"\n", &[(3, 10, "unknown access \"rw\" (expected none, list, read, create, append or write)", )]),
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
            "{}:4:10: unknown access \"bad\" (expected none, list, read, create, append or write)",
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
                assert!(v.grant.includes(v.effective));
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
