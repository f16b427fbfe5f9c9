//! The FUSE wire format the io_uring transport reads and writes itself (fuser keeps its own
//! private): request headers and per-opcode argument structs in, reply structs out. Plain
//! byte (de)serialisation in native endianness, as the kernel lays the structs out
//! (include/uapi/linux/fuse.h, protocol 7.42+); no `unsafe`.
//!
//! Invariant: decoding never panics on a short or malformed buffer (missing bytes read
//! as an error, the request answered EINVAL); encoding never writes past the buffer
//! it is given.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType};

/// Opcodes (the ones the daemon serves or answers on purpose).
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const INIT: u32 = 26;
    pub const INTERRUPT: u32 = 36;
}

/// The size of the argument struct that opens a request of `opcode` (what follows it:
/// names, data), for transports that get a request as one run of bytes (a virtqueue).
/// Opcodes with no struct (names only) and unknown ones: 0. SETXATTR: the struct without
/// FUSE_SETXATTR_EXT (never negotiated).
pub fn op_in_len(opcode: u32) -> usize {
    match opcode {
        op::GETATTR | op::MKNOD | op::FSYNC | op::FSYNCDIR | op::CREATE | op::RENAME2 => 16,
        op::MKDIR | op::RENAME | op::LINK | op::OPEN | op::OPENDIR | op::SETXATTR => 8,
        op::GETXATTR | op::LISTXATTR | op::ACCESS | op::FORGET | op::INTERRUPT => 8,
        op::BATCH_FORGET => 8,
        op::READ | op::WRITE | op::READDIR | op::READDIRPLUS => 40,
        op::RELEASE | op::RELEASEDIR | op::FLUSH | op::LSEEK => 24,
        op::FALLOCATE | op::IOCTL => 32,
        op::COPY_FILE_RANGE => 56,
        op::SETATTR => 88,
        op::INIT => 64,
        _ => 0,
    }
}

/// `sizeof(struct fuse_in_header)`.
pub const IN_HEADER: usize = 40;
/// `sizeof(struct fuse_out_header)`.
pub const OUT_HEADER: usize = 16;
/// `sizeof(struct fuse_attr)`.
const ATTR: usize = 88;
/// `sizeof(struct fuse_entry_out)`.
pub const ENTRY_OUT: usize = 40 + ATTR;
/// `sizeof(struct fuse_attr_out)`.
pub const ATTR_OUT: usize = 16 + ATTR;
/// `sizeof(struct fuse_open_out)`.
pub const OPEN_OUT: usize = 16;
/// `sizeof(struct fuse_kstatfs)` (= `fuse_statfs_out`).
pub const STATFS_OUT: usize = 80;
/// `sizeof(struct fuse_dirent)` without the name.
const DIRENT: usize = 24;

/// `setattr` valid bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

/// `FOPEN_PASSTHROUGH`.
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;
/// `FUSE_GETATTR_FH`.
pub const GETATTR_FH: u32 = 1;
/// `FUSE_WRITE_KILL_SUIDGID` (write_flags).
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `FUSE_FSYNC_FDATASYNC`.
pub const FSYNC_FDATASYNC: u32 = 1;

/// A request's argument bytes, read field by field; a short buffer is an error.
#[derive(Clone, Copy)]
pub struct Args<'a>(pub &'a [u8]);

/// A request that does not carry the bytes its opcode needs.
#[derive(Debug)]
pub struct Short;

impl<'a> Args<'a> {
    /// The u32 at `off`.
    pub fn u32(&self, off: usize) -> Result<u32, Short> {
        let b = self.0.get(off..off + 4).ok_or(Short)?;
        Ok(u32::from_ne_bytes(b.try_into().map_err(|_| Short)?))
    }
    /// The u64 at `off`.
    pub fn u64(&self, off: usize) -> Result<u64, Short> {
        let b = self.0.get(off..off + 8).ok_or(Short)?;
        Ok(u64::from_ne_bytes(b.try_into().map_err(|_| Short)?))
    }
    /// The NUL-terminated string at the start, and what follows it.
    pub fn cstr(&self) -> Result<(&'a [u8], Args<'a>), Short> {
        let end = self.0.iter().position(|&b| b == 0).ok_or(Short)?;
        Ok((&self.0[..end], Args(&self.0[end + 1..])))
    }
}

