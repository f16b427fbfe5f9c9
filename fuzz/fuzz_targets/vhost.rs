//! Virtqueue requests from a hostile guest: arbitrary bytes → up to four descriptors and
//! the guest memory they point at, served through the vhost-user transport's real queue
//! code, decoder and handlers (over a scratch workspace). Asserts no panic, each chain put
//! back at most once, no used length past the writable room (see `harness.rs` in
//! src/transport/vhost/).
#![no_main]

use std::sync::OnceLock;

use fencefs::transport::vhost::harness::Guest;
use libfuzzer_sys::fuzz_target;

static GUEST: OnceLock<Guest> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let g = GUEST.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fencefs-fuzz-vhost-{}", std::process::id()));
        Guest::new(&dir)
    });
    g.fuzz(data);
});
