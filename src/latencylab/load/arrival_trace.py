"""Trace arrivals: replay recorded send times (:class:`TraceReplay`), and read or write the trace files
(CSV ``t_s[,payload]`` or JSON lines)."""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from latencylab.errors import LatencyLabError
from latencylab.load.arrivals import Arrival, Blocks, arrival_limits, bounded_arrivals


class TraceReplay:
    """Replays recorded arrival times from a CSV (``t_s[,payload]`` header) or JSON-lines file.

    Times must be finite, >= 0 and non-decreasing; payloads non-negative
    integers or empty/absent. Replay shifts the first time to 0 and divides by
    ``speed`` (2.0 = twice as fast). With ``loop=True`` the trace repeats with
    period ``span * n / (n - 1)`` (the span plus one mean gap, so a
    constant-rate trace loops seamlessly), and a duration or request budget
    is needed.
    """

    __slots__ = ("_payloads", "_times", "loop", "path", "speed")

    def __init__(self, path: str | os.PathLike[str], speed: float = 1.0, loop: bool = False) -> None:
        if isinstance(speed, bool) or not isinstance(speed, int | float) or not (math.isfinite(speed) and speed > 0):
            raise LatencyLabError(f"trace speed must be a finite number > 0, got {speed!r}")
        self.path = Path(path)
        self.speed = float(speed)
        self.loop = bool(loop)
        times, payloads = read_trace(self.path)
        self._times = np.asarray(times, dtype=np.float64) - times[0]
        self._payloads: tuple[int | None, ...] = tuple(payloads)
        if self.loop and self._span() <= 0:
            raise LatencyLabError(f"{self.path}: cannot loop a trace whose arrivals all share one timestamp")

    @property
    def name(self) -> str:
        return "trace"

    def __len__(self) -> int:
        return len(self._payloads)

    def _span(self) -> float:
        return float(self._times[-1])

    def _period(self) -> float:
        n = len(self)
        return self._span() * n / (n - 1)

    def arrivals(self, duration_s: float | None = None, max_requests: int | None = None) -> Iterator[Arrival]:
        end, budget = arrival_limits(duration_s, max_requests, not self.loop, "looped trace")
        return bounded_arrivals(self._blocks(), end, budget)

    def _blocks(self) -> Blocks:
        cycle = 0
        period = self._period() if self.loop else 0.0
        while True:
            base = self._times if cycle == 0 else self._times + cycle * period
            yield base / self.speed, self._payloads
            if not self.loop:
                return
            cycle += 1

    def describe(self) -> dict[str, Any]:
        return {
            "process": "trace",
            "path": str(self.path),
            "speed": self.speed,
            "loop": self.loop,
            "requests": len(self),
            "span_s": self._span() / self.speed,
            "mean_rate": self.mean_rate(),
        }

    def mean_rate(self) -> float:
        """``(n - 1) / span`` at the replay speed; infinite when all arrivals share one instant."""
        span = self._span()
        return (len(self) - 1) * self.speed / span if span > 0 else math.inf


# -- trace files -----------------------------------------------------------------------------


