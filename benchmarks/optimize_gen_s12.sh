#!/bin/bash
# Session 12 of `latencylab optimize --workload gen` (issue 19): the new candidates (BF16, the INT8 perplexity
# screen, KV cache dtypes, torch.compile of the decode step) beside FP32 and torch's dynamic INT8, as
# docs/benchmarks/optimize-gen.md ("Session 12") reports them:
#   /tmp/lbench benchmarks/optimize_gen_s12.sh [THREADS] [CANDIDATES]
# The same run as benchmarks/optimize_gen_s13.sh with session 12's candidates; results in
# benchmarks/results/optimize-gen-s12-tN.{txt,json}.
set -euo pipefail
SESSION=s12 exec bash "$(dirname "$0")/optimize_gen_s13.sh" "${1:-1}" \
  "${2:-int8-dynamic,bf16,int8-dynamic-screen,kv-bf16,kv-fp8,compile-decode}"
