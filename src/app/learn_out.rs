//! `--learn OUT.toml`: where a learning mount writes its draft (at unmount and on the
//! control socket's `{"cmd":"learn"}`).
//!
//! OUT.toml is replaced, never written through: each draft goes to a new file beside it
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600), is fsynced and renamed over OUT.toml, and the
//! directory is fsynced. A symlink planted at OUT.toml (by an agent that can write there)
//! is itself replaced by the draft: its target is never opened.
//!
//! Invariants: OUT.toml's directory is opened and checked once, before the mount exists
//! (writable: a temporary file is made there and removed; OUT.toml is not a directory),
//! so a bad path fails the mount before anything is mounted; every later write is
//! relative to that directory's descriptor. The writes run on a thread of their own,
//! started then, outside the workers' Landlock domain (the main thread, which writes the
//! unmount's draft, is confined to SOURCE by then and could not make a file beside
//! OUT.toml). Drafting and writing happen under one lock, so OUT.toml always holds one
//! complete draft, the latest written: an unmount after a `learn` command leaves the
//! unmount's draft. A failed write leaves OUT.toml as it was and no temporary file.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Sender, channel};

use parking_lot::Mutex;

use crate::fs::ops::Shared;
use crate::host::sys::{self, Name};

/// The mode of OUT.toml once a draft is written (a draft lists what the session used).
pub(crate) const DRAFT_MODE: u32 = 0o600;

/// One write for the writer thread: the draft, and where its outcome goes.
type Job = (String, Sender<Result<(), String>>);

/// `--learn OUT.toml`: where a learning mount writes its draft.
pub(crate) struct LearnOut {
    path: PathBuf,
    jobs: Mutex<Sender<Job>>,
}

/// What one write of the draft wrote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written {
    /// Rules in the draft.
    pub(crate) rules: usize,
    /// Bytes of the draft.
    pub(crate) bytes: usize,
}

/// OUT.toml's directory (held open) and its name there.
struct Target {
    dir: OwnedFd,
    name: Name,
}

