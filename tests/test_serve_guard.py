from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from latencylab.clock import FakeClock
from latencylab.errors import LatencyLabError
from latencylab.serve.guard import Alarm, GuardConfig, SloGuard, Transition, webhook_notifier

MS = 1_000_000
S = 1_000_000_000
LEVELS = ["fp32", "minilm-l3", "int8", "cache"]


def make(levels: list[str] = LEVELS, **kw: Any) -> tuple[SloGuard, FakeClock, list[Alarm]]:
    clock = FakeClock()
    alarms: list[Alarm] = []
    g = SloGuard(levels, GuardConfig(slo_ms=100.0, **kw), clock, alarms.append)
    return g, clock, alarms


def feed(g: SloGuard, level: int, n: int, ms: float) -> None:
    for _ in range(n):
        g.observe(level, ms * MS)


def drive(
    g: SloGuard, clock: FakeClock, seconds: float, latency_ms: Callable[[int], float], per_tick: int = 2
) -> list[Transition]:
    """Simulated traffic: every 10 ms ``per_tick`` requests are routed and observed; evaluate every 100 ms."""
    made = []
    for tick in range(round(seconds * 100)):
        clock.advance(10 * MS)
        for _ in range(per_tick):
            lvl = g.route()
            g.observe(lvl, latency_ms(lvl) * MS)
        if tick % 10 == 9:
            t = g.evaluate()
            if t is not None:
                made.append(t)
    return made


def step_down(g: SloGuard, clock: FakeClock) -> Transition:
    """Pass the dwell and breach the current level: exactly one DOWN."""
    clock.advance(g.config.dwell_s * S)
    feed(g, g.level, g.config.min_samples, 150.0)
    t = g.evaluate()
    assert t is not None and t.direction == "down"
    return t


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"slo_ms": 0},
        {"slo_ms": float("nan")},
        {"q": 99},
        {"q": 1.0},
        {"q": 0.0},
        {"exit_ratio": 1.0},
        {"exit_ratio": 1.2, "enter_ratio": 1.1},
        {"window_s": 0},
        {"bucket_s": 20.0},
        {"window_s": 10_000.0, "bucket_s": 0.001},
        {"dwell_s": -1},
        {"min_samples": 0},
        {"probe_min_samples": 2.5},
        {"probe_fraction": 0},
        {"probe_fraction": 0.9},
    ],
)
def test_config_rejects_nonsense(kw: dict[str, Any]) -> None:
    args = {"slo_ms": 100.0, **kw}
    with pytest.raises(LatencyLabError):
        GuardConfig(**args)


def test_config_derived_values() -> None:
    cfg = GuardConfig(slo_ms=100)
    assert (cfg.n_buckets, cfg.probe_every) == (10, 20)
    assert GuardConfig(slo_ms=100, window_s=2.5, bucket_s=1.0).n_buckets == 3
    assert GuardConfig(slo_ms=100, probe_fraction=0.3).probe_every == 3


def test_levels_must_be_distinct_and_nonempty() -> None:
    cfg = GuardConfig(slo_ms=100)
    with pytest.raises(LatencyLabError):
        SloGuard([], cfg, FakeClock())
    with pytest.raises(LatencyLabError):
        SloGuard(["fp32", "fp32"], cfg, FakeClock())
    g = SloGuard(LEVELS, cfg, FakeClock())
    assert (g.level, g.level_name, g.levels) == (0, "fp32", tuple(LEVELS))
    with pytest.raises(ValueError):
        g.observe(4, MS)


# -- stepping down ---------------------------------------------------------------------------


