#!/usr/bin/env bash
# scripts/bench.sh — fencefs benchmark against the native directory and bindfs.
#
# Runs the same workloads on five targets, alternating targets inside every round:
#   native          the source directory itself (no FUSE)
#   bindfs          `bindfs -f SRC MNT` (a plain pass-through FUSE file system)
#   fencefs         `fencefs mount -m MODE -p POLICY [--transport dev-fuse] SRC MNT`
#   fencefs-uring   the same with `--transport io-uring` (FUSE over io_uring; the script
#                   sets /sys/module/fuse/parameters/enable_uring=Y for it and restores the
#                   old value on exit). Only when `fencefs mount --help` lists --transport:
#                   otherwise it is skipped (logged, noted in the header) and the other
#                   fencefs targets run without the flag.
#   fencefs-revoke  `fencefs ... --revoke` (with --transport dev-fuse when available)
#   fencefs-stage-uring  fencefs-uring with `--stage DIR` (every change staged in DIR, a
#                   fresh empty directory beside the mount point at every mount; SOURCE
#                   untouched; only when asked for in --targets)
#   passthrough_hp, passthrough_hp-uring (only when asked for in --targets)
#                   libfuse's example/passthrough_hp, `--foreground SRC MNT`, the second
#                   with `-o io_uring`: the low-level C peer, no policy. $PASSTHROUGH_HP, or
#                   else built once by scripts/bench/passthrough-hp.sh from Debian's fuse3
#                   source (>= 3.18) with liburing into DIR/cache/libfuse.
#   passthrough_hp-overlay-uring (only when asked for in --targets)
#                   the peer doing what staging does: kernel overlayfs (lowerdir=SRC, a
#                   fresh upperdir and workdir beside the mount point at every mount)
#                   under passthrough_hp -o io_uring — every change lands in the upper,
#                   SOURCE untouched, as fencefs-stage-uring. The fair column for the
#                   staged rows (a host change to SOURCE while it is mounted is
#                   undefined for overlayfs: the rmrf_host row may fail on it).
# Every FUSE mount is checked from the daemon's descriptors (scripts/bench/uring-check.sh):
# a *-uring target needs enable_uring=Y and anon_inode:[io_uring] fds, any other target
# must hold none; a target that fails the check fails its cells (FAIL, reason in errors).
# Medians over --runs rounds are printed as one table with ratios to native and saved
# as TSV + JSON (+ every sample, the errors and the daemon logs) under --out.
# A workload that fails on a target is recorded as FAIL for that cell; the run goes on.
#
# Workloads (full size; --quick uses about a fifth and skips the cold/1k-rule/no-op rows):
#   tree   15,000 files (150 dirs x 100): find, ls -lR, lstat of every file (C loop,
#          scripts/bench/fsops.c), each cold then warm; lstat warm again under a
#          generated 1,000-rule policy. Daemon VmRSS/VmHWM/fd count after the walk.
#   git    `git status` in a 3,000-file repository: 1st run after a fresh mount (host
#          page cache warm), cold, warm. Each target gets its own copy of the repo.
#   write  create 5,000 100-byte files / unlink them (C loop); untar a 5,000-file
#          synthetic source tarball (uncompressed, as root: chown + utimens per file)
#          and `rm -rf` it. `sync` (untimed) before each.
#   dd     1 GiB sequential write with conv=fsync, sequential read cold and hot.
#   fio    4k random reads, psync, 256 MiB file, 10 s, hot page cache (--invalidate=0).
#   build  `make -j2` of a generated 50-file C project, then a no-op `make -j2`.
#   agent  what a coding agent runs, each row in a fresh directory on the target
#          (removed afterwards, untimed):
#          - `/usr/bin/python3 -m venv .venv && .venv/bin/pip install --no-index
#            --find-links WHEELHOUSE` of 12 real packages (requests, idna, urllib3, certifi,
#            charset-normalizer, six, packaging, attrs, pygments, jinja2, markupsafe,
#            click) from a local wheelhouse;
#          - `git clone --no-hardlinks SRC.git dst`: SRC.git is a bare clone of THIS
#            repository (fencefs, the largest real repository on the machine), taken once;
#          - sqlite WAL: 10,000 single-row transactions (python sqlite3, a commit each,
#            default synchronous = FULL);
#          - `npm install --offline --cache CACHE` of lodash, express, chalk, commander
#            (74 packages) from a local npm cache, in a fresh copy of the project;
#          - `meson setup build && ninja -C build` of a generated 60-file C project.
#          The wheelhouse, the npm cache and SRC.git are prepared once (the only network
#          use: PyPI and the npm registry) under DIR/cache and reused by later runs.
# "cold" = FUSE target unmounted and remounted (fresh daemon) + sync + drop_caches;
# "warm" = the same command again right after. Every group mounts its target afresh.
# The time is taken inside the child shell (process start-up excluded).
# Policy (--policy): by default the agent group runs under the repository's
# policy.example.toml in workspace-write mode (the policy meant for agent workspaces),
# every other group in mode danger with a 4-rule policy (secrets none, **/*.pem none,
# **/.env none, docs read); --policy example / --policy small use one of them everywhere.
# --loopfs puts everything the targets see (native source, FUSE sources, mount points) on
# a private, freshly made ext4 image (loop mount), so other processes' journal traffic on
# the host file system stays out of the create/delete rows, and fencefs's fanotify watch
# (a mark on SOURCE's whole file system) sees only the benchmark's own changes; the image
# is unmounted, its loop device detached and the file removed on exit.
# --count (one untimed round) counts the FUSE requests each workload sends to each FUSE
# target, by opcode, with the kernel's fuse:fuse_request_send tracepoint in a private
# tracefs instance (filtered on the mount's connection; FORGETs not included), or,
# without that tracepoint, with `strace -f -p DAEMON` (reads on /dev/fuse, io_uring_enter).
# Results are only as quiet as the machine: check loadavg in the header and the
# per-sample spread in *.samples.tsv / the JSON "samples" before trusting a ratio.
#
# Run as root (drop_caches, FUSE and loop mounts). Needs: gcc, make, git, tar, fio,
# bindfs, fusermount3; for the agent group python3 (venv, pip), sqlite3 (python), npm,
# meson, ninja; `apt-get install -y bindfs fio` is tried when they are missing.
# Usage: scripts/bench.sh [--quick] [--runs N] [--dir DIR] [--out DIR] [--bin PATH]
#        [--build] [--threads N] [--targets LIST] [--only GROUPS] [--policy P]
#        [--loopfs [SIZE]] [--count] [--timeout SEC] [--help]
# shellcheck disable=SC2016 # commands and checks are strings, expanded when they run
set -uo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)

usage() {
    cat <<EOF
usage: scripts/bench.sh [options]
  --quick           small sizes, 1 run, slow rows skipped (cold rows, 1k-rule row,
                    make no-op); finishes in under two minutes
  --runs N          rounds per workload, median reported (default 3; --quick: 1)
  --dir DIR         work directory; the native target is DIR/full/src (DIR/quick/src
                    with --quick), FUSE mounts go on DIR/mnt (default
                    /tmp/fencefs-bench-work; the generated data is kept and reused by
                    later runs, delete the directory by hand)
  --out DIR         results directory (default /tmp/fencefs-bench)
  --bin PATH        fencefs binary (default \$REPO/target/release/fencefs, built with
                    'cargo build --release' first: the checkout's code); copied into DIR/bin first so
                    concurrent rebuilds cannot swap it mid-run
  --build           (kept for old command lines: the checkout's binary is always rebuilt
                    when --bin is not given, cargo does nothing when it is fresh)
  --threads N       pass --threads N to fencefs
  --targets LIST    comma list out of native,bindfs,fencefs,fencefs-uring,fencefs-revoke,
                    fencefs-stage-uring,
                    passthrough_hp,passthrough_hp-uring,passthrough_hp-overlay-uring
                    (\$PASSTHROUGH_HP or built, see the top)
                    (default all; fencefs-uring is skipped when the binary has no
                    --transport option)
  --only GROUPS     comma list out of tree,git,write,dd,fio,build,agent (default all)
  --policy P        auto (default): the agent group under policy.example.toml in
                    workspace-write mode, the other groups under the 4-rule danger policy;
                    example: policy.example.toml (workspace-write) for every group;
                    small: the 4-rule danger policy for every group
  --loopfs [SIZE]   put the work data and the mount points on a private ext4 image
                    (sparse DIR/loopfs.img, default size 8G, made afresh every run: the
                    data is regenerated), loop-mounted on DIR/loopfs; removed on exit
  --count           one untimed round that counts the FUSE requests every workload sends
                    to each FUSE target (by opcode); prints that table instead of times
  --timeout SEC     per-command timeout, a hung command is killed and recorded FAIL
                    (default 600)
EOF
}

# ---------------------------------------------------------------- options
QUICK=0 RUNS="" WORK=/tmp/fencefs-bench-work OUT=/tmp/fencefs-bench BIN_SRC="" BUILD=0
THREADS="" TARGETS_OPT="native,bindfs,fencefs,fencefs-uring,fencefs-revoke" ONLY="tree,git,write,dd,fio,build,agent"
TMO=600 POLICY_OPT=auto LOOPFS=0 LOOPFS_SIZE=8G COUNT=0
while (($#)); do
    case $1 in
    --quick) QUICK=1 ;;
    --runs) RUNS=$2; shift ;;
    --dir) WORK=$2; shift ;;
    --out) OUT=$2; shift ;;
    --bin) BIN_SRC=$2; shift ;;
    --build) BUILD=1 ;;
    --threads) THREADS=$2; shift ;;
    --targets) TARGETS_OPT=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --timeout) TMO=$2; shift ;;
    --policy) POLICY_OPT=$2; shift ;;
    --loopfs)
        LOOPFS=1
        if [[ ${2:-} =~ ^[0-9]+[KMGT]?$ ]]; then LOOPFS_SIZE=$2; shift; fi ;;
    --count) COUNT=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
