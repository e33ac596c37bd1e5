"""benchmarks/serve_overload.py's verdict over repeated runs (the script itself runs servers; this part does not)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import serve_overload as so
from _serving import windows


def _run(cap: float, p99s: list[float], goodput: float, passed: bool = True) -> dict[str, Any]:
    wins = [{"p99_ms": p, "from_s": 10.0 * i, "to_s": 10.0 * (i + 1)} for i, p in enumerate(p99s)]
    ll = {"offered_rate": 2 * cap, "sent": 100, "ok": 60, "shed": 40, "error": 0, "p99_ms": max(p99s),
          "windows": wins, "goodput": goodput}  # fmt: skip
    return {
        "capacity": {"capacity_rate": cap, "goodput": cap},
        "latencylab": ll,
        "naive": {"windows": [{"p99_ms": 40.0}, {"p99_ms": 4000.0}]},
        "goodput_fraction": goodput / cap,
        "worst_window_p99_ms": max(p99s[1:]),
        "load_before": (0.5, 0.5, 0.5),
        "checks": [{"check": "x", "passed": passed}],
    }


def test_runs_that_pass_with_capacities_within_10_percent_pass(capsys: pytest.CaptureFixture[str]) -> None:
    out: dict[str, Any] = {}
    so.report(out, [_run(200, [35, 28, 29], 190), _run(210, [31, 27, 29], 200), _run(190, [30, 29, 28], 180)], 30.0)
    text = capsys.readouterr().out
    assert out["all_passed"]
    assert out["capacity_spread"] == {"median": 200, "min": 190, "max": 210, "spread": pytest.approx(0.05)}
    assert "median 200.0/s, min-max 190.0-210.0/s, spread +/-5.0%" in text
    assert "PASS  every claim in every run (3 of 3 runs pass)" in text
    assert "| 1 | 200.0 (200.0) | 400.0 | 100 = 60 + 40 + 0 |" in text


def test_one_failing_run_or_a_wide_spread_fails_the_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    out: dict[str, Any] = {}
    so.report(out, [_run(200, [35, 28], 190), _run(200, [31, 33], 200, passed=False), _run(200, [30, 29], 190)], 30.0)
    assert not out["all_passed"]
    assert "FAIL  every claim in every run (2 of 3 runs pass)" in capsys.readouterr().out
    out = {}
    so.report(out, [_run(150, [29, 28], 150), _run(200, [29, 29], 190), _run(240, [29, 28], 230)], 30.0)
    text = capsys.readouterr().out
    assert not out["all_passed"] and "FAIL  capacities agree within +/-10% (+/-25.0%)" in text


def test_the_capacity_in_units_of_the_speed_probe_absorbs_a_host_that_moved(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Capacities 150, 200, 240/s (+/-25%) on a host whose light-load service time moved 4.0 -> 3.0 -> 2.5 ms:
    capacity x probe is 0.6 in every run (spread 0); a run without its after-probe uses its before-probe."""
    runs = [_run(150, [29, 28], 150), _run(200, [29, 29], 190), _run(240, [29, 28], 230)]
    for r, (b, a) in zip(runs, [(3.9, 4.1), (3.0, None), (2.4, 2.6)], strict=True):
        r["probe_before"] = {"service_ms": b}
        if a is not None:
            r["probe_after"] = {"service_ms": a}
    out: dict[str, Any] = {}
    so.report(out, runs, 30.0)
    text = capsys.readouterr().out
    assert "capacity x probe: 0.600, 0.600, 0.600, spread +/-0.0%" in text
    assert out["normalised_capacity_spread"]["probe_ms"] == pytest.approx([4.0, 3.0, 2.5])
    assert "FAIL  capacities agree within +/-10% (+/-25.0%)" in text  # the raw verdict is not softened
    # --combine: the same report over runs saved by separate invocations
    for i, r in enumerate(runs):
        (tmp_path / f"{i}.json").write_text(json.dumps({"model": "vision", "slo_ms": 30.0, "runs": [r]}))
    assert so.combine([str(tmp_path / f"{i}.json") for i in range(3)]) == 1
    assert "capacity x probe: 0.600, 0.600, 0.600" in capsys.readouterr().out
    (tmp_path / "t.json").write_text(json.dumps({"model": "text", "slo_ms": 300.0, "runs": [runs[0]]}))
    assert so.combine([str(tmp_path / "0.json"), str(tmp_path / "t.json")]) == 2


