"""Autoscaling ``serve --ray`` on the SLO (``--autoscale MIN:MAX``): Ray Serve's controller, fed by
latencylab's own latency signal instead of the request count.

Each replica reports its **SLO pressure** to Ray Serve (``OipReplica.record_autoscaling_stats``, a custom
autoscaling metric, averaged over ``look_back_period_s``): for each model it serves, the larger of

* the predicted latency of a request arriving now (admission's ``predicted_finish_ns``: the batches running and
  queued, then its own, on the rung the guard serves), and
* the guard's window P99 of what it answered (``SloGuard.window_quantile``, 10-s window by default),

divided by the model's ``slo_ms``; the replica's pressure is its worst model's. :class:`SloPressure` (the
deployment's autoscaling policy) asks for ``ceil(replicas x mean pressure / target)`` replicas: at the default
target 0.5 a deployment grows when its replicas predict answers beyond half their SLO and shrinks when they
predict under it, so the P99 has room before admission starts refusing (admission aims at 0.9 of the SLO:
an overloaded replica reports about 0.9-1.0 and more, so one step at least doubles). Ray Serve applies its own
delays (``upscale_delay_s``, ``downscale_delay_s``) and the ``[MIN, MAX]`` bounds to what the policy asks.

The request count (Ray's default policy, ``target_ongoing_requests``) does not know a request's cost or the
deadline: a replica with 8 requests of 1 ms and one with 8 of 50 ms look alike to it, and so do a batch that
meets the SLO and one that misses it.
"""

from __future__ import annotations

import math
from typing import Any

PRESSURE = "slo_pressure"
DEFAULT_TARGET = 0.5


def replica_pressure(state: Any, now_ns: int | None = None) -> float:
    """The SLO pressure of one replica's server state (module docstring); 0.0 for an idle replica."""
    worst = 0.0
    for svc in state.services.values():
        slo_ms = float(svc.cfg.slo_ms)
        level = svc.guard.level
        batchers = svc.batchers
        predicted_ms = 0.0
        if batchers and level < len(batchers):
            b = batchers[level]
            now = svc.now_ns() if now_ns is None else now_ns
            predicted_ms = max(0.0, (b.predicted_finish_ns(now) - now) / 1e6)
        p99 = svc.guard.window_quantile(level) or 0.0
        worst = max(worst, max(predicted_ms, p99) / slo_ms)
    return worst


class SloPressure:
    """Ray Serve autoscaling policy (``AutoscalingPolicy(policy_function=SloPressure, policy_kwargs=...)``):
    called with Ray's ``AutoscalingContext``, returns (replicas wanted, policy state)."""

    def __init__(self, target: float = DEFAULT_TARGET) -> None:
        if not 0 < target <= 1:
            raise ValueError(f"target pressure {target} must be in (0, 1]")
        self.target = float(target)

    def __call__(self, ctx: Any) -> tuple[float, dict[str, Any]]:
        running = int(ctx.current_num_replicas)
        metrics = ctx.aggregated_metrics or {}
        per = dict(metrics.get(PRESSURE) or {})
        if running == 0 or not per:  # nothing reported yet (replicas starting): keep what is asked
            return ctx.target_num_replicas, dict(ctx.policy_state or {})
        mean = sum(float(v) for v in per.values()) / len(per)
        wanted = desired(running, mean, self.target)
        state = dict(ctx.policy_state or {})
        state.update({"slo_pressure": mean, "wanted": wanted})
        return wanted, state


def desired(running: int, pressure: float, target: float) -> int:
    """Replicas that bring the mean pressure to ``target`` if the load spreads evenly (at least 1)."""
    if not math.isfinite(pressure):
        return running * 2
    return max(1, math.ceil(running * pressure / target - 1e-9))
