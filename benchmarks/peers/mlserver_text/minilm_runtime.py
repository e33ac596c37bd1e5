"""MLServer runtime for benchmarks/serve_vs_peers.py: all-MiniLM-L6-v2 FP32 embeddings with adaptive batching.

Runs inside the peer's own venv (benchmarks/.venvs/mlserver-text, made by
benchmarks/peers/mlserver_text_setup.sh). Models of this repository (benchmarks/peers/mlserver_text/):

* ``text``: input ``TEXT`` BYTES [n] -> output ``EMBEDDING`` FP32 [n, 384]. MLServer's adaptive batcher
  (``max_batch_size`` 8, ``max_batch_time`` 5 ms in text/model-settings.json) merges single-text requests
  into one ``predict`` call, which embeds them in one padded forward (benchmarks/peers/minilm_embed.py) and
  MLServer splits the [n, 384] answer back per request. ``parameters.extra``: ``threads`` (torch intra-op
  threads, 2), ``offload`` (false: the forward runs on the event loop, as MLServer's own runtimes and
  most custom ones do; true, or MINILM_OFFLOAD=1 in the environment: on one dedicated thread, so HTTP
  parsing overlaps the forward).
* ``stats``: diagnostics, not benchmarked: any request returns the ``text`` model's Embedder counters as
  one JSON string (MLServer has no custom routes; MLServer imports this module once per model, so the
  Embedder is found through minilm_embed.REGISTRY).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import sys
from pathlib import Path
from typing import Any

from mlserver import MLModel
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/peers: the shared artifact
from minilm_embed import REGISTRY, Embedder, texts_of


class MiniLMModel(MLModel):
    async def load(self) -> bool:
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        self._embedder = Embedder(int(extra.get("threads", 2)))
        self._embedder.warmup()
        offload = bool(extra.get("offload")) or os.environ.get("MINILM_OFFLOAD") == "1"
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="forward") if offload else None
        REGISTRY[self.name] = self._embedder
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        by_name = {inp.name: inp for inp in payload.inputs}
        if "TEXT" not in by_name:
            raise InferenceError(f"{self.name}: expected an input named 'TEXT', got {sorted(by_name)}")
        # Raw data, not a codec: StringCodec would work too, but this is the cheapest path for JSON strings.
        data: Any = by_name["TEXT"].data
        texts = texts_of(getattr(data, "root", data))
        if self._executor is None:
            emb = self._embedder.embed(texts)
        else:
            emb = await asyncio.get_running_loop().run_in_executor(self._executor, self._embedder.embed, texts)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            outputs=[
                ResponseOutput(name="EMBEDDING", datatype="FP32", shape=list(emb.shape), data=emb.ravel().tolist())
            ],
        )


class StatsModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        stats = {name: e.stats() for name, e in REGISTRY.items()}
        return InferenceResponse(
            model_name=self.name,
            outputs=[ResponseOutput(name="STATS", datatype="BYTES", shape=[1], data=[json.dumps(stats)])],
        )
