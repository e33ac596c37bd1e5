from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from latencylab.errors import LatencyLabError
from latencylab.load.arrival_trace import TraceReplay, record_trace
from latencylab.load.arrivals import (
    Arrival,
    ArrivalProcess,
    Constant,
    Poisson,
    Schedule,
    Step,
    parse_arrivals,
)


def times(proc: ArrivalProcess, duration_s: float | None = None, max_requests: int | None = None) -> np.ndarray:
    return np.array([a.t_s for a in proc.arrivals(duration_s, max_requests)])


def test_poisson_count_and_exponential_gaps() -> None:
    t = times(Poisson(200.0, seed=3), duration_s=60.0)
    assert abs(t.size - 12_000) < 4 * math.sqrt(12_000)
    assert t[0] > 0 and t[-1] < 60.0
    assert np.all(np.diff(t) >= 0)
    gaps = np.diff(np.r_[0.0, t])
    assert stats.kstest(gaps, "expon", args=(0, 1 / 200)).pvalue > 0.001
    assert gaps.mean() == pytest.approx(1 / 200, rel=0.05)


def test_poisson_is_reproducible_per_seed() -> None:
    a = times(Poisson(50.0, seed=11), duration_s=30.0)
    b = times(Poisson(50.0, seed=11), duration_s=30.0)
    c = times(Poisson(50.0, seed=12), duration_s=30.0)
    assert np.array_equal(a, b)
    assert not np.array_equal(a[:100], c[:100])
    # the stop condition only truncates: same seed, same prefix
    assert np.array_equal(times(Poisson(50.0, seed=11), max_requests=100), a[:100])


def test_stops_at_whichever_limit_comes_first() -> None:
    assert times(Poisson(100.0), duration_s=60.0, max_requests=10).size == 10
    t = times(Poisson(100.0), duration_s=0.5, max_requests=10_000)
    assert 20 < t.size < 90 and t[-1] < 0.5
    assert times(Constant(100.0), duration_s=1.0, max_requests=10_000).size == 100
    assert times(Constant(100.0), duration_s=1.0, max_requests=7).size == 7


def test_constant_times_are_exact() -> None:
    t = times(Constant(3.0), duration_s=10.0)
    assert t.tolist() == [k / 3.0 for k in range(30)]
    arr = list(Constant(7.0).arrivals(max_requests=100_000))
    assert arr[-1] == Arrival(99_999 / 7.0, None)  # no accumulated drift after 1e5 arrivals
    assert times(Constant(50.0), duration_s=10.0).size == 500


def test_open_ended_processes_need_a_limit() -> None:
    for proc in (Poisson(10.0), Constant(10.0)):
        with pytest.raises(LatencyLabError, match="never end"):
            proc.arrivals()
    with pytest.raises(LatencyLabError, match="duration"):
        Poisson(10.0).arrivals(duration_s=-1)
    with pytest.raises(LatencyLabError, match="maximum request count"):
        Poisson(10.0).arrivals(max_requests=0)


@pytest.mark.parametrize("bad", [0, -5, math.inf, math.nan])
def test_rates_must_be_positive(bad: float) -> None:
    with pytest.raises(LatencyLabError, match="rate"):
        Poisson(bad)
    with pytest.raises(LatencyLabError, match="rate"):
        Constant(bad)
    with pytest.raises(LatencyLabError, match="rate"):
        Step(10.0, bad)


def test_ramp_may_start_at_zero_but_not_be_zero() -> None:
    assert Step(10.0, 0.0, 100.0).requests == 500.0
    assert Step(10.0, 100.0, 0.0).requests == 500.0
    with pytest.raises(LatencyLabError, match="0 to 0"):
        Step(10.0, 0.0, 0.0)
    with pytest.raises(LatencyLabError, match="duration"):
        Step(0.0, 10.0)
    with pytest.raises(LatencyLabError, match="at least one step"):
        Schedule([])
    with pytest.raises(LatencyLabError, match="process"):
        Schedule([Step(1.0, 1.0)], process="uniform")


