//! Requests off the ring: decoded into owned arguments (the entry's buffers are reused for
//! the reply), then handed to the same transport-neutral handlers the `/dev/fuse` path
//! calls ([`crate::fs::handlers`]). Opcodes the daemon does not serve get the answer
//! fuser's loop gives them (ENOSYS; ENOTTY for ioctl), so the kernel learns the same
//! things on either transport.
//!
//! Invariant: every decoded request is answered exactly once; a malformed one with EINVAL.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{Errno, TimeOrNow};

use super::abi::{self, Args, InHeader, Short, fattr, op};
use super::encode::{Dir, Sink};
use super::pool::{Pool, Turn};
use super::ring::Incoming;
use crate::fs::handlers::SetAttr;
use crate::fs::ops::WriteKind;
use crate::fs::reply::{
    AttrReply, CreateReply, DataReply, DirPlusReply, DirReply, EmptyReply, EntryReply, LseekReply,
    OpenReply, Reply, StatfsReply, WriteReply, XattrReply,
};
use crate::fs::{Core, Rq};

/// A request with its arguments, owned.
pub enum Req {
    Lookup(u64, Vec<u8>),
    GetAttr(u64, Option<u64>),
    SetAttr(u64, SetAttr),
    ReadLink(u64),
    Symlink(u64, Vec<u8>, Vec<u8>),
    Mknod(u64, Vec<u8>, u32, u32),
    Mkdir(u64, Vec<u8>, u32),
    Remove(u64, Vec<u8>, bool),
    Rename(u64, Vec<u8>, u64, Vec<u8>, u32),
    Link(u64, u64, Vec<u8>),
    Open(u64, i32),
    Read(u64, u64, u32),
    Write(u64, u64, Vec<u8>, WriteKind),
    StatFs(u64),
    Release(u64, u64),
    Fsync(u64, bool),
    SetXattr(u64, Vec<u8>, Vec<u8>, i32),
    GetXattr(u64, Vec<u8>, u32),
    ListXattr(u64, u32),
    RemoveXattr(u64, Vec<u8>),
    Flush,
    OpenDir(u64),
    ReadDir(u64, u64, u64, u32),
    ReadDirPlus(u64, u64, u64, u32),
    ReleaseDir(u64),
    Access(u64, i32),
    Create(u64, Vec<u8>, u32, i32),
    Fallocate(u64, u64, u64, i32),
    Lseek(u64, i64, i32),
    CopyFileRange(u64, u64, u64, u64, u64),
    Destroy,
    /// Answered with this errno at once.
    Fail(Errno),
}

/// A decoded request: who sent it and what it asks.
pub struct Decoded {
    rq: Rq,
    req: Req,
}

impl Decoded {
    /// Caps the reply sizes the request asks for (read, readdir, xattrs) at `max` bytes: a
    /// transport whose requests are not bounded by a kernel (a guest's virtqueue) must not
    /// let one make the handlers allocate what it names.
    pub fn clamp(&mut self, max: u32) {
        match &mut self.req {
            Req::Read(_, _, size)
            | Req::ReadDir(_, _, _, size)
            | Req::ReadDirPlus(_, _, _, size)
            | Req::GetXattr(_, _, size)
            | Req::ListXattr(_, size) => *size = (*size).min(max),
            _ => {}
        }
    }
}

/// A reply the dispatcher can answer any request with: every reply trait, and a directory
/// reply of a given size made from it (every [`Sink`] is one, through the shared encoder).
pub trait Answer:
    Reply
    + EmptyReply
    + EntryReply
    + AttrReply
    + DataReply
    + OpenReply
    + WriteReply
    + CreateReply
    + StatfsReply
    + XattrReply
    + LseekReply
{
    /// The readdir(plus) reply.
    type Dir: DirReply + DirPlusReply;
    /// A directory reply of at most `size` bytes.
    fn dir(self, size: usize) -> Self::Dir;
}

impl<S: Sink> Answer for S {
    type Dir = Dir<S>;
    fn dir(self, size: usize) -> Dir<S> {
        Dir::new(self, size)
    }
}

/// Who may use the mount besides the kernel's own checks (as fuser's `SessionACL`).
#[derive(Clone, Copy, Debug)]
pub enum Acl {
    /// Everyone (`--allow-other`).
    All,
    /// Only this uid (the mount's owner).
    Owner(u32),
}

