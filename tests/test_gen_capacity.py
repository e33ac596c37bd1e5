"""``latencylab load --api ... --find-capacity``: the capacity search on a goodput SLO.

The per-request judgement (missed any objective) by hand, the search's ``Segment.missed`` hook on a fake
server, and one coarse CLI search of the reference streaming server in its queueing mode (``--slots``), judged
against bounds from the server's law (an M/D/c queue). The search's precision against a real server's truth is
tests/test_load_capacity_reference.py's (M/D/1, within -30%/+10%); a second, finer generative search (6-s
chunks to 10%, within -20%/+25% of the M/D/2 truth) took 2-4 minutes of the suite's 10 alone, and checked
nothing of the generative path that this search and the fake-server test do not (issue 14).
"""

from __future__ import annotations

import heapq
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from latencylab.errors import LatencyLabError
from latencylab.load.capacity import SearchConfig, Segment, search_capacity
from latencylab.load.gen_capacity import GoodputSlo, missed_any
from latencylab.load.generator import Records
from latencylab.load.sse import Trace
from latencylab.load.token_metrics import TokenSlo
from servers import stream_server

MS = 1_000_000


def test_goodput_slo_needs_one_percentile() -> None:
    slo = GoodputSlo.of([TokenSlo.parse("ttft_p99=2s"), TokenSlo.parse("tpot_p99=250ms")])
    assert slo.q == 0.99 and slo.describe() == "ttft_p99<=2000ms & tpot_p99<=250ms"
    with pytest.raises(LatencyLabError, match="same one"):
        GoodputSlo.of([TokenSlo.parse("ttft_p99=2s"), TokenSlo.parse("tpot_p90=250ms")])
    with pytest.raises(LatencyLabError, match="needs --slo"):
        GoodputSlo.of([])


def test_missed_any_judges_each_request_on_every_objective() -> None:
    # 0: TTFT 100, TPOT 20 (meets both); 1: TTFT 300 (misses TTFT); 2: TPOT 60 (misses TPOT);
    # 3: one token, TTFT 50 (no TPOT: within); 4: failed (the search's "failed", flag irrelevant)
    traces = [
        Trace([100 * MS, 120 * MS, 140 * MS], [1, 1, 1]),
        Trace([400 * MS, 410 * MS], [1, 1]),
        Trace([300 * MS, 360 * MS, 420 * MS], [1, 1, 1]),
        Trace([350 * MS], [1]),
        Trace([], [], error="x"),
    ]
    rec = Records(
        intended_ns=np.array([0, 100, 200, 300, 400]) * MS, sent_ns=np.array([0, 100, 200, 300, 400]) * MS,
        done_ns=np.array([140, 410, 420, 350, 450]) * MS, outcome=np.array([0, 0, 0, 0, 2], dtype=np.int8),
        status=np.array([200] * 5), payload=np.zeros(5, dtype=np.int32), errors={}, retry_after=[], traces=traces,
    )  # fmt: skip
    slos = [TokenSlo.parse("ttft_p99=200ms"), TokenSlo.parse("tpot_p99=50ms")]
    assert missed_any(rec, slos).tolist()[:4] == [False, True, True, False]
    assert missed_any(rec, slos[:1]).tolist()[:4] == [False, True, False, False]


def _fake_measure(capacity: float):  # type: ignore[no-untyped-def]
    """A server that is fine below ``capacity`` and, above it, makes 20% of its answers miss an objective
    (their end-to-end latency stays low: only the flags can fail the step)."""

    def measure(rate: float, seconds: float, seed: int, abort):  # type: ignore[no-untyped-def]
        rng = np.random.default_rng(seed)
        n = int(rate * seconds)
        intended = np.sort(rng.uniform(0, seconds, n) * 1e9).astype(np.int64)
        missed = rng.random(n) < (0.2 if rate > capacity else 0.0)
        return Segment(rate, intended, intended + 5 * MS, np.zeros(n, dtype=np.int8), missed=missed)

    return measure


def test_search_judges_the_missed_flags_not_the_latency() -> None:
    slo = GoodputSlo.of([TokenSlo.parse("ttft_p99=1ms")])  # every latency (5 ms) is over 1 ms: flags decide
    cfg = SearchConfig(start_rate=50, chunk_s=4, warmup_s=0, search_warmup_s=0, precision=0.1, max_chunks=4)
    cap = search_capacity(_fake_measure(130), slo, cfg)
    assert cap.capacity_rate is not None and 130 / 1.1 <= cap.capacity_rate <= 130
    assert cap.slo == "ttft_p99<=1ms"
    fails = [s for s in cap.steps if s["verdict"] == "fail"]
    assert fails and all("missed" in s["why"] and "allowed" in s["why"] for s in fails)
    assert all(s["late"] == 0 for s in cap.steps if s["offered_rate"] <= 130)


