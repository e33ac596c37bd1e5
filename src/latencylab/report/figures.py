"""The report's figures: matplotlib on the Agg canvas, returned as inline PNG ``data:`` URIs.

Every function takes a result (or its JSON document) and returns ``data:image/png;base64,...`` that an
``<img>`` shows without any file or network access. PNGs are palette-quantised (Pillow, a matplotlib
dependency) so that a report with a dozen figures stays well under a megabyte and a half.

The load-run figures (latency over time, CDF, capacity curve) are drawn by :mod:`latencylab.load.plots`,
the same as ``latencylab load --plot`` writes, so the report and the PNGs never disagree. Latencies are
in milliseconds; log axes wherever a tail is 10x the median. matplotlib is optional
(``pip install 'latencylab[plot]'``): a missing one is a one-line :class:`~latencylab.errors.LatencyLabError`.
"""

from __future__ import annotations

import base64
import io
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from latencylab import stats
from latencylab.errors import require
from latencylab.load.results import LoadResult
from latencylab.results import ProfileResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from latencylab.budget import BudgetVerdict

__all__ = [
    "ThroughputPoint",
    "capacity_curve",
    "ladder_over_time",
    "latency_vs_throughput",
    "load_cdf",
    "load_histogram",
    "load_over_time",
    "pareto_front",
    "profile_breakdown",
    "profile_distribution",
    "profile_over_time",
    "server_breakdown",
    "stage_shares",
]

DPI = 100
WIDE = (11.0, 4.6)  # inches: 1100 x 460 px at DPI

# One colour per meaning, as in load.plots.
P50 = "#1f77b4"
P99 = "#ff7f0e"
DEADLINE = "#d62728"  # red: budgets, SLOs and "over" marks only
CHOSEN = "#2ca02c"
LEVEL = "#1b7837"
STAGE_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#72b7b2", "#eeca3b", "#9d755d", "#bab0ac")