def test_an_extra_overload_factor_is_judged_and_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """--also-factor 4: the 4x run has the same three checks and its own table row."""
    r = _run(200, [35, 28, 29], 190)
    wins = [{"p99_ms": p} for p in (40.0, 29.0, 31.0)]
    four = {"factor": 4.0, "offered_rate": 800.0, "sent": 10, "ok": 5, "shed": 4, "error": 0, "p99_ms": 31.0,
            "windows": wins, "goodput": 170.0, "identity": False}  # fmt: skip
    checks = dict(so._overload_checks(four, 4.0, 30.0, 200.0))
    assert [ok for ok in checks.values()] == [False, False, False]  # 10 != 9, 31 ms > 30, 85% < 90%
    assert "(worst 31.00 ms)" in next(iter(k for k in checks if "window" in k))
    r["latencylab_also"] = [{**four, "ok": 6, "identity": True, "worst_window_p99_ms": 31.0, "goodput_fraction": 0.85}]
    so.report({}, [r], 30.0)
    text = capsys.readouterr().out
    assert "| 1 @ 4x |  | 800.0 | 10 = 6 + 4 + 0 | 31.00 (31.00) | 40.0, 29.0, 31.0 | 170.0 (85%) |" in text
    assert "at 4x: p99 of admitted 31.00 ms, worst window after the first 31.00 ms, goodput 85% of capacity" in text


def test_an_error_after_admission_is_a_miss_of_the_admitted() -> None:
    """A 504 (or any error) after admission counts in the admitted p99 at its latency; a shed request does not."""
    n = 200
    intended = np.arange(n, dtype=np.int64) * 50_000_000  # 20/s over 10 s: one window
    lat = np.full(n, 10_000_000, dtype=np.int64)  # every answer 10 ms
    outcome = np.zeros(n, dtype=np.int8)
    outcome[:20] = 1  # 10% shed at once (1 ms): not admitted
    lat[:20] = 1_000_000
    outcome[20:25] = 2  # 2.5% of sent end in a 504 at the 300-ms deadline
    lat[20:25] = 300_000_000
    (w,) = windows(intended, intended + lat, outcome, 10.0, slo_ms=30.0)
    assert w["p99_ms"] == pytest.approx(10.0)  # of ok only: the 504s are invisible
    assert w["p99_admitted_ms"] == pytest.approx(300.0)  # 5 of 180 admitted = 2.8% > 1%
    run = {"sent": n, "ok": 175, "shed": 20, "error": 5, "identity": True, "windows": [w, w], "goodput": 17.5,
           "p99_ms": 10.0, "p99_admitted_ms": 300.0}  # fmt: skip
    checks = dict(so._overload_checks(run, 2.0, 30.0, 17.5))
    window_check = next(k for k in checks if "window" in k)
    assert not checks[window_check] and "(worst 300.00 ms)" in window_check


