"""Models served through OpenVINO's CPU plugin: an OpenVINO IR (``model.xml`` + ``model.bin``, what
``latencylab optimize --families ...,openvino --out DIR`` exports when it chooses an OpenVINO candidate).

The same interfaces as the ONNX Runtime rungs (serve/ort_text.py, serve/ort_vision.py), and the same
tokenisation, length groups, preprocessing and postprocessing (the variants reuse :class:`TextVariant` and
:class:`VisionVariant` whole): only the forward call runs in an OpenVINO inference request. Each rung is
compiled as the search measured it: one stream, its thread count, the latency hint, and the inference precision
the IR records (``f32`` unless the search chose OpenVINO's default). A request is one ``InferRequest``, which is
not safe to share between threads: the variant keeps one per calling thread.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.serve.ort_text import CpuTextVariant
from latencylab.serve.variants_vision import VisionVariant

__all__ = ["OvModel", "OvTextVariant", "OvVisionVariant", "check_ov_interface"]


class OvModel:
    """One IR compiled for the CPU, with an inference request per calling thread; ``run(inputs)`` returns the
    first output as float32. ``threads`` can be reset (the config's ``ort_threads`` knob): that recompiles."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        from latencylab.optimize.families.openvino.common import core, read_precision

        self.path = Path(path)
        if not self.path.is_file() or not self.path.with_suffix(".bin").is_file():
            raise LatencyLabError(f"{path}: no OpenVINO IR there (model.xml and its model.bin)")
        try:
            self.model = core().read_model(str(self.path))
        except Exception as exc:  # OpenVINO raises its own RuntimeError subclasses for unreadable models
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise LatencyLabError(f"{path}: OpenVINO cannot read it ({type(exc).__name__}: {first})") from None
        self.precision = read_precision(self.model) or "f32"
        self.threads = max(1, int(threads))
        self._local = threading.local()
        self._compile()

    def _compile(self) -> None:
        from latencylab.optimize.families.openvino.common import compile_model

        self.compiled = compile_model(self.model, self.threads, self.precision)
        self._local = threading.local()  # requests of the old compiled model are dropped

    @property
    def intra_op_threads(self) -> int:
        return self.threads

    @intra_op_threads.setter
    def intra_op_threads(self, n: int) -> None:
        self.threads = max(1, int(n))
        self._compile()

    def inputs(self) -> list[tuple[str, str, list[Any]]]:
        """(name, element type, shape with None for dynamic dimensions) of each input."""
        return [(i.get_any_name(), i.get_element_type().get_type_name(), _dims(i.get_partial_shape()))
                for i in self.model.inputs]  # fmt: skip

    def outputs(self) -> list[tuple[str, str, list[Any]]]:
        return [(o.get_any_name(), o.get_element_type().get_type_name(), _dims(o.get_partial_shape()))
                for o in self.model.outputs]  # fmt: skip

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        req = getattr(self._local, "request", None)
        if req is None:
            req = self._local.request = self.compiled.create_infer_request()
        req.infer({n: np.ascontiguousarray(a) for n, a in inputs.items()})
        return np.array(req.get_output_tensor(0).data, dtype=np.float32)


def _dims(shape: Any) -> list[Any]:
    return [d.get_length() if d.is_static else None for d in shape]


def check_ov_interface(model: OvModel, workload: str) -> None:
    """Raise a LatencyLabError unless ``model`` has the workload's serving interface (as for ONNX rungs)."""
    ins, outs = model.inputs(), model.outputs()
    if workload == "vision":
        if [(n, t) for n, t, _ in ins] != [("pixels", "f32")]:
            raise LatencyLabError(f"{model.path}: a vision model takes one input, pixels f32; this one takes {ins}")
        shape = ins[0][2]
        if len(shape) != 4 or shape[1] != 3 or shape[2] is None or shape[2] != shape[3]:
            raise LatencyLabError(f"{model.path}: pixels must be (batch, 3, res, res) with a fixed res, got {shape}")
        if not outs or outs[0][0] != "logits" or len(outs[0][2]) != 2 or outs[0][2][1] is None:
            raise LatencyLabError(f"{model.path}: a vision model's first output is logits (batch, classes); got {outs}")
        return
    if sorted((n, t) for n, t, _ in ins) != [("attention_mask", "i64"), ("input_ids", "i64")]:
        raise LatencyLabError(
            f"{model.path}: a text model takes input_ids and attention_mask, int64; this one takes {ins}"
        )
    if not outs or outs[0][0] != "embedding" or len(outs[0][2]) != 2 or outs[0][2][1] is None:
        raise LatencyLabError(
            f"{model.path}: a text model's first output is embedding (batch, hidden) with a fixed hidden; got {outs}"
        )


class OvTextVariant(CpuTextVariant):
    """A :class:`TextVariant` whose encoder is an OpenVINO IR (``input_ids``, ``attention_mask`` -> ``embedding``)."""

    RUNTIME = "OpenVINO"

    def __init__(self, name: str, kind: str, tokenizer: Any, path: Path, *, threads: int = 1, **kw: Any) -> None:
        self.path = Path(path)
        super().__init__(name, kind, tokenizer, self.path, threads=threads, **kw)

    def _bind(self, model: Any) -> int:
        self.ov = OvModel(Path(model), self.threads)
        check_ov_interface(self.ov, "text")
        self.module = None
        return int(self.ov.outputs()[0][2][1])

    @property
    def intra_op_threads(self) -> int:
        return self.ov.intra_op_threads

    @intra_op_threads.setter
    def intra_op_threads(self, n: int) -> None:
        self.threads = max(1, int(n))
        self.ov.intra_op_threads = self.threads

    def _encode(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.ov.run({"input_ids": input_ids, "attention_mask": mask})


class _OvModule:
    """The torch-module face :class:`VisionVariant` expects (``to``, ``eval``, call on a tensor) over an IR."""

    def __init__(self, model: OvModel) -> None:
        self.ov = model

    def to(self, device: str) -> _OvModule:
        return self

    def eval(self) -> _OvModule:
        return self

    def __call__(self, x: Any) -> Any:
        import torch

        return torch.from_numpy(self.ov.run({"pixels": np.ascontiguousarray(x.numpy(), dtype=np.float32)}))


class OvVisionVariant(VisionVariant):
    """A :class:`VisionVariant` whose classifier is an OpenVINO IR (``pixels`` -> ``logits``)."""

    def __init__(
        self, name: str, kind: str, path: Path, *, threads: int = 1, max_batch_size: int = 8, description: str = ""
    ) -> None:
        self.path = Path(path)
        self.provenance: dict[str, Any] = {}
        self.ov = OvModel(self.path, threads)
        check_ov_interface(self.ov, "vision")
        _, _, shape = self.ov.inputs()[0]
        classes = int(self.ov.outputs()[0][2][1])
        super().__init__(name, kind, _OvModule(self.ov), int(shape[2]), max_batch_size=max_batch_size,
                         description=description, n_classes=classes)  # fmt: skip

    @property
    def intra_op_threads(self) -> int:
        return self.ov.intra_op_threads

    @intra_op_threads.setter
    def intra_op_threads(self, n: int) -> None:
        self.ov.intra_op_threads = n
