"""Graph helpers (quantisable nodes, encoder detection) and the sources quantisation starts from: the FP32 export and
the fused graph."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize.families.onnxruntime.common import (
    COMPUTE_OPS,
    DYNAMIC_OPS,
    NOT_A_TRANSFORMER,
    TRANSFORMERS,
    _atomic_build,
    _file_digest,
    _key,
    _onnx,
    _ort,
    _workdir,
)
from latencylab.optimize.types import BuildContext


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
