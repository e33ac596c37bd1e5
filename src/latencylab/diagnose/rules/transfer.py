"""Rule: the accelerator sits idle while the pipeline is busy: host-device copies block it.

Only GPU data can show it: a profile whose pipeline device is ``cuda*`` (timed with CUDA events). Figures:
*transfer share* = share of end-to-end time in ``transfer`` stages; *accelerator busy* = total time in
``forward`` stages / the run's wall span (first iteration start to the last iteration's end), so the
accelerator is idle the rest of the time (copies, host preprocessing, gaps between iterations). The rule
fires when transfer share >= 15%, or >= 5% while the accelerator is idle more than half the time.
"""

from __future__ import annotations

from collections.abc import Sequence

from latencylab.diagnose.rules.common import pct, profiles, stage_shares
from latencylab.findings import Evidence, Finding
from latencylab.results import LoadedResult

RULE = "transfer-blocking"
MIN_SHARE = 0.15
MIN_SHARE_IF_IDLE = 0.05
IDLE = 0.5

ADVICE = (
    "host-to-device copies are on the critical path: allocate inputs in pinned (page-locked) memory and copy with "
    "non_blocking=True on a side CUDA stream, overlapped with the previous batch's compute (double buffering); "
    "send uint8 images and convert/normalise on the device (4x fewer bytes); keep tensors resident instead of "
    "copying back and forth; capture the steady-state step in a CUDA graph to remove launch gaps"
)


def rule(results: Sequence[LoadedResult]) -> list[Finding]:
    out: list[Finding] = []
    for r, prof in profiles(results):
        device = str(prof.pipeline.get("device", "cpu"))
        if not (device.startswith("cuda") or prof.clock.startswith("cuda")):
            continue
        shares = stage_shares(prof)
        transfer = [s for s in prof.stages if s.kind == "transfer"]
        t_share = sum(shares[s.name] for s in transfer)
        e2e = prof.end_to_end_ns()
        span = prof.iteration_start_ns[-1] + int(e2e[-1])
        fwd = sum(float(s.array().sum()) for s in prof.stages if s.kind == "forward")
        busy = fwd / span if span > 0 else 0.0
        if not (t_share >= MIN_SHARE or (t_share >= MIN_SHARE_IF_IDLE and busy < 1 - IDLE)):
            continue
        gaps = sum(
            int(b) - int(a) - int(d)
            for a, b, d in zip(prof.iteration_start_ns, prof.iteration_start_ns[1:], e2e, strict=False)
        )
        ev = [
            Evidence("transfer share of end-to-end", pct(t_share), "%"),
            *(Evidence(f"{s.name} mean", round(float(s.array().mean()) / 1e6, 4), "ms") for s in transfer),
            Evidence("accelerator busy (forward time / wall span)", pct(busy), "%"),
            Evidence("accelerator idle", pct(1 - busy), "%"),
            Evidence("host gaps between iterations", pct(max(gaps, 0) / span if span > 0 else 0.0), "% of span"),
        ]
        out.append(
            Finding(
                rule=RULE,
                severity="critical" if busy < 1 - IDLE and t_share >= MIN_SHARE else "warning",
                title=(
                    f"accelerator idle {1 - busy:.0%} of the run while host-device copies take {t_share:.0%} "
                    "of end-to-end time"
                ),
                evidence=tuple(ev),
                recommendation=ADVICE,
                source=r.source,
                details={"transfer_share": t_share, "busy": busy},
            )
        )
    return out
