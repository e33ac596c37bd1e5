"""Arrival processes: the *intended* send times of an open-loop load test.

An arrival process is fixed before the run and does not depend on how fast the
server answers; the generator sends each request at its intended time and
measures latency from it (so a stalled server cannot hide its stall).

* ``Poisson(rate)``: independent arrivals, exponential gaps (the usual model of
  many independent users).
* ``Constant(rate)``: ``t_k = k / rate``, computed per k, so there is no drift.
* ``Schedule(steps)``: piecewise rates, each step flat or a linear ramp. Its
  cumulative intensity ``L(t) = integral_0^t rate`` is piecewise quadratic and
  invertible in closed form; Poisson arrivals are ``L^-1(E_k)`` for the event
  times E_k of a unit-rate Poisson process (time rescaling: an exact
  non-homogeneous Poisson process), constant arrivals are ``L^-1(k)``.
* ``TraceReplay(path)`` (:mod:`latencylab.load.arrival_trace`): recorded times
  (CSV ``t_s,payload`` or JSON lines), shifted to start at 0 and divided by ``speed``.

Every process yields ``Arrival``s with ``t_s < duration_s`` and at most
``max_requests`` of them, whichever ends first. Open-ended processes need one
of the two; schedules (which end with their last step) and unlooped traces do not.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from latencylab.errors import LatencyLabError

FloatArray = npt.NDArray[np.float64]
_BLOCK = 4096  # arrivals generated per numpy call; fixed so a seed gives one sequence

PROCESSES = ("poisson", "constant")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One intended send: ``t_s`` seconds after the run start; ``payload`` indexes the payload pool.

    ``payload=None`` lets the generator choose the payload.
    """

    t_s: float
    payload: int | None = None


class ArrivalProcess(Protocol):
    """What the load generator needs from an arrival process."""

    @property
    def name(self) -> str: ...

    def arrivals(self, duration_s: float | None = None, max_requests: int | None = None) -> Iterator[Arrival]:
        """Intended send times in order, stopping at ``duration_s`` or ``max_requests``."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable parameters, for results and reports."""
        ...

    def mean_rate(self) -> float:
        """Mean arrivals per second."""
        ...


Blocks = Iterator[tuple[FloatArray, Sequence[int | None] | None]]


def arrival_limits(duration_s: float | None, max_requests: int | None, finite: bool, who: str) -> tuple[float, int]:
    if duration_s is None and max_requests is None and not finite:
        raise LatencyLabError(f"{who} arrivals never end: give a duration or a maximum request count")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise LatencyLabError(f"duration must be a finite number of seconds > 0, got {duration_s!r}")
    if max_requests is not None and (
        isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 1
    ):
        raise LatencyLabError(f"maximum request count must be an integer >= 1, got {max_requests!r}")
    end = math.inf if duration_s is None else float(duration_s)
    budget = sys.maxsize if max_requests is None else max_requests
    return end, budget


def bounded_arrivals(blocks: Blocks, end: float, budget: int) -> Iterator[Arrival]:
    """Arrivals from sorted time blocks, those with ``t < end``, at most ``budget`` of them."""
    left = budget
    for times, payloads in blocks:
        cut = int(np.searchsorted(times, end, side="left"))
        take = min(cut, left)
        ts = times[:take].tolist()
        if payloads is None:
            for t in ts:
                yield Arrival(t, None)
        else:
            for t, p in zip(ts, payloads[:take], strict=True):
                yield Arrival(t, p)
        left -= take
        if cut < len(times) or left <= 0:
            return


