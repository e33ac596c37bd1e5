"""``latencylab load --ray [ADDRESS] --workers N``: the cluster from the options, and the per-worker table;
``latencylab serve --ray [ADDRESS] --replicas N``: the deployment from the serve options."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from latencylab.errors import LatencyLabError
from latencylab.load.results import LoadResult

DEFAULT_WORKERS = 2


def cluster_from(ray: str | None, workers: int | None) -> Any:
    """A ``LoadCluster`` (not yet open) when ``--ray`` was given, else None (``--workers`` alone is refused)."""
    if ray is None:
        if workers is not None:
            raise LatencyLabError("--workers needs --ray [ADDRESS]")
        return None
    from latencylab.scaleout.load_ray import LoadCluster  # imports ray only when a run opens the cluster

    return LoadCluster(workers or DEFAULT_WORKERS, ray or None)


def render_workers(result: LoadResult, console: Console) -> None:
    """The per-worker breakdown of a distributed result (nothing for a one-host result)."""
    rows = result.summary.get("workers")
    if not rows:
        return
    t = Table(title="per worker", title_justify="left")
    for col in ("worker", "node", "sent", "ok", "p50 ms", "p99 ms", "late", "start error ms", "valid"):
        t.add_column(col, justify="left" if col == "node" else "right")

    def num(v: Any, fmt: str = ".2f") -> str:
        return "-" if v is None else format(v, fmt)

    for r in rows:
        valid = "yes" if r.get("valid") else ("[red]NO[/red]" if r.get("valid") is False else "-")
        t.add_row(
            str(r["worker"]), escape(str(r["node"])), str(r["sent"]), str(r["ok"]), num(r.get("p50_ms")),
            num(r.get("p99_ms")), f"{r['late_fraction']:.1%}", num(r.get("start_error_ms"), ".3f"),
            valid + (" (partial)" if r.get("partial") else ""),
        )  # fmt: skip
    console.print(t)
    d = result.summary.get("distributed", {})
    console.print(
        escape(
            f"{d.get('workers')} workers ({d.get('split')}); clock offsets known to "
            f"+/-{d.get('clock_uncertainty_max_ms', 0):.3f} ms; failed: {d.get('failed_workers') or 'none'}"
        )
    )


DEFAULT_REPLICAS = 2


def run_serve_ray(args: argparse.Namespace) -> int:
    """``latencylab serve --ray [ADDRESS] --replicas N``: deploy, print the endpoint, serve until SIGINT/SIGTERM,
    then delete the deployment (latencylab.scaleout.serve_ray)."""
    if args.ray is None:
        given = next(f for k, f in (("replicas", "--replicas"), ("autoscale", "--autoscale"),
                                    ("retry_shed", "--retry-shed")) if getattr(args, k, None) is not None)  # fmt: skip
        raise LatencyLabError(f"{given} needs --ray [ADDRESS]")
    if getattr(args, "timeline", None):
        raise LatencyLabError("--timeline is per process: read each replica's /metrics with --ray instead")
    from latencylab.scaleout.serve_ray import ReplicaOptions, deploy, shutdown

    gen = getattr(args, "model", None) == "gen"
    if gen and (getattr(args, "autoscale", None) or getattr(args, "retry_shed", None)):
        raise LatencyLabError("--autoscale and --retry-shed are for the OIP models; not --model gen yet")
    if gen:
        from latencylab.genserve.server import config_from_args as gen_config

        cfg: Any = gen_config(args)
    else:
        from latencylab.serve.frontend import config_from_args

        cfg = config_from_args(args)
    if cfg.port == 0:
        raise LatencyLabError("--port 0 is not supported with --ray: Ray Serve's proxy needs a fixed port")
    retry = getattr(args, "retry_shed", None)
    if retry is not None and retry < 0:
        raise LatencyLabError("--retry-shed must be >= 0")
    scale = getattr(args, "autoscale", None)
    replicas = args.replicas or (scale[0] if scale else DEFAULT_REPLICAS)
    opts = ReplicaOptions(
        replicas=replicas, num_cpus=float(cfg.threads or 1), host=cfg.host, port=cfg.port, retry_shed=retry or 0,
        autoscale=scale,
    )  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    url = deploy(cfg, opts, args.ray or None)
    try:
        print(f"listening {url}", flush=True)
        count = str(opts.replicas)
        if scale is not None:
            count += f" (autoscaled {scale[0]}-{scale[1]} on SLO pressure)"
        if gen:
            print(f"  model {cfg.model_name}: {count} Ray Serve replicas (the generative server, streamed through Ray "
                  "Serve's proxy)", flush=True)  # fmt: skip
        for m in () if gen else cfg.models:
            print(f"  model {m.name}: {count} Ray Serve replicas, ladder {' -> '.join(m.ladder)}", flush=True)
        if opts.retry_shed:
            print(f"  a shed request is offered to another replica up to {opts.retry_shed} times", flush=True)
        stop.wait()
    finally:
        shutdown(opts)
    print("server stopped", file=sys.stderr)
    return 0
