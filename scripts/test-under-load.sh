#!/usr/bin/env bash
# The suite, RUNS times in a row (default 3), while a busy loop keeps one core at 100%: a test that
# only passes on a quiet machine fails here. Usage: make test-under-load [RUNS=3] [PYTEST_ARGS=...]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
python3 -c 'while True: pass' &
hog=$!
trap 'kill "$hog" 2>/dev/null || true' EXIT INT TERM
for i in $(seq 1 "$runs"); do
  echo "== run $i of $runs, CPU hog pid $hog"
  .venv/bin/python -m pytest -q ${PYTEST_ARGS:-}
done
