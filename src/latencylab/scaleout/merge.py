"""Per-worker parts of a distributed load run, and their lossless merge into one ``load`` summary.

A worker ships a :class:`WorkerPart`: its HDR histograms (the layout of ``load.results.new_histogram``, so
they merge without loss), outcome counts, late sends, SLO counts and a per-second timeline whose latency
figures are histograms too. The driver adds counts and merges histograms; every percentile of the merged
result is read from a merged histogram, so it equals exactly the percentile of one histogram built from all
the workers' samples (the HDR resolution, 0.1%, is the only approximation, as for any histogram figure).

The merged summary has the keys of a one-host summary (``load.results.summarize_run``; docs/metrics.md
"load"), read from the histograms, plus ``workers`` (the per-worker breakdown) and ``distributed``.
A snapshot part (``partial``) carries the requests completed when it was taken: the driver polls them while
the run goes on, so a worker that dies leaves its last snapshot behind.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab import stats
from latencylab.histogram import LatencyHistogram
from latencylab.load.generator import LATE_FRACTION, LATE_NS, LoadConfig, Records, RunStats
from latencylab.load.results import (
    CLOSED_BASIS,
    OPEN_BASIS,
    Slo,
    explain_omission,
    histogram_of,
    new_histogram,
    outcome_histograms,
    slo_summary,
)

SUMMARY_QS = (0.5, 0.9, 0.99, 0.999)
RECORD_FIELDS = ("intended_ns", "sent_ns", "done_ns", "outcome", "status", "payload")


@dataclass(frozen=True, slots=True)
class WorkerPart:
    """What one worker measured (or had measured when a snapshot was taken): plain, picklable values."""

    index: int
    node: str
    histograms: Mapping[str, Mapping[str, Any]]  # LatencyHistogram.to_dict() by name (as in a load result)
    counts: Mapping[str, int]  # sent, ok, shed, error
    late: int  # sends more than LATE_NS after their intended time
    errors_by_reason: Mapping[str, int]
    timeline: tuple[Mapping[str, Any], ...]  # per second of intended time: counts + corrected_ok histogram
    slo_over: int | None = None  # requests over the SLO threshold or unsuccessful (None: no SLO)
    slo_good: int | None = None  # successful within the threshold
    summary: Mapping[str, Any] | None = None  # the worker's own one-host summary (final parts only)
    run: Mapping[str, Any] | None = None  # its RunStats (final parts only)
    partial: bool = False  # a snapshot: requests still in flight are left out
    start_unix_ns: int = 0  # the worker's first intended send, on its own wall clock
    records: Mapping[str, list[int]] | None = None  # raw per-request arrays, when asked (RECORD_FIELDS)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def histogram(self, name: str) -> LatencyHistogram:
        return LatencyHistogram.from_dict(dict(self.histograms[name]))


def completed(rec: Records) -> Records:
    """The requests of ``rec`` with an outcome (a live read may hold in-flight ones, and ragged arrays)."""
    n = min(rec.intended_ns.size, rec.sent_ns.size, rec.done_ns.size, rec.outcome.size, rec.status.size)
    n = min(n, rec.payload.size)
    keep = np.flatnonzero(rec.outcome[:n] >= 0)
    return Records(
        rec.intended_ns[keep], rec.sent_ns[keep], rec.done_ns[keep], rec.outcome[keep], rec.status[keep],
        rec.payload[keep], dict(rec.errors), list(rec.retry_after),
    )  # fmt: skip


def part_from_records(
    index: int,
    node: str,
    rec: Records,
    slo_ns: float | None = None,
    start_unix_ns: int = 0,
    summary: Mapping[str, Any] | None = None,
    run: RunStats | None = None,
    partial: bool = False,
    keep_records: bool = False,
) -> WorkerPart:
    """A worker's part from its records (only requests with an outcome count; see ``completed``)."""
    rec = completed(rec)
    ok = rec.outcome == 0
    corrected, late = rec.corrected(), rec.lateness()
    hists, counts = outcome_histograms(rec)  # the same recording as a one-host run, so the parts merge into one
    timeline: list[dict[str, Any]] = []
    if rec.n:
        idx = rec.intended_ns // 1_000_000_000
        timeline = [_second(rec, corrected, idx, b) for b in range(int(idx.max()) + 1)]
    over = good = None
    if slo_ns is not None:
        over = int(((corrected > slo_ns) | ~ok).sum())
        good = int((ok & (corrected <= slo_ns)).sum())
    records = None
    if keep_records:
        records = {f: getattr(rec, f).tolist() for f in RECORD_FIELDS}
    return WorkerPart(
        index=index, node=node, histograms={k: h.to_dict() for k, h in hists.items()}, counts=counts,
        late=int((late > LATE_NS).sum()), errors_by_reason=dict(rec.errors), timeline=tuple(timeline),
        slo_over=over, slo_good=good, summary=summary, run=None if run is None else _run_dict(run),
        partial=partial, start_unix_ns=start_unix_ns, records=records,
    )  # fmt: skip


