//! The apply intent log, `DIR/apply-intent`: which SOURCE paths an apply in flight may
//! have left a temporary entry beside (`.NAME.fencefs-apply-PID`, a file or tree being
//! written; `.NAME.fencefs-delete-PID`, a directory being emptied), so that a crash never
//! leaves one visible in SOURCE.
//!
//! The log is written whole (beside, fsync'd, renamed, DIR fsync'd) before the first
//! temporary entry is made, and removed after the last staged entry is dropped. [`recover`]
//! (run before a mount serves DIR and before every apply or discard) removes every
//! temporary entry the log names that still exists, drops the staged entry of every
//! logged path that equals SOURCE now (the apply had carried it over but not yet
//! unstaged it: left, it would hide later host edits of the path), then the log. The temporary names are
//! the apply's own (its pid is in the log), so nothing else in SOURCE is touched.
//!
//! Format: `fencefs-apply 1 PID\n`, then each path (workspace-relative bytes, never
//! holding a NUL) followed by a NUL.
//!
//! Invariants: SOURCE is reached through directory handles walked without following
//! symlinks; only entries with the two temporary names of a logged path are removed.

use super::StageError;
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use super::changes::Layers;
use super::remove::sync_path;
use super::tree::split;
use crate::host::sys::{self, Name};

const HEAD: &str = "fencefs-apply 1";

fn path(dir: &Path) -> PathBuf {
    dir.join("apply-intent")
}

fn err(p: &Path, e: impl std::fmt::Display) -> StageError {
    StageError::at(p, e)
}

/// The temporary name beside `n` of the apply with process id `pid` (`what`: `apply` or
/// `delete`). A name over 200 bytes is cut to 180 and followed by a hash of the whole
/// name, so two names of one batch that share their first 200 bytes never share a
/// temporary name; the hash is FNV-1a, fixed, so a later daemon's [`recover`] finds the
/// same names.
pub fn tmp_name(n: &[u8], what: &str, pid: u32) -> io::Result<Name> {
    let mut t = b".".to_vec();
    if n.len() <= 200 {
        t.extend_from_slice(n);
    } else {
        let h = n.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        t.extend_from_slice(&n[..180]);
        t.extend_from_slice(format!("-{h:016x}").as_bytes());
    }
    t.extend_from_slice(format!(".fencefs-{what}-{pid}").as_bytes());
    Name::new(&t)
}

/// Records that this process is about to write temporary entries beside `paths`.
pub fn write(dir: &Path, paths: &[&[u8]]) -> Result<(), StageError> {
    let p = path(dir);
    let tmp = dir.join("apply-intent.tmp");
    let res = (|| -> io::Result<()> {
        let mut buf = format!("{HEAD} {}\n", std::process::id()).into_bytes();
        for q in paths {
            buf.extend_from_slice(q);
            buf.push(0);
        }
        crate::private_file::write_synced(&tmp, &buf, crate::private_file::FILE_MODE, None)?;
        fs::rename(&tmp, &p)?;
        sync_path(dir)
    })();
    res.map_err(StageError::io(&p))
}

/// The apply is over: no temporary entry of it is left.
pub fn clear(dir: &Path) -> Result<(), StageError> {
    let p = path(dir);
    match fs::remove_file(&p) {
        Ok(()) => sync_path(dir).map_err(StageError::io(dir)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StageError::io(&p)(e)),
    }
}

/// Removes what an apply a crash interrupted left beside its paths in SOURCE (`l.lower`),
/// then the log. Returns what it did, for the log.
pub fn recover(dir: &Path, l: &Layers) -> Result<Option<String>, StageError> {
    let p = path(dir);
    let data = match fs::read(&p) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StageError::io(&p)(e)),
    };
    let damaged = || err(&p, "damaged (not an apply intent log); nothing was changed");
    let nl = data.iter().position(|&b| b == b'\n').ok_or_else(damaged)?;
    let head = std::str::from_utf8(&data[..nl]).map_err(|_| damaged())?;
    let pid: u32 = head
        .strip_prefix(HEAD)
        .and_then(|r| r.trim().parse().ok())
        .ok_or_else(damaged)?;
    let paths: Vec<&[u8]> = data[nl + 1..]
        .split(|&b| b == 0)
        .filter(|q| !q.is_empty())
        .collect();
    let mut removed = 0usize;
    for &q in &paths {
        let (parent, last) = split(q);
        let Ok(Some(d)) = l.lower.dir(parent) else {
            continue;
        };
        for what in ["apply", "delete"] {
            let t = tmp_name(last, what, pid).map_err(StageError::io(&p))?;
            match sys::fstatat_nofollow(d.fd.as_fd(), &t) {
                Ok(_) => {
                    super::remove::remove_tree(l.lower.source(), d.fd.as_fd(), &t)
                        .map_err(|e| err(&p, format!("removing a temporary entry: {e}")))?;
                    removed += 1;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(StageError::io(&p)(e)),
            }
        }
    }
    if removed > 0 {
        let root = sys::reopen(
            l.lower.source().proc_fd.as_fd(),
            l.lower.source().root.as_fd(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )
        .map_err(|e| err(&p, e))?;
        super::sys::syncfs(root.as_fd()).map_err(|e| err(&p, e))?;
    }
    // An apply squashes the checkpoints first; were there layers below the staged tree,
    // an entry equal to SOURCE could still hide a layer's: then nothing is dropped.
    let unstaged = if super::layers::live(dir)?.is_empty() {
        drop_applied(l, &paths).map_err(|e| err(&p, format!("unstaging: {e}")))?
    } else {
        0
    };
    clear(dir)?;
    Ok(Some(format!(
        "an apply was interrupted: {removed} temporary entries it left in SOURCE removed, {unstaged} paths it had carried into SOURCE unstaged; every path is applied or still staged"
    )))
}

/// Drops the staged entry of every path of the log that equals SOURCE now (see
/// [`Layers::equals_source`]): what an apply killed after its renames but before it
/// dropped them left. Such an entry is no change, but it would hide every later host
/// edit of the path. Then one `syncfs` of DIR; returns how many were dropped.
fn drop_applied(l: &Layers, paths: &[&[u8]]) -> std::io::Result<usize> {
    let all = l.changes()?;
    let mut n = 0;
    for &q in paths {
        if l.equals_source(q, &all)? {
            super::remove::drop_staged(&l.upper, q)?;
            n += 1;
        }
    }
    if n > 0 {
        let root = sys::reopen(
            l.upper.proc_fd.as_fd(),
            l.upper.root.as_fd(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )?;
        super::sys::syncfs(root.as_fd())?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::tmp_name;

    #[test]
    fn long_names_alike_in_their_first_200_bytes_get_their_own_temporary_names() {
        let stem = vec![b'n'; 240];
        let (mut a, mut b) = (stem.clone(), stem);
        a.push(b'a');
        b.push(b'b');
        let (ta, tb) = (
            tmp_name(&a, "apply", 7).unwrap(),
            tmp_name(&b, "apply", 7).unwrap(),
        );
        assert_ne!(ta.bytes(), tb.bytes());
        assert!(ta.bytes().len() <= 255 && ta.bytes().ends_with(b".fencefs-apply-7"));
        assert_eq!(ta.bytes(), tmp_name(&a, "apply", 7).unwrap().bytes());
        let short = tmp_name(b"a.txt", "delete", 7).unwrap();
        assert_eq!(short.bytes(), b".a.txt.fencefs-delete-7");
    }
}
