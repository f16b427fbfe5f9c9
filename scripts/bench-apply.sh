#!/usr/bin/env bash
# `fencefs stage apply --dir` of N new files (100 bytes each, 100 to a directory, made
# through a staged mount and sealed by a checkpoint, as bench-stage.sh's apply row) against
# `cp -a` of the same files followed by `sync`, R alternating rounds: wall and CPU seconds
# (user + system, with children) of each, medians. With --vs OTHER, OTHER's `stage apply`
# (another build) runs in the same rounds on its own copy, for a paired before/after.
# With --strace, one more round of each under `strace -c -f -w` (wall time per syscall;
# the table goes to stderr; -f also follows the background removal apply starts).
#
# Usage: scripts/bench-apply.sh [--files N] [--runs R] [--bin PATH] [--vs OTHER] [--strace]
# Needs root (staging mounts kernel overlayfs). Cleans up what it made, and kills only
# the daemons it started.
set -euo pipefail
N=10000 RUNS=3 BIN=target/release/fencefs STRACE= VS=
while [ $# -gt 0 ]; do
  case $1 in
    --files) N=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --strace) STRACE=1; shift ;;
    --vs) VS=$(realpath "$2"); shift 2 ;;
    *) echo "usage: $0 [--files N] [--runs R] [--bin PATH] [--vs OTHER] [--strace]" >&2; exit 2 ;;
  esac
done
BIN=$(realpath "$BIN")
W=$(mktemp -d "${TMPDIR:-/var/tmp}/fencefs-bench-apply.XXXXXX")
PIDS=()
cleanup() {
  for m in "$W"/*/mnt; do mountpoint -q "$m" 2>/dev/null && fusermount3 -u -z "$m"; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT
printf 'mode = "workspace-write"\ndefault = "write"\n' > "$W/policy.toml"
now() { date +%s.%N; }
# Wall seconds on stdout; CPU seconds (user + system, children included) appended to $2.
tc() {
  local out=$1 s; shift; s=$(now)
  /usr/bin/time -f '%U %S' -o "$W/cpu" "$@" >/dev/null 2>"$W/err" || { cat "$W/err" >&2; exit 1; }
  awk '{print $1 + $2}' "$W/cpu" >>"$out"; echo "$(now) - $s" | bc
}
# A staging area with N new files sealed as checkpoint 1, its daemon stopped.
prepare() {
  local d=$1; rm -rf "$d"; mkdir -p "$d/src" "$d/mnt"
  echo keep > "$d/src/keep.txt"
  "$BIN" mount -p "$W/policy.toml" --stage "$d/stage" --control "$d/ctl.sock" "$d/src" "$d/mnt" 2>"$d/log" &
  local pid=$!; PIDS+=("$pid")
  for _ in $(seq 200); do mountpoint -q "$d/mnt" && break; sleep 0.05; done
  python3 - "$d/mnt/c" "$N" <<'EOF'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    sub = os.path.join(d, f"d{i // 100}")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, f"f{i}"), "w") as f:
        f.write("x" * 100)
EOF
  "$BIN" stage checkpoint "$d/ctl.sock" >/dev/null
  kill "$pid"; wait "$pid" || true
  sync
}
: >"$W/cpa.cpu"; : >"$W/apply.cpu"; : >"$W/cpa.wall"; : >"$W/apply.wall"
: >"$W/vs.cpu"; : >"$W/vs.wall"
for r in $(seq "$RUNS"); do
  d="$W/r$r"; prepare "$d"
  tc "$W/cpa.cpu" sh -c "cp -a '$d/stage/layers/1/c' '$d/cp-copy' && sync" >>"$W/cpa.wall"
  rm -rf "$d/cp-copy"; sync
  tc "$W/apply.cpu" "$BIN" stage apply --dir "$d/stage" >>"$W/apply.wall"
  [ "$(find "$d/src/c" -type f | wc -l)" = "$N" ] || { echo "apply did not apply $N files" >&2; exit 1; }
  rm -rf "$d"
  if [ -n "$VS" ]; then
    d="$W/v$r"; prepare "$d"
    tc "$W/vs.cpu" "$VS" stage apply --dir "$d/stage" >>"$W/vs.wall"
    [ "$(find "$d/src/c" -type f | wc -l)" = "$N" ] || { echo "--vs apply did not apply $N files" >&2; exit 1; }
    rm -rf "$d"
  fi
done
med() { sort -n "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $N files, $RUNS rounds, medians"
printf '%-30s %10s %10s\n' "" "wall s" "CPU s"
printf '%-30s %10.3f %10.3f\n' "cp -a + sync" "$(med "$W/cpa.wall")" "$(med "$W/cpa.cpu")"
printf '%-30s %10.3f %10.3f\n' "stage apply --dir" "$(med "$W/apply.wall")" "$(med "$W/apply.cpu")"
[ -z "$VS" ] || printf '%-30s %10.3f %10.3f\n' "--vs stage apply --dir" "$(med "$W/vs.wall")" "$(med "$W/vs.cpu")"
printf '%-30s %9.2fx %9.2fx\n' "ratio (apply / cp -a)" "$(echo "$(med "$W/apply.wall") / $(med "$W/cpa.wall")" | bc -l)" \
  "$(echo "$(med "$W/apply.cpu") / $(med "$W/cpa.cpu")" | bc -l)"
if [ -n "$STRACE" ]; then
  d="$W/s"; prepare "$d"
  echo "== strace -c -f: cp -a + sync" >&2
  strace -c -f -w -o "$W/st.cpa" sh -c "cp -a '$d/stage/layers/1/c' '$d/cp-copy' && sync"; head -25 "$W/st.cpa" >&2
  rm -rf "$d/cp-copy"; sync
  echo "== strace -c -f: stage apply --dir" >&2
  strace -c -f -w -o "$W/st.apply" "$BIN" stage apply --dir "$d/stage" >/dev/null; head -25 "$W/st.apply" >&2
fi
