"""The interleaved timing harness: variants take turns in rounds, timed on an injected Clock.

Interleaving (A B C, B C A, C A B, ...) in one process means machine drift (thermal, a noisy neighbour, the
frequency governor) hits every variant alike instead of whichever ran last. :func:`interleave` times
:class:`Arm` calls into :class:`VariantTiming` (raw samples in ns, derived per-item statistics);
:func:`time_calls` and :func:`rotated` are the two steps it is built from, which the optimize search uses
for its candidates x input sets. Every time is read from a :class:`~latencylab.clock.Clock`
(``perf_counter_ns`` by default; tests pass a :class:`~latencylab.clock.FakeClock` and get exact numbers)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from latencylab import stats
from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError


@dataclass(frozen=True, slots=True)
class VariantTiming:
    """Timed calls of one variant: ``samples_ns[i]`` is call i's duration; each call handles ``items_per_call``.

    Per-item latency of a call is its duration / ``items_per_call`` (for a batch, the per-item cost; the
    latency one request in the batch sees is the whole call). Throughput is items / busy time.
    """

    name: str
    items_per_call: int
    samples_ns: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.items_per_call < 1:
            raise LatencyLabError(f"{self.name}: items_per_call must be >= 1")
        if not self.samples_ns:
            raise LatencyLabError(f"{self.name}: no timed calls")

    @property
    def n_calls(self) -> int:
        return len(self.samples_ns)

    def per_item_ms(self) -> np.ndarray:
        return np.asarray(self.samples_ns, dtype=np.float64) / self.items_per_call / 1e6

    def summary(self) -> stats.Summary:
        """Per-item latency in ms: mean, p50 and p99 with bootstrap CIs, plus stability warnings."""
        return stats.summarize(self.per_item_ms(), qs=(0.5, 0.99), label=self.name)

    @property
    def items_per_s(self) -> float:
        total = sum(self.samples_ns)
        return 0.0 if total <= 0 else self.items_per_call * self.n_calls / (total / 1e9)

    def to_dict(self) -> dict[str, Any]:
        s = self.summary()
        p50, p99 = s.at(0.5), s.at(0.99)
        return {
            "name": self.name,
            "items_per_call": self.items_per_call,
            "n_calls": self.n_calls,
            "per_item_ms": {
                "mean": s.mean,
                "p50": p50.value,
                "p50_ci": [p50.ci_low, p50.ci_high],
                "p99": p99.value,
                "p99_ci": [p99.ci_low, p99.ci_high],
            },
            "call_ms_p50": float(np.median(self.samples_ns)) / 1e6,
            "items_per_s": self.items_per_s,
            "warnings": list(s.warnings),
            "samples_ns": list(self.samples_ns),
        }


@dataclass(frozen=True, slots=True)
class Arm:
    """One variant in an interleaved comparison.

    ``call(j)`` runs the variant's j-th call (j = 0..calls-1; map j to an input yourself); ``setup()`` runs
    before each block of the variant's calls (e.g. to set the thread count); it is not timed.
    """

    name: str
    call: Callable[[int], Any]
    calls: int
    items_per_call: int = 1
    setup: Callable[[], None] | None = None


T = TypeVar("T")
A = TypeVar("A")


def rotated(items: Sequence[T], r: int) -> list[T]:
    """Round ``r``'s order: ``items`` rotated left by ``r`` (A B C, B C A, C A B, ...)."""
    if not items:
        return []
    k = r % len(items)
    return [*items[k:], *items[:k]]


def time_calls(call: Callable[[A], Any], args: Iterable[A], clock: Clock, out: list[int]) -> list[int]:
    """Run ``call(a)`` for each ``a`` of ``args``, appending each call's duration (ns, on ``clock``) to ``out``.

    The two marks bracket the call alone; they are resolved after it, off the timed path."""
    mark, resolve = clock.mark, clock.resolve
    for a in args:
        m0 = mark()
        call(a)
        m1 = mark()
        t0, t1 = resolve([m0, m1])
        out.append(int(t1) - int(t0))
    return out


def now_ns(clock: Clock) -> int:
    """The clock's current time in ns (for wall-time spans around untimed work)."""
    return int(clock.resolve([clock.mark()])[0])


def interleave(arms: Sequence[Arm], rounds: int, warmup: int = 0, clock: Clock | None = None) -> list[VariantTiming]:
    """Time every arm's calls in ``rounds`` rounds, rotating the order (A B C, B C A, C A B, ...).

    Each arm's ``calls`` are split evenly over the rounds (round r runs calls r*calls//rounds up to
    (r+1)*calls//rounds), so every arm sees the same inputs in the same rounds. ``warmup`` untimed calls
    per arm (j = 0..warmup-1) come first.
    """
    if not arms:
        raise LatencyLabError("interleave needs at least one arm")
    if len({a.name for a in arms}) != len(arms):
        raise LatencyLabError("arm names must be unique")
    if rounds < 1:
        raise LatencyLabError(f"rounds must be >= 1, got {rounds}")
    for a in arms:
        if a.calls < rounds:
            raise LatencyLabError(f"arm {a.name!r}: {a.calls} calls cannot fill {rounds} rounds")
    clk = clock or PerfCounterClock()
    for a in arms:
        if a.setup is not None:
            a.setup()
        for j in range(warmup):
            a.call(j)
    samples: dict[str, list[int]] = {a.name: [] for a in arms}
    for r in range(rounds):
        for a in rotated(arms, r):
            if a.setup is not None:
                a.setup()
            time_calls(a.call, range(r * a.calls // rounds, (r + 1) * a.calls // rounds), clk, samples[a.name])
    return [VariantTiming(a.name, a.items_per_call, tuple(samples[a.name])) for a in arms]


def env_or_fingerprint(env: Mapping[str, Any] | None) -> dict[str, Any]:
    """``env`` as given, or this machine's fingerprint when None."""
    if env is not None:
        return dict(env)
    from latencylab.env import fingerprint

    return fingerprint()


def ms(ns: float) -> float:
    """Nanoseconds as milliseconds."""
    return ns / 1e6
