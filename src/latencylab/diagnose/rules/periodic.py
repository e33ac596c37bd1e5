"""Rule: latency or throughput swings periodically (pipeline bubbles, a periodic background job).

Algorithm (:func:`find_period`): the series is winsorised at its 0.5% / 99.5% quantiles (one huge stall
must not hide a rhythm), its mean removed, and its autocorrelation computed by FFT (biased estimator,
r[0] = 1). The period is the lag k in [2, n/3] of the highest local maximum of r, accepted when
r[k] >= ``MIN_ACF`` and r dipped at least ``MIN_DEPTH`` below it at a shorter lag (a rhythm goes out of
phase half-way; a trend or a level shift decays slowly and never dips), refined to a fraction of a lag
by a parabola through r[k-1..k+1]. Its amplitude is the range of the series folded on the period (mean
per phase) over the series median; swings under ``MIN_AMPLITUDE`` are ignored.

On a profile, the rhythm is looked for only in what more specific causes leave unexplained
(:func:`unexplained`): iterations holding a compile event (+-1), a repeated pause or an isolated stall (the
``spikes`` rule reports those, with their own period) are set to the median, and when the run recorded which
input (or input shape) each iteration ran and inputs repeat, each iteration's latency is taken relative to the
median of its input: a pipeline cycling through a fixed input set swings with the inputs, which is no rhythm
of the system. The finding names the stage whose folded profile swings most, the iterations of the peak phase
and the effect: the time above the trough of the folded profile, as a share of end-to-end time, and the share
of the p99 tail that falls in the high half of the cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from latencylab.diagnose.rules.common import effect, iteration_list, of_kind, profiles, tail_iterations
from latencylab.diagnose.rules.spikes import _compile_events, _explained_by_compiles, find_stalls, stage_excess
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult, ProfileResult

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


def unexplained(prof: ProfileResult) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], list[str]]:
    """(end-to-end, per-stage [stage, iteration]) series with what other causes explain taken out, and notes."""
    e2e = prof.end_to_end_ns().astype(np.float64)
    names, exc, exp, _ = stage_excess(prof)
    notes = []
    drop = _explained_by_compiles(_compile_events(prof))
    pause, stalls = find_stalls(prof, drop)
    if drop:
        notes.append("compile events")
    if pause is not None:
        drop |= set(pause.iterations)
        notes.append(f"pauses every {pause.period} iterations")
    if stalls:
        drop |= {s.iteration for s in stalls}
        notes.append("isolated stalls")
    # relative to the input's own median (``stage_excess`` uses the input or shape when they repeat)
    per_stage = exc + np.median(exp, axis=1, keepdims=True)
    if not np.allclose(exp, np.median(exp, axis=1, keepdims=True)):
        notes.append("the input set's own latencies")
    idx = np.asarray(sorted(i for i in drop if 0 <= i < e2e.size), dtype=np.int64)
    if idx.size:
        per_stage[:, idx] = np.median(per_stage, axis=1, keepdims=True)
    del names
    return per_stage.sum(axis=0), per_stage, notes


def _profile_finding(r: LoadedResult, prof: ProfileResult) -> Finding | None:
    resid, per_stage, notes = unexplained(prof)
    p = find_period(resid)
    if p is None:
        return None
    e2e = prof.end_to_end_ns()
    starts = np.asarray(prof.iteration_start_ns, dtype=np.float64)
    step = float(np.mean(np.diff(starts))) / 1e9 if starts.size > 1 else 0.0
    phases = np.arange(resid.size) % p.lag
    fold = np.asarray([resid[phases == k].mean() for k in range(p.lag)])
    swings = [float(np.ptp([row[phases == k].mean() for k in range(p.lag)])) for row in per_stage]
    j = int(np.argmax(swings))
    stage = prof.stages[j].name
    peak = int(np.argmax(fold))
    peak_its = list(range(peak, resid.size, p.lag))
    excess = fold[phases] - fold.min()
    eff = effect(e2e, range(resid.size), excess)
    high = np.flatnonzero(fold > (fold.max() + fold.min()) / 2)
    tail = tail_iterations(e2e)
    eff["tail_share"] = float(np.isin(tail % p.lag, high).mean()) if tail.size else 0.0
    f = _finding(r.source, "end-to-end latency per iteration", p, step, "iterations", resid.size)
    secs = p.period * step
    return Finding(
        rule=RULE,
        severity=f.severity,
        title=(
            f"{stage} swings periodically: period {p.period:.1f} iterations ({secs:.3g} s), peak-to-trough "
            f"{p.amplitude:.0%} of the median, peaks at iterations {iteration_list(peak_its, 4)}; "
            f"the swing is {eff['share']:.1%} of end-to-end time, {eff['tail_share']:.0%} of the p99 tail "
            "falls in the high half of the cycle"
        ),
        evidence=(
            Evidence("stage that swings most", f"{stage} ({swings[j] / 1e6:.3f} ms peak-to-trough)"),
            Evidence("peak phase: iterations", iteration_list(peak_its, 8)),
            *f.evidence[1:],
            Evidence("share of end-to-end time above the trough", round(100 * eff["share"], 2), "%"),
            Evidence("share of the p99 tail in the high half", round(100 * eff["tail_share"], 1), "%"),
            Evidence("taken out before looking", ", ".join(notes) or "nothing (no other cause found)"),
        ),
        recommendation=ADVICE,
        source=r.source,
        details={**f.details, "stage": stage, "peak_iterations": peak_its[:50], "effect": eff, "ruled_out": notes},
    )


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r, prof in profiles(results):
        f = _profile_finding(r, prof)
        if f is not None:
            out.append(f)
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
