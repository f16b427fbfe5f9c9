//! Git linked worktrees: when SOURCE is one (`SOURCE/.git` is a file `gitdir: G`, G =
//! `COMMON/worktrees/NAME` outside SOURCE, as `git worktree add` makes), the mount serves
//! what git needs so that git works through it with no host path:
//!
//! ```text
//! MOUNT/.git                     a file: "gitdir: .fencefs-git/worktrees/NAME" (in memory)
//! MOUNT/.fencefs-git/            root: the repository's common dir COMMON, not listed
//!       objects/ refs/ packed-refs logs/ info/ ...        served (the shared part, [`SHARED`])
//!       everything else at the top: hooks/ config shallow   read-only (EROFS): settings, and
//!         HEAD ORIG_HEAD MERGE_* FETCH_HEAD rebase-merge/ ... the main checkout's own state
//!       info/{grafts,attributes,exclude,sparse-checkout}   read-only
//!       refs/{bisect,rewritten,worktree}/                  read-only (the main checkout's)
//!       index  logs/HEAD  logs/refs/{bisect,...}/          hidden (the main checkout's)
//!       worktrees/NAME/          this worktree's private gitdir (HEAD, index, logs, ...)
//!       worktrees/NAME/{gitdir,commondir,config.worktree}  read-only
//!       worktrees/NAME/locked    "locked" while mounted (in memory, unless the host has one)
//!       worktrees/NAME/gitdir    "./.git" (in memory: `git worktree list` shows `.`)
//!       objects/XX/HASH, objects/pack/pack-*.{pack,idx}    kept: made, never removed
//!       worktrees/OTHER/         hidden: other worktrees' private dirs
//! ```
//!
//! Git reads a relative `gitdir:` in a `.git` file relative to the file's directory, and the
//! private dir's own `commondir` (`../..`) then leads to `.fencefs-git`: no file of the
//! repository is rewritten. The `locked` file keeps `git worktree prune` and `git gc`
//! inside the mount from removing the host's record of this worktree (its `gitdir` names
//! a host path that does not exist in a container).
//!
//! Invariants: a worktree is served only when the link goes both ways (`SOURCE/.git`
//! names `worktrees/NAME`, whose `gitdir` names `SOURCE/.git`); the host's `.git` file
//! and `worktrees/NAME/{gitdir,commondir}` are never written (the served `.git` is a sealed memory file, the others are fenced read-only);
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    // The link must go both ways: the private dir's `gitdir` names this `.git` (git
    // writes it so). SOURCE's `.git` is the agent's to write; the other end is not, so a
    // `.git` naming another repository's worktree does not get that repository served.
    let back = std::fs::read_to_string(private.join("gitdir")).unwrap_or_default();
    // (relative to the private dir with `worktree.useRelativePaths`)
    let back = std::fs::canonicalize(private.join(back.trim())).ok();
    if back.as_deref() != std::fs::canonicalize(&dotgit).ok().as_deref() {
        return Err(format!(
            "{}/gitdir does not name {}",
            private.display(),
            dotgit.display()
        ));
    }
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

/// The served `worktrees/NAME/gitdir` record (see [`serve`]).
pub const RECORD: &[u8] = b"./.git\n";

/// Whether `rest`, a path below the common dir's `objects/`, is a loose object
/// (`XX/` + 38 or 62 hex digits) or a pack (`pack/pack-*.pack`, its `.idx`): what is
/// kept (`Fence::Kept`).
pub fn object_shape(rest: &[u8]) -> bool {
    let hex = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_hexdigit);
    let mut parts = rest.split(|&b| b == b'/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(dir), Some(name), None) if dir.len() == 2 && hex(dir) => {
            matches!(name.len(), 38 | 62) && hex(name)
        }
        (Some(b"pack"), Some(name), None) => {
            name.starts_with(b"pack-") && (name.ends_with(b".pack") || name.ends_with(b".idx"))
        }
        _ => false,
    }
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
    // What `git worktree list` prints for this worktree: the record's path, less
    // `/.git`. The host's names a host path; this one is `.`, the worktree's top (git
    // before 2.48 prints a record as written; see the worktrees chapter).
    let record = memfile(
        &format!("{private}/gitdir"),
        "worktree record",
        RECORD,
        &wt.private.join("gitdir"),
    );
    roots.add(record.map_err(err)?)?;
    roots.fence(b".git", false, Fence::ReadOnly);
    // The policy's rules for `.git/...` (protected, presets, a hidden .git) apply to the
    // served repository as well: it is decided under both names.
    roots.alias(GIT_ROOT.as_bytes(), b".git");
    let g = |p: &str| format!("{GIT_ROOT}/{p}").into_bytes();
    main_checkout_fences(roots, &g);
    // The objects other worktrees (and the main checkout) may need, which git inside
    // cannot see as reachable (their HEADs, indexes and reflogs are hidden): `git gc` and
    // `git prune` inside may write new packs but remove no object; `alternates` would
    // send the host's git to another object store.
    roots.keep(&g("objects"), object_shape);
    roots.fence(&g("objects/info/alternates"), false, Fence::ReadOnly);
    roots.fence(&g("worktrees"), false, Fence::ReadOnly);
    roots.keep_only(&g("worktrees"), wt.name.as_bytes());
    for f in ["", "/gitdir", "/commondir", "/config.worktree", "/locked"] {
        roots.fence(format!("{private}{f}").as_bytes(), false, Fence::ReadOnly);
    }
    Ok(())
}