/// The fixed part of every request.
#[derive(Debug, Clone, Copy)]
pub struct InHeader {
    /// Opcode.
    pub opcode: u32,
    /// Request id, echoed in the reply.
    pub unique: u64,
    /// Node the request is about.
    pub nodeid: u64,
    /// Caller uid.
    pub uid: u32,
    /// Caller gid.
    pub gid: u32,
    /// Caller pid.
    pub pid: u32,
}

impl InHeader {
    /// Decodes `struct fuse_in_header`.
    pub fn parse(b: &[u8]) -> Result<InHeader, Short> {
        if b.len() < IN_HEADER {
            return Err(Short);
        }
        let a = Args(b);
        Ok(InHeader {
            opcode: a.u32(4)?,
            unique: a.u64(8)?,
            nodeid: a.u64(16)?,
            uid: a.u32(24)?,
            gid: a.u32(28)?,
            pid: a.u32(32)?,
        })
    }
}

/// Writes `struct fuse_out_header` (error: 0 or a negative errno).
pub fn out_header(b: &mut [u8], len: usize, error: i32, unique: u64) {
    put32(b, 0, len as u32);
    put32(b, 4, error as u32);
    put64(b, 8, unique);
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

/// Seconds (two's complement for times before 1970) and nanoseconds.
fn time(t: &SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                ((-s) as u64, 0)
            } else {
                ((-s - 1) as u64, 1_000_000_000 - n)
            }
        }
    }
}

/// The `mode` of an attribute: file type bits and permissions.
fn mode(kind: FileType, perm: u16) -> u32 {
    let t = match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    };
    t | u32::from(perm)
}

/// Writes `struct fuse_attr` (88 bytes).
fn attr(b: &mut [u8], a: &FileAttr) {
    let (at, atn) = time(&a.atime);
    let (mt, mtn) = time(&a.mtime);
    let (ct, ctn) = time(&a.ctime);
    put64(b, 0, a.ino.0);
    put64(b, 8, a.size);
    put64(b, 16, a.blocks);
    put64(b, 24, at);
    put64(b, 32, mt);
    put64(b, 40, ct);
    put32(b, 48, atn);
    put32(b, 52, mtn);
    put32(b, 56, ctn);
    put32(b, 60, mode(a.kind, a.perm));
    put32(b, 64, a.nlink);
    put32(b, 68, a.uid);
    put32(b, 72, a.gid);
    put32(b, 76, a.rdev);
    put32(b, 80, a.blksize);
    put32(b, 84, 0);
}

/// Writes `struct fuse_entry_out` (128 bytes).
pub fn entry_out(b: &mut [u8], attr_ttl: &Duration, entry_ttl: &Duration, a: &FileAttr) {
    put64(b, 0, a.ino.0);
    put64(b, 8, 0);
    put64(b, 16, entry_ttl.as_secs());
    put64(b, 24, attr_ttl.as_secs());
    put32(b, 32, entry_ttl.subsec_nanos());
    put32(b, 36, attr_ttl.subsec_nanos());
    attr(&mut b[40..40 + ATTR], a);
}

/// Writes `struct fuse_attr_out` (104 bytes).
pub fn attr_out(b: &mut [u8], ttl: &Duration, a: &FileAttr) {
    put64(b, 0, ttl.as_secs());
    put32(b, 8, ttl.subsec_nanos());
    put32(b, 12, 0);
    attr(&mut b[16..16 + ATTR], a);
}

/// Writes `struct fuse_open_out` (16 bytes).
pub fn open_out(b: &mut [u8], fh: u64, flags: u32, backing: Option<u32>) {
    put64(b, 0, fh);
    let flags = if backing.is_some() {
        flags | FOPEN_PASSTHROUGH
    } else {
        flags
    };
    put32(b, 8, flags);
    put32(b, 12, backing.unwrap_or(0));
}

/// Writes a u32 then 4 bytes of padding (`fuse_write_out`, `fuse_getxattr_out`).
pub fn u32_out(b: &mut [u8], v: u32) {
    put32(b, 0, v);
    put32(b, 4, 0);
}

/// Writes a u64 (`fuse_lseek_out`).
pub fn u64_out(b: &mut [u8], v: u64) {
    put64(b, 0, v);
}

/// Writes `struct fuse_statfs_out` (80 bytes).
pub fn statfs_out(b: &mut [u8], s: &libc::statvfs) {
    put64(b, 0, s.f_blocks);
    put64(b, 8, s.f_bfree);
    put64(b, 16, s.f_bavail);
    put64(b, 24, s.f_files);
    put64(b, 32, s.f_ffree);
    put32(b, 40, s.f_bsize as u32);
    put32(b, 44, s.f_namemax as u32);
    put32(b, 48, s.f_frsize as u32);
    b[52..80].fill(0);
}

