//! The cost of `ignore_files`: a tree of 100k paths with 100 nested `.aiignore` files is
//! written under target/tmp, then (1) the scan that finds and reads them (what a mount
//! does at start and on every reload), (2) their compile into the policy, and (3) a
//! decision (`Policy::verdict_for`) for every path, with and without the ignore files.
//!
//! Run: `cargo run --release --example ignore_bench` (prints one line per figure).

use std::fs;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Instant;

use fencefs::policy::{Access, Caller, Policy};

const POLICY: &str = "mode = \"danger\"\nignore_files = [\".aiignore\"]\n[[rule]]\npath = \"**/*.pem\"\naccess = \"none\"\n";

/// 100 directories `dK` (K < 100), each with 10 subdirectories of 100 files: 100k files.
/// Every `dK` holds an `.aiignore`; so does the root.
fn make_tree(root: &Path) -> Vec<Vec<u8>> {
    let mut paths = Vec::with_capacity(100_000);
    fs::write(
        root.join(".aiignore"),
        "*.key\n!keep.key\n/top-secret\nlogs/\n",
    )
    .unwrap();
    for d in 0..100 {
        let dir = root.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        // A few lines each, anchored and floating, with a negation.
        fs::write(
            dir.join(".aiignore"),
            format!("*.tmp{d}\n/s0/f{d}.txt\n!*.key\ncache{d}/\n# comment\n"),
        )
        .unwrap();
        for s in 0..10 {
            let sub = dir.join(format!("s{s}"));
            fs::create_dir_all(&sub).unwrap();
            for f in 0..100 {
                let name = match f % 10 {
                    0 => format!("f{f}.key"),
                    1 => format!("f{f}.tmp{d}"),
                    _ => format!("f{f}.txt"),
                };
                let rel = format!("d{d}/s{s}/{name}");
                fs::write(root.join(&rel), b"").unwrap();
                paths.push(rel.into_bytes());
            }
        }
    }
    paths
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp/ignore-bench");
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(&root).unwrap();
    let paths = make_tree(&root);
    let caller = Caller::new(1000, 1000);
    let base = Policy::parse(POLICY, "bench.toml").expect("bench policy");
    let src = fencefs::host::sys::open_root(&root).unwrap();

    let t = Instant::now();
    let found = fencefs::host::ignore_scan::scan(src.as_fd(), base.ignore_names()).unwrap();
    let scan = t.elapsed();
    let t = Instant::now();
    let p = base.clone().with_ignores(&found).unwrap();
    let compile = t.elapsed();
    println!(
        "scan: {} ignore files among {} paths in {:.1} ms; compile: {:.2} ms",
        found.len(),
        paths.len(),
        scan.as_secs_f64() * 1e3,
        compile.as_secs_f64() * 1e3
    );

    // The compile at its bound: 100 files of 100 pattern lines (MAX_PATTERNS together).
    let big: Vec<fencefs::policy::IgnoreSource> = (0..100)
        .map(|d| fencefs::policy::IgnoreSource {
            dir: format!("d{d}").into_bytes(),
            name: ".aiignore".into(),
            text: (0..50).map(|i| format!("p{i}*.x{d}\n!/k{i}/\n")).collect(),
        })
        .collect();
    let t = Instant::now();
    let worst = base.clone().with_ignores(&big).unwrap();
    println!(
        "compile at the bound ({} files, {} patterns): {:.1} ms",
        worst.ignore_set().len(),
        big.iter().map(|s| s.text.lines().count()).sum::<usize>(),
        t.elapsed().as_secs_f64() * 1e3
    );

    for (what, pol) in [
        ("without ignore files", &base),
        ("with 101 ignore files", &p),
    ] {
        let rounds = 5;
        let t = Instant::now();
        let mut hidden = 0usize;
        for _ in 0..rounds {
            for path in &paths {
                if pol.verdict_for(path, caller, false).effective == Access::None {
                    hidden += 1;
                }
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let n = (rounds * paths.len()) as f64;
        println!(
            "{what}: {:.0} decisions/s ({:.2} us each; {} of {} paths hidden)",
            n / secs,
            secs / n * 1e6,
            hidden / rounds,
            paths.len()
        );
    }
    let _ = fs::remove_dir_all(&root);
}