def _new(figsize: tuple[float, float] = WIDE, ncols: int = 1, width_ratios: Sequence[float] | None = None) -> Any:
    require("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False, width_ratios=width_ratios)[0]
    return fig, list(axes)


def _png_uri(png: bytes) -> str:
    """Palette-quantised PNG as a data URI (the quantised one only when it is smaller)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    small = io.BytesIO()
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        small, format="PNG", optimize=True
    )
    data = small.getvalue() if small.tell() < len(png) else png
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def to_data_uri(fig: Figure, dpi: int = DPI) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    return _png_uri(buf.getvalue())


def _via_file(draw: Callable[[Path], Path]) -> str:
    """A figure from a function that writes a PNG file (load.plots), as a data URI."""
    with tempfile.TemporaryDirectory(prefix="latencylab-report-") as tmp:
        return _png_uri(draw(Path(tmp) / "fig.png").read_bytes())


def _fmt_ms(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _log_ms(ax: Axes, axis: str = "x") -> None:
    """Plain-number labels on a log axis (1, 10, 100; also 2 and 5 when it spans under two decades)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    a = ax.xaxis if axis == "x" else ax.yaxis

    def minor(v: float, _pos: int | None) -> str:
        lo, hi = sorted(a.get_view_interval())
        return f"{v:g}" if lo > 0 and math.log10(hi / lo) <= 2 else ""

    a.set_major_locator(LogLocator(base=10))
    a.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    a.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    a.set_minor_formatter(FuncFormatter(minor))


# -- profile -----------------------------------------------------------------------------------


def _hist_edges(lo: float, hi: float, bins: int = 60) -> tuple[np.ndarray, bool]:
    """Bin edges (ms): log-spaced when the range spans more than 3x, linear otherwise."""
    lo, hi = max(lo, 1e-6), max(hi, lo * 1.001)
    if hi / lo > 3:
        return np.geomspace(lo, hi * 1.0001, bins + 1), True
    return np.linspace(lo, hi * 1.0001, bins + 1), False


def _tail(ax: Axes, xs_ms: np.ndarray, color: str, label: str) -> None:
    """1 - CDF on a log y axis from sorted samples (ms)."""
    n = xs_ms.size
    frac_above = 1.0 - np.arange(1, n + 1) / n
    floor = 0.5 / n
    ax.plot(xs_ms, np.maximum(frac_above, floor), drawstyle="steps-post", color=color, lw=1.7, label=label)


def _mark_quantiles(ax: Axes, values: Mapping[str, float], y: float | None = None) -> None:
    for (name, v), color in zip(values.items(), (P50, P99), strict=False):
        ax.axvline(v, color=color, lw=1.2, ls=":")
        ax.annotate(
            f"{name} {_fmt_ms(v)} ms", (v, 1.0 if y is None else y), xycoords=("data", "axes fraction"),
            xytext=(3, -12), textcoords="offset points", color=color, fontsize=9, fontweight="bold",
        )  # fmt: skip


def profile_distribution(result: ProfileResult, deadline_ms: float | None = None, q: float = 0.99) -> str:
    """End-to-end latency: histogram (left) and tail, 1 - CDF on a log axis (right), p50 and the held
    quantile marked, the budget deadline as a red line."""
    e2e = np.sort(result.end_to_end_ns()) / 1e6
    p50, pq = stats.quantile(e2e, 0.5), stats.quantile(e2e, q)
    qname = stats.format_q(q)
    fig, (hist, tail) = _new(ncols=2)
    hi = max(float(e2e[-1]), deadline_ms or 0.0)
    edges, log = _hist_edges(float(e2e[0]), hi)
    hist.hist(e2e, bins=edges, color=STAGE_COLOURS[0], alpha=0.85)
    if log:
        hist.set_xscale("log")
        _log_ms(hist)
    hist.set_xlabel("end-to-end latency (ms)")
    hist.set_ylabel(f"iterations per bin (of {result.n:,})")
    hist.set_title("histogram", fontsize=11)
    _mark_quantiles(hist, {"p50": p50, qname: pq})
    _tail(tail, e2e, STAGE_COLOURS[0], "end-to-end")
    tail.set_xscale("log")
    tail.set_yscale("log")
    _log_ms(tail)
    tail.set_xlabel("end-to-end latency (ms)")
    tail.set_ylabel("fraction of iterations slower than x")
    tail.set_title("tail (1 - CDF, log scale)", fontsize=11)
    tail.axhline(1 - q, color="0.5", lw=0.8, ls=":")
    tail.plot([pq], [1 - q], "o", color=P99, ms=7, zorder=5)
    tail.annotate(f"{qname} {_fmt_ms(pq)} ms", (pq, 1 - q), xytext=(6, 6), textcoords="offset points",
                  color=P99, fontweight="bold", fontsize=9.5)  # fmt: skip
    for a in (hist, tail):
        a.grid(True, which="major", alpha=0.3)
        if deadline_ms is not None:
            a.axvline(deadline_ms, color=DEADLINE, ls="--", lw=1.4, label=f"deadline {deadline_ms:g} ms")
    if deadline_ms is not None:
        tail.legend(loc="lower left", fontsize=9)
    fig.suptitle(f"Latency distribution: {result.workload} ({result.n:,} iterations, {result.clock})", fontsize=13)
    return to_data_uri(fig)


def profile_over_time(
    result: ProfileResult, spikes: Sequence[Mapping[str, Any]] = (), deadline_ms: float | None = None
) -> str:
    """Every iteration's end-to-end latency against its start time (dots), the p50 and p99 of ~100 equal
    time windows (lines), spikes found by the analysis shaded, the deadline as a red line."""
    t = np.asarray(result.iteration_start_ns, dtype=np.float64) / 1e9
    y = result.end_to_end_ns() / 1e6
    fig, (ax,) = _new()
    step = max(1, y.size // 20_000)  # enough dots to see the texture, few enough to stay small
    ax.scatter(t[::step], y[::step], s=5, color="0.45", alpha=0.45, lw=0, label="iterations", rasterized=True)
    nwin = max(1, min(100, y.size // 100))  # >= 100 iterations per window: its p99 is not just its maximum
    edges = np.linspace(t[0], t[-1] + 1e-9, nwin + 1)
    idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, nwin - 1)
    mids, w50, w99 = [], [], []
    for w in range(nwin):
        sel = y[idx == w]
        if sel.size:
            mids.append((edges[w] + edges[w + 1]) / 2)
            w50.append(float(np.quantile(sel, 0.5)))
            w99.append(float(np.quantile(sel, 0.99)))
    ax.plot(
        mids,
        w99,
        color=P99,
        lw=1.7,
        marker=".",
        label=f"p99 per window ({nwin} windows of ~{y.size // nwin:,} iterations)",
    )
    ax.plot(mids, w50, color=P50, lw=1.7, marker=".", label="p50 per window")
    span = max(t[-1] - t[0], 1e-9)
    for k, sp in enumerate(spikes):
        a, b = int(sp.get("start", 0)), int(sp.get("end", 0))
        if 0 <= a < t.size:
            t1 = max(float(t[min(max(b, a), t.size - 1)]), t[a] + span / 300)  # a one-iteration stall stays visible
            ax.axvspan(
                t[a], t1, color=DEADLINE, alpha=0.15, lw=0, label=f"spikes found ({len(spikes)})" if k == 0 else None
            )
            if len(spikes) <= 4:  # more labels than that would overlap
                ax.annotate(f"{sp.get('kind', 'spike')} x{float(sp.get('ratio', 0)):.1f}", (t[a], 1),
                            xycoords=("data", "axes fraction"), xytext=(2, -12), textcoords="offset points",
                            fontsize=8.5, color=DEADLINE)  # fmt: skip
    if deadline_ms is not None:
        ax.axhline(deadline_ms, color=DEADLINE, ls="--", lw=1.3, label=f"deadline {deadline_ms:g} ms")
    ax.set_yscale("log")
    _log_ms(ax, "y")
    ax.set_xlabel("time since the first timed iteration (s)")
    ax.set_ylabel("end-to-end latency (ms)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=9, framealpha=0.9, markerscale=3)
    fig.suptitle(f"Latency over time: {result.workload}", fontsize=13)
    return to_data_uri(fig)


def stage_shares(results: Sequence[tuple[str, ProfileResult]]) -> str:
    """Where the time goes: one stacked bar per profile, each stage's mean duration (ms), labelled with
    its share of end-to-end time."""
    fig, (ax,) = _new(figsize=(11.0, 1.3 + 0.55 * len(results)))
    names: list[str] = []
    for _, r in results:
        names.extend(n for n in r.stage_names if n not in names)
    colour = {n: STAGE_COLOURS[i % len(STAGE_COLOURS)] for i, n in enumerate(names)}
    labels = []
    for row, (label, r) in enumerate(results):
        labels.append(label)
        total = float(r.end_to_end_ns().mean()) / 1e6
        left = 0.0
        for s in r.stages:
            mean = float(s.array().mean()) / 1e6
            ax.barh(row, mean, left=left, color=colour[s.name], edgecolor="white", height=0.6, label=s.name)
            if total > 0 and mean / total >= 0.06:
                ax.text(left + mean / 2, row, f"{s.name}\n{mean / total:.0%}", ha="center", va="center",
                        fontsize=8.5, color="white", fontweight="bold")  # fmt: skip
            left += mean
        ax.text(left, row, f"  {_fmt_ms(left)} ms", va="center", fontsize=9)
    ax.set_yticks(range(len(results)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("mean time per iteration (ms), stages in pipeline order")
    handles, hl = ax.get_legend_handles_labels()
    seen = dict(zip(hl, handles, strict=True))
    fig.legend(seen.values(), seen.keys(), loc="outside right upper", fontsize=9)
    ax.set_xlim(0, ax.get_xlim()[1] * 1.08)
    fig.suptitle("Stage breakdown: mean time per stage (share of end-to-end)", fontsize=13)
    return to_data_uri(fig)


def profile_breakdown(result: ProfileResult, verdict: BudgetVerdict | None = None) -> str:
    """Per stage: p50 (solid) and the held quantile (light) with each stage's allowance as a black mark;
    end-to-end last against the deadline. A stage over its allowance is outlined red; the one that
    breaks the budget first is labelled."""
    q = verdict.budget.quantile if verdict is not None else 0.99
    qname = stats.format_q(q)
    rows: list[tuple[str, np.ndarray, float | None, str]] = []
    for i, s in enumerate(result.stages):
        allowance = None
        if verdict is not None:
            allowance = verdict.row(s.name).allowance_ms
        rows.append((s.name, s.array() / 1e6, allowance, STAGE_COLOURS[i % len(STAGE_COLOURS)]))
    rows.append(
        ("end-to-end", result.end_to_end_ns() / 1e6, None if verdict is None else verdict.budget.deadline_ms, "0.35")
    )
    fig, (ax,) = _new(figsize=(11.0, 1.8 + 0.55 * len(rows)))
    from matplotlib.colors import to_rgba

    top = 0.0
    for y, (name, xs, allowance, color) in enumerate(rows):
        p50, pq = float(np.quantile(xs, 0.5)), float(np.quantile(xs, q))
        over = allowance is not None and pq > allowance
        breaking = verdict is not None and name == verdict.breaking_stage
        light = to_rgba(color, 0.35)
        ax.barh(y, pq, height=0.62, color=light, edgecolor=DEADLINE if over else "none", lw=2.2 if over else 0)
        ax.barh(y, p50, height=0.62, color=color)
        text = f" {qname} {_fmt_ms(pq)} ms"
        if allowance is not None:
            ax.plot([allowance, allowance], [y - 0.42, y + 0.42], color="black", lw=2.4, solid_capstyle="butt")
            text += f" / {_fmt_ms(allowance)} ms" + (f"  OVER x{pq / allowance:.2f}" if over else "")
        if breaking:
            text += "  <- breaks the budget first"
        ax.text(max(pq, allowance or 0.0), y, text, va="center", fontsize=9,
                color=DEADLINE if over else "0.2", fontweight="bold" if over else "normal")  # fmt: skip
        top = max(top, pq, allowance or 0.0)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.55)
    ax.set_xlabel(f"ms: p50 (solid), {qname} (light)" + ("; black mark: allowance / deadline" if verdict else ""))
    ax.grid(True, axis="x", alpha=0.3)
    title = f"Stage latency: {result.workload}"
    if verdict is not None:
        title += f" against the budget ({'met' if verdict.ok else 'BROKEN'})"
    fig.suptitle(title, fontsize=13, color=DEADLINE if verdict is not None and not verdict.ok else "black")
    return to_data_uri(fig)


# -- load --------------------------------------------------------------------------------------


def load_histogram(result: LoadResult) -> str:
    """Histogram of successful requests' latency (from the intended send), from the HDR buckets."""
    h = result.histogram("corrected_ok")
    pts = h.cdf()
    xs = np.asarray([v / 1e6 for v, _ in pts])
    fs = np.asarray([f for _, f in pts])
    edges, log = _hist_edges(float(xs[0]), float(xs[-1]))
    # fraction of requests <= each edge (a step function through the HDR CDF), differenced per bin
    at = np.concatenate([[0.0], fs])[np.searchsorted(xs, edges, side="right")]
    counts = np.diff(at) * h.count
    fig, (ax,) = _new(figsize=(11.0, 3.8))
    ax.stairs(counts, edges, fill=True, color=P50, alpha=0.8)
    if log:
        ax.set_xscale("log")
        _log_ms(ax)
    s = result.summary
    marks = {k: float(s[f"{k}_ms"]) for k in ("p50", "p99") if s.get(f"{k}_ms") is not None}
    _mark_quantiles(ax, marks)
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
    from latencylab.load.plots import plot_cdf

    return _via_file(lambda p: plot_cdf(result, p, dpi=DPI))


def load_over_time(result: LoadResult) -> str:
    from latencylab.load.plots import plot_latency_over_time

    return _via_file(lambda p: plot_latency_over_time(result, p, dpi=DPI))


def capacity_curve(steps: Sequence[Mapping[str, Any]], slo_ms: float | None) -> str:
    from latencylab.load.plots import plot_capacity

    return _via_file(lambda p: plot_capacity(steps, p, slo_ms, dpi=DPI))


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
    fig, (ax,) = _new(figsize=(11.0, 2.2))
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
    fig, (ax,) = _new()
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
    _log_ms(ax, "y")
    ax.margins(x=0.1)
    ax.set_xlabel("achieved rate (requests sent per s)")
    ax.set_ylabel("latency from intended send (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.suptitle("Latency vs throughput across the load runs", fontsize=13)
    return to_data_uri(fig)


# -- optimize ----------------------------------------------------------------------------------


def fidelity_score(doc: Mapping[str, Any]) -> tuple[str, Callable[[Mapping[str, Any]], float | None]]:
    """The fidelity axis of the Pareto front, as the search scores it: accuracy where labels exist,
    else the mean cosine similarity to the FP32 reference."""
    cands = doc.get("candidates") or []
    if any((c.get("fidelity") or {}).get("accuracy") is not None for c in cands):
        return "accuracy on the held-out set", lambda c: (c.get("fidelity") or {}).get("accuracy")
    return "mean cosine similarity to FP32", lambda c: (c.get("fidelity") or {}).get("cos_mean")


def pareto_front(doc: Mapping[str, Any]) -> str:
    """Each measured candidate at (p50 latency, fidelity) with its p50 95% CI, the Pareto front joined,
    the baseline and the chosen variant marked; candidates outside the fidelity budget hollow."""
    s = doc.get("summary") or {}
    label, score = fidelity_score(doc)
    front = list(s.get("pareto") or [])
    chosen = (s.get("chosen") or {}).get("name")
    base = (s.get("baseline") or {}).get("name")
    fig, (ax,) = _new(figsize=(11.0, 5.2))
    pts = {}
    for c in doc.get("candidates") or []:
        y = score(c)
        if c.get("p50_ms") is None or y is None:
            continue
        x = float(c["p50_ms"])
        pts[c["name"]] = (x, float(y))
        ci = c.get("p50_ci_ms") or [x, x]
        inside = c.get("status") in ("baseline", "inside-budget")
        color = CHOSEN if c["name"] == chosen else ("0.2" if c["name"] == base else P50)
        ax.errorbar(x, y, xerr=[[x - ci[0]], [ci[1] - x]], fmt="none", ecolor=color, elinewidth=1.2, capsize=3)
        ax.scatter(
            [x],
            [y],
            s=70,
            marker="o",
            facecolors=color if inside else "white",
            edgecolors=color,
            linewidths=1.8,
            zorder=4,
        )
        ax.annotate(c["name"], (x, y), xytext=(6, 5), textcoords="offset points", fontsize=8.5, color="0.25")
    fx = sorted(pts[n] for n in front if n in pts)
    if fx:
        ax.plot([p[0] for p in fx], [p[1] for p in fx], color=P99, lw=1.6, ls="-", zorder=3)
        ax.scatter([p[0] for p in fx], [p[1] for p in fx], s=260, facecolors="none", edgecolors=P99, linewidths=2.0,
                   zorder=3, label="Pareto front (not dominated)")  # fmt: skip
    if chosen in pts:
        x, y = pts[chosen]
        ax.scatter([x], [y], s=420, marker="*", color=CHOSEN, edgecolors="black", linewidths=0.8, zorder=6,
                   label=f"chosen: {chosen}")  # fmt: skip
    if base in pts:
        ax.scatter([pts[base][0]], [pts[base][1]], s=150, marker="D", facecolors="none", edgecolors="0.2",
                   linewidths=1.6, zorder=5, label=f"baseline: {base}")  # fmt: skip
    from matplotlib.lines import Line2D

    handles, _ = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], marker="o", ls="", color=P50, mfc="white", label="outside the fidelity budget"))
    ax.legend(handles=handles, loc="lower right", fontsize=9, framealpha=0.9)
    if pts:
        xs = [p[0] for p in pts.values()]
        ax.set_xlim(min(xs) * 0.85, max(xs) * 1.25)
        ax.margins(y=0.12)
    ax.set_xlabel("p50 latency per inference (ms), 95% CI; left is faster")
    ax.set_ylabel(f"{label}; up is better")
    ax.grid(True, alpha=0.3)
    model = (doc.get("model") or {}).get("model", "")
    fig.suptitle(f"Optimisation: latency vs fidelity ({model}, budget {s.get('budget', '?')})", fontsize=13)
    ax.set_title(str(s.get("verdict", "")), fontsize=9.5, color="0.3")
    return to_data_uri(fig)


# -- serve: the SLO guard ladder ----------------------------------------------------------------


def ladder_over_time(doc: Mapping[str, Any]) -> str:
    """The guard's ladder level over time (step line, top = primary), the window p99 of the current
    level and the SLO (log axis, left), alarm periods in red and each transition's switch time."""
    samples = [s for s in doc.get("samples") or [] if len(s) >= 4]
    ladder = list(doc.get("ladder") or [])
    nlev = max([len(ladder)] + [int(s[1]) + 1 for s in samples])
    names = ladder if len(ladder) == nlev else [f"level {i}" for i in range(nlev)]
    fig, (ax,) = _new(figsize=(11.0, 5.4))
    lv = ax.twinx()
    ax.set_zorder(lv.get_zorder() + 1)
    ax.patch.set_visible(False)
    t = [float(s[0]) for s in samples]
    end = float(doc.get("duration_s") or (t[-1] if t else 1.0))
    phases = list(doc.get("phases") or [])
    for i, ph in enumerate(phases):  # benchmarks/serve_ladder.py: when which rungs were slowed on purpose
        stop = float(phases[i + 1]["at_s"]) if i + 1 < len(phases) else end
        if ph.get("slow"):
            first = all(not q.get("slow") for q in phases[:i])
            ax.axvspan(float(ph["at_s"]), stop, color="#fdae61", alpha=0.16, lw=0,
                       label="slowdown injected" if first else None)  # fmt: skip
            ax.text(float(ph["at_s"]) + 0.2, 0.02, "+" + ", ".join(ph["slow"]), transform=ax.get_xaxis_transform(),
                    fontsize=8, color="#a6611a")  # fmt: skip
    lv.step(
        t, [int(s[1]) for s in samples], where="post", color=LEVEL, lw=2.6, alpha=0.85, label="ladder level (right)"
    )
    start = None
    for s in [*samples, [end, 0, None, False]]:
        if s[3] and start is None:
            start = float(s[0])
        elif not s[3] and start is not None:
            lv.axvspan(start, float(s[0]), color=DEADLINE, alpha=0.12, lw=0)
            lv.text(start, -0.55, " ALARM", color=DEADLINE, fontsize=9, fontweight="bold", va="center")
            start = None
    for tr in doc.get("transitions") or []:
        sw = tr.get("switch_time_s")
        if sw is not None and tr.get("t_s") is not None:
            lv.annotate(f"{sw * 1e3:.1f} ms", (float(tr["t_s"]), int(tr["to_level"])), xytext=(4, 4),
                        textcoords="offset points", fontsize=8, color=LEVEL)  # fmt: skip
    lv.set_ylim(nlev - 0.5, -0.8)
    lv.set_yticks(range(nlev), names)
    lv.set_ylabel("ladder level (top = primary)", color=LEVEL)
    qt = [(float(s[0]), float(s[2])) for s in samples if s[2] is not None and s[2] > 0]
    ax.plot([a for a, _ in qt], [b for _, b in qt], color=P50, lw=1.5, label="guard: window p99 of the current level")
    per_s = [w for w in doc.get("client_per_second") or [] if w.get("p99_ms") is not None]
    shift = float(doc.get("client_shift_s") or 0.0)
    if per_s:
        ax.step([w["from_s"] + shift for w in per_s], [w["p99_ms"] for w in per_s], where="post", color=P99, lw=1.4,
                label="client p99 per second (open loop)")  # fmt: skip
    slo = doc.get("slo_ms")
    if slo is not None:
        ax.axhline(float(slo), color=DEADLINE, ls="--", lw=1.3, label=f"SLO p99 <= {float(slo):g} ms")
    ax.set_yscale("log")
    _log_ms(ax, "y")
    ax.set_ylabel("latency (ms, log)")
    ax.set_xlabel("seconds since the start of the load")
    ax.set_xlim(0, end)
    ax.grid(True, alpha=0.3)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = lv.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncols=3, fontsize=8.5, frameon=False)
    fig.suptitle(f"SLO guard ladder over time: {doc.get('model', '')} model, {doc.get('rate', '?')} req/s", fontsize=13)
    return to_data_uri(fig)


def finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
