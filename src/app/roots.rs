//! The roots of a mount, built before it (`host/roots.rs` serves them): every `--root
//! PATH=DIR`, checked and opened, and the repository of a linked git worktree
//! (`host/worktree.rs`) unless `--no-git-worktree`.
//!
//! Invariants: with `--stage`, every root besides SOURCE is read-only (only SOURCE is
//! staged); a bad `--root` is one error line and nothing is mounted; a root's DIR is an
//! existing directory that neither holds SOURCE nor lies inside it (one host directory
//! has one path in the mount), nor holds the mount point (the mount would contain
//! itself, and the daemon would serve its own requests through it); PATH does not exist in SOURCE and its parent is a directory
//! of SOURCE; a worktree that cannot be served is logged and served as it is. A reload
//! reads `SOURCE/.git` again ([`redetect`]) and serves what it finds, under the same
//! checks, when its repository is one the workers' confinement covers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

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

fn one_root(value: &str, src: &Path, mnt: &Path) -> Result<Root, String> {
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
    // Mounting over DIR itself is fine (its handle is opened first), as for SOURCE.
    if mnt != dir && mnt.starts_with(&dir) {
        return Err(bad(format!(
            "{} holds the mount point {} (the mount would contain itself)",
            dir.display(),
            mnt.display()
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
    let git_label = "the repository of a linked worktree when SOURCE is one; its settings (hooks/, config, ...) and the main checkout's own state read-only, its index and other worktrees hidden".to_string();
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

/// How this mount's roots were made, kept for a reload to make them again
/// ([`redetect`]): one mount per process, so one plan.
struct Plan {
    src: PathBuf,
    /// The `--root` roots (no worktree, no staging fence).
    given: Roots,
    /// Linked worktrees are served (no `--no-git-worktree`).
    git: bool,
    stage: bool,
    /// The worktree served now.
    served: Option<worktree::Worktree>,
    /// A worktree was served once: its names stay the mount's (see [`finish`]).
    ever: bool,
    /// The host directories (`(st_dev, st_ino)`) the workers' Landlock domain covers
    /// besides SOURCE; `None` while there is no domain (any repository can be served).
    confined: Option<Vec<(u64, u64)>>,
}

static PLAN: Mutex<Option<Plan>> = Mutex::new(None);

/// Every root of the mount of `src` at `mnt` (both canonical).
pub fn build(a: &MountArgs, src: &Path, mnt: &Path) -> Result<Roots, String> {
    let mut given = Roots::default();
    for value in &a.root {
        let r = one_root(value, src, mnt)?;
        log::info!(
            "root: {} at {} in the mount",
            r.host.display(),
            String::from_utf8_lossy(&r.path)
        );
        given.add(r).map_err(|e| format!("--root '{value}': {e}"))?;
    }
    let mut plan = Plan {
        src: src.to_path_buf(),
        given,
        git: !a.no_git_worktree,
        stage: a.stage.is_some(),
        served: at_mount(a, src),
        ever: false,
        confined: None,
    };
    let out = finish(&mut plan)?;
    if plan.stage && out.iter().next().is_some() {
        log::info!("staging: the other roots are served read-only (they are not staged)");
    }
    *PLAN.lock() = Some(plan);
    Ok(out)
}

/// The roots of `plan` with the worktree it serves: the `--root` roots, the worktree's
/// roots and fences, staging's read-only fence on every root. Once a worktree was
/// served, `.fencefs-git` stays the mount's name while none is: hidden, so that a node
/// the kernel still holds from the repository served before reaches nothing.
fn finish(plan: &mut Plan) -> Result<Roots, String> {
    let mut out = plan.given.clone();
    if let Some(wt) = &plan.served {
        worktree::serve(wt, &plan.src, &mut out)?;
        plan.ever = true;
    } else if plan.ever {
        out.fence(worktree::GIT_ROOT.as_bytes(), true, roots::Fence::Hidden);
    }
    if plan.stage {
        // Staging keeps every change out of SOURCE until applied; the other roots are not
        // staged, so nothing may change them.
        let paths: Vec<Vec<u8>> = out.iter().map(|r| r.path.clone()).collect();
        for p in &paths {
            out.fence(p, true, roots::Fence::ReadOnly);
        }
    }
    Ok(out)
}

/// The linked worktree at `src` to serve at mount (none with `--no-git-worktree`).
fn at_mount(a: &MountArgs, src: &Path) -> Option<worktree::Worktree> {
    if a.no_git_worktree {
        if let Ok(Some(wt)) = worktree::detect(src) {
            log::info!(
                "git worktree {}: served as it is (--no-git-worktree); its .git names {}",
                wt.name,
                wt.private.display()
            );
        }
        return None;
    }
    match worktree::detect(src) {
        Ok(Some(wt)) => {
            served_line(&wt, "");
            Some(wt)
        }
        Ok(None) => None,
        Err(e) => {
            log::warn!("git worktree: not served ({e}); .git is served as it is");
            None
        }
    }
}

fn served_line(wt: &worktree::Worktree, when: &str) {
    log::info!(
        "git worktree {}{when}: the repository {} is served at {} (its settings and the main checkout's own state read-only, other worktrees hidden); --no-git-worktree turns this off",
        wt.name,
        wt.common.display(),
        worktree::GIT_ROOT
    );
}

/// Records what the workers' confinement covers (`harden.rs`, applied once): `dirs`, the
/// `(st_dev, st_ino)` of every root directory it was given besides SOURCE.
pub(super) fn confined(dirs: Vec<(u64, u64)>) {
    if let Some(plan) = PLAN.lock().as_mut() {
        plan.confined = Some(dirs);
    }
}

/// Whether the workers can reach `wt`'s repository: no confinement, or one given its
/// common dir (the same directory, wherever it was moved since).
fn covered(plan: &Plan, wt: &worktree::Worktree) -> bool {
    let key = std::fs::metadata(&wt.common).map(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    });
    match (&plan.confined, key) {
        (None, _) => true,
        (Some(dirs), Ok(k)) => dirs.contains(&k),
        (Some(_), Err(_)) => false,
    }
}

/// On a reload: reads `SOURCE/.git` again. Returns the roots to serve from now on when
/// what is to be served changed (a worktree appeared, its record changed, it is gone),
/// `None` when nothing changed. A worktree that cannot be served (its record does not
/// name SOURCE back; its repository is outside the workers' confinement, which is fixed
/// at mount) is logged and not served, as at mount; the rest of the reload goes on.
pub(super) fn redetect() -> Option<Roots> {
    let mut guard = PLAN.lock();
    let plan = guard.as_mut().filter(|p| p.git)?;
    let next = match worktree::detect(&plan.src) {
        Ok(Some(wt)) if plan.served.as_ref() == Some(&wt) => return None,
        Ok(Some(wt)) if !covered(plan, &wt) => {
            log::warn!(
                "git worktree {}: not served (its repository {} was not served at mount, and the daemon's confinement is fixed at mount: remount to serve it); .git is served as it is",
                wt.name,
                wt.common.display()
            );
            None
        }
        Ok(found) => found,
        Err(e) => {
            log::warn!("git worktree: not served ({e}); .git is served as it is");
            None
        }
    };
    if next == plan.served {
        return None;
    }
    let before = std::mem::replace(&mut plan.served, next);
    match finish(plan) {
        Ok(out) => {
            match &plan.served {
                Some(wt) => served_line(wt, " (detected on reload)"),
                None => log::info!(
                    "git worktree: SOURCE is no longer served as a linked worktree (reload); {} is hidden until the next mount",
                    worktree::GIT_ROOT
                ),
            }
            Some(out)
        }
        Err(e) => {
            log::warn!("git worktree: not served on reload ({e}); the roots stay as they were");
            plan.served = before;
            None
        }
    }
}

/// The first components of every root's path in `a` and `b`, and `.fencefs-git`: the
/// names at the top of the mount a change of roots changes.
pub(super) fn top_names(a: &Roots, b: &Roots) -> Vec<Vec<u8>> {
    let mut out = vec![worktree::GIT_ROOT.as_bytes().to_vec()];
    for r in a.iter().chain(b.iter()) {
        let top = r.path.split(|&c| c == b'/').next().unwrap_or(&r.path);
        if !out.iter().any(|n| n == top) {
            out.push(top.to_vec());
        }
    }
    out
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
