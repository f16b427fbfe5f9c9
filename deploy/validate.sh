#!/usr/bin/env bash
# Validates deploy/ as far as this machine allows and prints what was validated and
# what was SKIPPED (never a check it did not run).
#
#   deploy/validate.sh            # from anywhere; needs cargo, python3 (+ PyYAML)
#   ENGINE_TEST=0 deploy/validate.sh   # without step 6 (the real-engine test, ~10 min)
#
# What it does:
#   1. Dockerfile: the build stage's command (cargo build --release --locked), the COPY
#      sources vs the root .dockerignore, what the legacy builder cannot do (COPY --chmod,
#      a `# syntax=` line), the runtime stage's `fencefs check`, the binary's glibc needs.
#   2. fencefs.service: `systemd-analyze verify` (binary path pointed at the fresh build).
#   3. Type=notify for real: the unit's ExecStartPre propagation command (on a temporary
#      directory: it must end up a shared mount, idempotently), its ExecStart (paths swapped for temporary ones) under
#      an emulated $NOTIFY_SOCKET (python3 datagram listener): READY=1 must arrive while
#      the mount is live; then ExecReload (/bin/kill -HUP $MAINPID), the Dockerfile's
#      HEALTHCHECK command, KillSignal=SIGTERM (clean unmount, exit 0), and the
#      ExecStopPost cleanup after a SIGKILL.
#   4. compose.yaml and k8s-pod.yaml: YAML syntax and the settings that matter (devices,
#      capabilities, AppArmor, propagation); the compose-spec JSON schema when
#      COMPOSE_SCHEMA=/path/to/compose-spec.json is given and python3 has jsonschema;
#      `kubernetes-validate` (pip) when it is on PATH.
#   5. The container layouts' mount propagation, with unshare(1) instead of Docker: a
#      "fencefs container" mount namespace mounts on a directory inside an rshared bind;
#      an "agent container" namespace (rslave) sees it, as uid 1000 through setpriv,
#      whether it started before or after the mount (root only).
#   6. deploy/engine-test.sh on a real engine, when one is there (podman, or docker with
#      a reachable daemon): images built from deploy/Dockerfile, both layouts, the policy
#      from inside an agent container. Without an engine: SKIPPED, with how to run it.
# Exit status: 0 when nothing failed (things that could not be checked are listed).
# shellcheck disable=SC2016  # single-quoted scripts for sh -c / literal $MAINPID, on purpose
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD
DEPLOY=$ROOT/deploy
PY=${PYTHON:-python3}

validated=()
not_validated=()
failed=()
ok() {
    validated+=("$1")
    printf '  ok: %s\n' "$1"
}
nope() {
    not_validated+=("$1")
    printf '  SKIPPED: %s\n' "$1"
}
bad() {
    failed+=("$1")
    printf '  FAILED: %s\n' "$1" >&2
}
say() { printf '\n== %s\n' "$*"; }
# Forget a pid once it has been waited for (cleanup signals only live children we started).
forget() {
    local keep=() p
    for p in "${PIDS[@]}"; do
        [[ $p == "$1" ]] || keep+=("$p")
    done
    PIDS=("${keep[@]}")
}

WORK=$(mktemp -d /tmp/fencefs-validate.XXXXXX)
chmod 755 "$WORK"
PIDS=()
MOUNTS=()
cleanup() {
    local p m
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null
    done
    for m in "${MOUNTS[@]}"; do
        umount -l "$m" 2>/dev/null
    done
    if ! grep -qF " $WORK/" /proc/self/mountinfo; then
        rm -rf "$WORK"
    else
        echo "validate.sh: leaving $WORK (still mounted)" >&2
    fi
}
trap cleanup EXIT

# ------------------------------------------------------------------------------------
say "1. Dockerfile (build stage run as a script; the image itself: step 6)"
BIN=$ROOT/target/release/fencefs
if cargo build --release --locked --quiet; then
    ok "Dockerfile build stage: cargo build --release --locked"
    install -D -m 0755 "$BIN" "$WORK/out/fencefs"
else
    bad "cargo build --release --locked"
    echo "validate.sh: cannot go on without a build" >&2
    exit 1
