"""The generative SLO guard: TTFT p99 and TPOT p99 held by one :class:`~latencylab.serve.guard.SloGuard`.

The OIP server's guard holds one latency per request to one SLO. A generative request has two objectives, its
time to first token and its time per output token, so each finished request is observed as its **SLO usage**

    usage = max(TTFT / TTFT_SLO, TPOT / TPOT_SLO)        (TPOT left out for a one-token answer)

in percent of its budget: the guard runs with ``slo_ms = 100`` and a request that took 1.5 s to its first token
against a 2-s objective is recorded as 75 "ms". Every rule of the OIP guard then applies unchanged (window
quantile, hysteresis between ``exit_ratio`` and ``enter_ratio``, dwell, 1-in-N probes of the rung above, the
quiet step up on a timer, the alarm on the last rung).

Why one guard on the usage and not one guard per objective: a p99 of the usage above 100 % is implied by either
p99 above its SLO (usage >= each ratio), so the guard steps down whenever either objective is breached; it is
conservative in the other direction (two objectives each breached by a different 1 % of requests make a usage
p99 over 100 % with each p99 within its SLO). Stepping up needs the probes' usage p99 below ``exit_ratio``, which
bounds both p99s below ``exit_ratio`` x their SLO. Two guards would also have to agree on one ladder position,
and on whose probes count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from latencylab.clock import Clock
from latencylab.errors import LatencyLabError
from latencylab.serve.guard import Alarm, GuardConfig, SloGuard, Transition

__all__ = ["USAGE_SLO", "GenGuard"]

USAGE_SLO = 100.0  # the guard's SLO: 100 % of each request's budget (its "ms" are percent)


class GenGuard:
    """One model's guard over the SLO usage of its requests (see the module docstring)."""

    def __init__(
        self,
        rungs: Sequence[str],
        ttft_slo_s: float,
        tpot_slo_s: float,
        overrides: Mapping[str, Any] | None = None,
        clock: Clock | None = None,
        on_alarm: Callable[[Alarm], None] | None = None,
        name: str = "",
    ) -> None:
        if not ttft_slo_s > 0 or not tpot_slo_s > 0:
            raise LatencyLabError(f"guard SLOs must be > 0, got TTFT {ttft_slo_s} s, TPOT {tpot_slo_s} s")
        over = dict(overrides or {})
        for bad in ("slo_ms", "q"):
            if bad in over:
                raise LatencyLabError(f"guard override {bad!r}: the generative guard sets it (TTFT/TPOT SLOs, p99)")
        self.ttft_slo_s = ttft_slo_s
        self.tpot_slo_s = tpot_slo_s
        self.slo = SloGuard(rungs, GuardConfig(slo_ms=USAGE_SLO, q=0.99, **over), clock, on_alarm, name=name)

    def usage(self, ttft_s: float, tpot_s: float | None) -> float:
        """The request's SLO usage in percent (see the module docstring)."""
        u = ttft_s / self.ttft_slo_s
        if tpot_s is not None:
            u = max(u, tpot_s / self.tpot_slo_s)
        return 100.0 * u

    def observe(self, level: int, ttft_s: float, tpot_s: float | None, probe: bool) -> None:
        # the SloGuard's unit is ns of latency: usage percent x 1e6 reads back as "ms" = percent
        self.slo.observe(level, self.usage(ttft_s, tpot_s) * 1e6, probe=probe)

    def observe_breach(self, level: int, probe: bool) -> None:
        """A request (or probe) that could not be served at ``level`` counts as one at exactly its SLO: it
        cannot justify a step up."""
        self.slo.observe(level, USAGE_SLO * 1e6, probe=probe)

    # -- the SloGuard's decisions and state, as they are
    def route(self) -> int:
        return self.slo.route()

    def evaluate(self) -> Transition | None:
        return self.slo.evaluate()

    def first_served(self, level: int) -> float | None:
        return self.slo.first_served(level)

    @property
    def level(self) -> int:
        return self.slo.level

    @property
    def alarm_active(self) -> bool:
        return self.slo.alarm_active

    @property
    def transitions(self) -> list[Transition]:
        return self.slo.transitions

    def snapshot(self) -> dict[str, Any]:
        snap = self.slo.snapshot()
        snap["unit"] = "percent of the SLO budget: max(TTFT / TTFT SLO, TPOT / TPOT SLO) x 100"
        snap["ttft_slo_s"] = self.ttft_slo_s
        snap["tpot_slo_s"] = self.tpot_slo_s
        return snap