class PartFold:
    """The driver's running part of one worker: each polled chunk of raw requests folded into histograms and
    counters as it arrives, then dropped. Memory per worker: the five outcome histograms (decoded, ~270 KB
    each) and one encoded histogram per second of the run (a few KB: HDR's compressed form), whatever the
    number of requests. A chunk touches only its own seconds' rows. ``part()`` equals ``part_from_records``
    of all the chunks at once (histograms merge losslessly, counts add, rows merge by second)."""

    def __init__(self, index: int, node: str, slo_ns: float | None = None) -> None:
        self.index, self.node, self.slo_ns = index, node, slo_ns
        self.hists: dict[str, LatencyHistogram] = {}
        self.counts: dict[str, int] = {}
        self.late = 0
        self.slo_over = 0
        self.slo_good = 0
        self.rows: dict[int, dict[str, Any]] = {}  # second -> counts + its corrected_ok histogram, encoded
        self.folded = 0  # requests folded in

    def add(self, chunk: Mapping[str, Any]) -> None:
        """Fold one chunk (``RECORD_FIELDS`` arrays of completed requests; other keys are ignored)."""
        cols = [np.asarray(chunk[f]) for f in RECORD_FIELDS]
        if cols[3].size == 0:
            return
        rec = completed(Records(
            cols[0].astype(np.int64), cols[1].astype(np.int64), cols[2].astype(np.int64), cols[3].astype(np.int8),
            cols[4].astype(np.int16), cols[5].astype(np.int32), {}, [],
        ))  # fmt: skip
        hists, counts = outcome_histograms(rec)
        for name, h in hists.items():
            if name in self.hists:
                self.hists[name].merge(h)
            else:
                self.hists[name] = h
        for k, v in counts.items():
            self.counts[k] = self.counts.get(k, 0) + int(v)
        corrected, ok = rec.corrected(), rec.outcome == 0
        self.late += int((rec.lateness() > LATE_NS).sum())
        if self.slo_ns is not None:
            self.slo_over += int(((corrected > self.slo_ns) | ~ok).sum())
            self.slo_good += int((ok & (corrected <= self.slo_ns)).sum())
        idx = rec.intended_ns // 1_000_000_000
        for b in np.unique(idx).tolist():
            row = _second(rec, corrected, idx, b)
            mine = self.rows.get(b)
            if mine is None:
                self.rows[b] = row
                continue
            for k in ("sent", "ok", "shed", "error"):
                mine[k] += row[k]
            merged = LatencyHistogram.from_dict(dict(mine["corrected_ok"]))
            merged.merge(LatencyHistogram.from_dict(dict(row["corrected_ok"])))
            mine["corrected_ok"] = merged.to_dict()
        self.folded += rec.n

    def part(self) -> WorkerPart:
        """The fold so far as a snapshot part (``partial``)."""
        if not self.folded:
            return part_from_records(self.index, self.node, _no_records(), self.slo_ns, partial=True)
        empty = new_histogram().to_dict()
        zero = {"sent": 0, "ok": 0, "shed": 0, "error": 0}
        timeline = tuple(
            dict(self.rows[b]) if b in self.rows else {"t_s": float(b), **zero, "corrected_ok": empty}
            for b in range(max(self.rows) + 1)
        )
        slo = self.slo_ns is not None
        return WorkerPart(
            index=self.index, node=self.node, histograms={k: h.to_dict() for k, h in self.hists.items()},
            counts=dict(self.counts), late=self.late, errors_by_reason={}, timeline=timeline,
            slo_over=self.slo_over if slo else None, slo_good=self.slo_good if slo else None, partial=True,
        )  # fmt: skip


