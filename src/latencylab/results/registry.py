"""The result kinds: each ``kind`` with its schema version and the class that reads it.

A result document is a JSON object whose ``kind`` names one entry of :data:`KINDS`. The entry says which
``schema_version`` this latencylab writes and reads, and where the typed, frozen class that parses the document
lives (``"module:Class"``, imported only when a document of that kind is parsed, so that ``load`` can register
its :class:`~latencylab.load.results.LoadResult` without this module importing the load generator).

Every class implements :class:`Result`: ``kind``, ``schema_version``, ``to_dict()`` and ``from_dict(doc)``.
A new result kind adds one entry here (with a line of history) and one such class.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from latencylab.errors import LatencyLabError

__all__ = ["KINDS", "SCHEMA_VERSION", "Result", "ResultKind", "kind_version", "parse", "register", "result_class"]

SCHEMA_VERSION = 1  # the version of a kind not in KINDS (and of every kind so far)


@runtime_checkable
class Result(Protocol):
    """What every result class provides (its ``from_dict`` classmethod reads a document back)."""

    @property
    def kind(self) -> str: ...

    @property
    def schema_version(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class ResultKind:
    """One result kind: its schema version, its class (``"module:Class"``) and the history of its versions."""

    kind: str
    version: int
    loader: str
    history: str


KINDS: dict[str, ResultKind] = {}


def register(kind: str, version: int, loader: str, history: str) -> None:
    """Add (or replace) a result kind; ``loader`` is ``"module:Class"`` with a ``from_dict`` classmethod."""
    KINDS[kind] = ResultKind(kind, version, loader, history)


# History, as pyperf keeps it: a version changes only when a reader of the old files would misread them;
# optional keys added later are read as empty from older files and keep the version.
register(
    "profile",
    1,
    "latencylab.results.profile:ProfileResult",
    "1: stages' raw samples_ns + summary; later, optional: iteration_meta, iteration_run, runs",
)
register(
    "load",
    1,
    "latencylab.load.results:LoadResult",
    "1: HDR histograms, timeline, summary; later, optional: capacity, server",
)
register(
    "optimize",
    1,
    "latencylab.results.optimize:OptimizeResult",
    "1: summary, candidates, config, model, env; with --out: artifact, recipe, out_removed",
)
register(
    "optimize-gen",
    1,
    "latencylab.results.optimize_gen:OptimizeGenResult",
    "1: summary (budget, baseline, chosen, verdict, speedups), candidates (fidelity, TTFT/TPOT), model, config, "
    "inputs, env; with --out or --recipe: recipe",
)
for _kind in ("shape-policy", "pipeline-overlap", "sweep"):
    register(
        _kind,
        1,
        "latencylab.results.experiment:ExperimentResult",
        "1: the experiment's config, raw per-call samples_ns of each variant, conclusion, env",
    )
register("capacity", 1, "latencylab.results.document:Document", "1: capacity, repeats (load --find-capacity)")
register(
    "serve",
    1,
    "latencylab.results.document:Document",
    "1: the guard's ladder over time: samples, transitions (serve --timeline)",
)
register("recipe", 1, "latencylab.results.document:Document", "1: the chosen variant and how to rebuild it")
register("diagnose", 1, "latencylab.results.document:Document", "1: findings over result files")
register("roofline-peaks", 1, "latencylab.results.document:Document", "1: measured peaks of one machine")


def kind_version(kind: str) -> int:
    """The schema version this latencylab writes and reads for ``kind``."""
    entry = KINDS.get(kind)
    return entry.version if entry is not None else SCHEMA_VERSION


def result_class(kind: str) -> Any:
    """The class that parses documents of ``kind`` (imported now)."""
    entry = KINDS.get(kind)
    if entry is None:
        raise LatencyLabError(f"unknown result kind {kind!r}; latencylab reads {', '.join(KINDS)}")
    module, _, name = entry.loader.partition(":")
    return getattr(importlib.import_module(module), name)


def parse(doc: Mapping[str, Any]) -> Any:
    """The typed, frozen result of a document, by its ``kind`` (one-line :class:`LatencyLabError` otherwise)."""
    return result_class(str(doc.get("kind"))).from_dict(doc)
