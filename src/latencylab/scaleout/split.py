"""Split one arrival process into N per-worker streams whose superposition is the requested process.

* **Poisson** (``Poisson`` and Poisson ``Schedule``\\ s, flat or ramped): N independent Poisson processes of
  rate ``R/N`` (``lambda(t)/N``), each with its own seed. The superposition of independent Poisson processes
  is a Poisson process of the summed rate, so the union is the requested process in distribution (not the
  same sample as a one-host run with that seed). Each worker draws only its own arrivals: O(R/N) work.
* **Everything else** (``Constant``, constant ``Schedule``\\ s, traces): interleaving. Worker i of N takes
  arrivals ``k = i, i + N, i + 2N, ...`` of the one parent stream, so the union *is* the parent sequence,
  sample for sample (each worker walks the whole parent stream and keeps every N-th: O(R) work per worker).

A request budget splits the same way: ``max_requests`` M gives worker i ``ceil((M - i) / N)`` (interleaved,
exactly the parent's first M) or ``M // N`` plus one for the first ``M % N`` workers (Poisson).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.load.arrivals import Arrival, ArrivalProcess, Poisson, Schedule, Step


def stream_seed(seed: int, index: int) -> int:
    """Worker ``index``'s seed (arrivals and payload choice): independent streams from one run seed."""
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, index]).generate_state(1)[0])


@dataclass(frozen=True, slots=True)
class Interleaved:
    """Arrivals ``index, index + n, index + 2n, ...`` of ``parent``: one of ``n`` interleaved shares."""

    parent: ArrivalProcess
    index: int
    n: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.n:
            raise LatencyLabError(f"interleaved share {self.index} of {self.n} does not exist")

    @property
    def name(self) -> str:
        return f"{self.parent.name} (share {self.index + 1} of {self.n})"

    def arrivals(self, duration_s: float | None = None, max_requests: int | None = None) -> Iterator[Arrival]:
        # The parent's first n * max_requests arrivals hold this share's first max_requests.
        budget = None if max_requests is None else max_requests * self.n
        stream = self.parent.arrivals(duration_s, budget)
        return itertools.islice(stream, self.index, None, self.n)

    def describe(self) -> dict[str, Any]:
        return {"process": "interleaved", "index": self.index, "of": self.n, "parent": self.parent.describe()}

    def mean_rate(self) -> float:
        return self.parent.mean_rate() / self.n


def split_arrivals(arrivals: ArrivalProcess, n: int, seed: int = 0) -> list[ArrivalProcess]:
    """``n`` streams whose superposition is ``arrivals`` (module docstring); ``[arrivals]`` when ``n == 1``."""
    if n < 1:
        raise LatencyLabError(f"need at least one worker, got {n}")
    if n == 1:
        return [arrivals]
    if isinstance(arrivals, Poisson):
        return [Poisson(arrivals.rate / n, stream_seed(arrivals.seed + seed, i)) for i in range(n)]
    if isinstance(arrivals, Schedule) and arrivals.process == "poisson":
        steps = [Step(s.duration_s, s.rate / n, None if s.end_rate is None else s.end_rate / n) for s in arrivals.steps]
        return [replace(arrivals, steps=steps, seed=stream_seed(arrivals.seed + seed, i)) for i in range(n)]
    return [Interleaved(arrivals, i, n) for i in range(n)]


def split_count(total: int | None, n: int, index: int, interleaved: bool) -> int | None:
    """Worker ``index``'s share of a request count (``max_requests`` / ``min_requests``; None stays None)."""
    if total is None:
        return None
    if interleaved:
        return max(0, -(-(total - index) // n))
    return total // n + (1 if index < total % n else 0)
