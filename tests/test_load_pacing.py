"""Send timing (spin or sleep, decided from the other work on the generator's cores) and the run labels that
say what a load result can claim: the mode in the title, closed-loop latency basis, validity, CPU share."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from latencylab.clock import FakeClock
from latencylab.errors import LatencyLabError
from latencylab.load.arrivals import Constant
from latencylab.load.frontend import render_load
from latencylab.load.generator import LoadConfig, Records, RunStats
from latencylab.load.pacing import SpinPolicy, WakeMargin, Waker, proc_stat_busy_s, spin_allowed
from latencylab.load.payloads import fetch_metadata, infer_path, payloads_for_model
from latencylab.load.results import CLOSED_BASIS, OPEN_BASIS, LoadResult, summarize_run
from latencylab.load.runner import load_test
from servers import reference_server

PATH = infer_path("reference")


# -- the spin decision -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "others", "spin"),
    [
        (1, 0.0, False),  # the spin would fill the only core
        (2, 0.0, True),  # one core spins, one stays idle
        (2, 0.05, False),  # anything else on 2 cores: the spin takes CPU from it
        (2, 0.5, False),
        (4, 1.5, True),  # 4 - 1 - 1.5 = 1.5 idle >= max(1, 1.5)
        (4, 1.6, False),
        (16, 1.0, True),
        (16, 7.5, True),
        (16, 7.6, False),
    ],
)
def test_spin_allowed_only_when_a_core_is_free_for_it(cores: int, others: float, spin: bool) -> None:
    assert spin_allowed(cores, others) is spin


class _Machine:
    """Injected CPU readers: total busy seconds on the generator's cores and the generator's own CPU."""

    def __init__(self) -> None:
        self.busy_s: float | None = 0.0
        self.own_s = 0.0
        self.load: float | None = None
        self.reads = 0

    def machine_busy_s(self, cpus: frozenset[int] | None) -> float | None:
        self.reads += 1
        return self.busy_s

    def own_cpu_s(self) -> float:
        return self.own_s

    def loadavg(self) -> float | None:
        return self.load

    def run(self, clock: FakeClock, seconds: float, others: float, own: float) -> None:
        """``seconds`` pass with ``others`` cores of other work and ``own`` cores of the generator's."""
        clock.advance(seconds * 1e9)
        self.own_s += own * seconds
        if self.busy_s is not None:
            self.busy_s += (others + own) * seconds


def _policy(mode: str, cores: int, m: _Machine, clock: FakeClock, machine_cores: int | None = None) -> SpinPolicy:
    return SpinPolicy(
        mode,
        cores,
        machine_cores=machine_cores,
        machine_busy_s=m.machine_busy_s,
        own_cpu_s=m.own_cpu_s,
        loadavg=m.loadavg,
        clock=clock,
        window_s=0.5,
    )


def test_auto_starts_sleeping_and_re_decides_every_window() -> None:
    clock, m = FakeClock(), _Machine()
    p = _policy("auto", 16, m, clock)
    p.start()
    assert p.spin is False  # the server under test is idle before the first request: no decision from that
    m.run(clock, 0.3, others=1.0, own=0.05)
    reads = m.reads
    assert p.tick() is False and m.reads == reads  # within the window: no new sample
    m.run(clock, 0.2, others=1.0, own=0.05)
    assert p.tick() is True  # 16 cores, 1 busy with other work: a core is free for the spin
    # The generator's own spinning is not counted against it: 0.95 cores of own CPU, others unchanged.
    m.run(clock, 0.5, others=1.0, own=0.95)
    assert p.tick() is True
    assert p.others[-1] == (pytest.approx(1.0), pytest.approx(0.5))
    # The machine fills up (say a compile starts): the next window stops the spin.
    m.run(clock, 0.5, others=9.0, own=0.9)
    assert p.tick() is False
    m.run(clock, 0.5, others=2.0, own=0.05)
    assert p.tick() is True
    assert p.others_mean == pytest.approx((1.0 + 1.0 + 9.0 + 2.0) / 4)


