"""Keep the garbage collector's full collections out of a timed run, and count the pauses it still takes.

A CPython full (generation-2) collection walks every tracked object while holding the GIL: in a process that
holds a model, a framework and a test session (~400k-800k objects) one takes 60-160 ms here, and every thread
of the process (a load generator's send loop, a server's event loop) stops for it. In a load generator that is
the generator's own error: the sends due during the pause go out late (a clean-clone CI run saw 5.8% of sends
more than 1 ms late at 90 req/s, against 0-0.6% in a fresh process).

``frozen()`` collects once before the run and ``gc.freeze()``-s what survives (moved to a permanent generation
that collections skip), so collections during the run only walk what the run itself allocates; it unfreezes
when the last concurrent user leaves. ``PauseMeter`` counts the collections and their pauses via
``gc.callbacks`` (``RunStats.gc_pauses``, ``gc_pause_max_ms``).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_users = 0


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Collect, then freeze the surviving objects for the block; reentrant and thread-safe (counted)."""
    global _users
    with _lock:
        if _users == 0:
            gc.collect()
            gc.freeze()
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                gc.unfreeze()


class PauseMeter:
    """Collections during a block and how long each held the process (``with PauseMeter() as m``)."""

    def __init__(self) -> None:
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0
        self._t0: int | None = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        elif self._t0 is not None:
            d = time.perf_counter_ns() - self._t0
            self._t0 = None
            self.count += 1
            self.total_ns += d
            self.max_ns = max(self.max_ns, d)

    def __enter__(self) -> PauseMeter:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)
