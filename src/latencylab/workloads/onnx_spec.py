"""The user-model workload's vocabulary: its params (``threads``, ``opt_level``, ``provider``, ``dim``),
what ONNX Runtime says of an input (:class:`InputSpec`), the dtypes and the limits on generated inputs.
The workload itself is :mod:`latencylab.workloads.onnx_model`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError

OPT_LEVELS: dict[str, str] = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
PROVIDERS: dict[str, str] = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
KNOWN_PARAMS = ("threads", "opt_level", "provider", "dim.<name>", "dim")

DEFAULT_DIM = 16
POOL_SIZE = 32
# Generated feeds are kept in memory; a large model at a large batch would
# otherwise hold 32 copies of a big input.
POOL_BYTES = 256 * 1024 * 1024
INT_HIGH = 100  # generated integer inputs are drawn from 0..INT_HIGH-1

ORT_DTYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
}

Dim = int | str | None  # as ONNX Runtime reports it: size, symbolic name, or unknown
Feed = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class OnnxParams:
    """The workload's parsed ``key=value`` params."""

    threads: int = 0
    opt_level: str = "all"
    provider: str | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    default_dim: int = DEFAULT_DIM  # symbolic dims not named in ``dims``
    default_dim_set: bool = False  # given as ``dim=N`` (else the built-in guess)

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> OnnxParams:
        threads = 0
        opt_level = "all"
        provider: str | None = None
        dims: dict[str, int] = {}
        default_dim: int | None = None
        for key, raw in params.items():
            value = str(raw).strip()
            if key == "threads":
                threads = parse_int(key, value, minimum=0)
            elif key == "opt_level":
                if value not in OPT_LEVELS:
                    raise LatencyLabError(f"opt_level={value!r} is not one of {', '.join(OPT_LEVELS)}")
                opt_level = value
            elif key == "provider":
                if value not in PROVIDERS:
                    raise LatencyLabError(f"provider={value!r} is not one of {', '.join(PROVIDERS)}")
                provider = value
            elif key.startswith("dim.") and len(key) > 4:
                dims[key[4:]] = parse_int(key, value, minimum=1)
            elif key == "dim":
                default_dim = parse_int(key, value, minimum=1)
            else:
                raise LatencyLabError(f"unknown onnx workload param {key!r}; known: {', '.join(KNOWN_PARAMS)}")
        return cls(
            threads=threads,
            opt_level=opt_level,
            provider=provider,
            dims=dims,
            default_dim=DEFAULT_DIM if default_dim is None else default_dim,
            default_dim_set=default_dim is not None,
        )


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One model input as declared: name, dims (size, symbolic name or None) and type."""

    name: str
    dims: tuple[Dim, ...]
    type: str

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def dtype(self) -> np.dtype[Any]:
        if self.type not in ORT_DTYPES:
            raise LatencyLabError(f"model input {self.name!r} has type {self.type}, which latencylab cannot feed")
        return ORT_DTYPES[self.type]

    @property
    def batched(self) -> bool:
        """Whether axis 0 is a batch axis (declared symbolic or unknown)."""
        return self.rank > 0 and not is_static(self.dims[0])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.dims), "dtype": self.type}


# ---------------------------------------------------------------- helpers


def is_static(d: Dim) -> bool:
    return isinstance(d, int)


def parse_int(key: str, value: str, minimum: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise LatencyLabError(f"{key}={value!r} is not an integer") from None
    if n < minimum:
        raise LatencyLabError(f"{key}={n} must be >= {minimum}")
    return n


def one_line(exc: BaseException) -> str:
    """ORT messages carry a ``[ONNXRuntimeError] : 7 : INVALID_PROTOBUF :`` prefix and newlines."""
    text = str(exc).strip() or type(exc).__name__
    if text.startswith("[ONNXRuntimeError]"):
        parts = text.split(" : ", 3)
        text = parts[-1] if len(parts) == 4 else text
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
