#!/usr/bin/env bash
# Installs the pinned tools that exec profiles and their tests use into the cache outside the work
# tree, so nothing is fetched when a turn runs:
#   tools/tsx-<ver>          the TypeScript runner for `script: x.ts` profiles (npm `tsx`)
#   tools/agentproc-<ver>    a virtualenv with the AgentProc P0 SDK (PyPI `agentproc`), used by the
#                            compatibility tests with third-party profile code
#   tools/acp-ts-<ver>       the official TypeScript ACP SDK (npm `@agentclientprotocol/sdk`) and
#                            `ws`, the editor of the editor-mode tests (Node 20 has no WebSocket)
# A re-run with the same versions does nothing; a version bump installs beside the old one.
# Prints the tools directory.
set -euo pipefail

TSX_VERSION="4.23.15"
AGENTPROC_VERSION="0.4.2"
ACP_TS_VERSION="2.4.0"
WS_VERSION="8.23.0"
TOOLS="${XWORKMATE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/xworkmate-bridge/tools}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$TOOLS"

# install_npm DIR CHECK PACKAGE...: the npm PACKAGEs into DIR, unless DIR already holds them (its
# .installed names them and the path CHECK inside DIR exists).
install_npm() {
  local dir="$1" check="$2"
  shift 2
  local want="$*"
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$want" ] && [ -e "$dir/$check" ]; then
    return 0
  fi
  command -v npm >/dev/null || { echo "install-profile-tools: npm not found, skipping $want" >&2; return 0; }
  rm -rf "$dir" && mkdir -p "$dir"
  echo "installing $want into $dir" >&2
  (cd "$dir" && npm init -y >/dev/null && npm install --no-audit --no-fund --loglevel=error "$@" >&2)
  echo "$want" > "$dir/.installed"
}

install_tsx() {
  install_npm "$TOOLS/tsx-$TSX_VERSION" node_modules/.bin/tsx "tsx@$TSX_VERSION"
}

install_acp_ts() {
  install_npm "$TOOLS/acp-ts-$ACP_TS_VERSION" node_modules/ws "@agentclientprotocol/sdk@$ACP_TS_VERSION" "ws@$WS_VERSION"
}

install_agentproc() {
  local dir="$TOOLS/agentproc-$AGENTPROC_VERSION" want="agentproc==$AGENTPROC_VERSION"
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$want" ] && [ -x "$dir/bin/python" ]; then
    return 0
  fi
  rm -rf "$dir"
  echo "installing $want into $dir" >&2
  "$PYTHON" -m venv "$dir"
  "$dir/bin/pip" install --quiet --disable-pip-version-check "$want" >&2
  echo "$want" > "$dir/.installed"
}

install_tsx &
install_agentproc &
install_acp_ts &
fail=0
for job in $(jobs -p); do wait "$job" || fail=1; done
[ "$fail" = 0 ] || { echo "install-profile-tools: an install failed (see above)" >&2; exit 1; }
echo "$TOOLS"
