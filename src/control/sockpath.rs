//! Unix socket paths longer than `sun_path` (108 bytes with its NUL): a socket deep in a
//! workspace or a CI checkout (`/check/work/main/target/tmp/…/control.PID`) is still
//! bound and reached, through `/proc/self/fd/N/NAME` with `N` an `O_PATH` descriptor of
//! its directory.
//!
//! Invariant: the name the socket gets on disk is `path` itself; only the string handed to
//! `bind(2)`/`connect(2)` changes, and the directory descriptor lives until that call
//! returns.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The longest path `sun_path` holds (its last byte is the NUL).
const SUN_PATH_MAX: usize = 107;

/// Calls `f` with `path`, or, when `path` is too long for `sun_path`, with a short
/// `/proc/self/fd/N/NAME` that names the same file.
pub fn with<T>(path: &Path, f: impl FnOnce(&Path) -> io::Result<T>) -> io::Result<T> {
    if path.as_os_str().as_bytes().len() <= SUN_PATH_MAX {
        return f(path);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return f(path);
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let d = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)?;
    let short: PathBuf = Path::new(&format!("/proc/self/fd/{}", d.as_raw_fd())).join(name);
    if short.as_os_str().as_bytes().len() > SUN_PATH_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket name {:?} is too long (at most ~90 bytes)",
                name.to_string_lossy()
            ),
        ));
    }
    let r = f(&short);
    drop(d);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn binds_and_connects_past_sun_path() {
        let base = std::env::temp_dir().join(format!("fencefs-sockpath-{}", std::process::id()));
        let deep = base.join("a".repeat(60)).join("b".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        let p = deep.join("control.sock");
        assert!(p.as_os_str().len() > SUN_PATH_MAX);
        assert!(UnixListener::bind(&p).is_err(), "std alone refuses it");
        let l = with(&p, |s| UnixListener::bind(s)).unwrap();
        assert!(
            std::fs::symlink_metadata(&p).is_ok(),
            "bound at the real path"
        );
        let c = with(&p, |s| UnixStream::connect(s)).unwrap();
        let (s, _) = l.accept().unwrap();
        drop((c, s));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