[[ -z $RUNS ]] && { ((QUICK)) && RUNS=1 || RUNS=3; }
((COUNT)) && RUNS=1
case $POLICY_OPT in auto | small | example) ;; *) echo "bench.sh: --policy is auto, small or example" >&2; exit 2 ;; esac
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "bench.sh: --runs needs a positive integer" >&2; exit 2; }
[[ $WORK =~ [[:space:]] || $OUT =~ [[:space:]] ]] && { echo "bench.sh: --dir/--out must not contain whitespace" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "bench.sh: run as root (drop_caches, mounts)" >&2; exit 2; }
mkdir -p "$WORK" "$OUT" || exit 1
WORK=$(cd "$WORK" && pwd) OUT=$(cd "$OUT" && pwd)
IFS=, read -r -a TARGETS <<<"$TARGETS_OPT"
for t in "${TARGETS[@]}"; do
    case $t in native | bindfs | fencefs | fencefs-uring | fencefs-revoke | fencefs-stage-uring) ;;
    passthrough_hp | passthrough_hp-uring | passthrough_hp-overlay-uring) ;; # built below when $PASSTHROUGH_HP is unset
    *) echo "bench.sh: unknown target $t" >&2; exit 2 ;; esac
done
ALL_TARGETS=(native bindfs passthrough_hp passthrough_hp-uring passthrough_hp-overlay-uring fencefs fencefs-uring fencefs-stage-uring fencefs-revoke)
# targets that are not fencefs: unmounted with fusermount3, their exit status not checked
peer() { [[ $1 == bindfs || $1 == passthrough_hp* ]]; }
if ((COUNT)); then # counting is about FUSE requests: native has none
    read -r -a TARGETS <<<"$(for t in "${TARGETS[@]}"; do [[ $t != native ]] && printf '%s ' "$t"; done)"
    ((${#TARGETS[@]})) || { echo "bench.sh: --count needs a FUSE target" >&2; exit 2; }
fi

# ---------------------------------------------------------------- sizes
if ((QUICK)); then
    TREE_DIRS=30 TREE_FILES=100       # 3,000 files
    GIT_FILES=600
    CREATE_N=1000
    TAR_FILES=1000
    DD_MB=128
    FIO_SIZE=64M FIO_RT=3
    C_FILES=8
    SQL_N=2000 MESON_FILES=12
    SKIP_SLOW=1
else
    TREE_DIRS=150 TREE_FILES=100      # 15,000 files
    GIT_FILES=3000
    CREATE_N=5000
    TAR_FILES=5000
    DD_MB=1024
    FIO_SIZE=256M FIO_RT=10
    C_FILES=50
    SQL_N=10000 MESON_FILES=60
    SKIP_SLOW=0
fi
TREE_N=$((TREE_DIRS * TREE_FILES))
NRULES=1000
MAKE_J=2

DATASET=full; ((QUICK)) && DATASET=quick
# --loopfs: everything the targets see lives on the ext4 image mounted on $LOOP_MNT; the
# agent group's prepared inputs (wheelhouse, npm cache, bare repository) stay in $CACHE
LOOP_IMG=$WORK/loopfs.img LOOP_MNT=$WORK/loopfs CACHE=$WORK/cache
ROOT=$WORK; ((LOOPFS)) && ROOT=$LOOP_MNT
SRC=$ROOT/$DATASET/src DATA=$ROOT/$DATASET/data MNT=$ROOT/mnt BINDIR=$ROOT/bin STAGE_DIR=$ROOT/stage
OVL_DIR=$ROOT/overlay OVL_MOUNTED=0
STAMP_RUN=$(date +%Y%m%d-%H%M%S)
RES=$OUT/bench-$STAMP_RUN
LOGDIR=$RES.logs
mkdir -p "$LOGDIR" "$CACHE" || exit 1
# libfuse's peer: $PASSTHROUGH_HP, or built from Debian's fuse3 source with liburing
# (scripts/bench/passthrough-hp.sh says why Debian's own binaries will not do)
PTHP_NOTE=""
if [[ ",$TARGETS_OPT," == *,passthrough_hp* ]]; then
    if [[ -z ${PASSTHROUGH_HP:-} ]]; then
        PASSTHROUGH_HP=$("$SCRIPT_DIR/bench/passthrough-hp.sh" "$CACHE/libfuse") ||
            { echo "bench.sh: no passthrough_hp with FUSE-over-io_uring could be built (above); drop the passthrough_hp targets" >&2; exit 1; }
        PTHP_NOTE="passthrough_hp: $PASSTHROUGH_HP, $(cat "$CACHE/libfuse/VERSION")"
    else
        PTHP_NOTE="passthrough_hp: \$PASSTHROUGH_HP=$PASSTHROUGH_HP (links: $(ldd "$PASSTHROUGH_HP" 2>/dev/null | awk '/libfuse|liburing/ { printf "%s ", $3 }'))"
    fi
    [[ -x $PASSTHROUGH_HP ]] || { echo "bench.sh: $PASSTHROUGH_HP is not executable" >&2; exit 2; }
fi
# shellcheck source=scripts/bench/uring-check.sh
source "$SCRIPT_DIR/bench/uring-check.sh"
SAMPLES=$RES.samples.tsv ERRORS=$RES.errors.log
printf 'round\trow\ttarget\tvalue\tstatus\n' >"$SAMPLES"
: >"$ERRORS"
TMPD=$(mktemp -d /tmp/fencefs-bench-tmp.XXXXXX)

log() { printf '[bench %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
err() { printf '[%s] %s\n' "$(date +%T)" "$*" >>"$ERRORS"; log "ERROR: $*"; }

# ---------------------------------------------------------------- mounts / cleanup
CUR_TARGET="" CUR_PID="" CUR_POLICY="" CUR_GROUP="" TIMED_PID=""
declare -A RINGS=() # target -> "N rings", what transport_check saw at its last mount
STARTED_PIDS=()

is_mounted() { awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }

pid_is_ours() { # pid alive and still the daemon we started for $MNT
    [[ -n $1 ]] && kill -0 "$1" 2>/dev/null && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$MNT"
}

# unmount whatever is on $MNT and stop the daemon we started; never leaves a mount behind
unmount_current() {
    local pid=$CUR_PID tgt=$CUR_TARGET rc i
    CUR_TARGET="" CUR_PID=""
    [[ -z $tgt || $tgt == native ]] && return 0
    if pid_is_ours "$pid"; then
        if peer "$tgt"; then fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT" 2>/dev/null
        else kill -TERM "$pid" 2>/dev/null; fi
        for ((i = 0; i < 200; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
        if kill -0 "$pid" 2>/dev/null; then
            err "$tgt: daemon $pid did not exit 10 s after unmount request; SIGKILL"
            kill -KILL "$pid" 2>/dev/null
        fi
        wait "$pid" 2>/dev/null; rc=$?
        ! peer "$tgt" && [[ $rc != 0 ]] && err "$tgt: daemon exited with status $rc on SIGTERM (log: $LOGDIR/$tgt.log)"
    fi
    if is_mounted "$MNT"; then
        fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null ||
            fusermount3 -u -z "$MNT" 2>/dev/null
    fi
    is_mounted "$MNT" && err "could not unmount $MNT"
    ovl_unmount
    return 0
}

# the kernel overlayfs under passthrough_hp-overlay-uring: a fresh upper every mount
ovl_mount() {
    ovl_unmount
    rm -rf "${OVL_DIR:?}" && mkdir -p "$OVL_DIR/upper" "$OVL_DIR/work" "$OVL_DIR/merged" || return 1
    OVL_MOUNTED=1 # before the mount: an interrupt right after it still unmounts it
    mount -t overlay overlay -o "lowerdir=$SRC,upperdir=$OVL_DIR/upper,workdir=$OVL_DIR/work" "$OVL_DIR/merged" ||
        { err "passthrough_hp-overlay-uring: cannot mount overlayfs on $OVL_DIR/merged"; return 1; }
}
# unmounts what ovl_mount mounted (the flag is cleared only once it is gone: an interrupt
# meanwhile leaves it to the cleanup trap), then removes its directory
ovl_unmount() {
    local i m
    ((OVL_MOUNTED)) || return 0
    m=$(realpath -m "$OVL_DIR/merged") # mountinfo has the resolved path
    for ((i = 0; i < 20; i++)); do
        is_mounted "$m" || break
        umount "$m" 2>/dev/null && break
        sleep 0.25
    done
    is_mounted "$m" && { err "overlayfs on $m busy: lazy unmount"; umount -l "$m"; }
    OVL_MOUNTED=0
    is_mounted "$m" || rm -rf "${OVL_DIR:?}"
}

cleanup() {
    local p
    trap - EXIT INT TERM
    if [[ -n $TIMED_PID ]] && kill -0 "$TIMED_PID" 2>/dev/null; then
        kill -TERM "$TIMED_PID" 2>/dev/null; wait "$TIMED_PID" 2>/dev/null
    fi
    unmount_current
    for p in "${STARTED_PIDS[@]}"; do pid_is_ours "$p" && kill -KILL "$p" 2>/dev/null; done
    ovl_unmount
    is_mounted "$MNT" && { umount -l "$MNT" 2>/dev/null || fusermount3 -u -z "$MNT" 2>/dev/null; }
    count_teardown
    [[ -n ${STAGE_DIR:-} ]] && ! is_mounted "$MNT" && rm -rf "$STAGE_DIR"
    loopfs_teardown
    if [[ -n $URING_PREV ]]; then
        echo "$URING_PREV" >"$URING_PARAM" 2>/dev/null || log "WARNING: could not restore $URING_PARAM to $URING_PREV"
        URING_PREV=""
    fi
    rm -rf "$TMPD"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# ---------------------------------------------------------------- --loopfs
LOOP_DEV="" LOOP_MOUNTED=0
loopfs_setup() {
    is_mounted "$LOOP_MNT" && { echo "bench.sh: $LOOP_MNT is already mounted (left by a killed run? umount it by hand)" >&2; exit 1; }
    need mkfs.ext4 || { echo "bench.sh: --loopfs needs mkfs.ext4 (e2fsprogs)" >&2; exit 1; }
    mkdir -p "$LOOP_MNT" && rm -f "$LOOP_IMG" && truncate -s "$LOOPFS_SIZE" "$LOOP_IMG" || exit 1
    # inode tables and journal written now: no ext4lazyinit thread writing during the rows
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$LOOP_IMG" >"$TMPD/mkfs.log" 2>&1 ||
        { echo "bench.sh: mkfs.ext4 $LOOP_IMG failed: $(tail -n 2 "$TMPD/mkfs.log")" >&2; rm -f "$LOOP_IMG"; exit 1; }
    mount -o loop "$LOOP_IMG" "$LOOP_MNT" || { echo "bench.sh: mount -o loop $LOOP_IMG failed" >&2; rm -f "$LOOP_IMG"; exit 1; }
    LOOP_MOUNTED=1
    LOOP_DEV=$(awk -v m="$LOOP_MNT" '$5 == m { for (j = 7; j <= NF; j++) if ($j == "-") { d = $(j + 2); break } } END { print d }' /proc/self/mountinfo)
    log "loopfs: $LOOP_IMG ($LOOPFS_SIZE, ext4) on $LOOP_MNT via $LOOP_DEV"
}
loopfs_teardown() { # unmount what loopfs_setup mounted, detach its loop device, drop the image
    local i
    ((LOOP_MOUNTED)) || return 0
    LOOP_MOUNTED=0
    for ((i = 0; i < 20; i++)); do
        is_mounted "$LOOP_MNT" || break
        umount "$LOOP_MNT" 2>/dev/null && break
        sleep 0.25
    done
    if is_mounted "$LOOP_MNT"; then
        log "WARNING: $LOOP_MNT busy; lazy unmount (the loop device is released with the last user)"
        umount -l "$LOOP_MNT"
    fi
    # mount -o loop sets autoclear, so the device is normally gone already; detach it only
    # when it is still bound to our image
    if [[ $LOOP_DEV == /dev/loop* ]] && [[ $(losetup -n -O BACK-FILE "$LOOP_DEV" 2>/dev/null) == "$LOOP_IMG"* ]]; then
        losetup -d "$LOOP_DEV" 2>/dev/null || log "WARNING: could not detach $LOOP_DEV"
    fi
    is_mounted "$LOOP_MNT" || rm -f "$LOOP_IMG"
}

# ---------------------------------------------------------------- FUSE over io_uring
URING_PARAM=/sys/module/fuse/parameters/enable_uring URING_PREV=""
uring_enable() { # enable_uring=Y for fencefs-uring; the old value is restored on exit
    local v
    [[ -r $URING_PARAM ]] || { err "fencefs-uring: $URING_PARAM missing (kernel without FUSE over io_uring)"; return 1; }
    v=$(cat "$URING_PARAM")
    [[ $v == Y ]] && return 0
    echo Y >"$URING_PARAM" 2>/dev/null || { err "fencefs-uring: cannot set $URING_PARAM=Y"; return 1; }
    [[ -z $URING_PREV ]] && URING_PREV=$v
    log "set $URING_PARAM=Y (was $v; restored on exit)"
}

# the policy a group runs under (--policy), and the mode a policy file is mounted with
group_policy() {
    case $POLICY_OPT in example) echo "$POLICY_EXAMPLE" ;; small) echo "$POLICY_SMALL" ;;
    *) if [[ $CUR_GROUP == agent ]]; then echo "$POLICY_EXAMPLE"; else echo "$POLICY_SMALL"; fi ;; esac
}
pol_mode() { if [[ $1 == "$POLICY_EXAMPLE" ]]; then echo workspace-write; else echo danger; fi; }

# mount TARGET [POLICY]; sets TP (the path the workloads use). Returns 1 on failure.
mount_target() {
    local tgt=$1 pol=${2:-$(group_policy)} pid i args from=$SRC
    unmount_current
    if [[ $tgt == native ]]; then TP=$SRC; CUR_TARGET=native; return 0; fi
    TP=$MNT
    is_mounted "$MNT" && { err "$MNT still mounted before mounting $tgt"; return 1; }
    local log=$LOGDIR/$tgt.log logsz
    logsz=$(stat -c %s "$log" 2>/dev/null || echo 0)
    args=(mount -p "$pol" -m "$(pol_mode "$pol")" ${THREADS:+--threads "$THREADS"})
    case $tgt in
    fencefs) ((HAS_TRANSPORT)) && args+=(--transport dev-fuse) ;;
    fencefs-uring) args+=(--transport io-uring); uring_enable || return 1 ;;
    fencefs-revoke) args+=(--revoke); ((HAS_TRANSPORT)) && args+=(--transport dev-fuse) ;;
    fencefs-stage-uring) # a fresh staging area: what earlier mounts staged is not carried over
        rm -rf "${STAGE_DIR:?}" || { err "$tgt: cannot remove $STAGE_DIR"; return 1; }
        args+=(--transport io-uring --stage "$STAGE_DIR"); uring_enable || return 1 ;;
    esac
    case $tgt in
    bindfs) args=(bindfs -f) ;;
    passthrough_hp) args=("$PASSTHROUGH_HP" --foreground) ;;
    passthrough_hp-uring) args=("$PASSTHROUGH_HP" --foreground -o io_uring); uring_enable || return 1 ;;
    passthrough_hp-overlay-uring)
        args=("$PASSTHROUGH_HP" --foreground -o io_uring); uring_enable || return 1
        ovl_mount || return 1
        from=$OVL_DIR/merged ;;
    *) args=("$BIN" "${args[@]}") ;;
    esac
    printf -- '--- %(%T)T %s\n' -1 "${args[*]} $from $MNT" >>"$log"
    "${args[@]}" "$from" "$MNT" >>"$log" 2>&1 &
    pid=$!
    STARTED_PIDS+=("$pid")
    for ((i = 0; i < 400; i++)); do
        if awk -v m="$MNT" '$5 == m { for (j = 7; j <= NF; j++) if ($j == "-") { if ($(j+1) ~ /^fuse/) f = 1; break } } END { exit !f }' /proc/self/mountinfo; then
            CUR_TARGET=$tgt CUR_PID=$pid CUR_POLICY=$pol
            # the transport the name claims, from the daemon's descriptors, every mount
            local seen
            if ! seen=$(transport_check "$tgt" "$pid" "$MNT" 2>"$TMPD/tc.err"); then
                RINGS[$tgt]="FAILED"
                err "$(cat "$TMPD/tc.err") — $tgt fails, its cells are not reported"
                unmount_current
                return 1
            fi
            [[ ${RINGS[$tgt]:-} == FAILED ]] || RINGS[$tgt]=$seen
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.025
    done
    wait "$pid" 2>/dev/null
    err "$tgt: mount failed (daemon status $?): $(tail -c +$((logsz + 1)) "$log" | tail -n 5 | tr '\n' ' ')"
    CUR_TARGET=$tgt CUR_PID=$pid
    unmount_current
    return 1
}

