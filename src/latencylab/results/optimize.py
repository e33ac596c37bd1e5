"""The ``optimize`` result: the lab's search (every candidate's latency and fidelity) and its choice.

The document is built by :func:`latencylab.optimize.lab_summary.result_dict` through :meth:`OptimizeResult.build`;
readers get the same document back with typed accessors (the candidates keep their open-ended fields,
which the report and diagnose read by name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from latencylab.results.base import header
from latencylab.results.document import check_header

KIND = "optimize"
REQUIRED = ("summary", "candidates")


@dataclass(frozen=True, slots=True)
class OptimizeResult:
    """One ``latencylab optimize`` run: ``summary`` (baseline, chosen, speedups, verdict), ``candidates``
    (one document each: name, backend, latency per input set, fidelity, status), ``config``, ``model``, ``env``."""

    doc: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return KIND

    @property
    def schema_version(self) -> int:
        return int(self.doc["schema_version"])

    @property
    def summary(self) -> Mapping[str, Any]:
        return self.doc["summary"]

    @property
    def candidates(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(self.doc["candidates"])

    @property
    def chosen(self) -> str | None:
        """The chosen candidate's name, or None when none passed the budget."""
        name = (self.summary.get("chosen") or {}).get("name")
        return None if name is None else str(name)

    @property
    def baseline(self) -> str | None:
        name = (self.summary.get("baseline") or {}).get("name")
        return None if name is None else str(name)

    @property
    def verdict(self) -> str:
        return str(self.summary.get("verdict", ""))

    @property
    def config(self) -> Mapping[str, Any]:
        return self.doc.get("config") or {}

    @property
    def model(self) -> Mapping[str, Any]:
        return self.doc.get("model") or {}

    @property
    def env(self) -> Mapping[str, Any]:
        return self.doc.get("env") or {}

    def candidate(self, name: str) -> Mapping[str, Any]:
        for c in self.candidates:
            if c.get("name") == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.doc)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OptimizeResult:
        check_header(d, KIND, REQUIRED)
        return cls(dict(d))

    @classmethod
    def build(
        cls,
        summary: Mapping[str, Any],
        config: Mapping[str, Any],
        model: Mapping[str, Any],
        wall_s: float,
        candidates: Sequence[Mapping[str, Any]],
        env: Mapping[str, Any],
    ) -> OptimizeResult:
        return cls(
            {
                **header(KIND),
                "summary": dict(summary),
                "config": dict(config),
                "model": dict(model),
                "wall_s": wall_s,
                "candidates": [dict(c) for c in candidates],
                "env": dict(env),
            }
        )
