"""The measuring machinery against ground truth: fake clock (exact) and real clock (tolerance)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import Noise, Watch
from latencylab.analysis import analyze
from latencylab.clock import Clock, FakeClock, PerfCounterClock, cuda_available
from latencylab.errors import LatencyLabError
from latencylab.pipeline import Pipeline
from latencylab.profiler import ProfileConfig, profile
from latencylab.workloads.synthetic import Distribution, Injection, SyntheticStage, synthetic_pipeline

STAGES = (
    SyntheticStage("preprocess", Distribution("normal", 1e6, 0.1e6), "preprocess"),
    SyntheticStage("forward", Distribution("lognormal", 3e6, 0.25), "forward"),
    SyntheticStage("postprocess", Distribution("constant", 0.3e6), "postprocess"),
)


def _planned(pipe: Pipeline, start: int, n: int) -> np.ndarray:
    return np.stack([pipe.source(start + i) for i in range(n)])


def test_fake_clock_records_exactly_the_planned_durations() -> None:
    clk = FakeClock()
    pipe = synthetic_pipeline(STAGES, seed=3, clock=clk, iteration_offset=5)
    res = profile(pipe, ProfileConfig(warmup=5, iterations=500), clock=clk, env={})
    planned = np.rint(_planned(pipe, 5, 500)).astype(np.int64)
    for j, st in enumerate(res.stages):
        assert st.samples_ns == tuple(planned[:, j])
    assert np.array_equal(res.end_to_end_ns(), planned.sum(axis=1))
    # iteration starts are the running sum of the previous iterations' durations
    assert res.iteration_start_ns == tuple(np.r_[0, np.cumsum(planned.sum(axis=1))[:-1]])
    assert res.clock == "fake"
    assert res.stop_reason == "iterations reached"


def test_fake_clock_percentiles_within_3pct_of_true_quantiles() -> None:
    clk = FakeClock()
    pipe = synthetic_pipeline(STAGES, seed=1, clock=clk)
    res = profile(pipe, ProfileConfig(warmup=0, iterations=50_000), clock=clk, env={})
    a = analyze(res, qs=(0.5, 0.99))
    for st, sa in zip(STAGES, a.stages, strict=True):
        for q in (0.5, 0.99):
            truth = st.dist.quantile(q)
            assert sa.summary.at(q).value == pytest.approx(truth, rel=0.03), (st.name, q)
            lo, hi = sa.summary.at(q).ci_low, sa.summary.at(q).ci_high
            assert lo <= truth <= hi or st.dist.kind == "constant"


# A real-clock attempt is judged only when its thread was kept off the CPU at most this share of the time
# (10 ms of a 4-s run: two or three preemptions of a busy core's time slice, each of which can stretch one
# busy-wait sample, fewer than the 8 samples above the p99 of 800).
QUIET = 0.0025


def test_real_clock_percentiles_within_3pct_of_truth(machine_noise: Noise) -> None:
    # Busy-wait stages on the real clock: the truth is the planned duration of each iteration.
    stages = (
        SyntheticStage("preprocess", Distribution("constant", 2e6), "preprocess"),
        SyntheticStage("forward", Distribution("lognormal", 3e6, 0.3), "forward"),
    )
    # p50 within 3%; p99 within 5%: a scheduler preemption that covers the end of a busy-wait stretches that
    # sample, and a few of the 8 tail samples may carry one even on a quiet machine (the fake-clock test holds
    # p99 to 3% exactly). Another process hogging the core is outside the profiler's control: each attempt
    # watches how long its thread was kept off the CPU, and only a quiet attempt is judged (up to 5 attempts,
    # as pyperf reruns).
    machine_noise.require("busy-wait stage timings to 5%", stolen=0.05)
    tolerance = {0.5: 0.03, 0.99: 0.05}
    judged: list[str] = []
    disturbed: list[str] = []
    for attempt in range(5):
        pipe = synthetic_pipeline(stages, seed=5 + attempt, iteration_offset=3)
        with Watch() as watch:
            res = profile(pipe, ProfileConfig(warmup=3, iterations=800), clock=PerfCounterClock(), env={})
        planned = _planned(pipe, 3, 800)
        series = [(st.name, st.array(), planned[:, j]) for j, st in enumerate(res.stages)]
        series.append(("end-to-end", res.end_to_end_ns(), planned.sum(axis=1)))
        errors = [
            f"{name} {q}: {np.quantile(got, q):.0f} vs {np.quantile(want, q):.0f}"
            for name, got, want in series
            for q, rel in tolerance.items()
            if abs(np.quantile(got, q) / np.quantile(want, q) - 1) > rel
        ]
        # durations never come out shorter than planned (busy-wait can only overshoot), noisy machine or not
        assert (res.stage("forward").array() >= np.floor(planned[:, 1]) - 1).all()
        if not errors:
            return
        if watch.waited is not None and watch.waited > QUIET:
            disturbed.append(f"attempt {attempt}: {watch.describe()}: {errors}")
        else:
            judged.append(f"attempt {attempt} ({watch.describe()}): {errors}")
    if not judged:
        pytest.skip(f"every attempt was kept off the CPU more than {QUIET:.2%} of its time: {disturbed}")
    raise AssertionError(f"quiet attempts measured wrong: {judged}; disturbed ones: {disturbed}")


def test_injected_level_shift_is_detected_and_located() -> None:
    clk = FakeClock()
    pipe = synthetic_pipeline(STAGES, [Injection("forward", 600, 150, 2.5)], seed=2, clock=clk, iteration_offset=10)
    res = profile(pipe, ProfileConfig(warmup=10, iterations=2000), clock=clk, env={})
    a = analyze(res)
    assert len(a.spikes) == 1
    sp = a.spikes[0]
    assert sp.kind == "level-shift"
    assert abs(sp.start - 600) <= 3 and abs(sp.end - 750) <= 3
    assert sp.at_s == pytest.approx(res.iteration_start_ns[sp.start] / 1e9)
    assert any("latency jumped" in w and "iterations 60" in w for w in a.warnings)


def test_injected_stall_on_real_clock_is_detected(machine_noise: Noise) -> None:
    # A busy machine adds real (scheduler) stalls: the injected one (50 ms, 100x the 0.5-ms stage) must be found
    # and be the worst, which only a machine whose own stalls stay well under 50 ms can show.
    machine_noise.require("a 50-ms stall against the machine's own", max_stall_ms=10.0)
    stages = (SyntheticStage("forward", Distribution("normal", 0.5e6, 0.02e6), "forward"),)
    pipe = synthetic_pipeline(stages, [Injection("forward", 300, 1, 1.0, 50e6)], seed=0, iteration_offset=2)
    with Watch() as watch:
        res = profile(pipe, ProfileConfig(warmup=2, iterations=600), env={})
    stalls = [s for s in analyze(res).spikes if s.kind == "stall"]
    worst = max(stalls, key=lambda s: s.ratio, default=None)
    found = worst is not None and (worst.start, worst.end) == (300, 301) and worst.ratio > 50
    if not found and watch.waited is not None and watch.waited > QUIET:
        pytest.skip(f"the machine itself stalled the run ({watch.describe()}); stalls found: {stalls}")
    assert found, stalls


def test_clean_run_has_no_spike() -> None:
    clk = FakeClock()
    res = profile(
        synthetic_pipeline(STAGES, seed=9, clock=clk),
        ProfileConfig(warmup=0, iterations=5000),
        clock=clk,
        env={},
    )
    assert analyze(res).spikes == ()


def test_shares_sum_to_one_and_match_durations() -> None:
    clk = FakeClock()
    stages = (
        SyntheticStage("preprocess", Distribution("constant", 2e6), "preprocess"),
        SyntheticStage("forward", Distribution("constant", 6e6), "forward"),
    )
    res = profile(synthetic_pipeline(stages, clock=clk), ProfileConfig(warmup=0, iterations=50), clock=clk, env={})
    a = analyze(res)
    assert [s.share for s in a.stages] == [0.25, 0.75]
    summary = a.summary_dict()
    assert summary["end_to_end"]["p50_ms"] == 8.0
    assert summary["stages"]["forward"]["p99_ms"] == 6.0
    assert summary["stages"]["preprocess"]["share"] == 0.25


def test_min_time_rule_runs_at_least_that_long() -> None:
    pipe = synthetic_pipeline((SyntheticStage("forward", Distribution("constant", 1e5)),))
    t0 = time.perf_counter()
    res = profile(pipe, ProfileConfig(warmup=0, min_time_s=0.3, min_iterations=5), env={})
    assert time.perf_counter() - t0 >= 0.3
    assert res.wall_time_s >= 0.3
    assert res.stop_reason.startswith("min-time")


def test_adaptive_stops_when_p99_ci_is_narrow() -> None:
    clk = FakeClock()
    stages = (SyntheticStage("forward", Distribution("lognormal", 1e6, 0.1)),)
    res = profile(
        synthetic_pipeline(stages, clock=clk),
        ProfileConfig(warmup=0, adaptive=True, target_rel_ci=0.03, max_time_s=60),
        clock=clk,
        env={},
    )
    assert res.stop_reason.startswith("adaptive: p99 95% CI within")
    assert 1000 <= res.n < 20000  # needs the tail samples, then stops


def test_adaptive_reports_time_cap() -> None:
    stages = (SyntheticStage("forward", Distribution("lognormal", 2e5, 1.5)),)
    res = profile(
        synthetic_pipeline(stages),
        ProfileConfig(warmup=0, adaptive=True, target_rel_ci=0.001, max_time_s=0.5),
        env={},
    )
    assert res.stop_reason.startswith("time cap 0.5s reached")


def test_config_validation() -> None:
    with pytest.raises(LatencyLabError, match="one stopping rule"):
        ProfileConfig(iterations=5, min_time_s=1)
    with pytest.raises(LatencyLabError, match="iterations"):
        ProfileConfig(iterations=0)
    with pytest.raises(LatencyLabError, match="no stages"):
        profile(Pipeline("empty", source=lambda i: i), ProfileConfig(iterations=1), env={})


def test_pipeline_building_errors() -> None:
    p = Pipeline("p", source=lambda i: i).stage("a", lambda x: x)
    with pytest.raises(LatencyLabError, match="already has a stage"):
        p.stage("a", lambda x: x)
    with pytest.raises(LatencyLabError, match="kind"):
        p.stage("b", lambda x: x, kind="bogus")


def test_clocks_satisfy_protocol() -> None:
    assert isinstance(PerfCounterClock(), Clock)
    assert isinstance(FakeClock(), Clock)
    c = FakeClock(5)
    c.advance(10)
    assert c.resolve([c.mark()]) == [15]
    with pytest.raises(ValueError):
        c.advance(-1)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="no CUDA device on this machine")
def test_cuda_event_clock_charges_async_work_to_its_stage() -> None:
    import torch

    from latencylab.clock import CudaEventClock

    a = torch.randn(4096, 4096, device="cuda")

    def launch(x: object) -> object:
        return a @ a @ a  # returns immediately: kernels are queued

    def host_only(x: object) -> object:
        return x

    pipe = Pipeline("gpu", source=lambda i: None, device="cuda").stage("matmul", launch).stage("host", host_only)
    res = profile(pipe, ProfileConfig(warmup=3, iterations=20), clock=CudaEventClock(), env={})
    mm = np.median(res.stage("matmul").array())
    host = np.median(res.stage("host").array())
    assert mm > 10 * host  # a host clock would have charged the matmul to whichever stage synchronises
