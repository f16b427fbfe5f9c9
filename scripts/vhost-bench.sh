#!/usr/bin/env bash
# Guest workloads over virtio-fs, fencefs vhost-user against virtiofsd (the anchor), same
# run: untar 5,000 files (a git repository: its objects in one pack), `ls -lR` (warm, right
# after), `find` (cold: caches dropped), a stat walk (lstat of every file, warm), `git
# status` twice (the first finds every index entry's ctime changed by the untar, reads the
# files and rewrites the index; the second is the usual one: an lstat per file), a 256 MiB
# sequential write and read (page cache dropped in between). Debian's /usr/bin/git and the
# libraries ldd names go into the bench's own initramfs segment. Each backend
# serves a fresh copy of the same tree to a fresh VM (the guest scripts/vm-guest.sh
# prepares; QEMU under TCG here, so compare ratios within one run, not absolute times).
# Times come from the guest's /proc/uptime (10 ms); the daemon's CPU time (user+system,
# /proc/PID/stat) is sampled as the guest's console says each workload starts and ends.
#
# Usage: scripts/vhost-bench.sh [--runs N] [--bin target/release/fencefs]
#            [--virtiofsd PATH] [--policy FILE] [--queue-size N]
#            [--variant NAME='FENCEFS ARGS']...   (default: one variant "fencefs", no args)
#            [--anchor NAME='VIRTIOFSD ARGS']...  (more virtiofsd runs, e.g. xattr=--xattr)
# e.g. --variant fencefs= --variant ttl30='--cache-ttl 30'
# Each round runs every backend once, in turn (the order reversed every other round, so a
# drift of the machine's load does not favour one); the table gives medians and, with more
# than one round, the range (min-max) of the ratios per round.
# virtiofsd: `cargo install --locked virtiofsd --root target/tools` (needs libseccomp-dev
# and libcap-ng-dev).
# Results: a table on stdout, TSV in target/tmp/vhost-bench/results.tsv, and fencefs's
# per-connection request profile (requests by opcode, queue-thread µs each) from its logs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=1
bin=target/release/fencefs
virtiofsd=$(command -v virtiofsd || echo target/tools/bin/virtiofsd)
policy=
qsize=1024
variants=()
anchors=()
while (($#)); do
    case $1 in
        --runs) runs=$2; shift 2 ;;
        --queue-size) qsize=$2; shift 2 ;;
        --variant) variants+=("$2"); shift 2 ;;
        --anchor) anchors+=("$2"); shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --virtiofsd) virtiofsd=$2; shift 2 ;;
        --policy) policy=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[[ -x $bin ]] || { echo "no $bin (cargo build --release)" >&2; exit 1; }
((${#variants[@]})) || variants=("fencefs=")
[[ -x $virtiofsd ]] || { echo "no virtiofsd ($virtiofsd): cargo install virtiofsd" >&2; exit 1; }
sh scripts/vm-guest.sh target/vm >/dev/null

out=$PWD/target/tmp/vhost-bench
rm -rf "$out"
mkdir -p "$out/tree"
# The tree to untar: 5,000 small files in 50 directories.
for d in $(seq 1 50); do
    mkdir -p "$out/tree/d$d"
    for f in $(seq 1 100); do echo "file $d/$f" >"$out/tree/d$d/f$f.txt"; done
done
# A git repository of them (objects packed, so the untar adds a handful of files).
git -C "$out/tree" init -q
git -C "$out/tree" add -A
git -C "$out/tree" -c user.name=bench -c user.email=bench@localhost commit -q -m tree
git -C "$out/tree" gc -q
tar -C "$out/tree" -cf "$out/tree.tar" .

if [[ -z $policy ]]; then
    # Everything writable: what the benchmark measures is the transport and the checks.
    policy=$out/policy.toml
    printf 'mode = "workspace-write"\ndefault = "write"\n' >"$policy"
fi

cat >"$out/test.sh" <<'EOF'
#!/bin/sh
W=/w
mkdir -p $W
mount -t virtiofs fs $W || { echo "GUEST: mount failed"; exit; }
now() { cut -d' ' -f1 /proc/uptime; }
t() { name=$1; shift; echo "B $name"; a=$(now); if "$@" >/dev/null 2>&1; then b=$(now); echo "T $name $a $b"; else echo "GUEST: $name failed"; fi; }
mkdir -p $W/x
t untar tar -xf $W/tree.tar -C $W/x
t ls_lR ls -lR $W/x
echo 3 > /proc/sys/vm/drop_caches
t find find $W/x
t stat_walk sh -c "find $W/x -type f | xargs stat -c %Y"
export HOME=/tmp GIT_CONFIG_NOSYSTEM=1
t git_status_1 /usr/bin/git -C $W/x status --porcelain
t git_status /usr/bin/git -C $W/x status --porcelain
t write_256M sh -c "dd if=/dev/zero of=$W/big bs=1M count=256 && sync"
echo 3 > /proc/sys/vm/drop_caches
t read_256M dd if=$W/big of=/dev/null bs=1M
umount $W
EOF
chmod +x "$out/test.sh"
# The segment: test.sh, git and what it links (the guest's busybox has no git).
seg=$out/seg
mkdir -p "$seg/usr/bin"
cp "$out/test.sh" "$seg/"
cp /usr/bin/git "$seg/usr/bin/git"
for l in $(ldd /usr/bin/git | grep -o '/[^ ]*'); do
    mkdir -p "$seg$(dirname "$l")"
    cp -L "$l" "$seg$l"
done
(cd "$seg" && find . -mindepth 1 | busybox cpio -o -H newc 2>/dev/null) >"$out/seg.cpio"
cat target/vm/initramfs.gz "$out/seg.cpio" >"$out/initrd"

accel=tcg,thread=multi
[[ -e /sys/module/kvm_intel || -e /sys/module/kvm_amd ]] && accel=kvm

# CPU seconds (user + system) of process $1 so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# run NAME KIND ARGS: boots the VM against a daemon of KIND (virtiofsd or fencefs, with
# ARGS) on $out/NAME.sock; prints NAME WORKLOAD SECONDS DAEMON-CPU-SECONDS lines.
run() {
    local name=$1 kind=$2 args=$3 dir=$out/src-$1 sock=$out/$1.sock pid
    rm -rf "$dir" "$sock"
    mkdir -p "$dir"
    cp "$out/tree.tar" "$dir/"
    case $kind in
        # shellcheck disable=SC2086
        virtiofsd) "$virtiofsd" --socket-path="$sock" --shared-dir="$dir" --cache=auto \
                       --sandbox=none $args >"$out/$name.log" 2>&1 & ;;
        # shellcheck disable=SC2086
        fencefs) "$bin" vhost-user --socket "$sock" --policy "$policy" $args "$dir" \
                     >"$out/$name.log" 2>&1 & ;;
    esac
    pid=$!
    for _ in $(seq 1 200); do [[ -S $sock ]] && break; sleep 0.05; done
    local nq=1
    [[ $args =~ --request-queues[=\ ]([0-9]+) ]] && nq=${BASH_REMATCH[1]}
    timeout 900 qemu-system-x86_64 -accel "$accel" -cpu max -m 1G -smp 2 -nographic \
        -no-reboot -nodefaults -serial stdio -kernel target/vm/vmlinuz -initrd "$out/initrd" \
        -append "console=ttyS0 quiet panic=-1" \
        -object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
        -chardev socket,id=fs,path="$sock" \
        -device "vhost-user-fs-pci,chardev=fs,tag=fs,queue-size=$qsize,num-request-queues=$nq" \
        </dev/null 2>&1 | while IFS= read -r line; do
            line=${line%$'\r'}
            case $line in
                "B "* | "T "*) echo "$line $(cpu "$pid")" ;;
                *) echo "$line" ;;
            esac
        done >"$out/$name.console" || true
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    awk -v n="$name" '/^B / { c[$2] = $3 } /^T / { printf "%s\t%s\t%.2f\t%.2f\n", n, $2, $4 - $3, $5 - c[$2] }' \
        "$out/$name.console"
}

