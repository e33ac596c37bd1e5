"""The result of a load run: HDR histograms (mergeable, lossless), a timeline, the documented summary."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from latencylab import stats
from latencylab.errors import LatencyLabError
from latencylab.histogram import LatencyHistogram
from latencylab.load.generator import LATE_FRACTION, LATE_NS, OUTCOMES, LoadConfig, Records, RunStats
from latencylab.results import kind_version, write_json
from latencylab.results.base import utc_now

SCHEMA_VERSION = kind_version("load")  # this class is the registry's "load" kind (latencylab.results.registry)


@dataclass(frozen=True, slots=True)
class Slo:
    """``q``-quantile latency <= ``threshold_ns`` (e.g. p99=100ms)."""

    q: float
    threshold_ns: float

    @classmethod
    def parse(cls, text: str) -> Slo:
        from latencylab.workloads.synthetic import parse_duration_ns

        key, sep, value = text.partition("=")
        key = key.strip().lower()
        if not sep or not key.startswith("p"):
            raise LatencyLabError(f"SLO {text!r} must look like p99=100ms")
        try:
            q = float(key[1:]) / 100.0
        except ValueError as exc:
            raise LatencyLabError(f"SLO {text!r}: {key!r} is not a percentile like p99 or p99.9") from exc
        if not 0 < q < 1:
            raise LatencyLabError(f"SLO {text!r}: percentile must be between p0 and p100")
        return cls(q, parse_duration_ns(value))

    def describe(self) -> str:
        return f"{stats.format_q(self.q)}<={self.threshold_ns / 1e6:g}ms"


def new_histogram() -> LatencyHistogram:
    """The layout every load histogram uses (1 ns .. 1 h, 3 significant figures), so all of them merge:
    lowest 1 ns keeps sub-millisecond figures (lateness, fast endpoints) at 0.1% resolution."""
    return LatencyHistogram(lowest_ns=1)


def histogram_of(values: np.ndarray) -> LatencyHistogram:
    """``values`` (ns) recorded in the common layout, floored at 1 ns."""
    h = new_histogram()
    h.record_many(np.maximum(values, 1).tolist())
    return h


def outcome_histograms(rec: Records) -> tuple[dict[str, LatencyHistogram], dict[str, int]]:
    """A run's histograms (successful latencies from the intended and from the actual send, lateness, each
    failure kind's latency) and its outcome counts (``sent`` included): what a one-host summary and a
    distributed worker's part are both built from."""
    ok = rec.outcome == 0
    corrected, uncorrected, late = rec.corrected(), rec.uncorrected(), rec.lateness()
    hists = {
        "corrected_ok": histogram_of(corrected[ok]),
        "uncorrected_ok": histogram_of(uncorrected[ok]),
        "lateness": histogram_of(late),
    }
    for code, name in enumerate(OUTCOMES[1:], start=1):
        sel = rec.outcome == code
        if sel.any():
            hists[f"corrected_{name}"] = histogram_of(corrected[sel])
    counts = {name: int((rec.outcome == code).sum()) for code, name in enumerate(OUTCOMES)}
    counts["sent"] = rec.n
    return hists, counts


