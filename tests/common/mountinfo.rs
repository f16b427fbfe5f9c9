//! Reading /proc/self/mountinfo: whether a path is a mount point, its type and options.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The fstype of the last mount at exactly `mnt` (per /proc/self/mountinfo), if any.
pub fn mount_fstype(mnt: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mnt.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 5 || unescape_mountinfo(fields[4]) != want {
            continue;
        }
        let fstype = fields
            .iter()
            .position(|f| *f == "-")
            .and_then(|i| fields.get(i + 1))
            .map(|s| s.to_string())
            .unwrap_or_default();
        found = Some(fstype);
    }
    found
}

pub fn is_mounted(mnt: &Path) -> bool {
    mount_fstype(mnt).is_some()
}

/// The mount options (per-mount and super options) of the mount at `mnt`.
pub fn mount_options(mnt: &Path) -> Option<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mnt.as_os_str().as_bytes();
    info.lines()
        .rfind(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.len() > 5 && unescape_mountinfo(f[4]) == want
        })
        .map(|l| l.to_string())
}
