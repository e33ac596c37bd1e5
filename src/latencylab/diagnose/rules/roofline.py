"""Rule: place every timed variant of an ``optimize`` result on this machine's roofline.

Each variant's p50 forward time, the baseline model's FLOPs (every variant computes the same function) and
the bytes its dtype moves give achieved GFLOP/s and arithmetic intensity; the measured roofs (cached per
machine by :mod:`latencylab.roofline.peaks`) give the attainable rate. One finding per optimize result: how
far each variant is from its roof, which roof binds it, and the lever to pull. The roofs are this machine's:
a result recorded elsewhere is placed under the wrong roofs, which the finding says when the result's CPU
model differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from latencylab.diagnose.types import Evidence, Finding, LoadedResult
from latencylab.errors import LatencyLabError

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
    best = max(points, key=lambda p: p.achieved_gflops)
    ev = []
    for p in points:
        unit = "GOP/s" if p.dtype == "int8" else "GFLOP/s"
        ev.append(
            Evidence(
                f"{p.name} ({p.dtype}, {p.bound}-bound, {p.intensity:.1f} FLOP/B): achieved of attainable "
                f"{p.attainable_gflops:.1f} {unit}; lever {p.lever}",
                round(p.pct_of_attainable, 4),
                "fraction",
            )
        )
    recorded = ((r.doc.get("env") or {}).get("cpu") or {}).get("model")
    from latencylab.roofline.theory import read_cpu

    here = read_cpu().model_name
    caveat = f" (recorded on {recorded!r}, roofs measured on {here!r})" if recorded and recorded != here else ""
    far = [p for p in points if p.pct_of_attainable < 0.3]
    return Finding(
        rule=RULE,
        severity="warning" if len(far) == len(points) else "info",
        title=(
            f"{workload} optimize variants on the roofline: fastest {best.name} at {best.achieved_gflops:.1f} "
            f"GFLOP/s = {best.pct_of_attainable:.0%} of its attainable {best.attainable_gflops:.1f}{caveat}"
        ),
        evidence=tuple(ev),
        recommendation=f"{best.name}: {best.lever}: {best.lever_reason}",
        source=r.source,
        details={"points": [p.to_dict() for p in points]},
    )
