//! Before the mount: the checks on SOURCE and MOUNTPOINT, the signal mask, the policy and
//! audit writer to start with, the FUSE session's settings and the descriptor budget, and
//! reading `/proc/self/mountinfo`.
//!
//! Invariants: nothing here mounts or starts a FUSE worker. [`block_signals`] must run
//! before any thread exists (every later thread inherits the mask). A check that fails
//! returns one line naming the bad input and what to do about it; [`top_mount`] reads
//! mountinfo only and never touches the path itself (it may be a FUSE mount nobody serves).

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use fuser::{Config, MountOption, SessionACL};
use nix::sys::signal::{SigSet, Signal};

use crate::audit::{Audit, Rotation, Target};
use crate::cli::MountArgs;
use crate::host::handle::Handles;
use crate::host::sys;
use crate::policy::Policy;
use crate::reload;

/// The file system type of the topmost mount exactly at `path`, if one is there.
fn top_mount_type(path: &Path) -> Option<String> {
    top_mount(&path.canonicalize().ok()?).map(|m| m.fstype)
}

/// One mount as `/proc/self/mountinfo` lists it.
pub(super) struct MountEntry {
    /// `major:minor` of the mounted file system (unique per FUSE connection).
    pub(super) dev: String,
    fstype: String,
}

/// The topmost mount exactly at the canonical path `canon` (read from mountinfo only: no
/// syscall on the path itself, which may be a FUSE mount nobody serves yet).
pub(super) fn top_mount(canon: &Path) -> Option<MountEntry> {
    let info = std::fs::read("/proc/self/mountinfo").ok()?;
    let target = canon.as_os_str().as_bytes();
    // Later lines are mounted on top of earlier ones.
    info.split(|&b| b == b'\n')
        .rev()
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            if fields.get(4).is_none_or(|mp| unescape(mp) != target) {
                return None;
            }
            let sep = fields.iter().position(|f| *f == b"-")?;
            Some(MountEntry {
                dev: String::from_utf8_lossy(fields.get(2)?).into_owned(),
                fstype: String::from_utf8_lossy(fields.get(sep + 1)?).into_owned(),
            })
        })
        .next()
}

fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

fn find_in_path(bin: &str) -> bool {
    if let Some(p) = std::env::var_os("FUSERMOUNT_PATH") {
        return Path::new(&p).exists();
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

pub(super) fn startup_checks(a: &MountArgs) -> Result<(PathBuf, PathBuf), String> {
    let src = &a.source;
    let md = std::fs::metadata(src).map_err(|e| format!("source '{}': {e}", src.display()))?;
    if !md.is_dir() {
        return Err(format!("source '{}' is not a directory", src.display()));
    }
    let mnt = &a.mountpoint;
    let mm = std::fs::metadata(mnt).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            format!(
                "mount point '{}': {e}: a FUSE daemon died there; detach it with \
                 `fusermount3 -u -z {}`",
                mnt.display(),
                mnt.display()
            )
        } else {
            format!("mount point '{}': {e}", mnt.display())
        }
    })?;
    if !mm.is_dir() {
        return Err(format!(
            "mount point '{}' is not a directory",
            mnt.display()
        ));
    }
    // Busy: a FUSE file system (another fencefs, say) is already mounted exactly there.
    // Other mounts (a Docker bind target, a Kubernetes volume) are fine to mount over.
    if let Some(t) = top_mount_type(mnt).filter(|t| t == "fuse" || t.starts_with("fuse.")) {
        return Err(format!(
            "mount point '{}' is busy: a {t} file system is already mounted there \
             (if its daemon is gone: fusermount3 -u -z {})",
            mnt.display(),
            mnt.display()
        ));
    }
    let src = src
        .canonicalize()
        .map_err(|e| format!("source '{}': {e}", src.display()))?;
    let mnt_c = mnt
        .canonicalize()
        .map_err(|e| format!("mount point '{}': {e}", mnt.display()))?;
    // Mounting over SOURCE itself is fine (the root handle is opened first); anything
    // strictly inside would make the mirror contain itself.
    if mnt_c != src && mnt_c.starts_with(&src) {
        return Err(format!(
            "mount point '{}' lies inside the source '{}'",
            mnt_c.display(),
            src.display()
        ));
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse is missing: load the fuse module or pass --device /dev/fuse".into());
    }
    if !find_in_path("fusermount3") {
        return Err("fusermount3 not found in PATH: install the fuse3 package".into());
    }
    if a.allow_other && sys::geteuid() != 0 {
        let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
        if !conf.lines().any(|l| l.trim() == "user_allow_other") {
            return Err(
                "--allow-other needs 'user_allow_other' in /etc/fuse.conf when not run as root"
                    .into(),
            );
        }
    }
    if a.cache_ttl
        .is_some_and(|t| !t.is_finite() || !(0.0..=3600.0).contains(&t))
    {
        return Err("--cache-ttl must be between 0 and 3600 seconds".into());
    }
    Ok((src, mnt_c))
}

