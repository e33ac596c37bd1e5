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
from latencylab.cliargs import (
    add_otlp_argument,
    add_ray_arguments,
    fraction,
    non_negative_int,
    positive_float,
    positive_int,
)
from latencylab.errors import LatencyLabError

EXIT_USAGE = 2
EXIT_INTERNAL = 70


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (the usage text stays in --help)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="latencylab", description="Find where inference time goes.")
    parser.add_argument("--version", action="version", version=f"latencylab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    from latencylab.profile_frontend import add_arguments as add_profile_arguments

    add_profile_arguments(sub.add_parser("profile", help="time every stage of an inference pipeline"))

    ld = sub.add_parser(
        "load", help="open-loop load test of an Open Inference Protocol endpoint (or a generative one: --api)"
    )
    ld.add_argument("--url", required=True, help="http://127.0.0.1:PORT of the OIP v2 server")
    ld.add_argument("--model", required=True, help="model name on the server")
    ld.add_argument("--model-version", help="model version (optional)")
    arr = ld.add_mutually_exclusive_group()
    arr.add_argument("--rate", type=positive_float, help="Poisson arrivals at this mean rate (req/s)")
    arr.add_argument("--arrivals", help="poisson:R, constant:R, step:10s@50,10s@100, ramp:0-300@60s, trace:FILE")
    arr.add_argument("--concurrency", type=positive_int, help="CLOSED loop with N users (hides stalls)")
    ld.add_argument("--duration", type=positive_float, default=None, help="seconds of sending (default 10)")
    ld.add_argument("--max-requests", type=positive_int, help="stop after N requests")
    ld.add_argument("--min-requests", type=positive_int, default=0, help="send at least N (extends the duration)")
    ld.add_argument("--early-stop", action="store_true", help="stop once the --slo verdict is decided")
    ld.add_argument("--timeout", type=positive_float, default=30.0, help="per-request timeout (s)")
    ld.add_argument("--connections", type=positive_int, default=8, help="connections opened before the run")
    ld.add_argument(
        "--payload", default="auto", help="auto (from model metadata), text (corpus), vision (JPEGs), or FILE.jsonl"
    )
    ld.add_argument("--input-name", default=None, help="input tensor name for --payload text")
    ld.add_argument(
        "--slo", action="append",
        help="latency objective, e.g. p99=100ms (verdict with --confidence); with --api, repeatable: "
        "ttft_p99=2s, tpot_p99=250ms, e2e_p90=10s (goodput: requests/s meeting every one)",
    )  # fmt: skip
    ld.add_argument("--confidence", type=fraction, default=0.99)
    ld.add_argument("--find-capacity", action="store_true", help="search the highest rate meeting --slo")
    ld.add_argument("--start-rate", type=positive_float, default=10.0)
    ld.add_argument("--max-rate", type=positive_float, default=100_000.0)
    ld.add_argument(
        "--step-duration", type=positive_float, default=8.0,
        help="seconds per capacity chunk: a step runs 3 to --max-chunks of them until its verdict is decided",
    )  # fmt: skip
    ld.add_argument("--max-chunks", type=positive_int, default=8, help="capacity: chunks per step at most")
    ld.add_argument("--warmup", type=float, default=2.0, help="capacity: seconds left out at each chunk's start")
    ld.add_argument(
        "--search-warmup", type=float, default=5.0, help="capacity: seconds of one discarded run before the first step"
    )
    ld.add_argument(
        "--max-late", type=fraction, default=0.01,
        help="capacity: keep a chunk whose only fault is late sends (> 1 ms) up to this share of them",
    )  # fmt: skip
    ld.add_argument("--repeat", type=positive_int, default=1, help="capacity: K searches; median and min-max")
    ld.add_argument("--precision", type=fraction, default=0.05, help="capacity bracket width (relative)")
    ld.add_argument(
        "--refine-rounds", type=int, default=0,
        help="capacity: after a 15%% bracket, N interleaved rounds over a grid of rates around it, judged on a "
        "monotone fit (for a host whose speed drifts within minutes; 0 = off)",
    )  # fmt: skip
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
    from latencylab.load.gen_cli import add_gen_arguments

    add_gen_arguments(ld)
    add_ray_arguments(ld)

    sv = sub.add_parser("serve", help="Open Inference Protocol server with batching and an SLO ladder")
    sv.add_argument("--config", help="TOML model repository config (see docs/serve.md)")
    sv.add_argument(
        "--model",
        choices=["text", "vision", "gen"],
        help="serve one built-in model with its default ladder (gen: SmolLM2, continuous batching, OpenAI API)",
    )
    sv.add_argument(
        "--from",
        dest="from_dir",
        metavar="DIR",
        help="serve what `latencylab optimize --out DIR` found, with the ladder its search describes "
        "(with --model gen: the variant `optimize --workload gen` chose)",
    )
    sv.add_argument("--host", help="bind address (default 127.0.0.1)")
    sv.add_argument("--port", type=int, help="port (default 8000; 0 = any free port)")
    sv.add_argument("--slo-ms", type=positive_float, help="P99 objective of the guard (default 100)")
    sv.add_argument("--max-batch-size", type=positive_int)
    sv.add_argument("--max-queue-delay-ms", type=positive_float)
    sv.add_argument("--threads", type=positive_int, help="torch intra-op threads")
    sv.add_argument("--compute-workers", type=positive_int, help="batches computed at once per variant (default 1)")
    sv.add_argument("--token-env", help="require a bearer token: the name of the env var holding it")
    sv.add_argument("--ladder", help="--model gen: the SLO guard's ladder, e.g. fp32,int8,capped,cache (default fp32)")
    sv.add_argument(
        "--prefill-dtype",
        choices=("fp32", "bf16", "auto"),
        help="--model gen: the prompt's forward in BF16 (decode stays FP32; ~3x faster prefill where the CPU has "
        "native BF16; changes the numbers: docs/genserve.md), auto = bf16 where native (default fp32)",
    )
    sv.add_argument(
        "--itl-cap-ms",
        type=positive_float,
        help="--model gen: plan every step with running streams to at most this long, so a prompt joining is "
        "prefilled in chunks that keep each inter-token gap near it (costs that prompt's TTFT; docs/genserve.md; "
        "default off: the TPOT-tied budget alone)",
    )
    sv.add_argument(
        "--itl-cap-yield",
        action="store_true",
        help="--model gen, with --itl-cap-ms: a step may pass the cap, within the TPOT plan, for a prompt that would "
        "otherwise miss the first token admission planned (docs/genserve.md; default off: the cap holds)",
    )
    sv.add_argument(
        "--spec-lookup",
        type=int,
        metavar="K",
        help="--model gen, with --gen-engine packed: speculative decoding of greedy requests, up to K tokens a step "
        "drafted by prompt lookup and verified in the step's forward, in steps of <= 4 decoding sequences (identical "
        "output; docs/genserve.md; default off)",
    )
    sv.add_argument(
        "--gen-engine",
        choices=("padded", "packed"),
        help="--model gen: how a step runs the model: padded = a prefill chunk and the decode batch each their own "
        "forward over one left-padded cache; packed = both in one forward (a K/V buffer per sequence), so a chunk "
        "rides on the decode step's weight read (docs/genserve.md; default padded)",
    )
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
    from latencylab.cliargs import add_serve_ray_arguments

    add_serve_ray_arguments(sv)
    add_otlp_argument(sv)

    op = sub.add_parser("optimize", help="search optimisation variants; keep the fastest inside the accuracy budget")
    op.add_argument("--workload", default="text", choices=["text", "vision", "gen"])
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
    op.add_argument("--threads", type=positive_int, default=1, help="intra-op threads for every variant")
    op.add_argument("--time-budget", type=positive_float, default=600.0, help="seconds; later candidates skip")
    op.add_argument("--families", default="torch,onnxruntime", help="candidate families to try")
    op.add_argument("--only", help="comma-separated candidate names (besides the baseline)")
    op.add_argument("--tune-time", type=float, default=0.0, help="seconds of TVM MetaSchedule tuning (0: off)")
    op.add_argument("--tvm-fuse-depth", type=positive_int, default=None,
                    help="TVM: operators FuseOps may chain into one kernel (1: no fusion; default: TVM's)")  # fmt: skip
    op.add_argument("--tvm-fast-math", action="store_true",
                    help="TVM: approximate erf, exp, tanh, softmax (FastMathTransform); fidelity measured")  # fmt: skip
    op.add_argument("--rounds", type=positive_int, default=None, help="interleaved timing rounds (10; gen: 2)")
    op.add_argument("--quick", action="store_true", help="gen: a small search (2 prompts, 8 tokens, 1 round) for tests")
    op.add_argument(
        "--seq-len", type=int, default=128,
        help="text: the length of padding=max_length and of the passages input set (0 = no passages); "
        "--model without --inputs: the guessed size of its symbolic (sequence) dimensions",
    )  # fmt: skip
    op.add_argument("--batch-size", type=positive_int, default=1)
    op.add_argument("--out", help="directory for the chosen artifact and recipe.json")
    op.add_argument("--recipe", help="re-apply a recipe.json and measure it again")
    op.add_argument(
        "--force", action="store_true", help="--recipe: rebuild even when the model or inputs differ from the recorded"
    )
    op.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    op.add_argument("--quiet", action="store_true")
    from latencylab.cliargs import add_optimize_ray_arguments

    add_optimize_ray_arguments(op)

    from latencylab.optimize.experiments.frontend import add_arguments as add_experiment_arguments

    ex = sub.add_parser("experiment", help="pipeline experiments: shape policy, overlap, thread and batch sweeps")
    add_experiment_arguments(ex)

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
    cp.add_argument("--rounds", type=positive_int, default=20, help="--run: interleaved rounds (default 20)")
    cp.add_argument("--iterations", type=positive_int, default=100, help="--run: timed iterations per run (100)")
    cp.add_argument("--warmup", type=non_negative_int, default=10, help="--run: warm-up iterations per run (10)")
    cp.add_argument("--seed", type=int, default=0, help="--run: seed of the A/B order per round")
    cp.add_argument("--keep", metavar="DIR", help="--run: also write DIR/A.json and DIR/B.json")
    cp.add_argument("--strict", action="store_true", help="an undecided gate fails when its evidence says so")
    cp.add_argument("--fail-if", action="append", default=[], metavar="GATE", help='e.g. "p99>+5%%" (repeatable)')
    cp.add_argument("--alpha", type=fraction, default=0.05, help="significance level (default 0.05)")
    cp.add_argument("--json", metavar="PATH", help="write the comparison as JSON")

    e = sub.add_parser("env", help="environment fingerprint, lint and diff")
    e.add_argument("--json", nargs="?", const="-", metavar="PATH", help="write the fingerprint as JSON (- = stdout)")
    e.add_argument("--diff", nargs=2, metavar=("A", "B"), help="differences that change latency (env or result files)")

    from latencylab.prepare import add_arguments as add_prepare_arguments

    add_prepare_arguments(
        sub.add_parser("prepare", help="build the built-in workloads' model caches once (offline): CNN, SmolLM2, peaks")
    )
    return parser


def _stdout_console() -> Any:
    """Rich console for results: a pipe or file gets a fixed wide layout, not 80 columns."""
    from rich.console import Console

    con = Console()
    return con if con.is_terminal else Console(width=200, no_color=True)


def cmd_profile(args: argparse.Namespace) -> int:
    from latencylab.profile_frontend import run_profile_command

    return run_profile_command(args, _stdout_console())


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
    if args.api and args.ray is not None:
        raise LatencyLabError("--ray distributes OIP infer load tests; --api runs on one host")
    if args.api:
        from latencylab.load.gen_frontend import run_gen_load_command

        return run_gen_load_command(args, _stdout_console())
    if args.prompts or args.max_tokens:
        raise LatencyLabError("--prompts and --max-tokens need --api (a generative endpoint)")
    if args.slo and len(args.slo) > 1:
        raise LatencyLabError("one --slo for an OIP infer load test (several are for --api: ttft_p99=..., ...)")
    args.slo = args.slo[0] if args.slo else None
    from latencylab.load.frontend import run_load_command

    return run_load_command(args, _stdout_console())


def cmd_serve(args: argparse.Namespace) -> int:
    ray_only = ("replicas", "autoscale", "retry_shed")
    if getattr(args, "ray", None) is not None or any(getattr(args, k, None) is not None for k in ray_only):
        from latencylab.scaleout.cli import run_serve_ray  # --ray: Ray Serve replicas (latencylab.scaleout)

        return run_serve_ray(args)
    from latencylab.serve.frontend import run_serve_command

    return run_serve_command(args)


def cmd_optimize(args: argparse.Namespace) -> int:
    from latencylab.optimize.frontend import run_optimize_command

    return run_optimize_command(args, _stdout_console())


def cmd_experiment(args: argparse.Namespace) -> int:
    from latencylab.optimize.experiments.frontend import run_experiment_command

    return run_experiment_command(args)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from latencylab.diagnose.frontend import run_diagnose_command

    return run_diagnose_command(args, _stdout_console())


def cmd_report(args: argparse.Namespace) -> int:
    from latencylab.report.frontend import run_report_command

    return run_report_command(args, _stdout_console())


def cmd_compare(args: argparse.Namespace) -> int:
    from latencylab.compare.frontend import run_compare_command

    return run_compare_command(args, _stdout_console())


def cmd_prepare(args: argparse.Namespace) -> int:
    from latencylab.prepare import run_prepare_command

    return run_prepare_command(args)


COMMANDS: dict[str, Any] = {
    "profile": cmd_profile,
    "env": cmd_env,
    "load": cmd_load,
    "serve": cmd_serve,
    "optimize": cmd_optimize,
    "experiment": cmd_experiment,
    "diagnose": cmd_diagnose,
    "report": cmd_report,
    "compare": cmd_compare,
    "prepare": cmd_prepare,
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
