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
    """The fidelity score the search ranks the Pareto front by: accuracy where labels exist, else the mean
    cosine similarity to the FP32 reference."""
    cands = doc.get("candidates") or []
    if any((c.get("fidelity") or {}).get("accuracy") is not None for c in cands):
        return "accuracy on the held-out set", lambda c: (c.get("fidelity") or {}).get("accuracy")
    return "mean cosine similarity to FP32", lambda c: (c.get("fidelity") or {}).get("cos_mean")


@dataclass(frozen=True, slots=True)
class FidelityLoss:
    """The fidelity axis of the optimize plot as a loss (0 = the reference's outputs; smaller is better),
    so that a log scale separates 0.99 from 0.999: ``1 - cos`` (embeddings), the accuracy drop (labels),
    ``1 - top1`` (classifiers without labels); ``bound`` is the budget's limit on the same loss."""

    label: str  # axis label, e.g. "1 - mean cosine similarity to FP32"
    short: str  # table column / budget text, e.g. "1 - cos"
    value: Callable[[Mapping[str, Any]], float | None]
    bound: float | None  # the budget's limit on the loss (None when the budget does not bound it)
    clause: str  # the budget clause that gives the bound, e.g. "cos>=0.99"


def _budget_terms(text: str) -> list[tuple[str, str, float, str]]:
    """(metric, op, value, clause) of a budget text such as ``cos>=0.99,min_cos>=0.98`` (unparsed: none)."""
    from latencylab.errors import LatencyLabError
    from latencylab.optimize.search import Budget

    try:
        b = Budget.parse(text)
    except LatencyLabError:
        return []
    return [(m, op, v, part.strip()) for (m, op, v), part in zip(b.terms, text.split(","), strict=True)]


def fidelity_loss(doc: Mapping[str, Any]) -> FidelityLoss:
    """The loss to plot for ``doc`` (an optimize result): the accuracy drop where labels exist, else
    ``1 - top1`` when the budget bounds top-1 agreement only, else ``1 - cos_mean``."""
    cands = doc.get("candidates") or []
    terms = _budget_terms(str((doc.get("summary") or {}).get("budget") or ""))

    def fid(c: Mapping[str, Any], key: str) -> float | None:
        v = (c.get("fidelity") or {}).get(key)
        return float(v) if v is not None and finite(v) else None

    def bound(metric: str, complement: bool) -> tuple[float | None, str]:
        for m, _, v, clause in terms:
            if m == metric:
                return (round(1.0 - v, 12) if complement else v), clause  # 1 - 0.99 = 0.01, not 0.010000000000000009
        return None, ""

    if any(fid(c, "accuracy") is not None for c in cands):

        def drop(c: Mapping[str, Any]) -> float | None:
            acc, ref = fid(c, "accuracy"), fid(c, "reference_accuracy")
            return None if acc is None else (ref if ref is not None else 1.0) - acc

        b, clause = bound("accuracy_drop", False)
        return FidelityLoss("accuracy drop on the held-out set (vs FP32)", "accuracy drop", drop, b, clause)
    metrics = {m for m, *_ in terms}
    if "top1" in metrics and "cos" not in metrics:
        b, clause = bound("top1", True)
        top1 = fid  # 1 - top1 below

        return FidelityLoss(
            "1 - top-1 agreement with FP32", "1 - top1",
            lambda c: None if (t := top1(c, "top1")) is None else 1.0 - t, b, clause,
        )  # fmt: skip
    b, clause = bound("cos", True)
    return FidelityLoss(
        "1 - mean cosine similarity to FP32", "1 - cos",
        lambda c: None if (v := fid(c, "cos_mean")) is None else 1.0 - v, b, clause,
    )  # fmt: skip


# Candidates are coloured by backend (not by meaning): green and red stay reserved for the choice and budgets.
BACKEND_COLOURS = ("#4c78a8", "#b279a2", "#72b7b2", "#9d755d", "#eeca3b", "#bab0ac", "#17becf", "#8c6d31")


def _loss_floor(losses: Sequence[float], bound: float | None) -> float:
    """The bottom of the log loss axis, where a loss of 0 (a variant identical to the reference, or
    better) and any loss below it are drawn: one decade under the smallest positive loss, but no lower than
    1/1000 of the budget (below that, differences are float rounding, and decades of it would squeeze the
    decades around the budget that the reader needs), and never below 1e-9."""
    pos = [v for v in losses if v > 0]
    lo = min(pos + ([bound] if bound else []), default=1e-3)
    floor = 10.0 ** (math.floor(math.log10(lo)) - 1)
    if bound:
        floor = max(floor, 10.0 ** math.floor(math.log10(bound / 1000)))
    return max(floor, 1e-9)