def _check_rate(rate: float, what: str = "rate", allow_zero: bool = False) -> None:
    ok = isinstance(rate, int | float) and not isinstance(rate, bool) and math.isfinite(rate)
    if not ok or rate < 0 or (rate == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise LatencyLabError(f"{what} must be a finite number of requests/s {bound}, got {rate!r}")


@dataclass(frozen=True, slots=True)
class Poisson:
    """Poisson arrivals at ``rate`` per second: exponential gaps from a seeded numpy Generator."""

    rate: float
    seed: int = 0

    def __post_init__(self) -> None:
        _check_rate(self.rate)

    @property
    def name(self) -> str:
        return "poisson"

    def arrivals(self, duration_s: float | None = None, max_requests: int | None = None) -> Iterator[Arrival]:
        end, budget = arrival_limits(duration_s, max_requests, False, "poisson")
        return bounded_arrivals(self._blocks(), end, budget)

    def _blocks(self) -> Blocks:
        rng = np.random.default_rng(self.seed)
        t = 0.0
        while True:
            times = t + np.cumsum(rng.standard_exponential(_BLOCK) / self.rate)
            t = float(times[-1])
            yield times, None

    def describe(self) -> dict[str, Any]:
        return {"process": "poisson", "rate": float(self.rate), "seed": self.seed}

    def mean_rate(self) -> float:
        return float(self.rate)


@dataclass(frozen=True, slots=True)
class Constant:
    """Evenly spaced arrivals: ``t_k = k / rate`` for k = 0, 1, ... (no accumulated drift)."""

    rate: float

    def __post_init__(self) -> None:
        _check_rate(self.rate)

    @property
    def name(self) -> str:
        return "constant"

    def arrivals(self, duration_s: float | None = None, max_requests: int | None = None) -> Iterator[Arrival]:
        end, budget = arrival_limits(duration_s, max_requests, False, "constant")
        return bounded_arrivals(self._blocks(), end, budget)

    def _blocks(self) -> Blocks:
        k0 = 0
        while True:
            yield np.arange(k0, k0 + _BLOCK, dtype=np.float64) / self.rate, None
            k0 += _BLOCK

    def describe(self) -> dict[str, Any]:
        return {"process": "constant", "rate": float(self.rate)}

    def mean_rate(self) -> float:
        return float(self.rate)


@dataclass(frozen=True, slots=True)
class Step:
    """``duration_s`` seconds at ``rate``/s, or a linear ramp from ``rate`` to ``end_rate``.

    Flat steps need ``rate > 0``; a ramp's ends may be 0 (not both).
    """

    duration_s: float
    rate: float
    end_rate: float | None = None

    def __post_init__(self) -> None:
        d = self.duration_s
        if isinstance(d, bool) or not isinstance(d, int | float) or not (math.isfinite(d) and d > 0):
            raise LatencyLabError(f"step duration must be a finite number of seconds > 0, got {d!r}")
        if self.end_rate is None:
            _check_rate(self.rate, "step rate")
        else:
            _check_rate(self.rate, "ramp start rate", allow_zero=True)
            _check_rate(self.end_rate, "ramp end rate", allow_zero=True)
            if self.rate == 0 and self.end_rate == 0:
                raise LatencyLabError("a ramp from 0 to 0 requests/s sends nothing")

    @property
    def final_rate(self) -> float:
        return float(self.rate if self.end_rate is None else self.end_rate)

    @property
    def requests(self) -> float:
        """Expected arrivals in the step: the integral of its rate."""
        return float(self.duration_s * (self.rate + self.final_rate) / 2)

    def to_dict(self) -> dict[str, Any]:
        return {"duration_s": float(self.duration_s), "rate": float(self.rate), "end_rate": self.final_rate}


@dataclass(frozen=True, slots=True)
class Schedule:
    """Piecewise-rate arrivals over consecutive ``steps`` (Poisson or constant); ends with the last step."""

    steps: Sequence[Step]
    process: str = "poisson"
    seed: int = 0
    # cumulative tables, derived in __post_init__
    _starts: FloatArray = field(init=False, repr=False, compare=False)
    _lam: FloatArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        steps = tuple(self.steps)
        if not steps:
            raise LatencyLabError("a schedule needs at least one step")
        for s in steps:
            if not isinstance(s, Step):
                raise LatencyLabError(f"schedule steps must be Step values, got {s!r}")
        if self.process not in PROCESSES:
            raise LatencyLabError(f"schedule process must be one of {', '.join(PROCESSES)}, got {self.process!r}")
        starts = np.zeros(len(steps) + 1)
        lam = np.zeros(len(steps) + 1)
        for i, s in enumerate(steps):  # sequential sums: starts[i] + duration == starts[i + 1] exactly
            starts[i + 1] = starts[i] + s.duration_s
            lam[i + 1] = lam[i] + s.requests
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "_starts", starts)
        object.__setattr__(self, "_lam", lam)

    @property
    def name(self) -> str:
        return "schedule"

    @property
    def duration_s(self) -> float:
        return float(self._starts[-1])

    def rate_at(self, t_s: float) -> float:
        """The intended rate (requests/s) at ``t_s`` seconds (0 outside the schedule)."""
        if not 0 <= t_s < self.duration_s:
            return 0.0
        i = int(np.searchsorted(self._starts, t_s, side="right")) - 1
        s = self.steps[i]
        u = t_s - float(self._starts[i])
        return float(s.rate + (s.final_rate - s.rate) * u / s.duration_s)

    def expected_between(self, a_s: float, b_s: float) -> float:
        """Expected arrivals in [a_s, b_s): the integral of the rate."""
        return self._cumulative(min(max(b_s, 0.0), self.duration_s)) - self._cumulative(
            min(max(a_s, 0.0), self.duration_s)
        )

    def _cumulative(self, t_s: float) -> float:
        i = min(int(np.searchsorted(self._starts, t_s, side="right")) - 1, len(self.steps) - 1)
        s = self.steps[i]
        u = t_s - float(self._starts[i])
        slope = (s.final_rate - s.rate) / s.duration_s
        return float(self._lam[i] + s.rate * u + slope * u * u / 2)

    def _inverse(self, lam: FloatArray) -> FloatArray:
        """Times t with L(t) = lam, for lam in [0, L(end)), solving each step's quadratic stably."""
        rate0 = np.array([s.rate for s in self.steps], dtype=np.float64)
        rate1 = np.array([s.final_rate for s in self.steps], dtype=np.float64)
        dur = np.array([s.duration_s for s in self.steps], dtype=np.float64)
        i = np.clip(np.searchsorted(self._lam, lam, side="right") - 1, 0, len(self.steps) - 1)
        c = lam - self._lam[i]  # arrivals still to go inside step i
        b = rate0[i]
        a = (rate1[i] - rate0[i]) / (2 * dur[i])
        # a u^2 + b u = c  ->  u = 2c / (b + sqrt(b^2 + 4ac)): no cancellation when a -> 0 or b = 0
        root = np.sqrt(np.maximum(b * b + 4 * a * c, 0.0))
        denom = b + root
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(a == 0, c / b, 2 * c / denom)
        u = np.where(c <= 0, 0.0, u)
        u = np.clip(u, 0.0, dur[i])
        return np.asarray(self._starts[i] + u, dtype=np.float64)

    def arrivals(self, duration_s: float | None = None, max_requests: int | None = None) -> Iterator[Arrival]:
        end, budget = arrival_limits(duration_s, max_requests, True, "schedule")
        return bounded_arrivals(self._blocks(), min(end, self.duration_s), budget)

    def _blocks(self) -> Blocks:
        total = float(self._lam[-1])
        rng = np.random.default_rng(self.seed)
        level = 0.0
        k0 = 0
        last = 0.0
        while True:
            if self.process == "poisson":
                lam = level + np.cumsum(rng.standard_exponential(_BLOCK))
                level = float(lam[-1])
            else:
                lam = np.arange(k0, k0 + _BLOCK, dtype=np.float64)
                k0 += _BLOCK
            inside = lam < total
            times = self._inverse(lam[inside])
            # rounding must never reorder arrivals
            times = np.maximum.accumulate(np.maximum(times, last)) if times.size else times
            if times.size:
                last = float(times[-1])
            if not inside.all():
                # past the schedule's end: an end marker stops bounded_arrivals after this block
                yield np.append(times, math.inf), None
                return
            yield times, None

    def describe(self) -> dict[str, Any]:
        return {
            "process": "schedule",
            "arrival": self.process,
            "steps": [s.to_dict() for s in self.steps],
            "seed": self.seed,
            "duration_s": self.duration_s,
            "mean_rate": self.mean_rate(),
        }

    def mean_rate(self) -> float:
        return float(self._lam[-1] / self._starts[-1])


