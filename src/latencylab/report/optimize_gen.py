"""The report's view of an ``optimize-gen`` result: the candidate table (plain-text cells, shared by the
HTML section and the terminal summary), the choice line, and the terminal summary itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

from latencylab.results.optimize_gen import GenCandidateRow, OptimizeGenResult

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["HEAD", "NUMERIC", "cells", "choice_line", "ordered", "render_optimize_gen"]

HEAD = (
    "candidate", "family", "TPOT ms (equal work)", "TPOT p50 / p99 ms", "TTFT p50 / p99 ms",
    "TPOT speed-up [95% CI]", "TTFT speed-up", "token agreement", "exact", "top-1", "ppl delta",
    "spec. acceptance / tokens per step", "budget", "why",
)  # fmt: skip
NUMERIC = (2, 3, 4, 5, 6, 7, 8, 9, 10, 11)


def _g(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}g}"


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None and b is None else f"{_g(a)} / {_g(b)}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def ordered(res: OptimizeGenResult) -> list[GenCandidateRow]:
    """Measured candidates by TPOT speed-up (fastest first, as the plot's x axis), then the unmeasured ones
    in the search's order."""
    measured = sorted((r for r in res.rows if r.speedup_tpot is not None), key=lambda r: -(r.speedup_tpot or 0.0))
    return [*measured, *(r for r in res.rows if r.speedup_tpot is None)]


def budget_cell(r: GenCandidateRow) -> str:
    return {"baseline": "reference", "inside-budget": "inside", "outside-budget": "OUTSIDE"}.get(r.status, r.status)


def cells(r: GenCandidateRow, chosen: str | None = None) -> list[str]:
    """One table row (plain text) in :data:`HEAD`'s order."""
    sp = _x(r.speedup_tpot)
    if r.speedup_tpot is not None and r.ratio_ci_low and r.ratio_ci_high and r.status != "baseline":
        sp += f" [{1 / r.ratio_ci_high:.2f}, {1 / r.ratio_ci_low:.2f}]"
    spec = "-"
    if r.tokens_per_step is not None:
        spec = f"{'-' if r.acceptance is None else f'{r.acceptance:.2f}'} / {r.tokens_per_step:.2f}"
    ppl = "-" if r.ppl_delta is None else f"{100 * r.ppl_delta:+.2f}%"
    name = (
        r.name
        + (" (chosen)" if r.name == chosen else "")
        + (" (exact by construction)" if r.exact_by_construction else "")
    )
    return [
        name, r.family, _g(r.tpot_ms), _pair(r.tpot_p50_ms, r.tpot_p99_ms), _pair(r.ttft_p50_ms, r.ttft_p99_ms),
        sp, _x(r.speedup_ttft), "-" if r.token_agreement is None else f"{r.token_agreement:.3f}",
        "-" if r.exact is None else f"{r.exact:.2f}", "-" if r.top1 is None else f"{r.top1:.3f}", ppl, spec,
        budget_cell(r), r.reason,
    ]  # fmt: skip


def choice_line(res: OptimizeGenResult) -> str:
    """The choice, its equal-work TPOT speed-up with the paired CI, and the recipe path; or why none."""
    if res.chosen is None:
        line = "no variant chosen: none inside the budget has a TPOT significantly below the baseline's"
    else:
        r = res.row(res.chosen)
        family = f" ({r.family})" if r.family and r.family != r.name else ""
        line = f"chosen: {r.name}{family}, TPOT {_x(r.speedup_tpot)} faster than {res.baseline} at equal work"
        if r.ratio_ci_low and r.ratio_ci_high:
            line += f" (95% paired CI [{1 / r.ratio_ci_high:.2f}x, {1 / r.ratio_ci_low:.2f}x])"
        if r.speedup_ttft is not None:
            line += f", TTFT {_x(r.speedup_ttft)}"
    path = res.recipe_path
    if path:
        line += f"; recipe: {path}" if res.recipe_check is None else f"; applied recipe: {path}"
    return line


def render_optimize_gen(res: OptimizeGenResult, source: str, console: Console) -> None:
    """The terminal summary of one optimize-gen result (``latencylab report``)."""
    from rich.markup import escape
    from rich.table import Table

    model = res.model.get("model") or "?"
    work = f"{res.tokens} tokens, {res.rounds} rounds" if res.tokens is not None else "equal work"
    t = Table(title=f"{source}: optimize --workload gen, {model} (budget {res.budget or '?'}; {work})",
              title_justify="left")  # fmt: skip
    keep = (0, 2, 3, 4, 5, 7, 10, 11, 12, 13)  # the terminal's columns (the HTML has every one)
    for i in keep:
        t.add_column(escape(HEAD[i]), justify="right" if i in NUMERIC else "left", overflow="fold")
    for r in ordered(res):
        row = cells(r, res.chosen)
        t.add_row(*(escape(row[i]) for i in keep), style="bold" if r.name == res.chosen else None)
    console.print(t)
    console.print(escape(res.verdict))
    console.print(escape(choice_line(res)))
