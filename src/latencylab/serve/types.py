"""Values and protocols shared by the server's parts (protocol codec, variants, batcher, guard, cache)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from latencylab.errors import LatencyLabError

# OIP datatypes and their numpy equivalents (BYTES: numpy object arrays of ``bytes``).
DATATYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BYTES": np.object_,
}  # fmt: skip


class ProtocolError(LatencyLabError):
    """A request the server must refuse: becomes ``{"error": message}`` with ``status``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A declared input or output: -1 in ``shape`` is a variable dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class Tensor:
    """A named, typed, shaped tensor; ``data`` is a numpy array of ``shape`` (object array of bytes for BYTES)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True, slots=True)
class InferRequest:
    model: str
    version: str | None
    inputs: tuple[Tensor, ...]
    id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    outputs: tuple[str, ...] | None = None  # names the client asked for (None: all)

    def input(self, name: str) -> Tensor:
        for t in self.inputs:
            if t.name == name:
                return t
        raise ProtocolError(f"missing input {name!r}")


@dataclass(frozen=True, slots=True)
class InferResponse:
    model: str
    version: str
    outputs: tuple[Tensor, ...]
    id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Variant(Protocol):
    """One servable form of a model (a rung of the fallback ladder).

    The server calls ``preprocess`` once per request and ``forward`` +
    ``postprocess`` once per batch, each in a worker thread, and times each
    call as a stage. ``preprocess`` raises ProtocolError(400) for content it
    cannot use (wrong shape, undecodable image...).
    """

    name: str  # e.g. "fp32", "trunc64", "int8"
    kind: str  # "primary" | "lighter" | "quantized"
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int

    def preprocess(self, request: InferRequest) -> Any: ...

    def forward(self, items: Sequence[Any]) -> Any: ...

    def postprocess(self, raw: Any, n: int) -> list[tuple[Tensor, ...]]: ...

    def warmup(self, batch_sizes: Sequence[int]) -> None: ...
