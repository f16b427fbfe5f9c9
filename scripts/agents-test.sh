#!/usr/bin/env bash
# agents-test.sh: real agent CLIs, unchanged, under `fencefs run --live` (issue 35).
#
# Installs Claude Code and Codex CLI from the npm registry into target/agents-npm (apt-get
# installs nodejs/npm when missing), builds the release binary, and for each agent:
#   - makes a demo workspace, a git repo owned by uid 1000 with README.md, notes.txt and a
#     .env holding a fresh secret token (git-ignored, as a real project has it);
#   - starts scripts/agents/mock_model.py on 127.0.0.1, which speaks the agent's wire
#     protocol (Anthropic Messages for Claude Code, OpenAI Responses for Codex), answers
#     from a fixed script of tool calls with the agent's own tool names (list the files,
#     `cat .env`, an edit with the agent's edit tool, `sed -i`, `git add -A && git commit`,
#     a final answer) and logs every request body;
#   - runs the agent's non-interactive command as uid 1000, with a HOME of its own, under
#     `fencefs run --live --`, in a private mount namespace of this script where
#     /dev/fuse is a 0666 node bound over the host's (as tests/common/run.rs does);
#   - checks: the agent exited 0, both edits are in the workspace, the commit exists and
#     holds them, `cat .env` answered "No such file or directory", and the secret token
#     is in no request the model server received.
# Prints one PASS/FAIL/SKIPPED line per agent (SKIPPED: the agent cannot run here at all,
# e.g. its npm install or native binary fails, with the reason) and exits 1 if any agent
# failed or none passed. Each agent's files stay in target/agents-test/AGENT/ for a look:
# requests.jsonl (every request), transcript (what the model answered, turn by turn),
# agent.out/agent.err, ws/ and home/.
# Needs root (for the private /dev/fuse node and setpriv) and the npm registry; slow (a
# few minutes), so it is not part of scripts/test.sh.
#
# Usage: scripts/agents-test.sh [--unfenced | --staged] [claude] [codex]  (default: both)
#   --unfenced  the control: the same runs without `fencefs run`; every agent must FAIL
#               (the token reaches the model, `cat .env` reads it, no 'fenced' line),
#               which shows the checks can fail.
#   --staged    `fencefs run` without --live (its default: staged, as uid 1000, no root):
#               the workspace must be untouched when the agent exits; then uid 1000 runs
#               `fencefs stage apply --dir` on the run's staging area and the same checks
#               as live must hold (edits, commit, .env, token).
# Env:   AGENTS_TEST_TIMEOUT  seconds per agent run (default 300)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/target/agents-test
PREFIX=$ROOT/target/agents-npm
MOCK=$ROOT/scripts/agents/mock_model.py
BIN=$ROOT/target/release/fencefs
AGENT_UID=1000
TIMEOUT=${AGENTS_TEST_TIMEOUT:-300}
PROMPT="Tidy up this demo project: edit README.md and notes.txt, then commit."

UNFENCED= LIVE=--live
if [ "${1:-}" = --unfenced ]; then UNFENCED=1; shift; fi
if [ "${1:-}" = --staged ]; then LIVE=; shift; fi
if [ "$#" -gt 0 ]; then AGENTS=("$@"); else AGENTS=(claude codex); fi

