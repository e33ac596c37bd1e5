#!/usr/bin/env bash
# The sample HTML report in docs/: real short runs on the vision workload, then `latencylab report`.
#
#   1. optimize: the vision CNN, a handful of torch / ONNX Runtime candidates, 3 interleaved rounds;
#   2. profile:  the vision pipeline for 5 s (stage breakdown, held to examples/budget-vision.toml);
#   3. load:     `latencylab serve --model vision` in the background; open-loop runs at 40 and 80 req/s
#                and a capacity search for p99 <= 50 ms (latency vs throughput);
#   4. ladder:   benchmarks/serve_ladder.py --quick (the SLO guard stepping down and back up);
#   5. report:   docs/report-sample.html, and a screenshot of its first screen by headless Chromium
#                (docs/img/report-sample.png).
#
# About 4 minutes on a 2-core VM. Heavy runs are serialised with the other benchmarks:
#   flock /tmp/latencylab-bench.lock scripts/make_report_sample.sh [OUT_DIR]
# OUT_DIR (default /tmp/latencylab-report-sample) keeps the result JSON files; REPORT_ONLY=1 only redraws from them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LL=("$PY" -m latencylab)
OUT=${1:-/tmp/latencylab-report-sample}
mkdir -p "$OUT" docs/img
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if [ -z "${REPORT_ONLY:-}" ]; then  # REPORT_ONLY=1: redraw the report from the JSON files of an earlier run
echo "== optimize (vision)"
"${LL[@]}" optimize --workload vision --families torch,onnxruntime \
  --only torch-int8-dynamic,ort-fp32,ort-int8-dynamic-default,ort-int8-static-minmax-perchannel \
  --rounds 3 --quiet --json "$OUT/optimize-vision.json" | tail -2

echo "== profile (vision, 5 s)"
"${LL[@]}" profile --workload vision --min-time 5 --quiet --json "$OUT/profile-vision.json" \
  --latency-budget examples/budget-vision.toml | tail -3 || true  # exit 1 = budget broken: still a sample

echo "== load (latencylab serve --model vision)"
"${LL[@]}" serve --model vision --port 0 --threads 1 >"$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  URL=$(sed -n 's/^listening \(http[^ ]*\).*/\1/p' "$OUT/serve.log" | head -1)
  [ -n "$URL" ] && break
  sleep 0.5
done
[ -n "${URL:-}" ] || { echo "server did not start:"; cat "$OUT/serve.log"; exit 1; }
# a few requests first: a fresh server has no stage metrics yet, and the run's server-side breakdown needs them
"${LL[@]}" load --url "$URL" --model vision --rate 20 --max-requests 20 --quiet >/dev/null
"${LL[@]}" load --url "$URL" --model vision --rate 40 --duration 15 --slo p99=50ms --quiet \
  --json "$OUT/load-vision-40rps.json" | tail -4
"${LL[@]}" load --url "$URL" --model vision --rate 80 --duration 10 --slo p99=50ms --quiet \
  --json "$OUT/load-vision-80rps.json" | tail -1
"${LL[@]}" load --url "$URL" --model vision --find-capacity --slo p99=50ms --start-rate 40 --max-rate 2000 \
  --step-duration 5 --precision 0.15 --quiet --json "$OUT/capacity-vision.json" | tail -2
kill "$SERVER"
wait "$SERVER" 2>/dev/null || true
trap - EXIT

echo "== SLO guard ladder (benchmarks/serve_ladder.py --quick)"
"$PY" benchmarks/serve_ladder.py --quick --plot '' --json "$OUT/serve-ladder-vision.json" | tail -1

fi

echo "== report"
"${LL[@]}" report "$OUT/profile-vision.json" "$OUT/load-vision-40rps.json" "$OUT/load-vision-80rps.json" \
  "$OUT/capacity-vision.json" \
  "$OUT/optimize-vision.json" "$OUT/serve-ladder-vision.json" --latency-budget examples/budget-vision.toml \
  --title "latencylab sample report: vision workload" -o docs/report-sample.html

CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -n "$CHROME" ]; then
  PROFILE=$(mktemp -d)
  "$CHROME" --headless --no-sandbox --disable-gpu --disable-background-networking --no-first-run \
    --disable-component-update --disable-sync --user-data-dir="$PROFILE" --hide-scrollbars \
    --screenshot="$OUT/report-sample.png" --window-size=1400,4000 "file://$PWD/docs/report-sample.html" 2>/dev/null
  rm -rf "$PROFILE"
  # 256-colour PNG: a tenth of the size, no visible loss on flat plot colours
  "$PY" -c "import sys; from PIL import Image; Image.open(sys.argv[1]).convert('RGB').quantize(256).save(sys.argv[2], optimize=True)" \
    "$OUT/report-sample.png" docs/img/report-sample.png
  echo "wrote docs/img/report-sample.png"
else
  echo "chromium not found: no screenshot (scripts/system-deps.sh installs it)"
fi
ls -l docs/report-sample.html docs/img/report-sample.png 2>/dev/null || true
