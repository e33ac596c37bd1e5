"""ONNX Runtime candidates: graph optimisation levels, transformer fusion, dynamic and static INT8, mixed precision.

``candidates(ctx)`` lists (cheaply: no model work happens until a candidate is built or asked why it skips):

* ``ort-fp32`` / ``ort-fp32-basic``: the FP32 export under ``ORT_ENABLE_ALL`` / ``ORT_ENABLE_BASIC`` (family
  ``graph``);
* ``ort-fp32-fused``: the transformer optimizer's fused graph (Attention, SkipLayerNormalization, BiasGelu, ...),
  transformer encoders only (family ``fusion``: the built-in text model, or any graph :func:`detect_encoder`
  recognises, its hidden size and heads read from the graph); which fusions happened goes into
  ``runner.stats["fusions"]``;
* dynamic INT8 (``quantize_dynamic``, family ``int8-dynamic``): the defaults as ORT/optimum users get them (the
  peer recipe), per-channel, QUInt8 weights, ``reduce_range`` and the fused graph quantised;
* static QDQ INT8 (``quantize_static``, family ``int8-static``) calibrated on ``adapter.calibration()`` only:
  MinMax, Entropy, Percentile (99.99) and "EMA 3-sigma" (our own ranges, see :func:`ema_sigma_ranges`);
* mixed precision (family ``mixed``): the first and last compute layers kept in float, and the K most harmful
  nodes kept in float as ranked by :func:`sensitivity`.

A candidate's ``params`` are the whole recipe (JSON): :func:`candidate_from_params` rebuilds it. Quantised and
fused files live under ``ctx.workdir / "ort"``, named by a hash of the recipe and of what it was made from (the
FP32 file's bytes, the calibration feeds), so building the same candidate twice reuses the file.

x86 notes that shape the grid: without VNNI (AVX2, AVX-512F) ORT's u8s8 kernels multiply with ``vpmaddubsw``,
which adds two u8 x s8 products into a saturating int16: large activations times large weights clip.
``reduce_range`` (7-bit weights) makes the pair sum fit; QUInt8 weights take the u8u8 kernel, which widens to
int16 first and cannot saturate, at some speed cost. With VNNI (``vpdpbusd``) neither is needed. Measured on an
AVX2-only machine (MiniLM, 1 thread, 1 x 128): per-tensor reduce_range LOST accuracy (mean cosine 0.86 against
0.957 for the defaults: halving the weight resolution costs more than the saturation it avoids), u8u8 gained
some (0.980) at +20% latency, and per-channel weights gave the most (0.991) at no cost. MiniLM's static QDQ
recipes stay below 0.93 (per-tensor activation scales meet the transformer's outlier hidden dimensions), and
3-sigma clipping makes that worse (0.58): it helps where small values matter and large ones are noise (the
seeds' CT images), not where a few large values carry the signal.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize import shapes
from latencylab.optimize.types import BuildContext, Candidate, Feed

BACKEND = "onnxruntime"
NOT_A_TRANSFORMER = "not a transformer"
SUBDIR = "ort"
# The compute layers (the "first and last layers" of the mixed-precision recipe are chosen among these).
COMPUTE_OPS = ("MatMul", "Gemm", "Conv")
# Ops the dynamic quantizer (IntegerOps mode) rewrites when they carry a float weight initializer.
# Gemm is among them: in dynamic mode the quantizer first rewrites Gemm(alpha=beta=1, transA=0) with a constant B
# into MatMul "<name>_MatMul" + Add (see _with_gemm_aliases).
DYNAMIC_OPS = ("MatMul", "Gemm", "Conv", "Gather", "Attention", "EmbedLayerNormalization", "LSTM")
# Static QDQ: only ops with int8 kernels. Quantising Add/Softmax/LayerNorm too only adds Q/DQ pairs and error.
STATIC_OPS = ("MatMul", "Gemm", "Conv")
FALLBACK_KS = (2, 4, 8, 16)
# Per-channel weights already fix most of the error the fallback repairs: a small K is enough there.
PERCHANNEL_FALLBACK_KS = (2, 4)
SENSITIVITY_FEEDS = 8
# Known transformer shapes per adapter; other models' are read from the graph (detect_encoder).
TRANSFORMERS: dict[str, dict[str, Any]] = {"text": {"model_type": "bert", "num_heads": 12, "hidden_size": 384}}
_GRAPH_LEVELS = ("disabled", "basic", "extended", "all")


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "onnx") from exc
    return onnxruntime


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        raise MissingDependencyError("onnx", "onnx") from exc
    return onnx


# ------------------------------------------------------------------ runner


SHAPE_POLICIES = shapes.POLICIES
trim_padding = shapes.trim_padding  # re-exported: it lived here first


class OrtRunner:
    """One ``InferenceSession`` on the CPU provider: ``threads`` intra-op threads, one inter-op, sequential.

    ``run(feed)`` passes the session's inputs from the feed and returns the first output as float32.
    ``shape_policy`` (:mod:`latencylab.optimize.shapes`) is applied to every feed first (``exact`` trims right
    padding); ``tokens`` counts the sequence positions each call really ran.
    ``stats`` describes the built artifact (file, size, fusions, excluded nodes ...) for the search's record.
    """

    def __init__(
        self,
        path: Path,
        threads: int = 1,
        graph_optimization: str = "all",
        stats: dict[str, Any] | None = None,
        shape_policy: str = shapes.AS_GIVEN,
    ) -> None:
        ort = _ort()
        self.shape_policy = shapes.normalise(shape_policy)
        self.tokens = shapes.TokenCounter()
        if graph_optimization not in _GRAPH_LEVELS:
            raise LatencyLabError(f"unknown graph optimisation level {graph_optimization!r}; one of {_GRAPH_LEVELS}")
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = {
            "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[graph_optimization]
        so.log_severity_level = 3  # errors only: initializer-removal chatter is not news
        self.path = Path(path)
        self.session = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_name = self.session.get_outputs()[0].name
        self.stats: dict[str, Any] = {"model_file": str(path), "model_bytes": self.path.stat().st_size, **(stats or {})}

    def run(self, feed: Feed) -> np.ndarray:
        try:
            inputs = {n: feed[n] for n in self.input_names}
        except KeyError as exc:
            raise LatencyLabError(
                f"feed has no input {exc.args[0]!r}; the model wants {list(self.input_names)}"
            ) from exc
        inputs = shapes.apply(inputs, self.shape_policy)
        self.tokens.count(inputs)
        out = self.session.run([self.output_name], inputs)[0]
        return np.asarray(out, dtype=np.float32)

    @property
    def model_path(self) -> Path:
        """The ONNX file this session runs (what ``optimize --out`` exports)."""
        return self.path

    def close(self) -> None:
        self.session = None


# ------------------------------------------------------------------ hashing and files


def _file_digest(ctx: BuildContext, path: Path) -> str:
    """sha256 of a file's bytes, memoised in ``ctx.cache`` by (path, size, mtime)."""
    st = path.stat()
    key = f"ort-digest:{path}:{st.st_size}:{st.st_mtime_ns}"
    if key not in ctx.cache:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        ctx.cache[key] = h.hexdigest()
    return str(ctx.cache[key])


