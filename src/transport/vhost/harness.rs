//! A guest without a VM, for the unit tests and the fuzz target: guest memory is a
//! `vm-memory` mapping with one split queue laid out at its start (descriptor table,
//! available ring, used ring), the workspace a host directory, the session the real one.
//! [`Guest::run`] writes descriptors, makes the chain available, serves it through
//! [`super::chain::serve`] and reads the used ring back. Not part of the daemon.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost_user_backend::{VringRwLock, VringT};
use virtio_queue::QueueOwnedT;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic};

use super::Mem;
use super::chain::{self, Session};
use crate::fs::ops::{Settings, Shared, Stats};
use crate::transport::devfuse::FenceFs;

/// Descriptors in the queue.
pub const QSIZE: u16 = 16;
/// Where tests put request and reply buffers (past the queue's rings).
pub const BUF: u64 = 0x1_0000;
/// The guest memory's size.
pub const MEM: usize = 0x10_0000;
const DESC: u64 = 0;
const AVAIL: u64 = 16 * QSIZE as u64;
/// After the available ring (flags, idx, ring, used_event), aligned to 4.
const USED: u64 = (AVAIL + 4 + 2 * QSIZE as u64 + 2 + 3) & !3;

/// A session over `dir` (created, with `a.txt` = "hello"), default policy (read-only);
/// `xattr`: extended attributes served (false: `--no-xattr`).
pub fn session(dir: &Path, xattr: bool) -> Session {
    session_with(dir, xattr, None)
}

/// [`session`] under `policy` (TOML) when given.
pub fn session_with(dir: &Path, xattr: bool, policy: Option<&str>) -> Session {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("a.txt"), b"hello").unwrap();
    let policy = match policy {
        Some(t) => crate::policy::Policy::parse(t, "test.toml").unwrap(),
        None => crate::reload::load(&[], None).unwrap(),
    };
    let root = crate::host::sys::open_root(dir).unwrap();
    let shared = Arc::new(Shared {
        inodes: crate::host::inode::Inodes::new(root, 64).unwrap(),
        handles: crate::host::handle::Handles::new(64, 64, 1024, 1024),
        policy: crate::reload::PolicyStore::new(policy, Vec::new(), None, None),
        audit: None,
        settings: Settings {
            revoke: false,
            ttl: Duration::from_secs(1),
            passthrough: false,
            learn: None,
            xattr,
        },
        as_root: false,
        uids: crate::idmap::IdMap::parse(&[]).unwrap(),
        gids: crate::idmap::IdMap::parse(&[]).unwrap(),
        kcache: Default::default(),
        gate: None,
        bases: None,
        approvals: Arc::new(crate::approvals::Approvals::new(4, Duration::from_secs(1))),
        stats: Stats::default(),
        programs: Default::default(),
        notes: Default::default(),
        saves: Default::default(),
    });
    let core = FenceFs::new(shared).core();
    Session::new(core, crate::transport::pool::Pool::start().unwrap())
}

/// A guest with one queue.
pub struct Guest {
    mem: GuestMemoryAtomic<Mem>,
    vring: chain::Vring,
    s: Session,
}

impl Guest {
    /// A guest whose workspace is `dir`.
    pub fn new(dir: &Path) -> Guest {
        Guest::with_xattr(dir, true)
    }

    /// A guest whose workspace is `dir`, extended attributes served or not (`--no-xattr`).
    pub fn with_xattr(dir: &Path, xattr: bool) -> Guest {
        Guest::with_session(session(dir, xattr))
    }

    /// A guest whose workspace is `dir`, under `policy` (TOML).
    pub fn with_policy(dir: &Path, policy: &str) -> Guest {
        Guest::with_session(session_with(dir, true, Some(policy)))
    }

    fn with_session(s: Session) -> Guest {
        let mem = GuestMemoryAtomic::new(Mem::from_ranges(&[(GuestAddress(0), MEM)]).unwrap());
        let vring = VringRwLock::new(mem.clone(), QSIZE).unwrap();
        vring.set_queue_size(QSIZE);
        vring.set_queue_info(DESC, AVAIL, USED).unwrap();
        vring.set_queue_ready(true);
        vring.set_enabled(true);
        Guest { mem, vring, s }
    }

