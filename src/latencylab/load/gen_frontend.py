"""``latencylab load --api ...``: generative (streaming) load tests from the CLI, and their rendering."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from latencylab.errors import LatencyLabError
from latencylab.load.arrivals import ArrivalProcess, Poisson, parse_arrivals
from latencylab.load.gen_client import gen_api
from latencylab.load.generator import OUTCOMES, LoadConfig, Records
from latencylab.load.prompts import Prompt, builtin_prompts, read_prompts, with_max_tokens
from latencylab.load.results import LoadResult
from latencylab.load.token_metrics import TokenSlo


def prompts_from_args(args: argparse.Namespace) -> list[Prompt]:
    prompts = read_prompts(args.prompts) if args.prompts else builtin_prompts()
    return with_max_tokens(prompts, args.max_tokens) if args.max_tokens else prompts


def render_tokens(result: LoadResult, console: Console) -> None:
    """The token table of a streaming load result (after ``render_load``'s request table)."""
    t = result.summary.get("tokens")
    if not t:
        return
    table = Table(title=escape(f"tokens ({result.target.get('api')}, {t['requests']} streamed requests)"),
                  title_justify="left")  # fmt: skip
    for col, justify in (("metric", "left"), ("p50", "right"), ("p90", "right"), ("p99", "right"),
                         ("p99 95% CI", "right"), ("n", "right")):  # fmt: skip
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    labels = {
        "ttft": "TTFT (from intended send)", "ttft_uncorrected": "TTFT (from actual send)",
        "tpot": "TPOT", "itl": "ITL (every gap)", "e2e": "E2E (from intended send)",
    }  # fmt: skip
    for key, label in labels.items():
        d = t.get(key)
        if not d:
            table.add_row(label, "-", "-", "-", "-", "0")
            continue
        ci = d.get("p99_ci_ms")
        table.add_row(
            label, f"{d['p50_ms']:.2f} ms", f"{d['p90_ms']:.2f} ms", f"{d['p99_ms']:.2f} ms",
            escape(f"[{ci[0]:.2f}, {ci[1]:.2f}]") if ci else "-", str(d["n"]),
        )  # fmt: skip
    console.print(table)
    rate = t.get("output_tokens_per_s")
    per = t.get("request_output_tokens_per_s_p50")
    console.print(
        escape(
            f"output tokens: {t['output_tokens']} (mean {t['output_tokens_mean'] or 0:.1f} per request); "
            f"{rate or 0:.1f} tokens/s in aggregate; per request p50 {per or 0:.1f} tokens/s"
        )
    )
    for v in t.get("slo", []):
        console.print(f"SLO {escape(v['objective'])}: {escape(v['text'])}")
    if t.get("slo"):
        good = t.get("goodput")
        console.print(
            escape(f"goodput: {good or 0:.2f} requests/s met every objective ({t['good']} of {result.summary['sent']})")
        )
    if t.get("one_shot"):
        console.print(escape(f"{t['one_shot']} one-shot answers (not streamed): end to end only"))


def write_gen_requests_jsonl(path: str | Path, rec: Records) -> Path:
    """One JSON line per request: the request fields of ``load --requests-jsonl`` plus its stream: first-token
    time, output tokens, token event times (ms from the run start) and the stream's failure reason."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    traces = rec.traces or [None] * rec.n
    with p.open("w", encoding="utf-8") as fh:
        for i in range(rec.n):
            tr = traces[i]
            row: dict[str, Any] = {
                "intended_ms": rec.intended_ns[i] / 1e6, "sent_ms": rec.sent_ns[i] / 1e6,
                "done_ms": rec.done_ns[i] / 1e6, "e2e_ms": (rec.done_ns[i] - rec.intended_ns[i]) / 1e6,
                "outcome": OUTCOMES[rec.outcome[i]] if rec.outcome[i] >= 0 else "none",
                "status": int(rec.status[i]), "payload": int(rec.payload[i]),
            }  # fmt: skip
            if tr is not None:
                row["ttft_ms"] = (tr.chunk_ns[0] - rec.intended_ns[i]) / 1e6 if tr.chunk_ns else None
                row["output_tokens"] = tr.output_tokens
                row["token_ms"] = [t / 1e6 for t in tr.chunk_ns]
                row["error"] = tr.error or None
            fh.write(json.dumps(row) + "\n")
    return p


def run_gen_load_command(args: argparse.Namespace, console: Console) -> int:
    """``latencylab load --api ...``: one streaming load test (open loop by default), rendered and saved."""
    from latencylab.env import fingerprint
    from latencylab.load.frontend import _progress, render_load, write_outputs
    from latencylab.load.gen_runner import gen_load_test

    api = gen_api(args.api)
    slos = [TokenSlo.parse(s) for s in (args.slo or [])]
    if args.find_capacity and (args.concurrency or args.arrivals):
        raise LatencyLabError("--find-capacity searches Poisson rates itself: drop --concurrency/--arrivals")
    if args.early_stop:
        raise LatencyLabError("--early-stop judges a request-latency SLO; with --api run a fixed --duration")
    if args.payload != "auto" or args.input_name:
        raise LatencyLabError("--payload/--input-name are for OIP infer; with --api use --prompts FILE.jsonl")
    prompts = prompts_from_args(args)
    for p in prompts:
        api.body(args.model, p)  # refuses a 'messages' prompt for a prompt-only API, before anything is sent
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    if args.find_capacity:
        from latencylab.load.gen_capacity import run_gen_capacity

        return run_gen_capacity(args, console, args.url, api, prompts, slos, headers, fingerprint(sample_s=0.0))
    duration = args.duration if args.duration is not None else (None if args.max_requests else 10.0)
    common: dict[str, Any] = {
        "duration_s": duration, "max_requests": args.max_requests, "min_requests": args.min_requests,
        "timeout_s": args.timeout, "headers": headers, "request_start_header": args.request_start_header,
        "spin": args.spin,
    }  # fmt: skip
    arrivals: ArrivalProcess | None
    if args.concurrency:
        cfg = LoadConfig(mode="closed", concurrency=args.concurrency, connections=args.concurrency, **common)
        arrivals = None
    else:
        arrivals = parse_arrivals(args.arrivals, args.seed) if args.arrivals else Poisson(args.rate or 1.0, args.seed)
        cfg = LoadConfig(connections=args.connections, **common)
    live, update = _progress(Console(stderr=True), args.quiet)
    with live if live is not None else contextlib.nullcontext():
        result, rec = gen_load_test(
            args.url, api, args.model, prompts, arrivals, cfg, slos, args.confidence, args.seed, update,
            env=fingerprint(sample_s=0.0),
        )  # fmt: skip
    render_load(result, console)
    render_tokens(result, console)
    write_outputs(result, console, args.json, args.plot, (args.requests_jsonl, rec, write_gen_requests_jsonl))
    return 0
