"""``latencylab load``: turn CLI arguments into a load test or capacity search, and render the outcome."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from latencylab.errors import LatencyLabError
from latencylab.load.arrivals import ArrivalProcess, Poisson, parse_arrivals
from latencylab.load.generator import LoadConfig, Payload, Records
from latencylab.load.payloads import (
    builtin_payloads,
    fetch_metadata,
    infer_path,
    payloads_for_model,
    text_payloads,
    vision_payloads,
)
from latencylab.load.results import LoadResult, Slo, latency_basis, write_requests_jsonl


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """``latencylab load``'s options (OIP infer endpoints), as typed values: see ``latencylab load --help``.

    Built from the parsed command line by :meth:`from_args`, the one place that reads the namespace."""

    url: str
    model: str
    model_version: str | None = None
    rate: float | None = None  # Poisson arrivals at this mean rate (default 10/s)
    arrivals: str | None = None  # an arrival spec (load.arrivals.parse_arrivals)
    concurrency: int | None = None  # closed loop with N users
    duration: float | None = None  # seconds of sending (default 10, or none with max_requests)
    max_requests: int | None = None
    min_requests: int = 0
    early_stop: bool = False
    timeout: float = 30.0
    connections: int = 8
    payload: str = "auto"  # auto, text, vision, or a .jsonl file of infer requests
    input_name: str | None = None
    slo: str | None = None  # e.g. "p99=100ms"
    confidence: float = 0.99
    find_capacity: bool = False
    start_rate: float = 10.0
    max_rate: float = 100_000.0
    step_duration: float = 8.0
    max_chunks: int = 8
    warmup: float = 2.0
    search_warmup: float = 5.0
    max_late: float = 0.01
    repeat: int = 1
    precision: float = 0.05
    refine_rounds: int = 0
    token: str | None = None
    request_start_header: bool = False
    spin: str = "auto"
    seed: int = 0
    json: str | None = None
    requests_jsonl: str | None = None
    plot: str | None = None
    quiet: bool = False
    ray: str | None = None  # --ray [ADDRESS]: distributed generators (latencylab.scaleout); "" = local/RAY_ADDRESS
    workers: int | None = None  # --workers N with --ray

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadOptions:
        """The options from ``latencylab load``'s namespace (``args.slo``: one objective, or None)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def _payloads(opts: LoadOptions, meta: dict[str, Any]) -> list[Payload]:
    name = opts.input_name or str(meta["inputs"][0]["name"])
    if opts.payload == "auto":
        return builtin_payloads(meta) or payloads_for_model(meta, n=64, seed=opts.seed)
    if opts.payload == "text":
        return text_payloads(name)
    if opts.payload == "vision":
        return vision_payloads(name)
    path = Path(opts.payload)
    if not path.is_file():
        raise LatencyLabError(f"--payload {opts.payload}: not auto, text, or an existing .jsonl file")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise LatencyLabError(f"{path}:{i}: not a JSON infer request") from exc
        if not isinstance(obj, dict) or "inputs" not in obj:
            raise LatencyLabError(f"{path}:{i}: an infer request needs an 'inputs' list")
        out.append(Payload(json.dumps(obj).encode(), f"{path.name}:{i}"))
    if not out:
        raise LatencyLabError(f"{path}: no requests")
    return out


def _progress(console: Console, quiet: bool) -> Any:
    if quiet or not console.is_terminal:
        return None, None
    from rich.live import Live

    live = Live(console=console, transient=True, refresh_per_second=4)

    def update(p: dict[str, Any]) -> None:
        live.update(
            f"[bold]load[/bold] {p['elapsed_s']:.1f}s  sent {p['sent']}  done {p['done']}  "
            f"rate {p['rate']:.0f}/s  p50 {p['p50_ms']:.1f} ms  p99 {p['p99_ms']:.1f} ms  "
            f"errors {p['errors']}  in flight {p['in_flight']}"
        )

    return live, update


def _validity(s: Any) -> str:
    """The verdict row: open loop is valid or not; closed loop has no schedule to keep and is not judged."""
    valid = s.get("valid")
    if valid is None:
        return "not judged (closed loop)"
    return "yes" if valid else "[red]NO[/red]"


