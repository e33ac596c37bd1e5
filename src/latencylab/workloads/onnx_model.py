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
``dim=N``
    Size of every other symbolic (non-batch) dimension of generated inputs
    (default 16; ``optimize --model`` passes its ``--seq-len``).

Generated inputs follow the input's name and what the graph does with it
(:func:`guess_rule`), and every guess is listed in ``metadata["guessed"]``:
masks (``*mask*``) are 1 everywhere (``*pad*mask*``: 0 everywhere), i.e.
no padding; ``token_type_ids`` / ``*segment*`` are 0; ``position_ids`` count
0..S-1; an integer input that indexes an embedding table (a ``Gather`` on a
constant table) is drawn from the table's rows; other integers from
0..``INT_HIGH``-1; floats are standard normal; booleans are random. When the
model rejects the guess, the error names the guessed dimensions and the fix
(``dim.<name>=N`` or ``--inputs``).

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
            elif key == "dim":
                default_dim = _parse_int(key, value, minimum=1)
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
        return self.rank > 0 and not _is_static(self.dims[0])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.dims), "dtype": self.type}


@dataclass(slots=True)
class UserModel:
    """An opened user model: its session, declared inputs, and where its inputs come from.

    ``source(i)`` is the i-th batch (the profiler's view); ``npz`` holds the .npz samples when given, so
    that callers can split them (``optimize`` keeps calibration and held-out samples apart);
    :meth:`generated` makes ``n`` feeds by the guessing rules when no .npz is given.
    """

    path: Path
    session: Any
    specs: list[InputSpec]
    params: OnnxParams
    batch: int
    source: Callable[[int], Feed]
    forward: Callable[[Feed], list[Any]]
    metadata: dict[str, Any]
    npz: NpzInputs | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # generated inputs' shapes
    rules: dict[str, ValueRule] = field(default_factory=dict)  # generated inputs' value rules
    seed: int = 0

    def generated(self, n: int) -> list[Feed]:
        """``n`` feeds by the guessing rules (seeded: the same ``n`` feeds every time)."""
        if self.npz is not None:
            raise LatencyLabError("the inputs come from an .npz: nothing is generated")
        rng = np.random.default_rng(self.seed)
        return [_generate_feed(self.specs, self.shapes, self.rules, rng) for _ in range(n)]


def open_model(opts: WorkloadOptions) -> UserModel:
    """Open ``opts.model_path`` and check its inputs (one untimed run); see the module docstring."""
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
    npz: NpzInputs | None = None
    shapes: dict[str, tuple[int, ...]] = {}
    rules: dict[str, ValueRule] = {}
    guessed_dims: dict[str, int] = {}
    if opts.inputs_path:
        npz = _npz_inputs(opts.inputs_path, specs, batch, params.dims, notes)
        source, pool_size = npz.source()
        fed = npz.fed
        origin = "npz"
    else:
        shapes = {s.name: _resolve_shape(s, batch, params, guessed_dims) for s in specs}
        rules = {s.name: guess_rule(s, shapes[s.name], _gather_tables(path)) for s in specs}
        for key, size in guessed_dims.items():
            how = "dim=N" if params.default_dim_set else "the default guess"
            notes.append(f"dimension {key!r} set to {size} ({how}; pass dim.{key}=N to choose)")
        for s in specs:
            notes.append(f"input {s.name!r} {s.dtype} {list(shapes[s.name])}: {rules[s.name].text}")
        pool = _generate_pool(specs, shapes, rules, np.random.default_rng(opts.seed))
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
    # with one line (naming the fix when the inputs were guessed) rather than mid-profile.
    try:
        sample_outputs = forward(source(0))
    except LatencyLabError as exc:
        if npz is not None:
            raise LatencyLabError(f"{exc} (on the .npz inputs {Path(opts.inputs_path or '').name})") from exc
        raise LatencyLabError(f"{exc}; {_guess_hint(specs, shapes, guessed_dims)}") from exc
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
        "inputs_path": str(Path(opts.inputs_path).expanduser().resolve()) if opts.inputs_path else None,
        "inputs_sha256": _sha256(Path(opts.inputs_path).expanduser()) if opts.inputs_path else None,
        "samples": None if npz is None else npz.samples,
        "guessed": [
            {"name": s.name, "dtype": str(s.dtype), "shape": list(shapes[s.name]), "values": rules[s.name].text}
            for s in specs
        ]
        if npz is None
        else [],
        "guessed_dims": guessed_dims,
        "seed": opts.seed,
        "pool_size": pool_size,
        "notes": notes,
    }
    return UserModel(path, session, specs, params, batch, source, forward, metadata, npz, shapes, rules, opts.seed)


def build(opts: WorkloadOptions) -> Pipeline:
    """Build the ``forward`` pipeline for ``opts.model_path`` (see the module docstring)."""
    m = open_model(opts)
    # session.run is synchronous and returns host arrays even on CUDA, so a
    # host clock times it correctly; a CUDA-event clock on torch's stream would not.
    return Pipeline(m.path.stem or "onnx", source=m.source, device="cpu", metadata=m.metadata).stage(
        "forward", m.forward, kind="forward"
    )


