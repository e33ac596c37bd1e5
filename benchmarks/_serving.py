"""Shared helpers of the serving and load benchmarks (serve_overload.py, serve_ladder.py, serve_vs_peers.py,
load_vs_locust.py): ports, machine load and CPU accounting, config files, windows and tables, and process
control (start a server in its own session, wait until it is ready, stop it and everything it started).

Servers run on loopback only, every run is bounded, and each benchmark is meant to run alone on the
machine: wrap it in ``flock /tmp/latencylab-bench.lock`` when other benchmarks may run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
HOST = "127.0.0.1"
LOCK = "/tmp/latencylab-bench.lock"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
_SCRUBBED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PROMETHEUS_MULTIPROC_DIR")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def machine_load() -> str:
    """``uptime``'s load averages and the CPU count, with a warning when the machine is not idle."""
    one, five, _ = os.getloadavg()
    n = os.cpu_count() or 1
    note = "" if one < 0.5 else f"  WARNING: 1-min load {one:.2f} on {n} CPUs: numbers will be noisy"
    return f"load average {one:.2f} / {five:.2f} (1 / 5 min) on {n} CPUs{note}"


def cpu_model() -> str:
    """The CPU's model name and flags that matter here (from /proc/cpuinfo), and the CPUs this process may use."""
    name, avx512 = "unknown CPU", False
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name == "unknown CPU":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                avx512 = avx512 or "avx512f" in line.split()
    return f"{name}, {os.cpu_count()} vCPUs{', AVX-512' if avx512 else ''}"


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def write_serve_config(
    path: Path, model: dict[str, Any], guard: dict[str, Any] | None = None, server: dict[str, Any] | None = None
) -> Path:
    """A one-model ``latencylab serve`` config (TOML): ``[server]`` on loopback (+ ``server``), ``[[models]]``,
    ``[models.guard]``."""
    lines = ["[server]", f'host = "{HOST}"'] + [f"{k} = {toml_value(v)}" for k, v in (server or {}).items()]
    lines += ["", "[[models]]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in model.items()]
    if guard:
        lines += ["[models.guard]"] + [f"{k} = {toml_value(v)}" for k, v in guard.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@dataclass
class Server:
    """A server child process and its URL."""

    proc: subprocess.Popen[str]
    url: str
    log: Path


@contextlib.contextmanager
def server_process(
    argv: Sequence[str], log: Path, cpus: set[int] | None = None, start_s: float = 180.0
) -> Iterator[Server]:
    """Run ``argv`` (which must print ``listening http://HOST:PORT``), yield it, then SIGTERM and reap it.

    stdout and stderr go to ``log``; the child is pinned to ``cpus`` when given.
    """

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    fh = log.open("w", encoding="utf-8")
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=fh, text=True, env=env, preexec_fn=pin, cwd=ROOT)
    url: list[str] = []
    ready = threading.Event()

    def pump() -> None:  # copy stdout to the log, noticing the "listening" line
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            fh.flush()
            if line.startswith("listening ") and not url:
                url.append(line.split()[1].strip())
                ready.set()
        ready.set()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        if not ready.wait(start_s) or not url:
            raise RuntimeError(f"{argv[:4]}... did not start listening within {start_s:g} s; see {log}")
        yield Server(proc, url[0], log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        t.join(5)
        fh.close()


def windows(
    intended_ns: np.ndarray,
    done_ns: np.ndarray,
    outcome: np.ndarray,
    width_s: float,
    slo_ms: float | None = None,
    span_s: float | None = None,
) -> list[dict[str, Any]]:
    """Per window of intended send time: sent, ok, shed, error, p50/p99/max of ok (corrected), goodput/s, and the
    p99 of the admitted (``p99_admitted_ms``: every request not shed, an error such as a 504 at its latency)."""
    lat = done_ns - intended_ns
    idx = (intended_ns // int(width_s * 1e9)).astype(np.int64)
    n_win = int(idx.max()) + 1 if idx.size else 0
    if span_s is not None:
        n_win = min(n_win, max(1, round(span_s / width_s)))
    out = []
    for b in range(n_win):
        m = idx == b
        ok = m & (outcome == 0)
        v = lat[ok] / 1e6
        row: dict[str, Any] = {
            "from_s": b * width_s,
            "to_s": (b + 1) * width_s,
            "sent": int(m.sum()),
            "ok": int(ok.sum()),
            "shed": int((m & (outcome == 1)).sum()),
            "error": int((m & (outcome == 2)).sum()),
            "p50_ms": float(np.quantile(v, 0.5)) if v.size else None,
            "p99_ms": float(np.quantile(v, 0.99)) if v.size else None,
            "max_ms": float(v.max()) if v.size else None,
        }
        admitted = lat[m & (outcome != 1)] / 1e6  # ok + error: a request admitted and then failed is a miss too
        row["p99_admitted_ms"] = float(np.quantile(admitted, 0.99)) if admitted.size else None
        if slo_ms is not None:
            row["goodput"] = float((v <= slo_ms).sum()) / width_s
        out.append(row)
    return out


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (pastes into docs/benchmarks/*.md as is)."""
    cells = [[str(c) for c in r] for r in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in cells]
    return "\n".join(lines)


def metric_sum(metrics: dict[tuple[str, str], float], name: str, **labels: str) -> float:
    """Sum of a Prometheus sample over the series whose labels include ``labels``."""
    total = 0.0
    for (n, lab), v in metrics.items():
        if n != name:
            continue
        if all(f'{k}="{val}"' in lab for k, val in labels.items()):
            total += v
    return total


def by_label(metrics: dict[tuple[str, str], float], name: str, label: str) -> dict[str, float]:
    """{label value: sample} of one metric (e.g. shed counts by reason)."""
    out: dict[str, float] = {}
    key = f'{label}="'
    for (n, lab), v in metrics.items():
        if n == name and key in lab:
            val = lab.split(key, 1)[1].split('"', 1)[0]
            out[val] = out.get(val, 0.0) + v
    return out


def delta(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def monotonic_s() -> float:
    """CLOCK_MONOTONIC seconds: time.perf_counter on Linux, comparable across processes."""
    return time.perf_counter()


# ---------------------------------------------------------------------------------------------- machine


def session_cpu_s(sid: int) -> float:
    """User + system CPU seconds of every live process in session ``sid`` (a server and all it started)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def session_pids(sid: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == sid:
                pids.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return pids


def machine_busy_s() -> float:
    """CPU seconds all CPUs spent busy since boot (everything in /proc/stat but idle and iowait)."""
    vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    return (sum(vals) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")


def machine_steal_s() -> float:
    """CPU seconds the hypervisor gave this VM's CPUs to someone else since boot (/proc/stat's steal): the host's
    other tenants, which no process in the VM sees."""
    return int(Path("/proc/stat").read_text().splitlines()[0].split()[8]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class ForeignCpu:
    """CPU that other processes used while a block ran, in CPUs (0.25 = a quarter of one core on average): the
    machine's busy time (/proc/stat) less this process's (the generator) and ``pids``'s (the server).

    A benchmark on a shared machine measures the machine as much as the server when another process takes a
    core from under it; a chunk measured while other processes used more than a small share is not a
    measurement of the server and is rerun (``benchmarks/serve_overload.py``). ``steal`` is the same for the
    host's other tenants: the CPUs the hypervisor took from this VM meanwhile (/proc/stat's steal)."""

    def __init__(self, pids: Sequence[int] = ()) -> None:
        self.pids = tuple(pids)
        self.cpus: float = 0.0
        self.steal: float = 0.0
        self.wall_s: float = 0.0

    def _ours(self) -> float:
        total = own_cpu_s()
        for pid in self.pids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += proc_cpu_s(pid)
        return total

    def __enter__(self) -> ForeignCpu:
        self._t0, self._busy0, self._ours0 = time.perf_counter(), machine_busy_s(), self._ours()
        self._steal0 = machine_steal_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._t0
        foreign = (machine_busy_s() - self._busy0) - (self._ours() - self._ours0)
        self.cpus = max(0.0, foreign) / self.wall_s if self.wall_s > 0 else 0.0
        self.steal = max(0.0, machine_steal_s() - self._steal0) / self.wall_s if self.wall_s > 0 else 0.0


class StealTrace:
    """The hypervisor's steal (ForeignCpu.steal) sampled every ``every_s`` on a daemon thread while a block runs,
    so a run can say in which of its windows the host took CPUs from the VM, not only on average."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.samples: list[tuple[float, float]] = []  # (seconds since the start, steal CPU-seconds since the start)
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append((time.perf_counter() - self._t0, machine_steal_s() - self._s0))

    def __enter__(self) -> StealTrace:
        self._t0, self._s0 = time.perf_counter(), machine_steal_s()
        self._thread = threading.Thread(target=self._run, name="steal-trace", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.perf_counter() - self._t0, machine_steal_s() - self._s0))

    def per_window(self, window_s: float) -> list[float]:
        """Steal in CPUs (stolen CPU-seconds / wall seconds) per ``window_s`` window from the start."""
        out: list[float] = []
        prev_t, prev_v = 0.0, 0.0
        edge = window_s
        for t, v in self.samples:
            if t >= edge - 1e-9:
                out.append((v - prev_v) / (t - prev_t) if t > prev_t else 0.0)
                prev_t, prev_v, edge = t, v, edge + window_s
        if self.samples and self.samples[-1][0] >= prev_t + 0.5 * window_s:  # a last partial window, if long enough
            t, v = self.samples[-1]
            out.append((v - prev_v) / (t - prev_t))
        return out


def wait_quiet(
    pids: Sequence[int] = (), limit: float = 0.1, probe_s: float = 1.0, max_wait_s: float = 300.0,
    steal_limit: float | None = None,
) -> float:  # fmt: skip
    """Wait until other processes than this one and ``pids`` use at most ``limit`` CPUs over ``probe_s`` (and,
    with ``steal_limit``, the host steals at most that many CPUs from the VM), at most ``max_wait_s``; returns the
    seconds waited (0.0 when the machine was quiet at once)."""
    t0 = time.perf_counter()
    while True:
        with ForeignCpu(pids) as fc:
            time.sleep(probe_s)
        quiet = fc.cpus <= limit and (steal_limit is None or fc.steal <= steal_limit)
        if quiet or time.perf_counter() - t0 >= max_wait_s:
            return time.perf_counter() - t0 - probe_s


def cpu_busy(seconds: float = 1.0) -> float:
    """Fraction of all CPUs busy over ``seconds`` (from /proc/stat)."""

    def snap() -> tuple[int, int]:
        vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = vals[3] + vals[4]
        return sum(vals), idle

    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def wait_idle(limit_busy: float = 0.1, max_wait_s: float = 90.0) -> str:
    """Wait until the machine is idle (before starting a server); returns a line for the log."""
    start = time.monotonic()
    busy = cpu_busy()
    while busy > limit_busy and time.monotonic() - start < max_wait_s:
        busy = cpu_busy(2.0)
    load = os.getloadavg()
    note = "" if busy <= limit_busy else f"  WARNING: still {busy:.0%} busy after {max_wait_s:g} s"
    return f"CPU {busy:.0%} busy, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}{note}"


@contextlib.contextmanager
def bench_lock(path: str) -> Iterator[float]:
    """Hold the machine-wide benchmark lock (flock), yielding how long we waited for it."""
    t0 = time.monotonic()
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - t0
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pin_to(core: int) -> Any:
    """A preexec_fn that pins the child (and everything it forks) to one core."""

    def pin() -> None:
        os.sched_setaffinity(0, {core})

    return pin


def core_ticks(core: int) -> tuple[int, int]:
    """(busy, total) jiffies of one core from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            v = [int(x) for x in line.split()[1:]]
            return sum(v) - v[3] - v[4], sum(v)
    return 0, 0


def noise_probe(core: int, seconds: float, other: int) -> dict[str, float]:
    """Spin on ``core`` and count the gaps > 1 ms between back-to-back clock reads: time the core was taken
    away (host steal, other tasks). An open-loop sender on that core is late by at least as much. Also
    reports how busy ``other`` (the server core, where nginx is idle meanwhile) is with other processes."""
    b0, t0 = core_ticks(other)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        clock = time.perf_counter_ns
        end = clock() + int(seconds * 1e9)
        last = clock()
        gaps: list[int] = []
        while last < end:
            t = clock()
            if t - last > 1_000_000:
                gaps.append(t - last)
            last = t
    finally:
        os.sched_setaffinity(0, before)
    b1, t1 = core_ticks(other)
    return {
        "other_core_busy_percent": 100 * (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0,
        "stalls_over_1ms": len(gaps),
        "stalled_percent": 100 * sum(gaps) / (seconds * 1e9),
        "longest_ms": max(gaps, default=0) / 1e6,
    }


# ---------------------------------------------------------------------------------------------- processes


def http(url: str, body: bytes | None = None, timeout_s: float = 10.0) -> tuple[int | None, bytes]:
    """(status, body) of GET (or POST with ``body``) ``url``; status None when nothing answered."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()
    except (urllib.error.URLError, OSError):
        return None, b""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED and not k.startswith("MLSERVER_")}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",  # loopback only: no usage report
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    env.update(extra or {})
    return env


def normal_priority() -> None:
    """preexec_fn: the servers run as ordinary processes (SCHED_OTHER, nice 0) whatever the generator runs as."""
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, 0, 0)


def raise_generator_priority(mode: str) -> str:
    """Let the load generator (this process) run before the server when both want a core.

    On a separate client machine the generator would never wait for the server's threads; here they share
    2 cores, and with the server's torch threads busy, Linux's fair scheduler can keep the generator off a
    core for a few ms, so its sends are late and the step counts as invalid. ``fifo``: SCHED_FIFO priority 1
    (the generator sleeps between sends, so it takes little: its CPU share is printed per step);
    ``nice``: nice -10; ``none``: unchanged. Returns what was applied.
    """
    try:
        if mode == "fifo":
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        elif mode == "nice":
            os.setpriority(os.PRIO_PROCESS, 0, -10)
    except PermissionError:
        return "unchanged (not permitted)"
    return {"fifo": "SCHED_FIFO 1", "nice": "nice -10", "none": "unchanged"}[mode]


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]
    url: str
    path: str
    workdir: Path
    stats: Callable[[], dict[str, Any] | None]
    startup_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def log_tail(self, n: int = 25) -> str:
        try:
            return "\n".join((self.workdir / "server.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL after ``grace_s``, then any straggler of its session."""
        sid = self.process.pid
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(sid, signal.SIGKILL)
                self.process.wait()
        # Ray's daemons may outlive the driver for a moment (or be in other process groups of the session).
        deadline = time.monotonic() + 10
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in session_pids(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def launch(
    name: str, cmd: list[str], *, url: str, path: str, ready: str, workdir: Path, env: dict[str, str],
    stats: Callable[[], dict[str, Any] | None], notes: list[str], startup_timeout: float,
) -> Running:  # fmt: skip
    """Start ``cmd`` in ``workdir`` as a server in its own session (an ordinary process, its output in
    ``workdir/server.log``) and wait until ``ready`` answers 200; on failure stop it and raise RuntimeError
    with the log's tail."""
    t0 = time.monotonic()
    with open(workdir / "server.log", "wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=normal_priority,
        )
    srv = Running(name, proc, url, path, workdir, stats, notes=notes)
    try:
        while http(ready, timeout_s=2.0)[0] != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}; log:\n{srv.log_tail()}")
            if time.monotonic() - t0 > startup_timeout:
                raise RuntimeError(f"{name} not ready within {startup_timeout:g} s; log:\n{srv.log_tail()}")
            time.sleep(0.2)
    except BaseException:
        srv.stop()
        raise
    srv.startup_s = time.monotonic() - t0
    return srv


def json_stats(url: str) -> dict[str, Any] | None:
    """The JSON a server's stats endpoint answers, or None."""
    status, body = http(url)
    return json.loads(body) if status == 200 else None
