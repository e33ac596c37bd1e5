"""The capacity search's refine phase (load/capacity_refine.py): interleaved rounds over a grid of rates, judged
on a monotone fit. Against the simulated FIFO queues of test_load_capacity_search (no wall time), including a
server whose speed drifts between a fast and a slow phase, as the shared VM's host does (issue 22)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from typing import Any

import pytest

from latencylab.load.capacity import SearchConfig, Segment, search_capacity
from latencylab.load.capacity_refine import grid, isotonic, refine_seed
from latencylab.load.results import Slo
from test_load_capacity_search import CFG, Queue, md1_truth

SLO = Slo.parse("p99=150ms")
REFINE = dataclasses.replace(CFG, refine_rounds=4)


class Drifting(Queue):
    """An M/D/1 server whose service time is ``d`` in fast phases and ``slow x d`` in slow ones, the phases
    alternating every ``phase_s`` seconds of the search's own time (chunks plus 2 s between them), from an
    ``offset`` into the cycle."""

    def __init__(self, d: float, slow: float, phase_s: float, offset: float) -> None:
        super().__init__("const", d)
        self.d, self.slow, self.phase_s, self.t = d, slow, phase_s, offset

    def __call__(self, rate: float, seconds: float, seed: int, abort: Any) -> Segment:
        self.mean_s = self.d if int(self.t // self.phase_s) % 2 == 0 else self.d * self.slow
        self.t += seconds + 2.0
        return super().__call__(rate, seconds, seed, abort)


def spread(rates: list[float]) -> float:
    med = statistics.median(rates)
    return max(abs(r - med) for r in rates) / med


def test_isotonic_is_the_weighted_pool_adjacent_violators_fit() -> None:
    assert isotonic([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1]) == [1.0, 2.5, 2.5, 4.0]
    # the weights decide the pooled value: 3 (weight 3) and 1 (weight 1) pool to 2.5
    assert isotonic([3.0, 1.0], [3, 1]) == [2.5, 2.5]
    fit = isotonic([0.5, 0.1, 0.3, 0.2, 0.9], [10, 10, 5, 5, 1])
    assert all(a <= b for a, b in itertools.pairwise(fit))
    # the fit keeps the weighted total (it is a projection onto the monotone cone)
    w = [10, 10, 5, 5, 1]
    assert sum(f * x for f, x in zip(fit, w, strict=True)) == pytest.approx(0.5 * 10 + 0.1 * 10 + 1.5 + 1.0 + 0.9)
    # an already monotone sequence is its own fit; a zero weight carries no information
    assert isotonic([0.0, 0.01, 0.2], [5, 5, 5]) == [0.0, 0.01, 0.2]
    out = isotonic([0.3, 99.0, 0.1], [1, 0, 1])
    assert out[0] == out[2] == pytest.approx(0.2) and math.isnan(out[1])
    with pytest.raises(ValueError):
        isotonic([1.0], [-1.0])


def test_the_grid_steps_by_the_precision_around_the_bracket() -> None:
    g = grid(300.0, 345.0, 0.05, 2, 1, 1e6)
    assert 300.0 in g and g == sorted(g)
    assert g[0] == pytest.approx(300 / 1.05**2, abs=1e-3)
    assert g[-1] >= 345.0 * 1.05 * (1 - 1e-6) and g[-2] < 345.0 * 1.05
    assert all(b / a == pytest.approx(1.05, rel=1e-4) for a, b in itertools.pairwise(g))
    assert grid(300.0, 345.0, 0.05, 2, 1, 320.0)[-1] <= 320.0  # never above max_rate
    with pytest.raises(ValueError):
        grid(300.0, 300.0, 0.05, 2, 1, 1e6)


def test_refine_rounds_interleave_every_rate_ascending_after_a_cooldown() -> None:
    q = Queue("const", 0.02)
    slept: list[float] = []
    cfg = dataclasses.replace(REFINE, cooldown_s=3.0)
    cap = search_capacity(q, SLO, cfg, seed=1, sleep=slept.append)
    refine_rows = [s for s in cap.steps if s.get("phase") == "refine"]
    rates = [r["offered_rate"] for r in refine_rows]
    assert rates == sorted(rates) and len(rates) >= 5
    assert all(r["chunks"] == cfg.refine_rounds for r in refine_rows)
    # the calls of the refine phase: round after round, each ascending over the grid
    n_bisect = len(q.calls) - cfg.refine_rounds * len(rates)
    calls = [c[0] for c in q.calls[n_bisect:]]
    assert calls == rates * cfg.refine_rounds
    bisect_steps = [s for s in cap.steps if s.get("phase") != "refine"]
    assert len(slept) == len(bisect_steps) - 1 + cfg.refine_rounds  # before every step but the first, every round
    assert "bracketed within 15%" in cap.reason and "interleaved rounds" in cap.reason
    # the answer is a grid rate, the highest within the allowances on the fit; every one below passes
    assert cap.capacity_rate in rates
    passed = [r["passed"] for r in refine_rows]
    assert passed == sorted(passed, reverse=True)
    row = refine_rows[rates.index(cap.capacity_rate)]
    assert row["over_fitted"] <= 0.01 and row["failed_fitted"] <= CFG.max_error_fraction
    assert cap.goodput == row["goodput"]


def test_refine_finds_the_simulated_truth_without_drift() -> None:
    truth = md1_truth(0.02, 0.15)
    caps = [search_capacity(Queue("const", 0.02), SLO, REFINE, seed=s).capacity_rate for s in range(5)]
    assert all(c is not None for c in caps)
    rates = [float(c) for c in caps if c is not None]
    assert abs(statistics.median(rates) / truth - 1) <= 0.10, (rates, truth)
    assert spread(rates) <= 0.10, rates


def test_on_a_drifting_server_refine_holds_10_percent_where_bisection_alone_does_not() -> None:
    """Service 25% slower every other minute, each search starting at another point of the cycle: the bisection
    alone answers whatever the steps near its bracket met (27.5-40/s over these seeds); the refine phase measures
    every rate in both phases and agrees within 10%, between the slow and the fast phase's capacities."""
    fast, slow = md1_truth(0.02, 0.15), md1_truth(0.025, 0.15)
    plain, refined = [], []
    for s in range(8):
        for cfg, out in ((CFG, plain), (REFINE, refined)):
            cap = search_capacity(Drifting(0.02, 1.25, 60.0, offset=37.0 * s), SLO, cfg, seed=s).capacity_rate
            assert cap is not None
            out.append(cap)
    assert spread(refined) <= 0.10, refined
    assert spread(plain) > 0.2, plain  # the failure this phase exists for (deterministic: simulated queues)
    assert slow * 0.9 <= statistics.median(refined) <= fast * 1.05, (refined, slow, fast)