# -- CLI syntax ------------------------------------------------------------------------------

_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_DURATION = re.compile(rf"^({_NUM})\s*(ms|s|m|min|h)?$")
_RANGE = re.compile(rf"^({_NUM})\s*-\s*({_NUM})$")
_SPEED = re.compile(rf"^({_NUM})x$")
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, None: 1.0}

SPEC_HELP = (
    "poisson:RATE, constant:RATE, step[-constant]:DUR@RATE,DUR@RATE,..., "
    "ramp[-constant]:FROM-TO@DUR,..., trace:PATH[@SPEEDx]"
)


def _bad(spec: str, why: str) -> LatencyLabError:
    return LatencyLabError(f"bad arrival spec {spec!r}: {why}")


def _rate(spec: str, text: str) -> float:
    text = text.strip()
    if not re.fullmatch(_NUM, text):
        raise _bad(spec, f"rate {text!r} is not a number of requests/s")
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise _bad(spec, f"rate {text!r} must be > 0")
    return value


def _duration(spec: str, text: str) -> float:
    m = _DURATION.match(text.strip())
    if not m:
        raise _bad(spec, f"duration {text.strip()!r} is not like 10s, 500ms, 2m or 1h")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if not (math.isfinite(value) and value > 0):
        raise _bad(spec, f"duration {text.strip()!r} must be > 0")
    return value


