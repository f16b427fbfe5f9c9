//! `fencefs run` fails closed: before COMMAND starts, prove from inside the namespace that
//! each fence is really there. The directory's device is no longer the host's, the topmost
//! mount at its path is `fuse.fencefs`, the first few names at its top that the policy
//! hides (read from the real directory before the mount) answer ENOENT through it, and the
//! first few it keeps read-only (that the host lets the caller write) refuse a write
//! (access(2) with W_OK: nothing is written).
//!
//! Invariants: [`Before::take`] runs before the fence is mounted (it sees the host);
//! [`Before::check`] after, and only reads. A failed proof is one line naming what it saw.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::unistd::{AccessFlags, access};

use crate::policy::{Access, Caller};

/// How many hidden names are probed at most.
const PROBES: usize = 8;
/// How many top-level names are looked at for them.
const SCAN: usize = 4096;

/// What the host showed before the fence went up.
pub(super) struct Before {
    dir: PathBuf,
    dev: u64,
    /// The first top-level names, each with whether the host let the caller write it.
    names: Vec<(OsString, bool)>,
}

impl Before {
    /// The directory's device and its first top-level names.
    pub(super) fn take(dir: &Path) -> Result<Before, String> {
        let md = std::fs::metadata(dir).map_err(|e| format!("'{}': {e}", dir.display()))?;
        let names = std::fs::read_dir(dir)
            .map_err(|e| format!("'{}': {e}", dir.display()))?
            .take(SCAN)
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .map(|n| {
                let w = access(&dir.join(&n), AccessFlags::W_OK).is_ok();
                (n, w)
            })
            .collect();
        Ok(Before {
            dir: dir.to_path_buf(),
            dev: md.dev(),
            names,
        })
    }

    /// Proves the fence at the directory, judging names by `policy` (its layer files);
    /// `other` is a path below it that another fence serves (the workspace in $HOME).
    pub(super) fn check(
        &self,
        policy: &[PathBuf],
        uid: u32,
        gid: u32,
        other: Option<&Path>,
    ) -> Result<(), String> {
        self.mounted()
            .and_then(|()| self.names_decided(policy, Caller::new(uid, gid), other))
            .map_err(|what| {
                format!(
                    "the fence at {} is not up ({what}); not starting COMMAND",
                    self.dir.display()
                )
            })
    }

    /// The directory is a fencefs mount now: another device, `fuse.fencefs` on top.
    fn mounted(&self) -> Result<(), String> {
        let md = std::fs::metadata(&self.dir).map_err(|e| format!("stat: {e}"))?;
        if md.dev() == self.dev {
            return Err("its device is still the host's".into());
        }
        match super::super::mount::top_mount_type(&self.dir) {
            Some(t) if t == "fuse.fencefs" => Ok(()),
            t => Err(format!("the mount there is {t:?}, not fuse.fencefs")),
        }
    }

    /// Names the policy hides answer ENOENT; names it keeps read-only (that the host lets
    /// the caller write) refuse a write (access(2) W_OK: nothing is written).
    fn names_decided(
        &self,
        policy: &[PathBuf],
        caller: Caller,
        other: Option<&Path>,
    ) -> Result<(), String> {
        let root = crate::host::sys::open_root(&self.dir).map_err(|e| e.to_string())?;
        let policy = crate::reload::load_in(policy, None, Some(root.as_fd())).map_err(|e| {
            format!(
                "policy: {}",
                e.first().map(|e| e.to_string()).unwrap_or_default()
            )
        })?;
        let (mut hidden, mut read_only) = (0, 0);
        for (n, host_writable) in &self.names {
            let p = self.dir.join(n);
            if other == Some(p.as_path()) {
                continue;
            }
            match policy.verdict(n.as_bytes(), caller).effective {
                Access::None if hidden < PROBES => {
                    hidden += 1;
                    match std::fs::symlink_metadata(&p) {
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                        r => {
                            let r = r.map(|_| "exists").map_err(|e| e.to_string());
                            return Err(format!(
                                "'{}', hidden by the policy, answers {r:?}",
                                p.display()
                            ));
                        }
                    }
                }
                Access::List | Access::Read if *host_writable && read_only < PROBES => {
                    read_only += 1;
                    if access(&p, AccessFlags::W_OK).is_ok() {
                        return Err(format!(
                            "'{}', read-only by the policy, is writable",
                            p.display()
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}