def _feeds_digest(feeds: Sequence[Feed]) -> str:
    h = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            a = np.ascontiguousarray(feed[name])
            h.update(f"{name}:{a.dtype}:{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def _key(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _workdir(ctx: BuildContext) -> Path:
    d = ctx.workdir / SUBDIR
    d.mkdir(parents=True, exist_ok=True)
    return d


def _atomic_build(dst: Path, make: Callable[[Path], None]) -> Path:
    """Run ``make(tmp)`` and move the result to ``dst``, unless ``dst`` exists already (then reuse it)."""
    if dst.exists():
        return dst
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.stem}-", suffix=dst.suffix)
    os.close(fd)
    try:
        make(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the artifact is an ordinary file
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dst


class _DropOrtChatter(logging.Filter):
    """The quantizer logs 'Please consider to run pre-processing' on the root logger at every call."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (msg.startswith("Please consider") or "pre-processing" in msg)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Drop the quantizer's root-logger advice and the calibrators' progress prints (stdout)."""
    flt = _DropOrtChatter()
    root = logging.getLogger()
    root.addFilter(flt)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.removeFilter(flt)


# ------------------------------------------------------------------ graph helpers


def quantisable_nodes(model_path: Path, op_types: Sequence[str] = DYNAMIC_OPS) -> list[str]:
    """Names of the nodes (graph order) that the quantizer can rewrite: ``op_types`` nodes with a float weight.

    MatMul counts only with a constant B (``MatMulConstBOnly``, the dynamic default), Gather only with a
    constant table (embeddings), the others with any float initializer input.
    """
    onnx = _onnx()
    model = onnx.load(str(model_path), load_external_data=False)
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    inits = {i.name for i in model.graph.initializer if i.data_type in floats}
    # Constant nodes holding float tensors count as initializers (the quantizer folds them the same way).
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].t.data_type in floats:
            inits.update(n.output)
    names = []
    for i, n in enumerate(model.graph.node):
        if n.op_type not in op_types:
            continue
        if n.op_type == "MatMul":
            quant = len(n.input) > 1 and n.input[1] in inits
        elif n.op_type == "Gemm":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            plain = attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA", 0)
            quant = plain and len(n.input) > 1 and n.input[1] in inits
        elif n.op_type == "Gather":
            quant = bool(n.input) and n.input[0] in inits
        else:
            quant = any(x in inits for x in n.input[1:])
        if quant:
            names.append(n.name or f"<unnamed node {i}>")
    return names


def first_last_compute(model_path: Path, op_types: Sequence[str] = DYNAMIC_OPS) -> list[str]:
    """The first and the last quantisable MatMul/Gemm/Conv node in graph order (the layers kept in float)."""
    onnx = _onnx()
    model = onnx.load(str(model_path), load_external_data=False)
    kind = {n.name: n.op_type for n in model.graph.node}
    compute = [n for n in quantisable_nodes(model_path, op_types) if kind.get(n) in COMPUTE_OPS]
    if not compute:
        raise LatencyLabError(f"no quantisable {'/'.join(COMPUTE_OPS)} node in {model_path.name}")
    return [compute[0]] if len(compute) == 1 else [compute[0], compute[-1]]


def _with_gemm_aliases(nodes: Sequence[str]) -> list[str]:
    """Node names as the dynamic quantizer sees them: a Gemm ``X`` is quantised as its rewritten MatMul ``X_MatMul``.

    Naming both is harmless (a name that matches no node is ignored) and makes keeping a Gemm in float work.
    """
    return [alias for n in nodes for alias in (n, f"{n}_MatMul")]


def _check_nodes(model_path: Path, nodes: Sequence[str]) -> None:
    onnx = _onnx()
    known = {n.name for n in onnx.load(str(model_path), load_external_data=False).graph.node}
    unknown = [n for n in nodes if n not in known]
    if unknown:
        raise LatencyLabError(f"unknown node(s) {unknown[:5]} in {model_path.name} ({len(known)} nodes)")