fn time(secs: u64, nsec: u32, now: bool) -> TimeOrNow {
    if now {
        TimeOrNow::Now
    } else {
        let s = secs as i64;
        let t = if s >= 0 {
            UNIX_EPOCH + Duration::new(s as u64, nsec)
        } else {
            UNIX_EPOCH - Duration::from_secs(s.unsigned_abs()) + Duration::from_nanos(nsec.into())
        };
        TimeOrNow::SpecificTime(t)
    }
}

fn setattr(a: Args<'_>) -> Result<SetAttr, Short> {
    let valid = a.u32(0)?;
    let has = |bit| valid & bit != 0;
    Ok(SetAttr {
        mode: has(fattr::MODE).then(|| a.u32(68)).transpose()?,
        uid: has(fattr::UID).then(|| a.u32(76)).transpose()?,
        gid: has(fattr::GID).then(|| a.u32(80)).transpose()?,
        size: has(fattr::SIZE).then(|| a.u64(16)).transpose()?,
        atime: if has(fattr::ATIME) {
            Some(time(a.u64(32)?, a.u32(56)?, has(fattr::ATIME_NOW)))
        } else {
            None
        },
        mtime: if has(fattr::MTIME) {
            Some(time(a.u64(40)?, a.u32(60)?, has(fattr::MTIME_NOW)))
        } else {
            None
        },
        fh: has(fattr::FH).then(|| a.u64(8)).transpose()?,
    })
}

/// Decodes one request off the ring.
pub fn decode(inc: &Incoming<'_>, acl: Acl) -> Decoded {
    let h = match InHeader::parse(inc.in_header) {
        Ok(h) => h,
        Err(Short) => {
            return Decoded {
                rq: Rq {
                    uid: 0,
                    gid: 0,
                    pid: 0,
                },
                req: Req::Fail(Errno::EIO),
            };
        }
    };
    let rq = Rq {
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    };
    let req = match decode_args(&h, Args(inc.op_in), Args(inc.payload)) {
        Ok(r) => r,
        Err(Short) => Req::Fail(Errno::EINVAL),
    };
    // Like fuser: without --allow-other only the owner's requests are served, except the
    // ones the kernel may send on its own (no caller uid).
    let req = match (acl, &req) {
        (Acl::Owner(owner), _) if h.uid != owner => match req {
            Req::Read(..)
            | Req::ReadDir(..)
            | Req::ReadDirPlus(..)
            | Req::Write(..)
            | Req::Fsync(..)
            | Req::Release(..)
            | Req::ReleaseDir(..)
            | Req::Destroy => req,
            _ => Req::Fail(Errno::EACCES),
        },
        _ => req,
    };
    Decoded { rq, req }
}

fn name(p: Args<'_>) -> Result<Vec<u8>, Short> {
    Ok(p.cstr()?.0.to_vec())
}

