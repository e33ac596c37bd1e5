"""A stratified payload mix: every ``strata`` consecutive requests hold one payload of each cost stratum.

The generator's default picks each request's payload uniformly at random from the pool. On a pool whose
costs span 10x (the text corpus: 600 passages, 89-1303 bytes, the longest ~100 ms of compute at one thread) the
share of long passages in a 10-s capacity chunk is then a binomial sample (the 5% longest: 20 +/- 4.4 of 400
requests), and what a chunk sheds depended on that sample as much as on the rate (session 9: 6.2%, 2.6% and
0.7% shed at 40/s in three runs; docs/benchmarks/load.md). :class:`Stratified` removes that sampling noise:
the payloads are ranked by cost (body size, or any key the caller gives) and cut into ``strata`` groups of
equal size; each round of ``strata`` requests takes one random member of every group, in a random order. Any
window of requests then holds the pool's cost mix to within one round, in every run, while the order within
a round and the member drawn stay random (seeded), so no request sequence repeats exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latencylab.load.arrivals import Arrival, ArrivalProcess

__all__ = ["Stratified", "strata_of"]


def strata_of(costs: Sequence[float], strata: int) -> list[list[int]]:
    """The payload indices ranked by ``costs`` (ties by index) and cut into ``strata`` groups of (nearly) equal
    size, cheapest first; fewer groups when there are fewer payloads than ``strata``."""
    if strata < 1:
        raise ValueError("strata must be at least 1")
    if not costs:
        raise ValueError("no payloads to stratify")
    order = sorted(range(len(costs)), key=lambda i: (costs[i], i))
    k = min(strata, len(order))
    return [list(part) for part in np.array_split(np.asarray(order), k)]


@dataclass(frozen=True)
class Stratified:
    """``base``'s arrival times, each with a payload from the stratified mix (see the module docstring)."""

    base: ArrivalProcess
    groups: tuple[tuple[int, ...], ...]
    seed: int = 0

    @classmethod
    def of(cls, base: ArrivalProcess, costs: Sequence[float], strata: int = 20, seed: int = 0) -> Stratified:
        return cls(base, tuple(tuple(g) for g in strata_of(costs, strata)), seed)

    @property
    def name(self) -> str:
        return f"{self.base.name}+stratified"

    def arrivals(self, duration_s: float | None = None, max_requests: int | None = None) -> Iterator[Arrival]:
        rng = np.random.default_rng(self.seed)
        picks = self._picks(rng)
        for a in self.base.arrivals(duration_s, max_requests):
            yield Arrival(a.t_s, next(picks))

    def _picks(self, rng: np.random.Generator) -> Iterator[int]:
        sizes = np.array([len(g) for g in self.groups])
        while True:
            members = rng.integers(0, sizes)  # one random member of every group
            for g in rng.permutation(len(self.groups)):
                yield self.groups[g][members[g]]

    def describe(self) -> dict[str, Any]:
        return {**self.base.describe(), "payload_mix": "stratified", "strata": len(self.groups), "mix_seed": self.seed}

    def mean_rate(self) -> float:
        return self.base.mean_rate()
