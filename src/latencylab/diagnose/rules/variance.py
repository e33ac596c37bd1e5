"""Rule ``unstable-explained``: how much of a profile's spread the input explains, and how much is noise.

The profiler warns "unstable" when the end-to-end IQR exceeds 10% of the median (``stats.IQR_WARN``).
On a workload whose inputs differ in size (text: token counts) much of that spread is the work itself,
not noise; on a multi-run profile part of it is the machine moving between runs. This rule separates them.

Figures, over the end-to-end latency ``y`` of every timed iteration:

* **input size** per iteration: the sum of ``iteration_meta.lengths`` (real tokens per item) when the
  pipeline recorded them, else the product of ``iteration_meta.shape``.
* **input fit** f(size): least squares of ``y`` on (1, size, size^2), refitted once without the iterations
  whose residual exceeds 3 x 1.4826 x MAD (a preempted iteration must not bend the curve).
* **explained by input** = 1 - IQR(y - f(size)) / IQR(y), clipped to [0, 1].
* **explained by runs** (``profile --runs N``): of what the input leaves, 1 - IQR(r - median of r in its
  run) / IQR(y), where r = y - f(size) (or y without input sizes).
* **noise** = the IQR of what is left, as a share of the median.

Fires when IQR(y) / median(y) > ``IQR_WARN`` and the input or the runs are known; warning when the noise
alone still exceeds ``IQR_WARN``, info otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from latencylab.diagnose.rules.common import meta_column, pct, profiles
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult, ProfileResult
from latencylab.stats import IQR_WARN

RULE = "unstable-explained"
MIN_DISTINCT = 3  # distinct input sizes needed to fit a curve


def input_sizes(prof: ProfileResult) -> tuple[npt.NDArray[np.float64], str] | None:
    """Per-iteration input size and what it counts, or None when the run recorded none."""
    lengths = meta_column(prof, "lengths")
    if lengths is not None and all(isinstance(v, (list, tuple)) for v in lengths):
        return np.array([float(sum(v)) for v in lengths]), "input length (tokens)"
    shapes = meta_column(prof, "shape")
    if shapes is not None and all(isinstance(v, (list, tuple)) and v for v in shapes):
        return np.array([float(math.prod(int(x) for x in v)) for v in shapes]), "input size (elements of its shape)"
    return None


def _iqr(x: npt.NDArray[np.float64]) -> float:
    q1, q3 = np.quantile(x, [0.25, 0.75])
    return float(q3 - q1)


def fit_residuals(size: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """y minus the robust quadratic fit on size (see the module docstring)."""
    scale = float(np.max(np.abs(size))) or 1.0
    x = size / scale
    design = np.stack([np.ones_like(x), x, x * x], axis=1)
    keep = np.ones(y.size, dtype=bool)
    for _ in range(2):
        coef, *_ = np.linalg.lstsq(design[keep], y[keep], rcond=None)
        resid = y - design @ coef
        mad = float(np.median(np.abs(resid - np.median(resid))))
        keep = np.abs(resid - np.median(resid)) <= 3 * 1.4826 * mad if mad > 0 else np.ones(y.size, dtype=bool)
    return np.asarray(resid, dtype=np.float64)


def explain(prof: ProfileResult) -> dict[str, Any] | None:
    """The figures of the module docstring, or None when the run is stable or nothing can explain it."""
    y = prof.end_to_end_ns().astype(np.float64)
    med = float(np.median(y))
    spread = _iqr(y)
    if y.size < 20 or med <= 0 or spread / med <= IQR_WARN:
        return None
    out: dict[str, Any] = {"iqr_rel": spread / med, "median_ms": med / 1e6, "n": int(y.size)}
    rest = y
    sizes = input_sizes(prof)
    if sizes is not None and np.unique(sizes[0]).size >= MIN_DISTINCT:
        rest = fit_residuals(sizes[0], y)
        out["input"] = sizes[1]
        out["explained_input"] = min(1.0, max(0.0, 1.0 - _iqr(rest) / spread))
        corr = np.corrcoef(sizes[0], y)[0, 1]
        out["correlation"] = float(corr) if np.isfinite(corr) else 0.0
    if prof.n_runs >= 2:
        run = prof.run_index()
        medians = np.array([np.median(rest[run == r]) for r in range(prof.n_runs)])
        within = rest - medians[run]
        out["explained_runs"] = min(1.0, max(0.0, (_iqr(rest) - _iqr(within)) / spread))
        out["runs"] = prof.n_runs
        rest = within
    if "explained_input" not in out and "explained_runs" not in out:
        return None
    out["noise_rel"] = _iqr(rest) / med
    return out


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    findings = []
    for r, prof in profiles(results):
        fig = explain(prof)
        if fig is None:
            continue
        parts = []
        ev = [Evidence("end-to-end IQR / median", pct(fig["iqr_rel"]), "%"), Evidence("iterations", fig["n"])]
        if "explained_input" in fig:
            parts.append(f"{fig['explained_input']:.0%} explained by {fig['input'].split(' (')[0]}")
            ev.append(Evidence(f"explained by {fig['input']}", pct(fig["explained_input"]), "%"))
            ev.append(Evidence("correlation of latency with input size", round(fig["correlation"], 3)))
        if "explained_runs" in fig:
            parts.append(f"{fig['explained_runs']:.0%} by differences between its {fig['runs']} runs")
            ev.append(Evidence("explained by the run (machine drift between runs)", pct(fig["explained_runs"]), "%"))
        ev.append(Evidence("left unexplained (noise): IQR / median", pct(fig["noise_rel"]), "%"))
        noisy = fig["noise_rel"] > IQR_WARN
        if noisy:
            rec = (
                f"the unexplained spread (IQR {fig['noise_rel']:.0%} of the median) is the machine or the process, "
                "not the input: check `latencylab env` and the canary, measure on a quieter machine, and compare "
                "interleaved (`latencylab compare --run A B`)"
            )
        else:
            rec = (
                "the spread is mostly the work itself: compare like with like (the same inputs on both sides, as "
                "profile and compare --run do), and watch per-size latency rather than the overall IQR"
            )
        findings.append(
            Finding(
                rule=RULE,
                severity="warning" if noisy else "info",
                title=f"unstable: IQR {fig['iqr_rel']:.0%} of the median, of which " + " and ".join(parts),
                evidence=tuple(ev),
                recommendation=rec,
                source=r.source,
                details={k: v for k, v in fig.items() if isinstance(v, (int, float, str))},
            )
        )
    return findings
