//! What an operation answers, whatever carries it to the kernel: one trait per kind of
//! reply, implemented by fuser's reply types (the `/dev/fuse` transport) and by the
//! io_uring transport's ring entries. The handlers in [`super::handlers`] are written
//! against these traits only, so both transports run the very same code.
//!
//! Invariant (as with fuser): a reply is consumed by exactly one answer.

use std::time::Duration;

use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};

use super::ops::Error;

/// Every reply can carry an errno.
pub trait Reply: Send + 'static {
    /// Answers with an error.
    fn error(self, e: Errno);
}

/// A reply without data.
pub trait EmptyReply: Reply {
    /// Success.
    fn ok(self);
}

/// A name → node reply (lookup, mkdir, mknod, symlink, link).
pub trait EntryReply: Reply {
    /// The entry, with its cache lifetimes (node id 0: a negative entry).
    fn entry(self, attr_ttl: &Duration, entry_ttl: &Duration, attr: &FileAttr);
}

/// An attributes reply (getattr, setattr).
pub trait AttrReply: Reply {
    /// The attributes and how long the kernel may keep them.
    fn attr(self, ttl: &Duration, attr: &FileAttr);
}

/// A bytes reply (read, readlink).
pub trait DataReply: Reply {
    /// The bytes.
    fn data(self, data: &[u8]);
}

/// An open reply (open, opendir).
pub trait OpenReply: Reply {
    /// The handle; `backing`: the kernel passthrough backing id the handle's I/O goes to.
    fn opened(self, fh: u64, flags: FopenFlags, backing: Option<u32>);
}

/// A byte-count reply (write, copy_file_range).
pub trait WriteReply: Reply {
    /// Bytes written.
    fn written(self, n: u32);
}

/// A create reply: an entry and an open handle.
pub trait CreateReply: Reply {
    /// The new entry and its handle (see [`OpenReply::opened`]).
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        fh: u64,
        flags: FopenFlags,
        backing: Option<u32>,
    );
}

/// A statfs reply.
pub trait StatfsReply: Reply {
    /// The host file system's figures.
    fn statfs(self, s: &libc::statvfs);
}

/// A getxattr/listxattr reply.
pub trait XattrReply: Reply {
    /// The size the caller needs (it asked with size 0).
    fn size(self, n: u32);
    /// The value or the list.
    fn data(self, d: &[u8]);
}

/// An lseek reply.
pub trait LseekReply: Reply {
    /// The new offset.
    fn offset(self, o: i64);
}

/// A readdir reply, filled entry by entry.
pub trait DirReply: Reply {
    /// Adds an entry; true when the buffer is full (the entry was not added).
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &[u8]) -> bool;
    /// Sends the entries added.
    fn ok(self);
}

/// A readdirplus reply, filled entry by entry.
pub trait DirPlusReply: Reply {
    /// Adds an entry with its attributes (node id `attr.ino`); true when full.
    fn add(&mut self, offset: u64, name: &[u8], ttl: &Duration, attr: &FileAttr) -> bool;
    /// Whether this reply can carry an entry without attributes (node id 0, the real
    /// `d_ino`: a plain directory entry to the kernel). fuser's cannot: it writes the
    /// attributes' inode as both.
    fn can_plain(&self) -> bool {
        false
    }
    /// Adds an entry without attributes (see `can_plain`, the only case it is called
    /// in); true when full.
    fn add_plain(&mut self, ino: u64, offset: u64, kind: FileType, name: &[u8]) -> bool {
        let _ = (ino, offset, kind, name);
        true
    }
    /// Sends the entries added.
    fn ok(self);
}

// ------------------------------------------------------------------ fuser (/dev/fuse)

macro_rules! fuser_error {
    ($($t:ty),*) => {$(
        impl Reply for $t {
            fn error(self, e: Errno) {
                <$t>::error(self, e)
            }
        }
    )*};
}

fuser_error!(
    fuser::ReplyEmpty,
    fuser::ReplyEntry,
    fuser::ReplyAttr,
    fuser::ReplyData,
    fuser::ReplyOpen,
    fuser::ReplyWrite,
    fuser::ReplyCreate,
    fuser::ReplyStatfs,
    fuser::ReplyXattr,
    fuser::ReplyLseek,
    fuser::ReplyDirectory,
    fuser::ReplyDirectoryPlus
);

