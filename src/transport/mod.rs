//! How requests travel between the kernel and the operations. Two transports, chosen at
//! mount and logged:
//! - `/dev/fuse`: fuser's session loop, one `read(2)` and one `writev(2)` per request;
//! - FUSE over io_uring ([`ring`], Linux 6.14+ with `CONFIG_FUSE_IO_URING` and the fuse
//!   module's `enable_uring`): one queue per CPU, a request fetched and the previous
//!   reply committed in one `io_uring_enter`.
//!
//! Both run the same handlers ([`crate::fs::handlers`]); FORGET, INTERRUPT and the
//! daemon's cache notifications use `/dev/fuse` on both. Invariant: io_uring is only
//! offered to the kernel (FUSE_OVER_IO_URING in INIT) after this process proved it can
//! create the rings, because once offered the kernel holds every request until the rings
//! are registered (or a registration fails, which sends it back to `/dev/fuse`).
//!
//! A third, [`vhost`], serves a VM's virtqueues instead of the kernel (`fencefs vhost-user`),
//! through the same decoder and dispatcher.

pub mod abi;
pub mod devfuse;
pub mod dispatch;
pub mod encode;
pub mod pages;
pub mod pool;
pub mod reply;
pub mod ring;
pub mod vhost;

/// Largest WRITE payload the kernel sends (and the io_uring payload buffer size: with
/// an entry per request that can be held, ~1,040 per CPU, mostly never touched).
pub const MAX_WRITE: usize = 128 << 10;

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::mpsc::channel;

use crate::fs::Core;
use dispatch::Acl;

/// The kernel's switch for FUSE over io_uring.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// What `--transport` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Choice {
    /// io_uring when the kernel offers it, `/dev/fuse` otherwise.
    Auto,
    /// FUSE over io_uring; the mount fails if the kernel cannot do it. As root, turns on
    /// the fuse module's `enable_uring` when it is off.
    IoUring,
    /// The classic `/dev/fuse` read/write loop.
    DevFuse,
}

/// The outcome of the checks made before mounting.
#[derive(Debug)]
pub enum Plan {
    /// Offer io_uring to the kernel at INIT, with one queue per possible CPU (counted
    /// before the daemon confines itself away from /sys).
    Offer {
        /// `num_possible_cpus()`: the kernel wants a registered entry on every queue.
        queues: usize,
    },
    /// `/dev/fuse` only, and why (logged).
    Classic(String),
}

fn uring_enabled() -> io::Result<bool> {
    let v = std::fs::read_to_string(ENABLE_URING)?;
    Ok(v.trim() == "Y" || v.trim() == "1")
}

/// Decides before mounting whether to offer io_uring: the kernel must have it (and it
/// enabled, or `io-uring` asked and we may enable it), and this process must be able to
/// create SQE128 rings. `Err`: `io-uring` was asked for and cannot be had.
pub fn plan(choice: Choice) -> Result<Plan, String> {
    let queues = possible_cpus();
    decide(
        choice,
        uring_enabled().map_err(|e| e.to_string()),
        || {
            std::fs::write(ENABLE_URING, "Y").map_err(|e| e.to_string())?;
            log::info!("transport: turned on FUSE over io_uring ({ENABLE_URING} = Y)");
            Ok(())
        },
        || {
            queues
                .as_ref()
                .map_err(|e| e.clone())
                .and_then(|_| ring::probe().map_err(|e| e.to_string()))
        },
    )
    .map(|p| match (p, queues) {
        (Plan::Offer { .. }, Ok(queues)) => Plan::Offer { queues },
        (p, _) => p,
    })
}

