"""The optimize figure: candidates on latency against fidelity loss, the Pareto front, the choice and the
fidelity budget, each named point labelled where it overlaps nothing."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from latencylab.plotting import P99, log_ms_axis
from latencylab.report.figures.common import CHOSEN, DEADLINE, finite, new, to_data_uri

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


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

    s = doc.get("summary") or {}
    loss = fidelity_loss(doc)
    front = [str(n) for n in s.get("pareto") or []]
    chosen = (s.get("chosen") or {}).get("name")
    base = (s.get("baseline") or {}).get("name")
    fig, (ax,) = new(figsize=(11.0, 6.2))
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
    log_ms_axis(ax.xaxis)
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
    add_score_axis(ax, loss.short)
    ax.grid(True, which="major", alpha=0.3)
    groups = {f"backend {b}": colour[b] for b in backends}
    add_legend(fig, groups, len(fx), chosen if chosen in pts else None, base if base in pts else None,
               loss.clause if loss.bound else None, loss.short, floor)  # fmt: skip
    model = (doc.get("model") or {}).get("model", "")
    # the titles over the axes, not the figure: the legend beside the axes would cover a centred suptitle
    # the headline (a long line) is the report's text above the figure, not a title that squeezes the axes
    ax.set_title(f"Optimisation: latency vs fidelity ({model.split('/')[-1]}, {len(pts)} candidates)", fontsize=13)
    named = [n for n in dict.fromkeys([*front, *([chosen] if chosen else [])]) if n in pts]
    items = [(n, *pts[n], CHOSEN if n == chosen else "0.15") for n in named]
    _place_labels(fig, ax, items, np.asarray(list(pts.values())) if pts else np.empty((0, 2)))
    return fig, named


def add_score_axis(ax: Axes, short: str) -> None:
    """For a loss ``1 - score`` on a log axis, the score itself on a right-hand axis (0.999 and 0.99 a decade
    apart); nothing for any other loss."""
    if not short.startswith("1 - "):
        return
    from matplotlib.ticker import FuncFormatter, LogLocator

    score_axis = ax.secondary_yaxis("right")
    score_axis.yaxis.set_major_locator(LogLocator(base=10))
    score_axis.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _complement(v)))
    score_axis.set_ylabel(short[4:], fontsize=9)


def add_legend(
    fig: Figure, groups: Mapping[str, str], n_front: int, chosen: str | None, base: str | None,
    budget_clause: str | None, short: str, floor: float,
) -> None:  # fmt: skip
    """The legend of a speed-vs-fidelity plot, right of the axes: a marker per group (label -> colour), hollow =
    outside the budget, the Pareto front's rings, the chosen star, the baseline diamond, the budget line and the
    floor at which a zero loss is drawn."""
    from matplotlib.lines import Line2D

    handles: list[Any] = [Line2D([], [], marker="o", ls="", color=c, ms=7, label=g) for g, c in groups.items()]
    handles.append(
        Line2D([], [], marker="o", ls="", color="0.4", mfc="white", ms=7, label="outside the budget (hollow)")
    )
    if n_front:
        handles.append(Line2D([], [], marker="o", ms=12, mfc="none", mec=P99, color=P99, lw=1.5,
                              label=f"Pareto front ({n_front}, labelled)"))  # fmt: skip
    if chosen is not None:
        handles.append(Line2D([], [], marker="*", ls="", ms=16, color=CHOSEN, mec="black", label=f"chosen: {chosen}"))
    if base is not None:
        handles.append(Line2D([], [], marker="D", ls="", ms=9, mfc="none", mec="0.15", label=f"baseline: {base}"))
    if budget_clause is not None:
        handles.append(Line2D([], [], color=DEADLINE, ls="--", lw=1.4, label=f"fidelity budget ({budget_clause})"))
    handles.append(Line2D([], [], color="0.6", ls=":", lw=0.8, label=f"{short} <= {floor:.0e}, 0 included"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8.5, framealpha=0.9)


def _complement(loss: float) -> str:
    """1 - loss with as many decimals as the loss needs (1e-3 -> 0.999); 1 at a zero loss."""
    if loss <= 0 or loss >= 1:
        return f"{1 - loss:g}"
    return f"{1 - loss:.{max(1, -math.floor(math.log10(loss) + 1e-9))}f}"


def pareto_front(doc: Mapping[str, Any]) -> str:
    """The optimize plot (:func:`pareto_figure`) as a data URI."""
    fig, _ = pareto_figure(doc)
    return to_data_uri(fig)
