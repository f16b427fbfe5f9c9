//! The roots of a mount, built before it (`host/roots.rs` serves them): every `--root
//! PATH=DIR`, checked and opened, and the repository of a linked git worktree
//! (`host/worktree.rs`) unless `--no-git-worktree`.
//!
//! Invariants: with `--stage`, every root besides SOURCE is read-only (only SOURCE is
//! staged); a bad `--root` is one error line and nothing is mounted; a root's DIR is an
//! existing directory that neither holds SOURCE nor lies inside it (one host directory
//! has one path in the mount); PATH does not exist in SOURCE and its parent is a directory
//! of SOURCE; a worktree that cannot be served is logged and served as it is.

use std::path::Path;
use std::sync::Arc;

use crate::cli::MountArgs;
use crate::host::roots::{self, Root, Roots};
use crate::host::{sys, worktree};

/// Splits a `--root` value: `PATH=DIR` (or `PATH:DIR`, the `-o root=PATH:DIR` form).
pub(super) fn split(value: &str) -> Result<(&str, &str), String> {
    value
        .split_once('=')
        .or_else(|| value.split_once(':'))
        .filter(|(p, d)| !p.is_empty() && !d.is_empty())
        .ok_or_else(|| format!("--root '{value}': expected PATH=DIR"))
}

fn one_root(value: &str, src: &Path) -> Result<Root, String> {
    let (path, dir) = split(value)?;
    let bad = |why: String| format!("--root '{value}': {why}");
    let norm = roots::normalize(path).map_err(bad)?;
    let first = norm.split(|&b| b == b'/').next().unwrap_or(&norm);
    if first == crate::fs::notes::NAME || first == worktree::GIT_ROOT.as_bytes() {
        return Err(bad(format!(
            "{} is a name the mount keeps for itself",
            String::from_utf8_lossy(first)
        )));
    }
    let dir = std::fs::canonicalize(dir).map_err(|e| bad(format!("{dir}: {e}")))?;
    if !dir.is_dir() {
        return Err(bad(format!("{} is not a directory", dir.display())));
    }
    if dir.starts_with(src) || src.starts_with(&dir) {
        return Err(bad(format!(
            "{} and SOURCE {} are nested",
            dir.display(),
            src.display()
        )));
    }
    let at = src.join(path);
    if std::fs::symlink_metadata(&at).is_ok() {
        return Err(bad(format!("{path} exists in SOURCE")));
    }
    let parent = at.parent().unwrap_or(src);
    let parent_ok = std::fs::symlink_metadata(parent).is_ok_and(|m| m.file_type().is_dir());
    if !parent_ok {
        return Err(bad(format!(
            "the parent of {path} is not a directory of SOURCE"
        )));
    }
    let fd = sys::open_root(&dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
    let st = sys::fstat(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| bad(e.to_string()))?;
    Ok(Root {
        path: norm,
        label: dir.display().to_string(),
        host: dir,
        fd: Arc::new(fd),
        key: (st.st_dev, st.st_ino),
        kind: libc::S_IFDIR,
        listed: true,
    })
}

/// The `root:` line of `explain`: which root `path` (in the mount) is in, from the
/// `--root` values (not opened) and the place a linked worktree's repository is served.
pub(super) fn describe(values: &[String], path: &[u8]) -> Result<String, String> {
    let mut best: Option<(Vec<u8>, String)> = None;
    let git = worktree::GIT_ROOT.as_bytes().to_vec();
    let git_label = "the repository of a linked worktree when SOURCE is one; hooks/ and config read-only, index and other worktrees hidden".to_string();
    let mut all = vec![(git, git_label)];
    for v in values {
        let (p, d) = split(v)?;
        all.push((roots::normalize(p)?, d.to_string()));
    }
    for (p, label) in all {
        let inside = path == p.as_slice()
            || (path.len() > p.len() && path.starts_with(&p) && path[p.len()] == b'/');
        if inside && best.as_ref().is_none_or(|(b, _)| p.len() > b.len()) {
            best = Some((p, label));
        }
    }
    Ok(match best {
        Some((p, label)) => format!("{} ({label})", String::from_utf8_lossy(&p)),
        None => "SOURCE".to_string(),
    })
}

/// The second name a path of a linked worktree's served repository is decided under
/// (`.fencefs-git/X` is also `.git/X`), for `explain`.
pub(super) fn git_alias(path: &[u8]) -> Option<Vec<u8>> {
    let mut r = Roots::default();
    r.alias(worktree::GIT_ROOT.as_bytes(), b".git");
    r.alias_of(path)
}

/// Every root of the mount of `src` (canonical).
pub fn build(a: &MountArgs, src: &Path) -> Result<Roots, String> {
    let mut out = Roots::default();
    for value in &a.root {
        let r = one_root(value, src)?;
        log::info!(
            "root: {} at {} in the mount",
            r.host.display(),
            String::from_utf8_lossy(&r.path)
        );
        out.add(r).map_err(|e| format!("--root '{value}': {e}"))?;
    }
    let mut out = worktree_roots(a, src, out)?;
    if a.stage.is_some() {
        // Staging keeps every change out of SOURCE until applied; the other roots are not
        // staged, so nothing may change them.
        let paths: Vec<Vec<u8>> = out.iter().map(|r| r.path.clone()).collect();
        for p in &paths {
            out.fence(p, true, roots::Fence::ReadOnly);
        }
        if !paths.is_empty() {
            log::info!("staging: the other roots are served read-only (they are not staged)");
        }
    }
    Ok(out)
}

/// Adds the roots of a linked worktree at `src` (unless `--no-git-worktree`).
fn worktree_roots(a: &MountArgs, src: &Path, mut out: Roots) -> Result<Roots, String> {
    if a.no_git_worktree {
        if let Ok(Some(wt)) = worktree::detect(src) {
            log::info!(
                "git worktree {}: served as it is (--no-git-worktree); its .git names {}",
                wt.name,
                wt.private.display()
            );
        }
        return Ok(out);
    }
    match worktree::detect(src) {
        Ok(Some(wt)) => match worktree::serve(&wt, src, &mut out) {
            Ok(()) => log::info!(
                "git worktree {}: the repository {} is served at {} (hooks/ and config read-only, other worktrees hidden); --no-git-worktree turns this off",
                wt.name,
                wt.common.display(),
                worktree::GIT_ROOT
            ),
            Err(e) => return Err(e),
        },
        Ok(None) => {}
        Err(e) => log::warn!("git worktree: not served ({e}); .git is served as it is"),
    }
    Ok(out)
}

/// Adds to fanotify group `fan` the file system of every root directory not on SOURCE's
/// (`source`) file system: host changes there reach the kernel's caches too.
pub(super) fn watch(
    fan: &std::os::fd::OwnedFd,
    roots: &Roots,
    source: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<()> {
    let mut devs = vec![sys::fstat(source)?.st_dev];
    for r in roots.iter().filter(|r| r.kind == libc::S_IFDIR) {
        if !devs.contains(&r.key.0) {
            devs.push(r.key.0);
            crate::watch::mark(fan, std::os::fd::AsFd::as_fd(&*r.fd))?;
        }
    }
    Ok(())
}
