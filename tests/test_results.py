from __future__ import annotations

import json
from pathlib import Path

import pytest

from latencylab.analysis import save_profile
from latencylab.clock import FakeClock
from latencylab.env import fingerprint
from latencylab.errors import LatencyLabError
from latencylab.profiler import ProfileConfig, profile
from latencylab.results import ProfileResult, load_result
from latencylab.results.registry import SCHEMA_VERSION
from latencylab.workloads.synthetic import synthetic_pipeline


def _result() -> ProfileResult:
    clk = FakeClock()
    return profile(
        synthetic_pipeline(seed=4, clock=clk),
        ProfileConfig(warmup=2, iterations=300),
        clock=clk,
        env=fingerprint(sample_s=0.01),
    )


def test_round_trip_through_json(tmp_path: Path) -> None:
    res = _result()
    path = save_profile(res, tmp_path / "r.json")
    back = load_result(path)
    assert back == res
    d = json.loads(path.read_text())
    assert d["schema_version"] == SCHEMA_VERSION
    assert d["kind"] == "profile"
    assert set(d["summary"]) >= {"unit", "end_to_end", "stages", "ci", "spikes", "warnings"}
    assert set(d["summary"]["stages"]) == {"preprocess", "forward", "postprocess"}
    e2e = d["summary"]["end_to_end"]
    assert e2e["p50_ms"] == pytest.approx(
        float(sorted(res.end_to_end_ns())[149] + sorted(res.end_to_end_ns())[150]) / 2e6
    )
    assert e2e["share"] == 1.0
    assert d["env"]["cpu"]["logical_cpus"] >= 1
    assert len(d["stages"][0]["samples_ns"]) == 300


def test_load_rejects_bad_files(tmp_path: Path) -> None:
    with pytest.raises(LatencyLabError, match="no such result file"):
        load_result(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(LatencyLabError, match="not a JSON result file"):
        load_result(bad)
    d = _result().to_dict()
    d["schema_version"] = 99
    bad.write_text(json.dumps(d))
    with pytest.raises(LatencyLabError, match="unsupported schema_version 99"):
        load_result(bad)
    d["schema_version"] = SCHEMA_VERSION
    del d["stages"]
    bad.write_text(json.dumps(d))
    with pytest.raises(LatencyLabError, match="malformed"):
        load_result(bad)


def test_results_are_frozen() -> None:
    res = _result()
    with pytest.raises(AttributeError):
        res.workload = "x"  # type: ignore[misc]
