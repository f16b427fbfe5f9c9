//! cargo-fuzz target: arbitrary bytes as a policy plus derived paths → `Policy::parse`,
//! `verdict_for`, `check_for`, `dir_rename_allowed`; see `fuzz/harness.rs`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