# is the current target still healthy (daemon alive and mounted)?
target_alive() {
    [[ $CUR_TARGET == native ]] && return 0
    [[ -n $CUR_PID ]] && kill -0 "$CUR_PID" 2>/dev/null && is_mounted "$MNT"
}

DROP_OK=1
drop_caches() {
    sync
    ((DROP_OK)) && { echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || { DROP_OK=0; log "WARNING: drop_caches not writable; cold = remount only"; }; }
}

# remount the current target (fresh daemon), optionally dropping caches in between
remount() { # remount [cold]
    local tgt=$CUR_TARGET pol=$CUR_POLICY
    [[ -z $tgt ]] && return 1
    unmount_current
    [[ ${1:-} == cold ]] && drop_caches
    mount_target "$tgt" "$pol"
}

# ---------------------------------------------------------------- --count
# Counts the FUSE requests of one timed command on the current FUSE target: the kernel's
# fuse:fuse_request_send tracepoint in a private tracefs instance, filtered on the mount's
# connection (works for /dev/fuse and io_uring alike, costs the daemon nothing); without
# the tracepoint, `strace -f -y -p DAEMON`: successful read(2)s on /dev/fuse (one per
# request) and io_uring_enter calls (batched, a lower bound). FENCEFS_BENCH_COUNT=strace
# forces strace (slow: it stops the daemon at every read). The tracepoint does not see
# FORGET/BATCH_FORGET (queued apart, no reply); strace's reads do (delete 1k files: 1,001
# requests traced, ~1,975 reads).
TRACEFS=/sys/kernel/tracing TRACE_INST="" TRACEFS_MOUNTED=0 COUNT_METHOD="" STRACE_PID=""
COUNTS=$RES.counts.tsv
count_setup() {
    if [[ ${FENCEFS_BENCH_COUNT:-} != strace ]]; then
        if [[ ! -d $TRACEFS/events ]] && mount -t tracefs nodev "$TRACEFS" 2>/dev/null; then TRACEFS_MOUNTED=1; fi
        if [[ -d $TRACEFS/events/fuse/fuse_request_send ]] && mkdir "$TRACEFS/instances/fencefs-bench-$$" 2>/dev/null; then
            TRACE_INST=$TRACEFS/instances/fencefs-bench-$$
            echo 0 >"$TRACE_INST/tracing_on"
            echo 65536 >"$TRACE_INST/buffer_size_kb" || echo 16384 >"$TRACE_INST/buffer_size_kb"
            COUNT_METHOD=tracefs
        fi
    fi
    if [[ -z $COUNT_METHOD ]]; then
        need strace || { echo "bench.sh: --count needs the fuse tracepoints (tracefs) or strace" >&2; exit 1; }
        COUNT_METHOD=strace
    fi
    printf 'row\ttarget\top\tcount\n' >"$COUNTS"
    log "--count: counting FUSE requests with $COUNT_METHOD"
}
count_teardown() {
    if [[ -n $STRACE_PID ]] && kill -0 "$STRACE_PID" 2>/dev/null; then kill -INT "$STRACE_PID"; wait "$STRACE_PID" 2>/dev/null; fi
    STRACE_PID=""
    if [[ -n $TRACE_INST && -d $TRACE_INST ]]; then
        echo 0 >"$TRACE_INST/tracing_on"
        echo 0 >"$TRACE_INST/events/fuse/fuse_request_send/enable"
        rmdir "$TRACE_INST" || log "WARNING: could not remove tracefs instance $TRACE_INST"
    fi
    TRACE_INST=""
    if ((TRACEFS_MOUNTED)); then umount "$TRACEFS" 2>/dev/null; TRACEFS_MOUNTED=0; fi
}
count_start() {
    local mm ev
    case $COUNT_METHOD in
    tracefs)
        mm=$(awk -v m="$MNT" '$5 == m { d = $3 } END { print d }' /proc/self/mountinfo) # MAJOR:MINOR
        ev=$TRACE_INST/events/fuse/fuse_request_send
        echo "connection == $(((${mm%%:*} << 20) | ${mm##*:}))" >"$ev/filter" && echo 1 >"$ev/enable" &&
            : >"$TRACE_INST/trace" && echo 1 >"$TRACE_INST/tracing_on" ;;
    strace)
        strace -q -f -y -s 0 -e trace=read,io_uring_enter -e signal=none -o "$TMPD/strace.out" -p "$CUR_PID" 2>/dev/null &
        STRACE_PID=$!
        sleep 1 ;; # attach to every thread before the workload starts
    esac
}
count_stop() { # count_stop ROW TARGET: appends "row target op count" lines (op ALL = total)
    local row=$1 tgt=$2 lost=0
    case $COUNT_METHOD in
    tracefs)
        echo 0 >"$TRACE_INST/tracing_on"
        lost=$(cat "$TRACE_INST"/per_cpu/cpu*/stats 2>/dev/null | awk '/^overrun:/ { n += $2 } END { print n + 0 }')
        awk -v r="$row" -v t="$tgt" '/ opcode [0-9]+ \(/ { match($0, / opcode [0-9]+ \([A-Z_0-9]+\)/); s = substr($0, RSTART, RLENGTH)
                sub(/.*\(FUSE_/, "", s); sub(/\)$/, "", s); n[s]++; all++ }
            END { for (o in n) printf "%s\t%s\t%s\t%d\n", r, t, o, n[o]; printf "%s\t%s\tALL\t%d\n", r, t, all }' "$TRACE_INST/trace" >>"$COUNTS"
        echo 0 >"$TRACE_INST/events/fuse/fuse_request_send/enable" ;;
    strace)
        kill -INT "$STRACE_PID" 2>/dev/null; wait "$STRACE_PID" 2>/dev/null; STRACE_PID=""
        # -f interleaves threads: "PID read(N</dev/fuse>, <unfinished ...>" ... "PID <... read resumed>..."
        awk -v r="$row" -v t="$tgt" '/ read\([0-9]+<\/dev\/fuse>/ { if (/<unfinished \.\.\.>$/) { pend[$1] = 1; next }
                    if (/ = [1-9][0-9]*$/) { n["read_dev_fuse"]++; all++ } }
                /<\.\.\. read resumed>/ && pend[$1] { delete pend[$1]; if (/ = [1-9][0-9]*$/) { n["read_dev_fuse"]++; all++ } }
                / io_uring_enter\(/ && !/resumed>/ { n["io_uring_enter"]++; all++ }
            END { for (o in n) printf "%s\t%s\t%s\t%d\n", r, t, o, n[o]; printf "%s\t%s\tALL\t%d\n", r, t, all }' "$TMPD/strace.out" >>"$COUNTS" ;;
    esac
    ((lost)) && { printf '%s\t%s\tLOST\t%d\n' "$row" "$tgt" "$lost" >>"$COUNTS"; err "--count $tgt $row: $lost trace events lost (buffer overrun)"; }
    log "  $tgt $row: $(awk -F'\t' -v r="$row" -v t="$tgt" '$1 == r && $2 == t && $3 == "ALL" { print $4 }' "$COUNTS") FUSE requests"
}

