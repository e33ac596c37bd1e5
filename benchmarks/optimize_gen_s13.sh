#!/bin/bash
# Session 13 of `latencylab optimize --workload gen` (issue 19): INT8 that tries to stay inside the fidelity
# budget (every down_proj kept FP32; SmoothQuant scales folded into the weights; the perplexity screen judged
# on validation text) beside FP32, torch's dynamic INT8 and session 12's choice (compile-decode), as
# docs/benchmarks/optimize-gen.md ("Session 13") reports them:
#   /tmp/lbench benchmarks/optimize_gen_s13.sh [THREADS] [CANDIDATES]
# Defaults: 1 thread; the full search's prompts, tokens (24) and rounds (2). Table in
# benchmarks/results/optimize-gen-sNN-tN.txt, every sample in benchmarks/results/optimize-gen-sNN-tN.json
# (SESSION=s13 by default; benchmarks/optimize_gen_s12.sh runs session 12's candidates through this script).
set -euo pipefail
cd "$(dirname "$0")/.."
export LATENCYLAB_CACHE=${LATENCYLAB_CACHE:-$PWD/.cache/latencylab} HF_HUB_OFFLINE=1 COLUMNS=260
threads=${1:-1}
only=${2:-int8-dynamic,int8-dynamic-keep-down,int8-dynamic-screen-validated,int8-smooth,int8-smooth-keep-down,int8-smooth-screen,compile-decode}
out=$(mktemp -d /tmp/optimize-gen-XXXX)
trap 'rm -rf "$out"' EXIT
res=benchmarks/results/optimize-gen-${SESSION:-s13}-t$threads
{
  echo "# latencylab optimize --workload gen --threads $threads --only $only --time-budget 420 --json $res.json"
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC')  $(nproc) CPUs  torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
  timeout 570 .venv/bin/latencylab optimize --workload gen --quiet --threads "$threads" --only "$only" \
    --time-budget 420 --out "$out/gen" --json "$res.json"
  echo "# recipe.json: $(cat "$out/gen/recipe.json" 2>/dev/null | head -c 2000 || echo none)"
} 2>&1 | tee "$res.txt"
