"""Token-level latency of a streaming load run: TTFT, TPOT, ITL, E2E, output tokens/s and goodput.

Definitions (docs/metrics.md, "Generative load"): for each request that succeeded and was streamed,

* TTFT = arrival of the first event carrying output text - the *intended* send time (coordinated-omission
  correct, as every latency of ``latencylab load``); ``ttft_uncorrected`` is timed from the actual send;
* E2E = end of the stream (its last byte) - the intended send time;
* TPOT = (E2E - TTFT) / (output tokens - 1), for requests with at least 2 output tokens;
* ITL = every gap between consecutive token-carrying events of one request (one sample per gap);
* output tokens = the server's ``usage.completion_tokens`` when it sent one, else the tokens counted.

Each metric is kept in a mergeable HDR histogram (the load layout, ``latencylab.load.results.new_histogram``)
and summarised with percentiles and CIs. Goodput is the rate of requests that succeeded and met every stated
per-request objective (:class:`TokenSlo`); each objective also gets a binomial verdict on its percentile.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latencylab import stats
from latencylab.errors import LatencyLabError
from latencylab.histogram import LatencyHistogram
from latencylab.load.generator import Records
from latencylab.load.results import new_histogram

METRICS = ("ttft", "tpot", "itl", "e2e")
SLO_METRICS = ("ttft", "tpot", "e2e")  # per-request values; ITL is per gap (a request's TPOT is its mean gap)
QS = (0.5, 0.9, 0.99)
STALL_FACTOR = 5.0  # a token gap longer than this many ITL medians is a stall
MAX_STALL_WINDOWS = 20  # the longest kept in the result


@dataclass(frozen=True, slots=True)
class TokenSlo:
    """``metric``'s ``q``-quantile <= ``threshold_ns``, e.g. ``ttft_p99=2s``, ``tpot_p99=250ms``."""

    metric: str
    q: float
    threshold_ns: float

    @classmethod
    def parse(cls, text: str) -> TokenSlo:
        from latencylab.workloads.synthetic import parse_duration_ns

        m = re.fullmatch(r"\s*(\w+?)_p([\d.]+)\s*=\s*(\S+)\s*", text)
        if not m:
            raise LatencyLabError(f"SLO {text!r} must look like ttft_p99=2s or tpot_p99=250ms")
        metric = m.group(1).lower()
        if metric not in SLO_METRICS:
            hint = " (ITL is per gap, not per request: state the decode pace as tpot)" if metric == "itl" else ""
            raise LatencyLabError(f"SLO {text!r}: metric must be one of {', '.join(SLO_METRICS)}{hint}")
        try:
            q = float(m.group(2)) / 100.0
        except ValueError as exc:
            raise LatencyLabError(f"SLO {text!r}: p{m.group(2)} is not a percentile") from exc
        if not 0 < q < 1:
            raise LatencyLabError(f"SLO {text!r}: percentile must be between p0 and p100")
        return cls(metric, q, parse_duration_ns(m.group(3)))

    def describe(self) -> str:
        return f"{self.metric}_{stats.format_q(self.q)}<={self.threshold_ns / 1e6:g}ms"


@dataclass(frozen=True, slots=True)
class TokenArrays:
    """Per-request token metrics (ns) of the successful streamed requests, and every ITL gap."""

    request: np.ndarray  # index into the run's records
    ttft_ns: np.ndarray
    ttft_uncorrected_ns: np.ndarray
    e2e_ns: np.ndarray
    tpot_ns: np.ndarray  # NaN where fewer than 2 output tokens
    output_tokens: np.ndarray
    itl_ns: np.ndarray  # all gaps, all requests
    one_shot: int  # successful requests answered in one piece (OIP generate): E2E only
    itl_end_ns: np.ndarray | None = None  # per gap: arrival of its later token (ns from the run start)
    itl_request: np.ndarray | None = None  # per gap: the request (index into the run's records)

    @property
    def n(self) -> int:
        return int(self.request.size)


