"""Shared helpers of the serving benchmarks (serve_overload.py, serve_ladder.py).

Servers run on loopback only, every run is bounded, and each benchmark is meant to run alone on the
machine: wrap it in ``flock /tmp/latencylab-bench.lock`` when other benchmarks may run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
HOST = "127.0.0.1"


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


def write_serve_config(path: Path, model: dict[str, Any], guard: dict[str, Any] | None = None) -> Path:
    """A one-model ``latencylab serve`` config (TOML): ``[server]`` on loopback, ``[[models]]``, ``[models.guard]``."""
    lines = ["[server]", f'host = "{HOST}"', "", "[[models]]"]
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
    """Per window of intended send time: sent, ok, shed, error, p50/p99/max of ok (corrected), goodput/s."""
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
        if slo_ms is not None:
            row["goodput"] = float((v <= slo_ms).sum()) / width_s
        out.append(row)
    return out


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (pastes into docs/BENCHMARKS.md as is)."""
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
