"""latencylab serve --timeline (serve/timeline.py): the guard's ladder over time, in the file report reads."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from latencylab.clock import FakeClock
from latencylab.serve.guard import GuardConfig, SloGuard
from latencylab.serve.timeline import TimelineRecorder, timeline_paths

MS = 1_000_000
S = 1_000_000_000


def _state(clock: FakeClock, **guards: SloGuard) -> Any:
    """The two things the recorder reads of a ServerState: services, each with its guard and clock reader."""
    return SimpleNamespace(
        services={m: SimpleNamespace(guard=g, now_ns=lambda: clock.now_ns) for m, g in guards.items()}
    )


def test_the_recorded_timeline_is_the_serve_document_report_draws(tmp_path: Path) -> None:
    clock = FakeClock(start_ns=1000 * S)  # the clock's origin is not the timeline's
    cfg = GuardConfig(slo_ms=50.0, window_s=2.0, bucket_s=0.5, dwell_s=1.0, min_samples=10)
    g = SloGuard(["fp32", "int8", "cache"], cfg, clock)
    rec = TimelineRecorder(_state(clock, vision=g), tmp_path / "ladder.json", every_s=0.1)
    rec.sample()  # t = 0
    for _ in range(20):  # 2 s healthy at 10 ms, 20 req/s
        clock.advance(100 * MS)
        for _ in range(2):
            g.observe(g.route(), 10 * MS)
        rec.sample()
    for _ in range(15):  # then slow: 200 ms, until the guard steps down
        clock.advance(100 * MS)
        for _ in range(2):
            g.observe(g.route(), 200 * MS)
        g.evaluate()
        rec.sample()
    (path,) = rec.write()
    doc = json.loads(path.read_text())
    assert doc["kind"] == "serve" and doc["schema_version"] == 1 and doc["model"] == "vision"
    assert doc["ladder"] == ["fp32", "int8", "cache"] and doc["slo_ms"] == 50.0
    assert doc["duration_s"] == pytest.approx(3.5)
    samples = doc["samples"]
    assert len(samples) == 36 and samples[0][0] == 0.0 and samples[-1][0] == pytest.approx(3.5)
    assert samples[10][1] == 0 and samples[10][2] == pytest.approx(10.0, rel=0.01) and samples[10][3] is False
    assert samples[10][4] == pytest.approx(20 / 2.0)  # 20 requests in the 2-s window
    t, t2 = doc["transitions"]  # the slowdown hits every rung: down to int8, then to the cache (alarm)
    assert (t["from_name"], t["to_name"], t["direction"]) == ("fp32", "int8", "down")
    assert (t2["from_name"], t2["to_name"]) == ("int8", "cache")
    # transitions on the timeline's own time axis, where the level samples change
    assert 2.0 < t["t_s"] < t2["t_s"] <= 3.5
    assert next(s[0] for s in samples if s[1] == 1) == pytest.approx(t["t_s"])
    assert next(s[0] for s in samples if s[1] == 2) == pytest.approx(t2["t_s"])
    assert samples[-1][1] == 2 and samples[-1][3] is True and doc["final"] == {"level_name": "cache", "alarm": True}

    from latencylab.report import figures
    from latencylab.report.frontend import load_input

    loaded = load_input(path)  # the report accepts it as a "serve" result
    assert loaded.kind == "serve"
    assert figures.ladder_over_time(loaded.doc).startswith("data:image/png;base64,")


def test_several_models_get_one_file_each(tmp_path: Path) -> None:
    assert timeline_paths(tmp_path / "t.json", ["a"]) == {"a": tmp_path / "t.json"}
    assert timeline_paths(tmp_path / "t.json", ["a", "b"]) == {"a": tmp_path / "t-a.json", "b": tmp_path / "t-b.json"}
    clock = FakeClock()
    cfg = GuardConfig(slo_ms=50.0)
    rec = TimelineRecorder(
        _state(clock, a=SloGuard(["x"], cfg, clock), b=SloGuard(["y", "z"], cfg, clock)),
        tmp_path / "t.json",
        every_s=0.01,
        max_samples=3,
    )
    rec.start()
    paths = rec.stop()  # a last sample, then both files
    assert sorted(p.name for p in paths) == ["t-a.json", "t-b.json"]
    for p in paths:
        doc = json.loads(p.read_text())
        assert 1 <= len(doc["samples"]) <= 3 and doc["transitions"] == []
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ValueError):
        TimelineRecorder(_state(clock), tmp_path / "x.json", every_s=0)
