//! The virtio-fs device as `vhost-user-backend` sees it: queue 0 is the high-priority queue
//! (FORGET), queues 1.. the request queues; each queue has its own thread, which pops
//! every available chain and serves it ([`super::chain::serve`]).
//!
//! Invariants: a queue thread never waits on anything but the host call of the request
//! in hand (slow calls go to the shared worker pool, held requests to the approvals
//! table); errors a guest can cause are logged and the queue goes on (an `Err` out of
//! `handle_event` would end the queue's thread); the chains are popped under the vring's
//! lock and served after it is released, so replies from other threads are not held up.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueOwnedT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};

use super::Mem;
use super::chain::{self, Session};
use crate::fs::Core;
use crate::host::sys;
use crate::transport::pool::Pool;

/// Descriptors per queue the device accepts (the guest picks up to this).
const QUEUE_SIZE: usize = 1024;

/// The device; cloned into each queue thread.
#[derive(Clone)]
pub struct FsBackend {
    inner: Arc<Inner>,
}

struct Inner {
    session: Arc<Session>,
    request_queues: usize,
    mem: Mutex<Option<GuestMemoryAtomic<Mem>>>,
    event_idx: AtomicBool,
    /// One exit event per queue thread.
    exits: Vec<(EventConsumer, EventNotifier)>,
    /// The exit event consumers handed to `vhost-user-backend` (queue thread, descriptor
    /// number): it keeps only their numbers and never closes them (0.24's
    /// `VringEpollHandler::new` takes `into_raw_fd`), so [`FsBackend::reclaim`] does.
    handed: Mutex<Vec<(usize, RawFd)>>,
}

impl FsBackend {
    /// A device with `request_queues` request queues serving `core`.
    pub fn new(core: Arc<Core>, pool: Pool, request_queues: usize) -> io::Result<FsBackend> {
        let exits = (0..=request_queues)
            .map(|_| new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(FsBackend {
            inner: Arc::new(Inner {
                session: Arc::new(Session::new(core, pool)),
                request_queues,
                mem: Mutex::new(None),
                event_idx: AtomicBool::new(false),
                exits,
                handed: Mutex::new(Vec::new()),
            }),
        })
    }

    /// What the guest asked for on this connection.
    pub fn stats(&self) -> &super::stats::Stats {
        &self.inner.session.stats
    }

    /// Ends the queue threads (after the connection is gone).
    pub fn end(&self) {
        for (_, n) in &self.inner.exits {
            let _ = n.notify();
        }
    }

    /// Closes the exit event descriptors the crate leaked, once its queue threads are
    /// joined (the daemon dropped): without this, each connection served would keep one
    /// descriptor per queue. Returns how many were closed.
    pub fn reclaim(&self) -> usize {
        let handed = std::mem::take(&mut *self.inner.handed.lock());
        handed
            .into_iter()
            .filter(|&(i, fd)| {
                self.inner
                    .exits
                    .get(i)
                    .is_some_and(|(c, _)| sys::close_leaked_dup(c, fd))
            })
            .count()
    }

    /// Pops and serves every chain available on `vring`.
    fn drain(&self, vring: &VringRwLock<GuestMemoryAtomic<Mem>>, hiprio: bool) -> io::Result<()> {
        let Some(mem) = self.inner.mem.lock().clone() else {
            return Ok(());
        };
        let event_idx = self.inner.event_idx.load(Ordering::Relaxed);
        loop {
            if event_idx {
                let _ = vring.disable_notification();
            }
            let chains: Vec<_> = {
                let mut g = vring.get_mut();
                match g.get_queue_mut().iter(mem.memory()) {
                    Ok(it) => it.collect(),
                    Err(e) => {
                        log::warn!("vhost-user: queue not usable: {e}");
                        return Ok(());
                    }
                }
            };
            for c in chains {
                chain::serve(&self.inner.session, c, vring, hiprio);
            }
            if !event_idx {
                return Ok(());
            }
            match vring.enable_notification() {
                Ok(true) => continue,
                Ok(false) => return Ok(()),
                Err(e) => {
                    log::warn!("vhost-user: enabling notifications: {e}");
                    return Ok(());
                }
            }
        }
    }
}

impl VhostUserBackend for FsBackend {
    type Bitmap = ();
    type Vring = VringRwLock<GuestMemoryAtomic<Mem>>;

    fn num_queues(&self) -> usize {
        1 + self.inner.request_queues
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.inner.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<Mem>) -> io::Result<()> {
        *self.inner.mem.lock() = Some(mem);
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.num_queues()).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) = self.inner.exits.get(thread_index)?;
        let (c, n) = (c.try_clone().ok()?, n.try_clone().ok()?);
        self.inner.handed.lock().push((thread_index, c.as_raw_fd()));
        Some((c, n))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Self::Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Ok(());
        }
        // One queue per thread: the thread's only vring; thread 0 has the hiprio queue.
        let Some(vring) = vrings.get(device_event as usize) else {
            return Ok(());
        };
        self.drain(vring, thread_id == 0)
    }
}
