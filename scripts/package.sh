#!/usr/bin/env bash
# Builds the Debian package: target/debian/fencefs_<version>-1_<arch>.deb.
#
#   scripts/package.sh
#
# 1. cargo build --release --locked
# 2. fencefs generate-docs target/debian/gen: fencefs(1) and fencefs-policy(5) (gzip -9n),
#    bash/zsh/fish completions — generated from the clap definition, never committed
# 3. cargo deb --no-build (cargo-deb; installed with `cargo install cargo-deb --locked`
#    when missing): assets and maintainer scripts from [package.metadata.deb] in Cargo.toml
# Needs: cargo, gzip, dpkg (dpkg-shlibdeps comes with dpkg-dev: installed when missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '\n== %s\n' "$*"; }

if ! command -v dpkg-shlibdeps >/dev/null 2>&1; then
    say "installing dpkg-dev (dpkg-shlibdeps, for Depends: libc6)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends dpkg-dev >/dev/null
fi
if ! cargo deb --version >/dev/null 2>&1; then
    say "cargo install cargo-deb --locked"
    cargo install cargo-deb --locked --quiet
fi

say "cargo build --release --locked"
cargo build --release --locked --quiet

say "man pages and completions (fencefs generate-docs)"
gen=target/debian/gen
rm -rf "$gen"
target/release/fencefs generate-docs "$gen"
gzip -9n "$gen"/man/*.[0-9]

say "cargo deb"
rm -f target/debian/fencefs_*.deb
cargo deb --no-build --strip --quiet
deb=$(ls target/debian/fencefs_*.deb)
dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Architecture\|Depends\|Suggests\|Installed-Size\):/&/p'
dpkg-deb --contents "$deb" | awk '{ print $6 }'
echo "$deb"
