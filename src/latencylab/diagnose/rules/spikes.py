"""Rule: latency suddenly jumps (level shift) or stalls mid-run, and whether a recompilation explains it.

Uses :func:`latencylab.stats.detect_spikes` on the end-to-end series of a profile (and on the per-interval
p50 of a load timeline). When the profile carries per-iteration compile events (``iteration_meta.compiles``,
written by a pipeline probe such as the ``compiled`` workload's, from TorchDynamo's counters), a spike that
starts within one iteration of a compile event is attributed to it: "recompiled at iteration N (shape X)".
Compile events in the timed run that no spike covers are reported too: each one is a stall waiting to
happen on the next new shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from latencylab import stats
from latencylab.diagnose.rules.common import meta_column, ms, of_kind, profiles, shape_text, time_range_s
from latencylab.diagnose.types import Evidence, Finding, LoadedResult
from latencylab.results import ProfileResult

MAX_STALLS_LISTED = 5

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


def _profile_findings(r: LoadedResult, prof: ProfileResult) -> list[Finding]:
    e2e = prof.end_to_end_ns()
    spikes = stats.detect_spikes(e2e, prof.iteration_start_ns)
    events = _compile_events(prof)
    shapes = meta_column(prof, "shape")
    baseline = float(np.median(e2e))
    explained: set[int] = set()
    out: list[Finding] = []
    stalls: list[stats.Spike] = []
    for sp in spikes:
        cause = [ev for ev in events if sp.start - 1 <= ev[0] < sp.end + 1]
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
            # One finding per compile event: each recompilation is its own cause, even when the detector saw one
            # long excursion holding several (a slower shape between them keeps the latency up).
            for ev in cause:
                prev = shapes[ev[0] - 1] if shapes is not None and ev[0] > 0 else None
                ev_list = [*common, _event_evidence(ev, prof)]
                if prev is not None:
                    ev_list.append(Evidence("shape before", shape_text(prev)))
                et0, _ = time_range_s(prof, ev[0], ev[0] + 1)
                out.append(
                    Finding(
                        rule="recompilation",
                        severity="critical",
                        title=f"recompiled at iteration {ev[0]} (shape {shape_text(ev[2])}): latency x{sp.ratio:.0f}"
                        f" at {et0:.2f} s into the run",
                        evidence=tuple(ev_list),
                        recommendation=RECOMPILE_ADVICE,
                        source=r.source,
                        details={"spike": _spike_dict(sp), "compile_iterations": [ev[0]]},
                    )
                )
        elif sp.kind == "level-shift":
            ev_list = list(common)
            why = ""
            if shapes is not None and 0 < sp.start < len(shapes) and shapes[sp.start] != shapes[sp.start - 1]:
                change = f"{shape_text(shapes[sp.start - 1])} -> {shape_text(shapes[sp.start])}"
                why = f"; the input shape changed {change}"
                ev_list.append(Evidence("input shape", change))
            out.append(
                Finding(
                    rule="latency-jump",
                    severity="critical" if sp.ratio >= 2 else "warning",
                    title=(
                        f"latency jumped x{sp.ratio:.1f} over iterations {sp.start}-{sp.end - 1} "
                        f"({t0:.2f}-{t1:.2f} s){why}"
                    ),
                    evidence=tuple(ev_list),
                    recommendation=JUMP_ADVICE,
                    source=r.source,
                    details={"spike": _spike_dict(sp)},
                )
            )
        else:
            stalls.append(sp)
    if stalls:
        worst = max(stalls, key=lambda s: s.ratio)
        ev_list = []
        for sp in sorted(stalls, key=lambda s: -s.ratio)[:MAX_STALLS_LISTED]:
            t0, t1 = time_range_s(prof, sp.start, sp.end)
            ev_list.append(
                Evidence(f"stall at iteration {sp.start}", round(float(e2e[sp.start]) / 1e6, 3), "ms", t0, t1)
            )
        ev_list.append(Evidence("baseline end-to-end median", ms(baseline), "ms"))
        out.append(
            Finding(
                rule="stall",
                severity="warning",
                title=f"{len(stalls)} isolated stall(s), worst x{worst.ratio:.0f} the median (iteration {worst.start})",
                evidence=tuple(ev_list),
                recommendation=STALL_ADVICE,
                source=r.source,
                details={"stalls": [_spike_dict(sp) for sp in stalls]},
            )
        )
    rest = [ev for ev in events if ev[0] not in explained]
    if rest:
        where = ", ".join(f"iteration {ev[0]} (shape {shape_text(ev[2])})" for ev in rest[:MAX_STALLS_LISTED])
        out.append(
            Finding(
                rule="recompilation",
                severity="warning",
                title=f"recompiled {sum(ev[1] for ev in rest)} time(s) during the timed run: {where}",
                evidence=tuple(_event_evidence(ev, prof) for ev in rest[:MAX_STALLS_LISTED]),
                recommendation=RECOMPILE_ADVICE,
                source=r.source,
                details={"compile_iterations": [ev[0] for ev in rest]},
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