def _no_records() -> Records:
    z = np.zeros(0, dtype=np.int64)
    return Records(z, z, z, z.astype(np.int8), z.astype(np.int16), z.astype(np.int32), {}, [])


def _second(rec: Records, corrected: np.ndarray, idx: np.ndarray, b: int) -> dict[str, Any]:
    """One timeline row: second ``b`` of intended time (``idx``: each request's second)."""
    m = idx == b
    okb = m & (rec.outcome == 0)
    return {
        "t_s": float(b),
        "sent": int(m.sum()),
        "ok": int(okb.sum()),
        "shed": int((m & (rec.outcome == 1)).sum()),
        "error": int((m & (rec.outcome == 2)).sum()),
        "corrected_ok": histogram_of(corrected[okb]).to_dict(),
    }


def _run_dict(run: RunStats) -> dict[str, Any]:
    return {f: getattr(run, f) for f in RunStats.__dataclass_fields__}


def merged_histograms(parts: Sequence[WorkerPart]) -> dict[str, LatencyHistogram]:
    """Every histogram name of any part, merged over the parts that have it (lossless)."""
    names: list[str] = []
    for p in parts:
        names += [k for k in p.histograms if k not in names]
    return {name: LatencyHistogram.merged(p.histogram(name) for p in parts if name in p.histograms) for name in names}


def merged_records(parts: Sequence[WorkerPart]) -> Records | None:
    """All parts' raw requests in one ``Records`` (each worker's times from its own start), sorted by intended
    time; None when any part did not keep its records."""
    if not parts or any(p.records is None for p in parts):
        return None
    kept = [p.records for p in parts if p.records is not None]
    cols = {f: np.concatenate([np.asarray(r[f]) for r in kept]) for f in RECORD_FIELDS}
    order = np.argsort(cols["intended_ns"], kind="stable")
    errors: dict[str, int] = {}
    for p in parts:
        for k, v in p.errors_by_reason.items():
            errors[k] = errors.get(k, 0) + v
    return Records(
        cols["intended_ns"][order].astype(np.int64), cols["sent_ns"][order].astype(np.int64),
        cols["done_ns"][order].astype(np.int64), cols["outcome"][order].astype(np.int8),
        cols["status"][order].astype(np.int16), cols["payload"][order].astype(np.int32), errors, [],
    )  # fmt: skip


def hist_quantile_ci(h: LatencyHistogram, q: float, confidence: float) -> tuple[float, float]:
    """The distribution-free order-statistic interval of quantile ``q`` (``stats.order_stat_ci``), its two
    ranks read from the histogram."""
    from scipy.stats import binom

    n = h.count
    alpha = 1.0 - confidence
    lo = min(max(int(binom.ppf(alpha / 2, n, q)), 1), n)
    hi = min(max(int(binom.ppf(1 - alpha / 2, n, q)) + 1, 1), n)
    # rank k is HDR's value at fraction k / n (its target count is round(fraction * n) = k)
    return h.quantile(lo / n), h.quantile(hi / n)


def _ms(v: float) -> float | None:
    return None if math.isnan(v) else v / 1e6


def merged_timeline(parts: Sequence[WorkerPart]) -> list[dict[str, Any]]:
    """The one-host timeline's rows (``load.results._timeline``), each second merged over the workers."""
    seconds = max((len(p.timeline) for p in parts), default=0)
    out = []
    for b in range(seconds):
        rows = [p.timeline[b] for p in parts if b < len(p.timeline)]
        h = LatencyHistogram.merged(LatencyHistogram.from_dict(dict(r["corrected_ok"])) for r in rows)
        p50, p99 = h.quantiles([0.5, 0.99])
        row: dict[str, Any] = {"t_s": float(b)}
        for k in ("sent", "ok", "shed", "error"):
            row[k] = sum(int(r[k]) for r in rows)
        row.update({"p50_ms": _ms(p50), "p99_ms": _ms(p99), "max_ms": _ms(h.max_ns)})
        out.append(row)
    return out


