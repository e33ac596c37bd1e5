"""A pipeline of fixed CPU work, for benchmarks/compare_runs.py: its time moves with the machine's speed.

The synthetic workload busy-waits on the clock, so a slower machine does not make it slower (only
preemption does); this one does a fixed amount of interpreter work per stage, like a real pipeline's
Python and numpy code, so a host that slows down slows it down. ``--param forward_scale=1.10`` gives
the forward stage 10% more work: a real +10% regression of one stage.

    latencylab profile --pipeline _cpu_pipeline:make --param forward_scale=1.10   # with PYTHONPATH=benchmarks
"""

from __future__ import annotations

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.pipeline import Pipeline
from latencylab.workloads import WorkloadOptions

PRE_LOOP = 1_500  # ~0.1 ms on the reference VM
FORWARD_LOOP = 12_000  # ~0.85 ms
POST_ELEMENTS = 50_000


def _loop(n: int) -> int:
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFFFFF
    return x


def make(opts: WorkloadOptions) -> Pipeline:
    unknown = set(opts.params) - {"forward_scale"}
    if unknown:
        raise LatencyLabError(f"unknown param(s) {sorted(unknown)}; known: forward_scale")
    scale = float(opts.params.get("forward_scale", "1.0"))
    forward_n = round(FORWARD_LOOP * scale)
    data = np.arange(POST_ELEMENTS, dtype=np.float64)

    pipe = Pipeline(
        "cpu-work",
        source=lambda i: i,
        metadata={"pre_loop": PRE_LOOP, "forward_loop": forward_n, "post_elements": POST_ELEMENTS},
    )
    pipe.stage("preprocess", lambda i: _loop(PRE_LOOP) + i, kind="preprocess")
    pipe.stage("forward", lambda x: _loop(forward_n) ^ x, kind="forward")
    pipe.stage("postprocess", lambda x: float(data.sum()) + x, kind="postprocess")
    return pipe