def test_auto_never_spins_beside_a_busy_server_on_two_cores() -> None:
    clock, m = FakeClock(), _Machine()
    p = _policy("auto", 2, m, clock)
    p.start()
    for _ in range(6):
        m.run(clock, 0.5, others=0.3, own=0.04)
        assert p.tick() is False
    m.run(clock, 0.2, others=0.6, own=0.04)
    p.finish()  # the last partial window counts in the mean (time-weighted) and decides nothing
    assert p.others_mean == pytest.approx((6 * 0.5 * 0.3 + 0.2 * 0.6) / 3.2)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_fixed_modes_do_not_change_but_still_measure(mode: str) -> None:
    clock, m = FakeClock(), _Machine()
    p = _policy(mode, 16, m, clock)
    p.start()
    for others in (0.0, 15.0, 0.0):
        m.run(clock, 0.5, others=others, own=0.1)
        assert p.tick() is (mode == "on")
    assert [o for o, _ in p.others] == pytest.approx([0.0, 15.0, 0.0])


def test_load_average_is_the_fallback_and_nothing_known_means_sleep() -> None:
    clock, m = FakeClock(), _Machine()
    m.busy_s = None  # no /proc/stat
    m.load = 2.0  # machine-wide, 8 CPUs, the generator may use 4: 1 core of it on ours
    p = _policy("auto", 4, m, clock, machine_cores=8)
    p.start()
    m.run(clock, 0.5, others=0.0, own=0.1)
    assert p.tick() is True
    assert p.others[-1][0] == pytest.approx(2.0 * 4 / 8 - 0.1)
    m.load = 7.0
    m.run(clock, 0.5, others=0.0, own=0.1)
    assert p.tick() is False
    m.load = None
    m.run(clock, 0.5, others=0.0, own=0.1)
    assert p.tick() is False and len(p.others) == 2


def test_spin_mode_is_validated() -> None:
    with pytest.raises(LatencyLabError, match="spin must be one of auto, on, off"):
        LoadConfig(spin="sometimes")
    with pytest.raises(LatencyLabError, match="spin must be one of"):
        SpinPolicy("yes")


