"""A naive Open Inference Protocol endpoint: one forward per request, no batching, no admission control.

The baseline of benchmarks/serve_overload.py: what a first "wrap the model in Starlette" server does.
Every request is accepted and waits its turn in an unbounded FIFO (the one model thread's executor
queue); nothing is ever refused, so under overload the queue, and the latency, grow for as long as the
overload lasts. It runs the very same variant objects as ``latencylab serve`` (built-in ``text`` or
``vision`` model, ``fp32`` rung) and the same OIP JSON codec, so the only differences from latencylab
are the ones under test: no batching, no deadline-aware admission, no ladder.

    .venv/bin/python benchmarks/serve_naive.py --model vision --port 0 --threads 1
    # prints "listening http://127.0.0.1:PORT"; POST /v2/models/vision/infer; SIGTERM stops it
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def build_app(model: str, threads: int) -> Any:
    import torch
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from latencylab.serve.protocol_request import parse_infer_request
    from latencylab.serve.protocol_response import encode_infer_response, error_body
    from latencylab.serve.types import InferResponse, ProtocolError
    from latencylab.serve.variants import build_variants

    torch.set_num_threads(threads)
    (variant,) = build_variants(model, ["fp32"], max_batch_size=1)
    variant.warmup([1])
    worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="model")  # unbounded FIFO in front
    served = {"n": 0, "compute_s": 0.0}

    def run_one(req: Any) -> bytes:
        t0 = time.perf_counter()
        item = variant.preprocess(req)
        (outputs,) = variant.postprocess(variant.forward([item]), 1)
        served["n"] += 1
        served["compute_s"] += time.perf_counter() - t0
        return encode_infer_response(InferResponse(model, "fp32", outputs, req.id), req.outputs)

    async def infer(request: Request) -> Response:
        if request.path_params["model"] != model:
            return Response(error_body("unknown model"), 404, media_type="application/json")
        try:
            req = parse_infer_request(await request.body(), model, None, variant.inputs)
            body = await asyncio.get_running_loop().run_in_executor(worker, run_one, req)
        except ProtocolError as exc:
            return Response(error_body(str(exc)), exc.status, media_type="application/json")
        return Response(body, media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response(b'{"ready":true}', media_type="application/json")

    async def stats(request: Request) -> Response:
        return Response(json.dumps(served), media_type="application/json")

    return Starlette(
        routes=[
            Route("/v2/models/{model}/infer", infer, methods=["POST"]),
            Route("/v2/health/ready", ready),
            Route("/debug/stats", stats),
        ]
    )


def main() -> None:
    import uvicorn

    from latencylab.serve.app import bind

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["text", "vision"], default="vision")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    app = build_app(args.model, args.threads)
    sock = bind(args.host, args.port)  # same socket options as latencylab serve (TCP_NODELAY, backlog 2048)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, loop="uvloop", http="httptools", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        print(f"listening http://{args.host}:{sock.getsockname()[1]}", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