fn decode_args(h: &InHeader, a: Args<'_>, p: Args<'_>) -> Result<Req, Short> {
    let n = h.nodeid;
    Ok(match h.opcode {
        op::LOOKUP => Req::Lookup(n, name(p)?),
        op::GETATTR => {
            let fh = (a.u32(0)? & abi::GETATTR_FH != 0)
                .then(|| a.u64(8))
                .transpose()?;
            Req::GetAttr(n, fh)
        }
        op::SETATTR => Req::SetAttr(n, setattr(a)?),
        op::READLINK => Req::ReadLink(n),
        op::SYMLINK => {
            let (link, rest) = p.cstr()?;
            Req::Symlink(n, link.to_vec(), rest.cstr()?.0.to_vec())
        }
        op::MKNOD => Req::Mknod(n, name(p)?, a.u32(0)?, a.u32(4)?),
        op::MKDIR => Req::Mkdir(n, name(p)?, a.u32(0)?),
        op::UNLINK => Req::Remove(n, name(p)?, false),
        op::RMDIR => Req::Remove(n, name(p)?, true),
        op::RENAME | op::RENAME2 => {
            let flags = if h.opcode == op::RENAME2 {
                a.u32(8)?
            } else {
                0
            };
            let (old, rest) = p.cstr()?;
            Req::Rename(n, old.to_vec(), a.u64(0)?, rest.cstr()?.0.to_vec(), flags)
        }
        op::LINK => Req::Link(a.u64(0)?, n, name(p)?),
        op::OPEN => Req::Open(n, a.u32(0)? as i32),
        op::READ => Req::Read(a.u64(0)?, a.u64(8)?, a.u32(16)?),
        op::WRITE => {
            let size = a.u32(16)? as usize;
            let data = p.0.get(..size).ok_or(Short)?;
            let wflags = a.u32(20)?;
            let kill = wflags & abi::WRITE_KILL_SUIDGID != 0;
            // `flags` (the file's open flags) since protocol 7.9; 0 before.
            let flags = a.u32(32).unwrap_or(0) as i32;
            let kind = WriteKind::from_flags(wflags, kill, flags);
            Req::Write(a.u64(0)?, a.u64(8)?, data.to_vec(), kind)
        }
        op::STATFS => Req::StatFs(n),
        op::RELEASE => Req::Release(n, a.u64(0)?),
        op::FSYNC | op::FSYNCDIR => Req::Fsync(a.u64(0)?, a.u32(8)? & abi::FSYNC_FDATASYNC != 0),
        op::SETXATTR => {
            let size = a.u32(0)? as usize;
            let (xname, rest) = p.cstr()?;
            let value = rest.0.get(..size).ok_or(Short)?;
            Req::SetXattr(n, xname.to_vec(), value.to_vec(), a.u32(4)? as i32)
        }
        op::GETXATTR => Req::GetXattr(n, name(p)?, a.u32(0)?),
        op::LISTXATTR => Req::ListXattr(n, a.u32(0)?),
        op::REMOVEXATTR => Req::RemoveXattr(n, name(p)?),
        op::FLUSH => Req::Flush,
        op::OPENDIR => Req::OpenDir(n),
        op::READDIR => Req::ReadDir(n, a.u64(0)?, a.u64(8)?, a.u32(16)?),
        op::READDIRPLUS => Req::ReadDirPlus(n, a.u64(0)?, a.u64(8)?, a.u32(16)?),
        op::RELEASEDIR => Req::ReleaseDir(a.u64(0)?),
        op::ACCESS => Req::Access(n, a.u32(0)? as i32),
        op::CREATE => Req::Create(n, name(p)?, a.u32(4)?, a.u32(0)? as i32),
        op::FALLOCATE => Req::Fallocate(a.u64(0)?, a.u64(8)?, a.u64(16)?, a.u32(24)? as i32),
        op::LSEEK => Req::Lseek(a.u64(0)?, a.u64(8)? as i64, a.u32(16)? as i32),
        op::COPY_FILE_RANGE => {
            Req::CopyFileRange(a.u64(0)?, a.u64(8)?, a.u64(24)?, a.u64(32)?, a.u64(40)?)
        }
        op::DESTROY => Req::Destroy,
        op::IOCTL => Req::Fail(Errno::ENOTTY),
        // FORGET and BATCH_FORGET arrive on /dev/fuse; anything else is not served.
        op::FORGET | op::BATCH_FORGET => Req::Fail(Errno::ENOSYS),
        _ => Req::Fail(Errno::ENOSYS),
    })
}

/// Runs a decoded request and answers through `reply`: on a worker of `pool` when it
/// waits for the disk by nature (flushes, allocation, copies, truncation) or, on a
/// staged mount served by the daemon, may copy a file up first (an open for writing, a
/// rename, a link, an attribute or xattr change: the copy takes as long as the file is
/// big, and would hold up every other request of the queue's CPU meanwhile), here
/// otherwise (reads and writes through the daemon stay here: a hand-off per request
/// would cost `--revoke` more than it saves; an unstaged mount copies nothing up, and
/// its setattrs and renames are not worth a hand-off either).
pub fn run<R: Answer>(core: &Arc<Core>, pool: &Pool, d: Decoded, reply: R) {
    let inodes = &core.shared.inodes;
    let merged = || inodes.union().is_some();
    // A file already in the upper (made or copied up through the mount: the usual case
    // for an agent's own files) has nothing to copy: served here, no hand-off.
    let copies_up = |ino: u64| merged() && inodes.may_copy_up(ino);
    let slow = match &d.req {
        Req::Fsync(..) | Req::Fallocate(..) | Req::CopyFileRange(..) => true,
        // A truncation may free a big file's blocks: as a setattr of its size, on the pool.
        Req::Open(_, flags) if flags & libc::O_TRUNC != 0 => merged(),
        Req::Open(ino, flags) => flags & libc::O_ACCMODE != libc::O_RDONLY && copies_up(*ino),
        Req::SetAttr(ino, s) => s.size.is_some() || copies_up(*ino),
        Req::Link(ino, ..) | Req::SetXattr(ino, ..) | Req::RemoveXattr(ino, ..) => copies_up(*ino),
        Req::Rename(..) => merged(),
        _ => false,
    };
    if slow {
        let core = core.clone();
        pool.run(d.rq.uid, move |turn| match turn {
            Turn::Run => run_here(&core, d, reply),
            Turn::Busy => reply.error(Errno::EAGAIN),
        });
    } else {
        run_here(core, d, reply)
    }
}

