#!/usr/bin/env bash
# scripts/bench-stage.sh — staged vs unstaged fencefs, same run, ratios.
#
# Each round mounts fencefs over a fresh copy of the same tree twice (without and with
# --stage) and times, through the mount: creating N small files (python), untarring an
# N-file tarball, `rm -rf` of it, `git status` (warm) in an N-file repository; then, for
# the staged mount only, through its control socket: `fencefs stage status` of the 2N
# changed paths, `stage checkpoint` of them (it counts them for the log, then seals),
# `stage status` again (now flattening the checkpoint's layer), and (unmounted)
# `fencefs stage apply` of them (squashing the checkpoint first) against `cp -a` of the
# same files followed by `sync`. The agent rows, staged vs unstaged in the same round:
# `python3 -m venv` + `pip install` of a local wheel of 300 modules (built here, no
# network), `git clone --no-hardlinks` of a bare copy of this repository, and sqlite WAL
# (--sql one-row commits, `PRAGMA journal_mode=WAL`). Copy-up (staged only): the first
# append to a --big MiB SOURCE file through the mount, then `sync`, against `cp` of it
# and `sync` on the host (the file and the copies are deleted with the rest).
# `rm -rf` of an N-file tree of SOURCE (staged: N whiteouts, then discarded again before
# the staged-only rows). For the `rm -rf` rows and sqlite also the CPU seconds they cost (the daemon's, from
# /proc/PID/stat, plus the program's own): steadier than wall time on a shared machine.
# With --floor, each round also runs those three on the plain directory and on a plain
# kernel overlayfs mount (lower = a copy of SOURCE, upper and work beside DIR, redirects
# on, as the daemon mounts it) with no fencefs: what overlayfs itself costs (the floor
# of the staged/unstaged ratio). Medians of --runs.
# Everything runs on a private 8 GiB (sparse) ext4 image, unless --no-loopfs.
# Usage: scripts/bench-stage.sh [--files N] [--runs R] [--sql K] [--big MiB] [--floor]
#        [--no-loopfs] [--bin PATH]
# Needs root (the staged mount uses kernel overlayfs). Leaves nothing mounted: every mount
# it makes is unmounted on exit, and it kills only the daemons it started (by pid).
set -euo pipefail
N=2000
RUNS=3
SQL=3000
BIG=1024
FLOOR=0
LOOPFS=1
BIN=${BIN:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --files) N=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --sql) SQL=$2; shift 2 ;;
    --big) BIG=$2; shift 2 ;;
    --floor) FLOOR=1; shift ;;
    --bin) BIN=$2; shift 2 ;;
    --no-loopfs) LOOPFS=0; shift ;;
    *) echo "usage: $0 [--files N] [--runs R] [--sql K] [--big MiB] [--floor] [--no-loopfs] [--bin PATH]" >&2; exit 2 ;;
  esac
done
if [ -z "$BIN" ]; then # the checkout's code, never a stale release build
  (cd "$(dirname "$0")/.." && cargo build --release --locked --quiet) || { echo "cargo build failed" >&2; exit 1; }
  BIN=$(dirname "$0")/../target/release/fencefs
