"""The user-model workload: ``--model path.onnx`` run by ONNX Runtime.

``build(opts)`` opens an ``InferenceSession`` and returns a one-stage pipeline
(``forward``: ``session.run(None, feed)``). Inputs come from an ``.npz`` file
whose array names match the model's input names, or are generated from the
model's declared shapes and dtypes.

Workload params (``opts.params``, all strings):

``threads=N``
    ONNX Runtime intra-op threads (0 = its default, one per physical core).
``opt_level=disable|basic|extended|all``
    Graph optimisation level (default ``all``, ONNX Runtime's own default).
``provider=cpu|cuda``
    Execution provider (default: from ``opts.device``).
``dim.<name>=N``
    Size of the symbolic dimension ``<name>`` for generated inputs; an unnamed
    dimension is addressed as ``dim.<input>.<axis>``.

Batch axis: the first axis of an input is its batch axis when the model
declares it symbolic or unknown; it is set to ``opts.batch_size``. Inputs
whose first axis is fixed keep the model's size.

``.npz`` layout: each array has the model input's rank and its first axis
indexes samples; ``source(i)`` stacks samples ``i*B .. i*B+B-1`` (modulo the
sample count) into a batch of ``B``. An array that already has the exact input
shape is therefore used as-is, one sample per batch.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.pipeline import Pipeline
from latencylab.workloads import WorkloadOptions

OPT_LEVELS: dict[str, str] = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
PROVIDERS: dict[str, str] = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
KNOWN_PARAMS = ("threads", "opt_level", "provider", "dim.<name>")

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

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> OnnxParams:
        threads = 0
        opt_level = "all"
        provider: str | None = None
        dims: dict[str, int] = {}
        for key, raw in params.items():
            value = str(raw).strip()
            if key == "threads":
                threads = _parse_int(key, value, minimum=0)
            elif key == "opt_level":
                if value not in OPT_LEVELS:
                    raise LatencyLabError(f"opt_level={value!r} is not one of {', '.join(OPT_LEVELS)}")
                opt_level = value
            elif key == "provider":
                if value not in PROVIDERS:
                    raise LatencyLabError(f"provider={value!r} is not one of {', '.join(PROVIDERS)}")
                provider = value
            elif key.startswith("dim.") and len(key) > 4:
                dims[key[4:]] = _parse_int(key, value, minimum=1)
            else:
                raise LatencyLabError(f"unknown onnx workload param {key!r}; known: {', '.join(KNOWN_PARAMS)}")
        return cls(threads=threads, opt_level=opt_level, provider=provider, dims=dims)


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
        return self.rank > 0 and not _is_static(self.dims[0])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.dims), "dtype": self.type}


def build(opts: WorkloadOptions) -> Pipeline:
    """Build the ``forward`` pipeline for ``opts.model_path`` (see the module docstring)."""
    params = OnnxParams.parse(opts.params)
    path = _check_model_file(opts.model_path)
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "onnx") from exc

    providers, provider_name = _providers(ort, params.provider, opts.device)
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[params.opt_level])
    so.intra_op_num_threads = params.threads
    so.log_severity_level = 3  # errors only: ORT's load-time warnings are noise in a profile
    try:
        session = ort.InferenceSession(str(path), so, providers=providers)
    except Exception as exc:  # ORT raises bare Exception subclasses from pybind
        raise LatencyLabError(f"cannot load ONNX model {path.name}: {_one_line(exc)}") from exc

    used = list(session.get_providers())
    if PROVIDERS[provider_name] not in used:
        raise LatencyLabError(
            f"{path.name}: asked for {PROVIDERS[provider_name]} but onnxruntime is using {', '.join(used)}"
        )

    specs = [InputSpec(i.name, tuple(_norm_dim(d) for d in i.shape), i.type) for i in session.get_inputs()]
    for spec in specs:
        _ = spec.dtype  # unsupported input types fail here, before any work
    notes: list[str] = []
    batch = _check_batch(specs, opts.batch_size, path.name)
    _check_dim_names(specs, params.dims)
    rng = np.random.default_rng(opts.seed)
    if opts.inputs_path:
        source, pool_size, fed = _npz_source(opts.inputs_path, specs, batch, params.dims, notes)
        origin = "npz"
    else:
        shapes = {s.name: _resolve_shape(s, batch, params.dims, notes) for s in specs}
        pool = _generate_pool(specs, shapes, rng, notes)
        pool_size = len(pool)

        def source(i: int) -> Feed:
            return pool[i % pool_size]

        fed = shapes
        origin = "generated"

    model_name = path.name
    run = session.run

    def forward(feed: Feed) -> list[Any]:
        try:
            return run(None, feed)
        except Exception as exc:
            raise LatencyLabError(f"onnxruntime failed running {model_name}: {_one_line(exc)}") from exc

    # One untimed run now, so that inputs the model rejects fail at build time
    # with one line rather than mid-profile.
    sample_outputs = forward(source(0))
    opts_used = session.get_session_options()
    if opts_used.intra_op_num_threads == 0:
        notes.append("threads=0: onnxruntime picks the intra-op thread count (one per physical core)")
    level = opts_used.graph_optimization_level.name
    metadata: dict[str, Any] = {
        "model_path": str(path),
        "model_sha256": _sha256(path),
        "model_bytes": path.stat().st_size,
        "opset": _opset(path),
        "producer": session.get_modelmeta().producer_name or None,
        "inputs": [{**s.to_dict(), "fed_shape": list(fed[s.name])} for s in specs],
        "outputs": [
            {
                "name": o.name,
                "shape": [_norm_dim(d) for d in o.shape],
                "dtype": o.type,
                "sample_shape": list(np.shape(v)),
            }
            for o, v in zip(session.get_outputs(), sample_outputs, strict=True)
        ],
        "providers": used,
        "graph_optimization_level": {v: k for k, v in OPT_LEVELS.items()}.get(level, level),
        "threads": opts_used.intra_op_num_threads,
        "batch_size": batch,
        "input_origin": origin,
        "inputs_path": str(Path(opts.inputs_path).resolve()) if opts.inputs_path else None,
        "seed": opts.seed,
        "pool_size": pool_size,
        "notes": notes,
    }
    # session.run is synchronous and returns host arrays even on CUDA, so a
    # host clock times it correctly; a CUDA-event clock on torch's stream would not.
    return Pipeline(path.stem or "onnx", source=source, device="cpu", metadata=metadata).stage(
        "forward", forward, kind="forward"
    )


# ---------------------------------------------------------------- model file


def _check_model_file(model_path: str | None) -> Path:
    if not model_path:
        raise LatencyLabError("the onnx workload needs a model file (--model path.onnx)")
    path = Path(model_path).expanduser()
    if not path.exists():
        raise LatencyLabError(f"model file {model_path} not found")
    if path.is_dir():
        raise LatencyLabError(f"model path {model_path} is a directory, not an .onnx file")
    if path.stat().st_size == 0:
        raise LatencyLabError(f"model file {model_path} is empty")
    if not os.access(path, os.R_OK):
        raise LatencyLabError(f"model file {model_path} is not readable")
    return path.resolve()


def _providers(ort: Any, provider: str | None, device: str) -> tuple[list[Any], str]:
    kind, _, index = device.partition(":")
    if kind not in PROVIDERS:
        raise LatencyLabError(f"device {device!r} is not supported by the onnx workload (cpu or cuda[:N])")
    name = provider or kind
    if name == "cpu":
        return ["CPUExecutionProvider"], name
    available = ort.get_available_providers()
    if PROVIDERS[name] not in available:
        raise LatencyLabError(
            f"{PROVIDERS[name]} is not available in this onnxruntime (has {', '.join(available)}); "
            "install onnxruntime-gpu"
        )
    device_id = int(index) if kind == "cuda" and index.isdigit() else 0
    return [(PROVIDERS[name], {"device_id": device_id}), "CPUExecutionProvider"], name


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _opset(path: Path) -> int | None:
    """The default-domain opset, read with the onnx package if it is installed."""
    try:
        import onnx
    except ImportError:
        return None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # ORT already accepted the file; the opset is only informative
        return None
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    return None


# ---------------------------------------------------------------- shapes


def _norm_dim(d: Any) -> Dim:
    if isinstance(d, int) and not isinstance(d, bool):
        return d if d >= 0 else None
    if isinstance(d, str) and d:
        return d
    return None


def _is_static(d: Dim) -> bool:
    return isinstance(d, int)


def _check_batch(specs: Sequence[InputSpec], batch_size: int, model: str) -> int:
    if batch_size > 1 and specs and not any(s.batched for s in specs):
        shapes = "; ".join(f"{s.name} {list(s.dims)}" for s in specs)
        raise LatencyLabError(
            f"{model} has no dynamic batch axis ({shapes}), so batch size {batch_size} cannot be fed; "
            "export it with a dynamic first axis"
        )
    return batch_size


def _batch_names(specs: Sequence[InputSpec]) -> set[str]:
    return {s.dims[0] for s in specs if s.batched and isinstance(s.dims[0], str)}


def _check_dim_names(specs: Sequence[InputSpec], dims: Mapping[str, int]) -> None:
    batch_names = _batch_names(specs)
    known: list[str] = []
    for s in specs:
        for axis, d in enumerate(s.dims):
            if _is_static(d) or (axis == 0 and s.batched):
                continue
            known.append(d if isinstance(d, str) else f"{s.name}.{axis}")
    for name in dims:
        if name in batch_names:
            raise LatencyLabError(f"dim.{name}: {name!r} is the batch axis; set it with the batch size")
        if name not in known:
            listed = ", ".join(dict.fromkeys(known)) or "none"
            raise LatencyLabError(f"dim.{name}: the model has no symbolic dimension {name!r} (has: {listed})")


def _resolve_shape(spec: InputSpec, batch: int, dims: Mapping[str, int], notes: list[str]) -> tuple[int, ...]:
    shape: list[int] = []
    for axis, d in enumerate(spec.dims):
        if isinstance(d, int):
            shape.append(d)
        elif axis == 0:
            shape.append(batch)
        else:
            key = d if isinstance(d, str) else f"{spec.name}.{axis}"
            if key in dims:
                shape.append(dims[key])
            else:
                shape.append(DEFAULT_DIM)
                note = f"dimension {key!r} set to {DEFAULT_DIM} (pass dim.{key}=N to choose)"
                if note not in notes:
                    notes.append(note)
    return tuple(shape)


# ---------------------------------------------------------------- generated inputs


def _generate_pool(
    specs: Sequence[InputSpec],
    shapes: Mapping[str, tuple[int, ...]],
    rng: np.random.Generator,
    notes: list[str],
) -> list[Feed]:
    feed_bytes = sum(math.prod(shapes[s.name]) * s.dtype.itemsize for s in specs)
    size = max(1, min(POOL_SIZE, POOL_BYTES // max(1, feed_bytes)))
    if any(s.dtype.kind in "iu" for s in specs):
        notes.append(
            f"integer inputs are random in 0..{INT_HIGH - 1}; token ids or indices may need real "
            "values from an .npz (--inputs)"
        )
    return [{s.name: _random(s.dtype, shapes[s.name], rng) for s in specs} for _ in range(size)]


def _random(dtype: np.dtype[Any], shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape, dtype=np.float64).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, INT_HIGH, size=shape, dtype=dtype)
    return rng.random(shape) < 0.5  # bool


# ---------------------------------------------------------------- npz inputs


def _npz_source(
    inputs_path: str,
    specs: Sequence[InputSpec],
    batch: int,
    dims: Mapping[str, int],
    notes: list[str],
) -> tuple[Callable[[int], Feed], int, dict[str, tuple[int, ...]]]:
    arrays = _load_npz(inputs_path, [s.name for s in specs])
    label = Path(inputs_path).name
    batch_names = _batch_names(specs)
    # symbolic name -> (size, who set it), seeded with the dim.<name> params
    sizes: dict[str, tuple[int, str]] = {k: (v, f"dim.{k}") for k, v in dims.items()}
    counts: dict[str, int] = {}
    per_input: list[tuple[str, np.ndarray, int | None]] = []  # name, samples, rows per batch
    fed: dict[str, tuple[int, ...]] = {}
    for s in specs:
        a = _cast(arrays[s.name], s, label, notes)
        where = f"{label}: array {s.name!r}"
        if a.ndim != s.rank:
            raise LatencyLabError(
                f"{where} has rank {a.ndim} (shape {a.shape}) but model input {s.name!r} has rank "
                f"{s.rank} {list(s.dims)}; the array's first axis indexes samples"
            )
        for axis, (d, n) in enumerate(zip(s.dims, a.shape, strict=True)):
            if axis == 0:
                continue
            if isinstance(d, int) and d != n:
                raise LatencyLabError(
                    f"{where} has shape {a.shape} but model input {s.name!r} expects {list(s.dims)} "
                    f"(axis {axis} must be {d})"
                )
            if isinstance(d, str):
                if d in batch_names:
                    continue
                seen = sizes.setdefault(d, (n, f"array {s.name!r}"))
                if seen[0] != n:
                    raise LatencyLabError(f"{where} has {d}={n} on axis {axis} but {seen[1]} has {d}={seen[0]}")
        if s.rank == 0:
            per_input.append((s.name, a, None))
            fed[s.name] = ()
            continue
        if a.shape[0] == 0:
            raise LatencyLabError(f"{where} has no samples (first axis is empty)")
        counts[s.name] = a.shape[0]
        d0 = s.dims[0]
        rows = d0 if isinstance(d0, int) else batch
        per_input.append((s.name, a, rows))
        fed[s.name] = (rows, *a.shape[1:])
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{k} {v}" for k, v in counts.items())
        raise LatencyLabError(f"{label}: arrays have different sample counts ({listed}); they must match")

    def make(i: int) -> Feed:
        feed: Feed = {}
        for name, a, rows in per_input:
            if rows is None:
                feed[name] = a
            else:
                n = a.shape[0]
                start = (i * rows) % n
                idx = (start + np.arange(rows)) % n
                feed[name] = a if rows == n and start == 0 else np.take(a, idx, axis=0)
        return feed

    # Batches repeat with period n / gcd(n, rows); precompute them when few.
    period = math.lcm(1, *(a.shape[0] // math.gcd(a.shape[0], r) for _, a, r in per_input if r))
    feed_bytes = sum(a.nbytes // max(1, a.shape[0]) * (r or 1) for _, a, r in per_input)
    if period <= POOL_SIZE and period * feed_bytes <= POOL_BYTES:
        pool = [make(i) for i in range(period)]

        def source(i: int) -> Feed:
            return pool[i % period]

        return source, period, fed
    return make, 0, fed


def _load_npz(inputs_path: str, names: Sequence[str]) -> dict[str, np.ndarray]:
    path = Path(inputs_path).expanduser()
    if not path.exists():
        raise LatencyLabError(f"inputs file {inputs_path} not found")
    if path.is_dir():
        raise LatencyLabError(f"inputs path {inputs_path} is a directory, not an .npz file")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise LatencyLabError(f"inputs file {path.name} is not a readable .npz: {_one_line(exc)}") from exc
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise LatencyLabError(
            f"inputs file {path.name} holds a single array; save named arrays with numpy.savez(path, name=array)"
        )
    with data:
        missing = [n for n in names if n not in data.files]
        if missing:
            raise LatencyLabError(
                f"inputs file {path.name} has no array for model input(s) {', '.join(map(repr, missing))} "
                f"(has: {', '.join(data.files) or 'nothing'})"
            )
        out: dict[str, np.ndarray] = {}
        for n in names:
            try:
                out[n] = np.asarray(data[n])
            except Exception as exc:
                raise LatencyLabError(f"inputs file {path.name}: cannot read array {n!r}: {_one_line(exc)}") from exc
    return out


def _cast(a: np.ndarray, spec: InputSpec, label: str, notes: list[str]) -> np.ndarray:
    """Return ``a`` as the model's dtype when that loses no meaning (same kind, values in range)."""
    want = spec.dtype
    if a.dtype == want:
        return np.ascontiguousarray(a)
    mismatch = LatencyLabError(
        f"{label}: array {spec.name!r} has dtype {a.dtype} but model input {spec.name!r} expects {want}"
    )
    kinds = {"f": "f", "i": "int", "u": "int", "b": "b"}
    if kinds.get(a.dtype.kind) != kinds.get(want.kind):
        raise mismatch
    if want.kind in "iu" and a.size:
        info = np.iinfo(want)
        if int(a.min()) < info.min or int(a.max()) > info.max:
            raise LatencyLabError(
                f"{label}: array {spec.name!r} has values outside the range of {want} (model input dtype)"
            )
    notes.append(f"array {spec.name!r} cast from {a.dtype} to {want}")
    return np.ascontiguousarray(a.astype(want))


# ---------------------------------------------------------------- helpers


def _parse_int(key: str, value: str, minimum: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise LatencyLabError(f"{key}={value!r} is not an integer") from None
    if n < minimum:
        raise LatencyLabError(f"{key}={n} must be >= {minimum}")
    return n


def _one_line(exc: BaseException) -> str:
    """ORT messages carry a ``[ONNXRuntimeError] : 7 : INVALID_PROTOBUF :`` prefix and newlines."""
    text = str(exc).strip() or type(exc).__name__
    if text.startswith("[ONNXRuntimeError]"):
        parts = text.split(" : ", 3)
        text = parts[-1] if len(parts) == 4 else text
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
