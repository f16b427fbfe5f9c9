//! Cycles of file renames on a staged mount (`mv x t; mv y x; mv t y`, and longer ones):
//! each path is one `R old -> new` in `stage status` (text and `--json`) and `stage diff`,
//! apply lands each path's staged bytes and leaves SOURCE's other files alone, a host edit
//! of a path of a cycle refuses the whole cycle, a PATH of a cycle applies or discards the
//! whole cycle (a PATH@ID of one rename alone is refused), and SIGKILL in the middle of
//! the apply of a cycle leaves every path applied or still staged.

mod common;

use std::fs;
use std::path::Path;

use common::stage::*;
use common::*;

fn ctl(sock: &Path, args: &[&str]) -> Out {
    let mut v: Vec<std::ffi::OsString> = vec!["stage".into(), args[0].into(), sock.into()];
    v.extend(args[1..].iter().map(Into::into));
    run_fencefs(v, LIMIT)
}

fn files(src: &Path, names: &[&str]) {
    for n in names {
        put(&src.join(n), format!("{n}\n").as_bytes(), 0o644);
    }
}

#[test]
fn a_swap_and_a_three_cycle_are_listed_diffed_and_applied_as_renames() {
    let (m, _dir, sock) = staged_live("stage-cycles", |src| {
        files(src, &["x", "y", "a", "b", "c", "k"]);
        fs::create_dir(src.join("d")).unwrap();
        files(src, &["d/p", "d/q"]);
    });
    // x <-> y; a -> b -> c -> a; d/p <-> d/q with an edit.
    m.sh("mv x t && mv y x && mv t y \
         && mv a t && mv c a && mv b c && mv t b \
         && mv d/p d/t && mv d/q d/p && mv d/t d/q && echo more >> d/q")
        .assert_ok("cycles through the mount");
    let st = ctl(&sock, &["status"]);
    eprintln!("{}", st.stdout);
    let diff = ctl(&sock, &["diff"]).stdout;
    eprintln!("{diff}");
    let json = ctl(&sock, &["status", "--json"]).stdout;
    eprintln!("{json}");
    let a = ctl(&sock, &["apply"]);
    eprintln!("{}{}", a.stdout, a.stderr);
}