# ---------------------------------------------------------------- measuring
ROUND=0
# timed ROW TARGET DIR CMD [CHECK]
#   runs CMD (bash) in DIR under a timeout; the time is taken inside the child shell, so
#   process start-up is not measured. CHECK is a bash condition run afterwards with $OUT_F
#   (stdout of CMD); a false CHECK records FAIL ("wrong result"). Sets LAST_OK.
timed() {
    local row=$1 tgt=$2 dir=$3 cmd=$4 check=${5:-} rc t
    OUT_F=$TMPD/out ERR_F=$TMPD/err TIME_F=$TMPD/time
    LAST_OK=0
    rm -f "$TIME_F"
    if ! target_alive; then
        record "$row" "$tgt" FAIL "target not mounted (daemon died earlier?)"
        return 1
    fi
    local counting=0
    ((COUNT)) && [[ $tgt != native && $row != _* ]] && { counting=1; count_start; }
    timeout -k 5 "$TMO" bash -c '
        set -o pipefail
        cd "$1" || exit 97
        t0=$EPOCHREALTIME
        eval "$2"
        rc=$?
        t1=$EPOCHREALTIME
        echo "$t0 $t1" >"$3"
        exit $rc' bench "$dir" "$cmd" "$TIME_F" >"$OUT_F" 2>"$ERR_F" </dev/null &
    TIMED_PID=$!
    wait "$TIMED_PID"
    rc=$?
    TIMED_PID=""
    ((counting)) && count_stop "$row" "$tgt"
    if ((rc != 0)); then
        local why="exit status $rc"
        ((rc == 124 || rc == 137)) && why="timed out after ${TMO}s"
        record "$row" "$tgt" FAIL "$why: $cmd :: $(head -c 600 "$ERR_F" | tr '\n' ' ')"
        check_daemon "$tgt"
        return 1
    fi
    t=$(awk '{ printf "%.6f", $2 - $1 }' "$TIME_F")
    if [[ -n $check ]] && ! eval "$check"; then
        record "$row" "$tgt" FAIL "wrong result: $cmd :: check [$check] failed; stdout: $(head -c 300 "$OUT_F" | tr '\n' ' ')"
        return 1
    fi
    record "$row" "$tgt" "$t"
    LAST_OK=1
}

check_daemon() {
    [[ $CUR_TARGET == native || -z $CUR_TARGET ]] && return 0
    if ! kill -0 "$CUR_PID" 2>/dev/null; then
        wait "$CUR_PID" 2>/dev/null
        err "$1: daemon $CUR_PID died (status $?); log tail: $(tail -n 5 "$LOGDIR/$1.log" | tr '\n' ' ')"
        remount
    fi
}

record() { # record ROW TARGET VALUE|FAIL [NOTE]
    local row=$1 tgt=$2 v=$3 note=${4:-}
    if [[ $v == FAIL ]]; then
        printf '%s\t%s\t%s\t\tFAIL\n' "$ROUND" "$row" "$tgt" >>"$SAMPLES"
        err "round $ROUND $tgt $row: $note"
    else
        printf '%s\t%s\t%s\t%s\tok\n' "$ROUND" "$row" "$tgt" "$v" >>"$SAMPLES"
        log "  $tgt $row = $v"
    fi
}

fail_rows() { # fail_rows TARGET REASON ROW... (e.g. the mount failed)
    local tgt=$1 why=$2 r
    shift 2
    for r; do slow "$r" || record "$r" "$tgt" FAIL "$why"; done
}

# ---------------------------------------------------------------- rows
ROWS=()
declare -A LABEL KIND UNIT
row() { ROWS+=("$1"); LABEL[$1]=$2; KIND[$1]=$3; UNIT[$1]=$4; }
k() { awk -v n="$1" 'BEGIN { if (n >= 1000 && n % 1000 == 0) printf "%dk", n / 1000; else if (n >= 1000) printf "%.1fk", n / 1000; else printf "%d", n }'; }
row tree_find_cold "find, $(k $TREE_N)-file tree, cold" time s
row tree_find_warm "find, $(k $TREE_N)-file tree, warm" time s
row tree_lslr_cold "ls -lR, $(k $TREE_N) files, cold" time s
row tree_lslr_warm "ls -lR, $(k $TREE_N) files, warm" time s
row tree_stat_cold "lstat every file ($(k $TREE_N)), cold" time s
row tree_stat_warm "lstat every file ($(k $TREE_N)), warm" time s
row tree_stat_1k "lstat every file, warm, $NRULES-rule policy" time s
row git_first "git status ($(k $GIT_FILES) files), 1st after mount" time s
row git_cold "git status ($(k $GIT_FILES) files), cold" time s
row git_warm "git status ($(k $GIT_FILES) files), warm" time s
row create "create $(k $CREATE_N) small files" time s
row delete "delete $(k $CREATE_N) files" time s
row untar "untar $(k $TAR_FILES)-file source tarball" time s
row rmrf "rm -rf the untarred tree" time s
row rmrf_host "rm -rf the tree made on the host" time s
row dd_write "write $DD_MB MiB seq + fsync (dd)" time s
row dd_read_cold "read $DD_MB MiB seq, cold (dd)" time s
row dd_read_hot "read $DD_MB MiB seq, hot (dd)" time s
row fio_iops "fio 4k randread psync ${FIO_SIZE}B [T]" tput IOPS
row build "make -j$MAKE_J, $C_FILES-file C project" time s
row build_noop "make -j$MAKE_J, nothing to rebuild" time s
PIP_PKGS="requests idna urllib3 certifi charset-normalizer six packaging attrs pygments jinja2 markupsafe click"
NPM_DEPS='"lodash": "^4.17.21", "express": "^4.21.0", "chalk": "^5.3.0", "commander": "^12.1.0"'
row agent_pip "python venv + pip install, 12 local wheels" time s
row agent_clone "git clone --no-hardlinks, fencefs repo" time s
row agent_sqlite "sqlite WAL, $(k $SQL_N) one-row commits" time s
row agent_npm "npm install --offline, 4 deps (74 pkgs)" time s
row agent_meson "meson setup + ninja, $MESON_FILES-file C project" time s
row d_rss "daemon VmRSS after tree walk" info MiB
row d_hwm "daemon VmHWM after tree walk" info MiB
row d_fds "daemon open fds after tree walk" info fds
SLOW_ROWS=" tree_find_cold tree_lslr_cold tree_stat_cold tree_stat_1k git_cold dd_read_cold build_noop "
slow() { ((SKIP_SLOW)) && [[ $SLOW_ROWS == *" $1 "* ]]; }

# ---------------------------------------------------------------- prerequisites
need() { command -v "$1" >/dev/null 2>&1; }
for p in bindfs fio; do
    if ! need $p; then
        log "installing $p"
        { apt-get install -y $p || { apt-get update && apt-get install -y $p; }; } >"$TMPD/apt.log" 2>&1 ||
            log "WARNING: could not install $p: $(tail -n 2 "$TMPD/apt.log" | tr '\n' ' ')"
    fi
