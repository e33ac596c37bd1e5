"""PNG plots of a load run: latency over time, latency CDFs (coordinated omission), the capacity curve.

Each ``*_figure`` function returns the figure, each ``plot_*`` one writes it as a PNG file; the set-up
(Agg canvas, never pyplot; optional matplotlib; colours) is :mod:`latencylab.plotting`'s.
All latencies are drawn in milliseconds on log axes: a stall is 100-1000x the median, and a
linear axis would flatten everything but the stall.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latencylab import stats
from latencylab.errors import LatencyLabError
from latencylab.load.results import LoadResult, Slo
from latencylab.plotting import P50, P99, SLO_RED, fmt_ms, log_ms_axis, new_figure, save_png

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "DPI",
    "FIGSIZE",
    "capacity_figure",
    "cdf_figure",
    "latency_over_time_figure",
    "objective_threshold_ms",
    "plot_capacity",
    "plot_cdf",
    "plot_latency_over_time",
    "plot_load",
]

DPI = 110
FIGSIZE = (10.0, 5.5)  # inches: 1100 x 605 px at DPI

# One colour per meaning, the same in every plot (P50, P99 and SLO_RED: latencylab.plotting).
_CORRECTED = "#1f77b4"  # the true latency (from the intended send), as the p50/p99 lines are
_UNCORRECTED = "#ff7f0e"
_LATENESS = "#7f7f7f"
_SHED = "#9467bd"
_ERROR = "#8c564b"


def objective_threshold_ms(text: str) -> float:
    """The threshold in ms of an SLO objective as results print it: 'p99<=100ms' -> 100.0.

    Also accepts the command-line form 'p99=100ms' and units ns, us, ms, s.
    """
    return Slo.parse(text.replace("<=", "=").replace("≤", "=")).threshold_ns / 1e6


def _slo(summary: Mapping[str, Any], slo_ms: float | None) -> tuple[float, str] | None:
    """(threshold ms, legend label): the explicit ``slo_ms`` wins over the run's own objective."""
    if slo_ms is not None:
        return slo_ms, f"SLO {slo_ms:g} ms"
    slo = summary.get("slo")
    objective = slo.get("objective") if isinstance(slo, Mapping) else None
    if not objective:
        return None
    return objective_threshold_ms(str(objective)), f"SLO {str(objective).replace('<=', ' ≤ ')}"


def _new_figure(ncols: int = 1) -> tuple[Figure, list[Axes]]:
    return new_figure(FIGSIZE, ncols)


def _rate(v: Any) -> str:
    return f"{float(v):,.4g} req/s"


def _describe_run(summary: Mapping[str, Any]) -> str:
    mode = str(summary.get("mode", "open"))
    # summary["mode"] is "open" or "closed (concurrency N)".
    head = mode.replace("closed", "closed loop", 1) if mode.startswith("closed") else f"{mode} loop"
    if summary.get("target_rate") is not None:
        head += f", target {_rate(summary['target_rate'])}"
    return head


def _stats_line(summary: Mapping[str, Any]) -> str:
    parts = []
    if summary.get("achieved_rate") is not None:
        parts.append(f"achieved {_rate(summary['achieved_rate'])}")
    if summary.get("p50_ms") is not None:
        parts.append(f"p50 {fmt_ms(summary['p50_ms'])} ms")
    if summary.get("p99_ms") is not None:
        text = f"p99 {fmt_ms(summary['p99_ms'])} ms"
        if summary.get("uncorrected_p99_ms") is not None:
            text += f" (uncorrected {fmt_ms(summary['uncorrected_p99_ms'])} ms)"
        parts.append(text)
    counts = [
        f"{summary[k]:,} {word}"
        for k, word in (("sent", "sent"), ("shed", "shed"), ("error", "failed"))
        if summary.get(k)
    ]
    if counts:
        parts.append(", ".join(counts))
    return "; ".join(parts)


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


# -- latency over time ---------------------------------------------------------------------


def plot_latency_over_time(result: LoadResult, path: str | Path, slo_ms: float | None = None, dpi: int = DPI) -> Path:
    """:func:`latency_over_time_figure` written to ``path`` as a PNG."""
    return save_png(latency_over_time_figure(result, slo_ms), path, dpi)


