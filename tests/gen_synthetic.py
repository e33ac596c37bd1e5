"""Synthetic generative load results for the readers' tests (diagnose, report, compare): records with token
traces built by hand from a stated law, turned into a ``load`` result by the same code as a real run
(``latencylab.load.gen_runner.gen_result``), so every figure in them is known."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from latencylab.load.arrivals import Poisson
from latencylab.load.gen_client import gen_api
from latencylab.load.gen_runner import gen_result
from latencylab.load.generator import LoadConfig, Records, RunStats
from latencylab.load.prompts import Prompt
from latencylab.load.results import LoadResult
from latencylab.load.sse import Trace
from latencylab.load.token_metrics import TokenSlo

MS = 1_000_000


def synthetic_gen_result(
    seconds: float = 20.0,
    rate: float = 10.0,
    ttft_ms: float = 100.0,
    gap_ms: float = 20.0,
    tokens: int = 16,
    jitter: float = 0.1,
    pauses: Sequence[tuple[float, float]] = (),  # (start s, length ms): every stream in flight waits each out
    ttft_growth_ms_per_s: float = 0.0,  # TTFT grows by this per second of the run (a queue building)
    slos: tuple[str, ...] = (),
    seed: int = 0,
) -> LoadResult:
    """Poisson arrivals; TTFT and gaps lognormal-ish around the stated values (``jitter``: relative spread)."""
    rng = np.random.default_rng(seed)
    intended = np.cumsum(rng.exponential(1.0 / rate, int(seconds * rate * 1.2)))
    intended = (intended[intended < seconds] * 1e9).astype(np.int64)
    n = intended.size
    traces: list[Trace | None] = []
    done = np.empty(n, dtype=np.int64)
    for i in range(n):
        ttft = ttft_ms * MS * rng.lognormal(0, jitter) + ttft_growth_ms_per_s * MS * intended[i] / 1e9
        gaps = gap_ms * MS * rng.lognormal(0, jitter, tokens - 1)
        times = intended[i] + np.cumsum([ttft, *gaps])
        for start_s, length_ms in sorted(pauses):
            a, b = int(start_s * 1e9), int(start_s * 1e9 + length_ms * MS)
            hit = np.flatnonzero((times >= a) & (times < b))
            if hit.size and hit[0] > 0:  # a token due inside the pause comes at its end, the rest after it
                times[hit[0] :] += b - times[hit[0]]
        t = [int(x) for x in times]
        traces.append(Trace(t, [1] * tokens, usage_tokens=tokens, saw_end=True))
        done[i] = t[-1]
    rec = Records(
        intended_ns=intended, sent_ns=intended + 50_000, done_ns=done, outcome=np.zeros(n, dtype=np.int8),
        status=np.full(n, 200, dtype=np.int16), payload=np.zeros(n, dtype=np.int32), errors={}, retry_after=[],
        traces=traces,
    )  # fmt: skip
    run = RunStats(wall_s=int(done.max()) / 1e9, send_span_s=int(intended.max()) / 1e9, cpu_s=0.5,
                   connections_opened=8, max_in_flight=8, cpu_share=0.05, cores=2, spin="off")  # fmt: skip
    cfg = LoadConfig(duration_s=seconds, spin="off")
    prompts = [Prompt("synthetic", tokens, None, "p0")]
    return gen_result(rec, run, "http://synthetic", gen_api("chat"), "synthetic", prompts, Poisson(rate, seed),
                      cfg, [TokenSlo.parse(s) for s in slos], 0.99, seed, env={})  # fmt: skip
