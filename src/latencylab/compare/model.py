"""The comparison model: two result files in (:mod:`.core`), one frozen :class:`Comparison` out.

The run is the unit of variation (issue 23): two runs of an unchanged program differ whenever the
host's speed moves between them, and no statistic over one run's iterations can see that. So the
comparison has a *level*:

* ``paired``: both results come from one interleaved session (``compare --run A B``, or
  ``profiler.profile_interleaved``): each metric is taken per run and tested on the per-round paired
  log-ratios (``compare.stats.run_delta(paired=True)``); the machine's drift hits both sides of a round.
* ``run``: at least one side holds several runs (``profile --runs N``): each metric is taken per run and
  the spread between runs sets the noise floor (Welch's t on the per-run logs).
* ``iteration``: one run a side. The samples are still compared (bootstrap, Mann-Whitney, below), but
  that is evidence about two runs, not about two programs: a gate that this evidence alone would fire is
  *undecided* and does not fail the build unless ``strict``.

Whatever the level, when the machine-speed canary of the two results (``env.canary``) moved by more than
``canary.THRESHOLD``, a gate that would fire is undecided too ("the machine was N% slower in B's run"):
the change cannot be told from the machine's.

A comparison holds, for every latency *series* the two results share (a
profile's end-to-end latency and each stage; a load result's corrected and
uncorrected latency), the change of p50, p90, p99, p99.9, mean and max with a
bootstrap CI and a Mann-Whitney test (``compare.stats``); for load results
also throughput and error rate; the environment and configuration
differences that may explain a change; and the verdict of each ``--fail-if``
gate. A change is *significant* when its (1 - alpha) CI excludes zero, and
*flagged* when it is significant and at least ``NOISE`` (1%) of the baseline
(criterion's noise threshold): runs of one configuration differ by a few
tens of nanoseconds of timer overhead, which thousands of samples make
"significant" without it meaning anything.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from latencylab.canary import CanaryDelta
from latencylab.compare import stats as cstats
from latencylab.compare.stats import MetricDelta
from latencylab.errors import LatencyLabError

NOISE = 0.01
COMPARE_VERSION = 2
READABLE_VERSIONS = (1, 2)
LEVELS = ("iteration", "run", "paired")
ONE_RUN = (
    "one run a side: the within-run statistics cannot separate a change from the machine's drift between "
    "the runs (measure with profile --runs N, or compare --run A B interleaved)"
)

# Gate / table metric ids -> compare.stats statistic.
LATENCY_METRICS: dict[str, float | str] = {
    "p50": 0.5,
    "p90": 0.9,
    "p99": 0.99,
    "p999": 0.999,
    "mean": "mean",
    "max": "max",
}
RATE_METRICS = ("throughput", "error_rate")
# Series of a generative load result (compare.core.TOKEN_LOAD_SERIES): a gate "ttft_p99>+5%" reads as
# "ttft:p99>+5%"
TOKEN_SERIES = ("ttft", "tpot", "itl", "e2e")
LABELS = {"p999": "p99.9", "error_rate": "error rate"}
TAIL_SAMPLES = 10  # as latencylab.stats: samples wanted beyond a quantile before trusting it


def label(metric: str) -> str:
    return LABELS.get(metric, metric)


@dataclass(frozen=True, slots=True)
class SeriesDelta:
    """Every metric of one latency series, and the Mann-Whitney test of the whole distribution."""

    name: str
    n_baseline: int
    n_candidate: int
    metrics: tuple[MetricDelta, ...]
    rank: cstats.RankTest | None  # None at the run and paired levels (an iteration-level test across runs)
    warnings: tuple[str, ...] = ()
    block_baseline: int = 1  # bootstrap block length (1: samples resampled independently)
    block_candidate: int = 1
    level: str = "iteration"
    runs_baseline: int = 1
    runs_candidate: int = 1
    spread_baseline: float | None = None  # sd of the per-run log p50 (0.03: runs differ by ~3%)
    spread_candidate: float | None = None

    def metric(self, name: str) -> MetricDelta:
        for m in self.metrics:
            if m.metric == name:
                return m
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class Difference:
    """A field that differs between the two results: environment (with env's impact) or configuration."""

    path: str
    baseline: Any
    candidate: Any
    impact: str = ""


_GATE = re.compile(
    r"\s*(?:(?P<series>[^:<>\s][^:<>]*?)\s*:\s*)?(?P<metric>[A-Za-z_][A-Za-z0-9_.]*)\s*"
    r"(?P<op>[<>])\s*(?P<num>[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>%|pp|ns|us|ms|s)?\s*"
)
_UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


@dataclass(frozen=True, slots=True)
class Gate:
    """A CI gate ``[SERIES:]METRIC OP THRESHOLD``, e.g. ``p99>+5%``, ``forward:p50>2ms``, ``throughput<-5%``.

    ``relative``: the threshold is a fraction of the baseline (written in %);
    otherwise it is absolute in the metric's unit (ns for latency, written
    with ns/us/ms/s; req/s for throughput, a plain number; a fraction for
    error_rate, a plain number or percentage points ``pp``). ``>`` fires on
    an increase beyond a non-negative threshold, ``<`` on a decrease beyond
    a non-positive one, and only when the change is significant at alpha.
    """

    text: str
    series: str | None
    metric: str
    op: str
    threshold: float
    relative: bool

    @classmethod
    def parse(cls, text: str) -> Gate:
        m = _GATE.fullmatch(text)
        if not m:
            raise LatencyLabError(
                f"bad gate {text!r}: use [STAGE:]METRIC>THRESHOLD or METRIC<THRESHOLD, "
                'e.g. "p99>+5%", "forward:p50>2ms", "throughput<-5%"'
            )
        metric = m["metric"].lower().replace("p99.9", "p999")
        series = m["series"].strip() if m["series"] else None
        token, sep, rest = metric.partition("_")
        if sep and token in TOKEN_SERIES and series is None:  # ttft_p99 -> series ttft, metric p99
            series, metric = token, rest
        op, unit, value = m["op"], m["unit"], float(m["num"])
        known = (*LATENCY_METRICS, *RATE_METRICS)
        if metric not in known:
            raise LatencyLabError(f"gate {text!r}: unknown metric {m['metric']!r} (one of {', '.join(known)})")
        if metric in RATE_METRICS and series is not None:
            raise LatencyLabError(f"gate {text!r}: {metric} belongs to the whole run, not to {series!r}")
        if unit == "%":
            threshold, relative = value / 100.0, True
        elif metric in LATENCY_METRICS:
            if unit not in _UNIT_NS:
                raise LatencyLabError(f"gate {text!r}: a latency threshold needs % or a unit (ns, us, ms, s)")
            threshold, relative = value * _UNIT_NS[unit], False
        elif metric == "error_rate":
            if unit not in (None, "pp"):
                raise LatencyLabError(f"gate {text!r}: an error_rate threshold is %, pp or a fraction")
            threshold, relative = (value / 100.0 if unit == "pp" else value), False
        else:
            if unit is not None:
                raise LatencyLabError(f"gate {text!r}: a throughput threshold is % or a plain number (req/s)")
            threshold, relative = value, False
        if op == ">" and threshold < 0:
            raise LatencyLabError(f"gate {text!r}: '>' fires on an increase; the threshold must be >= 0")
        if op == "<" and threshold > 0:
            what = f"{metric}<-{m['num'].lstrip('+')}{unit or ''}"
            raise LatencyLabError(f"gate {text!r}: '<' fires on a decrease; write {what!r}")
        return cls(text.strip(), series, metric, op, threshold, relative)

    def describe_threshold(self) -> str:
        if self.relative:
            return f"{self.threshold * 100:+g}%"
        if self.metric in LATENCY_METRICS:
            return f"{self.threshold / 1e6:+g} ms"
        if self.metric == "error_rate":
            return f"{self.threshold * 100:+g} pp"
        return f"{self.threshold:+g} req/s"


@dataclass(frozen=True, slots=True)
class GateResult:
    """A gate's verdict: ``fired`` when the change is beyond the threshold and significant in that direction."""

    gate: Gate
    series: str
    fired: bool
    beyond: bool  # the point estimate is beyond the threshold
    significant: bool  # significant at alpha in the gate's direction
    delta: MetricDelta
    undecided: bool = False  # beyond and significant, but the evidence cannot be trusted (``why``)
    why: str = ""


@dataclass(frozen=True, slots=True)
class Comparison:
    """``latencylab compare``'s result (``kind`` "compare"): see docs/metrics-sections/compare.md."""

    result_kind: str
    baseline: str
    candidate: str
    alpha: float
    noise: float
    n_boot: int
    seed: int
    series: tuple[SeriesDelta, ...]
    rates: tuple[MetricDelta, ...]
    env: tuple[Difference, ...]
    config: tuple[Difference, ...]
    gates: tuple[GateResult, ...]
    notes: tuple[str, ...] = ()
    version: int = COMPARE_VERSION
    kind: str = "compare"
    level: str = "iteration"
    strict: bool = False
    canary: CanaryDelta | None = None

    @property
    def confidence(self) -> float:
        return 1.0 - self.alpha

    @property
    def failed(self) -> tuple[GateResult, ...]:
        return tuple(g for g in self.gates if g.fired)

    @property
    def undecided(self) -> tuple[GateResult, ...]:
        return tuple(g for g in self.gates if g.undecided)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def find(self, series: str) -> SeriesDelta:
        for s in self.series:
            if s.name == series:
                return s
        raise KeyError(series)

    def to_dict(self) -> dict[str, Any]:
        return _plain(asdict(self))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Comparison:
        if d.get("kind") != "compare" or d.get("version") not in READABLE_VERSIONS:
            raise LatencyLabError("not a latencylab comparison of this version")

        def delta(x: Mapping[str, Any]) -> MetricDelta:
            return MetricDelta(**x)

        try:
            return cls(
                result_kind=d["result_kind"],
                baseline=d["baseline"],
                candidate=d["candidate"],
                alpha=d["alpha"],
                noise=d["noise"],
                n_boot=d["n_boot"],
                seed=d["seed"],
                series=tuple(
                    SeriesDelta(
                        s["name"],
                        s["n_baseline"],
                        s["n_candidate"],
                        tuple(delta(m) for m in s["metrics"]),
                        cstats.RankTest(**s["rank"]) if s["rank"] is not None else None,
                        tuple(s["warnings"]),
                        s["block_baseline"],
                        s["block_candidate"],
                        s.get("level", "iteration"),
                        s.get("runs_baseline", 1),
                        s.get("runs_candidate", 1),
                        s.get("spread_baseline"),
                        s.get("spread_candidate"),
                    )
                    for s in d["series"]
                ),
                rates=tuple(delta(m) for m in d["rates"]),
                env=tuple(Difference(**x) for x in d["env"]),
                config=tuple(Difference(**x) for x in d["config"]),
                gates=tuple(
                    GateResult(
                        Gate(**g["gate"]),
                        g["series"],
                        g["fired"],
                        g["beyond"],
                        g["significant"],
                        delta(g["delta"]),
                        g.get("undecided", False),
                        g.get("why", ""),
                    )
                    for g in d["gates"]
                ),
                notes=tuple(d["notes"]),
                level=d.get("level", "iteration"),
                strict=d.get("strict", False),
                canary=CanaryDelta(**d["canary"]) if d.get("canary") else None,
            )
        except (KeyError, TypeError) as exc:
            raise LatencyLabError(f"malformed comparison: {exc}") from exc

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False))
        return p


def _plain(x: Any) -> Any:
    """asdict() output with tuples as lists and non-finite floats as None (strict JSON)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
