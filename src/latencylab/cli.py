"""Command line: parse, build a config, call one library function, render.

One ``cmd_<name>(args) -> int`` per subcommand. Every user error is one line
on stderr and a non-zero exit (2); no tracebacks unless LATENCYLAB_DEBUG=1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from latencylab import __version__
from latencylab.errors import LatencyLabError

EXIT_USAGE = 2
EXIT_INTERNAL = 70


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (the usage text stays in --help)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _params(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise LatencyLabError(f"--param {p!r} must look like key=value")
        out[key.strip()] = value
    return out


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} must be >= 1")
    return v


def _non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return v


def _fraction(text: str) -> float:
    v = _positive_float(text)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"{text} must be a fraction in (0, 1), e.g. 0.99")
    return v


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="latencylab", description="Find where inference time goes.")
    parser.add_argument("--version", action="version", version=f"latencylab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("profile", help="time every stage of an inference pipeline")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", default=None, help="built-in workload: text, vision, synthetic (default text)")
    src.add_argument("--model", help="an ONNX model file to run with ONNX Runtime")
    src.add_argument("--pipeline", help="package.module:factory returning a latencylab Pipeline")
    p.add_argument("--inputs", help="an .npz of inputs for --model (default: generated from declared shapes)")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--iterations", type=_positive_int, help="exactly N timed iterations")
    stop.add_argument("--min-time", type=_positive_float, help="time for at least S seconds (default 5)")
    stop.add_argument("--adaptive", action="store_true", help="until the p99 CI is narrow enough or --max-time")
    p.add_argument("--max-time", type=_positive_float, default=120.0, help="time cap for --adaptive (s)")
    p.add_argument("--target-q", type=_fraction, default=0.99, help="quantile --adaptive watches (default 0.99)")
    p.add_argument("--target-ci", type=_fraction, default=0.05, help="CI half-width to reach, relative (0.05)")
    p.add_argument("--warmup", type=_non_negative_int, default=10, help="untimed iterations first (default 10)")
    p.add_argument(
        "--runs", type=_positive_int, default=1,
        help="separate runs (own warm-up and stopping rule each), canary between; compare's unit (default 1)",
    )  # fmt: skip
    p.add_argument("--threads", type=_positive_int, help="intra-op threads (torch / ONNX Runtime)")
    p.add_argument("--batch-size", type=_positive_int, default=1)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="workload parameter")
    p.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--latency-budget", metavar="TOML", help="budget file: end-to-end deadline and stage allowances")

    ld = sub.add_parser("load", help="open-loop load test of an Open Inference Protocol endpoint")
    ld.add_argument("--url", required=True, help="http://127.0.0.1:PORT of the OIP v2 server")
    ld.add_argument("--model", required=True, help="model name on the server")
    ld.add_argument("--model-version", help="model version (optional)")
    arr = ld.add_mutually_exclusive_group()
    arr.add_argument("--rate", type=_positive_float, help="Poisson arrivals at this mean rate (req/s)")
    arr.add_argument("--arrivals", help="poisson:R, constant:R, step:10s@50,10s@100, ramp:0-300@60s, trace:FILE")
    arr.add_argument("--concurrency", type=_positive_int, help="CLOSED loop with N users (hides stalls)")
    ld.add_argument("--duration", type=_positive_float, default=None, help="seconds of sending (default 10)")
    ld.add_argument("--max-requests", type=_positive_int, help="stop after N requests")
    ld.add_argument("--min-requests", type=_positive_int, default=0, help="send at least N (extends the duration)")
    ld.add_argument("--early-stop", action="store_true", help="stop once the --slo verdict is decided")
    ld.add_argument("--timeout", type=_positive_float, default=30.0, help="per-request timeout (s)")
    ld.add_argument("--connections", type=_positive_int, default=8, help="connections opened before the run")
    ld.add_argument(
        "--payload", default="auto", help="auto (from model metadata), text (corpus), vision (JPEGs), or FILE.jsonl"
    )
    ld.add_argument("--input-name", default=None, help="input tensor name for --payload text")
    ld.add_argument("--slo", help="latency objective, e.g. p99=100ms (verdict with --confidence)")
    ld.add_argument("--confidence", type=_fraction, default=0.99)
    ld.add_argument("--find-capacity", action="store_true", help="search the highest rate meeting --slo")
    ld.add_argument("--start-rate", type=_positive_float, default=10.0)
    ld.add_argument("--max-rate", type=_positive_float, default=100_000.0)
    ld.add_argument(
        "--step-duration", type=_positive_float, default=8.0,
        help="seconds per capacity chunk: a step runs 3 to --max-chunks of them until its verdict is decided",
    )  # fmt: skip
    ld.add_argument("--max-chunks", type=_positive_int, default=8, help="capacity: chunks per step at most")
    ld.add_argument("--warmup", type=float, default=2.0, help="capacity: seconds left out at each chunk's start")
    ld.add_argument("--repeat", type=_positive_int, default=1, help="capacity: K searches; median and min-max")
    ld.add_argument("--precision", type=_fraction, default=0.05, help="capacity bracket width (relative)")
    ld.add_argument("--token", help="bearer token sent as Authorization header")
    ld.add_argument(
        "--request-start-header",
        action="store_true",
        help="send X-Request-Start: t=<unix µs of the intended send time> (servers count deadlines from it)",
    )
    ld.add_argument(
        "--spin",
        choices=["auto", "on", "off"],
        default="auto",
        help="busy-wait the last 1.5 ms before each send: only while a core is free for it (auto), always, never",
    )
    ld.add_argument("--seed", type=int, default=0)
    ld.add_argument("--json", metavar="PATH", help="write the result as JSON")
    ld.add_argument("--requests-jsonl", metavar="PATH", help="write one JSON line per request")
    ld.add_argument("--plot", metavar="DIR", help="write PNG plots (latency over time, CDF, capacity curve)")
    ld.add_argument("--quiet", action="store_true", help="no live progress")

    sv = sub.add_parser("serve", help="Open Inference Protocol server with batching and an SLO ladder")
    sv.add_argument("--config", help="TOML model repository config (see docs/serve.md)")
    sv.add_argument("--model", choices=["text", "vision"], help="serve one built-in model with its default ladder")
    sv.add_argument(
        "--from",
        dest="from_dir",
        metavar="DIR",
        help="serve what `latencylab optimize --out DIR` found, with the ladder its search describes",
    )
    sv.add_argument("--host", help="bind address (default 127.0.0.1)")
    sv.add_argument("--port", type=int, help="port (default 8000; 0 = any free port)")
    sv.add_argument("--slo-ms", type=_positive_float, help="P99 objective of the guard (default 100)")
    sv.add_argument("--max-batch-size", type=_positive_int)
    sv.add_argument("--max-queue-delay-ms", type=_positive_float)
    sv.add_argument("--threads", type=_positive_int, help="torch intra-op threads")
    sv.add_argument("--compute-workers", type=_positive_int, help="batches computed at once per variant (default 1)")
    sv.add_argument("--token-env", help="require a bearer token: the name of the env var holding it")
    sv.add_argument(
        "--trust-request-start",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="count deadlines from the X-Request-Start header when a request has one (default on)",
    )
    sv.add_argument(
        "--timeline",
        metavar="PATH",
        help="write the SLO guard's ladder over time (JSON for `latencylab report`), every 30 s and on shutdown",
    )

    op = sub.add_parser("optimize", help="search optimisation variants; keep the fastest inside the accuracy budget")
    op.add_argument("--workload", default="text", choices=["text", "vision"])
    op.add_argument(
        "--model", help="optimize a user's ONNX file or Hugging Face model directory instead (ONNX Runtime candidates)"
    )
    op.add_argument(
        "--inputs",
        help="an .npz of inputs for --model, at least 13 samples: every fifth calibrates, the others are held out "
        "(default: guessed from the declared shapes and input names, printed)",
    )
    op.add_argument("--pipeline", metavar="MOD:FN", help="a factory returning a ModelAdapter (optimize/types.py)")
    op.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE",
        help="--model: e.g. dim.seq=64; text: padding=longest|max_length (the inputs your pipeline runs)",
    )  # fmt: skip
    op.add_argument("--budget", help='fidelity budget, e.g. "cos>=0.99,min_cos>=0.98" or "accuracy_drop<=1%%"')
    op.add_argument("--threads", type=_positive_int, default=1, help="intra-op threads for every variant")
    op.add_argument("--time-budget", type=_positive_float, default=600.0, help="seconds; later candidates skip")
    op.add_argument("--families", default="torch,onnxruntime", help="candidate families to try")
    op.add_argument("--only", help="comma-separated candidate names (besides the baseline)")
    op.add_argument("--rounds", type=_positive_int, default=10, help="interleaved timing rounds")
    op.add_argument(
        "--seq-len", type=int, default=128,
        help="text: the length of padding=max_length and of the passages input set (0 = no passages); "
        "--model without --inputs: the guessed size of its symbolic (sequence) dimensions",
    )  # fmt: skip
    op.add_argument("--batch-size", type=_positive_int, default=1)
    op.add_argument("--out", help="directory for the chosen artifact and recipe.json")
    op.add_argument("--recipe", help="re-apply a recipe.json and measure it again")
    op.add_argument(
        "--force", action="store_true", help="--recipe: rebuild even when the model or inputs differ from the recorded"
    )
    op.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    op.add_argument("--quiet", action="store_true")

    dg = sub.add_parser("diagnose", help="findings with evidence from result files (profile, load, optimize, serve)")
    dg.add_argument("results", nargs="*", metavar="RESULT.json", help="result files to examine")
    dg.add_argument(
        "--workload", choices=["text", "vision", "synthetic", "compiled"], help="profile this workload first"
    )
    dg.add_argument("--pipeline", metavar="MOD:FACTORY", help="profile your pipeline first (a factory returning one)")
    dg.add_argument("--deep", action="store_true", help="sandwich: slowest stage -> system metrics -> operators")
    dg.add_argument("--roofline", action="store_true", help="place the forward pass on this machine's roofline")
    dg.add_argument("--json", metavar="PATH", help="write the findings as JSON")
    dg.add_argument("--quiet", action="store_true")

    rp = sub.add_parser("report", help="one self-contained HTML report with plots and findings")
    rp.add_argument("results", nargs="+", metavar="RESULT.json", help="profile / load / optimize / serve results")
    rp.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    rp.add_argument("--latency-budget", metavar="TOML", help="budget file: mark the stage that breaks it")
    rp.add_argument("--title", help="report title")

    cp = sub.add_parser("compare", help="A/B comparison with significance; --fail-if gates for CI")
    cp.add_argument("baseline", metavar="BASELINE.json", nargs="?")
    cp.add_argument("candidate", metavar="CANDIDATE.json", nargs="?")
    cp.add_argument(
        "--run", nargs=2, metavar=("A", "B"),
        help='measure two specs interleaved, e.g. "--workload synthetic --param ..." (the recommended CI gate)',
    )  # fmt: skip
    cp.add_argument("--rounds", type=_positive_int, default=20, help="--run: interleaved rounds (default 20)")
    cp.add_argument("--iterations", type=_positive_int, default=100, help="--run: timed iterations per run (100)")
    cp.add_argument("--warmup", type=_non_negative_int, default=10, help="--run: warm-up iterations per run (10)")
    cp.add_argument("--seed", type=int, default=0, help="--run: seed of the A/B order per round")
    cp.add_argument("--keep", metavar="DIR", help="--run: also write DIR/A.json and DIR/B.json")
    cp.add_argument("--strict", action="store_true", help="an undecided gate fails when its evidence says so")
    cp.add_argument("--fail-if", action="append", default=[], metavar="GATE", help='e.g. "p99>+5%%" (repeatable)')
    cp.add_argument("--alpha", type=_fraction, default=0.05, help="significance level (default 0.05)")
    cp.add_argument("--json", metavar="PATH", help="write the comparison as JSON")

    e = sub.add_parser("env", help="environment fingerprint, lint and diff")
    e.add_argument("--json", nargs="?", const="-", metavar="PATH", help="write the fingerprint as JSON (- = stdout)")
    e.add_argument("--diff", nargs=2, metavar=("A", "B"), help="differences that change latency (env or result files)")
    return parser


def _stdout_console() -> Any:
    """Rich console for results: a pipe or file gets a fixed wide layout, not 80 columns."""
    from rich.console import Console

    con = Console()
    return con if con.is_terminal else Console(width=200, no_color=True)


def cmd_profile(args: argparse.Namespace) -> int:
    from rich.console import Console

    from latencylab.analysis import analyze
    from latencylab.env import fingerprint, lint
    from latencylab.profiler import ProfileConfig, apply_threads, profile
    from latencylab.report.terminal import render_profile
    from latencylab.workloads import WorkloadOptions, build_workload, load_pipeline_factory

    params = _params(args.param)
    if args.device != "cpu" and not args.device.startswith("cuda"):
        raise LatencyLabError(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if args.device.startswith("cuda"):
        from latencylab.clock import cuda_available

        if not cuda_available():
            raise LatencyLabError(f"--device {args.device}: no CUDA device is available on this machine")
    if args.inputs and not args.model:
        raise LatencyLabError("--inputs only applies with --model")
    cfg = ProfileConfig(
        warmup=args.warmup,
        iterations=args.iterations,
        min_time_s=args.min_time,
        adaptive=args.adaptive,
        max_time_s=args.max_time,
        target_q=args.target_q,
        target_rel_ci=args.target_ci,
        threads=args.threads,
        runs=args.runs,
    )
    if args.model and args.threads and "threads" not in params:
        params["threads"] = str(args.threads)
    if (args.workload or "text") == "synthetic":
        params.setdefault("offset", str(args.warmup))  # injected spikes land at timed iteration numbers
    opts = WorkloadOptions(
        batch_size=args.batch_size,
        seed=args.seed,
        device=args.device,
        model_path=args.model,
        inputs_path=args.inputs,
        params=params,
    )
    apply_threads(args.threads)
    err = Console(stderr=True)
    if args.pipeline:
        pipe = load_pipeline_factory(args.pipeline, opts)
    elif args.model:
        pipe = build_workload("onnx", opts)
    else:
        pipe = build_workload(args.workload or "text", opts)
    apply_threads(args.threads)  # again: building may have imported torch
    env = fingerprint()
    if args.quiet or not err.is_terminal:
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
    out = _stdout_console()
    render_profile(result, analysis, out)
    for w in lint(dict(result.env)):  # busy: judged by what the run measured (env.run)
        out.print(f"[yellow]env:[/yellow] {w.message} ({w.hint})")
    budget_broken = False
    if args.latency_budget:
        from latencylab.budget import evaluate_budget, load_budget, render_budget_verdict

        verdict = evaluate_budget(load_budget(args.latency_budget), result)
        render_budget_verdict(verdict, out)
        budget_broken = not verdict.ok
    if args.json:
        path = result.save(args.json)
        out.print(f"wrote {path}")
    return 1 if budget_broken else 0


def cmd_env(args: argparse.Namespace) -> int:

    from latencylab import env as envmod

    out = _stdout_console()
    if args.diff:
        a = envmod.load_fingerprint(args.diff[0])
        b = envmod.load_fingerprint(args.diff[1])
        diffs = envmod.diff(a, b)
        envmod.render_diff(diffs, out)
        return 0
    fp = envmod.fingerprint()
    if args.json:
        text = json.dumps(fp, indent=1, default=str)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
            out.print(f"wrote {args.json}")
        return 0
    envmod.render_fingerprint(fp, out)
    envmod.render_warnings(envmod.lint(fp), out)
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    from latencylab.load.frontend import run_load_command

    return run_load_command(args, _stdout_console())


def cmd_serve(args: argparse.Namespace) -> int:
    from latencylab.serve.frontend import run_serve_command

    return run_serve_command(args)


def cmd_optimize(args: argparse.Namespace) -> int:
    from latencylab.optimize.frontend import run_optimize_command

    return run_optimize_command(args, _stdout_console())


def cmd_diagnose(args: argparse.Namespace) -> int:
    from latencylab.diagnose.frontend import run_diagnose_command

    return run_diagnose_command(args, _stdout_console())


def cmd_report(args: argparse.Namespace) -> int:
    from latencylab.report.frontend import run_report_command

    return run_report_command(args, _stdout_console())


def cmd_compare(args: argparse.Namespace) -> int:
    from latencylab.compare.frontend import run_compare_command

    return run_compare_command(args, _stdout_console())


COMMANDS: dict[str, Any] = {
    "profile": cmd_profile,
    "env": cmd_env,
    "load": cmd_load,
    "serve": cmd_serve,
    "optimize": cmd_optimize,
    "diagnose": cmd_diagnose,
    "report": cmd_report,
    "compare": cmd_compare,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(COMMANDS[args.command](args))
    except LatencyLabError as exc:
        sys.stderr.write(f"latencylab {args.command}: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("latencylab: interrupted\n")
        return 130
    except Exception as exc:
        if os.environ.get("LATENCYLAB_DEBUG"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        sys.stderr.write(
            f"latencylab {args.command}: internal error: {type(exc).__name__}: {first} "
            "(set LATENCYLAB_DEBUG=1 for a traceback)\n"
        )
        return EXIT_INTERNAL
