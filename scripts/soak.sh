#!/usr/bin/env bash
# soak.sh [--secs N] [--bin PATH] [--transport T] [--layers] [--stage [--as-user UID]] — mixed hostile load against one real mount while a
# well-behaved user builds a C project through it (issue 9's soak).
#
# Hostile uid 1000 (each loop its own process, killed by pid at the end):
#   descriptor floods (open until refused, hold, release), FIFO games (mkfifo, O_CREAT
#   opens of FIFOs, unlink), refused-open floods on a hidden path (audit flood), rename/
#   mkdir/rmdir churn, hidden-name stat loops; and against the people around the fence
#   (issue 17): held creates in an `ask` directory from processes with a 1 MiB argv and
#   file names full of terminal escapes, held writes whose asker is flooded with signals
#   (FUSE interrupts), and a crowd of held opens competing for the held slots.
# An approver that reads every event but never answers (so requests stay held until
#   --ask-dir-hold / --ask-timeout), connected to the control socket.
# Root: a SIGHUP reload every 0.5 s, alternating between two policies.
# Well-behaved uid 1001: `make clean all` of a 30-file C project in a loop, and an `ls` of
# the mount and of the `ask` directory every second that must answer within 2 s (the
# directory holds are bounded by --ask-dir-hold 1).
# Pass: every build and every ls succeeded, the daemon is alive, its fds stayed under its
# RLIMIT_NOFILE and its RSS under 128 MiB, the audit files and the daemon's log stayed
# bounded, the approver stayed connected and got the held requests' events, and no raw
# escape byte reached the daemon's log.
# --layers loads conformance/second-layer.toml as a second policy layer (every request
# decided by both layers). Default 600 s; scripts/test.sh runs it for 30 s. Needs root, fuse3, python3, make, cc.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SECS=600
STAGE=0 AS_USER=
BIN=
TRANSPORT=auto
LAYERS=()
while (($#)); do
    case $1 in
        --secs) SECS=$2; shift 2 ;;
        --bin) BIN=$2; shift 2 ;;
        --transport) TRANSPORT=$2; shift 2 ;;
        --layers) LAYERS=(-p "$PWD/conformance/second-layer.toml"); shift ;;
        --stage) STAGE=1; shift ;;
        --as-user) AS_USER=$2; shift 2 ;;
        *) echo "usage: soak.sh [--secs N] [--bin PATH] [--transport auto|io-uring|dev-fuse] [--layers] [--stage [--as-user UID]]" >&2; exit 2 ;;
    esac
done
if [[ -z $BIN ]]; then
    cargo build --quiet --bin fencefs
    BIN=target/debug/fencefs
fi
BIN=$(realpath "$BIN")
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3)

# --stage: the staging soak (scripts/soak-stage.py: an agent, the operator and a host
# editor at once; a ledger proves no host save or applied version is lost).
if ((STAGE)); then
    ROOT=$(realpath -m "target/tmp/soak-$$")
    mkdir -p "$ROOT"
    trap 'rm -rf "$ROOT"' EXIT
    # --as-user UID: the daemon, the agent, the host editor and the operator are all that
    # ordinary user (a person's own workspace, no root anywhere: `user.overlay.*` markers).
    # This machine's /dev/fuse is 0600 (Debian's fuse3 makes it 0666): a 0666 node is
    # bound over it in a private mount namespace of the soak's own (tests/common/user.rs
    # does the same), never on the host; the mount dies with that namespace.
    if [[ -n $AS_USER ]]; then
        chown "$AS_USER:$AS_USER" "$ROOT"
        mknod -m 0666 "$ROOT/fuse" c 10 229
        unshare -m --propagation private sh -c 'mount --bind "$1" /dev/fuse && shift && exec "$@"' \
            sh "$ROOT/fuse" setpriv --reuid="$AS_USER" --regid="$AS_USER" --clear-groups \
            "$PY" "$PWD/scripts/soak-stage.py" --bin "$BIN" --root "$ROOT" --secs "$SECS" --transport "$TRANSPORT"
        exit
    fi
    "$PY" scripts/soak-stage.py --bin "$BIN" --root "$ROOT" --secs "$SECS" --transport "$TRANSPORT"
    exit
fi

