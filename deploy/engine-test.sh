#!/usr/bin/env bash
# deploy/engine-test.sh — the container deployment of README ("Run an agent in a
# container") on a real container engine, without any container registry.
#
#   sudo deploy/engine-test.sh                 # podman if installed, else docker
#   sudo ENGINE=docker deploy/engine-test.sh   # or ENGINE=podman
#
# What it does (every step timed, every check printed as PASS/FAIL):
#  1. A Debian bookworm base image from Debian's archive: debootstrap --variant=minbase
#     (cached as a tarball in $ENGINE_TEST_CACHE), then `podman import` / `docker import`.
#  2. From that base, with the engine's own builder: a Rust build image (Debian's
#     rustc-web/cargo-web, gcc, libc6-dev; stands in for rust:1-bookworm) and an agent
#     image (adds git). Then deploy/Dockerfile itself, unchanged, with
#     --build-arg RUST_IMAGE=… BASE_IMAGE=… pointing at them: its build stage really runs
#     `cargo build --release --locked` (crates come from crates.io), its runtime stage
#     really runs `apt-get install fuse3`. podman builds with --format docker.
#  3. Layout 1: fencefs on this host (the README's commands: shared bind of run/fencefs,
#     `fencefs mount … --allow-other`), agents in containers as uid 1000: one binding the
#     directory above the mount point (started before the mount), one binding the mount
#     point itself (started after it).
#  4. Layout 2: fencefs in a container (--device /dev/fuse --cap-add SYS_ADMIN
#     --security-opt apparmor=unconfined, rshared bind), the agent in another.
#  In both layouts, from inside the agent as uid 1000: .env and secrets/ ENOENT, a write
#  into docs/ EACCES, .git/hooks EROFS, `git commit` works, everything it creates is
#  1000:1000 on the host; a policy edit + SIGHUP is seen by the agent within 1 s; after
#  the daemon stops, a process whose working directory was in the mount gets ENOTCONN
#  at once (no hang) and a fresh path shows the empty directory; restart works; after a
#  crash (SIGKILL, what `docker rm -f` does) the host keeps a dead mount, which
#  `fusermount3 -u -z` (layout 1, the unit's ExecStopPost) or the image's entrypoint
#  (layout 2) clears so fencefs mounts again.
#
# Needs root (mounts, --allow-other, chown 1000), /dev/fuse, fusermount3, debootstrap (it
# is installed with apt-get when missing), network access to Debian's archive and
# crates.io, and cargo on the host for layout 1's binary (without cargo the binary is
# copied out of the built image). When neither podman nor a reachable docker daemon is
# there, podman (and runc, catatonit) are installed from Debian's archive.
#
# Environment:
#   ENGINE=auto|podman|docker  (auto: podman if installed, else docker if its daemon answers)
#   DOCKER=docker              docker client to use (e.g. /usr/bin/docker, Debian's 20.10)
#   DOCKER_BUILDKIT=0|1        docker's builder (legacy / BuildKit); unset: the client's default
#   ENGINE_TEST_CACHE=DIR      default target/engine-test: the debootstrap tarball is kept
#                              here (delete it to fetch a fresh one)
#   ENGINE_TEST_KEEP_IMAGES=1  keep the images (podman: the private store in the cache dir;
#                              docker: the localhost/fencefs-et-* tags) so the next run
#                              reuses the build cache
#   DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR  (default http://deb.debian.org/debian{,-security})
#
# Clean-up, also on failure or Ctrl-C: it stops and removes the containers it created,
# stops the fencefs daemons it started (by pid), unmounts every mount under its work
# directory (including a dead FUSE mount a killed container left), removes its images
# (podman uses a private store: --root/--runroot/--tmpdir under the work or cache dir,
# so nothing of yours is touched; docker: only its own tags and the dangling images its
# builds left; BuildKit's build cache stays, `docker builder prune` clears it).
# Exit status: 0 when every check passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
T0=$(date +%s.%N)

ENGINE=${ENGINE:-auto}
CACHE=${ENGINE_TEST_CACHE:-$ROOT/target/engine-test}
KEEP=${ENGINE_TEST_KEEP_IMAGES:-0}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SEC_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
IMG_BASE=localhost/fencefs-et-base:bookworm
IMG_RUST=localhost/fencefs-et-rust:bookworm
IMG_AGENT=localhost/fencefs-et-agent:bookworm
IMG_FENCEFS=localhost/fencefs-et-fencefs:local
CTRS=(fencefs-et-l1-agent-a fencefs-et-l1-agent-b fencefs-et-l2-fencefs fencefs-et-l2-agent)

