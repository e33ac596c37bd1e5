"""``latencylab profile``: its parser, the typed options built from it at the edge, and the run.

:func:`add_arguments` declares the options; :meth:`ProfileOptions.from_args` turns the parsed namespace into
:class:`ProfileOptions` (checking what argparse cannot: the device, ``--inputs`` without ``--model``);
:func:`run_profile` builds the pipeline, profiles it, renders the table and writes the result.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from latencylab import cliargs
from latencylab.errors import LatencyLabError

if TYPE_CHECKING:
    from rich.console import Console

    from latencylab.profiler import ProfileConfig
    from latencylab.workloads import WorkloadOptions

__all__ = ["ProfileOptions", "add_arguments", "run_profile", "run_profile_command"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", default=None, help="built-in workload: text, vision, synthetic, gen (default text)")
    src.add_argument("--model", help="an ONNX model file to run with ONNX Runtime")
    src.add_argument("--pipeline", help="package.module:factory returning a latencylab Pipeline")
    p.add_argument("--inputs", help="an .npz of inputs for --model (default: generated from declared shapes)")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--iterations", type=cliargs.positive_int, help="exactly N timed iterations")
    stop.add_argument("--min-time", type=cliargs.positive_float, help="time for at least S seconds (default 5)")
    stop.add_argument("--adaptive", action="store_true", help="until the p99 CI is narrow enough or --max-time")
    p.add_argument("--max-time", type=cliargs.positive_float, default=120.0, help="time cap for --adaptive (s)")
    p.add_argument("--target-q", type=cliargs.fraction, default=0.99, help="quantile --adaptive watches (default 0.99)")
    p.add_argument("--target-ci", type=cliargs.fraction, default=0.05, help="CI half-width to reach, relative (0.05)")
    p.add_argument("--warmup", type=cliargs.non_negative_int, default=10, help="untimed iterations first (default 10)")
    p.add_argument(
        "--runs", type=cliargs.positive_int, default=1,
        help="separate runs (own warm-up and stopping rule each), canary between; compare's unit (default 1)",
    )  # fmt: skip
    p.add_argument("--threads", type=cliargs.positive_int, help="intra-op threads (torch / ONNX Runtime)")
    p.add_argument("--batch-size", type=cliargs.positive_int, default=1)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="workload parameter")
    p.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--latency-budget", metavar="TOML", help="budget file: end-to-end deadline and stage allowances")


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """Everything ``latencylab profile`` was asked for (``--workload``/``--model``/``--pipeline`` pick the source)."""

    workload: str | None = None
    model: str | None = None
    pipeline: str | None = None
    inputs: str | None = None
    iterations: int | None = None
    min_time: float | None = None
    adaptive: bool = False
    max_time: float = 120.0
    target_q: float = 0.99
    target_ci: float = 0.05
    warmup: int = 10
    runs: int = 1
    threads: int | None = None
    batch_size: int = 1
    device: str = "cpu"
    seed: int = 0
    params: Mapping[str, str] = field(default_factory=dict)
    json: str | None = None
    quiet: bool = False
    latency_budget: str | None = None

    def __post_init__(self) -> None:
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise LatencyLabError(f"--device must be cpu or cuda[:N], got {self.device!r}")
        if self.inputs and not self.model:
            raise LatencyLabError("--inputs only applies with --model")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ProfileOptions:
        return cls(
            workload=args.workload, model=args.model, pipeline=args.pipeline, inputs=args.inputs,
            iterations=args.iterations, min_time=args.min_time, adaptive=args.adaptive, max_time=args.max_time,
            target_q=args.target_q, target_ci=args.target_ci, warmup=args.warmup, runs=args.runs,
            threads=args.threads, batch_size=args.batch_size, device=args.device, seed=args.seed,
            params=cliargs.params(args.param), json=args.json, quiet=args.quiet, latency_budget=args.latency_budget,
        )  # fmt: skip

    def config(self) -> ProfileConfig:
        from latencylab.profiler import ProfileConfig

        return ProfileConfig(
            warmup=self.warmup,
            iterations=self.iterations,
            min_time_s=self.min_time,
            adaptive=self.adaptive,
            max_time_s=self.max_time,
            target_q=self.target_q,
            target_rel_ci=self.target_ci,
            threads=self.threads,
            runs=self.runs,
        )

    def workload_options(self) -> WorkloadOptions:
        from latencylab.workloads import source_options

        return source_options(
            workload=self.workload, model=self.model, inputs=self.inputs, params=self.params, threads=self.threads,
            batch_size=self.batch_size, device=self.device, seed=self.seed, warmup=self.warmup,
        )  # fmt: skip


def run_profile_command(args: argparse.Namespace, out: Console) -> int:
    return run_profile(ProfileOptions.from_args(args), out)


def run_profile(opts: ProfileOptions, out: Console) -> int:
    """Profile, render to ``out``, check the budget, write the JSON; 1 when the budget is broken, else 0."""
    from rich.console import Console

    from latencylab.analysis import analyze, save_profile
    from latencylab.device import check_device
    from latencylab.env import fingerprint, lint
    from latencylab.profiler import apply_threads, profile
    from latencylab.report.terminal import render_profile
    from latencylab.workloads import build_source

    check_device(opts.device)
    cfg = opts.config()
    wopts = opts.workload_options()
    apply_threads(opts.threads)
    err = Console(stderr=True)
    pipe = build_source(opts.workload, opts.model, opts.pipeline, wopts)
    apply_threads(opts.threads)  # again: building may have imported torch
    env = fingerprint()
    if opts.quiet or not err.is_terminal:
        result = profile(pipe, cfg, env=env)
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        total = (cfg.iterations or (cfg.max_time_s if cfg.adaptive else cfg.effective_min_time())) * cfg.runs
        with Progress(
            TextColumn("[bold]profiling[/bold] {task.description}"),
            BarColumn(),
            TextColumn("{task.fields[n]} it  last {task.fields[last]:.2f} ms"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task(pipe.name, total=total, n=0, last=0.0)

            def on_progress(n: int, elapsed: float, last_ns: int) -> None:
                done = n if cfg.iterations else elapsed
                bar.update(task, completed=done, n=n, last=last_ns / 1e6)

            result = profile(pipe, cfg, env=env, progress=on_progress)
    analysis = analyze(result)
    render_profile(result, analysis, out)
    gen = None
    if (result.pipeline.get("metadata") or {}).get("generative"):  # --workload gen, or a pipeline built like it
        from latencylab.gen.profile import profile_figures, render_gen

        gen = profile_figures(result, opts.params)  # TTFT/TPOT/ITL, where the time goes, the roofline
        if gen is not None:
            render_gen(gen, out)
    for w in lint(dict(result.env)):  # busy: judged by what the run measured (env.run)
        out.print(f"[yellow]env:[/yellow] {w.message} ({w.hint})")
    budget_broken = False
    if opts.latency_budget:
        from latencylab.budget import evaluate_budget, load_budget, render_budget_verdict

        verdict = evaluate_budget(load_budget(opts.latency_budget), result)
        render_budget_verdict(verdict, out)
        budget_broken = not verdict.ok
    if opts.json:
        if gen is not None:
            path = result.save(opts.json, summary={**analysis.summary_dict(), "tokens": gen.to_dict()})
        else:
            path = save_profile(result, opts.json, analysis)
        out.print(f"wrote {path}")
    return 1 if budget_broken else 0