def test_poisson_ramp_counts_follow_the_rate_integral() -> None:
    ramp = Schedule([Step(60.0, 0.0, 300.0)], seed=5)  # rate(t) = 5 t
    t = times(ramp)
    assert t[-1] < 60.0
    counts, _ = np.histogram(t, bins=6, range=(0.0, 60.0))
    for i, n in enumerate(counts):
        expected = 2.5 * ((10 * i + 10) ** 2 - (10 * i) ** 2)  # integral of 5t over the slice
        assert expected == ramp.expected_between(10 * i, 10 * i + 10)
        assert abs(n - expected) < 4 * math.sqrt(expected), (i, n, expected)
    # time rescaling: L(t_k) = 2.5 t_k^2 must be a unit-rate Poisson process
    rescaled_gaps = np.diff(np.r_[0.0, 2.5 * t**2])
    assert stats.kstest(rescaled_gaps, "expon").pvalue > 0.001


def test_ramp_down_and_multi_segment_poisson() -> None:
    sched = parse_arrivals("ramp:300-0@20s,0-100@10s", seed=2)
    assert isinstance(sched, Schedule)
    t = times(sched)
    for a, b in ((0, 10), (10, 20), (20, 30)):
        n = int(((t >= a) & (t < b)).sum())
        expected = sched.expected_between(a, b)
        assert abs(n - expected) < 4 * math.sqrt(expected), (a, n, expected)
    assert sched.expected_between(0, 10) == 2250.0 and sched.expected_between(20, 30) == 500.0


def test_constant_schedule_solves_the_integral_exactly() -> None:
    steps = parse_arrivals("step-constant:10s@50,10s@100,10s@200")
    t = times(steps)
    counts, _ = np.histogram(t, bins=3, range=(0.0, 30.0))
    assert counts.tolist() == [500, 1000, 2000]
    assert t[:3].tolist() == [0.0, 0.02, 0.04]
    assert t[500] == 10.0 and t[1500] == 20.0
    assert steps.mean_rate() == pytest.approx(3500 / 30)
    # ramp 0 -> 100 over 10 s: L(t) = 5 t^2, so the k-th arrival is at sqrt(k / 5)
    ramp = times(parse_arrivals("ramp-constant:0-100@10s"))
    assert ramp.size == 500
    assert np.allclose(ramp, np.sqrt(np.arange(500) / 5.0), rtol=1e-12, atol=1e-12)


def test_poisson_steps_and_schedule_limits() -> None:
    sched = parse_arrivals("step:10s@50,10s@100,10s@200", seed=4)
    assert isinstance(sched, Schedule) and sched.process == "poisson"
    t = times(sched)  # a schedule ends by itself
    for (a, b), rate in zip(((0, 10), (10, 20), (20, 30)), (50, 100, 200), strict=True):
        n = int(((t >= a) & (t < b)).sum())
        assert abs(n - 10 * rate) < 4 * math.sqrt(10 * rate)
    assert t[-1] < 30.0
    assert times(sched, duration_s=10.0).tolist() == t[t < 10.0].tolist()
    assert times(sched, max_requests=7).tolist() == t[:7].tolist()
    assert sched.rate_at(15.0) == 100.0 and sched.rate_at(31.0) == 0.0


def test_describe_is_json_and_mean_rate() -> None:
    for spec, rate in (
        ("poisson:200", 200.0),
        ("constant:50", 50.0),
        ("step:10s@50,10s@150", 100.0),
        ("ramp:0-300@60s", 150.0),
    ):
        proc = parse_arrivals(spec, seed=1)
        assert proc.mean_rate() == rate
        d = json.loads(json.dumps(proc.describe()))
        assert d["process"] in ("poisson", "constant", "schedule")


def test_trace_round_trip_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    original = [
        Arrival(a.t_s, i % 5 if i % 3 else None) for i, a in enumerate(Constant(30.0).arrivals(max_requests=200))
    ]
    record_trace(path, original)
    replay = TraceReplay(path)
    assert list(replay.arrivals()) == original  # unlooped traces end by themselves
    assert len(replay) == 200
    assert replay.mean_rate() == pytest.approx(30.0)
    # a trace not starting at 0 is shifted
    poisson = list(Poisson(100.0, seed=9).arrivals(max_requests=300))
    record_trace(path, poisson)
    t0 = poisson[0].t_s
    assert list(TraceReplay(path).arrivals()) == [Arrival(a.t_s - t0, None) for a in poisson]
    first = json.loads(path.read_text().splitlines()[0])
    assert first == {"t_s": t0}


