"""Shared test set-up: offline model hubs, a private cache, and the machine-noise precondition.

Tests that judge real wall-clock behaviour (a busy-wait measured to 5%, a timer that must fire within a
few ms) cannot pass on a machine whose cores are taken by other work, however correct the program. Such a
test states its precondition through the ``machine_noise`` fixture: the fixture measures, just before the
test, how much of a spinning thread's time the scheduler takes away and how late a 1-ms sleep wakes up;
``machine_noise.require(...)`` skips the test with those numbers when they exceed what the test can
tolerate. A test whose judgement failed can re-measure (``Noise.measure()``) and skip when the machine
turned noisy while it ran; on a quiet machine the failure stands.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

STALL_NS = 100_000  # a gap this long between two clock reads of a spinning thread is the scheduler's doing


@dataclass(frozen=True, slots=True)
class Noise:
    """What the scheduler did to this process during a short probe (``Noise.measure()``).

    ``stolen``: share of a spinning thread's wall time lost in gaps of at least ``STALL_NS`` (another
    process, or the hypervisor, had the core). ``max_stall_ms``: the longest such gap. ``wake_late_ms``:
    the second-worst lateness of ``time.sleep(1 ms)`` over 20 sleeps (timer wake-up latency, what an
    event loop's timers suffer). ``load``: the 1-minute load average per CPU, for the record.
    """

    stolen: float
    max_stall_ms: float
    wake_late_ms: float
    load: float

    @classmethod
    def measure(cls, spin_s: float = 0.25, sleeps: int = 20) -> Noise:
        """Spin on ``perf_counter_ns`` for ``spin_s`` counting the gaps, then time ``sleeps`` 1-ms sleeps (~0.3 s)."""
        now = time.perf_counter_ns
        start = last = now()
        end = start + int(spin_s * 1e9)
        stalled = longest = 0
        while last < end:
            t = now()
            gap = t - last
            if gap >= STALL_NS:
                stalled += gap
                longest = max(longest, gap)
            last = t
        late = []
        for _ in range(sleeps):
            t0 = now()
            time.sleep(0.001)
            late.append((now() - t0) / 1e6 - 1.0)
        late.sort()
        return cls(
            stolen=stalled / (last - start),
            max_stall_ms=longest / 1e6,
            wake_late_ms=max(0.0, late[-2]),
            load=os.getloadavg()[0] / (os.cpu_count() or 1),
        )

    def describe(self) -> str:
        return (
            f"{self.stolen:.1%} of a spinning thread's time stolen (longest gap {self.max_stall_ms:.1f} ms), "
            f"1-ms sleeps woke up to {self.wake_late_ms:.1f} ms late, load average {self.load:.2f} per CPU"
        )

    def require(
        self,
        judging: str,
        *,
        stolen: float | None = None,
        max_stall_ms: float | None = None,
        wake_late_ms: float | None = None,
    ) -> None:
        """Skip the calling test, naming ``judging`` and the measured figures, when the machine is noisier than
        the limits given (``stolen``: a fraction; ``max_stall_ms``, ``wake_late_ms``: milliseconds)."""
        over = []
        if stolen is not None and self.stolen > stolen:
            over.append(f"stolen time {self.stolen:.1%} > {stolen:.1%}")
        if max_stall_ms is not None and self.max_stall_ms > max_stall_ms:
            over.append(f"longest stall {self.max_stall_ms:.1f} ms > {max_stall_ms:g} ms")
        if wake_late_ms is not None and self.wake_late_ms > wake_late_ms:
            over.append(f"sleep wake-up lateness {self.wake_late_ms:.1f} ms > {wake_late_ms:g} ms")
        if over:
            pytest.skip(f"machine too noisy to judge {judging} ({'; '.join(over)}): {self.describe()}")


@pytest.fixture()
def machine_noise() -> Noise:
    """The machine's noise measured just before the test (see ``Noise.require``)."""
    return Noise.measure()


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never write to the user's cache unless they ask for a specific one."""
    if "LATENCYLAB_CACHE" not in os.environ:
        monkeypatch.setenv("LATENCYLAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
