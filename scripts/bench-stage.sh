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
# same files followed by `sync`. Medians of --runs.
# Usage: scripts/bench-stage.sh [--files N] [--runs R] [--bin PATH]
# Needs root (the staged mount uses kernel overlayfs). Leaves nothing mounted: every mount
# it makes is unmounted on exit, and it kills only the daemons it started (by pid).
set -euo pipefail
N=2000
RUNS=3
BIN=${BIN:-target/release/fencefs}
while [ $# -gt 0 ]; do
  case "$1" in
    --files) N=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    *) echo "usage: $0 [--files N] [--runs R] [--bin PATH]" >&2; exit 2 ;;
  esac
done
BIN=$(realpath "$BIN")
W=$(mktemp -d "${TMPDIR:-/tmp}/fencefs-bench-stage.XXXXXX")
PIDS=()
cleanup() {
  for m in "$W"/*/mnt; do mountpoint -q "$m" 2>/dev/null && fusermount3 -u -z "$m"; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT
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
now() { date +%s.%N; }
t() { local s; s=$(now); "$@" >/dev/null 2>&1; echo "$(now) - $s" | bc; }
declare -A R
one() { # $1 = label, $2 = extra args
  local d="$W/$1" ; rm -rf "$d"; mkdir -p "$d/src" "$d/mnt"
  cp -a "$W/tarsrc/t" "$d/src/repo"
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
  R[$1,rmrf]+=" $(t rm -rf "$d/mnt/c/t")"
  R[$1,gitstatus]+=" $(t git -C "$d/mnt/repo" status)"
  if [ -n "$2" ]; then
    tar xf "$W/t.tar" -C "$d/mnt/c"
    R[$1,status]+=" $(t "$BIN" stage status "$d/ctl.sock")"
    R[$1,checkpoint]+=" $(t "$BIN" stage checkpoint "$d/ctl.sock")"
    R[$1,status1]+=" $(t "$BIN" stage status "$d/ctl.sock")"
  fi
  kill "$pid"; wait "$pid" || true
  if [ -n "$2" ]; then
    sync
    R[$1,cpa]+=" $(t sh -c "cp -a '$d/stage/layers/1/c' '$d/cp-copy' && sync")"
    R[$1,apply]+=" $(t "$BIN" stage apply --dir "$d/stage")"
  fi
}
med() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for _ in $(seq "$RUNS"); do one plain ""; one staged "--stage $W/staged/stage --control $W/staged/ctl.sock"; done
printf '%-28s %10s %10s %7s\n' workload unstaged staged ratio
for w in create untar rmrf gitstatus; do
  a=$(med "${R[plain,$w]}"); b=$(med "${R[staged,$w]}")
  printf '%-28s %10.3f %10.3f %6.2fx\n' "$w ($N files)" "$a" "$b" "$(echo "$b / $a" | bc -l)"
done
printf '%-28s %10s %10.3f\n' "stage status ($((N * 2)) paths)" - "$(med "${R[staged,status]}")"
printf '%-28s %10s %10.3f\n' "stage checkpoint ($((N * 2)))" - "$(med "${R[staged,checkpoint]}")"
printf '%-28s %10s %10.3f\n' "status, 1 checkpoint" - "$(med "${R[staged,status1]}")"
a=$(med "${R[staged,cpa]}"); b=$(med "${R[staged,apply]}")
printf '%-28s %10.3f %10.3f %6.2fx\n' "apply vs cp -a ($((N * 2)))" "$a" "$b" "$(echo "$b / $a" | bc -l)"