def _transformer(ctx: BuildContext) -> dict[str, Any] | None:
    """The optimizer config for this adapter's model, or None when it is not a transformer encoder.

    The built-in text model's shape is known; any other model's FP32 export is inspected
    (:func:`detect_encoder`, once per run), so a user's BERT-style ONNX file gets the fusion candidates too.
    """
    known = TRANSFORMERS.get(ctx.adapter.name)
    if known is not None:
        return dict(known)
    if "ort-transformer" not in ctx.cache:
        try:
            ctx.cache["ort-transformer"] = detect_encoder(ctx.fp32_onnx())
        except MissingDependencyError:
            raise
        except Exception:  # an export that fails is reported by the candidates that build it
            ctx.cache["ort-transformer"] = None
    got = ctx.cache["ort-transformer"]
    return None if got is None else dict(got)


def _constants(graph: Any) -> dict[str, np.ndarray]:
    """Initializers and Constant outputs by name (int64 shape tensors resolve through these)."""
    onnx = _onnx()
    out = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer if i.data_type == onnx.TensorProto.INT64}
    for n in graph.node:
        if n.op_type != "Constant" or not n.attribute:
            continue
        a = n.attribute[0]
        if a.name == "value" and a.t.data_type == onnx.TensorProto.INT64:
            out[n.output[0]] = onnx.numpy_helper.to_array(a.t)
        elif a.name in ("value_ints", "value_int"):
            out[n.output[0]] = np.asarray(onnx.helper.get_attribute_value(a), dtype=np.int64)
    return out


def _shape_values(name: str, consts: Mapping[str, np.ndarray], producers: Mapping[str, Any]) -> list[int] | None:
    """A Reshape's target shape with what is constant in it (-1 where it is computed at run time): a constant,
    or a Concat of constants and run-time pieces (each an unsqueezed scalar), as torch's exporter writes
    ``x.view(batch, seq, heads, head_dim)``."""
    if name in consts:
        return [int(v) for v in np.ravel(consts[name])]
    node = producers.get(name)
    if node is None or node.op_type != "Concat":
        return None
    out: list[int] = []
    for x in node.input:
        out += [int(v) for v in np.ravel(consts[x])] if x in consts else [-1]
    return out


