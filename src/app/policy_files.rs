//! `--watch-policy`: reloads when a policy file given with `-p` changes, by watching its
//! directory (inotify), not the file: an editor replaces the file by a rename, and the
//! kubelet updates a ConfigMap volume by writing a new timestamped directory
//! (`..2026_12_06_…`), pointing a `..data_tmp` symlink at it and renaming that over
//! `..data` (the file itself, `policy.toml -> ..data/policy.toml`, never changes). Either
//! way an event names the file or `..data` in the watched directory.
//!
//! Invariants: the thread only pokes the debounced reload thread (`policy_watch`), which
//! reads the files and, when they are invalid, keeps the policy in force and says so in
//! the log and the audit (`threads::reload_now`); both threads start before the daemon
//! confines itself (the files are outside SOURCE).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::fs::ops::Shared;

/// The names in a watched directory whose change means "reload".
fn names_for(file: &Path) -> (PathBuf, BTreeSet<OsString>) {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut names = BTreeSet::new();
    if let Some(n) = file.file_name() {
        names.insert(n.to_os_string());
    }
    // A ConfigMap's atomic swap renames over `..data`.
    names.insert(OsString::from("..data"));
    (dir, names)
}

/// Watches the directories of `files` and starts the reload thread it pokes.
pub(super) fn start(files: &[PathBuf], shared: &Arc<Shared>) -> Result<(), String> {
    if files.is_empty() {
        log::warn!("--watch-policy: no -p file to watch");
        return Ok(());
    }
    let ino = Inotify::init(InitFlags::IN_CLOEXEC).map_err(|e| format!("inotify: {e}"))?;
    let mut dirs: BTreeMap<PathBuf, BTreeSet<OsString>> = BTreeMap::new();
    for f in files {
        let (d, n) = names_for(f);
        dirs.entry(d).or_default().extend(n);
    }
    let flags = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_ATTRIB;
    let mut watches = BTreeMap::new();
    for (d, names) in dirs {
        let wd = ino
            .add_watch(&d, flags)
            .map_err(|e| format!("--watch-policy: cannot watch '{}': {e}", d.display()))?;
        watches.insert(wd, names);
    }
    let trigger = super::policy_watch::start(shared.clone(), "a -p policy file")?;
    std::thread::Builder::new()
        .name("fencefs-policy-files".into())
        .spawn(move || {
            loop {
                let events = match ino.read_events() {
                    Ok(ev) => ev,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        log::error!("--watch-policy: inotify: {e}; policy files no longer watched");
                        return;
                    }
                };
                let hit = events.iter().any(|e| {
                    e.name
                        .as_ref()
                        .is_some_and(|n| watches.get(&e.wd).is_some_and(|s| s.contains(n)))
                });
                if hit {
                    trigger.poke();
                }
            }
        })
        .map_err(|e| e.to_string())?;
    log::info!("policy files: watched (--watch-policy); a change reloads");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_and_a_configmap_swap_are_watched() {
        let (d, n) = names_for(Path::new("/etc/fencefs/policy.toml"));
        assert_eq!(d, PathBuf::from("/etc/fencefs"));
        assert!(n.contains(&OsString::from("policy.toml")));
        assert!(n.contains(&OsString::from("..data")));
    }
}