ROOT=$(realpath -m "target/tmp/soak-$$")
SRC=$ROOT/src MNT=$ROOT/mnt POL=$ROOT/policy.toml AUDIT=$ROOT/audit.jsonl LOG=$ROOT/daemon.log
DAEMON= PIDS=()
cleanup() {
    local rc=$?
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    if [[ -n $DAEMON ]] && kill -0 "$DAEMON" 2>/dev/null; then
        kill -TERM "$DAEMON" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$DAEMON" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$DAEMON" 2>/dev/null || true
    fi
    if grep -q " $MNT " /proc/self/mountinfo 2>/dev/null; then fusermount3 -u -z "$MNT" || true; fi
    rm -rf "$ROOT"
    exit $rc
}
trap cleanup EXIT
mkdir -p "$SRC"/{w,pub,secrets,build,asky} "$MNT"
echo held >"$SRC/asky/f"
chmod 755 "$ROOT" "$SRC" "$MNT"
for i in $(seq 50); do echo "key $i" >"$SRC/secrets/k$i"; done
echo hello >"$SRC/pub/readme"
bash scripts/bench/gen-cproject.sh "$SRC/build" 30 >/dev/null
chown -R 1000:1000 "$SRC/w" "$SRC/pub" "$SRC/asky"
chown -R 1001:1001 "$SRC/build"

policy() { # $1: extra hidden glob
    printf 'mode = "workspace-write"\n[[rule]]\npath = "secrets"\naccess = "none"\n'
    printf '[[rule]]\npath = "%s"\naccess = "none"\n' "$1"
    printf '[[rule]]\npath = "asky"\naccess = "read"\nask = "write"\n'
}
policy "w/hidden*" >"$POL"
policy "w/gone*" >"$ROOT/policy.b"
policy "w/hidden*" >"$ROOT/policy.a"

"$BIN" mount -p "$POL" "${LAYERS[@]}" --allow-other --audit "$AUDIT" --audit-max-size 1M --audit-keep 2 \
    --control "$ROOT/ctl.sock" --ask-timeout 4 --ask-dir-hold 1 \
    --transport "$TRANSPORT" "$SRC" "$MNT" 2>"$LOG" &
DAEMON=$!
for _ in $(seq 100); do grep -q " $MNT " /proc/self/mountinfo && break; sleep 0.1; done
grep -q " $MNT " /proc/self/mountinfo || { cat "$LOG"; echo "soak: mount failed" >&2; exit 1; }
NOFILE=$(awk '/Max open files/ {print $4}' "/proc/$DAEMON/limits")

as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --clear-groups "$@"; }
END=$((SECONDS + SECS))

# --- hostile uid 1000 ---------------------------------------------------------------
hostile_py() { as 1000 "$PY" -c "$1" "$MNT" "$SECS" & PIDS+=($!); }
hostile_py '
import os, sys, time
os.chdir(sys.argv[1]); end = time.monotonic() + float(sys.argv[2])
import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
while time.monotonic() < end:
    fds = []
    try:
        while len(fds) < 19000:
            # Directories hold a daemon fd (the per-uid share); files go through passthrough.
            fds.append(os.open("pub", os.O_RDONLY | os.O_DIRECTORY) if len(fds) % 2 else os.open("pub/readme", os.O_RDONLY))
    except OSError: pass
    time.sleep(1)
    for f in fds: os.close(f)
' 2>/dev/null
hostile_py '
import os, sys, time, errno
os.chdir(sys.argv[1]); end = time.monotonic() + float(sys.argv[2]); i = 0
while time.monotonic() < end:
    p = "w/fifo%d" % (i % 20); i += 1
    try: os.mkfifo(p)
    except OSError: pass
    for fl in (os.O_CREAT | os.O_WRONLY | os.O_NONBLOCK, os.O_RDWR | os.O_NONBLOCK, os.O_CREAT | os.O_RDONLY | os.O_NONBLOCK):
        try: os.close(os.open(p, fl, 0o644))
        except OSError: pass
    try: os.unlink(p)
    except OSError: pass
'
hostile_py '
import os, sys, time
os.chdir(sys.argv[1]); end = time.monotonic() + float(sys.argv[2]); i = 0
while time.monotonic() < end:
    i += 1
    for p in ("secrets/k1", "secrets/new%d" % (i % 5000), "w/hidden%d" % (i % 100)):
        try: os.open(p, os.O_RDONLY)
        except OSError: pass
