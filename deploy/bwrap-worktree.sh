#!/bin/sh
# An agent on a git linked worktree in bubblewrap, with nothing of the host but the
# mount (docs/src/worktrees.md). Run as root; the agent runs as uid/gid 1000.
#
#   deploy/bwrap-worktree.sh ~/repo-wt1 [POLICY]
#
# git works inside with no host path: the mount serves the repository at
# /workspace/.fencefs-git (hooks/ and config read-only, other worktrees hidden).
set -eu
wt=$(realpath "$1")
policy=${2:-/etc/fencefs/policy.toml}
mnt=/run/fencefs/$(basename "$wt")
mkdir -p "$mnt"
fencefs mount -p "$policy" --allow-other "$wt" "$mnt" &
daemon=$!
trap 'fusermount3 -u "$mnt"; wait "$daemon"' EXIT
while ! grep -q " $mnt fuse.fencefs " /proc/self/mountinfo; do sleep 0.1; done
setpriv --reuid=1000 --regid=1000 --clear-groups \
  bwrap --unshare-user --uid 1000 --gid 1000 --unshare-pid --die-with-parent \
    --ro-bind /usr /usr --ro-bind /etc /etc \
    --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
    --bind "$mnt" /workspace --dev /dev --proc /proc --tmpfs /tmp \
    --chdir /workspace --setenv HOME /tmp \
    sh -c 'git status && git log --oneline -3; exec sh'
