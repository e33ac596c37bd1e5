"""Admission slack from the recent quantile of prediction errors (serve/slack.py) and its use by the server."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from fake_variants import FakeVariant
from latencylab.serve.app import build_state, lifespan_app
from latencylab.serve.config import ModelConfig, ServerConfig
from latencylab.serve.slack import PredictionError, RiskBudget

MS = 1_000_000
BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def test_slack_is_the_error_quantile_beyond_the_margin() -> None:
    e = PredictionError(0.99, window_s=2.0, min_samples=100, every=16)
    t = 10**12
    for i in range(15):  # fewer than `every` errors: no slack
        e.observe(t + i, 5 * MS)
    assert e.slack_ns(t + 15, 3 * MS) == 0
    for i in range(15, 99):  # too few for a 99th percentile: the largest error stands in (one of 9 ms)
        e.observe(t + i, 9 * MS if i == 40 else 5 * MS)
    assert e.slack_ns(t + 99, 3 * MS) == 6 * MS
    e = PredictionError(0.99, window_s=2.0, min_samples=100, every=1)
    for i in range(99):
        e.observe(t + i, 5 * MS)
    for i in range(101):  # 200 errors: 190 of 5 ms, 10 of 20 ms -> type-7 0.99 quantile 20 ms
        e.observe(t + 100 + i, 20 * MS if i % 10 == 0 else 5 * MS)
    assert e.quantile_ns == int(np.quantile([5 * MS] * 189 + [20 * MS] * 11, 0.99)) == 20 * MS
    assert e.slack_ns(t + 300, 3 * MS) == 17 * MS  # beyond the margin admission already adds
    assert e.slack_ns(t + 300, 30 * MS) == 0  # never negative


def test_errors_age_out_of_the_window_even_without_new_finishes() -> None:
    """A stall's errors must not hold the slack up once nothing more is admitted (no finishes to update it)."""
    e = PredictionError(0.99, window_s=2.0, min_samples=100, every=16)
    t = 10**12
    for i in range(160):
        e.observe(t + i * MS, 50 * MS)
    assert e.slack_ns(t + 200 * MS, 3 * MS) == 47 * MS
    assert e.slack_ns(t + 3_000 * MS, 3 * MS) == 0  # 3 s later: every error is older than the 2-s window


def test_miss_probability_is_the_share_of_errors_beyond_the_headroom() -> None:
    e = PredictionError(0.99, window_s=2.0, min_samples=100, every=16)
    t = 10**12
    assert e.miss_probability(t, 5 * MS, 3 * MS) == 0.0  # no errors yet: the fixed margin decides
    assert e.miss_probability(t, 2 * MS, 3 * MS) == 1.0
    for i in range(320):  # errors 0..19 ms, 16 of each (recomputed every 16 errors)
        e.observe(t + i, (i % 20) * MS)
    assert e.miss_probability(t + 320, 20 * MS, 3 * MS) == 0.0
    assert e.miss_probability(t + 320, 14 * MS, 3 * MS) == pytest.approx(5 / 20)  # errors 15..19 ms exceed it
    assert e.miss_probability(t + 320, -1 * MS, 3 * MS) == 1.0
    small = PredictionError(0.99, window_s=2.0, min_samples=100, every=16)
    for i in range(32):
        small.observe(t + i, (i % 4) * MS)
    assert small.miss_probability(t + 32, 3 * MS, 3 * MS) == 0.0  # beyond the largest of a small sample
    assert small.miss_probability(t + 32, 2 * MS, 3 * MS) == pytest.approx(0.25)


def test_risk_budget_keeps_expected_misses_at_the_target() -> None:
    """Safe requests earn the target; a risky one is admitted once their savings cover it, never more often."""
    b = RiskBudget(0.005, cap=0.5)
    assert not b.admit(0.2)  # nothing saved yet
    assert all(b.admit(0.0) for _ in range(40))  # 40 x 0.005 = 0.2 saved
    assert b.admit(0.2) and not b.admit(0.2)
    # a long mixed stream: 95% safe, 5% at 30% risk. Expected misses among the admitted stay <= 0.5%.
    b = RiskBudget(0.005, cap=0.5)
    rng = np.random.default_rng(0)
    admitted, expected = 0, 0.0
    for p in np.where(rng.random(20_000) < 0.05, 0.3, 0.0):
        if b.admit(float(p)):
            admitted += 1
            expected += p
    assert expected / admitted <= 0.005 + 0.5 / admitted  # the cap is the only excess
    assert admitted > 19_000 * 1.0  # the safe ones all go in, and some risky ones
    b = RiskBudget(0.005, cap=0.5)
    for _ in range(1000):
        b.admit(0.0)
    assert b.balance == pytest.approx(0.5)  # capped: a burst cannot spend more than 0.5 expected misses
    with pytest.raises(ValueError, match="target"):
        RiskBudget(1.5)


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


def test_admission_refuses_requests_whose_risk_the_budget_cannot_cover() -> None:
    """A quarter of the batches finish ~15 ms later than predicted. After 150 such requests, a 15-ms deadline
    (the prediction, ~6 ms with the margin, fits it) misses with probability ~1/4: the savings of the 150 safe
    requests (0.75 expected misses, capped at 0.5) cover two of them, the rest are refused at admission; a
    200-ms deadline is still served."""
    variant = _SometimesSlow("fp32")
    cfg = ServerConfig(models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make"),))
    state = build_state(cfg, {"fake": [variant]})
    svc = state.services["fake"]
    url = "/v2/models/fake/versions/fp32/infer"
    with TestClient(lifespan_app(state)) as c:
        warm = [c.post(url, json={**BODY, "parameters": {"deadline_ms": 200}}).status_code for _ in range(150)]
        assert warm.count(200) == 150
        slack = svc.errors[0].slack_ns(time.perf_counter_ns(), svc.batchers[0].margin_ns)
        assert 8 * MS < slack < 60 * MS, slack
        tight = [c.post(url, json={**BODY, "parameters": {"deadline_ms": 15}}) for _ in range(20)]
        assert 16 <= [r.status_code for r in tight].count(503) <= 19, [r.status_code for r in tight]
        assert all(r.json()["error"] == "overloaded (deadline)" for r in tight if r.status_code == 503)
        assert c.post(url, json={**BODY, "parameters": {"deadline_ms": 200}}).status_code == 200
        gauge = 'latencylab_server_admission_slack_seconds{model="fake",variant="fp32"}'
        shown = [line for line in c.get("/metrics").text.splitlines() if line.startswith(gauge)]
        assert shown and float(shown[0].split()[-1]) == pytest.approx(slack / 1e9, rel=0.5)
