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

#[test]
fn program_rules_apply_only_to_matching_programs() {
    let p = pol(&format!(
        "{DANGER}default = 'write'\n\
         [[rule]]\npath = '.git'\naccess = 'read'\n\
         [[rule]]\npath = '.git'\naccess = 'write'\nexe = ['/usr/bin/git', '/usr/lib/git-core/*']\n\
         [[rule]]\npath = 'cache'\naccess = 'write'\nancestor_exe = ['/usr/bin/npm']\n\
         [[rule]]\npath = 'cache'\naccess = 'read'\n\
         [[rule]]\npath = 'mine'\naccess = 'none'\nexe = ['/bin/sh']\nuid = [1000]\n"
    ));
    assert!(p.has_programs() && p.has_ancestor_programs() && p.has_id_rules());
    let with = |exe: &[u8], anc: &[&[u8]]| Caller {
        progs: p.match_programs(exe, &anc.iter().map(|a| a.to_vec()).collect::<Vec<_>>()),
        ..ME
    };
    let git = with(b"/usr/bin/git", &[]);
    let helper = with(b"/usr/lib/git-core/git-remote-http", &[b"/usr/bin/git"]);
    let deep = with(b"/usr/lib/git-core/sub/x", &[]);
    let sh = with(b"/bin/sh", &[]);
    let under_npm = with(b"/bin/sh", &[b"/usr/bin/node", b"/usr/bin/npm"]);
    let w = |c: Caller, path: &[u8]| p.verdict(path, c).grant;
    assert_eq!(
        w(git, b".git/objects/x"),
        Write,
        "exe rule beats the plain one"
    );
    assert_eq!(w(helper, b".git/objects/x"), Write);
    assert_eq!(w(deep, b".git/objects/x"), Read, "* does not cross /");
    assert_eq!(w(sh, b".git/objects/x"), Read);
    assert_eq!(w(ME, b".git/objects/x"), Read, "no program known");
    assert_eq!(w(under_npm, b"cache/a"), Write, "an ancestor matches");
    assert_eq!(w(sh, b"cache/a"), Read);
    // exe and uid together: both must match.
    assert_eq!(w(sh, b"mine/x"), No);
    assert_eq!(w(Caller { uid: 2000, ..sh }, b"mine/x"), Write);
    assert_eq!(w(git, b"mine/x"), Write);
}

#[test]
fn program_selectors_are_checked_when_loading() {
    let bad = |body: &str| {
        Policy::parse(
            &format!("[[rule]]\npath = 'a'\naccess = 'read'\n{body}\n"),
            "t",
        )
        .unwrap_err()[0]
            .message
            .clone()
    };
    assert!(bad("exe = ['git']").contains("absolute path"));
    assert!(bad("exe = []").contains("must not be empty"));
    assert!(bad("ancestor_exe = ['/usr/bin/[']").contains("invalid ancestor_exe glob"));
    assert!(bad("exe = '/usr/bin/git'").contains("array of strings"));
    let many: String = (0..=MAX_PROGRAM_RULES)
        .map(|i| format!("[[rule]]\npath = 'p{i}'\naccess = 'read'\nexe = ['/bin/x{i}']\n"))
        .collect();
    let e = Policy::parse(&many, "t").unwrap_err();
    assert!(e[0].message.contains("at most 64"), "{e:?}");
    let fits: String = (0..MAX_PROGRAM_RULES)
        .map(|i| format!("[[rule]]\npath = 'p{i}'\naccess = 'read'\nexe = ['/bin/x{i}']\n"))
        .collect();
    let p = pol(&fits);
    let last = format!("/bin/x{}", MAX_PROGRAM_RULES - 1);
    assert_eq!(
        p.match_programs(last.as_bytes(), &[]),
        1 << (MAX_PROGRAM_RULES - 1)
    );
}