/// The entries of the common dir git shares between worktrees and writes from a linked
/// one (git's `common_list` in path.c, less the settings; the lock and temporary names git
/// writes `packed-refs` and `gc.pid` through; the reftable store; git-lfs's objects): every
/// other entry at
/// its top is the main checkout's own state (its `HEAD`, `index`, `ORIG_HEAD`,
/// `FETCH_HEAD`, `MERGE_*`, `CHERRY_PICK_HEAD`, `REVERT_HEAD`, `AUTO_MERGE`, `BISECT_*`,
/// `rebase-merge/`, `sequencer/`, ...) or the repository's settings (`config`, `hooks/`,
/// `info/`'s files, `shallow`, `commondir`, `modules/`), which git in a linked worktree
/// keeps in its private dir or never writes: read-only.
const SHARED: &[&[u8]] = &[
    b"objects",
    b"refs",
    b"logs",
    b"packed-refs",
    b"packed-refs.lock",
    b"packed-refs.new",
    b"worktrees",
    b"info",
    b"branches",
    b"remotes",
    b"rr-cache",
    b"svn",
    b"lost-found",
    b"common",
    b"gc.pid",
    b"gc.pid.lock",
    b"reftable",
    b"lfs",
];

/// Fences the main checkout's state and the repository's settings in the served common
/// dir (`g` names a path in it): everything at its top but [`SHARED`] read-only, and
/// below the shared entries, what is still per worktree or a setting.
fn main_checkout_fences(roots: &mut Roots, g: &dyn Fn(&str) -> Vec<u8>) {
    roots.writable_only(GIT_ROOT.as_bytes(), SHARED);
    // The main checkout's index: hidden (what is staged there is its own).
    roots.fence(&g("index"), false, Fence::Hidden);
    // Its reflogs of per-worktree refs: hidden, so `git reflog expire --all` (and `git
    // gc`) inside neither rewrites them nor tries to lock the main checkout's HEAD.
    roots.fence(&g("logs/HEAD"), false, Fence::Hidden);
    roots.fence(&g("logs/HEAD.lock"), false, Fence::ReadOnly);
    for d in ["bisect", "rewritten", "worktree"] {
        // Its per-worktree refs (a linked worktree's are in its private dir).
        roots.fence(&g(&format!("refs/{d}")), true, Fence::ReadOnly);
        roots.fence(&g(&format!("logs/refs/{d}")), true, Fence::Hidden);
    }
    // Settings in info/: history (`grafts`), how files diff and merge (`attributes`),
    // what the main checkout's git ignores (`exclude`) and checks out (`sparse-checkout`).
    for f in ["grafts", "attributes", "exclude", "sparse-checkout"] {
        roots.fence(&g(&format!("info/{f}")), true, Fence::ReadOnly);
    }
}

#[cfg(test)]
mod tests {
    use super::object_shape;

    #[test]
    fn objects_and_packs_are_kept_and_temporary_files_are_not() {
        let loose = format!("ab/{}", "0".repeat(38));
        let sha256 = format!("ab/{}", "f".repeat(62));
        for p in [&loose, &sha256, "pack/pack-1a2b.pack", "pack/pack-1a2b.idx"] {
            assert!(object_shape(p.as_bytes()), "{p}");
        }
        let short = format!("ab/{}", "0".repeat(37));
        let deep = format!("ab/{}/x", "0".repeat(38));
        let not_hex = format!("zz/{}", "0".repeat(38));
        for p in [
            short.as_str(),
            deep.as_str(),
            not_hex.as_str(),
            "ab/tmp_obj_XYZ",
            "pack/tmp_pack_123",
            "pack/.tmp-1-pack-1a2b.pack",
            "pack/pack-1a2b.rev",
            "pack/pack-1a2b.keep",
            "info/packs",
            "info/commit-graph",
            "ab",
            "",
        ] {
            assert!(!object_shape(p.as_bytes()), "{p}");
        }
    }
}
