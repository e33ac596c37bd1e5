"""OpenVINO candidates (``--families openvino``; ``pip install 'latencylab[openvino]'``).

``candidates(ctx)`` lists, from the same FP32 ONNX export as the ONNX Runtime family:

* ``ov-fp32`` (dynamic shapes) and ``ov-fp32-static`` (the model reshaped and compiled per distinct input
  shape, at most :data:`~..static_shapes.MAX_STATIC_SHAPES`, else skipped with the count): the CPU plugin at FP32
  inference precision;
* NNCF post-training INT8 (``nncf.quantize``, calibrated on ``adapter.calibration()`` only): its defaults at
  OpenVINO's default precision (``ov-int8-default``, the peer recipe optimum-intel users get: BF16 for the
  float ops on a CPU that has BF16), its defaults with the rest in FP32 (``ov-int8``), and
  ``model_type=TRANSFORMER`` (``ov-int8-transformer``, also ``-static``; transformer encoders only);
* NNCF's accuracy-control loop (``quantize_with_accuracy_control``) within latencylab's own fidelity budget,
  validated on held-out feeds only (``ov-int8-ac``, ``ov-int8-transformer-ac``; :mod:`.accuracy`);
* weight-only INT8 (``nncf.compress_weights``, ``ov-int8-weights``; the CPU plugin then quantises the activations
  on the fly, so its arithmetic is INT8 too);
* length-routed pairs (``route-*``, :mod:`latencylab.optimize.families.routed`): an ONNX Runtime INT8 candidate
  for short inputs, OpenVINO's transformer INT8 from a crossover length measured at build time.

Thread settings equal the other families' (one stream, ``ctx.threads`` threads, the latency hint: see
:mod:`.common`). A candidate's ``params`` are its whole recipe; :func:`candidate_from_params` rebuilds it. The
chosen candidate is exported as OpenVINO IR (``model.xml`` + ``model.bin``), which ``latencylab serve --from``
serves (:mod:`latencylab.serve.ov_runner`).
"""

from __future__ import annotations

from latencylab.optimize.families.openvino.common import BACKEND, compile_config, compile_model, save_ir
from latencylab.optimize.families.openvino.grid import build_runner, candidate_from_params, load_ir
from latencylab.optimize.families.openvino.grid import candidates as grid_candidates
from latencylab.optimize.families.openvino.runner import OvRunner
from latencylab.optimize.families.static_shapes import MAX_STATIC_SHAPES
from latencylab.optimize.types import BuildContext, Candidate


def candidates(ctx: BuildContext) -> list[Candidate]:
    """The OpenVINO grid, then the length-routed ONNX Runtime / OpenVINO pairs."""
    from latencylab.optimize.families import routed

    return [*grid_candidates(ctx), *routed.candidates(ctx)]


__all__ = [
    "BACKEND",
    "MAX_STATIC_SHAPES",
    "OvRunner",
    "build_runner",
    "candidate_from_params",
    "candidates",
    "compile_config",
    "compile_model",
    "grid_candidates",
    "load_ir",
    "save_ir",
]
