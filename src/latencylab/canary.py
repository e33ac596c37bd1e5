"""The machine-speed canary: how fast was this machine while a result was measured?

Two runs of an unchanged program differ when the host's speed moves between them (another tenant, a
frequency step, the hypervisor taking cycles), and no statistic over one run's samples can see that. So
every profile result carries a *canary*: two short fixed kernels timed before the run, between runs and
after it, plus the operating system's own account of lost time.

* **CPU kernel**: a pure-Python integer loop (``CPU_LOOP`` iterations of a multiply-add-mask), timed
  ``CPU_REPEATS`` times with ``perf_counter_ns``; a reading is the median repeat (~1.3 ms each on the
  reference VM, ~35 ms a reading). It runs in the interpreter, like a pipeline's Python glue, so a
  slower core, a lower clock and a core shared with other work all show in it: the median, because a
  ~1 ms piece of a pipeline is slowed by the scheduler's interruptions just as the canary is (the first
  quartile, ``cpu_best_ns``, is kept too: the core's speed when it is not interrupted). Its own noise:
  docs/metrics.md, "The machine-speed canary".
* **Memory kernel**: ``numpy.copyto`` of a ``MEM_BYTES`` (64 MiB, beyond the last-level cache) array,
  ``MEM_REPEATS`` times; a reading is the best throughput, read + write bytes / time, in GB/s.
* **Frequency** (MHz, mean over CPUs) from ``cpufreq/scaling_cur_freq`` or ``/proc/cpuinfo``, where readable.
* **Steal** (``/proc/stat``: time the hypervisor ran another guest while this one wanted the CPU) and this
  process's **involuntary context switches** (``getrusage``), counted from the first reading to the last.

``summarize`` turns the readings into the ``env.canary`` section of a result; ``compare_canaries`` tells
how much slower the machine was in one result than in another. Everything is a pure function of the
readings except :class:`MachineCanary`, which takes them; tests pass their own canary.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

CANARY_VERSION = 1
CPU_LOOP = 20_000
CPU_REPEATS = 25
MEM_BYTES = 64 * 2**20
MEM_REPEATS = 5
# The canary moved between two results by more than this: compare refuses to judge a gate on them, and
# diagnose says so. Measured: the canary's own spread on the shared 2-vCPU reference VM (docs/metrics.md).
THRESHOLD = 0.10
STEAL_WARN = 0.05  # steal time above this share of the CPU time: the hypervisor is taking cycles


@dataclass(frozen=True, slots=True)
class Reading:
    """One canary reading: when (``at``: before / between / after; ``t_s`` from the first reading), the
    CPU kernel's repeats (ns), the memory kernel's throughputs (GB/s), and the OS counters at that moment."""

    at: str
    t_s: float
    cpu_ns: tuple[int, ...]
    mem_gbps: tuple[float, ...]
    freq_mhz: float | None = None
    steal_ticks: int | None = None
    total_ticks: int | None = None
    involuntary_switches: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "t_s": round(self.t_s, 4),
            "cpu_ns": list(self.cpu_ns),
            "mem_gbps": [round(v, 3) for v in self.mem_gbps],
            "freq_mhz": self.freq_mhz,
            "steal_ticks": self.steal_ticks,
            "total_ticks": self.total_ticks,
            "involuntary_switches": self.involuntary_switches,
        }


class Canary(Protocol):
    """Takes one reading; ``at`` says when in the measurement it is taken."""

    def read(self, at: str) -> Reading: ...


def cpu_kernel(n: int = CPU_LOOP) -> int:
    """The fixed CPU work: a multiply-add-mask chain (cannot be skipped or vectorised by the interpreter)."""
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFFFFF
    return x


def _proc_stat() -> tuple[int | None, int | None]:
    """(steal, total) jiffies of the first ``cpu`` line of /proc/stat, or (None, None)."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None, None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None, None
    ticks = [int(v) for v in fields[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already in user.
    return ticks[7], sum(ticks[:8])


def _frequency_mhz() -> float | None:
    found = []
    for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            found.append(int(p.read_text().strip()) / 1000.0)
        except (OSError, ValueError):
            continue
    if not found:
        try:
            text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "cpu MHz":
                try:
                    found.append(float(value))
                except ValueError:
                    continue
    return round(statistics.fmean(found), 1) if found else None


def _involuntary() -> int | None:
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw)


class MachineCanary:
    """The real canary (see the module docstring); the first reading sets ``t_s`` = 0."""

    def __init__(
        self, cpu_loop: int = CPU_LOOP, cpu_repeats: int = CPU_REPEATS, mem_bytes: int = MEM_BYTES,
        mem_repeats: int = MEM_REPEATS,
    ) -> None:  # fmt: skip
        self.cpu_loop, self.cpu_repeats = cpu_loop, cpu_repeats
        self.mem_bytes, self.mem_repeats = mem_bytes, mem_repeats
        self._t0: int | None = None

    def read(self, at: str) -> Reading:
        import numpy as np

        now = time.perf_counter_ns
        t = now()
        if self._t0 is None:
            self._t0 = t
        t_s = (t - self._t0) / 1e9
        cpu_kernel(self.cpu_loop // 10)  # warm the loop's code path
        cpu = []
        for _ in range(self.cpu_repeats):
            t = now()
            cpu_kernel(self.cpu_loop)
            cpu.append(now() - t)
        n = max(1, self.mem_bytes // 8)
        src = np.ones(n, dtype=np.float64)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # touch the pages first: page faults are not bandwidth
        mem = []
        for _ in range(self.mem_repeats):
            t = now()
            np.copyto(dst, src)
            mem.append(2 * src.nbytes / max(now() - t, 1))  # bytes per ns = GB/s
        steal, total = _proc_stat()
        return Reading(at, t_s, tuple(cpu), tuple(mem), _frequency_mhz(), steal, total, _involuntary())


# ------------------------------------------------------------------------------------------ summary
def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def summarize(readings: Sequence[Reading], kernel: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``env.canary`` section: every reading, and the figures compare and diagnose use.

    ``cpu_ns``: the median over readings of each reading's median repeat (``cpu_best_ns``: of each
    reading's first quartile); ``mem_gbps``: the median over readings of each reading's best throughput.
    ``drift``: (slowest - fastest reading) / ``cpu_ns``, how much the machine's speed moved while this
    result was measured. ``steal_fraction``: steal jiffies / all jiffies between the first and the last
    reading (None where /proc/stat is not readable). ``involuntary_switches_per_s``: this process's
    involuntary context switches over the same span, per second.
    """
    cpu = [cpu_reading(r.cpu_ns) for r in readings if r.cpu_ns]
    best = [cpu_reading(r.cpu_ns, 0.25) for r in readings if r.cpu_ns]
    mem = [max(r.mem_gbps) for r in readings if r.mem_gbps]
    freqs = [r.freq_mhz for r in readings if r.freq_mhz is not None]
    cpu_mid = _median(cpu)
    out: dict[str, Any] = {
        "version": CANARY_VERSION,
        "kernel": dict(kernel or describe_kernel()),
        "cpu_ns": round(cpu_mid) if cpu_mid is not None else None,
        "cpu_best_ns": round(b) if (b := _median(best)) is not None else None,
        "mem_gbps": round(m, 3) if (m := _median(mem)) is not None else None,
        "drift": round((max(cpu) - min(cpu)) / cpu_mid, 4) if cpu_mid else None,
        "freq_mhz": round(statistics.fmean(freqs), 1) if freqs else None,
        "steal_fraction": None,
        "involuntary_switches_per_s": None,
        "readings": [r.to_dict() for r in readings],
    }
    if len(readings) >= 2:
        first, last = readings[0], readings[-1]
        if None not in (first.steal_ticks, last.steal_ticks, first.total_ticks, last.total_ticks):
            assert first.steal_ticks is not None and last.steal_ticks is not None
            assert first.total_ticks is not None and last.total_ticks is not None
            span = last.total_ticks - first.total_ticks
            out["steal_fraction"] = round((last.steal_ticks - first.steal_ticks) / span, 4) if span > 0 else 0.0
        seconds = last.t_s - first.t_s
        if first.involuntary_switches is not None and last.involuntary_switches is not None and seconds > 0:
            out["involuntary_switches_per_s"] = round(
                (last.involuntary_switches - first.involuntary_switches) / seconds, 2
            )
    return out


def cpu_reading(repeats_ns: Sequence[int], q: float = 0.5) -> float:
    """A CPU reading from its repeats: their ``q`` quantile (type 7; the median by default)."""
    xs = sorted(repeats_ns)
    h = (len(xs) - 1) * q
    lo = int(h)
    return float(xs[lo] + (h - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo]))


def describe_kernel() -> dict[str, Any]:
    return {
        "cpu": f"pure-Python multiply-add-mask loop x {CPU_LOOP}, median of {CPU_REPEATS} repeats",
        "mem": f"numpy.copyto of {MEM_BYTES // 2**20} MiB, best of {MEM_REPEATS} (read + write GB/s)",
    }


@dataclass(frozen=True, slots=True)
class CanaryDelta:
    """How much slower the machine was in ``candidate``'s measurement than in ``baseline``'s.

    ``slower`` = candidate CPU-kernel time / baseline's - 1 (0.12: the machine ran the same kernel 12%
    slower); ``mem_slower`` = baseline GB/s / candidate GB/s - 1; ``drift_*`` each side's own movement;
    ``moved``: |slower| or |mem_slower| > ``threshold``.
    """

    baseline_ns: float
    candidate_ns: float
    slower: float
    mem_slower: float | None
    drift_baseline: float | None
    drift_candidate: float | None
    threshold: float
    moved: bool

    def describe(self, names: tuple[str, str] = ("baseline", "candidate")) -> str:
        def how(x: float) -> str:
            return f"{abs(x):.0%} {'slower' if x > 0 else 'faster'}"

        text = (
            f"the machine was {how(self.slower)} in {names[1]}'s run than in {names[0]}'s "
            f"(canary CPU kernel {self.baseline_ns / 1e6:.2f} -> {self.candidate_ns / 1e6:.2f} ms"
        )
        if self.mem_slower is not None:
            text += f", memory kernel {how(self.mem_slower)}"
        return text + ")"


def compare_canaries(
    a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, threshold: float = THRESHOLD
) -> CanaryDelta | None:
    """The canary change from ``a`` to ``b`` (two ``env.canary`` sections), or None when either lacks one."""
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return None
    ca, cb = a.get("cpu_ns"), b.get("cpu_ns")
    if not isinstance(ca, (int, float)) or not isinstance(cb, (int, float)) or ca <= 0 or cb <= 0:
        return None
    slower = cb / ca - 1.0
    ma, mb = a.get("mem_gbps"), b.get("mem_gbps")
    mem = ma / mb - 1.0 if isinstance(ma, (int, float)) and isinstance(mb, (int, float)) and mb > 0 else None
    # Only the CPU kernel decides: the memory kernel's own spread on a shared machine (docs/metrics.md) is
    # close to the threshold, so it would refuse comparisons of unchanged programs; it is reported beside.
    moved = abs(slower) > threshold
    return CanaryDelta(float(ca), float(cb), slower, mem, a.get("drift"), b.get("drift"), threshold, moved)


def default_canary_enabled() -> bool:
    """``LATENCYLAB_CANARY=0`` turns the canary off (for a machine where even 0.1 s per result matters)."""
    return os.environ.get("LATENCYLAB_CANARY", "1") not in ("0", "off", "no", "false")
