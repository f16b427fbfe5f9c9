#!/usr/bin/env bash
# cpu-per-op.sh: the daemon's own CPU time per FUSE request, for one metadata workload
# at a time, on a private ext4 image (so the file-system-wide fanotify watch sees only
# this run). Wall time on a shared machine is noise; the daemon's task-clock (perf stat
# -p, every thread) per operation is what a change to the daemon moves.
#
#   sudo scripts/cpu-per-op.sh [-n N] [-r ROUNDS] [-p POLICY] [-u UID] [-w WORKLOADS] TARGET...
#
# TARGET: fencefs | fencefs-uring | fencefs-nowatch | fencefs-nowatch-uring | fencefs-stage | fencefs-stage-uring
# | passthrough_hp | passthrough_hp-uring | bindfs (fencefs-stage*: with `--stage DIR`, a
# fresh DIR on the image every round, so every change is staged and SOURCE untouched;
# passthrough_hp: passthrough_hp: $PASSTHROUGH_HP, a libfuse example/passthrough_hp binary, else
# the one scripts/bench/passthrough-hp.sh builds with io_uring into
# /tmp/fencefs-bench-work/cache/libfuse, as bench.sh does;
# bindfs: `bindfs -f`, libfuse's high-level, path-based API; $FENCEFS_BIN: another
# fencefs binary, e.g. a build from before a change).
# Workloads, N files each (default 5000) in one directory:
#   create   open(O_CREAT|O_EXCL) + write 4 bytes + close   (LOOKUP CREATE GETXATTR RELEASE)
#   lookup   lstat of every name after a remount + drop_caches   (LOOKUP)
#   unlink   unlink of every name (names cached)             (UNLINK)
#   setattr  chmod of every name just created (names cached)  (SETATTR)
#   mkdir    mkdir of N new directories                      (LOOKUP MKDIR)
#   rmdir    rmdir of them (names cached)                    (RMDIR)
# and on a tree of N files, 16 to a directory, after a remount + drop_caches:
#   find     `find` of the tree                              (OPENDIR READDIRPLUS RELEASEDIR)
#   lslr     `ls -lR` of the tree                            (the same + LOOKUP, GETXATTR)
# and, only when named in -w (a comma list; default create,lookup,unlink,find,lslr;
# setattr needs create, rmdir needs mkdir):
#   clone    `git clone -q --no-hardlinks` of a bare clone of this repository, from the
#            mount into the mount (bench.sh's agent row): ms of daemon CPU per clone and
#            the clone's wall ms through the mount, against its wall ms on the image itself
# -u UID: the workloads run as UID (its files, created as the caller: setfsuid).
# Prints µs of daemon CPU per file, the median of ROUNDS (default 3). With PROFILE=DIR,
# each run is also recorded (`perf record -g`; PERF_ARGS replaces `-g`, e.g.
# PERF_ARGS="-e cpu-clock:u --call-graph dwarf"; PERF_FREQ sets -F) to
# DIR/TARGET-WORKLOAD.data.
# -x: the daemon's context switches per file instead (perf's context-switches event,
# every thread): each is a sleep and a wake-up of a daemon thread.
# -s: the daemon's syscalls per file instead (`strace -c -f -p`, every thread; strace
# slows the daemon, so never with the CPU figures); each run's table is kept in
# $SYSCALLS (default target/tmp/syscalls)/TARGET-WORKLOAD.txt.
set -euo pipefail
N=5000 ROUNDS=3 POLICY= AS=() WL=create,lookup,unlink,find,lslr SYS=0 EV=task-clock
while getopts n:r:p:u:w:sx o; do case $o in n) N=$OPTARG ;; r) ROUNDS=$OPTARG ;; p) POLICY=$OPTARG ;; s) SYS=1 ;; x) EV=context-switches ;;
    u) AS=(setpriv --reuid="$OPTARG" --regid="$OPTARG" --clear-groups) ;; w) WL=$OPTARG ;; *) exit 2 ;; esac; done
