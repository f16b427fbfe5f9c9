#!/bin/sh
# Entrypoint of the fencefs image (deploy/Dockerfile): runs /usr/local/bin/fencefs with
# the container's arguments. For `mount … MOUNTPOINT` it first prepares MOUNTPOINT:
#  - a dead fencefs mount left there by a crashed predecessor (the kernel keeps it:
#    "Transport endpoint is not connected", and fencefs cannot mount over it) is
#    detached, so `restart: unless-stopped` / a restarted sidecar comes back; a live
#    mount is left alone (fencefs then reports the mount point as busy);
#  - the directory is created (it usually lives inside a freshly bound, empty directory).
# Then fencefs replaces this shell (exec), so it is PID 1 and gets SIGTERM/SIGHUP itself.
set -eu
BIN=/usr/local/bin/fencefs

if [ "${1:-}" = mount ] && [ "$#" -ge 3 ]; then
    for mp in "$@"; do :; done # the last argument
    case $mp in
    -*) ;; # not a path: let fencefs report the usage error
    *)
        if awk -v mp="$mp" '$5 == mp && / - fuse\.fencefs / { found = 1 } END { exit !found }' \
            /proc/self/mountinfo && ! stat "$mp" >/dev/null 2>&1; then
            echo "fencefs entrypoint: detaching the dead fencefs mount at $mp" >&2
            fusermount3 -u -z "$mp" || umount -l "$mp" || true
        fi
        mkdir -p "$mp"
        ;;
    esac
fi
exec "$BIN" "$@"
