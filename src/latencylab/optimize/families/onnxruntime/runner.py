"""The runner: one ONNX Runtime session over a model file, with its shape policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.optimize import shapes
from latencylab.optimize.families.onnxruntime.common import _ort, session_options
from latencylab.optimize.types import Feed

SHAPE_POLICIES = shapes.POLICIES
trim_padding = shapes.trim_padding  # re-exported: it lived here first


class OrtRunner:
    """One ``InferenceSession`` on the CPU provider: ``threads`` intra-op threads, one inter-op, sequential.

    ``run(feed)`` passes the session's inputs from the feed and returns the first output as float32.
    ``shape_policy`` (:mod:`latencylab.optimize.shapes`) is applied to every feed first (``exact`` trims right
    padding); ``tokens`` counts the sequence positions each call really ran.
    ``stats`` describes the built artifact (file, size, fusions, excluded nodes ...) for the search's record.
    """

    def __init__(
        self,
        path: Path,
        threads: int = 1,
        graph_optimization: str = "all",
        stats: dict[str, Any] | None = None,
        shape_policy: str = shapes.AS_GIVEN,
    ) -> None:
        ort = _ort()
        self.shape_policy = shapes.normalise(shape_policy)
        self.tokens = shapes.TokenCounter()
        so = session_options(threads, graph_optimization)
        self.path = Path(path)
        self.session = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_name = self.session.get_outputs()[0].name
        self.stats: dict[str, Any] = {"model_file": str(path), "model_bytes": self.path.stat().st_size, **(stats or {})}

    def run(self, feed: Feed) -> np.ndarray:
        try:
            inputs = {n: feed[n] for n in self.input_names}
        except KeyError as exc:
            raise LatencyLabError(
                f"feed has no input {exc.args[0]!r}; the model wants {list(self.input_names)}"
            ) from exc
        inputs = shapes.apply(inputs, self.shape_policy)
        self.tokens.count(inputs)
        out = self.session.run([self.output_name], inputs)[0]
        return np.asarray(out, dtype=np.float32)

    @property
    def model_path(self) -> Path:
        """The ONNX file this session runs (what ``optimize --out`` exports)."""
        return self.path

    def close(self) -> None:
        self.session = None
