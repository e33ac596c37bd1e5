"""Autoscaling ``serve --ray`` on the SLO (``--autoscale MIN:MAX``): Ray Serve's controller, fed by
latencylab's own latency signal instead of the request count.

Each replica reports its **SLO pressure** to Ray Serve (``OipReplica.record_autoscaling_stats``, a custom
autoscaling metric, averaged over ``look_back_period_s``): for each model it serves, the larger of

* the predicted latency of a request arriving now (admission's ``predicted_finish_ns``: the batches running and
  queued, then its own, on the rung the guard serves), and
* the guard's window P99 of what it answered (``SloGuard.window_quantile``, 10-s window by default),

divided by the model's ``slo_ms``; the replica's pressure is its worst model's. Beside it each replica reports
that model's **floor**: the compute of one request on an idle replica (``Admission.own_cost_s``) over the SLO,
the part of the pressure no number of replicas removes. What more replicas shrink is the rest, the wait.

:class:`SloPressure` (the deployment's autoscaling policy) asks for ``ceil(replicas x mean wait / (target -
mean floor))`` replicas: the count at which the wait, spread evenly, brings the mean pressure to the target.
At the default target 0.5 a deployment grows when its replicas predict answers beyond half their SLO and shrinks
when they predict under it, so the P99 has room before admission starts refusing (admission aims at 0.9 of the
SLO). An idle deployment (no wait) asks for one replica whatever its model costs; a model whose floor is at or
above the target keeps a fifth of the target as room (it scales on the wait alone). Ray Serve applies its own
delays (``upscale_delay_s``, ``downscale_delay_s``) and the ``[MIN, MAX]`` bounds to what the policy asks.

Without the floor (``ceil(replicas x pressure / target)``, the first version) an idle pair of replicas whose
model costs more than a quarter of the target never shrank to one: the cost alone read as pressure (seen in CI:
a 20-ms model, a 100-ms SLO, a busy machine, and two idle replicas held for the whole minute the test waited).

The request count (Ray's default policy, ``target_ongoing_requests``) does not know a request's cost or the
deadline: a replica with 8 requests of 1 ms and one with 8 of 50 ms look alike to it, and so do a batch that
meets the SLO and one that misses it.
"""

from __future__ import annotations

import math
from typing import Any

PRESSURE = "slo_pressure"
FLOOR = "slo_floor"
DEFAULT_TARGET = 0.5
MIN_ROOM = 0.2  # of the target: the room kept when a model's floor reaches the target


def replica_stats(state: Any, now_ns: int | None = None) -> dict[str, float]:
    """One replica's SLO pressure and its floor (module docstring), both of its worst model; 0.0 when idle."""
    worst, floor = 0.0, 0.0
    for svc in state.services.values():
        slo_ms = float(svc.cfg.slo_ms)
        level = svc.guard.level
        batchers = svc.batchers
        predicted_ms = own_ms = 0.0
        if batchers and level < len(batchers):
            b = batchers[level]
            now = svc.now_ns() if now_ns is None else now_ns
            predicted_ms = max(0.0, (b.predicted_finish_ns(now) - now) / 1e6)
            own_ms = b.own_cost_s() * 1e3
        p99 = svc.guard.window_quantile(level) or 0.0
        pressure = max(predicted_ms, p99) / slo_ms
        if pressure > worst:
            worst, floor = pressure, min(own_ms / slo_ms, pressure)
    return {PRESSURE: worst, FLOOR: floor}


def replica_pressure(state: Any, now_ns: int | None = None) -> float:
    """The SLO pressure of one replica's server state (module docstring); 0.0 for an idle replica."""
    return replica_stats(state, now_ns)[PRESSURE]


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
        floors = dict(metrics.get(FLOOR) or {})
        mean = sum(float(v) for v in per.values()) / len(per)
        floor = sum(min(float(floors.get(k, 0.0)), float(v)) for k, v in per.items()) / len(per)
        wanted = desired(running, mean, self.target, floor)
        state = dict(ctx.policy_state or {})
        state.update({"slo_pressure": mean, "slo_floor": floor, "wanted": wanted})
        return wanted, state


def desired(running: int, pressure: float, target: float, floor: float = 0.0) -> int:
    """Replicas that bring the mean pressure to ``target`` if the load spreads evenly (at least 1): the wait
    (``pressure - floor``) shrinks with the replicas, the floor does not."""
    if not math.isfinite(pressure):
        return running * 2
    room = max(target - floor, MIN_ROOM * target)
    return max(1, math.ceil(running * max(0.0, pressure - floor) / room - 1e-9))
