"""``latencylab serve``: build the config from a file, flags or an optimize output directory (``--from``), load
and warm the variants, serve."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.serve.config import ModelConfig, ServerConfig, default_config, load_config

log = logging.getLogger("latencylab.serve")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    source = getattr(args, "from_dir", None)
    if sum(1 for x in (args.config, args.model, source) if x) > 1:
        raise LatencyLabError("give one of --config, --model or --from")
    model_over = {
        k: v
        for k, v in {
            "slo_ms": args.slo_ms,
            "max_batch_size": args.max_batch_size,
            "max_queue_delay_ms": args.max_queue_delay_ms,
            "compute_workers": getattr(args, "compute_workers", None),
        }.items()
        if v is not None
    }
    server_over = {
        k: v
        for k, v in {
            "host": args.host,
            "port": args.port,
            "token_env": args.token_env,
            "threads": args.threads,
            "trust_request_start": getattr(args, "trust_request_start", None),
            "otlp_endpoint": getattr(args, "otlp_endpoint", None),
        }.items()
        if v is not None
    }
    if args.config:
        cfg = load_config(args.config)
        if model_over:
            cfg = dataclasses.replace(cfg, models=tuple(dataclasses.replace(m, **model_over) for m in cfg.models))
        return dataclasses.replace(cfg, **server_over)
    if source:
        from latencylab.serve.from_optimize import load_plan

        plan = load_plan(source)
        model = ModelConfig(name=plan.workload, ladder=plan.ladder, from_optimize=str(source), **model_over)
        return ServerConfig(models=(model,), **server_over)
    return default_config(args.model or "text", **model_over, **server_over)


def load_variants(m: ModelConfig, device: str) -> list[Any]:
    """The ladder's variants of one model: built-in, from an optimize output directory, or from ``factory``."""
    if m.from_optimize is not None:
        from latencylab.serve.from_optimize import load_plan, plan_variants

        return plan_variants(load_plan(m.from_optimize), m.variants, m.max_batch_size, device)
    if m.factory is None:
        from latencylab.serve.variants import build_variants

        return list(build_variants(m.name, m.variants, m.max_batch_size, device))
    import importlib

    module, _, attr = m.factory.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise LatencyLabError(f"model {m.name!r}: cannot load factory {m.factory!r}: {exc}") from exc
    variants = list(fn(list(m.variants), m.max_batch_size, device))
    if [v.name for v in variants] != list(m.variants):
        raise LatencyLabError(
            f"model {m.name!r}: factory returned {[v.name for v in variants]}, ladder wants {list(m.variants)}"
        )
    return variants


def apply_process_settings(cfg: ServerConfig) -> None:
    """Process-wide settings of a server process (before any thread starts)."""
    # The GIL's switch interval (CPython default 5 ms) is how long a thread that wants the GIL waits for a
    # holder to give it up. The event loop, the preprocess threads and the compute thread hand work to each
    # other several times per request; on a busy core each hand-over could wait that long. Measured
    # (vision, one core, 230 req/s, docs/BENCHMARKS.md): 5 ms shed 24% at p99 31 ms; 1 ms shed none at
    # p99 30 ms; 0.2 ms did a little better again at 260 req/s.
    sys.setswitchinterval(cfg.switch_interval_ms / 1e3)


def run_serve_command(args: argparse.Namespace) -> int:
    if getattr(args, "model", None) == "gen":  # a generative model: continuous batching, OpenAI API (genserve/)
        from latencylab.genserve.server import run_gen_serve

        return run_gen_serve(args)
    if getattr(args, "prefill_dtype", None):
        raise LatencyLabError("--prefill-dtype is for --model gen (a generative model's prompt forward)")
    if getattr(args, "itl_cap_ms", None) or getattr(args, "itl_cap_yield", False):
        raise LatencyLabError("--itl-cap-ms and --itl-cap-yield are for --model gen (a generative model's steps)")
    if getattr(args, "gen_engine", None) or getattr(args, "spec_lookup", None) is not None:
        raise LatencyLabError("--gen-engine and --spec-lookup are for --model gen (a generative model's steps)")
    from latencylab.serve.app import build_state, run_server

    cfg = config_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    apply_process_settings(cfg)
    for m in cfg.models:
        if m.from_optimize is not None:  # which candidate fills which rung, before the minutes of loading
            from latencylab.serve.from_optimize import load_plan

            for line in load_plan(m.from_optimize).lines():
                log.info("model %s: %s", m.name, line)
    if cfg.threads is not None:
        import torch

        torch.set_num_threads(cfg.threads)
    variants = {m.name: load_variants(m, cfg.device) for m in cfg.models}
    state = build_state(cfg, variants)

    def listening(port: int) -> None:
        print(f"listening http://{cfg.host}:{port}", flush=True)
        for m in cfg.models:
            print(
                f"  model {m.name}: ladder {' -> '.join(m.ladder)}, SLO p{m.quantile * 100:g} <= {m.slo_ms:g} ms",
                flush=True,
            )

    recorder = None
    if getattr(args, "timeline", None):  # the guard's ladder over time, for `latencylab report`
        from latencylab.serve.timeline import TimelineRecorder

        recorder = TimelineRecorder(state, args.timeline).start()
    try:
        run_server(state, listening)
    except OSError as exc:
        raise LatencyLabError(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}") from exc
    finally:
        if recorder is not None:
            for path in recorder.stop():
                print(f"wrote ladder timeline {path}", file=sys.stderr)
    print("server stopped", file=sys.stderr)
    return 0
