"""System metrics sampled in a background thread while something runs (the sandwich's middle layer).

Every ``interval_s`` (default 0.1 s) the sampler records:

* CPU utilisation per logical core (``psutil.cpu_percent(percpu=True)``, % busy since the previous sample)
  and this process's CPU use (``psutil.Process().cpu_percent``, 100% = one core busy);
* this process's context switches (involuntary ones mean another thread or process took the core) and
  minor page faults (``resource.getrusage``), as rates per second;
* a memory-bandwidth proxy: the throughput of a fixed 8 MiB ``numpy.copyto`` timed in the sampler thread,
  every ``probe_every`` samples, relative to the same copy on the idle machine before the run. It is the
  bandwidth still *available* to one more core: a ratio well below 1 means the run saturates memory
  bandwidth (or the cores). Hardware counters (perf, resctrl MBM) are not readable in most VMs, so this is
  a proxy, and it costs ~1 ms per probe;
* GPU utilisation and memory-controller utilisation per device via NVML when ``pynvml`` is importable and
  a driver answers; otherwise the GPU section is absent (never an error).
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

PROBE_BYTES = 8 << 20


def _copy_gbps(src: np.ndarray, dst: np.ndarray, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best / 1e9  # read + write


class _Nvml:
    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.nv: Any = None
        try:
            import pynvml as nv

            nv.nvmlInit()
            self.nv = nv
            self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        except Exception:  # no pynvml, no driver, no device: skip the GPU layer cleanly
            self.nv = None
            self.handles = []

    def sample(self) -> list[tuple[float, float]] | None:
        if self.nv is None or not self.handles:
            return None
        try:
            rates = [self.nv.nvmlDeviceGetUtilizationRates(h) for h in self.handles]
            return [(float(r.gpu), float(r.memory)) for r in rates]
        except Exception:
            return None

    def close(self) -> None:
        if self.nv is not None:
            with contextlib.suppress(Exception):
                self.nv.nvmlShutdown()


@dataclass
class SystemMetrics:
    """What the sampler saw; ``summary()`` gives the figures the sandwich reports."""

    interval_s: float
    t_s: list[float] = field(default_factory=list)
    cpu_per_core: list[list[float]] = field(default_factory=list)
    process_cpu: list[float] = field(default_factory=list)
    ctx_involuntary_per_s: list[float] = field(default_factory=list)
    ctx_voluntary_per_s: list[float] = field(default_factory=list)
    minor_faults_per_s: list[float] = field(default_factory=list)
    bandwidth_idle_gbps: float | None = None
    bandwidth_gbps: list[float] = field(default_factory=list)
    gpu: list[list[tuple[float, float]]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"samples": len(self.t_s), "interval_s": self.interval_s}
        if self.cpu_per_core:
            cores = np.asarray(self.cpu_per_core, dtype=np.float64)
            out["cpu_mean_per_core"] = [round(float(v), 1) for v in cores.mean(axis=0)]
            out["cpu_mean"] = round(float(cores.mean()), 1)
            out["cpu_busiest_core"] = round(float(cores.mean(axis=0).max()), 1)
            out["process_cpu_mean"] = round(float(np.mean(self.process_cpu)), 1)
            out["ctx_involuntary_per_s"] = round(float(np.mean(self.ctx_involuntary_per_s)), 1)
            out["ctx_voluntary_per_s"] = round(float(np.mean(self.ctx_voluntary_per_s)), 1)
            out["minor_faults_per_s"] = round(float(np.mean(self.minor_faults_per_s)), 1)
        if self.bandwidth_idle_gbps and self.bandwidth_gbps:
            during = float(np.median(self.bandwidth_gbps))
            out["bandwidth_idle_gbps"] = round(self.bandwidth_idle_gbps, 2)
            out["bandwidth_during_gbps"] = round(during, 2)
            out["bandwidth_available_ratio"] = round(during / self.bandwidth_idle_gbps, 3)
        if self.gpu:
            arr = np.asarray(self.gpu, dtype=np.float64)  # samples x devices x (gpu%, mem%)
            out["gpu_util_mean"] = [round(float(v), 1) for v in arr[:, :, 0].mean(axis=0)]
            out["gpu_idle_fraction"] = [round(float(v), 3) for v in (arr[:, :, 0] < 5).mean(axis=0)]
            out["gpu_mem_util_mean"] = [round(float(v), 1) for v in arr[:, :, 1].mean(axis=0)]
        return out


class Sampler:
    """``with Sampler() as s: run()`` then ``s.metrics.summary()``. Samples in a daemon thread."""

    def __init__(self, interval_s: float = 0.1, probe_every: int = 3, bandwidth: bool = True) -> None:
        self.interval_s = interval_s
        self.probe_every = probe_every
        self.bandwidth = bandwidth
        self.metrics = SystemMetrics(interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process(os.getpid())
        self._nvml = _Nvml()
        self._src = self._dst = np.empty(0)

    def __enter__(self) -> Sampler:
        if self.bandwidth:
            self._src = np.ones(PROBE_BYTES // 8)
            self._dst = np.empty_like(self._src)
            self.metrics.bandwidth_idle_gbps = _copy_gbps(self._src, self._dst, repeat=5)
        psutil.cpu_percent(percpu=True)  # prime: the first call has no interval to compare with
        self._proc.cpu_percent()
        self._thread = threading.Thread(target=self._run, name="latencylab-sysmetrics", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._nvml.close()

    def _run(self) -> None:
        m = self.metrics
        t0 = time.perf_counter()
        prev_t = t0
        prev = resource.getrusage(resource.RUSAGE_SELF)
        k = 0
        while not self._stop.wait(self.interval_s):
            now = time.perf_counter()
            dt = max(now - prev_t, 1e-9)
            ru = resource.getrusage(resource.RUSAGE_SELF)
            m.t_s.append(now - t0)
            m.cpu_per_core.append([float(v) for v in psutil.cpu_percent(percpu=True)])
            m.process_cpu.append(float(self._proc.cpu_percent()))
            m.ctx_involuntary_per_s.append((ru.ru_nivcsw - prev.ru_nivcsw) / dt)
            m.ctx_voluntary_per_s.append((ru.ru_nvcsw - prev.ru_nvcsw) / dt)
            m.minor_faults_per_s.append((ru.ru_minflt - prev.ru_minflt) / dt)
            gpu = self._nvml.sample()
            if gpu is not None:
                m.gpu.append(gpu)
            if self.bandwidth and k % self.probe_every == 0:
                m.bandwidth_gbps.append(_copy_gbps(self._src, self._dst, repeat=1))
            k += 1
            prev_t, prev = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
