//! Layers: the combination table (allow / ask / deny × the errno precedence × modes),
//! the combined mode, global indices, and the layer each answer names.

use super::*;
use crate::policy::Layer;

fn layer(src: &str, file: &str) -> Layer {
    Layer::parse(src, file).unwrap_or_else(|e| panic!("layer should parse: {e:?}\n{src}"))
}

fn set(srcs: &[&str]) -> Policy {
    Policy::from_layers(
        srcs.iter()
            .enumerate()
            .map(|(k, s)| layer(s, &format!("l{k}.toml")))
            .collect(),
    )
}

const ALLOW: &str = "mode = \"danger\"\n";
const HIDE: &str = "mode = \"danger\"\n[[rule]]\npath = 'p'\naccess = \"none\"\n";
const READ: &str = "mode = \"danger\"\n[[rule]]\npath = 'p'\naccess = \"read\"\n";
const ASK: &str = "mode = \"danger\"\n[[rule]]\npath = 'p'\naccess = \"read\"\nask = \"write\"\n";
const RO: &str = "mode = \"read-only\"\n";
const PROTECT: &str = "mode = \"workspace-write\"\nprotected = ['p']\n";
const NOSETID: &str = "mode = \"danger\"\n";
const SETID: &str = "mode = \"danger\"\nallow_setid = true\n";

