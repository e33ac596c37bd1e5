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

The family is a package along those lines: :mod:`.common` (constants, content-addressed files),
:mod:`.runner`, :mod:`.graph` (graph helpers and the FP32/fused sources), :mod:`.calibration`,
:mod:`.quantisation` and :mod:`.grid` (the candidates).
"""

from __future__ import annotations

from latencylab.optimize.families.onnxruntime.calibration import FeedReader, ema_sigma_ranges
from latencylab.optimize.families.onnxruntime.common import BACKEND, NOT_A_TRANSFORMER
from latencylab.optimize.families.onnxruntime.graph import detect_encoder, first_last_compute, quantisable_nodes
from latencylab.optimize.families.onnxruntime.grid import build_runner, candidate_from_params, candidates
from latencylab.optimize.families.onnxruntime.quantisation import output_error, sensitivity
from latencylab.optimize.families.onnxruntime.runner import SHAPE_POLICIES, OrtRunner, trim_padding

__all__ = [
    "BACKEND",
    "NOT_A_TRANSFORMER",
    "SHAPE_POLICIES",
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
    "trim_padding",
]