def test_steps_down_on_p99_breach_but_not_before_min_samples(caplog: pytest.LogCaptureFixture) -> None:
    g, clock, _ = make()
    clock.advance(5 * S)
    feed(g, 0, 49, 150.0)
    assert g.evaluate() is None  # 49 < min_samples
    feed(g, 0, 1, 150.0)
    with caplog.at_level(logging.INFO, logger="latencylab.serve.guard"):
        t = g.evaluate()
    assert t is not None
    assert (t.from_level, t.to_level, t.from_name, t.to_name) == (0, 1, "fp32", "minilm-l3")
    assert (g.level, g.level_name) == (1, "minilm-l3")
    assert t.at_s == 5.0
    assert t.quantile_ms == pytest.approx(150.0, rel=1e-3)
    assert "p99 150.0" in t.reason and "SLO 100 ms" in t.reason and "50 requests" in t.reason
    assert g.transitions == [t]
    [rec] = [r for r in caplog.records if r.name == "latencylab.serve.guard"]
    assert rec.levelno == logging.WARNING and "fp32 -> minilm-l3" in rec.getMessage()


def test_decides_on_the_quantile_not_the_mean() -> None:
    # 100 samples: p99 is the 99th smallest. Means (13.8 ms, 12.9 ms) are far below the SLO either way.
    g, clock, _ = make()
    clock.advance(5 * S)
    feed(g, 0, 99, 10.0)
    feed(g, 0, 1, 300.0)
    assert g.evaluate() is None
    assert g.window_quantile(0) == pytest.approx(10.0, rel=1e-3)
    g2, clock2, _ = make()
    clock2.advance(5 * S)
    feed(g2, 0, 98, 10.0)
    feed(g2, 0, 2, 200.0)
    t = g2.evaluate()
    assert t is not None and t.quantile_ms == pytest.approx(200.0, rel=1e-3)


def test_exactly_at_the_threshold_is_not_a_breach() -> None:
    g, clock, _ = make()
    clock.advance(5 * S)
    feed(g, 0, 100, 99.9)  # HDR reports the top of the bucket: still <= 100 ms
    assert g.evaluate() is None
    feed(g, 0, 10, 101.0)
    assert g.evaluate() is not None


def test_dwell_holds_each_level_before_any_step() -> None:
    g, clock, _ = make()
    clock.advance(1 * S)
    feed(g, 0, 100, 150.0)
    clock.advance(4 * S - 1)  # 1 ns short of the 5 s dwell since construction
    assert g.evaluate() is None
    clock.advance(1)
    assert g.evaluate() is not None
    # at level 1 now: a breach right away waits for the dwell again
    feed(g, 1, 100, 150.0)
    clock.advance(4 * S)
    assert g.evaluate() is None
    clock.advance(1 * S)
    t = g.evaluate()
    assert t is not None and (t.from_level, t.to_level, t.at_s) == (1, 2, 10.0)


def test_the_last_level_cannot_step_further_down() -> None:
    g, clock, _ = make(levels=["fp32", "cache"])
    step_down(g, clock)
    clock.advance(5 * S)
    feed(g, 1, 100, 500.0)
    assert g.evaluate() is None
    assert g.level == 1


def test_stepping_down_starts_the_new_levels_window_empty() -> None:
    g, clock, _ = make()
    feed(g, 1, 100, 150.0)  # level 1 was slow earlier (e.g. during a previous stint)
    step_down(g, clock)
    assert g.window_quantile(1) is None
    clock.advance(5 * S)
    assert g.evaluate() is None  # old evidence does not push it further down
    feed(g, 1, 50, 150.0)
    assert g.evaluate() is not None


# -- window ----------------------------------------------------------------------------------


