"""``latencylab serve --model gen``: load SmolLM2, warm the scheduler's cost model, serve on uvicorn.

:func:`build_service` makes the service (real model or, for tests, any engine and codec);
:func:`serve_in_thread` runs an app on a real uvicorn in a thread (tests, benchmarks); :func:`run_gen_serve`
is the CLI's entry (serve/frontend.py hands ``--model gen`` here).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.genserve.scheduler import SchedulerConfig
from latencylab.genserve.service import GenServeConfig, GenService, HfCodec

log = logging.getLogger("latencylab.genserve")
ENGINES = ("fp32", "int8")  # the model rungs build_service can make for SmolLM2
PREFILL_WITH_FROM = "--prefill-dtype with --from: the chosen variant's own precision applies; give one"
GEN_ENGINES = ("padded", "packed")  # GenServeConfig.engine
PACKED_WITH_BF16 = (
    "--gen-engine packed runs prefill and decode in one forward, in one dtype: it takes no --prefill-dtype bf16 or auto"
)


def config_from_args(args: argparse.Namespace) -> GenServeConfig:
    """``serve --model gen`` flags: --max-batch-size is max_num_seqs, --slo-ms the TTFT deadline (ms)."""
    # the CLI's server ties each step's prefill budget and the batch size to its TPOT objective (scheduler.py)
    itl_cap_ms = getattr(args, "itl_cap_ms", None)
    if getattr(args, "itl_cap_yield", False) and not itl_cap_ms:
        raise LatencyLabError("--itl-cap-yield needs --itl-cap-ms (the cap that yields)")
    spec = getattr(args, "spec_lookup", None)
    if spec is not None and (spec < 1 or getattr(args, "gen_engine", None) != "packed"):
        raise LatencyLabError("--spec-lookup K needs K >= 1 and --gen-engine packed (drafts verified in its forward)")
    sched = SchedulerConfig(
        max_num_seqs=getattr(args, "max_batch_size", None) or 8, tpot_slo_s=GenServeConfig().tpot_slo_s,
        itl_cap_s=itl_cap_ms / 1e3 if itl_cap_ms else None, itl_cap_yields=getattr(args, "itl_cap_yield", False),
        spec_lookup_k=spec or 0,
    )  # fmt: skip
    over: dict[str, Any] = {"sched": sched}
    for key, attr in (("host", "host"), ("port", "port"), ("token_env", "token_env"), ("threads", "threads"),
                      ("otlp_endpoint", "otlp_endpoint")):  # fmt: skip
        v = getattr(args, attr, None)
        if v is not None:
            over[key] = v
    slo_ms = getattr(args, "slo_ms", None)
    if slo_ms is not None:
        over["ttft_slo_s"] = slo_ms / 1e3
    source = getattr(args, "from_dir", None)
    engine = getattr(args, "gen_engine", None)
    if engine is not None:
        if engine not in GEN_ENGINES:
            raise LatencyLabError(f"--gen-engine {engine!r}: choose from {', '.join(GEN_ENGINES)}")
        over["engine"] = engine
    if engine == "packed" and getattr(args, "prefill_dtype", None) not in (None, "fp32"):
        raise LatencyLabError(PACKED_WITH_BF16)
    if getattr(args, "prefill_dtype", None):
        from latencylab.genserve.prefill import resolve

        # bf16 on a CPU without native BF16, or beside --from, fails before the model loads
        if resolve(args.prefill_dtype) != "fp32" and source:
            raise LatencyLabError(PREFILL_WITH_FROM)
        over["prefill_dtype"] = args.prefill_dtype
    engines = ENGINES
    if source:  # the variant an optimize --workload gen search chose is the top rung (genserve/from_optimize.py)
        from latencylab.genserve.from_optimize import check_ladder, load_gen_plan

        plan = load_gen_plan(source)  # a bad directory fails before the model loads
        over["from_dir"] = str(plan.source)
        over["ladder"] = (plan.candidate,)
        engines = (plan.candidate, *ENGINES[1:])
    ladder = getattr(args, "ladder", None)
    if ladder:
        from latencylab.genserve.ladder import plan_ladder

        over["ladder"] = tuple(x.strip() for x in ladder.split(",") if x.strip())
        if source:
            check_ladder(plan, over["ladder"])
        plan_ladder(over["ladder"], engines, 1)  # a bad ladder fails before the model loads
    return GenServeConfig(**over)


def build_service(cfg: GenServeConfig, lm: Any = None, warmup: bool = True) -> GenService:
    """The service over SmolLM2 (``lm``: a ``LoadedModel``; default: ``load_model()``), warmed up.

    A ladder with an ``int8`` rung gets an INT8 copy of the model (``cfg.int8_method``) as its engine; with
    ``cfg.int8_fidelity`` the score ``python -m latencylab.genserve.int8`` stored for it is shown in the model's
    metadata and ``/v2/models/{m}/guard`` (or how to measure it). With ``cfg.from_dir`` the top rung is the
    variant that ``optimize --workload gen`` search chose, rebuilt from its recipe (genserve/from_optimize.py),
    named by its candidate (a ladder left at its default becomes that one rung); the INT8 standby is still made
    from the FP32 model."""
    import dataclasses

    from latencylab.genserve.engine import TorchEngine
    from latencylab.workloads.gen import context_window
    from latencylab.workloads.gen_decode import eos_ids
    from latencylab.workloads.gen_model import MODEL_NAME, load_model

    if lm is None:
        lm = load_model()
    window = context_window(lm.model)
    cfg = dataclasses.replace(
        cfg, context_window=min(window, cfg.context_window) if window else cfg.context_window,
        aliases=tuple(dict.fromkeys((*cfg.aliases, MODEL_NAME))),
        max_tokens_limit=min(cfg.max_tokens_limit, window),
    )  # fmt: skip
    from latencylab.genserve.ladder import plan_ladder

    plan, top_name = None, "fp32"
    if cfg.from_dir:
        from latencylab.genserve.from_optimize import check_ladder, load_gen_plan, rebuild

        plan = load_gen_plan(cfg.from_dir)
        top_name = plan.candidate
        if cfg.ladder == GenServeConfig().ladder:
            cfg = dataclasses.replace(cfg, ladder=(top_name,))
        check_ladder(plan, cfg.ladder)
    plan_ladder(cfg.ladder, (top_name, *ENGINES[1:]), cfg.cap_tokens)
    from latencylab.genserve.prefill import prefill_model, resolve

    prefill = resolve(cfg.prefill_dtype)
    if prefill != "fp32" and plan is not None:
        raise LatencyLabError(PREFILL_WITH_FROM)
    engines = {top_name: lm.model}
    if plan is not None:
        engines[top_name] = rebuild(plan, lm.model, lm.path.name, tokenizer=lm.tokenizer, threads=cfg.threads)
    if "int8" in cfg.ladder:
        from latencylab.genserve.int8 import quantize_int8

        engines["int8"] = quantize_int8(lm.model, cfg.int8_method)
    top = cfg.ladder[0]
    if cfg.engine not in GEN_ENGINES:
        raise LatencyLabError(f"engine {cfg.engine!r}: choose from {', '.join(GEN_ENGINES)}")
    if cfg.engine == "packed" and prefill != "fp32":
        raise LatencyLabError(PACKED_WITH_BF16)

    def make(model: Any, prefill: str = "fp32") -> Any:
        if hasattr(model, "mixed"):  # already an engine (an ort-* choice: genserve/ort_engine.py)
            return model
        if cfg.engine == "packed":  # a step's chunks and decode batch in one forward (genserve/packed.py)
            from latencylab.genserve.packed import PackedEngine

            return PackedEngine(model)
        return TorchEngine(model, prefill_model=prefill_model(model, prefill))

    standby = {name: make(m) for name, m in engines.items() if name != top and name in cfg.ladder}
    if top != "fp32" and prefill != "fp32":  # the prefill copy is of the FP32 model, not of a quantised rung
        log.warning("--prefill-dtype %s: not applied, the top rung is %s (it keeps its own forward)", prefill, top)
        prefill = "fp32"
    main = make(engines[top], prefill)
    codec = HfCodec(lm.tokenizer)
    if cfg.prefix_cache:  # the chat template's fixed prefix, prefilled once per model rung (genserve/prefix.py)
        from latencylab.genserve.prefix import chat_prefix

        prefix = chat_prefix(codec.encode_chat)
        for engine in (main, *standby.values()):
            engine.set_prefix(prefix)
        log.info(
            "prefix cache: %d tokens of the chat template prefilled once per model rung%s", len(prefix),
            " (not the ONNX Runtime rung: it prefills every prompt whole)" if hasattr(main, "drafts_itself") else "",
        )  # fmt: skip
    svc = GenService(cfg, codec, main, eos_ids(lm.tokenizer, lm.model), standby=standby)
    svc.info[top_name] = {"description": "the FP32 model"}
    if plan is not None:  # what the search measured of it: GET /v1/models, the metadata, the guard's ladder
        svc.served = plan.describe()
        svc.info[top_name] = {
            "description": f"{plan.candidate}, chosen by optimize --workload gen ({plan.source})",
            **{k: svc.served[k] for k in ("candidate", "tpot_p50_ms", "speedup_tpot", "fidelity", "measured_threads")},
        }
    if prefill != "fp32":
        svc.info[top_name]["prefill"] = f"{prefill} (the prompt's forward; decode in FP32: genserve/prefill.py)"
        log.info("prefill in %s (requested %s); decode in FP32", prefill, cfg.prefill_dtype)
    if "int8" in engines:
        svc.info["int8"] = {"description": f"INT8 copy of every nn.Linear ({cfg.int8_method}: genserve/int8.py)"}
        if cfg.int8_fidelity:
            from latencylab.genserve.int8 import stored_fidelity

            got = stored_fidelity(lm.path.name, cfg.int8_method)
            svc.info["int8"]["fidelity"] = (
                got.to_dict()
                if got is not None
                else f"not measured: python -m latencylab.genserve.int8 --method {cfg.int8_method}"
            )
    if warmup:
        svc.warmup()
    return svc


def uvicorn_config(app: Any) -> Any:
    import uvicorn

    from latencylab.serve.limits import HttpLimits, guarded_protocol

    limits = HttpLimits()
    return uvicorn.Config(
        app, log_level="warning", access_log=False, loop="uvloop", http=guarded_protocol(limits),
        timeout_keep_alive=limits.keep_alive_s, timeout_graceful_shutdown=30, lifespan="on",
    )  # fmt: skip


def token_of(cfg: GenServeConfig) -> str | None:
    if not cfg.token_env:
        return None
    token = os.environ.get(cfg.token_env)
    if not token:
        raise LatencyLabError(f"--token-env {cfg.token_env!r}: the variable is empty")
    return token


def tracer_provider_of(cfg: GenServeConfig) -> Any:
    if not cfg.otlp_endpoint:
        return None
    from latencylab.serve.tracing import make_tracer_provider

    return make_tracer_provider(cfg.otlp_endpoint, service_name="latencylab-genserve")


@contextmanager
def serve_in_thread(svc: GenService, token: str | None = None, tracer_provider: Any = None) -> Iterator[str]:
    """Serve ``svc`` on 127.0.0.1 (any free port) in a thread; yields its base URL."""
    import uvicorn

    from latencylab.genserve.app import lifespan_gen_app
    from latencylab.serve.app import bind

    server = uvicorn.Server(uvicorn_config(lifespan_gen_app(svc, token, tracer_provider)))
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    give_up = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < give_up:
        time.sleep(0.01)
    if not server.started:
        raise RuntimeError("the generative server did not start")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


def run_gen_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from latencylab.genserve.app import lifespan_gen_app
    from latencylab.serve.app import bind

    cfg = config_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sys.setswitchinterval(0.001)
    threads, served = cfg.threads, ""
    if cfg.from_dir:  # which variant, what it measured, before the seconds of loading and rebuilding
        from latencylab.genserve.from_optimize import load_gen_plan

        plan = load_gen_plan(cfg.from_dir)
        served = plan.line()
        log.info("%s", served)
        if threads is None:
            threads = plan.threads
        elif threads != plan.threads:
            log.warning("--threads %d: the search measured %s at %d thread(s)", threads, plan.candidate, plan.threads)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    token = token_of(cfg)
    svc = build_service(cfg)
    sock = bind(cfg.host, cfg.port)
    server = uvicorn.Server(uvicorn_config(lifespan_gen_app(svc, token, tracer_provider_of(svc.cfg))))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            s = svc.cfg.sched
            print(f"listening http://{cfg.host}:{sock.getsockname()[1]}", flush=True)
            print(
                f"  model {svc.cfg.model_name} ({', '.join(svc.cfg.aliases)}): continuous batching, max_num_seqs "
                f"{s.max_num_seqs}, prefill chunk {s.prefill_chunk_tokens} tokens, KV budget {s.kv_budget_tokens} "
                f"tokens, TTFT SLO {svc.cfg.ttft_slo_s:g} s"
                + (
                    f", steps with streams capped at {s.itl_cap_s * 1e3:g} ms (ITL"
                    + (", yields to TTFT deadlines)" if s.itl_cap_yields else ")")
                    if s.itl_cap_s
                    else ""
                )
                + f", {getattr(svc.engine, 'label', f'{svc.cfg.engine} engine')}"
                + (
                    f", speculative decoding (prompt lookup, k <= {s.spec_lookup_k}, steps of <= {s.spec_max_batch})"
                    if s.spec_lookup_k
                    else ""
                ),
                flush=True,
            )
            if served:
                print(f"  {served}", flush=True)
            if svc.guard is not None:
                print(
                    f"  SLO guard: ladder {' -> '.join(r.name for r in svc.rungs)}, TTFT p99 <= "
                    f"{svc.cfg.ttft_slo_s:g} s, TPOT p99 <= {svc.cfg.tpot_slo_s * 1e3:g} ms",
                    flush=True,
                )
        await task

    asyncio.run(serve())
    print("server stopped", file=sys.stderr)
    return 0