: >"$out/results.tsv"
# The backends of a round: KIND NAME=ARGS.
backends=("virtiofsd virtiofsd=")
for a in "${anchors[@]}"; do backends+=("virtiofsd $a"); done
for v in "${variants[@]}"; do backends+=("fencefs $v"); done
names=()
for b in "${backends[@]}"; do n=${b#* }; names+=("${n%%=*}"); done
for r in $(seq 1 "$runs"); do
    order=("${backends[@]}")
    if ((r % 2 == 0)); then
        order=()
        for ((i = ${#backends[@]} - 1; i >= 0; i--)); do order+=("${backends[i]}"); done
    fi
    for b in "${order[@]}"; do
        kind=${b%% *} v=${b#* }
        run "${v%%=*}" "$kind" "${v#*=}" | sed "s/^/$r\t/" >>"$out/results.tsv"
        cp "$out/${v%%=*}.log" "$out/${v%%=*}.log.$r"
    done
done
# Medians per backend and workload (seconds, and the daemon's CPU seconds), and each
# backend / virtiofsd: the ratio of the medians and the range of the per-round ratios.
python3 - "$out/results.tsv" "${names[@]}" <<'EOF'
import sys, statistics, collections
t = collections.defaultdict(list)
c = collections.defaultdict(list)
by_round = {}
for line in open(sys.argv[1]):
    r, name, work, secs, cpu = line.split()
    t[(name, work)].append(float(secs))
    c[(name, work)].append(float(cpu))
    by_round[(r, name, work)] = float(secs)
names = sys.argv[2:]
works = list(dict.fromkeys(w for (n, w) in t if n == "virtiofsd"))
rounds = sorted({r for (r, _, _) in by_round}, key=int)
med = lambda d, k: statistics.median(d[k]) if d.get(k) else float("nan")
print(f"{len(rounds)} round(s); seconds in the guest, median (daemon CPU seconds); "
      "ratio = backend / virtiofsd: of the medians [min-max of the rounds' ratios]")
print(f"{'workload':<11}" + "".join(f"{n:>34}" for n in names))
for w in works:
    a = med(t, ("virtiofsd", w))
    row = f"{w:<11}"
    for n in names:
        b, cb = med(t, (n, w)), med(c, (n, w))
        cell = f"{b:.2f} ({cb:.2f})"
        if n != "virtiofsd":
            rs = [by_round[(r, n, w)] / by_round[(r, "virtiofsd", w)] for r in rounds
                  if (r, n, w) in by_round and by_round.get((r, "virtiofsd", w))]
            cell += f" {b / a if a else float('nan'):.2f}x"
            if len(rs) > 1:
                cell += f" [{min(rs):.2f}-{max(rs):.2f}]"
        row += f"{cell:>34}"
    print(row)
EOF
for v in "${variants[@]}"; do
    for r in $(seq 1 "$runs"); do
        sed -n "s/.*connection 1: \([0-9]* requests.*\)/${v%%=*} (round $r): \1/p" \
            "$out/${v%%=*}.log.$r"
    done
done