def test_window_forgets_old_buckets() -> None:
    g, clock, _ = make()
    clock.advance(S // 2)  # t = 0.5 s: bucket 0
    feed(g, 0, 100, 150.0)
    clock.advance(6 * S)  # t = 6.5 s: bucket 6
    feed(g, 0, 100, 20.0)
    assert g.window_quantile(0) == pytest.approx(150.0, rel=1e-3)
    assert g.snapshot()["levels"][0]["window_count"] == 200
    clock.advance(3_500_000_000 - 1)  # t = 9.999999999 s: bucket 0 still inside (buckets 0..9)
    assert g.snapshot()["levels"][0]["window_count"] == 200
    clock.advance(1)  # t = 10 s: bucket 10, the window is buckets 1..10
    assert g.snapshot()["levels"][0]["window_count"] == 100
    assert g.window_quantile(0) == pytest.approx(20.0, rel=1e-3)
    assert g.evaluate() is None  # the forgotten breach decides nothing
    clock.advance(7 * S)  # t = 17 s: bucket 6 is gone too
    assert g.window_quantile(0) is None


def test_ring_slot_reuse_resets_the_old_bucket() -> None:
    g, clock, _ = make(window_s=2.0, bucket_s=1.0)
    feed(g, 0, 10, 150.0)  # bucket 0, slot 0
    clock.advance(2 * S)  # bucket 2 reuses slot 0
    feed(g, 0, 3, 5.0)
    snap = g.snapshot()["levels"][0]
    assert snap["window_count"] == 3
    assert snap["window_quantile_ms"] == pytest.approx(5.0, rel=1e-3)


def test_window_merges_histograms_across_buckets() -> None:
    # 90 fast samples in one bucket, 10 slow in another: p99 of the merged window is slow,
    # while neither bucket's own p99 averaged with the other's would say 150 ms.
    g, clock, _ = make()
    feed(g, 0, 90, 10.0)
    clock.advance(S)
    feed(g, 0, 10, 150.0)
    assert g.window_quantile(0) == pytest.approx(150.0, rel=1e-3)
    feed(g, 0, 900, 10.0)  # now 1000 samples, 10 slow: rank 990 is fast
    assert g.window_quantile(0) == pytest.approx(10.0, rel=1e-3)


# -- probes and stepping up ------------------------------------------------------------------


def test_probes_route_exactly_one_in_n_up_after_the_dwell() -> None:
    g, clock, _ = make()
    assert all(g.route() == 0 for _ in range(1000))  # at the top: no probes
    step_down(g, clock)
    assert all(g.route() == 1 for _ in range(1000))  # within the dwell: no probes
    clock.advance(5 * S)
    routed = [g.route() for _ in range(1000)]
    assert routed.count(0) == 50 and routed.count(1) == 950
    assert [i for i, lvl in enumerate(routed) if lvl == 0] == list(range(19, 1000, 20))


def test_probe_share_follows_probe_fraction() -> None:
    g, clock, _ = make(probe_fraction=0.3)  # N = round(3.33) = 3
    step_down(g, clock)
    clock.advance(5 * S)
    assert [g.route() for _ in range(9)] == [1, 1, 0, 1, 1, 0, 1, 1, 0]


def test_steps_up_only_after_enough_fast_probes(caplog: pytest.LogCaptureFixture) -> None:
    g, clock, _ = make()
    step_down(g, clock)
    clock.advance(5 * S)
    probes = 0
    while probes < 29:
        lvl = g.route()
        g.observe(lvl, (20.0 if lvl == 0 else 50.0) * MS)
        probes += lvl == 0
    assert g.evaluate() is None  # 29 < probe_min_samples
    while g.route() != 0:
        pass
    g.observe(0, 20 * MS)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="latencylab.serve.guard"):
        t = g.evaluate()
    assert t is not None and (t.from_level, t.to_level, t.direction) == (1, 0, "up")
    assert t.quantile_ms == pytest.approx(20.0, rel=1e-3)
    assert "probe p99 20.0" in t.reason and "30 probes" in t.reason and "SLO 100 ms" in t.reason
    assert [r.levelno for r in caplog.records if r.name == "latencylab.serve.guard"] == [logging.INFO]
    # the level's window restarts from the probes that justified the step
    assert g.snapshot()["levels"][0]["window_count"] == 30
    assert g.window_quantile(0) == pytest.approx(20.0, rel=1e-3)


def test_slow_probes_keep_the_guard_down() -> None:
    g, clock, _ = make()
    step_down(g, clock)
    made = drive(g, clock, 30.0, lambda lvl: 80.0 if lvl == 0 else 30.0, per_tick=5)
    assert made == []
    snap = g.snapshot()["levels"][0]
    assert snap["probe_count"] > 30 and snap["probe_quantile_ms"] == pytest.approx(80.0, rel=1e-3)


def test_stragglers_before_probing_are_not_probes() -> None:
    g, clock, _ = make()
    step_down(g, clock)
    feed(g, 0, 100, 20.0)  # in-flight requests of level 0 finishing after the step down
    clock.advance(5 * S)
    assert g.snapshot()["levels"][0]["probe_count"] == 0
    assert g.evaluate() is None


