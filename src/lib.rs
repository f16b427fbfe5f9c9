//! fencefs: a FUSE daemon that mirrors a host workspace at a mount point and decides every
//! operation against a TOML policy of per-path grants and a sandbox mode.
//!
//! ```text
//!  kernel ──/dev/fuse──▶ fs (fuser glue) ──┐
//!  kernel ──io_uring──▶ transport (rings) ─┴─▶ fs::handlers ──▶ fs::ops (snapshot → decide → audit → host)
//!                                                                   │             │
//!                                          policy (pure: parse, compile, decide)   host (handles, *at syscalls)
//! ```
//! Threat model: the callers of the mount (agents and everything they exec) are untrusted;
//! the host side may change concurrently. The policy decides on the logical path a caller
//! used; the host is only touched through held directory handles, one name at a time,
//! never following a symlink.
//!
//! `unsafe` is denied here and allowed (`#![allow(unsafe_code)]`, each block with a
//! `// SAFETY:` line) only in the syscall and ring modules: `host/sys/`, `stage/sys.rs`,
//! `transport/ring.rs`, `transport/reply.rs`, `watch.rs`, `harden.rs`, `daemon.rs`; and,
//! item by item, fuser's `wrap_backing` in `fs/reply.rs` and the tests that call libc.
#![deny(unsafe_code)]

pub mod app;
pub mod approvals;
pub mod audit;
pub mod cli;
pub mod control;
pub mod daemon;
pub mod docs;
pub mod fs;
pub mod fuse_opts;
pub mod harden;
pub mod host;
pub mod idmap;
pub mod learn;
pub mod logging;
pub mod out;
pub mod policy;
pub mod private_file;
pub mod quote;
pub mod reload;
pub mod stage;
pub mod transport;
pub mod watch;
