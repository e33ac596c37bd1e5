"""One Clock protocol for every timer in latencylab.

A clock hands out *marks* at stage boundaries and later turns the marks of one
iteration into nanosecond timestamps. Host clocks resolve a mark immediately;
the CUDA-event clock records an event on the current stream and resolves all of
an iteration's events after one synchronisation, so asynchronous GPU work is
charged to the stage that launched it rather than to whichever stage happens to
block on it first.

Tests inject :class:`FakeClock` and get exact numbers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Timestamps stage boundaries.

    ``mark()`` is called at every boundary, on the hot path, so it must be
    cheap. ``resolve(marks)`` is called once per iteration, off the timed path,
    and returns one integer nanosecond timestamp per mark (monotonic, with an
    arbitrary origin shared by all marks of one run).
    """

    name: str

    def mark(self) -> Any: ...

    def resolve(self, marks: Sequence[Any]) -> Sequence[int]: ...


class PerfCounterClock:
    """Host wall clock: ``time.perf_counter_ns`` (monotonic, ~tens of ns resolution)."""

    name = "perf_counter_ns"

    # The C function itself, not a Python wrapper: one call per boundary.
    mark = staticmethod(time.perf_counter_ns)

    def resolve(self, marks: Sequence[Any]) -> Sequence[int]:
        return marks  # already integer nanoseconds


class FakeClock:
    """A clock that only moves when told to: ``advance(ns)``. For exact tests."""

    name = "fake"

    def __init__(self, start_ns: int = 0) -> None:
        self.now_ns = int(start_ns)

    def advance(self, ns: int | float) -> None:
        if ns < 0:
            raise ValueError("a clock cannot go backwards")
        self.now_ns += round(ns)

    def mark(self) -> int:
        return self.now_ns

    def resolve(self, marks: Sequence[Any]) -> Sequence[int]:
        return marks


class SyncClock:
    """Host clock that first waits for all queued CUDA work (``torch.cuda.synchronize``).

    Correct for GPU pipelines but it serialises host and device at every
    boundary, removing overlap the real pipeline may have; prefer
    :class:`CudaEventClock`.
    """

    name = "cuda_sync+perf_counter_ns"

    def __init__(self, device: Any = None) -> None:
        import torch

        self._sync = torch.cuda.synchronize
        self._device = device

    def mark(self) -> int:
        self._sync(self._device)
        return time.perf_counter_ns()

    def resolve(self, marks: Sequence[Any]) -> list[int]:
        return [int(m) for m in marks]


class CudaEventClock:
    """CUDA events recorded on the current stream at each boundary.

    ``resolve`` synchronises on the last event and converts
    ``start.elapsed_time(event)`` (milliseconds, ~0.5 us resolution) to ns.
    Host-only stages are measured too: an event on an idle stream completes
    when the host enqueues it.
    """

    name = "cuda_event"

    def __init__(self, device: Any = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("CudaEventClock needs a CUDA device; none is available")
        self._torch = torch
        self._device = device

    def mark(self) -> Any:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev, time.perf_counter_ns()

    def resolve(self, marks: Sequence[Any]) -> list[int]:
        """Event times anchored at the first mark's host time (so runs have a timeline)."""
        if not marks:
            return []
        marks[-1][0].synchronize()
        first, host0 = marks[0]
        return [host0] + [host0 + round(first.elapsed_time(ev) * 1e6) for ev, _ in marks[1:]]


def cuda_available() -> bool:
    """True when torch is importable and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def clock_for_device(device: str) -> Clock:
    """The right clock for a pipeline whose tensors live on ``device``."""
    if device.startswith("cuda"):
        return CudaEventClock(device)
    return PerfCounterClock()


def wall_offset_ns(tries: int = 5) -> int:
    """unix time (``time.time_ns``) minus ``perf_counter_ns``, from the tightest of a few paired reads."""
    best: tuple[int, int] | None = None
    for _ in range(tries):
        a = time.perf_counter_ns()
        wall = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, wall - (a + b) // 2)
    assert best is not None
    return best[1]
