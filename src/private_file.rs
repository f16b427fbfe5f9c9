//! Files the daemon writes for the operator (the `--answers` file, the staging area's
//! records, a `--learn` draft): created with an explicit mode, never with the daemon's
//! umask, which is 0 on purpose (files it creates for FUSE callers get exactly the
//! callers' modes) and would otherwise leave them writable by every local user.
//!
//! Invariant: what [`write_synced`] leaves is a new file with exactly the mode (and, given
//! one, the owner) it was asked for, whatever the process umask; nothing left at its name
//! before is written through.

use std::fs::{OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of a record the daemon makes for the operator.
pub const FILE_MODE: u32 = 0o600;
/// The mode of a directory it makes for the operator.
pub const DIR_MODE: u32 = 0o700;

/// Writes `bytes` to a new file `path`, with mode `mode` and, given one, owner `(uid,
/// gid)`, then syncs it: the temporary file of a write-beside-and-rename. Whatever was left
/// at `path` (a crash's temporary file, a symlink, a hard link to another file) is
/// unlinked first, never written through.
pub fn write_synced(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
    }
    // The umask masks the mode given to open(2).
    f.set_permissions(Permissions::from_mode(mode))?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_mode_is_exact_and_nothing_left_there_is_written_through() {
        let dir = std::env::temp_dir().join(format!("fencefs-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("rec.tmp");
        std::fs::write(&p, "old, longer than the new text\n").unwrap();
        std::fs::set_permissions(&p, Permissions::from_mode(0o666)).unwrap();
        write_synced(&p, b"new\n", FILE_MODE, None).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o600);
        assert_eq!(std::fs::read(&p).unwrap(), b"new\n");
        let me = std::fs::metadata(&dir).unwrap();
        let q = dir.join("kept.tmp");
        write_synced(&q, b"x", 0o640, Some((me.uid(), me.gid()))).unwrap();
        let md = std::fs::metadata(&q).unwrap();
        assert_eq!((md.mode() & 0o7777, md.uid()), (0o640, me.uid()));
        let link = dir.join("link.tmp");
        std::os::unix::fs::symlink(&q, &link).unwrap();
        write_synced(&link, b"y", FILE_MODE, None).unwrap();
        let hard = dir.join("hard.tmp");
        std::fs::hard_link(&q, &hard).unwrap();
        write_synced(&hard, b"z", FILE_MODE, None).unwrap();
        assert_eq!(std::fs::read(&q).unwrap(), b"x", "not written through");
        assert_eq!(std::fs::metadata(&q).unwrap().mode() & 0o7777, 0o640);
        assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
        assert_eq!(std::fs::read(&hard).unwrap(), b"z");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
