//! What a directory listing's policy decisions cost per listed name: the benchmark's tree
//! (150 directories of 100 files, `dK/fN`, and a few names the example policy's presets
//! match in each), under `policy.example.toml`, decided name by name through
//! `Policy::verdict_for` and through `Policy::listing` (one per directory, as the daemon
//! lists).
//!
//! Run: `cargo run --release --example listing_bench [POLICY]` (prints ns per name).

use std::path::Path;
use std::time::Instant;

use fencefs::policy::{Access, Caller, Policy};

fn main() {
    let file = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "policy.example.toml".into());
    let policy = Policy::load(Path::new(&file)).unwrap_or_else(|e| panic!("{file}: {e:?}"));
    let dirs: Vec<Vec<Vec<u8>>> = (0..150)
        .map(|d| {
            let mut names: Vec<Vec<u8>> = (0..100).map(|f| format!("d{d}/f{f}").into()).collect();
            for extra in [".env", "server.pem", "README.md", "main.rs"] {
                names.push(format!("d{d}/{extra}").into());
            }
            names
        })
        .collect();
    let names: usize = dirs.iter().map(Vec::len).sum();
    let caller = Caller::new(1000, 1000);
    for round in 0..3 {
        let start = Instant::now();
        let mut shown = 0usize;
        for dir in &dirs {
            for p in dir {
                shown += (policy.verdict_for(p, caller, false).effective != Access::None) as usize;
            }
        }
        let each = start.elapsed().as_nanos() as f64 / names as f64;
        let start = Instant::now();
        let mut listed = 0usize;
        for dir in &dirs {
            let mut listing = policy.listing(caller);
            for p in dir {
                listed += listing.visible(p, false) as usize;
            }
        }
        let once = start.elapsed().as_nanos() as f64 / names as f64;
        assert_eq!(shown, listed, "the listing disagrees with verdict_for");
        println!(
            "round {round}: {names} names, {shown} shown: verdict_for {each:.0} ns a name, \
             listing {once:.0} ns a name"
        );
    }
}
