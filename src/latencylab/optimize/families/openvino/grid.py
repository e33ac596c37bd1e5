"""The OpenVINO candidates, and the runner a candidate's params rebuild.

Every candidate starts from the same FP32 ONNX export as the ONNX Runtime family (``ctx.fp32_onnx()``), read
by OpenVINO's ONNX frontend; the INT8 models are NNCF's, made from ``adapter.calibration()`` only and cached
as IR under ``ctx.workdir / "ov"``, named by a hash of the recipe and of what it was made from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from latencylab.errors import LatencyLabError, MissingDependencyError
from latencylab.optimize import shapes
from latencylab.optimize.families import static_shapes
from latencylab.optimize.families.onnxruntime.common import _feeds_digest, _file_digest, _key
from latencylab.optimize.families.openvino import accuracy
from latencylab.optimize.families.openvino.common import (
    BACKEND,
    PRECISIONS,
    SUBDIR,
    _nncf,
    _ov,
    _quiet,
    cached_ir,
    core,
)
from latencylab.optimize.families.openvino.runner import OvRunner
from latencylab.optimize.lab_summary import default_budget
from latencylab.optimize.types import BuildContext, Candidate, Feed

MODES = ("ptq", "ptq-ac", "weights")
MODEL_TYPES = (None, "transformer")


def _check(params: Mapping[str, Any]) -> None:
    if params.get("precision", "f32") not in PRECISIONS:
        raise LatencyLabError(f"precision {params.get('precision')!r}: one of {', '.join(PRECISIONS)}")
    q = params.get("quantization")
    if q is not None and (q.get("mode") not in MODES or q.get("model_type") not in MODEL_TYPES):
        raise LatencyLabError(f"unknown OpenVINO quantization {dict(q)}")


def _dataset(model: Any, feeds: Sequence[Feed]) -> Any:
    names = [i.get_any_name() for i in model.inputs]
    return _nncf().Dataset([{n: f[n] for n in names} for f in feeds])


def _source_model(ctx: BuildContext, q: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """The ``openvino.Model`` the recipe runs: the FP32 export read as is, or NNCF's INT8 of it (cached IR)."""
    src = ctx.fp32_onnx()
    if not q:
        return core().read_model(str(src)), {}
    calib = ctx.adapter.calibration() if q["mode"] != "weights" else []
    seen = _feeds_digest(ctx.all_feeds()) if q["mode"] == "ptq-ac" else ""  # the loop's validation feeds
    key = _key("ov", dict(q), _file_digest(ctx, src), _feeds_digest(calib), seen, _ov().__version__)
    dst = ctx.workdir / SUBDIR / f"{q['mode']}-{key}.xml"

    def make() -> Any:
        nncf = _nncf()
        model = core().read_model(str(src))
        if q["mode"] == "ptq-ac":
            out, ac_stats = accuracy.quantize(ctx, model, calib, q)
            accuracy.save_stats(dst, ac_stats)
            return out
        with _quiet():
            if q["mode"] == "weights":
                return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
            kw: dict[str, Any] = {}
            if q.get("model_type") == "transformer":
                kw["model_type"] = nncf.ModelType.TRANSFORMER
            return nncf.quantize(model, _dataset(model, calib), **kw)

    path = cached_ir(dst, make)
    stats: dict[str, Any] = {"ir": str(path), "calibration_feeds": len(calib)}
    if q["mode"] == "ptq-ac":
        stats["accuracy_control"] = accuracy.load_stats(path)
    return core().read_model(str(path)), stats


def build_runner(ctx: BuildContext, params: Mapping[str, Any], name: str = "ov") -> OvRunner:
    """Build the compiled model a recipe describes; any failure is re-raised naming the candidate."""
    try:
        _check(params)
        model, stats = _source_model(ctx, params.get("quantization"))
        policy = shapes.normalise(params.get("shape_policy"))
        return OvRunner(
            model, ctx.threads, str(params.get("precision", "f32")), stats, policy, bool(params.get("static"))
        )
    except MissingDependencyError:
        raise
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LatencyLabError(f"{name}: {type(exc).__name__}: {msg}") from exc


def distinct_shapes(ctx: BuildContext, policy: str) -> int:
    """How many distinct input shapes the held-out feeds have after the shape policy."""
    return static_shapes.distinct(ctx.all_feeds(), lambda f: shapes.apply(f, policy))


