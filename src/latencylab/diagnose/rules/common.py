"""Helpers the rules share: typed views of loaded results and small formatting functions."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from latencylab.diagnose.types import LoadedResult
from latencylab.results import ProfileResult


def of_kind(results: Sequence[LoadedResult], kind: str) -> Iterator[LoadedResult]:
    return (r for r in results if r.kind == kind)


def profiles(results: Sequence[LoadedResult]) -> Iterator[tuple[LoadedResult, ProfileResult]]:
    """Each profile result with its parsed ProfileResult (``load_result`` validated it already)."""
    for r in of_kind(results, "profile"):
        yield r, ProfileResult.from_dict(r.doc)


def stage_shares(prof: ProfileResult) -> dict[str, float]:
    """Share of end-to-end time per stage: its total over the run / the total of end-to-end (docs/metrics.md)."""
    totals = {s.name: float(s.array().sum()) for s in prof.stages}
    whole = sum(totals.values())
    return {k: (v / whole if whole > 0 else 0.0) for k, v in totals.items()}


def time_range_s(prof: ProfileResult, start: int, end: int) -> tuple[float, float]:
    """Seconds from the first timed iteration to the start of iteration ``start`` and the end of ``end - 1``."""
    starts = prof.iteration_start_ns
    e2e = prof.end_to_end_ns()
    last = max(start, end - 1)
    return starts[start] / 1e9, (starts[last] + int(e2e[last])) / 1e9


def meta_column(prof: ProfileResult, key: str) -> tuple[Any, ...] | None:
    col = prof.iteration_meta.get(key)
    return tuple(col) if col is not None else None


def pct(x: float) -> float:
    """A fraction as a percentage rounded for evidence (0.6123 -> 61.2)."""
    return round(100.0 * x, 1)


def ms(ns: float) -> float:
    return round(ns / 1e6, 4)


def shape_text(shape: Any) -> str:
    if isinstance(shape, (list, tuple)):
        return "(" + ", ".join(str(v) for v in shape) + ")"
    return str(shape)


def finite(values: Sequence[Any]) -> np.ndarray:
    """The numeric, finite entries of ``values`` (None and NaN dropped) as float64."""
    arr = np.asarray([v for v in values if isinstance(v, (int, float))], dtype=np.float64)
    return arr[np.isfinite(arr)]