done
for p in gcc make git tar fusermount3 timeout; do need $p || { echo "bench.sh: $p is required" >&2; exit 1; }; done
((LOOPFS)) && loopfs_setup
mkdir -p "$SRC" "$MNT" "$DATA" "$BINDIR" || exit 1

if [[ -z $BIN_SRC ]]; then
    BIN_SRC=$REPO/target/release/fencefs
    # Always the checkout's code: a release binary older than the sources measured a
    # different daemon once (an untar row 1.8x the peer that the current code does not
    # have). cargo does nothing when the build is up to date.
    log "cargo build --release (the checkout's code)"
    (cd "$REPO" && cargo build --release --locked) >&2 || { echo "bench.sh: cargo build failed" >&2; exit 1; }
fi
[[ -x $BIN_SRC ]] || { echo "bench.sh: no fencefs binary at $BIN_SRC" >&2; exit 1; }
BIN=$BINDIR/fencefs
BIN_MTIME=$(stat -c %y "$BIN_SRC" | cut -d. -f1)
cp -f "$BIN_SRC" "$BIN.tmp" && mv -f "$BIN.tmp" "$BIN" || exit 1
BIN_SHA=$(sha256sum "$BIN" | cut -c1-12)
# --transport (dev-fuse | io-uring) is newer than some binaries: use it only when listed
HAS_TRANSPORT=0 TRANSPORT_NOTE="this fencefs has no --transport option: fencefs-uring skipped, fencefs targets without the flag"
if "$BIN" mount --help 2>/dev/null | grep -q -- '--transport'; then
    HAS_TRANSPORT=1 TRANSPORT_NOTE="fencefs and revoke: --transport dev-fuse, fencefs-uring: --transport io-uring"
fi
if [[ ",$TARGETS_OPT," == *,fencefs-uring,* ]] && ! ((HAS_TRANSPORT)); then
    log "fencefs-uring skipped: '$BIN_SRC mount --help' does not list --transport (this build cannot choose FUSE over io_uring)"
    read -r -a TARGETS <<<"$(for t in "${TARGETS[@]}"; do [[ $t != fencefs-uring ]] && printf '%s ' "$t"; done)"
    ((${#TARGETS[@]})) || { echo "bench.sh: no target left" >&2; exit 2; }
fi
gcc -O2 -o "$BINDIR/fsops" "$SCRIPT_DIR/bench/fsops.c" || { echo "bench.sh: cannot build fsops" >&2; exit 1; }
FSOPS=$BINDIR/fsops

# ---------------------------------------------------------------- data (deterministic)
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@example.invalid GIT_COMMITTER_NAME=bench
export GIT_COMMITTER_EMAIL=bench@example.invalid GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z'

POLICY_SMALL=$DATA/policy-small.toml POLICY_1K=$DATA/policy-1k.toml POLICY_EXAMPLE=$DATA/policy.example.toml
PARAMS="v1 tree=${TREE_DIRS}x$TREE_FILES git=$GIT_FILES tar=$TAR_FILES c=$C_FILES rules=$NRULES"

gen_tree() { # gen_tree DIR NDIRS NFILES — small text files, sizes 16..~1 KiB
    local root=$1 nd=$2 nf=$3 d f i line dn fn
    mkdir -p "$root"
    for ((d = 0; d < nd; d++)); do
        printf -v dn '%s/d%03d' "$root" "$d"
        mkdir -p "$dn"
        for ((f = 0; f < nf; f++)); do
            printf -v line 'd%03d/f%03d: the quick brown fox jumps over the lazy dog\n' "$d" "$f"
            i=$(((d * 31 + f * 7) % 16 + 1))
            local body=""
            while ((i--)); do body+=$line; done
            printf -v fn '%s/f%03d.txt' "$dn" "$f"
            printf '%s' "$body" >"$fn"
        done
    done
}

gen_srctree() { # a synthetic source tree of N files: nested dirs, .c/.h/.md, 0.2..12 KiB
    local root=$1 n=$2 i d sz chunk ext fn
    chunk=$(printf '/* synthetic source line for the fencefs benchmark, padding text. */\n%.0s' {1..16})
    for ((i = 0; i < n; i++)); do
        printf -v d 'pkg%02d/mod%02d' $((i / 250)) $((i / 25 % 10))
        mkdir -p "$root/$d"
        case $((i % 5)) in 0 | 1 | 2) ext=c ;; 3) ext=h ;; *) ext=md ;; esac
        sz=$(((i * 37) % 11 + 1))
        local body=""
        while ((sz--)); do body+=$chunk; done
        printf -v fn '%s/%s/file%05d.%s' "$root" "$d" "$i" "$ext"
        printf '%s' "$body" >"$fn"
    done
}

gen_policies() {
    cat >"$POLICY_SMALL" <<'EOF'
# bench policy: a few rules so every lookup is really evaluated
mode = "danger"
default = "write"

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "**/*.pem"
access = "none"

[[rule]]
path = "**/.env"
access = "none"

[[rule]]
path = "docs"
access = "read"
EOF
    {
        printf '# bench policy: %d rules, none of them changes what the tree workloads see\nmode = "danger"\ndefault = "write"\n' "$NRULES"
        local i n=0
        for ((i = 0; n < NRULES; i++)); do
            case $((i % 5)) in
            0) printf '\n[[rule]]\npath = "secrets%04d"\naccess = "none"\n' "$i" ;;
            1) printf '\n[[rule]]\npath = "**/*.key%04d"\naccess = "none"\n' "$i" ;;
            2) printf '\n[[rule]]\npath = "tree/d%03d/nomatch%04d.txt"\naccess = "none"\n' $((i % TREE_DIRS)) "$i" ;;
            3) printf '\n[[rule]]\npath = "vendor/lib%04d/**"\naccess = "read"\n' "$i" ;;
            4) printf '\n[[rule]]\npath = "tree/d%03d/**/*.bak%d"\naccess = "read"\n' $((i % TREE_DIRS)) "$i" ;;
            esac
            n=$((n + 1))
        done
    } >"$POLICY_1K"
}

prepare_data() {
    if [[ $(cat "$DATA/ready" 2>/dev/null) == "$PARAMS" ]]; then
        log "reusing generated data in $ROOT ($PARAMS)"
        return 0
    fi
    log "generating data in $ROOT ($PARAMS)"
    rm -rf "$SRC" "$DATA" && mkdir -p "$SRC" "$DATA"
    gen_tree "$SRC/tree" "$TREE_DIRS" "$TREE_FILES"
    (cd "$SRC/tree" && find . -type f | LC_ALL=C sort) >"$DATA/tree.list"
    (cd "$SRC/tree" && find . | wc -l) >"$DATA/tree.count"
    mkdir -p "$SRC/secrets" "$SRC/docs"
    echo "s3cr3t" >"$SRC/secrets/key.txt"
    echo "README" >"$SRC/docs/README"
    # git repository template: GIT_FILES tracked files in nested dirs, one commit
    local g=$DATA/git-template
    gen_tree "$g/src" $((GIT_FILES / 50)) 50
    (cd "$g" && git init -q -b main . && git add -A && git commit -q -m "bench repo") || { echo "bench.sh: git init failed" >&2; exit 1; }
    # tarball of a synthetic source tree
    gen_srctree "$DATA/srctree/srctree" "$TAR_FILES"
    tar -C "$DATA/srctree" --owner=0 --group=0 --sort=name --mtime='2026-01-01' -cf "$DATA/src.tar" srctree || exit 1
    rm -rf "$DATA/srctree"
    # C project template
    bash "$SCRIPT_DIR/bench/gen-cproject.sh" "$DATA/cproject" "$C_FILES" || exit 1
    echo "$PARAMS" >"$DATA/ready"
}

