"""Rule: batching is inefficient because input shapes vary too much (padding waste, many distinct shapes).

Data: a profile whose pipeline probe recorded per-iteration ``shape`` (the padded shape the model ran on)
and optionally ``lengths`` (the real length of each item; the text workload records both), or the shape
policy experiment (kind ``shape-policy``, ``python -m latencylab.optimize.experiments``).

Figures: *padding waste* = padded positions per real position, sum(padded - real) / sum(real) (as in the
shape-policy experiment). For a profile run one item at a time the current waste can be 0 while the
shapes still vary; batching those inputs in arrival order, ``BATCH`` at a time, padded to the longest, is
what a plain dynamic batcher would do, so that waste is reported too. The recommended bucket edges come
from :func:`latencylab.optimize.experiments.choose_buckets` (min-waste, 3 edges, 95% of inputs fit the
largest, rounded up to multiples of 8) plus a last bucket at the longest length seen; the waste they leave
is each item padded to its bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from latencylab.diagnose.rules.common import meta_column, of_kind, profiles
from latencylab.diagnose.types import Evidence, Finding, LoadedResult
from latencylab.optimize.experiments import bucket_for, choose_buckets

RULE = "shape-variance"
BATCH = 8
MIN_CV = 0.3  # coefficient of variation of the lengths
MIN_WASTE = 0.25  # padded positions per real one
MIN_DISTINCT = 8  # distinct shapes: each is a recompile / engine profile for static-shape compilers
COVERAGE = 0.95


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


def _profile_finding(r: LoadedResult, shapes_col: Sequence[Any], lengths_col: Sequence[Any] | None) -> Finding | None:
    shapes = [list(s) for s in shapes_col if isinstance(s, (list, tuple))]
    if len(shapes) != len(shapes_col) or len(shapes) < 2:
        return None
    d = _seq_dim(shapes)
    if d is None:
        return None
    padded_per_iter = [int(s[d]) for s in shapes]
    if lengths_col is not None and all(isinstance(v, (list, tuple)) for v in lengths_col):
        real = [int(x) for lens in lengths_col for x in lens]
        padded = [p for p, lens in zip(padded_per_iter, lengths_col, strict=True) for _ in lens]
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
    title = (
        f"input lengths vary {int(arr.min())}-{longest} (p50 {q[0]:.0f}, p90 {q[1]:.0f}, {distinct} distinct shapes): "
        f"{what}; buckets {edges} cut it to {bucketed:.2f}"
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
        ),
        recommendation=(
            f"group inputs into length buckets with edges {edges} plus a last bucket at the maximum length ({cap} "
            f"here; {COVERAGE:.0%} of these inputs fit the edges) and batch within a bucket: padding waste "
            f"{bucketed:.2f} instead of "
            f"{max(current, naive):.2f}; static-shape compilers (torch.compile dynamic=False, TensorRT optimisation "
            f"profiles) then see {len(edges) + 1} shapes instead of {distinct}; "
            "`python -m latencylab.optimize.experiments` measures fixed vs exact vs bucketed padding"
        ),
        source=r.source,
        details={"edges": edges, "waste": current, "waste_batched": naive, "waste_bucketed": bucketed, "cv": cv},
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
        f = _profile_finding(r, shapes, meta_column(prof, "lengths"))
        if f is not None:
            out.append(f)
    for r in of_kind(results, "shape-policy"):
        f = _policy_finding(r)
        if f is not None:
            out.append(f)
    return out
