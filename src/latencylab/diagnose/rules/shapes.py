"""Rule: batching is inefficient because input shapes vary too much (padding waste, many distinct shapes).

Data: a profile whose pipeline probe recorded per-iteration ``shape`` (the padded shape the model ran on)
and optionally ``lengths`` (the real length of each item; the text workload records both), or the shape
policy experiment (kind ``shape-policy``, ``latencylab experiment``).

Figures: *padding waste* = padded positions per real position, sum(padded - real) / sum(real) (as in the
shape-policy experiment). For a profile run one item at a time the current waste can be 0 while the
shapes still vary; batching those inputs in arrival order, ``BATCH`` at a time, padded to the longest, is
what a plain dynamic batcher would do, so that waste is reported too. The recommended bucket edges come
from :func:`latencylab.optimize.buckets.choose_buckets` (min-waste, 3 edges, 95% of inputs fit the
largest, rounded up to multiples of 8) plus a last bucket at the longest length seen; the waste they leave
is each item padded to its bucket.

*Cost of the padding* (when the run recorded real lengths): the time of the stage that ran on the padded
input (``pipeline.observed.shape_stage``, recorded by the profiler, else the first ``forward`` stage) is fitted
against the padded positions per iteration (batch x padded length): a least-squares line through the medians of
8 equal-size groups of iterations ordered by padded positions (robust to a preempted iteration); the slope times the
padded-minus-real positions of the run is the time spent on padding, reported as a share of that stage and of
end-to-end time, with the fit's R^2 (not reported when the slope is not positive or R^2 < 0.2).

The shapes and lengths come from the profiler itself (``latencylab.autoprobe``: the stage input's array, a
tokenizer output's ``attention_mask``) or from a pipeline probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from latencylab.diagnose.rules.common import meta_column, of_kind, profiles
from latencylab.findings import Evidence, Finding
from latencylab.optimize.buckets import bucket_for, choose_buckets
from latencylab.results import LoadedResult, ProfileResult

RULE = "shape-variance"
BATCH = 8
MIN_CV = 0.3  # coefficient of variation of the lengths
MIN_WASTE = 0.25  # padded positions per real one
MIN_DISTINCT = 8  # distinct shapes: each is a recompile / engine profile for static-shape compilers
COVERAGE = 0.95
FIT_BINS = 8


def _seq_dim(shapes: Sequence[Sequence[int]]) -> int | None:
    """Index of the first non-batch dimension that varies over the run (else 1 when shapes have one)."""
    dims = {len(s) for s in shapes}
    if len(dims) != 1:
        return None
    ndim = dims.pop()
    for d in range(1, ndim):
        if len({int(s[d]) for s in shapes}) > 1:
            return d
    return 1 if ndim >= 2 else None


def _waste(real: Sequence[int], padded: Sequence[int]) -> float:
    tot = sum(real)
    return (sum(padded) - tot) / tot if tot > 0 else 0.0


def _batched_waste(lengths: Sequence[int], batch: int) -> float:
    padded = []
    for i in range(0, len(lengths), batch):
        chunk = lengths[i : i + batch]
        padded += [max(chunk)] * len(chunk)
    return _waste(lengths, padded)


def _shape_stage(prof: ProfileResult) -> str | None:
    observed = (prof.pipeline.get("observed") or {}).get("shape_stage")
    if observed in prof.stage_names:
        return str(observed)
    return next((s.name for s in prof.stages if s.kind == "forward"), None)


def _padding_cost(prof: ProfileResult, padded_pos: np.ndarray, real_pos: np.ndarray) -> dict[str, Any] | None:
    stage = _shape_stage(prof)
    if stage is None or padded_pos.size < 10 or np.ptp(padded_pos) == 0:
        return None
    t = prof.stage(stage).array().astype(np.float64)
    # robust to preemption outliers: a line through the medians of FIT_BINS groups of equal size (by positions)
    order = np.argsort(padded_pos, kind="stable")
    groups = [g for g in np.array_split(order, FIT_BINS) if g.size]
    bx = np.asarray([np.median(padded_pos[g]) for g in groups])
    by = np.asarray([np.median(t[g]) for g in groups])
    if np.unique(bx).size < 3:
        return None
    slope, icpt = np.polyfit(bx, by, 1)
    ss = float(((by - by.mean()) ** 2).sum())
    r2 = 1.0 - float(((by - (slope * bx + icpt)) ** 2).sum()) / ss if ss > 0 else 0.0
    if slope <= 0 or r2 < 0.2:
        return None
    pad_ns = float(slope * (padded_pos - real_pos).clip(0).sum())
    return {
        "stage": stage,
        "ns_per_position": float(slope),
        "r2": r2,
        "stage_share": pad_ns / float(t.sum()),
        "share": pad_ns / float(prof.end_to_end_ns().sum()),
    }


def _profile_finding(
    r: LoadedResult, prof: ProfileResult, shapes_col: Sequence[Any], lengths_col: Sequence[Any] | None
) -> Finding | None:
    shapes = [list(s) for s in shapes_col if isinstance(s, (list, tuple))]
    if len(shapes) != len(shapes_col) or len(shapes) < 2:
        return None
    d = _seq_dim(shapes)
    if d is None:
        return None
    padded_per_iter = [int(s[d]) for s in shapes]
    cost = None
    if lengths_col is not None and all(isinstance(v, (list, tuple)) for v in lengths_col):
        real = [int(x) for lens in lengths_col for x in lens]
        padded = [p for p, lens in zip(padded_per_iter, lengths_col, strict=True) for _ in lens]
        padded_pos = np.asarray([p * len(lens) for p, lens in zip(padded_per_iter, lengths_col, strict=True)], float)
        cost = _padding_cost(prof, padded_pos, np.asarray([sum(lens) for lens in lengths_col], float))
    else:
        batch = int(shapes[0][0]) if d != 0 else 1
        real = [p for p in padded_per_iter for _ in range(batch)]
        padded = list(real)
    arr = np.asarray(real, dtype=np.float64)
    if arr.size < 2 or arr.min() < 1:
        return None
    cv = float(arr.std() / arr.mean())
    distinct = len({tuple(s) for s in shapes})
    current = _waste(real, padded)
    naive = _batched_waste(real, BATCH)
    if cv < MIN_CV or not (current >= MIN_WASTE or naive >= MIN_WASTE or distinct >= MIN_DISTINCT):
        return None
    edges = choose_buckets(real, coverage=COVERAGE, k=3, multiple=8)
    longest = int(arr.max())
    cap = max(longest, edges[-1])
    bucketed = _waste(real, [bucket_for(x, edges, cap) for x in real])
    q = np.quantile(arr, [0.5, 0.9])
    if current >= MIN_WASTE:
        what = f"padding wastes {current:.2f} padded positions per real one"
    else:
        what = f"batching {BATCH} at a time padded to the longest would waste {naive:.2f} per real position"
    stage = _shape_stage(prof)
    where = f" into {stage}" if stage else ""
    title = (
        f"input lengths{where} vary {int(arr.min())}-{longest} (p50 {q[0]:.0f}, p90 {q[1]:.0f}, {distinct} distinct "
        f"shapes over {len(shapes)} iterations): {what}; buckets {edges} cut it to {bucketed:.2f}"
    )
    cost_ev: tuple[Evidence, ...] = ()
    if cost is not None:
        title += (
            f"; padding costs ~{cost['stage_share']:.0%} of {cost['stage']} time ({cost['share']:.1%} of end-to-end)"
        )
        cost_ev = (
            Evidence("stage that runs on the padded input", cost["stage"]),
            Evidence(f"{cost['stage']} time per padded position (fit)", round(cost["ns_per_position"] / 1e3, 4), "us"),
            Evidence("fit R^2", round(cost["r2"], 3)),
            Evidence(f"time spent on padding, share of {cost['stage']}", round(100 * cost["stage_share"], 1), "%"),
            Evidence("time spent on padding, share of end-to-end", round(100 * cost["share"], 1), "%"),
        )
    return Finding(
        rule=RULE,
        severity="warning",
        title=title,
        evidence=(
            Evidence("length min / p50 / p90 / max", f"{int(arr.min())} / {q[0]:.0f} / {q[1]:.0f} / {longest}"),
            Evidence("length coefficient of variation", round(cv, 3)),
            Evidence("distinct input shapes", distinct),
            Evidence("padding waste as run", round(current, 3), "padded/real"),
            Evidence(f"padding waste batching {BATCH} in arrival order", round(naive, 3), "padded/real"),
            Evidence(f"padding waste with buckets {edges}", round(bucketed, 3), "padded/real"),
            *cost_ev,
        ),
        recommendation=(
            f"group inputs into length buckets with edges {edges} plus a last bucket at the maximum length ({cap} "
            f"here; {COVERAGE:.0%} of these inputs fit the edges) and batch within a bucket: padding waste "
            f"{bucketed:.2f} instead of "
            f"{max(current, naive):.2f}; static-shape compilers (torch.compile dynamic=False, TensorRT optimisation "
            f"profiles) then see {len(edges) + 1} shapes instead of {distinct}; "
            "`latencylab experiment` measures fixed vs exact vs bucketed padding"
        ),
        source=r.source,
        details={
            "edges": edges,
            "waste": current,
            "waste_batched": naive,
            "waste_bucketed": bucketed,
            "cv": cv,
            "cost": cost,
            "iterations": len(shapes),
        },
    )


def _policy_finding(r: LoadedResult) -> Finding | None:
    doc = r.doc
    pols = {str(p["name"]): p for p in doc.get("policies", [])}
    fixed = next((p for n, p in pols.items() if n.startswith("fixed")), None)
    if fixed is None or float(fixed.get("padded_per_real_token", 0.0)) < MIN_WASTE:
        return None
    edges = list(doc.get("bucket_edges", []))
    ev = []
    for name, p in pols.items():
        ev.append(Evidence(f"{name}: padded per real token", round(float(p["padded_per_real_token"]), 3)))
        per_item = (p.get("timing") or {}).get("per_item_ms") or {}
        if per_item.get("p50") is not None:
            ev.append(Evidence(f"{name}: per-item p50", round(float(per_item["p50"]), 4), "ms"))
        ev.append(Evidence(f"{name}: distinct shapes", len(p.get("shapes", []))))
    buck = pols.get("buckets")
    after = f" (waste {float(buck['padded_per_real_token']):.2f})" if buck else ""
    return Finding(
        rule=RULE,
        severity="warning",
        title=(
            f"padding to {fixed['name'].removeprefix('fixed-')} wastes "
            f"{float(fixed['padded_per_real_token']):.2f} padded tokens per real token at batch {doc.get('batch_size')}"
        ),
        evidence=tuple(ev),
        recommendation=(
            f"pad to length buckets {edges}{after} or exactly (measured winner: {doc.get('winner')}); "
            f"{doc.get('conclusion', '')}"
        ).strip(),
        source=r.source,
        details={"edges": edges, "winner": doc.get("winner")},
    )


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r, prof in profiles(results):
        shapes = meta_column(prof, "shape")
        if shapes is None:
            continue
        f = _profile_finding(r, prof, shapes, meta_column(prof, "lengths"))
        if f is not None:
            out.append(f)
    for r in of_kind(results, "shape-policy"):
        f = _policy_finding(r)
        if f is not None:
            out.append(f)
    return out
