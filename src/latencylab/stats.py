"""Latency statistics: pure functions over samples, no I/O.

Conventions (also in docs/metrics.md):

* Quantiles are fractions in [0, 1] everywhere (0.99, not 99).
* The point estimator is linear interpolation between order statistics
  (Hyndman & Fan type 7, numpy's default): for sorted x[0..n-1],
  h = (n-1) q, Q(q) = x[floor h] + (h - floor h)(x[floor h + 1] - x[floor h]).
* Confidence intervals for a quantile are the percentile bootstrap
  (B resamples, fixed seed) for n <= BOOTSTRAP_MAX_N, and the exact
  distribution-free order-statistic interval (binomial) above it, where the
  two agree and the bootstrap would cost seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

DEFAULT_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99, 0.999)
BOOTSTRAP_MAX_N = 20_000
TAIL_SAMPLES = 10  # samples wanted beyond a quantile before we trust it
IQR_WARN = 0.10  # IQR / median above this: unstable (torch.utils.benchmark's threshold)
CV_WARN = 0.10  # std / mean above this: unstable (pyperf's threshold)

FloatArray = npt.NDArray[np.float64]


def _check_q(q: float) -> None:
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not a fraction in [0, 1]")


def as_array(samples: Sequence[float] | npt.ArrayLike) -> FloatArray:
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError("samples must be one-dimensional")
    return arr


def quantile(samples: Sequence[float] | npt.ArrayLike, q: float) -> float:
    """Type-7 quantile of ``samples`` at fraction ``q``."""
    _check_q(q)
    arr = as_array(samples)
    if arr.size == 0:
        raise ValueError("no samples")
    return float(np.quantile(arr, q))


def samples_needed(q: float, tail: int = TAIL_SAMPLES) -> int:
    """Samples needed so that ``tail`` of them lie beyond quantile ``q``.

    p99 needs 1000, p99.9 needs 10000: below that a tail quantile is an
    extrapolation from a handful of points.
    """
    _check_q(q)
    if q >= 1.0 or q <= 0.0:
        return 2**62  # the extreme order statistic is never estimable with a tail
    return math.ceil(tail / (1.0 - q) - 1e-9) if q > 0.5 else math.ceil(tail / q - 1e-9)


def order_stat_ci(sorted_samples: FloatArray, q: float, confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free CI for quantile ``q`` from order statistics.

    The number of samples below the true q-quantile is Binomial(n, q); the
    interval [x_(l), x_(u)] with l, u the binomial alpha/2 and 1-alpha/2
    quantiles covers it with probability >= confidence. When the sample is too
    small for a bound to exist, the bound is the sample minimum / maximum
    (i.e. the interval is optimistic: see ``samples_needed``).
    """
    from scipy.stats import binom

    _check_q(q)
    n = sorted_samples.size
    if n == 0:
        raise ValueError("no samples")
    alpha = 1.0 - confidence
    lo = int(binom.ppf(alpha / 2, n, q))  # count of samples below: index of lower bound (1-based l)
    hi = int(binom.ppf(1 - alpha / 2, n, q)) + 1
    lo_idx = min(max(lo - 1, 0), n - 1)
    hi_idx = min(max(hi - 1, 0), n - 1)
    return float(sorted_samples[lo_idx]), float(sorted_samples[hi_idx])


