"""Synthetic workload: stages that busy-wait for durations from a stated distribution.

This is the ground truth the measuring machinery is tested against: every
distribution knows its true quantiles, spikes are injected at known
iterations. Durations for iteration i are drawn (seeded) in ``source(i)``,
outside the timed region; each stage then spins on ``perf_counter_ns`` until
its duration has passed (a sleep would add scheduler wake-up latency). With a
:class:`~latencylab.clock.FakeClock` the stages advance the fake clock
instead, so tests get exact numbers.

Parameter syntax (``--param``)::

    stages=preprocess:normal(1ms,0.1ms);forward:lognormal(3ms,0.25);postprocess:constant(300us)
    spike=forward@300+50x2        # iterations 300..349 of stage forward take 2x as long
    stall=forward@500:200ms       # iteration 500 of stage forward takes 200 ms extra
    timer=fake                    # stages advance a FakeClock, which the profiler then reads (exact numbers,
                                  # however busy the machine; default: busy-wait on the real clock)
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab.clock import FakeClock
from latencylab.errors import LatencyLabError
from latencylab.pipeline import STAGE_KINDS, Pipeline
from latencylab.workloads import WorkloadOptions

_UNITS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def parse_duration_ns(text: str) -> float:
    """'1.5ms' -> 1.5e6. Units: ns, us, ms, s."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|ms|s)\s*", text)
    if not m:
        raise LatencyLabError(f"bad duration {text!r}: use a number with ns, us, ms or s (e.g. 2.5ms)")
    return float(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True, slots=True)
class Distribution:
    """A latency distribution in ns that knows its own quantiles.

    kinds: constant(v), normal(mean, std) (truncated at 0, negligible when
    std << mean), lognormal(median, sigma), uniform(lo, hi).
    """

    kind: str
    a: float
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("constant", "normal", "lognormal", "uniform"):
            raise LatencyLabError(f"unknown distribution {self.kind!r}: constant, normal, lognormal, uniform")
        if self.a < 0 or self.b < 0:
            raise LatencyLabError(f"{self.kind}: parameters must be >= 0")
        if self.kind == "uniform" and self.b < self.a:
            raise LatencyLabError("uniform(lo, hi) needs lo <= hi")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "constant":
            return np.full(n, self.a)
        if self.kind == "normal":
            return np.maximum(rng.normal(self.a, self.b, n), 0.0)
        if self.kind == "lognormal":
            return self.a * np.exp(rng.normal(0.0, self.b, n))
        return rng.uniform(self.a, self.b, n)

    def quantile(self, q: float) -> float:
        """The true q-quantile (q in (0, 1))."""
        from scipy.stats import norm

        if self.kind == "constant":
            return self.a
        if self.kind == "normal":
            return max(0.0, self.a + self.b * float(norm.ppf(q)))
        if self.kind == "lognormal":
            return self.a * math.exp(self.b * float(norm.ppf(q)))
        return self.a + q * (self.b - self.a)

    @classmethod
    def parse(cls, text: str) -> Distribution:
        m = re.fullmatch(r"\s*(\w+)\((.*)\)\s*", text)
        if not m:
            raise LatencyLabError(f"bad distribution {text!r}: use e.g. normal(2ms,0.2ms) or lognormal(3ms,0.25)")
        kind, args = m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]
        want = {"constant": 1, "normal": 2, "lognormal": 2, "uniform": 2}.get(kind)
        if want is None:
            raise LatencyLabError(f"unknown distribution {kind!r}: constant, normal, lognormal, uniform")
        if len(args) != want:
            raise LatencyLabError(f"{kind} takes {want} argument(s), got {len(args)} in {text!r}")
        if kind == "lognormal":
            try:
                sigma = float(args[1])
            except ValueError as exc:
                raise LatencyLabError(f"lognormal sigma must be a plain number, got {args[1]!r}") from exc
            return cls(kind, parse_duration_ns(args[0]), sigma)
        vals = [parse_duration_ns(a) for a in args]
        return cls(kind, vals[0], vals[1] if len(vals) > 1 else 0.0)


@dataclass(frozen=True, slots=True)
class SyntheticStage:
    name: str
    dist: Distribution
    kind: str = "other"


@dataclass(frozen=True, slots=True)
class Injection:
    """Extra latency at known iterations: ``factor`` x for [start, start+length), plus ``extra_ns``."""

    stage: str
    start: int
    length: int = 1
    factor: float = 1.0
    extra_ns: float = 0.0


DEFAULT_STAGES: tuple[SyntheticStage, ...] = (
    SyntheticStage("preprocess", Distribution("normal", 1e6, 0.1e6), "preprocess"),
    SyntheticStage("forward", Distribution("lognormal", 3e6, 0.25), "forward"),
    SyntheticStage("postprocess", Distribution("constant", 0.3e6), "postprocess"),
)


def _busy_wait(ns: float) -> None:
    end = time.perf_counter_ns() + int(ns)
    while time.perf_counter_ns() < end:
        pass


