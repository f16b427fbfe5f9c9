//! Records the git commit the binary is built from, for `fencefs --version`.
//!
//! `FENCEFS_COMMIT` in the build environment wins (a packager building from a source
//! tarball can pass the commit it came from); otherwise `git rev-parse HEAD`; otherwise
//! (no git, not a checkout — a source tarball, the Docker build context without `.git`)
//! "unknown". The script re-runs when HEAD moves (checkout, commit, reset), not on every
//! edit, so the commit says which commit the sources were at, not whether they were
//! modified since.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=FENCEFS_COMMIT");
    let commit = std::env::var("FENCEFS_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let c = git(&["rev-parse", "HEAD"])?;
            // Re-run when HEAD or the branch it points to moves. Only existing files are
            // named: cargo would re-run the script on every build for a missing one.
            let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])?];
            if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watch.extend(git(&["rev-parse", "--git-path", &r]));
            }
            watch.extend(git(&["rev-parse", "--git-path", "packed-refs"]));
            for p in watch.into_iter().map(PathBuf::from).filter(|p| p.exists()) {
                let p = if p.is_relative() {
                    // git prints paths relative to the current directory (the package root).
                    std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
                } else {
                    p
                };
                println!("cargo:rerun-if-changed={}", p.display());
            }
            Some(c)
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FENCEFS_COMMIT={commit}");
}
