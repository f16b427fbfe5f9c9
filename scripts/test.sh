#!/usr/bin/env bash
# Full local/CI check: installs what a fresh Debian machine lacks, then the layout and
# docs checks, fmt, clippy, cargo doc, build, and every test (unit + mount tests against
# the real daemon).
# Idempotent; exits non-zero on the first failing step.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '\n== %s\n' "$*"; }

# --- system packages (only when a command is missing) -------------------------------
need=()
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v git >/dev/null 2>&1 || need+=(git)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
command -v tar >/dev/null 2>&1 || need+=(tar)
command -v sha256sum >/dev/null 2>&1 || need+=(coreutils)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
# Tests run Debian's /usr/bin/python3 as other uids (a pyenv shim on PATH may not be theirs).
[[ -x /usr/bin/python3 ]] || need+=(python3)
# tests/example_policy.rs: `/usr/bin/python3 -m venv` with pip (Debian's ensurepip lives in
# python3-venv), meson + ninja, sqlite3 and npm through a mount of policy.example.toml.
/usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v meson >/dev/null 2>&1 || need+=(meson)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v sqlite3 >/dev/null 2>&1 || need+=(sqlite3)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v make >/dev/null 2>&1 || need+=(make)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v man >/dev/null 2>&1 || need+=(man-db)
# tests/round_trips.rs: getfacl/setfacl through the mount.
command -v setfacl >/dev/null 2>&1 || need+=(acl)
# tests/run_tty.rs: fencefs run on a real terminal (job control, SIGWINCH, raw mode).
command -v tmux >/dev/null 2>&1 || need+=(tmux)
# tests/agent_notes_copy.rs: `rsync -a` of a mount leaves `.fencefs/` out.
command -v rsync >/dev/null 2>&1 || need+=(rsync)
if ((${#need[@]})); then
    say "installing ${need[*]}"
    if [[ $(id -u) -ne 0 ]]; then
        echo "test.sh: missing ${need[*]} and not root; install them first" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- FUSE must be usable: the mount tests never skip ---------------------------------
if [[ ! -c /dev/fuse ]]; then
    modprobe fuse 2>/dev/null || true
fi
if [[ ! -c /dev/fuse ]]; then
    echo "test.sh: /dev/fuse is missing (load the fuse module / pass --device /dev/fuse)" >&2
    exit 1
fi

# --- Rust toolchain components -------------------------------------------------------
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        rustup component add rustfmt clippy
    else
        echo "test.sh: cargo fmt/clippy missing and no rustup to add them" >&2
        exit 1
    fi
fi

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

say "layout: no file under src/ over 800 lines, no import cycle (scripts/check-layout.sh)"
bash scripts/check-layout.sh

say "docs: the book builds and its links resolve (scripts/check-docs.sh)"
bash scripts/check-docs.sh

say "deploy/kubernetes: valid against the Kubernetes schemas (scripts/k8s-validate.sh; pip once)"
bash scripts/k8s-validate.sh

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy --all-targets -- -D warnings"
cargo clippy --quiet --all-targets -- -D warnings

say "cargo doc: the API docs (private items too) build without a warning"
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps --document-private-items

say "cargo build"
cargo build --quiet --all-targets

# Leftovers from an interrupted earlier run: lazily unmount our own test mounts only
# (they live under target/tmp/fencefs-tests), then remove the directories.
tmp="$PWD/target/tmp/fencefs-tests"
if [[ -d $tmp ]]; then
    while read -r mp; do
        fusermount3 -u -z "$mp" 2>/dev/null || true
    done < <(awk -v p="$tmp/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo)
    rm -rf "$tmp"
fi
# scripts/soak.sh's own trap cannot run when it is SIGKILLed: its mounts live under
# target/tmp/soak-PID (the PID of that soak, never another program's).
for d in "$PWD"/target/tmp/soak-*; do
    [[ -d $d ]] || continue
    while read -r mp; do
        fusermount3 -u -z "$mp" 2>/dev/null || true
    done < <(awk -v p="$d/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo)
    rm -rf "$d"
done

# Some tests (tests/transport.rs) and the io_uring pass turn the kernel's FUSE-over-io_uring
# switch on (we are root); it is put back as it was before the first test.
uring=/sys/module/fuse/parameters/enable_uring
if [[ -e $uring ]]; then
    was=$(cat "$uring")
    trap 'echo "$was" >"$uring" 2>/dev/null || true' EXIT
fi

say "the VM guest for tests/vhost.rs (qemu-system-x86, busybox-static, a Debian kernel; cached in target/vm)"
sh scripts/vm-guest.sh target/vm

say "cargo test (mount tests over /dev/fuse)"
# Each mount test runs its own daemon; two at a time suits a 2-core machine.
FENCEFS_TEST_TRANSPORT=dev-fuse \
    cargo test --quiet --no-fail-fast -- --test-threads="${FENCEFS_TEST_THREADS:-2}"

say "cargo test (mount tests over FUSE over io_uring)"
# The same mount tests on the other transport.
if [[ ! -e $uring ]]; then
    echo "test.sh: this kernel has no FUSE over io_uring ($uring missing; needs Linux 6.14+" >&2
    echo "  with CONFIG_FUSE_IO_URING). FENCEFS_TEST_NO_URING=1 runs without that pass." >&2
    [[ ${FENCEFS_TEST_NO_URING:-} == 1 ]] || exit 1
else
    FENCEFS_TEST_TRANSPORT=io-uring \
        cargo test --quiet --no-fail-fast --test '*' -- --test-threads="${FENCEFS_TEST_THREADS:-2}"
    say "hostile soak over io_uring with two policy layers (short run)"
    bash scripts/soak.sh --secs "${FENCEFS_SOAK_SECS:-30}" --bin target/debug/fencefs \
        --transport io-uring --layers
    echo "$was" >"$uring"
fi

say "fsx through the mount, every I/O path (short run; scripts/conformance.sh has the full one)"
bash scripts/conformance.sh --only fsx --ops 5000 --concurrent-ops 2000 \
    --io default,no-passthrough,revoke --bin target/debug/fencefs

say "hostile soak over /dev/fuse (short run; scripts/soak.sh runs 10 minutes)"
bash scripts/soak.sh --secs "${FENCEFS_SOAK_SECS:-30}" --bin target/debug/fencefs \
    --transport dev-fuse

say "staging soak: an agent, the operator and a host editor at once (short run; scripts/soak.sh --stage runs 10 minutes)"
bash scripts/soak.sh --stage --secs "${FENCEFS_SOAK_SECS:-30}" --bin target/debug/fencefs

say "policy fuzzing (stable harness, 25 s)"
FENCEFS_FUZZ_SECS="${FENCEFS_FUZZ_SECS:-25}" cargo test --quiet --test policy_prop -- \
    --ignored --exact fuzz::fuzz_random_inputs

say "all checks passed"