def latency_over_time_figure(result: LoadResult, slo_ms: float | None = None) -> Figure:
    """Per-second p50 and p99 latency (from the intended send time) on a log axis, with shed and
    failed requests per second as bars on a second axis when there are any, and the SLO threshold
    (``slo_ms``, else the run's own objective) as a horizontal line."""
    timeline = list(result.timeline)
    if not timeline:
        raise LatencyLabError("the run has no timeline to plot (no request was sent)")
    t = [float(b["t_s"]) for b in timeline]
    bucket = min((b - a for a, b in itertools.pairwise(t)), default=1.0) or 1.0
    x = [v + bucket / 2 for v in t]  # each value describes a whole bucket: draw it at the centre
    p50 = [_num(b.get("p50_ms")) for b in timeline]
    p99 = [_num(b.get("p99_ms")) for b in timeline]
    shed = [int(b.get("shed", 0)) for b in timeline]
    error = [int(b.get("error", 0)) for b in timeline]
    slo = _slo(result.summary, slo_ms)

    fig, (ax,) = _new_figure()
    from matplotlib.ticker import MaxNLocator

    handles: list[Any] = []
    if any(shed) or any(error):
        bars = ax.twinx()
        # Latency lines in front of the bars, on a transparent background.
        ax.set_zorder(bars.get_zorder() + 1)
        ax.patch.set_visible(False)
        width = 0.8 * bucket
        if any(shed):
            handles.append(bars.bar(x, shed, width, color=_SHED, alpha=0.45, label="shed (429/503)"))
        if any(error):
            handles.append(bars.bar(x, error, width, bottom=shed, color=_ERROR, alpha=0.55, label="failed"))
        top = max(s + e for s, e in zip(shed, error, strict=True))
        bars.yaxis.set_major_locator(MaxNLocator(integer=True))
        bars.set_ylim(0, top * 2.5)  # bars in the lower part of the plot, under most of the lines
        bars.set_ylabel(f"requests shed / failed per {bucket:g} s")

    marker = "o" if len(x) <= 60 else None
    (l50,) = ax.plot(x, p50, color=P50, marker=marker, markersize=3, lw=1.6, label="p50")
    (l99,) = ax.plot(x, p99, color=P99, marker=marker, markersize=3, lw=1.6, label="p99")
    handles[:0] = [l99, l50]
    finite = [v for v in p50 + p99 if not math.isnan(v) and v > 0]
    if slo is not None:
        handles.append(ax.axhline(slo[0], color=SLO_RED, ls="--", lw=1.3, label=slo[1]))
        finite.append(slo[0])
    if finite:
        ax.set_yscale("log")
        ax.set_ylim(min(finite) / 1.6, max(finite) * 1.6)
        log_ms_axis(ax.yaxis)
    else:
        ax.text(0.5, 0.5, "no successful request", transform=ax.transAxes, ha="center", color="0.4")
    ax.set_xlim(t[0], t[-1] + bucket)
    ax.set_xlabel("time since start of run (s)")
    ax.set_ylabel(f"latency per {bucket:g} s, from intended send (ms)")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", axis="y", alpha=0.12)
    ax.legend(handles=handles, loc="upper left", framealpha=0.9)
    fig.suptitle(f"Latency over time: {_describe_run(result.summary)}", fontsize=13)
    ax.set_title(_stats_line(result.summary), fontsize=9.5, color="0.3")
    return fig


# -- CDF -----------------------------------------------------------------------------------


def _cdf_ms(result: LoadResult, name: str) -> tuple[list[float], list[float], int]:
    """(latency ms, fraction <= it) as a step function starting at 0, and the sample count."""
    h = result.histogram(name)
    pts = h.cdf()
    if not pts:
        return [], [], 0
    xs = [pts[0][0] / 1e6] + [v / 1e6 for v, _ in pts]
    ys = [0.0] + [f for _, f in pts]
    return xs, ys, h.count


def _p99(result: LoadResult, key: str, hist: str) -> float:
    """The summary's p99 (the documented figure, the same the other plots print), else the histogram's."""
    v = result.summary.get(key)
    return float(v) if v is not None else result.histogram(hist).quantile(0.99) / 1e6


def plot_cdf(result: LoadResult, path: str | Path, slo_ms: float | None = None, dpi: int = DPI) -> Path:
    """:func:`cdf_figure` written to ``path`` as a PNG."""
    return save_png(cdf_figure(result, slo_ms), path, dpi)


