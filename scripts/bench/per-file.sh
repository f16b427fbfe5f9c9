#!/usr/bin/env bash
# scripts/bench/per-file.sh: wall time, daemon CPU and daemon context switches per file
# of bench.sh's two write rows (`fsops create DIR N 100`, then `fsops unlink` of the same
# names, so every name is cached: UNLINK alone reaches the daemon, a FORGET follows), with
# the targets alternating inside every round on one private ext4 image.
#
#   sudo scripts/bench/per-file.sh [-n N] [-r ROUNDS] TARGET...
#
# TARGET: native | fencefs | fencefs-uring | passthrough_hp | passthrough_hp-uring
# ($FENCEFS_BIN: another fencefs binary; $PASSTHROUGH_HP as in bench.sh, else the build of
# scripts/bench/passthrough-hp.sh). Each mount's transport is checked as bench.sh does.
# CPU: utime + stime of every daemon thread (/proc/PID/stat, 10 ms ticks: ±2 µs per file
# at N = 5000); switches: voluntary + involuntary of every daemon thread.
set -euo pipefail
N=5000 ROUNDS=3
while getopts n:r: o; do case $o in n) N=$OPTARG ;; r) ROUNDS=$OPTARG ;; *) exit 2 ;; esac; done
shift $((OPTIND - 1))
(($#)) || { sed -n 2,13p "$0"; exit 2; }
HERE=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/bench/uring-check.sh
source "$HERE/scripts/bench/uring-check.sh"
BIN=${FENCEFS_BIN:-$HERE/target/release/fencefs}
if [[ " $* " == *" passthrough_hp"* && -z ${PASSTHROUGH_HP:-} ]]; then
    PASSTHROUGH_HP=$("$HERE/scripts/bench/passthrough-hp.sh" /tmp/fencefs-bench-work/cache/libfuse)
fi
WORK=$HERE/target/tmp/per-file.$$
SRC=$WORK/fs/src MNT=$WORK/mnt PID=
mkdir -p "$WORK/fs" "$MNT"
unmount() {
    [[ -n $PID ]] || return 0
    fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
    local i
    for ((i = 0; i < 200; i++)); do kill -0 "$PID" 2>/dev/null || break; sleep 0.05; done
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=
}
cleanup() {
    unmount || true
    mountpoint -q "$WORK/fs" && umount "$WORK/fs"
    rm -rf "$WORK"
}
trap cleanup EXIT
truncate -s 2G "$WORK/img"
mkfs.ext4 -q -F "$WORK/img"
mount -o loop "$WORK/img" "$WORK/fs"
mkdir -p "$SRC"
gcc -O2 -o "$WORK/fsops" "$HERE/scripts/bench/fsops.c"

mounted() { awk -v m="$MNT" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }
mount_t() {
    local t=$1 i
    case $t in
    native) PID=; return 0 ;;
    fencefs) "$BIN" mount -p "$HERE/policy.example.toml" --transport dev-fuse "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    fencefs-uring) "$BIN" mount -p "$HERE/policy.example.toml" --transport io-uring "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    passthrough_hp) "$PASSTHROUGH_HP" --foreground "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    passthrough_hp-uring) "$PASSTHROUGH_HP" --foreground -o io_uring "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
    esac
    PID=$!
    for ((i = 0; i < 400; i++)); do
        if mounted; then transport_check "$t" "$PID" "$MNT" >/dev/null && return 0; exit 1; fi
        sleep 0.025
    done
    echo "mount of $t failed: $(tail -n 3 "$WORK/log")" >&2
    exit 1
}
ticks() { [[ -n $PID ]] && awk '{ print $14 + $15 }' "/proc/$PID/stat" || echo 0; }
switches() { [[ -n $PID ]] && cat /proc/"$PID"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { n += $2 } END { print n + 0 }' || echo 0; }
HZ=$(getconf CLK_TCK)
# one WORKLOAD on the mounted target: prints "wall cpu switches" per file
measure() {
    local d=$1 op=$2 t0 t1 c0 c1 s0 s1
    c0=$(ticks) s0=$(switches) t0=$(date +%s%N)
    if [[ $op == create ]]; then "$WORK/fsops" create "$d" "$N" 100 >/dev/null; else "$WORK/fsops" unlink "$d" "$N" >/dev/null; fi
    t1=$(date +%s%N)
    sleep 0.05 # the FORGETs that follow the last unlinks
    c1=$(ticks) s1=$(switches)
    awk -v n="$N" -v hz="$HZ" -v w=$((t1 - t0)) -v c=$((c1 - c0)) -v s=$((s1 - s0)) \
        'BEGIN { printf "%.1f %.1f %.2f", w / 1000 / n, c * 1e6 / hz / n, s / n }'
}
printf 'round\ttarget\tcreate wall/cpu µs/switches\tunlink wall/cpu µs/switches (per file, N=%s)\n' "$N"
for ((r = 1; r <= ROUNDS; r++)); do
    for t in "$@"; do
        mount_t "$t"
        d=$MNT/d
        [[ $t == native ]] && d=$SRC/d
        mkdir "$d"
        c=$(measure "$d" create)
        sync
        sleep 0.2
        u=$(measure "$d" unlink)
        rmdir "$d"
        unmount
        printf '%s\t%s\t%s\t%s\n' "$r" "$t" "${c// //}" "${u// //}"
    done
done
