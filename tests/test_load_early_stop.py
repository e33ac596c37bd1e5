"""The early-stop rule: few looks, and a miss count that one burst cannot turn into a verdict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from latencylab import stats
from latencylab.load.arrival_trace import TraceReplay
from latencylab.load.capacity_steps import grid_capacity
from latencylab.load.early_stop import EarlyStop, Progress, block_t_violated
from latencylab.load.generator import LoadConfig
from latencylab.load.payloads import fetch_metadata, payloads_for_model
from latencylab.load.results import LoadResult, Slo
from latencylab.load.runner import load_test
from servers import reference_server

PATH = "/v2/models/reference/infer"


def _progress(block_n: list[int], block_over: list[int], elapsed: float, planned: float | None = 12.0) -> Progress:
    return Progress(sum(block_n), sum(block_over), elapsed, planned, tuple(block_n), tuple(block_over))


def test_one_burst_is_not_a_verdict_but_a_growing_queue_is() -> None:
    # 8 of the first 30 over, then nothing: the old per-request binomial called that a violation at 99%
    # (P[X >= 8 | n=270, p=0.01] ~ 1e-4); as blocks it is one bad second out of nine.
    burst = _progress([30] * 9, [8] + [0] * 8, 9.5)
    assert EarlyStop(0.99)(burst) == ""
    assert not block_t_violated([30] * 9, [8] + [0] * 8, 0.01, 0.01 / 3)
    # Every block mostly over: violated, and the reason says when.
    growing = _progress([30] * 5, [20, 27, 30, 30, 30], 6.0)
    reason = EarlyStop(0.99)(growing)
    assert reason.startswith("SLO violated with 99% confidence after 150 requests")
    # Misses spread over every block at 5%: the t-test agrees with the binomial.
    spread = _progress([40] * 6, [2, 3, 2, 2, 1, 2], 7.0)
    assert EarlyStop(0.99)(spread) != ""


def test_looks_are_few_and_fixed() -> None:
    rule = EarlyStop(0.99)
    hopeless = [30, 30, 30, 30]
    assert rule(_progress(hopeless, hopeless, 2.9)) == ""  # before 25% of 12 s: no look at all
    assert rule(_progress(hopeless, hopeless, 3.0)) != ""  # the first look
    rule = EarlyStop(0.99)
    assert rule(_progress([30] * 3, [0] * 3, 3.0)) == ""  # first look spent on a clean run
    assert rule(_progress([30] * 4, [0] * 4, 4.0)) == ""  # no look due until 6 s, whatever the counts
    assert rule(_progress([30] * 4, [30] * 4, 4.0)) == ""
    assert rule(_progress([30] * 6, [30] * 6, 6.0)) != ""
    # A counted run (no planned duration) looks at 100, 200, 400 completions.
    rule = EarlyStop(0.99)
    assert rule(_progress([33] * 3, [33] * 3, 3.0, None)) == ""  # 99 completions
    assert rule(_progress([34] * 3, [34] * 3, 3.0, None)) != ""


def test_met_needs_enough_clean_completions() -> None:
    rule = EarlyStop(0.99, decide_met=True)
    assert rule(_progress([100] * 3, [0] * 3, 3.0)) == ""  # 300 clean: not enough for p99 at 99%/3
    assert rule(_progress([100] * 6, [0] * 6, 6.0)).startswith("SLO met with 99% confidence after 600")


def test_bad_confidence() -> None:
    with pytest.raises(ValueError, match="confidence"):
        EarlyStop(0.99, confidence=1.0)


def test_a_burst_at_the_start_of_a_real_run_does_not_stop_it(tmp_path: Path) -> None:
    """A real server, 10 ms per request one at a time: 12 requests at t=0 queue up to 120 ms, then 30/s is
    easy. The old rule stopped this run after about ten completions; now it runs to its end."""
    trace = tmp_path / "burst.csv"
    times = [0.0] * 12 + [0.5 + i / 30 for i in range(30 * 5)]
    trace.write_text("t_s\n" + "".join(f"{t:.4f}\n" for t in times))
    slo = Slo.parse("p99=60ms")
    with reference_server("--service", "constant(10ms)", "--serial") as url:
        payloads = payloads_for_model(fetch_metadata(url, "reference"), 4)
        res, rec = load_test(
            url, PATH, payloads, TraceReplay(trace), LoadConfig(duration_s=5.6), slo=slo,
            abort_when=EarlyStop(slo.q), env={},
        )  # fmt: skip
    s = res.summary
    assert not s.get("stopped_early")
    assert s["sent"] == len(times) and s["sent"] == s["ok"] + s["shed"] + s["error"]
    # The old rule (binomial on every completion so far, from the tenth on) would have stopped it early.
    order = np.argsort(rec.done_ns)
    over = (rec.done_ns - rec.intended_ns)[order] > slo.threshold_ns
    cum = np.cumsum(over)
    assert any(stats.slo_violated(n, int(cum[n - 1]), slo.q, 0.99) for n in range(10, 30))
    # ... and the whole run's verdict still counts the burst.
    assert s["slo"]["over"] == int(over.sum()) >= 4


def _result(p99_ms: float) -> LoadResult:
    summary = {"valid": True, "sent": 100, "ok": 100, "shed": 0, "error": 0, "p99_ms": p99_ms, "goodput": 10.0}
    return LoadResult(target={}, arrivals=None, config={}, summary=summary, histograms={}, timeline=(), env={})


def test_grid_capacity_is_the_highest_rate_below_the_first_failure() -> None:
    """Every server runs the same grid: a pass above a failure (a lucky sample) does not raise the capacity, and
    two failures in a row end the run."""
    p99 = {10.0: 40.0, 20.0: 60.0, 30.0: 120.0, 40.0: 90.0, 50.0: 150.0, 60.0: 170.0, 70.0: 1.0}
    ran: list[float] = []

    def step(rate: float, abort_when: object) -> LoadResult:
        assert isinstance(abort_when, EarlyStop)  # a fresh rule per step
        ran.append(rate)
        return _result(p99[rate])

    cap = grid_capacity(step, Slo.parse("p99=100ms"), [70, 10, 30, 20, 40, 50, 60])
    assert ran == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert cap.capacity_rate == 20.0 and cap.goodput == 10.0
    assert cap.reason == "passes every rate up to 20/s, first fails at 30/s"
    assert [s["passed"] for s in cap.steps] == [True, True, False, True, False, False]
    with pytest.raises(ValueError, match="positive"):
        grid_capacity(step, Slo.parse("p99=100ms"), [])
