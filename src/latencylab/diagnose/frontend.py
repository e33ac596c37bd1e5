"""``latencylab diagnose``: load results (or profile a workload live), run the rules, render the findings.

With ``--workload`` the workload is profiled first for ``LIVE_MIN_TIME_S`` seconds (after
``LIVE_WARMUP`` warm-up iterations) on ``LIVE_THREADS`` intra-op thread, as ``latencylab profile`` would,
and the live result is diagnosed
with the files. ``--deep`` adds the sandwich (stage -> system -> operators) on that workload, or on the
built-in workload a profile file names. ``--roofline`` asks ``latencylab.roofline`` (optional module).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from latencylab.diagnose.engine import diagnose_results, findings_doc, load_result, loaded
from latencylab.diagnose.types import SEVERITIES, Finding, LoadedResult
from latencylab.errors import LatencyLabError

LIVE_WARMUP = 5
LIVE_MIN_TIME_S = 3.0
LIVE_THREADS = 1  # one intra-op thread: shares stay representative when other work shares the cores
_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def _build(workload: str, warmup: int) -> Any:
    from latencylab.workloads import WorkloadOptions, build_workload

    params = {"offset": str(warmup)} if workload in ("synthetic", "compiled") else {}
    return build_workload(workload, WorkloadOptions(params=params))


def _live_profile(workload: str, deep: bool, quiet: bool, console: Any) -> tuple[Any, Any, Any]:
    """(pipeline, ProfileResult, SystemMetrics or None): profile the workload, under the sampler with --deep."""
    from latencylab.env import fingerprint
    from latencylab.profiler import ProfileConfig, profile

    pipe = _build(workload, LIVE_WARMUP)
    cfg = ProfileConfig(warmup=LIVE_WARMUP, min_time_s=LIVE_MIN_TIME_S, threads=LIVE_THREADS)
    env = fingerprint()
    if not quiet:
        console.print(f"profiling {workload} for {LIVE_MIN_TIME_S:g} s ...")
    if deep:
        from latencylab.diagnose.sysmetrics import Sampler

        with Sampler() as sampler:
            result = profile(pipe, cfg, env=env)
        return pipe, result, sampler.metrics
    return pipe, profile(pipe, cfg, env=env), None


def _deep_target(results: Sequence[LoadedResult]) -> str:
    from latencylab.workloads import BUILTIN

    for r in results:
        if r.kind == "profile" and str(r.doc.get("workload")) in BUILTIN and r.doc.get("workload") != "onnx":
            return str(r.doc["workload"])
    raise LatencyLabError("--deep needs --workload, or a profile result of a built-in workload to re-run")


def _roofline(workload: str | None, results: Sequence[LoadedResult]) -> list[Finding]:
    try:
        from latencylab.roofline.api import roofline_findings
    except ImportError:
        raise LatencyLabError("roofline not available") from None
    if workload is None:
        workload = next((str(r.doc["workload"]) for r in results if r.kind == "profile"), None)
    if workload is None:
        raise LatencyLabError("--roofline needs --workload or a profile result naming its workload")
    threads = None
    for r in results:
        if r.kind == "profile":
            threads = (r.doc.get("config") or {}).get("threads")
            break
    return list(roofline_findings(workload, threads))


def diagnose(
    paths: Sequence[str | Path] = (),
    workload: str | None = None,
    deep: bool = False,
    roofline: bool = False,
    quiet: bool = True,
    console: Any = None,
) -> tuple[list[Finding], list[str]]:
    """The whole command as a library call: (findings most severe first, the sources read)."""
    results = [load_result(p) for p in paths]
    live = None
    if workload is not None:
        pipe, result, metrics = _live_profile(workload, deep, quiet or console is None, console)
        live = (pipe, result, metrics)
        results.append(loaded(result.to_dict(with_summary=False), f"live run ({workload})"))
    if not results:
        raise LatencyLabError("give result files (RESULT.json ...) or --workload to profile one live")
    findings = diagnose_results(results)
    if deep:
        from latencylab.diagnose.sandwich import run_sandwich

        if live is not None:
            findings += run_sandwich(live[0], live[1], live[2], source=f"live run ({workload})")
        else:
            name = _deep_target(results)
            findings += run_sandwich(_build(name, LIVE_WARMUP), source=f"live run ({name}, --deep)")
    if roofline:
        findings += _roofline(workload, results)
    findings.sort(key=lambda f: -SEVERITIES.index(f.severity))
    return findings, [r.source for r in results]


def _value(v: float | str, unit: str) -> str:
    text = f"{v:g}" if isinstance(v, float) else str(v)
    return f"{text} {unit}".rstrip() if unit not in ("%", "x") else f"{text}{unit}"


def render_findings(findings: Sequence[Finding], console: Any) -> None:
    """Severity, title, evidence (with time ranges), recommendation and source of every finding."""
    from rich.markup import escape

    if not findings:
        console.print("[green]no findings[/green]: no rule fired on these results")
        return
    counts = {s: sum(1 for f in findings if f.severity == s) for s in reversed(SEVERITIES)}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items() if n) + " finding(s)")
    for f in findings:
        style = _STYLE[f.severity]
        console.print(
            f"\n[{style}]{f.severity.upper():8}[/{style}] [bold]{escape(f.title)}[/bold]  [dim]({f.rule})[/dim]"
        )
        for e in f.evidence:
            when = ""
            if e.t_start_s is not None:
                when = f"  [dim]@ {e.t_start_s:.3f}-{(e.t_end_s if e.t_end_s is not None else e.t_start_s):.3f} s[/dim]"
            console.print(f"    {escape(e.label)}: {escape(_value(e.value, e.unit))}{when}")
        console.print(f"  [bold]->[/bold] {escape(f.recommendation)}")
        if f.source:
            console.print(f"  [dim]source: {escape(f.source)}[/dim]")


def run_diagnose_command(args: argparse.Namespace, console: Any) -> int:
    findings, sources = diagnose(
        args.results,
        workload=args.workload,
        deep=args.deep,
        roofline=args.roofline,
        quiet=args.quiet,
        console=console,
    )
    render_findings(findings, console)
    if args.json:
        p = Path(args.json)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(findings_doc(findings, sources), indent=1))
        console.print(f"wrote {p}")
    return 0
