//! The third transport: fencefs as a vhost-user virtio-fs device (`fencefs vhost-user`),
//! for a VM's hypervisor instead of the host kernel. The vhost-user protocol, guest memory
//! and virtqueues are the rust-vmm crates virtiofsd is built on (`vhost`,
//! `vhost-user-backend`, `virtio-queue`, `vm-memory`); this module only turns a descriptor
//! chain into a FUSE request for the same decoder and handlers the io_uring transport uses
//! ([`super::dispatch`], [`crate::fs::handlers`]) and writes the answer back:
//! - [`backend`]: the device (queues, features, one thread per queue popping chains);
//! - [`chain`]: a chain read into a bounded request, INIT/FORGET/INTERRUPT, the rest decoded;
//! - [`reply`]: the reply traits over a chain's writable descriptors.
//!
//! Invariants: the guest is untrusted. Every guest address and length goes through
//! `vm-memory` (a slice outside the guest's shared memory is an error, never an access);
//! a request is read into a buffer of at most [`MAX_REQUEST`] bytes and its reply sizes are
//! capped at [`MAX_REPLY`]; a malformed chain is returned to the guest unanswered (used
//! length 0) or answered EINVAL, never a panic. Every chain popped is put on the used ring
//! exactly once (its reply, or dropped unanswered: EIO). A request held for an approver
//! keeps only its reply; its queue thread goes on with the next chain. Guest pids mean
//! nothing on the host: requests carry pid 0.

pub mod backend;
pub mod chain;
#[doc(hidden)]
pub mod harness;
pub mod queue;
pub mod reply;
pub mod stats;

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use vhost::vhost_user::Listener;
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::fs::Core;

/// Largest WRITE (and READ) a guest is told to send (INIT's `max_write`, `max_pages`):
/// 1 MiB, as virtiofsd says. Larger than a FUSE mount's ([`crate::transport::MAX_WRITE`]): under
/// virtio every request costs the guest a queue round trip, so fewer, larger ones are
/// faster (a 256 MiB sequential read took 4× virtiofsd's time with 128 KiB requests).
pub const MAX_WRITE: usize = 1 << 20;
/// Largest request read from a chain: a WRITE of [`MAX_WRITE`] bytes with its headers,
/// and room to spare. Larger ones are answered EINVAL without being read.
pub const MAX_REQUEST: usize = MAX_WRITE + 4096;
/// Largest reply payload a request may ask for (read, readdir, xattr sizes are capped).
pub const MAX_REPLY: u32 = 1 << 20;

/// The guest's memory, as the crates map it.
pub type Mem = GuestMemoryMmap<()>;

/// Ends the connection being served (SIGTERM) and stops serving more.
#[derive(Clone, Default)]
pub struct Stop {
    stopped: Arc<AtomicBool>,
    conn: Arc<Mutex<Option<ShutdownHandle>>>,
}

impl Stop {
    /// Stops: the current connection is shut down, no other one is accepted. Returns
    /// whether a connection was being served.
    pub fn stop(&self) -> bool {
        self.stopped.store(true, Ordering::SeqCst);
        match self.conn.lock().as_ref() {
            Some(h) => {
                h.shutdown();
                true
            }
            None => false,
        }
    }

    /// Whether [`Stop::stop`] was called.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

/// How to serve.
pub struct Options {
    /// Request queues (besides the high-priority queue).
    pub request_queues: usize,
    /// Serve the next connection after one ends.
    pub keep_serving: bool,
}

/// Binds the vhost-user socket at `socket` (a stale socket file there is replaced).
pub fn listen(socket: &Path) -> io::Result<Listener> {
    Listener::new(socket, true).map_err(|e| io::Error::other(e.to_string()))
}

/// Serves connections on `listener` until one ends (or, with `keep_serving`, until
/// `stop`).
pub fn serve(
    listener: &mut Listener,
    core: &Arc<Core>,
    opts: &Options,
    stop: &Stop,
) -> Result<(), String> {
    let pool = super::pool::Pool::start().map_err(|e| e.to_string())?;
    let mut n = 0u64;
    loop {
        let backend = backend::FsBackend::new(core.clone(), pool.clone(), opts.request_queues)
            .map_err(|e| format!("vhost-user backend: {e}"))?;
        let mut daemon = VhostUserDaemon::new(
            "fencefs-vhost".into(),
            backend.clone(),
            GuestMemoryAtomic::new(Mem::new()),
        )
        .map_err(|e| format!("vhost-user daemon: {e}"))?;
        if stop.stopped() {
            return Ok(());
        }
        daemon
            .start(listener)
            .map_err(|e| format!("vhost-user: accepting a connection: {e}"))?;
        n += 1;
        log::info!("vhost-user: a VM connected (connection {n})");
        *stop.conn.lock() = daemon.shutdown_handle();
        if stop.stopped() {
            daemon.request_shutdown();
        }
        let r = daemon.wait();
        *stop.conn.lock() = None;
        backend.end();
        // Joins the queue threads: no request of this connection is served any more.
        drop(daemon);
        log::info!("vhost-user: connection {n}: {}", backend.stats().summary());
        let reclaimed = backend.reclaim();
        log::debug!("vhost-user: {reclaimed} exit event descriptors closed");
        forget_connection(core, n);
        match r {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => log::info!("vhost-user: the VM disconnected (connection {n})"),
            Err(e) if stop.stopped() => log::debug!("vhost-user: connection ended: {e}"),
            Err(e) => log::warn!("vhost-user: connection {n} ended: {e}"),
        }
        if !opts.keep_serving || stop.stopped() {
            return Ok(());
        }
        log::info!("vhost-user: waiting for the next connection (--keep-serving)");
    }
}

/// After connection `n` ended: the guest's kernel that held its handles and lookups is
/// gone (a VM that stops sends no RELEASE or FORGET), so they are dropped, and the next
/// guest starts with the tables a fresh daemon has (the root only, no handle). A request
/// of the old connection still on a worker or held for an approver keeps what it uses.
pub fn forget_connection(core: &Core, n: u64) {
    let shared = &core.shared;
    let handles = shared.handles.clear();
    let nodes = shared.inodes.forget_all();
    // The hidden names that guest may have cached went with it.
    let hidden = shared.kcache.take_hidden().len();
    log::info!(
        "vhost-user: connection {n}: closed {handles} handles, forgot {nodes} nodes and {hidden} hidden names"
    );
}

#[cfg(test)]
mod tests;
