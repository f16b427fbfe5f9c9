//! Host change watching: other processes editing SOURCE show up through the mount within
//! milliseconds, so the kernel may cache names and attributes for long.
//!
//! A fanotify mark on SOURCE's file system reports every create, delete, move, modify and
//! attribute change with the parent directory's file handle and the name. Events for
//! directories the mount knows become invalidations (entry + attributes) sent to the
//! notify thread; events caused by the daemon itself are skipped (the kernel already
//! knows what it asked for). On queue overflow everything known is invalidated.
//!
//! The thread reads at most once per [`COALESCE`]: the events of a burst (5,000 unlinks
//! through the mount queue 5,000, nearly all the daemon's own) wait in the kernel's queue
//! and are read, skipped or turned into one batch together, instead of one wake-up each.
//! A host change is therefore seen at most `COALESCE` later than it would be otherwise;
//! the queue (16,384 events by default) overflows only at millions of events a second.
//! Needs CAP_SYS_ADMIN; without it the caches simply expire after `--cache-ttl`.
#![allow(unsafe_code)]

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use crate::fs::ops::Shared;
use crate::host::union::Union;

/// The shortest time between two reads of the event queue.
pub const COALESCE: Duration = Duration::from_millis(5);

const FAN_Q_OVERFLOW: u64 = 0x4000;
const FAN_MODIFY: u64 = 0x2;
/// create, delete, moved from, moved to.
const DIRENT: u64 = 0x100 | 0x200 | 0x40 | 0x80;
const INFO_FID: u8 = 1;
const INFO_DFID_NAME: u8 = 2;
const INFO_DFID: u8 = 3;
const INFO_OLD_DFID_NAME: u8 = 10;
const INFO_NEW_DFID_NAME: u8 = 12;

/// What the kernel must forget after some host changes.
#[derive(Debug, Default)]
pub struct Batch {
    /// `(directory, name)` entries.
    pub entries: Vec<(u64, Vec<u8>)>,
    /// `(inode, offset)`: `-1` attributes only, `0` attributes and cached pages.
    pub inodes: Vec<(u64, i64)>,
    /// The event queue overflowed: invalidate everything.
    pub everything: bool,
    /// Names directly in SOURCE's root that changed in any way (created, removed, moved,
    /// written, attributes): the workspace layer's file is watched through these.
    pub root_names: Vec<Vec<u8>>,
    /// Some event named an ignore file (`ignore_files`) or a directory on the way to one,
    /// in any directory (known to the mount or not), or a directory moved in: the ignore
    /// files must be found again.
    pub ignore_changed: bool,
}

