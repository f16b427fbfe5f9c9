#!/usr/bin/env bash
# Conformance suites against fencefs (issue 6).
#
#   scripts/conformance.sh [OPTIONS]
#
# Installs the suites from the package registries only (crates.io: pjdfstest, fsx;
# Debian: fuse3, bindfs), then runs them as root against fresh mounts and prints each
# suite's counts:
#
#   pjdfstest  on the plain host directory, on bindfs, on fencefs in `danger` mode with an
#              allow-all policy (conformance/allow-all.toml, --allow-other; once per file
#              I/O path, see --io), and on fencefs with allow_setid/allow_devices off
#              (conformance/allow-all-restricted.toml).
#              Counts side by side; every failure through fencefs that passes on the host
#              directory is listed. conformance/pjdfstest.exclude lists the failures that
#              are by design (one reason per entry); any other one fails the script, and so
#              does an entry of the restricted run that does not fail (a refusal that
#              did not happen).
#   fsx        for each file I/O path (--io): --ops operations without mmap and with mmap
#              against one file in a fresh fencefs mount, then --procs concurrent fsx
#              processes (half of them with mmap) on distinct files.
#              A failing run is repeated with the same seed on the host directory to tell
#              fencefs bugs from host behaviour.
#
# Options:
#   --ops N              fsx operations per single-file run (default 100000)
#   --procs N            concurrent fsx processes (default 4)
#   --concurrent-ops N   operations per concurrent fsx process (default ops/4)
#   --seed N             fsx seed (default 1)
#   --only SUITE         pjdfstest | fsx (default both)
#   --io LIST            fencefs file I/O paths to test, comma-separated (default
#                        default,no-passthrough,revoke): `default` = kernel passthrough
#                        where available, `no-passthrough` = through the daemon and the
#                        page cache, `revoke` = --revoke (direct I/O, every read/write
#                        re-checked). Options the binary lacks are skipped with a note.
#   --filter PATTERN     only pjdfstest tests whose name contains PATTERN (repeatable)
#   --bin PATH           fencefs binary to test (default: cargo build --release, then
#                        target/release/fencefs)
#   --no-install         do not install anything; fail if a tool is missing
#   --pjdfstest-timeout S  per pjdfstest run (default 900)
#   --fsx-timeout S      per fsx run (default 1800)
#   --keep               keep the scratch directories (logs are always kept)
#   --stage              every fencefs mount stages its changes (`--stage DIR`, a fresh
#                        DIR per mount): the same suites through the merged view
#   --layers             every fencefs mount also loads conformance/second-layer.toml as a
#                        second policy layer (an organisation floor: the `secrets` preset):
#                        the same suites with the layered decision path
#   --as-user UID        every fencefs daemon runs as UID, an ordinary user with no
#                        capabilities (setpriv), mounting through fusermount3 with
#                        --allow-other (the suites still run as root). The script runs in
#                        a private mount namespace of its own where /dev/fuse is a 0666
#                        node and /etc/fuse.conf says user_allow_other (the host's are
#                        left alone); SOURCE, the mount point and DIR are UID's. With
#                        --stage: DIR's markers are user.overlay.*
#   -h, --help
#
# Exit status: 0 when every check passed, 1 when one failed, 2 on usage errors.
# Logs (daemon logs, full pjdfstest output, fsx artifacts) go to a directory printed at
# the start and the end. Everything the script mounts is unmounted on exit (trap EXIT),
# and only the daemons it started are stopped, by pid.

set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONF="$ROOT/conformance"
PJDFSTEST_VERSION=0.2.2
FSX_VERSION=0.3.2

OPS=100000
PROCS=4
CONC_OPS=
SEED=1
ONLY=
IO_LIST=default,no-passthrough,revoke
FILTERS=()
BIN=
INSTALL=1
PJD_TIMEOUT=900
FSX_TIMEOUT=1800
KEEP=0
STAGE=0
LAYERS=0
AS_USER=
ARGS=("$@")

usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --ops) OPS=$2; shift 2 ;;
        --procs) PROCS=$2; shift 2 ;;
        --concurrent-ops) CONC_OPS=$2; shift 2 ;;
        --seed) SEED=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --io) IO_LIST=$2; shift 2 ;;
        --filter) FILTERS+=("$2"); shift 2 ;;
        --bin) BIN=$2; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        --pjdfstest-timeout) PJD_TIMEOUT=$2; shift 2 ;;
        --fsx-timeout) FSX_TIMEOUT=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --stage) STAGE=1; shift ;;
        --layers) LAYERS=1; shift ;;
        --as-user) AS_USER=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "conformance: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$OPS" "$PROCS" "$SEED" "$PJD_TIMEOUT" "$FSX_TIMEOUT" ${CONC_OPS:+"$CONC_OPS"} ${AS_USER:+"$AS_USER"}; do
    case "$n" in ''|*[!0-9]*) echo "conformance: '$n' is not a number" >&2; exit 2 ;; esac
done
case "$ONLY" in ''|pjdfstest|fsx) ;; *) echo "conformance: --only pjdfstest|fsx" >&2; exit 2 ;; esac
[ -n "$CONC_OPS" ] || CONC_OPS=$(( OPS / 4 > 0 ? OPS / 4 : 1 ))
want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

if [ "$(id -u)" -ne 0 ]; then
    echo "conformance: must run as root (pjdfstest switches users, creates device nodes)" >&2
    exit 2
fi

# --as-user: the whole run in a private mount namespace (what it binds and mounts there
# never reaches the host's; everything goes with the namespace).
if [ -n "$AS_USER" ] && [ -z "${FENCEFS_CONFORMANCE_NS:-}" ]; then
    exec env FENCEFS_CONFORMANCE_NS=1 unshare -m --propagation private "$0" "${ARGS[@]}"
fi

export PATH="$HOME/.cargo/bin:$PATH"
export NO_COLOR=1 CLICOLOR=0 CLICOLOR_FORCE=0

log() { printf '==> %s\n' "$*"; }

# ---- scratch space and cleanup -------------------------------------------------------

# Short paths on purpose: pjdfstest binds unix sockets below its test directory
# (sun_path holds 107 bytes), and its PATH_MAX helper panics when the length left under
# PATH_MAX is a multiple of 127 (NAME_MAX / 2); every directory it runs in is
# /tmp/fcf.XXXXXX/xN (18 bytes), which avoids both.
WORK=$(mktemp -d /tmp/fcf.XXXXXX)
chmod 755 "$WORK"      # pjdfstest's dummy users must be able to traverse it
LOGS="$WORK/logs"
mkdir -p "$LOGS"
SHM=
NMOUNT=0
MOUNTS=()   # mount points this script mounted (index-aligned with PIDS)
PIDS=()     # pids of the daemons this script started

# --as-user: /dev/fuse usable by the user, and user_allow_other, in this namespace only.
DEVD=
if [ -n "$AS_USER" ]; then
    DEVD=$(mktemp -d /tmp/fcf-dev.XXXXXX)
    if ! { mount -t tmpfs -o size=64k,mode=0755 fencefs-conformance-dev "$DEVD" \
        && mknod -m 0666 "$DEVD/fuse" c 10 229 \
        && printf 'user_allow_other\n' >"$DEVD/fuse.conf" \
        && mount --bind "$DEVD/fuse" /dev/fuse \
        && mount --bind "$DEVD/fuse.conf" /etc/fuse.conf; }; then
        echo "conformance: --as-user: cannot prepare /dev/fuse and fuse.conf" >&2; exit 1
    fi
fi

mounted() { # MOUNTPOINT -> 0 if it is a mount point now
    awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo
}

mount_fstype() { # MOUNTPOINT -> fstype of the mount there
    awk -v m="$1" '$5 == m { for (i = 7; i <= NF; i++) if ($i == "-") { print $(i + 1); exit } }' \
        /proc/self/mountinfo
}

stop_mount() { # INDEX: SIGTERM the daemon by pid, wait, unmount what is left
    local i=$1 mnt=${MOUNTS[$1]} pid=${PIDS[$1]}
    [ -n "$mnt" ] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    if mounted "$mnt"; then
        echo "conformance: $mnt still mounted after SIGTERM to $pid; unmounting" >&2
        fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" 2>/dev/null \
            || umount -l "$mnt" 2>/dev/null
    fi
    if kill -0 "$pid" 2>/dev/null; then
        echo "conformance: daemon $pid did not exit; SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    local rc=$?
    MOUNTS[i]=
    return $rc
}

CHILDREN=() # pids of the suite processes this script started in the background