say() { printf 'agents-test: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root: it binds a private 0666 /dev/fuse and runs the agents as uid $AGENT_UID"

# --- What the machine needs -------------------------------------------------------------

need=()
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
command -v python3 >/dev/null || need+=(python3)
command -v git >/dev/null || need+=(git)
command -v setpriv >/dev/null || need+=(util-linux)
if [ "${#need[@]}" -gt 0 ]; then
  say "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! getent passwd "$AGENT_UID" >/dev/null; then
  say "no user with uid $AGENT_UID: creating fencefs-agent"
  useradd -u "$AGENT_UID" -U -m -s /bin/bash fencefs-agent
fi
AGENT_GID=$(getent passwd "$AGENT_UID" | cut -d: -f4)

RESULTS=()
FAILED=0
PASSED=0
declare -A SKIP=()
declare -A PKG=([claude]=@anthropic-ai/claude-code [codex]=@openai/codex)
mkdir -p "$PREFIX"
for a in "${AGENTS[@]}"; do
  [ -n "${PKG[$a]:-}" ] || die "unknown agent '$a' (known: ${!PKG[*]})"
  if [ ! -x "$PREFIX/node_modules/.bin/$a" ]; then
    say "npm install ${PKG[$a]} into $PREFIX"
    npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error "${PKG[$a]}" \
      >"$PREFIX/install-$a.log" 2>&1 ||
      SKIP[$a]="npm install ${PKG[$a]} failed: $(tail -1 "$PREFIX/install-$a.log")"
  fi
  # The agent's native binary must run here at all (libc, CPU, a platform package).
  if [ -z "${SKIP[$a]:-}" ] && ! "$PREFIX/node_modules/.bin/$a" --version >"$PREFIX/version-$a" 2>&1; then
    SKIP[$a]="'$a --version' fails here: $(head -1 "$PREFIX/version-$a")"
  fi
done

say "cargo build --release"
(cd "$ROOT" && cargo build --release --quiet)

rm -rf "$OUT"
mkdir -p "$OUT"
chmod 0755 "$OUT"

# --- Cleanup: only what this script started, by pid ---------------------------------------

MOCK_PID=
# shellcheck disable=SC2317 # invoked by the EXIT trap
stop_mock() {
  if [ -n "$MOCK_PID" ]; then
    kill "$MOCK_PID" 2>/dev/null || true
    wait "$MOCK_PID" 2>/dev/null || true
    MOCK_PID=
  fi
}
trap stop_mock EXIT

# --- One agent ----------------------------------------------------------------------------

# make_workspace DIR TOKEN: the demo project, owned by uid 1000.
make_workspace() {
  local ws=$1 token=$2
  mkdir -p "$ws/src"
  printf '# Demo\n\nHello from the demo.\n' >"$ws/README.md"
  printf 'title: demo notes\nstatus: draft\n' >"$ws/notes.txt"
  printf 'def main():\n    print("demo")\n' >"$ws/src/app.py"
  printf '.env\n' >"$ws/.gitignore"
  printf 'TOKEN=%s\n' "$token" >"$ws/.env"
  chmod 0600 "$ws/.env"
  git -C "$ws" init -q -b main
  git -C "$ws" config user.name "Demo Agent"
  git -C "$ws" config user.email "agent@example.invalid"
  git -C "$ws" add -A
  git -C "$ws" commit -q -m "demo: initial"
  chown -R "$AGENT_UID:$AGENT_GID" "$ws"
}

# configure AGENT HOME PORT: the agent's own configuration in its HOME, pointed at the
# mock; prints the environment (NAME=VALUE lines) its run needs.
configure() {
  local agent=$1 home=$2 port=$3
  case $agent in
    claude)
      printf '%s\n' "ANTHROPIC_BASE_URL=http://127.0.0.1:$port" \
        "ANTHROPIC_API_KEY=sk-ant-mock-key" \
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1" "DISABLE_AUTOUPDATER=1"
      ;;
    codex)
      mkdir -p "$home/.codex"
      python3 - "$home/.codex/mock-models.json" <<'EOF'
import json, sys
level = lambda e: {"effort": e, "description": e}
model = {
    "slug": "mock-model", "display_name": "mock-model", "description": "scripted",
    "base_instructions": "You are a coding agent working in the user's workspace.",
    "default_reasoning_level": "low", "supported_reasoning_levels": [level("low")],
    "shell_type": "shell_command", "apply_patch_tool_type": "freeform",
    "visibility": "list", "supported_in_api": True, "priority": 1,
    "context_window": 200000, "truncation_policy": {"mode": "tokens", "limit": 10000},
    "supports_parallel_tool_calls": False, "prefer_websockets": False,
    "input_modalities": ["text"], "experimental_supported_tools": [],
    "supports_reasoning_summaries": False, "support_verbosity": False,
}
json.dump({"models": [model]}, open(sys.argv[1], "w"), indent=1)
EOF
      cat >"$home/.codex/config.toml" <<EOF
model = "mock-model"
model_provider = "mock"
model_catalog_json = "$home/.codex/mock-models.json"
check_for_update_on_startup = false