passed=0 failed=0 skipped=0
FAILS=()
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
say() { printf '\n== %s\n' "$*"; }
pass() {
    passed=$((passed + 1))
    printf '  PASS: %s\n' "$1"
}
fail() {
    failed=$((failed + 1))
    FAILS+=("$1")
    printf '  FAIL: %s\n' "$1"
}
skip() {
    skipped=$((skipped + 1))
    printf '  SKIPPED: %s\n' "$1"
}
info() { printf '  %s\n' "$*"; }
DIED=0
die() {
    printf 'engine-test: %s\n' "$*" >&2
    DIED=1
    exit 2
}
STEP_T=
step() {
    [[ -n $STEP_T ]] && info "($(since "$STEP_T") s)"
    STEP_T=$(now)
    say "$*"
}

[[ $(id -u) -eq 0 ]] || die "needs root (mounts, --allow-other, files owned by uid 1000)"
[[ -c /dev/fuse ]] || die "/dev/fuse is missing"
command -v fusermount3 >/dev/null || die "fusermount3 is missing (apt-get install fuse3)"
command -v git >/dev/null || die "git is missing (apt-get install git)"
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock -n 9 || die "another engine-test.sh is running (lock $CACHE/lock)"

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    info "apt-get install $*"
    apt-get update -qq && apt-get install -y -qq "$@" >/dev/null
}

# ---- engine ---------------------------------------------------------------------------
docker_usable() { command -v "${DOCKER:-docker}" >/dev/null && "${DOCKER:-docker}" info >/dev/null 2>&1; }
case $ENGINE in
podman | docker) ;;
auto)
    if command -v podman >/dev/null; then
        ENGINE=podman
    elif docker_usable; then
        ENGINE=docker
    else
        info "no podman and no reachable docker daemon: installing podman from Debian's archive"
        apt_install podman runc catatonit || die "apt-get install podman failed"
        ENGINE=podman
    fi
    ;;
*) die "ENGINE must be auto, podman or docker" ;;
esac

W=$(mktemp -d /tmp/fencefs-engine-test.XXXXXX)
chmod 755 "$W"
if [[ $ENGINE == podman ]]; then
    command -v podman >/dev/null || die "podman is not installed"
    # A private store: nothing here touches the user's images or containers.
    if [[ $KEEP == 1 ]]; then S=$CACHE/podman; else S=$W/podman; fi
    mkdir -p "$S"
    ENG=(podman --root "$S/root" --runroot "$S/run" --tmpdir "$S/tmp")
    [[ -n ${ENGINE_TEST_STORAGE_DRIVER:-} ]] && ENG+=(--storage-driver "$ENGINE_TEST_STORAGE_DRIVER")
else
    docker_usable || die "docker: '${DOCKER:-docker} info' fails (no daemon?)"
    ENG=("${DOCKER:-docker}")
fi
e() { "${ENG[@]}" "$@"; }
# podman without systemd logs "unable to get systemd connection" (health-check timers)
# on start/stop/kill; keep such chatter out of the report.
quiet() { "$@" >/dev/null 2>>"$W/engine-chatter.log"; }
RUNOPTS=()  # extra options `run` and podman's `build` need on this host (see the probe)

