#!/usr/bin/env bash
# `make test` / `make test-fast`: the tests that judge real wall-clock behaviour (marked `serial`, see
# tests/conftest.py) one at a time on a machine nothing else in the suite is using, then every other test on
# $TEST_WORKERS pytest-xdist workers (a test file per worker at a time). TEST_WORKERS=0: one process for all.
# Usage: scripts/run-tests.sh [MARK-EXPRESSION]   (e.g. "not slow"); extra pytest options via PYTEST_ADDOPTS.
set -u
py=${PYTHON:-.venv/bin/python}
expr=${1:-}
workers=${TEST_WORKERS:-2}
sel() { if [ -n "$expr" ]; then echo "($expr) and $1"; else echo "$1"; fi; }

if [ "$workers" = 0 ]; then
  if [ -n "$expr" ]; then exec "$py" -m pytest -q -m "$expr"; fi
  exec "$py" -m pytest -q
fi
start=$(date +%s)
echo "tests, part 1 of 2: the serial ones (they judge real time), one at a time"
"$py" -m pytest -q -m "$(sel serial)"
a=$?; [ "$a" = 5 ] && a=0  # 5: none selected
mid=$(date +%s)
echo "tests, part 2 of 2: the rest, on $workers workers"
"$py" -m pytest -q -n "$workers" --dist loadfile -m "$(sel 'not serial')"
b=$?; [ "$b" = 5 ] && b=0
echo "tests: part 1 took $((mid - start)) s, part 2 $(($(date +%s) - mid)) s, $(($(date +%s) - start)) s in all"
[ "$a" != 0 ] && exit "$a"
exit "$b"
