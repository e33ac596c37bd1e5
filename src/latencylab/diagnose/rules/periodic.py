"""Rule: latency or throughput swings periodically (pipeline bubbles, a periodic background job).

Algorithm (:func:`find_period`): the series is winsorised at its 0.5% / 99.5% quantiles (one huge stall
must not hide a rhythm), its mean removed, and its autocorrelation computed by FFT (biased estimator,
r[0] = 1). The period is the lag k in [2, n/3] of the highest local maximum of r, accepted when
r[k] >= ``MIN_ACF`` and r dipped at least ``MIN_DEPTH`` below it at a shorter lag (a rhythm goes out of
phase half-way; a trend or a level shift decays slowly and never dips), refined to a fraction of a lag
by a parabola through r[k-1..k+1]. Its amplitude is the range of the series folded on the period (mean
per phase) over the series median; swings under ``MIN_AMPLITUDE`` are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from latencylab.diagnose.rules.common import of_kind, profiles
from latencylab.diagnose.types import Evidence, Finding, LoadedResult

RULE = "periodic-swings"
MIN_ACF = 0.3
MIN_DEPTH = 0.5
MIN_AMPLITUDE = 0.1
MIN_POINTS = 16

ADVICE = (
    "a regular rhythm in latency or throughput usually means pipeline bubbles: stages that take turns instead "
    "of overlapping (the accelerator waits while the host decodes the next batch, then the host waits), a "
    "batcher timer, or a periodic background job (garbage collection, checkpointing, metrics flush, another "
    "process's cron); double-buffer the data path (prepare batch i+1 while batch i runs), give the batcher a "
    "queue of ready inputs, and look for anything that runs every period (utilisation sampled over time: "
    "`latencylab diagnose --deep`)"
)


@dataclass(frozen=True, slots=True)
class Periodicity:
    period: float  # in samples (fractional after refinement)
    lag: int  # the integer lag of the autocorrelation peak
    acf: float  # autocorrelation at that lag
    depth: float  # acf at the peak minus the lowest acf at a shorter lag
    amplitude: float  # (max - min) of the folded profile / median of the series
    profile: tuple[float, ...]  # mean of the series per phase of the period


def autocorrelation(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Biased sample autocorrelation r[0..n-1] of ``x`` (r[0] = 1; all zeros for a constant series)."""
    a = np.asarray(x, dtype=np.float64)
    a = a - a.mean()
    n = a.size
    f = np.fft.rfft(a, 2 * n)
    acf = np.fft.irfft(f * np.conj(f), 2 * n)[:n]
    return acf / acf[0] if acf[0] > 0 else np.zeros(n)


def find_period(series: npt.ArrayLike, max_fraction: float = 1 / 3) -> Periodicity | None:
    """The dominant period of ``series`` (see the module docstring), or None when there is no clear rhythm."""
    x = np.asarray(series, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = x.size
    if n < MIN_POINTS:
        return None
    lo, hi = np.quantile(x, [0.005, 0.995])
    w = np.clip(x, lo, hi)
    r = autocorrelation(w)
    max_lag = int(n * max_fraction)
    best = None
    for k in range(2, max_lag):
        if r[k] >= r[k - 1] and r[k] >= r[k + 1] and (best is None or r[k] > r[best]):
            best = k
    if best is None or r[best] < MIN_ACF:
        return None
    depth = float(r[best] - r[1:best].min())
    if depth < MIN_DEPTH:
        return None
    den = r[best - 1] - 2 * r[best] + r[best + 1]
    period = best + (0.5 * (r[best - 1] - r[best + 1]) / den if den < 0 else 0.0)
    phases = np.arange(n) % best
    prof = np.asarray([w[phases == p].mean() for p in range(best)])
    med = float(np.median(x))
    amp = float((prof.max() - prof.min()) / med) if med > 0 else 0.0
    if amp < MIN_AMPLITUDE:
        return None
    return Periodicity(float(period), best, float(r[best]), depth, amp, tuple(float(v) for v in prof))


def _finding(source: str, what: str, p: Periodicity, unit_s: float, unit_name: str, n: int) -> Finding:
    secs = p.period * unit_s
    per = f"{p.period:.1f} {unit_name}" + (f" ({secs:.3g} s)" if unit_name != "s" else "")
    return Finding(
        rule=RULE,
        severity="warning",
        title=f"{what} swings periodically: period {per}, peak-to-trough {p.amplitude:.0%} of the median",
        evidence=(
            Evidence("series", what),
            Evidence("period", round(p.period, 2), unit_name),
            Evidence("period", round(secs, 4), "s"),
            Evidence("autocorrelation at the period", round(p.acf, 3)),
            Evidence("peak-to-trough swing (folded mean / median)", round(100 * p.amplitude, 1), "%"),
            Evidence("samples", n),
        ),
        recommendation=ADVICE,
        source=source,
        details={"period": p.period, "period_s": secs, "acf": p.acf, "profile": list(p.profile)},
    )


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r, prof in profiles(results):
        e2e = prof.end_to_end_ns()
        p = find_period(e2e)
        if p is not None:
            starts = np.asarray(prof.iteration_start_ns, dtype=np.float64)
            step = float(np.mean(np.diff(starts))) / 1e9 if starts.size > 1 else 0.0
            out.append(_finding(r.source, "end-to-end latency per iteration", p, step, "iterations", e2e.size))
    for r in of_kind(results, "load"):
        tl = list(r.doc.get("timeline", []))
        if len(tl) < MIN_POINTS:
            continue
        ts = [float(t["t_s"]) for t in tl]
        step = float(np.median(np.diff(ts))) if len(ts) > 1 else 1.0
        for key, what in (
            ("ok", "throughput (successful requests per interval)"),
            ("p50_ms", "p50 latency per interval"),
        ):
            vals = [t.get(key) for t in tl]
            if any(v is None for v in vals):
                continue
            p = find_period(vals)
            if p is not None:
                out.append(_finding(r.source, what, p, step, "s" if step == 1.0 else "intervals", len(vals)))
                break  # one rhythm per run is enough: latency and throughput swing together
    return out
