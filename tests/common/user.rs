//! A daemon run as an ordinary user (`MountBuilder::daemon_as_user`): `fencefs mount` as uid U
//! with no capabilities, mounting through the setuid `fusermount3` as an ordinary user
//! does — so a staged mount's markers are `user.overlay.*`, as the SPEC's "No root needed"
//! promises.
//!
//! Two things of this machine differ from a stock Debian one and are put right in a
//! private mount namespace of the daemon's own, never on the host: `/dev/fuse` is 0600
//! here (the fuse3 package makes it 0666; fuser opens it before it falls back to
//! fusermount3), so a 0666 node of it is bound over it there, and `/etc/fuse.conf` gets
//! `user_allow_other` there, so the test's own reads as root (the oracle's comparisons, the
//! checks) reach the user's mount (`--allow-other`). The agent's operations run as uid U,
//! as with `fencefs run`. The mount point's parent, `ROOT/mp`, is bound onto itself and
//! made shared before the daemon starts, so the mount the daemon makes in its namespace
//! shows in the test's (and its unmount too); the fixture unmounts that bind last.
//!
//! The workspace root, SOURCE (what setup put there) and the mount point are owned by U
//! (the daemon makes DIR and its control socket under ROOT, as a person's own files).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use super::{BIN, chown_tree, mkdirp, sh_in};

/// Prepares `root` (a fresh workspace) for a daemon as `uid` and returns the command that
/// runs `fencefs mount ARGS` as that uid in its own mount namespace.
pub fn daemon_command(root: &Path, uid: u32, args: &[OsString]) -> Command {
    for p in [root.to_path_buf(), root.join("mp/mnt")] {
        std::os::unix::fs::lchown(&p, Some(uid), Some(uid)).unwrap();
    }
    chown_tree(&root.join("src"), uid);
    mkdirp(&root.join("fusedev"));
    // The mount point's parent shared, so the daemon's mount propagates back here.
    sh_in(root, "mount --bind mp mp && mount --make-shared mp").assert_ok("shared bind of mp");
    let mut c = Command::new("unshare");
    c.args([
        "-m",
        "--propagation",
        "unchanged",
        "sh",
        "-c",
        AS_USER,
        "as-user",
    ])
    .args(args)
    .env("D", root.join("fusedev"))
    .env("U", uid.to_string())
    .env("BIN", BIN);
    c
}

/// The mount namespace's set-up, then `exec fencefs mount "$@"` as uid `$U` (the same pid
/// all along: the test signals it by its pid).
const AS_USER: &str = r#"set -e
mount -t tmpfs -o size=64k,mode=0755 fencefs-test-dev "$D"
mknod -m 0666 "$D/fuse" c 10 229
printf 'user_allow_other\n' > "$D/fuse.conf"
mount --bind "$D/fuse" /dev/fuse
mount --bind "$D/fuse.conf" /etc/fuse.conf
exec setpriv --reuid "$U" --regid "$U" --clear-groups "$BIN" mount "$@""#;

/// Undoes [`daemon_command`]'s bind of `ROOT/mp` (after the daemon and its mount are gone).
pub fn undo(root: &Path) {
    let _ = Command::new("umount").arg(root.join("mp")).status();
}
