"""``latencylab diagnose``: load results (or profile a workload live), run the rules, render the findings.

With ``--workload`` the workload is profiled first for ``LIVE_MIN_TIME_S`` seconds (after
``LIVE_WARMUP`` warm-up iterations) on ``LIVE_THREADS`` intra-op thread, as ``latencylab profile`` would;
with ``--pipeline MOD:FACTORY`` the user's pipeline is, with the threads it sets itself. The live result is
diagnosed with the files; on a live pipeline an oversubscription finding gets its measured cost
(``threadcost``). ``--deep`` adds the sandwich (stage -> system -> operators) on the live pipeline, or on the
pipeline a profile file names (the factory it recorded, or a built-in workload whose stages match), and
names the user's Python function in the data-path advice when the operator layer shows one.
``--roofline`` asks ``latencylab.roofline`` (optional module), for the built-in text and vision workloads.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from latencylab.diagnose.engine import diagnose_results, findings_doc, load_result, loaded
from latencylab.errors import LatencyLabError
from latencylab.findings import SEVERITIES, Evidence, Finding
from latencylab.results import LoadedResult

LIVE_WARMUP = 5
LIVE_MIN_TIME_S = 3.0
LIVE_THREADS = 1  # built-in workloads: one intra-op thread, so shares stay representative on shared cores
_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


@dataclass(slots=True)
class _Live:
    pipe: Any
    result: Any
    metrics: Any
    source: str


def _build(workload: str, warmup: int) -> Any:
    from latencylab.workloads import WorkloadOptions, build_workload

    params = {"offset": str(warmup)} if workload in ("synthetic", "compiled") else {}
    return build_workload(workload, WorkloadOptions(params=params))


def _factory(spec: str, options: Mapping[str, Any] | None = None) -> Any:
    from latencylab.workloads import WorkloadOptions, load_pipeline_factory

    opts = WorkloadOptions(**dict(options)) if options else None
    return load_pipeline_factory(spec, opts)


def _live_profile(pipe: Any, label: str, threads: int | None, deep: bool, quiet: bool, console: Any) -> _Live:
    """Profile ``pipe`` (under the system sampler with --deep) as ``latencylab profile`` would."""
    from latencylab.env import fingerprint
    from latencylab.profiler import ProfileConfig, profile

    cfg = ProfileConfig(warmup=LIVE_WARMUP, min_time_s=LIVE_MIN_TIME_S, threads=threads)
    env = fingerprint()
    if not quiet:
        console.print(f"profiling {label} for {LIVE_MIN_TIME_S:g} s ...")
    source = f"live run ({label})"
    if deep:
        from latencylab.diagnose.sysmetrics import Sampler

        with Sampler() as sampler:
            result = profile(pipe, cfg, env=env)
        return _Live(pipe, result, sampler.metrics, source)
    return _Live(pipe, profile(pipe, cfg, env=env), None, source)


def _user_pipeline(doc: Mapping[str, Any]) -> str | None:
    """The factory a profile result of a user pipeline recorded (``--pipeline``), else None."""
    factory = ((doc.get("pipeline") or {}).get("metadata") or {}).get("factory")
    return str(factory) if isinstance(factory, str) and ":" in factory else None


def _deep_target(results: Sequence[LoadedResult]) -> tuple[Any, str, str]:
    """(pipeline, label, the result's source) for the sandwich: the factory a result recorded, else its built-in.

    A built-in name is trusted only when the built-in's stages are the result's: a user pipeline that
    happens to be called "vision" is never silently replaced by the built-in vision workload.
    """
    from latencylab.workloads import BUILTIN

    for r in results:
        if r.kind != "profile":
            continue
        spec = _user_pipeline(r.doc)
        if spec is not None:
            opts = ((r.doc.get("pipeline") or {}).get("metadata") or {}).get("factory_options")
            return _factory(spec, opts), spec, r.source
        name = str(r.doc.get("workload"))
        stages = [str(s.get("name")) for s in r.doc.get("stages", [])]
        if name in BUILTIN and name != "onnx":
            pipe = _build(name, LIVE_WARMUP)
            if list(pipe.stage_names) != stages:
                raise LatencyLabError(
                    f"{r.source}: pipeline {name!r} has stages {', '.join(stages)}, not those of the built-in "
                    f"{name} workload ({', '.join(pipe.stage_names)}): re-run it with "
                    "`latencylab diagnose --deep --pipeline MOD:FACTORY`"
                )
            return pipe, name, r.source
    raise LatencyLabError(
        "--deep needs --workload, --pipeline MOD:FACTORY, or a profile result of a built-in workload or of a "
        "pipeline loaded with --pipeline (its factory is recorded in the result)"
    )


ROOFLINE_WORKLOADS = ("text", "vision")


def _roofline_workload(workload: str | None, results: Sequence[LoadedResult], pipeline: str | None) -> str:
    """The built-in workload ``--roofline`` places, or one LatencyLabError line saying why there is none."""
    try:
        import latencylab.roofline.api  # noqa: F401
    except ImportError:
        raise LatencyLabError("roofline not available") from None
    what = None
    if pipeline is not None:
        what = f"{pipeline} is a user pipeline"
    elif workload is None:
        for r in results:
            if r.kind != "profile":
                continue
            name, spec = str(r.doc.get("workload")), _user_pipeline(r.doc)
            if spec is not None or name not in ROOFLINE_WORKLOADS:
                what = f"{r.source} is a profile of pipeline {name!r}" + (f" ({spec})" if spec else "")
            workload = name
            break
    if what is not None:
        raise LatencyLabError(
            f"--roofline places the built-in {' and '.join(ROOFLINE_WORKLOADS)} workloads on this machine's roofline "
            f"(it counts their model's work); {what}, so there is nothing to place"
        )
    if workload is None:
        raise LatencyLabError("--roofline needs --workload or a profile result naming its workload")
    return workload


def _roofline(workload: str | None, results: Sequence[LoadedResult]) -> list[Finding]:
    from latencylab.roofline.api import roofline_findings

    name = _roofline_workload(workload, results, None)
    threads = None
    for r in results:
        if r.kind == "profile":
            threads = (r.doc.get("config") or {}).get("threads")
            break
    return list(roofline_findings(name, threads))


def _with_thread_cost(findings: list[Finding], live: _Live) -> list[Finding]:
    """Oversubscription findings about a live pipeline, with its cost measured (``threadcost``)."""
    from latencylab.diagnose.threadcost import measure_thread_cost

    out = []
    for f in findings:
        if f.rule != "thread-oversubscription" or live.source not in f.source or f.details.get("processes", 1) != 1:
            out.append(f)
            continue
        cost = measure_thread_cost(live.pipe, int(f.details["cpus"]))
        ev = [e for e in f.evidence if e.label != "cost"]
        title = f.title
        if cost["measured"]:
            slower = cost["p50_ms"] / cost["p50_fixed_ms"] - 1 if cost["p50_fixed_ms"] > 0 else 0.0
            ev += [
                Evidence(f"end-to-end p50 with {cost['threads']} threads (as run)", round(cost["p50_ms"], 3), "ms"),
                Evidence(f"end-to-end p50 with {cost['cpus']} thread(s)", round(cost["p50_fixed_ms"], 3), "ms"),
                Evidence(f"end-to-end p99 with {cost['threads']} threads (as run)", round(cost["p99_ms"], 3), "ms"),
                Evidence(f"end-to-end p99 with {cost['cpus']} thread(s)", round(cost["p99_fixed_ms"], 3), "ms"),
            ]
            title += (
                f"; measured: p50 {cost['p50_ms']:.2f} ms as run vs {cost['p50_fixed_ms']:.2f} ms with "
                f"{cost['cpus']} thread(s) ({slower:+.0%}), p99 {cost['p99_ms']:.2f} vs {cost['p99_fixed_ms']:.2f} ms"
            )
        else:
            ev.append(Evidence("cost", f"not measurable: {cost['why']}"))
        out.append(replace(f, title=title, evidence=tuple(ev), details={**f.details, "cost": cost}))
    return out


def _with_user_function(findings: list[Finding], pipe: Any, deep: list[Finding]) -> list[Finding]:
    """The data-path finding's advice names the user's Python function the operator layer found in its stage."""
    from latencylab.diagnose.sandwich import Operator, python_functions, stage_inputs, user_function

    out = []
    for f in findings:
        stages = [k for k in (f.details.get("shares") or {}) if k in pipe.stage_names]
        if f.rule != "preprocess-dominates" or not stages:
            out.append(f)
            continue
        kinds = {s.name: s.kind for s in pipe.stages}
        data = [k for k in stages if kinds[k] in ("load", "preprocess")]
        if not data:
            out.append(f)
            continue
        stage = max(data, key=lambda k: f.details["shares"][k])
        ops_f = next((d for d in deep if d.rule == "sandwich-operators" and d.details.get("stage") == stage), None)
        if ops_f is not None and str(ops_f.details.get("method", "")).startswith("cProfile"):
            ops = [Operator(**o) for o in ops_f.details["operators"]]
        else:
            fn, inputs = stage_inputs(pipe, stage)
            ops = python_functions(fn, inputs)
        top = user_function(ops)
        if top is None or top.share < 0.1:
            out.append(f)
            continue
        where = f"{top.name}"
        advice = (
            f"{stage}: {top.share:.0%} of its time is in your Python function {where}, interpreted code: vectorise "
            "it (numpy, Pillow, OpenCV, torch ops) or move it to a worker process overlapped with the forward pass"
        )
        out.append(
            replace(
                f,
                title=f"{f.title}; {top.share:.0%} of {stage} is your Python function {where.split(' (')[0]}",
                evidence=(*f.evidence, Evidence(f"python function in {stage} (own time)", where, "")),
                recommendation=f"{advice}; {f.recommendation}",
                details={**f.details, "user_function": top.to_dict(), "user_function_stage": stage},
            )
        )
    return out


def diagnose(
    paths: Sequence[str | Path] = (),
    workload: str | None = None,
    deep: bool = False,
    roofline: bool = False,
    quiet: bool = True,
    console: Any = None,
    pipeline: str | None = None,
) -> tuple[list[Finding], list[str]]:
    """The whole command as a library call: (findings most severe first, the sources read).

    ``workload``: a built-in workload to profile live; ``pipeline``: ``package.module:factory`` of a user
    pipeline to profile live (with the thread count it sets itself). ``deep`` adds the sandwich on the live
    pipeline, else on the pipeline a profile result names (its recorded factory, or the built-in workload).
    """
    if workload is not None and pipeline is not None:
        raise LatencyLabError("give --workload or --pipeline, not both")
    if roofline and pipeline is not None:
        _roofline_workload(workload, [], pipeline)  # fail fast on a user pipeline, before any profiling
    results = [load_result(p) for p in paths]
    live: _Live | None = None
    quiet = quiet or console is None
    if workload is not None:
        live = _live_profile(_build(workload, LIVE_WARMUP), workload, LIVE_THREADS, deep, quiet, console)
    elif pipeline is not None:
        live = _live_profile(_factory(pipeline), pipeline, None, deep, quiet, console)
    if live is not None:
        results.append(loaded(live.result.to_dict(), live.source))
    if not results:
        raise LatencyLabError("give result files (RESULT.json ...), --workload or --pipeline MOD:FACTORY")
    if roofline and workload is None:
        _roofline_workload(None, results, None)  # a user pipeline's result: one clear line before any work
    findings = diagnose_results(results)
    deep_findings: list[Finding] = []
    target = live.pipe if live is not None else None
    if deep:
        from latencylab.diagnose.sandwich import run_sandwich

        if live is not None:
            deep_findings = run_sandwich(live.pipe, live.result, live.metrics, source=live.source)
        else:
            target, label, src = _deep_target(results)
            deep_findings = run_sandwich(target, source=f"live run ({label}, --deep)")
            live = _Live(target, None, None, src)  # the sandwich ran it: its own thread settings are in force
        findings = _with_user_function(findings, target, deep_findings)
    if live is not None and live.source:
        findings = _with_thread_cost(findings, live)
    findings += deep_findings
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
        pipeline=getattr(args, "pipeline", None),
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