fn run_here<R: Answer>(core: &Arc<Core>, d: Decoded, reply: R) {
    let rq = d.rq;
    match d.req {
        Req::Lookup(p, n) => core.lookup(rq, p, &n, reply),
        Req::GetAttr(i, fh) => core.getattr(rq, i, fh, reply),
        Req::SetAttr(i, s) => core.setattr(rq, i, s, reply),
        Req::ReadLink(i) => core.readlink(rq, i, reply),
        Req::Symlink(p, n, t) => core.symlink(rq, p, &n, &t, reply),
        Req::Mknod(p, n, mode, rdev) => core.mknod(rq, p, &n, mode, rdev, reply),
        Req::Mkdir(p, n, mode) => core.mkdir(rq, p, &n, mode, reply),
        Req::Remove(p, n, dir) => core.remove(rq, p, &n, dir, reply),
        Req::Rename(p, n, np, nn, flags) => core.rename(rq, p, &n, np, &nn, flags, reply),
        Req::Link(i, np, nn) => core.link(rq, i, np, &nn, reply),
        Req::Open(i, flags) => core.open(rq, i, flags, reply),
        Req::Read(fh, off, size) => core.read(rq, fh, off, size, reply),
        Req::Write(fh, off, data, kill) => core.write(rq, fh, off, &data, kill, reply),
        Req::StatFs(i) => core.statfs(rq, i, reply),
        Req::Release(i, fh) => core.release(i, fh, reply),
        Req::Fsync(fh, datasync) => core.fsync(fh, datasync, reply),
        Req::SetXattr(i, n, v, flags) => core.setxattr(rq, i, &n, &v, flags, reply),
        Req::GetXattr(i, n, size) => core.getxattr(rq, i, &n, size, reply),
        Req::ListXattr(i, size) => core.listxattr(rq, i, size, reply),
        Req::RemoveXattr(i, n) => core.removexattr(rq, i, &n, reply),
        Req::Flush => core.flush(reply),
        Req::OpenDir(i) => core.opendir(rq, i, reply),
        Req::ReadDir(i, fh, off, size) => core.readdir(rq, i, fh, off, reply.dir(size as usize)),
        Req::ReadDirPlus(i, fh, off, size) => {
            core.readdirplus(rq, i, fh, off, reply.dir(size as usize))
        }
        Req::ReleaseDir(fh) => core.releasedir(fh, reply),
        Req::Access(i, mask) => core.access(rq, i, mask, reply),
        Req::Create(p, n, mode, flags) => core.create(rq, p, &n, mode, flags, reply),
        Req::Fallocate(fh, off, len, mode) => core.fallocate(rq, fh, off, len, mode, reply),
        Req::Lseek(fh, off, whence) => core.lseek(fh, off, whence, reply),
        Req::CopyFileRange(fh_in, off_in, fh_out, off_out, len) => {
            core.copy_file_range(rq, fh_in, off_in, fh_out, off_out, len, reply)
        }
        Req::Destroy => EmptyReply::ok(reply),
        Req::Fail(e) => reply.error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: u32, nodeid: u64, uid: u32) -> Vec<u8> {
        let mut h = vec![0u8; abi::IN_HEADER];
        h[4..8].copy_from_slice(&opcode.to_ne_bytes());
        h[8..16].copy_from_slice(&77u64.to_ne_bytes());
        h[16..24].copy_from_slice(&nodeid.to_ne_bytes());
        h[24..28].copy_from_slice(&uid.to_ne_bytes());
        h
    }

    fn dec(opcode: u32, op_in: &[u8], payload: &[u8], uid: u32, acl: Acl) -> Decoded {
        let h = header(opcode, 5, uid);
        let mut o = [0u8; 128];
        o[..op_in.len()].copy_from_slice(op_in);
        decode(
            &Incoming {
                in_header: &h,
                op_in: &o,
                payload,
            },
            acl,
        )
    }

    #[test]
    fn names_and_arguments_are_read_where_the_kernel_puts_them() {
        let mut r2 = 9u64.to_ne_bytes().to_vec();
        r2.extend_from_slice(&1u32.to_ne_bytes());
        let d = dec(op::RENAME2, &r2, b"old\0new\0", 0, Acl::All);
        let Req::Rename(p, n, np, nn, flags) = d.req else {
            panic!()
        };
        assert_eq!(
            (p, &n[..], np, &nn[..], flags),
            (5, &b"old"[..], 9, &b"new"[..], 1)
        );
        let d = dec(op::SYMLINK, &[], b"link\0/tar/get\0", 0, Acl::All);
        assert!(matches!(d.req, Req::Symlink(5, ref l, ref t) if l == b"link" && t == b"/tar/get"));
        let mut w = vec![0u8; 40];
        w[0..8].copy_from_slice(&3u64.to_ne_bytes());
        w[8..16].copy_from_slice(&4096u64.to_ne_bytes());
        w[16..20].copy_from_slice(&5u32.to_ne_bytes());
        let d = dec(op::WRITE, &w, b"hello, and more", 0, Acl::All);
        let plain = WriteKind::default();
        assert!(matches!(d.req, Req::Write(3, 4096, ref v, k) if v == b"hello" && k == plain));
        w[20..24].copy_from_slice(&abi::WRITE_KILL_SUIDGID.to_ne_bytes());
        let d = dec(op::WRITE, &w, b"hello", 0, Acl::All);
        assert!(matches!(d.req, Req::Write(3, 4096, _, k) if k.kill_setid && !k.append));
        w[32..36].copy_from_slice(&(libc::O_WRONLY | libc::O_APPEND).to_ne_bytes());
        let d = dec(op::WRITE, &w, b"hello", 0, Acl::All);
        assert!(matches!(d.req, Req::Write(3, 4096, _, k) if k.kill_setid && k.append));
        // A page-cache write (FUSE_WRITE_CACHE) never counts as an append.
        w[20..24].copy_from_slice(&1u32.to_ne_bytes());
        let d = dec(op::WRITE, &w, b"hello", 0, Acl::All);
        assert!(matches!(d.req, Req::Write(3, 4096, _, k) if !k.append));
        // setattr: size and mtime "now", nothing else.
        let mut sa = vec![0u8; 88];
        let valid = fattr::SIZE | fattr::MTIME | fattr::MTIME_NOW;
        sa[0..4].copy_from_slice(&valid.to_ne_bytes());
        sa[16..24].copy_from_slice(&123u64.to_ne_bytes());
        let d = dec(op::SETATTR, &sa, &[], 0, Acl::All);
        let Req::SetAttr(5, s) = d.req else { panic!() };
        assert_eq!(s.size, Some(123));
        assert!(matches!(s.mtime, Some(TimeOrNow::Now)));
        assert!(s.mode.is_none() && s.uid.is_none() && s.atime.is_none() && s.fh.is_none());
    }

    #[test]
    fn malformed_requests_are_einval_and_unknown_ones_enosys() {
        // A name without its NUL, write data shorter than announced.
        assert!(
            matches!(dec(op::LOOKUP, &[], b"abc", 0, Acl::All).req, Req::Fail(e) if e == Errno::EINVAL)
        );
        let mut w = vec![0u8; 40];
        w[16..20].copy_from_slice(&100u32.to_ne_bytes());
        assert!(
            matches!(dec(op::WRITE, &w, b"short", 0, Acl::All).req, Req::Fail(e) if e == Errno::EINVAL)
        );
        assert!(matches!(dec(9999, &[], &[], 0, Acl::All).req, Req::Fail(e) if e == Errno::ENOSYS));
        assert!(
            matches!(dec(op::IOCTL, &[], &[], 0, Acl::All).req, Req::Fail(e) if e == Errno::ENOTTY)
        );
        let short = decode(
            &Incoming {
                in_header: &[0u8; 12],
                op_in: &[],
                payload: &[],
            },
            Acl::All,
        );
        assert!(matches!(short.req, Req::Fail(e) if e == Errno::EIO));
    }

    #[test]
    fn without_allow_other_only_the_owner_is_served() {
        let lookup = |uid| dec(op::LOOKUP, &[], b"a\0", uid, Acl::Owner(0)).req;
        assert!(matches!(lookup(0), Req::Lookup(5, _)));
        assert!(matches!(lookup(1000), Req::Fail(e) if e == Errno::EACCES));
        // The kernel's own requests (no caller) still pass, as with fuser.
        let rel = dec(op::RELEASE, &[0u8; 24], &[], 1000, Acl::Owner(0)).req;
        assert!(matches!(rel, Req::Release(5, 0)));
        assert!(matches!(
            dec(op::LOOKUP, &[], b"a\0", 1000, Acl::All).req,
            Req::Lookup(..)
        ));
    }
}
