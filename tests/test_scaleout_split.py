"""Splitting an arrival process over N workers: the superposition is the requested process (fast tier)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from latencylab.clock import FakeClock
from latencylab.errors import LatencyLabError
from latencylab.load.arrivals import Constant, Poisson, Schedule, Step, parse_arrivals
from latencylab.scaleout.skew import measure_offset, start_error_ns
from latencylab.scaleout.split import Interleaved, split_arrivals, split_count


def _union(streams, duration_s=None, budgets=None):  # type: ignore[no-untyped-def]
    times = []
    for i, s in enumerate(streams):
        times += [a.t_s for a in s.arrivals(duration_s, None if budgets is None else budgets[i])]
    return np.sort(np.asarray(times))


def test_poisson_split_superposes_to_the_requested_rate_and_exponential_gaps() -> None:
    rate, n, dur = 400.0, 4, 100.0
    streams = split_arrivals(Poisson(rate, seed=7), n, seed=3)
    assert len(streams) == n
    assert all(s.mean_rate() == pytest.approx(rate / n) for s in streams)
    # independent streams: their own seeds, different samples
    firsts = {round(next(iter(s.arrivals(dur))).t_s, 9) for s in streams}
    assert len(firsts) == n
    t = _union(streams, dur)
    expected = rate * dur
    assert abs(t.size - expected) < 4 * np.sqrt(expected)  # Poisson count: 4 sigma
    gaps = np.diff(t)
    assert sps.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.01
    # the same test sees a wrong superposition: streams that kept the full rate each (4x too many)
    wrong = _union([Poisson(rate, seed=i) for i in range(n)], dur)
    assert sps.kstest(np.diff(wrong), "expon", args=(0, 1 / rate)).pvalue < 1e-6


def test_poisson_ramp_split_is_the_same_nonhomogeneous_process() -> None:
    sched = Schedule([Step(30.0, 100.0, 500.0), Step(20.0, 300.0)], "poisson", seed=1)
    streams = split_arrivals(sched, 3, seed=0)
    assert all(isinstance(s, Schedule) for s in streams)
    t = _union(streams)
    # time rescaling: Lambda(t_k) of the union are a unit-rate Poisson process
    lam = np.array([sched._cumulative(float(x)) for x in t])
    assert sps.kstest(np.diff(lam), "expon").pvalue > 0.01
    for a, b in ((0, 10), (10, 30), (30, 50)):
        exp = sched.expected_between(a, b)
        got = int(((t >= a) & (t < b)).sum())
        assert abs(got - exp) < 4 * np.sqrt(exp)


def test_constant_and_trace_interleave_to_the_parent_sequence_exactly(tmp_path: Path) -> None:
    parent = Constant(250.0)
    streams = split_arrivals(parent, 3)
    assert all(isinstance(s, Interleaved) for s in streams)
    assert np.array_equal(_union(streams, 4.0), np.array([a.t_s for a in parent.arrivals(4.0)]))
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,payload\n" + "".join(f"{0.013 * k:.4f},{k % 5}\n" for k in range(101)))
    tr = parse_arrivals(f"trace:{trace}@2x")
    shares = split_arrivals(tr, 4)
    got = sorted((a.t_s, a.payload) for s in shares for a in s.arrivals())
    assert got == [(a.t_s, a.payload) for a in tr.arrivals()]
    assert sum(s.mean_rate() for s in shares) == pytest.approx(tr.mean_rate())
    ramp_c = parse_arrivals("ramp-constant:0-200@5s")
    rs = split_arrivals(ramp_c, 2)
    assert np.array_equal(_union(rs), np.array([a.t_s for a in ramp_c.arrivals()]))


def test_request_budgets_split_exactly() -> None:
    parent = Constant(100.0)
    m, n = 23, 4
    shares = [split_count(m, n, i, interleaved=True) for i in range(n)]
    assert sum(s or 0 for s in shares) == m
    streams = split_arrivals(parent, n)
    assert np.array_equal(_union(streams, None, shares), np.array([a.t_s for a in parent.arrivals(None, m)]))
    poisson = [split_count(m, n, i, interleaved=False) for i in range(n)]
    assert sum(s or 0 for s in poisson) == m and max(poisson) - min(poisson) <= 1  # type: ignore[operator]
    assert split_count(None, n, 0, True) is None


def test_one_worker_is_the_process_itself_and_bad_counts_refused() -> None:
    p = Poisson(10.0, seed=2)
    assert split_arrivals(p, 1) == [p]
    with pytest.raises(LatencyLabError):
        split_arrivals(p, 0)
    with pytest.raises(LatencyLabError):
        Interleaved(p, 3, 3)


def test_clock_offset_from_the_tightest_round_trip() -> None:
    clock = FakeClock(1_000_000_000)
    true_offset = 123_456_789
    # (up, down) delays of each round trip; the third is the tightest and symmetric
    delays = [(900_000, 100_000), (50_000, 450_000), (20_000, 20_000), (300_000, 10_000)]
    current = iter(delays)

    def probe() -> int:
        up, down = next(current)
        clock.advance(up)
        w = clock.now_ns + true_offset
        clock.advance(down)
        return w

    off = measure_offset(probe, clock.mark, rounds=4)
    assert off.rtt_ns == 40_000
    assert off.offset_ns == true_offset
    assert off.to_driver(off.to_worker(5)) == 5
    # an asymmetric trip is wrong by at most half its round trip, which the offset reports
    clock2 = FakeClock(0)

    def lopsided() -> int:
        clock2.advance(70_000)
        w = clock2.now_ns + true_offset
        clock2.advance(10_000)
        return w

    off2 = measure_offset(lopsided, clock2.mark, rounds=2)
    assert abs(off2.offset_ns - true_offset) <= off2.uncertainty_ns
    assert off2.offset_ns != true_offset
    assert start_error_ns(off2, off2.to_worker(1_000) + 250, 1_000) == 250
