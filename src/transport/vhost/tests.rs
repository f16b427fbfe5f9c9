//! Malformed chains and requests, served through the real queue, decoder and handlers over
//! a workspace in a temporary directory: guest memory is a `vm-memory` mapping the test
//! writes descriptors into (virtio-queue's mock queue layout), the used ring is read back.
//! The test reads xattrs back with libc directly (`unsafe`, each with its `// SAFETY:`).
#![allow(unsafe_code)]

use std::time::Duration;

use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::RawDescriptor;
use virtio_queue::desc::split::Descriptor;

use super::chain;
use super::harness::{BUF, MEM};
use crate::transport::abi::{IN_HEADER, OUT_HEADER, op};

/// A guest over a fresh workspace.
struct Guest(super::harness::Guest);

impl Guest {
    fn new(name: &str) -> Guest {
        Guest::with_xattr(name, true)
    }
    fn with_xattr(name: &str, xattr: bool) -> Guest {
        Guest(super::harness::Guest::with_xattr(&Guest::dir(name), xattr))
    }
    fn dir(name: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/tmp/vhost-unit")
            .join(format!("{name}-{}", std::process::id()))
    }
    fn run(&self, descs: &[RawDescriptor]) -> Vec<(u32, u32)> {
        self.0.run(descs, Duration::from_secs(5))
    }
    fn write(&self, at: u64, b: &[u8]) {
        self.0.write(at, b)
    }
    fn read(&self, at: u64, n: usize) -> Vec<u8> {
        self.0.read(at, n)
    }
}

fn d(addr: u64, len: u32, flags: u32, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
}