def test_a_bracket_found_in_a_fast_minute_moves_the_grid_down() -> None:
    """The bisection meets a fast server, the refine phase a server 40% slower: the grid's lowest rate fails on
    the fit, so a grid below it is measured and the answer is the slow server's capacity."""
    truth_slow = md1_truth(0.028, 0.15)
    fast, slow = Queue("const", 0.02), Queue("const", 0.028)

    def measure(rate: float, seconds: float, seed: int, abort: Any) -> Segment:
        # the refine phase's chunks (their own seeds, grid k's base seed 2 + 31 k) meet the slow server
        refining = any(seed == refine_seed(2 + 31 * k, rate, r) for k in range(3) for r in range(4))
        return (slow if refining else fast)(rate, seconds, seed, abort)

    cap = search_capacity(measure, SLO, REFINE, seed=2)
    assert "; " in cap.reason and cap.reason.count("rates") >= 2  # two grids: the bracket's, then one below
    refine_rows = [s for s in cap.steps if s.get("phase") == "refine"]
    bisect_lo = max(s["offered_rate"] for s in cap.steps if s.get("phase") != "refine" and s["passed"])
    assert min(r["offered_rate"] for r in refine_rows) < bisect_lo / 1.15
    assert cap.capacity_rate is not None
    assert abs(cap.capacity_rate / truth_slow - 1) <= 0.12, (cap.capacity_rate, truth_slow, cap.reason)


def test_refine_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        SearchConfig(refine_rounds=-1)
    with pytest.raises(ValueError):
        SearchConfig(refine_bracket=1.5)
    # off by default: the bisection goes to the precision and no refine row appears
    cap = search_capacity(Queue("const", 0.02), SLO, CFG, seed=0)
    assert not any(s.get("phase") == "refine" for s in cap.steps) and "bracketed within 5%" in cap.reason