def _ramp_rates(spec: str, text: str) -> tuple[float, float]:
    m = _RANGE.match(text.strip())
    if not m:
        raise _bad(spec, f"ramp {text.strip()!r} is not FROM-TO (requests/s), like 0-300")
    lo, hi = float(m.group(1)), float(m.group(2))
    if not (math.isfinite(lo) and math.isfinite(hi)) or (lo == 0 and hi == 0):
        raise _bad(spec, f"ramp {text.strip()!r} must be finite and not 0-0")
    return lo, hi


def _segments(spec: str, body: str) -> list[tuple[str, str]]:
    if not body.strip():
        raise _bad(spec, "no steps given")
    out = []
    for seg in body.split(","):
        left, at, right = seg.partition("@")
        if not at or not left.strip() or not right.strip():
            raise _bad(
                spec,
                f"segment {seg.strip()!r} has no '@'" if not at else f"segment {seg.strip()!r} is incomplete",
            )
        out.append((left, right))
    return out


def parse_arrivals(spec: str, seed: int = 0) -> ArrivalProcess:
    """Build an arrival process from CLI syntax.

    ``poisson:200``, ``constant:50``, ``step:10s@50,10s@100`` (Poisson steps;
    ``step-constant:`` for even spacing; a step may ramp: ``10s@50-100``),
    ``ramp:0-300@60s`` (linear ramp, several comma-separated allowed;
    ``ramp-constant:`` too), ``trace:path.jsonl`` or ``trace:path.csv@2x``
    (replayed twice as fast). Durations take ms, s, m or h (bare numbers
    are seconds).
    """
    kind, colon, body = spec.partition(":")
    kind = kind.strip().lower()
    if not colon:
        raise _bad(spec, f"expected KIND:ARGS, one of {SPEC_HELP}")
    if kind in ("poisson", "constant"):
        rate = _rate(spec, body)
        return Poisson(rate, seed) if kind == "poisson" else Constant(rate)
    if kind in ("step", "step-poisson", "step-constant"):
        steps = []
        for left, right in _segments(spec, body):
            duration = _duration(spec, left)
            if _RANGE.match(right.strip()):
                lo, hi = _ramp_rates(spec, right)
                steps.append(Step(duration, lo, hi))
            else:
                steps.append(Step(duration, _rate(spec, right)))
        return Schedule(steps, "constant" if kind == "step-constant" else "poisson", seed)
    if kind in ("ramp", "ramp-poisson", "ramp-constant"):
        steps = []
        for left, right in _segments(spec, body):
            lo, hi = _ramp_rates(spec, left)
            steps.append(Step(_duration(spec, right), lo, hi))
        return Schedule(steps, "constant" if kind == "ramp-constant" else "poisson", seed)
    if kind == "trace":
        path, speed = body.strip(), 1.0
        head, at, tail = path.rpartition("@")
        if at and _SPEED.match(tail.strip()):
            path, speed = head, float(tail.strip()[:-1])
            if not (math.isfinite(speed) and speed > 0):
                raise _bad(spec, f"speed {tail.strip()!r} must be > 0")
        if not path:
            raise _bad(spec, "no trace file given")
        # The trace reader imports this module (Arrival), so it is imported here, where a trace is named.
        from latencylab.load.arrival_trace import TraceReplay

        return TraceReplay(path, speed=speed)
    raise _bad(spec, f"unknown kind {kind!r}; expected one of {SPEC_HELP}")
