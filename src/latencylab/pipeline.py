"""A Pipeline of named stages: what the profiler times.

A user builds one in a few lines::

    pipe = Pipeline("my-model", source=lambda i: texts[i % len(texts)])
    pipe.stage("preprocess", tokenize, kind="preprocess")
    pipe.stage("forward", model_forward, kind="forward")
    pipe.stage("postprocess", pool, kind="postprocess")

Each stage is a one-argument callable; the output of one stage is the input
of the next. ``source(i)`` produces the i-th input and is *not* timed (put
reading from disk in a ``load`` stage if it belongs in the budget).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from latencylab.clock import Clock
from latencylab.errors import LatencyLabError

STAGE_KINDS = ("load", "preprocess", "transfer", "forward", "postprocess", "network", "other")


@dataclass(frozen=True, slots=True)
class Stage:
    """One named step. ``kind`` is one of STAGE_KINDS (used by diagnose rules)."""

    name: str
    fn: Callable[[Any], Any]
    kind: str = "other"

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise LatencyLabError(f"stage name {self.name!r} must be alphanumeric (with - or _)")
        if self.kind not in STAGE_KINDS:
            raise LatencyLabError(f"stage kind {self.kind!r} is not one of {', '.join(STAGE_KINDS)}")
        if not callable(self.fn):
            raise LatencyLabError(f"stage {self.name!r}: fn is not callable")


@dataclass(slots=True)
class Pipeline:
    """Named stages run in order on inputs drawn from ``source``.

    ``device`` says where the pipeline's tensors live ("cpu", "cuda", "cuda:1");
    the profiler picks a device-correct clock from it, unless ``clock`` names the
    pipeline's own (a synthetic pipeline on a ``FakeClock``: its stages advance
    that clock, so only that clock measures them). ``metadata`` is recorded
    verbatim in results (model name, batch size, sequence lengths...).
    ``close`` is called once when profiling ends. ``probe(i)``, if set, is
    called after iteration ``i`` (outside the timed region) and returns small
    JSON-safe facts about it (input shape, compile events...); the profiler
    stores them per timed iteration in ``ProfileResult.iteration_meta``.
    """

    name: str
    source: Callable[[int], Any]
    stages: list[Stage] = field(default_factory=list)
    device: str = "cpu"
    metadata: dict[str, Any] = field(default_factory=dict)
    close: Callable[[], None] | None = None
    probe: Callable[[int], Mapping[str, Any]] | None = None
    clock: Clock | None = None

    def stage(self, name: str, fn: Callable[[Any], Any], kind: str = "other") -> Pipeline:
        """Append a stage; returns the pipeline so calls can chain."""
        if any(s.name == name for s in self.stages):
            raise LatencyLabError(f"pipeline {self.name!r} already has a stage named {name!r}")
        self.stages.append(Stage(name, fn, kind))
        return self

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def run_once(self, i: int = 0) -> Any:
        """Run every stage on input ``i`` untimed (for checks and warm-up)."""
        x = self.source(i)
        for s in self.stages:
            x = s.fn(x)
        return x

    def validate(self) -> None:
        if not self.stages:
            raise LatencyLabError(f"pipeline {self.name!r} has no stages")

    def describe(self) -> Mapping[str, Any]:
        return {
            "name": self.name,
            "device": self.device,
            "stages": [{"name": s.name, "kind": s.kind} for s in self.stages],
            "metadata": dict(self.metadata),
        }
