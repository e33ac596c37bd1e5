"""``latencylab optimize``: parse, run the lab with a progress bar, render the table, write files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from latencylab.errors import LatencyLabError


def render(doc: dict[str, Any], console: Console) -> None:
    s = doc["summary"]
    t = Table(title=f"latencylab optimize: {doc['model'].get('model')} (budget {s['budget']})", title_justify="left")
    sets = list(s.get("input_sets") or [])
    extra = [f"{n} p50 ms (x)" for n in sets[1:]]
    cols = ("candidate", "backend", "status", "p50 ms [95% CI]", "p99 ms", "speed-up", *extra, "fidelity", "why")
    for col in cols:
        t.add_column(col, justify="right" if col in ("p99 ms", "speed-up", *extra) else "left")
    for c in doc["candidates"]:
        f = c.get("fidelity") or {}
        if f.get("accuracy") is not None:
            fid = f"acc {f['accuracy']:.4f} top1 {f['top1']:.3f}"
        elif f:
            fid = f"cos {f['cos_mean']:.5f} min {f['cos_min']:.4f}"
        else:
            fid = "-"
        p50 = (
            "-" if c.get("p50_ms") is None else f"{c['p50_ms']:.2f} [{c['p50_ci_ms'][0]:.2f}, {c['p50_ci_ms'][1]:.2f}]"
        )
        p99 = "-" if c.get("p99_ms") is None else f"{c['p99_ms']:.2f}"
        sp = "-" if c.get("speedup_p50") is None else f"{c['speedup_p50']:.2f}x"
        name = f"[bold]{c['name']}[/bold]" if s.get("chosen") and c["name"] == s["chosen"]["name"] else c["name"]
        more = []
        for n in sets[1:]:
            m = (c.get("sets") or {}).get(n) or {}
            x = f" ({m['speedup_p50']:.2f}x)" if m.get("speedup_p50") else ""
            more.append("-" if m.get("p50_ms") is None else f"{m['p50_ms']:.2f}{x}")
        t.add_row(name, c["backend"], c["status"], p50, p99, sp, *more, fid, c["reason"])
    console.print(t)
    from latencylab.optimize.lab_summary import input_lines

    for line in input_lines(doc.get("model") or {}, (doc.get("config") or {}).get("seq_len")):
        console.print(line, markup=False, highlight=False)
    if sets:
        console.print(f"input sets: {', '.join(sets)} (the first is the p50 column's; speed-up = baseline as declared"
                      " / candidate, a shape policy's gain included: the split is below)")  # fmt: skip
    console.print(f"Pareto front (p50 vs fidelity): {', '.join(s['pareto'])}")
    if s.get("baseline_inputs"):
        console.print(f"baseline: {s['baseline_inputs']}")
    console.print(f"[bold]{s['verdict']}[/bold]")
    if s.get("total_speedup") and s.get("pipeline_speedup"):
        console.print(f"total on the declared inputs: {s['total_speedup']:.2f}x = {s['speedup']:.2f}x (model, equal "
                      f"work) x {s['pipeline_speedup']:.2f}x (pipeline: {s.get('input_policy')})")  # fmt: skip
    elif s.get("speedup"):
        console.print(f"speed-up at equal work: {s['speedup']:.2f}x; pipeline speed-up: none (the choice runs the "
                      "inputs as declared)")  # fmt: skip
    if s.get("skipped_by_time_cap"):
        cut = s["skipped_by_time_cap"]
        console.print(f"[yellow]the time cap cut {len(cut)} candidate(s): {', '.join(cut)}[/yellow]")
    if doc.get("out_removed"):
        console.print(f"removed the previous run's {', '.join(doc['out_removed'])} from --out", markup=False)
    if doc.get("artifact"):
        console.print(f"artifact: {doc['artifact']}  recipe: {doc.get('recipe')}")
    if doc.get("artifact_error"):
        console.print(f"[red]{doc['artifact_error']}[/red]")


def run_optimize_command(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from latencylab.optimize.lab import LabConfig, apply_recipe, run_lab
    from latencylab.optimize.lab_export import check_writable

    # what can be refused is refused now, not after a search of many minutes
    if args.json:
        check_writable(args.json, "--json", is_dir=False)
    from latencylab.optimize.gen_lab import is_gen_recipe, run_gen_command

    ray, workers = getattr(args, "ray", None), getattr(args, "workers", None)
    if workers is not None and ray is None:
        raise LatencyLabError("--workers needs --ray [ADDRESS]")
    if ray is not None and (args.recipe or args.workload == "gen"):
        raise LatencyLabError("--ray distributes the text, vision and --model searches' builds; not --recipe or gen")

    if (args.recipe and is_gen_recipe(args.recipe)) or (not args.recipe and args.workload == "gen"):
        if args.recipe and args.out:
            raise LatencyLabError("--out does not apply with --recipe (it re-measures the recipe's variant)")
        return run_gen_command(args, console)  # the generative search: its own candidates, budget and table
    if args.rounds is None:
        args.rounds = 10
    if args.recipe and args.out:
        raise LatencyLabError("--out does not apply with --recipe (it re-measures the recipe's variant)")
    if args.force and not args.recipe:
        raise LatencyLabError("--force only applies with --recipe")
    err = Console(stderr=True)
    with Progress(
        TextColumn("[bold]optimize[/bold] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=args.quiet or not err.is_terminal,
    ) as bar:
        task = bar.add_task("starting", total=None)

        def progress(msg: str, step: int, total: int) -> None:
            bar.update(task, description=msg, completed=step, total=total)
            if not err.is_terminal and not args.quiet:
                err.print(f"optimize: [{step}/{total}] {msg}")

        def notice(line: str) -> None:
            if not args.quiet:
                bar.console.print(line, markup=False, highlight=False)

        if args.recipe:
            doc = apply_recipe(Path(args.recipe), progress, force=args.force)
        else:
            if args.model and args.pipeline:
                raise LatencyLabError("give either --model or --pipeline, not both")
            if args.inputs and not args.model:
                raise LatencyLabError("--inputs only applies with --model")
            workload = "onnx" if args.model else ("pipeline" if args.pipeline else args.workload)
            cfg = LabConfig(
                workload=workload,
                model_path=args.model,
                inputs_path=args.inputs,
                pipeline=args.pipeline,
                params=tuple(args.param),
                budget=args.budget,
                threads=args.threads,
                time_budget_s=args.time_budget,
                families=tuple(f.strip() for f in args.families.split(",") if f.strip()),
                rounds=args.rounds,
                seq_len=None if args.seq_len == 0 else args.seq_len,
                batch_size=args.batch_size,
                only=tuple(x.strip() for x in (args.only or "").split(",") if x.strip()),
                tune_time_s=max(0.0, float(getattr(args, "tune_time", 0.0) or 0.0)),
                tvm_fuse_depth=getattr(args, "tvm_fuse_depth", None),
                tvm_fast_math=bool(getattr(args, "tvm_fast_math", False)),
                ray=ray,
                workers=workers or 2,
            )
            if cfg.threads < 1:
                raise LatencyLabError("--threads must be >= 1")
            doc = run_lab(cfg, Path(args.out) if args.out else None, progress, notice=notice)
    render(doc, console)
    if args.recipe and doc.get("recipe"):
        rec = doc["recipe"]
        console.print(f"recipe recorded: {rec['recorded']}\nreproduced now:  {rec['reproduced']}")
        for msg in rec.get("forced") or []:
            console.print(f"[yellow]--force: {msg}[/yellow]")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        console.print(f"wrote {args.json}")
    return 0