def cdf_figure(result: LoadResult, slo_ms: float | None = None) -> Figure:
    """Latency CDFs of successful requests: from the intended send (corrected) and from the actual
    send (uncorrected), with the generator's lateness. Left: the CDF; right: its tail (1 - CDF, log)
    where the p99 of each curve is annotated. The horizontal gap between the two latency curves is
    the coordinated-omission effect: time requests spent waiting to be sent behind slow ones."""
    cx, cy, n = _cdf_ms(result, "corrected_ok")
    if n == 0:
        raise LatencyLabError("the run has no successful request: no latency CDF to plot")
    ux, uy, _ = _cdf_ms(result, "uncorrected_ok")
    lx, ly, _ = _cdf_ms(result, "lateness") if "lateness" in result.histograms else ([], [], 0)
    c99 = _p99(result, "p99_ms", "corrected_ok")
    u99 = _p99(result, "uncorrected_p99_ms", "uncorrected_ok") if ux else math.nan
    slo = _slo(result.summary, slo_ms)

    fig, (ax, tail) = _new_figure(ncols=2)
    floor = 0.5 / n  # where "nobody slower" is drawn on the log tail axis
    # Lateness is often microseconds: let it run off the left edge rather than squash the latencies.
    lat_min = min(cx[0], ux[0]) if ux else cx[0]
    lat_max = max(cx[-1], ux[-1] if ux else 0.0, lx[-1] if lx else 0.0)
    xlo, xhi = lat_min / 2, lat_max * 3
    # Legend order: corrected first; drawing order: corrected last, on top where the curves coincide.
    series = [
        (2, cx, cy, _CORRECTED, "-", f"corrected (from intended send), p99 {fmt_ms(c99)} ms"),
        (1, ux, uy, _UNCORRECTED, "-", f"uncorrected (from actual send), p99 {fmt_ms(u99)} ms"),
    ]
    if lx:
        label = f"generator lateness (sent - intended), p99 {fmt_ms(_p99(result, 'lateness_p99_ms', 'lateness'))} ms"
        if lx[-1] < xlo:
            label += ", left of the axis"
        series.append((0, lx, ly, _LATENESS, "--", label))
    for z, xs, ys, color, ls, label in series:
        if not xs:
            continue
        ax.plot(xs, ys, drawstyle="steps-post", color=color, ls=ls, lw=1.8, label=label, zorder=2 + z / 10)
        ccdf = [max(1.0 - y, floor) for y in ys]
        tail.plot(xs, ccdf, drawstyle="steps-post", color=color, ls=ls, lw=1.8, zorder=2 + z / 10)
    if slo is not None:
        xhi = max(xhi, slo[0] * 2)
        for a in (ax, tail):
            a.axvline(slo[0], color=SLO_RED, ls="--", lw=1.3, label=slo[1] if a is ax else None)
    for a in (ax, tail):
        a.set_xscale("log")
        a.set_xlim(xlo, xhi)
        log_ms_axis(a.xaxis)
        a.set_xlabel("latency (ms)")
        a.grid(True, which="major", alpha=0.35)

    ax.axhline(0.99, color="0.5", lw=0.8, ls=":")
    for v, color in ((u99, _UNCORRECTED), (c99, _CORRECTED)):
        if not math.isnan(v):
            ax.plot([v], [0.99], "o", color=color, ms=6, zorder=5)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("fraction of requests with latency <= x")
    ax.set_title("CDF", fontsize=11)
    # Below the panels: inside, a legend this long would cover part of a curve whatever the corner.
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize=9, frameon=False)

    _annotate_tail(tail, c99, u99)
    tail.set_yscale("log")
    tail.set_ylim(floor, 1.5)
    tail.yaxis.set_major_formatter(_tail_formatter())
    tail.set_ylabel("fraction of requests slower than x (1 - CDF)")
    tail.set_title("tail (log scale)", fontsize=11)

    fig.suptitle(f"Latency distribution: {_describe_run(result.summary)}", fontsize=13)
    return fig


def _tail_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    def fmt(v: float, _pos: int | None) -> str:
        if v >= 1:
            return "1"
        q = 1 - v
        e = math.log10(v)
        # At exact powers of ten say which percentile that is: 0.01 -> "0.01 (p99)".
        return f"{v:g} ({stats.format_q(q)})" if abs(e - round(e)) < 1e-9 and q >= 0.9 else f"{v:g}"

    return FuncFormatter(fmt)


