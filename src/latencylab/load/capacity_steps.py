"""Capacity from single runs: one run per offered rate, judged once (the older steps; the reproducible search
is ``latencylab.load.capacity.search_capacity``).

``find_capacity`` (bracket, then bisect) and ``grid_capacity`` (a fixed grid) run one step per rate with a
fixed early-stop rule; ``benchmarks/serve_vs_peers.py`` compares servers with them on common random numbers. A
step passes when the run is valid, its ``slo.q`` latency (from the intended send time) is within the
threshold, and at most ``max_error_fraction`` of requests were shed or failed. The capacity is the highest
passing offered rate and ``goodput`` (successful requests within the SLO per second) the best among passing
steps. Each rate gets its own arrival seed (``latencylab.load.capacity.step_seed``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from latencylab import stats
from latencylab.load.capacity import Capacity
from latencylab.load.early_stop import EarlyStop
from latencylab.load.generator import AbortFn
from latencylab.load.results import LoadResult, Slo

StepFn = Callable[[float, AbortFn], LoadResult]


def step_passes(result: LoadResult, slo: Slo, max_error_fraction: float) -> tuple[bool, str]:
    s = result.summary
    if not s.get("valid", False):
        return False, "invalid run: " + "; ".join(s.get("invalid_reasons", []))
    if s.get("stopped_early"):
        return False, str(s["stopped_early"])
    sent = s.get("sent", 0) or 1
    bad = (s.get("shed", 0) + s.get("error", 0)) / sent
    if bad > max_error_fraction:
        return False, f"{bad:.1%} shed or failed (limit {max_error_fraction:.0%})"
    key = stats.format_q(slo.q).replace(".", "_") + "_ms"
    value = s.get(key)
    if value is None:
        return False, "no successful request"
    if value * 1e6 > slo.threshold_ns:
        return False, f"{stats.format_q(slo.q)} {value:.1f} ms > {slo.threshold_ns / 1e6:g} ms"
    return True, f"{stats.format_q(slo.q)} {value:.1f} ms"


def _run(
    run_step: StepFn,
    rate: float,
    slo: Slo,
    confidence: float,
    max_error_fraction: float,
    on_step: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    result = run_step(rate, EarlyStop(slo.q, confidence))  # a fresh rule (its looks) per step
    ok, why = step_passes(result, slo, max_error_fraction)
    s = result.summary
    step = {
        "offered_rate": rate,
        "achieved_rate": s.get("achieved_rate"),
        "throughput_ok": s.get("throughput_ok"),
        "goodput": s.get("goodput"),
        "p50_ms": s.get("p50_ms"),
        "p99_ms": s.get("p99_ms"),
        "sent": s.get("sent"),
        "passed": ok,
        "why": why,
    }
    if on_step is not None:
        on_step(step)
    return step


def grid_capacity(
    run_step: StepFn,
    slo: Slo,
    rates: Sequence[float],
    confidence: float = 0.99,
    max_error_fraction: float = 0.01,
    stop_after_failures: int = 2,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> Capacity:
    """Every rate of a fixed grid, lowest first: the capacity is the highest rate below the first failure.

    For comparing servers: each one runs the same rates with the same seeds (common random numbers), where a
    bisection would send each server down its own path of rates, each with its own sample. Stops after
    ``stop_after_failures`` failures in a row.
    """
    import scipy.stats  # noqa: F401 - imported now, not in the middle of the first timed step

    grid = sorted({float(r) for r in rates})
    if not grid or grid[0] <= 0:
        raise ValueError("the grid needs positive rates")
    steps: list[dict[str, Any]] = []
    capacity: float | None = None
    goodput: float | None = None
    failed_at: float | None = None
    run_of_failures = 0
    for rate in grid:
        step = _run(run_step, rate, slo, confidence, max_error_fraction, on_step)
        steps.append(step)
        if step["passed"]:
            run_of_failures = 0
            if failed_at is None:
                capacity, goodput = rate, step["goodput"]
        else:
            run_of_failures += 1
            failed_at = rate if failed_at is None else failed_at
            if run_of_failures >= stop_after_failures:
                break
    if failed_at is None:
        reason = f"passes at every rate of the grid, up to {grid[-1]:g}/s"
    elif capacity is None:
        reason = f"fails at the lowest rate of the grid, {grid[0]:g}/s"
    else:
        reason = f"passes every rate up to {capacity:g}/s, first fails at {failed_at:g}/s"
    return Capacity(slo.describe(), capacity, goodput, tuple(steps), reason)


def find_capacity(
    run_step: StepFn,
    slo: Slo,
    start_rate: float = 10.0,
    max_rate: float = 100_000.0,
    precision: float = 0.05,
    max_steps: int = 16,
    confidence: float = 0.99,
    max_error_fraction: float = 0.01,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> Capacity:
    """Run steps through ``run_step(rate, abort_when)`` and return the capacity and the curve."""

    import scipy.stats  # noqa: F401 - imported now, not in the middle of the first timed step

    steps: list[dict[str, Any]] = []
    lo: float | None = None  # highest passing rate
    hi: float | None = None  # lowest failing rate
    best_goodput: float | None = None
    rate = start_rate
    reason = ""
    for _ in range(max_steps):
        step = _run(run_step, rate, slo, confidence, max_error_fraction, on_step)
        steps.append(step)
        ok = step["passed"]
        if ok:
            lo = rate
            g = step["goodput"]
            if g is not None and (best_goodput is None or g > best_goodput):
                best_goodput = g
        else:
            hi = rate if hi is None else min(hi, rate)
        if hi is None:
            if rate >= max_rate:
                reason = f"still passing at the maximum rate {max_rate:g}/s"
                break
            rate = min(rate * 2, max_rate)
            continue
        if lo is None:
            if rate <= start_rate / 64:
                reason = "fails even at the lowest rate tried"
                break
            rate = rate / 2
            continue
        if hi / lo - 1 <= precision:
            reason = f"bracketed within {precision:.0%}: passes at {lo:g}/s, fails at {hi:g}/s"
            break
        rate = (lo + hi) / 2
    else:
        reason = f"stopped after {max_steps} steps"
    return Capacity(slo.describe(), lo, best_goodput, tuple(steps), reason)