impl Target {
    /// Opens OUT.toml's directory and checks that a draft can be written there.
    fn open(path: &Path) -> io::Result<Target> {
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::other("not a file name"))
            .and_then(Name::from_os)?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let dir: OwnedFd = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)?
            .into();
        if let Ok(st) = sys::fstatat_nofollow(dir.as_fd(), &name)
            && st.st_mode & libc::S_IFMT == libc::S_IFDIR
        {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        let t = Target { dir, name };
        let (tmp, _) = t.create_temp()?;
        sys::unlinkat(t.dir.as_fd(), &tmp, 0)?;
        Ok(t)
    }

    /// A new file beside OUT.toml, made by this call (`O_EXCL`, never through a symlink).
    fn create_temp(&self) -> io::Result<(Name, File)> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        let mut seq = 0u32;
        loop {
            let tmp =
                Name::new(format!(".fencefs-learn-{}-{seq}.tmp", std::process::id()).as_bytes())?;
            match sys::openat(self.dir.as_fd(), &tmp, flags, DRAFT_MODE) {
                Ok(fd) => return Ok((tmp, File::from(fd))),
                // A leftover of an earlier daemon with this pid: another name.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) && seq < 16 => seq += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Replaces OUT.toml with a file holding `text`.
    fn replace(&self, text: &[u8]) -> io::Result<()> {
        let (tmp, mut f) = self.create_temp()?;
        let r = f
            .write_all(text)
            .and_then(|()| f.sync_all())
            .and_then(|()| sys::renameat2(self.dir.as_fd(), &tmp, self.dir.as_fd(), &self.name, 0));
        if r.is_err() {
            let _ = sys::unlinkat(self.dir.as_fd(), &tmp, 0);
        }
        r?;
        // Replaced: a directory that cannot be synced is said, not a failed write.
        if let Err(e) = sys::fsync(self.dir.as_fd(), false) {
            log::warn!("--learn: syncing the draft's directory: {e}");
        }
        Ok(())
    }
}

impl LearnOut {
    /// Checks OUT.toml's directory and starts the writer thread; the error is the mount's
    /// one startup line.
    pub(crate) fn open(path: &Path) -> Result<LearnOut, String> {
        let quoted = || crate::quote::quote(path.as_os_str().as_encoded_bytes());
        let target = Target::open(path).map_err(|e| format!("--learn {}: {e}", quoted()))?;
        // Canonical, for the answer's `path` (the daemon may chdir); OUT.toml itself is
        // never resolved (a symlink there is replaced, not followed).
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = std::fs::canonicalize(dir.unwrap_or(Path::new(".")))
            .unwrap_or_else(|_| dir.unwrap_or(Path::new(".")).to_path_buf());
        let path = dir.join(path.file_name().unwrap_or_default());
        let shown = path.display().to_string();
        let (tx, rx) = channel::<Job>();
        std::thread::Builder::new()
            .name("fencefs-learn".into())
            .spawn(move || {
                for (text, reply) in rx {
                    let r = target.replace(text.as_bytes());
                    let _ = reply.send(r.map_err(|e| format!("writing {shown}: {e}")));
                }
            })
            .map_err(|e| format!("--learn {}: cannot start its writer: {e}", quoted()))?;
        Ok(LearnOut {
            path,
            jobs: Mutex::new(tx),
        })
    }

    /// Where the draft goes.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Drafts what `shared` recorded so far and replaces OUT.toml with it.
    pub(crate) fn write(&self, shared: &Shared) -> Result<Written, String> {
        let Some(rec) = &shared.settings.learn else {
            return Err("this mount does not learn (no --learn)".into());
        };
        // Drafted and written under one lock: two writers never leave the older draft last.
        let jobs = self.jobs.lock();
        let draft = rec.draft(&shared.policy.get().policy);
        let rules = crate::policy::Policy::parse(&draft, "<draft>")
            .map(|p| p.rules().len())
            .map_err(|e| format!("the draft does not parse (a bug): {e:?}"))?;
        let bytes = draft.len();
        let (tx, rx) = channel();
        let gone = || format!("writing {}: the writer thread is gone", self.path.display());
        jobs.send((draft, tx)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())??;
        Ok(Written { rules, bytes })
    }

    /// [`LearnOut::write`] at the end of a session, its outcome logged.
    pub(crate) fn write_logged(&self, shared: &Shared) {
        match self.write(shared) {
            Ok(w) => log::info!(
                "--learn: the draft policy is written to {} ({} rules)",
                self.path.display(),
                w.rules
            ),
            Err(e) => log::error!("--learn: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, symlink};

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("fencefs-learn-out-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_symlink_at_out_is_replaced_and_its_target_never_written() {
        let d = dir("symlink");
        std::fs::write(d.join("victim"), b"keep me\n").unwrap();
        symlink(d.join("victim"), d.join("out.toml")).unwrap();
        let t = Target::open(&d.join("out.toml")).unwrap();
        assert_eq!(
            std::fs::read(d.join("victim")).unwrap(),
            b"keep me\n",
            "open"
        );
        t.replace(b"default = \"none\"\n").unwrap();
        assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"keep me\n");
        let m = std::fs::symlink_metadata(d.join("out.toml")).unwrap();
        assert!(m.file_type().is_file(), "a regular file now");
        assert_eq!(m.mode() & 0o7777, DRAFT_MODE);
        assert_eq!(
            std::fs::read(d.join("out.toml")).unwrap(),
            b"default = \"none\"\n"
        );
        // Again, over the draft itself: replaced whole (no old tail), nothing left over.
        t.replace(b"x\n").unwrap();
        assert_eq!(std::fs::read(d.join("out.toml")).unwrap(), b"x\n");
        assert_eq!(entries(&d), ["out.toml", "victim"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_at_out_or_an_unwritable_place_fails_at_open() {
        let d = dir("bad");
        std::fs::create_dir(d.join("out.toml")).unwrap();
        let e = Target::open(&d.join("out.toml"))
            .err()
            .expect("a directory");
        assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
        let e = Target::open(&d.join("missing/out.toml"))
            .err()
            .expect("no directory");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert!(Target::open(Path::new("/")).is_err(), "no file name");
        assert_eq!(entries(&d), ["out.toml"], "nothing left behind");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_rename_leaves_out_and_no_temporary_file() {
        let d = dir("fail");
        std::fs::write(d.join("out.toml"), b"old\n").unwrap();
        let t = Target::open(&d.join("out.toml")).unwrap();
        // OUT.toml turned into a non-empty directory after the start: rename fails.
        std::fs::remove_file(d.join("out.toml")).unwrap();
        std::fs::create_dir(d.join("out.toml")).unwrap();
        std::fs::write(d.join("out.toml/x"), b"").unwrap();
        assert!(t.replace(b"new\n").is_err());
        assert_eq!(entries(&d), ["out.toml"]);
        assert_eq!(entries(&d.join("out.toml")), ["x"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
