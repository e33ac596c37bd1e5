"""Servable variants of the built-in models: the rungs of the server's fallback ladder.

Each model has a ladder of variants, in the order the SLO guard steps down it::

    model   primary                        lighter                      quantized (int8)
    text    "fp32-onnx": all-MiniLM-L6-v2  "trunc64": inputs cut at 64  torch dynamic INT8 Linear layers
            FP32 on ONNX Runtime (CPU)
    vision  "fp32": digits CNN at 64x64    "res32": same CNN at 32x32   dynamic INT8 classifier (convs stay FP32)

This module is the registry: the ladders, and the builders that load the weights once and make every rung
(:func:`build_variants`). The variants themselves live in serve/variants_text.py (:class:`TextVariant`),
serve/variants_vision.py (:class:`VisionVariant`) and, for the ONNX Runtime rungs, serve/ort_text.py and
serve/ort_vision.py; what they share is serve/variants_base.py.

A variant implements :class:`latencylab.serve.types.Variant`: ``preprocess``
turns one request into an item (and refuses bad content with a 400
:class:`ProtocolError`), ``forward`` runs a batch of items in one model call,
``postprocess`` splits the batch's output back into one tuple of tensors per
request, and ``warmup`` pays the first-call costs before traffic arrives.

Preprocessing reuses the workloads' own functions (the text tokenizer, the
vision workload's ``decode`` and ``Preprocess``), so what the server computes
for a request is what the ``text`` and ``vision`` workloads compute for the
same input.

Fidelity, measured over the whole shipped corpus (600 texts) and the 360
held-out JPEGs (tests/test_serve_variants.py asserts floors just below):

- text ``int8``: mean cosine 0.937 vs FP32 (min 0.85); ``bf16`` (opt-in,
  off the default ladder): 0.99996.
- text ``trunc64`` (the default lighter rung): the same weights with inputs
  truncated to 64 tokens: mean cosine 0.960 (min 0.50), 78% of the corpus
  unchanged; the long passages that set the p99 cost about a quarter.
- text ``minilm-l3`` (opt-in, off the ladder): mean cosine 0.28 (min 0.03). Dropping layers without
  distillation leaves the output in another space: its vectors cannot be
  compared with FP32 ones (an index built by the primary), and even its own
  similarity ranking agrees poorly (Spearman 0.43 against FP32's). The best
  untrained 3-layer subset, layers (0, 4, 5), reaches only 0.70.
- vision accuracy: ``fp32`` 0.997, ``res32`` 0.994, ``int8`` 0.997.

Dynamic INT8 (``torch.ao.quantization.quantize_dynamic``) has CPU kernels
only: the ``int8`` rungs always run on the CPU, whatever ``device`` the other
rungs use.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from latencylab.device import check_device
from latencylab.errors import LatencyLabError
from latencylab.serve.types import Variant
from latencylab.serve.variants_base import check_max_batch_size, torch_module
from latencylab.serve.variants_text import TEXT_MAX_LENGTH, TextVariant
from latencylab.serve.variants_vision import VisionVariant

if TYPE_CHECKING:
    import torch

__all__ = ["EXTRAS", "LADDERS", "build_variants"]

# model -> its ladder, in fallback order: (variant name, kind).
# Text leads with "fp32-onnx": the same FP32 weights on ONNX Runtime, the fastest text runtime measured on a CPU
# (a 208-token passage in 36-39 ms on 2 threads against 55-69 ms for torch eager; docs/serve.md). A GPU server
# puts the torch "fp32" there instead (config.default_ladder): ORT's CPU provider cannot use the device.
LADDERS: dict[str, tuple[tuple[str, str], ...]] = {
    "text": (("fp32-onnx", "primary"), ("trunc64", "lighter"), ("int8", "quantized")),
    "vision": (("fp32", "primary"), ("res32", "lighter"), ("int8", "quantized")),
}
# Variants that can be asked for by name but are not on the default ladder.
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "text": (("fp32", "primary"), ("minilm-l3", "lighter"), ("bf16", "lighter"), ("fp32-onnx-unfused", "primary")),
    "vision": (),
}

LIGHT_TEXT_LAYERS = 3
LIGHT_TEXT_TOKENS = 64
LIGHT_VISION_RES = 32


def _quantize_dynamic_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of ``model`` with every nn.Linear replaced by a dynamic INT8 one (per-tensor weights)."""
    torch = torch_module()
    with warnings.catch_warnings():
        # torch.ao.quantization announces its deprecation on every call; it still works in 2.13.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model).cpu(), {torch.nn.Linear}, dtype=torch.qint8
        )
    return quantized.eval()


