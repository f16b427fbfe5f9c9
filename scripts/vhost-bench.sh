#!/usr/bin/env bash
# Guest workloads over virtio-fs, fencefs vhost-user against virtiofsd (the anchor), same
# run: untar 5,000 files, `ls -lR`, `find`, a 256 MiB sequential write and read (page cache
# dropped in between). Each backend serves a fresh copy of the same tree to a fresh VM
# (the guest scripts/vm-guest.sh prepares; QEMU under TCG here, so compare ratios within
# one run, not absolute times). Times come from the guest's /proc/uptime (10 ms).
#
# Usage: scripts/vhost-bench.sh [--runs N] [--bin target/release/fencefs]
#                               [--virtiofsd PATH] [--policy FILE]
# virtiofsd: `cargo install virtiofsd` (needs libseccomp-dev and libcap-ng-dev).
# Results: a table on stdout and TSV in /tmp/fencefs-vhost-bench/results.tsv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=1
bin=target/release/fencefs
virtiofsd=$(command -v virtiofsd || echo target/virtiofsd/bin/virtiofsd)
policy=
while (($#)); do
    case $1 in
        --runs) runs=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --virtiofsd) virtiofsd=$2; shift 2 ;;
        --policy) policy=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[[ -x $bin ]] || { echo "no $bin (cargo build --release)" >&2; exit 1; }
[[ -x $virtiofsd ]] || { echo "no virtiofsd ($virtiofsd): cargo install virtiofsd" >&2; exit 1; }
sh scripts/vm-guest.sh target/vm >/dev/null

out=/tmp/fencefs-vhost-bench
rm -rf "$out"
mkdir -p "$out/tree"
# The tree to untar: 5,000 small files in 50 directories.
for d in $(seq 1 50); do
    mkdir -p "$out/tree/d$d"
    for f in $(seq 1 100); do echo "file $d/$f" >"$out/tree/d$d/f$f.txt"; done
done
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
t() { name=$1; shift; a=$(now); if "$@" >/dev/null 2>&1; then b=$(now); echo "T $name $a $b"; else echo "GUEST: $name failed"; fi; }
mkdir -p $W/x
t untar tar -xf $W/tree.tar -C $W/x
t ls_lR ls -lR $W/x
echo 3 > /proc/sys/vm/drop_caches
t find find $W/x
t write_256M sh -c "dd if=/dev/zero of=$W/big bs=1M count=256 && sync"
echo 3 > /proc/sys/vm/drop_caches
t read_256M dd if=$W/big of=/dev/null bs=1M
umount $W
EOF
chmod +x "$out/test.sh"
(cd "$out" && echo test.sh | busybox cpio -o -H newc 2>/dev/null) >"$out/seg.cpio"
cat target/vm/initramfs.gz "$out/seg.cpio" >"$out/initrd"

accel=tcg,thread=multi
[[ -e /sys/module/kvm_intel || -e /sys/module/kvm_amd ]] && accel=kvm

# run NAME: boots the VM against the daemon started by start_NAME on $out/NAME.sock.
run() {
    local name=$1 dir=$out/src-$1 sock=$out/$1.sock pid
    rm -rf "$dir" "$sock"
    mkdir -p "$dir"
    cp "$out/tree.tar" "$dir/"
    case $name in
        virtiofsd) "$virtiofsd" --socket-path="$sock" --shared-dir="$dir" --cache=auto \
                       --sandbox=none >"$out/$name.log" 2>&1 & ;;
        fencefs) "$bin" vhost-user --socket "$sock" --policy "$policy" "$dir" \
                     >"$out/$name.log" 2>&1 & ;;
    esac
    pid=$!
    for _ in $(seq 1 200); do [[ -S $sock ]] && break; sleep 0.05; done
    timeout 600 qemu-system-x86_64 -accel "$accel" -cpu max -m 1G -smp 2 -nographic \
        -no-reboot -nodefaults -serial stdio -kernel target/vm/vmlinuz -initrd "$out/initrd" \
        -append "console=ttyS0 quiet panic=-1" \
        -object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
        -chardev socket,id=fs,path="$sock" -device vhost-user-fs-pci,chardev=fs,tag=fs \
        </dev/null >"$out/$name.console" 2>&1 || true
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    awk -v n="$name" '/^T / { printf "%s\t%s\t%.2f\n", n, $2, $4 - $3 }' "$out/$name.console"
}

: >"$out/results.tsv"
for r in $(seq 1 "$runs"); do
    for name in virtiofsd fencefs; do
        run "$name" | sed "s/^/$r\t/" >>"$out/results.tsv"
    done
done
# Medians per backend and workload, and fencefs / virtiofsd.
python3 - "$out/results.tsv" <<'EOF'
import sys, statistics, collections
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    _, name, work, secs = line.split()
    t[(name, work)].append(float(secs))
works = [w for (n, w) in t if n == "virtiofsd"]
print(f"{'workload':<12} {'virtiofsd s':>12} {'fencefs s':>10} {'ratio':>7}")
for w in dict.fromkeys(works):
    a = statistics.median(t[("virtiofsd", w)])
    b = statistics.median(t.get(("fencefs", w), [float("nan")]))
    print(f"{w:<12} {a:>12.2f} {b:>10.2f} {b / a if a else float('nan'):>7.2f}")
EOF