def _cpu(s: Any) -> str:
    share = s.get("client_cpu_share")
    if share is None:  # results written before the share was recorded
        pct = s.get("client_cpu_percent")
        return "-" if pct is None else f"{pct:.0f}% of one core"
    cores = s.get("client_cores")
    of = f" of {cores} core{'s' if cores != 1 else ''}" if cores else ""
    others = s.get("other_cpu_cores")
    return f"{share:.2f}{of}" + ("" if others is None else f" (other work {others:.2f})")


def _send_timing(s: Any) -> str | None:
    spin = s.get("spin")
    if spin is None:
        return None
    frac = s.get("spin_fraction")
    return f"spin {spin}" + ("" if frac is None else f": {frac:.0%} of sends busy-waited")


def render_load(result: LoadResult, console: Console) -> None:
    s = result.summary
    # Everything that comes from the run or the user is escaped: rich reads "[open]" as markup and drops it.
    t = Table(
        title=escape(f"latencylab load: {result.target['url']}{result.target['path']} [{s['mode']}]"),
        title_justify="left",
    )
    t.add_column("figure")
    t.add_column("value", justify="right")

    def ms(key: str) -> str:
        v = s.get(key)
        return "-" if v is None else f"{v:.2f} ms"

    closed = str(s.get("mode", "")).startswith("closed")
    basis = escape(latency_basis(s))
    rate = s.get("target_rate")
    t.add_row("offered rate (target)", "-" if rate is None else f"{rate:.1f}/s")
    ach = s.get("achieved_rate")
    t.add_row("achieved send rate", "-" if ach is None else f"{ach:.1f}/s")
    t.add_row("sent / ok / shed / error", f"{s['sent']} / {s['ok']} / {s['shed']} / {s['error']}")
    for key, label in (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"), ("p99_9_ms", "p99.9")):
        ci = s.get(key.replace("_ms", "_ci_ms"))
        extra = escape(f" [{ci[0]:.2f}, {ci[1]:.2f}]") if ci else ""
        t.add_row(f"latency {label} ({basis})", ms(key) + extra)
    if not closed:  # closed loop: intended = sent, so these are the rows above again
        t.add_row(
            "uncorrected p50 / p99 (from actual send)", f"{ms('uncorrected_p50_ms')} / {ms('uncorrected_p99_ms')}"
        )
    t.add_row(
        "generator lateness p50 / p99 / max",
        f"{ms('lateness_p50_ms')} / {ms('lateness_p99_ms')} / {ms('lateness_max_ms')}",
    )
    timing = _send_timing(s)
    if timing is not None:
        t.add_row("send timing", escape(timing))
    t.add_row("generator CPU share (cores)", _cpu(s))
    t.add_row("valid (open-loop sends on time)", _validity(s))
    console.print(t)
    for r in s.get("invalid_reasons", []):
        console.print(f"[red]invalid:[/red] {escape(r)}")
    if s.get("stopped_early"):
        console.print(f"stopped early: {escape(s['stopped_early'])}")
    if s.get("coordinated_omission"):
        console.print(f"note: {escape(s['coordinated_omission'])}")
    if s.get("slo"):
        console.print(f"SLO {escape(s['slo']['text'])}")
    for reason, n in s.get("errors_by_reason", {}).items():
        console.print(f"errors: {n} x {escape(reason)}")
    for w in s.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if result.server:
        srv = result.server
        stages = ", ".join(f"{k} {v:.2f} ms" for k, v in srv["server_stages_mean_ms"].items())
        net = srv.get("network_and_client_mean_ms")
        console.print(
            escape(
                f"server-side means ({srv['server_requests']} requests): {stages}; "
                f"client mean {srv['client_mean_ms']:.2f} ms"
                + ("" if net is None else f"; network + client overhead {net:.2f} ms")
            )
        )


def _verdict_decided(slo: Slo, confidence: float, min_requests: int) -> Any:
    """Abort rule for --early-stop: the SLO verdict is pass or fail at one of a few looks (see early_stop)."""
    from latencylab.load.early_stop import EarlyStop

    rule = EarlyStop(slo.q, confidence, decide_met=True, min_requests=min_requests)

    def decided(progress: Any) -> str:
        reason = rule(progress)
        return f"early stop: {reason}" if reason else ""

    return decided


def _find_capacity(
    opts: LoadOptions, console: Console, slo: Slo, payloads: list[Payload], path: str,
    headers: dict[str, str], env: dict[str, Any], info: dict[str, Any],
) -> int:  # fmt: skip
    """``--find-capacity``: ``repeat_capacity`` (load/capacity.py) over Poisson runs, printed step by step."""
    from latencylab.load.capacity import SearchConfig, Segment, repeat_capacity
    from latencylab.load.runner import load_test
    from latencylab.scaleout.cli import cluster_from

    cluster = cluster_from(opts.ray, opts.workers)

    try:
        search = SearchConfig(
            start_rate=opts.start_rate, max_rate=opts.max_rate, precision=opts.precision,
            chunk_s=opts.step_duration, max_chunks=max(opts.max_chunks, 3), warmup_s=opts.warmup,
            confidence=opts.confidence, search_warmup_s=opts.search_warmup,
            max_late_fraction=opts.max_late, refine_rounds=opts.refine_rounds,
        )  # fmt: skip
    except ValueError as exc:
        raise LatencyLabError(f"--find-capacity: {exc}") from exc

    def measure(rate: float, seconds: float, seed: int, abort_when: Any) -> Segment:
        cfg = LoadConfig(
            duration_s=seconds,
            timeout_s=opts.timeout,
            connections=opts.connections,
            headers=headers,
            request_start_header=opts.request_start_header,
            spin=opts.spin,
        )
        if cluster is not None:  # the same step, from the cluster's workers (their records merged)
            run = cluster.run(
                opts.url, path, payloads, Poisson(rate, seed), cfg, slo, opts.confidence, seed, abort_when,
                keep_records=True, env=env, target_info=info,
            )  # fmt: skip
            assert run.records is not None
            return Segment.from_run(rate, run.result, run.records)
        res, rec = load_test(
            opts.url, path, payloads, Poisson(rate, seed), cfg, slo, opts.confidence, seed,
            abort_when=abort_when, env=env, target_info=info,
        )  # fmt: skip
        return Segment.from_run(rate, res, rec)

    def on_step(step: dict[str, Any]) -> None:
        mark = {"pass": "pass", "fail": "FAIL"}.get(step["verdict"], "pass?" if step["passed"] else "FAIL?")
        console.print(
            escape(
                f"  {'refined' if step.get('phase') == 'refine' else 'offered'} {step['offered_rate']:.1f}/s  "
                f"achieved {step.get('achieved_rate') or 0:.1f}/s  "
                f"{step['chunks']} x {opts.step_duration:g} s  {mark}: {step['why']}"
            )
        )

    def on_search(r: int, cap: Any) -> None:
        rate = "none" if cap.capacity_rate is None else f"{cap.capacity_rate:.1f}/s"
        console.print(escape(f"search {r + 1} of {opts.repeat}: capacity {rate} ({cap.reason})"))

    console.print(escape(f"capacity search for {slo.describe()} on {opts.url}{path}"))
    with cluster if cluster is not None else contextlib.nullcontext():
        spread = repeat_capacity(measure, slo, search, opts.repeat, opts.seed, on_step, on_search)
    good = "-" if spread.goodput is None else f"{spread.goodput:.1f}/s"
    console.print(escape(f"capacity: {spread.describe()} offered, goodput {good}"))
    first = spread.searches[0]
    if opts.plot:
        from latencylab.load.plots import plot_capacity

        out = Path(opts.plot) / "capacity.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        console.print(escape(f"wrote {plot_capacity(first.steps, out, slo.threshold_ns / 1e6)}"))
    if opts.json:
        doc = spread.result_doc(search, env)
        Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.json).write_text(json.dumps(doc, indent=1))
        console.print(escape(f"wrote {opts.json}"))
    return 0


