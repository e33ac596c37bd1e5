#!/usr/bin/env bash
# `make test` / `make test-fast`: the tests that judge real wall-clock behaviour (marked `serial`, see
# tests/conftest.py) one at a time, then every other test on $TEST_WORKERS pytest-xdist workers (a test file per
# worker at a time). The serial tests that need the machine idle (marked `quiet`) run last in part 1, or with
# TEST_OVERLAP=1 after everything else. TEST_WORKERS=0: one process for all.
#
# Overlap (TEST_OVERLAP=1, opt-in; off by default): part 2 starts at once beside part 1, under the SCHED_IDLE
# policy: the kernel runs it only on CPU time nothing else wants, and a serial test's thread that wakes up preempts
# it at once, so part 2 runs in the half of the machine the serial tests leave idle (~7 min for the whole suite
# instead of ~13). When part 1 ends, part 2 and everything it started get the normal policy back. Not the default:
# idle-priority work still keeps the second vCPU busy, and in a clean-clone CI run two serial judgements failed
# beside it (the load generator's percentiles against the truth, the generative capacity bracket) that pass
# alone (docs/benchmarks/tests.md).
# Usage: scripts/run-tests.sh [MARK-EXPRESSION]   (e.g. "not slow"); extra pytest options via PYTEST_ADDOPTS.
set -u
py=${PYTHON:-.venv/bin/python}
expr=${1:-}
workers=${TEST_WORKERS:-2}
overlap=${TEST_OVERLAP:-0}
# Python's bytecode caches on, whatever the environment says (some images set PYTHONDONTWRITEBYTECODE): part 1 writes
# pytest's assertion-rewritten test modules (and the package's own .pyc) once, and part 2's workers and every
# server or CLI process the tests start read them instead of compiling again (~9 s of each pytest's collection)
unset PYTHONDONTWRITEBYTECODE
sel() { if [ -n "$expr" ]; then echo "($expr) and $1"; else echo "$1"; fi; }

if [ "$workers" = 0 ]; then
  if [ -n "$expr" ]; then exec "$py" -m pytest -q -m "$expr"; fi
  exec "$py" -m pytest -q
fi
chrt --idle 0 true >/dev/null 2>&1 || overlap=0  # no chrt, or the policy is not allowed here

descendants() {  # the pids under $1, depth first
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}

start=$(date +%s)
# part 1 collects only the files that may hold a serial test (tests/serial_files.py; part 2 fails the run if a
# serial test is anywhere else): collecting all ~120 files costs ~19 s without bytecode caches
p1files=$("$py" tests/serial_files.py) || { echo "tests/serial_files.py failed"; exit 2; }
export LATENCYLAB_PART1_FILES="$p1files"
part2() { "$py" -m pytest -q -n "$workers" --dist loadfile -m "$(sel 'not serial')"; }
if [ "$overlap" = 1 ]; then
  log=$(mktemp "${TMPDIR:-/tmp}/latencylab-tests-part2.XXXXXX")
  echo "tests, part 2 of 2: every test not marked serial, on $workers workers, at idle priority beside part 1 (log: $log)"
  export -f part2 sel
  export py workers expr
  chrt --idle 0 bash -c part2 >"$log" 2>&1 &
  p2=$!
  trap 'kill -- $(descendants $p2) $p2 2>/dev/null' INT TERM
fi
if [ "$overlap" = 1 ]; then p1='serial and not quiet'; else p1=serial; fi  # quiet: nothing else runs now
echo "tests, part 1 of 2: the serial ones (they judge real time), one at a time"
# shellcheck disable=SC2086  # one word per file
"$py" -m pytest -q -m "$(sel "$p1")" $p1files
a=$?; [ "$a" = 5 ] && a=0  # 5: none selected
mid=$(date +%s)
if [ "$overlap" = 1 ]; then
  for _ in 1 2; do  # twice: a process started while the first pass ran
    for pid in $p2 $(descendants "$p2"); do chrt --other --all-tasks -p 0 "$pid" >/dev/null 2>&1; done
  done
  echo "tests: part 1 done after $((mid - start)) s; part 2 back at normal priority"
  wait "$p2"
  b=$?
  cat "$log"
  rm -f "$log"
else
  echo "tests, part 2 of 2: the rest, on $workers workers"
  part2
  b=$?
fi
[ "$b" = 5 ] && b=0
c=0
if [ "$overlap" = 1 ]; then
  echo "tests, last: the serial ones that need the machine idle (marked quiet), after everything else"
  # only the modules tests/conftest.py's QUIET table names: collecting the whole suite again costs ~10 s
  quiet_files=$(cd tests && "$py" -c "import conftest; print(' '.join(sorted({'tests/' + k.split('::')[0] for k in conftest.QUIET})))" 2>/dev/null)
  # shellcheck disable=SC2086  # one word per file
  "$py" -m pytest -q -m "$(sel quiet)" $quiet_files
  c=$?; [ "$c" = 5 ] && c=0
fi
echo "tests: part 1 took $((mid - start)) s, all $(($(date +%s) - start)) s (overlap=$overlap)"
[ "$a" != 0 ] && exit "$a"
[ "$b" != 0 ] && exit "$b"
exit "$c"
