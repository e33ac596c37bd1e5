"""``latencylab report``: read result files, run diagnose on them, write one self-contained HTML file."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from latencylab.errors import LatencyLabError, require
from latencylab.findings import Finding
from latencylab.results import LoadedResult, read_result

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["KINDS", "diagnose_findings", "load_inputs", "print_summaries", "run_report_command", "write_report"]

# kind -> keys a document of that kind must have for the report to draw it
KINDS: dict[str, tuple[str, ...]] = {
    "profile": ("stages", "iteration_start_ns"),
    "load": ("summary", "histograms", "timeline"),
    "capacity": ("capacity",),
    "optimize": ("summary", "candidates"),
    "optimize-gen": ("summary", "candidates"),
    "serve": ("samples", "transitions"),
}


def load_input(path: str | Path) -> LoadedResult:
    """One result file as a :class:`LoadedResult` (:func:`latencylab.results.read_result`); one-line errors for a
    missing, unreadable or unknown file, or one that lacks what the report draws."""
    r = read_result(path, accept=KINDS, reader="the report")
    missing = [k for k in KINDS[r.kind] if k not in r.doc]
    if missing:
        raise LatencyLabError(f"{r.source}: malformed {r.kind} result: missing {', '.join(missing)}")
    if r.kind == "optimize-gen":
        r.result()  # its typed reader checks every candidate: a malformed one is one line here, not a crash later
    return r


def load_inputs(paths: Sequence[str | Path]) -> list[LoadedResult]:
    if not paths:
        raise LatencyLabError("no result files given")
    return [load_input(p) for p in paths]


def diagnose_findings(results: Sequence[LoadedResult]) -> tuple[tuple[Finding, ...] | None, str]:
    """(findings, note): ``latencylab.diagnose.engine.diagnose_results`` over the inputs, imported lazily;
    ``(None, why)`` when diagnose is not available or fails, so the rest of the report is still written."""
    try:
        from latencylab.diagnose.engine import diagnose_results
    except ImportError as exc:
        return None, f"diagnose unavailable: {exc}"
    try:
        return tuple(diagnose_results(results)), ""
    except Exception as exc:  # a failing rule must not cost the user the plots
        first = (str(exc).strip().splitlines() or [""])[0]
        return None, f"diagnose failed: {type(exc).__name__}: {first}"


def write_report(
    paths: Sequence[str | Path],
    output: str | Path,
    budget_path: str | Path | None = None,
    title: str | None = None,
) -> tuple[Path, str]:
    """Read ``paths``, diagnose, render and write the HTML to ``output``; returns (path, findings note)."""
    require("matplotlib", "plot")
    from latencylab.budget import load_budget
    from latencylab.report.html import ReportInput, render_report

    results = load_inputs(paths)
    budget = load_budget(budget_path) if budget_path else None
    findings, note = diagnose_findings(results)
    doc = render_report(
        ReportInput(
            results=tuple(results),
            title=title or "latencylab report: " + ", ".join(Path(r.source).stem for r in results),
            budget=budget,
            findings=findings,
            findings_note=note,
        )
    )
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(doc, encoding="utf-8")
    tmp.replace(out)
    return out, note


def print_summaries(paths: Sequence[str | Path], console: Console) -> None:
    """A terminal summary of the inputs that have one (optimize-gen: its candidate table and choice)."""
    for r in load_inputs(paths):
        if r.kind == "optimize-gen":
            from latencylab.report.optimize_gen import render_optimize_gen

            render_optimize_gen(r.result(), _label(r.source), console)


def _label(source: str) -> str:
    return Path(source).name or source


def run_report_command(args: argparse.Namespace, console: Console) -> int:
    out, note = write_report(args.results, args.output, args.latency_budget, args.title)
    print_summaries(args.results, console)
    if note:
        console.print(f"[yellow]report:[/yellow] {note}")
    size = out.stat().st_size
    console.print(f"wrote {out} ({size / 1024:.0f} KiB, {len(args.results)} result file(s))")
    return 0
