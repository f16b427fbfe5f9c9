//! Step 1 of a mount, **check**: block the signals the signal thread handles, then check
//! SOURCE and MOUNTPOINT (directories, MOUNTPOINT not busy with a FUSE mount nor inside
//! SOURCE), `/dev/fuse`, `fusermount3`, `--allow-other` and `--cache-ttl`. Also the
//! reading of `/proc/self/mountinfo` the checks and the exit thread share.
//!
//! Takes: the parsed [`MountArgs`]. Gives: the signal set to wait on, and SOURCE and
//! MOUNTPOINT canonical.
//!
//! Invariants: nothing here opens SOURCE, mounts or starts a thread. [`block_signals`]
//! runs before any thread exists (every later thread inherits the mask). A check that fails
//! returns one line naming the bad input and what to do about it; [`top_mount`] reads
//! mountinfo only and never touches the path itself (it may be a FUSE mount nobody serves).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigSet, Signal};

use crate::cli::MountArgs;
use crate::host::sys;

/// The file system type of the topmost mount exactly at `path`, if one is there.
pub(in crate::app) fn top_mount_type(path: &Path) -> Option<String> {
    top_mount(&path.canonicalize().ok()?).map(|m| m.fstype)
}

/// The file system type of the topmost mount exactly at the absolute `path`, read from
/// mountinfo only: `path` itself is never touched (a FUSE mount nobody serves, or serves
/// to other uids only, would block or refuse a stat).
pub(in crate::app) fn mount_type_at(path: &Path) -> Option<String> {
    top_mount(path).map(|m| m.fstype)
}

/// One mount as `/proc/self/mountinfo` lists it.
pub(super) struct MountEntry {
    /// `major:minor` of the mounted file system (unique per FUSE connection).
    pub(super) dev: String,
    fstype: String,
}

/// The topmost mount exactly at the canonical path `canon` (read from mountinfo only: no
/// syscall on the path itself, which may be a FUSE mount nobody serves yet).
pub(super) fn top_mount(canon: &Path) -> Option<MountEntry> {
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    let target = canon.as_os_str().as_bytes();
    // Later lines are mounted on top of earlier ones.
    info.split(|&b| b == b'\n')
        .rev()
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            if fields.get(4).is_none_or(|mp| unescape(mp) != target) {
                return None;
            }
            let sep = fields.iter().position(|f| *f == b"-")?;
            Some(MountEntry {
                dev: String::from_utf8_lossy(fields.get(2)?).into_owned(),
                fstype: String::from_utf8_lossy(fields.get(sep + 1)?).into_owned(),
            })
        })
        .next()
}

fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

fn find_in_path(bin: &str) -> bool {
    if let Some(p) = std::env::var_os("FUSERMOUNT_PATH") {
        return Path::new(&p).exists();
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

pub(super) fn startup_checks(a: &MountArgs) -> Result<(PathBuf, PathBuf), String> {
    source_dir(a)?;
    let src = &a.source;
    let mnt = &a.mountpoint;
    let mm = std::fs::metadata(mnt).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            format!(
                "mount point '{}': {e}: a FUSE daemon died there; detach it with \
                 `fusermount3 -u -z {}`",
                mnt.display(),
                mnt.display()
            )
        } else {
            format!("mount point '{}': {e}", mnt.display())
        }
    })?;
    if !mm.is_dir() {
        return Err(format!(
            "mount point '{}' is not a directory",
            mnt.display()
        ));
    }
    // Busy: a FUSE file system (another fencefs, say) is already mounted exactly there.
    // Other mounts (a Docker bind target, a Kubernetes volume) are fine to mount over.
    if let Some(t) = top_mount_type(mnt).filter(|t| t == "fuse" || t.starts_with("fuse.")) {
        return Err(format!(
            "mount point '{}' is busy: a {t} file system is already mounted there \
             (if its daemon is gone: fusermount3 -u -z {})",
            mnt.display(),
            mnt.display()
        ));
    }
    let src = src
        .canonicalize()
        .map_err(|e| format!("source '{}': {e}", src.display()))?;
    let mnt_c = mnt
        .canonicalize()
        .map_err(|e| format!("mount point '{}': {e}", mnt.display()))?;
    // Mounting over SOURCE itself is fine (the root handle is opened first); anything
    // strictly inside would make the mirror contain itself.
    if mnt_c != src && mnt_c.starts_with(&src) {
        return Err(format!(
            "mount point '{}' lies inside the source '{}'",
            mnt_c.display(),
            src.display()
        ));
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing: load the fuse module or pass --device /dev/fuse".into());
    }
    if !a.direct && !find_in_path("fusermount3") {
        return Err("fusermount3 not found in PATH: install the fuse3 package".into());
    }
    if a.allow_other && sys::geteuid() != 0 {
        let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
        if !conf.lines().any(|l| l.trim() == "user_allow_other") {
            return Err(
                "--allow-other needs 'user_allow_other' in /etc/fuse.conf when not run as root"
                    .into(),
            );
        }
    }
    cache_ttl(a)?;
    Ok((src, mnt_c))
}

/// SOURCE must be a directory (a mount and `vhost-user` both check it).
pub(in crate::app) fn source_dir(a: &MountArgs) -> Result<(), String> {
    let src = &a.source;
    let md = std::fs::metadata(src).map_err(|e| format!("source '{}': {e}", src.display()))?;
    if !md.is_dir() {
        return Err(format!("source '{}' is not a directory", src.display()));
    }
    Ok(())
}

/// `--cache-ttl`, when given, must be finite and within an hour.
pub(in crate::app) fn cache_ttl(a: &MountArgs) -> Result<(), String> {
    if a.cache_ttl
        .is_some_and(|t| !t.is_finite() || !(0.0..=3600.0).contains(&t))
    {
        return Err("--cache-ttl must be between 0 and 3600 seconds".into());
    }
    Ok(())
}

/// Blocks the signals the signal thread handles; must run before any thread exists.
pub(in crate::app) fn block_signals() -> Result<SigSet, String> {
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGHUP, Signal::SIGINT, Signal::SIGTERM] {
        sigs.add(s);
    }
    sigs.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;
    Ok(sigs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(b"/tmp/a\\040b"), b"/tmp/a b");
        assert_eq!(unescape(b"/x"), b"/x");
    }
}