fi

# COPY sources (build context = repository root) exist and are not docker-ignored.
copy_ok=1
while read -r src; do
    [[ -e $ROOT/$src ]] || {
        bad "Dockerfile COPY source '$src' missing"
        copy_ok=0
    }
    if [[ $src != . ]] && grep -qxF "$src" "$ROOT/.dockerignore"; then
        bad "Dockerfile COPY source '$src' is excluded by .dockerignore"
        copy_ok=0
    fi
done < <(awk '$1 == "COPY" && !/--from=/ { for (i = 2; i <= NF; i++) if ($i !~ /^--/) { print $i; next } }' \
    "$DEPLOY/Dockerfile")
((copy_ok)) && ok "Dockerfile COPY sources exist in the build context"

# The legacy builder (Debian's docker.io) reads only the root .dockerignore; without it
# the context holds target/ (hundreds of MB).
ign_ok=1
for want in target .git; do
    grep -qxF "$want" "$ROOT/.dockerignore" 2>/dev/null || {
        bad ".dockerignore (repository root) does not exclude $want"
        ign_ok=0
    }
done
[[ -e $DEPLOY/Dockerfile.dockerignore ]] && {
    bad "deploy/Dockerfile.dockerignore exists: BuildKit would use it instead of the root .dockerignore"
    ign_ok=0
}
((ign_ok)) && ok "root .dockerignore excludes target and .git (read by every builder)"
# What only BuildKit understands, or what needs a registry before the first FROM.
if head -1 "$DEPLOY/Dockerfile" | grep -iE '^#[[:space:]]*syntax[[:space:]]*=' ||
    grep -vE '^[[:space:]]*#' "$DEPLOY/Dockerfile" |
    grep -E -- '--chmod|^RUN --(mount|network|security)|^(COPY|ADD) --link'; then
    bad "Dockerfile uses BuildKit-only syntax (lines above): the legacy builder cannot build it"
else
    ok "Dockerfile: no '# syntax=' line, no COPY --chmod, no RUN --mount (legacy builder and BuildKit)"
fi
# Both stages on the same Debian release (the binary's glibc must exist at run time).
rust_img=$(sed -n 's/^ARG RUST_IMAGE=//p' "$DEPLOY/Dockerfile")
base_img=$(sed -n 's/^ARG BASE_IMAGE=//p' "$DEPLOY/Dockerfile")
froms=$(awk 'toupper($1) == "FROM" { print $2 }' "$DEPLOY/Dockerfile" | tr '\n' ' ')
if [[ $froms == '${RUST_IMAGE} ${BASE_IMAGE} ' && $rust_img == *rust:1-bookworm &&
    $base_img == *debian:bookworm-slim ]]; then
    ok "Dockerfile stages: RUST_IMAGE=$rust_img, BASE_IMAGE=$base_img (same Debian release)"
else
    bad "Dockerfile stages are not \${RUST_IMAGE} (rust:1-bookworm) then \${BASE_IMAGE} (debian:bookworm-slim): $froms"
fi
if command -v objdump >/dev/null 2>&1; then
    need=$(objdump -T "$BIN" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)
    if [[ -n $need ]] && printf '%s\nGLIBC_2.36\n' "$need" | sort -V -C; then
        ok "release binary needs $need, bookworm-slim has GLIBC_2.36"
    else
        bad "release binary needs $need (> bookworm's GLIBC_2.36)"
    fi
    libs=$(objdump -p "$BIN" | awk '$1 == "NEEDED" { print $2 }' | tr '\n' ' ')
    if [[ $libs =~ fuse ]]; then
        bad "binary links libfuse ($libs); the runtime stage installs only fuse3"
    else
        ok "binary needs only $libs(no libfuse; the runtime stage's fuse3 gives fusermount3)"
    fi
else
    nope "glibc/library needs of the binary (objdump missing: apt-get install binutils)"
