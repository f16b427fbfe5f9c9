//! Finding and reading the ignore files (`ignore_files`) in SOURCE, for the policy compile
//! (at start, on reload, and when the host watch sees an ignore file change).
//!
//! Handle-based: a depth-first walk from SOURCE's root handle with `openat` (`O_NOFOLLOW`,
//! `O_NONBLOCK`): no symlink is followed, a FIFO never blocks. Only the directories on the
//! current path are held open.
//!
//! Invariants (bounds; a hostile repository cannot stall startup or eat memory): at most
//! [`MAX_FILES`] ignore files, each at most [`MAX_FILE_BYTES`] and together at most
//! [`MAX_TOTAL_BYTES`]; at most [`MAX_DIRS`] directories and [`MAX_ENTRIES`] entries walked,
//! at most [`MAX_DEPTH`] levels deep: a directory that deep is not walked but hidden (see
//! [`too_deep_hide`]), a depth being something any caller of the mount can make. Over any
//! other bound, and for an ignore file that is not a
//! regular file (a symlink, a FIFO), the scan fails: the caller refuses to mount (at
//! start) or keeps the ignore files in force (reload, see `reload::load_in`), never a
//! partial set of ignore files.

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::path::join;
use super::sys::{self, Name};
use crate::policy::IgnoreSource;

/// Most ignore files read.
pub const MAX_FILES: usize = 1000;
/// Largest ignore file read.
pub const MAX_FILE_BYTES: u64 = 256 * 1024;
/// Most bytes read from all ignore files together.
pub const MAX_TOTAL_BYTES: u64 = 4 * 1024 * 1024;
/// Most directories walked.
pub const MAX_DIRS: usize = 250_000;
/// Most directory entries looked at.
pub const MAX_ENTRIES: usize = 5_000_000;
/// Deepest directory level walked.
pub const MAX_DEPTH: usize = 256;

/// Why a scan failed: the path concerned (workspace-relative) and what is wrong.
#[derive(Debug)]
pub struct ScanError {
    /// Workspace-relative path (`""`: SOURCE).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

fn fail(path: &[u8], message: String) -> ScanError {
    ScanError {
        path: String::from_utf8_lossy(path).into_owned(),
        message,
    }
}

/// One directory being walked: its handle, its path, the subdirectories still to visit.
struct Level {
    fd: OwnedFd,
    path: Vec<u8>,
    todo: Vec<Vec<u8>>,
}

#[derive(Default)]
struct Counts {
    dirs: usize,
    entries: usize,
    bytes: u64,
}

/// Every ignore file named `names` in the tree under `root` (SOURCE's root handle), in
/// walk order. `Ok(vec![])` when `names` is empty (nothing is walked).
pub fn scan(root: BorrowedFd<'_>, names: &[String]) -> Result<Vec<IgnoreSource>, ScanError> {
    let mut out = Vec::new();
    if names.is_empty() {
        return Ok(out);
    }
    let proc_fd = sys::open_proc_self_fd().map_err(|e| fail(b"", e.to_string()))?;
    let top = sys::reopen(proc_fd.as_fd(), root, libc::O_RDONLY | libc::O_DIRECTORY)
        .map_err(|e| fail(b"", format!("cannot open SOURCE: {e}")))?;
    let mut counts = Counts::default();
    let mut stack = vec![visit(top, Vec::new(), names, &mut counts, &mut out)?];
    let mut too_deep = false;
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.todo.pop() else {
            stack.pop();
            continue;
        };
        let path = join(&level.path, &name);
        let depth = stack.len();
        let Some(level) = stack.last() else { break };
        if depth >= MAX_DEPTH {
            // Not walked, and hidden (below): the scan never fails on a depth a caller
            // of the mount can make (`mkdir -p` 300 levels would otherwise refuse every
            // reload and keep the old, maybe less restrictive, policy).
            too_deep = true;
            continue;
        }
        let fd = match open_dir(level.fd.as_fd(), &name) {
            Ok(fd) => fd,
            // Gone since it was listed, or replaced by a symlink: nothing to read there.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
                ) =>
            {
                continue;
            }
            Err(e) => return Err(fail(&path, format!("cannot open the directory: {e}"))),
        };
        let next = visit(fd, path, names, &mut counts, &mut out)?;
        stack.push(next);
    }
    if too_deep && let Some(name) = names.last() {
        // First, and of the highest-precedence name: no file of SOURCE's root outranks it.
        out.insert(0, too_deep_hide(name));
    }
    Ok(out)
}