'
hostile_py '
import os, sys, time, shutil
os.chdir(sys.argv[1]); end = time.monotonic() + float(sys.argv[2]); i = 0
while time.monotonic() < end:
    i += 1; a = "w/d%d" % (i % 7); b = "w/e%d" % (i % 11)
    try:
        os.makedirs(a + "/x/y", exist_ok=True); open(a + "/x/f", "w").write("z")
        os.rename(a, b)
    except OSError: pass
    try: shutil.rmtree(b)
    except OSError: pass
    try: open("w/hidden%d" % (i % 100), "w").write("h")
    except OSError: pass
'
hostile_py '
import os, sys, time
os.chdir(sys.argv[1]); end = time.monotonic() + float(sys.argv[2]); i = 0
while time.monotonic() < end:
    i += 1
    for p in ("w/hidden%d" % (i % 100), "w/gone%d" % (i % 100), "w/absent%d" % (i % 100)):
        try: os.stat(p)
        except OSError: pass
'

# An approver that reads everything and answers nothing; it counts the ask events.
"$PY" -c '
import json, os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
f.readline(); f.write(b"{\"cmd\":\"subscribe\"}\n"); f.flush()
n = 0
for line in f:
    if b"\"event\":\"ask\"" in line:
        n += 1
        # Replaced, not rewritten: the monitor never reads a half-written count.
        open(sys.argv[2] + ".tmp", "w").write(str(n)); os.replace(sys.argv[2] + ".tmp", sys.argv[2])
open(sys.argv[2] + ".closed", "w").write("closed")
' "$ROOT/ctl.sock" "$ROOT/approver.count" &
PIDS+=($!)
# Held creates in asky/ from 1 MiB argvs, with names that carry terminal escapes.
hostile_py '
import os, sys, time, subprocess
os.chdir(sys.argv[1]); end = time.monotonic() + float(sys.argv[2]); i = 0
big = ["A" * 65536] * 16  # 1 MiB of argv (one argument may hold at most 128 KiB)
while time.monotonic() < end:
    i += 1
    name = "asky/\x1b[2K\x1b[1A\x1b]0;owned\x07\r\u202e%d" % (i % 50)
    subprocess.run(["/bin/sh", "-c", "echo x > \"$1\"", "sh", name] + big, stderr=subprocess.DEVNULL)
'
# A held write whose asker is flooded with signals: every signal is a FUSE INTERRUPT.
hostile_py '
import os, sys, time, signal
os.chdir(sys.argv[1]); end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGUSR1, lambda *a: None)
        try: os.close(os.open("asky/f", os.O_WRONLY))
        except OSError: pass
        os._exit(0)
    t = time.monotonic() + 5
    while time.monotonic() < t:
        try: os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError: break
        if os.waitpid(pid, os.WNOHANG)[0]: pid = 0; break
        time.sleep(0.0005)
    if pid:
        os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
'
# A crowd of held opens (64 at a time) competing for the held slots.
hostile_py '
import os, sys, time
os.chdir(sys.argv[1]); end = time.monotonic() + float(sys.argv[2]); kids = set()
while time.monotonic() < end:
    while len(kids) < 64:
        pid = os.fork()
        if pid == 0:
            try: os.close(os.open("asky/f", os.O_WRONLY))
            except OSError: pass
            os._exit(0)
        kids.add(pid)
    pid, _ = os.wait(); kids.discard(pid)
for k in kids: os.kill(k, 9)
'

# --- root: reloads -------------------------------------------------------------------
(
    n=0
    while ((SECONDS < END)); do
        n=$((n + 1))
        if ((n % 2)); then cp "$ROOT/policy.b" "$POL.tmp"; else cp "$ROOT/policy.a" "$POL.tmp"; fi
        mv "$POL.tmp" "$POL"
        kill -HUP "$DAEMON" 2>/dev/null || exit 0
        sleep 0.5
    done
) &
PIDS+=($!)

