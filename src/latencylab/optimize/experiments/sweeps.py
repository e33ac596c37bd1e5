"""Thread and batch sweeps: per-item latency and throughput per setting, interleaved.

:func:`non_monotonic` flags batch sizes that are slower per item than a smaller batch. Settings:
:class:`ThreadSweepConfig`, :class:`BatchSweepConfig`."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab.clock import Clock
from latencylab.errors import LatencyLabError, require
from latencylab.results.base import utc_now
from latencylab.results.experiment import experiment_doc
from latencylab.results.registry import SCHEMA_VERSION
from latencylab.threads import TorchThreads
from latencylab.timing import Arm, VariantTiming, env_or_fingerprint, interleave


def non_monotonic(throughputs_by_batch: Mapping[int, float], tolerance: float = 0.0) -> list[str]:
    """Batch sizes whose per-item throughput is lower than a smaller batch size's.

    Walks the batch sizes in ascending order and compares each with the best smaller one; a batch is
    flagged when its throughput is below ``(1 - tolerance)`` x that best (the seeds' "batch 8 slower per
    item than batch 4" symptom: throughput against batch size is not monotonic). Returns one message per
    flagged batch size, in ascending order of batch size.
    """
    if not 0 <= tolerance < 1:
        raise LatencyLabError(f"tolerance must be in [0, 1), got {tolerance}")
    flags: list[str] = []
    best_b: int | None = None
    best_t = -math.inf
    for b, t in sorted(throughputs_by_batch.items()):
        if b < 1:
            raise LatencyLabError(f"batch sizes must be >= 1, got {b}")
        if not math.isfinite(t) or t < 0:
            raise LatencyLabError(f"throughput for batch {b} must be finite and >= 0, got {t}")
        if best_b is not None and t < best_t * (1.0 - tolerance):
            flags.append(
                f"batch {b}: {t:.4g} items/s is lower than batch {best_b}'s {best_t:.4g} items/s "
                f"({t / best_t - 1:+.0%})"
            )
        if t > best_t:
            best_b, best_t = b, t
    return flags


@dataclass(frozen=True, slots=True)
class SweepPoint:
    value: int  # the thread count or batch size
    timing: VariantTiming

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, **self.timing.to_dict()}


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Per-item latency and throughput per setting of one knob (``threads`` or ``batch``)."""

    label: str
    knob: str  # "threads" | "batch"
    fixed: Mapping[str, Any]  # the other settings held constant (threads for a batch sweep, batch for threads)
    rounds: int
    points: tuple[SweepPoint, ...]
    best: int  # the setting with the highest throughput
    non_monotonic: tuple[str, ...]  # batch sweeps: point estimates (p50), see non_monotonic()
    non_monotonic_significant: tuple[str, ...]  # ... and only where the p50 CIs do not overlap
    env: Mapping[str, Any]
    created_at: str = field(default_factory=utc_now)
    schema_version: int = SCHEMA_VERSION
    kind: str = "sweep"

    def throughputs(self) -> dict[int, float]:
        """Items/s per setting from the p50 per-item latency (robust to the odd preempted call)."""
        return {p.value: 1e3 / p.timing.summary().median for p in self.points}

    def to_dict(self) -> dict[str, Any]:
        return experiment_doc(
            self,
            points=[p.to_dict() for p in self.points],
            items_per_s_from_p50={str(k): v for k, v in self.throughputs().items()},
        )


def _sweep_result(
    label: str, knob: str, fixed: Mapping[str, Any], rounds: int, points: Sequence[SweepPoint], env: Any
) -> SweepResult:
    tput = {p.value: 1e3 / p.timing.summary().median for p in points}
    flags: list[str] = []
    strict: list[str] = []
    if knob == "batch":
        flags = non_monotonic(tput)
        # Significant: the larger batch's best case (p50 CI low -> highest throughput) is still below a smaller
        # batch's worst case.
        hi = {p.value: 1e3 / p.timing.summary().at(0.5).ci_low for p in points}
        lo = {p.value: 1e3 / p.timing.summary().at(0.5).ci_high for p in points}
        for b in sorted(tput):
            worse = [s for s in sorted(tput) if s < b and hi[b] < lo[s]]
            if worse:
                s = max(worse, key=lambda v: lo[v])
                strict.append(
                    f"batch {b}: at most {hi[b]:.4g} items/s, below batch {s}'s at least {lo[s]:.4g} (p50 95% CIs)"
                )
    best = max(tput, key=lambda v: tput[v])
    return SweepResult(label, knob, dict(fixed), rounds, tuple(points), best, tuple(flags), tuple(strict), env)


@dataclass(frozen=True, slots=True)
class ThreadSweepConfig:
    """Settings of :func:`thread_sweep` (each field's ``help`` says what it sets)."""

    items_per_call: int = field(default=1, metadata={"help": "items one call handles"})
    rounds: int = field(default=5, metadata={"help": "interleaved rounds"})
    calls_per_round: int = field(default=10, metadata={"help": "calls per setting per round"})
    warmup: int = field(default=3, metadata={"help": "untimed calls per variant first"})
    label: str = field(default="", metadata={"help": "what was measured, for the table and the result"})


def thread_sweep(
    run_fn: Callable[[], Any],
    threads: Sequence[int] | None = None,
    config: ThreadSweepConfig | None = None,
    *,
    clock: Clock | None = None,
    env: Mapping[str, Any] | None = None,
    **settings: Any,
) -> SweepResult:
    """Time ``run_fn()`` (which handles ``items_per_call`` items) at each torch intra-op thread count.

    ``threads`` defaults to 1..os.cpu_count(). The counts take turns in rotated rounds; torch's setting is
    restored afterwards.
    """
    cfg = dataclasses.replace(config or ThreadSweepConfig(), **settings)
    items_per_call, rounds, calls_per_round, warmup, label = (
        cfg.items_per_call,
        cfg.rounds,
        cfg.calls_per_round,
        cfg.warmup,
        cfg.label,
    )
    require("torch", "torch")
    counts = list(threads) if threads is not None else list(range(1, (os.cpu_count() or 1) + 1))
    if not counts or any(t < 1 for t in counts):
        raise LatencyLabError(f"thread counts must be >= 1, got {counts}")
    th = TorchThreads()

    def setter(t: int) -> Callable[[], None]:
        return lambda: th.set(t)

    arms = [
        Arm(f"threads={t}", lambda j: run_fn(), rounds * calls_per_round, items_per_call, setter(t)) for t in counts
    ]
    with th:
        timings = interleave(arms, rounds, warmup, clock)
    points = [SweepPoint(t, tm) for t, tm in zip(counts, timings, strict=True)]
    return _sweep_result(label, "threads", {"items_per_call": items_per_call}, rounds, points, env_or_fingerprint(env))


@dataclass(frozen=True, slots=True)
class BatchSweepConfig:
    """Settings of :func:`batch_sweep` (each field's ``help`` says what it sets)."""

    threads: int | None = field(default=1, metadata={"help": "torch intra-op threads (None: leave as is)"})
    rounds: int = field(default=5, metadata={"help": "interleaved rounds"})
    items_per_round: int = field(default=32, metadata={"help": "items per batch size per round"})
    warmup: int = field(default=2, metadata={"help": "untimed calls per variant first"})
    label: str = field(default="", metadata={"help": "what was measured, for the table and the result"})


def batch_sweep(
    make_run: Callable[[int], Callable[[], Any]],
    batches: Sequence[int] = (1, 2, 4, 8, 16),
    config: BatchSweepConfig | None = None,
    *,
    clock: Clock | None = None,
    env: Mapping[str, Any] | None = None,
    **settings: Any,
) -> SweepResult:
    """Time ``make_run(b)()`` (one call handles a batch of b items) at each batch size b.

    Each round gives every batch size about ``items_per_round`` items (max(1, items_per_round // b) calls),
    so large batches do not dominate the round's time; the order rotates every round. Flags batch sizes
    slower per item than a smaller one (:func:`non_monotonic`).
    """
    cfg = dataclasses.replace(config or BatchSweepConfig(), **settings)
    threads, rounds, items_per_round, warmup, label = (
        cfg.threads,
        cfg.rounds,
        cfg.items_per_round,
        cfg.warmup,
        cfg.label,
    )
    sizes = list(batches)
    if not sizes or any(b < 1 for b in sizes) or len(set(sizes)) != len(sizes):
        raise LatencyLabError(f"batch sizes must be distinct and >= 1, got {sizes}")
    fns = {b: make_run(b) for b in sizes}

    def caller(b: int) -> Callable[[int], Any]:
        fn = fns[b]
        return lambda j: fn()

    arms = [Arm(f"batch={b}", caller(b), rounds * max(1, items_per_round // b), b) for b in sizes]
    with TorchThreads(threads):
        timings = interleave(arms, rounds, warmup, clock)
    points = [SweepPoint(b, tm) for b, tm in zip(sizes, timings, strict=True)]
    return _sweep_result(label, "batch", {"threads": threads}, rounds, points, env_or_fingerprint(env))


def format_sweep(r: SweepResult) -> str:
    lines = [
        f"{r.knob} sweep, {r.label}, fixed {dict(r.fixed)}, {r.rounds} rounds",
        f"{r.knob:>7} {'call p50 ms':>11} {'item mean':>9} {'item p50':>9} {'p50 95% CI':>17} {'item p99':>9} "
        f"{'items/s':>8}",
    ]
    tput = r.throughputs()
    for p in r.points:
        s = p.timing.summary()
        a50 = s.at(0.5)
        lines.append(
            f"{p.value:>7} {float(np.median(p.timing.samples_ns)) / 1e6:11.2f} {s.mean:9.3f} {a50.value:9.3f} "
            f"{f'[{a50.ci_low:.3f}, {a50.ci_high:.3f}]':>17} {s.at(0.99).value:9.3f} {tput[p.value]:8.1f}"
        )
    lines.append(f"best: {r.knob} {r.best}")
    for f in r.non_monotonic:
        lines.append(f"non-monotonic: {f}")
    for f in r.non_monotonic_significant:
        lines.append(f"non-monotonic (CIs separate): {f}")
    return "\n".join(lines)
