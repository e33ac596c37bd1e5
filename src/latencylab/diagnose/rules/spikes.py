"""Rule: latency suddenly jumps (level shift), stalls or pauses mid-run, and whether a recompilation explains it.

*Level shifts* come from :func:`latencylab.stats.detect_spikes` on the end-to-end series of a profile (and on
the per-interval p50 of a load timeline).

*Stalls* are judged per stage, against the stage's own distribution (:func:`find_stalls`): each sample's
*excess* is its time minus the stage's expected time (the median of the stage over the iterations that ran the
same input, or the same input shape, when the run recorded them, else the stage's median), and its spread is
the median absolute deviation of those excesses (x 1.4826, floor 1% of the median). An iteration is a
*pause candidate* when a stage's excess is >= 6 spreads, >= half the stage's median and >= a quarter of the
end-to-end median; candidates that recur every ``g`` iterations (:func:`find_regular`: one in at least 60% of
the slots ``phase + k g``, at least 4 times, and 3x more often than candidates fall elsewhere) are *repeated
pauses*. An
*isolated stall* is >= 10 spreads, >= 2x the stage's median and >= the end-to-end median (the iteration at
least doubled); they are reported when they cost at least 1% of the end-to-end time or 5% of the p99.

When the profile carries compile events (``iteration_meta.compiles``: recorded by the profiler itself when
torch.compile runs, see ``latencylab.autoprobe``, or by a pipeline probe), a spike that starts within one
iteration of a compile event is attributed to it: "recompiled at iteration N (shape X)"; those iterations are
not reported again as stalls. Compile events that no spike covers are reported too: each one is a stall
waiting to happen on the next new shape.

Every finding names the stage, the iterations, and the effect: share of the end-to-end time and of the p99
tail (``common.effect``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from latencylab import stats
from latencylab.diagnose.rules.common import (
    effect,
    effect_text,
    iteration_list,
    meta_column,
    ms,
    of_kind,
    profiles,
    shape_text,
    time_range_s,
)
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult, ProfileResult

MAX_STALLS_LISTED = 5
MAX_EVENT_FINDINGS = 3  # more compile events than this are one finding
STALL_MIN_SHARE = 0.01  # isolated stalls below this share of the end-to-end time ...
STALL_MIN_P99_GAIN = 0.05  # ... and moving the p99 by less than this are machine noise, not a finding
PAUSE_SIGMAS, PAUSE_REL_STAGE, PAUSE_REL_E2E = 6.0, 0.5, 0.25
STALL_SIGMAS, STALL_REL_STAGE, STALL_REL_E2E = 10.0, 2.0, 1.0
MIN_REPEATS, MIN_COVERAGE, ALPHA = 5, 0.6, 1e-3
RECOMPILE_ADVICE = (
    "static-shape compilation (torch.compile dynamic=False, TensorRT, XLA) compiles again for every new input "
    "shape: pad inputs to a few fixed bucket shapes, mark the varying dimension dynamic "
    "(torch._dynamo.mark_dynamic / dynamic=True), and warm up every bucket shape before serving; "
    "TORCH_LOGS=recompiles names the failing guard"
)
JUMP_ADVICE = (
    "look at what changed at that moment: a recompilation (new input shape or guard failure; TORCH_LOGS=recompiles), "
    "a different input size, another process taking the CPU (see the environment findings), thermal or frequency "
    "throttling, memory pressure or swapping; pin the input shapes and re-run to see if it persists"
)
PAUSE_ADVICE = (
    "a pause that comes back every so many iterations is periodic work on the request path: garbage collection "
    "(gc.freeze() after warm-up, or gc.disable() around inference), a flush, checkpoint or metrics export every N "
    "calls, a cache eviction, or a timer in the model code; move it off the request path or spread it out"
)
STALL_ADVICE = (
    "isolated stalls are usually one-off work on the request path: lazy initialisation or compilation, garbage "
    "collection (gc.freeze() after warm-up, or gc.disable() around inference), page faults on first touch, or "
    "preemption by another process; warm up every code path and shape before timing or serving"
)


def _compile_events(prof: ProfileResult) -> list[tuple[int, int, Any, float | None]]:
    """(iteration, compiles, shape, compile seconds) for every timed iteration with a compile event."""
    compiles = meta_column(prof, "compiles")
    if compiles is None:
        return []
    shapes = meta_column(prof, "shape") or (None,) * prof.n
    secs = meta_column(prof, "compile_s") or (None,) * prof.n
    return [
        (i, int(c), shapes[i], _num(secs[i])) for i, c in enumerate(compiles) if isinstance(c, (int, float)) and c > 0
    ]


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _guilty_stage(prof: ProfileResult, start: int, end: int) -> tuple[str, float, float]:
    """(stage, added ns, fraction of the end-to-end increase) for the stage whose time grew most in [start, end).

    Added time = the stage's mean inside the range minus its median outside it (means add up across stages,
    so the fractions of the increase are comparable).
    """
    adds = {}
    for s in prof.stages:
        a = s.array().astype(np.float64)
        outside = np.r_[a[:start], a[end:]]
        base = float(np.median(outside)) if outside.size else 0.0
        adds[s.name] = float(np.mean(a[start:end])) - base
    best = max(adds, key=lambda k: adds[k])
    total = sum(v for v in adds.values() if v > 0)
    return best, adds[best], (adds[best] / total if total > 0 else 0.0)


@dataclass(frozen=True, slots=True)
class Pause:
    """Repeated pauses: one stall in ``stage`` every ``period`` iterations."""

    stage: str
    period: int
    iterations: tuple[int, ...]
    excess_ns: tuple[float, ...]
    stage_median_ns: float


@dataclass(frozen=True, slots=True)
class Stall:
    iteration: int
    stage: str
    excess_ns: float
    stage_median_ns: float


def _labels(prof: ProfileResult) -> list[Any] | None:
    """What makes iterations comparable: the input they ran (when inputs repeat), else their input shape."""
    for key in ("input", "shape"):
        col = meta_column(prof, key)
        if col is not None and len({repr(v) for v in col}) <= prof.n // 3:
            return [repr(v) for v in col]
    return None


def _expected(a: np.ndarray, labels: list[Any] | None) -> np.ndarray:
    """Per iteration: the stage's median over the iterations with the same label (>= 3 of them), else overall."""
    med = float(np.median(a))
    out = np.full(a.size, med)
    if labels is None:
        return out
    groups: dict[Any, list[int]] = {}
    for i, lab in enumerate(labels):
        groups.setdefault(lab, []).append(i)
    for idx in groups.values():
        if len(idx) >= 3:
            out[idx] = float(np.median(a[idx]))
    return out