# --- well-behaved uid 1001, and the monitor -------------------------------------------
builds=0 build_fail=0 ls_ok=0 ls_fail=0 max_fds=0 max_rss=0
next_ls=$SECONDS
build() { as 1001 sh -c "cd '$MNT/build' && make -s clean && make -s -j2 app && ./app" >/dev/null 2>"$ROOT/build.err"; }
build &
BUILD=$!
PIDS+=($BUILD)
while ((SECONDS < END)); do
    if ! kill -0 "$BUILD" 2>/dev/null; then
        if wait "$BUILD"; then builds=$((builds + 1)); else build_fail=$((build_fail + 1)); cat "$ROOT/build.err" >&2; fi
        build &
        BUILD=$!
        PIDS+=($BUILD)
    fi
    if ((SECONDS >= next_ls)); then
        if timeout 2 setpriv --reuid=1001 --regid=1001 --clear-groups ls -la "$MNT/pub" >/dev/null 2>&1 &&
            timeout 2 setpriv --reuid=1001 --regid=1001 --clear-groups ls -la "$MNT/asky" >/dev/null 2>&1; then
            ls_ok=$((ls_ok + 1))
        else
            ls_fail=$((ls_fail + 1)); echo "soak: ls by uid 1001 failed at ${SECONDS}s" >&2
        fi
        fds=$(ls "/proc/$DAEMON/fd" 2>/dev/null | wc -l)
        rss=$(awk '/VmRSS/ {print $2}' "/proc/$DAEMON/status" 2>/dev/null || echo 0)
        ((fds > max_fds)) && max_fds=$fds
        ((rss > max_rss)) && max_rss=$rss
        next_ls=$((SECONDS + 1))
    fi
    sleep 0.2
done
if wait "$BUILD"; then builds=$((builds + 1)); else build_fail=$((build_fail + 1)); fi
for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
PIDS=()
sleep 0.5
alive=yes
kill -0 "$DAEMON" 2>/dev/null || alive=no
audit_bytes=$(cat "$AUDIT"* 2>/dev/null | wc -c)
audit_files=$(ls "$AUDIT"* 2>/dev/null | wc -l)
reloads=$(grep -c "policy reloaded" "$LOG" || true)
log_bytes=$(wc -c <"$LOG")
asks=$(cat "$ROOT/approver.count" 2>/dev/null || true)
asks=${asks:-0}
approver=connected
[[ -e $ROOT/approver.count.closed ]] && approver=dropped
raw_esc=0
LC_ALL=C grep -q $'\x1b' "$LOG" && raw_esc=1
echo "soak: ${SECS}s: builds ok $builds, failed $build_fail; ls ok $ls_ok, failed $ls_fail;" \
    "daemon alive $alive, max fds $max_fds (limit $NOFILE), max RSS $((max_rss / 1024)) MiB;" \
    "reloads $reloads; audit $audit_files files, $audit_bytes bytes; log $log_bytes bytes;" \
    "approver $approver, $asks ask events"
fail=0
((builds >= 1 && build_fail == 0)) || { echo "soak: FAIL: the well-behaved build failed" >&2; fail=1; }
((ls_fail == 0 && ls_ok >= 1)) || { echo "soak: FAIL: ls by another uid failed" >&2; fail=1; }
[[ $alive == yes ]] || { echo "soak: FAIL: the daemon died" >&2; tail -20 "$LOG" >&2; fail=1; }
((max_fds < NOFILE)) || { echo "soak: FAIL: daemon fds reached the limit" >&2; fail=1; }
((max_rss < 128 * 1024)) || { echo "soak: FAIL: RSS ${max_rss} KiB" >&2; fail=1; }
((audit_bytes <= 3 * 1024 * 1024 + 65536)) || { echo "soak: FAIL: audit $audit_bytes bytes" >&2; fail=1; }
((log_bytes <= 65536 + SECS * 2048)) || { echo "soak: FAIL: daemon log $log_bytes bytes" >&2; tail -5 "$LOG" >&2; fail=1; }
((raw_esc == 0)) || { echo "soak: FAIL: a raw ESC byte reached the daemon's log" >&2; fail=1; }
[[ $approver == connected ]] || { echo "soak: FAIL: the approver was disconnected" >&2; fail=1; }
((asks >= 1)) || { echo "soak: FAIL: the approver got no ask event" >&2; fail=1; }
((reloads >= 1)) || { echo "soak: FAIL: no reload happened" >&2; fail=1; }
exit $fail