def test_callers_can_say_what_is_a_probe() -> None:
    g, clock, _ = make()
    step_down(g, clock)
    clock.advance(5 * S)
    assert g.route() == 1  # probing has begun (call 1 of 20)
    for _ in range(19):
        g.route()
    feed(g, 0, 5, 20.0)  # inferred: probes
    for _ in range(10):
        g.observe(0, 20 * MS, probe=False)  # e.g. fall-through traffic the caller knows is not a probe
    assert g.snapshot()["levels"][0]["probe_count"] == 5
    for _ in range(25):
        g.observe(0, 20 * MS, probe=True)
    assert g.snapshot()["levels"][0]["probe_count"] == 30
    t = g.evaluate()
    assert t is not None and t.to_level == 0


def test_steps_up_whether_or_not_the_current_level_is_healthy() -> None:
    g, clock, _ = make()
    step_down(g, clock)
    # level 1 at 90 ms: not healthy (>= 70), not breaching (<= 100); probes at 0 are fast
    made = drive(g, clock, 10.0, lambda lvl: 20.0 if lvl == 0 else 90.0, per_tick=5)
    assert [(t.from_level, t.to_level) for t in made] == [(1, 0)]


def test_down_wins_when_the_current_level_breaches_and_probes_are_fast() -> None:
    g, clock, _ = make()
    step_down(g, clock)
    clock.advance(5 * S)
    for _ in range(40 * 20):  # 40 fast probes at level 0, 760 slow requests at level 1
        lvl = g.route()
        g.observe(lvl, (20.0 if lvl == 0 else 150.0) * MS)
    snap = g.snapshot()["levels"]
    assert (snap[0]["probe_count"], snap[1]["window_count"]) == (40, 760)
    t = g.evaluate()
    assert t is not None and (t.from_level, t.to_level) == (1, 2)
    assert g.evaluate() is None and g.level == 2


def test_hysteresis_no_flapping_between_exit_and_enter() -> None:
    g, clock, _ = make()
    hover = lambda lvl: 85.0  # noqa: E731  (between 0.7 x 100 and 1.0 x 100 ms)
    assert drive(g, clock, 30.0, hover) == []  # never steps down at the top
    step_down(g, clock)
    assert drive(g, clock, 30.0, hover) == []  # nor back up from below
    assert g.level == 1
    made = drive(g, clock, 30.0, lambda lvl: 60.0)  # below the exit threshold: back up, once
    assert [(t.from_level, t.to_level) for t in made] == [(1, 0)]
    assert drive(g, clock, 30.0, hover) == []
    assert len(g.transitions) == 2


def test_full_ladder_down_and_back_up_with_alarm(caplog: pytest.LogCaptureFixture) -> None:
    g, clock, alarms = make()
    overloaded = {0: 300.0, 1: 200.0, 2: 150.0, 3: 1.0}
    with caplog.at_level(logging.INFO, logger="latencylab.serve.guard"):
        made = drive(g, clock, 20.0, overloaded.__getitem__, per_tick=5)
        assert [(t.from_level, t.to_level) for t in made] == [(0, 1), (1, 2), (2, 3)]
        assert g.level_name == "cache" and g.alarm_active
        [raised] = alarms
        assert raised.active and raised.level_name == "cache" and raised.at_s == made[-1].at_s
        assert "int8" in raised.message and "p99 150.0" in raised.message
        assert any(r.levelno == logging.ERROR and "ALARM" in r.getMessage() for r in caplog.records)
        made = drive(g, clock, 60.0, lambda lvl: 10.0, per_tick=5)
    assert [(t.from_level, t.to_level) for t in made] == [(3, 2), (2, 1), (1, 0)]
    assert len(alarms) == 2
    cleared = alarms[1]
    assert not cleared.active and cleared.level_name == "cache" and cleared.at_s == made[0].at_s
    assert "int8" in cleared.message
    assert not g.alarm_active and not g.snapshot()["alarm"]


