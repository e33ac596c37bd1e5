"""The runner: one OpenVINO CPU compiled model over an ``openvino.Model``, with its shape policy, and
optionally one model reshaped to each static input shape it meets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from latencylab.optimize import shapes
from latencylab.optimize.families import feeds
from latencylab.optimize.families.openvino.common import compile_model, save_ir
from latencylab.optimize.families.static_shapes import PerShape, ShapeKey
from latencylab.optimize.types import Feed

# Static shapes (one compiled model per distinct input shape, at most MAX_STATIC_SHAPES): a shape beyond them
# runs on the dynamic model.


class OvRunner:
    """An OpenVINO CPU inference request over ``model`` (``openvino.Model``), compiled by
    :func:`~.common.compile_model` (``threads``, ``precision``).

    ``run(feed)`` applies ``shape_policy`` (:mod:`latencylab.optimize.shapes`), counts the positions it ran
    (``tokens``) and returns the first output as float32. With ``static``, each distinct input shape gets the
    model reshaped to it and compiled on first sight (up to :data:`MAX_STATIC_SHAPES`; the search's fidelity
    pass sees every held-out shape before it times anything, so no compile lands in a timed call).
    ``export_artifact(dir)`` writes the (dynamic) model as OpenVINO IR: what ``optimize --out`` exports.
    """

    def __init__(
        self,
        model: Any,
        threads: int = 1,
        precision: str = "f32",
        stats: dict[str, Any] | None = None,
        shape_policy: str = shapes.AS_GIVEN,
        static: bool = False,
    ) -> None:
        self.model = model
        self.threads = int(threads)
        self.precision = precision
        self.shape_policy = shapes.normalise(shape_policy)
        self.static = bool(static)
        self.tokens = shapes.TokenCounter()
        self.input_names = tuple(i.get_any_name() for i in model.inputs)
        self._dynamic = compile_model(model, self.threads, precision)
        self._request = self._dynamic.create_infer_request()
        self._static: PerShape[Any] = PerShape(self._compile_static)
        self.stats: dict[str, Any] = {"precision": precision, "static_shapes": 0, **(stats or {})}

    def _compile_static(self, key: ShapeKey) -> Any:
        m = self.model.clone()
        m.reshape({n: list(s) for n, s in key})
        req = compile_model(m, self.threads, self.precision).create_infer_request()
        self.stats["static_shapes"] = len(self._static) + 1
        return req

    def _request_for(self, inputs: dict[str, np.ndarray]) -> Any:
        if not self.static:
            return self._request
        req = self._static.get(inputs)
        if req is None:
            self.stats["dynamic_calls"] = int(self.stats.get("dynamic_calls", 0)) + 1
            return self._request
        return req

    def run(self, feed: Feed) -> np.ndarray:
        inputs = shapes.apply(feeds.pick(feed, self.input_names), self.shape_policy)
        self.tokens.count(inputs)
        req = self._request_for(inputs)
        req.infer(inputs)
        return np.array(req.get_output_tensor(0).data, dtype=np.float32)

    def export_artifact(self, out_dir: Path) -> Path:
        """``out_dir/model.xml`` + ``model.bin``: the model as OpenVINO IR, its inference precision recorded."""
        return save_ir(self.model, Path(out_dir) / "model.xml", self.precision)

    def close(self) -> None:
        self._static.clear()
        self._request = None
        self._dynamic = None
