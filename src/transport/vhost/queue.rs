//! The queue types the chain reader and the reply writer share (kept apart so neither
//! imports the other): a popped chain, a queue, and the guest notification.

use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::DescriptorChain;
use vm_memory::{GuestMemoryAtomic, GuestMemoryLoadGuard};

use super::Mem;

/// A chain as popped off a queue, with the guest memory it was popped under.
pub type Chain = DescriptorChain<GuestMemoryLoadGuard<Mem>>;
/// A queue.
pub type Vring = VringRwLock<GuestMemoryAtomic<Mem>>;

/// Signals the guest when its notification settings ask for it.
pub fn notify(vring: &Vring) {
    if vring.needs_notification().unwrap_or(true)
        && let Err(e) = vring.signal_used_queue()
    {
        log::debug!("vhost-user: signalling the guest: {e}");
    }
}
