# scripts/bench/uring-check.sh (sourced by scripts/bench.sh and scripts/cpu-per-op.sh)
# transport_check TARGET PID MNT: proves from the running daemon which transport it serves.
# A target named *-uring must show the kernel's switch on
# (/sys/module/fuse/parameters/enable_uring = Y) and at least one `anon_inode:[io_uring]`
# descriptor in /proc/PID/fd once the connection is initialised (the stat of MNT waits for
# FUSE_INIT; libfuse and fencefs set their rings up before answering it); any other FUSE
# target must show none. Prints "N rings" on success; on failure prints the reason on
# stderr and returns 1 (the caller then fails the target: it is never reported under a
# name whose transport it does not use).
transport_check() {
    local tgt=$1 pid=$2 mnt=$3 rings i
    stat "$mnt" >/dev/null 2>&1 || true
    for ((i = 0; i < 40; i++)); do # rings of later queues may come up a moment after INIT
        rings=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 -lname 'anon_inode:\[io_uring\]' 2>/dev/null | wc -l)
        [[ $tgt != *-uring ]] || ((rings > 0)) && break
        sleep 0.05
    done
    if [[ $tgt == *-uring ]]; then
        if [[ $(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null) != Y ]]; then
            echo "$tgt: /sys/module/fuse/parameters/enable_uring is not Y: the kernel serves no FUSE over io_uring" >&2
            return 1
        fi
        if ((rings == 0)); then
            echo "$tgt: daemon $pid holds no anon_inode:[io_uring] descriptor: it runs over /dev/fuse, not io_uring" >&2
            return 1
        fi
    elif ((rings > 0)); then
        echo "$tgt: daemon $pid holds $rings io_uring descriptor(s) though its target is /dev/fuse" >&2
        return 1
    fi
    echo "$rings rings"
}
