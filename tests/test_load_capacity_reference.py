"""search_capacity against the reference server (a real HTTP server in its own process) with a known queue.

``--serial --service constant(5ms)``: one request computes at a time for exactly 5 ms (plus the server's
own HTTP handling), an M/D/1 queue, whose capacity at p99 <= 30 ms is simulated here (the Lindley recursion
of test_load_capacity_search). The real server is a little slower than its sleeps (HTTP parsing and the GIL
on a shared 2-vCPU machine), so the search may land below the ideal queue's capacity, never far above it.
"""

from __future__ import annotations

from typing import Any

import pytest

from latencylab.load.arrivals import Poisson
from latencylab.load.capacity import SearchConfig, Segment, search_capacity
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.results import Slo
from latencylab.load.runner import load_test
from servers import reference_server
from test_load_capacity_search import md1_truth

pytestmark = pytest.mark.slow


def test_search_finds_the_md1_capacity_of_a_single_worker_reference_server() -> None:
    truth = md1_truth(0.005, 0.030)  # ~125/s
    slo = Slo.parse("p99=30ms")
    cfg = SearchConfig(
        start_rate=80.0, chunk_s=1.25, warmup_s=0.25, max_chunks=4, search_warmup_s=1.0, precision=0.2,
        max_steps=10, invalid_retries=1, max_late_fraction=0.05,
    )  # fmt: skip
    # 80/s (passes: 40% busy) -> 160/s (fails: 80% busy) -> 120 -> 100 or 140: four steps, a 20% bracket around the
    # ~125/s truth. The queue's time scale is half that of a 10-ms server judged at 60 ms (62/s): the same number
    # of requests per step, and the same queueing law, in half the time (it was 54 s of the serial test tier)
    with reference_server("--service", "constant(5ms)", "--serial") as url:
        path = infer_path("reference")
        payloads = payloads_for_model(fetch_metadata(url, "reference"), n=16)

        def measure(rate: float, seconds: float, seed: int, abort: Any) -> Segment:
            # spin: a sleeping generator here (a KVM guest) sends 4-7% of requests > 1 ms late even on a quiet
            # machine, which invalidates a step; this test judges the server's queue, not the send timing
            lc = LoadConfig(duration_s=seconds, timeout_s=10.0, connections=16, spin="on")
            res, rec = load_test(url, path, payloads, Poisson(rate, seed), lc, slo, seed=seed, abort_when=abort, env={})
            return Segment.from_run(rate, res, rec)

        cap = search_capacity(measure, slo, cfg, seed=1)
    invalid = [s["why"] for s in cap.steps if s["verdict"] == "invalid"]
    if cap.generator_bound or (invalid and (cap.capacity_rate or 0) < 0.5 * truth):
        # Every chunk of those steps was invalidated by the generator itself (> 5% of sends > 1 ms late): on 2
        # cores that other processes keep busy, the search measured the generator, not the server; it says so,
        # and what it passed is still a lower bound of the truth.
        assert cap.capacity_rate is None or cap.capacity_rate <= 1.1 * truth, (cap.capacity_rate, cap.reason)
        pytest.skip(f"the generator fell behind (a busy machine): {cap.reason}")
    assert cap.capacity_rate is not None, cap.reason
    # The noise first: the server's real cost a request. At 80/s (40% busy) a request finds the server idle with
    # probability 0.6, so the first step's median latency is its whole cost (5 ms of service + HTTP and Python).
    # On a slowed host (this VM's speed moves by +/-37%) that cost grows and the true capacity with it falls: a CI
    # run measured 80/s passing and 90/s failing against the nominal 125/s. The lower bound is judged against the
    # truth of the measured cost; a host where a request costs over twice the nominal 5 ms is skipped, with why.
    first = cap.steps[0]
    assert first["offered_rate"] == cfg.start_rate, cap.steps
    cost_s = (first.get("p50_ms") or 0.0) / 1e3
    if cost_s > 0.010:
        pytest.skip(f"a request costs {cost_s * 1e3:.1f} ms at 40% load (5 ms nominal): the host is too slow now")
    measured_truth = md1_truth(max(cost_s, 0.005), 0.030)
    assert 0.7 * measured_truth <= cap.capacity_rate <= 1.1 * truth, (
        cap.capacity_rate, truth, measured_truth, cost_s, cap.reason,
    )  # fmt: skip
    assert any(s["verdict"] == "fail" for s in cap.steps) and any(s["passed"] for s in cap.steps)
    assert all(s["measured_s"] <= s["chunks"] * (cfg.chunk_s - cfg.warmup_s) + 1e-9 for s in cap.steps)