def token_arrays(rec: Records) -> TokenArrays:
    """Token metrics of every successful streamed request of a run (see the module docstring)."""
    traces = rec.traces or [None] * rec.n
    req, ttft, ttft_u, e2e, tpot, ntok, gaps = [], [], [], [], [], [], []
    gap_end: list[int] = []
    gap_req: list[int] = []
    one_shot = 0
    for i, tr in enumerate(traces):
        if tr is None or rec.outcome[i] != 0 or not tr.chunk_ns:
            continue
        if not tr.streamed:
            one_shot += 1
            continue
        intended, sent, done = int(rec.intended_ns[i]), int(rec.sent_ns[i]), int(rec.done_ns[i])
        first = tr.chunk_ns[0]
        n_out = tr.output_tokens
        req.append(i)
        ttft.append(first - intended)
        ttft_u.append(first - sent)
        e2e.append(done - intended)
        ntok.append(n_out)
        tpot.append((done - first) / (n_out - 1) if n_out > 1 else np.nan)
        gaps.extend(np.diff(tr.chunk_ns).tolist())
        gap_end.extend(tr.chunk_ns[1:])
        gap_req.extend([i] * (len(tr.chunk_ns) - 1))
    return TokenArrays(
        np.asarray(req, dtype=np.int64), np.asarray(ttft, dtype=np.int64), np.asarray(ttft_u, dtype=np.int64),
        np.asarray(e2e, dtype=np.int64), np.asarray(tpot, dtype=np.float64), np.asarray(ntok, dtype=np.int64),
        np.asarray(gaps, dtype=np.int64), one_shot, np.asarray(gap_end, dtype=np.int64),
        np.asarray(gap_req, dtype=np.int64),
    )  # fmt: skip


def _values(arr: TokenArrays, metric: str) -> np.ndarray:
    if metric == "ttft":
        return arr.ttft_ns
    if metric == "tpot":
        return arr.tpot_ns[~np.isnan(arr.tpot_ns)]
    if metric == "itl":
        return arr.itl_ns
    return arr.e2e_ns


def token_histograms(arr: TokenArrays) -> dict[str, LatencyHistogram]:
    """``ttft_ok``, ``tpot_ok``, ``itl_ok``, ``e2e_ok``, ``ttft_uncorrected_ok``: HDR, in the load layout."""
    out = {}
    for metric in METRICS:
        h = new_histogram()
        h.record_many(np.maximum(np.rint(_values(arr, metric)), 1).tolist())
        out[f"{metric}_ok"] = h
    h = new_histogram()
    h.record_many(np.maximum(arr.ttft_uncorrected_ns, 1).tolist())
    out["ttft_uncorrected_ok"] = h
    return out


def _describe(values: np.ndarray) -> dict[str, Any] | None:
    if values.size == 0:
        return None
    s = stats.summarize(values, qs=QS, n_boot=200, label="tokens")
    out: dict[str, Any] = {"n": int(values.size), **stats.quantiles_ms(s)}
    out["mean_ms"] = s.mean / 1e6
    out["max_ms"] = s.max / 1e6
    return out


def token_timeline(rec: Records, arr: TokenArrays, bucket_s: float = 1.0) -> list[dict[str, Any]]:
    """Per ``bucket_s`` of the run: TTFT p50/p99 of the requests intended then, and ITL p50/p99/max of the
    gaps that ended then (ms)."""
    if arr.n == 0:
        return []
    b_ns = int(bucket_s * 1e9)
    t_req = rec.intended_ns[arr.request] // b_ns
    t_gap = arr.itl_end_ns // b_ns if arr.itl_end_ns is not None else np.array([], dtype=np.int64)
    last = int(max(t_req.max(), t_gap.max() if t_gap.size else 0))
    out = []
    for b in range(last + 1):
        ttft = arr.ttft_ns[t_req == b]
        gaps = arr.itl_ns[t_gap == b] if t_gap.size else np.array([])
        out.append({
            "t_s": b * bucket_s, "requests": int(ttft.size),
            "ttft_p50_ms": float(np.quantile(ttft, 0.5)) / 1e6 if ttft.size else None,
            "ttft_p99_ms": float(np.quantile(ttft, 0.99)) / 1e6 if ttft.size else None,
            "itl_n": int(gaps.size),
            "itl_p50_ms": float(np.quantile(gaps, 0.5)) / 1e6 if gaps.size else None,
            "itl_p99_ms": float(np.quantile(gaps, 0.99)) / 1e6 if gaps.size else None,
            "itl_max_ms": float(gaps.max()) / 1e6 if gaps.size else None,
        })  # fmt: skip
    return out


