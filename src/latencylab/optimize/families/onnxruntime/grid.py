"""The grid of candidates: of ONNX Runtime variants, and the runner a candidate's params rebuild."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize import shapes
from latencylab.optimize.families.onnxruntime.common import (
    BACKEND,
    FALLBACK_KS,
    NOT_A_TRANSFORMER,
    PERCHANNEL_FALLBACK_KS,
    SENSITIVITY_FEEDS,
    STATIC_OPS,
    TRANSFORMERS,
    _ort,
)
from latencylab.optimize.families.onnxruntime.graph import (
    _source,
    _transformer,
    quantisable_nodes,
)
from latencylab.optimize.families.onnxruntime.quantisation import (
    _quantise,
)
from latencylab.optimize.families.onnxruntime.runner import OrtRunner
from latencylab.optimize.types import BuildContext, Candidate


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
    return Candidate(name, family, BACKEND, frozen, build, _skip(frozen), description, input_policy=policy,
                     shares=_shares(frozen))  # fmt: skip


def _shares(params: Mapping[str, Any]) -> str:
    """The intermediate a candidate's build makes for others (:attr:`Candidate.shares`): a sensitivity
    fallback's ranking (one per source graph and quantisation recipe, whatever K), else none."""
    q = params.get("quantization") or {}
    fb = q.get("fallback") or {}
    if fb.get("policy") != "sensitivity":
        return ""
    recipe = {k: q.get(k) for k in ("mode", "weight_type", "per_channel", "reduce_range")}
    return "ort-sensitivity:" + json.dumps([params.get("source", "fp32"), recipe, fb.get("feeds")], sort_keys=True)


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
