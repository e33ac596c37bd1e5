"""Token-latency figures of a generative (streaming) load result (``latencylab load --api ...``).

``token_cdf``: the tail (1 - CDF, log) of TTFT, TPOT, ITL and E2E from the result's HDR histograms, so the
p99 of each reads off one axis. ``token_over_time``: per-second TTFT p50/p99 (by intended send) and ITL
p50/p99/max (by the later token's arrival) from ``summary.tokens.timeline``, with the stall windows the result
found (``summary.tokens.stalls``) shaded in red.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.load.results import LoadResult
from latencylab.plotting import P50, P99, SLO_RED, log_ms_axis
from latencylab.report.figures.common import STAGE_COLOURS, new, to_data_uri

SERIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))


def has_tokens(result: LoadResult) -> bool:
    t = result.summary.get("tokens")
    return isinstance(t, Mapping) and bool(t.get("requests"))


def token_cdf(result: LoadResult) -> str:
    """1 - CDF of each token metric (log-log), with its p99 marked."""
    if not has_tokens(result):
        raise LatencyLabError("not a streamed load result: no token metrics")
    t = result.summary["tokens"]
    fig, (ax,) = new()
    drawn = 0
    for (key, name), color in zip(SERIES, STAGE_COLOURS, strict=False):
        hname = f"{key}_ok"
        if hname not in result.histograms or not t.get(key):
            continue
        h = result.histogram(hname)
        if not h.count:
            continue
        pts = h.cdf()
        xs = [v / 1e6 for v, _ in pts]
        floor = 0.5 / h.count
        ys = [max(1.0 - f, floor) for _, f in pts]
        p99 = t[key]["p99_ms"]
        ax.plot(xs, ys, drawstyle="steps-post", color=color, lw=1.8,
                label=f"{name} (n {h.count:,}), p50 {t[key]['p50_ms']:.3g} ms, p99 {p99:.3g} ms")  # fmt: skip
        ax.plot([p99], [0.01], marker="o", color=color, ms=6)
        drawn += 1
    if not drawn:
        raise LatencyLabError("the result has no token histograms")
    ax.axhline(0.01, color="0.5", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    log_ms_axis(ax.xaxis)
    ax.set_xlabel("ms (TTFT and E2E from the intended send; ITL per gap; TPOT per request)")
    ax.set_ylabel("fraction slower (1 - CDF)")
    ax.grid(True, which="major", alpha=0.35)
    ax.legend(loc="lower left", fontsize=9)
    fig.suptitle(f"Token latency tails: {t['requests']:,} streamed requests", fontsize=13)
    return to_data_uri(fig)


def token_over_time(result: LoadResult) -> str:
    """Per-second TTFT and ITL percentiles over the run; stall windows shaded."""
    if not has_tokens(result):
        raise LatencyLabError("not a streamed load result: no token metrics")
    t = result.summary["tokens"]
    rows = t.get("timeline") or []
    if not rows:
        raise LatencyLabError("the result has no token timeline (written before it was recorded)")
    fig, (top, bottom) = _two_rows()
    xs = [r["t_s"] + 0.5 for r in rows]

    def line(ax: Any, key: str, color: str, label: str, ls: str = "-") -> None:
        pts = [(x, r[key]) for x, r in zip(xs, rows, strict=True) if r.get(key) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, ls=ls, lw=1.6, marker=".", label=label)

    line(top, "ttft_p50_ms", P50, "TTFT p50")
    line(top, "ttft_p99_ms", P99, "TTFT p99")
    line(bottom, "itl_p50_ms", P50, "ITL p50")
    line(bottom, "itl_p99_ms", P99, "ITL p99")
    line(bottom, "itl_max_ms", "0.45", "ITL max", ls=":")
    stalls = t.get("stalls") or {}
    for i, w in enumerate(stalls.get("windows") or []):
        for ax in (top, bottom):
            ax.axvspan(w["start_s"], max(w["end_s"], w["start_s"] + 0.02), color=SLO_RED, alpha=0.18, lw=0,
                       label="stall window" if i == 0 and ax is bottom else None)  # fmt: skip
    for ax, what in ((top, "TTFT (ms)"), (bottom, "ITL (ms)")):
        ax.set_yscale("log")
        log_ms_axis(ax.yaxis)
        ax.set_ylabel(what)
        ax.grid(True, which="major", alpha=0.35)
        ax.legend(loc="upper left", fontsize=8.5, ncols=4)
    bottom.set_xlabel("s from the run start (TTFT by intended send; ITL by the later token's arrival)")
    n = stalls.get("window_count", 0) if stalls else 0
    fig.suptitle(f"Token latency over time{f': {n} stall windows' if n else ''}", fontsize=13)
    return to_data_uri(fig)


def _two_rows() -> Any:
    """A report-sized figure with two rows of axes sharing the time axis."""
    fig = new(figsize=(11.0, 5.6))[0]
    fig.clear()
    top, bottom = fig.subplots(2, 1, sharex=True)
    return fig, (top, bottom)
