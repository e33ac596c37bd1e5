"""The comparison model: two result files in, one frozen :class:`Comparison` out.

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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from latencylab.canary import CanaryDelta, compare_canaries
from latencylab.compare import stats as cstats
from latencylab.errors import LatencyLabError
from latencylab.results import read_result

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
LABELS = {"p999": "p99.9", "error_rate": "error rate"}
TAIL_SAMPLES = 10  # as latencylab.stats: samples wanted beyond a quantile before trusting it


def label(metric: str) -> str:
    return LABELS.get(metric, metric)


# ------------------------------------------------------------------------------------------ model
@dataclass(frozen=True, slots=True)
class MetricDelta(cstats.Change):
    """The change of one metric from baseline to candidate.

    ``unit``: "ns" (latency), "1/s" (throughput) or "fraction" (error rate).
    ``ci_low``/``ci_high`` bound ``candidate - baseline`` and
    ``rel_ci_low``/``rel_ci_high`` bound ``candidate / baseline - 1`` (None
    when the baseline is 0), at the comparison's confidence. ``method`` names
    the test behind ``p_value``.
    """

    metric: str
    unit: str
    baseline: float
    candidate: float
    ci_low: float
    ci_high: float
    rel_ci_low: float | None
    rel_ci_high: float | None
    p_value: float
    method: str
    significant: bool
    flagged: bool
    enough: bool = True  # both sides have TAIL_SAMPLES beyond the quantile


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


# ------------------------------------------------------------------------------------------ computing


def _short_tail(q: float | str, n: int) -> tuple[int, int] | None:
    """(tail samples, samples wanted) when quantile ``q`` of ``n`` samples has fewer than ``TAIL_SAMPLES``
    beyond it; None when it has enough, or ``q`` is not a quantile (mean, max)."""
    if not isinstance(q, float):
        return None
    tail = math.floor(n * (1.0 - q))
    return None if tail >= TAIL_SAMPLES else (tail, math.ceil(TAIL_SAMPLES / (1.0 - q)))


def compare_series(
    name: str,
    baseline: cstats.Binned,
    candidate: cstats.Binned,
    alpha: float = 0.05,
    noise: float = NOISE,
    n_boot: int = cstats.DEFAULT_BOOT,
    seed: int = 0,
) -> SeriesDelta:
    """Every latency metric of one series (values in ns), bootstrap CIs and the rank test."""
    ids = list(LATENCY_METRICS)
    boots = cstats.bootstrap_deltas(baseline, candidate, [LATENCY_METRICS[k] for k in ids], alpha, n_boot, seed)
    metrics = []
    warnings = []
    n_min = min(baseline.n, candidate.n)
    for mid, b in zip(ids, boots, strict=True):
        q = LATENCY_METRICS[mid]
        short = _short_tail(q, n_min)
        enough = short is None
        if short is not None and mid in ("p50", "p90", "p99"):
            warnings.append(f"{name}: {label(mid)} rests on {short[0]} tail samples (want {short[1]} samples a side)")
        p, method, sig = b.p_value, "bootstrap", b.significant
        if mid == "max":  # the bootstrap of a maximum is degenerate: use the exact exceedance test
            p, method = cstats.exceedance_test(baseline, candidate), "exceedance"
            sig = p < alpha
        metrics.append(
            MetricDelta(
                mid,
                "ns",
                b.baseline,
                b.candidate,
                b.ci_low,
                b.ci_high,
                b.rel_ci_low,
                b.rel_ci_high,
                p,
                method,
                sig,
                _flag(sig and enough, b.baseline, b.candidate, noise),
                enough,
            )
        )
    blocks = (baseline.block, candidate.block)
    if max(blocks) > 1:
        warnings.append(
            f"{name}: neighbouring iterations are alike (drift or bursts of interference): resampled in blocks of "
            f"{blocks[0]} / {blocks[1]} iterations, so the CIs are wider than for independent samples"
        )
    rank = cstats.mann_whitney(baseline, candidate)
    return SeriesDelta(name, baseline.n, candidate.n, tuple(metrics), rank, tuple(warnings), *blocks)


def compare_runs_series(
    name: str,
    baseline: Sequence[npt.ArrayLike],
    candidate: Sequence[npt.ArrayLike],
    alpha: float = 0.05,
    noise: float = NOISE,
    paired: bool = False,
) -> SeriesDelta:
    """Every latency metric of one series from per-run samples: the run is the unit (``stats.run_delta``).

    ``baseline`` and ``candidate`` hold one sample array (ns) per run; at least one side needs two runs.
    A quantile is ``enough`` when every run has ``TAIL_SAMPLES`` samples beyond it (each run's own value
    of it must be an estimate, not an extreme). The absolute CI is the baseline times the relative one.
    """
    metrics = []
    warnings = []
    n_min = min(int(np.asarray(x).size) for x in (*baseline, *candidate))
    spread: tuple[float | None, float | None] = (None, None)
    for mid, q in LATENCY_METRICS.items():
        rd = cstats.run_delta(cstats.per_run(baseline, q), cstats.per_run(candidate, q), alpha, paired)
        if rd is None:
            raise LatencyLabError(f"{name}: a run-level comparison needs two runs on one side at least")
        if mid == "p50":
            spread = (rd.spread_baseline, rd.spread_candidate)
        short = _short_tail(q, n_min)
        enough = short is None
        if short is not None and mid in ("p50", "p90", "p99"):
            warnings.append(
                f"{name}: {label(mid)} rests on {short[0]} tail samples in the shortest run (want {short[1]} per run)"
            )
        sig = rd.significant
        metrics.append(
            MetricDelta(
                mid, "ns", rd.baseline, rd.candidate, rd.baseline * rd.rel_ci_low, rd.baseline * rd.rel_ci_high,
                rd.rel_ci_low, rd.rel_ci_high, rd.p_value, rd.method, sig,
                _flag(sig and enough, rd.baseline, rd.candidate, noise), enough,
            )
        )  # fmt: skip
    level = "paired" if paired else "run"
    return SeriesDelta(
        name,
        sum(int(np.asarray(x).size) for x in baseline),
        sum(int(np.asarray(x).size) for x in candidate),
        tuple(metrics),
        None,
        tuple(warnings),
        1,
        1,
        level,
        len(baseline),
        len(candidate),
        *spread,
    )


def _flag(significant: bool, a: float, b: float, noise: float) -> bool:
    if not significant:
        return False
    return a == 0 or abs(b - a) / abs(a) >= noise


def compare_rates(
    ok: tuple[int, int],
    sent: tuple[int, int],
    seconds: tuple[float, float],
    alpha: float = 0.05,
    noise: float = NOISE,
) -> tuple[MetricDelta, ...]:
    """Throughput (ok per second, Poisson test) and error rate (not-ok per sent, Fisher's test)."""
    from scipy.stats import norm

    z = float(norm.ppf(1.0 - alpha / 2))
    (ka, kb), (na, nb), (ta, tb) = ok, sent, seconds
    out = []
    if ta > 0 and tb > 0:
        ra, rb = ka / ta, kb / tb
        half = z * math.sqrt(ka / ta**2 + kb / tb**2)  # normal approximation of the Poisson difference
        p = cstats.poisson_rate_test(ka, ta, kb, tb)
        rel_lo = (rb - ra - half) / ra if ra > 0 else None
        rel_hi = (rb - ra + half) / ra if ra > 0 else None
        sig = p < alpha
        out.append(
            MetricDelta(
                "throughput", "1/s", ra, rb, rb - ra - half, rb - ra + half, rel_lo, rel_hi, p,
                "poisson", sig, _flag(sig, ra, rb, noise),
            )
        )  # fmt: skip
    if na > 0 and nb > 0:
        ea, eb = (na - ka) / na, (nb - kb) / nb
        half = z * math.sqrt(ea * (1 - ea) / na + eb * (1 - eb) / nb)
        p = cstats.error_rate_test(na - ka, na, nb - kb, nb)
        sig = p < alpha
        rel_lo = (eb - ea - half) / ea if ea > 0 else None
        rel_hi = (eb - ea + half) / ea if ea > 0 else None
        out.append(
            MetricDelta(
                "error_rate", "fraction", ea, eb, eb - ea - half, eb - ea + half, rel_lo, rel_hi, p,
                "fisher", sig, _flag(sig, ea, eb, noise),
            )
        )  # fmt: skip
    return tuple(out)


def evaluate_gate(gate: Gate, series: str, delta: MetricDelta, refuse: str = "", strict: bool = False) -> GateResult:
    """Fire when the change is beyond the threshold and significant in the gate's direction.

    ``refuse`` (why the evidence cannot be trusted: one run a side, the canary moved) makes such a gate
    *undecided* instead: it does not fire unless ``strict``.
    """
    change = delta.rel if gate.relative else delta.diff
    if change is None:
        change = 0.0
    # A quantile with too few tail samples has a bootstrap CI that is too narrow: it never decides a gate.
    decidable = delta.significant and delta.enough
    if gate.op == ">":
        beyond = change > gate.threshold
        significant = decidable and delta.diff > 0
    else:
        beyond = change < gate.threshold
        significant = decidable and delta.diff < 0
    fires = beyond and significant
    undecided = fires and bool(refuse)
    return GateResult(
        gate, series, fires and (strict or not undecided), beyond, significant, delta, undecided,
        refuse if undecided else "",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------ results in
@dataclass(frozen=True, slots=True)
class _Side:
    """What compare needs from one result: its latency series, rate counts, env and config."""

    series: dict[str, cstats.Binned]
    ok: int | None
    sent: int | None
    seconds: float | None
    env: Mapping[str, Any]
    config: Mapping[str, Any]
    runs: Mapping[str, list[npt.NDArray[np.int64]]] | None = None  # series -> one sample array per run
    session: str | None = None  # the interleaved session the result was measured in

    @property
    def n_runs(self) -> int:
        return len(next(iter(self.runs.values()))) if self.runs else 1


def _profile_side(doc: Mapping[str, Any]) -> _Side:
    from latencylab.results import ProfileResult

    r = ProfileResult.from_dict(doc)
    arrays = {"end-to-end": r.end_to_end_ns(), **{s.name: s.array() for s in r.stages}}
    series = {k: cstats.Binned.from_samples(v, ordered=True) for k, v in arrays.items()}
    slices = r.run_slices()
    runs = {k: [v[sl] for sl in slices] for k, v in arrays.items()}
    config = {"workload": r.workload, "config": dict(r.config), "pipeline": dict(r.pipeline)}
    inter = r.config.get("interleaved")
    session = str(inter["session"]) if isinstance(inter, Mapping) and "session" in inter else None
    return _Side(series, None, None, None, r.env, config, runs, session)


LOAD_SERIES = {"latency": "corrected_ok", "uncorrected": "uncorrected_ok"}


def _load_side(doc: Mapping[str, Any]) -> _Side:
    from latencylab.histogram import LatencyHistogram
    from latencylab.results import kind_version

    if doc.get("schema_version") != kind_version("load"):
        raise LatencyLabError(f"unsupported load result schema_version {doc.get('schema_version')!r}")
    try:
        hists, summary = doc["histograms"], doc["summary"]
        series = {}
        for name, key in LOAD_SERIES.items():
            if key in hists:
                h = LatencyHistogram.from_dict(dict(hists[key]))
                if h.count:
                    series[name] = cstats.Binned.from_cdf(h.cdf(), h.count)
        config = {"target": doc.get("target"), "arrivals": doc.get("arrivals"), "config": doc.get("config")}
        return _Side(
            series,
            int(summary["ok"]),
            int(summary["sent"]),
            float(summary["duration_s"]),
            doc.get("env") or {},
            config,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LatencyLabError(f"malformed load result: {exc!r}") from None


def _check_kind(doc: Mapping[str, Any], path: str) -> str:
    kind = doc.get("kind")
    if kind in ("profile", "load"):
        return str(kind)
    why = "compare reads profile and load results"
    if kind == "optimize":
        why = "an optimize result keeps summaries, not latency samples; " + why
    raise LatencyLabError(f"{path}: cannot compare kind {kind!r} ({why})")


def _side(doc: Mapping[str, Any]) -> _Side:
    return _profile_side(doc) if doc.get("kind") == "profile" else _load_side(doc)


def _flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping) and node:
        for k, v in node.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, node


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[Difference, ...]:
    fa, fb = dict(_flatten(a)), dict(_flatten(b))
    return tuple(Difference(k, fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k))


def env_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[Difference, ...]:
    """High- and medium-impact differences from ``latencylab.env.diff`` (low-impact ones rarely explain a change)."""
    from latencylab.env import diff

    if not a or not b:
        return ()
    return tuple(Difference(d.path, d.a, d.b, d.impact) for d in diff(dict(a), dict(b)) if d.impact != "low")


def _busy(a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str]) -> list[tuple[str, str]]:
    """``env`` lint's "machine is busy" for each side: load is volatile, so env.diff ignores it, yet a run
    measured beside other work differs from one measured alone, whatever the configuration."""
    from latencylab.env import lint

    return [
        (who, w.message)
        for who, fp in zip(names, (a, b), strict=True)
        if fp
        for w in lint(dict(fp))
        if w.code == "busy"
    ]


def compare_docs(
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    gates: Sequence[Gate] = (),
    alpha: float = 0.05,
    noise: float = NOISE,
    n_boot: int = cstats.DEFAULT_BOOT,
    seed: int = 0,
    names: tuple[str, str] = ("baseline", "candidate"),
    strict: bool = False,
) -> Comparison:
    """Compare two parsed result documents of the same kind (see the module docstring).

    ``strict``: an undecided gate (one run a side, or the canary moved) fires when its evidence says so.
    """
    if not 0 < alpha < 1:
        raise LatencyLabError(f"alpha must be in (0, 1), got {alpha}")
    ka, kb = _check_kind(baseline, names[0]), _check_kind(candidate, names[1])
    if ka != kb:
        raise LatencyLabError(f"cannot compare a {ka} result with a {kb} result")
    a, b = _side(baseline), _side(candidate)
    common = [n for n in a.series if n in b.series]
    if not common:
        raise LatencyLabError("the two results share no latency series (no stage names in common, or no samples)")
    notes = [f"{who} was measured on a busy machine: {msg}" for who, msg in _busy(a.env, b.env, names)]
    notes += [f"only in {names[0]}: {n}" for n in a.series if n not in b.series]
    notes += [f"only in {names[1]}: {n}" for n in b.series if n not in a.series]
    default = common[0]
    for g in gates:  # check before the (seconds-long) bootstrap
        if g.metric in RATE_METRICS and ka != "load":
            raise LatencyLabError(f"gate {g.text!r}: {g.metric} exists for load results only")
        if g.series is not None and g.series not in common:
            raise LatencyLabError(f"gate {g.text!r}: no series {g.series!r} in both results ({', '.join(common)})")
    level = "iteration"
    if max(a.n_runs, b.n_runs) >= 2:
        paired = a.session is not None and a.session == b.session and a.n_runs == b.n_runs
        level = "paired" if paired else "run"
    if level == "iteration":
        series = tuple(
            compare_series(n, a.series[n], b.series[n], alpha, noise, n_boot, seed + i) for i, n in enumerate(common)
        )
    else:
        assert a.runs is not None and b.runs is not None
        series = tuple(compare_runs_series(n, a.runs[n], b.runs[n], alpha, noise, level == "paired") for n in common)
    canary = compare_canaries(a.env.get("canary"), b.env.get("canary"))
    refuse = [ONE_RUN] if level == "iteration" else []
    if canary is not None and level != "paired":
        notes.append("canary: " + canary.describe(names) + (
            f": more than the {canary.threshold:.0%} threshold, so no gate can be decided on these results"
            if canary.moved else f", within the {canary.threshold:.0%} threshold"
        ))  # fmt: skip
        if canary.moved:
            refuse.append(canary.describe(names))
    for who, side in zip(names, (a, b), strict=True):
        if level == "paired":
            who = f"{names[0]} and {names[1]} were"  # one session, one canary
        else:
            who += " was"
        c = side.env.get("canary")
        drift = c.get("drift") if isinstance(c, Mapping) else None
        if isinstance(drift, (int, float)) and drift > (canary.threshold if canary else 0.10):
            notes.append(f"the machine's speed moved {drift:.0%} while {who} measured (canary readings)")
        steal = c.get("steal_fraction") if isinstance(c, Mapping) else None
        if isinstance(steal, (int, float)) and steal > 0.05:
            notes.append(f"the hypervisor took {steal:.0%} of the CPU time while {who} measured (steal)")
        if level == "paired":
            break  # one session, one canary
    rates: tuple[MetricDelta, ...] = ()
    if ka == "load" and a.sent is not None and b.sent is not None:
        assert a.ok is not None and b.ok is not None and a.seconds is not None and b.seconds is not None
        rates = compare_rates((a.ok, b.ok), (a.sent, b.sent), (a.seconds, b.seconds), alpha, noise)
    results = []
    for g in gates:
        name = g.series or default
        why = "; and ".join(refuse)
        if g.metric in RATE_METRICS:
            found = [r for r in rates if r.metric == g.metric]
            if not found:
                raise LatencyLabError(f"gate {g.text!r}: the results do not record {g.metric}")
            results.append(evaluate_gate(g, "run", found[0], why, strict))
        else:
            s = next(s for s in series if s.name == name)
            results.append(evaluate_gate(g, name, s.metric(g.metric), why, strict))
    return Comparison(
        result_kind=str(ka),
        baseline=names[0],
        candidate=names[1],
        alpha=alpha,
        noise=noise,
        n_boot=n_boot,
        seed=seed,
        series=series,
        rates=rates,
        env=env_differences(a.env, b.env),
        config=config_differences(a.config, b.config),
        gates=tuple(results),
        notes=tuple(notes),
        level=level,
        strict=strict,
        canary=canary,
    )


def compare_files(
    baseline: str | Path,
    candidate: str | Path,
    gates: Sequence[str] = (),
    alpha: float = 0.05,
    noise: float = NOISE,
    n_boot: int = cstats.DEFAULT_BOOT,
    seed: int = 0,
    strict: bool = False,
) -> Comparison:
    """``latencylab compare`` as a function: gates are parsed first, so a bad one fails before any work."""
    parsed = [Gate.parse(g) for g in gates]
    return compare_docs(
        read_result(baseline).doc,
        read_result(candidate).doc,
        parsed,
        alpha,
        noise,
        n_boot,
        seed,
        names=(str(baseline), str(candidate)),
        strict=strict,
    )