@dataclass(slots=True)
class _Plan:
    stages: Sequence[SyntheticStage]
    injections: Sequence[Injection]
    seed: int
    block: int = 4096
    _cache: dict[int, np.ndarray] = field(default_factory=dict)

    def durations(self, i: int) -> np.ndarray:
        """Durations (ns) of every stage for iteration i: deterministic in (seed, i)."""
        blk = i // self.block
        table = self._cache.get(blk)
        if table is None:
            rng = np.random.default_rng([self.seed, abs(blk), int(blk < 0)])  # warm-up indices are negative
            table = np.stack([s.dist.sample(rng, self.block) for s in self.stages], axis=1)
            self._cache = {blk: table}  # keep one block: memory stays flat on long runs
        row = table[i % self.block].copy()
        for inj in self.injections:
            if inj.start <= i < inj.start + inj.length:
                j = [s.name for s in self.stages].index(inj.stage)
                row[j] = row[j] * inj.factor + inj.extra_ns
        return row


def _fake_stage(j: int, clock: FakeClock) -> Callable[[np.ndarray], np.ndarray]:
    def fn(d: np.ndarray) -> np.ndarray:
        clock.advance(d[j])
        return d

    return fn


def _busy_stage(j: int) -> Callable[[np.ndarray], np.ndarray]:
    def fn(d: np.ndarray) -> np.ndarray:
        _busy_wait(d[j])
        return d

    return fn


def synthetic_pipeline(
    stages: Sequence[SyntheticStage] = DEFAULT_STAGES,
    injections: Sequence[Injection] = (),
    seed: int = 0,
    clock: FakeClock | None = None,
    iteration_offset: int = 0,
) -> Pipeline:
    """A pipeline whose stage j of iteration i takes exactly ``plan.durations(i)[j]`` ns.

    ``iteration_offset`` maps the profiler's input index to the plan's
    iteration (the profiler feeds warm-up iterations first, so pass the
    warm-up count to have injections land at timed iteration numbers).
    """
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise LatencyLabError("synthetic stage names must be unique")
    for inj in injections:
        if inj.stage not in names:
            raise LatencyLabError(f"injection names stage {inj.stage!r}; stages are {', '.join(names)}")
    plan = _Plan(stages, injections, seed)

    def source(i: int) -> Any:
        return plan.durations(i - iteration_offset)

    pipe = Pipeline(
        "synthetic",
        source=source,
        clock=clock,
        metadata={
            "stages": {s.name: {"dist": s.dist.kind, "a_ns": s.dist.a, "b": s.dist.b} for s in stages},
            "injections": [
                {
                    "stage": j.stage,
                    "start": j.start,
                    "length": j.length,
                    "factor": j.factor,
                    "extra_ns": j.extra_ns,
                }
                for j in injections
            ],
            "seed": seed,
            "timer": "fake clock" if clock is not None else "busy-wait on perf_counter_ns",
        },
    )
    for j, st in enumerate(stages):
        fn = _fake_stage(j, clock) if clock is not None else _busy_stage(j)
        pipe.stage(st.name, fn, kind=st.kind)
    return pipe


def _parse_stages(text: str) -> list[SyntheticStage]:
    out = []
    for part in text.split(";"):
        if not part.strip():
            continue
        name, sep, dist = part.partition(":")
        if not sep:
            raise LatencyLabError(f"bad stage {part!r}: use name:distribution, e.g. forward:lognormal(3ms,0.25)")
        name = name.strip()
        kind = name if name in STAGE_KINDS else "other"
        out.append(SyntheticStage(name, Distribution.parse(dist), kind))
    if not out:
        raise LatencyLabError("stages= lists no stage")
    return out


def _parse_spike(text: str) -> Injection:
    m = re.fullmatch(r"\s*(\w[\w-]*)@(\d+)\+(\d+)x([0-9.]+)\s*", text)
    if not m:
        raise LatencyLabError(f"bad spike {text!r}: use stage@start+length x factor, e.g. forward@300+50x2")
    return Injection(m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4)))


def _parse_stall(text: str) -> Injection:
    m = re.fullmatch(r"\s*(\w[\w-]*)@(\d+):(.+)", text)
    if not m:
        raise LatencyLabError(f"bad stall {text!r}: use stage@iteration:duration, e.g. forward@500:200ms")
    return Injection(m.group(1), int(m.group(2)), 1, 1.0, parse_duration_ns(m.group(3)))


def build(opts: WorkloadOptions) -> Pipeline:
    known = {"stages", "spike", "stall", "offset", "timer"}
    unknown = set(opts.params) - known
    if unknown:
        raise LatencyLabError(f"unknown synthetic param(s) {sorted(unknown)}; known: {sorted(known)}")
    stages = _parse_stages(opts.params["stages"]) if "stages" in opts.params else list(DEFAULT_STAGES)
    injections = []
    if "spike" in opts.params:
        injections += [_parse_spike(t) for t in opts.params["spike"].split(";")]
    if "stall" in opts.params:
        injections += [_parse_stall(t) for t in opts.params["stall"].split(";")]
    try:
        offset = int(opts.params.get("offset", "0"))
    except ValueError as exc:
        raise LatencyLabError("offset must be an integer (the warm-up count)") from exc
    timer = opts.params.get("timer", "busy")
    if timer not in ("busy", "fake"):
        raise LatencyLabError(f"timer={timer!r}: use busy (spin on the real clock) or fake (a FakeClock)")
    clock = FakeClock() if timer == "fake" else None
    return synthetic_pipeline(stages, injections, opts.seed, clock=clock, iteration_offset=offset)
