"""diagnose rules of issue 23: how much of the spread the input explains, and the machine-speed canary."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from latencylab.diagnose.engine import diagnose_results, loaded
from latencylab.diagnose.rules import machine, variance
from latencylab.results import ProfileResult, StageSeries


def text_like(noise: float, runs: tuple[float, ...] = (1.0,), n: int = 600, seed: int = 0) -> ProfileResult:
    """End-to-end = 2 ms + 30 us per token, token counts 5-200 as a text corpus; times ``noise`` lognormal
    jitter; run r of len(runs) scaled by runs[r] (the machine's speed)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(5, 200, n)
    run = np.repeat(np.arange(len(runs)), n // len(runs))
    y = (2e6 + 3e4 * tokens) * rng.lognormal(0.0, noise, n) * np.asarray(runs)[run]
    ys = np.rint(y).astype(np.int64)
    return ProfileResult(
        workload="text",
        stages=(StageSeries("forward", "forward", tuple(int(v) for v in ys)),),
        iteration_start_ns=tuple(int(v) for v in np.r_[0, np.cumsum(ys)[:-1]]),
        clock="fake",
        config={},
        pipeline={},
        env={},
        stop_reason="iterations reached",
        warmup_iterations=0,
        wall_time_s=float(ys.sum()) / 1e9,
        iteration_meta={"lengths": tuple([int(t)] for t in tokens), "shape": tuple([1, int(t)] for t in tokens)},
        iteration_run=tuple(int(r) for r in run) if len(runs) > 1 else (),
        runs=tuple({"run": r} for r in range(len(runs))) if len(runs) > 1 else (),
    )


def findings(*results: ProfileResult, rule: Any = variance.rule) -> list[Any]:
    return rule([loaded(r.to_dict(), f"r{i}.json") for i, r in enumerate(results)])


def test_spread_explained_by_input_length() -> None:
    (f,) = findings(text_like(noise=0.01))
    assert f.rule == "unstable-explained" and f.severity == "info"
    fig = f.details
    assert fig["iqr_rel"] > 0.5  # tokens 5-200 spread the latency widely
    assert fig["explained_input"] > 0.9 and fig["noise_rel"] < 0.05
    assert f.title.startswith(f"unstable: IQR {fig['iqr_rel']:.0%} of the median, of which ")
    assert "explained by input length" in f.title


def test_noise_the_input_does_not_explain_is_a_warning() -> None:
    (f,) = findings(text_like(noise=0.4))
    assert f.severity == "warning"
    assert f.details["explained_input"] < 0.6 and f.details["noise_rel"] > 0.1
    assert "machine or the process" in f.recommendation


def test_between_run_drift_is_its_own_share() -> None:
    (f,) = findings(text_like(noise=0.01, runs=(1.0, 1.6, 1.0, 1.6)))
    assert f.details["runs"] == 4 and f.details["explained_runs"] > 0.15
    assert "by differences between its 4 runs" in f.title


def test_stable_or_unexplainable_runs_are_left_to_the_profiler_warning() -> None:
    stable = text_like(noise=0.01)
    flat = ProfileResult.from_dict({**stable.to_dict(), "iteration_meta": {}})
    assert findings(flat) == []  # unstable, but nothing recorded can explain it: the profiler's warning stands
    rng = np.random.default_rng(1)
    quiet = rng.normal(3e6, 3e4, 300).astype(np.int64)
    calm = ProfileResult.from_dict(
        {**flat.to_dict(), "stages": [{"name": "f", "kind": "forward", "samples_ns": quiet.tolist()}],
         "iteration_start_ns": list(range(300)), "iteration_meta": {"lengths": [[5]] * 300}}
    )  # fmt: skip
    assert findings(calm) == []


def canary(cpu_ms: float, drift: float = 0.02, steal: float = 0.0) -> dict[str, Any]:
    ns = int(cpu_ms * 1e6)
    readings = [{"at": "before", "t_s": 0.0, "cpu_ns": [ns]}, {"at": "after", "t_s": 1.0, "cpu_ns": [ns]}]
    return {"version": 1, "cpu_ns": ns, "mem_gbps": 20.0, "drift": drift, "steal_fraction": steal, "readings": readings}


def test_machine_speed_between_and_within_results() -> None:
    a, b = text_like(0.01), text_like(0.01, seed=1)
    a = ProfileResult.from_dict({**a.to_dict(), "env": {"canary": canary(1.0)}})
    slow = canary(1.3, drift=0.25, steal=0.08)
    b = ProfileResult.from_dict({**b.to_dict(), "env": {"canary": slow}})
    got = findings(a, b, rule=machine.rule)
    titles = [f.title for f in got]
    assert "the machine's speed moved 25% while this was measured (canary)" in titles
    assert "the hypervisor took 8% of the CPU time (steal) while this was measured" in titles
    between = next(f for f in got if "slower in" in f.title)
    assert between.title.startswith("the machine was 30% slower in r1.json's run than in r0.json's")
    assert between.details["slower"] == pytest.approx(0.3)
    same = ProfileResult.from_dict({**b.to_dict(), "env": {"canary": canary(1.05)}})
    assert findings(a, same, rule=machine.rule) == []
    # both rules are registered and run through the engine
    rules = {f.rule for f in diagnose_results([loaded(r.to_dict(), "x") for r in (a, b)])}
    assert {"machine-speed", "unstable-explained"} <= rules
