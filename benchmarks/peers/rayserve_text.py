"""Ray Serve peer for benchmarks/serve_vs_peers.py: all-MiniLM-L6-v2 FP32 embeddings behind ``@serve.batch``.

Runs in its own venv (benchmarks/.venvs/rayserve, made by benchmarks/peers/rayserve_setup.sh):

    benchmarks/.venvs/rayserve/bin/python benchmarks/peers/rayserve_text.py --port 8003 [--threads 2]

Starts a local Ray (2 CPUs, no dashboard), Serve's HTTP proxy on 127.0.0.1:PORT and ONE replica of an
Open Inference Protocol deployment at route prefix /v2/models/text: POST .../infer takes ``TEXT`` BYTES [1]
and answers ``EMBEDDING`` FP32 [1, 384]; the single texts are gathered by ``@serve.batch``
(``max_batch_size`` 8, ``batch_wait_timeout_s`` 5 ms, the same limits MLServer and latencylab get) and
embedded in one padded forward (benchmarks/peers/minilm_embed.py). ``max_ongoing_requests`` is 16 (Ray's
default, 5, would cap every batch at 5); requests beyond it wait in Serve's router. GET .../stats returns
the Embedder's counters. Access logs are off. Prints ``ready`` once the deployment answers, then serves
until SIGTERM/SIGINT, and shuts Serve and Ray down.

A request crosses two processes: the proxy actor (HTTP parsing, routing) and the replica actor (the
handler and the model), plus Ray's own daemons (GCS, raylet), all on the same 2 cores.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

PEERS = str(Path(__file__).resolve().parent)
MODEL = "text"


def build_app(threads: int, max_batch_size: int, batch_wait_s: float, max_ongoing: int) -> Any:
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    # the replica runs the ONNX export too when the benchmark asks for it (env vars reach Ray workers only so)
    @serve.deployment(
        name="text",
        num_replicas=1,
        max_ongoing_requests=max_ongoing,
        ray_actor_options={
            "num_cpus": 1,
            "runtime_env": {"env_vars": {"MINILM_ONNX": os.environ.get("MINILM_ONNX", "")}},
        },
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )
    class TextEmbedding:
        def __init__(self) -> None:
            sys.path.insert(0, PEERS)
            from minilm_embed import HIDDEN, Embedder

            self.hidden = HIDDEN
            self.embedder = Embedder(threads)
            self.embedder.warmup()

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_s)
        async def embed(self, texts: list[str]) -> list[Any]:
            return list(self.embedder.embed(texts))

        async def __call__(self, request: Request) -> Any:
            path = request.url.path.rstrip("/")
            if request.method == "GET":
                if path.endswith("/stats"):
                    return JSONResponse(self.embedder.stats())
                if path.endswith("/ready"):
                    return JSONResponse({"ready": True})
                return JSONResponse(
                    {
                        "name": MODEL,
                        "versions": ["fp32"],
                        "platform": "rayserve-minilm",
                        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1]}],
                        "outputs": [{"name": "EMBEDDING", "datatype": "FP32", "shape": [1, self.hidden]}],
                    }
                )
            from minilm_embed import texts_of

            try:
                body = await request.json()
                inp = next(i for i in body["inputs"] if i["name"] == "TEXT")
                texts = texts_of(inp["data"])
            except (ValueError, KeyError, TypeError, StopIteration) as exc:
                return JSONResponse({"error": f"bad request: {exc!r}"}, status_code=400)
            if len(texts) != 1:
                return JSONResponse({"error": "one text per request (shape [1])"}, status_code=400)
            emb = await self.embed(texts[0])
            out = {
                "model_name": MODEL,
                "model_version": "fp32",
                "outputs": [
                    {"name": "EMBEDDING", "datatype": "FP32", "shape": [1, int(emb.shape[0])], "data": emb.tolist()}
                ],
            }
            if "id" in body:
                out["id"] = body["id"]
            return JSONResponse(out)

    return TextEmbedding.bind()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8003)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads of the replica")
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--batch-wait-ms", type=float, default=5.0)
    ap.add_argument("--max-ongoing", type=int, default=16, help="max_ongoing_requests of the replica")
    args = ap.parse_args()

    import ray
    from ray import serve

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning")
    try:
        serve.start(
            http_options={"host": "127.0.0.1", "port": args.port},
            logging_config={"enable_access_log": False, "log_level": "WARNING"},
        )
        app = build_app(args.threads, args.max_batch_size, args.batch_wait_ms / 1e3, args.max_ongoing)
        serve.run(app, name=MODEL, route_prefix=f"/v2/models/{MODEL}")
        print("ready", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