def detect_encoder(model_path: Path) -> dict[str, Any] | None:
    """The transformer optimizer's config for a BERT-style encoder graph, or None for another graph.

    An encoder: Softmax (attention), at least two layer norms (LayerNormalization ops, or their decomposed
    ReduceMean form) and at least four MatMuls. ``hidden_size`` is the most common layer-norm width (the
    scale's length; else the most common square MatMul weight); ``num_heads`` comes from the attention's
    4-D Reshape ``[batch, seq, heads, head_dim]``: heads where it is constant, else ``hidden / head_dim``.
    A size that cannot be read is 0, which tells the optimizer to detect it itself.
    """
    from collections import Counter

    onnx = _onnx()
    graph = onnx.load(str(model_path), load_external_data=False).graph
    ops = Counter(n.op_type for n in graph.node)
    layer_norms = ops["LayerNormalization"] + ops["SimplifiedLayerNormalization"] + ops["ReduceMean"] // 2
    if not ops["Softmax"] or layer_norms < 2 or ops["MatMul"] < 4:
        return None
    dims = {i.name: tuple(int(d) for d in i.dims) for i in graph.initializer}
    widths = Counter(
        dims[n.input[1]][0]
        for n in graph.node
        if n.op_type == "LayerNormalization" and len(n.input) > 1 and len(dims.get(n.input[1], ())) == 1
    )
    if not widths:
        widths = Counter(
            dims[n.input[1]][0]
            for n in graph.node
            if n.op_type == "MatMul" and len(n.input) > 1 and len(set(dims.get(n.input[1], (0, 1)))) == 1
        )
    hidden = widths.most_common(1)[0][0] if widths else 0
    consts = _constants(graph)
    producers = {o: n for n in graph.node for o in n.output}
    heads: Counter[int] = Counter()
    for n in graph.node:
        if n.op_type != "Reshape" or len(n.input) < 2:
            continue
        shape = _shape_values(n.input[1], consts, producers)
        if not shape or len(shape) != 4 or shape[3] <= 0 or not hidden:
            continue
        h, d = shape[2], shape[3]
        if h > 0 and h * d == hidden:
            heads[h] += 1
        elif h <= 0 and d < hidden and hidden % d == 0:
            heads[hidden // d] += 1
    return {"model_type": "bert", "num_heads": heads.most_common(1)[0][0] if heads else 0, "hidden_size": hidden}


# ------------------------------------------------------------------ sources: FP32 and fused


def _fused(ctx: BuildContext, fusion: Mapping[str, Any]) -> tuple[Path, dict[str, int]]:
    """The transformer optimizer's output for the FP32 export (made once) and its fused-operator counts."""
    src = ctx.fp32_onnx()
    key = _key("fused", _file_digest(ctx, src), dict(fusion), _ort().__version__)
    cache_key = f"ort-fused:{key}"
    if cache_key in ctx.cache:
        path, counts = ctx.cache[cache_key]
        return Path(path), dict(counts)
    wd = _workdir(ctx)
    dst = wd / f"fused-{key}.onnx"
    stats_path = wd / f"fused-{key}.json"

    def make(tmp: Path) -> None:
        from onnxruntime.transformers.optimizer import optimize_model

        opt = optimize_model(
            str(src),
            model_type=str(fusion.get("model_type", "bert")),
            num_heads=int(fusion.get("num_heads", 0)),
            hidden_size=int(fusion.get("hidden_size", 0)),
            opt_level=fusion.get("opt_level"),
            use_gpu=False,
        )
        counts = {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}
        opt.save_model_to_file(str(tmp))
        stats_path.write_text(json.dumps(counts, sort_keys=True))

    if not dst.exists() or not stats_path.exists():
        dst.unlink(missing_ok=True)
        _atomic_build(dst, make)
    stats: dict[str, int] = json.loads(stats_path.read_text())
    ctx.cache[cache_key] = (str(dst), stats)
    return dst, dict(stats)


def _source(ctx: BuildContext, params: Mapping[str, Any]) -> tuple[Path, dict[str, Any]]:
    source = params.get("source", "fp32")
    if source == "fp32":
        return ctx.fp32_onnx(), {}
    if source == "fused":
        fusion = params.get("fusion") or _transformer(ctx)
        if fusion is None:
            raise LatencyLabError(f"{NOT_A_TRANSFORMER}: no fusion config for adapter {ctx.adapter.name!r}")
        path, fusions = _fused(ctx, fusion)
        return path, {"fusions": fusions, "fusion": dict(fusion)}
    raise LatencyLabError(f"unknown source {source!r} (fp32 | fused)")


# ------------------------------------------------------------------ calibration


class FeedReader:
    """A ``CalibrationDataReader`` over a list of feeds; ``served`` counts the feeds handed out."""

    def __init__(self, feeds: Sequence[Feed], input_names: Sequence[str] | None = None) -> None:
        self.feeds = list(feeds)
        self.input_names = tuple(input_names) if input_names is not None else None
        self.served = 0
        self._start, self._end, self._i = 0, len(self.feeds), 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._i >= self._end:
            return None
        feed = self.feeds[self._i]
        self._i += 1
        self.served += 1
        return dict(feed) if self.input_names is None else {n: feed[n] for n in self.input_names}

    def __iter__(self) -> FeedReader:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item

    def __len__(self) -> int:
        return len(self.feeds)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._start, self._end, self._i = start_index, min(end_index, len(self.feeds)), start_index

    def rewind(self) -> None:
        self._start, self._end, self._i = 0, len(self.feeds), 0


def _model_inputs(path: Path) -> list[str]:
    onnx = _onnx()
    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _calibration_feeds(ctx: BuildContext, n: int | None) -> list[Feed]:
    feeds = list(ctx.adapter.calibration())
    if not feeds:
        raise LatencyLabError(f"adapter {ctx.adapter.name!r} has no calibration feeds")
    return feeds[:n] if n else feeds


def _tensors_to_calibrate(model: Any, op_types: Sequence[str]) -> list[Any]:
    """Value infos of the float activations around ``op_types`` nodes (what ORT's calibrators would pick)."""
    onnx = _onnx()
    vis = {vi.name: vi for vi in model.graph.value_info}
    vis.update({o.name: o for o in model.graph.output})
    vis.update({i.name: i for i in model.graph.input})
    inits = {i.name for i in model.graph.initializer}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    out: dict[str, Any] = {}
    for node in model.graph.node:
        if node.op_type not in op_types:
            continue
        for name in [*node.input, *node.output]:
            vi = vis.get(name)
            if vi is None or name in inits or not vi.type.HasField("tensor_type"):
                continue
            if vi.type.tensor_type.elem_type in floats:
                out[name] = vi
    return list(out.values())


def ema_sigma_ranges(
    model_path: Path, reader: FeedReader, op_types: Sequence[str], ema_constant: float = 0.1, sigmas: float = 3.0
) -> dict[str, tuple[float, float]]:
    """Per-tensor ranges: EMA-smoothed batch min/max, clipped to mean +- ``sigmas`` * std.

    Each calibration batch gives every tensor a min and a max; these are smoothed as
    ``m <- (1 - c) * m + c * batch_value`` (first batch initialises), so one outlier batch cannot stretch the
    range as plain MinMax lets it. The mean and std are pooled over every element of every batch (float64
    sums); the final range is ``[max(ema_min, mean - k*std), min(ema_max, mean + k*std)]``. Clipping spends the
    256 levels on where the values are, so small features are no longer rounded away (the seeds' CT-lesion
    case), at the price of saturating the rare values outside k sigma.
    """
    ort = _ort()
    onnx = _onnx()
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    model = load_model_with_shape_infer(Path(model_path))
    targets = _tensors_to_calibrate(model, op_types)
    if not targets:
        raise LatencyLabError(f"no float activations around {list(op_types)} in {Path(model_path).name}")
    existing = {o.name for o in model.graph.output}
    for vi in targets:
        if vi.name not in existing:
            model.graph.output.append(vi)
    names = [vi.name for vi in targets]
    with tempfile.TemporaryDirectory(prefix="latencylab-ema-") as tmp:
        aug = Path(tmp) / "augmented.onnx"
        onnx.save(model, str(aug))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every tensor as it is
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(aug), sess_options=so, providers=["CPUExecutionProvider"])
        lo: dict[str, float] = {}
        hi: dict[str, float] = {}
        acc = {n: [0.0, 0.0, 0] for n in names}  # sum, sum of squares, count
        for feed in reader:
            outs = sess.run(names, feed)
            for n, a in zip(names, outs, strict=True):
                a64 = np.asarray(a, dtype=np.float64)
                if a64.size == 0:
                    continue
                bmin, bmax = float(a64.min()), float(a64.max())
                lo[n] = bmin if n not in lo else (1 - ema_constant) * lo[n] + ema_constant * bmin
                hi[n] = bmax if n not in hi else (1 - ema_constant) * hi[n] + ema_constant * bmax
                s = acc[n]
                s[0] += float(a64.sum())
                s[1] += float(np.square(a64).sum())
                s[2] += int(a64.size)
    if not lo:
        raise LatencyLabError("EMA calibration saw no data (no calibration feeds?)")
    ranges: dict[str, tuple[float, float]] = {}
    for n in lo:
        total, sq, count = acc[n]
        mean = total / count
        std = float(np.sqrt(max(sq / count - mean * mean, 0.0)))
        rmin = max(lo[n], mean - sigmas * std)
        rmax = min(hi[n], mean + sigmas * std)
        if not np.isfinite(rmin) or not np.isfinite(rmax) or rmin > rmax:
            rmin, rmax = lo[n], hi[n]
        ranges[n] = (rmin, rmax)
    return ranges