def stage_excess(prof: ProfileResult) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(stage names, excess ns [stage, iteration], expected ns [stage, iteration], spread ns per stage)."""
    labels = _labels(prof)
    names, exc, exp, spread = [], [], [], []
    for s in prof.stages:
        a = s.array().astype(np.float64)
        e = _expected(a, labels)
        d = a - e
        mad = float(np.median(np.abs(d - np.median(d)))) * 1.4826
        names.append(s.name)
        exc.append(d)
        exp.append(e)
        spread.append(max(mad, 0.01 * float(np.median(a)), 1e3))
    return names, np.asarray(exc), np.asarray(exp), np.asarray(spread)


def _over(exc: np.ndarray, exp: np.ndarray, spread: np.ndarray, sig: float, rel: float, floor: float) -> np.ndarray:
    """[stage, iteration] mask: excess >= sig spreads, >= rel x the expected time, >= floor ns."""
    return (exc >= sig * spread[:, None]) & (exc >= rel * exp) & (exc >= floor)


def find_regular(cands: np.ndarray, n: int) -> tuple[int, np.ndarray] | None:
    """(period g, the candidates on its slots) when candidate iterations recur every g iterations.

    For each g in [4, n/4]: the phase holding most candidates; its slots ``phase + k g`` must hold a candidate
    in >= ``MIN_COVERAGE`` of them (>= ``MIN_REPEATS`` in all), 3x more often than candidates fall outside
    them (the background rate b of random stalls), and so often that chance cannot explain it: the binomial
    tail P(X >= hits | slots, b) < ``ALPHA`` / (periods tried). The g with the most hits wins (on a tie the
    shortest: a multiple of the period holds half of them).
    """
    from scipy.stats import binom

    if cands.size < MIN_REPEATS:
        return None
    best: tuple[int, np.ndarray] | None = None
    best_hits = 0
    tried = max(1, n // MIN_REPEATS - 3)
    for g in range(4, n // MIN_REPEATS + 1):
        ph = int(np.argmax(np.bincount(cands % g, minlength=g)))
        on = (cands - ph) % g == 0
        hits = int(on.sum())
        slots = (n - 1 - ph) // g + 1
        background = (cands.size - hits) / max(1, n - slots)
        cover = hits / slots
        plausible = hits >= MIN_REPEATS and cover >= MIN_COVERAGE and cover >= 3 * background and hits > best_hits
        if plausible and float(binom.sf(hits - 1, slots, max(background, 1e-6))) < ALPHA / tried:
            best, best_hits = (g, cands[on]), hits
    return best


def find_stalls(prof: ProfileResult, exclude: set[int] | None = None) -> tuple[Pause | None, list[Stall]]:
    """Repeated pauses and isolated stalls of a profile (module docstring); ``exclude``: explained iterations."""
    exclude = exclude or set()
    names, exc, exp, spread = stage_excess(prof)
    e2e_med = float(np.median(prof.end_to_end_ns()))
    keep = np.ones(prof.n, dtype=bool)
    if exclude:
        keep[[i for i in exclude if 0 <= i < prof.n]] = False
    pmask = _over(exc, exp, spread, PAUSE_SIGMAS, PAUSE_REL_STAGE, PAUSE_REL_E2E * e2e_med) & keep
    cands = np.flatnonzero(pmask.any(axis=0))
    pause = None
    reg = find_regular(cands, prof.n)
    members: set[int] = set()
    if reg is not None:
        g, its = reg
        stage_of = [int(np.argmax(np.where(pmask[:, i], exc[:, i], -np.inf))) for i in its]
        j = max(set(stage_of), key=stage_of.count)
        members = {int(i) for i in its}
        pause = Pause(
            names[j],
            g,
            tuple(int(i) for i in its),
            tuple(float(max(exc[j, i], 0.0)) for i in its),
            float(np.median(exp[j])),
        )
    smask = _over(exc, exp, spread, STALL_SIGMAS, STALL_REL_STAGE, STALL_REL_E2E * e2e_med) & keep
    stalls = []
    for i in np.flatnonzero(smask.any(axis=0)):
        if int(i) in members:
            continue
        j = int(np.argmax(np.where(smask[:, i], exc[:, i], -np.inf)))
        stalls.append(Stall(int(i), names[j], float(exc[j, i]), float(exp[j, i])))
    return pause, stalls


def _explained_by_compiles(events: list[tuple[int, int, Any, float | None]]) -> set[int]:
    return {ev[0] + d for ev in events for d in (-1, 0, 1)}


def _pause_finding(r: LoadedResult, prof: ProfileResult, p: Pause) -> Finding:
    e2e = prof.end_to_end_ns()
    eff = effect(e2e, p.iterations, p.excess_ns)
    mean_exc = float(np.mean(p.excess_ns))
    t0, _ = time_range_s(prof, p.iterations[0], p.iterations[0] + 1)
    period_s = p.period * float(np.mean(np.diff(prof.iteration_start_ns))) / 1e9 if prof.n > 1 else 0.0
    return Finding(
        rule="stall",
        severity="critical" if eff["share"] >= 0.1 or eff["tail_share"] >= 0.5 else "warning",
        title=(
            f"{p.stage} pauses every {p.period} iterations (iterations {iteration_list(p.iterations, 4)}): "
            f"+{mean_exc / 1e6:.2f} ms each (x{(p.stage_median_ns + mean_exc) / p.stage_median_ns:.1f} its "
            f"median {p.stage_median_ns / 1e6:.2f} ms); {effect_text(eff)}"
        ),
        evidence=(
            Evidence("stage", p.stage),
            Evidence("period", p.period, "iterations"),
            Evidence("period", round(period_s, 4), "s"),
            Evidence("iterations", iteration_list(p.iterations, 12), "", t0, None),
            Evidence("pauses", len(p.iterations)),
            Evidence("added per pause (mean)", ms(mean_exc), "ms"),
            Evidence(f"{p.stage} median", ms(p.stage_median_ns), "ms"),
            Evidence("share of end-to-end time", round(100 * eff["share"], 2), "%"),
            Evidence("share of the p99 tail", round(100 * eff["tail_share"], 1), "%"),
            Evidence("p99 without them", round(eff["p99_without_ms"], 3), "ms"),
        ),
        recommendation=PAUSE_ADVICE,
        source=r.source,
        details={
            "stage": p.stage,
            "period": p.period,
            "iterations": list(p.iterations),
            "excess_ms": [round(v / 1e6, 4) for v in p.excess_ns],
            "effect": eff,
        },
    )


def _stalls_matter(prof: ProfileResult, stalls: list[Stall]) -> bool:
    """A few isolated stalls are what any shared machine does (a preemption, a page fault): they are a finding
    only when they cost something, i.e. at least ``STALL_MIN_SHARE`` of the end-to-end time, or a p99 that
    would be ``STALL_MIN_P99_GAIN`` lower without them."""
    eff = effect(prof.end_to_end_ns(), [s.iteration for s in stalls], [s.excess_ns for s in stalls])
    return eff["share"] >= STALL_MIN_SHARE or eff["p99_without_ms"] <= (1 - STALL_MIN_P99_GAIN) * eff["p99_ms"]


def _stall_finding(r: LoadedResult, prof: ProfileResult, stalls: list[Stall]) -> Finding:
    e2e = prof.end_to_end_ns()
    baseline = float(np.median(e2e))
    eff = effect(e2e, [s.iteration for s in stalls], [s.excess_ns for s in stalls])
    worst = max(stalls, key=lambda s: s.excess_ns)
    by_stage: dict[str, int] = {}
    for s in stalls:
        by_stage[s.stage] = by_stage.get(s.stage, 0) + 1
    where = ", ".join(f"{k} {v}" for k, v in sorted(by_stage.items(), key=lambda kv: -kv[1]))
    ev = []
    for s in sorted(stalls, key=lambda s: -s.excess_ns)[:MAX_STALLS_LISTED]:
        t0, t1 = time_range_s(prof, s.iteration, s.iteration + 1)
        ev.append(
            Evidence(
                f"stall at iteration {s.iteration} in {s.stage}",
                f"+{s.excess_ns / 1e6:.3f} ms (end-to-end {e2e[s.iteration] / 1e6:.3f} ms)",
                "",
                t0,
                t1,
            )
        )
    ev += [
        Evidence("stalls per stage", where),
        Evidence("baseline end-to-end median", ms(baseline), "ms"),
        Evidence("share of end-to-end time", round(100 * eff["share"], 2), "%"),
        Evidence("share of the p99 tail", round(100 * eff["tail_share"], 1), "%"),
        Evidence("p99 without them", round(eff["p99_without_ms"], 3), "ms"),
    ]
    return Finding(
        rule="stall",
        severity="warning",
        title=(
            f"{len(stalls)} isolated stall(s), worst x{e2e[worst.iteration] / baseline:.0f} the median "
            f"(iteration {worst.iteration}, {worst.stage} +{worst.excess_ns / 1e6:.2f} ms); stages: {where}; "
            f"{effect_text(eff)}"
        ),
        evidence=tuple(ev),
        recommendation=STALL_ADVICE,
        source=r.source,
        details={
            "stalls": [{"iteration": s.iteration, "stage": s.stage, "excess_ms": s.excess_ns / 1e6} for s in stalls],
            "effect": eff,
        },
    )


def _compile_excess(prof: ProfileResult, its: Sequence[int]) -> list[float]:
    e2e = prof.end_to_end_ns().astype(np.float64)
    base = float(np.median(e2e))
    return [max(0.0, float(e2e[i]) - base) for i in its]


def _profile_findings(r: LoadedResult, prof: ProfileResult) -> list[Finding]:
    e2e = prof.end_to_end_ns()
    spikes = stats.detect_spikes(e2e, prof.iteration_start_ns)
    events = _compile_events(prof)
    shapes = meta_column(prof, "shape")
    baseline = float(np.median(e2e))
    explained: set[int] = set()
    out: list[Finding] = []
    shifted: set[int] = set()
    caused: list[tuple[stats.Spike, tuple[int, int, Any, float | None], list[Evidence]]] = []
    for sp in spikes:
        cause = [ev for ev in events if sp.start - 1 <= ev[0] < sp.end + 1 and ev[0] not in explained]
        t0, t1 = time_range_s(prof, sp.start, sp.end)
        stage, added, frac = _guilty_stage(prof, sp.start, sp.end)
        n = sp.end - sp.start
        common = [
            Evidence("iterations", f"{sp.start}-{sp.end - 1} ({n})", "", t0, t1),
            Evidence("ratio to baseline median", round(sp.ratio, 2), "x", t0, t1),
            Evidence("baseline end-to-end median", ms(baseline), "ms"),
            Evidence("stage that grew most", f"{stage} (+{added / 1e6:.3f} ms mean, {frac:.0%} of the increase)"),
        ]
        if cause:
            explained.update(ev[0] for ev in cause)
            caused += [(sp, ev, common) for ev in cause]
        elif sp.kind == "level-shift":
            shifted.update(range(sp.start, sp.end))
            ev_list = list(common)
            why = ""
            if shapes is not None and 0 < sp.start < len(shapes) and shapes[sp.start] != shapes[sp.start - 1]:
                change = f"{shape_text(shapes[sp.start - 1])} -> {shape_text(shapes[sp.start])}"
                why = f"; the input shape changed {change}"
                ev_list.append(Evidence("input shape", change))
            eff = effect(e2e, range(sp.start, sp.end), [max(0.0, float(v) - baseline) for v in e2e[sp.start : sp.end]])
            ev_list.append(Evidence("share of end-to-end time", round(100 * eff["share"], 2), "%"))
            ev_list.append(Evidence("share of the p99 tail", round(100 * eff["tail_share"], 1), "%"))
            out.append(
                Finding(
                    rule="latency-jump",
                    severity="critical" if sp.ratio >= 2 else "warning",
                    title=(
                        f"latency jumped x{sp.ratio:.1f} over iterations {sp.start}-{sp.end - 1} "
                        f"({t0:.2f}-{t1:.2f} s) in {stage}{why}; {effect_text(eff)}"
                    ),
                    evidence=tuple(ev_list),
                    recommendation=JUMP_ADVICE,
                    source=r.source,
                    details={"spike": _spike_dict(sp), "stage": stage, "effect": eff},
                )
            )
    rest = [ev for ev in events if ev[0] not in explained]
    if len(caused) + len(rest) > MAX_EVENT_FINDINGS:
        out += _recompile_findings(r, prof, caused, shapes, rest)
        rest = []
    else:
        out += _recompile_findings(r, prof, caused, shapes)
    pause, stalls = find_stalls(prof, _explained_by_compiles(events) | shifted)
    if pause is not None:
        out.append(_pause_finding(r, prof, pause))
    if stalls and _stalls_matter(prof, stalls):
        out.append(_stall_finding(r, prof, stalls))
    if rest:
        where = ", ".join(f"iteration {ev[0]} (shape {shape_text(ev[2])})" for ev in rest[:MAX_STALLS_LISTED])
        eff = effect(e2e, [ev[0] for ev in rest], _compile_excess(prof, [ev[0] for ev in rest]))
        out.append(
            Finding(
                rule="recompilation",
                severity="warning",
                title=f"recompiled {sum(ev[1] for ev in rest)} time(s) during the timed run: {where}; "
                f"{effect_text(eff)}",
                evidence=tuple(_event_evidence(ev, prof) for ev in rest[:MAX_STALLS_LISTED]),
                recommendation=RECOMPILE_ADVICE,
                source=r.source,
                details={"compile_iterations": [ev[0] for ev in rest], "effect": eff},
            )
        )
    return out


def _recompile_findings(
    r: LoadedResult,
    prof: ProfileResult,
    caused: list[tuple[stats.Spike, tuple[int, int, Any, float | None], list[Evidence]]],
    shapes: tuple[Any, ...] | None,
    uncovered: list[tuple[int, int, Any, float | None]] | None = None,
) -> list[Finding]:
    """One critical finding per compile event a spike holds; with ``uncovered`` (events no spike holds), one
    finding for all of them (used when there are more than MAX_EVENT_FINDINGS)."""
    e2e = prof.end_to_end_ns()
    out = []
    if uncovered is not None:
        events = sorted([ev for _, ev, _ in caused] + uncovered)
        its = [ev[0] for ev in events]
        eff = effect(e2e, its, _compile_excess(prof, its))
        stage, _, _ = _guilty_stage(prof, its[0], its[0] + 1)
        gaps = np.diff(its)
        every = f", every ~{int(np.median(gaps))} iterations" if gaps.size else ""
        shown = ", ".join(f"{ev[0]} ({shape_text(ev[2])})" for ev in events[:4])
        worst = float(np.max(e2e[its])) / float(np.median(e2e))
        return [
            Finding(
                rule="recompilation",
                severity="critical" if caused else "warning",
                title=(
                    f"recompiled {len(its)} times in {stage} (iterations {shown}{', ...' if len(its) > 4 else ''}"
                    f"{every}): up to x{worst:.0f} the median; {effect_text(eff)}"
                ),
                evidence=(
                    Evidence("stage", stage),
                    Evidence("compile iterations", iteration_list(its, 20)),
                    *(_event_evidence(ev, prof) for ev in events[:MAX_STALLS_LISTED]),
                    Evidence("share of end-to-end time", round(100 * eff["share"], 2), "%"),
                    Evidence("share of the p99 tail", round(100 * eff["tail_share"], 1), "%"),
                    Evidence("p99 without them", round(eff["p99_without_ms"], 3), "ms"),
                ),
                recommendation=RECOMPILE_ADVICE,
                source=r.source,
                details={"compile_iterations": its, "stage": stage, "effect": eff},
            )
        ]
    for sp, ev, common in caused:
        # One finding per compile event: each recompilation is its own cause, even when the detector saw one
        # long excursion holding several (a slower shape between them keeps the latency up).
        prev = shapes[ev[0] - 1] if shapes is not None and ev[0] > 0 else None
        eff = effect(e2e, [ev[0]], _compile_excess(prof, [ev[0]]))
        ev_list = [
            *common,
            _event_evidence(ev, prof),
            Evidence("share of end-to-end time", round(100 * eff["share"], 2), "%"),
            Evidence("share of the p99 tail", round(100 * eff["tail_share"], 1), "%"),
        ]
        if prev is not None:
            ev_list.append(Evidence("shape before", shape_text(prev)))
        et0, _ = time_range_s(prof, ev[0], ev[0] + 1)
        stage, _, _ = _guilty_stage(prof, ev[0], ev[0] + 1)
        out.append(
            Finding(
                rule="recompilation",
                severity="critical",
                title=f"recompiled at iteration {ev[0]} (shape {shape_text(ev[2])}): latency x{sp.ratio:.0f}"
                f" at {et0:.2f} s into the run, in {stage}; {effect_text(eff)}",
                evidence=tuple(ev_list),
                recommendation=RECOMPILE_ADVICE,
                source=r.source,
                details={"spike": _spike_dict(sp), "compile_iterations": [ev[0]], "stage": stage, "effect": eff},
            )
        )
    return out


def _event_evidence(ev: tuple[int, int, Any, float | None], prof: ProfileResult) -> Evidence:
    i, count, shape, secs = ev
    t0, t1 = time_range_s(prof, i, i + 1)
    what = f"{count} compile(s), shape {shape_text(shape)}"
    if secs is not None:
        what += f", {secs * 1e3:.1f} ms compiling"
    return Evidence(f"compile event at iteration {i}", what, "", t0, t1)


def _spike_dict(sp: stats.Spike) -> dict[str, Any]:
    return {"start": sp.start, "end": sp.end, "at_s": sp.at_s, "ratio": sp.ratio, "kind": sp.kind}


def _load_findings(r: LoadedResult) -> list[Finding]:
    tl = [t for t in r.doc.get("timeline", []) if t.get("p50_ms") is not None]
    if len(tl) < 10:
        return []
    p50 = np.asarray([float(t["p50_ms"]) for t in tl])
    starts = np.asarray([float(t["t_s"]) * 1e9 for t in tl])
    step = float(np.median(np.diff(starts))) / 1e9 if len(starts) > 1 else 1.0
    out = []
    for sp in stats.detect_spikes(p50, starts, window=max(2, len(tl) // 10)):
        if sp.kind != "level-shift":
            continue
        t0, t1 = float(tl[sp.start]["t_s"]), float(tl[sp.end - 1]["t_s"]) + step
        out.append(
            Finding(
                rule="latency-jump",
                severity="critical" if sp.ratio >= 2 else "warning",
                title=f"p50 latency jumped x{sp.ratio:.1f} between {t0:.0f} s and {t1:.0f} s of the load run",
                evidence=(
                    Evidence(
                        "p50 inside the jump (median)", round(float(np.median(p50[sp.start : sp.end])), 3), "ms", t0, t1
                    ),
                    Evidence("p50 baseline (median of intervals)", round(float(np.median(p50)), 3), "ms"),
                ),
                recommendation=JUMP_ADVICE,
                source=r.source,
                details={"spike": _spike_dict(sp)},
            )
        )
    return out


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r, prof in profiles(results):
        out += _profile_findings(r, prof)
    for r in of_kind(results, "load"):
        out += _load_findings(r)
    return out
