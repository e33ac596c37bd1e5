"""The user-model workload's inputs: each input's shape (the batch axis, symbolic dims), generated
feeds (values guessed from the input's name and what the graph does with it, :func:`guess_rule`) and
feeds read from an ``.npz`` file. See :mod:`latencylab.workloads.onnx_model` for the rules."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.workloads.onnx_spec import (
    INT_HIGH,
    POOL_BYTES,
    POOL_SIZE,
    Dim,
    Feed,
    InputSpec,
    OnnxParams,
    is_static,
    one_line,
)

# ---------------------------------------------------------------- shapes


def norm_dim(d: Any) -> Dim:
    if isinstance(d, int) and not isinstance(d, bool):
        return d if d >= 0 else None
    if isinstance(d, str) and d:
        return d
    return None


def check_batch(specs: Sequence[InputSpec], batch_size: int, model: str) -> int:
    if batch_size > 1 and specs and not any(s.batched for s in specs):
        shapes = "; ".join(f"{s.name} {list(s.dims)}" for s in specs)
        raise LatencyLabError(
            f"{model} has no dynamic batch axis ({shapes}), so batch size {batch_size} cannot be fed; "
            "export it with a dynamic first axis"
        )
    return batch_size


def _batch_names(specs: Sequence[InputSpec]) -> set[str]:
    return {s.dims[0] for s in specs if s.batched and isinstance(s.dims[0], str)}


def check_dim_names(specs: Sequence[InputSpec], dims: Mapping[str, int]) -> None:
    batch_names = _batch_names(specs)
    known: list[str] = []
    for s in specs:
        for axis, d in enumerate(s.dims):
            if is_static(d) or (axis == 0 and s.batched):
                continue
            known.append(d if isinstance(d, str) else f"{s.name}.{axis}")
    for name in dims:
        if name in batch_names:
            raise LatencyLabError(f"dim.{name}: {name!r} is the batch axis; set it with the batch size")
        if name not in known:
            listed = ", ".join(dict.fromkeys(known)) or "none"
            raise LatencyLabError(f"dim.{name}: the model has no symbolic dimension {name!r} (has: {listed})")


def resolve_shape(spec: InputSpec, batch: int, params: OnnxParams, guessed: dict[str, int]) -> tuple[int, ...]:
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
    from :func:`gather_tables`). A guess: real inputs (``--inputs``) always win."""
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


def gather_tables(path: Path) -> dict[str, int]:
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


def generate_feed(
    specs: Sequence[InputSpec],
    shapes: Mapping[str, tuple[int, ...]],
    rules: Mapping[str, ValueRule],
    rng: np.random.Generator,
) -> Feed:
    return {s.name: _values(s.dtype, shapes[s.name], rules[s.name], rng) for s in specs}


def generate_pool(
    specs: Sequence[InputSpec],
    shapes: Mapping[str, tuple[int, ...]],
    rules: Mapping[str, ValueRule],
    rng: np.random.Generator,
) -> list[Feed]:
    feed_bytes = sum(math.prod(shapes[s.name]) * s.dtype.itemsize for s in specs)
    size = max(1, min(POOL_SIZE, POOL_BYTES // max(1, feed_bytes)))
    return [generate_feed(specs, shapes, rules, rng) for _ in range(size)]


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


def guess_hint(specs: Sequence[InputSpec], shapes: Mapping[str, tuple[int, ...]], guessed: Mapping[str, int]) -> str:
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


def npz_inputs(
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
        raise LatencyLabError(f"inputs file {path.name} is not a readable .npz: {one_line(exc)}") from exc
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
                raise LatencyLabError(f"inputs file {path.name}: cannot read array {n!r}: {one_line(exc)}") from exc
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
