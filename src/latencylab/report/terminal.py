"""Terminal rendering of profile results (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from latencylab import stats
from latencylab.analysis import ProfileAnalysis
from latencylab.results import ProfileResult

TABLE_QUANTILES = (0.5, 0.9, 0.99, 0.999)


def ms_text(ns: float) -> str:
    """Nanoseconds as milliseconds with 3-4 significant digits (the cells of every terminal table)."""
    ms = ns / 1e6
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def ci_cell(summary: stats.Summary, q: float) -> str:
    """A percentile with its CI, dimmed with a ``*`` when too few samples lie beyond it."""
    est = summary.at(q)
    text = f"{ms_text(est.value)} [{ms_text(est.ci_low)}, {ms_text(est.ci_high)}]"
    return text if est.enough else f"[dim]{text}*[/dim]"


def render_profile(result: ProfileResult, analysis: ProfileAnalysis, console: Console) -> None:
    """Per-stage percentiles with CIs and shares, then the run's warnings."""
    conf = analysis.end_to_end.summary.confidence
    table = Table(
        title=f"latencylab profile: {result.workload} ({result.n} iterations, clock {result.clock})",
        caption=f"ms; \\[low, high] = {conf:.0%} CI ({analysis.end_to_end.summary.ci_method}); "
        "* = fewer than 10 samples beyond the percentile",
        title_justify="left",
    )
    table.add_column("stage")
    table.add_column("kind")
    table.add_column("share", justify="right")
    table.add_column("mean", justify="right")
    for q in TABLE_QUANTILES:
        table.add_column(stats.format_q(q), justify="right")
    table.add_column("max", justify="right")
    for sa in (*analysis.stages, analysis.end_to_end):
        row = [
            sa.name if sa is not analysis.end_to_end else "[bold]end-to-end[/bold]",
            sa.kind,
            f"{sa.share:.1%}",
            ms_text(sa.summary.mean),
            *(ci_cell(sa.summary, q) for q in TABLE_QUANTILES),
            ms_text(sa.summary.max),
        ]
        table.add_row(*row, end_section=sa is analysis.stages[-1])
    console.print(table)
    console.print(f"stopped: {result.stop_reason}; wall time {result.wall_time_s:.1f} s")
    for w in analysis.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
