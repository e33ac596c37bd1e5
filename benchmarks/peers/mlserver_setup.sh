#!/usr/bin/env bash
# Creates the MLServer peer's own virtual environment: benchmarks/.venvs/mlserver.
#
# MLServer is a second, independent implementation of the Open Inference Protocol (KServe v2) that the
# load generator must drive unchanged. It pins old libraries (fastapi <0.116, protobuf <7, its own
# grpcio/opentelemetry), so it never shares the project's .venv. No torch is installed here: the peer's
# models (benchmarks/peers/mlserver_model/) are plain numpy.
#
# Idempotent: a stamp file records what was installed; a second run with the same pin is a no-op.
#     bash benchmarks/peers/mlserver_setup.sh          # PY=python3.11 to choose the interpreter
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/benchmarks/.venvs/mlserver"
STAMP="$VENV/.installed"
PY="${PY:-python3}"
# The only direct requirement; pip resolves the rest from MLServer's own metadata.
# MLServer 1.7 supports Python >=3.9,<3.13.
SPEC="mlserver==1.7.*"
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() {
    echo "mlserver_setup: FAILED: $*" >&2
    exit 1
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SPEC" ]] && "$VENV/bin/python" -c "import mlserver" 2>/dev/null; then
    echo "mlserver_setup: up to date ($VENV, $SPEC)"
    exit 0
fi

start=$(date +%s)
log="$(mktemp -t mlserver_setup.XXXXXX.log)"
trap 'rm -f "$log"' EXIT

command -v "$PY" >/dev/null || fail "no $PY on PATH (set PY=python3.X, 3.9-3.12)"
"$PY" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] < (3, 13) else 1)' \
    || fail "$PY is $("$PY" -V 2>&1); MLServer 1.7 needs Python >=3.9,<3.13 (set PY=...)"

rm -f "$STAMP"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY" -m venv "$VENV" >"$log" 2>&1 || fail "$PY -m venv $VENV: $(tail -n 1 "$log")"
fi
"$VENV/bin/python" -m pip install --quiet "$SPEC" >"$log" 2>&1 \
    || fail "pip install $SPEC: $(grep -m 1 -E '^ERROR' "$log" || tail -n 1 "$log")"
"$VENV/bin/python" -c "import mlserver, mlserver.cli" >"$log" 2>&1 \
    || fail "mlserver installed but does not import: $(tail -n 1 "$log")"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    fail "torch got into $VENV; the peer must stay numpy-only"
fi

echo "$SPEC" >"$STAMP"
version="$("$VENV/bin/python" -c 'import mlserver; print(mlserver.__version__)')"
echo "mlserver_setup: installed mlserver $version in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1) in $VENV)"