/// The ignore source that hides every directory [`MAX_DEPTH`] levels deep (what the walk
/// did not look inside, so whatever ignore files it holds are never missed): one
/// anchored, directory-only pattern of `MAX_DEPTH` components at SOURCE's root.
pub fn too_deep_hide(name: &str) -> IgnoreSource {
    IgnoreSource {
        dir: Vec::new(),
        name: name.to_string(),
        text: format!("/{}\n", "*/".repeat(MAX_DEPTH)),
    }
}

fn open_dir(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    let n = Name::new(name)?;
    sys::openat(dir, &n, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// Lists one directory: reads the ignore files in it, returns the subdirectories to visit.
fn visit(
    fd: OwnedFd,
    path: Vec<u8>,
    names: &[String],
    counts: &mut Counts,
    out: &mut Vec<IgnoreSource>,
) -> Result<Level, ScanError> {
    counts.dirs += 1;
    if counts.dirs > MAX_DIRS {
        return Err(fail(
            b"",
            format!("more than {MAX_DIRS} directories to search for ignore files"),
        ));
    }
    let entries =
        sys::read_dir(fd.as_fd()).map_err(|e| fail(&path, format!("cannot list: {e}")))?;
    counts.entries += entries.len();
    if counts.entries > MAX_ENTRIES {
        return Err(fail(
            b"",
            format!("more than {MAX_ENTRIES} entries to search for ignore files"),
        ));
    }
    let mut todo = Vec::new();
    for e in entries {
        let dtype = match e.dtype {
            libc::DT_UNKNOWN => Name::new(&e.name)
                .and_then(|n| sys::fstatat_nofollow(fd.as_fd(), &n))
                .map(|st| dtype_of(st.st_mode))
                .unwrap_or(libc::DT_UNKNOWN),
            t => t,
        };
        let named = names.iter().find(|n| n.as_bytes() == e.name.as_slice());
        if let Some(name) = named {
            let file = join(&path, &e.name);
            if dtype != libc::DT_REG {
                return Err(fail(
                    &file,
                    "the ignore file is not a regular file (symlinks are not followed)".into(),
                ));
            }
            if out.len() >= MAX_FILES {
                return Err(fail(&file, format!("more than {MAX_FILES} ignore files")));
            }
            let text = read_one(fd.as_fd(), &e.name, counts).map_err(|m| fail(&file, m))?;
            out.push(IgnoreSource {
                dir: path.clone(),
                name: name.clone(),
                text,
            });
        } else if dtype == libc::DT_DIR {
            todo.push(e.name);
        }
    }
    // Popped from the end: visit in listing order.
    todo.reverse();
    Ok(Level { fd, path, todo })
}

fn dtype_of(mode: libc::mode_t) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFREG => libc::DT_REG,
        libc::S_IFLNK => libc::DT_LNK,
        _ => libc::DT_UNKNOWN,
    }
}

/// Reads one ignore file (a regular file, within the size bounds).
fn read_one(dir: BorrowedFd<'_>, name: &[u8], counts: &mut Counts) -> Result<String, String> {
    let n = Name::new(name).map_err(|e| e.to_string())?;
    let fd = sys::openat(dir, &n, libc::O_RDONLY, 0).map_err(|e| format!("cannot open: {e}"))?;
    let st = sys::fstat(fd.as_fd()).map_err(|e| e.to_string())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("the ignore file is not a regular file".into());
    }
    let mut buf = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read: {e}"))?;
    if buf.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "the ignore file is larger than {MAX_FILE_BYTES} bytes"
        ));
    }
    counts.bytes += buf.len() as u64;
    if counts.bytes > MAX_TOTAL_BYTES {
        return Err(format!(
            "the ignore files hold more than {MAX_TOTAL_BYTES} bytes together"
        ));
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}