def md_c_capacity(c: int, service_s: float, ttft_s: float, limit_s: float, q: float = 0.99) -> float:
    """The highest Poisson rate at which an M/D/c FIFO queue keeps the ``q`` quantile of (wait + ttft) within
    ``limit_s`` (simulated: 60 000 arrivals per rate, bisected to 1%)."""

    def ok(rate: float) -> bool:
        rng = np.random.default_rng(7)
        arrivals = np.cumsum(rng.exponential(1 / rate, 60_000))
        free = [0.0] * c
        waits = np.empty(arrivals.size)
        for i, a in enumerate(arrivals):
            start = max(a, heapq.heappop(free))
            waits[i] = start - a
            heapq.heappush(free, start + service_s)
        return float(np.quantile(waits[5000:], q)) + ttft_s <= limit_s

    lo, hi = 0.0, c / service_s
    while hi / max(lo, 1e-9) - 1 > 0.01:
        mid = (lo + hi) / 2 if lo else hi / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


# The law: 2 slots, TTFT 10 ms, 4 tokens 5 ms apart: each stream holds a slot 25 ms (at most 80 streams/s);
# TTFT p99 <= 60 ms leaves 50 ms of queueing.
SLOTS, TTFT_S, GAP_S, TOKENS, LIMIT_S = 2, 0.010, 0.005, 4, 0.060
SERVICE_S = TTFT_S + (TOKENS - 1) * GAP_S
LAW = ("--slots", str(SLOTS), "--ttft", f"constant({TTFT_S * 1e3:g}ms)", "--gap", f"constant({GAP_S * 1e3:g}ms)")


def _search(url: str, tmp_path: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    out = tmp_path / "cap.json"
    p = subprocess.run(
        [sys.executable, "-m", "latencylab", "load", "--url", url, "--model", "reference", "--api", "chat",
         "--max-tokens", str(TOKENS), "--slo", f"ttft_p99={LIMIT_S * 1e3:g}ms", "--slo", "tpot_p99=50ms",
         "--find-capacity", "--max-rate", "320", "--json", str(out), "--quiet", *extra],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "capacity search for ttft_p99<=60ms & tpot_p99<=50ms" in p.stdout and "capacity:" in p.stdout, p.stdout
    assert "ttft p99" in p.stdout and "tpot p99" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["kind"] == "capacity" and doc["summary"]["objectives"] == ["ttft_p99<=60ms", "tpot_p99<=50ms"]
    return doc


def test_cli_capacity_of_the_queueing_reference_server_is_bracketed(tmp_path: Path) -> None:
    """Coarse and short (precision 50%, 1-s chunks): the answer passes, the next rate up fails on TTFT, and it
    lies below the server's hard ceiling (2 slots / 25 ms = 80/s: there the queue only grows) and above half the
    M/D/2 truth. Short chunks start with an empty queue that has no time to reach its steady state, so they
    pass rates somewhat above the steady-state truth (60/s here, against 46/s): the ceiling is the bound."""
    truth = md_c_capacity(SLOTS, SERVICE_S, TTFT_S, LIMIT_S)
    assert 40 < truth < 80  # the law's own capacity, with margin from both ends
    with stream_server(*LAW) as url:
        doc = _search(url, tmp_path, "--start-rate", "40", "--step-duration", "1", "--warmup", "0.2",
                      "--max-chunks", "3", "--precision", "0.5")  # fmt: skip
    cap = doc["summary"]["capacity_rate"]
    steps = doc["capacity"]["steps"]
    if doc["capacity"]["generator_bound"]:
        # the load generator fell behind above the answer (a busy machine): a lower bound, still under the ceiling
        assert cap is None or cap < SLOTS / SERVICE_S, (cap, steps)
        pytest.skip(f"the generator fell behind: {doc['capacity']['reason']}")
    assert cap is not None and 0.5 * truth <= cap < SLOTS / SERVICE_S, (cap, truth, steps)
    passing = [s for s in steps if s["passed"]]
    failing = [s for s in steps if not s["passed"] and s["verdict"] != "invalid" and s["offered_rate"] > cap]
    assert passing and failing and min(s["offered_rate"] for s in failing) <= 1.5 * cap * 1.01
    assert all(s["ttft_p99_ms"] is not None for s in steps)
    # the failures are late first tokens (queueing), not failed requests
    assert all(s.get("failed", 0) == 0 for s in steps) and any(s.get("late", 0) > 0 for s in failing)


def test_cli_refuses_what_it_cannot_search() -> None:
    for extra, msg in (
        (("--slo", "ttft_p99=1s", "--slo", "tpot_p90=1s"), "same one"),
        (("--slo", "ttft_p99=1s", "--concurrency", "2"), "searches Poisson rates itself"),
        ((), "needs --slo"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "latencylab", "load", "--url", "http://127.0.0.1:9", "--model", "m", "--api",
             "chat", "--find-capacity", *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert p.returncode == 2 and msg in p.stderr, (extra, p.stderr)
