//! Replies to a guest's requests: the out header and payload written into the chain's
//! writable descriptors (through `virtio-queue`'s `Writer`, which checks every guest
//! address), the chain put on the used ring and the guest signalled. The chain is the
//! [`Sink`] the shared encoder ([`crate::transport::encode`]) writes every reply trait
//! into, so the handlers answer a guest as they answer the kernel.
//!
//! Invariants: a reply answers its chain exactly once (dropped unanswered: EIO); a reply
//! that does not fit the writable room becomes EIO (or, without room for the out header,
//! a used chain of length 0); it may be sent from any thread (a held request's resume);
//! no open handle keeps a listing or file pages across opens.

use std::io::Write;

use fuser::FopenFlags;
use vhost_user_backend::VringT;
use virtio_queue::Writer;

use super::queue::{Chain, Vring, notify};
use crate::transport::abi::{self, OUT_HEADER};
use crate::transport::encode::Sink;

/// The answer to one chain.
pub struct GuestReply {
    chain: Option<Chain>,
    vring: Vring,
    unique: u64,
}

impl GuestReply {
    /// The reply to the request `unique` that came in `chain`.
    pub fn new(chain: Chain, vring: Vring, unique: u64) -> GuestReply {
        GuestReply {
            chain: Some(chain),
            vring,
            unique,
        }
    }

    /// Payload bytes the writable descriptors hold after the out header.
    pub fn room(&self) -> usize {
        self.chain
            .as_ref()
            .and_then(|c| Writer::<()>::new(c.memory(), c.clone()).ok())
            .map_or(0, |w| w.available_bytes().saturating_sub(OUT_HEADER))
    }

    /// Sends `error` (0 or a negative errno) with the payload `parts`.
    fn put(&mut self, error: i32, parts: &[&[u8]]) {
        let Some(chain) = self.chain.take() else {
            return;
        };
        let head = chain.head_index();
        let len: usize = OUT_HEADER + parts.iter().map(|p| p.len()).sum::<usize>();
        let mem = chain.memory();
        let written = match Writer::<()>::new(mem, chain.clone()) {
            Err(e) => {
                log::warn!("vhost-user: a malformed reply chain: {e}");
                0
            }
            Ok(mut w) => {
                let room = w.available_bytes();
                let mut h = [0u8; OUT_HEADER];
                let ok = if len <= room {
                    abi::out_header(&mut h, len, error, self.unique);
                    w.write_all(&h).is_ok() && parts.iter().all(|p| w.write_all(p).is_ok())
                } else if OUT_HEADER <= room {
                    log::warn!(
                        "vhost-user: a reply of {len} bytes does not fit the guest's {room}"
                    );
                    abi::out_header(&mut h, OUT_HEADER, -libc::EIO, self.unique);
                    w.write_all(&h).is_ok()
                } else {
                    false
                };
                if ok { w.bytes_written() } else { 0 }
            }
        };
        if let Err(e) = self.vring.add_used(head, written as u32) {
            log::warn!("vhost-user: returning descriptor {head}: {e}");
        }
        notify(&self.vring);
    }

    /// Answers with `b` as the whole payload.
    pub fn raw(self, b: &[u8]) {
        self.send(0, &[b])
    }
}

impl Drop for GuestReply {
    fn drop(&mut self) {
        if self.chain.is_some() {
            self.put(-libc::EIO, &[]);
        }
    }
}

impl Sink for GuestReply {
    /// Entries of a readdirplus carry their attributes (as before the shared encoder).
    const PLAIN: bool = false;

    fn send(mut self, error: i32, parts: &[&[u8]]) {
        self.put(error, parts)
    }

    /// No cache kept across opens (a listing or file pages), since nothing can tell a
    /// guest to drop it after a reload or a host change; no kernel passthrough.
    fn open_flags(flags: FopenFlags, _backing: Option<u32>) -> (u32, Option<u32>) {
        let keep = FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE;
        ((flags - keep).bits(), None)
    }
}
