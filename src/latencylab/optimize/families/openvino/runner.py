"""The runner: one OpenVINO CPU compiled model over an ``openvino.Model``, with its shape policy, and
optionally one model reshaped to each static input shape it meets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.optimize import shapes
from latencylab.optimize.families.openvino.common import compile_model, save_ir
from latencylab.optimize.types import Feed

# Static shapes: one compiled model per distinct input shape, at most this many (a few shapes that cover the
# real lengths, as TensorRT's optimisation profiles do); a shape beyond them runs on the dynamic model.
MAX_STATIC_SHAPES = 8

ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]


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
        self._static: dict[ShapeKey, Any] = {}
        self.stats: dict[str, Any] = {"precision": precision, "static_shapes": 0, **(stats or {})}

    def _request_for(self, inputs: dict[str, np.ndarray]) -> Any:
        if not self.static:
            return self._request
        key: ShapeKey = tuple((n, tuple(int(d) for d in a.shape)) for n, a in inputs.items())
        req = self._static.get(key)
        if req is None:
            if len(self._static) >= MAX_STATIC_SHAPES:
                self.stats["dynamic_calls"] = int(self.stats.get("dynamic_calls", 0)) + 1
                return self._request
            m = self.model.clone()
            m.reshape({n: list(s) for n, s in key})
            req = compile_model(m, self.threads, self.precision).create_infer_request()
            self._static[key] = req
            self.stats["static_shapes"] = len(self._static)
        return req

    def run(self, feed: Feed) -> np.ndarray:
        try:
            inputs = {n: np.ascontiguousarray(feed[n]) for n in self.input_names}
        except KeyError as exc:
            raise LatencyLabError(
                f"feed has no input {exc.args[0]!r}; the model wants {list(self.input_names)}"
            ) from exc
        inputs = shapes.apply(inputs, self.shape_policy)
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