/// Opens a fanotify group marking SOURCE's whole file system.
pub fn open(source: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let flags = libc::FAN_CLASS_NOTIF
        | libc::FAN_CLOEXEC
        | libc::FAN_REPORT_FID
        | libc::FAN_REPORT_DFID_NAME;
    // SAFETY: plain syscall with constant flags; the result is checked.
    let fd = unsafe { libc::fanotify_init(flags, (libc::O_RDONLY | libc::O_CLOEXEC) as u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor.
    let fan = unsafe { OwnedFd::from_raw_fd(fd) };
    mark(&fan, source)?;
    Ok(fan)
}

/// Marks the whole file system of `dir` (an `O_PATH` handle) in group `fan`: SOURCE's,
/// and that of every root on another file system.
pub fn mark(fan: &OwnedFd, dir: BorrowedFd<'_>) -> io::Result<()> {
    let mask = libc::FAN_CREATE
        | libc::FAN_DELETE
        | libc::FAN_MOVED_FROM
        | libc::FAN_MOVED_TO
        | libc::FAN_MODIFY
        | libc::FAN_ATTRIB
        | libc::FAN_DELETE_SELF
        | libc::FAN_MOVE_SELF
        | libc::FAN_ONDIR;
    let source = dir;
    // fanotify_mark does not take O_PATH handles: reopen the directory for reading.
    let proc_fd = crate::host::sys::open_proc_self_fd()?;
    let dir =
        crate::host::sys::reopen(proc_fd.as_fd(), source, libc::O_RDONLY | libc::O_DIRECTORY)?;
    // SAFETY: valid fds; a null path marks the object behind `dir` (its file system).
    let r = unsafe {
        libc::fanotify_mark(
            fan.as_raw_fd(),
            libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
            mask,
            dir.as_raw_fd(),
            std::ptr::null(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(i..i + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(i..i + 8)?.try_into().ok()?))
}

/// One info record: handle key (`type` ++ bytes) and, for `*_NAME` records, the name.
fn parse_info(rec: &[u8]) -> Option<(u8, Vec<u8>, Option<Vec<u8>>)> {
    let kind = *rec.first()?;
    // header (4) + fsid (8) + handle_bytes (4) + handle_type (4)
    let hb = u32_at(rec, 12)? as usize;
    let ht = rec.get(16..20)?;
    let h = rec.get(20..20 + hb)?;
    let mut key = Vec::with_capacity(4 + hb);
    key.extend_from_slice(ht);
    key.extend_from_slice(h);
    let name = match kind {
        INFO_DFID_NAME | INFO_OLD_DFID_NAME | INFO_NEW_DFID_NAME => {
            let rest = rec.get(20 + hb..)?;
            let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
            Some(rest[..end].to_vec())
        }
        _ => None,
    };
    Some((kind, key, name))
}

/// Turns one buffer of events into a batch of invalidations.
fn decode(buf: &[u8], shared: &Shared, me: u32, pages: bool) -> Batch {
    let mut b = Batch::default();
    let mut seen_e: HashSet<(u64, Vec<u8>)> = HashSet::new();
    let mut seen_i: HashSet<u64> = HashSet::new();
    let snap = shared.policy.get();
    let ignore = snap.policy.ignore_set();
    // Some event may have changed a part of a redirect-walked merged directory: their
    // caches go, once for the whole buffer (a host build elsewhere sends thousands).
    let mut walk_all = false;
    let mut off = 0;
    while off + 24 <= buf.len() {
        let Some(len) = u32_at(buf, off).map(|l| l as usize) else {
            break;
        };
        let meta_len = u16_at(buf, off + 6).unwrap_or(24) as usize;
        let mask = u64_at(buf, off + 8).unwrap_or(0);
        let pid = u32_at(buf, off + 20).unwrap_or(0);
        if len < 24 || off + len > buf.len() {
            break;
        }
        let ev = &buf[off..off + len];
        off += len;
        if mask & FAN_Q_OVERFLOW != 0 {
            b.everything = true;
            // Lost events may have been directories': every merged one is found again.
            if let Some(u) = shared.inodes.union() {
                u.host_changed();
            }
            continue;
        }
        if pid == me {
            continue;
        }
        let mut i = meta_len;
        while i + 4 <= ev.len() {
            let rlen = u16_at(ev, i + 2).unwrap_or(0) as usize;
            if rlen < 4 || i + rlen > ev.len() {
                break;
            }
            if let Some((kind, key, name)) = parse_info(&ev[i..i + rlen]) {
                match (kind, name) {
                    (_, Some(name)) => {
                        let moved_dir_in = mask & libc::FAN_ONDIR != 0 && mask & 0x80 != 0;
                        if !b.ignore_changed
                            && !ignore.names().is_empty()
                            && (moved_dir_in || ignore.affects(&name))
                        {
                            b.ignore_changed = true;
                        }
                        let known = shared.inodes.by_handle(&key);
                        // A directory made, removed or moved on the host in a directory
                        // the mount knows: a staged mount's merged directories may have
                        // gained or lost a part. (The watch covers the whole file system:
                        // a directory made anywhere else — a build's, say — must not throw
                        // away every merged directory's parts. Unless a merged directory
                        // has parts found through a redirect from a lower layer's root:
                        // those lie below SOURCE directories the mount may never have
                        // looked up.)
                        if mask & libc::FAN_ONDIR != 0
                            && mask & DIRENT != 0
                            && let Some(u) = shared.inodes.union()
                            && (known.is_some() || u.follows_redirects())
                        {
                            u.host_changed();
                        }
                        // A name made, removed or moved in a directory the mount does not
                        // know may be one a redirect-walked part of a merged directory
                        // shows: its listing and attributes are dropped too.
                        if mask & DIRENT != 0
                            && known.is_none()
                            && let Some(u) = shared.inodes.union()
                            && u.follows_redirects()
                        {
                            walk_all = true;
                        }
                        if let Some(dir) = known {
                            if dir == crate::host::inode::ROOT && !b.root_names.contains(&name) {
                                b.root_names.push(name.clone());
                            }
                            let dirent = mask & DIRENT != 0;
                            // Offset 0 also drops the kernel's cached listing.
                            if dirent && seen_i.insert(dir) {
                                b.inodes.push((dir, 0));
                            }
                            if let Some(child) = shared.inodes.child(dir, &name)
                                && seen_i.insert(child)
                            {
                                let off = if pages && mask & FAN_MODIFY != 0 {
                                    0
                                } else {
                                    -1
                                };
                                b.inodes.push((child, off));
                            }
                            // Only a name that appeared, vanished or moved is dropped;
                            // content and attribute changes keep the cached name.
                            if dirent && seen_e.insert((dir, name.clone())) {
                                b.entries.push((dir, name));
                            }
                        }
                    }
                    (INFO_FID | INFO_DFID, None) => {
                        // A directory itself deleted or moved away (a merged directory's
                        // part may be that one).
                        if mask & libc::FAN_ONDIR != 0
                            && mask & (libc::FAN_DELETE_SELF | libc::FAN_MOVE_SELF) != 0
                            && let Some(u) = shared.inodes.union()
                        {
                            u.host_changed();
                            walk_all |= u.follows_redirects();
                        }
                        if let Some(node) = shared.inodes.by_handle(&key)
                            && seen_i.insert(node)
                        {
                            b.inodes.push((node, -1));
                        }
                    }
                    _ => {}
                }
            }
            i += rlen;
        }
    }
    if walk_all && let Some(u) = shared.inodes.union() {
        walked(shared, &u, &mut b, (&mut seen_i, &mut seen_e));
    }
    b
}

/// Drops the kernel's listings, attributes and names of the merged directories with
/// parts found through a redirect walked from a lower layer's root
/// ([`Union::walked_nodes`]): their parts may have changed (a SOURCE part replaced gives
/// the directory a new identity, so its name is looked up again).
fn walked(
    shared: &Shared,
    u: &Union,
    b: &mut Batch,
    (seen_i, seen_e): (&mut HashSet<u64>, &mut HashSet<(u64, Vec<u8>)>),
) {
    for ino in u.walked_nodes() {
        if seen_i.insert(ino) {
            b.inodes.push((ino, 0));
            if let Some((parent, name)) = shared.inodes.alias(ino)
                && seen_e.insert((parent, name.clone()))
            {
                b.entries.push((parent, name));
            }
        }
    }
}

/// Reads events forever, handing batches to `send`. `pages`: file contents are cached by
/// the kernel for the mount (no passthrough), so modifications also drop cached pages.
pub fn run(fan: OwnedFd, shared: Arc<Shared>, pages: bool, send: impl Fn(Batch)) {
    let me = std::process::id();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        // SAFETY: valid fd; buffer of the given length.
        let n = unsafe { libc::read(fan.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            log::error!("host change watch stopped: {e}");
            return;
        }
        if n == 0 {
            return;
        }
        let batch = decode(&buf[..n as usize], &shared, me, pages);
        if batch.everything
            || !batch.entries.is_empty()
            || !batch.inodes.is_empty()
            || !batch.root_names.is_empty()
            || batch.ignore_changed
        {
            send(batch);
        }
        // Let the rest of a burst queue up (see the module header).
        std::thread::sleep(COALESCE);
    }
}