def test_the_capacity_in_units_of_the_step_s_own_preprocess_speed(capsys: pytest.CaptureFixture[str]) -> None:
    """Each step carries the server's preprocess ms a request over its valid chunks (weighted by requests); the
    report normalises each run's capacity by the reading of its capacity step, not of a light-load probe."""
    chunks = [
        {"valid": True, "rate": 300.0, "requests": 100, "ok": 100, "preprocess_ms": 1.0, "server_cpu_s": 0.2},
        {"valid": True, "rate": 300.0, "requests": 300, "ok": 300, "preprocess_ms": 2.0, "server_cpu_s": 0.6},
        {"valid": False, "rate": 300.0, "requests": 900, "ok": 900, "preprocess_ms": 9.0, "server_cpu_s": 9.0},
    ]
    speed = so.step_speed(chunks)
    assert speed["server_preprocess_ms"] == pytest.approx(1.75)  # (100 x 1 + 300 x 2) / 400; the stolen chunk out
    assert speed["server_cpu_ms_per_ok"] == pytest.approx(2.0)
    assert so.step_speed([]) == {"server_preprocess_ms": None, "server_cpu_ms_per_ok": None}
    runs = [_run(150, [29, 28], 150), _run(200, [29, 29], 190), _run(240, [29, 28], 230)]
    for r, ms in zip(runs, (4.0, 3.0, 2.5), strict=True):
        r["capacity"]["steps"] = [
            {"offered_rate": r["capacity"]["capacity_rate"] * 2, "server_preprocess_ms": 99.0},
            {"offered_rate": r["capacity"]["capacity_rate"], "server_preprocess_ms": ms},
        ]
    out: dict[str, Any] = {}
    so.report(out, runs, 30.0)
    text = capsys.readouterr().out
    assert "capacity x that: 0.600, 0.600, 0.600, spread +/-0.0%" in text
    assert out["preprocess_normalised_capacity_spread"]["preprocess_ms"] == [4.0, 3.0, 2.5]
    assert "FAIL  capacities agree within +/-10% (+/-25.0%)" in text  # the raw verdict stays


def test_steal_is_read_per_window_and_shown_with_the_tries_not_judged(capsys: pytest.CaptureFixture[str]) -> None:
    from _serving import StealTrace, machine_steal_s

    assert machine_steal_s() >= 0.0
    st = StealTrace()
    # (seconds since the start, stolen CPU-seconds since the start), sampled every second
    st.samples = [(float(t), 0.0 if t <= 10 else 0.5 * (t - 10)) for t in range(1, 26)]
    assert st.per_window(10.0) == pytest.approx([0.0, 0.5, 0.5])  # the last window: 5 s of 10, kept
    st.samples = st.samples[:22]  # 2 s into the third window: too short to report
    assert st.per_window(10.0) == pytest.approx([0.0, 0.5])
    with StealTrace(every_s=0.05) as live:
        pass
    assert live.samples and all(v >= 0 for _, v in live.samples)
    r = _run(200, [29, 28, 29], 190)
    r["latencylab"].update(foreign_cpu=0.01, steal_per_window=[0.02, 0.3], discarded_tries=[{"ok": 1}])
    so.report({}, [r], 30.0)
    assert "| 0.01 / 0.30 (1 tries not judged) |" in capsys.readouterr().out


def test_an_overload_run_the_host_stole_from_is_run_again_and_every_try_is_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A 10-s window over STEAL_LIMIT -> run again after the cooldown, at most `retries` times; the last try is judged
    whatever its steal; the tries before it are kept (their figures), never dropped."""
    stolen, quiet = [0.02, so.STEAL_LIMIT + 0.01, 0.0], [0.02, so.STEAL_LIMIT, 0.0]  # the limit itself passes
    for plan, retries, n_runs, over in (
        ([quiet], 2, 1, False),
        ([stolen, stolen, quiet], 2, 3, False),
        ([stolen, stolen, stolen, quiet], 2, 3, True),  # out of retries: the third is judged, flagged
        ([stolen, quiet], 0, 1, True),
    ):
        tries = iter(enumerate(plan, start=1))
        slept: list[float] = []
        m = so.judge_unstolen(
            lambda it=tries: dict(zip(("ok", "steal_per_window"), next(it), strict=True)),
            "latencylab", retries, 8.0, sleep=slept.append,
        )  # fmt: skip
        assert slept == [8.0] * (n_runs - 1)
        assert m["ok"] == n_runs and m["steal_over_limit"] is over
        assert [t["ok"] for t in m["discarded_tries"]] == list(range(1, n_runs))
    assert "latencylab: not judged: the host took 0.11 CPU from the VM in one 10-s window" in capsys.readouterr().out


def test_a_run_of_one_window_is_reported_without_a_worst_window(capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(200, [29, 28], 190)
    r["latencylab"]["windows"] = r["latencylab"]["windows"][:1]
    r["worst_window_p99_ms"] = None
    so.report({}, [r], 30.0)
    assert "worst 10-s window after the first - ms (SLO 30)" in capsys.readouterr().out
