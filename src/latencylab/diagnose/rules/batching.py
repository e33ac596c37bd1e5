"""Rule: per-item throughput is not monotonic in batch size (a larger batch is slower per item: cache thrash).

Data: a batch sweep (kind ``sweep``, knob ``batch``) from ``latencylab.optimize.experiments.batch_sweep``.
Throughput per batch size is items/s from the p50 per-item latency (as the sweep reports it). A batch is
flagged when it is significantly slower per item than a smaller one: its p50 95% CI and the smaller
batch's do not overlap (``non_monotonic_significant``, computed by the sweep); point-estimate dips whose
CIs overlap are reported as info only.
"""

from __future__ import annotations

from collections.abc import Sequence

from latencylab.diagnose.rules.common import of_kind
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult

RULE = "batch-non-monotonic"

ADVICE = (
    "a larger batch that is slower per item usually means its working set (activations + weights) no longer "
    "fits the cache (L2/LLC conflicts and thrashing), or that the thread pool splits it badly: cap the batch at "
    "{best} (the best measured), align buffers (128-byte), try a thread count that divides the batch, and "
    "re-measure with the batch sweep after each change; throughput against batch size is not monotonic, so "
    "never assume the largest batch is the fastest"
)


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r in of_kind(results, "sweep"):
        doc = r.doc
        if doc.get("knob") != "batch":
            continue
        tput = {int(k): float(v) for k, v in (doc.get("items_per_s_from_p50") or {}).items()}
        strict = list(doc.get("non_monotonic_significant") or [])
        loose = list(doc.get("non_monotonic") or [])
        if not strict and not loose:
            continue
        best = int(doc.get("best", max(tput, key=lambda b: tput[b]) if tput else 0))
        ev = [Evidence(f"batch {b}", round(t, 1), "items/s") for b, t in sorted(tput.items())]
        ev.append(Evidence("best batch size", best))
        flags = strict or loose
        ev += [Evidence("flag", f) for f in flags]
        significant = bool(strict)
        out.append(
            Finding(
                rule=RULE,
                severity="warning" if significant else "info",
                title=(
                    f"per-item throughput drops at a larger batch ({flags[0].split(':')[0]}): "
                    + ("cache thrash likely" if significant else "within noise (p50 CIs overlap)")
                ),
                evidence=tuple(ev),
                recommendation=ADVICE.format(best=best),
                source=r.source,
                details={"items_per_s": {str(k): v for k, v in tput.items()}, "best": best, "significant": significant},
            )
        )
    return out
