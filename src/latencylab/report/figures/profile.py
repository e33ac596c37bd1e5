"""Profile figures: the latency distribution and its tail, latency over time, stage shares, the stage
breakdown against a latency budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from latencylab import stats
from latencylab.plotting import P50, P99, fmt_ms, log_ms_axis
from latencylab.report.figures.common import DEADLINE, STAGE_COLOURS, hist_edges, mark_quantiles, new, to_data_uri
from latencylab.results import ProfileResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from latencylab.budget import BudgetVerdict


def _tail(ax: Axes, xs_ms: np.ndarray, color: str, label: str) -> None:
    """1 - CDF on a log y axis from sorted samples (ms)."""
    n = xs_ms.size
    frac_above = 1.0 - np.arange(1, n + 1) / n
    floor = 0.5 / n
    ax.plot(xs_ms, np.maximum(frac_above, floor), drawstyle="steps-post", color=color, lw=1.7, label=label)


def profile_distribution(result: ProfileResult, deadline_ms: float | None = None, q: float = 0.99) -> str:
    """End-to-end latency: histogram (left) and tail, 1 - CDF on a log axis (right), p50 and the held
    quantile marked, the budget deadline as a red line."""
    e2e = np.sort(result.end_to_end_ns()) / 1e6
    p50, pq = stats.quantile(e2e, 0.5), stats.quantile(e2e, q)
    qname = stats.format_q(q)
    fig, (hist, tail) = new(ncols=2)
    hi = max(float(e2e[-1]), deadline_ms or 0.0)
    edges, log = hist_edges(float(e2e[0]), hi)
    hist.hist(e2e, bins=edges, color=STAGE_COLOURS[0], alpha=0.85)
    if log:
        hist.set_xscale("log")
        log_ms_axis(hist.xaxis)
    hist.set_xlabel("end-to-end latency (ms)")
    hist.set_ylabel(f"iterations per bin (of {result.n:,})")
    hist.set_title("histogram", fontsize=11)
    mark_quantiles(hist, {"p50": p50, qname: pq})
    _tail(tail, e2e, STAGE_COLOURS[0], "end-to-end")
    tail.set_xscale("log")
    tail.set_yscale("log")
    log_ms_axis(tail.xaxis)
    tail.set_xlabel("end-to-end latency (ms)")
    tail.set_ylabel("fraction of iterations slower than x")
    tail.set_title("tail (1 - CDF, log scale)", fontsize=11)
    tail.axhline(1 - q, color="0.5", lw=0.8, ls=":")
    tail.plot([pq], [1 - q], "o", color=P99, ms=7, zorder=5)
    tail.annotate(f"{qname} {fmt_ms(pq)} ms", (pq, 1 - q), xytext=(6, 6), textcoords="offset points",
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
    fig, (ax,) = new()
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
    log_ms_axis(ax.yaxis)
    ax.set_xlabel("time since the first timed iteration (s)")
    ax.set_ylabel("end-to-end latency (ms)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=9, framealpha=0.9, markerscale=3)
    fig.suptitle(f"Latency over time: {result.workload}", fontsize=13)
    return to_data_uri(fig)


def stage_shares(results: Sequence[tuple[str, ProfileResult]]) -> str:
    """Where the time goes: one stacked bar per profile, each stage's mean duration (ms), labelled with
    its share of end-to-end time."""
    fig, (ax,) = new(figsize=(11.0, 1.3 + 0.55 * len(results)))
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
        ax.text(left, row, f"  {fmt_ms(left)} ms", va="center", fontsize=9)
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
    fig, (ax,) = new(figsize=(11.0, 1.8 + 0.55 * len(rows)))
    from matplotlib.colors import to_rgba

    top = 0.0
    for y, (name, xs, allowance, color) in enumerate(rows):
        p50, pq = float(np.quantile(xs, 0.5)), float(np.quantile(xs, q))
        over = allowance is not None and pq > allowance
        breaking = verdict is not None and name == verdict.breaking_stage
        light = to_rgba(color, 0.35)
        ax.barh(y, pq, height=0.62, color=light, edgecolor=DEADLINE if over else "none", lw=2.2 if over else 0)
        ax.barh(y, p50, height=0.62, color=color)
        text = f" {qname} {fmt_ms(pq)} ms"
        if allowance is not None:
            ax.plot([allowance, allowance], [y - 0.42, y + 0.42], color="black", lw=2.4, solid_capstyle="butt")
            text += f" / {fmt_ms(allowance)} ms" + (f"  OVER x{pq / allowance:.2f}" if over else "")
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
