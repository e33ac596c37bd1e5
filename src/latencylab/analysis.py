"""Derived figures of a profile result: per-stage summaries, shares, spikes, warnings.

Pure: reads a ProfileResult, computes with ``stats``, touches nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from latencylab import stats
from latencylab.results import ProfileResult

END_TO_END = "end_to_end"
SUMMARY_QUANTILES: tuple[float, ...] = stats.DEFAULT_QUANTILES


@dataclass(frozen=True, slots=True)
class StageAnalysis:
    name: str
    kind: str
    summary: stats.Summary  # in ns
    share: float  # of end-to-end time, sum over the run


@dataclass(frozen=True, slots=True)
class ProfileAnalysis:
    stages: tuple[StageAnalysis, ...]
    end_to_end: StageAnalysis
    spikes: tuple[stats.Spike, ...]
    warnings: tuple[str, ...]

    def summary_dict(self) -> dict[str, Any]:
        """The documented top-level ``summary`` object (docs/metrics.md)."""

        def one(sa: StageAnalysis) -> dict[str, Any]:
            s = sa.summary
            d: dict[str, Any] = {
                "kind": sa.kind,
                "n": s.n,
                "share": round(sa.share, 6),
                "mean_ms": s.mean / 1e6,
                "std_ms": s.std / 1e6,
                "min_ms": s.min / 1e6,
                "max_ms": s.max / 1e6,
                "iqr_ms": s.iqr / 1e6,
                **stats.quantiles_ms(s),
            }
            return d

        return {
            "unit": "ms",
            "ci": {
                "confidence": self.end_to_end.summary.confidence,
                "method": self.end_to_end.summary.ci_method,
            },
            "end_to_end": one(self.end_to_end),
            "stages": {sa.name: one(sa) for sa in self.stages},
            "spikes": [
                {"start": sp.start, "end": sp.end, "at_s": sp.at_s, "ratio": sp.ratio, "kind": sp.kind}
                for sp in self.spikes
            ],
            "warnings": list(self.warnings),
        }


def analyze(
    result: ProfileResult,
    qs: Sequence[float] = SUMMARY_QUANTILES,
    confidence: float = 0.95,
    n_boot: int = 1000,
) -> ProfileAnalysis:
    e2e = result.end_to_end_ns()
    total = float(e2e.sum())
    stage_analyses = []
    for st in result.stages:
        arr = st.array()
        summ = stats.summarize(arr, qs, confidence, n_boot, label=st.name)
        stage_analyses.append(StageAnalysis(st.name, st.kind, summ, stats.share(float(arr.sum()), total)))
    e2e_summary = stats.summarize(e2e, qs, confidence, n_boot, label="end-to-end")
    spikes = tuple(stats.detect_spikes(e2e, result.iteration_start_ns))
    # Stage-level instability is detail; the run-level warnings are end-to-end's plus spikes.
    warnings = list(e2e_summary.warnings)
    warnings += [f"end-to-end: {sp.describe()}" for sp in spikes]
    return ProfileAnalysis(
        stages=tuple(stage_analyses),
        end_to_end=StageAnalysis(END_TO_END, "total", e2e_summary, 1.0),
        spikes=spikes,
        warnings=tuple(warnings),
    )


def save_profile(result: ProfileResult, path: str | Path, analysis: ProfileAnalysis | None = None) -> Path:
    """The profile result's writer: ``result`` with its summary (``analysis``, computed now when not given)."""
    return result.save(path, summary=(analysis or analyze(result)).summary_dict())