def test_alarm_callback_errors_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def boom(alarm: Alarm) -> None:
        raise RuntimeError("receiver down")

    clock = FakeClock()
    g = SloGuard(["fp32", "cache"], GuardConfig(slo_ms=100.0), clock, boom, name="text")
    with caplog.at_level(logging.INFO, logger="latencylab.serve.guard"):
        step_down(g, clock)
    assert g.alarm_active
    assert any("alarm callback failed" in r.getMessage() and "'text'" in r.getMessage() for r in caplog.records)


# -- switch time -----------------------------------------------------------------------------


def test_switch_time_is_decision_to_first_response_at_the_new_level() -> None:
    g, clock, _ = make()
    assert g.first_served(0) is None  # no transition into level 0 yet
    t = step_down(g, clock)
    assert g.transitions[-1].switch_time_s is None
    clock.advance(37 * MS)
    assert g.first_served(0) is None  # a straggler at the old level
    assert g.first_served(1) == pytest.approx(0.037)
    assert g.first_served(1) is None  # only the first response counts
    assert g.transitions[-1].switch_time_s == pytest.approx(0.037)
    assert g.transitions[-1].at_s == t.at_s
    assert g.snapshot()["transitions"][-1]["switch_time_s"] == pytest.approx(0.037)


def test_switch_that_never_completed_reports_nothing() -> None:
    g, clock, _ = make()
    step_down(g, clock)  # into 1, nothing served there
    step_down(g, clock)  # into 2
    assert g.first_served(1) is None
    clock.advance(12 * MS)
    assert g.first_served(2) == pytest.approx(0.012)
    assert [t.switch_time_s for t in g.transitions] == [None, pytest.approx(0.012)]


# -- snapshot --------------------------------------------------------------------------------


def test_snapshot_is_json_and_complete() -> None:
    g, clock, _ = make()
    step_down(g, clock)
    clock.advance(2 * S)
    feed(g, 1, 10, 40.0)
    snap = g.snapshot()
    json.dumps(snap)
    assert snap["level"] == 1 and snap["level_name"] == "minilm-l3"
    assert snap["at_level_s"] == 2.0 and snap["slo_ms"] == 100.0 and snap["q"] == 0.99
    assert [lv["name"] for lv in snap["levels"]] == LEVELS
    assert snap["levels"][0]["window_count"] == 50
    assert snap["levels"][1]["window_count"] == 10
    assert snap["levels"][1]["window_quantile_ms"] == pytest.approx(40.0, rel=1e-3)
    assert snap["levels"][2] == {
        "name": "int8",
        "window_count": 0,
        "window_quantile_ms": None,
        "probe_count": 0,
        "probe_quantile_ms": None,
    }
    assert snap["alarm"] is False and snap["transitions_total"] == 1
    assert snap["transitions"][0]["direction"] == "down"


def test_default_clock_is_the_host_clock() -> None:
    g = SloGuard(LEVELS, GuardConfig(slo_ms=100.0))
    g.observe(0, 5 * MS)
    assert g.window_quantile(0) == pytest.approx(5.0, rel=1e-3)
    assert g.evaluate() is None


def test_concurrent_observers_lose_no_samples() -> None:
    g, _, _ = make()

    def work() -> None:
        for _ in range(2000):
            g.observe(g.route(), 5 * MS)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert g.snapshot()["levels"][0]["window_count"] == 16_000


# -- webhook ---------------------------------------------------------------------------------


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def receiver(no_proxy: None) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"got": threading.Event(), "release": threading.Event(), "bodies": [], "headers": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state["bodies"].append(json.loads(body))
            state["headers"].append(dict(self.headers))
            state["path"] = self.path
            state["got"].set()
            state["release"].wait(10)  # hold the response: the sender must not be waiting for it
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/alarm"
    try:
        yield state
    finally:
        state["release"].set()
        server.shutdown()
        server.server_close()