def _sum(values: Sequence[Any]) -> Any:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def merge_summary(
    parts: Sequence[WorkerPart],
    cfg: LoadConfig,
    target_rate: float | None,
    slo: Slo | None = None,
    confidence: float = 0.99,
    failures: Mapping[int, str] | None = None,
) -> tuple[dict[str, Any], dict[str, LatencyHistogram]]:
    """One-host-shaped summary of the merged parts (module docstring) and the merged histograms.

    ``failures``: worker index -> why it has no final part (it died); those workers' parts are their last
    snapshots, and the run is invalid.
    """
    failures = dict(failures or {})
    hists = merged_histograms(parts)
    counts = {k: sum(int(p.counts[k]) for p in parts) for k in ("ok", "shed", "error", "sent")}
    n = counts["sent"]
    late_n = sum(p.late for p in parts)
    late_frac = late_n / n if n else 0.0
    runs = [p.run for p in parts if p.run is not None]
    invalid: list[str] = []
    for p in parts:
        if p.index in failures:
            invalid.append(
                f"worker {p.index} ({p.node}) failed: {failures[p.index]}; its {p.counts['sent']} requests "
                "completed by its last snapshot are kept"
            )
        elif p.summary is not None:
            invalid += [f"worker {p.index} ({p.node}): {r}" for r in p.summary.get("invalid_reasons", [])]
    if cfg.mode == "open" and late_frac > LATE_FRACTION and not any("fell behind" in r for r in invalid):
        invalid.append(
            f"generator fell behind: {late_frac:.1%} of requests were sent more than "
            f"{LATE_NS / 1e6:g} ms after their intended time (limit {LATE_FRACTION:.0%})"
        )
    valid: bool | None = not invalid if cfg.mode == "open" or invalid else None
    wall = max((float(r["wall_s"]) for r in runs), default=0.0)
    span = max((float(r["send_span_s"]) for r in runs), default=0.0)
    stopped = [str(p.summary.get("stopped_early")) for p in parts if p.summary and p.summary.get("stopped_early")]
    if cfg.duration_s is not None and not stopped:
        span = max(span, cfg.duration_s)
    cpu_share = _sum([r.get("cpu_share") for r in runs])
    spun = sum(int(r.get("spun") or 0) for r in runs)
    spin = next((str(r["spin"]) for r in runs if r.get("spin")), "")
    late_h = hists["lateness"]
    summary: dict[str, Any] = {
        "mode": cfg.mode if cfg.mode == "open" else f"closed (concurrency {cfg.concurrency})",
        "latency_basis": OPEN_BASIS if cfg.mode == "open" else CLOSED_BASIS,
        "target_rate": target_rate,
        "achieved_rate": n / span if span > 0 else None,
        "throughput_ok": counts["ok"] / wall if wall > 0 else None,
        "duration_s": wall,
        **counts,
        "errors_by_reason": _merge_counts([p.errors_by_reason for p in parts]),
        "valid": valid,
        "invalid_reasons": invalid,
        "late_fraction": late_frac,
        "lateness_p50_ms": _ms(late_h.quantile(0.5)) if n else None,
        "lateness_p99_ms": _ms(late_h.quantile(0.99)) if n else None,
        "lateness_max_ms": _ms(late_h.max_ns) if n else None,
        "client_cpu_s": _sum([r.get("cpu_s") for r in runs]),
        "client_cpu_share": cpu_share,
        "client_cpu_percent": None if cpu_share is None else 100 * cpu_share,
        # per node, not per worker: workers sharing a node share its cores (and count each other as other work)
        "client_cores": _per_node(parts, "cores"),
        "other_cpu_cores": _per_node(parts, "other_cpu_cores"),
        "spin": spin or None,
        "spin_fraction": spun / n if spin and n else None,
        "connections_opened": _sum([r.get("connections_opened") for r in runs]),
        "max_in_flight": _sum([r.get("max_in_flight") for r in runs]),  # an upper bound: peaks need not coincide
        "gc_pauses": _sum([r.get("gc_pauses") for r in runs]) or 0,  # each worker's own process
        "gc_pause_max_ms": max((float(r.get("gc_pause_max_ms") or 0.0) for r in runs), default=0.0),
    }
    ok_h = hists["corrected_ok"]
    warnings: list[str] = []
    if counts["ok"]:
        values = ok_h.quantiles(SUMMARY_QS)
        for q, v in zip(SUMMARY_QS, values, strict=True):
            key = stats.format_q(q).replace(".", "_")
            lo, hi = hist_quantile_ci(ok_h, q, 0.95)
            summary[f"{key}_ms"] = v / 1e6
            summary[f"{key}_ci_ms"] = [lo / 1e6, hi / 1e6]
            tail = math.floor(counts["ok"] * (1.0 - q))
            if tail < stats.TAIL_SAMPLES:
                need = stats.samples_needed(q)
                warnings.append(
                    f"latency: {stats.format_q(q)} rests on {tail} tail samples of {counts['ok']}: "
                    f"need {need - counts['ok']} more samples ({need} in all) for {stats.TAIL_SAMPLES} beyond it"
                )
        summary["mean_ms"] = ok_h.mean_ns / 1e6
        summary["max_ms"] = ok_h.max_ns / 1e6
        un = hists["uncorrected_ok"]
        u50, u99 = un.quantiles([0.5, 0.99])
        summary["uncorrected_p50_ms"] = u50 / 1e6
        summary["uncorrected_p99_ms"] = u99 / 1e6
        summary["uncorrected_mean_ms"] = un.mean_ns / 1e6
    else:
        warnings.append("no successful request")
    for p in parts:
        for w in (p.summary or {}).get("warnings", []):
            if "rests on" not in w and w != "no successful request":
                warnings.append(f"worker {p.index} ({p.node}): {w}")
    summary["warnings"] = warnings
    if slo is not None:
        over = sum(int(p.slo_over or 0) for p in parts)
        good = sum(int(p.slo_good or 0) for p in parts)
        summary["slo"], _ = slo_summary(slo, n, over, confidence)
        summary["goodput"] = good / wall if wall > 0 else None
    if stopped:
        summary["stopped_early"] = stopped[0]
    summary["coordinated_omission"] = explain_omission(summary)
    return summary, hists