def _skip(params: Mapping[str, Any]) -> Callable[[BuildContext], str | None]:
    def why(ctx: BuildContext) -> str | None:
        try:
            _ov()
            if params.get("quantization"):
                _nncf()
        except MissingDependencyError as exc:
            return str(exc)
        if ctx.device != "cpu":
            return f"OpenVINO's CPU plugin only (device is {ctx.device})"
        q = params.get("quantization") or {}
        if q.get("mode") in ("ptq", "ptq-ac") and not ctx.adapter.calibration():
            return "no calibration feeds"
        if q.get("model_type") == "transformer":
            from latencylab.optimize.families.onnxruntime.graph import _transformer

            if _transformer(ctx) is None:
                return "not a transformer: NNCF's transformer model type (SmoothQuant, no quantised Add) is for those"
        policy = shapes.normalise(params.get("shape_policy"))
        if policy == shapes.EXACT:
            why_exact = shapes.exact_skip(ctx)
            if why_exact:
                return why_exact
        if params.get("static"):
            return static_shapes.too_many(distinct_shapes(ctx, policy))
        return None

    return why


def candidate_from_params(name: str, family: str, params: Mapping[str, Any], description: str = "") -> Candidate:
    """A candidate that rebuilds exactly from its (JSON) params: what the recipe file stores."""
    frozen = json.loads(json.dumps(params))

    def build(ctx: BuildContext) -> OvRunner:
        return build_runner(ctx, frozen, name)

    policy = shapes.normalise(frozen.get("shape_policy"))
    return Candidate(name, family, BACKEND, frozen, build, _skip(frozen), description, input_policy=policy)


def _recipe(
    quantization: Mapping[str, Any] | None = None, precision: str = "f32", static: bool = False, **extra: Any
) -> dict[str, Any]:
    return {
        "source": "fp32-onnx",
        "precision": precision,
        "quantization": dict(quantization) if quantization else None,
        "static": static,
        **extra,
    }


PTQ = {"tool": "nncf", "mode": "ptq", "model_type": None}
PTQ_TRANSFORMER = {"tool": "nncf", "mode": "ptq", "model_type": "transformer"}


def accuracy_control(budget: str, transformer: bool = False) -> dict[str, Any]:
    """The recipe of NNCF's accuracy-control loop within ``budget`` (:mod:`.accuracy`)."""
    model_type = "transformer" if transformer else None
    q = {"tool": "nncf", "mode": "ptq-ac", "model_type": model_type, "budget": budget}
    return {**q, "max_reverts": accuracy.MAX_REVERTS}


WEIGHTS = {"tool": "nncf", "mode": "weights", "weights": "int8_asym", "model_type": None}


def candidates(ctx: BuildContext) -> list[Candidate]:
    """The OpenVINO grid (cheap to list: nothing is read, quantised or compiled until built). The
    accuracy-control recipes take the search's budget (``ctx.cache["budget"]``, set by the lab) or the default."""
    budget = str(ctx.cache.get("budget") or default_budget(ctx.adapter))
    specs: list[tuple[str, str, dict[str, Any], str]] = [
        ("ov-fp32", "compile", _recipe(), "OpenVINO CPU plugin, FP32 inference precision, dynamic shapes"),
        (
            "ov-fp32-static",
            "compile",
            _recipe(static=True),
            "FP32, the model reshaped and compiled per static input shape (a few shapes)",
        ),
        (
            "ov-int8-default",
            "int8-static",
            _recipe(PTQ, precision="default"),
            "nncf.quantize defaults at OpenVINO's default precision (BF16 where the CPU has it): the "
            "optimum-intel peer recipe",
        ),
        ("ov-int8", "int8-static", _recipe(PTQ), "nncf.quantize defaults (post-training INT8), the rest in FP32"),
        (
            "ov-int8-transformer",
            "int8-static",
            _recipe(PTQ_TRANSFORMER),
            "nncf.quantize with model_type=TRANSFORMER (SmoothQuant, attention-aware scopes), the rest in FP32",
        ),
        (
            "ov-int8-transformer-static",
            "int8-static",
            _recipe(PTQ_TRANSFORMER, static=True),
            "the transformer INT8 model, reshaped and compiled per static input shape",
        ),
        (
            "ov-int8-ac",
            "int8-static",
            _recipe(accuracy_control(budget)),
            f"NNCF's accuracy-control loop within {budget} (defaults; reverts the costliest quantisers to float)",
        ),
        (
            "ov-int8-transformer-ac",
            "int8-static",
            _recipe(accuracy_control(budget, transformer=True)),
            f"NNCF's accuracy-control loop within {budget} from the transformer recipe",
        ),
        (
            "ov-int8-weights",
            "int8-weights",
            # INT8 arithmetic in fact: the CPU plugin quantises the activations of weight-compressed layers on the
            # fly (its dynamic quantisation, on by default): measured above the FP32 roof (docs/benchmarks/optimize.md)
            _recipe(WEIGHTS),
            "nncf.compress_weights INT8 (weight-only, asymmetric per channel; the plugin quantises activations)",
        ),
    ]
    return [candidate_from_params(name, fam, params, desc) for name, fam, params, desc in specs]


def load_ir(path: Path) -> Any:
    """An IR (or ONNX) file read into an ``openvino.Model``."""
    return core().read_model(str(path))
