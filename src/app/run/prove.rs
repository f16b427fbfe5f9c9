//! `fencefs run` fails closed: before COMMAND starts, prove from inside the namespace that
//! each fence is really there. The directory's device is no longer the host's, the topmost
//! mount at its path is `fuse.fencefs`, and the first few names at its top that the policy
//! hides (read from the real directory before the mount) answer ENOENT through it.
//!
//! Invariants: [`Before::take`] runs before the fence is mounted (it sees the host);
//! [`Before::check`] after, and only reads. A failed proof is one line naming what it saw.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::policy::{Access, Caller};

/// How many hidden names are probed at most.
const PROBES: usize = 8;
/// How many top-level names are looked at for them.
const SCAN: usize = 4096;

/// What the host showed before the fence went up.
pub(super) struct Before {
    dir: PathBuf,
    dev: u64,
    names: Vec<std::ffi::OsString>,
}

impl Before {
    /// The directory's device and its first top-level names.
    pub(super) fn take(dir: &Path) -> Result<Before, String> {
        let md = std::fs::metadata(dir).map_err(|e| format!("'{}': {e}", dir.display()))?;
        let names = std::fs::read_dir(dir)
            .map_err(|e| format!("'{}': {e}", dir.display()))?
            .take(SCAN)
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        Ok(Before {
            dir: dir.to_path_buf(),
            dev: md.dev(),
            names,
        })
    }

    /// Proves the fence at the directory, judging names by `policy` (its layer files).
    pub(super) fn check(&self, policy: &[PathBuf], uid: u32, gid: u32) -> Result<(), String> {
        let d = self.dir.display();
        let fail = |what: String| {
            Err(format!(
                "the fence at {d} is not up ({what}); not starting COMMAND"
            ))
        };
        let md = match std::fs::metadata(&self.dir) {
            Ok(md) => md,
            Err(e) => return fail(format!("stat: {e}")),
        };
        if md.dev() == self.dev {
            return fail("its device is still the host's".into());
        }
        match super::super::mount::top_mount_type(&self.dir) {
            Some(t) if t == "fuse.fencefs" => {}
            t => return fail(format!("the mount there is {t:?}, not fuse.fencefs")),
        }
        let root = crate::host::sys::open_root(&self.dir).map_err(|e| format!("{d}: {e}"))?;
        let policy = crate::reload::load_in(policy, None, Some(std::os::fd::AsFd::as_fd(&root)))
            .map_err(|e| {
                format!(
                    "policy: {}",
                    e.first().map(|e| e.to_string()).unwrap_or_default()
                )
            })?;
        let caller = Caller::new(uid, gid);
        let hidden = self
            .names
            .iter()
            .filter(|n| policy.verdict(n.as_bytes(), caller).effective == Access::None)
            .take(PROBES);
        for n in hidden {
            let p = self.dir.join(n);
            match std::fs::symlink_metadata(&p) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                r => {
                    return fail(format!(
                        "'{}', hidden by the policy, answers {:?}",
                        p.display(),
                        r.map(|_| "exists").map_err(|e| e.to_string())
                    ));
                }
            }
        }
        Ok(())
    }
}
