//! `check()`: the errno order, and directory renames.

use super::*;

// ---------------------------------------------------------------- check()

const NO_SPECIAL: Special = Special {
    device: false,
    setid: false,
};
pub(super) const DEVICE: Special = Special {
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
                assert_eq!(d.errno, d.refusal.errno(*need), "case {i}");
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

/// A refusal's kind gives its errno and its rank: the contract's order is `Refusal`'s
/// order (the table above checks every denial's errno is its kind's).
#[test]
fn refusal_kinds_are_in_the_contracts_order() {
    use Refusal::*;
    assert!(Hidden < Special && Special < Mode && Mode < Rule);
    let errnos = |n| [Hidden, Special, Mode, Rule].map(|r| r.errno(n));
    let (noent, perm, rofs, acces) = (libc::ENOENT, libc::EPERM, libc::EROFS, libc::EACCES);
    assert_eq!(errnos(Need::Read), [noent, perm, rofs, acces]);
    assert_eq!(errnos(Need::Create), [acces, perm, rofs, acces]);
    let p = pol(
        "mode = 'read-only'\n[[rule]]\npath='s'\naccess='none'\n[[rule]]\npath='d'\naccess='list'\n",
    );
    let kind = |path: &[u8], need, sp| p.check(path, ME, need, sp).unwrap_err().refusal;
    assert_eq!(kind(b"s/x", Need::Create, NO_SPECIAL), Hidden);
    assert_eq!(kind(b"x", Need::Create, DEVICE), Special);
    assert_eq!(kind(b"x", Need::Write, NO_SPECIAL), Mode);
    assert_eq!(kind(b"d/x", Need::Read, NO_SPECIAL), Rule);
}