# bg_wait OUTFILE CMD...: runs CMD (stdout and stderr to OUTFILE) in the background and
# waits for it, so that a signal to this script is handled at once (bash runs traps only
# between foreground commands).
bg_wait() {
    local out=$1; shift
    "$@" >"$out" 2>&1 &
    local p=$!
    CHILDREN+=("$p")
    wait "$p"
}

exec 8>&1 9>&2   # the script's own stdout/stderr, for cleanup() wherever a trap fires

cleanup() {
    local i left=0
    exec 1>&8 2>&9
    trap - EXIT INT TERM HUP
    for i in "${CHILDREN[@]}"; do
        kill -TERM "$i" 2>/dev/null
    done
    for (( i = ${#MOUNTS[@]} - 1; i >= 0; i-- )); do
        stop_mount "$i"
    done
    if grep -q " $WORK/" /proc/self/mountinfo; then
        echo "conformance: something is still mounted under $WORK; leaving it in place" >&2
        left=1
    fi
    if [ "$left" = 0 ] && [ "$KEEP" = 0 ]; then
        find "$WORK" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} + 2>/dev/null
    fi
    [ -n "$SHM" ] && rm -rf "$SHM"
    if [ -n "$DEVD" ]; then
        umount /etc/fuse.conf /dev/fuse "$DEVD" 2>/dev/null
        rmdir "$DEVD" 2>/dev/null
    fi
    echo "logs: $LOGS"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

wait_mounted() { # MOUNTPOINT PID FSTYPE LOG
    for _ in $(seq 1 200); do
        if mounted "$1" && [ "$(mount_fstype "$1")" = "$3" ]; then
            return 0
        fi
        if ! kill -0 "$2" 2>/dev/null; then
            echo "conformance: daemon for $1 exited before mounting:" >&2
            tail -n 20 "$4" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "conformance: $1 did not appear as $3 in /proc/self/mountinfo within 20 s" >&2
    return 1
}

# start_fencefs NAME [fencefs mount options...]: fresh SOURCE and MOUNTPOINT under $WORK;
# sets MNT and SRC.
start_fencefs() {
    local name=$1; shift
    NMOUNT=$(( NMOUNT + 1 )); SRC="$WORK/s$NMOUNT"; MNT="$WORK/m$NMOUNT"
    mkdir -p "$SRC" "$MNT"; chmod 755 "$SRC" "$MNT"
    local stage=()
    [ "$STAGE" = 1 ] && stage=(--stage "$WORK/stage$NMOUNT")
    local layer=()
    [ "$LAYERS" = 1 ] && layer=(-p "$CONF/second-layer.toml")
    local other=() asuser=()
    if [ -n "$AS_USER" ]; then
        asuser=(setpriv --reuid "$AS_USER" --regid "$AS_USER" --clear-groups)
        chown "$AS_USER:$AS_USER" "$SRC" "$MNT"
        if [ "$STAGE" = 1 ]; then
            mkdir -m 700 "$WORK/stage$NMOUNT" && chown "$AS_USER:$AS_USER" "$WORK/stage$NMOUNT"
        fi
        # The suites run as root: they reach the user's mount only with allow_other.
        case " $* " in *" --allow-other "*) ;; *) other=(--allow-other) ;; esac
    fi
    RUST_LOG=${RUST_LOG:-warn} "${asuser[@]}" "$FENCEFS" mount "${stage[@]}" "$@" "${other[@]}" "${layer[@]}" "$SRC" "$MNT" >"$LOGS/$name.daemon.log" 2>&1 &
    local pid=$!
    MOUNTS+=("$MNT"); PIDS+=("$pid")
    wait_mounted "$MNT" "$pid" fuse.fencefs "$LOGS/$name.daemon.log"
}

start_bindfs() {
    local name=$1
    NMOUNT=$(( NMOUNT + 1 )); SRC="$WORK/s$NMOUNT"; MNT="$WORK/m$NMOUNT"
    mkdir -p "$SRC" "$MNT"; chmod 755 "$SRC" "$MNT"
    bindfs -f "$SRC" "$MNT" >"$LOGS/$name.daemon.log" 2>&1 &
    local pid=$!
    MOUNTS+=("$MNT"); PIDS+=("$pid")
    wait_mounted "$MNT" "$pid" fuse "$LOGS/$name.daemon.log"
}

# stop_last: unmount the newest mount; reports the daemon's exit status.
stop_last() {
    local i=$(( ${#MOUNTS[@]} - 1 )) name=$1 rc
    stop_mount "$i"; rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "conformance: $name: daemon exited with status $rc on SIGTERM (expected 0)" >&2
        CHECK_FAIL=$(( CHECK_FAIL + 1 ))
        FAILED_CHECKS+=("$name: daemon exit status $rc on SIGTERM")
    fi
}

CHECK_PASS=0
CHECK_FAIL=0
FAILED_CHECKS=()
check() { # NAME OK(0|1)
    if [ "$2" = 0 ]; then
        CHECK_PASS=$(( CHECK_PASS + 1 ))
    else
        CHECK_FAIL=$(( CHECK_FAIL + 1 )); FAILED_CHECKS+=("$1")
    fi
}

# ---- installation (package registries only) ------------------------------------------

APT_UPDATED=0
apt_install() {
    [ "$INSTALL" = 1 ] || { echo "conformance: missing $* (--no-install)" >&2; exit 1; }
    if [ "$APT_UPDATED" = 0 ]; then
        apt-get update -qq >/dev/null || { echo "conformance: apt-get update failed" >&2; exit 1; }
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
        || { echo "conformance: apt-get install $* failed" >&2; exit 1; }
}

cargo_install() { # CRATE VERSION BINARY
    if command -v "$3" >/dev/null && "$3" --version 2>/dev/null | grep -q " $2\$"; then
        return 0
    fi
    [ "$INSTALL" = 1 ] || { echo "conformance: missing $3 $2 (--no-install)" >&2; exit 1; }
    log "cargo install $1@$2"
    cargo install --locked --quiet "$1@$2" >"$LOGS/install-$1.log" 2>&1 || {
        tail -n 30 "$LOGS/install-$1.log" >&2
        echo "conformance: cargo install $1@$2 failed" >&2
        exit 1
    }
}

command -v fusermount3 >/dev/null || apt_install fuse3
if want pjdfstest; then
    command -v bindfs >/dev/null || apt_install bindfs
    cargo_install pjdfstest "$PJDFSTEST_VERSION" pjdfstest
fi
want fsx && cargo_install fsx "$FSX_VERSION" fsx

if [ -z "$BIN" ]; then
    log "cargo build --release"
    (cd "$ROOT" && cargo build --release --quiet) >"$LOGS/build.log" 2>&1 || {
        tail -n 40 "$LOGS/build.log" >&2
        echo "conformance: cargo build --release failed" >&2
        exit 1
    }
    BIN="$ROOT/target/release/fencefs"
fi
FENCEFS=$(readlink -f "$BIN")
[ -x "$FENCEFS" ] || { echo "conformance: no fencefs binary at $BIN" >&2; exit 1; }

log "logs: $LOGS"
log "fencefs: $FENCEFS"

# The file I/O paths to test, as far as this binary has them.
IO_MODES=()
FENCE_RUNS=()
HELP=$("$FENCEFS" mount --help 2>&1)
for m in ${IO_LIST//,/ }; do
    case "$m" in
        default) IO_MODES+=(default) ;;
        no-passthrough|revoke)
            if grep -q -- "--$m" <<<"$HELP"; then IO_MODES+=("$m")
            else log "note: this fencefs has no --$m; that I/O path is not tested"; fi ;;
        *) echo "conformance: --io: unknown I/O path '$m'" >&2; exit 2 ;;
    esac
done
[ "${#IO_MODES[@]}" -gt 0 ] || { echo "conformance: --io selects nothing" >&2; exit 2; }
io_args() { [ "$1" = default ] || echo "--$1"; }

# ---- pjdfstest ------------------------------------------------------------------------

declare -A STATUS   # "<run>|<test>" -> ok | FAILED | skipped | xfail | xpass
declare -A MESSAGE  # "<run>|<test>" -> first line of the failure message
declare -A COUNTS   # "<run>" -> "passed failed skipped"
RUNS=()
RUN_LABEL=()

pjd_config() { # -> path of the pjdfstest config with this machine's dummy users
    local cfg="$WORK/pjdfstest.toml" u1=nobody u2=daemon
    if ! id "$u1" >/dev/null 2>&1 || ! id "$u2" >/dev/null 2>&1; then
        echo "conformance: pjdfstest needs the users '$u1' and '$u2'" >&2; exit 1
    fi
    {
        cat "$CONF/pjdfstest.toml"
        printf '\n[dummy_auth]\nentries = [["%s", "%s"], ["%s", "%s"]]\n' \
            "$u1" "$(id -gn "$u1")" "$u2" "$(id -gn "$u2")"
    } >"$cfg"
    echo "$cfg"
}

# run_pjdfstest RUN LABEL DIR: runs the suite in DIR, parses every test's status.
run_pjdfstest() {
    local run=$1 label=$2 dir=$3 out="$LOGS/pjdfstest-$1.log" rc
    local args=(-c "$PJD_CFG" -p "$dir")
    [ -n "$SHM" ] && args+=(-s "$SHM")
    log "pjdfstest on $label ($dir)"
    local t0=$SECONDS
    bg_wait "$out" timeout -k 10 "$PJD_TIMEOUT" env -C "$dir" pjdfstest "${args[@]}" "${FILTERS[@]}"
    rc=$?
    RUNS+=("$run"); RUN_LABEL+=("$label")
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "conformance: pjdfstest on $label timed out after ${PJD_TIMEOUT}s" >&2
    fi
    local name status msg
    while IFS=$'\t' read -r name status msg; do
        STATUS["$run|$name"]=$status
        MESSAGE["$run|$name"]=$msg
    done < <(awk '
        function flush() { if (name != "") print name "\t" st "\t" msg; name = "" }
        /^[^ \t]/ && NF >= 2 {
            flush()
            st = ""
            if ($NF == "ok") st = "ok"
            else if ($NF == "FAILED") st = "FAILED"
            else if ($NF == "skipped") st = "skipped"
            else if ($(NF-1) " " $NF == "as expected") st = "xfail"
            else if ($(NF-1) " " $NF == "PASSED UNEXPECTEDLY") st = "xpass"
            if (st != "") { name = $1; msg = "" }
            next
        }
        /^\t/ && name != "" && msg == "" && st == "FAILED" {
            m = $0; sub(/^\t+/, "", m); gsub(/\t/, " ", m); msg = m; next
        }
        END { flush() }' "$out")
    local summary
    summary=$(grep -E '^Summary: ' "$out" | tail -n 1)
    local f s p
    f=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$summary")
    s=$(sed -nE 's/.* ([0-9]+) skipped.*/\1/p' <<<"$summary")
    p=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$summary")
    if [ -z "$summary" ]; then
        # No summary (crash, time-out): count what was parsed.
        f=0 s=0 p=0
        local k
        for k in "${!STATUS[@]}"; do
            [ "${k%%|*}" = "$run" ] || continue
            case "${STATUS[$k]}" in ok) p=$((p+1)) ;; skipped) s=$((s+1)) ;; *) f=$((f+1)) ;; esac
        done
        echo "conformance: pjdfstest on $label printed no summary (exit $rc); see $out" >&2
        COUNTS["$run"]="$p $f $s incomplete"
    else
        COUNTS["$run"]="$p $f $s"
    fi
    printf '    %s passed, %s failed, %s skipped (%ds)\n' "$p" "$f" "$s" $(( SECONDS - t0 ))
}

