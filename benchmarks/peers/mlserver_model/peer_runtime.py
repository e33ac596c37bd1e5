"""A tiny MLServer runtime for driving MLServer as an independent Open Inference Protocol peer.

Runs inside MLServer's own venv (benchmarks/.venvs/mlserver), never the project's, so it imports only
what MLServer brings (mlserver, numpy). One class serves both models of this repository:

* ``sleepy``: holds each request for a known service time, ``parameters.extra.service_ms`` in its
  model-settings.json (default 2 ms), with ``asyncio.sleep`` so that concurrent requests overlap in
  MLServer's single event loop the way an I/O-bound or offloaded backend would; a load test therefore
  sees queueing only from MLServer itself, not from a busy CPU.
* ``echo``: the same with ``service_ms`` 0 (no sleep at all): MLServer's own per-request overhead.

Input ``INPUT0`` is FP32 (any shape) or BYTES. Output ``OUTPUT0`` is the FP32 input echoed back with
its shape, or for BYTES the INT64 length in UTF-8 bytes of each element (same shape).
"""

from __future__ import annotations

import asyncio

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse, RequestInput, ResponseOutput

DEFAULT_SERVICE_MS = 2.0
INPUT_NAME = "INPUT0"
OUTPUT_NAME = "OUTPUT0"


def _compute(inp: RequestInput) -> np.ndarray:
    """OUTPUT0 for INPUT0: FP32 echoed with its shape; BYTES -> INT64 UTF-8 length of each element."""
    if inp.datatype == "FP32":
        return NumpyCodec.decode_input(inp).astype(np.float32, copy=False)
    if inp.datatype == "BYTES":
        # Raw data, not NumpyCodec: that makes JSON strings a numpy str array (characters, not bytes).
        data = getattr(inp.data, "root", inp.data)
        values = np.array(data, dtype=object).ravel()
        lengths = [len(v.encode() if isinstance(v, str) else v) for v in values]
        return np.array(lengths, dtype=np.int64).reshape(inp.shape)
    raise InferenceError(f"{INPUT_NAME} must be FP32 or BYTES, got {inp.datatype}")


class SleepyModel(MLModel):
    async def load(self) -> bool:
        extra = (self.settings.parameters.extra if self.settings.parameters else None) or {}
        service_ms = float(extra.get("service_ms", DEFAULT_SERVICE_MS))
        if service_ms < 0:
            raise ValueError(f"{self.name}: service_ms must be >= 0, got {service_ms}")
        self._service_s = service_ms / 1e3
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        by_name = {inp.name: inp for inp in payload.inputs}
        if INPUT_NAME not in by_name:
            raise InferenceError(f"{self.name}: expected an input named {INPUT_NAME!r}, got {sorted(by_name)}")
        inp = by_name[INPUT_NAME]
        try:
            out = _compute(inp)
        except ValueError as e:  # data that does not fit its declared shape
            raise InferenceError(f"{self.name}: bad {INPUT_NAME}: {e}") from e

        if self._service_s > 0:
            await asyncio.sleep(self._service_s)

        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            # Not NumpyCodec.encode_output: it reshapes a 1-D tensor [n] to [n, 1]; OIP keeps the shape.
            outputs=[
                ResponseOutput(
                    name=OUTPUT_NAME,
                    datatype="FP32" if out.dtype == np.float32 else "INT64",
                    shape=list(out.shape),
                    data=out.ravel().tolist(),
                )
            ],
        )