# ---------------------------------------------------------------- text


def _load_text_base() -> tuple[Any, Any]:
    from latencylab.workloads.text import load_model

    return load_model(device="cpu")


def _truncate_layers(model: Any, n_layers: int) -> Any:
    """A copy of a BERT encoder keeping only its first ``n_layers`` transformer layers."""
    light = copy.deepcopy(model)
    light.encoder.layer = light.encoder.layer[:n_layers]
    light.config.num_hidden_layers = n_layers
    return light


def _build_text(names: Sequence[str], max_batch_size: int, device: str) -> list[TextVariant]:
    from latencylab.workloads.text import MODEL_NAME

    tok, base = _load_text_base()
    kinds = dict(LADDERS["text"] + EXTRAS["text"])
    models: dict[str, tuple[Any, str, str]] = {}
    # Derive the copies from the CPU base before the primary (which may be the base itself) moves to the device.
    for name in names:
        if name == "trunc64":
            # Same weights, inputs cut at 64 tokens: the long passages that set the p99 cost a quarter.
            models[name] = (
                base,
                device,
                f"{MODEL_NAME} FP32 with inputs truncated to {LIGHT_TEXT_TOKENS} tokens (same weights, same "
                "embedding space; only texts longer than that change)",
            )
        elif name == "minilm-l3":
            models[name] = (
                _truncate_layers(base, LIGHT_TEXT_LAYERS),
                device,
                f"{MODEL_NAME} FP32 truncated to its first {LIGHT_TEXT_LAYERS} of 6 transformer layers "
                "(no retraining: mean cosine vs FP32 only about 0.28, a different embedding space)",
            )
        elif name == "bf16":
            torch = torch_module()
            models[name] = (
                copy.deepcopy(base).to(torch.bfloat16),
                device,
                f"{MODEL_NAME} with BF16 weights and activations (pooling in FP32); mean cosine vs FP32 "
                "above 0.9999; fast only where the hardware has BF16 matrix units (AVX-512 BF16, AMX, GPUs)",
            )
        elif name == "int8":
            models[name] = (
                _quantize_dynamic_int8(base),
                "cpu",
                f"{MODEL_NAME} with torch dynamic INT8 Linear layers (weights per-tensor INT8, activations "
                "quantised per batch; embeddings and LayerNorm stay FP32); CPU only; mean cosine vs FP32 about 0.95",
            )
    if "fp32" in names:
        models["fp32"] = (base, device, f"{MODEL_NAME} FP32, 6 layers, mean pooling + L2 normalisation")
    built: dict[str, TextVariant] = {}
    for name in ("fp32-onnx", "fp32-onnx-unfused"):
        if name not in names:
            continue
        from latencylab.serve.ort_text import ort_text_variant

        if device != "cpu":
            raise LatencyLabError(f"variant {name!r} runs on the CPU only (ONNX Runtime's CPU provider)")
        fuse = name == "fp32-onnx"
        built[name] = ort_text_variant(
            name,
            kinds[name],
            tok,
            fuse=fuse,
            max_batch_size=max_batch_size,
            description=f"{MODEL_NAME} FP32 exported to ONNX (pooling and normalisation in the graph)"
            + (", transformer kernels fused by ONNX Runtime's optimizer" if fuse else "")
            + ", ONNX Runtime CPU session: the fp32 rung's embeddings up to float rounding",
        )
    return [
        built[name]
        if name in built
        else TextVariant(
            name,
            kinds[name],
            tok,
            models[name][0],
            max_batch_size=max_batch_size,
            device=models[name][1],
            description=models[name][2],
            max_length=LIGHT_TEXT_TOKENS if name == "trunc64" else TEXT_MAX_LENGTH,
        )
        for name in names
    ]