# agent group inputs: fetched once into $CACHE (network: PyPI, npm registry), reused later
WHEELS=$CACHE/wheels NPM_DIR=$CACHE/npm GIT_SRC=$CACHE/fencefs.git
NPM_CACHE=$NPM_DIR/cache NPM_PROJ=$NPM_DIR/project
NPM_FLAGS="--cache $NPM_CACHE --no-audit --no-fund --no-update-notifier --loglevel=error"
AGENT_PARAMS="v1 sql=$SQL_N meson=$MESON_FILES"
GIT_SRC_HEAD="" GIT_SRC_FILES=0 NPM_PKGS=0
declare -A AGENT_BAD # row -> why it cannot run (recorded FAIL on every target)
prepare_agent() {
    local d=$DATA/agent f
    if ! need /usr/bin/python3; then AGENT_BAD[agent_pip]="no /usr/bin/python3"; AGENT_BAD[agent_sqlite]="no /usr/bin/python3"; fi
    need npm || AGENT_BAD[agent_npm]="npm not installed"
    { need meson && need ninja; } || AGENT_BAD[agent_meson]="meson/ninja not installed"
    if [[ -z ${AGENT_BAD[agent_pip]:-} && ! -f $WHEELS/ready ]]; then
        log "agent: pip download $PIP_PKGS -> $WHEELS (once)"
        rm -rf "$WHEELS" && mkdir -p "$WHEELS"
        # shellcheck disable=SC2086 # PIP_PKGS is a word list
        if /usr/bin/python3 -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$WHEELS" $PIP_PKGS >"$TMPD/prep.log" 2>&1; then
            touch "$WHEELS/ready"
        else AGENT_BAD[agent_pip]="pip download failed: $(tail -n 2 "$TMPD/prep.log" | tr '\n' ' ')"; fi
    fi
    if [[ -z ${AGENT_BAD[agent_npm]:-} && ! -f $NPM_DIR/ready ]]; then
        log "agent: npm install ($NPM_DEPS) to fill $NPM_CACHE (once)"
        rm -rf "$NPM_DIR" && mkdir -p "$NPM_PROJ"
        printf '{\n  "name": "fencefs-bench-npm",\n  "version": "1.0.0",\n  "private": true,\n  "dependencies": { %s }\n}\n' "$NPM_DEPS" >"$NPM_PROJ/package.json"
        # 1. resolve and write package-lock.json; 2. install from the lockfile online, which
        # caches the (abbreviated) metadata an install from the lockfile asks for; 3. check
        # that an --offline install from the cache works
        # shellcheck disable=SC2086 # NPM_FLAGS is a word list
        if (cd "$NPM_PROJ" && npm install $NPM_FLAGS && rm -rf node_modules) >"$TMPD/prep.log" 2>&1 &&
            for f in "" --offline; do
                rm -rf "$NPM_DIR/tmp" && mkdir "$NPM_DIR/tmp" && cp "$NPM_PROJ"/package*.json "$NPM_DIR/tmp/" &&
                    (cd "$NPM_DIR/tmp" && npm install $f $NPM_FLAGS) >>"$TMPD/prep.log" 2>&1 || break
            done && [[ -f $NPM_DIR/tmp/node_modules/express/package.json ]]; then
            touch "$NPM_DIR/ready"
        else AGENT_BAD[agent_npm]="npm cache preparation failed: $(tail -n 2 "$TMPD/prep.log" | tr '\n' ' ')"; fi
        rm -rf "$NPM_DIR/tmp"
    fi
    [[ -f $NPM_PROJ/package-lock.json ]] && NPM_PKGS=$(grep -c '"node_modules/' "$NPM_PROJ/package-lock.json")
    if [[ ! -f $GIT_SRC/bench-ready ]]; then
        log "agent: git clone --bare $REPO -> $GIT_SRC (once)"
        rm -rf "$GIT_SRC"
        if git clone -q --bare --no-hardlinks "$REPO" "$GIT_SRC" >"$TMPD/prep.log" 2>&1; then touch "$GIT_SRC/bench-ready"
        else AGENT_BAD[agent_clone]="git clone --bare $REPO failed: $(tail -n 2 "$TMPD/prep.log" | tr '\n' ' ')"; fi
    fi
    if [[ -f $GIT_SRC/bench-ready ]]; then
        GIT_SRC_HEAD=$(git -C "$GIT_SRC" rev-parse HEAD)
        GIT_SRC_FILES=$(git -C "$GIT_SRC" ls-tree -r HEAD | wc -l)
    fi
    [[ $(cat "$d/ready" 2>/dev/null) == "$AGENT_PARAMS" ]] && return 0
    rm -rf "$d" && mkdir -p "$d"
    cat >"$d/sqlite_wal.py" <<'EOF'
# sqlite_wal.py DB N: N single-row transactions (a commit each) in a WAL database,
# default synchronous; prints "count journal_mode synchronous"
import sqlite3, sys
db, n = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db, isolation_level=None)
mode = c.execute("PRAGMA journal_mode=WAL").fetchone()[0]
c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT NOT NULL, v BLOB)")
for i in range(n):
    c.execute("BEGIN")
    c.execute("INSERT INTO t (k, v) VALUES (?, ?)", ("key%06d" % i, b"x" * 100))
    c.execute("COMMIT")