def _place_labels(fig: Figure, ax: Axes, items: Sequence[tuple[str, float, float, str]], avoid: np.ndarray) -> None:
    """Annotate ``(text, x, y, colour)`` so that no label overlaps another label or a marker and each stays
    inside the axes: for each point (left to right) the first free spot on rings of growing radius
    around it, joined to it by a thin leader line once it is off the marker. ``avoid``: (n, 2) data
    points every label must keep clear of."""
    from matplotlib.transforms import Bbox

    fig.canvas.draw()  # settle the constrained layout, then freeze it: display coordinates must not move
    fig.set_layout_engine("none")
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    px = fig.dpi / 72.0
    marks = [Bbox.from_bounds(x - 6, y - 6, 12, 12) for x, y in ax.transData.transform(avoid)] if len(avoid) else []
    taken: list[Bbox] = [t.get_window_extent(renderer) for t in ax.texts]  # the budget's and the floor's
    rings = [(r, a) for r in (9, 22, 38, 56, 78, 104) for a in (35, -35, 145, -145, 90, -90, 0, 180, 60, -60)]

    def clash(bb: Bbox) -> float:
        """Pixels of ``bb`` over other labels and markers, or outside the axes (0: a free spot)."""
        inter = 0.0
        for o in (*taken, *marks):
            w = min(bb.x1, o.x1) - max(bb.x0, o.x0)
            h = min(bb.y1, o.y1) - max(bb.y0, o.y0)
            inter += max(w, 0.0) * max(h, 0.0)
        out = bb.width * bb.height - max(min(bb.x1, frame.x1) - max(bb.x0, frame.x0), 0.0) * max(
            min(bb.y1, frame.y1) - max(bb.y0, frame.y0), 0.0
        )
        return inter + 10 * out

    for text, x, y, colour in sorted(items, key=lambda it: (it[1], -it[2])):
        best: tuple[float, int] | None = None
        for k, (r, deg) in enumerate(rings):
            t = _ring_label(ax, text, x, y, colour, r, deg)
            cost = clash(_text_box(t, renderer, px))
            t.remove()
            if best is None or cost < best[0]:
                best = (cost, k)
            if cost == 0:
                break
        assert best is not None
        t = _ring_label(ax, text, x, y, colour, *rings[best[1]])  # the first free spot, else the least covered
        taken.append(_text_box(t, renderer, px))


def _text_box(t: Any, renderer: Any, px: float) -> Any:
    """The display box of an annotation's text (padded by 2 points), without its leader line."""
    from matplotlib.text import Text

    t.update_positions(renderer)
    return Text.get_window_extent(t, renderer).padded(2 * px)


def _ring_label(ax: Axes, text: str, x: float, y: float, colour: str, r: float, deg: float) -> Any:
    """``text`` at ``r`` points from (x, y) in direction ``deg``, aligned away from the point."""
    dx, dy = r * math.cos(math.radians(deg)), r * math.sin(math.radians(deg))
    ha = "left" if dx > 1 else ("right" if dx < -1 else "center")
    va = "bottom" if dy > 1 else ("top" if dy < -1 else "center")
    arrow = {"arrowstyle": "-", "color": "0.55", "lw": 0.7, "shrinkA": 0, "shrinkB": 4} if r > 9 else None
    t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=8.5,
                    color=colour, arrowprops=arrow, zorder=7,
                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})  # fmt: skip
    t.set_in_layout(False)  # a label near the frame must not shrink the axes under constrained layout
    return t


