#!/usr/bin/env bash
# Creates the Locust peer's own virtual environment: benchmarks/.venvs/locust.
#
# Locust is the reference closed-loop load generator that benchmarks/load_vs_locust.py compares the
# open-loop generator against. It brings gevent, Flask and friends, so it never shares the project's
# .venv. Nothing here pulls torch (checked below).
#
# Idempotent: a stamp file records what was installed; a second run with the same pin is a no-op.
#     bash benchmarks/peers/locust_setup.sh          # PY=python3.11 to choose the interpreter
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/benchmarks/.venvs/locust"
STAMP="$VENV/.installed"
PY="${PY:-python3}"
# The only direct requirement; pip resolves the rest (gevent, geventhttpclient, flask, ...).
SPEC="locust==2.*"
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() {
    echo "locust_setup: FAILED: $*" >&2
    exit 1
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SPEC" ]] \
    && "$VENV/bin/python" -c "import locust.contrib.fasthttp" 2>/dev/null; then
    echo "locust_setup: up to date ($VENV, $SPEC)"
    exit 0
fi

start=$(date +%s)
log="$(mktemp -t locust_setup.XXXXXX.log)"
trap 'rm -f "$log"' EXIT

command -v "$PY" >/dev/null || fail "no $PY on PATH (set PY=python3.X, >= 3.10)"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 10) else 1)' \
    || fail "$PY is $("$PY" -V 2>&1); Locust 2 needs Python >= 3.10 (set PY=...)"

rm -f "$STAMP"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY" -m venv "$VENV" >"$log" 2>&1 || fail "$PY -m venv $VENV: $(tail -n 1 "$log")"
fi
"$VENV/bin/python" -m pip install --quiet "$SPEC" >"$log" 2>&1 \
    || fail "pip install $SPEC: $(grep -m 1 -E '^ERROR' "$log" || tail -n 1 "$log")"
"$VENV/bin/python" -c "import locust, locust.contrib.fasthttp" >"$log" 2>&1 \
    || fail "locust installed but does not import: $(tail -n 1 "$log")"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    fail "torch got into $VENV; the peer must stay torch-free"
fi

echo "$SPEC" >"$STAMP"
version="$("$VENV/bin/python" -c 'import locust; print(locust.__version__)')"
echo "locust_setup: installed locust $version in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1) in $VENV)"
