//! Decisions per second with 1, 2 and 4 policy layers: `explain`-style decisions
//! (`Policy::verdict_for` + `Policy::check_for`) over a fixed set of workspace paths, each
//! layer a copy of `policy.example.toml`'s kind of rules.
//!
//! Run: `cargo run --release --example layers_bench` (prints one line per layer count).

use std::time::Instant;

use fencefs::policy::{Caller, Layer, Need, Policy, Special};

const LAYER: &str = r#"
mode = "workspace-write"
default = "write"
[[rule]]
path = "**/*.pem"
access = "none"
except = ["**/site-packages/**", "**/node_modules/**"]
[[rule]]
path = "**/.env"
access = "none"
[[rule]]
path = "secrets"
access = "none"
[[rule]]
path = "docs"
access = "read"
[[rule]]
path = "build/cache"
access = "write"
uid = [1000]
[[rule]]
path = "vendor/**/*.so"
access = "read"
"#;

fn main() {
    let paths: Vec<Vec<u8>> = [
        "src/main.rs",
        "src/policy/layers.rs",
        "docs/src/policy.md",
        "secrets/key",
        "a/b/c/d/e/f/g.txt",
        "venv/lib/site-packages/certifi/cacert.pem",
        "keys/server.pem",
        ".env",
        "build/cache/x.o",
        "vendor/x/y/lib.so",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let caller = Caller::new(1000, 1000);
    for n in [1, 2, 4] {
        let layers = (0..n)
            .map(|k| Layer::parse(LAYER, &format!("l{k}.toml")).expect("bench layer"))
            .collect();
        let p = Policy::from_layers(layers);
        let rounds = 20_000;
        let start = Instant::now();
        let mut sink = 0usize;
        for _ in 0..rounds {
            for path in &paths {
                let v = p.verdict_for(path, caller, false);
                let c = p.check_for(path, caller, Need::Read, Special::default(), false);
                sink += v.effective as usize + c.is_ok() as usize;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let decisions = (rounds * paths.len()) as f64;
        println!(
            "{n} layer(s): {:.0} decisions/s ({:.2} us each; {sink})",
            decisions / secs,
            secs / decisions * 1e6
        );
    }
}
