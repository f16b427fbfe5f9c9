#!/usr/bin/env bash
# scripts/bench/passthrough-hp.sh DIR: prints the path of libfuse's example/passthrough_hp
# built WITH FUSE-over-io_uring, building it under DIR the first time (later calls reuse
# the build after re-checking it).
#
# Where libfuse comes from: Debian's source package `fuse3` (`apt-get source`, Debian's
# archive only; no GitHub). FUSE-over-io_uring needs libfuse >= 3.18 configured with
# liburing (SQE128) and libnuma. Debian's own binary packages are built without them
# (fuse3's Build-Depends list neither, so meson silently leaves HAVE_URING unset and
# `passthrough_hp -o io_uring` quietly runs over /dev/fuse: libfuse logs "failed to start
# io-uring" at INFO level and goes on). So the source is taken from the newest Debian suite
# that has >= 3.18 (sid, then trixie; a private apt configuration under DIR/apt, the
# system's sources are not touched) and built here with Debian's liburing-dev and
# libnuma-dev (installed with apt-get when missing, as are meson, ninja-build and g++).
# The build fails, loudly, when HAVE_URING is not set or the binary does not link liburing.
# Exit status 1 and a reason on stderr when no such build is possible on this machine.
set -euo pipefail
DIR=${1:?usage: passthrough-hp.sh DIR}
MIN=3.18
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
B=$DIR/build BIN=$DIR/build/example/passthrough_hp
die() { echo "passthrough-hp.sh: $*" >&2; exit 1; }

check() { # the build links liburing and libfuse was configured with HAVE_URING
    [[ -x $BIN ]] && grep -q '^#define HAVE_URING' "$B/fuse_config.h" 2>/dev/null &&
        ldd "$BIN" | grep -q 'liburing\.so' && ldd "$BIN" | grep -q "$B/.*libfuse3\.so"
}
if check; then echo "$BIN"; exit 0; fi

[[ $(id -u) == 0 ]] || die "run as root (apt-get)"
pkgs=()
for p in liburing-dev libnuma-dev meson ninja-build g++ pkgconf dpkg-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || pkgs+=("$p")
done
if ((${#pkgs[@]})); then
    echo "passthrough-hp.sh: apt-get install ${pkgs[*]}" >&2
    apt-get install -y --no-install-recommends "${pkgs[@]}" >&2 || die "apt-get install ${pkgs[*]} failed"
fi

# a private apt configuration holding only Debian source indexes
A=$DIR/apt
mkdir -p "$A/lists/partial" "$A/cache/archives/partial"
cat >"$A/sources.list" <<'EOF'
deb-src http://deb.debian.org/debian sid main
deb-src http://deb.debian.org/debian trixie main
EOF
APT=(-o "Dir::Etc::sourcelist=$A/sources.list" -o Dir::Etc::sourceparts=/nonexistent
    -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache" -o APT::Sandbox::User=root)
apt-get "${APT[@]}" update >&2 || die "apt-get update of Debian's source indexes failed"
ver=$(apt-cache "${APT[@]}" showsrc fuse3 | awk '/^Version:/ { print $2 }' | sort -V | tail -n 1)
[[ -n $ver ]] || die "no fuse3 source package in Debian's sid or trixie indexes"
up=${ver%-*}
dpkg --compare-versions "$up" ge "$MIN" ||
    die "Debian's newest fuse3 source is $ver: libfuse < $MIN has no FUSE-over-io_uring"
rm -rf "$DIR/src" && mkdir -p "$DIR/src"
(cd "$DIR/src" && apt-get "${APT[@]}" source "fuse3=$ver" >&2) || die "apt-get source fuse3=$ver failed"
S=$(find "$DIR/src" -mindepth 1 -maxdepth 1 -type d -name 'fuse3-*' | head -n 1)
[[ -f $S/example/passthrough_hp.cc ]] || die "fuse3 $ver has no example/passthrough_hp.cc"

rm -rf "$B"
meson setup "$B" "$S" -Denable-io-uring=true -Dexamples=true -Dutils=false -Dtests=false \
    -Duseroot=false >"$DIR/meson.log" 2>&1 || die "meson setup failed: $(tail -n 5 "$DIR/meson.log")"
grep -q '^#define HAVE_URING' "$B/fuse_config.h" ||
    die "libfuse $up configured without HAVE_URING (liburing with SQE128 and libnuma needed): $(grep -iE 'uring|numa' "$DIR/meson.log" | tr '\n' ' ')"
ninja -C "$B" example/passthrough_hp >"$DIR/ninja.log" 2>&1 || die "build failed: $(tail -n 5 "$DIR/ninja.log")"
check || die "$BIN does not link liburing and the libfuse built beside it"
echo "libfuse $ver (Debian source), $(grep -m1 -o 'liburing found: YES [0-9.]*' "$DIR/meson.log")" >"$DIR/VERSION"
echo "$BIN"
