//! Replies to requests that came on a ring: written in place into the request's own
//! entry (out header, payload, `payload_sz`), then handed back to the queue thread to
//! commit (`Queue::answered`). The entry is the [`Sink`] the shared encoder
//! ([`super::encode`]) writes every reply trait into, so the handlers answer ring requests
//! exactly as they answer fuser's.
//!
//! Invariant: a reply owns its entry from creation until it answers (or is dropped, which
//! answers EIO); it answers exactly once. Its `unsafe` is the entry buffer access that
//! ownership makes exclusive.
#![allow(unsafe_code)]

use fuser::FopenFlags;

use super::abi::{self, OUT_HEADER};
use super::encode::Sink;
use super::ring::ENT_IN_OUT;
pub use super::ring::RingReply;

impl RingReply {
    /// Writes the out header for `len` payload bytes already in place and queues the commit.
    fn finish(mut self, error: i32, len: usize) {
        self.sent = true;
        // SAFETY: this reply owns the entry until `answered`.
        let (h, _) = unsafe { self.q.bufs(self.slot) };
        abi::out_header(&mut h[..OUT_HEADER], OUT_HEADER + len, error, self.unique);
        h[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(len as u32).to_ne_bytes());
        self.q.answered(self.slot);
    }

    /// The payload buffer to write a reply into.
    fn payload(&mut self) -> &mut [u8] {
        // SAFETY: this reply owns the entry.
        unsafe { self.q.bufs(self.slot).1 }
    }
}

impl Drop for RingReply {
    fn drop(&mut self) {
        if !self.sent {
            self.sent = true;
            // SAFETY: this reply still owns the entry.
            let (h, _) = unsafe { self.q.bufs(self.slot) };
            abi::out_header(&mut h[..OUT_HEADER], OUT_HEADER, -libc::EIO, self.unique);
            h[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&0u32.to_ne_bytes());
            self.q.answered(self.slot);
        }
    }
}

impl Sink for RingReply {
    const PLAIN: bool = true;

    /// Copies the parts into the entry's payload (EIO if the buffer cannot hold them).
    fn send(mut self, error: i32, parts: &[&[u8]]) {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        let p = self.payload();
        if n > p.len() {
            log::warn!("io_uring reply of {n} bytes does not fit the ring buffer");
            return self.finish(-libc::EIO, 0);
        }
        let mut at = 0;
        for part in parts {
            p[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        self.finish(error, n)
    }

    fn open_flags(flags: FopenFlags, backing: Option<u32>) -> (u32, Option<u32>) {
        (flags.bits(), backing)
    }

    fn in_place(&mut self) -> Option<&mut [u8]> {
        Some(self.payload())
    }

    fn send_in_place(self, len: usize) {
        self.finish(0, len)
    }
}
