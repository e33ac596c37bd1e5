"""Quantisation: dynamic and static INT8, the nodes kept in float, and the per-node sensitivity that ranks them."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.optimize.families.onnxruntime.calibration import (
    FeedReader,
    _calibration_feeds,
    _calibration_method,
    _calibration_table,
    _model_inputs,
)
from latencylab.optimize.families.onnxruntime.common import (
    DYNAMIC_OPS,
    SENSITIVITY_FEEDS,
    STATIC_OPS,
    _atomic_build,
    _feeds_digest,
    _file_digest,
    _key,
    _onnx,
    _ort,
    _quiet,
    _workdir,
)
from latencylab.optimize.families.onnxruntime.graph import (
    _check_nodes,
    _with_gemm_aliases,
    first_last_compute,
    quantisable_nodes,
)
from latencylab.optimize.families.onnxruntime.runner import OrtRunner
from latencylab.optimize.types import BuildContext


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