    /// Puts `descs` at the start of the descriptor table, makes head 0 available, serves
    /// what the queue yields (waiting up to `wait` for replies from other threads) and
    /// returns the used ring's new (id, len) pairs.
    pub fn run(&self, descs: &[RawDescriptor], wait: Duration) -> Vec<(u32, u32)> {
        let g = self.mem.memory();
        let u16_at = |a: u64| g.read_obj::<u16>(GuestAddress(a)).unwrap();
        let before = u16_at(USED + 2);
        // The whole table: no descriptor of an earlier run stays reachable.
        let zero = RawDescriptor::from(Descriptor::new(0, 0, 0, 0));
        for i in 0..QSIZE as usize {
            let d = descs.get(i).copied().unwrap_or(zero);
            g.write_obj(d, GuestAddress(DESC + 16 * i as u64)).unwrap();
        }
        let idx = u16_at(AVAIL + 2);
        g.write_obj(0u16, GuestAddress(AVAIL + 4 + 2 * u64::from(idx % QSIZE)))
            .unwrap();
        g.write_obj(idx.wrapping_add(1), GuestAddress(AVAIL + 2))
            .unwrap();
        let chains: Vec<_> = {
            let mut v = self.vring.get_mut();
            match v.get_queue_mut().iter(self.mem.memory()) {
                Ok(it) => it.collect(),
                Err(_) => Vec::new(),
            }
        };
        for c in chains {
            chain::serve(&self.s, c, &self.vring, false);
        }
        let deadline = Instant::now() + wait;
        while u16_at(USED + 2) == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let after = u16_at(USED + 2);
        (before..after)
            .map(|i| {
                let at = USED + 4 + 8 * u64::from(i % QSIZE);
                let id = g.read_obj::<u32>(GuestAddress(at)).unwrap();
                let len = g.read_obj::<u32>(GuestAddress(at + 4)).unwrap();
                (id, len)
            })
            .collect()
    }

    /// Writes `b` into guest memory at `at` (clipped to the memory).
    pub fn write(&self, at: u64, b: &[u8]) {
        let end = (at as usize).saturating_add(b.len()).min(MEM);
        let n = end.saturating_sub(at as usize);
        if n > 0 {
            self.mem
                .memory()
                .write_slice(&b[..n], GuestAddress(at))
                .unwrap();
        }
    }

    /// `n` bytes of guest memory at `at`.
    pub fn read(&self, at: u64, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.mem
            .memory()
            .read_slice(&mut b, GuestAddress(at))
            .unwrap();
        b
    }

    /// Runs fuzz input: up to four descriptors (16 bytes each: addr, len, flags, next as
    /// the guest writes them), then guest memory content at [`BUF`]. Panics only on a
    /// violated invariant (a chain not put back exactly once, a used length past the
    /// writable room).
    pub fn fuzz(&self, data: &[u8]) {
        let n = (data.first().copied().unwrap_or(0) % 4 + 1) as usize;
        let rest = data.get(1..).unwrap_or_default();
        let mut descs = Vec::new();
        let mut indirect = false;
        for i in 0..n {
            let raw = rest.get(i * 16..i * 16 + 16);
            let mut b = [0u8; 16];
            if let Some(r) = raw {
                b.copy_from_slice(r);
            }
            let addr = u64::from_le_bytes(b[0..8].try_into().unwrap());
            let len = u32::from_le_bytes(b[8..12].try_into().unwrap());
            let flags = u16::from_le_bytes(b[12..14].try_into().unwrap());
            let next = u16::from_le_bytes(b[14..16].try_into().unwrap());
            // Mostly inside guest memory, as a real guest's would be; sometimes not.
            let addr = if flags & 0x8000 != 0 {
                addr
            } else {
                BUF + addr % (MEM as u64 - BUF)
            };
            // NEXT and WRITE; INDIRECT only when asked (its table is not checked below).
            let keep = if flags & 0x4000 != 0 { 0x7 } else { 0x3 };
            indirect |= flags & keep & 0x4 != 0;
            descs.push(RawDescriptor::from(Descriptor::new(
                addr,
                len,
                flags & keep,
                next,
            )));
        }
        self.write(BUF, rest.get(n * 16..).unwrap_or_default());
        let used = self.run(&descs, Duration::from_millis(200));
        assert!(used.len() <= 1, "one chain, used {} times", used.len());
        // The writable bytes of the chain as the queue walks it: from head 0 along `next`,
        // at most QSIZE descriptors (a chain may loop over the same buffers).
        let mut writable = 0u64;
        let mut i = 0usize;
        for _ in 0..QSIZE {
            let Some(d) = descs.get(i).map(|d| Descriptor::from(*d)) else {
                break;
            };
            if d.flags() & 2 != 0 {
                writable += u64::from(d.len());
            }
            if d.flags() & 1 == 0 || d.next() >= QSIZE {
                break;
            }
            i = usize::from(d.next());
        }
        for (_, len) in used {
            if indirect {
                continue;
            }
            assert!(
                u64::from(len) <= writable,
                "used {len} > writable {writable}"
            );
        }
    }
}
