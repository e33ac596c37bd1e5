"""What thread oversubscription costs, measured: the pipeline as it runs vs with one thread per usable CPU.

Algorithm: two copies of the pipeline (no probe, no close) are profiled in ``ROUNDS`` interleaved rounds
(``profile_interleaved``, randomised order per round, ``ROUND_S`` seconds of timed iterations per run after
``WARMUP`` warm-up iterations); before each run torch's intra-op threads are set to the count the pipeline
ran with (side A) or to the usable CPUs (side B), and after each run the count in force is read back. When
the pipeline resets its own thread count during a run (it calls ``torch.set_num_threads`` on every call),
or torch is not imported (the threads come from env vars, fixed at start-up), nothing can be measured and
the answer says why. The figures are the end-to-end p50 and p99 of each side over all its runs.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import numpy as np

from latencylab.pipeline import Pipeline

ROUNDS = 3
ROUND_S = 0.5
WARMUP = 3


def measure_thread_cost(pipe: Pipeline, cpus: int) -> dict[str, Any]:
    """{"measured": bool, "why" | "threads", "cpus", "p50_ms", "p50_fixed_ms", "p99_ms", "p99_fixed_ms"}."""
    from latencylab.profiler import ProfileConfig, profile_interleaved

    torch = sys.modules.get("torch")
    if torch is None:
        return {"measured": False, "why": "torch is not imported: the threads come from env vars fixed at start-up"}
    as_run = int(torch.get_num_threads())
    if as_run <= cpus:
        return {"measured": False, "why": f"torch runs {as_run} intra-op thread(s) now, not more than {cpus} CPUs"}
    target = {0: as_run, 1: cpus}
    ended: list[tuple[int, int]] = []
    last: list[int] = []

    def before_run(k: int, _r: int) -> None:
        if last:
            ended.append((last[0], int(torch.get_num_threads())))
        torch.set_num_threads(target[k])
        last[:] = [k]

    sides = [replace(pipe, probe=None, close=None), replace(pipe, probe=None, close=None)]
    try:
        cfg = ProfileConfig(warmup=WARMUP, min_time_s=ROUND_S, runs=ROUNDS)
        res = profile_interleaved(sides, cfg, env={}, canary=False, before_run=before_run)
        if last:
            ended.append((last[0], int(torch.get_num_threads())))
    finally:
        torch.set_num_threads(as_run)
    if any(got != target[k] for k, got in ended):
        return {"measured": False, "why": "the pipeline sets its own thread count while it runs"}
    a, b = (r.end_to_end_ns().astype(np.float64) / 1e6 for r in res)
    return {
        "measured": True,
        "threads": as_run,
        "cpus": cpus,
        "p50_ms": float(np.median(a)),
        "p50_fixed_ms": float(np.median(b)),
        "p99_ms": float(np.quantile(a, 0.99)),
        "p99_fixed_ms": float(np.quantile(b, 0.99)),
        "n": [int(a.size), int(b.size)],
    }