IFS=, read -ra WLS <<<"$WL"
for w in "${WLS[@]}"; do case $w in create | lookup | unlink | setattr | mkdir | rmdir | find | lslr | clone) ;; *) echo "unknown workload $w" >&2; exit 2 ;; esac; done
[[ ,$WL, =~ ,(lookup|unlink|setattr), && ,$WL, != *,create,* ]] && { echo "lookup, unlink and setattr use the files create makes: name create too" >&2; exit 2; }
[[ ,$WL, == *,rmdir,* && ,$WL, != *,mkdir,* ]] && { echo "rmdir removes the directories mkdir makes: name mkdir too" >&2; exit 2; }
OTHER=() # other users reach a root-mounted FUSE file system only with allow_other
((${#AS[@]})) && OTHER=(--allow-other)
shift $((OPTIND - 1))
(($#)) || { sed -n 2,28p "$0"; exit 2; }
HERE=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/bench/uring-check.sh
source "$HERE/scripts/bench/uring-check.sh"
if [[ " $* " == *" passthrough_hp"* && -z ${PASSTHROUGH_HP:-} ]]; then
    PASSTHROUGH_HP=$("$HERE/scripts/bench/passthrough-hp.sh" /tmp/fencefs-bench-work/cache/libfuse)
fi
if [[ -z ${FENCEFS_BIN:-} ]]; then # the checkout's code, never a stale release build
    (cd "$HERE" && cargo build --release --locked --quiet) || { echo "cargo build failed" >&2; exit 1; }
fi
BIN=${FENCEFS_BIN:-$HERE/target/release/fencefs}
POLICY=${POLICY:-$HERE/policy.example.toml}
WORK=$HERE/target/tmp/cpu-per-op.$$
IMG=$WORK/img SRC=$WORK/fs/src MNT=$WORK/mnt STAGE=$WORK/fs/stage
PID=
mkdir -p "$WORK/fs" "$MNT"
cleanup() {
    unmount || true
    mountpoint -q "$WORK/fs" && umount "$WORK/fs"
    rm -rf "$WORK"
}
trap cleanup EXIT
truncate -s 2G "$IMG"
mkfs.ext4 -q -F "$IMG"
mount -o loop "$IMG" "$WORK/fs"
mkdir -p "$SRC/d" "$SRC/m"
for ((i = 0; i < N / 16; i++)); do
    mkdir -p "$SRC/t/d$i"
    for ((j = 0; j < 16; j++)); do : >"$SRC/t/d$i/f$j"; done
done
if [[ ,$WL, == *,clone,* ]]; then
    git clone -q --bare --no-hardlinks "$HERE" "$SRC/repo.git"
    ((${#AS[@]})) && chown -R "${AS[1]#--reuid=}:${AS[1]#--reuid=}" "$SRC/repo.git"
fi
((${#AS[@]})) && chown -R "${AS[1]#--reuid=}:${AS[1]#--reuid=}" "$SRC/d" "$SRC/m" "$SRC/t"

unmount() {
    [[ -n $PID ]] || return 0
    fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true
    local i
    for ((i = 0; i < 200; i++)); do kill -0 "$PID" 2>/dev/null || break; sleep 0.05; done
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=
}

mounted() { awk -v m="$MNT" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }

mount_t() {
    local t=$1
    case $t in
    fencefs) "$BIN" mount -p "$POLICY" "${OTHER[@]}" --transport dev-fuse "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    fencefs-uring) "$BIN" mount -p "$POLICY" "${OTHER[@]}" --transport io-uring "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    fencefs-nowatch) "$BIN" mount -p "$POLICY" "${OTHER[@]}" --no-watch --transport dev-fuse "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    fencefs-nowatch-uring) "$BIN" mount -p "$POLICY" "${OTHER[@]}" --no-watch --transport io-uring "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    fencefs-stage) "$BIN" mount -p "$POLICY" "${OTHER[@]}" --stage "$STAGE" --transport dev-fuse "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    fencefs-stage-uring) "$BIN" mount -p "$POLICY" "${OTHER[@]}" --stage "$STAGE" --transport io-uring "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    passthrough_hp) "$PASSTHROUGH_HP" --foreground ${OTHER:+-o allow_other} "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    passthrough_hp-uring) "$PASSTHROUGH_HP" --foreground -o io_uring ${OTHER:+-o allow_other} "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    bindfs) bindfs -f ${OTHER:+-o allow_other} "$SRC" "$MNT" 2>>"$WORK/log" & ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
    esac
    PID=$!
    local i
    for ((i = 0; i < 400; i++)); do
        if mounted; then # the transport the name claims, from the daemon's descriptors
            transport_check "$t" "$PID" "$MNT" >/dev/null && return 0
            exit 1
        fi
        sleep 0.025
    done
    echo "mount of $t failed: $(tail -n 3 "$WORK/log")" >&2
    exit 1
}

# cpu WORKLOAD [DIV]: runs it while perf counts the daemon's task-clock; prints µs per
# file (DIV = N), or ms per run (DIV = 1000: clone, followed by /WALL_MS of the run)
cpu() {
    local div=${2:-$N}
    if ((SYS)); then
        local out=${SYSCALLS:=$HERE/target/tmp/syscalls}/$T-$1.txt
        mkdir -p "$SYSCALLS"
        strace -c -f -q -p "$PID" -o "$out" &
        local sp=$!
        sleep 1 # attached to every thread
        "run_$1"
        sleep 0.2
        kill -INT $sp
        wait $sp 2>/dev/null || true
        awk -v n="$div" '$NF == "total" { printf "%.2f", $4 / n }' "$out"
        return 0
    fi
    perf stat -x, -e "$EV" -p "$PID" -o "$WORK/perf" &
    local pp=$! rp=
    if [[ -n ${PROFILE:-} ]]; then
        mkdir -p "$PROFILE"
        perf record -q ${PERF_ARGS:--g} ${PERF_FREQ:+-F $PERF_FREQ} -p "$PID" -o "$PROFILE/$T-$1.data" 2>/dev/null &
        rp=$!
    fi
    sleep 0.3
    local t0 t1
    t0=$(date +%s%N)
    "run_$1"
    t1=$(date +%s%N)
    sleep 0.2
    kill -INT $pp ${rp:+$rp}
    wait $pp ${rp:+$rp} 2>/dev/null || true
    awk -F, -v n="$div" -v ev="$EV" '$3 ~ ev { printf "%.2f", $1 * (ev == "task-clock" ? 1000 : 1) / n }' "$WORK/perf"
    [[ $div == 1000 ]] && printf '/%d' $(((t1 - t0) / 1000000))
    return 0
}

run_create() { "${AS[@]}" /usr/bin/python3 - "$MNT/d" "$N" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, b"abc\n")
    os.close(fd)
EOF
}
run_lookup() { "${AS[@]}" /usr/bin/python3 - "$MNT/d" "$N" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    os.lstat(f"{d}/f{i}")
EOF
}
run_unlink() { "${AS[@]}" /usr/bin/python3 - "$MNT/d" "$N" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    os.unlink(f"{d}/f{i}")
EOF
}
run_setattr() { "${AS[@]}" /usr/bin/python3 - "$MNT/d" "$N" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    os.chmod(f"{d}/f{i}", 0o640)
EOF
}
run_mkdir() { "${AS[@]}" /usr/bin/python3 - "$MNT/m" "$N" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    os.mkdir(f"{d}/d{i}", 0o755)
EOF
}
run_rmdir() { "${AS[@]}" /usr/bin/python3 - "$MNT/m" "$N" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    os.rmdir(f"{d}/d{i}")
EOF
}
run_clone() { "${AS[@]}" git clone -q --no-hardlinks "$MNT/repo.git" "$MNT/dst"; }
run_find() { "${AS[@]}" find "$MNT/t" >/dev/null; }
run_lslr() { "${AS[@]}" ls -lR "$MNT/t" >/dev/null; }
cold() { unmount; sync; echo 3 >/proc/sys/vm/drop_caches; mount_t "$1"; }
median() { tr ' ' '\n' | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

printf 'target'
for w in "${WLS[@]}"; do printf '\t%s' "$w"; done
if [[ $EV == context-switches ]]; then printf '\t(daemon context switches per file, median of %s, N=%s' "$ROUNDS" "$N"; elif ((SYS)); then printf '\t(daemon syscalls per file, median of %s, N=%s' "$ROUNDS" "$N"; else printf '\t(µs of daemon CPU per file, median of %s, N=%s' "$ROUNDS" "$N"; fi
[[ ,$WL, == *,clone,* ]] && printf '; clone: ms of daemon CPU/wall ms per clone'
printf ')\n'
if [[ ,$WL, == *,clone,* ]]; then # the clone's own wall time, no FUSE (the same image)
    CN=()
    for ((r = 0; r < ROUNDS; r++)); do
        t0=$(date +%s%N)
        "${AS[@]}" git clone -q --no-hardlinks "$SRC/repo.git" "$SRC/dst"
        CN+=($((($(date +%s%N) - t0) / 1000000)))
        rm -rf "$SRC/dst"
    done
    printf 'native clone wall ms: %s\n' "${CN[*]}"
fi
has() { [[ ,$WL, == *,$1,* ]]; }
for t in "$@"; do
    T=$t
    declare -A R=()
    for ((r = 0; r < ROUNDS; r++)); do
        rm -rf "$STAGE"
        mount_t "$t"
        has create && R[create]+=" $(cpu create)"
        has setattr && R[setattr]+=" $(cpu setattr)"
        if has lookup || has unlink; then
            cold "$t"
            has lookup && R[lookup]+=" $(cpu lookup)"
            has unlink && R[unlink]+=" $(cpu unlink)"
        fi
        has mkdir && R[mkdir]+=" $(cpu mkdir)"
        has rmdir && R[rmdir]+=" $(cpu rmdir)"
        has find && { cold "$t"; R[find]+=" $(cpu find)"; }
        has lslr && { cold "$t"; R[lslr]+=" $(cpu lslr)"; }
        if has clone; then
            cold "$t"
            R[clone]+=" $(cpu clone 1000)"
            rm -rf "$MNT/dst"
        fi
        unmount
        find "$SRC/d" "$SRC/m" -mindepth 1 -delete # what a workload list left (no unlink, rmdir)
    done
    printf '%s' "$t"
    for w in "${WLS[@]}"; do printf '\t%s' "$(echo ${R[$w]} | median)"; done
    printf '\n'
    unset R
done
