"""Computing the deltas: every latency metric of a series (bootstrap at the iteration level, per-run
statistics at the run and paired levels), the rate metrics of a load run, and a gate's verdict on one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from latencylab.compare import stats as cstats
from latencylab.compare.model import LATENCY_METRICS, NOISE, TAIL_SAMPLES, Gate, GateResult, SeriesDelta, label
from latencylab.compare.stats import MetricDelta
from latencylab.errors import LatencyLabError


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
            replace(
                b,
                metric=mid,
                unit="ns",
                p_value=p,
                method=method,
                significant=sig,
                flagged=_flag(sig and enough, b.baseline, b.candidate, noise),
                enough=enough,
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
