//! A caller whose program cannot be known (`Caller::program_unknown`): it gets the most
//! restrictive of the answers any program could get, so a rule that restricts a program
//! is never escaped by being unknown (fail closed), and one that widens a program's
//! access never applies.

use super::*;

const DANGER: &str = "mode = 'danger'\n";

fn unknown() -> Caller {
    Caller::unknown_program(ME.uid, ME.gid)
}

#[test]
fn an_unknown_program_gets_the_most_restrictive_answer() {
    let p = pol(&format!(
        "{DANGER}default = 'write'\n\
         [[rule]]\npath = '.git'\naccess = 'read'\n\
         [[rule]]\npath = '.git'\naccess = 'write'\nexe = ['/usr/bin/git']\n\
         [[rule]]\npath = 'downloads'\naccess = 'read'\nexe = ['/usr/bin/curl']\n\
         [[rule]]\npath = 'work/keys'\naccess = 'none'\nancestor_exe = ['/usr/bin/npm']\n\
         [[rule]]\npath = 'logs'\naccess = 'append'\nexe = ['/bin/a']\n\
         [[rule]]\npath = 'logs'\naccess = 'create'\nexe = ['/bin/c']\n\
         [[rule]]\npath = 'bin'\naccess = 'write'\nexec = false\nexe = ['/bin/sh']\n"
    ));
    let g = |c: Caller, path: &[u8]| p.verdict(path, c).grant;
    // A widening rule (git writes .git) does not apply: the plain rule's read.
    assert_eq!(g(unknown(), b".git/objects/x"), Read);
    // A restricting rule (curl only reads downloads/) applies: never the default's write.
    assert_eq!(
        g(ME, b"downloads/a"),
        Write,
        "a known program that is not curl"
    );
    assert_eq!(g(unknown(), b"downloads/a"), Read);
    let d = p.check(b"downloads/a", unknown(), Need::Write, Special::default());
    let d = d.unwrap_err();
    assert_eq!(d.errno, libc::EACCES);
    assert_eq!(
        p.rule(match d.by {
            By::Rule(i) => i,
            other => panic!("decided by {other:?}"),
        })
        .pattern,
        "downloads",
        "the restricting rule is named"
    );
    // A hiding rule for some program hides for an unknown one (ENOENT, as for npm).
    assert_eq!(g(unknown(), b"work/keys/id"), No);
    assert_eq!(
        p.check(b"work/keys/id", unknown(), Need::Read, Special::default())
            .unwrap_err()
            .errno,
        libc::ENOENT
    );
    assert_eq!(
        g(unknown(), b"work/other"),
        Write,
        "outside every program rule"
    );
    // Two programs' levels at one depth: their meet.
    assert_eq!(g(unknown(), b"logs/x"), Read, "append ∧ create ∧ write");
    // exec = false of some program's rule fences an unknown one.
    assert!(p.exec_denied(b"bin/tool", ME).is_none());
    assert!(p.exec_denied(b"bin/tool", unknown()).is_some());
    // Without program rules an unknown program changes nothing.
    let plain = pol(&format!("{DANGER}{}", rules(&[("a", "read")])));
    assert_eq!(plain.verdict(b"a/x", unknown()), plain.verdict(b"a/x", ME));
}

#[test]
fn the_unknown_answer_is_the_meet_over_every_combination_of_matches() {
    // Program rules at several depths, one with a uid list, one hiding with a hole, with
    // plain rules between them: the answer for an unknown program equals the meet of the
    // answers for every subset of matching program rules (brute force, 2^4 subsets).
    let p = pol(&format!(
        "{DANGER}default = 'read'\n\
         [[rule]]\npath = 'a'\naccess = 'write'\nexe = ['/p0']\n\
         [[rule]]\npath = 'a/b'\naccess = 'append'\n\
         [[rule]]\npath = 'a/b'\naccess = 'create'\nexe = ['/p1']\n\
         [[rule]]\npath = 'a/b/c'\naccess = 'none'\nexe = ['/p2']\nexcept = ['a/b/c/open']\n\
         [[rule]]\npath = 'a/b/c/open'\naccess = 'list'\nuid = [1000]\n\
         [[rule]]\npath = '**/*.sh'\naccess = 'write'\nexe = ['/p3']\nuid = [1000]\n\
         [[rule]]\npath = 'x'\naccess = 'none'\n\
         [[rule]]\npath = 'x/y'\naccess = 'read'\nexe = ['/p0']\n"
    ));
    let paths: &[&[u8]] = &[
        b"",
        b"a",
        b"a/f",
        b"a/b",
        b"a/b/f",
        b"a/b/c",
        b"a/b/c/f",
        b"a/b/c/open",
        b"a/b/c/open/z",
        b"a/run.sh",
        b"a/b/c/run.sh",
        b"x",
        b"x/y",
        b"x/z",
        b"q.sh",
    ];
    for uid in [1000, 2000] {
        for &path in paths {
            for is_dir in [false, true] {
                let mut meet: Option<Access> = None;
                for mask in 0u64..16 {
                    let c = Caller {
                        progs: mask,
                        ..Caller::new(uid, uid)
                    };
                    let a = p.verdict_for(path, c, is_dir).grant;
                    meet = Some(meet.map_or(a, |m| m.meet(a)));
                }
                let got = p
                    .verdict_for(path, Caller::unknown_program(uid, uid), is_dir)
                    .grant;
                assert_eq!(
                    Some(got),
                    meet,
                    "uid {uid} {:?} dir {is_dir}",
                    String::from_utf8_lossy(path)
                );
            }
        }
    }
}