# The exclusion list: "SCOPE PATTERN REASON..." (scope: fencefs | restricted | layers;
# PATTERN is a test name or a shell glob over test names, e.g. '*::block'). `layers`
# entries apply to the allow-all runs only with --layers.
declare -A EXCLUDE
excluded() { # SCOPE TEST -> prints the reason of the first matching entry
    local k
    for k in "${!EXCLUDE[@]}"; do
        [ "${k%%|*}" = "$1" ] || continue
        # shellcheck disable=SC2053  # the entry is a glob on purpose
        if [[ "$2" == ${k#*|} ]]; then
            printf '%s' "${EXCLUDE[$k]}"
            return 0
        fi
    done
    return 1
}
load_excludes() {
    local scope name reason
    [ -f "$CONF/pjdfstest.exclude" ] || return 0
    while read -r scope name reason; do
        case "$scope" in ''|'#'*) continue ;; esac
        if [ -z "$reason" ]; then
            echo "conformance: pjdfstest.exclude: '$name' has no reason" >&2; exit 1
        fi
        case "$scope" in fencefs|restricted|layers) ;; *)
            echo "conformance: pjdfstest.exclude: unknown scope '$scope'" >&2; exit 1 ;;
        esac
        EXCLUDE["$scope|$name"]=$reason
    done <"$CONF/pjdfstest.exclude"
}

