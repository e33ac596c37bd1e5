"""The contract between model adapters, candidate families and the search.

* A **ModelAdapter** knows one model: its FP32 torch module (taking and returning tensors), how to export
  it to ONNX, and its inputs: held-out feeds (fidelity and latency are measured on these, never on the
  calibration feeds), calibration feeds, and labels where a task metric exists.
* A **Candidate** is one optimisation variant: a name, a family, the backend, the parameters that rebuild
  it (they go into the recipe), and ``build(ctx) -> Runner``. A candidate that cannot run on this machine
  says why in ``skip_reason(ctx)`` and is reported as skipped, never silently dropped.
* A **Runner** runs a feed and returns the model output as a float numpy array (B, D).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

Feed = dict[str, np.ndarray]  # input name -> array (int64 token ids / float32 pixels), batch first


@runtime_checkable
class Runner(Protocol):
    def run(self, feed: Feed) -> np.ndarray: ...

    def close(self) -> None: ...


@runtime_checkable
class ModelAdapter(Protocol):
    name: str  # "text", "vision", "onnx:<file>", ...
    input_names: tuple[str, ...]
    output_kind: str  # "embedding" (compare by cosine) | "logits" (compare by top-1 agreement + accuracy)

    def torch_model(self) -> Any:
        """The FP32 torch.nn.Module (eval mode, CPU): forward(*[feed[n] as tensors for n in input_names])."""
        ...

    def export_onnx(self, path: Path, opset: int = 17) -> Path:
        """Export the FP32 model to ONNX with dynamic batch (and sequence) axes; returns the path."""
        ...

    def heldout(self) -> list[Feed]:
        """Feeds for fidelity and latency (never used for calibration)."""
        ...

    def calibration(self) -> list[Feed]:
        """Feeds for static-quantisation calibration and sensitivity analysis (disjoint from heldout)."""
        ...

    def labels(self) -> np.ndarray | None:
        """Task labels aligned with ``heldout()`` (one per row, concatenated), or None."""
        ...

    def describe(self) -> dict[str, Any]: ...


def input_sets(adapter: ModelAdapter) -> dict[str, list[Feed]]:
    """Held-out input sets, name -> feeds, the primary (``heldout()``) first.

    An adapter may offer several (``input_sets()``, e.g. the text workload's natural-length sentences and
    passages of exactly 128 real tokens): fidelity must hold on each, and latency is reported on each.
    Without that method there is one set, ``heldout``.
    """
    fn = getattr(adapter, "input_sets", None)
    sets = dict(fn()) if callable(fn) else {"heldout": adapter.heldout()}
    if not sets or not all(sets.values()):
        raise ValueError(f"adapter {adapter.name!r}: every input set needs at least one feed")
    return sets


@dataclass(slots=True)
class BuildContext:
    """What candidates are built from; shared, built once per run."""

    adapter: ModelAdapter
    workdir: Path  # scratch space for exported / quantised files
    threads: int = 1
    device: str = "cpu"
    isa: frozenset[str] = frozenset()  # CPU flags from the env fingerprint (avx512_bf16, amx_tile, ...)
    cache: dict[str, Any] = field(default_factory=dict)  # e.g. the exported FP32 ONNX path, reused

    def input_sets(self) -> dict[str, list[Feed]]:
        """The adapter's held-out input sets (name -> feeds), the primary first; see :func:`input_sets`."""
        got = self.cache.get("input_sets")
        if got is None:
            got = input_sets(self.adapter)
            self.cache["input_sets"] = got
        return dict(got)

    def all_feeds(self) -> list[Feed]:
        """Every held-out feed of every input set."""
        return [f for feeds in self.input_sets().values() for f in feeds]

    def fp32_onnx(self) -> Path:
        """The FP32 ONNX export, made once."""
        p = self.cache.get("fp32_onnx")
        if p is None:
            p = self.adapter.export_onnx(self.workdir / "fp32.onnx")
            self.cache["fp32_onnx"] = p
        return Path(p)


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str  # unique, e.g. "ort-int8-dynamic-perchannel"
    family: str  # precision | int8-dynamic | int8-static | mixed | prune | fusion | compile | graph
    backend: str  # torch | torch-compile | onnxruntime
    params: Mapping[str, Any]  # everything needed to rebuild it (goes into the recipe)
    build: Callable[[BuildContext], Runner]
    skip_reason: Callable[[BuildContext], str | None] = lambda ctx: None
    description: str = ""
    # What the candidate does to the inputs before its model runs (latencylab.optimize.shapes): "as-given",
    # or a pipeline change such as "exact", whose gain is reported apart from the model speedup.
    input_policy: str = "as-given"
    # An intermediate this candidate's build makes and others with the same key reuse (e.g. the ORT family's
    # per-node sensitivity ranking behind every "-fallback-kN" of one recipe); "" when none. A distributed search
    # (scaleout/optimize_ray.py) builds one member of a group at a time, so the others find it made.
    shares: str = ""


# A family module exposes: def candidates(ctx: BuildContext) -> Sequence[Candidate]
CandidateFamily = Callable[[BuildContext], Sequence[Candidate]]