def token_stalls(arr: TokenArrays, factor: float = STALL_FACTOR) -> dict[str, Any] | None:
    """Gaps longer than ``factor`` x the ITL median, merged into windows of the run's time where one stream or
    several stalled together (a server-wide pause holds every stream in flight at once). The longest
    ``MAX_STALL_WINDOWS`` windows are kept: start and end (s from the run start), streams and gaps in them."""
    if arr.itl_ns.size == 0 or arr.itl_end_ns is None or arr.itl_request is None:
        return None
    threshold = factor * float(np.median(arr.itl_ns))
    big = np.flatnonzero(arr.itl_ns > threshold)
    out: dict[str, Any] = {
        "threshold_ms": threshold / 1e6, "factor": factor, "gaps": int(big.size),
        "fraction": big.size / arr.itl_ns.size, "stalled_ms": float(arr.itl_ns[big].sum()) / 1e6,
        "streams": int(np.unique(arr.itl_request[big]).size), "windows": [],
    }  # fmt: skip
    if not big.size:
        return out
    end = arr.itl_end_ns[big]
    start = end - arr.itl_ns[big]
    order = np.argsort(start)
    windows: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for k in order:
        s0, e0, r = int(start[k]), int(end[k]), int(arr.itl_request[big[k]])
        if cur is not None and s0 <= cur["_end"]:
            cur["_end"] = max(cur["_end"], e0)
            cur["_req"].add(r)
            cur["gaps"] += 1
            continue
        cur = {"_start": s0, "_end": e0, "_req": {r}, "gaps": 1}
        windows.append(cur)
    rows = [
        {"start_s": w["_start"] / 1e9, "end_s": w["_end"] / 1e9, "duration_ms": (w["_end"] - w["_start"]) / 1e6,
         "streams": len(w["_req"]), "gaps": w["gaps"]}
        for w in windows
    ]  # fmt: skip
    rows.sort(key=lambda w: -w["duration_ms"])
    out["window_count"] = len(rows)
    out["windows"] = sorted(rows[:MAX_STALL_WINDOWS], key=lambda w: w["start_s"])
    return out


def per_request_within(arr: TokenArrays, slo: TokenSlo) -> np.ndarray:
    """Per successful streamed request: its ``slo.metric`` is within the threshold (TPOT of a one-token
    answer: within, as it has no decode phase)."""
    if slo.metric == "ttft":
        return arr.ttft_ns <= slo.threshold_ns
    if slo.metric == "e2e":
        return arr.e2e_ns <= slo.threshold_ns
    return np.isnan(arr.tpot_ns) | (arr.tpot_ns <= slo.threshold_ns)


def summarize_tokens(
    rec: Records, arr: TokenArrays, duration_s: float, slos: Sequence[TokenSlo] = (), confidence: float = 0.99
) -> dict[str, Any]:
    """The ``summary.tokens`` object of a streaming load result (docs/metrics.md)."""
    out: dict[str, Any] = {"requests": arr.n, "one_shot": arr.one_shot}
    for metric in METRICS:
        out[metric] = _describe(_values(arr, metric).astype(np.float64))
    out["ttft_uncorrected"] = _describe(arr.ttft_uncorrected_ns.astype(np.float64))
    total = int(arr.output_tokens.sum())
    out["output_tokens"] = total
    out["output_tokens_mean"] = float(arr.output_tokens.mean()) if arr.n else None
    out["output_tokens_per_s"] = total / duration_s if duration_s > 0 else None
    per_req = arr.output_tokens / np.maximum(arr.e2e_ns, 1) * 1e9
    out["request_output_tokens_per_s_p50"] = float(np.median(per_req)) if arr.n else None
    out["timeline"] = token_timeline(rec, arr)
    out["stalls"] = token_stalls(arr)
    if slos:
        good = np.ones(arr.n, dtype=bool)
        verdicts = []
        for slo in slos:
            within = per_request_within(arr, slo)
            good &= within
            # every request sent is judged: a failed, shed or unstreamed one did not meet the objective
            over = rec.n - int(within.sum())
            v = stats.slo_verdict(rec.n, over, slo.q, slo.threshold_ns, confidence)
            verdicts.append(
                {"objective": slo.describe(), "metric": slo.metric, "verdict": v.status, "over": over,
                 "need_more": v.need_more, "text": f"{slo.metric}: {v.describe()}"}
            )  # fmt: skip
        n_good = int(good.sum())
        out["slo"] = verdicts
        out["good"] = n_good
        out["goodput"] = n_good / duration_s if duration_s > 0 else None
    return out
