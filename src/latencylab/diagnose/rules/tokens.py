"""Rules for generative (streaming) load results: where token latency goes wrong.

Data: a ``load`` result with ``summary.tokens`` (``latencylab load --api ...``; load/token_metrics.py).

* ``token-stalls``: the token stream stalls. ITL p99 is at least ``STALL_RATIO`` x ITL p50, and the result's
  stall windows (gaps longer than ``STALL_FACTOR`` x the ITL median, merged over the run's time) say when.
  A window that holds several streams at once is a server-wide pause (another request's prefill run between
  decode steps, a garbage collection, swapping); a stall of one stream at a time is that request's own (a
  long detokenisation, a slow consumer, a network retransmit).
* ``ttft-queueing``: TTFT grows through the run while the decode pace (TPOT) does not: requests wait longer
  and longer for their first token, i.e. a queue is building in front of prefill: the offered rate is above
  what the server admits. Judged on the per-second TTFT medians of the first and last quarter of the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from latencylab.diagnose.rules.common import of_kind
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult

RULE_STALLS = "token-stalls"
RULE_QUEUE = "ttft-queueing"
STALL_RATIO = 3.0  # ITL p99 / p50 from which the stream is said to stall
WARN_RATIO = 5.0
QUEUE_GROWTH = 2.0  # last quarter's TTFT median over the first quarter's
SHOWN_WINDOWS = 5

STALL_ADVICE = {
    "shared": (
        "the stalls hold several streams at the same moment: the server paused decoding for everyone. On a "
        "continuous-batching server that is usually a new request's prefill run between decode steps: enable "
        "chunked prefill (or cap prefill tokens per step) so decode steps keep their pace; otherwise look for a "
        "garbage collection, swapping or a CPU shared with other work in those time ranges"
    ),
    "single": (
        "the stalls hit one stream at a time: look at what that request does differently (a long prompt or "
        "output, a detokeniser that buffers multi-byte text, a slow client read, a retransmit); compare "
        "--requests-jsonl rows in those time ranges"
    ),
}
QUEUE_ADVICE = (
    "the first token waits longer and longer while the decode pace holds: requests queue before prefill, so the "
    "offered rate is above what the server sustains. Lower the rate or find the capacity "
    "(latencylab load --api ... --find-capacity --slo ttft_p99=...), add decode slots or batch prefill"
)


def _tokens(r: LoadedResult) -> Mapping[str, Any] | None:
    t = (r.doc.get("summary") or {}).get("tokens")
    return t if isinstance(t, Mapping) and t.get("requests") else None


def _stall_finding(r: LoadedResult, t: Mapping[str, Any]) -> Finding | None:
    itl = t.get("itl") or {}
    p50, p99 = itl.get("p50_ms"), itl.get("p99_ms")
    if not p50 or p99 is None or p99 < STALL_RATIO * p50:
        return None
    stalls = t.get("stalls") or {}
    windows = list(stalls.get("windows") or [])
    ev = [Evidence("ITL p50", round(p50, 3), "ms"), Evidence("ITL p99", round(p99, 3), "ms")]
    ci = itl.get("p99_ci_ms")
    if ci:
        ev.append(Evidence("ITL p99 95% CI", f"[{ci[0]:.2f}, {ci[1]:.2f}]", "ms"))
    ev.append(Evidence("ITL p99 / p50", round(p99 / p50, 1), "x"))
    kind = "single"
    if stalls:
        ev += [
            Evidence(f"gaps over {stalls['threshold_ms']:.1f} ms ({stalls['factor']:g} x median)", stalls["gaps"]),
            Evidence("share of all gaps", round(100 * stalls["fraction"], 2), "%"),
            Evidence("streams that stalled", stalls["streams"]),
            Evidence("time stalled (sum of those gaps)", round(stalls["stalled_ms"], 1), "ms"),
        ]
        shared_ms = sum(w["duration_ms"] for w in windows if w["streams"] > 1)
        if windows and shared_ms >= 0.5 * sum(w["duration_ms"] for w in windows):
            kind = "shared"
        for w in sorted(windows, key=lambda w: -w["duration_ms"])[:SHOWN_WINDOWS]:
            ev.append(
                Evidence(
                    f"stall: {w['streams']} stream(s), {w['gaps']} gap(s)",
                    round(w["duration_ms"], 1),
                    "ms",
                    w["start_s"],
                    w["end_s"],
                )
            )
    where = {"shared": "server-wide pauses (several streams at once)", "single": "one stream at a time"}[kind]
    return Finding(
        rule=RULE_STALLS,
        severity="warning" if p99 >= WARN_RATIO * p50 else "info",
        title=f"the token stream stalls: ITL p99 {p99:.1f} ms is {p99 / p50:.1f}x its median ({where})",
        evidence=tuple(ev),
        recommendation=STALL_ADVICE[kind],
        source=r.source,
        details={"itl_p50_ms": p50, "itl_p99_ms": p99, "kind": kind, "windows": windows},
    )


def _quarter_median(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = sorted(float(v[key]) for v in rows if v.get(key) is not None)
    return vals[len(vals) // 2] if vals else None


def _queue_finding(r: LoadedResult, t: Mapping[str, Any]) -> Finding | None:
    tl = [row for row in t.get("timeline") or [] if row.get("requests")]
    if len(tl) < 8:  # too short a run to see a trend (two seconds a quarter)
        return None
    k = len(tl) // 4
    first, last = tl[:k], tl[-k:]
    a, b = _quarter_median(first, "ttft_p50_ms"), _quarter_median(last, "ttft_p50_ms")
    ia, ib = _quarter_median(first, "itl_p50_ms"), _quarter_median(last, "itl_p50_ms")
    if a is None or b is None or b < QUEUE_GROWTH * a:
        return None
    if ia and ib and ib > QUEUE_GROWTH * ia:  # decode slowed as much: not a queue in front of prefill alone
        return None
    s = r.doc.get("summary") or {}
    ev = [
        Evidence("TTFT median, first quarter", round(a, 1), "ms", first[0]["t_s"], first[-1]["t_s"] + 1),
        Evidence("TTFT median, last quarter", round(b, 1), "ms", last[0]["t_s"], last[-1]["t_s"] + 1),
        Evidence("growth", round(b / a, 1), "x"),
    ]
    if ia and ib:
        ev.append(Evidence("ITL median, first / last quarter", f"{ia:.2f} / {ib:.2f}", "ms"))
    if s.get("target_rate") is not None:
        ev.append(Evidence("offered rate", round(float(s["target_rate"]), 2), "req/s"))
    return Finding(
        rule=RULE_QUEUE,
        severity="warning",
        title=f"TTFT grows {b / a:.1f}x through the run while the decode pace holds: a queue before prefill",
        evidence=tuple(ev),
        recommendation=QUEUE_ADVICE,
        source=r.source,
        details={"ttft_first_ms": a, "ttft_last_ms": b},
    )


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r in of_kind(results, "load"):
        t = _tokens(r)
        if t is None:
            continue
        for f in (_stall_finding(r, t), _queue_finding(r, t)):
            if f is not None:
                out.append(f)
    return out
