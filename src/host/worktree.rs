//! Git linked worktrees: when SOURCE is one (`SOURCE/.git` is a file `gitdir: G`, G =
//! `COMMON/worktrees/NAME` outside SOURCE, as `git worktree add` makes), the mount serves
//! what git needs so that git works through it with no host path:
//!
//! ```text
//! MOUNT/.git                     a file: "gitdir: .fencefs-git/worktrees/NAME" (in memory)
//! MOUNT/.fencefs-git/            root: the repository's common dir COMMON, not listed
//!       objects/ refs/ packed-refs logs/ info/ HEAD ...   served
//!       hooks/  config  config.worktree  modules/  commondir  read-only (EROFS)
//!       index                                              hidden (the main checkout's)
//!       worktrees/NAME/          this worktree's private gitdir (HEAD, index, logs, ...)
//!       worktrees/NAME/{gitdir,commondir,config.worktree}  read-only
//!       worktrees/NAME/locked    "locked" while mounted (in memory, unless the host has one)
//!       worktrees/OTHER/         hidden: other worktrees' private dirs
//! ```
//!
//! Git reads a relative `gitdir:` in a `.git` file relative to the file's directory, and the
//! private dir's own `commondir` (`../..`) then leads to `.fencefs-git`: no file of the
//! repository is rewritten. The `locked` file keeps `git worktree prune` and `git gc`
//! inside the mount from removing the host's record of this worktree (its `gitdir` names
//! a host path that does not exist in a container).
//!
//! Invariants: the host's `.git` file and `worktrees/NAME/{gitdir,commondir}` are never
//! written (the served `.git` is a sealed memory file, the others are fenced read-only);
//! detection only reads; anything that is not exactly a linked worktree is served as is.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::roots::{Fence, Root, Roots};
use super::sys;

/// Where the common dir is served in the mount.
pub const GIT_ROOT: &str = ".fencefs-git";

/// A linked worktree found at SOURCE.
#[derive(Debug, Clone)]
pub struct Worktree {
    /// The worktree's name (`worktrees/NAME`).
    pub name: String,
    /// The repository's common dir (canonical).
    pub common: PathBuf,
    /// The worktree's private gitdir, `COMMON/worktrees/NAME` (canonical).
    pub private: PathBuf,
}

/// Reads `SOURCE/.git`: `Ok(Some)` for a linked worktree, `Ok(None)` for anything else
/// (no `.git`, a directory, a submodule's gitdir file), `Err` when it claims to be a
/// worktree and is broken (the reason).
pub fn detect(src: &Path) -> Result<Option<Worktree>, String> {
    let dotgit = src.join(".git");
    let Ok(md) = std::fs::symlink_metadata(&dotgit) else {
        return Ok(None);
    };
    if !md.file_type().is_file() || md.len() > 4096 {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&dotgit).map_err(|e| format!("{}: {e}", dotgit.display()))?;
    let Some(target) = text.strip_prefix("gitdir:").map(str::trim) else {
        return Ok(None);
    };
    let gitdir = src.join(target);
    let private =
        std::fs::canonicalize(&gitdir).map_err(|e| format!("gitdir {}: {e}", gitdir.display()))?;
    if private.starts_with(src) {
        return Ok(None);
    }
    let Ok(commondir) = std::fs::read_to_string(private.join("commondir")) else {
        // A submodule's gitdir (`.git/modules/X`) has no commondir: not a worktree.
        return Ok(None);
    };
    let common = std::fs::canonicalize(private.join(commondir.trim()))
        .map_err(|e| format!("commondir of {}: {e}", private.display()))?;
    let name = private
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| format!("{}: no worktree name", private.display()))?;
    if private.parent() != Some(common.join("worktrees").as_path()) {
        return Err(format!(
            "{} is not in {}/worktrees",
            private.display(),
            common.display()
        ));
    }
    if common.starts_with(src) || src.starts_with(&common) {
        return Err(format!(
            "the common dir {} and SOURCE are nested",
            common.display()
        ));
    }
    Ok(Some(Worktree {
        name,
        common,
        private,
    }))
}

/// A listed root that is a sealed memory file holding `content`, owned like `like`.
fn memfile(path: &str, label: &str, content: &[u8], like: &Path) -> io::Result<Root> {
    let md = std::fs::metadata(like)?;
    let fd = sys::sealed_memfd(content, md.uid(), md.gid(), 0o444)?;
    root(path, like.to_path_buf(), label, fd, true)
}

fn root(path: &str, host: PathBuf, label: &str, fd: OwnedFd, listed: bool) -> io::Result<Root> {
    let st = sys::fstat(fd.as_fd())?;
    Ok(Root {
        path: path.as_bytes().to_vec(),
        host,
        label: label.to_string(),
        fd: Arc::new(fd),
        key: (st.st_dev, st.st_ino),
        kind: st.st_mode & libc::S_IFMT,
        listed,
    })
}

/// Adds the roots and fences that serve worktree `wt` of SOURCE `src` (layout above).
pub fn serve(wt: &Worktree, src: &Path, roots: &mut Roots) -> Result<(), String> {
    let err = |e: io::Error| format!("git worktree: {e}");
    let common = sys::open_root(&wt.common).map_err(err)?;
    let r = root(GIT_ROOT, wt.common.clone(), "git common dir", common, false).map_err(err)?;
    roots.add(r)?;
    let gitfile = format!("gitdir: {GIT_ROOT}/worktrees/{}\n", wt.name);
    let dotgit = memfile(
        ".git",
        "worktree .git",
        gitfile.as_bytes(),
        &src.join(".git"),
    );
    roots.add(dotgit.map_err(err)?)?;
    let private = format!("{GIT_ROOT}/worktrees/{}", wt.name);
    if !wt.private.join("locked").exists() {
        let why = b"served by fencefs: not to be pruned while mounted\n";
        let locked = memfile(
            &format!("{private}/locked"),
            "worktree lock",
            why,
            &wt.private,
        );
        roots.add(locked.map_err(err)?)?;
    }
    roots.fence(b".git", false, Fence::ReadOnly);
    // The policy's rules for `.git/...` (protected, presets, a hidden .git) apply to the
    // served repository as well: it is decided under both names.
    roots.alias(GIT_ROOT.as_bytes(), b".git");
    let g = |p: &str| format!("{GIT_ROOT}/{p}").into_bytes();
    roots.fence(&g("hooks"), true, Fence::ReadOnly);
    roots.fence(&g("config"), false, Fence::ReadOnly);
    roots.fence(&g("config.worktree"), false, Fence::ReadOnly);
    // A `commondir` in the common dir would send the host's own git in the main checkout
    // to another repository (and its config); submodules' gitdirs hold config and hooks.
    roots.fence(&g("commondir"), false, Fence::ReadOnly);
    roots.fence(&g("modules"), true, Fence::ReadOnly);
    roots.fence(&g("index"), false, Fence::Hidden);
    roots.fence(&g("worktrees"), false, Fence::ReadOnly);
    roots.keep_only(&g("worktrees"), wt.name.as_bytes());
    for f in ["", "/gitdir", "/commondir", "/config.worktree", "/locked"] {
        roots.fence(format!("{private}{f}").as_bytes(), false, Fence::ReadOnly);
    }
    Ok(())
}