/// (layers, need, setid, expected: Ok(()) or the errno, askable, deciding layer)
type Row<'a> = (&'a [&'a str], Need, bool, Result<(), i32>, bool, usize);

#[test]
fn combination_table() {
    use libc::{EACCES, ENOENT, EPERM, EROFS};
    let rows: &[Row] = &[
        // allow × allow: allowed
        (&[ALLOW, ALLOW], Need::Write, false, Ok(()), false, 0),
        // any refusal wins, whichever layer it is in
        (&[ALLOW, READ], Need::Write, false, Err(EACCES), false, 1),
        (&[READ, ALLOW], Need::Write, false, Err(EACCES), false, 0),
        (&[ALLOW, HIDE], Need::Read, false, Err(ENOENT), false, 1),
        (&[ALLOW, HIDE], Need::Create, false, Err(EACCES), false, 1),
        // errno precedence across layers: none, device/setid, mode, rule
        (&[READ, HIDE], Need::Write, false, Err(ENOENT), false, 1),
        (&[HIDE, PROTECT], Need::Write, false, Err(ENOENT), false, 0),
        (&[READ, PROTECT], Need::Write, false, Err(EROFS), false, 1),
        (&[PROTECT, READ], Need::Write, false, Err(EROFS), false, 0),
        (&[SETID, NOSETID], Need::Write, true, Err(EPERM), false, 1),
        (
            &[READ, NOSETID, HIDE],
            Need::Write,
            true,
            Err(ENOENT),
            false,
            2,
        ),
        (
            &[SETID, READ, NOSETID],
            Need::Write,
            true,
            Err(EPERM),
            false,
            1,
        ),
        // ask: held only when every refusing layer would hold it
        (&[ASK, ALLOW], Need::Write, false, Err(EACCES), true, 0),
        (&[ASK, ASK], Need::Write, false, Err(EACCES), true, 0),
        (&[ASK, READ], Need::Write, false, Err(EACCES), false, 1),
        (&[READ, ASK], Need::Write, false, Err(EACCES), false, 0),
        (&[ASK, HIDE], Need::Write, false, Err(ENOENT), false, 1),
        (&[ASK, PROTECT], Need::Write, false, Err(EROFS), false, 1),
        // reads pass where every layer grants read
        (&[READ, ASK, PROTECT], Need::Read, false, Ok(()), false, 0),
    ];
    for (i, &(srcs, need, setid, want, askable, at)) in rows.iter().enumerate() {
        let p = set(srcs);
        let special = Special {
            device: false,
            setid,
        };
        let got = p.check_for(b"p", ME, need, special, false);
        match (&got, want) {
            (Ok(v), Ok(())) => assert_eq!(v.layer, at, "row {i}: deciding layer"),
            (Err(d), Err(e)) => {
                assert_eq!(d.errno, e, "row {i}: errno");
                assert_eq!(d.askable(&p, need).is_some(), askable, "row {i}: askable");
                assert!(
                    !askable || p.has_asks(),
                    "row {i}: askable without an ask rule"
                );
                assert_eq!(d.verdict.layer, at, "row {i}: deciding layer");
                if let By::Rule(r) = d.by {
                    assert_eq!(p.rule(r).layer, at, "row {i}: the rule is the layer's");
                }
            }
            _ => panic!("row {i}: got {got:?}, want {want:?}"),
        }
    }
}

/// `has_asks` (the create hot path skips the atomic-save machinery without it): any
/// layer's `ask` rule counts, the workspace layer's included.
#[test]
fn has_asks_when_some_layer_has_an_ask_rule() {
    assert!(!set(&[ALLOW, READ, HIDE, PROTECT]).has_asks());
    assert!(set(&[ASK]).has_asks());
    assert!(set(&[READ, ASK]).has_asks());
    assert!(set(&[READ]).with_layer(layer(ASK, "ws.toml")).has_asks());
}

#[test]
fn the_mode_is_the_most_restrictive_the_layers_set() {
    let ww = "mode = \"workspace-write\"\n";
    let dg = "mode = \"danger\"\n";
    let none = "default = \"write\"\n";
    assert_eq!(set(&[dg, ww]).mode(), Mode::WorkspaceWrite);
    assert_eq!(set(&[ww, RO, dg]).mode(), Mode::ReadOnly);
    // A layer that sets no mode does not take part; none sets one: read-only.
    assert_eq!(set(&[dg, none]).mode(), Mode::Danger);
    assert_eq!(set(&[none, none]).mode(), Mode::ReadOnly);
    // --mode overrides every layer.
    let mut p = set(&[RO, dg]);
    p.set_mode(Mode::Danger);
    assert!(p.check(b"x", ME, Need::Write, Special::default()).is_ok());
}

#[test]
fn access_is_the_lowest_layer_and_indices_are_global() {
    let a = "mode = \"danger\"\n[[rule]]\npath = 'x'\naccess = \"read\"\n";
    let b = "mode = \"danger\"\n[[rule]]\npath = 'y'\naccess = \"write\"\n\
             [[rule]]\npath = 'x/z'\naccess = \"list\"\n";
    let p = set(&[a, b]);
    assert_eq!(p.rules().len(), 3);
    let v = p.verdict_for(b"x/z", ME, false);
    assert_eq!((v.effective, v.layer), (List, 1));
    assert_eq!(by_name(&p, v.by), "rule x/z");
    let v = p.verdict_for(b"x/w", ME, false);
    assert_eq!(
        (v.effective, v.layer, by_name(&p, v.by)),
        (Read, 0, "rule x".into())
    );
    assert_eq!(p.layer_file(1), "l1.toml");
    let each = p.layer_verdicts(b"x/z", ME, false);
    assert_eq!(
        each.iter().map(|v| v.effective).collect::<Vec<_>>(),
        [Read, List]
    );
    // Protected entries are global too: layer 1's entry is index 2 (after layer 0's two
    // defaults), and the ceiling names it.
    let p = set(&["mode = \"workspace-write\"\n", "protected = ['q']\n"]);
    assert_eq!(p.ceiling_by(b"q/r"), CeilingBy::Protected(2));
    assert_eq!(p.protected_entry(2).0, "q");
    assert_eq!(p.ceiling_layer_at(b"q/r"), 1);
}

#[test]
fn one_broken_layer_fails_the_set_naming_its_file() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/tmp")
        .join(format!("fencefs-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    let bad = dir.join("bad.toml");
    std::fs::write(&good, "mode = \"danger\"\n").unwrap();
    std::fs::write(
        &bad,
        "mode = \"danger\"\n[[rule]]\npath = 'a'\naccess = \"bogus\"\n",
    )
    .unwrap();
    let errs = crate::policy::load_all(&[&good, &bad]).unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].line, errs[0].column), (4, 10), "{errs:?}");
    assert!(
        errs[0]
            .to_string()
            .starts_with(&format!("{}:4:10:", bad.display()))
    );
    assert_eq!(
        crate::policy::load_all(&[&good, &good])
            .unwrap()
            .layers()
            .len(),
        2
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_workspace_layer_file_is_read_only_in_every_mode() {
    for mode in ["danger", "workspace-write", "read-only"] {
        let p = set(&[&format!(
            "mode = \"{mode}\"\nworkspace_policy = \".fencefs.toml\"\n"
        )]);
        assert_eq!(p.workspace_policy(), Some(".fencefs.toml"));
        for need in [Need::Write, Need::Create] {
            let d = p
                .check(b".fencefs.toml", ME, need, Special::default())
                .unwrap_err();
            assert_eq!(d.errno, libc::EROFS, "{mode} {need:?}");
        }
        assert!(
            p.check(b".fencefs.toml", ME, Need::Read, Special::default())
                .is_ok()
        );
        assert_eq!(p.verdict_for(b".fencefs.toml", ME, false).effective, Read);
        assert!(!p.dir_rename_allowed(b"d", b".fencefs.toml"));
        // Only that name: a file of the same name below the root is an ordinary file.
        assert_eq!(p.verdict_for(b"sub/.fencefs.toml", ME, false).grant, Write);
    }
    // `none` still comes first (ENOENT), and a layer added later keeps the pin.
    let p = set(&[
        "mode = \"danger\"\nworkspace_policy = \"w.toml\"\n[[rule]]\npath = 'w.toml'\naccess = \"none\"\n",
    ]);
    let d = p
        .check(b"w.toml", ME, Need::Write, Special::default())
        .unwrap_err();
    assert_eq!(d.errno, libc::ENOENT);
    let p = set(&["mode = \"danger\"\nworkspace_policy = \"w.toml\"\n"]).with_layer(layer(
        "[[rule]]\npath = 'docs'\naccess = \"read\"\n",
        "SOURCE/w.toml",
    ));
    assert_eq!(p.layers().len(), 2);
    assert_eq!(p.mode(), Mode::Danger);
    assert!(p.pinned(b"w.toml"));
    for bad in ["", "a/b", ".", ".."] {
        let e = Policy::parse(&format!("workspace_policy = \"{bad}\"\n"), "t.toml").unwrap_err();
        assert_eq!((e[0].line, e[0].column), (1, 20), "{bad:?}: {e:?}");
    }
}