# ---------------------------------------------------------------- model file


def _check_model_file(model_path: str | None) -> Path:
    if not model_path:
        raise LatencyLabError("the onnx workload needs a model file (--model path.onnx)")
    path = Path(model_path).expanduser()
    if not path.exists():
        raise LatencyLabError(f"model file {model_path} not found")
    if path.is_dir():
        raise LatencyLabError(
            f"model path {model_path} is a directory, not an .onnx file: give the .onnx file (a Hugging Face "
            "model directory: `latencylab optimize --model DIR` exports it, or export it yourself with "
            "`optimum-cli export onnx --model DIR OUT/` and pass OUT/model.onnx)"
        )
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


def _resolve_shape(spec: InputSpec, batch: int, params: OnnxParams, guessed: dict[str, int]) -> tuple[int, ...]:
    """The generated input's shape: fixed dims as declared, the batch axis, ``dim.<name>`` where given, and
    the guess (``dim=N``, else :data:`DEFAULT_DIM`) for the other symbolic dims (recorded in ``guessed``)."""
    shape: list[int] = []
    for axis, d in enumerate(spec.dims):
        if isinstance(d, int):
            shape.append(d)
        elif axis == 0:
            shape.append(batch)
        else:
            key = d if isinstance(d, str) else f"{spec.name}.{axis}"
            if key in params.dims:
                shape.append(params.dims[key])
            else:
                shape.append(params.default_dim)
                guessed[key] = params.default_dim
    return tuple(shape)


# ---------------------------------------------------------------- generated inputs

# Ops that carry integer indices through unchanged (between a graph input and the Gather that uses them).
_INDEX_PASS_THROUGH = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand"})


@dataclass(frozen=True, slots=True)
class ValueRule:
    """How a generated input's values are drawn: ``fill`` (all ``value``), ``positions`` (0..S-1 along the
    last axis), ``int`` (uniform in ``low``..``high``-1), ``normal`` (standard normal), ``bool`` (random)."""

    kind: str
    text: str  # the rule in words (printed, and recorded in metadata["guessed"])
    value: float = 0.0
    low: int = 0
    high: int = INT_HIGH


def guess_rule(spec: InputSpec, shape: tuple[int, ...], tables: Mapping[str, int]) -> ValueRule:
    """The value rule for a generated input, from its name, dtype and the embedding table it indexes (rows,
    from :func:`_gather_tables`). A guess: real inputs (``--inputs``) always win."""
    name = spec.name.lower()
    kind = spec.dtype.kind
    if "mask" in name:
        if "pad" in name:  # key_padding_mask and the like: 1 marks padding
            return ValueRule("fill", "0 everywhere (a padding mask: nothing padded)", value=0)
        return ValueRule("fill", "1 everywhere (a mask: every position attended, no padding)", value=1)
    if kind in "iu":
        if "token_type" in name or "segment" in name:
            return ValueRule("fill", "0 everywhere (one segment)", value=0)
        if "position" in name and shape:
            return ValueRule("positions", f"0..{max(shape[-1] - 1, 0)} along the last axis (positions)")
        rows = tables.get(spec.name)
        if rows:
            high = min(rows, int(np.iinfo(spec.dtype).max) + 1)
            return ValueRule("int", f"random in 0..{high - 1} (the {rows} rows of the embedding table it indexes)",
                             high=high)  # fmt: skip
        return ValueRule(
            "int", f"random in 0..{INT_HIGH - 1} (no embedding table found to bound them; real ids need --inputs)"
        )
    if kind == "f":
        return ValueRule("normal", "standard normal")
    return ValueRule("bool", "random true/false")


def _gather_tables(path: Path) -> dict[str, int]:
    """Graph input -> rows of the constant table a ``Gather`` indexes with it (through Cast/Unsqueeze/...):
    the vocabulary of ``input_ids``. Empty when the onnx package is missing or the graph cannot be read."""
    try:
        import onnx
    except ImportError:
        return {}
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # ORT read it; the table sizes are only a better guess
        return {}
    rows = {i.name: int(i.dims[0]) for i in graph.initializer if len(i.dims) >= 1}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value" and n.attribute[0].t.dims:
            rows[n.output[0]] = int(n.attribute[0].t.dims[0])
    consumers: dict[str, list[Any]] = {}
    for n in graph.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)
    out: dict[str, int] = {}
    for inp in graph.input:
        if inp.name in rows:  # an initializer listed among the inputs (old exporters)
            continue
        seen, frontier, found = {inp.name}, [inp.name], []
        while frontier:
            t = frontier.pop()
            for n in consumers.get(t, ()):
                axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == t and n.input[0] in rows and axis == 0:
                    found.append(rows[n.input[0]])
                elif n.op_type in _INDEX_PASS_THROUGH and n.input and n.input[0] == t:
                    frontier += [o for o in n.output if o not in seen]
                    seen.update(n.output)
        if found:
            out[inp.name] = min(found)
    return out


