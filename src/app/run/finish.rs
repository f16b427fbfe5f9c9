//! After a staged `fencefs run`: the staged changes are shown (`stage status`) and, on a
//! terminal, the caller chooses: apply all, keep staged (the next run in the workspace
//! continues them), or discard; reviewing is the command printed. Without a terminal they
//! stay staged and one line says how to review them.
//!
//! Invariants: runs after every daemon of the run has stopped (the staging area is no
//! longer served); it acts only through `fencefs stage`'s own code, on `--dir`.

use std::ffi::OsString;
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use clap::Parser;

use crate::cli::{Cli, Command};

/// Shows the staged changes in `dir` and acts on the caller's choice.
pub(super) fn staged(dir: &Path) {
    let review = format!("fencefs stage diff --dir {}", dir.display());
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        eprintln!(
            "fencefs: changes kept staged in {}: review with `{review}`, then `fencefs stage apply --dir {}`",
            dir.display(),
            dir.display()
        );
        return;
    }
    eprintln!("fencefs: staged changes ({}):", dir.display());
    stage(&["status"], dir);
    loop {
        eprint!("[a]pply all, [k]eep staged for the next run, [d]iscard all (review: {review})? ");
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if std::io::stdin().lock().read_line(&mut line).unwrap_or(0) == 0 {
            eprintln!();
            return;
        }
        match line.trim() {
            "a" | "apply" => return stage(&["apply"], dir),
            "k" | "keep" | "" => return,
            "d" | "discard" => return stage(&["discard"], dir),
            _ => {}
        }
    }
}

/// `fencefs stage OP --dir DIR`, in this process.
fn stage(op: &[&str], dir: &Path) {
    let mut argv: Vec<OsString> = vec!["fencefs".into(), "stage".into()];
    argv.extend(op.iter().map(OsString::from));
    argv.extend(["--dir".into(), dir.into()]);
    if let Ok(Cli {
        command: Command::Stage(a),
    }) = Cli::try_parse_from(argv)
    {
        crate::stage::cli::run(a);
    }
}