def _parse_t(raw: object, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise LatencyLabError(f"{where}: t_s {raw!r} is not a number")
    try:
        t = float(raw)
    except ValueError:
        raise LatencyLabError(f"{where}: t_s {raw!r} is not a number") from None
    if not math.isfinite(t) or t < 0:
        raise LatencyLabError(f"{where}: t_s {raw!r} must be a finite number of seconds >= 0")
    return t


def _parse_payload(raw: object, where: str) -> int | None:
    if raw is None or raw == "":
        return None
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and re.fullmatch(r"[+-]?\d+", raw.strip()):
        value = int(raw)
    if value is None or value < 0:
        raise LatencyLabError(f"{where}: payload {raw!r} is not a non-negative integer")
    return value


def read_trace(path: str | os.PathLike[str]) -> tuple[list[float], list[int | None]]:
    """Times and payloads from a trace file, validated; errors name the file and line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LatencyLabError(f"trace file {p} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LatencyLabError(f"cannot read trace file {p}: {exc}") from None
    lines = text.splitlines()
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    jsonl = p.suffix.lower() in (".jsonl", ".ndjson") or (p.suffix.lower() != ".csv" and first.startswith("{"))
    times, payloads = _read_jsonl(p, lines) if jsonl else _read_csv(p, lines)
    if not times:
        raise LatencyLabError(f"trace file {p} has no arrivals")
    return times, payloads


def _read_jsonl(p: Path, lines: list[str]) -> tuple[list[float], list[int | None]]:
    times: list[float] = []
    payloads: list[int | None] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LatencyLabError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise LatencyLabError(f'{where}: expected an object like {{"t_s": 0.01, "payload": 3}}')
        unknown = sorted(set(obj) - {"t_s", "payload"})
        if unknown:
            raise LatencyLabError(f"{where}: unknown key {unknown[0]!r} (expected t_s and optional payload)")
        if "t_s" not in obj:
            raise LatencyLabError(f"{where}: missing t_s")
        _append(times, payloads, _parse_t(obj["t_s"], where), _parse_payload(obj.get("payload"), where), where)
    return times, payloads


def _read_csv(p: Path, lines: list[str]) -> tuple[list[float], list[int | None]]:
    times: list[float] = []
    payloads: list[int | None] = []
    header: list[str] | None = None
    t_col = pay_col = -1
    for lineno, row in enumerate(csv.reader(lines), start=1):
        if not row or all(not cell.strip() for cell in row):
            continue
        where = f"{p}:{lineno}"
        if header is None:
            header = [cell.strip() for cell in row]
            if "t_s" not in header or not set(header) <= {"t_s", "payload"} or len(set(header)) != len(header):
                raise LatencyLabError(f"{where}: bad CSV header {','.join(header)!r} (expected 't_s' or 't_s,payload')")
            t_col = header.index("t_s")
            pay_col = header.index("payload") if "payload" in header else -1
            continue
        if len(row) > len(header):
            raise LatencyLabError(f"{where}: {len(row)} fields, but the header names {len(header)}")
        if t_col >= len(row):
            raise LatencyLabError(f"{where}: missing t_s")
        t = _parse_t(row[t_col].strip(), where)
        payload = _parse_payload(row[pay_col].strip(), where) if 0 <= pay_col < len(row) else None
        _append(times, payloads, t, payload, where)
    if header is None:
        raise LatencyLabError(f"trace file {p} is empty (expected a 't_s,payload' header and rows)")
    return times, payloads


def _append(times: list[float], payloads: list[int | None], t: float, payload: int | None, where: str) -> None:
    if times and t < times[-1]:
        raise LatencyLabError(f"{where}: t_s {t!r} is before the previous arrival ({times[-1]!r})")
    times.append(t)
    payloads.append(payload)


def record_trace(path: str | os.PathLike[str], arrivals: Iterable[Arrival]) -> None:
    """Write ``arrivals`` as JSON lines that ``TraceReplay`` reads back exactly.

    One ``{"t_s": ..., "payload": ...}`` object per line (payload omitted when
    None); floats are written in shortest round-trip form.
    """
    p = Path(path)
    rows: list[str] = []
    last = 0.0
    for n, a in enumerate(arrivals, start=1):
        where = f"arrival {n}"
        t = _parse_t(a.t_s, where)
        if t < last:
            raise LatencyLabError(f"{where}: t_s {t!r} is before the previous arrival ({last!r})")
        last = t
        obj: dict[str, Any] = {"t_s": t}
        payload = _parse_payload(a.payload, where)
        if payload is not None:
            obj["payload"] = payload
        rows.append(json.dumps(obj))
    try:
        p.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    except OSError as exc:
        raise LatencyLabError(f"cannot write trace file {p}: {exc}") from None