def pareto_figure(doc: Mapping[str, Any]) -> tuple[Figure, list[str]]:
    """The optimize plot and the names it labels (the Pareto front and the choice; the rest are found in
    the report's table by their p50). Each measured candidate sits at (p50 latency with its 95% CI, log
    x; fidelity loss, log y, inverted so that up is closer to the reference), coloured by backend, hollow
    when outside the fidelity budget; the front joined, the choice starred, the baseline a diamond, the
    budget a labelled red line with the region beyond it shaded; a loss of 0 (or one below the axis's
    floor, :func:`_loss_floor`) is drawn on the floor line."""
    from matplotlib.lines import Line2D

    s = doc.get("summary") or {}
    loss = fidelity_loss(doc)
    front = [str(n) for n in s.get("pareto") or []]
    chosen = (s.get("chosen") or {}).get("name")
    base = (s.get("baseline") or {}).get("name")
    fig, (ax,) = _new(figsize=(11.0, 6.2))
    rows = []
    for c in doc.get("candidates") or []:
        v = loss.value(c)
        if finite(c.get("p50_ms")) and v is not None and float(c["p50_ms"]) > 0:
            rows.append((c, float(c["p50_ms"]), float(v)))
    floor = _loss_floor([v for _, _, v in rows], loss.bound)
    backends = list(dict.fromkeys(str(c.get("backend") or "?") for c, _, _ in rows))
    colour = {b: BACKEND_COLOURS[i % len(BACKEND_COLOURS)] for i, b in enumerate(backends)}
    pts: dict[str, tuple[float, float]] = {}
    for c, x, v in rows:
        y = max(v, floor)
        pts[str(c["name"])] = (x, y)
        col = colour[str(c.get("backend") or "?")]
        ci = c.get("p50_ci_ms")
        if ci and len(ci) == 2 and all(finite(e) for e in ci):
            ax.errorbar(x, y, xerr=[[max(x - ci[0], 0.0)], [max(ci[1] - x, 0.0)]], fmt="none", ecolor=col,
                        elinewidth=0.9, alpha=0.6, capsize=2)  # fmt: skip
        inside = c.get("status") in ("baseline", "inside-budget")
        ax.scatter([x], [y], s=42, marker="o", facecolors=col if inside else "white", edgecolors=col, linewidths=1.5,
                   zorder=4)  # fmt: skip
    fx = sorted(pts[n] for n in front if n in pts)
    if fx:
        ax.plot([p[0] for p in fx], [p[1] for p in fx], color=P99, lw=1.5, zorder=3)
        ax.scatter([p[0] for p in fx], [p[1] for p in fx], s=170, facecolors="none", edgecolors=P99, linewidths=1.8,
                   zorder=3)  # fmt: skip
    if chosen in pts:
        ax.scatter(*pts[chosen], s=380, marker="*", color=CHOSEN, edgecolors="black", linewidths=0.8, zorder=6)
    if base in pts:
        ax.scatter(*pts[base], s=130, marker="D", facecolors="none", edgecolors="0.15", linewidths=1.6, zorder=5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _log_ms(ax)
    ys = [y for _, y in pts.values()] + ([loss.bound] if loss.bound else [])
    top = max(ys, default=1.0)
    ax.set_ylim(floor / 8, top * 2.5)  # headroom above the floor, where the variants equal to FP32 crowd
    ax.invert_yaxis()  # smaller loss (closer to the reference) is up, so up and left is better
    if pts:
        xs = [x for x, _ in pts.values()]
        ax.set_xlim(min(xs) / 1.25, max(xs) * 1.25)
    ax.axhline(floor, color="0.6", lw=0.8, ls=":", zorder=1)
    if loss.bound:
        ax.axhspan(loss.bound, top * 2.5, color=DEADLINE, alpha=0.05, lw=0, zorder=0)
        ax.axhline(loss.bound, color=DEADLINE, ls="--", lw=1.4, zorder=2)
        ax.annotate(f"budget {loss.clause}: {loss.short} <= {loss.bound:g}", (1.0, loss.bound),
                    xycoords=("axes fraction", "data"), xytext=(-4, 4), textcoords="offset points", ha="right",
                    va="bottom", fontsize=9, color=DEADLINE, fontweight="bold")  # fmt: skip
    ax.set_xlabel("p50 latency per call (ms, log), 95% CI; left is faster")
    ax.set_ylabel(f"{loss.label} (log; up is closer to FP32)")
    if loss.short.startswith("1 - "):  # the score itself beside its loss: 0.999 and 0.99 a decade apart
        from matplotlib.ticker import FuncFormatter, LogLocator

        score_axis = ax.secondary_yaxis("right")
        score_axis.yaxis.set_major_locator(LogLocator(base=10))
        score_axis.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _complement(v)))
        score_axis.set_ylabel(loss.short[4:], fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    handles: list[Any] = [
        Line2D([], [], marker="o", ls="", color=colour[b], ms=7, label=f"backend {b}") for b in backends
    ]
    handles.append(
        Line2D([], [], marker="o", ls="", color="0.4", mfc="white", ms=7, label="outside the budget (hollow)")
    )
    if fx:
        handles.append(Line2D([], [], marker="o", ms=12, mfc="none", mec=P99, color=P99, lw=1.5,
                              label=f"Pareto front ({len(fx)}, labelled)"))  # fmt: skip
    if chosen in pts:
        handles.append(Line2D([], [], marker="*", ls="", ms=16, color=CHOSEN, mec="black", label=f"chosen: {chosen}"))
    if base in pts:
        handles.append(Line2D([], [], marker="D", ls="", ms=9, mfc="none", mec="0.15", label=f"baseline: {base}"))
    if loss.bound:
        handles.append(Line2D([], [], color=DEADLINE, ls="--", lw=1.4, label=f"fidelity budget ({loss.clause})"))
    handles.append(Line2D([], [], color="0.6", ls=":", lw=0.8, label=f"{loss.short} <= {floor:.0e}, 0 included"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8.5, framealpha=0.9)
    model = (doc.get("model") or {}).get("model", "")
    # the titles over the axes, not the figure: the legend beside the axes would cover a centred suptitle
    # the headline (a long line) is the report's text above the figure, not a title that squeezes the axes
    ax.set_title(f"Optimisation: latency vs fidelity ({model.split('/')[-1]}, {len(pts)} candidates)", fontsize=13)
    named = [n for n in dict.fromkeys([*front, *([chosen] if chosen else [])]) if n in pts]
    items = [(n, *pts[n], CHOSEN if n == chosen else "0.15") for n in named]
    _place_labels(fig, ax, items, np.asarray(list(pts.values())) if pts else np.empty((0, 2)))
    return fig, named


def _complement(loss: float) -> str:
    """1 - loss with as many decimals as the loss needs (1e-3 -> 0.999); 1 at a zero loss."""
    if loss <= 0 or loss >= 1:
        return f"{1 - loss:g}"
    return f"{1 - loss:.{max(1, -math.floor(math.log10(loss) + 1e-9))}f}"


def pareto_front(doc: Mapping[str, Any]) -> str:
    """The optimize plot (:func:`pareto_figure`) as a data URI."""
    fig, _ = pareto_figure(doc)
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
