//! The file system's requests, transport-neutral: the handlers ([`handlers`]) every
//! transport calls (`/dev/fuse` through fuser: `crate::transport::devfuse`; FUSE over
//! io_uring and vhost-user: `crate::transport`), the operations they run ([`ops`]), the
//! request vocabulary ([`ctx`]), the policy decisions (`decide`), replies, attributes,
//! the kernel cache and the request gate.

pub mod attr;
mod core;
pub mod ctx;
mod decide;
pub mod forgets;
pub mod gate;
pub mod handlers;
pub mod kcache;
pub mod notes;
pub mod ops;
mod plus;
pub mod reply;

pub use core::{Core, Rq};