def _calibration_table(ctx: BuildContext, src: Path, q: Mapping[str, Any], reader: FeedReader) -> Path:
    """The tensor ranges for a static recipe, as ORT's calibration-cache JSON (computed once per source/method)."""
    from onnxruntime.quantization import CalibrationMethod, create_calibrator
    from onnxruntime.quantization.calibrate import TensorsData, save_tensors_data

    method = q["calibration"]
    op_types = list(q.get("op_types") or STATIC_OPS)
    calib_cfg = {k: q.get(k) for k in ("calibration", "percentile", "num_bins", "ema_constant", "sigmas", "op_types")}
    key = _key("calib", _file_digest(ctx, src), _feeds_digest(reader.feeds), calib_cfg, _ort().__version__)
    dst = _workdir(ctx) / f"calib-{key}.json"
    if dst.exists():
        return dst
    reader.rewind()
    if method == "ema-3sigma":
        ranges = ema_sigma_ranges(src, reader, op_types, float(q.get("ema_constant", 0.1)), float(q.get("sigmas", 3.0)))
        data = TensorsData(
            CalibrationMethod.MinMax,
            {n: (np.array(a, dtype=np.float32), np.array(b, dtype=np.float32)) for n, (a, b) in ranges.items()},
        )
    else:
        enum = _calibration_method(method)
        extra: dict[str, Any] = {}
        if method == "percentile":
            extra["percentile"] = float(q.get("percentile", 99.99))
        if method in ("entropy", "percentile") and q.get("num_bins"):
            extra["num_bins"] = int(q["num_bins"])
        with tempfile.TemporaryDirectory(prefix="latencylab-calib-") as tmp, _quiet():
            calibrator = create_calibrator(
                src,
                op_types,
                augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                calibrate_method=enum,
                extra_options=extra,
            )
            calibrator.collect_data(reader)
            data = calibrator.compute_data()
            del calibrator
    save_tensors_data(data, dst)
    return dst


def _calibration_method(name: str) -> Any:
    from onnxruntime.quantization import CalibrationMethod

    table = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
        "ema-3sigma": CalibrationMethod.MinMax,  # our ranges are stored as a MinMax table
    }
    if name not in table:
        raise LatencyLabError(f"unknown calibration method {name!r}; one of {sorted(table)}")
    return table[name]


# ------------------------------------------------------------------ quantisation


def _qtype(name: str) -> Any:
    from onnxruntime.quantization import QuantType

    try:
        return getattr(QuantType, name)
    except AttributeError:
        raise LatencyLabError(f"unknown quantisation type {name!r} (QInt8 | QUInt8)") from None


def _dynamic_extra() -> dict[str, Any]:
    # ONNX shape inference cannot type the outputs of com.microsoft ops (the fused graph's Attention,
    # SkipLayerNormalization ...); without a default the quantizer refuses a MatMul that follows one.
    return {"DefaultTensorType": _onnx().TensorProto.FLOAT}


def _excluded(ctx: BuildContext, src: Path, q: Mapping[str, Any]) -> list[str]:
    """Resolve a recipe's ``fallback`` (nodes kept in float) to node names."""
    fb = q.get("fallback")
    if not fb:
        return []
    policy = fb.get("policy")
    if policy == "nodes":
        nodes = [str(n) for n in fb.get("nodes", [])]
    elif policy == "ends":
        nodes = first_last_compute(src, q.get("op_types") or (DYNAMIC_OPS if q["mode"] == "dynamic" else STATIC_OPS))
    elif policy == "sensitivity":
        if q.get("mode") != "dynamic":
            raise LatencyLabError("the sensitivity fallback ranks nodes under dynamic INT8 only")
        base = {k: q[k] for k in ("weight_type", "per_channel", "reduce_range") if k in q}
        ranked = sensitivity(ctx, source=src, n_feeds=int(fb.get("feeds", SENSITIVITY_FEEDS)), **base)
        k = int(fb["k"])
        if k >= len(ranked):
            raise LatencyLabError(f"fallback k={k} keeps all {len(ranked)} quantisable nodes in float")
        nodes = [n for n, _ in ranked[:k]]
    else:
        raise LatencyLabError(f"unknown fallback policy {policy!r} (nodes | ends | sensitivity)")
    _check_nodes(src, nodes)
    return nodes


