#!/usr/bin/env bash
# Runs the benchmark suite (bench/run.py): the bridge against minimal baseline servers on
# 127.0.0.1, A/B rounds, table on stdout, JSON in bench/results/latest.json. Not part of
# `make test` or CI. Arguments go to bench/run.py (--quick, --rounds N, --profile CASE, ...).
# BENCH_BRIDGE_ROOT=/path/to/a/copy benchmarks another copy of the bridge package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  echo "bench: no virtualenv at .venv; run 'make install' first" >&2
  exit 2
fi
# Bytecode for the bridge's own modules, as a wheel install has: with an editable install and
# PYTHONDONTWRITEBYTECODE set, every start would compile them again (~50 ms of case 6).
"$PY" -m compileall -q bridge orchestrator compat bench >/dev/null
# Case 7 also runs against llmwiki-serve (cached outside the work tree); without it that part is skipped.
bash scripts/install-llmwiki.sh >/dev/null 2>&1 || echo "bench: llmwiki-serve could not be installed; case 7b is skipped" >&2
# bench/run.py stops itself within its --time-limit (19 min by default); this is the backstop.
exec timeout --kill-after=30 1230 "$PY" -m bench.run "$@"