def test_webhook_posts_the_alarm_as_json_without_blocking(receiver: dict[str, Any]) -> None:
    notify = webhook_notifier(receiver["url"], timeout_s=5.0)
    alarm = Alarm(12.5, True, "cache", "int8 breached its SLO")
    notify(alarm)  # returns while the receiver still holds the response
    assert receiver["got"].wait(5.0)
    assert not receiver["release"].is_set()
    receiver["release"].set()
    assert receiver["bodies"] == [
        {
            "source": "latencylab",
            "at_s": 12.5,
            "active": True,
            "level_name": "cache",
            "message": "int8 breached its SLO",
        }
    ]
    assert receiver["path"] == "/alarm"
    assert receiver["headers"][0]["Content-Type"] == "application/json"


def test_webhook_wired_as_the_guards_alarm(receiver: dict[str, Any]) -> None:
    clock = FakeClock()
    g = SloGuard(["fp32", "cache"], GuardConfig(slo_ms=100.0), clock, webhook_notifier(receiver["url"]))
    step_down(g, clock)
    assert receiver["got"].wait(5.0)
    receiver["release"].set()
    [body] = receiver["bodies"]
    assert body["active"] is True and body["level_name"] == "cache" and body["at_s"] == 5.0


def test_webhook_swallows_a_refused_connection(no_proxy: None, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # nothing listens on ``port`` now
    caplog.set_level(logging.WARNING, logger="latencylab.serve.guard")
    notify = webhook_notifier(f"http://127.0.0.1:{port}/alarm", timeout_s=2.0)
    notify(Alarm(1.0, True, "cache", "x"))  # does not raise
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if any("alarm webhook" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records):
            break
        time.sleep(0.01)
    else:
        pytest.fail("the refused POST was not logged")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "127.0.0.1:9000/alarm", "ftp://example.com/x"])
def test_webhook_wants_an_http_url(url: str) -> None:
    with pytest.raises(LatencyLabError):
        webhook_notifier(url)


def _idle(g: SloGuard, clock: FakeClock, seconds: float) -> list[Transition]:
    """No traffic at all for ``seconds``: only the periodic evaluation (every 100 ms)."""
    made = []
    for _ in range(round(seconds * 10)):
        clock.advance(100 * MS)
        t = g.evaluate()
        if t is not None:
            made.append(t)
    return made


def test_a_quiet_server_steps_back_up_to_the_top_and_clears_the_alarm() -> None:
    """After a burst the guard sat on the cache rung, alarm raised, for as long as no traffic came (probes come
    only with traffic). Now a whole window (10 s) at a level with too few samples to have stepped down on is no
    evidence of a breach: one level up per window, back to the top, alarm cleared."""
    g, clock, alarms = make()
    for _ in range(3):
        step_down(g, clock)
    assert g.level_name == "cache" and g.alarm_active
    entered = clock.now_ns
    made = _idle(g, clock, 35.0)
    assert [(t.from_level, t.to_level) for t in made] == [(3, 2), (2, 1), (1, 0)]
    assert [round(t.at_s - entered / 1e9, 6) for t in made] == [10.0, 20.0, 30.0]  # a full window at each level
    assert all(t.reason.startswith("quiet: 0 request(s)") and t.quantile_ms is None for t in made)
    assert not g.alarm_active and [a.active for a in alarms] == [True, False]


def test_quiet_recovery_needs_too_few_samples_and_no_slow_probe() -> None:
    """Traffic enough to judge (min_samples in the window) keeps the guard where it is, as does a probe of the
    level above that breaches the SLO; below min_samples with healthy (or no) probes, it steps up."""
    g, clock, _ = make(min_samples=10)
    step_down(g, clock)
    for _ in range(100):  # 10 samples per second at level 1, healthy: judged by the rules, no quiet step
        clock.advance(100 * MS)
        g.observe(1, 20 * MS)
        assert g.evaluate() is None
    g2, clock2, _ = make(min_samples=10)
    step_down(g2, clock2)
    clock2.advance(11 * S)
    g2.observe(0, 500 * MS, probe=True)  # the level above is still slow
    assert g2.evaluate() is None and g2.level == 1
    clock2.advance(10 * S)  # that probe has left the window too
    t = g2.evaluate()
    assert t is not None and (t.from_level, t.to_level) == (1, 0)