def _quantise(ctx: BuildContext, src: Path, q: Mapping[str, Any], stats: dict[str, Any]) -> Path:
    from onnxruntime.quantization import QuantFormat, quantize_dynamic, quantize_static

    mode = q.get("mode")
    exclude = _excluded(ctx, src, q)
    if exclude:
        stats["nodes_in_float"] = exclude
    if mode == "dynamic":
        key = _key("dyn", _file_digest(ctx, src), dict(q), exclude, _ort().__version__)
        dst = _workdir(ctx) / f"q-dyn-{key}.onnx"

        def make(tmp: Path) -> None:
            with _quiet():
                quantize_dynamic(
                    src,
                    tmp,
                    per_channel=bool(q.get("per_channel", False)),
                    reduce_range=bool(q.get("reduce_range", False)),
                    weight_type=_qtype(str(q.get("weight_type", "QInt8"))),
                    nodes_to_exclude=_with_gemm_aliases(exclude) or None,
                    op_types_to_quantize=list(q["op_types"]) if q.get("op_types") else None,
                    extra_options=_dynamic_extra(),
                )

        return _atomic_build(dst, make)
    if mode == "static":
        if q.get("format", "QDQ") != "QDQ":
            raise LatencyLabError(f"only the QDQ format is offered, not {q.get('format')!r}")
        reader = FeedReader(_calibration_feeds(ctx, q.get("calibration_feeds")), _model_inputs(src))
        table = _calibration_table(ctx, src, q, reader)
        stats["calibration_feeds"] = len(reader.feeds)
        stats["calibration_table"] = str(table)
        key = _key("qdq", _file_digest(ctx, src), _file_digest(ctx, table), dict(q), exclude, _ort().__version__)
        dst = _workdir(ctx) / f"q-qdq-{key}.onnx"
        op_types = list(q.get("op_types") or STATIC_OPS)

        def make_static(tmp: Path) -> None:
            with _quiet():
                quantize_static(
                    src,
                    tmp,
                    None,
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=op_types,
                    per_channel=bool(q.get("per_channel", False)),
                    reduce_range=bool(q.get("reduce_range", False)),
                    activation_type=_qtype(str(q.get("activation_type", "QUInt8"))),
                    weight_type=_qtype(str(q.get("weight_type", "QInt8"))),
                    nodes_to_exclude=exclude or None,
                    calibrate_method=_calibration_method(str(q["calibration"])),
                    calibration_cache_path=table,
                )

        return _atomic_build(dst, make_static)
    raise LatencyLabError(f"unknown quantisation mode {mode!r} (dynamic | static)")


def output_error(reference: np.ndarray, output: np.ndarray, kind: str) -> float:
    """1 - mean row cosine for embeddings; mean |difference| for logits."""
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    out = np.asarray(output, dtype=np.float64).reshape(len(output), -1)
    if ref.shape != out.shape:
        raise LatencyLabError(f"output shape {out.shape} differs from the reference {ref.shape}")
    if kind == "embedding":
        num = (ref * out).sum(axis=1)
        den = np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1)
        cos = np.where(den > 0, num / np.maximum(den, 1e-30), 0.0)
        return float(1.0 - cos.mean())
    return float(np.abs(ref - out).mean())


def sensitivity(
    ctx: BuildContext,
    *,
    source: Path | None = None,
    n_feeds: int = SENSITIVITY_FEEDS,
    weight_type: str = "QInt8",
    per_channel: bool = False,
    reduce_range: bool = False,
) -> list[tuple[str, float]]:
    """Rank the quantisable nodes by the output error each causes alone (most harmful first).

    Each node is quantised ONE at a time (dynamic INT8, the given recipe) and the model's output on the first
    ``n_feeds`` calibration feeds (never held-out) is compared with FP32 (:func:`output_error`). We chose this
    over excluding one node at a time from a fully quantised model: both cost one quantisation and one session
    per node, but here every error is measured against the exact FP32 output, so each node's share stands
    alone, while excluding one node measures a small improvement on top of the other nodes' large joint error,
    which needs many more feeds to resolve. Results are kept in ``ctx.cache`` and in the work directory.
    """
    from onnxruntime.quantization import quantize_dynamic

    src = Path(source) if source is not None else ctx.fp32_onnx()
    feeds = _calibration_feeds(ctx, n_feeds)
    recipe = {"weight_type": weight_type, "per_channel": per_channel, "reduce_range": reduce_range}
    key = _key(
        "sens", _file_digest(ctx, src), _feeds_digest(feeds), recipe, ctx.adapter.output_kind, _ort().__version__
    )
    cache_key = f"ort-sensitivity:{key}"
    if cache_key in ctx.cache:
        return list(ctx.cache[cache_key])
    saved = _workdir(ctx) / f"sensitivity-{key}.json"
    if saved.exists():
        ranked = [(str(n), float(e)) for n, e in json.loads(saved.read_text())]
        ctx.cache[cache_key] = ranked
        return list(ranked)
    nodes = quantisable_nodes(src)
    if not nodes:
        raise LatencyLabError(f"no quantisable node in {src.name}")
    kind = ctx.adapter.output_kind
    ref_runner = OrtRunner(src, ctx.threads)
    reference = np.concatenate([ref_runner.run(f) for f in feeds])
    ref_runner.close()
    errors: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="latencylab-sens-", dir=_workdir(ctx)) as tmp:
        for i, node in enumerate(nodes):
            path = Path(tmp) / f"n{i}.onnx"
            with _quiet():
                quantize_dynamic(
                    src,
                    path,
                    per_channel=per_channel,
                    reduce_range=reduce_range,
                    weight_type=_qtype(weight_type),
                    nodes_to_quantize=_with_gemm_aliases([node]),
                    extra_options=_dynamic_extra(),
                )
            runner = OrtRunner(path, ctx.threads)
            out = np.concatenate([runner.run(f) for f in feeds])
            runner.close()
            path.unlink()
            errors.append((node, output_error(reference, out, kind)))
    ranked = sorted(errors, key=lambda t: -t[1])
    saved.write_text(json.dumps(ranked))
    ctx.cache[cache_key] = ranked
    return list(ranked)