# ---------------------------------------------------------------- vision


def _build_vision(names: Sequence[str], max_batch_size: int, device: str) -> list[VisionVariant]:
    from latencylab.workloads import WorkloadOptions, digits_cnn, vision

    kinds = dict(LADDERS["vision"])
    default_res = vision.VisionSpec().res
    base = None
    if "fp32" in names or "int8" in names:
        base = vision.load_model(WorkloadOptions())
    specs: dict[str, tuple[Any, int, str, str]] = {}
    for name in names:
        if name == "res32":
            light = vision.load_model(WorkloadOptions(params={"res": str(LIGHT_VISION_RES)}))
            specs[name] = (
                light.model,
                LIGHT_VISION_RES,
                device,
                f"{digits_cnn.MODEL_NAME} FP32 trained and served at {LIGHT_VISION_RES}x{LIGHT_VISION_RES} input; "
                f"held-out accuracy {light.test_accuracy:.3f}",
            )
        elif name == "int8":
            assert base is not None
            specs[name] = (
                _quantize_dynamic_int8(base.model),
                default_res,
                "cpu",
                f"{digits_cnn.MODEL_NAME} at {default_res}x{default_res} with a dynamic INT8 classifier "
                "(nn.Linear); the conv layers stay FP32, so most of the compute is unchanged; CPU only",
            )
    if "fp32" in names:
        assert base is not None
        specs["fp32"] = (
            base.model,
            default_res,
            device,
            f"{digits_cnn.MODEL_NAME} FP32 at {default_res}x{default_res} input; "
            f"held-out accuracy {base.test_accuracy:.3f}",
        )
    return [
        VisionVariant(
            name,
            kinds[name],
            specs[name][0],
            specs[name][1],
            max_batch_size=max_batch_size,
            device=specs[name][2],
            description=specs[name][3],
        )
        for name in names
    ]


# ---------------------------------------------------------------- registry

_BUILDERS: dict[str, Callable[[Sequence[str], int, str], Sequence[Variant]]] = {
    "text": _build_text,
    "vision": _build_vision,
}


def build_variants(
    model: str,
    names: Sequence[str] | None = None,
    max_batch_size: int = 8,
    device: str = "cpu",
) -> list[Variant]:
    """The variants ``names`` of built-in ``model`` ("text" or "vision"), in the order given.

    ``names`` defaults to the whole ladder: primary, lighter, quantized
    (:data:`LADDERS`); :data:`EXTRAS` lists variants that exist off the
    default ladder (text ``fp32``, torch eager, and ``bf16``). Weights
    are loaded once per call and shared: the torch rungs serve the loaded model
    or copies of it (except vision ``res32``, a separately trained model from
    the same weights cache); text ``fp32-onnx`` is its cached ONNX export.
    """
    if model not in LADDERS:
        raise LatencyLabError(f"unknown model {model!r}; known models: {', '.join(LADDERS)}")
    ladder = [name for name, _ in LADDERS[model]]
    known = ladder + [name for name, _ in EXTRAS[model]]
    chosen = list(ladder if names is None else names)
    if not chosen:
        raise LatencyLabError(f"no variants requested for model {model!r}; known variants: {', '.join(known)}")
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise LatencyLabError(
            f"unknown variant(s) {', '.join(map(repr, unknown))} of model {model!r}; known variants: {', '.join(known)}"
        )
    if len(set(chosen)) != len(chosen):
        raise LatencyLabError(f"variant names repeat: {chosen}")
    check_max_batch_size(max_batch_size)
    dev = check_device(device)
    return list(_BUILDERS[model](chosen, max_batch_size, dev))