/// [`plan`] without the host: `enabled` is the kernel's switch (Err: no such switch),
/// `enable` turns it on, `probe` creates a ring.
fn decide(
    choice: Choice,
    enabled: Result<bool, String>,
    enable: impl FnOnce() -> Result<(), String>,
    probe: impl FnOnce() -> Result<(), String>,
) -> Result<Plan, String> {
    if choice == Choice::DevFuse {
        return Ok(Plan::Classic("--transport dev-fuse".into()));
    }
    let why_not = match enabled {
        Ok(true) => None,
        Ok(false) if choice == Choice::IoUring => enable()
            .err()
            .map(|e| format!("cannot turn on {ENABLE_URING}: {e}")),
        Ok(false) => Some(format!(
            "the kernel has it switched off; `echo Y > {ENABLE_URING}` (as root) or --transport io-uring turns it on"
        )),
        Err(e) => Some(format!(
            "this kernel has no FUSE over io_uring ({ENABLE_URING}: {e}; needs Linux 6.14+ with CONFIG_FUSE_IO_URING)"
        )),
    };
    let why_not = why_not.or_else(|| {
        probe()
            .err()
            .map(|e| format!("io_uring cannot be used here: {e}"))
    });
    match (why_not, choice) {
        (None, _) => Ok(Plan::Offer { queues: 0 }),
        (Some(w), Choice::IoUring) => Err(format!("--transport io-uring: {w}")),
        (Some(w), _) => Ok(Plan::Classic(w)),
    }
}

/// Ring sizes for a connection whose largest request payload is `max_payload` bytes.
/// (Address space: `depth` × `payload` per queue, mapped without reserving memory.)
pub fn sizes(max_payload: usize) -> ring::Sizes {
    ring::Sizes {
        depth: QUEUE_DEPTH + crate::approvals::MAX_HELD + pool::RING_ROOM,
        // A page multiple: pages of an entry are given back whole (`pages.rs`).
        payload: max_payload.max(8192).next_multiple_of(4096),
    }
}

/// Entries per queue besides those held requests may keep (see [`ring::Sizes::depth`]):
/// the requests held for an approver (at most [`crate::approvals::MAX_HELD`] in all) and
/// one uid's slow requests waiting for a worker ([`pool::RING_ROOM`]), so that neither
/// takes a queue's last entries from everyone else's requests.
const QUEUE_DEPTH: usize = 16;

/// The CPUs the kernel may queue requests for (`num_possible_cpus()`: one queue each).
/// Not guessed when unreadable: too few queues and the kernel never uses the rings,
/// holding every request.
fn possible_cpus() -> Result<usize, String> {
    const POSSIBLE: &str = "/sys/devices/system/cpu/possible";
    let s = std::fs::read_to_string(POSSIBLE).map_err(|e| format!("{POSSIBLE}: {e}"))?;
    parse_possible(&s).ok_or_else(|| format!("{POSSIBLE}: cannot parse {s:?}"))
}

/// The number of CPUs in a list like `0-3,8-11` (the kernel's `num_possible_cpus()`,
/// a weight, not the highest number plus one).
fn parse_possible(s: &str) -> Option<usize> {
    let mut n = 0;
    for r in s.trim().split(',') {
        let (a, b) = match r.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = r.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n += b.checked_sub(a)? + 1;
    }
    (n > 0).then_some(n)
}

/// Starts `queues` queue threads on the connection `dev` and waits until each has
/// registered its entries. On any failure the connection is sent back to `/dev/fuse`
/// ([`ring::abandon`]); `Err` only when even that failed (the kernel then holds every
/// request: the caller must end the daemon, which ends the connection).
pub fn start(
    dev: &OwnedFd,
    core: &Arc<Core>,
    acl: Acl,
    sizes: ring::Sizes,
    queues: usize,
) -> Result<Started, String> {
    // Fault injection for tests/transport.rs: the queues fail after INIT took io_uring.
    let started = if std::env::var_os("FENCEFS_FAULT_URING_QUEUES").is_some() {
        Err(io::Error::other(
            "fault injected (FENCEFS_FAULT_URING_QUEUES)",
        ))
    } else {
        start_queues(dev, core, acl, sizes, queues)
    };
    match started {
        Ok(()) => Ok(Started::Uring),
        Err(e) => match ring::abandon(dev) {
            Ok(()) => Ok(Started::FellBack(e.to_string())),
            Err(e2) => Err(format!(
                "io_uring queues failed ({e}) and the connection could not be sent back to /dev/fuse ({e2})"
            )),
        },
    }
}

