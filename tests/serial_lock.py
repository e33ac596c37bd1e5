"""A readers-writer lock between pytest-xdist workers: a test marked ``serial`` runs alone, the rest side by side.

``make test`` runs two workers (``-n 2``). Most tests can share the machine; a test that judges real wall-clock
behaviour (a percentile against a known truth, a capacity search, a stall it must see) cannot, so it takes the
lock exclusively: it waits until the other worker's current test ends, and the other worker waits before its
next test until the serial one is done. Fairness comes from a gate: a waiting writer holds the gate, so new
readers queue behind it instead of starving it.

Both files live in the temporary directory under the run's id (``PYTEST_XDIST_TESTRUNUID``, the same in every
worker of one run), so two runs on one machine do not lock each other. Without xdist there is nothing to share
and the lock does nothing.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _paths() -> tuple[Path, Path] | None:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run or not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    base = Path(tempfile.gettempdir()) / f"latencylab-pytest-{run}"
    return base.with_suffix(".gate"), base.with_suffix(".lock")


@contextmanager
def held(exclusive: bool) -> Iterator[None]:
    """Hold the run's lock for one test: exclusively for a serial test, shared for any other."""
    paths = _paths()
    if paths is None:
        yield
        return
    gate_path, lock_path = paths
    with open(gate_path, "a") as gate, open(lock_path, "a") as lock:
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)  # new readers stop at the gate ...
            fcntl.flock(lock, fcntl.LOCK_EX)  # ... and the current one finishes its test
            fcntl.flock(gate, fcntl.LOCK_UN)
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)  # passes unless a writer waits or runs
            fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
