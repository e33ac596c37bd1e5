"""Pooled, interleaved capacity: several servers, the same rates, several rounds each, judged on the pool.

One step of 12 s at 30 req/s holds ~360 requests, so its p99 is about its 4th-slowest request: on a
noisy machine the same server at the same rate passes at 82 ms in one step and fails at 105 ms in the
next, and a capacity found from single steps says more about the sample than about the server. Here
every server runs every rate ``rounds`` times, interleaved (round k runs the servers in an order rotated
by k, so drift of the machine falls on all of them alike), each round with its own seed, the same for
every server. A server's verdict at a rate is taken on the pool of its rounds: the ``slo.q`` quantile of
all its successful requests (their histograms merged losslessly) and the fraction of all its requests
that were shed or failed. Its capacity is the highest rate below its first pooled failure; a server is
not run above that failure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from latencylab import stats
from latencylab.histogram import LatencyHistogram
from latencylab.load.capacity import Capacity
from latencylab.load.results import LoadResult, Slo

# (server, rate, round) -> the step's result; round k must use a seed that depends on (rate, k) only
PooledStepFn = Callable[[str, float, int], LoadResult]


@dataclass(frozen=True, slots=True)
class PooledStep:
    """One server at one rate, over all its rounds."""

    server: str
    offered_rate: float
    rounds: int
    sent: int
    ok: int
    failed: int  # shed + error
    invalid: int  # rounds whose run was invalid (e.g. the generator fell behind): left out of the pool
    q_ms: float | None  # pooled slo.q latency of the successful requests (from the intended send)
    p50_ms: float | None  # pooled median of the same
    q_ci_ms: tuple[float, float] | None  # distribution-free 95% interval of that quantile
    round_q_ms: tuple[float | None, ...]  # each round's own quantile, to show the spread pooling removes
    goodput: float | None  # mean over rounds of ok-within-SLO per second
    passed: bool
    why: str
    # the same quantile over every request sent, a shed or failed one counting as slower than any answer
    # (None: more than 1 - q of them failed). Judged on when pooled with strict=True.
    q_all_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # tuples stay tuples; JSON writes them as lists


def _quantile_ci(h: LatencyHistogram, q: float, confidence: float = 0.95) -> tuple[float, float]:
    """The order-statistic interval (stats.order_stat_ci) read off a histogram: ranks -> quantiles."""
    from scipy.stats import binom

    n = h.count
    alpha = 1.0 - confidence
    lo = max(int(binom.ppf(alpha / 2, n, q)), 1)
    hi = min(int(binom.ppf(1 - alpha / 2, n, q)) + 1, n)
    return h.quantile(min(1.0, (lo - 0.5) / n)), h.quantile(min(1.0, (hi - 0.5) / n))


def quantile_all(h: LatencyHistogram, q: float, failed: int) -> float | None:
    """The ``q`` quantile (ns) of ``h``'s answers plus ``failed`` requests that count as slower than any answer:
    the value of rank max(1, round(q * n)) of all n (the rank ``LatencyHistogram.quantile`` uses), or None when
    that rank falls among the failed. With nothing failed it is ``h.quantile(q)``."""
    n = h.count + failed
    if h.count == 0:
        return None
    rank = max(1, math.floor(q * n + 0.5))
    if rank > h.count:
        return None
    return h.quantile(rank / h.count)


def pool(
    server: str,
    rate: float,
    results: Sequence[LoadResult],
    slo: Slo,
    max_error_fraction: float = 0.01,
    strict: bool = False,
) -> PooledStep:
    """The pooled verdict of ``results`` (one server, one rate, one result per round).

    By default a step passes when the quantile of the successful requests is within the SLO and at most
    ``max_error_fraction`` of them were shed or failed. ``strict``: the quantile is taken over every request,
    a shed or failed one counting as a miss, so a server cannot improve its tail by refusing its slowest
    requests (it still gains when refusing a hopeless one shortens the others' wait)."""
    if not results:
        raise ValueError("pool() needs at least one result")
    valid = [r for r in results if r.summary.get("valid", False)]
    sent = sum(int(r.summary.get("sent", 0)) for r in valid)
    ok = sum(int(r.summary.get("ok", 0)) for r in valid)
    failed = sum(int(r.summary.get("shed", 0)) + int(r.summary.get("error", 0)) for r in valid)
    hists = [r.histogram("corrected_ok") for r in valid if "corrected_ok" in r.histograms]
    key = stats.format_q(slo.q).replace(".", "_") + "_ms"
    round_q = tuple(r.summary.get(key) for r in results)
    goodputs = [float(r.summary["goodput"]) for r in valid if r.summary.get("goodput") is not None]
    goodput = sum(goodputs) / len(goodputs) if goodputs else None
    merged = LatencyHistogram.merged(hists) if hists else None
    q_ms = p50_ms = ci = q_all = None
    if merged is not None and merged.count:
        qa = quantile_all(merged, slo.q, failed)
        q_all = qa / 1e6 if qa is not None else None
        q_ms = merged.quantile(slo.q) / 1e6
        p50_ms = merged.quantile(0.5) / 1e6
        lo, hi = _quantile_ci(merged, slo.q)
        ci = (lo / 1e6, hi / 1e6)
    name = stats.format_q(slo.q)
    if not valid:
        passed, why = False, f"all {len(results)} rounds invalid"
    elif sent and failed / sent > max_error_fraction:
        passed, why = False, f"{failed / sent:.1%} shed or failed (limit {max_error_fraction:.0%})"
    elif q_ms is None:
        passed, why = False, "no successful request"
    elif strict and q_all is None:
        passed, why = False, f"more than {1 - slo.q:.0%} shed or failed: the {name} of all requests is a failure"
    elif strict and q_all is not None and q_all * 1e6 > slo.threshold_ns:
        passed, why = False, f"pooled {name} of all requests {q_all:.1f} ms > {slo.threshold_ns / 1e6:g} ms"
    elif strict:
        passed, why = True, f"pooled {name} of all requests {q_all:.1f} ms"
    elif q_ms * 1e6 > slo.threshold_ns:
        passed, why = False, f"pooled {name} {q_ms:.1f} ms > {slo.threshold_ns / 1e6:g} ms"
    else:
        passed, why = True, f"pooled {name} {q_ms:.1f} ms"
    return PooledStep(
        server=server, offered_rate=rate, rounds=len(results), sent=sent, ok=ok, failed=failed,
        invalid=len(results) - len(valid), q_ms=q_ms, p50_ms=p50_ms, q_ci_ms=ci, round_q_ms=round_q,
        goodput=goodput, passed=passed, why=why, q_all_ms=q_all,
    )  # fmt: skip


def crossing_rate(steps: Sequence[PooledStep], threshold_ms: float, strict: bool = False) -> float | None:
    """Where the pooled quantile crosses ``threshold_ms``, interpolated linearly in rate between the last passing
    step and the first failing one: a capacity finer than the grid's spacing. Uses the quantile the verdicts used
    (of all requests with ``strict``). None when no step passed, or when the first failure was not on latency
    (too many shed or failed, invalid rounds); the highest rate when every step passed (a lower bound)."""
    ordered = sorted(steps, key=lambda p: p.offered_rate)
    first_fail = next((i for i, p in enumerate(ordered) if not p.passed), None)
    if first_fail is None:
        return ordered[-1].offered_rate if ordered else None
    if first_fail == 0:
        return None
    lo, hi = ordered[first_fail - 1], ordered[first_fail]
    q_lo, q_hi = (lo.q_all_ms, hi.q_all_ms) if strict else (lo.q_ms, hi.q_ms)
    if q_lo is None or q_hi is None or q_hi <= threshold_ms or q_hi <= q_lo:
        return None
    frac = min(1.0, max(0.0, (threshold_ms - q_lo) / (q_hi - q_lo)))
    return lo.offered_rate + frac * (hi.offered_rate - lo.offered_rate)


def rotation(servers: Sequence[str], k: int) -> list[str]:
    """Round ``k``'s order: rotated by k, so each server takes each place in turn."""
    n = len(servers)
    return [servers[(i + k) % n] for i in range(n)] if n else []


def pooled_grid(
    run_step: PooledStepFn,
    servers: Sequence[str],
    slo: Slo,
    rates: Sequence[float],
    rounds: int,
    max_error_fraction: float = 0.01,
    on_step: Callable[[PooledStep], None] | None = None,
    strict: bool = False,
) -> dict[str, tuple[Capacity, tuple[PooledStep, ...]]]:
    """Each server's capacity on the pooled verdicts of an interleaved grid (module docstring).

    Returns, per server, its :class:`Capacity` (steps as dicts) and its pooled steps.
    """
    grid = sorted({float(r) for r in rates})
    if not grid or grid[0] <= 0:
        raise ValueError("the grid needs positive rates")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if len(set(servers)) != len(servers) or not servers:
        raise ValueError("servers must be distinct names, at least one")
    steps: dict[str, list[PooledStep]] = {s: [] for s in servers}
    alive = list(servers)
    for rate in grid:
        if not alive:
            break
        results: dict[str, list[LoadResult]] = {s: [] for s in alive}
        for k in range(rounds):
            for s in rotation(alive, k):
                results[s].append(run_step(s, rate, k))
        for s in list(alive):
            step = pool(s, rate, results[s], slo, max_error_fraction, strict)
            steps[s].append(step)
            if on_step is not None:
                on_step(step)
            if not step.passed:
                alive.remove(s)
    out: dict[str, tuple[Capacity, tuple[PooledStep, ...]]] = {}
    for s in servers:
        ss = steps[s]
        first_fail = next((p for p in ss if not p.passed), None)
        passing = [p for p in ss if p.passed]
        cap = passing[-1].offered_rate if passing else None
        goodput = passing[-1].goodput if passing else None
        if first_fail is None:
            reason = f"passes every rate of the grid (pooled over {rounds} rounds), up to {grid[-1]:g}/s"
        elif cap is None:
            reason = f"fails at the lowest rate of the grid, {grid[0]:g}/s: {first_fail.why}"
        else:
            reason = f"passes up to {cap:g}/s, first fails at {first_fail.offered_rate:g}/s: {first_fail.why}"
        curve = tuple(p.to_dict() for p in ss)
        out[s] = (Capacity(slo.describe(), cap, goodput, curve, reason), tuple(ss))
    return out
