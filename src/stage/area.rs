//! The staging area DIR on disk: its layout, its validation, and the one-daemon lock.
//!
//! Layout (documented in the README, "Staging"):
//! - `DIR/fencefs-stage`: the format marker: `fencefs-stage 1`, then `source PATH` (the
//!   canonical SOURCE it stages) and `source-id DEV:INO` (SOURCE's root directory);
//! - `DIR/upper/`: the staged tree, in kernel overlayfs's upper-directory format
//!   (whiteouts are character devices 0/0, `trusted.overlay.opaque` and
//!   `trusted.overlay.redirect` on directories);
//! - `DIR/work/`: the overlay's work directory (its copy-ups in flight);
//! - `DIR/lock`: `flock`ed by the daemon serving DIR, and by `stage apply`/`discard`.
//!
//! Invariants: nothing here deletes anything; an area that is not one, is newer, or lacks
//! a part is refused with one line naming the path. DIR is created 0700 and must lie
//! outside SOURCE and the mount point (checked on canonical paths).

use super::StageError;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::sys as ssys;

/// Format version written in `DIR/fencefs-stage`: 2 since deletions' base records may be
/// compact (`base::RecPath`), which a fencefs reading format 1 would take for no record.
/// A daemon serving an area of an older format marks it with this one
/// ([`Area::mark_current`]).
pub const FORMAT: u32 = 2;
const MARKER: &str = "fencefs-stage";

/// An opened, validated staging area.
pub struct Area {
    /// DIR, canonical.
    pub dir: PathBuf,
    /// The SOURCE it stages, as recorded.
    pub source: PathBuf,
    /// `DIR/upper` (handle).
    pub upper: OwnedFd,
    /// The lock file, locked when [`Area::lock`] succeeded.
    lock: OwnedFd,
    /// The format its marker says.
    version: u32,
}

fn err(dir: &Path, what: impl std::fmt::Display) -> StageError {
    StageError::at(dir, what)
}

fn inside(a: &Path, b: &Path) -> bool {
    a.starts_with(b)
}

impl Area {
    /// Creates (mode 0700) or opens the staging area `dir` for SOURCE `src` mounted at `mnt`
    /// (both canonical), and checks it is one for `src`.
    pub fn create_or_open(dir: &Path, src: &Path, mnt: &Path) -> Result<Area, StageError> {
        // Checked before anything is created: a DIR inside SOURCE is never made there.
        let canon = match dir.canonicalize() {
            Ok(c) => c,
            Err(_) => {
                let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
                let parent = parent.unwrap_or(Path::new("."));
                let name = dir
                    .file_name()
                    .ok_or_else(|| err(dir, "is not a directory name"))?;
                parent
                    .canonicalize()
                    .map_err(|e| err(dir, format!("parent: {e}")))?
                    .join(name)
            }
        };
        if inside(&canon, src) || inside(src, &canon) {
            return Err(err(
                dir,
                format!(
                    "lies inside the source '{}' (or holds it); put it outside",
                    src.display()
                ),
            ));
        }
        if inside(&canon, mnt) {
            return Err(err(
                dir,
                format!("lies inside the mount point '{}'", mnt.display()),
            ));
        }
        if !canon.exists() {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&canon)
                .map_err(StageError::io(dir))?;
        }
        let md = fs::symlink_metadata(&canon).map_err(StageError::io(dir))?;
        if !md.is_dir() {
            return Err(err(dir, "is not a directory"));
        }
        local_fs(&canon)?;
        let marker = canon.join(MARKER);
        if !marker.exists() {
            let empty = fs::read_dir(&canon)
                .map_err(StageError::io(dir))?
                .next()
                .is_none();
            if !empty {
                return Err(err(
                    dir,
                    "is not a staging area (not empty, no fencefs-stage file); give an empty or new directory",
                ));
            }
            init(&canon, src)?;
        }
        let area = Area::open(&canon)?;
        if area.source != src {
            return Err(err(
                &canon,
                format!(
                    "stages '{}', not '{}'; give another directory",
                    area.source.display(),
                    src.display()
                ),
            ));
        }
        Ok(area)
    }

    /// Opens an existing staging area (for `fencefs stage … --dir DIR`).
    pub fn open(dir: &Path) -> Result<Area, StageError> {
        let dir = dir.canonicalize().map_err(StageError::io(dir))?;
        let marker = dir.join(MARKER);
        let text = fs::read_to_string(&marker).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => err(&dir, "is not a staging area (no fencefs-stage file)"),
            _ => StageError::io(&marker)(e),
        })?;
        let (version, source) = parse_marker(&text).ok_or_else(|| {
            err(
                &marker,
                "damaged (expected `fencefs-stage N` and `source PATH`)",
            )
        })?;
        if version > FORMAT {
            return Err(err(
                &dir,
                format!("was made by a newer fencefs (format {version}; this one reads {FORMAT})"),
            ));
        }
        let lock = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(dir.join("lock"))
            .map_err(StageError::io(&dir.join("lock")))?;
        // A checkpoint, rewind or squash that a crash interrupted: finished here when no
        // one else holds the area (a running daemon finishes its own).
        if dir.join("intent").exists()
            && ssys::try_lock(lock.as_fd()).unwrap_or(false)
            && let Some(what) = super::layers::recover(&dir)?
        {
            log::warn!("stage '{}': {what} (interrupted before)", dir.display());
        }
        for part in ["upper", "work"] {
            let p = dir.join(part);
            if !fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
                return Err(err(
                    &p,
                    "damaged: missing (or not a directory); nothing was changed",
                ));
            }
        }
        let upper =
            crate::host::sys::open_root(&dir.join("upper")).map_err(StageError::io(&dir))?;
        Ok(Area {
            dir,
            source,
            upper,
            lock: lock.into(),
            version,
        })
    }

    /// Marks an area of an older format with [`FORMAT`] (what this daemon writes into it
    /// from now on needs it), rewriting the marker's first line, whole or not at all, and
    /// durably before any such record is written. Called with the lock held.
    pub fn mark_current(&mut self) -> Result<(), StageError> {
        if self.version >= FORMAT {
            return Ok(());
        }
        let marker = self.dir.join(MARKER);
        let text = fs::read_to_string(&marker).map_err(StageError::io(&marker))?;
        let rest = text.split_once('\n').map_or("", |(_, r)| r);
        write_marker(&self.dir, &format!("{MARKER} {FORMAT}\n{rest}"))?;
        self.version = FORMAT;
        Ok(())
    }

    /// Takes the area's lock (one daemon, or one apply/discard, at a time).
    pub fn lock(&self) -> Result<(), StageError> {
        match ssys::try_lock(self.lock.as_fd()) {
            Ok(true) => Ok(()),
            Ok(false) => Err(StageError::Busy(self.dir.clone())),
            Err(e) => Err(StageError::io(&self.dir.join("lock"))(e)),
        }
    }

    /// Gives the staged tree's root SOURCE's owner and mode: the overlay shows the upper
    /// root's attributes for the mount's root (and DIR itself stays 0700).
    pub fn match_root(&self, source: &OwnedFd) -> Result<(), StageError> {
        let st = crate::host::sys::fstat(source.as_fd()).map_err(StageError::io(&self.dir))?;
        let proc_fd = crate::host::sys::open_proc_self_fd().map_err(StageError::io(&self.dir))?;
        crate::host::sys::fchown_fd(self.upper.as_fd(), st.st_uid, st.st_gid)
            .and_then(|_| {
                crate::host::sys::fchmod_fd(
                    proc_fd.as_fd(),
                    self.upper.as_fd(),
                    st.st_mode & 0o7777,
                )
            })
            .map_err(StageError::io(&self.dir.join("upper")))
    }

    /// The same area with `DIR/upper` opened again (a checkpoint, rewind or squash
    /// replaced it); the lock stays held.
    pub fn reopen(self) -> Result<Area, StageError> {
        let upper = crate::host::sys::open_root(&self.dir.join("upper"))
            .map_err(StageError::io(&self.dir.join("upper")))?;
        Ok(Area { upper, ..self })
    }

    /// `DIR/work`, for the overlay.
    pub fn work(&self) -> PathBuf {
        self.dir.join("work")
    }
}