[model_providers.mock]
name = "mock"
base_url = "http://127.0.0.1:$port/v1"
wire_api = "responses"
env_key = "MOCK_API_KEY"
EOF
      printf '%s\n' "MOCK_API_KEY=mock-key"
      ;;
  esac
}

# command_of AGENT: the agent's non-interactive command line (NUL-separated).
command_of() {
  local bin=$PREFIX/node_modules/.bin/$1
  case $1 in
    claude) printf '%s\0' "$bin" -p "$PROMPT" --dangerously-skip-permissions ;;
    codex) printf '%s\0' "$bin" exec --skip-git-repo-check \
      --dangerously-bypass-approvals-and-sandbox --color never "$PROMPT" ;;
  esac
}

# The private namespace's script: a 0666 /dev/fuse of its own, then uid 1000 and
# `fencefs run --live -- COMMAND` in the workspace. $1.. is COMMAND; $ENVFILE the
# agent's NAME=VALUE lines.
# shellcheck disable=SC2016 # expanded by the inner shell
AS_AGENT='set -e
mount -t tmpfs -o size=64k,mode=0755 agents-test-dev "$DEV"
mknod -m 0666 "$DEV/fuse" c 10 229
mount --bind "$DEV/fuse" /dev/fuse
cd "$WS"
[ -n "$UNFENCED" ] || set -- "$BIN" run $LIVE -- "$@"
set -- env -i PATH="$NPMBIN:/usr/local/bin:/usr/bin:/bin" HOME="$AHOME" \
  XDG_RUNTIME_DIR="$RUNDIR" LANG=C.UTF-8 USER="$AUSER" LOGNAME="$AUSER" SHELL=/bin/bash \
  $(cat "$ENVFILE") "$@"
exec setpriv --reuid "$AUID" --regid "$AGID" --clear-groups "$@"'

