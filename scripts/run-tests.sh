#!/usr/bin/env bash
# Runs the whole test suite. As root, it runs inside a fresh network namespace with only the
# loopback interface up, so no agent under test can reach anything off this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTEST=(.venv/bin/python -m pytest -q "$@")
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && command -v ip >/dev/null \
   && unshare -n true 2>/dev/null; then
  echo "running tests in a loopback-only network namespace" >&2
  exec unshare -n sh -c 'ip link set lo up && exec "$@"' sh "${PYTEST[@]}"
fi
echo "running tests without a network namespace (needs root, unshare and ip)" >&2
exec "${PYTEST[@]}"