/// What [`start`] achieved.
pub enum Started {
    /// Every queue registered.
    Uring,
    /// The queues failed (why); the kernel serves the connection through `/dev/fuse`.
    FellBack(String),
}

fn start_queues(
    dev: &OwnedFd,
    core: &Arc<Core>,
    acl: Acl,
    sizes: ring::Sizes,
    queues: usize,
) -> io::Result<()> {
    let pool = pool::Pool::start()?;
    let (tx, rx) = channel();
    for qid in 0..queues {
        let dev = dev.try_clone()?;
        let core = core.clone();
        let pool = pool.clone();
        let tx = tx.clone();
        std::thread::Builder::new()
            .name(format!("fencefs-uring{qid}"))
            .spawn(move || {
                pin_to_cpu(qid);
                let r = ring::serve(
                    dev,
                    qid as u16,
                    sizes,
                    tx,
                    |inc| dispatch::decode(inc, acl),
                    |d, reply| dispatch::run(&core, &pool, d, reply),
                );
                if let Err(e) = r {
                    log::debug!("io_uring queue {qid} ended: {e}");
                }
            })?;
    }
    drop(tx);
    for _ in 0..queues {
        // Each queue reports once; one that died before reporting leaves a timeout.
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("a queue did not report its registration")),
        }
    }
    Ok(())
}

/// Runs the calling thread on `cpu` (its queue's CPU) when that CPU is online.
fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> Result<(), String> {
        panic!("must not be called")
    }

    #[test]
    fn auto_uses_io_uring_only_when_the_kernel_offers_it() {
        let ok = || Ok(());
        assert!(matches!(
            decide(Choice::Auto, Ok(true), never, ok),
            Ok(Plan::Offer { .. })
        ));
        // Switched off: auto does not flip a system-wide switch, and says how to.
        let Ok(Plan::Classic(why)) = decide(Choice::Auto, Ok(false), never, never) else {
            panic!()
        };
        assert!(why.contains("echo Y >"), "{why}");
        let Ok(Plan::Classic(why)) = decide(Choice::Auto, Err("No such file".into()), never, never)
        else {
            panic!()
        };
        assert!(why.contains("6.14"), "{why}");
        // The kernel offers it but this process cannot create a ring (seccomp, sysctl).
        let Ok(Plan::Classic(why)) = decide(Choice::Auto, Ok(true), never, || Err("EPERM".into()))
        else {
            panic!()
        };
        assert!(why.contains("EPERM"), "{why}");
    }

    #[test]
    fn io_uring_turns_the_switch_on_or_fails_and_dev_fuse_never_asks() {
        let mut turned = false;
        let r = decide(
            Choice::IoUring,
            Ok(false),
            || {
                turned = true;
                Ok(())
            },
            || Ok(()),
        );
        assert!(matches!(r, Ok(Plan::Offer { .. })) && turned);
        let e = decide(Choice::IoUring, Ok(false), || Err("EACCES".into()), never).unwrap_err();
        assert!(
            e.contains("--transport io-uring") && e.contains("EACCES"),
            "{e}"
        );
        let e = decide(Choice::IoUring, Err("ENOENT".into()), never, never).unwrap_err();
        assert!(e.contains("6.14"), "{e}");
        assert!(matches!(
            decide(Choice::DevFuse, Ok(true), never, never),
            Ok(Plan::Classic(_))
        ));
    }

    #[test]
    fn possible_cpus_reads_ranges() {
        assert_eq!(parse_possible("0\n"), Some(1));
        assert_eq!(parse_possible("0-1\n"), Some(2));
        assert_eq!(parse_possible("0-3,8-11"), Some(8));
        assert_eq!(parse_possible("0,2,4-5"), Some(4));
        assert_eq!(parse_possible("garbage"), None);
    }
}