# left_behind: the pids of any process still running this fencefs binary or an agent
# binary from PREFIX (the run's namespaces must have taken them all down).
left_behind() {
  local p exe out=()
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case $exe in "$BIN" | "$PREFIX"/*) out+=("${p#/proc/} ($exe)") ;; esac
  done
  echo "${out[*]}"
}

run_agent() {
  local agent=$1 dir=$OUT/$1
  local ws=$dir/ws home=$dir/home log=$dir/requests.jsonl
  local token port rc=0 why=()
  mkdir -p "$dir" "$home" "$dir/run" "$dir/dev"
  token="fencefs-secret-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
  make_workspace "$ws" "$token"
  : >"$log"

  python3 "$MOCK" --log "$log" --port-file "$dir/port" --workspace "$ws" \
    >"$dir/mock.out" 2>&1 &
  MOCK_PID=$!
  for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.1; done
  if [ ! -s "$dir/port" ]; then
    stop_mock
    RESULTS+=("FAIL $agent: the mock model server did not start ($dir/mock.out)")
    FAILED=1
    return
  fi
  port=$(cat "$dir/port")

  configure "$agent" "$home" "$port" >"$dir/env"
  chown -R "$AGENT_UID:$AGENT_GID" "$home" "$dir/run"
  chmod 0700 "$dir/run"

  local cmd=()
  mapfile -d '' cmd < <(command_of "$agent")
  say "$agent: running ${UNFENCED:+UNFENCED, not }under fencefs run ${LIVE:-(staged)} (files: $dir/)"
  local t0 t1
  t0=$(date +%s.%N)
  DEV=$dir/dev WS=$ws NPMBIN=$PREFIX/node_modules/.bin AHOME=$home RUNDIR=$dir/run \
    AUSER=$(getent passwd "$AGENT_UID" | cut -d: -f1) ENVFILE=$dir/env BIN=$BIN \
    AUID=$AGENT_UID AGID=$AGENT_GID UNFENCED=$UNFENCED LIVE=$LIVE \
    timeout -k 5 "$TIMEOUT" unshare -m --propagation private sh -c "$AS_AGENT" as-agent \
    "${cmd[@]}" </dev/null >"$dir/agent.out" 2>"$dir/agent.err" || rc=$?
  t1=$(date +%s.%N)
  stop_mock

  # The checks.
  [ "$rc" -eq 0 ] || why+=("exit status $rc (see $dir/agent.err)")
  if [ -z "$LIVE" ] && [ -z "$UNFENCED" ]; then
    # Staged: nothing reached the workspace; uid 1000 applies what the run staged.
    grep -qx "Hello from the demo." "$ws/README.md" || why+=("a staged run changed README.md on the host")
    local stage
    stage=$(ls -d "$home"/.local/state/fencefs/*/stage 2>/dev/null | head -1)
    if [ -z "$stage" ]; then
      why+=("no staging area under $home/.local/state/fencefs")
    else
      setpriv --reuid "$AGENT_UID" --regid "$AGENT_GID" --clear-groups \
        env -i PATH=/usr/bin:/bin HOME="$home" "$BIN" stage status --dir "$stage" >"$dir/stage.status" 2>&1 || true
      setpriv --reuid "$AGENT_UID" --regid "$AGENT_GID" --clear-groups \
        env -i PATH=/usr/bin:/bin HOME="$home" "$BIN" stage apply --dir "$stage" >"$dir/stage.apply" 2>&1 ||
        why+=("stage apply as uid $AGENT_UID failed ($dir/stage.apply)")
    fi
  fi
  grep -qF "fencefs: fenced $ws (" "$dir/agent.err" || why+=("no 'fencefs: fenced' line: was it fenced?")
  grep -qx "Hello from the demo, edited by $agent." "$ws/README.md" ||
    why+=("README.md not edited by the agent's edit tool")
  grep -qx "status: reviewed" "$ws/notes.txt" || why+=("notes.txt not edited by sed -i")
  # As root in uid 1000's repository: git wants it named safe.
  local git=(git -c safe.directory="$ws" -C "$ws")
  if [ "$("${git[@]}" log -1 --format=%s 2>/dev/null)" = "agent: edit README.md and notes.txt" ]; then
    local files
    files=$("${git[@]}" show --name-only --format= HEAD | sort | tr '\n' ' ')
    [ "$files" = "README.md notes.txt " ] || why+=("the commit holds '$files', not README.md notes.txt")
  else
    why+=("no commit by the agent")
  fi
  [ -z "$("${git[@]}" status --porcelain 2>&1)" ] ||
    why+=("the workspace is not clean after the commit: $("${git[@]}" status --porcelain 2>&1 | tr '\n' ' ')")
  grep -qx "TOKEN=$token" "$ws/.env" || why+=(".env changed on the host")
  if grep -qF " $ws " /proc/self/mountinfo; then why+=("a mount is left at $ws"); fi
  local left
  left=$(left_behind)
  [ -z "$left" ] || why+=("processes left running: $left")
  grep -q 'cat: .env: No such file or directory' "$log" ||
    why+=("'cat .env' did not answer ENOENT to the agent")
  if grep -q "$token" "$log"; then why+=("the secret token reached the model"); fi
  local requests turns
  requests=$(wc -l <"$log")
  turns=$(python3 -c 'import json, sys
print(sum(1 for l in open(sys.argv[1]) if (json.loads(json.loads(l)["body"] or "{}") or {}).get("tools")))' "$log")
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  # What the model answered, turn by turn, for the record.
  python3 -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r["method"], r["path"], len(r["body"]), "bytes ->", r.get("answer", "-"))' "$log" \
    >"$dir/transcript"
  if [ "${#why[@]}" -eq 0 ]; then
    PASSED=$((PASSED + 1))
    RESULTS+=("PASS $agent ($(head -1 "$PREFIX/version-$agent")): $secs s, $requests requests to the model ($turns with tools), edits and commit landed, cat .env ENOENT, token in no request")
  else
    local list
    list=$(printf '%s; ' "${why[@]}")
    RESULTS+=("FAIL $agent: $secs s, $requests requests to the model: ${list%; }")
    FAILED=1
  fi
}

for a in "${AGENTS[@]}"; do
  if [ -n "${SKIP[$a]:-}" ]; then
    RESULTS+=("SKIPPED $a: ${SKIP[$a]}")
  else
    run_agent "$a"
  fi
done
for r in "${RESULTS[@]}"; do echo "$r"; done
# Any failure fails; so does a run where no agent could be tried at all.
[ "$FAILED" -eq 0 ] && [ "$PASSED" -gt 0 ]
