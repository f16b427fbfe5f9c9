//! The `create` and `append` levels (decisions per need, the meet at one depth and across
//! layers, the mode ceiling, `ask` above them) and `exec = false`.

use super::*;

const DANGER: &str = "mode = 'danger'\n";

fn errno_of(p: &Policy, path: &[u8], need: Need) -> Option<i32> {
    p.check(path, ME, need, Special::default())
        .err()
        .map(|d| d.errno)
}

#[test]
fn every_need_under_create_and_append() {
    let p = pol(&format!(
        "{DANGER}{}",
        rules(&[("inbox", "create"), ("logs", "append"), ("ro", "read")])
    ));
    let e = libc::EACCES;
    #[rustfmt::skip]
    let cases: &[(&[u8], Need, Option<i32>)] = &[
        (b"inbox/a", Need::List, None),
        (b"inbox/a", Need::Read, None),
        (b"inbox/a", Need::Create, None),
        (b"inbox/a", Need::Append, Some(e)),
        (b"inbox/a", Need::Write, Some(e)),
        (b"logs/a", Need::List, None),
        (b"logs/a", Need::Read, None),
        (b"logs/a", Need::Create, Some(e)),
        (b"logs/a", Need::Append, None),
        (b"logs/a", Need::Write, Some(e)),
        (b"ro/a", Need::Create, Some(e)),
        (b"ro/a", Need::Append, Some(e)),
        (b"other", Need::Append, None), // default write includes both
        (b"other", Need::Create, None),
    ];
    for (path, need, want) in cases {
        assert_eq!(
            errno_of(&p, path, *need),
            *want,
            "{} {need:?}",
            String::from_utf8_lossy(path)
        );
    }
}

#[test]
fn the_mode_caps_create_and_append_with_erofs() {
    let src = rules(&[("inbox", "create"), ("logs", "append")]);
    let ro = pol(&format!("mode = 'read-only'\n{src}"));
    for (path, need) in [(&b"inbox/a"[..], Need::Create), (b"logs/a", Need::Append)] {
        assert_eq!(errno_of(&ro, path, need), Some(libc::EROFS));
        let v = ro.verdict(path, ME);
        assert_eq!((v.effective, v.by), (Read, By::Mode));
    }
    let ww = pol(&format!(
        "mode = 'workspace-write'\nwritable_roots = ['inbox']\n{src}"
    ));
    assert_eq!(errno_of(&ww, b"inbox/a", Need::Create), None);
    assert_eq!(errno_of(&ww, b"logs/a", Need::Append), Some(libc::EROFS));
    assert_eq!(ww.verdict(b"inbox/a", ME).effective, Access::Create);
}

#[test]
fn create_and_append_at_one_depth_meet_at_read() {
    let p = pol(&format!(
        "{DANGER}{}",
        rules(&[("d", "create"), ("d", "append")])
    ));
    let v = p.verdict(b"d/x", ME);
    assert_eq!(v.grant, Read);
    assert!(matches!(v.grant_by, By::Rule(_)));
    assert_eq!(errno_of(&p, b"d/x", Need::Create), Some(libc::EACCES));
    assert_eq!(errno_of(&p, b"d/x", Need::Append), Some(libc::EACCES));
    assert_eq!(errno_of(&p, b"d/x", Need::Read), None);
    // With a read rule too, that rule decides (its access is the meet itself).
    let p = pol(&format!(
        "{DANGER}{}",
        rules(&[("d", "append"), ("d", "create"), ("d", "read")])
    ));
    assert_eq!(grant_of(&p, b"d/x", ME), (Read, "rule d".into()));
    // Deeper wins as always: create below an append directory.
    let p = pol(&format!(
        "{DANGER}{}",
        rules(&[("d", "append"), ("d/in", "create")])
    ));
    assert_eq!(
        grant_of(&p, b"d/in/x", ME),
        (Access::Create, "rule d/in".into())
    );
    assert_eq!(grant_of(&p, b"d/x", ME), (Access::Append, "rule d".into()));
}

#[test]
fn layers_meet_create_and_append_at_read() {
    let a = build::Layer::parse(&format!("{DANGER}{}", rules(&[("d", "create")])), "a").unwrap();
    let b = build::Layer::parse(&format!("{DANGER}{}", rules(&[("d", "append")])), "b").unwrap();
    let p = Policy::from_layers(vec![a, b]);
    assert_eq!(p.verdict(b"d/x", ME).effective, Read);
    let read = p.check(b"d/x", ME, Need::Read, Special::default()).unwrap();
    assert_eq!(read.effective, Read);
    for need in [Need::Create, Need::Append, Need::Write] {
        assert_eq!(errno_of(&p, b"d/x", need), Some(libc::EACCES), "{need:?}");
    }
}

#[test]
fn ask_above_create_and_append() {
    let ok = |src: &str| Policy::parse(src, "t").is_ok();
    let r = |access: &str, ask: &str| {
        format!("[[rule]]\npath = 'd'\naccess = '{access}'\nask = '{ask}'\n")
    };
    assert!(ok(&r("append", "write")));
    assert!(ok(&r("create", "write")));
    assert!(ok(&r("read", "append")));
    assert!(ok(&r("list", "create")));
    assert!(!ok(&r("create", "append")), "incomparable");
    assert!(!ok(&r("append", "create")), "incomparable");
    assert!(!ok(&r("append", "read")), "below");
    assert!(!ok(&r("write", "append")), "below");
    let p = pol(&format!("{DANGER}{}", r("read", "append")));
    let d = p
        .check(b"d/x", ME, Need::Append, Special::default())
        .unwrap_err();
    assert_eq!(d.askable(&p, Need::Append), Some(Access::Append));
    let d = p
        .check(b"d/x", ME, Need::Write, Special::default())
        .unwrap_err();
    assert_eq!(
        d.askable(&p, Need::Write),
        None,
        "append cannot lift a write"
    );
    let d = p
        .check(b"d/x", ME, Need::Create, Special::default())
        .unwrap_err();
    assert_eq!(d.askable(&p, Need::Create), None);
}

#[test]
fn exec_false_covers_below_and_deeper_rules_do_not_lift_it() {
    let src = format!(
        "{DANGER}[[rule]]\npath = 'downloads'\naccess = 'write'\nexec = false\nexcept = ['downloads/ok']\n\
         [[rule]]\npath = '**/*.sh'\naccess = 'read'\n\
         [[rule]]\npath = 'bin'\naccess = 'read'\nexec = false\nuid = [2000]\n"
    );
    let p = pol(&src);
    assert!(p.has_noexec());
    assert!(p.exec_denied(b"downloads", ME).is_some());
    assert!(p.exec_denied(b"downloads/tool", ME).is_some());
    assert!(
        p.exec_denied(b"downloads/a/b.sh", ME).is_some(),
        "a deeper rule"
    );
    assert!(p.exec_denied(b"downloads/ok/x", ME).is_none(), "except");
    assert!(p.exec_denied(b"src/x", ME).is_none());
    assert!(p.exec_denied(b"bin/x", ME).is_none(), "uid rule, other uid");
    assert!(p.exec_denied(b"bin/x", OTHER).is_some());
    let none = pol(&format!("{DANGER}{}", rules(&[("a", "read")])));
    assert!(!none.has_noexec());
    assert!(none.exec_denied(b"a/x", ME).is_none());
    assert!(Policy::parse("[[rule]]\npath='a'\naccess='read'\nexec='no'\n", "t").is_err());
}