def test_trace_speed_and_limits(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("t_s,payload\n1.0,0\n1.5,\n3.0,2\n5.0,1\n")
    normal = list(TraceReplay(path).arrivals())
    assert normal == [Arrival(0.0, 0), Arrival(0.5, None), Arrival(2.0, 2), Arrival(4.0, 1)]
    fast = parse_arrivals(f"trace:{path}@2x")
    assert isinstance(fast, TraceReplay) and fast.speed == 2.0
    assert [a.t_s for a in fast.arrivals()] == [0.0, 0.25, 1.0, 2.0]
    assert [a.payload for a in fast.arrivals()] == [0, None, 2, 1]
    assert fast.describe()["span_s"] == 2.0
    assert [a.t_s for a in TraceReplay(path, speed=0.5).arrivals(duration_s=4.0)] == [0.0, 1.0]
    assert len(list(TraceReplay(path).arrivals(max_requests=2))) == 2
    only_t = tmp_path / "only.csv"
    only_t.write_text("t_s\n0\n0.25\n")
    assert list(TraceReplay(only_t).arrivals()) == [Arrival(0.0), Arrival(0.25)]


def test_trace_loop(tmp_path: Path) -> None:
    path = tmp_path / "loop.jsonl"
    record_trace(path, [Arrival(k / 10, k % 4) for k in range(10)])  # 0 .. 0.9 s at 10/s
    looped = TraceReplay(path, loop=True)
    with pytest.raises(LatencyLabError, match="never end"):
        looped.arrivals()
    arr = list(looped.arrivals(duration_s=3.5))
    assert len(arr) == 35  # period = span + one mean gap = 1.0 s: seamless
    assert np.allclose([a.t_s for a in arr], np.arange(35) / 10)
    assert [a.payload for a in arr[8:13]] == [0, 1, 0, 1, 2]
    assert len(list(TraceReplay(path, loop=True, speed=2.0).arrivals(duration_s=1.0))) == 20
    burst = tmp_path / "burst.jsonl"
    burst.write_text('{"t_s": 1}\n{"t_s": 1}\n')
    assert TraceReplay(burst).mean_rate() == math.inf
    with pytest.raises(LatencyLabError, match="share one timestamp"):
        TraceReplay(burst, loop=True)


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("h.csv", "time,payload\n0,1\n", r"h\.csv:1: bad CSV header"),
        ("h2.csv", "t_s,payload,extra\n0,1,2\n", r"h2\.csv:1: bad CSV header"),
        ("n.csv", "t_s,payload\n0,1\n\nabc,2\n", r"n\.csv:4: t_s 'abc' is not a number"),
        ("d.csv", "t_s\n0.5\n0.7\n0.6\n", r"d\.csv:4: t_s 0\.6 is before the previous arrival"),
        ("p.csv", "t_s,payload\n0,-1\n", r"p\.csv:2: payload '-1' is not a non-negative integer"),
        ("f.csv", "t_s,payload\n0,1.5\n", r"f\.csv:2: payload '1\.5'"),
        ("neg.csv", "t_s\n-1\n", r"neg\.csv:2: t_s '-1' must be a finite number of seconds >= 0"),
        ("inf.csv", "t_s\ninf\n", r"inf\.csv:2: t_s 'inf' must be a finite"),
        ("w.csv", "t_s\n0,3\n", r"w\.csv:2: 2 fields"),
        ("e.csv", "\n\n", r"e\.csv is empty"),
        ("hdr.csv", "t_s,payload\n", r"hdr\.csv has no arrivals"),
        ("j.jsonl", '{"t_s": 0}\n{"t_s": "x"}\n', r"j\.jsonl:2: t_s 'x' is not a number"),
        ("b.jsonl", '{"t_s": 0}\n{"t_s": 1,\n', r"b\.jsonl:2: not JSON"),
        ("o.jsonl", "[1, 2]\n", r"o\.jsonl:1: expected an object"),
        ("m.jsonl", '{"payload": 1}\n', r"m\.jsonl:1: missing t_s"),
        ("k.jsonl", '{"t_s": 0, "ts": 1}\n', r"k\.jsonl:1: unknown key 'ts'"),
        ("np.jsonl", '{"t_s": 0, "payload": -2}\n', r"np\.jsonl:1: payload -2"),
        ("tb.jsonl", '{"t_s": true}\n', r"tb\.jsonl:1: t_s True is not a number"),
        ("dj.jsonl", '{"t_s": 2}\n{"t_s": 1}\n', r"dj\.jsonl:2: t_s 1\.0 is before"),
    ],
)
def test_malformed_trace_files(tmp_path: Path, name: str, content: str, match: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(LatencyLabError, match=match) as err:
        TraceReplay(path)
    assert "\n" not in str(err.value)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(LatencyLabError, match=r"trace file .*nope\.jsonl not found"):
        TraceReplay(tmp_path / "nope.jsonl")
    with pytest.raises(LatencyLabError, match="not found"):
        parse_arrivals(f"trace:{tmp_path / 'nope.csv'}@2x")
    with pytest.raises(LatencyLabError, match="speed"):
        TraceReplay(tmp_path / "nope.csv", speed=0)


def test_record_trace_rejects_what_replay_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(LatencyLabError, match=r"arrival 2: t_s 0\.5 is before"):
        record_trace(tmp_path / "x.jsonl", [Arrival(1.0), Arrival(0.5)])
    with pytest.raises(LatencyLabError, match="arrival 1: payload -1"):
        record_trace(tmp_path / "x.jsonl", [Arrival(1.0, -1)])


def test_parse_good_specs() -> None:
    p = parse_arrivals("poisson:200", seed=7)
    assert p == Poisson(200.0, 7)
    assert parse_arrivals(" Constant: 50 ") == Constant(50.0)
    s = parse_arrivals("step:10s@50,500ms@100,1m@200")
    assert isinstance(s, Schedule)
    assert [(st.duration_s, st.rate, st.end_rate) for st in s.steps] == [
        (10.0, 50.0, None),
        (0.5, 100.0, None),
        (60.0, 200.0, None),
    ]
    r = parse_arrivals("ramp:0-300@60s")
    assert isinstance(r, Schedule) and r.steps == (Step(60.0, 0.0, 300.0),) and r.process == "poisson"
    assert parse_arrivals("ramp-constant:0-300@1m").process == "constant"  # type: ignore[attr-defined]
    mixed = parse_arrivals("step-poisson:10@1e2,5s@100-200")
    assert mixed.steps == (Step(10.0, 100.0), Step(5.0, 100.0, 200.0))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("poisson", "expected KIND:ARGS"),
        ("poisson:", "rate '' is not a number"),
        ("poisson:abc", "rate 'abc' is not a number"),
        ("poisson:-5", "rate '-5' is not a number"),
        ("constant:0", "rate '0' must be > 0"),
        ("uniform:5", "unknown kind 'uniform'"),
        ("step:", "no steps given"),
        ("step:10s", "segment '10s' has no '@'"),
        ("step:10s@50,@100", "segment '@100' is incomplete"),
        ("step:10x@50", "duration '10x' is not like 10s"),
        ("step:0s@50", "duration '0s' must be > 0"),
        ("step:10s@fast", "rate 'fast' is not a number"),
        ("ramp:0-300", "has no '@'"),
        ("ramp:300@60s", "ramp '300' is not FROM-TO"),
        ("ramp:0-0@60s", "not 0-0"),
        ("ramp:0-300@soon", "duration 'soon'"),
        ("trace:", "no trace file given"),
    ],
)
def test_parse_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(LatencyLabError, match=match) as err:
        parse_arrivals(spec)
    assert f"bad arrival spec {spec!r}" in str(err.value) or "trace file" in str(err.value)