/// A FUSE request: header (len as given) and arguments.
fn req(opcode: u32, nodeid: u64, len: Option<u32>, args: &[u8]) -> Vec<u8> {
    let total = IN_HEADER + args.len();
    let mut h = vec![0u8; IN_HEADER];
    h[0..4].copy_from_slice(&len.unwrap_or(total as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&opcode.to_ne_bytes());
    h[8..16].copy_from_slice(&99u64.to_ne_bytes());
    h[16..24].copy_from_slice(&nodeid.to_ne_bytes());
    h.extend_from_slice(args);
    h
}

/// The out header's (len, error, unique) at `at`.
fn out(g: &Guest, at: u64) -> (u32, i32, u64) {
    let b = g.read(at, OUT_HEADER);
    (
        u32::from_ne_bytes(b[0..4].try_into().unwrap()),
        i32::from_ne_bytes(b[4..8].try_into().unwrap()),
        u64::from_ne_bytes(b[8..16].try_into().unwrap()),
    )
}

const NEXT: u32 = VRING_DESC_F_NEXT;
const WRITE: u32 = VRING_DESC_F_WRITE;
const REPLY: u64 = BUF + 0x8000;

#[test]
fn a_lookup_over_a_well_formed_chain_is_answered() {
    let g = Guest::new("ok");
    let r = req(op::LOOKUP, 1, None, b"a.txt\0");
    g.write(BUF, &r);
    let used = g.run(&[d(BUF, r.len() as u32, NEXT, 1), d(REPLY, 4096, WRITE, 0)]);
    assert_eq!(
        used,
        vec![(0, (OUT_HEADER + crate::transport::abi::ENTRY_OUT) as u32)]
    );
    assert_eq!(out(&g, REPLY), (144, 0, 99));
    // The entry's attributes: a.txt's size (5) at fuse_entry_out.attr.size.
    let e = g.read(REPLY + OUT_HEADER as u64 + 40 + 8, 8);
    assert_eq!(u64::from_ne_bytes(e.try_into().unwrap()), 5);
}

#[test]
fn descriptors_outside_guest_memory_are_returned_unanswered() {
    let g = Guest::new("oob");
    // The request past the end of guest memory; a reply buffer that runs off its end.
    let used = g.run(&[
        d(MEM as u64 + 0x1000, 64, NEXT, 1),
        d(REPLY, 4096, WRITE, 0),
    ]);
    assert_eq!(used, vec![(0, 0)]);
    let r = req(op::LOOKUP, 1, None, b"a.txt\0");
    g.write(BUF, &r);
    let used = g.run(&[
        d(BUF, r.len() as u32, NEXT, 1),
        d(MEM as u64 - 8, 4096, WRITE, 0),
    ]);
    assert_eq!(used, vec![(0, 0)]);
}

#[test]
fn lengths_that_lie_are_einval_and_short_requests_unanswered() {
    let g = Guest::new("len");
    // The header claims more bytes than the chain has.
    let r = req(op::LOOKUP, 1, Some(4000), b"a.txt\0");
    g.write(BUF, &r);
    let used = g.run(&[d(BUF, r.len() as u32, NEXT, 1), d(REPLY, 4096, WRITE, 0)]);
    assert_eq!(used, vec![(0, OUT_HEADER as u32)]);
    assert_eq!(out(&g, REPLY), (16, -libc::EINVAL, 99));
    // ... or fewer than a header.
    let r = req(op::LOOKUP, 1, Some(8), b"a.txt\0");
    g.write(BUF, &r);
    g.run(&[d(BUF, r.len() as u32, NEXT, 1), d(REPLY, 4096, WRITE, 0)]);
    assert_eq!(out(&g, REPLY), (16, -libc::EINVAL, 99));
    // Fewer bytes than a FUSE header: nothing to answer with.
    let used = g.run(&[d(BUF, 12, NEXT, 1), d(REPLY, 4096, WRITE, 0)]);
    assert_eq!(used, vec![(0, 0)]);
    // A request larger than any the daemon reads: more readable bytes than MAX_REQUEST
    // (two descriptors over the same guest buffer, as a chain may have).
    let r = req(op::WRITE, 1, None, &[0u8; 40]);
    g.write(BUF, &r);
    let half = (super::MAX_REQUEST / 2 + 64) as u32;
    let used = g.run(&[
        d(BUF, r.len() as u32, NEXT, 1),
        d(BUF + 0x1000, half, NEXT, 2),
        d(BUF + 0x1000, half, NEXT, 3),
        d(REPLY, 4096, WRITE, 0),
    ]);
    assert_eq!(used, vec![(0, OUT_HEADER as u32)]);
    assert_eq!(out(&g, REPLY).1, -libc::EINVAL);
    // Argument structs cut short: EINVAL from the decoder.
    let r = req(op::READ, 1, None, &[0u8; 12]);
    g.write(BUF, &r);
    g.run(&[d(BUF, r.len() as u32, NEXT, 1), d(REPLY, 4096, WRITE, 0)]);
    assert_eq!(out(&g, REPLY).1, -libc::EINVAL);
}

#[test]
fn replies_that_do_not_fit_are_eio_or_nothing() {
    let g = Guest::new("room");
    let r = req(op::LOOKUP, 1, None, b"a.txt\0");
    g.write(BUF, &r);
    // Room for the header only: EIO.
    let used = g.run(&[d(BUF, r.len() as u32, NEXT, 1), d(REPLY, 20, WRITE, 0)]);
    assert_eq!(used, vec![(0, OUT_HEADER as u32)]);
    assert_eq!(out(&g, REPLY), (16, -libc::EIO, 99));
    // No writable descriptor at all: used with nothing written.
    let used = g.run(&[d(BUF, r.len() as u32, 0, 0)]);
    assert_eq!(used, vec![(0, 0)]);
}

#[test]
fn a_descriptor_loop_ends_and_reads_ask_no_more_than_the_room() {
    let g = Guest::new("loop");
    let r = req(op::LOOKUP, 1, None, b"a.txt\0");
    g.write(BUF, &r);
    // 0 → 1 → 0 → …: the queue's iterator stops it; whatever it yields is answered or
    // returned, and the daemon goes on.
    let _ = g.run(&[
        d(BUF, r.len() as u32, NEXT, 1),
        d(REPLY, 4096, WRITE | NEXT, 0),
    ]);
    // READDIR asking 4 GiB on a 4 KiB reply buffer: no 4 GiB allocation, an answer
    // within the room (here EBADF: no such handle).
    let mut a = vec![0u8; 40];
    a[16..20].copy_from_slice(&u32::MAX.to_ne_bytes());
    let r = req(op::READDIR, 1, None, &a);
    g.write(BUF, &r);
    let used = g.run(&[d(BUF, r.len() as u32, NEXT, 1), d(REPLY, 4096, WRITE, 0)]);
    assert_eq!(used.len(), 1);
    assert!(used[0].1 <= 4096);
    assert_eq!(out(&g, REPLY).2, 99);
}

#[test]
fn forgets_with_lying_counts_do_not_panic() {
    let g = Guest::new("forget");
    let mut a = vec![0u8; 8];
    a[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
    a.extend_from_slice(&[1u8; 20]); // one entry and a piece
    let r = req(op::BATCH_FORGET, 0, None, &a);
    g.write(BUF, &r);
    assert_eq!(g.run(&[d(BUF, r.len() as u32, 0, 0)]), vec![(0, 0)]);
    let r = req(op::FORGET, 1, None, &[]);
    g.write(BUF, &r);
    assert_eq!(g.run(&[d(BUF, r.len() as u32, 0, 0)]), vec![(0, 0)]);
    // INIT from an old or odd guest: refused, not misread.
    let mut init = vec![0u8; 64];
    init[0..4].copy_from_slice(&7u32.to_ne_bytes());
    init[4..8].copy_from_slice(&20u32.to_ne_bytes());
    let r = req(op::INIT, 0, None, &init);
    g.write(BUF, &r);
    g.run(&[d(BUF, r.len() as u32, NEXT, 1), d(REPLY, 4096, WRITE, 0)]);
    assert_eq!(out(&g, REPLY).1, -libc::EPROTO);
}

/// The workspace root's `user.tag` on the host, if any.
fn host_tag(dir: &std::path::Path) -> Option<Vec<u8>> {
    host_attr(dir, "user.tag")
}

/// Attribute `name` of `dir` on the host, read directly (None: absent).
fn host_attr(dir: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: NUL-terminated path and name; `buf` is writable for its length.
    let len =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

/// A GETXATTR/LISTXATTR/SETXATTR argument block: `size`, 0 (flags/padding), then `rest`.
fn size_and(size: u32, rest: &[u8]) -> Vec<u8> {
    let mut a = size.to_ne_bytes().to_vec();
    a.extend_from_slice(&0u32.to_ne_bytes());
    a.extend_from_slice(rest);
    a
}

/// One request on the root (nodeid 1) with a reply buffer: its out header's error.
fn root_call(g: &Guest, opcode: u32, args: &[u8]) -> i32 {
    let r = req(opcode, 1, None, args);
    g.write(BUF, &r);
    let used = g.run(&[d(BUF, r.len() as u32, NEXT, 1), d(REPLY, 4096, WRITE, 0)]);
    assert_eq!(used.len(), 1, "opcode {opcode} answered once");
    out(g, REPLY).1
}

#[test]
fn no_xattr_answers_every_xattr_request_enosys_and_leaves_the_host_alone() {
    let get = size_and(64, b"user.tag\0");
    let list = size_and(4096, b"");
    let set = size_and(3, b"user.tag\0new");
    let remove = b"user.tag\0".to_vec();
    for xattr in [true, false] {
        let name = format!("xattr-{xattr}");
        let g = Guest::with_xattr(&name, xattr);
        let dir = Guest::dir(&name);
        let p = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated path and name, a 3-byte value.
        let rc = unsafe {
            libc::lsetxattr(
                p.as_ptr(),
                c"user.tag".as_ptr(),
                b"old".as_ptr().cast(),
                3,
                0,
            )
        };
        assert_eq!(rc, 0, "host setxattr: {}", std::io::Error::last_os_error());
        let mut errs = vec![root_call(&g, op::GETXATTR, &get)];
        let value = g.read(REPLY + OUT_HEADER as u64, 3);
        for (o, a) in [
            (op::LISTXATTR, &list),
            (op::SETXATTR, &set),
            (op::REMOVEXATTR, &remove),
        ] {
            errs.push(root_call(&g, o, a));
        }
        if xattr {
            // Served: the value is read, the read-only default refuses the changes.
            assert_eq!((errs[0], errs[1], value), (0, 0, b"old".to_vec()));
            assert!(errs[2] < 0 && errs[3] < 0, "{errs:?}");
            assert!(!errs[2..].contains(&-libc::ENOSYS), "{errs:?}");
        } else {
            assert_eq!(errs, vec![-libc::ENOSYS; 4]);
        }
        assert_eq!(host_tag(&dir), Some(b"old".to_vec()), "xattr {xattr}");
    }
}

/// Root in the guest's kernel is not root on the host: `trusted.*` and `security.*` (but
/// file capabilities, which `allow_setid` decides) are neither changed nor, for
/// `trusted.*`, read or listed, under a policy that allows every write; `user.*` is.
#[test]
fn a_guest_root_changes_no_trusted_or_security_attribute_on_the_host() {
    let dir = Guest::dir("privileged-xattr");
    let policy = "mode = \"danger\"\ndefault = \"write\"\n";
    let g = Guest(super::harness::Guest::with_policy(&dir, policy));
    let p = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: NUL-terminated path and name, a 4-byte value.
    let rc = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            c"trusted.pre".as_ptr(),
            b"host".as_ptr().cast(),
            4,
            0,
        )
    };
    assert_eq!(rc, 0, "host setxattr: {}", std::io::Error::last_os_error());
    let set = |name: &str, value: &[u8]| {
        let mut rest = name.as_bytes().to_vec();
        rest.push(0);
        rest.extend_from_slice(value);
        size_and(value.len() as u32, &rest)
    };
    for name in [
        "trusted.x",
        "trusted.overlay.opaque",
        "security.ima",
        "security.evm",
        "security.SMACK64",
    ] {
        assert_eq!(
            root_call(&g, op::SETXATTR, &set(name, b"\x04\x01y")),
            -libc::EPERM,
            "set {name}"
        );
        assert_eq!(host_attr(&dir, name), None, "{name} on the host");
    }
    for name in ["trusted.pre", "security.ima"] {
        let rest = format!("{name}\0");
        assert_eq!(
            root_call(&g, op::REMOVEXATTR, rest.as_bytes()),
            -libc::EPERM,
            "remove {name}"
        );
    }
    assert_eq!(
        root_call(&g, op::GETXATTR, &size_and(64, b"trusted.pre\0")),
        -libc::ENODATA
    );
    assert_eq!(root_call(&g, op::LISTXATTR, &size_and(4096, b"")), 0);
    let (len, _, _) = out(&g, REPLY);
    let list = g.read(REPLY + OUT_HEADER as u64, len as usize - OUT_HEADER);
    assert!(
        !list.windows(8).any(|w| w == b"trusted."),
        "listed: {list:?}"
    );
    assert_eq!(host_attr(&dir, "trusted.pre"), Some(b"host".to_vec()));
    // What an owner may change reaches the host: the policy allows the writes.
    assert_eq!(root_call(&g, op::SETXATTR, &set("user.tag", b"new")), 0);
    assert_eq!(host_tag(&dir), Some(b"new".to_vec()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn init_answers_only_what_the_guest_offered() {
    let mut init = vec![0u8; 64];
    init[0..4].copy_from_slice(&7u32.to_ne_bytes());
    init[4..8].copy_from_slice(&38u32.to_ne_bytes());
    init[12..16].copy_from_slice(&((1u32 << 0) | (1 << 13) | (1 << 7)).to_ne_bytes());
    let b = chain::init_out(&init).unwrap();
    let flags = u32::from_ne_bytes(b[12..16].try_into().unwrap());
    // ASYNC_READ and DO_READDIRPLUS kept; bit 7 (not ours) dropped.
    assert_eq!(flags, 1 | (1 << 13));
    assert_eq!(
        u32::from_ne_bytes(b[20..24].try_into().unwrap()),
        super::MAX_WRITE as u32
    );
    assert_eq!(u16::from_ne_bytes(b[28..30].try_into().unwrap()), 256);
    assert!(chain::init_out(&init[..6]).is_err());
}

/// Random chains and bytes (xorshift, fixed seed; FENCEFS_VHOST_FUZZ_ITERS for more):
/// the stable-toolchain run of the fuzz target's harness (fuzz/fuzz_targets/vhost.rs).
#[test]
fn random_chains_keep_the_invariants() {
    let g = Guest::new("random");
    let iters: usize = std::env::var("FENCEFS_VHOST_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let opcodes = [
        1u32, 3, 4, 9, 12, 14, 15, 16, 22, 26, 28, 35, 42, 44, 45, 47, 9999,
    ];
    for _ in 0..iters {
        let mut data = vec![0u8; 1 + 64 + (next() % 512) as usize];
        for b in data.iter_mut() {
            *b = next() as u8;
        }
        // A plausible request often enough: a header with a real opcode and length.
        if next() % 2 == 0 {
            let n = (data[0] % 4 + 1) as usize;
            let at = 1 + n * 16;
            let len = (data.len() - at) as u32;
            let op = opcodes[(next() % opcodes.len() as u64) as usize];
            if data.len() >= at + IN_HEADER {
                data[at..at + 4].copy_from_slice(&len.to_le_bytes());
                data[at + 4..at + 8].copy_from_slice(&op.to_le_bytes());
                data[at + 16..at + 24].copy_from_slice(&1u64.to_le_bytes());
            }
            // The first descriptor over the request, the second writable.
            data[1..9].copy_from_slice(&0u64.to_le_bytes());
            data[9..13].copy_from_slice(&len.to_le_bytes());
            data[13..15].copy_from_slice(&1u16.to_le_bytes());
            data[15..17].copy_from_slice(&1u16.to_le_bytes());
        }
        g.0.fuzz(&data);
    }
}

/// The fuzz target's seeds and findings (fuzz/seeds/vhost), each on a fresh guest.
#[test]
fn fuzz_seeds_replay() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/vhost");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let g = Guest::new(&format!("seed{n}"));
        g.0.fuzz(&std::fs::read(&path).unwrap());
        n += 1;
    }
    assert!(n > 0, "no seeds in {}", dir.display());
}