is_fail() { case "$1" in FAILED|xpass) return 0 ;; *) return 1 ;; esac; }

pjdfstest_suite() {
    PJD_CFG=$(pjd_config) || exit 1
    SHM=
    if [ -d /dev/shm ] && [ "$(stat -f -c %T /dev/shm)" = tmpfs ]; then
        SHM=$(mktemp -d /dev/shm/fencefs-conformance.XXXXXX) && chmod 755 "$SHM"
    fi
    load_excludes

    # 1. the plain host directory
    local host="$WORK/h0"
    mkdir -p "$host"; chmod 755 "$host"
    run_pjdfstest host "host directory ($(stat -f -c %T "$host"))" "$host"

    # 2. bindfs
    if start_bindfs bindfs; then
        run_pjdfstest bindfs "bindfs $(bindfs --version 2>/dev/null | awk '{print $2; exit}')" "$MNT"
        stop_mount $(( ${#MOUNTS[@]} - 1 ))
    else
        check "bindfs mount" 1
    fi

    # 3. fencefs, danger, allow-all: once per file I/O path the daemon has
    local run
    for run in "${IO_MODES[@]}"; do
        local tag=fencefs label="fencefs allow-all"
        [ "$run" = default ] || { tag="fencefs-$run"; label="fencefs allow-all --$run"; }
        # shellcheck disable=SC2046  # io_args prints zero or one word
        if start_fencefs "$tag" -p "$CONF/allow-all.toml" -m danger --allow-other $(io_args "$run"); then
            run_pjdfstest "$tag" "$label" "$MNT"
            stop_last "$label"
            FENCE_RUNS+=("$tag")
        else
            check "mount: $label" 1
        fi
    done

    # 4. fencefs, danger, allow_setid = allow_devices = false
    if start_fencefs restricted -p "$CONF/allow-all-restricted.toml" -m danger --allow-other; then
        run_pjdfstest restricted "fencefs setid/devices off" "$MNT"
        stop_last "fencefs (restricted)"
    else
        check "mount: fencefs (restricted)" 1
    fi

    # ---- report ----
    echo
    echo "pjdfstest $PJDFSTEST_VERSION"
    printf '  %-34s %7s %7s %8s\n' run passed failed skipped
    local i p f s x
    for i in "${!RUNS[@]}"; do
        read -r p f s x <<<"${COUNTS[${RUNS[$i]}]}"
        printf '  %-34s %7s %7s %8s %s\n' "${RUN_LABEL[$i]}" "$p" "$f" "$s" "${x:+($x)}"
    done

    local names=() k
    for k in "${!STATUS[@]}"; do
        [ "${k%%|*}" = host ] && names+=("${k#*|}")
    done
    mapfile -t names < <(printf '%s\n' "${names[@]}" | sort)

    # Failures through fencefs (allow-all, any I/O path) that pass on the host directory.
    local unexpected=0 name st hs note reason where msg
    echo
    echo "fencefs-only failures, allow-all (fail through fencefs, not on the host directory):"
    local any=0
    for name in "${names[@]}"; do
        hs=${STATUS["host|$name"]:-missing}
        is_fail "$hs" && continue
        where="" msg=""
        for run in "${FENCE_RUNS[@]}"; do
            st=${STATUS["$run|$name"]:-missing}
            if is_fail "$st" || [ "$st" = missing ]; then
                where+="${where:+, }$run${st/#FAILED/}"
                [ -n "$msg" ] || msg=${MESSAGE["$run|$name"]:-}
            fi
        done
        [ -n "$where" ] || continue
        any=1
        note=""
        is_fail "${STATUS["bindfs|$name"]:-missing}" && note=" [also fails on bindfs]"
        if reason=$(excluded fencefs "$name") || { [ "$LAYERS" = 1 ] && reason=$(excluded layers "$name"); }; then
            printf '  %-50s excluded: %s\n' "$name" "$reason"
        else
            unexpected=$((unexpected + 1))
            printf '  %-50s on: %s%s\n      %s\n' "$name" "$where" "$note" "$msg"
        fi
    done
    [ "$any" = 1 ] || echo "  (none)"
    check "pjdfstest fencefs allow-all: $unexpected unexpected failure(s)" $(( unexpected > 0 ))

    # The restricted run: new failures must be exactly the listed device/setid refusals.
    local runexp=0 expected_n=0 eperm_n=0 reason explist="$LOGS/pjdfstest-restricted-expected.txt"
    : >"$explist"
    local -A expected_by=()
    echo
    echo "restricted run (allow_setid = allow_devices = false): failures that pass with allow-all:"
    any=0
    for name in "${names[@]}"; do
        st=${STATUS["restricted|$name"]:-missing}
        hs=${STATUS["fencefs|$name"]:-missing}
        is_fail "$st" || [ "$st" = missing ] || continue
        is_fail "$hs" && continue
        any=1
        if reason=$(excluded restricted "$name"); then
            printf '%-60s %s\n' "$name" "${MESSAGE["restricted|$name"]:-}" >>"$explist"
            expected_n=$((expected_n + 1))
            case "${MESSAGE["restricted|$name"]:-}" in *EPERM*) eperm_n=$((eperm_n + 1)) ;; esac
            expected_by["$reason"]=$(( ${expected_by["$reason"]:-0} + 1 ))
        else
            runexp=$((runexp + 1))
            printf '  %-60s UNEXPECTED %s\n      %s\n' "$name" "$st" "${MESSAGE["restricted|$name"]:-}"
        fi
    done
    [ "$any" = 1 ] || echo "  (none)"
    if [ "$expected_n" -gt 0 ]; then
        echo "  $expected_n expected (conformance/pjdfstest.exclude), by reason:"
        for reason in "${!expected_by[@]}"; do
            printf '    %4d  %s\n' "${expected_by[$reason]}" "$reason"
        done
        echo "  $eperm_n of them fail on an EPERM result, the others on a failed mknod of a device"
        echo "  (each with its message: $explist)"
    fi
    # Every listed refusal must really happen: a test an entry names must not pass.
    for name in "${names[@]}"; do
        [ "${STATUS["restricted|$name"]:-missing}" = ok ] || continue
        if reason=$(excluded restricted "$name"); then
            runexp=$((runexp + 1))
            printf '  %-60s PASSED, but the refusal listed for it did not happen (%s)\n' "$name" "$reason"
        fi
    done
    check "pjdfstest fencefs restricted: $runexp unexpected result(s)" $(( runexp > 0 ))
}

# ---- fsx ------------------------------------------------------------------------------

# fsx_run NAME CONFIG FILE OPS SEED -> 0 on "All operations completed A-OK!"
fsx_run() {
    local name=$1 cfg=$2 file=$3 ops=$4 seed=$5 rc
    local art="$LOGS/fsx-$name"
    mkdir -p "$art"
    bg_wait "$LOGS/fsx-$name.log" \
        timeout -k 10 "$FSX_TIMEOUT" fsx -f "$cfg" -N "$ops" -S "$seed" -P "$art" "$file"
    rc=$?
    if [ "$rc" = 0 ] && grep -q 'All operations completed A-OK' "$LOGS/fsx-$name.log"; then
        return 0
    fi
    [ "$rc" = 124 ] && echo "fsx $name: timed out after ${FSX_TIMEOUT}s" >>"$LOGS/fsx-$name.log"
    return 1
}

FSX_ROWS=()
fsx_report() { # NAME OPS OK SECONDS
    FSX_ROWS+=("$(printf '  %-34s %9s  %-6s %5ss' "$1" "$2" "$3" "$4")")
}

fsx_baseline() { # NAME CONFIG OPS SEED: repeat a failed run on the host directory
    local dir="$WORK/fsx-host" name=$1
    mkdir -p "$dir"
    if fsx_run "host-$name" "$2" "$dir/$name" "$3" "$4"; then
        echo "    same run on the host directory: A-OK, so the failure is fencefs's"
    else
        echo "    same run on the host directory: FAILS too (see $LOGS/fsx-host-$name.log)"
    fi
}

fsx_errors() { # LOG: the lines that say what went wrong
    grep -m 6 -E 'panicked|Err|[Ee]rror|FAIL|[Mm]ismatch|BAD|bad data|timed out' "$1" | sed 's/^/    /'
}

fsx_mode() { # I/O-PATH
    local io=$1 tag=fsx label="default"
    [ "$io" = default ] || { tag="fsx-$io"; label="--$io"; }
    # shellcheck disable=SC2046  # io_args prints zero or one word
    if ! start_fencefs "$tag" -p "$CONF/allow-all.toml" -m danger $(io_args "$io"); then
        check "mount: fencefs $label (fsx)" 1
        return
    fi
    local t0 ok name cfg run names=(plain mmap) mmap_cfg="$CONF/fsx-mmap.toml"
    # --revoke refuses shared writable mmap by design (ENODEV: pages could not be
    # re-checked; see README "Safety model"), so its runs do not use mmap.
    if [ "$io" = revoke ]; then
        names=(plain); mmap_cfg="$CONF/fsx.toml"
        log "fsx --revoke: mmap runs skipped (MAP_SHARED is refused with ENODEV by design)"
    fi
    for name in "${names[@]}"; do
        cfg="$CONF/fsx.toml"; [ "$name" = mmap ] && cfg="$mmap_cfg"
        run="$io-$name"
        log "fsx $label, $([ $name = mmap ] && echo with || echo without) mmap: $OPS ops, seed $SEED"
        t0=$SECONDS
        if fsx_run "$run" "$cfg" "$MNT/fsx-$name" "$OPS" "$SEED"; then ok=A-OK; else ok=FAILED; fi
        fsx_report "$label, $([ $name = mmap ] && echo with || echo without) mmap" "$OPS" "$ok" $(( SECONDS - t0 ))
        check "fsx $label $name" "$([ "$ok" = A-OK ]; echo $?)"
        if [ "$ok" = FAILED ]; then
            FSX_NOTES+=("fsx $label, $(basename "$cfg"), seed $SEED: FAILED ($LOGS/fsx-$run.log)")
            FSX_NOTES+=("$(fsx_errors "$LOGS/fsx-$run.log")")
            FSX_NOTES+=("$(fsx_baseline "$run" "$cfg" "$OPS" "$SEED")")
        fi
    done

    log "fsx $label, concurrent: $PROCS processes x $CONC_OPS ops on distinct files"
    local pids=() i rcs=() failed=0
    t0=$SECONDS
    for i in $(seq 1 "$PROCS"); do
        cfg="$CONF/fsx.toml"; [ $(( i % 2 )) = 0 ] && cfg="$mmap_cfg"
        fsx_run "$io-conc$i" "$cfg" "$MNT/fsx-conc$i" "$CONC_OPS" $(( SEED + i )) &
        pids+=($!); CHILDREN+=($!)
    done
    for i in "${!pids[@]}"; do
        if wait "${pids[$i]}"; then rcs+=(A-OK); else rcs+=(FAILED); failed=$((failed + 1)); fi
    done
    fsx_report "$label, $PROCS concurrent" "$PROCS x $CONC_OPS" \
        "$([ $failed = 0 ] && echo A-OK || echo "$failed FAILED")" $(( SECONDS - t0 ))
    check "fsx $label concurrent" $(( failed > 0 ))
    for i in "${!rcs[@]}"; do
        [ "${rcs[$i]}" = FAILED ] || continue
        local n=$(( i + 1 ))
        cfg="$CONF/fsx.toml"; [ $(( n % 2 )) = 0 ] && cfg="$mmap_cfg"
        FSX_NOTES+=("fsx $label, concurrent #$n, $(basename "$cfg"), seed $(( SEED + n )): FAILED ($LOGS/fsx-$io-conc$n.log)")
        FSX_NOTES+=("$(fsx_errors "$LOGS/fsx-$io-conc$n.log")")
        FSX_NOTES+=("$(fsx_baseline "$io-conc$n" "$cfg" "$CONC_OPS" $(( SEED + n )))")
    done
    stop_last "fencefs $label (fsx)"
}

FSX_NOTES=()
fsx_suite() {
    local io
    for io in "${IO_MODES[@]}"; do
        fsx_mode "$io"
    done
    echo
    echo "fsx $FSX_VERSION on fencefs (danger, allow-all policy; seed $SEED)"
    printf '  %-34s %9s  %-6s %6s\n' "I/O path, run" ops result time
    printf '%s\n' "${FSX_ROWS[@]}"
    if [ "${#FSX_NOTES[@]}" -gt 0 ]; then
        echo
        echo "fsx failures:"
        printf '%s\n' "${FSX_NOTES[@]}" | sed 's/^/  /'
    fi
}

want pjdfstest && pjdfstest_suite
want fsx && { echo; fsx_suite; }

echo
if [ "$CHECK_FAIL" -gt 0 ]; then
    echo "failed checks:"
    printf '  %s\n' "${FAILED_CHECKS[@]}"
fi
echo "conformance: $CHECK_PASS passed, $CHECK_FAIL failed"
[ "$CHECK_FAIL" = 0 ]
