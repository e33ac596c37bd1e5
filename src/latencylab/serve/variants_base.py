"""What every built-in variant shares: argument checks, reading a BYTES input, splitting a batch's rows.

The text (serve/variants_text.py) and vision (serve/variants_vision.py) variants and the ONNX Runtime ones
built on them (serve/ort_text.py, serve/ort_vision.py) check their arguments and read their requests the same
way; the registry that builds them is serve/variants.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, require
from latencylab.serve.types import InferRequest, ProtocolError, Tensor

__all__ = [
    "KINDS",
    "bytes_elements",
    "bytes_tensor",
    "check_kind",
    "check_max_batch_size",
    "check_warmup_sizes",
    "split_counts",
    "torch_module",
]

KINDS = ("primary", "lighter", "quantized")


def torch_module() -> Any:
    """torch, imported now (a one-line install hint if it is missing)."""
    return require("torch", "torch")


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise LatencyLabError(f"variant kind must be one of {', '.join(KINDS)}, got {kind!r}")


def check_max_batch_size(max_batch_size: int) -> int:
    if max_batch_size < 1:
        raise LatencyLabError(f"max_batch_size must be >= 1, got {max_batch_size}")
    return int(max_batch_size)


def bytes_elements(request: InferRequest, name: str, max_rows: int) -> list[Any]:
    """The elements of the 1-D BYTES input ``name``: 1 to ``max_rows`` of them, or a 400."""
    t = request.input(name)
    if t.datatype != "BYTES":
        raise ProtocolError(f"input {name!r} must have datatype BYTES, got {t.datatype}")
    if len(t.shape) != 1:
        raise ProtocolError(f"input {name!r} must be 1-D (shape [-1]), got shape {list(t.shape)}")
    data = np.asarray(t.data, dtype=object).reshape(-1)
    if data.size != t.shape[0]:
        raise ProtocolError(f"input {name!r} declares shape {list(t.shape)} but holds {data.size} element(s)")
    if data.size == 0:
        raise ProtocolError(f"input {name!r} is empty: send at least one element")
    if data.size > max_rows:
        raise ProtocolError(f"input {name!r} has {data.size} elements; this model takes at most {max_rows} per request")
    return list(data)


def split_counts(counts: Sequence[int], n: int) -> list[tuple[int, int]]:
    """The (start, stop) rows of each of the ``n`` requests of a batch, from how many rows each one owns."""
    if len(counts) != n:
        raise LatencyLabError(f"postprocess: the batch holds {len(counts)} request(s), not {n}")
    spans, start = [], 0
    for k in counts:
        spans.append((start, start + k))
        start += k
    return spans


def check_warmup_sizes(batch_sizes: Sequence[int], max_batch_size: int) -> list[int]:
    sizes = [int(b) for b in batch_sizes]
    bad = [b for b in sizes if not 1 <= b <= max_batch_size]
    if bad:
        raise LatencyLabError(f"warmup batch sizes must be in [1, {max_batch_size}], got {bad}")
    return sizes


def bytes_tensor(name: str, values: Sequence[bytes]) -> Tensor:
    """A 1-D BYTES tensor of ``values`` (the synthetic requests of warm-up)."""
    data = np.empty(len(values), dtype=object)
    data[:] = list(values)
    return Tensor(name, "BYTES", (len(values),), data)