def _generate_feed(
    specs: Sequence[InputSpec],
    shapes: Mapping[str, tuple[int, ...]],
    rules: Mapping[str, ValueRule],
    rng: np.random.Generator,
) -> Feed:
    return {s.name: _values(s.dtype, shapes[s.name], rules[s.name], rng) for s in specs}


def _generate_pool(
    specs: Sequence[InputSpec],
    shapes: Mapping[str, tuple[int, ...]],
    rules: Mapping[str, ValueRule],
    rng: np.random.Generator,
) -> list[Feed]:
    feed_bytes = sum(math.prod(shapes[s.name]) * s.dtype.itemsize for s in specs)
    size = max(1, min(POOL_SIZE, POOL_BYTES // max(1, feed_bytes)))
    return [_generate_feed(specs, shapes, rules, rng) for _ in range(size)]


def _values(dtype: np.dtype[Any], shape: tuple[int, ...], rule: ValueRule, rng: np.random.Generator) -> np.ndarray:
    if rule.kind == "fill":
        return np.full(shape, rule.value, dtype=dtype)
    if rule.kind == "positions":
        return np.ascontiguousarray(np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape))
    if rule.kind == "int":
        return rng.integers(rule.low, rule.high, size=shape, dtype=dtype)
    if rule.kind == "normal":
        return rng.standard_normal(shape, dtype=np.float64).astype(dtype)
    return rng.random(shape) < 0.5  # bool


def _guess_hint(specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]], guessed: Mapping[str, int]) -> str:
    """What to do when the model rejects generated inputs: name the guessed dims and the two fixes."""
    fed = ", ".join(f"{s.name} {list(shapes[s.name])}" for s in specs)
    if guessed:
        sizes = ", ".join(f"{k}={v}" for k, v in guessed.items())
        flags = " ".join(f"--param dim.{k}=N" for k in guessed)
        return (
            f"the inputs were guessed ({fed}; guessed {sizes}): set the real sizes with {flags}, "
            "or give real inputs with --inputs FILE.npz"
        )
    return f"the inputs were generated ({fed}): give real inputs with --inputs FILE.npz"


# ---------------------------------------------------------------- npz inputs


@dataclass(frozen=True, slots=True)
class NpzInputs:
    """The .npz's arrays, checked against the model: per input its samples (axis 0) and rows per batch
    (None for a scalar input, fed as it is)."""

    label: str
    arrays: tuple[tuple[str, np.ndarray, int | None], ...]
    samples: int  # along axis 0 (0 when every input is a scalar)
    fed: dict[str, tuple[int, ...]]

    @property
    def rows(self) -> int:
        """Samples per batch (the batch size, or a fixed first axis)."""
        return max((r for _, _, r in self.arrays if r), default=1)

    def feed(self, i: int, subset: np.ndarray | None = None) -> Feed:
        """Batch ``i`` of the samples ``subset`` (default all): samples ``i*B .. i*B+B-1`` of it, cycling."""
        out: Feed = {}
        for name, a, rows in self.arrays:
            if rows is None:
                out[name] = a
                continue
            pool = np.arange(a.shape[0]) if subset is None else np.asarray(subset)
            pos = (i * rows + np.arange(rows)) % len(pool)
            whole = subset is None and rows == a.shape[0] and pos[0] == 0
            out[name] = a if whole else np.take(a, pool[pos], axis=0)
        return out

    def feeds(self, subset: Sequence[int] | np.ndarray) -> list[Feed]:
        """Every sample of ``subset`` once, in batches (the last one completed from the subset's start)."""
        idx = np.asarray(subset, dtype=np.int64)
        return [self.feed(k, idx) for k in range(math.ceil(len(idx) / self.rows))] if len(idx) else []

    def source(self) -> tuple[Callable[[int], Feed], int]:
        """``source(i)`` over all samples, and the pool size (0 when batches are made on demand)."""
        # Batches repeat with period n / gcd(n, rows); precompute them when few.
        period = math.lcm(1, *(a.shape[0] // math.gcd(a.shape[0], r) for _, a, r in self.arrays if r))
        feed_bytes = sum(a.nbytes // max(1, a.shape[0]) * (r or 1) for _, a, r in self.arrays)
        if period <= POOL_SIZE and period * feed_bytes <= POOL_BYTES:
            pool = [self.feed(i) for i in range(period)]

            def source(i: int) -> Feed:
                return pool[i % period]

            return source, period
        return self.feed, 0


def _npz_inputs(
    inputs_path: str,
    specs: Sequence[InputSpec],
    batch: int,
    dims: Mapping[str, int],
    notes: list[str],
) -> NpzInputs:
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
    return NpzInputs(label, tuple(per_input), next(iter(counts.values()), 0), fed)


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
