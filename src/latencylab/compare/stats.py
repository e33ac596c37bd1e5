"""Two-sample statistics for ``latencylab compare``: pure functions, no I/O.

Every sample set is held as a *binned sample* (:class:`Binned`): sorted
distinct values and how many times each occurred. Raw profiler samples are
binned exactly (one bin per distinct nanosecond value); an HDR histogram is
already binned (one bin per occupied bucket, read at the bucket's top). The
same code then serves both, so a load result (histograms, no raw samples) is
tested the same way as a profile result.

* **Quantiles** use the type-7 estimator of ``latencylab.stats`` (linear
  interpolation between order statistics), evaluated on the binned sample.
* **Bootstrap** (``bootstrap_deltas``): each side is resampled independently
  B times with replacement; resampling n individuals is the same as drawing
  bin counts from Multinomial(n, counts / n), which is what we do when there
  are few bins (histograms), and otherwise we draw n indices. When the
  run order is known (profile results) and neighbouring iterations are
  correlated, whole blocks of consecutive iterations are resampled instead
  (circular block bootstrap, block length from ``block_length``). The
  two-sided percentile interval of the B differences at confidence
  1 - alpha is the CI; the difference is significant when the CI excludes 0.
* **Mann-Whitney U** (``mann_whitney``) on binned data: midranks over the
  pooled bins, normal approximation with the tie correction and a continuity
  correction (as ``scipy.stats.mannwhitneyu(method="asymptotic")``). With
  raw samples this is the ordinary test; with histograms every value in one
  bucket is a tie, which the tie correction accounts for.
* **Rates**: an error rate is compared with Fisher's exact test, a
  throughput (successful requests per second) with the conditional binomial
  test for two Poisson rates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from latencylab.stats import format_q

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_BOOT = 1000
EXACT_MAX_N = 20_000  # above this, raw samples are binned to COARSE_DIGITS significant digits first
COARSE_DIGITS = 4
_CHUNK = 2_000_000  # elements per bootstrap chunk (memory stays ~tens of MB)


@dataclass(frozen=True, slots=True)
class Binned:
    """A sample as sorted distinct ``values`` with positive ``counts`` (``n`` = counts.sum()).

    ``order``, when the samples' run order is known (profiler iterations), is
    the bin index of each sample in that order, and ``block`` the block length
    the bootstrap resamples it in (1: independent samples; see ``block_length``).
    """

    values: FloatArray
    counts: IntArray
    order: IntArray | None = None
    block: int = 1

    def __post_init__(self) -> None:
        if self.values.ndim != 1 or self.values.shape != self.counts.shape:
            raise ValueError("values and counts must be one-dimensional and of equal length")
        if self.values.size == 0:
            raise ValueError("no samples")
        if (self.counts <= 0).any() or (np.diff(self.values) <= 0).any():
            raise ValueError("values must be strictly increasing and counts positive")

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    @classmethod
    def from_samples(
        cls, samples: Sequence[float] | npt.ArrayLike, ordered: bool = False, coarsen_above: int = EXACT_MAX_N
    ) -> Binned:
        """Exact bins of raw samples; above ``coarsen_above`` samples, values are first rounded to
        ``COARSE_DIGITS`` significant digits (a 0.01% change of value) so the bootstrap stays fast.
        ``ordered``: the samples are a time series (run order), kept for the block bootstrap."""
        arr = np.asarray(samples, dtype=np.float64).ravel()
        if arr.size == 0:
            raise ValueError("no samples")
        if arr.size > coarsen_above:
            arr = round_significant(arr, COARSE_DIGITS)
        values, inverse, counts = np.unique(arr, return_inverse=True, return_counts=True)
        if not ordered:
            return cls(values.astype(np.float64), counts.astype(np.int64))
        order = inverse.astype(np.int64).ravel()
        return cls(values.astype(np.float64), counts.astype(np.int64), order, block_length(order))

    @classmethod
    def from_cdf(cls, points: Sequence[tuple[float, float]], total: int) -> Binned:
        """Bins from ``LatencyHistogram.cdf()`` (bucket tops, cumulative fractions) and its count."""
        if total <= 0 or not points:
            raise ValueError("empty histogram")
        tops = np.array([p[0] for p in points], dtype=np.float64)
        cum = np.rint(np.array([p[1] for p in points], dtype=np.float64) * total).astype(np.int64)
        counts = np.diff(np.r_[0, cum])
        keep = counts > 0
        return cls(tops[keep], counts[keep].astype(np.int64))


def round_significant(x: FloatArray, digits: int) -> FloatArray:
    """``x`` rounded to ``digits`` significant decimal digits (zeros stay zero)."""
    out = np.array(x, dtype=np.float64)
    nz = out != 0
    mag = np.floor(np.log10(np.abs(out[nz])))
    scale = 10.0 ** (digits - 1 - mag)
    out[nz] = np.round(out[nz] * scale) / scale
    return out


MAX_BLOCK_FRACTION = 0.1  # a block never spans more than a tenth of the run


def block_length(series: npt.ArrayLike) -> int:
    """Block length for the bootstrap of a time series: twice its integrated autocorrelation time.

    Latency samples of one run are not independent when the machine's state
    drifts or comes in bursts (another process takes the CPU for a while, a
    frequency step): neighbouring iterations are then alike, the run holds
    fewer independent observations than iterations, and an i.i.d. bootstrap
    would give too narrow intervals. Algorithm: ranks of the series (robust
    to outliers), autocorrelations rho_k by FFT, summed while they stay above
    the 2/sqrt(n) noise level (Geyer's initial-sequence idea); tau = 1 + 2
    sum rho_k; block = ceil(2 tau), 1 (plain bootstrap) when tau < 1.5, at
    most n/10. Blocks of length tau would still understate the variance
    (the correlation across block edges is lost); 2 tau recovers most of it.
    Strongly correlated runs still get somewhat too narrow CIs (measured in
    docs/BENCHMARKS.md, compare): the cure is more iterations.
    """
    x = np.asarray(series, dtype=np.float64).ravel()
    n = x.size
    if n < 20:
        return 1
    r = np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(np.float64)
    r -= r.mean()
    var = float(np.dot(r, r))
    if var == 0:
        return 1
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(r, size)
    acf = np.fft.irfft(f * np.conj(f), size)[: n // 2] / var
    limit = 2.0 / math.sqrt(n)
    below = np.flatnonzero(acf[1:] < limit)
    k_end = int(below[0]) + 1 if below.size else acf.size
    tau = 1.0 + 2.0 * float(acf[1:k_end].sum())
    if tau < 1.5:
        return 1
    return int(min(math.ceil(2.0 * tau), max(1, int(n * MAX_BLOCK_FRACTION))))


# ------------------------------------------------------------------------------------------ estimators
def _ranked(cum: IntArray, values: FloatArray, ranks: npt.ArrayLike) -> FloatArray:
    """Value of each 0-based order statistic in ``ranks`` given cumulative bin counts."""
    idx = np.searchsorted(cum, np.asarray(ranks), side="right")
    return values[np.minimum(idx, values.size - 1)]


def quantile(b: Binned, q: float) -> float:
    """Type-7 quantile of the binned sample (linear interpolation between order statistics)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is not a fraction in [0, 1]")
    cum = np.cumsum(b.counts)
    h = (b.n - 1) * q
    lo = math.floor(h)
    x0, x1 = _ranked(cum, b.values, [lo, min(lo + 1, b.n - 1)])
    return float(x0 + (h - lo) * (x1 - x0))


def mean(b: Binned) -> float:
    return float(np.dot(b.values, b.counts) / b.n)


# Statistic ids: a quantile fraction, or one of these names.
STATISTICS: tuple[str, ...] = ("mean", "max")


def statistic(b: Binned, stat: float | str) -> float:
    """``stat`` is a quantile fraction, "mean" or "max"."""
    if stat == "mean":
        return mean(b)
    if stat == "max":
        return float(b.values[-1])
    return quantile(b, float(stat))


def _at_rank(values: FloatArray, flat_cum: IntArray, starts: IntArray, r: float) -> FloatArray:
    """Per bootstrap row, the value of 0-based order statistic ``r`` (rows laid end to end in ``flat_cum``)."""
    k = values.size
    pos = np.searchsorted(flat_cum, starts + r, side="right")
    return values[np.minimum(pos - np.arange(starts.size) * k, k - 1)]


def _replicates(b: Binned, stats: Sequence[float | str], n_boot: int, rng: np.random.Generator) -> FloatArray:
    """``stats`` over ``n_boot`` bootstrap resamples of ``b``: shape (n_boot, len(stats))."""
    n, k = b.n, b.values.size
    out = np.empty((n_boot, len(stats)))
    blocks = b.order is not None and b.block > 1
    # Few bins (a histogram): drawing bin counts is cheaper than drawing n indices.
    multinomial = k * 8 < n and not blocks
    rows = max(1, _CHUNK // max(k if multinomial else n, 1))
    p = b.counts / n
    expand = np.repeat(np.arange(k), b.counts) if not multinomial and not blocks and k < n else None
    done = 0
    while done < n_boot:
        m = min(rows, n_boot - done)
        if multinomial:
            counts = rng.multinomial(n, p, size=m).astype(np.int64)
        else:
            if blocks:
                assert b.order is not None
                # Circular block bootstrap: ceil(n / block) blocks of consecutive iterations, cut to n.
                nb = -(-n // b.block)
                starts = rng.integers(0, n, size=(m, nb, 1))
                pos = ((starts + np.arange(b.block)) % n).reshape(m, nb * b.block)[:, :n]
                idx = b.order[pos]
            else:
                idx = rng.integers(0, n, size=(m, n))
                if expand is not None:  # ties: map a draw among the n individuals to its bin
                    idx = expand[idx]
            flat = (idx + (np.arange(m) * k)[:, None]).ravel()
            counts = np.bincount(flat, minlength=m * k).reshape(m, k).astype(np.int64)
        cum = np.cumsum(counts, axis=1)
        # One searchsorted over all rows: offset row r by r * (n + 1) so the flattened array stays sorted.
        offset = (np.arange(m) * (n + 1))[:, None]
        flat_cum = (cum + offset).ravel()
        row_starts = offset[:, 0]

        for j, s in enumerate(stats):
            if s == "mean":
                out[done : done + m, j] = counts @ b.values / n
            elif s == "max":
                out[done : done + m, j] = _at_rank(b.values, flat_cum, row_starts, n - 1)
            else:
                h = (n - 1) * float(s)
                lo = math.floor(h)
                x0, x1 = (
                    _at_rank(b.values, flat_cum, row_starts, lo),
                    _at_rank(b.values, flat_cum, row_starts, min(lo + 1, n - 1)),
                )
                out[done : done + m, j] = x0 + (h - lo) * (x1 - x0)
        done += m
    return out


@dataclass(frozen=True, slots=True)
class MetricDelta:
    """The change of one metric from baseline to candidate: what :func:`bootstrap_deltas` returns and every
    row of a :class:`latencylab.compare.model.Comparison` holds.

    ``unit``: "ns" (latency), "1/s" (throughput) or "fraction" (error rate); "" where the caller has not
    said (:func:`bootstrap_deltas`). ``ci_low``/``ci_high`` bound ``candidate - baseline`` and
    ``rel_ci_low``/``rel_ci_high`` bound ``candidate / baseline - 1`` (None when the baseline is 0), at the
    comparison's confidence. ``method`` names the test behind ``p_value``. ``significant``: the evidence
    excludes no change; ``flagged``: significant and at least the noise threshold of the baseline.
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

    @property
    def diff(self) -> float:
        return self.candidate - self.baseline

    @property
    def rel(self) -> float | None:
        """candidate / baseline - 1; None when both are 0, +-inf when only the baseline is."""
        if self.baseline == 0:
            return None if self.candidate == 0 else math.copysign(math.inf, self.candidate)
        return self.diff / self.baseline


def bootstrap_deltas(
    baseline: Binned,
    candidate: Binned,
    stats: Sequence[float | str],
    alpha: float = 0.05,
    n_boot: int = DEFAULT_BOOT,
    seed: int = 0,
) -> list[MetricDelta]:
    """Percentile-bootstrap CIs of ``stat(candidate) - stat(baseline)`` for each statistic (see module doc).

    ``p_value`` is the two-sided bootstrap p-value, 2 min(P*(delta <= 0), P*(delta >= 0)) capped at 1:
    below alpha exactly when the (1 - alpha) percentile interval excludes 0 (up to ties at 0), which is
    when the delta is ``significant``. ``metric`` names the statistic (``p50``, ``mean``); ``flagged`` is
    left False (the noise threshold is the caller's)."""
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    rng = np.random.default_rng(seed)
    ra = _replicates(baseline, stats, n_boot, rng)
    rb = _replicates(candidate, stats, n_boot, rng)
    d = rb - ra
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(ra > 0, rb / ra - 1.0, np.nan)
    out = []
    for j, s in enumerate(stats):
        lo, hi = np.quantile(d[:, j], [alpha / 2, 1 - alpha / 2])
        p = min(1.0, 2.0 * min(float(np.mean(d[:, j] <= 0)), float(np.mean(d[:, j] >= 0))))
        rj = rel[:, j]
        rel_lo: float | None = None
        rel_hi: float | None = None
        if np.isfinite(rj).all():
            rl, rh = np.quantile(rj, [alpha / 2, 1 - alpha / 2])
            rel_lo, rel_hi = float(rl), float(rh)
        out.append(
            MetricDelta(
                s if isinstance(s, str) else format_q(s),
                "",
                statistic(baseline, s),
                statistic(candidate, s),
                float(lo),
                float(hi),
                rel_lo,
                rel_hi,
                p,
                "bootstrap",
                bool(lo > 0 or hi < 0),
                False,
            )
        )
    return out


# ------------------------------------------------------------------------------------------ rank test
@dataclass(frozen=True, slots=True)
class RankTest:
    """Mann-Whitney U for ``candidate`` vs ``baseline``.

    ``u`` is the candidate's U statistic, ``prob_greater`` = U / (n_a n_b) =
    P(candidate > baseline) + P(tie) / 2 (0.5: neither tends to be larger),
    ``z`` the tie- and continuity-corrected normal score and ``p_value``
    its two-sided p-value.
    """

    u: float
    z: float
    p_value: float
    prob_greater: float


def mann_whitney(baseline: Binned, candidate: Binned) -> RankTest:
    """Two-sided Mann-Whitney U test on binned samples (see module doc)."""
    from scipy.stats import norm

    values = np.union1d(baseline.values, candidate.values)
    ca = np.zeros(values.size)
    cb = np.zeros(values.size)
    ca[np.searchsorted(values, baseline.values)] = baseline.counts
    cb[np.searchsorted(values, candidate.values)] = candidate.counts
    na, nb = float(baseline.n), float(candidate.n)
    big_n = na + nb
    t = ca + cb
    before = np.cumsum(t) - t
    midrank = before + (t + 1.0) / 2.0
    u = float(np.dot(cb, midrank) - nb * (nb + 1.0) / 2.0)
    mu = na * nb / 2.0
    ties = float(np.sum(t**3 - t))
    var = na * nb / 12.0 * ((big_n + 1.0) - ties / (big_n * (big_n - 1.0))) if big_n > 1 else 0.0
    if var <= 0:
        return RankTest(u, 0.0, 1.0, u / (na * nb))
    dev = u - mu
    z = (dev - math.copysign(0.5, dev)) / math.sqrt(var) if abs(dev) > 0.5 else 0.0
    p = min(1.0, 2.0 * float(norm.sf(abs(z))))
    return RankTest(u, z, p, u / (na * nb))


# ------------------------------------------------------------------------------------------ rates
def error_rate_test(bad_a: int, n_a: int, bad_b: int, n_b: int) -> float:
    """Two-sided p-value of Fisher's exact test that two error proportions are equal."""
    from scipy.stats import fisher_exact

    if n_a <= 0 or n_b <= 0:
        return 1.0
    _, p = fisher_exact([[bad_a, n_a - bad_a], [bad_b, n_b - bad_b]])
    return float(min(1.0, p))


def poisson_rate_test(k_a: int, t_a: float, k_b: int, t_b: float) -> float:
    """Two-sided p-value that two Poisson rates (k events over t seconds) are equal.

    Conditional test: given k_a + k_b events, k_b ~ Binomial(k_a + k_b,
    t_b / (t_a + t_b)) under equal rates. Arrivals that are more regular
    than Poisson (a constant-rate generator) make it conservative.
    """
    from scipy.stats import binomtest

    k = k_a + k_b
    if k == 0 or t_a <= 0 or t_b <= 0:
        return 1.0
    return float(binomtest(k_b, k, t_b / (t_a + t_b)).pvalue)


def exceedance_test(baseline: Binned, candidate: Binned) -> float:
    """Two-sided p-value that the larger maximum is not just chance (exact, distribution-free).

    Under "both samples come from one distribution" every arrangement of the
    pooled sample is equally likely, so the chance that the k largest values
    all belong to the sample with the larger maximum (n_1 of N values) is
    C(n_1, k) / C(N, k); k counts that sample's values above the other's
    maximum. A single outlier never reaches significance (p ~ 1 at equal
    sizes); six values beyond the other run's maximum do (p ~ 0.06 at
    k = 5, 0.03 at k = 6 for equal sizes).
    """
    if candidate.values[-1] == baseline.values[-1]:
        return 1.0
    hi, lo = (candidate, baseline) if candidate.values[-1] > baseline.values[-1] else (baseline, candidate)
    k = int(hi.counts[hi.values > lo.values[-1]].sum())
    n1, big_n = hi.n, hi.n + lo.n

    def log_comb(n: int, r: int) -> float:
        return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)

    return min(1.0, 2.0 * math.exp(log_comb(n1, k) - log_comb(big_n, k)))


# ------------------------------------------------------------------------------------------ runs
@dataclass(frozen=True, slots=True)
class RunDelta:
    """Inference on a metric's change when each side holds several runs (the run is the unit).

    Each run contributes one value of the metric (its own p50, mean, ...). On the log scale, with
    ``la``/``lb`` the per-run logs: ``baseline``/``candidate`` are the geometric means exp(mean(la)) and
    exp(mean(lb)); the relative change exp(mean(lb) - mean(la)) - 1 gets a (1 - alpha) t interval:

    * ``welch``: both sides >= 2 runs; Welch's t with the Welch-Satterthwaite degrees of freedom. The
      spread *between runs* (which already holds each run's own sampling noise) is the noise floor.
    * ``one-run``: one side has a single run; the other side's between-run variance stands for both
      (Student's t, se = s sqrt(1/n + 1), df = n - 1).
    * ``paired``: runs were interleaved in rounds (``compare --run``): d_r = lb_r - la_r per round, so
      drift common to a round cancels. With at least ``ROBUST_MIN_ROUNDS`` rounds (``paired-wilcoxon``):
      the Hodges-Lehmann estimate (median of the Walsh averages (d_i + d_j) / 2, i <= j) with the exact
      Wilcoxon signed-rank interval and p-value, so one round that other work on the machine hit on one
      side only does not blow up the interval as it does a t interval's; ``candidate`` is then
      ``baseline`` x exp(estimate). Fewer rounds: a one-sample t on the d_r (``paired``, df = rounds - 1).

    ``spread_*``: the standard deviation of the per-run logs (0.03: runs differ by about +/-3%), None
    for a single run. Zero spread (identical runs, a fake clock) gives a zero-width interval.
    """

    baseline: float
    candidate: float
    rel_ci_low: float
    rel_ci_high: float
    p_value: float
    df: float
    method: str
    spread_baseline: float | None
    spread_candidate: float | None

    @property
    def rel(self) -> float:
        return self.candidate / self.baseline - 1.0

    @property
    def significant(self) -> bool:
        return self.rel_ci_low > 0 or self.rel_ci_high < 0


ROBUST_MIN_ROUNDS = 6  # below this, no signed-rank interval reaches 95% (n = 5: min two-sided p = 0.0625)


def signed_rank_null(n: int) -> npt.NDArray[np.float64]:
    """P(T+ = t), t = 0..n(n+1)/2: the exact null distribution of the Wilcoxon signed-rank statistic."""
    m = n * (n + 1) // 2
    counts = np.zeros(m + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):  # each rank joins the positive set or not
        counts[r:] = counts[r:] + counts[: m + 1 - r].copy()
    return counts / counts.sum()


def hodges_lehmann(d: npt.ArrayLike, alpha: float = 0.05) -> tuple[float, float, float, float]:
    """(estimate, low, high, p) for the centre of paired differences ``d``: Hodges-Lehmann with the exact
    signed-rank interval [W_(k), W_(M+1-k)] over the M sorted Walsh averages, k the largest with
    P(T+ <= k - 1) <= alpha / 2; the two-sided exact signed-rank p-value (midranks for ties)."""
    x = np.asarray(d, dtype=np.float64)
    n = x.size
    i, j = np.triu_indices(n)
    walsh = np.sort((x[i] + x[j]) / 2.0)
    est = float(np.median(walsh))
    cdf = np.cumsum(signed_rank_null(n))
    k = int(np.searchsorted(cdf, alpha / 2, side="right"))  # P(T+ <= k - 1) <= alpha / 2
    m = walsh.size
    lo, hi = (float(walsh[k - 1]), float(walsh[m - k])) if k >= 1 else (float(walsh[0]), float(walsh[-1]))
    nz = x[x != 0]
    if nz.size == 0:
        return est, lo, hi, 1.0
    ranks = _midranks(np.abs(nz))
    t_plus = float(ranks[nz > 0].sum())
    null = signed_rank_null(nz.size)
    support = np.arange(null.size, dtype=np.float64)
    mid = nz.size * (nz.size + 1) / 4.0
    p = float(null[np.abs(support - mid) >= abs(t_plus - mid) - 1e-9].sum())
    return est, lo, hi, min(1.0, p)


def _midranks(x: FloatArray) -> FloatArray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(1, x.size + 1, dtype=np.float64)
    for v in np.unique(x):
        tie = x == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def _t_interval(diff: float, se: float, df: float, alpha: float) -> tuple[float, float, float]:
    """(low, high, p) of a t statistic: a zero standard error decides exactly."""
    from scipy.stats import t as student

    if se == 0 or not math.isfinite(se):
        return diff, diff, (1.0 if diff == 0 else 0.0)
    crit = float(student.ppf(1.0 - alpha / 2, df))
    p = float(2.0 * student.sf(abs(diff) / se, df))
    return diff - crit * se, diff + crit * se, min(1.0, p)


def run_delta(
    baseline: Sequence[float], candidate: Sequence[float], alpha: float = 0.05, paired: bool = False
) -> RunDelta | None:
    """Per-run metric values of each side -> :class:`RunDelta`; None with a single run a side (then the
    between-run spread is unknown, and no test over iterations can stand in for it)."""
    la = np.log(np.maximum(np.asarray(baseline, dtype=np.float64), 1.0))
    lb = np.log(np.maximum(np.asarray(candidate, dtype=np.float64), 1.0))
    na, nb = la.size, lb.size
    if na == 0 or nb == 0 or (na < 2 and nb < 2):
        return None
    sa = float(la.std(ddof=1)) if na > 1 else None
    sb = float(lb.std(ddof=1)) if nb > 1 else None
    diff = float(lb.mean() - la.mean())
    if paired:
        if na != nb:
            raise ValueError("a paired comparison needs one run a side per round")
        d = lb - la
        if na >= ROBUST_MIN_ROUNDS:
            est, lo, hi, p = hodges_lehmann(d, alpha)
            base = float(np.exp(la.mean()))
            return RunDelta(
                base, base * math.exp(est), math.expm1(lo), math.expm1(hi), p, float(na - 1), "paired-wilcoxon",
                sa, sb,
            )  # fmt: skip
        se = float(d.std(ddof=1)) / math.sqrt(na)
        df, method = float(na - 1), "paired"
    elif sa is not None and sb is not None:
        va, vb = sa**2 / na, sb**2 / nb
        se = math.sqrt(va + vb)
        denom = (va**2 / (na - 1) if na > 1 else 0.0) + (vb**2 / (nb - 1) if nb > 1 else 0.0)
        df, method = (se**4 / denom if denom > 0 else float(na + nb - 2)), "welch"
    else:
        s, n = (sa, na) if sa is not None else (sb, nb)
        assert s is not None
        se = s * math.sqrt(1.0 / n + 1.0)
        df, method = float(n - 1), "one-run"
    lo, hi, p = _t_interval(diff, se, df, alpha)
    return RunDelta(
        float(np.exp(la.mean())),
        float(np.exp(lb.mean())),
        math.expm1(lo),
        math.expm1(hi),
        p,
        df,
        method,
        sa,
        sb,
    )


def per_run(samples: Sequence[npt.ArrayLike], stat: float | str) -> list[float]:
    """``stat`` (a quantile fraction, "mean" or "max") of each run's samples (type-7 quantiles)."""
    out = []
    for s in samples:
        x = np.asarray(s, dtype=np.float64)
        if stat == "mean":
            out.append(float(x.mean()))
        elif stat == "max":
            out.append(float(x.max()))
        else:
            out.append(float(np.quantile(x, float(stat))))
    return out
