"""The ``optimize-gen`` figure: each candidate's TPOT speed-up over eager FP32 (equal work) against its
fidelity loss, the fidelity budget's line, the Pareto front and the choice; drawn as the encoder optimize
plot is (:mod:`.pareto`: log loss axis with a floor for "identical", labels placed clear of the markers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from latencylab.plotting import P99
from latencylab.report.figures.common import CHOSEN, DEADLINE, finite, new, to_data_uri
from latencylab.report.figures.pareto import (
    BACKEND_COLOURS,
    _loss_floor,
    _place_labels,
    add_legend,
    add_score_axis,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from latencylab.results.optimize_gen import GenCandidateRow, OptimizeGenResult

_AGREEMENTS = ("token_agreement", "top1", "exact")
_NAMES = {"token_agreement": "token agreement", "top1": "top-1 agreement", "exact": "exact answers"}


@dataclass(frozen=True, slots=True)
class GenFidelityAxis:
    """The fidelity the plot draws, as a loss (0 = FP32's answers): ``1 - metric`` for an agreement,
    ``ppl_delta`` itself; ``bound``: the budget's limit on that loss (None when it does not bound it)."""

    metric: str
    label: str
    short: str
    bound: float | None
    clause: str

    def loss(self, row: GenCandidateRow) -> float | None:
        v = getattr(row, self.metric)
        if v is None or not finite(v):
            return None
        return float(v) if self.metric == "ppl_delta" else 1.0 - float(v)


def budget_terms(text: str) -> list[tuple[str, str, float, str]]:
    """(metric, op, bound, clause) of a gen budget (``ppl_delta<=2%,token_agreement>=0.95``); none when it
    does not parse."""
    from latencylab.errors import LatencyLabError
    from latencylab.optimize.gen_search import GenBudget

    try:
        b = GenBudget.parse(text)
    except LatencyLabError:
        return []
    return [(m, op, v, part.strip()) for (m, op, v), part in zip(b.terms, text.split(","), strict=True)]


def fidelity_axis(budget: str) -> GenFidelityAxis:
    """Token agreement when the budget bounds it, else the first agreement it bounds, else ``ppl_delta``
    when it bounds that, else token agreement (no line)."""
    terms = {m: (v, clause) for m, _, v, clause in budget_terms(budget)}
    metric = next((m for m in (*_AGREEMENTS, "ppl_delta") if m in terms), "token_agreement")
    v, clause = terms.get(metric, (None, ""))
    if metric == "ppl_delta":
        return GenFidelityAxis(metric, "perplexity increase over FP32 (ppl_delta)", "ppl_delta", v, clause)
    bound = None if v is None else round(1.0 - v, 12)
    name = _NAMES[metric]
    return GenFidelityAxis(metric, f"1 - {name} with FP32", f"1 - {name}", bound, clause)


def gen_pareto_front(points: Sequence[tuple[str, float, float]]) -> list[str]:
    """Names of the (name, speed-up, loss) points no other point beats on both (faster and closer to FP32,
    one of them strictly), fastest first."""
    front = []
    for name, sp, loss in points:
        if not any(s2 >= sp and l2 <= loss and (s2 > sp or l2 < loss) for _, s2, l2 in points):
            front.append((sp, name))
    return [n for _, n in sorted(front, reverse=True)]


def gen_figure(res: OptimizeGenResult) -> tuple[Figure, list[str]]:
    """The plot and the names it labels (the Pareto front and the choice)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis = fidelity_axis(res.budget)
    rows = []
    for r in res.rows:
        loss = axis.loss(r)
        if r.speedup_tpot is not None and r.speedup_tpot > 0 and loss is not None:
            rows.append((r, r.speedup_tpot, loss))
    floor = _loss_floor([v for *_, v in rows], axis.bound)
    families = list(dict.fromkeys(r.family or "?" for r, *_ in rows))
    colour = {f: BACKEND_COLOURS[i % len(BACKEND_COLOURS)] for i, f in enumerate(families)}
    fig, (ax,) = new(figsize=(11.0, 6.2))
    pts: dict[str, tuple[float, float]] = {}
    for r, x, v in rows:
        y = max(v, floor)
        pts[r.name] = (x, y)
        col = colour[r.family or "?"]
        if r.ratio_ci_low and r.ratio_ci_high and r.status != "baseline":  # speed-up CI = 1 / the ratio CI
            lo, hi = 1.0 / r.ratio_ci_high, 1.0 / r.ratio_ci_low
            ax.errorbar(x, y, xerr=[[max(x - lo, 0.0)], [max(hi - x, 0.0)]], fmt="none", ecolor=col,
                        elinewidth=0.9, alpha=0.6, capsize=2)  # fmt: skip
        ax.scatter([x], [y], s=42, marker="o", facecolors=col if r.in_budget else "white", edgecolors=col,
                   linewidths=1.5, zorder=4)  # fmt: skip
    front = gen_pareto_front([(n, x, y) for n, (x, y) in pts.items()])
    fx = sorted(pts[n] for n in front)
    if fx:
        ax.plot([p[0] for p in fx], [p[1] for p in fx], color=P99, lw=1.5, zorder=3)
        ax.scatter([p[0] for p in fx], [p[1] for p in fx], s=170, facecolors="none", edgecolors=P99, linewidths=1.8,
                   zorder=3)  # fmt: skip
    chosen, base = res.chosen, res.baseline
    if chosen in pts:
        ax.scatter(*pts[chosen], s=380, marker="*", color=CHOSEN, edgecolors="black", linewidths=0.8, zorder=6)
    if base in pts:
        ax.scatter(*pts[base], s=130, marker="D", facecolors="none", edgecolors="0.15", linewidths=1.6, zorder=5)
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = [x for x, _ in pts.values()] + [1.0]
    ax.set_xlim(min(xs) / 1.3, max(xs) * 1.3)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="0.35", lw=1.0, ls="-.", zorder=1)
    ax.annotate("eager FP32 (1x)", (1.0, 0.0), xycoords=("data", "axes fraction"), xytext=(4, 4),
                textcoords="offset points", fontsize=8.5, color="0.35")  # fmt: skip
    ys = [y for _, y in pts.values()] + ([axis.bound] if axis.bound else [])
    top = max(ys, default=1.0)
    ax.set_ylim(floor / 8, top * 2.5)
    ax.invert_yaxis()  # smaller loss (closer to FP32) is up: up and right is better
    ax.axhline(floor, color="0.6", lw=0.8, ls=":", zorder=1)
    if axis.bound:
        ax.axhspan(axis.bound, top * 2.5, color=DEADLINE, alpha=0.05, lw=0, zorder=0)
        ax.axhline(axis.bound, color=DEADLINE, ls="--", lw=1.4, zorder=2)
        ax.annotate(f"budget {axis.clause}: {axis.short} <= {axis.bound:g}", (0.0, axis.bound),
                    xycoords=("axes fraction", "data"), xytext=(4, 4), textcoords="offset points", ha="left",
                    va="bottom", fontsize=9, color=DEADLINE, fontweight="bold")  # fmt: skip
    ax.set_xlabel("TPOT speed-up over eager FP32 at equal work (log), 95% paired CI; right is faster")
    ax.set_ylabel(f"{axis.label} (log; up is closer to FP32)")
    add_score_axis(ax, axis.short)
    ax.grid(True, which="major", alpha=0.3)
    groups = {f"family {f}": colour[f] for f in families}
    add_legend(fig, groups, len(fx), chosen if chosen in pts else None, base if base in pts else None,
               axis.clause if axis.bound else None, axis.short, floor)  # fmt: skip
    model = str(res.model.get("model") or "")
    ax.set_title(f"TPOT speed-up vs fidelity ({model.split('/')[-1]}, {len(pts)} candidates)", fontsize=13)
    named = [n for n in dict.fromkeys([*front, *([chosen] if chosen else [])]) if n in pts]
    items = [(n, *pts[n], CHOSEN if n == chosen else "0.15") for n in named]
    _place_labels(fig, ax, items, np.asarray(list(pts.values())) if pts else np.empty((0, 2)))
    return fig, named


def gen_speedup_fidelity(res: OptimizeGenResult) -> str:
    """The optimize-gen plot (:func:`gen_figure`) as a data URI."""
    fig, _ = gen_figure(res)
    return to_data_uri(fig)
