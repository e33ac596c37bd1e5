"""Admission's TTFT forecast: the scheduler's own policy replayed, step by step, on expected costs.

A new request's first token comes at the end of the step in which its prompt's last chunk is prefilled. Until
then every step pays, in order: the prefill forwards of the sequences ahead of it (oldest first, at most
``prefill_chunk_tokens`` tokens a step, a forward per sequence and chunk, each with its fixed cost), and one
decode forward over every sequence whose prefill ended in an earlier step. The running batch changes as it
goes: sequences ahead leave when their expected output is done (``output_fraction x max_tokens`` tokens), the
waiting ones join when a slot and the KV budget allow (first come first served). :func:`forecast_ttft_s`
replays exactly that with :class:`~latencylab.genserve.cost.StepCosts`' predictions, so what the schedule does
to a new request (chunked prefill behind a busy batch, the batch's decode steps in every one of its prefill
steps, a slot that frees only when a reply ends) is counted as the scheduler will run it. The replay stops as
soon as it passes ``horizon_s`` (past a deadline the exact figure does not matter). With a
:class:`~latencylab.genserve.budget.PrefillBudget` (the scheduler's TPOT-tied prefill budget) each replayed
step's chunk budget is the one the scheduler would compute from the decoding sequences' TPOT slack, which the
replay carries forward step by step.

What the replay cannot know (the machine's noise, replies longer or shorter than expected, a cost model that
lags the load) is measured afterwards: :class:`ForecastError` keeps the ratio of the actual to the forecast TTFT
of recent requests that were admitted near their deadline (the only ones whose errors decide the tail under
overload, as ``serve.slack.BoundarySlack`` found for the batcher) and admission scales its forecast by their
``q`` quantile.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from latencylab.genserve.budget import PrefillBudget
from latencylab.genserve.cost import StepCosts

__all__ = ["ForecastError", "Pending", "forecast_ttft_s"]


@dataclass(slots=True)
class Pending:
    """A sequence in the replay: prompt tokens not yet prefilled, decode steps still expected, KV reserved."""

    prefill_left: int
    decode_left: int  # decode steps expected after its first token (0: it ends at its first token)
    kv_tokens: int
    decoding: bool = False  # its prefill ended in an earlier step: it is in the decode batch
    target: bool = False  # the request being forecast
    slack_s: float = 0.0  # decoding: TPOT slack, target x (tokens - 1) - seconds since its first token (budget.py)
    aim_s: float | None = None  # prefilling: replay seconds to its planned first token (the ITL cap's yield), or None


def expected_output(costs: StepCosts, max_tokens: int) -> int:
    """Tokens a reply with ``max_tokens`` is expected to produce (at least 1, at most ``max_tokens``)."""
    return max(1, min(max_tokens, math.ceil(costs.output_fraction * max_tokens - 1e-9)))


def forecast_ttft_s(
    running: Iterable[Pending],
    waiting: Iterable[Pending],
    kv_reserved: int,
    *,
    max_num_seqs: int,
    kv_budget_tokens: int,
    prefill_chunk_tokens: int,
    costs: StepCosts,
    horizon_s: float = math.inf,
    max_steps: int = 100_000,
    budget: PrefillBudget | None = None,
) -> float:
    """Seconds until the first token of the ``target`` sequence in ``waiting`` (see the module docstring).

    ``running`` is the batch in join order, ``waiting`` the queue in order; the replay starts at a step's
    start. Past ``horizon_s`` (or ``max_steps`` steps) it returns the time reached so far: a lower bound.
    ``budget``: each step's prefill budget from the decoders' TPOT slack (else ``prefill_chunk_tokens``)."""
    run = list(running)
    queue = deque(waiting)
    kv = kv_reserved
    t = 0.0
    for _ in range(max_steps):
        while queue and len(run) < max_num_seqs and kv + queue[0].kv_tokens <= kv_budget_tokens:
            p = queue.popleft()
            kv += p.kv_tokens
            run.append(p)
        decoders = [p for p in run if p.decoding]
        d = costs.decode_s(len(decoders))
        left = prefill_chunk_tokens
        if budget is not None:
            slacks = ((p.slack_s, p.decode_left - 1) for p in decoders)
            need = 0
            if budget.yields and decoders:  # the ITL cap yields to prompts behind their aim, as the scheduler's
                ahead = ((p.prefill_left, None if p.aim_s is None else p.aim_s - t)
                         for p in run if not p.decoding and p.prefill_left > 0)  # fmt: skip
                need = budget.deadline_tokens(ahead, d, costs)
            left = budget.tokens(slacks, d, budget.later_step_s(costs, max_num_seqs), costs, need)
        t_start = t
        left_before = left
        ended_prefill: list[tuple[Pending, float]] = []  # with the time its first token was chosen
        for p in run:
            if left <= 0:
                break
            if p.decoding or p.prefill_left <= 0:
                continue
            take = min(p.prefill_left, left)
            t += costs.chunk_s(take, shares_forward=bool(decoders) or left_before > left)
            p.prefill_left -= take
            left -= take
            if p.prefill_left == 0:
                ended_prefill.append((p, t))
        t += d
        if any(p.target for p, _ in ended_prefill):
            return t
        if t > horizon_s:
            return t
        target_s = budget.target_s if budget is not None else 0.0
        for p in decoders:
            p.decode_left -= 1
            p.slack_s += target_s - (t - t_start)
        for p, t_first in ended_prefill:
            p.decoding = True
            p.slack_s = -(t - t_first)
        for p in [p for p in run if p.decoding and p.decode_left <= 0]:
            run.remove(p)
            kv -= p.kv_tokens
        if not run and not queue:
            break  # nothing ahead and no target: the caller passed no target
    return t


class ForecastError:
    """Actual / forecast TTFT of recent requests admitted near their deadline; admission's scale factor.

    A request counts when its planned TTFT (the scaled forecast) took at least ``near`` of its TTFT budget: under
    overload every admitted request is there, and at light loads none is, so the scale falls back to 1 (a
    forecast of 50 ms that took 120 ms says nothing about a 4-s deadline). The scale is the ``q`` quantile of
    the last ``window`` such ratios seen within ``max_age_s``, clamped to ``[1, max_scale]``: admission never
    trusts its forecast more than it is, and one stall cannot refuse everything for long."""

    def __init__(
        self, q: float = 0.9, window: int = 32, near: float = 0.5, max_scale: float = 2.0, max_age_s: float = 60.0
    ) -> None:
        if not 0 < q <= 1:
            raise ValueError(f"q must be a fraction in (0, 1], got {q}")
        self.q = q
        self.near = near
        self.max_scale = max_scale
        self.max_age_ns = int(max_age_s * 1e9)
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)  # (when, actual / forecast)

    def is_near(self, planned_s: float, budget_s: float) -> bool:
        """Whether a request planned (scaled forecast) at ``planned_s`` of its ``budget_s`` counts."""
        return budget_s > 0 and planned_s >= self.near * budget_s

    def observe(self, now_ns: int, forecast_s: float, actual_s: float) -> None:
        """A near request's first token came ``actual_s`` after its admission; the replay said ``forecast_s``."""
        if forecast_s > 0:
            self.samples.append((now_ns, actual_s / forecast_s))

    def scale(self, now_ns: int) -> float:
        while self.samples and now_ns - self.samples[0][0] > self.max_age_ns:
            self.samples.popleft()
        if not self.samples:
            return 1.0
        ratios = sorted(r for _, r in self.samples)
        k = min(len(ratios) - 1, math.ceil(self.q * len(ratios)) - 1)
        return min(self.max_scale, max(1.0, ratios[max(0, k)]))
