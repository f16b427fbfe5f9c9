//! Conversions between host `stat`, FUSE attributes and open flags, and which extended
//! attribute names the mount mirrors.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};

use crate::policy::Need;

/// FUSE's marker for an exec-open (`FMODE_EXEC`) in the open flags.
pub const FMODE_EXEC: i32 = 0x20;

/// `S_IFMT` bits → FUSE file type.
pub fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// `DT_*` → `S_IFMT` bits (0 when unknown).
pub fn dtype_to_mode(d: u8) -> u32 {
    match d {
        libc::DT_DIR => libc::S_IFDIR,
        libc::DT_LNK => libc::S_IFLNK,
        libc::DT_FIFO => libc::S_IFIFO,
        libc::DT_CHR => libc::S_IFCHR,
        libc::DT_BLK => libc::S_IFBLK,
        libc::DT_SOCK => libc::S_IFSOCK,
        libc::DT_REG => libc::S_IFREG,
        _ => 0,
    }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec.clamp(0, 999_999_999) as u32)
    } else {
        UNIX_EPOCH - Duration::new(sec.unsigned_abs(), 0) + Duration::new(0, nsec as u32)
    }
}

/// Host `stat` → FUSE attributes for node `ino`.
pub fn to_attr(ino: u64, st: &libc::stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: kind(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        // A staged mount's stand-in for a character device 0/0 reads as 0/0.
        rdev: crate::stage::standin::reported_rdev(st) as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

/// What an `open` with these flags asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenIntent {
    /// Reads will be made.
    pub read: bool,
    /// Writes will be made (write access mode, `O_TRUNC`).
    pub write: bool,
    /// The policy level needed.
    pub need: Need,
}

/// Classifies open flags completely: `O_ACCMODE` (3 = both), `O_TRUNC` and `O_CREAT` /
/// `O_TMPFILE` need write; a write with `O_APPEND` (and none of those) needs only append;
/// exec (`FMODE_EXEC`) and plain reads need read. `O_EXCL` only matters with `O_CREAT`.
pub fn classify(flags: i32) -> OpenIntent {
    let acc = flags & libc::O_ACCMODE;
    let mut read = acc == libc::O_RDONLY || acc == libc::O_RDWR || acc == libc::O_ACCMODE;
    let mut write = acc == libc::O_WRONLY || acc == libc::O_RDWR || acc == libc::O_ACCMODE;
    if flags & libc::O_TRUNC != 0 {
        write = true;
    }
    if flags & libc::O_TMPFILE == libc::O_TMPFILE || flags & libc::O_CREAT != 0 {
        write = true;
    }
    if flags & FMODE_EXEC != 0 {
        read = true;
    }
    let appends = flags & libc::O_APPEND != 0
        && flags & (libc::O_TRUNC | libc::O_CREAT) == 0
        && flags & libc::O_TMPFILE != libc::O_TMPFILE;
    let need = match (write, appends) {
        (false, _) => Need::Read,
        (true, true) => Need::Append,
        (true, false) => Need::Write,
    };
    OpenIntent { read, write, need }
}

/// Flags for reopening the host file: what the caller asked, minus what only makes sense
/// for path resolution (the handle is already resolved) and `O_DIRECT` (the daemon's
/// buffers are not aligned; with passthrough the kernel opens the backing file with the
/// caller's own flags, `O_DIRECT` included).
pub fn host_open_flags(flags: i32) -> i32 {
    flags
        & !(libc::O_CREAT
            | libc::O_EXCL
            | libc::O_NOCTTY
            | libc::O_NOFOLLOW
            | libc::O_TMPFILE
            | libc::O_DIRECT
            | FMODE_EXEC)
}

/// Extended attributes the mount does not mirror: EOPNOTSUPP for get, set and remove on
/// every path (before the policy, which it does not depend on), and never listed.
///
/// `security.selinux`: a kernel running SELinux answers it for a FUSE mount itself (from
/// its policy, genfscon or `context=`), so only a kernel without SELinux asks the daemon,
/// and for that kernel a host label means nothing. Saying "not supported" lets `ls -l`
/// (gnulib's `getfilecon` cache per `st_dev`) stop asking after the first file: one FUSE
/// round trip per listed file less, which the kernel could not cache.
pub fn unmirrored_xattr(name: &[u8]) -> bool {
    name == b"security.selinux"
}

/// Extended attributes only host privilege (CAP_SYS_ADMIN) may change on a local disk:
/// `trusted.*`, and `security.*` but `security.capability` (file capabilities, which an
/// owner may set and the policy decides as a set-ID bit: `allow_setid`). A caller without
/// it ([`crate::host::privilege::host_admin`]: a vhost-user guest, a process in another
/// user namespace) gets EPERM for a change and ENODATA for a `trusted.*` read, as on a
/// local disk.
pub fn privileged_xattr(name: &[u8]) -> bool {
    name.starts_with(b"trusted.")
        || (name.starts_with(b"security.") && name != b"security.capability")
}

/// A name of overlayfs's own markers (`trusted.overlay.*`, `user.overlay.*`): a staged
/// mount's format, never shown through its merged view.
pub fn overlay_marker(name: &[u8]) -> bool {
    name.starts_with(b"trusted.overlay.") || name.starts_with(b"user.overlay.")
}

/// A `listxattr` name list without overlayfs's markers ([`overlay_marker`]).
pub fn without_markers(list: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for n in list.split_inclusive(|b| *b == 0) {
        if !overlay_marker(n) {
            out.extend_from_slice(n);
        }
    }
    out
}

/// A `listxattr` name list without the `trusted.*` names (what a caller without host
/// privilege does not see on a local disk).
pub fn without_trusted(list: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for n in list.split_inclusive(|b| *b == 0) {
        if !n.starts_with(b"trusted.") {
            out.extend_from_slice(n);
        }
    }
    out
}

/// A `listxattr` name list (NUL-terminated names) without the names the mount does not
/// mirror.
pub fn mirrored_xattr_list(list: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len());
    for n in list.split_inclusive(|b| *b == 0) {
        let bare = n.strip_suffix(&[0]).unwrap_or(n);
        if !bare.is_empty() && !unmirrored_xattr(bare) {
            out.extend_from_slice(bare);
            out.push(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmirrored_names_leave_the_list_and_the_rest_stays_in_order() {
        use super::mirrored_xattr_list as m;
        assert_eq!(m(b""), b"");
        assert_eq!(m(b"security.selinux\0"), b"");
        assert_eq!(
            m(b"user.a\0security.selinux\0system.posix_acl_access\0security.capability\0"),
            b"user.a\0system.posix_acl_access\0security.capability\0"
        );
        assert_eq!(
            m(b"user.a\0security.selinuxx\0"),
            b"user.a\0security.selinuxx\0"
        );
        assert!(super::unmirrored_xattr(b"security.selinux"));
        assert!(!super::unmirrored_xattr(b"user.selinux"));
    }

    #[test]
    fn open_flags_are_classified_completely() {
        let cases = [
            (libc::O_RDONLY, true, false, Need::Read),
            (libc::O_WRONLY, false, true, Need::Write),
            (libc::O_RDWR, true, true, Need::Write),
            (libc::O_RDONLY | libc::O_TRUNC, true, true, Need::Write),
            (libc::O_WRONLY | libc::O_APPEND, false, true, Need::Append),
            (libc::O_RDWR | libc::O_APPEND, true, true, Need::Append),
            (
                libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC,
                false,
                true,
                Need::Write,
            ),
            (
                libc::O_WRONLY | libc::O_APPEND | libc::O_CREAT,
                false,
                true,
                Need::Write,
            ),
            (libc::O_RDONLY | libc::O_APPEND, true, false, Need::Read),
            (libc::O_RDONLY | libc::O_CREAT, true, true, Need::Write),
            (
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                false,
                true,
                Need::Write,
            ),
            (libc::O_TMPFILE | libc::O_RDWR, true, true, Need::Write),
            (libc::O_RDONLY | FMODE_EXEC, true, false, Need::Read),
            (libc::O_ACCMODE, true, true, Need::Write),
        ];
        for (flags, r, w, need) in cases {
            let i = classify(flags);
            assert_eq!((i.read, i.write, i.need), (r, w, need), "flags {flags:#o}");
        }
    }

    #[test]
    fn host_flags_drop_resolution_bits() {
        let f = host_open_flags(
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_APPEND | libc::O_DIRECT,
        );
        assert_eq!(f, libc::O_RDWR | libc::O_APPEND);
    }
}
