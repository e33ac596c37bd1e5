"""Clock offset between the driver and a worker, from round trips (Cristian's method, best of several).

The driver reads its wall clock (``t_send``), asks the worker for its wall clock (``w``), reads its own again
(``t_recv``). If the request and the answer took equally long, the worker read its clock at the driver's
``(t_send + t_recv) / 2``, so ``offset = w - (t_send + t_recv) / 2`` (worker minus driver), uncertain by at
most half the round trip. The round trip with the smallest RTT is kept: its bound is the tightest.

Latencies are per-worker local intervals (``perf_counter_ns`` on one host), so the offset never enters a
latency; it only places the common start instant on each worker's clock, and the result reports how well
the starts lined up (``start_error_ns``: where each worker actually started, on the driver's clock, minus
the instant asked for, within the worker's ``uncertainty_ns``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from latencylab.errors import LatencyLabError


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """A worker's wall clock minus the driver's, from the tightest of ``rounds`` round trips."""

    offset_ns: int
    rtt_ns: int  # of the round trip kept
    rounds: int

    @property
    def uncertainty_ns(self) -> int:
        """The offset is within this of the truth (half the kept round trip)."""
        return self.rtt_ns // 2

    def to_worker(self, driver_ns: int) -> int:
        """A driver wall-clock instant on the worker's clock."""
        return driver_ns + self.offset_ns

    def to_driver(self, worker_ns: int) -> int:
        """A worker wall-clock instant on the driver's clock."""
        return worker_ns - self.offset_ns

    def to_dict(self) -> dict[str, Any]:
        return {"offset_ns": self.offset_ns, "rtt_ns": self.rtt_ns, "uncertainty_ns": self.uncertainty_ns}


def measure_offset(probe: Callable[[], int], now_ns: Callable[[], int], rounds: int = 8) -> ClockOffset:
    """``probe()`` returns the worker's wall clock (ns); ``now_ns`` is the driver's. Best of ``rounds`` trips."""
    if rounds < 1:
        raise LatencyLabError("clock offset needs at least one round trip")
    best: tuple[int, int] | None = None
    for _ in range(rounds):
        t_send = now_ns()
        w = probe()
        t_recv = now_ns()
        rtt = t_recv - t_send
        if rtt < 0:
            raise LatencyLabError("the driver's clock went backwards during a round trip")
        if best is None or rtt < best[0]:
            best = (rtt, w - (t_send + t_recv) // 2)
    assert best is not None
    return ClockOffset(offset_ns=best[1], rtt_ns=best[0], rounds=rounds)


def start_error_ns(offset: ClockOffset, worker_start_ns: int, asked_ns: int) -> int:
    """Where a worker started (its wall clock), on the driver's clock, minus the instant asked (driver's clock)."""
    return offset.to_driver(worker_start_ns) - asked_ns