def bootstrap_quantile_ci(
    samples: FloatArray,
    qs: Sequence[float],
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
) -> list[tuple[float, float]]:
    """Percentile-bootstrap CIs for several quantiles at once (resampled jointly)."""
    n = samples.size
    if n == 0:
        raise ValueError("no samples")
    rng = np.random.default_rng(seed)
    alpha = 1.0 - confidence
    chunk = max(1, min(n_boot, 4_000_000 // max(n, 1)))
    est = np.empty((n_boot, len(qs)))
    done = 0
    while done < n_boot:
        b = min(chunk, n_boot - done)
        idx = rng.integers(0, n, size=(b, n))
        est[done : done + b] = np.quantile(samples[idx], qs, axis=1).T
        done += b
    lows = np.quantile(est, alpha / 2, axis=0)
    highs = np.quantile(est, 1 - alpha / 2, axis=0)
    return [(float(lo), float(hi)) for lo, hi in zip(lows, highs, strict=True)]


@dataclass(frozen=True, slots=True)
class QuantileEstimate:
    """A quantile with its confidence interval; values in the samples' unit."""

    q: float
    value: float
    ci_low: float
    ci_high: float
    tail_samples: int  # samples strictly beyond the estimate's rank
    enough: bool  # tail_samples >= TAIL_SAMPLES

    @property
    def rel_half_width(self) -> float:
        if self.value == 0:
            return 0.0
        return (self.ci_high - self.ci_low) / 2.0 / abs(self.value)


@dataclass(frozen=True, slots=True)
class Summary:
    """Descriptive statistics of one series of samples (unit: whatever came in, ns here)."""

    n: int
    mean: float
    std: float
    min: float
    max: float
    median: float
    iqr: float
    quantiles: tuple[QuantileEstimate, ...]
    ci_method: str
    confidence: float
    warnings: tuple[str, ...] = field(default=())

    def at(self, q: float) -> QuantileEstimate:
        for est in self.quantiles:
            if abs(est.q - q) < 1e-12:
                return est
        raise KeyError(f"quantile {q} was not computed")


def format_q(q: float) -> str:
    """0.99 -> 'p99', 0.999 -> 'p99.9', 0.5 -> 'p50'."""
    pct = q * 100
    text = f"{pct:.4f}".rstrip("0").rstrip(".")
    return f"p{text}"


def quantiles_ms(summary: Summary) -> dict[str, Any]:
    """A summary's percentiles in ms with their CIs, keyed as every result file writes them: ``p99_ms`` and
    ``p99_ci_ms`` (``p99_9_ms`` for 0.999)."""
    out: dict[str, Any] = {}
    for est in summary.quantiles:
        key = format_q(est.q).replace(".", "_")
        out[f"{key}_ms"] = est.value / 1e6
        out[f"{key}_ci_ms"] = [est.ci_low / 1e6, est.ci_high / 1e6]
    return out


def summarize(
    samples: Sequence[float] | npt.ArrayLike,
    qs: Sequence[float] = DEFAULT_QUANTILES,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    label: str = "",
) -> Summary:
    """Mean, std, min, max, median, IQR and quantiles with CIs, plus stability warnings."""
    arr = as_array(samples)
    n = arr.size
    if n == 0:
        raise ValueError("no samples")
    for q in qs:
        _check_q(q)
    srt = np.sort(arr)
    values = np.quantile(srt, qs) if len(qs) else np.array([])
    if n <= BOOTSTRAP_MAX_N:
        cis = bootstrap_quantile_ci(srt, qs, confidence, n_boot, seed) if n > 1 else [(srt[0], srt[0])] * len(qs)
        method = f"percentile bootstrap, B={n_boot}, seed={seed}"
    else:
        cis = [order_stat_ci(srt, q, confidence) for q in qs]
        method = "order statistics (binomial), distribution-free"
    ests = []
    for q, v, (lo, hi) in zip(qs, values, cis, strict=True):
        tail = math.floor(n * (1.0 - q)) if q >= 0.5 else math.floor(n * q)
        ests.append(QuantileEstimate(q, float(v), float(lo), float(hi), tail, tail >= TAIL_SAMPLES))
    q1, med, q3 = np.quantile(srt, [0.25, 0.5, 0.75])
    mean = float(arr.mean())
    std = float(arr.std(ddof=1)) if n > 1 else 0.0
    summary = Summary(
        n=n,
        mean=mean,
        std=std,
        min=float(srt[0]),
        max=float(srt[-1]),
        median=float(med),
        iqr=float(q3 - q1),
        quantiles=tuple(ests),
        ci_method=method,
        confidence=confidence,
    )
    return _with_warnings(summary, label)


def _with_warnings(s: Summary, label: str) -> Summary:
    prefix = f"{label}: " if label else ""
    warns: list[str] = []
    if s.median > 0 and s.iqr / s.median > IQR_WARN:
        warns.append(f"{prefix}unstable: IQR is {s.iqr / s.median:.0%} of the median (> {IQR_WARN:.0%})")
    if s.mean > 0 and s.n > 1 and s.std / s.mean > CV_WARN:
        warns.append(f"{prefix}noisy: std is {s.std / s.mean:.0%} of the mean (> {CV_WARN:.0%})")
    for est in s.quantiles:
        if not est.enough:
            need = samples_needed(est.q)
            warns.append(
                f"{prefix}{format_q(est.q)} rests on {est.tail_samples} tail samples of {s.n}: "
                f"need {need - s.n} more samples ({need} in all) for {TAIL_SAMPLES} beyond it"
            )
    return Summary(
        s.n,
        s.mean,
        s.std,
        s.min,
        s.max,
        s.median,
        s.iqr,
        s.quantiles,
        s.ci_method,
        s.confidence,
        tuple(warns),
    )


@dataclass(frozen=True, slots=True)
class Spike:
    """A stretch of iterations whose latency jumped above the run's baseline.

    ``start``/``end`` are iteration indices (end exclusive); ``at_s`` is the
    time since the start of the run when it began; ``ratio`` is the stretch's
    median over the baseline median.
    """

    start: int
    end: int
    at_s: float
    ratio: float
    kind: str  # "level-shift" (sustained) or "stall" (isolated huge sample)

    def describe(self, unit_scale: float = 1e-6) -> str:
        n = self.end - self.start
        what = "latency jumped" if self.kind == "level-shift" else "stall"
        return (
            f"{what} x{self.ratio:.1f} over iterations {self.start}-{self.end - 1} "
            f"({n} iteration{'s' if n != 1 else ''}), {self.at_s:.2f} s into the run"
        )


def detect_spikes(
    series: Sequence[float] | npt.ArrayLike,
    starts_ns: Sequence[int] | npt.ArrayLike | None = None,
    shift_ratio: float = 1.5,
    stall_ratio: float = 10.0,
    window: int | None = None,
) -> list[Spike]:
    """Find sustained jumps and isolated stalls in a latency time series.

    Algorithm: the series is cut into windows of ``window`` iterations
    (default max(10, n/50)); the baseline is the median of the window medians.
    Consecutive windows whose median exceeds ``shift_ratio`` x baseline form a
    level shift (the recompilation symptom: "latency suddenly doubles"); its
    edges are then refined to the first/last sample above the threshold.
    Separately, single samples above ``stall_ratio`` x baseline outside any
    level shift are stalls. Medians make both robust to ordinary tail noise.
    """
    x = as_array(series)
    n = x.size
    if n < 10:
        return []
    starts = np.asarray(starts_ns, dtype=np.float64) if starts_ns is not None else np.cumsum(np.r_[0.0, x[:-1]])
    t0 = starts[0]
    w = window or max(10, n // 50)
    n_win = n // w
    if n_win < 3:
        w = max(1, n // 3)
        n_win = n // w
    meds = np.median(x[: n_win * w].reshape(n_win, w), axis=1)
    baseline = float(np.median(meds))
    if baseline <= 0:
        return []
    spikes: list[Spike] = []
    hot = meds > shift_ratio * baseline
    covered = np.zeros(n, dtype=bool)
    i = 0
    while i < n_win:
        if not hot[i]:
            i += 1
            continue
        j = i
        while j < n_win and hot[j]:
            j += 1
        lo, hi = i * w, (j * w if j < n_win else n)
        above = x > shift_ratio * baseline
        s = _split(above, max(0, lo - w), min(n, lo + w), rising=True)
        e = _split(above, max(0, hi - w), min(n, hi + w), rising=False)
        e = max(e, s + 1)
        covered[s:e] = True
        spikes.append(Spike(s, e, (starts[s] - t0) / 1e9, float(np.median(x[s:e])) / baseline, "level-shift"))
        i = j
    for k in np.nonzero((x > stall_ratio * baseline) & ~covered)[0]:
        spikes.append(Spike(int(k), int(k) + 1, (starts[k] - t0) / 1e9, float(x[k]) / baseline, "stall"))
    spikes.sort(key=lambda sp: sp.start)
    return spikes


def _split(above: npt.NDArray[np.bool_], a: int, b: int, rising: bool) -> int:
    """Index in [a, b] that best separates below-threshold from above-threshold samples.

    For a rising edge, samples before the split should be below and after it
    above; we pick the split that misclassifies the fewest samples.
    """
    seg = above[a:b].astype(np.int64)
    if seg.size == 0:
        return a
    if not rising:
        seg = 1 - seg
    # errors(k) = (# above in seg[:k]) + (# below in seg[k:])
    before = np.r_[0, np.cumsum(seg)]
    below_after = (seg.size - np.arange(seg.size + 1)) - (before[-1] - before)
    return a + int(np.argmin(before + below_after))


def share(part_total: float, whole_total: float) -> float:
    """Fraction of the whole taken by a part (0 when the whole is 0)."""
    return 0.0 if whole_total <= 0 else part_total / whole_total


@dataclass(frozen=True, slots=True)
class SloVerdict:
    """Whether ``q``-quantile latency <= threshold holds with ``confidence`` (LoadGen-style early stopping).

    With n requests of which k exceeded the threshold, the tail probability
    p = P(latency > threshold) is estimated exactly (binomial): the SLO holds
    ("pass") when even the one-sided upper confidence bound of p is <= 1 - q,
    fails when the lower bound is > 1 - q, and is "undecided" otherwise, in
    which case ``need_more`` says how many more requests would decide it if
    the observed rate k/n held.
    """

    status: str  # "pass" | "fail" | "undecided"
    q: float
    threshold: float
    confidence: float
    n: int
    over: int
    need_more: int | None

    def describe(self, unit: str = "ms", scale: float = 1e-6) -> str:
        what = f"{format_q(self.q)} <= {self.threshold * scale:g} {unit}"
        conf = f"{self.confidence:.0%} confidence"
        if self.status == "pass":
            return f"PASS: {what} with {conf} ({self.over} of {self.n} over)"
        if self.status == "fail":
            return f"FAIL: {what} is violated with {conf} ({self.over} of {self.n} over)"
        more = f"need ~{self.need_more} more queries" if self.need_more is not None else "cannot pass at this rate"
        return f"UNDECIDED: {what} at {conf}: {more} ({self.over} of {self.n} over)"


def _passes(n: int, k: int, p: float, alpha: float) -> bool:
    from scipy.stats import binom

    return bool(binom.cdf(k, n, p) <= alpha)


def slo_violated(n: int, over: int, q: float, confidence: float = 0.99) -> bool:
    """True when "quantile q <= threshold" is already violated with ``confidence`` (one binomial tail).

    Cheap enough to call from a running load test; ``slo_verdict`` also works out ``need_more``.
    """
    from scipy.stats import binom

    return over > 0 and bool(binom.sf(over - 1, n, 1.0 - q) <= 1.0 - confidence)


def slo_met(n: int, over: int, q: float, confidence: float = 0.99) -> bool:
    """True when "quantile q <= threshold" is already met with ``confidence`` (the lower binomial tail)."""
    return n > 0 and _passes(n, over, 1.0 - q, 1.0 - confidence)


def slo_verdict(n: int, over: int, q: float, threshold: float, confidence: float = 0.99) -> SloVerdict:
    """Verdict for "quantile q <= threshold" from n samples of which ``over`` exceeded the threshold."""
    from scipy.stats import binom

    _check_q(q)
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if n < 0 or over < 0 or over > n:
        raise ValueError("need 0 <= over <= n")
    p = 1.0 - q
    alpha = 1.0 - confidence
    if n > 0 and _passes(n, over, p, alpha):
        return SloVerdict("pass", q, threshold, confidence, n, over, None)
    if over > 0 and binom.sf(over - 1, n, p) <= alpha:
        return SloVerdict("fail", q, threshold, confidence, n, over, None)
    rate = over / n if n else 0.0
    if rate >= p:
        return SloVerdict("undecided", q, threshold, confidence, n, over, None)
    # Smallest total N with the same over-rate that would pass: double, then bisect.
    lo, hi = max(n, 1), max(2 * n, 64)
    while not _passes(hi, math.floor(rate * hi), p, alpha):
        lo, hi = hi, hi * 2
        if hi > 10**9:
            return SloVerdict("undecided", q, threshold, confidence, n, over, None)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _passes(mid, math.floor(rate * mid), p, alpha):
            hi = mid
        else:
            lo = mid
    return SloVerdict("undecided", q, threshold, confidence, n, over, hi - n)