# ------------------------------------------------------------------ candidates


def build_runner(ctx: BuildContext, params: Mapping[str, Any], name: str = "ort") -> OrtRunner:
    """Build the session a recipe describes; any failure is re-raised naming the candidate."""
    try:
        stats: dict[str, Any] = {}
        src, extra = _source(ctx, params)
        stats.update(extra)
        q = params.get("quantization")
        path = _quantise(ctx, src, q, stats) if q else src
        policy = shapes.normalise(params.get("shape_policy"))
        return OrtRunner(path, ctx.threads, str(params.get("graph_optimization", "all")), stats, policy)
    except MissingDependencyError:
        raise
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LatencyLabError(f"{name}: {type(exc).__name__}: {msg}") from exc


def _skip(params: Mapping[str, Any]) -> Callable[[BuildContext], str | None]:
    def why(ctx: BuildContext) -> str | None:
        try:
            _ort()
        except MissingDependencyError as exc:
            return str(exc)
        if ctx.device != "cpu":
            return f"CPU execution provider only (device is {ctx.device})"
        if params.get("source") == "fused" and params.get("fusion") is None and _transformer(ctx) is None:
            return NOT_A_TRANSFORMER
        if shapes.normalise(params.get("shape_policy")) == shapes.EXACT:
            why_exact = shapes.exact_skip(ctx)
            if why_exact:
                return why_exact
        q = params.get("quantization") or {}
        if q.get("mode") == "static" and not ctx.adapter.calibration():
            return "no calibration feeds"
        fb = q.get("fallback") or {}
        if fb.get("policy") == "sensitivity":
            try:
                src = ctx.fp32_onnx() if params.get("source", "fp32") == "fp32" else _source(ctx, params)[0]
                n = len(quantisable_nodes(src))
            except Exception:
                return None  # the build reports the real error
            if int(fb["k"]) >= n:
                return f"only {n} quantisable nodes: keeping {fb['k']} in float leaves nothing quantised"
        return None

    return why


def candidate_from_params(name: str, family: str, params: Mapping[str, Any], description: str = "") -> Candidate:
    """A candidate that rebuilds exactly from its (JSON) params: what the recipe file stores."""
    frozen = json.loads(json.dumps(params))  # a private copy; also proves it is JSON-serialisable

    def build(ctx: BuildContext) -> OrtRunner:
        return build_runner(ctx, frozen, name)

    policy = shapes.normalise(frozen.get("shape_policy"))
    return Candidate(name, family, BACKEND, frozen, build, _skip(frozen), description, input_policy=policy)


def _dyn(
    weight_type: str = "QInt8", per_channel: bool = False, reduce_range: bool = False, fallback: Any = None
) -> dict[str, Any]:
    return {
        "mode": "dynamic",
        "weight_type": weight_type,
        "per_channel": per_channel,
        "reduce_range": reduce_range,
        "fallback": fallback,
    }


