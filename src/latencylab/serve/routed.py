"""A length-routed text rung: ``route.json`` (what ``optimize --out`` writes when it chooses a ``route-*``
candidate, optimize/families/routed.py) names an ONNX file for short inputs, an OpenVINO IR for long ones, and
the width ``at`` from which a batch goes to the long one.

:class:`RoutedTextVariant` is the ONNX Runtime text variant (its tokenisation, length groups, batching and
postprocessing) with an OpenVINO model beside its session: a batch whose padded width is ``at`` or more runs on
OpenVINO, any other on ONNX Runtime, as the search measured it (per feed, on the mask's width).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.serve.ort_text import OrtTextVariant

__all__ = ["RoutedTextVariant", "check_route_interface", "read_route"]


def read_route(path: Path) -> tuple[int | None, Path, Path]:
    """``(at, short ONNX file, long IR file)`` of a ``route.json``; a LatencyLabError naming what is wrong."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LatencyLabError(f"{path}: not a readable route file ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "route":
        raise LatencyLabError(f"{path}: not a latencylab route file (kind 'route')")
    at = doc.get("at")
    if at is not None and (not isinstance(at, int) or isinstance(at, bool) or at < 1):
        raise LatencyLabError(f"{path}: 'at' must be a number of positions >= 1 or null, got {at!r}")
    root = Path(path).parent
    short, long = root / str(doc.get("short") or ""), root / str(doc.get("long") or "")
    if short.suffix != ".onnx" or long.suffix != ".xml":
        raise LatencyLabError(f"{path}: a route names an ONNX file (short) and an OpenVINO IR (long)")
    for p in (short, long):
        if not p.is_file():
            raise LatencyLabError(f"{p}: the route's member file is missing")
    return at, short, long


def check_route_interface(path: Path, workload: str) -> None:
    """Both members of the route at ``path`` have the text workload's serving interface."""
    if workload != "text":
        raise LatencyLabError(f"{path}: a length-routed variant serves text only, not {workload}")
    from latencylab.serve.from_optimize import check_interface

    _, short, long = read_route(path)
    check_interface(short, workload)
    check_interface(long, workload)


class RoutedTextVariant(OrtTextVariant):
    """An ONNX Runtime text variant that runs batches of ``at`` positions or more on an OpenVINO IR."""

    RUNTIME = "ONNX Runtime + OpenVINO"

    def __init__(self, name: str, kind: str, tokenizer: Any, route: Path, *, threads: int = 1, **kw: Any) -> None:
        from latencylab.serve.ov_runner import OvModel, check_ov_interface

        self.route = Path(route)
        self.at, short, long = read_route(self.route)
        self.ov = OvModel(long, max(1, int(threads)))
        check_ov_interface(self.ov, "text")
        self.routed = [0, 0]  # batches run short, long
        super().__init__(name, kind, tokenizer, short, threads=threads, fuse=None, **kw)

    def _rebuild(self, spin: bool = False) -> None:
        """The session rebuilt (the threads knob, the spin setting); the OpenVINO model follows the threads."""
        super()._rebuild(spin)
        if self.ov.intra_op_threads != self.threads:
            self.ov.intra_op_threads = self.threads

    def _encode(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self.at is not None and input_ids.shape[1] >= self.at:
            self.routed[1] += 1
            return self.ov.run({"input_ids": input_ids, "attention_mask": mask})
        self.routed[0] += 1
        return super()._encode(input_ids, mask)
