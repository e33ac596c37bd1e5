"""Load figures: the latency histogram, the figures :mod:`latencylab.load.plots` draws (CDF, latency over
time, capacity curve: the same as ``latencylab load --plot`` writes, so the report and the PNGs never
disagree), server-side stages against client latency, latency against throughput across runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latencylab.load.results import LoadResult
from latencylab.plotting import P50, P99, log_ms_axis
from latencylab.report.figures.common import (
    DEADLINE,
    DPI,
    STAGE_COLOURS,
    hist_edges,
    mark_quantiles,
    new,
    to_data_uri,
)


def load_histogram(result: LoadResult) -> str:
    """Histogram of successful requests' latency (from the intended send), from the HDR buckets."""
    h = result.histogram("corrected_ok")
    pts = h.cdf()
    xs = np.asarray([v / 1e6 for v, _ in pts])
    fs = np.asarray([f for _, f in pts])
    edges, log = hist_edges(float(xs[0]), float(xs[-1]))
    # fraction of requests <= each edge (a step function through the HDR CDF), differenced per bin
    at = np.concatenate([[0.0], fs])[np.searchsorted(xs, edges, side="right")]
    counts = np.diff(at) * h.count
    fig, (ax,) = new(figsize=(11.0, 3.8))
    ax.stairs(counts, edges, fill=True, color=P50, alpha=0.8)
    if log:
        ax.set_xscale("log")
        log_ms_axis(ax.xaxis)
    s = result.summary
    marks = {k: float(s[f"{k}_ms"]) for k in ("p50", "p99") if s.get(f"{k}_ms") is not None}
    mark_quantiles(ax, marks)
    slo = s.get("slo")
    if isinstance(slo, Mapping) and slo.get("objective"):
        from latencylab.load.plots import objective_threshold_ms

        v = objective_threshold_ms(str(slo["objective"]))
        ax.axvline(v, color=DEADLINE, ls="--", lw=1.3, label=f"SLO {slo['objective']}")
        ax.legend(loc="upper right", fontsize=9)
    ax.set_xlabel("latency from intended send (ms)")
    ax.set_ylabel(f"requests per bin (of {h.count:,} ok)")
    ax.grid(True, alpha=0.3)
    fig.suptitle(
        f"Latency histogram: {s.get('mode', 'open')} loop, target {s.get('target_rate') or '-'} req/s", fontsize=13
    )
    return to_data_uri(fig)


def load_cdf(result: LoadResult) -> str:
    """The load run's latency CDFs, as ``latencylab load --plot`` draws them."""
    from latencylab.load.plots import cdf_figure

    return to_data_uri(cdf_figure(result), DPI)


def load_over_time(result: LoadResult) -> str:
    """Per-second p50 and p99 of the load run, as ``latencylab load --plot`` draws them."""
    from latencylab.load.plots import latency_over_time_figure

    return to_data_uri(latency_over_time_figure(result), DPI)


def capacity_curve(steps: Sequence[Mapping[str, Any]], slo_ms: float | None) -> str:
    """Latency against throughput for each capacity-search step, as ``latencylab load --plot`` draws it."""
    from latencylab.load.plots import capacity_figure

    return to_data_uri(capacity_figure(steps, slo_ms), DPI)


def server_breakdown(result: LoadResult) -> str | None:
    """Client mean latency split into server-side stages (Prometheus means) and network + client."""
    srv = result.server or {}
    stages = dict(srv.get("server_stages_mean_ms") or {})
    client = srv.get("client_mean_ms")
    if not stages or client is None:
        return None
    inside = stages.pop("request", None)
    parts = [(k, float(v)) for k, v in stages.items() if v is not None and v > 0]
    if inside is not None:
        rest = float(inside) - sum(v for _, v in parts)
        if rest > 0.005 * float(inside):
            parts.append(("other server", rest))
        parts.append(("network + client", float(client) - float(inside)))
    fig, (ax,) = new(figsize=(11.0, 2.2))
    left = 0.0
    for i, (name, v) in enumerate(parts):
        v = max(v, 0.0)
        ax.barh(
            0, v, left=left, color=STAGE_COLOURS[i % len(STAGE_COLOURS)], edgecolor="white", label=f"{name} {v:.2f} ms"
        )
        left += v
    ax.axvline(float(client), color="black", lw=1.2, ls=":", label=f"client mean {float(client):.2f} ms")
    ax.set_yticks([])
    ax.set_xlabel("mean ms per request")
    fig.legend(loc="outside right upper", fontsize=9)
    fig.suptitle(f"Server-side stages vs client latency ({srv.get('server_requests', '?')} requests)", fontsize=12)
    return to_data_uri(fig)


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    label: str
    rate: float  # achieved requests per second
    p50_ms: float | None
    p99_ms: float | None


def latency_vs_throughput(points: Sequence[ThroughputPoint], slo_ms: float | None = None) -> str:
    """p50 and p99 (from the intended send) of each load run against its achieved rate."""
    pts = sorted(points, key=lambda p: p.rate)
    fig, (ax,) = new()
    for attr, color, marker in (("p99_ms", P99, "s"), ("p50_ms", P50, "o")):
        xy = [(p.rate, getattr(p, attr)) for p in pts if getattr(p, attr) is not None]
        ax.plot([a for a, _ in xy], [b for _, b in xy], marker=marker, color=color, lw=1.5, ms=7, label=attr[:3])
    for p in pts:
        if p.p99_ms is not None:
            ax.annotate(
                p.label, (p.rate, p.p99_ms), xytext=(5, 5), textcoords="offset points", fontsize=8.5, color="0.3"
            )
    if slo_ms is not None:
        ax.axhline(slo_ms, color=DEADLINE, ls="--", lw=1.3, label=f"SLO {slo_ms:g} ms")
    ax.set_yscale("log")
    log_ms_axis(ax.yaxis)
    ax.margins(x=0.1)
    ax.set_xlabel("achieved rate (requests sent per s)")
    ax.set_ylabel("latency from intended send (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.suptitle("Latency vs throughput across the load runs", fontsize=13)
    return to_data_uri(fig)
