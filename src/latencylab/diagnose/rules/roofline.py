"""Rule: place every timed variant of an ``optimize`` result on this machine's roofline.

Each variant's p50 forward time, the FLOPs of the shapes it really ran (a variant that trims padding is
credited with the real tokens only) and the bytes its dtype moves give achieved GFLOP/s and arithmetic
intensity; the measured roofs (cached per machine by :mod:`latencylab.roofline.peaks`) give the attainable
rate. One finding per optimize result: how far each variant is from its roof, which roof binds it, and the
lever to pull; a variant above its roof is flagged as the measurement error it is. The roofs are this
machine's: a result recorded elsewhere is placed under the wrong roofs, which the finding says when the
result's CPU model differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from latencylab.errors import LatencyLabError
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult

RULE = "roofline"


def _optimize_docs(results: Sequence[LoadedResult]) -> list[LoadedResult]:
    return [r for r in results if r.kind == "optimize" or r.doc.get("kind") == "optimize"]


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r in _optimize_docs(results):
        workload = str((r.doc.get("config") or {}).get("workload", ""))
        if workload not in ("text", "vision"):
            continue  # an ONNX file's workload: its model is not at hand to count FLOPs
        try:
            from latencylab.roofline.api import place_optimize_result

            points = place_optimize_result(r.doc)
        except (LatencyLabError, ImportError, OSError) as exc:
            out.append(
                Finding(
                    rule=RULE,
                    severity="info",
                    title=f"roofline: the optimize variants could not be placed ({type(exc).__name__})",
                    evidence=(Evidence("reason", str(exc).splitlines()[0] if str(exc) else type(exc).__name__),),
                    recommendation="install the text/vision extras (torch, transformers) to count the model's FLOPs",
                    source=r.source,
                )
            )
            continue
        if points:
            out.append(_finding(r, workload, points))
    return out


def _finding(r: LoadedResult, workload: str, points: Sequence[Any]) -> Finding:
    """One finding for the document's points; the headline is the chosen variant (else the fastest).

    A point above its roof (``valid`` False: achieved > MAX_SHARE x attainable) is a measurement error: its
    evidence says so instead of giving a share, it never heads the finding as a figure, and the finding is a
    warning, since the roofline of that document cannot be trusted as it stands."""
    from latencylab.roofline.model import MAX_SHARE

    chosen = ((r.doc.get("summary") or {}).get("chosen") or {}).get("name")
    ev = []
    for p in points:
        unit = "GOP/s" if p.dtype == "int8" else "GFLOP/s"
        label = (
            f"{p.name} ({p.dtype}, {p.bound}-bound, {p.intensity:.1f} FLOP/B, {p.flops / 1e9:.3g} GFLOP per call): "
            f"achieved of attainable {p.attainable_gflops:.1f} {unit}; lever {p.lever}"
        )
        if p.valid:
            ev.append(Evidence(label, round(p.pct_of_attainable, 4), "fraction"))
        else:
            ev.append(Evidence(label, p.share_text()))
    recorded = ((r.doc.get("env") or {}).get("cpu") or {}).get("model")
    from latencylab.roofline.theory import read_cpu

    here = read_cpu().model_name
    caveat = f" (recorded on {recorded!r}, roofs measured on {here!r})" if recorded and recorded != here else ""
    head = next((p for p in points if p.name == chosen), None) or min(points, key=lambda p: p.seconds)
    role = "chosen" if head.name == chosen else "fastest"
    unit = "GOP/s" if head.dtype == "int8" else "GFLOP/s"
    bad = [p for p in points if not p.valid]
    if head.valid:
        title = (
            f"{workload} optimize variants on the roofline: {role} {head.name} at {head.achieved_gflops:.1f} "
            f"{unit} = {head.share_text()} of its attainable {head.attainable_gflops:.1f}{caveat}"
        )
    else:
        title = (
            f"{workload} optimize variants on the roofline: {role} {head.name} measures above its roof "
            f"({head.achieved_gflops:.1f} {unit} against an attainable {head.attainable_gflops:.1f}): a measurement "
            f"error, not a share of the roof{caveat}"
        )
    if bad:
        title += (
            f"; {len(bad)} of {len(points)} variants above their roof (achieved > {MAX_SHARE:g}x attainable): "
            "measurement errors"
        )
    far = [p for p in points if p.pct_of_attainable < 0.3]
    recommendation = f"{head.name}: {head.lever}: {head.lever_reason}"
    if bad and head.valid:
        recommendation += (
            f". {', '.join(p.name for p in bad[:5])}{' ...' if len(bad) > 5 else ''}: achieved above the roof is a "
            "measurement error (the work credited, the time or the measured peak is wrong): re-measure the peaks "
            "with refresh=True on an idle machine"
        )
    return Finding(
        rule=RULE,
        severity="warning" if bad or len(far) == len(points) else "info",
        title=title,
        evidence=tuple(ev),
        recommendation=recommendation,
        source=r.source,
        details={"points": [p.to_dict() for p in points]},
    )