/// Blocks the signals the signal thread handles; must run before any thread exists.
pub(super) fn block_signals() -> Result<SigSet, String> {
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGHUP, Signal::SIGINT, Signal::SIGTERM] {
        sigs.add(s);
    }
    sigs.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;
    Ok(sigs)
}

/// The policy to mount with, and its layers' files (canonical, for reloads).
pub(super) fn load_policy(
    a: &MountArgs,
    source: std::os::fd::BorrowedFd<'_>,
) -> Result<(Policy, Vec<PathBuf>), String> {
    let invalid = |errs: Vec<crate::policy::PolicyError>| {
        // One line: every error, separated by "; ".
        let all: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        format!("invalid policy: {}", all.join("; "))
    };
    // Errors name the files as given.
    let policy = reload::load_in(&a.policy, a.mode, Some(source)).map_err(invalid)?;
    let files = a
        .policy
        .iter()
        .map(|p| {
            p.canonicalize()
                .map_err(|e| format!("policy '{}': {e}", p.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Named by the canonical paths, as every reload reads them: audit lines keep one name.
    let policy = if files == a.policy {
        policy
    } else {
        reload::load_in(&files, a.mode, Some(source)).map_err(invalid)?
    };
    Ok((policy, files))
}

/// Starts the audit writer when `--audit` is given.
pub(super) fn start_audit(a: &MountArgs) -> Result<Option<Audit>, String> {
    let Some(t) = &a.audit else { return Ok(None) };
    let target = if t == "-" {
        Target::Stderr
    } else {
        Target::File(PathBuf::from(t))
    };
    let rotation = Rotation {
        max_size: a.audit_max_size,
        keep: a.audit_keep,
    };
    Audit::start(target, a.audit_allowed, rotation)
        .map(Some)
        .map_err(|e| format!("audit file '{t}': {e}"))
}

/// FUSE session settings: mount options, who may use the mount, worker threads.
/// `src` is the canonical SOURCE: the mount table names it as the mount's source.
pub(super) fn session_config(a: &MountArgs, src: &Path, threads: usize) -> Config {
    let mut opts = vec![
        MountOption::FSName(fsname(src)),
        // As root fuser calls mount(2) itself, which ignores `Subtype`; the kernel takes
        // `subtype=` as a mount option, so the type reads `fuse.fencefs` either way.
        MountOption::CUSTOM("subtype=fencefs".into()),
        MountOption::NoSuid,
        MountOption::NoDev,
    ];
    if a.allow_other {
        opts.push(MountOption::DefaultPermissions);
    }
    let mut config = Config::default();
    config.mount_options = opts;
    config.acl = if a.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(threads);
    config.clone_fd = true;
    config
}

/// The mount's source in the mount table (findmnt, df, /proc/self/mountinfo): SOURCE, as
/// bindfs and sshfs show theirs. A path that is not UTF-8, or holds a comma, a backslash
/// or a control character (which fusermount3's option list and mount(2) would read
/// differently), shows as `fencefs`.
pub(super) fn fsname(src: &Path) -> String {
    match src.to_str() {
        Some(s) if !s.chars().any(|c| c == ',' || c == '\\' || c.is_control()) => s.to_string(),
        _ => "fencefs".to_string(),
    }
}

/// Descriptors kept back from open handles for the daemon's own work: the FUSE channels,
/// the audit file, fanotify, and the short-lived opens of every worker.
const FD_RESERVE: usize = 256;
/// Handle table entries: for all uids together, and for one uid.
const HANDLES_TOTAL: usize = 262_144;
const HANDLES_PER_UID: usize = 65_536;

/// The handle table with its budgets: what is left of RLIMIT_NOFILE after the `O_PATH`
/// cache and a reserve goes to handles that hold a descriptor, a quarter of it (or
/// `--max-open-per-uid`) at most to one uid, so one caller cannot starve the others.
pub(super) fn handle_budget(
    nofile: usize,
    fd_cache: usize,
    threads: usize,
    cap: Option<u32>,
) -> Handles {
    let pool = nofile
        .saturating_sub(fd_cache + FD_RESERVE + 8 * threads)
        .max(64);
    let per_uid = cap.map_or(pool / 4, |n| n as usize);
    log::info!(
        "descriptors: {pool} for open handles, at most {} for one uid (RLIMIT_NOFILE {nofile}, {fd_cache} cached lookups)",
        per_uid.min(pool)
    );
    Handles::new(pool, per_uid, HANDLES_TOTAL, HANDLES_PER_UID)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(b"/tmp/a\\040b"), b"/tmp/a b");
        assert_eq!(unescape(b"/x"), b"/x");
    }

    #[test]
    fn fsname_is_source_unless_it_would_be_misread() {
        assert_eq!(fsname(Path::new("/srv/work")), "/srv/work");
        assert_eq!(fsname(Path::new("/srv/my work")), "/srv/my work");
        for odd in ["/srv/a,b", "/srv/a\\b", "/srv/a\nb"] {
            assert_eq!(fsname(Path::new(odd)), "fencefs", "{odd:?}");
        }
        let not_utf8 = std::ffi::OsStr::from_bytes(b"/srv/\xff");
        assert_eq!(fsname(Path::new(not_utf8)), "fencefs");
    }
}