fi
BIN=$(realpath "$BIN")
W0=$(mktemp -d "${TMPDIR:-/tmp}/fencefs-bench-stage.XXXXXX")
W=$W0
PIDS=()
cleanup() {
  for m in "$W"/*/mnt; do mountpoint -q "$m" 2>/dev/null && fusermount3 -u -z "$m"; done
  if mountpoint -q "$W/floor/ovl" 2>/dev/null; then umount -l "$W/floor/ovl"; fi
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  if mountpoint -q "$W0/fs" 2>/dev/null; then umount "$W0/fs" || umount -l "$W0/fs"; fi
  rm -rf "$W0"
}
trap cleanup EXIT
# Everything on a private ext4 image made with mkfs's defaults (hashed directories):
# the figures are the daemon's, not the host file system's (a root file system without
# dir_index searched a staged directory of 5,000 whiteouts linearly: 7x instead of 2x),
# and the fanotify watch sees only this run. --no-loopfs: in $TMPDIR as it is.
if ((LOOPFS)); then
  truncate -s 8G "$W0/img"
  mkfs.ext4 -q -F "$W0/img"
  mkdir "$W0/fs"
  mount -o loop "$W0/img" "$W0/fs"
  W=$W0/fs
fi
printf 'mode = "workspace-write"\ndefault = "write"\n' > "$W/policy.toml"
mkdir -p "$W/tarsrc/t"
python3 - "$W/tarsrc/t" "$N" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    sub = os.path.join(d, f"d{i // 100}")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, f"f{i}"), "w") as f:
        f.write("x" * 100)
EOF
tar cf "$W/t.tar" -C "$W/tarsrc" t
# A local wheel (pip installs it with --no-index: no network).
/usr/bin/python3 - "$W/wheels" <<'PY'
import os, sys, zipfile, hashlib, base64
d = sys.argv[1]; os.makedirs(d)
files = {f"benchpkg/m{i}.py": f"X = {i}\n" + "# padding\n" * 200 for i in range(300)}
files["benchpkg/__init__.py"] = "VERSION = '1.0'\n"
info = "benchpkg-1.0.dist-info"
files[f"{info}/METADATA"] = "Metadata-Version: 2.1\nName: benchpkg\nVersion: 1.0\n"
files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
def rec(b):
    h = base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
    return f"sha256={h},{len(b)}"
record = "".join(f"{k},{rec(v.encode())}\n" for k, v in files.items()) + f"{info}/RECORD,,\n"
with zipfile.ZipFile(os.path.join(d, "benchpkg-1.0-py3-none-any.whl"), "w") as z:
    for k, v in files.items():
        z.writestr(k, v)
    z.writestr(f"{info}/RECORD", record)
PY
git clone -q --bare --no-hardlinks "$(git rev-parse --show-toplevel)" "$W/origin.git"
cat > "$W/wal.py" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("PRAGMA journal_mode=WAL")
c.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
for i in range(int(sys.argv[2])):
    c.execute("INSERT INTO t (v) VALUES (?)", ("x" * 64,))
c.close()
PY
now() { date +%s.%N; }
t() { local s; s=$(now); "$@" >/dev/null 2>&1; echo "$(now) - $s" | bc; }
# CPU seconds (user + system) of a command and its children: steadier than wall time on
# a shared machine. Prints the wall time, records the CPU time in R[$1,$2].
tc() {
  local k=$1 s; shift; s=$(now)
  /usr/bin/time -f '%U %S' -o "$W/cpu" "$@" >/dev/null 2>&1
  R[$k]+=" $(awk '{print $1 + $2}' "$W/cpu")"; echo "$(now) - $s" | bc
}
# tw KEY PID CMD...: wall time into R[KEY], CPU seconds of CMD and of daemon PID (user +
# system, all its threads: /proc/PID/stat) into R[KEY cpu].
HZ=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tw() {
  local k=$1 pid=$2 s c0; shift 2; c0=$(ticks "$pid"); s=$(now)
  /usr/bin/time -f '%U %S' -o "$W/cpu" "$@" >/dev/null 2>&1
  R[$k]+=" $(echo "$(now) - $s" | bc)"
  R[${k}cpu]+=" $(awk -v d="$(( $(ticks "$pid") - c0 ))" -v hz="$HZ" '{print $1 + $2 + d / hz}' "$W/cpu")"
}
# tn KEY CMD...: the same without a daemon (the program's CPU holds the kernel's work).
tn() {
  local k=$1 s; shift; s=$(now)
  /usr/bin/time -f '%U %S' -o "$W/cpu" "$@" >/dev/null 2>&1
  R[$k]+=" $(echo "$(now) - $s" | bc)"; R[${k}cpu]+=" $(awk '{print $1 + $2}' "$W/cpu")"
}
declare -A R
# floor: rm -rf and sqlite on the plain directory, then on a plain kernel overlayfs mount.
floor() {
  local f="$W/floor" k d; rm -rf "$f"; mkdir -p "$f/dir" "$f/low" "$f/up" "$f/wk" "$f/ovl"
  cp -a "$W/tarsrc/t" "$f/low/repo"; cp -a "$W/tarsrc/t" "$f/low/del"; cp -a "$W/tarsrc/t" "$f/dir/del"
  mount -t overlay overlay -o "lowerdir=$f/low,upperdir=$f/up,workdir=$f/wk,redirect_dir=on" "$f/ovl"
  for k in dir ovl; do
    d="$f/$k"; mkdir -p "$d/c"; tar xf "$W/t.tar" -C "$d/c"
    tn "$k,rmrf" rm -rf "$d/c/t"
    tn "$k,sqlite" /usr/bin/python3 "$W/wal.py" "$d/wal.db" "$SQL"
    tn "$k,rmsrc" rm -rf "$d/del"
  done
  umount "$f/ovl"; rm -rf "$f"
}
one() { # $1 = label, $2 = extra args
  local d="$W/$1" ; rm -rf "$d"; mkdir -p "$d/src" "$d/mnt"
  cp -a "$W/tarsrc/t" "$d/src/repo"
  cp -a "$W/tarsrc/t" "$d/src/del"
  if [ -n "$2" ]; then dd if=/dev/zero of="$d/src/big" bs=1M count="$BIG" status=none; sync; fi
  (cd "$d/src/repo" && git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm x)
  "$BIN" mount -p "$W/policy.toml" $2 "$d/src" "$d/mnt" 2>"$d/log" &
  PIDS+=($!); local pid=$!
  for _ in $(seq 200); do mountpoint -q "$d/mnt" && break; sleep 0.05; done
  git -C "$d/mnt/repo" status >/dev/null
  R[$1,create]+=" $(t python3 -c "
import os
os.mkdir('$d/mnt/c')
for i in range($N):
    open('$d/mnt/c/f%d' % i, 'w').write('y')")"
  R[$1,untar]+=" $(t tar xf "$W/t.tar" -C "$d/mnt/c")"
  tw "$1,rmrf" "$pid" rm -rf "$d/mnt/c/t"
  R[$1,gitstatus]+=" $(t git -C "$d/mnt/repo" status)"
  R[$1,pip]+=" $(t sh -c "/usr/bin/python3 -m venv '$d/mnt/v' && '$d/mnt/v/bin/pip' install -q --no-index --find-links '$W/wheels' benchpkg")"
  "$d/mnt/v/bin/python" -c 'import benchpkg.m299' || { echo "pip install failed ($1)" >&2; exit 1; }
  R[$1,clone]+=" $(t git clone -q --no-hardlinks "$W/origin.git" "$d/mnt/clone")"
  git -C "$d/mnt/clone" log --oneline -1 >/dev/null || { echo "git clone failed ($1)" >&2; exit 1; }
  tw "$1,sqlite" "$pid" /usr/bin/python3 "$W/wal.py" "$d/mnt/wal.db" "$SQL"
  tw "$1,rmsrc" "$pid" rm -rf "$d/mnt/del"
  if [ -n "$2" ]; then
    "$BIN" stage discard "$d/ctl.sock" del >/dev/null
    tar xf "$W/t.tar" -C "$d/mnt/c"
    R[$1,status]+=" $(t "$BIN" stage status "$d/ctl.sock")"
    R[$1,checkpoint]+=" $(t "$BIN" stage checkpoint "$d/ctl.sock")"
    R[$1,status1]+=" $(t "$BIN" stage status "$d/ctl.sock")"
    R[$1,copyup]+=" $(t sh -c "echo x >> '$d/mnt/big' && sync")"
  fi
  kill "$pid"; wait "$pid" || true
  if [ -n "$2" ]; then
    sync
    tc "$1,cpacpu" sh -c "cp -a '$d/stage/layers/1/c' '$d/cp-copy' && sync" >"$W/wall"
    R[$1,cpa]+=" $(cat "$W/wall")"
    tc "$1,applycpu" "$BIN" stage apply --dir "$d/stage" >"$W/wall"
    R[$1,apply]+=" $(cat "$W/wall")"
    R[$1,cpbig]+=" $(t sh -c "cp '$d/src/big' '$d/big-copy' && sync")"
    rm -f "$d/src/big" "$d/big-copy"
  fi
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0) printf "%6.2fx", b / a; else printf "%7s", "-" }'; }
med() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for _ in $(seq "$RUNS"); do
  one plain ""; one staged "--stage $W/staged/stage --control $W/staged/ctl.sock"
  if [ "$FLOOR" = 1 ]; then floor; fi
done
printf '%-28s %10s %10s %7s\n' workload unstaged staged ratio
for w in create untar rmrf gitstatus pip clone sqlite rmsrc; do
  a=$(med "${R[plain,$w]}"); b=$(med "${R[staged,$w]}")
  case $w in
    pip) label="venv + pip (301 files)" ;; clone) label="git clone (this repo)" ;;
    sqlite) label="sqlite WAL ($SQL commits)" ;; rmsrc) label="rm -rf SOURCE's ($N files)" ;;
    *) label="$w ($N files)" ;;
  esac
  printf '%-28s %10.3f %10.3f %6.2fx\n' "$label" "$a" "$b" "$(echo "$b / $a" | bc -l)"
done
for w in rmrf sqlite rmsrc; do
  a=$(med "${R[plain,${w}cpu]}"); b=$(med "${R[staged,${w}cpu]}")
  printf '%-28s %10.3f %10.3f %s\n' "  $w, CPU s (daemon + it)" "$a" "$b" "$(ratio "$a" "$b")"
done
if [ "$FLOOR" = 1 ]; then
  echo "floor, no fencefs:            plain dir    overlay  ratio"
  for w in rmrf sqlite rmsrc; do
    for c in "" cpu; do
      a=$(med "${R[dir,$w$c]}"); b=$(med "${R[ovl,$w$c]}")
      printf '%-28s %10.3f %10.3f %s\n' "  $w${c:+, CPU s}" "$a" "$b" "$(ratio "$a" "$b")"
    done
  done
fi
printf '%-28s %10s %10.3f\n' "stage status ($((N * 2)) paths)" - "$(med "${R[staged,status]}")"
printf '%-28s %10s %10.3f\n' "stage checkpoint ($((N * 2)))" - "$(med "${R[staged,checkpoint]}")"
printf '%-28s %10s %10.3f\n' "status, 1 checkpoint" - "$(med "${R[staged,status1]}")"
a=$(med "${R[staged,cpa]}"); b=$(med "${R[staged,apply]}")
printf '%-28s %10.3f %10.3f %6.2fx\n' "apply vs cp -a ($((N * 2)))" "$a" "$b" "$(echo "$b / $a" | bc -l)"
a=$(med "${R[staged,cpacpu]}"); b=$(med "${R[staged,applycpu]}")
printf '%-28s %10.3f %10.3f %6.2fx\n' "  the same, CPU s" "$a" "$b" "$(echo "$b / $a" | bc -l)"
a=$(med "${R[staged,cpbig]}"); b=$(med "${R[staged,copyup]}")
printf '%-28s %10.3f %10.3f %6.2fx\n' "copy-up vs cp ($BIG MiB)" "$a" "$b" "$(echo "$b / $a" | bc -l)"