def _annotate_tail(tail: Axes, c99: float, u99: float) -> None:
    """Mark both p99s on the tail plot and, when they differ, the gap between them.

    Labels go where no curve can be: every curve is non-increasing, so the corrected curve (and the
    lateness, which is never larger) passes above 0.01 only left of its p99, and the uncorrected one
    passes below 0.01 only right of its p99. Above-right of the corrected p99 and below-left of the
    uncorrected p99 are therefore free (when the corrected p99 is the larger, as it should be).
    """
    tail.axhline(0.01, color="0.5", lw=0.8, ls=":")
    same = not math.isnan(u99) and fmt_ms(u99) == fmt_ms(c99)
    label: dict[str, Any] = {"textcoords": "offset points", "fontsize": 9.5, "fontweight": "bold"}
    tail.plot([c99], [0.01], "o", color=_CORRECTED, ms=7, zorder=5)
    tail.annotate(
        f"p99 {fmt_ms(c99)} ms" + (" (both)" if same else ""), (c99, 0.01), xytext=(6, 6), color=_CORRECTED, **label
    )
    if same or math.isnan(u99):
        return
    tail.plot([u99], [0.01], "o", color=_UNCORRECTED, ms=7, zorder=5)
    tail.annotate(f"p99 {fmt_ms(u99)} ms", (u99, 0.01), xytext=(-6, -15), ha="right", color=_UNCORRECTED, **label)
    if u99 > 0 and c99 / u99 >= 1.25:
        arrow = {"arrowstyle": "<->", "color": "0.25", "lw": 1.2, "shrinkA": 4, "shrinkB": 4}
        tail.annotate("", (c99, 0.01), xytext=(u99, 0.01), arrowprops=arrow)
        # The upper right corner of a tail plot is empty: every curve has fallen by then.
        tail.text(
            0.97,
            0.97,
            f"coordinated omission at p99: ×{c99 / u99:.3g}\n"
            f"{fmt_ms(c99)} ms from the intended send\nvs {fmt_ms(u99)} ms from the actual send",
            transform=tail.transAxes,
            ha="right",
            va="top",
            fontsize=9,
            color="0.2",
            bbox={"boxstyle": "round,pad=0.4", "fc": "white", "ec": "0.7", "alpha": 0.9},
        )


# -- capacity ------------------------------------------------------------------------------

_X_LABELS = {
    "achieved_rate": "achieved rate (requests sent per s)",
    "offered_rate": "offered rate (req/s)",
    "throughput_ok": "throughput (successful requests per s)",
    "goodput": "goodput (requests within the SLO per s)",
}


@dataclass(frozen=True, slots=True)
class _Step:
    x: float
    p50: float  # NaN: no successful request
    p99: float
    passed: bool
    offered: float | None


def plot_capacity(
    steps: Sequence[Mapping[str, Any]],
    path: str | Path,
    slo_ms: float | None = None,
    x: str = "achieved_rate",
    dpi: int = DPI,
) -> Path:
    """:func:`capacity_figure` written to ``path`` as a PNG."""
    return save_png(capacity_figure(steps, slo_ms, x), path, dpi)