def _per_node(parts: Sequence[WorkerPart], key: str) -> Any:
    """The sum over nodes of the largest ``run[key]`` among each node's workers (None when none has it)."""
    best: dict[str, float] = {}
    for p in parts:
        v = None if p.run is None else p.run.get(key)
        if v is not None:
            best[p.node] = max(best.get(p.node, v), v)
    return sum(best.values()) if best else None


def _merge_counts(maps: Sequence[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = out.get(k, 0) + int(v)
    return out


def worker_row(part: WorkerPart, failure: str = "") -> dict[str, Any]:
    """One worker's line of the breakdown: its counts, percentiles, lateness and validity."""
    h = part.histogram("corrected_ok")
    p50, p99 = h.quantiles([0.5, 0.99])
    s = part.summary or {}
    return {
        "worker": part.index,
        "node": part.node,
        **{k: int(part.counts[k]) for k in ("sent", "ok", "shed", "error")},
        "p50_ms": _ms(p50),
        "p99_ms": _ms(p99),
        "late_fraction": part.late / part.counts["sent"] if part.counts["sent"] else 0.0,
        "valid": False if failure else s.get("valid"),
        "invalid_reasons": [failure] if failure else list(s.get("invalid_reasons", [])),
        "partial": part.partial,
        "achieved_rate": s.get("achieved_rate"),
        "client_cpu_share": s.get("client_cpu_share"),
        **part.extra,
    }