impl EmptyReply for fuser::ReplyEmpty {
    fn ok(self) {
        fuser::ReplyEmpty::ok(self)
    }
}

impl EntryReply for fuser::ReplyEntry {
    fn entry(self, attr_ttl: &Duration, entry_ttl: &Duration, attr: &FileAttr) {
        self.entry_with_ttls(attr_ttl, entry_ttl, attr, GEN)
    }
}

impl AttrReply for fuser::ReplyAttr {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        fuser::ReplyAttr::attr(self, ttl, attr)
    }
}

impl DataReply for fuser::ReplyData {
    fn data(self, data: &[u8]) {
        fuser::ReplyData::data(self, data)
    }
}

impl OpenReply for fuser::ReplyOpen {
    #[allow(unsafe_code)] // fuser's `wrap_backing` (SAFETY below)
    fn opened(self, fh: u64, flags: FopenFlags, backing: Option<u32>) {
        match backing {
            Some(id) => {
                // SAFETY: the id is open on this connection and the handle's
                // `BackingFile` keeps it open; `into_raw` below hands it back unclosed.
                let b = unsafe { self.wrap_backing(id) };
                self.opened_passthrough(FileHandle(fh), flags, &b);
                let _ = b.into_raw();
            }
            None => fuser::ReplyOpen::opened(self, FileHandle(fh), flags),
        }
    }
}

impl WriteReply for fuser::ReplyWrite {
    fn written(self, n: u32) {
        fuser::ReplyWrite::written(self, n)
    }
}

impl CreateReply for fuser::ReplyCreate {
    #[allow(unsafe_code)] // fuser's `wrap_backing` (SAFETY below)
    fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        fh: u64,
        flags: FopenFlags,
        backing: Option<u32>,
    ) {
        match backing {
            Some(id) => {
                // SAFETY: as in `OpenReply for ReplyOpen`.
                let b = unsafe { self.wrap_backing(id) };
                self.created_passthrough(ttl, attr, GEN, FileHandle(fh), flags, &b);
                let _ = b.into_raw();
            }
            None => fuser::ReplyCreate::created(self, ttl, attr, GEN, FileHandle(fh), flags),
        }
    }
}

impl StatfsReply for fuser::ReplyStatfs {
    fn statfs(self, s: &libc::statvfs) {
        fuser::ReplyStatfs::statfs(
            self,
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        )
    }
}

impl XattrReply for fuser::ReplyXattr {
    fn size(self, n: u32) {
        fuser::ReplyXattr::size(self, n)
    }
    fn data(self, d: &[u8]) {
        fuser::ReplyXattr::data(self, d)
    }
}

impl LseekReply for fuser::ReplyLseek {
    fn offset(self, o: i64) {
        fuser::ReplyLseek::offset(self, o)
    }
}

impl DirReply for fuser::ReplyDirectory {
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &[u8]) -> bool {
        use std::os::unix::ffi::OsStrExt;
        fuser::ReplyDirectory::add(
            self,
            INodeNo(ino),
            offset,
            kind,
            std::ffi::OsStr::from_bytes(name),
        )
    }
    fn ok(self) {
        fuser::ReplyDirectory::ok(self)
    }
}

impl DirPlusReply for fuser::ReplyDirectoryPlus {
    fn add(&mut self, offset: u64, name: &[u8], ttl: &Duration, attr: &FileAttr) -> bool {
        use std::os::unix::ffi::OsStrExt;
        fuser::ReplyDirectoryPlus::add(
            self,
            attr.ino,
            offset,
            std::ffi::OsStr::from_bytes(name),
            ttl,
            attr,
            GEN,
        )
    }
    fn ok(self) {
        fuser::ReplyDirectoryPlus::ok(self)
    }
}

pub(crate) fn errno(e: Error) -> Errno {
    Errno::from_i32(e.0)
}

/// Attributes of a negative entry (node id 0).
pub(crate) fn negative_attr() -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: std::time::UNIX_EPOCH,
        mtime: std::time::UNIX_EPOCH,
        ctime: std::time::UNIX_EPOCH,
        crtime: std::time::UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

pub(crate) const GEN: Generation = Generation(0);
