#!/bin/bash
# `transformers serve` (continuous batching) as a generative peer: a venv that sees the project's packages (the
# same transformers and CPU torch, through a .pth file) and adds what transformers[serving] needs and the project
# lacks (FastAPI, installed without dependencies: starlette, pydantic, uvicorn and openai come from the project).
# The project's venv gains nothing. Usage: bash benchmarks/peers/tfserve_setup.sh  (then
# benchmarks/gen_serve_vs_peers.py serves it as "transformers-serve").
set -eu
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/benchmarks/.venvs/tfserve"
[ -x "$VENV/bin/python" ] || "$ROOT/.venv/bin/python" -m venv --without-pip "$VENV"
SITE=$("$ROOT/.venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
MINE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$SITE" > "$MINE/latencylab_project.pth"
"$ROOT/.venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$MINE" fastapi
"$VENV/bin/python" -c "from transformers.utils.import_utils import is_serve_available as a; assert a(), 'transformers serve still lacks a dependency'"
echo "tfserve_setup: ok ($VENV)"
