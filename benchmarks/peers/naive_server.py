"""The naive peer: an Open Inference Protocol endpoint where one request is one forward, as a user writes it.

What a typical FastAPI ``def`` endpoint does, on Starlette (FastAPI's core, already in the project venv):
the body is read and parsed on the event loop, the model call runs in Starlette's thread pool (anyio's
default: up to 40 threads), so concurrent requests run concurrent forwards, each with torch's 2 intra-op
threads; nothing is batched or queued by the server. One uvicorn process, access log off.

    python benchmarks/peers/naive_server.py --port 8001 [--threads 2]

Routes: GET /v2/health/live, /v2/health/ready, /v2/models/text (metadata), POST /v2/models/text/infer
(input ``TEXT`` BYTES [n] -> output ``EMBEDDING`` FP32 [n, 384]), GET /stats (the Embedder's counters,
for the benchmark's where-does-time-go table).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent))
from minilm_embed import HIDDEN, Embedder, texts_of

MODEL = "text"


def build_app(embedder: Embedder) -> Starlette:
    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def metadata(request: Request) -> Response:
        return JSONResponse(
            {
                "name": MODEL,
                "versions": ["fp32"],
                "platform": "naive-starlette",
                "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, HIDDEN]}],
            }
        )

    async def infer(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
            inp = next(i for i in body["inputs"] if i["name"] == "TEXT")
            texts = texts_of(inp["data"])
        except (ValueError, KeyError, TypeError, StopIteration) as exc:
            return JSONResponse({"error": f"bad request: {exc!r}"}, status_code=400)
        emb = await run_in_threadpool(embedder.embed, texts)  # = a FastAPI `def` endpoint
        out: dict[str, Any] = {
            "model_name": MODEL,
            "model_version": "fp32",
            "outputs": [
                {"name": "EMBEDDING", "datatype": "FP32", "shape": list(emb.shape), "data": emb.ravel().tolist()}
            ],
        }
        if "id" in body:
            out["id"] = body["id"]
        return JSONResponse(out)

    async def stats(request: Request) -> Response:
        return JSONResponse(embedder.stats())

    return Starlette(
        routes=[
            Route("/v2/health/live", live),
            Route("/v2/health/ready", live),
            Route(f"/v2/models/{MODEL}", metadata),
            Route(f"/v2/models/{MODEL}/ready", live),
            Route(f"/v2/models/{MODEL}/infer", infer, methods=["POST"]),
            Route("/stats", stats),
        ]
    )


def main() -> int:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = ap.parse_args()
    embedder = Embedder(args.threads)
    embedder.warmup()
    uvicorn.run(build_app(embedder), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