def capacity_figure(
    steps: Sequence[Mapping[str, Any]], slo_ms: float | None = None, x: str = "achieved_rate"
) -> Figure:
    """Latency (p50, p99 from the intended send) against throughput for each capacity-search step:
    passing steps filled, failing ones hollow, the SLO threshold as a line and the highest passing
    step marked. ``x`` picks the throughput measure (a key of the steps, offered rate as fallback)."""
    if x not in _X_LABELS:
        raise LatencyLabError(f"unknown x {x!r}: one of {', '.join(_X_LABELS)}")
    pts: list[_Step] = []
    for s in steps:
        rate = s.get(x) if s.get(x) is not None else s.get("offered_rate")
        if rate is not None:
            offered = s.get("offered_rate")
            pts.append(
                _Step(
                    float(rate),
                    _num(s.get("p50_ms")),
                    _num(s.get("p99_ms")),
                    bool(s.get("passed")),
                    None if offered is None else float(offered),
                )
            )
    pts.sort(key=lambda p: p.x)  # the search runs out of order (bracket, then bisect)
    if all(math.isnan(p.p99) for p in pts):
        raise LatencyLabError("no capacity step has a latency to plot")

    fig, (ax,) = _new_figure()
    from matplotlib.lines import Line2D

    for attr, color, marker in (("p50", P50, "o"), ("p99", P99, "s")):
        drawn = [(p.x, float(getattr(p, attr)), p.passed) for p in pts if not math.isnan(getattr(p, attr))]
        ax.plot([d[0] for d in drawn], [d[1] for d in drawn], color=color, lw=1.4, alpha=0.8)
        for passed in (True, False):
            sel = [d for d in drawn if d[2] is passed]
            ax.scatter(
                [d[0] for d in sel],
                [d[1] for d in sel],
                s=55,
                marker=marker,
                facecolors=color if passed else "white",
                edgecolors=color,
                linewidths=1.8,
                zorder=4,
            )
    handles: list[Any] = [
        Line2D([], [], color=P99, marker="s", lw=1.4, label="p99"),
        Line2D([], [], color=P50, marker="o", lw=1.4, label="p50"),
        Line2D([], [], color="0.3", marker="o", ls="", markersize=8, label="step passed"),
        Line2D([], [], color="0.3", marker="o", ls="", markersize=8, markerfacecolor="white", label="step failed"),
    ]
    finite = [v for p in pts for v in (p.p50, p.p99) if not math.isnan(v) and v > 0]
    if slo_ms is not None:
        handles.insert(2, ax.axhline(slo_ms, color=SLO_RED, ls="--", lw=1.3, label=f"SLO {slo_ms:g} ms"))
        finite.append(slo_ms)
    ax.set_yscale("log")
    ax.set_ylim(min(finite) / 1.6, max(finite) * 1.6)
    log_ms_axis(ax.yaxis)
    xs = [p.x for p in pts]
    pad = (max(xs) - min(xs)) * 0.06 or max(xs) * 0.1
    x0, x1 = max(0.0, min(xs) - pad), max(xs) + pad
    ax.set_xlim(x0, x1)
    passing = [p for p in pts if p.passed]
    if passing:
        best = max(passing, key=lambda p: p.offered if p.offered is not None else p.x)
        ax.axvline(best.x, color="0.35", ls=":", lw=1.2)
        text = f"capacity: {_rate(best.offered)} offered" if best.offered is not None else "highest passing step"
        right = (best.x - x0) / (x1 - x0) > 0.5  # the label on the side with room
        ax.annotate(
            text, (best.x, 1), xycoords=("data", "axes fraction"), xytext=(-4 if right else 4, -14),
            textcoords="offset points", ha="right" if right else "left", fontsize=9.5, color="0.25",
        )  # fmt: skip
    ax.set_xlabel(_X_LABELS[x])
    ax.set_ylabel("latency from intended send (ms)")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", axis="y", alpha=0.12)
    ax.legend(handles=handles, loc="upper left", framealpha=0.9)
    sub = f"{len(pts)} steps, {len(passing)} passed, {len(pts) - len(passing)} failed"
    undrawn = sum(math.isnan(p.p99) for p in pts)
    if undrawn:
        sub += f" ({undrawn} without a successful request, not drawn)"
    fig.suptitle("Capacity search: latency vs throughput", fontsize=13)
    ax.set_title(sub, fontsize=9.5, color="0.3")
    return fig


# -- all of them ---------------------------------------------------------------------------


def plot_load(
    result: LoadResult,
    out_dir: str | Path,
    capacity_steps: Sequence[Mapping[str, Any]] | None = None,
    slo_ms: float | None = None,
    dpi: int = DPI,
) -> list[Path]:
    """Write the plots that apply to ``result`` into ``out_dir`` and return their paths:
    latency_over_time.png (a timeline), latency_cdf.png (a successful request), capacity.png
    (``capacity_steps``, else the steps of ``result.capacity``)."""
    out = Path(out_dir)
    paths = []
    if result.timeline:
        paths.append(plot_latency_over_time(result, out / "latency_over_time.png", slo_ms, dpi))
    if "corrected_ok" in result.histograms and result.histogram("corrected_ok").count:
        paths.append(plot_cdf(result, out / "latency_cdf.png", slo_ms, dpi))
    cap_slo_ms = slo[0] if (slo := _slo(result.summary, slo_ms)) else None
    if capacity_steps is None and result.capacity is not None:
        capacity_steps = result.capacity.get("steps")
        if slo_ms is None and result.capacity.get("slo"):  # the search's own objective
            cap_slo_ms = objective_threshold_ms(str(result.capacity["slo"]))
    if capacity_steps and any(s.get("p99_ms") is not None for s in capacity_steps):
        paths.append(plot_capacity(capacity_steps, out / "capacity.png", cap_slo_ms, dpi=dpi))
    return paths