PIDS=()
cleanup() {
    local c p m
    trap - EXIT INT TERM
    say "clean-up"
    for c in "${CTRS[@]}"; do
        if e container inspect "$c" >/dev/null 2>&1; then
            e stop -t 10 "$c" >/dev/null 2>&1
            e rm -f "$c" >/dev/null 2>&1
        fi
    done
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    # Every mount under the work directory, deepest first (FUSE mounts, dead or alive,
    # and the shared binds); only ours: they all live under $W.
    while read -r m; do
        fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null ||
            info "could not unmount $m"
    done < <(awk -v w="$W/" -v s="${S:-$W}/" 'index($5, w) == 1 || index($5, s) == 1 { print length($5), $5 }' /proc/self/mountinfo |
        sort -rn | cut -d' ' -f2-)
    if [[ $KEEP == 1 ]]; then
        info "images kept (ENGINE_TEST_KEEP_IMAGES=1): $IMG_BASE $IMG_RUST $IMG_AGENT $IMG_FENCEFS"
    elif [[ $ENGINE == podman ]]; then
        e rm -af >/dev/null 2>&1
        e rmi -af >/dev/null 2>&1
    else
        e rmi "$IMG_FENCEFS" "$IMG_AGENT" "$IMG_RUST" "$IMG_BASE" >/dev/null 2>&1
        # Dangling images our builds left (the legacy builder's untagged build stage).
        for m in $(e images -q --filter dangling=true 2>/dev/null); do
            grep -qx "$m" "$W/dangling.before" 2>/dev/null || e rmi "$m" >/dev/null 2>&1
        done
    fi
    if grep -qF " $W/" /proc/self/mountinfo; then
        info "leaving $W: something is still mounted there"
    else
        rm -rf "$W"
    fi
    info "total time: $(since "$T0") s"
    printf '\nengine-test (%s): %d passed, %d failed, %d skipped\n' "$ENGINE" "$passed" "$failed" "$skipped"
    ((${#FAILS[@]})) && printf '  failed: %s\n' "${FAILS[@]}"
    ((DIED)) && exit 2
    ((failed == 0))
    exit $?
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ $ENGINE == podman ]]; then
    info "engine: $(podman --version), store ${S}"
else
    info "engine: ${ENG[*]}: client $(e version --format '{{.Client.Version}}' 2>/dev/null), daemon $(e version --format '{{.Server.Version}}' 2>/dev/null)"
fi
info "work directory: $W; cache: $CACHE"
[[ $ENGINE == docker ]] && e images -q --filter dangling=true >"$W/dangling.before" 2>/dev/null

# ---- 1. base image from Debian's archive -------------------------------------------------
step "1. Debian bookworm base image without a registry (debootstrap + import)"
TARBALL=$CACHE/bookworm-minbase.tar.gz
if [[ -s $TARBALL ]]; then
    info "debootstrap tarball from the cache: $TARBALL ($(du -h "$TARBALL" | cut -f1))"
else
    command -v debootstrap >/dev/null || apt_install debootstrap || die "cannot install debootstrap"
    info "debootstrap --variant=minbase bookworm $MIRROR"
    if ! debootstrap --variant=minbase bookworm "$W/rootfs" "$MIRROR" >"$W/debootstrap.log" 2>&1; then
        tail -5 "$W/debootstrap.log"
        die "debootstrap failed (log above)"
    fi
    # The suites debian:bookworm-slim has, so the runtime stage gets security updates.
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
        "$MIRROR" "$MIRROR" "$SEC_MIRROR" >"$W/rootfs/etc/apt/sources.list"
    rm -rf "$W/rootfs/var/lib/apt/lists/"* "$W/rootfs/var/cache/apt/"*.bin \
        "$W/rootfs/var/cache/apt/archives/"*.deb
    tar --numeric-owner -C "$W/rootfs" -c . | gzip -1 >"$TARBALL.tmp" && mv "$TARBALL.tmp" "$TARBALL"
    rm -rf "$W/rootfs"
    info "cached $TARBALL ($(du -h "$TARBALL" | cut -f1))"
fi
if e image inspect "$IMG_BASE" >/dev/null 2>&1; then
    info "$IMG_BASE already in the store (kept images)"
elif e import "$TARBALL" "$IMG_BASE" >"$W/import.log" 2>&1; then
    info "imported $IMG_BASE"
else
    cat "$W/import.log"
    die "$ENGINE import failed"
fi

# What this host needs to run a container at all. Each attempt's error is printed.
probe() { e run --rm --network none "${RUNOPTS[@]}" "$IMG_BASE" true 2>&1; }
if ! out=$(probe); then
    info "plain '$ENGINE run' fails here: $out"
    RUNTIMES=("")
    [[ $ENGINE == podman ]] && command -v runc >/dev/null && RUNTIMES+=(runc)
    ok=0
    for rt in "${RUNTIMES[@]}"; do
        for np in "" "$(ulimit -Hu)" 32768 4096; do
            [[ -z $rt && -z $np ]] && continue # tried above
            RUNOPTS=()
            [[ -n $rt ]] && RUNOPTS+=(--runtime "$rt")
            [[ -n $np ]] && RUNOPTS+=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=$np:$np")
            if out=$(probe); then
                ok=1
                break 2
            fi
            info "with ${RUNOPTS[*]:-no options}: $out"
        done
    done
    ((ok)) || die "cannot run any container with $ENGINE here (errors above)"
    info "containers run with: ${RUNOPTS[*]}"
fi

# ---- 2. images ------------------------------------------------------------------------------
build() { # build TAG CONTEXT DOCKERFILE [ARGS...]
    local tag=$1 ctx=$2 file=$3
    shift 3
    if [[ $ENGINE == podman ]]; then
        e build --format docker --network host "${RUNOPTS[@]}" -t "$tag" -f "$file" "$@" "$ctx"
    else
        e build --network host -t "$tag" -f "$file" "$@" "$ctx"
    fi
}
step "2a. build image (Debian's cargo-web/rustc-web) and agent image, from the base"
mkdir -p "$W/rust-ctx" "$W/agent-ctx"
{
    echo "FROM $IMG_BASE"
    echo "RUN apt-get update && apt-get install -y --no-install-recommends \\"
    echo "      rustc-web cargo-web gcc libc6-dev ca-certificates && rm -rf /var/lib/apt/lists/*"
    # A TLS-intercepting proxy's CA (as the host trusts it), or cargo cannot reach crates.io.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$W/rust-ctx/"
        echo "COPY *.crt /usr/local/share/ca-certificates/"
        echo "RUN update-ca-certificates"
    fi
} >"$W/rust-ctx/Containerfile"
printf 'FROM %s\nRUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*\n' \
    "$IMG_BASE" >"$W/agent-ctx/Containerfile"
t=$(now)
if build "$IMG_RUST" "$W/rust-ctx" "$W/rust-ctx/Containerfile" >"$W/build-rust.log" 2>&1; then
    info "$IMG_RUST: $(e run --rm --network none "${RUNOPTS[@]}" "$IMG_RUST" sh -c 'cargo --version; rustc --version' | tr '\n' ' ')($(since "$t") s)"
else
    tail -20 "$W/build-rust.log"
    die "building $IMG_RUST failed"
fi
t=$(now)
build "$IMG_AGENT" "$W/agent-ctx" "$W/agent-ctx/Containerfile" >"$W/build-agent.log" 2>&1 ||
    { tail -20 "$W/build-agent.log"; die "building $IMG_AGENT failed"; }
info "$IMG_AGENT ($(since "$t") s)"

step "2b. deploy/Dockerfile (RUST_IMAGE=$IMG_RUST BASE_IMAGE=$IMG_BASE)"
builder=$ENGINE
[[ $ENGINE == docker ]] && builder="docker, DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-unset (client default)}"
t=$(now)
if build "$IMG_FENCEFS" . deploy/Dockerfile --build-arg "RUST_IMAGE=$IMG_RUST" \
    --build-arg "BASE_IMAGE=$IMG_BASE" >"$W/build-fencefs.log" 2>&1; then
    pass "deploy/Dockerfile builds ($builder; $(since "$t") s)"
else
    tail -30 "$W/build-fencefs.log"
    fail "deploy/Dockerfile does not build ($builder)"
    exit 1
fi
ctx=$(grep -o 'Sending build context to Docker daemon *[0-9.]*[kMG]*B' "$W/build-fencefs.log" | tail -1)
[[ -n $ctx ]] && info "$ctx (the root .dockerignore keeps target/ and .git out)"
if grep -qiE 'warn.*(healthcheck|HEALTHCHECK)' "$W/build-fencefs.log"; then
    fail "the builder warns about HEALTHCHECK: $(grep -iE 'warn.*healthcheck' "$W/build-fencefs.log" | head -1)"
fi
hc=$(e image inspect --format '{{json .Config.Healthcheck}}' "$IMG_FENCEFS" 2>/dev/null)
if [[ $hc == *fuse.fencefs* ]]; then
    pass "the image keeps its HEALTHCHECK"
else
    fail "the image has no HEALTHCHECK ($hc)"
fi
if e run --rm --network none "${RUNOPTS[@]}" --entrypoint sh "$IMG_FENCEFS" -c \
    'test -x /usr/local/bin/fencefs-entrypoint && fencefs check /etc/fencefs/policy.toml 2>&1 && command -v fusermount3' \
    >"$W/image-check.log" 2>"$W/image-check.err"; then
    pass "image: entrypoint executable, $(head -1 "$W/image-check.log") (policy), $(tail -1 "$W/image-check.log")"
else
    fail "image contents: $(cat "$W/image-check.log" "$W/image-check.err")"
fi

# Layout 1's binary: the host's build (as README does), else the image's.
BIN=$W/fencefs
if command -v cargo >/dev/null; then
    (cargo build --release --locked --quiet) || die "cargo build --release --locked failed"
    cp target/release/fencefs "$BIN"
    info "layout 1 binary: cargo build --release --locked on the host"
else
    e create --name fencefs-et-copy "$IMG_FENCEFS" >/dev/null && e cp fencefs-et-copy:/usr/local/bin/fencefs "$BIN"
    e rm fencefs-et-copy >/dev/null
    info "layout 1 binary: copied out of $IMG_FENCEFS (no cargo on the host)"
fi

# ---- helpers for the layouts ------------------------------------------------------------
# The project the agent works on: owned by uid 1000, a git repository with hooks.
make_ws() {
    local d=$1
    mkdir -p "$d/docs" "$d/secrets" "$d/src"
    printf 'TOKEN=secret\n' >"$d/.env"
    printf 'key\n' >"$d/secrets/key.txt"
    printf '# guide\n' >"$d/docs/guide.md"
    printf 'notes\n' >"$d/notes.txt"
    printf 'hello\n' >"$d/README.md"
    printf 'int main(void) { return 0; }\n' >"$d/src/main.c"
    printf '.env\nsecrets/\n' >"$d/.gitignore"
    git -C "$d" init -q &&
        git -C "$d" add -A &&
        git -C "$d" -c user.name=engine-test -c user.email=engine-test@localhost commit -qm init ||
        die "git init of the fixture failed"
    chown -R 1000:1000 "$d"
}
# The README's propagation commands: make the shared directory a shared mount.
share() {
    mkdir -p "$1"
    mount --bind "$1" "$1" && mount --make-shared "$1" || die "cannot make $1 a shared mount"
    info "mount --bind $1 $1 && mount --make-shared $1 ($(findmnt -no PROPAGATION "$1"))"
}
host_state() { # live | dead | none : the FUSE mount at $1 as the host sees it
    if ! grep -q " $1 .* - fuse.fencefs " /proc/self/mountinfo; then
        echo none
    elif timeout 5 stat "$1/" >/dev/null 2>&1; then
        echo live
    else
        echo dead
    fi
}
# exec into a container (in its working directory, or in $XW when set); a FUSE hang
# becomes a failure, not a stuck test.
x() {
    local w=()
    [[ -n ${XW:-} ]] && w=(-w "$XW")
    timeout 30 "${ENG[@]}" exec "${w[@]}" "$@"
}
# agent_run NAME TMPDIR WORKDIR MOUNT-OPTIONS…: an unprivileged agent as uid 1000.
agent_run() {
    local name=$1 tmp=$2 wd=$3
    shift 3
    mkdir -p "$tmp" && chmod 1777 "$tmp"
    e run -d --name "$name" --init --network none "${RUNOPTS[@]}" --user 1000:1000 \
        --cap-drop ALL --security-opt no-new-privileges -e HOME=/tmp -v "$tmp:/tmp" \
        "$@" -w "$wd" "$IMG_AGENT" sleep infinity >/dev/null 2>"$W/$name.err" ||
        { cat "$W/$name.err"; die "cannot start the agent container $name"; }
}
# expect NAME WANT CONTAINER SCRIPT: the script's output (stdout+stderr) must contain WANT.
expect() {
    local name=$1 want=$2 ctr=$3 out
    out=$(x "$ctr" sh -c "$4" 2>&1)
    if [[ $out == *"$want"* ]]; then
        pass "$name"
    else
        fail "$name: got: $(printf '%s' "$out" | tr '\n' '|' | cut -c1-300)"
    fi
}
# The policy, from inside the agent (cwd = the fenced workspace), and ownership on the host.
policy_checks() {
    local L=$1 ctr=$2 ws=$3
    expect "$L: agent runs as uid 1000" "uid=1000 gid=1000" "$ctr" 'echo uid=$(id -u) gid=$(id -g)'
    expect "$L: .env hidden (ENOENT), not listed" "No such file or directory / not listed" "$ctr" \
        'r=$(cat .env 2>&1); ls -a | grep -qx .env && l=LISTED || l="not listed"; echo "$r / $l"'
    expect "$L: secrets/ hidden (ENOENT)" "No such file or directory" "$ctr" 'ls secrets'
    expect "$L: creating .env refused (EACCES)" "Permission denied" "$ctr" 'echo x > .env'
    expect "$L: write into docs/ refused (EACCES)" "Permission denied" "$ctr" 'echo x >> docs/guide.md'
    expect "$L: .git/hooks protected (EROFS)" "Read-only file system" "$ctr" \
        'echo "#!/bin/sh" > .git/hooks/pre-commit'
    expect "$L: git config protected (EROFS)" "Read-only file system" "$ctr" \
        'git config core.hooksPath /tmp 2>&1; echo x >> .git/config'
    expect "$L: git add + commit work" "2 commits" "$ctr" \
        'echo "int f(void) { return 1; }" > src/f.c && git add src/f.c &&
         git -c user.name=agent -c user.email=agent@localhost commit -qm agent &&
         echo "$(git rev-list --count HEAD) commits"'
    local bad
    bad=$(find "$ws" \( ! -uid 1000 -o ! -gid 1000 \) -print | head -3)
    if [[ -z $bad && $(stat -c %u:%g "$ws/src/f.c") == 1000:1000 ]]; then
        pass "$L: on the host, everything the agent created (src/f.c, git objects) is 1000:1000"
    else
        fail "$L: files not owned by 1000:1000 on the host: $bad"
    fi
    if [[ $(cat "$ws/docs/guide.md") == '# guide' && $(cat "$ws/.env") == TOKEN=secret ]] &&
        [[ ! -e $ws/.git/hooks/pre-commit ]]; then
        pass "$L: the refused files are unchanged on the host"
    else
        fail "$L: a refused change reached the host"
    fi
}
# hup_check L CONTAINER TMP POLICY-FILE SIGNAL-COMMAND…: hide notes.txt by a policy edit
# + SIGHUP; an agent process polling it must see it vanish within 1 s.
hup_check() {
    local L=$1 ctr=$2 tmp=$3 pol=$4 t_hup seen lat
    shift 4
    rm -f "$tmp/hup.ready" "$tmp/hup.seen"
    x "$ctr" sh -c '[ -e notes.txt ] || exit 3; : > /tmp/hup.ready
        while [ -e notes.txt ]; do :; done; date +%s.%N > /tmp/hup.seen' &
    local wpid=$!
    for _ in $(seq 100); do [[ -e $tmp/hup.ready ]] && break; sleep 0.05; done
    cp "$pol" "$pol.new" && printf '\n[[rule]]\npath = "notes.txt"\naccess = "none"\n' >>"$pol.new" &&
        mv "$pol.new" "$pol"
    t_hup=$(now)
    "$@"
    wait "$wpid"
    seen=$(cat "$tmp/hup.seen" 2>/dev/null)
    if [[ -n $seen ]]; then
        lat=$(awk -v a="$t_hup" -v b="$seen" 'BEGIN { printf "%.3f", b - a }')
        if awk -v l="$lat" 'BEGIN { exit !(l < 1.0) }'; then
            pass "$L: policy edit + SIGHUP: the agent sees notes.txt vanish after $lat s (< 1 s)"
        else
            fail "$L: SIGHUP reload seen only after $lat s"
        fi
    else
        fail "$L: the agent never saw the reload (notes.txt still there after 30 s)"
    fi
}
# hold CONTAINER: a long-running agent process whose working directory is the fenced
# workspace (the container's working directory), like an agent's shell.
hold() {
    "${ENG[@]}" exec -d "$1" sh -c 'echo $$ > /tmp/holder.pid; exec sleep 100000' >/dev/null
    for _ in $(seq 100); do
        [[ -s $2/holder.pid ]] && return 0
        sleep 0.05
    done
    fail "could not start a long-running process in $1"
}
# stopped_checks L CONTAINER FRESH-DIR: after a stop, the working directory of the
# process hold() started fails with ENOTCONN at once; a fresh lookup shows the empty
# directory below the mount.
stopped_checks() {
    local L=$1 ctr=$2 dir=$3 t
    t=$(now)
    XW=/ expect "$L: a process whose cwd was in the mount gets ENOTCONN" \
        "Transport endpoint is not connected" "$ctr" 'ls /proc/$(cat /tmp/holder.pid)/cwd/'
    info "(answered in $(since "$t") s, including the exec)"
    XW=/ expect "$L: a fresh path shows the empty directory below" "entries=0" "$ctr" \
        "echo entries=\$(ls -A $dir | wc -l)"
}

# ---- 3. layout 1 --------------------------------------------------------------------------
step "3. layout 1: fencefs on the host, agents in containers"
L1=$W/l1
mkdir -p "$L1/srv/workspace" "$L1/etc"
make_ws "$L1/srv/workspace"
cp deploy/policy/policy.toml "$L1/etc/policy.toml"
share "$L1/run/fencefs"
MP1=$L1/run/fencefs/workspace
mkdir -p "$MP1"
start_host() {
    rm -f "$L1/ready"
    "$BIN" mount --ready-fd 3 -p "$L1/etc/policy.toml" --allow-other "$L1/srv/workspace" "$MP1" \
        3>"$L1/ready" 2>>"$L1/fencefs.log" &
    FPID=$!
    PIDS+=("$FPID")
    for _ in $(seq 200); do
        [[ $(cat "$L1/ready" 2>/dev/null) == ready* ]] && return 0
        kill -0 "$FPID" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
# Agent A binds the directory above the mount point, before fencefs runs.
agent_run fencefs-et-l1-agent-a "$L1/tmp-a" /fenced/workspace \
    --mount "type=bind,source=$L1/run/fencefs,target=/fenced,bind-propagation=rslave"
t=$(now)
if start_host; then
    pass "layout 1: fencefs mount --allow-other ready ($(since "$t") s, --ready-fd)"
else
    fail "layout 1: fencefs did not start: $(tail -3 "$L1/fencefs.log")"
    exit 1
fi
# Agent B binds the mount point itself (README's first example), after the mount.
agent_run fencefs-et-l1-agent-b "$L1/tmp-b" /workspace \
    --mount "type=bind,source=$MP1,target=/workspace,bind-propagation=rslave"
expect "layout 1: agent A (started before the mount) sees it through the parent bind" \
    "README.md" fencefs-et-l1-agent-a 'ls'
expect "layout 1: agent B (binds the mount point) sees it, .env hidden" \
    "No such file or directory" fencefs-et-l1-agent-b 'ls | grep -qx README.md && cat .env'
policy_checks "layout 1" fencefs-et-l1-agent-a "$L1/srv/workspace"
hold fencefs-et-l1-agent-a "$L1/tmp-a"
hup_check "layout 1" fencefs-et-l1-agent-a "$L1/tmp-a" "$L1/etc/policy.toml" kill -HUP "$FPID"

kill -TERM "$FPID"
wait "$FPID"
rc=$?
if [[ $rc -eq 0 && $(host_state "$MP1") == none ]]; then
    pass "layout 1: SIGTERM: fencefs exits 0 and the mount is gone"
else
    fail "layout 1: SIGTERM: exit $rc, host mount $(host_state "$MP1")"
fi
stopped_checks "layout 1 stopped, agent A" fencefs-et-l1-agent-a /fenced/workspace
XW=/ expect "layout 1 stopped, agent B (bound the mount point): ENOTCONN" \
    "Transport endpoint is not connected" fencefs-et-l1-agent-b 'ls /workspace'

t=$(now)
start_host || fail "layout 1: restart: $(tail -3 "$L1/fencefs.log")"
expect "layout 1 restarted: agent A sees the new mount at a fresh path and writes" \
    "README.md" fencefs-et-l1-agent-a 'echo a > /fenced/workspace/after-restart && ls /fenced/workspace'
XW=/ expect "layout 1 restarted: agent A's old working directory still ENOTCONN" \
    "Transport endpoint is not connected" fencefs-et-l1-agent-a 'ls /proc/$(cat /tmp/holder.pid)/cwd/'
XW=/ expect "layout 1 restarted: agent B (bound the old mount point) still ENOTCONN" \
    "Transport endpoint is not connected" fencefs-et-l1-agent-b 'ls /workspace'
# Its working directory is the dead mount. Whether the engine can still exec into it
# depends on the engine and client (podman and docker CLI 28: "chdir … transport
# endpoint is not connected"; Debian's docker 20.10 CLI: exit 0): reported, not judged.
out=$(x fencefs-et-l1-agent-b true 2>&1)
rc=$?
info "'$ENGINE exec' into agent B (its working directory is the dead mount): exit $rc${out:+: $out}"
t=$(now)
quiet e restart -t 10 fencefs-et-l1-agent-b
d=$(since "$t")
if awk -v d="$d" 'BEGIN { exit !(d < 5) }'; then
    pass "layout 1: restarting agent B (--init, sleep infinity) takes $d s: SIGTERM is obeyed"
else
    fail "layout 1: restarting agent B took $d s (SIGTERM ignored?)"
fi
expect "layout 1: agent B after its restart sees the new mount" "README.md" fencefs-et-l1-agent-b 'ls'

# Crash: SIGKILL leaves a dead mount; fencefs refuses to mount over it until it is detached.
kill -KILL "$FPID"
wait "$FPID" 2>/dev/null
st=$(host_state "$MP1")
if [[ $st == dead ]]; then
    pass "layout 1: after SIGKILL the host keeps a dead mount ($(ls "$MP1" 2>&1 | head -1))"
else
    fail "layout 1: after SIGKILL the host mount is '$st', expected dead"
fi
expect "layout 1 crashed: agent A at a fresh path gets ENOTCONN (no hang)" \
    "Transport endpoint is not connected" fencefs-et-l1-agent-a 'ls /fenced/workspace'
if ! start_host; then
    info "restart over the dead mount refused: $(tail -1 "$L1/fencefs.log")"
    fusermount3 -u -z "$MP1" # the unit's ExecStopPost
    if start_host; then
        pass "layout 1: fusermount3 -u -z (ExecStopPost) clears the dead mount; fencefs mounts again"
    else
        fail "layout 1: restart after fusermount3 -u -z: $(tail -3 "$L1/fencefs.log")"
    fi
else
    fail "layout 1: fencefs mounted over a dead mount (expected a refusal)"
fi
expect "layout 1: agent A works again after the crash and restart" "README.md" \
    fencefs-et-l1-agent-a 'ls /fenced/workspace'
kill -TERM "$FPID"
wait "$FPID"
for c in fencefs-et-l1-agent-a fencefs-et-l1-agent-b; do e rm -f "$c" >/dev/null 2>&1; done
umount "$L1/run/fencefs"

# ---- 4. layout 2 --------------------------------------------------------------------------
step "4. layout 2: fencefs in a container, the agent in another"
L2=$W/l2
mkdir -p "$L2/srv/workspace" "$L2/policy"
make_ws "$L2/srv/workspace"
cp deploy/policy/policy.toml "$L2/policy/policy.toml"
share "$L2/run/fencefs"
MP2=$L2/run/fencefs/workspace
FC=fencefs-et-l2-fencefs
healthy() { # wait until the engine's health check passes
    local i
    for i in $(seq 60); do
        if [[ $ENGINE == podman ]]; then
            e healthcheck run "$FC" >/dev/null 2>&1 && return 0
        else
            [[ $(e inspect --format '{{.State.Health.Status}}' "$FC" 2>/dev/null) == healthy ]] && return 0
        fi
        sleep 0.5
    done
    return 1
}
t=$(now)
# The README's command (podman and docker take the same flags).
if ! e run -d --name "$FC" --network none "${RUNOPTS[@]}" \
    --device /dev/fuse --cap-add SYS_ADMIN --security-opt apparmor=unconfined \
    -v "$L2/srv/workspace:/srv/workspace" -v "$L2/policy:/etc/fencefs:ro" \
    --mount "type=bind,source=$L2/run/fencefs,target=/run/fencefs,bind-propagation=rshared" \
    "$IMG_FENCEFS" >/dev/null 2>"$W/l2-run.err"; then
    fail "layout 2: cannot start the fencefs container: $(cat "$W/l2-run.err")"
    exit 1
fi
if healthy; then
    pass "layout 2: fencefs container healthy ($(since "$t") s)"
else
    fail "layout 2: fencefs container not healthy: $(e logs "$FC" 2>&1 | tail -3)"
fi
if [[ $(host_state "$MP2") == live ]]; then
    pass "layout 2: the container's FUSE mount reached the host at run/fencefs/workspace"
else
    fail "layout 2: no live mount on the host at $MP2 ($(host_state "$MP2"))"
fi
agent_run fencefs-et-l2-agent "$L2/tmp" /fenced/workspace \
    --mount "type=bind,source=$L2/run/fencefs,target=/fenced,bind-propagation=rslave"
policy_checks "layout 2" fencefs-et-l2-agent "$L2/srv/workspace"
hold fencefs-et-l2-agent "$L2/tmp"
hup_check "layout 2" fencefs-et-l2-agent "$L2/tmp" "$L2/policy/policy.toml" \
    quiet e kill --signal HUP "$FC"

quiet e stop -t 20 "$FC"
rc=$(e inspect --format '{{.State.ExitCode}}' "$FC")
if [[ $rc == 0 && $(host_state "$MP2") == none ]]; then
    pass "layout 2: $ENGINE stop: fencefs exits 0, the mount is gone on the host"
else
    fail "layout 2: $ENGINE stop: exit $rc, host mount $(host_state "$MP2")"
fi
stopped_checks "layout 2 stopped" fencefs-et-l2-agent /fenced/workspace
t=$(now)
quiet e start "$FC"
if healthy && [[ $(host_state "$MP2") == live ]]; then
    pass "layout 2: $ENGINE start: healthy again ($(since "$t") s)"
else
    fail "layout 2: $ENGINE start: not healthy / no live mount"
fi
expect "layout 2 restarted: the agent sees the new mount at a fresh path and writes" \
    "README.md" fencefs-et-l2-agent 'echo a > /fenced/workspace/after-restart && ls /fenced/workspace'
XW=/ expect "layout 2 restarted: the agent's old working directory still ENOTCONN" \
    "Transport endpoint is not connected" fencefs-et-l2-agent 'ls /proc/$(cat /tmp/holder.pid)/cwd/'

# Crash: SIGKILL (what `docker rm -f` sends) leaves a dead mount on the host.
quiet e kill "$FC"
e wait "$FC" >/dev/null 2>&1
st=$(host_state "$MP2")
if [[ $st == dead ]]; then
    pass "layout 2: after $ENGINE kill (SIGKILL) the host keeps a dead mount ($(ls "$MP2" 2>&1 | head -1))"
else
    fail "layout 2: after SIGKILL the host mount is '$st', expected dead"
fi
expect "layout 2 crashed: the agent at a fresh path gets ENOTCONN (no hang)" \
    "Transport endpoint is not connected" fencefs-et-l2-agent 'ls /fenced/workspace'
quiet e start "$FC"
if healthy && [[ $(host_state "$MP2") == live ]] &&
    e logs "$FC" 2>&1 | grep -q 'detaching the dead fencefs mount'; then
    pass "layout 2: $ENGINE start after the crash: the entrypoint detaches the dead mount, fencefs mounts again"
else
    fail "layout 2: restart after the crash: $(e logs "$FC" 2>&1 | tail -3)"
fi
expect "layout 2: the agent works again after the crash and restart" "README.md" \
    fencefs-et-l2-agent 'ls /fenced/workspace'
quiet e stop -t 20 "$FC"
for c in fencefs-et-l2-agent "$FC"; do e rm -f "$c" >/dev/null 2>&1; done
umount "$L2/run/fencefs"
STEP_T_END=$(since "$STEP_T")
info "($STEP_T_END s)"
