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
(:func:`~latencylab.workloads.onnx_inputs.guess_rule`), and every guess is listed in
``metadata["guessed"]``:
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
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.pipeline import Pipeline
from latencylab.workloads import WorkloadOptions
from latencylab.workloads.onnx_inputs import (
    NpzInputs,
    ValueRule,
    check_batch,
    check_dim_names,
    gather_tables,
    generate_feed,
    generate_pool,
    guess_hint,
    guess_rule,
    norm_dim,
    npz_inputs,
    resolve_shape,
)
from latencylab.workloads.onnx_spec import OPT_LEVELS, PROVIDERS, Feed, InputSpec, OnnxParams, one_line


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
        return [generate_feed(self.specs, self.shapes, self.rules, rng) for _ in range(n)]


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
        raise LatencyLabError(f"cannot load ONNX model {path.name}: {one_line(exc)}") from exc

    used = list(session.get_providers())
    if PROVIDERS[provider_name] not in used:
        raise LatencyLabError(
            f"{path.name}: asked for {PROVIDERS[provider_name]} but onnxruntime is using {', '.join(used)}"
        )

    specs = [InputSpec(i.name, tuple(norm_dim(d) for d in i.shape), i.type) for i in session.get_inputs()]
    for spec in specs:
        _ = spec.dtype  # unsupported input types fail here, before any work
    notes: list[str] = []
    batch = check_batch(specs, opts.batch_size, path.name)
    check_dim_names(specs, params.dims)
    npz: NpzInputs | None = None
    shapes: dict[str, tuple[int, ...]] = {}
    rules: dict[str, ValueRule] = {}
    guessed_dims: dict[str, int] = {}
    if opts.inputs_path:
        npz = npz_inputs(opts.inputs_path, specs, batch, params.dims, notes)
        source, pool_size = npz.source()
        fed = npz.fed
        origin = "npz"
    else:
        shapes = {s.name: resolve_shape(s, batch, params, guessed_dims) for s in specs}
        rules = {s.name: guess_rule(s, shapes[s.name], gather_tables(path)) for s in specs}
        for key, size in guessed_dims.items():
            how = "dim=N" if params.default_dim_set else "the default guess"
            notes.append(f"dimension {key!r} set to {size} ({how}; pass dim.{key}=N to choose)")
        for s in specs:
            notes.append(f"input {s.name!r} {s.dtype} {list(shapes[s.name])}: {rules[s.name].text}")
        pool = generate_pool(specs, shapes, rules, np.random.default_rng(opts.seed))
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
            raise LatencyLabError(f"onnxruntime failed running {model_name}: {one_line(exc)}") from exc

    # One untimed run now, so that inputs the model rejects fail at build time
    # with one line (naming the fix when the inputs were guessed) rather than mid-profile.
    try:
        sample_outputs = forward(source(0))
    except LatencyLabError as exc:
        if npz is not None:
            raise LatencyLabError(f"{exc} (on the .npz inputs {Path(opts.inputs_path or '').name})") from exc
        raise LatencyLabError(f"{exc}; {guess_hint(specs, shapes, guessed_dims)}") from exc
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
                "shape": [norm_dim(d) for d in o.shape],
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
