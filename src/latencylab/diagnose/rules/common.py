"""Helpers the rules share: typed views of loaded results and small formatting functions."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from latencylab.results import LoadedResult, ProfileResult


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


TAIL_Q = 0.99


def tail_iterations(e2e: np.ndarray, q: float = TAIL_Q) -> np.ndarray:
    """Indices of the iterations at or above the end-to-end ``q`` quantile (at least one): "the tail"."""
    thr = float(np.quantile(e2e, q))
    return np.flatnonzero(e2e >= thr)


def effect(e2e: np.ndarray, iterations: Sequence[int], excess_ns: Sequence[float]) -> dict[str, float]:
    """How much of a run a set of slow iterations explains.

    ``share``: their excess time (``excess_ns``, time above the normal for each) over the total end-to-end
    time; ``tail_share``: the fraction of the tail iterations (>= p99) that are among them; ``p99_ms`` and
    ``p99_without_ms``: the end-to-end p99 as measured and with each of them reduced by its excess.
    """
    idx = np.asarray(list(iterations), dtype=np.int64)
    exc = np.asarray(list(excess_ns), dtype=np.float64)
    total = float(e2e.sum())
    tail = tail_iterations(e2e)
    fixed = e2e.astype(np.float64).copy()
    if idx.size:
        fixed[idx] -= np.clip(exc, 0.0, None)
    return {
        "share": float(np.clip(exc, 0.0, None).sum() / total) if total > 0 else 0.0,
        "tail_share": float(np.isin(tail, idx).mean()) if tail.size else 0.0,
        "p99_ms": float(np.quantile(e2e, TAIL_Q)) / 1e6,
        "p99_without_ms": float(np.quantile(fixed, TAIL_Q)) / 1e6,
    }


def effect_text(eff: dict[str, float]) -> str:
    return (
        f"{eff['share']:.1%} of end-to-end time, {eff['tail_share']:.0%} of the p99 tail "
        f"(p99 {eff['p99_ms']:.2f} ms, {eff['p99_without_ms']:.2f} ms without them)"
    )


def iteration_list(its: Sequence[int], limit: int = 6) -> str:
    shown = ", ".join(str(int(i)) for i in list(its)[:limit])
    return shown + (f", ... ({len(its)} in all)" if len(its) > limit else "")
