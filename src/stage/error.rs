//! The staging engine's error: what went wrong, typed where a caller must tell failures
//! apart (a busy area, a missing or ended checkpoint, an argument the CLI answers with exit
//! 2, an I/O failure whose kind decides the answer), text only where it is shown.
//!
//! Invariants: `Display` is the message `fencefs stage`, `fencefs review` and the control
//! socket's `{"ok":false,"error":…}` show, word for word what the engine said when its
//! errors were strings (tests pin them); the engine builds a `StageError`, the front-ends
//! (`cli.rs`, `control.rs`, `app/`) turn it into text. Hand-written rather than
//! `thiserror`: eleven variants, one `Display` each, and the crate has no other use for it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Why a staging operation failed.
#[derive(Debug)]
pub enum StageError {
    /// A system call on `path`, a file of DIR or SOURCE, failed: `stage 'PATH': ERROR`.
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// `path` is not what it must be (damaged, not a staging area, the wrong SOURCE…):
    /// `stage 'PATH': WHAT`.
    At {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// DIR's lock is held by another fencefs (a mount, an apply or a discard).
    Busy(PathBuf),
    /// No checkpoint N in the log.
    NoSuchCheckpoint(u64),
    /// Checkpoint N was ended by an apply or discard: no longer a rewind target.
    Ended(u64),
    /// The log holds the most live checkpoints a stack may have.
    TooManyLayers(u64),
    /// An operation's I/O failed: `WHAT: ERROR` (`reading the staged tree: …`).
    Op {
        /// What was being done.
        what: String,
        /// What the system said.
        source: io::Error,
    },
    /// A system call failed, shown as the system says it.
    Sys(io::Error),
    /// A change asked of a staging area no mount serves through its socket.
    NeedsLiveMount(&'static str),
    /// A bad argument: `fencefs stage` exits 2, as for clap's own.
    Usage(String),
    /// Any other refusal, its text made where it was found (an unknown op, a path with
    /// nothing staged, a file too large for hunks…).
    Invalid(String),
}

impl StageError {
    /// [`StageError::Io`] on `path`, for `map_err`.
    pub fn io(path: &Path) -> impl FnOnce(io::Error) -> StageError + '_ {
        move |source| StageError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// [`StageError::At`]: `path` is not what it must be.
    pub fn at(path: &Path, what: impl fmt::Display) -> StageError {
        StageError::At {
            path: path.to_path_buf(),
            what: what.to_string(),
        }
    }

    /// [`StageError::Op`] while doing `what`, for `map_err`.
    pub fn op(what: impl Into<String>) -> impl FnOnce(io::Error) -> StageError {
        let what = what.into();
        move |source| StageError::Op { what, source }
    }

    /// The kind of the I/O failure underneath, if it is one.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            StageError::Io { source, .. }
            | StageError::Op { source, .. }
            | StageError::Sys(source) => Some(source.kind()),
            _ => None,
        }
    }
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StageError::Io { path, source } => write!(f, "stage '{}': {source}", path.display()),
            StageError::At { path, what } => write!(f, "stage '{}': {what}", path.display()),
            StageError::Busy(dir) => write!(
                f,
                "stage '{}': is in use by another fencefs (a running mount, or an apply or discard); one at a time",
                dir.display()
            ),
            StageError::NoSuchCheckpoint(n) => {
                write!(f, "no checkpoint {n} (`fencefs stage log` lists them)")
            }
            StageError::Ended(n) => write!(
                f,
                "checkpoint {n} was ended by an apply or discard (staged changes were carried into SOURCE or dropped since): it is no longer a rewind target"
            ),
            StageError::TooManyLayers(max) => write!(
                f,
                "{max} checkpoints already: rewind, apply or discard before taking another"
            ),
            StageError::Op { what, source } => write!(f, "{what}: {source}"),
            StageError::Sys(e) => write!(f, "{e}"),
            StageError::NeedsLiveMount(op) => write!(f, "{op} needs the running mount"),
            StageError::Usage(m) | StageError::Invalid(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for StageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StageError::Io { source, .. }
            | StageError::Op { source, .. }
            | StageError::Sys(source) => Some(source),
            _ => None,
        }
    }
}

/// A system call's failure, as the system says it.
impl From<io::Error> for StageError {
    fn from(e: io::Error) -> StageError {
        StageError::Sys(e)
    }
}

/// A refusal whose text was made where it was found.
impl From<String> for StageError {
    fn from(m: String) -> StageError {
        StageError::Invalid(m)
    }
}

impl From<&str> for StageError {
    fn from(m: &str) -> StageError {
        StageError::Invalid(m.to_string())
    }
}

/// Where a front-end outside `stage/` shows the error (`app::run`, `fencefs review`).
impl From<StageError> for String {
    fn from(e: StageError) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_the_ones_shown_before() {
        let p = Path::new("/s");
        let e = StageError::io(p)(io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(
            e.to_string(),
            "stage '/s': No such file or directory (os error 2)"
        );
        assert_eq!(
            StageError::at(p, "damaged").to_string(),
            "stage '/s': damaged"
        );
        assert_eq!(
            StageError::NoSuchCheckpoint(3).to_string(),
            "no checkpoint 3 (`fencefs stage log` lists them)"
        );
        assert_eq!(
            StageError::NeedsLiveMount("apply").to_string(),
            "apply needs the running mount"
        );
        let e = StageError::op("diff")(io::ErrorKind::FileTooLarge.into());
        assert_eq!(e.io_kind(), Some(io::ErrorKind::FileTooLarge));
        assert!(e.to_string().starts_with("diff: "));
    }
}
