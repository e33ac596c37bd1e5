"""When to send: busy-wait up to an intended send time, or sleep to it, decided by whether a core is free.

An open-loop sender must hand each request to the socket at its intended
time. Two ways to wait for that time:

* **spin**: sleep on the event loop until ``SPIN_NS`` before the time (the
  loop's timers are only good to a millisecond: uvloop rounds to whole ms,
  asyncio's epoll wait rounds up), then yield to the loop in a tight loop.
  Sends land within tens of microseconds, but the last 1.5 ms before every
  send burn a core.
* **sleep**: a helper thread sleeps to the time itself (a futex wait with a
  monotonic deadline, good to ~0.1 ms on an idle core) and wakes the loop.
  No CPU is burnt waiting; a late wake-up is measured as lateness like any
  other, and latency is timed from the intended send either way. ``auto``
  sleeps to the time minus a :class:`WakeMargin` learned from its own
  wake-ups (0.1-1 ms) and yields to the loop for the rest: on a KVM guest a
  wake-up took ~0.35 ms at the median, which a 1-ms lateness rule feels.

Spinning is only free when nobody else wants the core it fills. On a
machine shared with the server under test (or anything else) the spin takes
CPU from the very thing being measured, and a spinning process is also the
first one the scheduler preempts, so it can even make sends later. Hence
``auto``: :class:`SpinPolicy` measures, every ``window_s`` of the run, how
busy the generator's usable cores were with *other* work (all CPU time on
those cores, from ``/proc/stat``, minus the generator's own process time;
where ``/proc/stat`` cannot be read, the 1-minute load average scaled to
those cores), and spins during the next window only when :func:`spin_allowed`
says a core is free for it. A run starts sleeping: before the first request
the server under test is idle, so the machine looks freer than it will be.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from latencylab.autoprobe import cpu_ticks
from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError

SPIN_MODES = ("auto", "on", "off")
SPIN_NS = 1_500_000  # with spin: sleep on the loop until this close to an intended time, then busy-wait
WINDOW_S = 0.5  # auto: how often the spin decision is taken again, from the last window's CPU use


def usable_cores() -> int:
    """CPUs this process may run on (its affinity set where the OS has one, else all of them)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _usable_cpu_ids() -> frozenset[int] | None:
    return frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def proc_stat_busy_s(cpus: frozenset[int] | None = None, path: str = "/proc/stat") -> float | None:
    """Seconds of CPU time spent busy since boot on ``cpus`` (all CPUs when None), by everyone.

    Busy = user + nice + system + irq + softirq + steal (a vCPU the hypervisor gave to another guest was
    not free either); idle and iowait are not. None where the file cannot be read or names none of ``cpus``.
    """
    rows = cpu_ticks(cpus, path)
    if not rows:
        return None
    try:
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    return sum(v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0) for v in rows) / tick


def _loadavg_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def spin_allowed(cores: float, others_busy: float) -> bool:
    """Whether busy-waiting costs nobody anything: ``others_busy`` is the other work on the generator's
    ``cores``, in cores (mean over the last window).

    The spin fills one core. What is left must still be at least one whole idle core, and at least as much
    idle as the others use on average: the server under test wakes exactly when a request arrives, so its
    demand comes in bursts well above its mean. So: cores - 1 - others >= max(1, others). Never on 1 or 2
    cores with anything else running; on 4 cores up to 1.5 cores of other work; on 16 up to 7.5.
    """
    return cores - 1.0 - others_busy >= max(1.0, others_busy)


