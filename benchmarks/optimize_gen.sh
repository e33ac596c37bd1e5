#!/bin/bash
# `latencylab optimize --workload gen` on SmolLM2-135M-Instruct, as docs/benchmarks/optimize-gen.md reports it:
#   /tmp/lbench benchmarks/optimize_gen.sh
# First a --quick smoke of the paths the full run takes (a failure stops here, before the long run), then the
# full search (defaults: 6 fidelity prompts and 3 timing prompts, 24 tokens, 2 rounds, 1 thread), its table in
# benchmarks/results/optimize-gen.txt, its result in benchmarks/results/optimize-gen.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export LATENCYLAB_CACHE=${LATENCYLAB_CACHE:-$PWD/.cache/latencylab} HF_HUB_OFFLINE=1 COLUMNS=260
out=$(mktemp -d /tmp/optimize-gen-XXXX)
trap 'rm -rf "$out"' EXIT
timeout 120 .venv/bin/latencylab optimize --workload gen --quick --quiet \
  --only int8-dynamic-perchannel-keep8,int8-weight,spec-int8-k3,fp32-t2 > "$out/smoke.txt"
echo "smoke ok ($(date -u +%H:%M:%S))"
{
  echo "# latencylab optimize --workload gen --out DIR --json benchmarks/results/optimize-gen.json"
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC')  $(nproc) CPUs  torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
  timeout 540 .venv/bin/latencylab optimize --workload gen --quiet --out "$out/gen" --json benchmarks/results/optimize-gen.json
  echo "# recipe.json: $(cat "$out/gen/recipe.json" 2>/dev/null | head -c 2000 || echo none)"
} 2>&1 | tee benchmarks/results/optimize-gen.txt
