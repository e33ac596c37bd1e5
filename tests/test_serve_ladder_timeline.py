"""latencylab serve --timeline: every rung change appended, as it is seen, to ``<stem>.transitions.jsonl``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from latencylab.clock import FakeClock
from latencylab.serve.guard import GuardConfig, SloGuard
from latencylab.serve.timeline import TimelineRecorder, transitions_path
from test_serve_timeline import MS, S, _state


def _drive(g: SloGuard, rec: TimelineRecorder, clock: FakeClock, steps: int, latency_ns: int) -> None:
    for _ in range(steps):
        clock.advance(100 * MS)
        for _ in range(2):
            g.observe(g.route(), latency_ns)
        g.evaluate()
        rec.sample()


def test_rung_changes_are_appended_to_a_jsonl_log_as_they_happen(tmp_path: Path) -> None:
    """A slowdown steps the guard down twice; the log holds both, on the timeline's time axis, before any rewrite
    of the document (a server killed now keeps them); more samples append nothing twice."""
    clock = FakeClock(start_ns=1000 * S)
    cfg = GuardConfig(slo_ms=50.0, window_s=2.0, bucket_s=0.5, dwell_s=1.0, min_samples=10)
    g = SloGuard(["fp32", "int8", "cache"], cfg, clock)
    rec = TimelineRecorder(_state(clock, vision=g), tmp_path / "ladder.json", every_s=0.1)
    log = transitions_path(tmp_path / "ladder.json")
    assert log == tmp_path / "ladder.transitions.jsonl"
    rec.sample()  # t = 0
    _drive(g, rec, clock, 20, 10 * MS)  # healthy: nothing to log
    assert not log.exists()
    _drive(g, rec, clock, 15, 200 * MS)  # slow: fp32 -> int8 -> cache
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert not (tmp_path / "ladder.json").exists()  # the log does not wait for the document's rewrite
    assert [(x["from"], x["to"], x["direction"], x["alarm"]) for x in lines] == [
        ("fp32", "int8", "down", False),
        ("int8", "cache", "down", True),
    ]
    assert 2.0 < lines[0]["t_s"] < lines[1]["t_s"] <= 3.5
    assert all(x["reason"] and x["quantile_ms"] > 50 for x in lines)
    assert all(abs(x["at_unix"] - time.time()) < 60 for x in lines)  # wall time, for a reader of the log
    _drive(g, rec, clock, 5, 200 * MS)  # no new change: nothing appended
    doc_transitions = json.loads(rec.write()[0].read_text())["transitions"]
    assert len(log.read_text().splitlines()) == 2 == len(doc_transitions)
    assert [x["t_s"] for x in lines] == pytest.approx([t["t_s"] for t in doc_transitions])