fn parse_marker(text: &str) -> Option<(u32, PathBuf)> {
    let mut lines = text.lines();
    let version = lines.next()?.strip_prefix(MARKER)?.trim().parse().ok()?;
    let mut source = None;
    for l in lines {
        if let Some(s) = l.strip_prefix("source ") {
            source = Some(PathBuf::from(s));
        }
    }
    Some((version, source?))
}

fn init(dir: &Path, src: &Path) -> Result<(), StageError> {
    for part in ["upper", "work"] {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.join(part))
            .map_err(StageError::io(&dir.join(part)))?;
    }
    let md = fs::metadata(src).map_err(StageError::io(src))?;
    let text = format!(
        "{MARKER} {FORMAT}\nsource {}\nsource-id {}:{}\n",
        src.display(),
        md.dev(),
        md.ino()
    );
    write_marker(dir, &text)
}

/// Writes `DIR/fencefs-stage` beside and renames it, then syncs DIR: a marker is whole or
/// absent, and durable once this returns.
fn write_marker(dir: &Path, text: &str) -> Result<(), StageError> {
    let tmp = dir.join(".fencefs-stage.tmp");
    let mode = crate::private_file::FILE_MODE;
    crate::private_file::write_synced(&tmp, text.as_bytes(), mode, None)
        .map_err(StageError::io(&tmp))?;
    fs::rename(&tmp, dir.join(MARKER)).map_err(StageError::io(dir))?;
    fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(StageError::io(dir))
}

/// Refuses network and FUSE file systems for DIR (the SPEC wants a local one).
fn local_fs(dir: &Path) -> Result<(), StageError> {
    const REMOTE: [i64; 5] = [0x6969, 0x65735546, 0xFF534D42, 0xFE534D42, 0x517B];
    let fd = crate::host::sys::open_root(dir).map_err(StageError::io(dir))?;
    let f = nix::sys::statfs::fstatfs(&fd).map_err(|e| err(dir, e))?;
    if REMOTE.contains(&(f.filesystem_type().0 as i64)) {
        return Err(err(
            dir,
            "is on a network or FUSE file system; put it on a local one",
        ));
    }
    Ok(())
}