/// Bytes a `fuse_dirent` with a name of `n` bytes takes (padded to 8).
pub fn dirent_len(n: usize) -> usize {
    (DIRENT + n + 7) & !7
}

/// Bytes a `fuse_direntplus` with a name of `n` bytes takes.
pub fn direntplus_len(n: usize) -> usize {
    ENTRY_OUT + dirent_len(n)
}

/// Writes a `fuse_dirent` (the caller checked the room with [`dirent_len`]).
pub fn dirent(b: &mut [u8], ino: u64, off: u64, kind: FileType, name: &[u8]) {
    put64(b, 0, ino);
    put64(b, 8, off);
    put32(b, 16, name.len() as u32);
    put32(b, 20, mode(kind, 0) >> 12);
    b[DIRENT..DIRENT + name.len()].copy_from_slice(name);
    b[DIRENT + name.len()..dirent_len(name.len())].fill(0);
}

/// Writes a `fuse_direntplus` (the caller checked the room with [`direntplus_len`]).
pub fn direntplus(b: &mut [u8], off: u64, name: &[u8], ttl: &Duration, a: &FileAttr) {
    entry_out(&mut b[..ENTRY_OUT], ttl, ttl, a);
    dirent(&mut b[ENTRY_OUT..], a.ino.0, off, a.kind, name);
}

/// Writes a `fuse_direntplus` without attributes: node id 0 (the kernel then links no
/// dentry and counts no lookup) and the entry's own `d_ino`.
pub fn direntplus_plain(b: &mut [u8], ino: u64, off: u64, kind: FileType, name: &[u8]) {
    b[..ENTRY_OUT].fill(0);
    dirent(&mut b[ENTRY_OUT..], ino, off, kind, name);
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuser::INodeNo;

    fn attr_of(kind: FileType, t: SystemTime) -> FileAttr {
        FileAttr {
            ino: INodeNo(7),
            size: 3,
            blocks: 1,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm: 0o644,
            nlink: 1,
            uid: 1000,
            gid: 100,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    #[test]
    fn short_requests_are_errors_not_panics() {
        assert!(InHeader::parse(&[0u8; 39]).is_err());
        assert!(Args(&[1, 2, 3]).u32(0).is_err());
        assert!(Args(&[1, 2, 3, 4]).u64(0).is_err());
        assert!(Args(b"no-nul").cstr().is_err());
        let (n, rest) = Args(b"a\0bc\0").cstr().unwrap();
        assert_eq!(n, b"a");
        assert_eq!(rest.cstr().unwrap().0, b"bc");
    }

    #[test]
    fn times_before_1970_are_twos_complement_with_positive_nanoseconds() {
        let t = UNIX_EPOCH - Duration::new(1, 250_000_000);
        assert_eq!(time(&t), ((-2i64) as u64, 750_000_000));
        assert_eq!(
            time(&(UNIX_EPOCH - Duration::from_secs(5))),
            ((-5i64) as u64, 0)
        );
        assert_eq!(time(&(UNIX_EPOCH + Duration::new(9, 1))), (9, 1));
    }

    #[test]
    fn entry_and_dirent_layouts() {
        let mut b = [0xffu8; ENTRY_OUT];
        let a = attr_of(FileType::Directory, UNIX_EPOCH + Duration::from_secs(100));
        entry_out(&mut b, &Duration::from_secs(2), &Duration::new(3, 5), &a);
        let r = Args(&b);
        assert_eq!(r.u64(0).unwrap(), 7);
        assert_eq!(r.u64(16).unwrap(), 3);
        assert_eq!(r.u64(24).unwrap(), 2);
        assert_eq!(r.u32(32).unwrap(), 5);
        assert_eq!(r.u64(40 + 32).unwrap(), 100);
        assert_eq!(r.u32(40 + 60).unwrap(), libc::S_IFDIR | 0o644);
        assert_eq!(dirent_len(1), 32);
        assert_eq!(dirent_len(8), 32);
        assert_eq!(dirent_len(9), 40);
        let mut d = [0xffu8; 40];
        dirent(&mut d, 9, 4, FileType::Symlink, b"abcdefghi");
        assert_eq!(Args(&d).u32(20).unwrap(), libc::DT_LNK as u32);
        assert_eq!(&d[24..33], b"abcdefghi");
        assert!(d[33..].iter().all(|&x| x == 0));
    }
}