fi
# The image's entrypoint script, with the binary pointed at the fresh build.
sed "s#^BIN=/usr/local/bin/fencefs\$#BIN=$WORK/out/fencefs#" "$DEPLOY/entrypoint.sh" >"$WORK/out/entrypoint"
chmod 755 "$WORK/out/entrypoint"
if sh -n "$DEPLOY/entrypoint.sh" && grep -q "^BIN=$WORK/out/fencefs\$" "$WORK/out/entrypoint" &&
    [[ $("$WORK/out/entrypoint" --version 2>&1) == "$("$BIN" --version 2>&1)" ]]; then
    ok "image entrypoint script: sh syntax, passes arguments through to fencefs"
else
    bad "deploy/entrypoint.sh"
fi
if "$WORK/out/entrypoint" check "$DEPLOY/policy/policy.toml" >/dev/null; then
    ok "Dockerfile runtime step: fencefs check /etc/fencefs/policy.toml (deploy/policy/policy.toml)"
else
    bad "fencefs check deploy/policy/policy.toml"
fi

# ------------------------------------------------------------------------------------
say "2. fencefs.service (systemd-analyze verify)"
UNIT=$DEPLOY/fencefs.service
if command -v systemd-analyze >/dev/null 2>&1; then
    # /usr/local/bin/fencefs is not installed here: verify a copy pointing at the build.
    mkdir -p "$WORK/unit"
    sed "s#/usr/local/bin/fencefs#$WORK/out/fencefs#g" "$UNIT" >"$WORK/unit/fencefs.service"
    if out=$(systemd-analyze verify "$WORK/unit/fencefs.service" 2>&1) && [[ -z $out ]]; then
        ok "systemd-analyze verify fencefs.service (no warnings)"
    else
        bad "systemd-analyze verify fencefs.service: $out"
    fi
else
    nope "systemd-analyze verify (no systemd-analyze: apt-get install systemd)"
fi
for want in 'Type=notify' 'ExecReload=/bin/kill -HUP $MAINPID' 'KillSignal=SIGTERM' \
    'ExecStart=/usr/local/bin/fencefs mount -p /etc/fencefs/policy.toml --allow-other /srv/workspace /run/fencefs/workspace'; do
    grep -qxF "$want" "$UNIT" || bad "fencefs.service lacks '$want'"
done
nope "the unit under a running systemd (PID 1 here is not systemd): start ordering, \
RuntimeDirectory=, Restart=; its commands are run by hand below"

# ------------------------------------------------------------------------------------
say "3. Type=notify readiness, ExecReload, KillSignal, ExecStopPost (emulated systemd)"
if [[ $(id -u) -ne 0 ]]; then
    nope "readiness/reload/stop (needs root to mount with --allow-other)"