def test_proc_stat_busy_reads_only_the_generators_cpus(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(
        "cpu  999 0 0 0 0 0 0 0 0 0\n"
        "cpu0 100 10 20 500 40 1 2 3 0 0\n"
        "cpu1 200 0 0 900 0 0 0 0 0 0\n"
        "cpu2 7 0 0 1 0 0 0 0 0 0\n"
        "intr 5\n"
    )
    tick = os.sysconf("SC_CLK_TCK")
    assert proc_stat_busy_s(frozenset({0, 1}), str(stat)) == pytest.approx((136 + 200) / tick)
    assert proc_stat_busy_s(None, str(stat)) == pytest.approx((136 + 200 + 7) / tick)
    assert proc_stat_busy_s(frozenset({5}), str(stat)) is None
    assert proc_stat_busy_s(None, str(stat) + ".missing") is None


def test_waker_never_wakes_before_the_deadline() -> None:
    async def main() -> list[int]:
        waker = Waker(asyncio.get_running_loop())
        try:
            out = []
            for i in range(20):
                deadline = time.perf_counter_ns() + 1_000_000 + 150_000 * i
                await waker.until(deadline)
                out.append(time.perf_counter_ns() - deadline)
            return out
        finally:
            waker.close()

    late = np.array(asyncio.run(main()))
    assert (late >= 0).all(), late.min()
    # How late is the machine's business (a busy 2-core box: several ms at worst); a lost wake-up is not.
    assert late.max() < 1e9


def test_wake_margin_follows_the_p90_of_recent_wake_ups_within_its_bounds() -> None:
    m = WakeMargin(lo_ns=100_000, hi_ns=1_000_000, start_ns=500_000, n=20, q=0.9)
    assert m.margin_ns == 500_000  # nothing seen yet
    for late in [200_000] * 17 + [300_000] * 3:  # p90 of 20: the 19th smallest (index 18)
        m.observe(late)
    assert m.margin_ns == 300_000
    for _ in range(20):  # wake-ups come on time (or early: counted as 0): the floor holds
        m.observe(-50_000)
    assert m.margin_ns == 100_000
    for _ in range(20):  # a stall of 5 ms is not waited out by spinning: the ceiling holds
        m.observe(5_000_000)
    assert m.margin_ns == 1_000_000
    m.observe(0)  # re-taken every n/4 = 5 wake-ups only
    assert m.margin_ns == 1_000_000
    with pytest.raises(ValueError):
        WakeMargin(lo_ns=600_000, start_ns=500_000)


def test_auto_sleeps_short_of_the_send_and_is_not_counted_as_spinning() -> None:
    # beside the reference server on 2 cores auto sleeps; its sends still leave within the margin
    with reference_server("--service", "constant(1ms)") as url:
        payloads = payloads_for_model(fetch_metadata(url, "reference"), n=4)
        res, rec = load_test(url, PATH, payloads, Constant(50), LoadConfig(duration_s=1.2, spin="auto"), env={})
    s = res.summary
    assert s["spin"] == "auto" and s["sent"] == 60 == s["ok"]
    assert (rec.lateness() >= 0).all()  # never sent before its time
    if s["spin_fraction"] == 0.0:  # slept throughout (the usual case on 2 cores): the short yield is not a spin
        assert s["client_cpu_share"] < 0.5


# -- what a result claims ----------------------------------------------------------------------------------


def _records(n: int = 400, late_every: int = 0) -> Records:
    rng = np.random.default_rng(0)
    intended = np.arange(n, dtype=np.int64) * 10_000_000
    sent = intended + 20_000
    if late_every:
        sent[::late_every] += 3_000_000
    done = sent + rng.integers(2_000_000, 4_000_000, n)
    return Records(
        intended_ns=intended,
        sent_ns=sent,
        done_ns=done,
        outcome=np.zeros(n, dtype=np.int8),
        status=np.full(n, 200, dtype=np.int16),
        payload=np.zeros(n, dtype=np.int32),
        errors={},
        retry_after=[],
    )


def _result(cfg: LoadConfig, rec: Records, run: RunStats, **summary_extra: object) -> LoadResult:
    summary, hists, _ = summarize_run(rec, run, cfg, 100.0 if cfg.mode == "open" else None)
    summary.update(summary_extra)
    return LoadResult(
        target={"url": "http://127.0.0.1:8000", "path": "/v2/models/m/infer"},
        arrivals=None,
        config={"mode": cfg.mode},
        summary=summary,
        histograms={k: h.to_dict() for k, h in hists.items()},
        timeline=(),
        env={},
    )


def _rendered(result: LoadResult) -> str:
    con = Console(record=True, width=200, no_color=True)
    render_load(result, con)
    return con.export_text()


RUN = RunStats(wall_s=4.0, send_span_s=4.0, cpu_s=0.2, connections_opened=8, max_in_flight=2, cpu_share=0.05,
               cores=2, spin="auto", spun=0, other_cpu_cores=0.4)  # fmt: skip


def test_open_loop_table_keeps_its_mode_label_and_reports_cpu_beside_validity() -> None:
    res = _result(LoadConfig(), _records(), RUN, errors_by_reason={"connection lost: [Errno 104] [/x]": 1})
    text = _rendered(res)
    assert "latencylab load: http://127.0.0.1:8000/v2/models/m/infer [open]" in text
    assert "latency p99 (from intended send)" in text
    lines = text.splitlines()
    cpu = next(i for i, ln in enumerate(lines) if "generator CPU share (cores)" in ln)
    assert "0.05 of 2 cores (other work 0.40)" in lines[cpu]
    assert "valid (open-loop sends on time)" in lines[cpu + 1] and lines[cpu + 1].rstrip(" │").endswith("yes")
    assert "spin auto: 0% of sends busy-waited" in text
    assert "errors: 1 x connection lost: [Errno 104] [/x]" in text  # server text is not markup either
    s = res.summary
    assert s["latency_basis"] == OPEN_BASIS and s["valid"] is True
    assert s["client_cpu_share"] == 0.05 and s["client_cpu_percent"] == pytest.approx(5.0)
    assert s["client_cores"] == 2 and s["spin"] == "auto" and s["spin_fraction"] == 0.0


def test_late_open_loop_run_is_invalid_and_says_so() -> None:
    res = _result(LoadConfig(), _records(late_every=20), RUN)
    assert res.summary["valid"] is False
    text = _rendered(res)
    assert "invalid: generator fell behind: 5.0% of requests" in text
    row = next(ln for ln in text.splitlines() if "valid (open-loop sends on time)" in ln)
    assert row.rstrip(" │").endswith("NO")


def test_closed_loop_is_labelled_as_closed_loop_in_table_and_json() -> None:
    cfg = LoadConfig(mode="closed", concurrency=1)
    rec = _records()
    rec.intended_ns = rec.sent_ns.copy()  # closed loop: intended = sent
    closed_run = RunStats(wall_s=4.0, send_span_s=4.0, cpu_s=0.2, connections_opened=1, max_in_flight=1,
                          cpu_share=0.05, cores=2)  # fmt: skip
    res = _result(cfg, rec, closed_run)
    s = json.loads(json.dumps(res.to_dict()))["summary"]
    assert s["latency_basis"] == CLOSED_BASIS == "closed loop: from actual send; coordinated omission not corrected"
    assert s["valid"] is None  # not judged: no open-loop verdict is claimed
    assert s["spin"] is None and s["spin_fraction"] is None
    text = _rendered(res)
    assert "latencylab load: http://127.0.0.1:8000/v2/models/m/infer [closed (concurrency 1)]" in text
    assert f"latency p99 ({CLOSED_BASIS})" in text
    assert "from intended send" not in text
    assert "not judged (closed loop)" in text
    assert "uncorrected" not in text  # the same figures again in closed loop
    assert "valid (open-loop sends on time)" in text and "yes" not in text


def test_old_results_without_the_new_fields_still_render() -> None:
    res = _result(LoadConfig(mode="closed", concurrency=2), _records(), RUN)
    s = dict(res.summary)
    for key in ("latency_basis", "client_cpu_share", "client_cores", "spin", "spin_fraction", "other_cpu_cores"):
        s.pop(key)
    s["valid"] = True
    old = LoadResult(res.target, None, res.config, s, res.histograms, (), {})
    text = _rendered(old)
    assert f"latency p50 ({CLOSED_BASIS})" in text  # the basis follows the mode
    assert "5% of one core" in text


# -- end to end against the reference server ----------------------------------------------------------------


@pytest.mark.parametrize("spin", ["off", "on"])
def test_spin_mode_is_obeyed_and_cpu_share_reported(spin: str) -> None:
    with reference_server("--service", "constant(2ms)") as url:
        payloads = payloads_for_model(fetch_metadata(url, "reference"), n=4)
        res, _ = load_test(url, PATH, payloads, Constant(50), LoadConfig(duration_s=1.2, spin=spin), env={})
    s = res.summary
    assert s["spin"] == spin and s["sent"] == 60 == s["ok"]
    if spin == "off":
        assert s["spin_fraction"] == 0.0
    else:  # a send whose coarse sleep overshot its time (a busy machine) has nothing left to spin for
        assert s["spin_fraction"] > 0.0
    assert s["client_cores"] >= 1 and 0.0 <= s["client_cpu_share"] <= s["client_cores"]
    assert s["client_cpu_percent"] == pytest.approx(100 * s["client_cpu_share"])
    assert s["other_cpu_cores"] is not None and 0.0 <= s["other_cpu_cores"] <= s["client_cores"]
