"""Admission slack from the recent quantile of prediction errors (serve/slack.py) and its use by the server."""

from __future__ import annotations

import numpy as np
import pytest
from starlette.testclient import TestClient

from fake_variants import FakeVariant, SometimesSlow
from latencylab.clock import FakeClock
from latencylab.serve.app import build_state, lifespan_app
from latencylab.serve.config import ModelConfig, ServerConfig
from latencylab.serve.slack import BoundarySlack

MS = 1_000_000
BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def test_boundary_slack_is_the_error_quantile_of_near_boundary_requests() -> None:
    b = BoundarySlack(0.99, band_ns=5 * MS, window_s=2.0, interval_s=0.1, min_samples=50)
    t = 10**12
    assert b.near(7 * MS, 3 * MS) and not b.near(9 * MS, 3 * MS)  # within margin + slack + band (8 ms)
    assert b.current(t, 3 * MS) == 0
    for i in range(100):  # errors 1..10 ms
        b.observe(t + i * MS, (1 + i % 10) * MS)
    assert b.current(t + 100 * MS, 3 * MS) == int(np.quantile([(1 + i % 10) * MS for i in range(100)], 0.99)) - 3 * MS
    assert b.slack_ns == 7 * MS
    assert b.near(14 * MS, 3 * MS)  # the band moves with the slack: 3 + 7 + 5 ms
    assert b.current(t + 150 * MS, 3 * MS) == 7 * MS  # no update within the interval


def test_boundary_slack_decays_without_evidence() -> None:
    """At loads met with room to spare nothing is admitted near the boundary: the slack halves to 0."""
    b = BoundarySlack(0.99, window_s=2.0, interval_s=0.1, min_samples=50)
    t = 10**12
    b.current(t, 0)
    for i in range(60):
        b.observe(t + i * MS, 40 * MS)
    assert b.current(t + 100 * MS, 0) == 40 * MS
    assert b.current(t + 3_000 * MS, 0) == 20 * MS  # the window emptied: halves at each update
    assert b.current(t + 3_100 * MS, 0) == 10 * MS
    for k in range(30):
        b.current(t + (3_200 + 100 * k) * MS, 0)
    assert b.slack_ns == 0


def test_bad_slack_settings() -> None:
    with pytest.raises(ValueError, match="q must"):
        BoundarySlack(99)


def test_a_late_tail_tightens_admission_until_it_fits() -> None:
    """A quarter of the batches take 15 ms longer than the others; every request has a 12-ms deadline. The
    prediction (a few ms) admits them all at first, near the boundary, and a quarter finish late; the slack
    (their errors' p99) rises until admission refuses what it cannot finish in time. A 200-ms deadline is still
    served. On a fake clock (the variant's costs advance it), so every error the slack learns is the variant's,
    none the machine's."""
    clock = FakeClock()
    variant = SometimesSlow("fp32", clock)
    model = ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make", admission_margin="fixed")
    cfg = ServerConfig(models=(model,))
    state = build_state(cfg, {"fake": [variant]}, clock=clock)
    svc = state.services["fake"]
    url = "/v2/models/fake/versions/fp32/infer"
    idle_gauge = 'latencylab_server_admission_idle_slack_seconds{model="fake",variant="fp32"}'
    with TestClient(lifespan_app(state)) as c:
        codes, slack = [], []
        for _ in range(300):  # one at a time: each with nothing ahead, so the idle slack is the one that learns
            codes.append(c.post(url, json={**BODY, "parameters": {"deadline_ms": 12}}).status_code)
            slack.append(svc.idle_boundary[0].slack_ns)
        assert codes[:20].count(503) <= 2  # nothing to go on yet: admitted on the prediction
        assert codes[-150:].count(503) >= 30, codes[-150:]  # the slack now refuses what would finish late
        assert set(codes) <= {200, 503, 504}
        assert max(slack) >= 3 * MS and slack[0] == 0
        assert svc.boundary[0].slack_ns == 0  # nothing was admitted behind a queue
        assert c.post(url, json={**BODY, "parameters": {"deadline_ms": 200}}).status_code == 200
        shown = [line for line in c.get("/metrics").text.splitlines() if line.startswith(idle_gauge)]
        assert shown and float(shown[0].split()[-1]) * 1e9 == pytest.approx(svc.idle_boundary[0].slack_ns, abs=MS)


@pytest.mark.parametrize("admit_when_idle", [True, False])
def test_a_slack_learned_behind_a_queue_does_not_refuse_an_idle_batcher(admit_when_idle: bool) -> None:
    """Issue 22's sticky low state: the boundary slack (learned from requests admitted behind a queue) grew past the
    whole deadline. With ``admit_when_idle`` a request with nothing ahead of it is judged by the fixed target and the
    idle slack (0 here: the variant takes 2 ms every time) and served; without it, everything is refused but the
    starvation probe once a second, and no answer can teach the slack it was too large."""
    clock = FakeClock()
    model = ModelConfig(
        name="fake", ladder=("fp32",), factory="fake_variants:make", slo_ms=30, default_deadline_ms=30,
        admit_when_idle=admit_when_idle,
    )  # fmt: skip
    state = build_state(ServerConfig(models=(model,)), {"fake": [FakeVariant("fp32", 0.002, clock=clock)]}, clock=clock)
    svc = state.services["fake"]
    url = "/v2/models/fake/versions/fp32/infer"
    with TestClient(lifespan_app(state)) as c:
        now = clock.now_ns
        svc.boundary[0].current(now - 200 * MS, 3 * MS)
        for i in range(60):  # near-boundary errors of 40 ms behind a queue: the slack becomes 37 ms (> 30-ms SLO)
            svc.boundary[0].observe(now - i, 40 * MS)
        clock.advance(0.2)
        codes = []
        for _ in range(20):
            codes.append(c.post(url, json=BODY).status_code)
            clock.advance(0.005)
        # still there (it decays only once its window empties)
        assert svc.boundary[0].current(clock.now_ns, 3 * MS) >= 30 * MS
        if admit_when_idle:
            assert codes == [200] * 20
            assert svc.idle_boundary[0].slack_ns == 0
        else:
            assert codes.count(503) >= 19  # at most the starvation probe gets through