else
    mkdir -p "$WORK/notify/srv/workspace" "$WORK/notify/run/fencefs/workspace"
    printf 'TOKEN=secret\n' >"$WORK/notify/srv/workspace/.env"
    printf 'hello\n' >"$WORK/notify/srv/workspace/README.md"
    execstart=$(sed -n 's/^ExecStart=//p' "$UNIT")
    execstart=${execstart//\/usr\/local\/bin\/fencefs/$WORK/out/fencefs}
    execstart=${execstart//\/etc\/fencefs\/policy.toml/$DEPLOY/policy/policy.toml}
    execstart=${execstart//\/srv\/workspace/$WORK/notify/srv/workspace}
    execstart=${execstart//\/run\/fencefs\/workspace/$WORK/notify/run/fencefs/workspace}
    reload=$(sed -n 's/^ExecReload=//p' "$UNIT")
    stoppost=$(sed -n 's/^ExecStopPost=-//p' "$UNIT")
    stoppost=${stoppost//\/run\/fencefs\/workspace/$WORK/notify/run/fencefs/workspace}
    MNT=$WORK/notify/run/fencefs/workspace
    # ExecStartPre: the shared directory becomes a shared mount, also where `/` is
    # private (as here); running it twice must not stack a second bind.
    prop=$(sed -n 's/^ExecStartPre=\/bin\/sh -c //p' "$UNIT")
    prop=${prop//\/run\/fencefs/$WORK/notify/prop}
    mkdir -p "$WORK/notify/prop"
    before=$(findmnt -n -o PROPAGATION -T "$WORK/notify/prop")
    if [[ -n $prop ]] && eval "sh -c $prop" && MOUNTS+=("$WORK/notify/prop") && eval "sh -c $prop" &&
        [[ $(findmnt -n -o PROPAGATION --mountpoint "$WORK/notify/prop") == shared ]] &&
        [[ $(grep -c " $WORK/notify/prop " /proc/self/mountinfo) == 1 ]]; then
        ok "ExecStartPre makes /run/fencefs a shared mount (here from '$before'), idempotently"
    else
        bad "ExecStartPre propagation command: $prop"
    fi
    # The listener plays systemd: it owns $NOTIFY_SOCKET, starts ExecStart, and reports.
    if "$PY" - "$WORK/notify" "$MNT" "$reload" "$stoppost" "$execstart" <<'EOF'; then
import os, shlex, signal, socket, subprocess, sys, time

work, mnt, reload_cmd, stoppost_cmd, execstart = sys.argv[1:6]
argv = shlex.split(execstart)
sock_path = os.path.join(work, "notify.sock")
fails = []

def mounted():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split(" ")
            if parts[4] == mnt and " - fuse.fencefs " in line:
                return True
    return False

def start():
    log = open(os.path.join(work, "daemon.log"), "ab")
    env = dict(os.environ, NOTIFY_SOCKET=sock_path, RUST_LOG="info")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

def wait_ready(p, what):
    s.settimeout(0.2)
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            msg = s.recv(4096).decode()
        except socket.timeout:
            if p.poll() is not None:
                break
            continue
        fields = dict(l.split("=", 1) for l in msg.splitlines() if "=" in l)
        if fields.get("READY") == "1":
            return fields
    fails.append(f"{what}: no READY=1 within 15 s (exit {p.poll()})")
    return None

s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sock_path)
p = start()
fields = wait_ready(p, "start")
if fields is not None:
    print(f"  READY=1 received: {fields}")
    # systemd considers the unit started now: the mount must already be serving.
    if not mounted():
        fails.append("READY=1 arrived before the mount was in /proc/self/mountinfo")
    try:
        names = sorted(os.listdir(mnt))
        print(f"  mount answers at READY: ls -> {names}")
        if ".env" in names or "README.md" not in names:
            fails.append(f"unexpected listing {names} (policy not in force?)")
    except OSError as e:
        fails.append(f"mount not answering at READY=1: {e}")
    if fields.get("MAINPID") not in (None, str(p.pid)):
        fails.append(f"MAINPID={fields.get('MAINPID')} but the main process is {p.pid}")
    # The Dockerfile's HEALTHCHECK command.
    hc = subprocess.run(["grep", "-q", " - fuse.fencefs ", "/proc/self/mountinfo"])
    if hc.returncode != 0:
        fails.append("HEALTHCHECK command failed while mounted")
    # ExecReload, with $MAINPID as systemd substitutes it.
    before = open(os.path.join(work, "daemon.log"), "rb").read().count(b"policy reloaded")
    subprocess.run(shlex.split(reload_cmd.replace("$MAINPID", str(p.pid))), check=True)
    deadline = time.time() + 10
    while time.time() < deadline:
        if open(os.path.join(work, "daemon.log"), "rb").read().count(b"policy reloaded") > before:
            print("  ExecReload: 'policy reloaded' logged")
            break
        time.sleep(0.05)
    else:
        fails.append("ExecReload (SIGHUP): no 'policy reloaded' in the log")
    # KillSignal=SIGTERM: clean unmount, exit 0.
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(15)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        fails.append("SIGTERM: still running after 15 s")
    if rc != 0:
        fails.append(f"SIGTERM: exit {rc}, want 0")
    if mounted():
        fails.append("SIGTERM: still mounted after exit")
    print(f"  KillSignal=SIGTERM: exit {rc}, mounted afterwards: {mounted()}")

    # A crash leaves a dead mount; the restart is refused until ExecStopPost detaches it.
    p = start()
    if wait_ready(p, "second start") is not None:
        p.kill()
        p.wait()
        if not mounted():
            fails.append("SIGKILL: expected a dead mount left behind")
        again = subprocess.run(argv, capture_output=True, timeout=15)
        if again.returncode == 0:
            fails.append("restart over a dead mount unexpectedly succeeded")
        print(f"  restart over the dead mount: exit {again.returncode}: "
              f"{again.stderr.decode().strip()}")
        subprocess.run(shlex.split(stoppost_cmd), check=False)
        if mounted():
            fails.append("ExecStopPost did not detach the dead mount")
        p = start()
        if wait_ready(p, "restart after ExecStopPost") is not None:
            print("  ExecStopPost (fusermount3 -u -z) made the restart work")
        p.send_signal(signal.SIGTERM)
        p.wait(15)
s.close()
if fails:
    print("\n".join("  " + f for f in fails), file=sys.stderr)
    print("  daemon log:\n" + open(os.path.join(work, "daemon.log")).read(), file=sys.stderr)
    sys.exit(1)
EOF
        ok "Type=notify: READY=1 over \$NOTIFY_SOCKET with the mount live and answering"
        ok "ExecReload=/bin/kill -HUP \$MAINPID reloads; KillSignal=SIGTERM unmounts, exit 0"
        ok "Dockerfile HEALTHCHECK command succeeds while mounted"
        ok "ExecStopPost=fusermount3 -u -z clears a crashed daemon's dead mount for Restart="
    else
        bad "Type=notify / reload / stop emulation (see above)"
    fi
fi

# ------------------------------------------------------------------------------------
say "4. compose.yaml and k8s-pod.yaml"
if ! "$PY" -c 'import yaml' 2>/dev/null; then
    nope "YAML files (python3 has no PyYAML: pip install pyyaml, or apt-get install python3-yaml)"
else
    if "$PY" - "$DEPLOY/compose.yaml" "$DEPLOY/k8s-pod.yaml" <<'EOF'; then
import sys, yaml
compose_path, k8s_path = sys.argv[1:3]
fails = []
def need(cond, what):
    if not cond:
        fails.append(what)

c = yaml.safe_load(open(compose_path))
f, a = c["services"]["fencefs"], c["services"]["agent"]
need("/dev/fuse:/dev/fuse" in f.get("devices", []), "compose: fencefs lacks /dev/fuse")
need("SYS_ADMIN" in f.get("cap_add", []) or f.get("privileged"), "compose: no SYS_ADMIN")
need(any(o.replace(":", "=") == "apparmor=unconfined" for o in f.get("security_opt", [])),
     "compose: fencefs lacks apparmor=unconfined")
fv = {v["target"]: v for v in f["volumes"] if isinstance(v, dict)}
av = {v["target"]: v for v in a["volumes"] if isinstance(v, dict)}
need(fv.get("/run/fencefs", {}).get("bind", {}).get("propagation") == "rshared",
     "compose: fencefs's /run/fencefs bind is not rshared")
need(av.get("/fenced", {}).get("bind", {}).get("propagation") in ("rslave", "rshared"),
     "compose: agent's /fenced bind is not rslave")
need(av["/fenced"]["source"] == fv["/run/fencefs"]["source"],
     "compose: agent does not bind the directory fencefs shares (survives restarts)")
need(a.get("working_dir") == "/fenced/workspace", "compose: agent working_dir")
need(a.get("init") is True, "compose: agent without init: true (sleep as PID 1 ignores SIGTERM)")
need("--allow-other" in f["command"], "compose: no --allow-other")
mp = f["command"][-1]
need(mp.startswith("/run/fencefs/") and mp != "/run/fencefs",
     "compose: the mount point must be a directory inside the bind, not its target")
need(a.get("depends_on", {}).get("fencefs", {}).get("condition") == "service_healthy",
     "compose: agent does not wait for fencefs to be healthy")

docs = [d for d in yaml.safe_load_all(open(k8s_path)) if d]
need(len(docs) == 1 and docs[0]["kind"] == "Pod", "k8s: expected one Pod")
spec = docs[0]["spec"]
side = [x for x in spec.get("initContainers", []) if x["name"] == "fencefs"]
need(side and side[0].get("restartPolicy") == "Always", "k8s: fencefs is not a native sidecar")
side = side[0]
need(side["securityContext"].get("privileged") is True, "k8s: sidecar not privileged")
sm = {m["name"]: m for m in side["volumeMounts"]}
agent = [x for x in spec["containers"] if x["name"] == "agent"][0]
am = {m["name"]: m for m in agent["volumeMounts"]}
need(sm["fenced"].get("mountPropagation") == "Bidirectional", "k8s: sidecar not Bidirectional")
need(am["fenced"].get("mountPropagation") == "HostToContainer", "k8s: agent not HostToContainer")
need("subPath" not in am["fenced"], "k8s: subPath does not carry propagated mounts")
args = " ".join(side.get("args", []))
need(sm["fenced"]["mountPath"] + "/workspace" in args, "k8s: mount point not inside the volume")
need(agent["workingDir"] == am["fenced"]["mountPath"] + "/workspace", "k8s: agent workingDir")
need(agent["securityContext"].get("runAsUser") == 1000, "k8s: agent not uid 1000")
if fails:
    print("\n".join("  " + x for x in fails), file=sys.stderr)
    sys.exit(1)
EOF
        ok "compose.yaml and k8s-pod.yaml: YAML syntax and the FUSE/propagation settings"
    else
        bad "compose.yaml / k8s-pod.yaml settings (see above)"
    fi
    if [[ -n ${COMPOSE_SCHEMA:-} ]] && "$PY" -c 'import jsonschema' 2>/dev/null; then
        if "$PY" - "$COMPOSE_SCHEMA" "$DEPLOY/compose.yaml" <<'EOF'; then
import json, sys, yaml, jsonschema
schema = json.load(open(sys.argv[1]))
errs = list(jsonschema.Draft7Validator(schema).iter_errors(yaml.safe_load(open(sys.argv[2]))))
for e in errs:
    print(f"  {list(e.path)}: {e.message}", file=sys.stderr)
sys.exit(1 if errs else 0)
EOF
            ok "compose.yaml against the compose-spec schema ($COMPOSE_SCHEMA)"
        else
            bad "compose.yaml against the compose-spec schema"
        fi
    else
        nope "compose.yaml against the compose-spec JSON schema (set COMPOSE_SCHEMA=compose-spec.json; needs python3 jsonschema)"
    fi
fi
if command -v kubernetes-validate >/dev/null 2>&1; then
    if kubernetes-validate --strict --quiet "$DEPLOY/k8s-pod.yaml"; then
        ok "k8s-pod.yaml: kubernetes-validate --strict (Pod schema)"
    else
        bad "k8s-pod.yaml: kubernetes-validate --strict"
    fi
else
    nope "k8s-pod.yaml against the Kubernetes schema (pip install kubernetes-validate)"
fi
nope "docker compose up / kubectl apply: compose.yaml and k8s-pod.yaml are not run here \
(step 6 runs the same containers with plain podman/docker run); kubelet's propagation and \
native sidecar ordering need a cluster"

# ------------------------------------------------------------------------------------
say "5. Mount propagation of the container layouts (unshare instead of Docker)"
if [[ $(id -u) -ne 0 ]] || ! command -v unshare >/dev/null || ! command -v setpriv >/dev/null; then
    nope "mount propagation emulation (needs root, unshare and setpriv from util-linux)"
else
    P=$WORK/prop
    # The "host": a shared mount holding /run/fencefs/workspace and the real workspace.
    mkdir -p "$P/host/run/fencefs/workspace" "$P/host/srv/workspace/src" \
        "$P/fencefs-ctr/run/fencefs" "$P/agent-a/fenced" "$P/agent-b/workspace"
    printf 'TOKEN=secret\n' >"$P/host/srv/workspace/.env"
    printf 'int main(void) { return 0; }\n' >"$P/host/srv/workspace/src/main.c"
    chown -R 1000:1000 "$P/host/srv/workspace"
    chmod -R a+rX "$P"
    mount --bind "$P/host" "$P/host" && MOUNTS+=("$P/host") && mount --make-shared "$P/host"
    HOSTMP=$P/host/run/fencefs/workspace
    host_mounted() { grep -q " $HOSTMP .* - fuse.fencefs " /proc/self/mountinfo; }
    # The "fencefs container": its own mount namespace; the host's /run/fencefs bound in
    # rshared (recursively, as Docker binds); then the image's entrypoint with
    # compose.yaml's command for the fencefs service (paths moved under $P), which mounts
    # FUSE on a directory inside that bind.
    mapfile -d '' ctr_argv < <("$PY" - "$DEPLOY/compose.yaml" "$P" "$WORK/out/fencefs" \
        "$DEPLOY/policy/policy.toml" "$WORK/out/entrypoint" <<'EOF'
import sys, yaml
compose, p, binary, policy, entrypoint = sys.argv[1:6]
svc = yaml.safe_load(open(compose))["services"]["fencefs"]
svc.setdefault("entrypoint", [entrypoint])
def fix(a):
    a = a.replace("$$", "$")  # compose interpolation
    a = a.replace("/usr/local/bin/fencefs", binary).replace("/etc/fencefs/policy.toml", policy)
    a = a.replace("/srv/workspace", p + "/host/srv/workspace")
    return a.replace("/run/fencefs/", p + "/fencefs-ctr/run/fencefs/")
sys.stdout.write("".join(fix(a) + "\0" for a in svc["entrypoint"] + svc["command"]))
EOF
    )
    start_fencefs() {
        unshare --mount --propagation unchanged -- sh -c '
            mount --rbind "$1/host/run/fencefs" "$1/fencefs-ctr/run/fencefs" &&
            mount --make-rshared "$1/fencefs-ctr/run/fencefs" && shift && exec "$@"
        ' sh "$P" "${ctr_argv[@]}" 2>>"$P/fencefs.log" &
        fpid=$!
        PIDS+=("$fpid")
        # Live = listed as fuse.fencefs AND answering (a crashed daemon's dead mount is
        # listed too, but says "Transport endpoint is not connected").
        for _ in $(seq 200); do
            host_mounted && ls "$HOSTMP" >/dev/null 2>&1 && return 0
            sleep 0.05
        done
        return 1
    }
    stop_fencefs() {
        kill -TERM "$fpid"
        wait "$fpid"
        local rc=$?
        forget "$fpid"
        return $rc
    }
    # Agent A (compose.yaml's agent): started BEFORE fencefs; binds the host's /run/fencefs
    # (recursively, like Docker) at /fenced with rslave and works in /fenced/workspace, as
    # uid 1000. It runs step files the script drops: 1 after the mount, 2 after a restart.
    unshare --mount --propagation slave -- sh -c '
        mount --rbind "$1/host/run/fencefs" "$1/agent-a/fenced" || exit 1
        touch "$1/agent-a.bound"
        for step in 1 2; do
            i=0
            while [ ! -e "$1/agent-a.go$step" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
            (cd "$1/agent-a/fenced/workspace" &&
             setpriv --reuid 1000 --regid 1000 --clear-groups sh -c "
                ls -A; echo step$step >> by-agent-a; cat .env 2>&1") >"$1/agent-a.out$step" 2>&1
            touch "$1/agent-a.done$step"
        done
    ' sh "$P" &
    apid=$!
    PIDS+=("$apid")
    for _ in $(seq 100); do [[ -e $P/agent-a.bound ]] && break; sleep 0.05; done
    wait_file() { for _ in $(seq 300); do [[ -e $1 ]] && return 0; sleep 0.05; done; return 1; }

    if start_fencefs; then
        ok "a FUSE mount made in the fencefs namespace under an rshared bind appears on the host"
    else
        bad "the mount did not propagate to the host: $(cat "$P/fencefs.log")"
    fi
    touch "$P/agent-a.go1"
    wait_file "$P/agent-a.done1"
    if grep -qx 'src' "$P/agent-a.out1" && grep -q '.env: No such file or directory' "$P/agent-a.out1" &&
        ! grep -q TOKEN "$P/agent-a.out1" &&
        [[ $(stat -c %u:%g "$P/host/srv/workspace/by-agent-a" 2>/dev/null) == 1000:1000 ]]; then
        ok "agent started before the mount (rslave bind of /run/fencefs) sees it; uid 1000 writes as 1000:1000; .env hidden"
    else
        bad "agent started before the mount: $(cat "$P/agent-a.out1")"
    fi
    # Agent B (the `docker run --mount …,bind-propagation=rslave` of README): binds the
    # mount point itself after the mount is up.
    if unshare --mount --propagation slave -- sh -c '
        mount --bind "$1/host/run/fencefs/workspace" "$1/agent-b/workspace" &&
        grep " $1/agent-b/workspace " /proc/self/mountinfo | grep -q " - fuse.fencefs " &&
        cd "$1/agent-b/workspace" &&
        setpriv --reuid 1000 --regid 1000 --clear-groups sh -c "echo b > by-agent-b && ! cat .env 2>/dev/null"
    ' sh "$P" && [[ $(stat -c %u:%g "$P/host/srv/workspace/by-agent-b") == 1000:1000 ]]; then
        ok "agent started after the mount (rslave bind of the mount point) works as uid 1000"
    else
        bad "agent started after the mount"
    fi
    # Restart fencefs: the unmount and the new mount both reach agent A.
    if stop_fencefs && ! host_mounted; then
        ok "SIGTERM in the fencefs namespace: exit 0, the unmount propagates to the host"
    else
        bad "stop: exit status or host still mounted: $(grep " $HOSTMP " /proc/self/mountinfo)"
    fi
    # A crash (SIGKILL) leaves a dead mount; the image's entrypoint detaches it.
    start_fencefs
    kill -KILL "$fpid"
    wait "$fpid" 2>/dev/null
    forget "$fpid"
    if host_mounted && start_fencefs; then
        ok "the image's entrypoint restarts fencefs over the dead mount a SIGKILL left"
    else
        bad "restart after SIGKILL: $(tail -3 "$P/fencefs.log")"
    fi
    touch "$P/agent-a.go2"
    wait_file "$P/agent-a.done2"
    if grep -qx 'by-agent-a' "$P/agent-a.out2" && ! grep -q TOKEN "$P/agent-a.out2" &&
        [[ $(cat "$P/host/srv/workspace/by-agent-a") == $'step1\nstep2' ]]; then
        ok "after a fencefs restart the agent binding /run/fencefs sees the new mount"
    else
        bad "agent A after the restart: $(cat "$P/agent-a.out2")"
    fi
    wait "$apid"
    forget "$apid"
    stop_fencefs || bad "final stop of fencefs"
fi

# ------------------------------------------------------------------------------------
say "6. Real container engine (deploy/engine-test.sh)"
engine=
if command -v podman >/dev/null 2>&1; then
    engine=podman
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    engine=docker
fi
if [[ ${ENGINE_TEST:-1} == 0 ]]; then
    nope "real-engine test (ENGINE_TEST=0): image build, both layouts, policy from inside an agent container"
elif [[ -z $engine ]]; then
    nope "real-engine test: no podman and no reachable docker daemon here; run \
'sudo deploy/engine-test.sh' (it installs podman from Debian's archive; ~10-15 min)"
elif [[ $(id -u) -ne 0 ]]; then
    nope "real-engine test on $engine (needs root: sudo deploy/engine-test.sh)"
else
    log=$WORK/engine-test.log
    if ENGINE=$engine "$DEPLOY/engine-test.sh" 2>&1 | tee "$log" | grep -E '^(==|  (PASS|FAIL|SKIPPED|total time)|engine-test)'; then
        ok "real-engine test on $engine: $(grep -E '^engine-test \(' "$log" | tail -1)"
    else
        bad "real-engine test on $engine: $(grep -E '^engine-test' "$log" | tail -1) (full log above)"
        tail -40 "$log"
    fi
fi

# ------------------------------------------------------------------------------------
say "summary"
printf 'validated (%d):\n' "${#validated[@]}"
printf '  - %s\n' "${validated[@]}"
printf 'SKIPPED (%d):\n' "${#not_validated[@]}"
printf '  - %s\n' "${not_validated[@]}"
if ((${#failed[@]})); then
    printf 'FAILED (%d):\n' "${#failed[@]}"
    printf '  - %s\n' "${failed[@]}"
    exit 1
fi
echo "deploy/validate.sh: nothing failed"