print(c.execute("SELECT count(*) FROM t").fetchone()[0], mode, c.execute("PRAGMA synchronous").fetchone()[0])
c.close()
EOF
    bash "$SCRIPT_DIR/bench/gen-cproject.sh" "$d/meson" "$MESON_FILES" || exit 1
    rm -f "$d/meson/Makefile"
    {
        echo "project('benchapp', 'c')"
        echo "executable('app',"
        (cd "$d/meson" && for f in src/*.c; do echo "  '$f',"; done)
        echo "  include_directories: include_directories('include'))"
    } >"$d/meson/meson.build"
    echo "$AGENT_PARAMS" >"$d/ready"
}

# ---------------------------------------------------------------- workload groups
# Every group mounts its target fresh, runs its rows, and unmounts again.

grp_tree() {
    local t=$1 exp_n exp_f
    exp_n=$(cat "$DATA/tree.count") exp_f=$(wc -l <"$DATA/tree.list")
    local rows=(tree_find_cold tree_find_warm tree_lslr_cold tree_lslr_warm tree_stat_cold tree_stat_warm d_rss d_hwm d_fds tree_stat_1k)
    drop_caches
    mount_target "$t" || { fail_rows "$t" "mount failed" "${rows[@]}"; return; }
    local chk_find="[[ \$(cat \$OUT_F) == $exp_n ]]" chk_stat="[[ \$(cat \$OUT_F) == $exp_f ]]"
    if slow tree_find_cold; then timed _warmup "$t" "$TP/tree" 'find . | wc -l' "$chk_find"
    else timed tree_find_cold "$t" "$TP/tree" 'find . | wc -l' "$chk_find"; fi
    timed tree_find_warm "$t" "$TP/tree" 'find . | wc -l' "$chk_find"
    slow tree_lslr_cold || { remount cold; timed tree_lslr_cold "$t" "$TP/tree" 'ls -lR . | grep -c "^-"' "$chk_stat"; }
    timed tree_lslr_warm "$t" "$TP/tree" 'ls -lR . | grep -c "^-"' "$chk_stat"
    slow tree_stat_cold || { remount cold; timed tree_stat_cold "$t" "$TP/tree" "$FSOPS stat $DATA/tree.list" "$chk_stat"; }
    timed tree_stat_warm "$t" "$TP/tree" "$FSOPS stat $DATA/tree.list" "$chk_stat"
    if [[ $t != native ]] && kill -0 "$CUR_PID" 2>/dev/null; then
        record d_rss "$t" "$(awk '/^VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$CUR_PID/status")"
        record d_hwm "$t" "$(awk '/^VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$CUR_PID/status")"
        record d_fds "$t" "$(find "/proc/$CUR_PID/fd" -mindepth 1 -maxdepth 1 | wc -l)"
    fi
    if ! slow tree_stat_1k; then
        # Every FUSE target is mounted afresh for this row (fencefs with the 1000-rule
        # policy, the peers as they are), so each runs its first warm pass after a fresh
        # mount and its cold warm-up: the kernel's caches are in the same state for all.
        if [[ $t == fencefs* ]]; then
            mount_target "$t" "$POLICY_1K" || { fail_rows "$t" "mount with $NRULES-rule policy failed" tree_stat_1k; return; }
        elif [[ $t != native ]]; then
            remount || { fail_rows "$t" "remount failed" tree_stat_1k; return; }
        fi
        # warm-up pass (untimed), then the timed warm pass
        timed _warmup "$t" "$TP/tree" "$FSOPS stat $DATA/tree.list" && timed tree_stat_1k "$t" "$TP/tree" "$FSOPS stat $DATA/tree.list" "$chk_stat"
    fi
    unmount_current
}

grp_git() {
    local t=$1 repo=$SRC/git/$1
    local chk='grep -q "nothing to commit, working tree clean" $OUT_F'
    rm -rf "$repo" && mkdir -p "$SRC/git" && cp -a "$DATA/git-template" "$repo"
    git -C "$repo" status >/dev/null 2>&1 # refresh the index (stat data of the copy)
    mount_target "$t" || { fail_rows "$t" "mount failed" git_first git_cold git_warm; return; }
    # one untimed pass through the target, so a target-specific index refresh is not timed
    timed _warmup "$t" "$TP/git/$t" 'git status' "$chk"
    remount; timed git_first "$t" "$TP/git/$t" 'git status' "$chk"
    slow git_cold || { remount cold; timed git_cold "$t" "$TP/git/$t" 'git status' "$chk"; }
    timed git_warm "$t" "$TP/git/$t" 'git status' "$chk"
    unmount_current
    rm -rf "$repo"
}

grp_write() {
    local t=$1 s=scratch/$1
    rm -rf "${SRC:?}/$s" && mkdir -p "$SRC/$s/c"
    mount_target "$t" || { fail_rows "$t" "mount failed" create delete untar rmrf rmrf_host; return; }
    sync
    timed create "$t" "$TP/$s" "$FSOPS create c $CREATE_N 100" "[[ \$(cat \$OUT_F) == $CREATE_N ]]"
    sync
    timed delete "$t" "$TP/$s" "$FSOPS unlink c $CREATE_N"
    sync
    timed untar "$t" "$TP/$s" "tar -xf $DATA/src.tar" &&
        { [[ $(find "$TP/$s/srctree" -type f | wc -l) == "$TAR_FILES" ]] || err "round $ROUND $t untar: wrong file count"; }
    sync
    timed rmrf "$t" "$TP/$s" 'rm -rf srctree' "[[ ! -e $TP/$s/srctree ]]"
    # The same tree made on the host (untimed, beside the mount), then removed through it:
    # names the mount never looked up, files whose blocks the host frees at the unlink.
    # Under a name the mount never looked up (a peer caching the negative entry of the
    # removed srctree would not show a new one). Timed only when the host has the whole
    # tree and the mount shows it (one LOOKUP).
    rm -rf "${SRC:?}/$s/srctree" "${SRC:?}/$s/host"
    if mkdir "$SRC/$s/host" && tar -xf "$DATA/src.tar" -C "$SRC/$s/host" && sync &&
        [[ $(find "$SRC/$s/host/srctree" -type f | wc -l) == "$TAR_FILES" &&
            -d $TP/$s/host/srctree ]]; then
        timed rmrf_host "$t" "$TP/$s" 'rm -rf host/srctree' "[[ ! -e $TP/$s/host/srctree ]]"
    else
        fail_rows "$t" "the tree made on the host is not whole, or not shown by the mount" rmrf_host
    fi
    unmount_current
    rm -rf "${SRC:?}/$s"
}

grp_dd() {
    local t=$1 s=scratch/$1
    rm -rf "${SRC:?}/$s" && mkdir -p "$SRC/$s"
    mount_target "$t" || { fail_rows "$t" "mount failed" dd_write dd_read_cold dd_read_hot; return; }
    sync
    timed dd_write "$t" "$TP/$s" "dd if=/dev/zero of=big bs=1M count=$DD_MB conv=fsync status=none"
    if ((LAST_OK)); then
        if ! slow dd_read_cold; then
            remount cold; timed dd_read_cold "$t" "$TP/$s" 'dd if=big of=/dev/null bs=1M status=none'
        fi
        timed _warmup "$t" "$TP/$s" 'cat big >/dev/null'
        timed dd_read_hot "$t" "$TP/$s" 'dd if=big of=/dev/null bs=1M status=none'
    else
        fail_rows "$t" "no file: the write failed" dd_read_cold dd_read_hot
    fi
    unmount_current
    rm -rf "${SRC:?}/$s"
}

grp_fio() {
    local t=$1 s=scratch/$1 iops
    rm -rf "${SRC:?}/$s" && mkdir -p "$SRC/$s"
    mount_target "$t" || { fail_rows "$t" "mount failed" fio_iops; return; }
    local common="fio --name=r --filename=r.dat --rw=randread --bs=4k --size=$FIO_SIZE --ioengine=psync --invalidate=0"
    # lay the file out and read it once (untimed): the timed run is a hot-cache random read
    # (--invalidate=0: fio would otherwise drop the file's page cache before the run)
    timed _warmup "$t" "$TP/$s" "$common --create_only=1 >/dev/null && cat r.dat >/dev/null"
    if timed _fio "$t" "$TP/$s" "$common --runtime=$FIO_RT --time_based --output-format=terse --terse-version=3"; then
        iops=$(awk -F';' 'NF > 8 { print $8 }' "$OUT_F" | head -n 1)
        if [[ $iops =~ ^[0-9.]+$ && $iops != 0 ]]; then record fio_iops "$t" "$iops"
        else record fio_iops "$t" FAIL "could not parse fio output: $(head -c 300 "$OUT_F")"; fi
    else
        record fio_iops "$t" FAIL "fio failed (see _fio above)"
    fi
    unmount_current
    rm -rf "${SRC:?}/$s"
}

grp_build() {
    local t=$1 s=build/$1
    rm -rf "${SRC:?}/$s" && mkdir -p "$SRC/build" && cp -a "$DATA/cproject" "$SRC/$s"
    mount_target "$t" || { fail_rows "$t" "mount failed" build build_noop; return; }
    sync
    timed build "$t" "$TP/$s" "make -s -j$MAKE_J" &&
        { timed _warmup "$t" "$TP/$s" './app' 'grep -q "built ok" $OUT_F' || err "round $ROUND $t build: ./app did not run"; }
    slow build_noop || timed build_noop "$t" "$TP/$s" "make -j$MAKE_J" 'grep -q "up to date" $OUT_F'
    unmount_current
    rm -rf "${SRC:?}/$s"
}

grp_agent() {
    local t=$1 s=agent/$1 r d
    local rows=(agent_pip agent_clone agent_sqlite agent_npm agent_meson)
    rm -rf "${SRC:?}/$s" && mkdir -p "$SRC/$s"
    mount_target "$t" || { fail_rows "$t" "mount failed" "${rows[@]}"; return; }
    for r in "${rows[@]}"; do
        if [[ -n ${AGENT_BAD[$r]:-} ]]; then record "$r" "$t" FAIL "${AGENT_BAD[$r]}"; continue; fi
        # a fresh directory, made (and the project copied in) through the target, untimed
        d=$TP/$s/${r#agent_}
        if ! mkdir "$d" 2>"$TMPD/mk"; then record "$r" "$t" FAIL "mkdir $d: $(cat "$TMPD/mk")"; continue; fi
        case $r in
        agent_npm) cp "$NPM_PROJ/package.json" "$NPM_PROJ/package-lock.json" "$d/" ;;
        agent_meson) cp -a "$DATA/agent/meson/." "$d/" ;;
        esac || { record "$r" "$t" FAIL "copying the project into $d failed"; continue; }
        sync
        case $r in
        agent_pip)
            timed "$r" "$t" "$d" "unset PIP_FIND_LINKS; export PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
                /usr/bin/python3 -m venv .venv && .venv/bin/pip install -q --no-index --find-links $WHEELS $PIP_PKGS" \
                "$d/.venv/bin/python -c 'import requests, attrs, six, packaging, jinja2, click, pygments, certifi; certifi.contents()'" ;;
        agent_clone)
            timed "$r" "$t" "$d" "git clone -q --no-hardlinks $GIT_SRC dst" \
                "[[ \$(git -C $d/dst rev-parse HEAD) == $GIT_SRC_HEAD && -z \$(git -C $d/dst status --porcelain) ]]" ;;
        agent_sqlite)
            timed "$r" "$t" "$d" "/usr/bin/python3 $DATA/agent/sqlite_wal.py bench.db $SQL_N" "grep -q '^$SQL_N wal ' \$OUT_F" ;;
        agent_npm)
            timed "$r" "$t" "$d" "npm install --offline $NPM_FLAGS" "[[ -f $d/node_modules/express/package.json && -f $d/node_modules/chalk/package.json ]]" ;;
        agent_meson)
            timed "$r" "$t" "$d" "meson setup build >/dev/null && ninja -C build >/dev/null" "[[ \$($d/build/app) == 'built ok '* ]]" ;;
        esac
    done
    unmount_current
    rm -rf "${SRC:?}/$s"
}

# ---------------------------------------------------------------- main loop
prepare_data
gen_policies
cp -f "$REPO/policy.example.toml" "$POLICY_EXAMPLE" || exit 1
[[ ",$ONLY," == *,agent,* ]] && prepare_agent
((COUNT)) && count_setup
"$BIN" check "$POLICY_EXAMPLE" >"$TMPD/check" 2>&1 || err "fencefs check $POLICY_EXAMPLE failed: $(head -c 400 "$TMPD/check")"
"$BIN" check "$POLICY_1K" >"$TMPD/check" 2>&1 || err "fencefs check $POLICY_1K failed: $(head -c 400 "$TMPD/check")"
"$BIN" check "$POLICY_SMALL" >"$TMPD/check" 2>&1 || err "fencefs check $POLICY_SMALL failed: $(head -c 400 "$TMPD/check")"
drop_caches

IFS=, read -r -a GROUPS_SEL <<<"$ONLY"
START=$EPOCHREALTIME
LOADAVG_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "results: $RES.{txt,tsv,json}  (quick=$QUICK runs=$RUNS targets=${TARGETS[*]})"
for ((ROUND = 1; ROUND <= RUNS; ROUND++)); do
    for g in "${GROUPS_SEL[@]}"; do
        declare -F "grp_$g" >/dev/null || { log "unknown group $g"; continue; }
        CUR_GROUP=$g
        n=${#TARGETS[@]}
        for ((j = 0; j < n; j++)); do # alternate targets, rotating the order every round
            t=${TARGETS[$(((j + ROUND - 1) % n))]}
            log "round $ROUND/$RUNS  $g  $t"
            "grp_$g" "$t"
        done
    done
done
unmount_current
ELAPSED=$(awk -v a="$START" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')

# ---------------------------------------------------------------- report
# medians per (row, target): FAIL when any round failed
MED=$TMPD/medians
awk -F'\t' 'NR > 1 && $2 !~ /^_/ {
        key = $2 "\t" $3
        if ($5 == "FAIL") fail[key] = 1; else { n[key]++; v[key, n[key]] = $4 }
        keys[key] = 1
    }
    END {
        for (key in keys) {
            if (key in fail) { print key "\tFAIL"; continue }
            m = n[key]
            for (i = 1; i <= m; i++) a[i] = v[key, i]
            for (i = 2; i <= m; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
            med = (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
            print key "\t" med
        }
    }' "$SAMPLES" >"$MED"

get_med() { awk -F'\t' -v r="$1" -v t="$2" '$1 == r && $2 == t { print $3; f = 1 } END { if (!f) print "-" }' "$MED"; }
fmt() { # fmt VALUE KIND UNIT
    case $1 in FAIL | -) printf '%s' "$1" ;; *)
        case $2/$3 in tput/* | */fds) awk -v x="$1" 'BEGIN { printf "%.0f", x }' ;; info/*) awk -v x="$1" 'BEGIN { printf "%.1f", x }' ;;
        *) awk -v x="$1" 'BEGIN { if (x < 10) printf "%.3f", x; else printf "%.2f", x }' ;; esac ;;
    esac
}
ratio() { # ratio VALUE NATIVE
    if [[ $1 =~ ^[0-9.e+-]*[0-9][0-9.e+-]*$ && $2 =~ ^[0-9.e+-]*[0-9][0-9.e+-]*$ ]]; then awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "-" }'
    else printf '%s' "-"; fi
}

# columns: the targets that ran, in the canonical order; ratio columns for the non-native ones
COLS=() RCOLS=()
for t in "${ALL_TARGETS[@]}"; do
    [[ " ${TARGETS[*]} " == *" $t "* ]] || continue
    COLS+=("$t")
    [[ $t != native ]] && RCOLS+=("$t")
done
short() { local x=${1/fencefs-revoke/revoke}; x=${x/passthrough_hp/pt_hp}; x=${x/fencefs-stage-uring/stage-ur}; x=${x/pt_hp-overlay-uring/ovl-ur}; printf '%s' "${x/fencefs-uring/uring}"; }
POLICY_NOTE="mode danger, policy 4 rules (+ a $NRULES-rule row)"
case $POLICY_OPT in
example) POLICY_NOTE="policy.example.toml, mode workspace-write (+ a $NRULES-rule danger row)" ;;
auto) [[ ",$ONLY," == *,agent,* ]] && POLICY_NOTE+="; agent group: policy.example.toml, mode workspace-write" ;;
esac

TXT=$RES.txt TSV=$RES.tsv JSON=$RES.json
if ((COUNT)); then
    # ---------------------------------------------------------------- --count report
    {
        echo "fencefs benchmark --count  $(date -Is)  host $(uname -n) kernel $(uname -r) cpus $(nproc)"
        echo "binary $BIN_SRC (built $BIN_MTIME, sha256 $BIN_SHA)  $POLICY_NOTE${THREADS:+, --threads $THREADS}"
        echo "transport: $TRANSPORT_NOTE"
        echo "transport checked at every mount from the daemon's fds (scripts/bench/uring-check.sh):$(for t in "${!RINGS[@]}"; do printf ' %s %s;' "$t" "${RINGS[$t]}"; done) enable_uring=$(cat "$URING_PARAM" 2>/dev/null || echo missing)"
        [[ -n $PTHP_NOTE ]] && echo "$PTHP_NOTE"
        echo "work dir $ROOT ($(df -T "$SRC" | awk 'NR == 2 { print $2 }'))$( ((LOOPFS)) && echo "  loopfs: private ext4 image $LOOP_IMG ($LOOPFS_SIZE) via $LOOP_DEV")"
        echo "FUSE requests per workload (one untimed round, counted with $COUNT_METHOD$([[ $COUNT_METHOD == strace ]] && echo ': successful read(2)s on /dev/fuse + io_uring_enter calls of the daemon'))"
        echo
        hdr=$(printf '%-46s' workload)
        for t in "${RCOLS[@]}"; do hdr+=$(printf ' %10s' "$(short "$t")"); done
        echo "$hdr"; printf '%*s\n' ${#hdr} '' | tr ' ' '-'
        for r in "${ROWS[@]}"; do
            grep -q "^$r	" "$COUNTS" || continue
            line=$(printf '%-46s' "${LABEL[$r]}")
            for t in "${RCOLS[@]}"; do
                v=$(awk -F'\t' -v r="$r" -v t="$t" '$1 == r && $2 == t && $3 == "ALL" { print $4; f = 1 } END { if (!f) print "-" }' "$COUNTS")
                awk -F'\t' -v r="$r" -v t="$t" '$1 == r && $2 == t && $3 == "LOST" { f = 1 } END { exit !f }' "$COUNTS" && v+="+"
                line+=$(printf ' %10s' "$v")
            done
            echo "$line"
        done
        echo
        echo "top opcodes (fencefs targets):"
        for r in "${ROWS[@]}"; do
            for t in "${RCOLS[@]}"; do
                [[ $t == fencefs* ]] || continue
                top=$(awk -F'\t' -v r="$r" -v t="$t" '$1 == r && $2 == t && $3 != "ALL" && $3 != "LOST" { print $4 "\t" $3 }' "$COUNTS" |
                    sort -k1,1nr | head -n 6 | awk -F'\t' '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $2, $1 }')
                [[ -n $top ]] && printf '  %-24s %-15s %s\n' "$r" "$(short "$t")" "$top"
            done
        done
        nerr=$(grep -c . "$ERRORS")
        echo
        if ((nerr)); then echo "$nerr error(s) in $ERRORS:"; sed 's/^/  /' "$ERRORS" | cut -c1-400; else echo "no errors"; fi
        echo "('+' = trace events lost, the count is a lower bound)  saved: $RES.counts.txt $COUNTS"
    } >"$RES.counts.txt"
    ln -sfn "$(basename "$RES.counts.txt")" "$OUT/latest-counts.txt"
    cat "$RES.counts.txt"
    exit 0
fi
{
    echo "fencefs benchmark  $(date -Is)  host $(uname -n) kernel $(uname -r) cpus $(nproc)"
    echo "binary $BIN_SRC (built $BIN_MTIME, sha256 $BIN_SHA)  $POLICY_NOTE${THREADS:+, --threads $THREADS}"
    echo "transport: $TRANSPORT_NOTE"
    echo "transport checked at every mount from the daemon's fds (scripts/bench/uring-check.sh):$(for t in "${!RINGS[@]}"; do printf ' %s %s;' "$t" "${RINGS[$t]}"; done) enable_uring=$(cat "$URING_PARAM" 2>/dev/null || echo missing)"
    [[ -n $PTHP_NOTE ]] && echo "$PTHP_NOTE"
    echo "runs $RUNS (median)$( ((QUICK)) && echo ', --quick: small sizes, cold/1k-rule/no-op rows skipped')  elapsed ${ELAPSED}s  loadavg at start $LOADAVG_START"
    echo "work dir $ROOT ($(df -T "$SRC" | awk 'NR == 2 { print $2 }'))$( ((DROP_OK)) || echo '  WARNING: drop_caches unavailable, cold = remount only')"
    ((LOOPFS)) && echo "loopfs in use: private ext4 image $LOOP_IMG ($LOOPFS_SIZE, sparse) loop-mounted via $LOOP_DEV on $LOOP_MNT"
    [[ ",$ONLY," == *,agent,* ]] && echo "agent inputs: $CACHE (wheelhouse $(find "$WHEELS" -name '*.whl' 2>/dev/null | wc -l) wheels, npm cache for $NPM_PKGS packages, git source: bare clone of $REPO, $GIT_SRC_FILES files at ${GIT_SRC_HEAD:0:12})"
    for t in fencefs fencefs-uring fencefs-stage-uring fencefs-revoke; do
        m=$(grep -h -m1 -o 'file I/O: .*' "$LOGDIR/$t.log" 2>/dev/null)
        [[ -n $m ]] && echo "$t $m"
    done
    echo "time rows: seconds, ratio = target time / native time (lower is better, 1.00 = native)"
    echo "throughput rows [T] (fio_iops): IOPS, ratio = target IOPS / native IOPS (higher is better)"
    echo "FAIL = the workload failed on that target in at least one round (details at the end); every sample: *.samples.tsv"
    echo
} >"$TXT"

hdr=$(printf '%-46s %-5s' workload unit)
for t in "${COLS[@]}"; do hdr+=$(printf ' %10s' "$(short "$t")"); done
for t in "${RCOLS[@]}"; do hdr+=$(printf ' %8s' "$(short "$t")/n"); done
{ echo "$hdr"; printf '%*s\n' ${#hdr} '' | tr ' ' '-'; } >>"$TXT"
printf 'row\tlabel\tkind\tunit' >"$TSV"
for t in "${COLS[@]}"; do printf '\t%s' "$t" >>"$TSV"; done
for t in "${RCOLS[@]}"; do printf '\tratio_%s' "$t" >>"$TSV"; done
echo >>"$TSV"

json_num() { [[ $1 =~ ^[0-9.e+-]*[0-9][0-9.e+-]*$ ]] && printf '%s' "$1" || printf '"%s"' "$1"; }
{
    printf '{\n  "date": "%s",\n  "host": "%s",\n  "kernel": "%s",\n  "cpus": %s,\n' "$(date -Is)" "$(uname -n)" "$(uname -r)" "$(nproc)"
    printf '  "binary": "%s",\n  "binary_mtime": "%s",\n  "binary_sha256_12": "%s",\n  "quick": %s,\n  "runs": %s,\n  "elapsed_s": %s,\n  "loadavg_start": "%s",\n' "$BIN_SRC" "$BIN_MTIME" "$BIN_SHA" "$( ((QUICK)) && echo true || echo false)" "$RUNS" "$ELAPSED" "$LOADAVG_START"
    printf '  "drop_caches": %s,\n  "threads": "%s",\n' "$( ((DROP_OK)) && echo true || echo false)" "${THREADS:-default}"
    printf '  "sizes": {"tree_files": %s, "git_files": %s, "create_files": %s, "tar_files": %s, "dd_mib": %s, "fio_size": "%s", "fio_runtime_s": %s, "c_files": %s, "rules_big_policy": %s},\n' \
        "$TREE_N" "$GIT_FILES" "$CREATE_N" "$TAR_FILES" "$DD_MB" "$FIO_SIZE" "$FIO_RT" "$C_FILES" "$NRULES"
    printf '  "rows": [\n'
} >"$JSON"

first=1
for r in "${ROWS[@]}"; do
    nat=$(get_med "$r" native)
    any=0
    for t in "${COLS[@]}"; do [[ $(get_med "$r" "$t") != - ]] && any=1; done
    ((any)) || continue
    line=$(printf '%-46s %-5s' "${LABEL[$r]}" "${UNIT[$r]}")
    tsv=$(printf '%s\t%s\t%s\t%s' "$r" "${LABEL[$r]}" "${KIND[$r]}" "${UNIT[$r]}")
    jmed="" jratio="" jsamp="" jmin=""
    for t in "${COLS[@]}"; do
        v=$(get_med "$r" "$t")
        line+=$(printf ' %10s' "$(fmt "$v" "${KIND[$r]}" "${UNIT[$r]}")")
        tsv+=$(printf '\t%s' "$v")
        [[ $v == - ]] || jmed+="${jmed:+, }\"$t\": $(json_num "$v")"
        s=$(awk -F'\t' -v r="$r" -v t="$t" '$2 == r && $3 == t { printf "%s%s", (n++ ? ", " : ""), ($5 == "FAIL" ? "\"FAIL\"" : $4) }' "$SAMPLES")
        [[ -n $s ]] && jsamp+="${jsamp:+, }\"$t\": [$s]"
        mn=$(awk -F'\t' -v r="$r" -v t="$t" -v k="${KIND[$r]}" '$2 == r && $3 == t && $5 == "ok" { x = $4 + 0; if (!n++ || (k == "tput" ? x > m : x < m)) m = x } END { if (n) print m }' "$SAMPLES")
        [[ -n $mn ]] && jmin+="${jmin:+, }\"$t\": $mn"
    done
    for t in "${RCOLS[@]}"; do
        v=$(get_med "$r" "$t")
        if [[ ${KIND[$r]} == info ]]; then x=-; else x=$(ratio "$v" "$nat"); fi
        [[ $v == FAIL ]] && x=FAIL
        line+=$(printf ' %8s' "$x")
        tsv+=$(printf '\t%s' "$x")
        [[ $x == - ]] || jratio+="${jratio:+, }\"$t\": $(json_num "$x")"
    done
    echo "$line" >>"$TXT"
    echo "$tsv" >>"$TSV"
    ((first)) || printf ',\n' >>"$JSON"
    first=0
    printf '    {"row": "%s", "label": "%s", "kind": "%s", "unit": "%s", "median": {%s}, "ratio_to_native": {%s}, "best": {%s}, "samples": {%s}}' \
        "$r" "${LABEL[$r]}" "${KIND[$r]}" "${UNIT[$r]}" "$jmed" "$jratio" "$jmin" "$jsamp" >>"$JSON"
done
nerr=$(grep -c . "$ERRORS")
{
    printf '\n  ],\n  "errors": %s,\n  "errors_log": "%s",\n  "samples_tsv": "%s",\n  "daemon_logs": "%s"\n}\n' "$nerr" "$ERRORS" "$SAMPLES" "$LOGDIR"
} >>"$JSON"
{
    echo
    if ((nerr)); then echo "$nerr error(s) — FAIL cells and details in $ERRORS:"; sed 's/^/  /' "$ERRORS" | cut -c1-400
    else echo "no errors"; fi
    echo "saved: $TXT $TSV $JSON $SAMPLES"
} >>"$TXT"
ln -sfn "$(basename "$TXT")" "$OUT/latest.txt"
ln -sfn "$(basename "$JSON")" "$OUT/latest.json"
ln -sfn "$(basename "$TSV")" "$OUT/latest.tsv"
cat "$TXT"