def _timeline(rec: Records, bucket_s: float = 1.0) -> list[dict[str, Any]]:
    if rec.n == 0:
        return []
    idx = (rec.intended_ns // int(bucket_s * 1e9)).astype(np.int64)
    corrected = rec.corrected()
    out = []
    for b in range(int(idx.max()) + 1):
        m = idx == b
        ok = m & (rec.outcome == 0)
        lat = corrected[ok]
        out.append(
            {
                "t_s": b * bucket_s,
                "sent": int(m.sum()),
                "ok": int(ok.sum()),
                "shed": int((m & (rec.outcome == 1)).sum()),
                "error": int((m & (rec.outcome == 2)).sum()),
                "p50_ms": float(np.quantile(lat, 0.5)) / 1e6 if lat.size else None,
                "p99_ms": float(np.quantile(lat, 0.99)) / 1e6 if lat.size else None,
                "max_ms": float(lat.max()) / 1e6 if lat.size else None,
            }
        )
    return out


def _achieved_rate(n: int, run: RunStats, cfg: LoadConfig) -> float | None:
    """Requests sent per second of sending: over the configured duration when the run lasted it."""
    span = run.send_span_s
    if cfg.duration_s is not None and not run.stopped_early:
        span = max(span, cfg.duration_s)
    return n / span if span > 0 else None


OPEN_BASIS = "from intended send"
CLOSED_BASIS = "closed loop: from actual send; coordinated omission not corrected"


def latency_basis(summary: Mapping[str, Any]) -> str:
    """What the latency figures are timed from (results written before the field existed were open loop
    or say "closed" in their mode)."""
    basis = summary.get("latency_basis")
    if basis:
        return str(basis)
    return CLOSED_BASIS if str(summary.get("mode", "")).startswith("closed") else OPEN_BASIS


def slo_summary(slo: Slo, n: int, over: int, confidence: float) -> tuple[dict[str, Any], stats.SloVerdict]:
    """The ``summary.slo`` block of a run of ``n`` requests of which ``over`` missed ``slo`` (shed and failed
    requests count as missing it), with its verdict at ``confidence``."""
    verdict = stats.slo_verdict(n, over, slo.q, slo.threshold_ns, confidence)
    block = {
        "objective": slo.describe(),
        "verdict": verdict.status,
        "confidence": confidence,
        "over": over,
        "need_more": verdict.need_more,
        "text": verdict.describe(),
    }
    return block, verdict


def summarize_run(
    rec: Records,
    run: RunStats,
    cfg: LoadConfig,
    target_rate: float | None,
    slo: Slo | None = None,
    confidence: float = 0.99,
) -> tuple[dict[str, Any], dict[str, LatencyHistogram], stats.SloVerdict | None]:
    """The documented ``summary`` object (docs/metrics.md) and the histograms behind it."""
    ok = rec.outcome == 0
    corrected, uncorrected, late = rec.corrected(), rec.uncorrected(), rec.lateness()
    hists, counts = outcome_histograms(rec)
    late_n = int((late > LATE_NS).sum())
    late_frac = late_n / rec.n if rec.n else 0.0
    invalid = []
    if cfg.mode == "open" and late_frac > LATE_FRACTION:
        invalid.append(
            f"generator fell behind: {late_frac:.1%} of requests were sent more than "
            f"{LATE_NS / 1e6:g} ms after their intended time (limit {LATE_FRACTION:.0%})"
        )
    if int((rec.outcome < 0).sum()):
        invalid.append("some requests have no outcome (internal error)")
    # Closed loop has no schedule to keep, so the open-loop rule (sends on time) says nothing about it:
    # its verdict is null, not a "valid" that would read as an open-loop-valid run.
    valid: bool | None = not invalid if cfg.mode == "open" or invalid else None
    cpu_share = run.cpu_share if run.cpu_share is not None else (run.cpu_s / run.wall_s if run.wall_s > 0 else None)
    summary: dict[str, Any] = {
        "mode": cfg.mode if cfg.mode == "open" else f"closed (concurrency {cfg.concurrency})",
        "latency_basis": OPEN_BASIS if cfg.mode == "open" else CLOSED_BASIS,
        "target_rate": target_rate,
        "achieved_rate": _achieved_rate(rec.n, run, cfg),
        "throughput_ok": counts["ok"] / run.wall_s if run.wall_s > 0 else None,
        "duration_s": run.wall_s,
        **counts,
        "errors_by_reason": dict(rec.errors),
        "valid": valid,
        "invalid_reasons": invalid,
        "late_fraction": late_frac,
        "lateness_p50_ms": float(np.quantile(late, 0.5)) / 1e6 if rec.n else None,
        "lateness_p99_ms": float(np.quantile(late, 0.99)) / 1e6 if rec.n else None,
        "lateness_max_ms": float(late.max()) / 1e6 if rec.n else None,
        "client_cpu_s": run.cpu_s,
        "client_cpu_share": cpu_share,
        "client_cpu_percent": None if cpu_share is None else 100 * cpu_share,
        "client_cores": run.cores,
        "other_cpu_cores": run.other_cpu_cores,
        "spin": run.spin or None,
        "spin_fraction": run.spun / rec.n if run.spin and rec.n else None,
        "connections_opened": run.connections_opened,
        "max_in_flight": run.max_in_flight,
        "gc_pauses": run.gc_pauses,
        "gc_pause_max_ms": run.gc_pause_max_ms,
    }
    if counts["ok"]:
        cs = stats.summarize(corrected[ok], qs=(0.5, 0.9, 0.99, 0.999), label="latency")
        us = stats.summarize(uncorrected[ok], qs=(0.5, 0.99), n_boot=200, label="uncorrected")
        summary.update(stats.quantiles_ms(cs))
        summary["mean_ms"] = cs.mean / 1e6
        summary["max_ms"] = cs.max / 1e6
        summary["uncorrected_p50_ms"] = us.at(0.5).value / 1e6
        summary["uncorrected_p99_ms"] = us.at(0.99).value / 1e6
        summary["uncorrected_mean_ms"] = us.mean / 1e6
        summary["warnings"] = [w for w in cs.warnings if "rests on" in w]
    else:
        summary["warnings"] = ["no successful request"]
    if cpu_share is not None and run.cores and run.other_cpu_cores is not None:
        busy = cpu_share + run.other_cpu_cores
        if busy >= 0.9 * run.cores:
            summary["warnings"].append(
                f"the generator's {run.cores} core(s) were {busy / run.cores:.0%} busy (generator {cpu_share:.2f}, "
                f"other work {run.other_cpu_cores:.2f} cores): the generator competed for CPU with the server "
                "under test and whatever else ran there"
            )
    verdict = None
    if slo is not None:
        # A request that was shed or failed did not meet the SLO either.
        over = int(((corrected > slo.threshold_ns) | ~ok).sum())
        summary["slo"], verdict = slo_summary(slo, rec.n, over, confidence)
        good = int((ok & (corrected <= slo.threshold_ns)).sum())
        summary["goodput"] = good / run.wall_s if run.wall_s > 0 else None
    summary["coordinated_omission"] = explain_omission(summary)
    return summary, hists, verdict


def explain_omission(summary: Mapping[str, Any]) -> str | None:
    """A sentence when corrected and uncorrected tails differ enough to matter."""
    c, u = summary.get("p99_ms"), summary.get("uncorrected_p99_ms")
    if c is None or u is None:
        return None
    if str(summary.get("mode", "")).startswith("closed"):
        return (
            "closed loop: each user waits for its previous answer before sending, so while the server stalls "
            "no requests are sent and the stall hides in a handful of samples; use open-loop mode for tail latency"
        )
    if c > 1.25 * u and c - u > 1.0:
        return (
            f"p99 from the intended send time is {c:.1f} ms but only {u:.1f} ms from the actual send: requests "
            "queued behind slow ones (a stall or overload) were delayed before being sent; a closed-loop tool "
            "would report the smaller figure (coordinated omission)"
        )
    return None


@dataclass(frozen=True, slots=True)
class LoadResult:
    target: Mapping[str, Any]
    arrivals: Mapping[str, Any] | None
    config: Mapping[str, Any]
    summary: Mapping[str, Any]
    histograms: Mapping[str, Mapping[str, Any]]
    timeline: tuple[Mapping[str, Any], ...]
    env: Mapping[str, Any]
    server: Mapping[str, Any] | None = None
    capacity: Mapping[str, Any] | None = None
    created_at: str = field(default_factory=utc_now)
    schema_version: int = SCHEMA_VERSION
    kind: str = "load"

    def histogram(self, name: str) -> LatencyHistogram:
        return LatencyHistogram.from_dict(dict(self.histograms[name]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": self.kind,
            "created_at": self.created_at,
            "summary": dict(self.summary),
            "target": dict(self.target),
            "arrivals": None if self.arrivals is None else dict(self.arrivals),
            "config": dict(self.config),
            "capacity": None if self.capacity is None else dict(self.capacity),
            "server": None if self.server is None else dict(self.server),
            "timeline": [dict(t) for t in self.timeline],
            "histograms": {k: dict(v) for k, v in self.histograms.items()},
            "env": dict(self.env),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LoadResult:
        if d.get("schema_version") != SCHEMA_VERSION or d.get("kind") != "load":
            raise LatencyLabError("not a latencylab load result of this schema version")
        try:
            return cls(
                target=d["target"],
                arrivals=d["arrivals"],
                config=d["config"],
                summary=d["summary"],
                histograms=d["histograms"],
                timeline=tuple(d["timeline"]),
                env=d["env"],
                server=d.get("server"),
                capacity=d.get("capacity"),
                created_at=d["created_at"],
            )
        except KeyError as exc:
            raise LatencyLabError(f"malformed load result: missing {exc}") from exc

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())


def write_requests_jsonl(path: str | Path, rec: Records) -> Path:
    """One JSON line per request: times in ms from the run start, outcome, status, payload index."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as fh:
        for i in range(rec.n):
            fh.write(
                json.dumps(
                    {
                        "intended_ms": rec.intended_ns[i] / 1e6,
                        "sent_ms": rec.sent_ns[i] / 1e6,
                        "done_ms": rec.done_ns[i] / 1e6,
                        "latency_ms": (rec.done_ns[i] - rec.intended_ns[i]) / 1e6,
                        "outcome": OUTCOMES[rec.outcome[i]] if rec.outcome[i] >= 0 else "none",
                        "status": int(rec.status[i]),
                        "payload": int(rec.payload[i]),
                    }
                )
                + "\n"
            )
    return p