class SpinPolicy:
    """Decides whether the open-loop sender spins: fixed (``on`` / ``off``) or re-decided every window (``auto``).

    ``tick()`` is cheap between windows; call it often (the generator's watchdog calls it every 50 ms). The
    readers are injectable for tests: ``machine_busy_s(cpus)`` as :func:`proc_stat_busy_s`, ``own_cpu_s()``
    as ``time.process_time``, ``loadavg()`` as the 1-minute load average, and a ``clock`` (``mark()`` in ns).
    """

    def __init__(
        self,
        mode: str = "auto",
        cores: int | None = None,
        *,
        cpus: frozenset[int] | None = None,
        machine_cores: int | None = None,
        machine_busy_s: Callable[[frozenset[int] | None], float | None] = proc_stat_busy_s,
        own_cpu_s: Callable[[], float] = time.process_time,
        loadavg: Callable[[], float | None] = _loadavg_1m,
        clock: Clock | None = None,
        window_s: float = WINDOW_S,
    ) -> None:
        if mode not in SPIN_MODES:
            raise LatencyLabError(f"spin must be one of {', '.join(SPIN_MODES)}, got {mode!r}")
        self.mode = mode
        if cpus is None and cores is None:
            cpus = _usable_cpu_ids()
        self.cpus = cpus
        self.cores = cores if cores is not None else (len(self.cpus) if self.cpus else usable_cores())
        self.machine_cores = machine_cores or os.cpu_count() or self.cores
        self._machine_busy_s = machine_busy_s
        self._own_cpu_s = own_cpu_s
        self._loadavg = loadavg
        self._clock: Clock = clock if clock is not None else PerfCounterClock()
        self._window_ns = round(window_s * 1e9)
        self.spin = mode == "on"
        # (other work on the generator's cores in cores, window length in s) per window; every mode: reported
        self.others: list[tuple[float, float]] = []
        self._last: tuple[int, float | None, float] | None = None

    def _sample(self) -> tuple[int, float | None, float]:
        return int(self._clock.mark()), self._machine_busy_s(self.cpus), self._own_cpu_s()

    def start(self) -> None:
        """Take the first sample (the run is about to start). ``auto`` starts sleeping: see the module doc."""
        self.spin = self.mode == "on"
        self._last = self._sample()

    def tick(self) -> bool:
        """Measure (and, in ``auto``, re-decide) when a window has passed since the last sample; return whether
        to spin now. ``on`` and ``off`` measure too: the other work on the generator's cores is reported."""
        others = self._measure(self._window_ns)
        if self.mode == "auto" and others is not None:
            # nan: nothing to go on, and sleeping is the safe choice
            self.spin = others == others and spin_allowed(self.cores, others)
        return self.spin

    def finish(self) -> None:
        """Measure the last, partial window (when at least 0.1 s long), for the report; decides nothing."""
        self._measure(100_000_000)

    def _measure(self, min_ns: int) -> float | None:
        """Other work on the generator's cores since the last sample, in cores (nan: unknown), or None when
        less than ``min_ns`` has passed."""
        if self._last is None:
            return None
        t0, busy0, own0 = self._last
        if int(self._clock.mark()) - t0 < min_ns:
            return None
        t1, busy1, own1 = self._sample()
        self._last = (t1, busy1, own1)
        wall = (t1 - t0) / 1e9
        own = (own1 - own0) / wall
        if busy0 is not None and busy1 is not None:
            others = (busy1 - busy0) / wall - own
        else:
            load = self._loadavg()
            # The 1-minute load average lags, and counts runnable tasks rather than CPU time: a fallback only.
            if load is None:
                return float("nan")
            others = load * self.cores / self.machine_cores - own
        others = min(max(others, 0.0), float(self.cores))
        self.others.append((others, wall))
        return others

    @property
    def others_mean(self) -> float | None:
        """Mean other work on the generator's cores over the windows measured (time-weighted), in cores."""
        wall = sum(w for _, w in self.others)
        return sum(o * w for o, w in self.others) / wall if wall > 0 else None


class WakeMargin:
    """How early to wake before an intended send when sleeping (``auto`` while it does not spin), learned from
    the wake-ups themselves: the ``q`` quantile of the last ``n`` wake-ups' lateness, clamped to
    [``lo_ns``, ``hi_ns``]. The sender sleeps to the intended time minus this margin and yields to the loop
    for the rest, so a wake-up that is late by less than the margin still sends on time. The cost is at most
    the margin of one core's time per send (0.5 ms at 100 req/s: 5% of a core), against the full spin's 1.5 ms.

    On a KVM guest the helper thread's futex wake-up plus the loop's own wake-up took 0.35 ms at the median and
    2.2-2.5 ms at p99 (a sleeping generator sent 2-6.5% of requests more than 1 ms late on a quiet 2-vCPU
    machine at 40-70 req/s: docs/metrics.md).
    """

    def __init__(
        self, lo_ns: int = 100_000, hi_ns: int = 1_000_000, start_ns: int = 500_000, n: int = 64, q: float = 0.9
    ) -> None:
        if not 0 <= lo_ns <= start_ns <= hi_ns or n < 1 or not 0 < q <= 1:
            raise ValueError("need 0 <= lo_ns <= start_ns <= hi_ns, n >= 1 and 0 < q <= 1")
        self.lo_ns, self.hi_ns, self.q = lo_ns, hi_ns, q
        self._seen: collections.deque[int] = collections.deque(maxlen=n)
        self._every = max(1, n // 4)  # the quantile is re-taken every n/4 wake-ups
        self._count = 0
        self.margin_ns = start_ns

    def observe(self, late_ns: int) -> None:
        """One wake-up, ``late_ns`` after the time it was asked for (negative: early; counted as 0)."""
        self._seen.append(max(0, late_ns))
        self._count += 1
        if self._count % self._every == 0:
            ranked = sorted(self._seen)
            k = min(len(ranked) - 1, int(self.q * len(ranked)))
            self.margin_ns = min(self.hi_ns, max(self.lo_ns, ranked[k]))


class Waker:
    """Wakes the event loop at a deadline (``perf_counter_ns``) from a helper thread, without busy-waiting.

    The loop's own timers are good to a millisecond only; a thread waiting on a condition with a timeout
    (a futex with a monotonic deadline) wakes within ~0.1 ms on an idle core and then costs the loop one
    ``call_soon_threadsafe``. One deadline at a time: ``until`` replaces a pending one.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._cv = threading.Condition()
        self._job: tuple[int, asyncio.Future[None]] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="latencylab-send-timer", daemon=True)
        self._thread.start()

    def until(self, deadline_ns: int) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self._loop.create_future()
        with self._cv:
            self._job = (deadline_ns, fut)
            self._cv.notify()
        return fut

    def _run(self) -> None:
        perf = time.perf_counter_ns
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                job = self._job
                if self._closed or job is None:
                    return
                deadline, fut = job
                while not self._closed and self._job is not None and self._job[1] is fut:
                    left = deadline - perf()
                    if left <= 0:
                        break
                    self._cv.wait(left / 1e9)
                if self._closed:
                    return
                if self._job is None or self._job[1] is not fut:
                    continue  # replaced by a newer deadline
                self._job = None
            try:
                self._loop.call_soon_threadsafe(_set, fut)
            except RuntimeError:  # the loop is closed
                return

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=1.0)


def _set(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)
