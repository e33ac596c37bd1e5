"""Request payloads for Open Inference Protocol targets, drawn from real workload inputs.

``payloads_for_model`` reads the model's OIP metadata and builds one request
per payload: BYTES inputs get texts from the text workload's corpus (real
sentences with varied lengths, so shape variance is realistic), numeric inputs
get seeded random tensors of the declared shape (variable dims -> 1, or the
``dims`` override).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.load.generator import Payload
from latencylab.load.http import request_once

_NUMPY = {
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "BOOL": np.bool_,
}  # fmt: skip


def infer_path(model: str, version: str | None = None) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"


def fetch_metadata(url: str, model: str, version: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """GET the model's OIP metadata; one-line errors for an unreachable target or unknown model."""
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    try:
        status, body = asyncio.run(request_once(url, "GET", path, timeout_s=timeout_s))
    except (ConnectionError, OSError, TimeoutError) as exc:
        raise LatencyLabError(f"cannot reach {url}: {exc}") from exc
    if status == 404:
        raise LatencyLabError(f"the server at {url} does not know model {model!r} (404 on {path})")
    if status != 200:
        raise LatencyLabError(f"model metadata {url}{path} answered HTTP {status}")
    try:
        meta = json.loads(body)
    except ValueError as exc:
        raise LatencyLabError(f"model metadata from {url}{path} is not JSON") from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("inputs"), list) or not meta["inputs"]:
        raise LatencyLabError(f"model metadata from {url}{path} declares no inputs")
    return meta


def _corpus() -> tuple[str, ...]:
    from latencylab.workloads.text import corpus

    return corpus()


def _shape(decl: Sequence[int], name: str, dims: Mapping[str, Sequence[int]]) -> list[int]:
    if name in dims:
        return list(dims[name])
    return [d if d > 0 else 1 for d in decl]


def payloads_for_model(
    meta: Mapping[str, Any], n: int = 64, seed: int = 0, dims: Mapping[str, Sequence[int]] | None = None
) -> list[Payload]:
    """``n`` request bodies matching the model's declared inputs."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    texts = None
    out = []
    for i in range(n):
        inputs = []
        label = ""
        for inp in meta["inputs"]:
            name, dtype = str(inp["name"]), str(inp["datatype"]).upper()
            shape = _shape([int(d) for d in inp.get("shape", [1])], name, dims)
            count = int(np.prod(shape)) if shape else 1
            if dtype == "BYTES":
                texts = texts or _corpus()
                data: list[Any] = [texts[(i * count + j) % len(texts)] for j in range(count)]
                label = f"text[{(i * count) % len(texts)}]"
            elif dtype in _NUMPY:
                np_type = _NUMPY[dtype]
                arr: np.ndarray
                if np.issubdtype(np_type, np.floating):
                    arr = rng.standard_normal(count).astype(np_type)
                elif np_type is np.bool_:
                    arr = rng.integers(0, 2, count).astype(bool)
                else:
                    arr = rng.integers(0, 100, count).astype(np_type)
                data = arr.tolist()
            else:
                raise LatencyLabError(f"input {name!r}: unsupported datatype {dtype}")
            inputs.append({"name": name, "datatype": dtype, "shape": shape, "data": data})
        out.append(Payload(json.dumps({"inputs": inputs}).encode(), label))
    return out


def text_payloads(input_name: str = "TEXT", n: int | None = None) -> list[Payload]:
    """One BYTES request per corpus text (the text workload's real inputs)."""
    texts = _corpus()
    k = len(texts) if n is None else n
    return [
        Payload(
            json.dumps({"inputs": [{"name": input_name, "datatype": "BYTES", "shape": [1], "data": [t]}]}).encode(),
            f"text[{i % len(texts)}]",
        )
        for i, t in zip(range(k), (texts[j % len(texts)] for j in range(k)), strict=True)
    ]


def vision_payloads(input_name: str = "IMAGE", n: int | None = None) -> list[Payload]:
    """One request per held-out JPEG of the vision workload (base64 in a BYTES tensor)."""
    import base64

    from latencylab.workloads.vision import heldout_set

    jpegs = heldout_set().jpegs
    k = len(jpegs) if n is None else min(n, len(jpegs))
    return [
        Payload(
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": input_name,
                            "datatype": "BYTES",
                            "shape": [1],
                            "data": [base64.b64encode(jpegs[i]).decode("ascii")],
                        }
                    ]
                }
            ).encode(),
            f"jpeg[{i}]",
        )
        for i in range(k)
    ]


def builtin_payloads(meta: Mapping[str, Any]) -> list[Payload] | None:
    """Real inputs for latencylab's own built-in models (text corpus, held-out JPEGs), else None."""
    if meta.get("platform") != "latencylab":
        return None
    name = str(meta["inputs"][0]["name"])
    if meta.get("name") == "text":
        return text_payloads(name)
    if meta.get("name") == "vision":
        return vision_payloads(name)
    return None
