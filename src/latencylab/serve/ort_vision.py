"""An image classifier served through ONNX Runtime: any ONNX graph ``pixels`` (float32 (N, 3, res, res)) ->
``logits`` (N, classes), such as the vision model that ``latencylab optimize --out`` exports.

Decoding, resizing and normalising are the vision workload's own functions, as for the torch rungs
(:class:`latencylab.serve.variants_vision.VisionVariant`, which this class reuses whole): only the forward call
runs in an ONNX Runtime CPU session instead of torch. ``res`` and the number of classes are read from the
graph's fixed input and output dimensions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.serve.ort_text import OrtSessionKnobs, ort_session
from latencylab.serve.variants_vision import VisionVariant

__all__ = ["OrtVisionVariant", "vision_shape"]


def vision_shape(session: Any) -> tuple[int, int]:
    """(res, classes) of a ``pixels`` -> ``logits`` session, or a LatencyLabError saying what does not fit."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if [i.name for i in inputs] != ["pixels"] or inputs[0].type != "tensor(float)":
        got = ", ".join(f"{i.name} {i.type}" for i in inputs)
        raise LatencyLabError(f"an ONNX vision model takes one input, pixels tensor(float); this one takes {got}")
    shape = list(inputs[0].shape)
    if len(shape) != 4 or shape[1] != 3 or not isinstance(shape[2], int) or shape[2] != shape[3]:
        raise LatencyLabError(f"pixels must be (batch, 3, res, res) with a fixed res, got {shape}")
    if not outputs or outputs[0].name != "logits" or len(outputs[0].shape) != 2:
        got = ", ".join(f"{o.name} {list(o.shape)}" for o in outputs)
        raise LatencyLabError(f"an ONNX vision model's first output is logits (batch, classes); this one has {got}")
    classes = outputs[0].shape[1]
    if not isinstance(classes, int):
        raise LatencyLabError(f"the logits' class dimension must be fixed, got {classes!r}")
    return int(shape[2]), int(classes)


class _SessionModule:
    """The torch-module face :class:`VisionVariant` expects (``to``, ``eval``, call on a tensor) over a session."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def to(self, device: str) -> _SessionModule:
        return self

    def eval(self) -> _SessionModule:
        return self

    def __call__(self, x: Any) -> Any:
        import torch

        out = self.session.run(None, {"pixels": np.ascontiguousarray(x.numpy(), dtype=np.float32)})[0]
        return torch.from_numpy(np.asarray(out, dtype=np.float32))


class OrtVisionVariant(OrtSessionKnobs, VisionVariant):
    """A :class:`VisionVariant` whose classifier is an ONNX Runtime CPU session over ``path``.

    ``graph`` is the session's graph optimisation level (serve/ort_text.py, ``GRAPH_LEVELS``); ``threads`` its
    intra-op threads (the config's ``ort_threads`` resets it, ``ort_spin_us`` caps idle spinning, as for the
    text rungs).
    """

    def __init__(
        self,
        name: str,
        kind: str,
        path: Path,
        *,
        threads: int = 1,
        graph: str = "all",
        max_batch_size: int = 8,
        description: str = "",
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise LatencyLabError(f"{path}: no such ONNX model file")
        self.threads = max(1, int(threads))
        self.graph = graph
        self._spin_us: int | None = None
        self.provenance: dict[str, Any] = {}
        self._module = _SessionModule(ort_session(self.path, self.threads, None, graph))
        try:
            res, classes = vision_shape(self._module.session)
        except LatencyLabError as exc:
            raise LatencyLabError(f"{path}: {exc}") from None
        super().__init__(
            name, kind, self._module, res, max_batch_size=max_batch_size, description=description, n_classes=classes
        )

    def _rebuild(self, spin: bool = False) -> None:
        self._module.session = ort_session(self.path, self.threads, self._spin_us, self.graph)
