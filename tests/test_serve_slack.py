"""Admission slack from the recent quantile of prediction errors (serve/slack.py) and its use by the server."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from starlette.testclient import TestClient

from fake_variants import FakeVariant
from latencylab.serve.app import build_state, lifespan_app
from latencylab.serve.config import ModelConfig, ServerConfig
from latencylab.serve.slack import SlackController

MS = 1_000_000
BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def test_slack_stays_at_zero_while_the_tail_is_inside_the_target() -> None:
    c = SlackController(0.99, outside_ns=2 * MS, window_s=2.0, interval_s=0.1, gain=0.5, min_samples=50)
    t = 10**12
    for i in range(200):  # every request answered 5..15 ms before its deadline
        c.observe(t + i * MS, -(5 + i % 10) * MS)
    assert c.current(t) == 0
    assert c.current(t + 300 * MS) == 0 and c.tail_ns is not None and c.tail_ns <= -5 * MS


def test_slack_rises_with_a_late_tail_and_falls_back() -> None:
    c = SlackController(0.99, outside_ns=2 * MS, window_s=2.0, interval_s=0.1, gain=0.5, min_samples=50)
    t = 10**12
    c.current(t)
    for i in range(100):  # 10% finish 8 ms after their deadline: the p99 is 10 ms past the target
        c.observe(t + i * MS, 8 * MS if i % 10 == 0 else -10 * MS)
    assert c.current(t + 100 * MS) == 5 * MS  # 0.5 x (8 - (-2)) ms
    assert c.current(t + 150 * MS) == 5 * MS  # no update within the interval
    assert c.current(t + 200 * MS) == 10 * MS  # the same tail: another step up
    for i in range(200):  # then everything early: the tail is 12 ms inside the deadline
        c.observe(t + 1_000 * MS + i * MS, -12 * MS)
    # once only the early ones are in the window, the slack comes down by 0.5 x (12 - 2) ms each update
    assert c.current(t + 2_150 * MS) == 5 * MS
    assert c.current(t + 2_250 * MS) == 0  # never below 0
    for i in range(60):
        c.observe(t + 2_300 * MS + i, 20 * MS)
    assert c.current(t + 2_350 * MS) == 11 * MS  # 0.5 x (20 + 2) ms
    assert c.current(t + 10_000 * MS) == 5_500_000  # nothing in the window any more: halves at each update
    assert c.tail_ns is None


def test_bad_controller_settings() -> None:
    with pytest.raises(ValueError, match="q must"):
        SlackController(99)
    with pytest.raises(ValueError, match="gain"):
        SlackController(0.99, gain=0.0)


class _SometimesSlow(FakeVariant):
    """Every 4th batch takes 15 ms more than the others: the latency model's mean cannot predict which."""

    def __init__(self, name: str) -> None:
        super().__init__(name, 0.002)
        self.calls = 0

    def forward(self, items: Sequence[Any]) -> Any:
        self.calls += 1
        if self.calls % 4 == 0:
            time.sleep(0.015)
        return super().forward(items)


def test_a_late_tail_tightens_admission_until_it_fits() -> None:
    """A quarter of the batches take 15 ms longer than the others; every request has a 12-ms deadline. The
    prediction (a few ms) admits them all at first, and a quarter finish late; the controller raises the slack
    until admission refuses what it cannot finish in time. A 200-ms deadline is still served."""
    variant = _SometimesSlow("fp32")
    cfg = ServerConfig(models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make"),))
    state = build_state(cfg, {"fake": [variant]})
    svc = state.services["fake"]
    url = "/v2/models/fake/versions/fp32/infer"
    gauge = 'latencylab_server_admission_slack_seconds{model="fake",variant="fp32"}'
    with TestClient(lifespan_app(state)) as c:
        codes, slack = [], []
        for _ in range(300):
            codes.append(c.post(url, json={**BODY, "parameters": {"deadline_ms": 12}}).status_code)
            slack.append(svc.slack[0].slack_ns)
        assert codes[:20].count(503) <= 2  # nothing to go on yet: admitted on the prediction
        assert codes[-150:].count(503) >= 30, codes[-150:]  # the slack now refuses what would finish late
        assert set(codes) <= {200, 503, 504}
        assert max(slack) >= 3 * MS and slack[0] == 0
        assert c.post(url, json={**BODY, "parameters": {"deadline_ms": 200}}).status_code == 200
        shown = [line for line in c.get("/metrics").text.splitlines() if line.startswith(gauge)]
        assert shown and float(shown[0].split()[-1]) * 1e9 == pytest.approx(svc.slack[0].slack_ns, abs=MS)