def run_load_command(args: argparse.Namespace, console: Console) -> int:
    """``latencylab load`` against an OIP infer endpoint: the namespace becomes :class:`LoadOptions` here."""
    return run_load(LoadOptions.from_args(args), console)


def run_load(opts: LoadOptions, console: Console) -> int:
    """A load test (or a capacity search, ``find_capacity``) as the options say; the outcome printed."""
    from latencylab.env import fingerprint
    from latencylab.load.runner import load_test

    slo = Slo.parse(opts.slo) if opts.slo else None
    if opts.find_capacity and slo is None:
        raise LatencyLabError("--find-capacity needs --slo, e.g. --slo p99=100ms")
    if opts.find_capacity and (opts.concurrency or opts.arrivals):
        raise LatencyLabError("--find-capacity searches Poisson rates itself: drop --concurrency/--arrivals")
    if opts.workers is not None and opts.ray is None:
        raise LatencyLabError("--workers needs --ray [ADDRESS]")
    meta = fetch_metadata(opts.url, opts.model, opts.model_version)
    payloads = _payloads(opts, meta)
    path = infer_path(opts.model, opts.model_version)
    headers = {"Authorization": f"Bearer {opts.token}"} if opts.token else {}
    env = fingerprint(sample_s=0.0)
    info = {"model": opts.model, "platform": meta.get("platform")}
    duration = opts.duration if opts.duration is not None else (None if opts.max_requests else 10.0)

    if opts.find_capacity:
        assert slo is not None
        return _find_capacity(opts, console, slo, payloads, path, headers, env, info)

    arrivals: ArrivalProcess | None
    common: dict[str, Any] = {
        "duration_s": duration,
        "max_requests": opts.max_requests,
        "min_requests": opts.min_requests,
        "timeout_s": opts.timeout,
        "headers": headers,
        "request_start_header": opts.request_start_header,
        "spin": opts.spin,
    }
    if opts.concurrency:
        cfg = LoadConfig(mode="closed", concurrency=opts.concurrency, connections=opts.concurrency, **common)
        arrivals = None
    else:
        arrivals = parse_arrivals(opts.arrivals, opts.seed) if opts.arrivals else Poisson(opts.rate or 10.0, opts.seed)
        cfg = LoadConfig(connections=opts.connections, **common)
    abort_when = None
    if opts.early_stop:
        if slo is None:
            raise LatencyLabError("--early-stop needs --slo")
        abort_when = _verdict_decided(slo, opts.confidence, opts.min_requests)
    from latencylab.scaleout.cli import cluster_from, render_workers

    cluster = cluster_from(opts.ray, opts.workers)
    if cluster is not None:  # --ray: the same test from N generator actors, merged (latencylab.scaleout)
        with cluster:
            run = cluster.run(
                opts.url, path, payloads, arrivals, cfg, slo, opts.confidence, opts.seed, abort_when,
                keep_records=bool(opts.requests_jsonl), env=env, target_info=info,
            )  # fmt: skip
        result, rec = run.result, run.records
    else:
        live, update = _progress(Console(stderr=True), opts.quiet)
        with live if live is not None else contextlib.nullcontext():
            result, rec = load_test(
                opts.url, path, payloads, arrivals, cfg, slo, opts.confidence, opts.seed, update,
                abort_when=abort_when, env=env, target_info=info,
            )  # fmt: skip
    render_load(result, console)
    render_workers(result, console)
    write_outputs(result, console, opts.json, opts.plot, (opts.requests_jsonl, rec, write_requests_jsonl))
    return 0


def write_outputs(
    result: LoadResult,
    console: Console,
    json_path: str | None,
    plot_dir: str | None,
    jsonl: tuple[str | None, Records | None, Callable[[str | Path, Records], Path]],
) -> None:
    """Write what a load run was asked to keep (result file, per-request JSONL, plots), a line for each."""
    written: list[Path | str] = []
    if json_path:
        result.save(json_path)
        written.append(json_path)
    jsonl_path, rec, write_jsonl = jsonl
    if jsonl_path and rec is not None:
        written.append(write_jsonl(jsonl_path, rec))
    if plot_dir:
        from latencylab.load.plots import plot_load

        written.extend(plot_load(result, plot_dir))
    for path in written:
        console.print(escape(f"wrote {path}"))