def _static(
    calibration: str,
    activation_type: str = "QUInt8",
    weight_type: str = "QInt8",
    per_channel: bool = False,
    reduce_range: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    q = {
        "mode": "static",
        "format": "QDQ",
        "calibration": calibration,
        "activation_type": activation_type,
        "weight_type": weight_type,
        "per_channel": per_channel,
        "reduce_range": reduce_range,
        "op_types": list(STATIC_OPS),
        "calibration_feeds": None,
        "fallback": None,
    }
    q.update(extra)
    return q


def _recipe(quantization: Mapping[str, Any] | None = None, source: str = "fp32", graph: str = "all") -> dict[str, Any]:
    return {"source": source, "graph_optimization": graph, "quantization": dict(quantization) if quantization else None}


def candidates(ctx: BuildContext) -> list[Candidate]:
    """The ONNX Runtime grid (cheap to list: nothing is exported or quantised until built).

    The fused candidates carry the built-in text model's known shape in their params; for another model
    the shape is read from its graph when they are built (:func:`detect_encoder`; in ``stats["fusion"]``).
    """
    fusion = TRANSFORMERS.get(ctx.adapter.name)
    fused: dict[str, Any] = {"source": "fused", "fusion": fusion}
    specs: list[tuple[str, str, dict[str, Any], str]] = [
        ("ort-fp32", "graph", _recipe(), "FP32, ORT_ENABLE_ALL graph optimisations"),
        ("ort-fp32-basic", "graph", _recipe(graph="basic"), "FP32, ORT_ENABLE_BASIC (constant folding, no fusions)"),
        (
            "ort-fp32-fused",
            "fusion",
            {**_recipe(), **fused},
            "FP32 after the transformer optimizer (fused counts in stats['fusions'])",
        ),
        (
            "ort-int8-dynamic-default",
            "int8-dynamic",
            _recipe(_dyn()),
            "quantize_dynamic defaults (QInt8 weights, per-tensor, no reduce_range): the optimum/ORT peer recipe",
        ),
        ("ort-int8-dynamic-perchannel", "int8-dynamic", _recipe(_dyn(per_channel=True)), "QInt8 weights per channel"),
        (
            "ort-int8-dynamic-reducerange",
            "int8-dynamic",
            _recipe(_dyn(reduce_range=True)),
            "7-bit weights: no vpmaddubsw saturation on x86 without VNNI",
        ),
        (
            "ort-int8-dynamic-perchannel-reducerange",
            "int8-dynamic",
            _recipe(_dyn(per_channel=True, reduce_range=True)),
            "per-channel 7-bit weights (ORT's advice for per-channel on non-VNNI x86)",
        ),
        (
            "ort-int8-dynamic-u8u8",
            "int8-dynamic",
            _recipe(_dyn(weight_type="QUInt8")),
            "QUInt8 weights: the u8u8 kernel widens to int16 first, so it cannot saturate",
        ),
        (
            "ort-int8-dynamic-fused",
            "int8-dynamic",
            {**_recipe(_dyn()), **fused},
            "defaults on the fused graph (QAttention, fused LayerNorm/GELU)",
        ),
        (
            "ort-int8-dynamic-fused-perchannel",
            "int8-dynamic",
            {**_recipe(_dyn(per_channel=True)), **fused},
            "fused graph, QInt8 weights per channel (the fused kernels' speed with per-channel accuracy)",
        ),
        (
            "ort-int8-dynamic-fused-u8u8",
            "int8-dynamic",
            {**_recipe(_dyn(weight_type="QUInt8")), **fused},
            "fused graph, QUInt8 weights (no int16 saturation on AVX2)",
        ),
        (
            "ort-fp32-exact",
            "shape",
            {**_recipe(), "shape_policy": "exact"},
            "FP32 on each input's real length: right padding trimmed by the attention mask (no work on padding)",
        ),
        (
            "ort-int8-dynamic-perchannel-exact",
            "shape",
            {**_recipe(_dyn(per_channel=True)), "shape_policy": "exact"},
            "per-channel dynamic INT8 on each input's real length (padding trimmed by the attention mask)",
        ),
        (
            "ort-int8-dynamic-fused-reducerange",
            "int8-dynamic",
            {**_recipe(_dyn(reduce_range=True)), **fused},
            "fused graph, 7-bit weights",
        ),
    ]
    for method, extra in (
        ("minmax", {}),
        # ORT's entropy default (128 bins for 128 quantised bins) leaves one threshold to try: MinMax again.
        # 512 bins give the KL search 193 thresholds at a tolerable cost (its loop is pure Python).
        ("entropy", {"num_bins": 512}),
        ("percentile", {"percentile": 99.99}),
        ("ema-3sigma", {"ema_constant": 0.1, "sigmas": 3.0}),
    ):
        specs.append(
            (
                f"ort-int8-static-{method}",
                "int8-static",
                _recipe(_static(method, **extra)),
                f"QDQ, U8 activations / S8 weights, {method} calibration on the calibration feeds",
            )
        )
    specs += [
        (
            "ort-int8-static-minmax-perchannel",
            "int8-static",
            _recipe(_static("minmax", per_channel=True)),
            "QDQ MinMax, per-channel weights",
        ),
        (
            "ort-int8-static-minmax-reducerange",
            "int8-static",
            _recipe(_static("minmax", reduce_range=True)),
            "QDQ MinMax, 7-bit weights (non-VNNI x86 advice)",
        ),
        (
            "ort-int8-static-minmax-s8s8",
            "int8-static",
            _recipe(_static("minmax", activation_type="QInt8")),
            "QDQ MinMax, S8 activations (ORT converts S8S8 QDQ to U8S8 on x86)",
        ),
        (
            "ort-int8-dynamic-keepends",
            "mixed",
            _recipe(_dyn(fallback={"policy": "ends"})),
            "dynamic INT8 defaults, first and last MatMul/Gemm/Conv kept in float",
        ),
        (
            "ort-int8-static-minmax-keepends",
            "mixed",
            _recipe(_static("minmax", fallback={"policy": "ends"})),
            "QDQ MinMax, first and last MatMul/Gemm/Conv kept in float",
        ),
    ]
    for k in FALLBACK_KS:
        specs.append(
            (
                f"ort-int8-dynamic-fallback-k{k}",
                "mixed",
                _recipe(_dyn(fallback={"policy": "sensitivity", "k": k, "feeds": SENSITIVITY_FEEDS})),
                f"dynamic INT8 defaults, the {k} most harmful nodes (sensitivity on calibration feeds) in float",
            )
        )
    for k in PERCHANNEL_FALLBACK_KS:
        specs.append(
            (
                f"ort-int8-dynamic-perchannel-fallback-k{k}",
                "mixed",
                _recipe(_dyn(per_channel=True, fallback={"policy": "sensitivity", "k": k, "feeds": SENSITIVITY_FEEDS})),
                f"dynamic INT8 per-channel, the {k} most harmful nodes (ranked under this recipe) in float",
            )
        )
    for k in (2, 4):
        specs.append(
            (
                f"ort-int8-dynamic-perchannel-fallback-k{k}-exact",
                "shape",
                {
                    **_recipe(
                        _dyn(per_channel=True, fallback={"policy": "sensitivity", "k": k, "feeds": SENSITIVITY_FEEDS})
                    ),
                    "shape_policy": "exact",
                },
                f"per-channel dynamic INT8 with the {k} most harmful nodes in float, on each input's real length",
            )
        )
    return [candidate_from_params(name, family, params, desc) for name, family, params, desc in specs]


__all__ = [
    "FeedReader",
    "OrtRunner",
    "build_runner",
    "candidate_from_params",
    "candidates",
    "detect_encoder",
    "ema_sigma_ranges",
    "first_last_compute",
    "output_error",
    "quantisable_nodes",
    "sensitivity",
]
