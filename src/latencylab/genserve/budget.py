"""The prefill budget of a step, tied to the TPOT objective: how many prompt tokens a step may prefill.

A step that prefills ``p`` seconds of prompt stalls every decoding sequence by ``p``: their next token comes
``decode + p`` after the last one. TPOT is an average over a reply, ``(last - first) / (tokens - 1)``, so a
sequence can absorb a stall as long as its average stays under the objective. A decoding sequence with ``k``
tokens, ``elapsed`` seconds after its first, has the *slack* ``target x (k - 1) - elapsed`` (negative: it is
already over), and with ``m`` more tokens expected after this step, its final TPOT stays within ``target`` if
this step's prefill takes at most::

    p_max = slack + (target - d) + m x (target - d_full)

``d`` is this step's decode, ``d_full`` what a later step may cost: the decode step of the largest batch
allowed plus the smallest prefill (``min_tokens``, which every step may take). The batch may fill up and
later prompts still go in before the sequence ends; slack planned on today's small batch and on steps without
prefill would be spent twice (a sequence then ends over its objective, as a first version of this rule did
under overload: 251 ms on the fake engine of tests/test_genserve_budget.py).

The step's budget is the smallest ``p_max`` over the decoding sequences, turned into prompt tokens with the
learnt prefill cost, clamped to ``[min_tokens, max_tokens]``: the floor keeps every prompt moving (no
starvation), the ceiling bounds one forward. With nothing decoding there is no stream to stall, so a step
prefills up to ``max_tokens`` at once: one forward for a whole prompt instead of a chunk a step (fewer fixed
costs per forward and no decode steps in between, the lowest TTFT a lone request can get). Under light load
the running sequences have slack and a new prompt goes in in large chunks (prefill first); under overload,
with the batch's decode step near the objective, it goes in small ones and the TPOT of the batch holds.

**Per gap, too** (``max_step_s``, the scheduler's ``itl_cap_s``). TPOT is a mean, so the rule above lets slack
saved over cheap steps be spent in one long one: a reply's TPOT holds while one of its gaps (ITL) is several
objectives long (session 19: ITL p99 731 ms at a 250-ms TPOT objective, worse than fixed 128-token chunks). With
``max_step_s`` set, a step with decoders also prefills at most ``max_step_s - d``: every gap it makes stays near
the cap (the floor ``min_tokens`` still moves every prompt). That is Sarathi-Serve's token budget derived from
the time-between-tokens objective; it costs a long prompt more chunks, hence a later first token.

**The cap may yield to a TTFT deadline** (``yield_to_deadline``, off by default: on the built-in workload it admitted
no more at equal arrivals, docs/benchmarks/generative.md "Session 23"). A capped step's chunk is small, so a
long prompt behind a busy batch may need more steps than its deadline leaves (session 22: refusals were 404-553
token prompts forecast 4.4-8.7 s under a 250-ms cap). For the prompts being prefilled (oldest first, each with
``ahead`` tokens to go counting those before it, and ``aim`` seconds to the time admission planned its first token
for), the prompt is in after ``k`` more steps of this one's size if ``k x (d + fixed) + ahead x per <= aim``: at
most ``k = floor((aim - ahead x per) / (d + fixed))`` steps, so this step needs ``ceil(ahead / k)`` tokens (all of
``ahead`` when even one step is too few). The step takes the larger of the cap's budget and that need, never more
than the TPOT plan allows: the cap bounds the gaps while every deadline is on course, the TPOT objective always.
:meth:`PrefillBudget.deadline_tokens` computes the need; the scheduler and admission's replay both pass it in.

Admission replays the same rule (genserve/forecast.py), so a TTFT forecast counts the smaller chunks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from latencylab.genserve.cost import StepCosts

__all__ = ["PrefillBudget"]


@dataclass(frozen=True, slots=True)
class PrefillBudget:
    """``target_s``: the TPOT a step plans for (a fraction of the objective); token bounds of a step's prefill;
    ``max_step_s``: the longest a step with decoders is planned to run (their gap, ITL), or None;
    ``yield_to_deadline``: a step may pass ``max_step_s`` (within the TPOT plan) for a prompt behind its deadline."""

    target_s: float
    min_tokens: int = 16
    max_tokens: int = 1024
    max_step_s: float | None = None
    yield_to_deadline: bool = False

    def __post_init__(self) -> None:
        if self.target_s <= 0:
            raise ValueError(f"target_s must be > 0, got {self.target_s}")
        if self.max_step_s is not None and self.max_step_s <= 0:
            raise ValueError(f"max_step_s must be > 0, got {self.max_step_s}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"need 1 <= min_tokens <= max_tokens, got {self.min_tokens}, {self.max_tokens}")

    def later_step_s(self, costs: StepCosts, max_batch: int) -> float:
        """What a later step is planned to cost (``d_full``): the largest batch's decode and the smallest prefill
        chunk, priced as that step runs it (a fused engine's chunk rides in the decode forward: no fixed cost;
        until session 23 the padded engine's fixed cost of a prefill forward was counted here for both, which put
        every later step of the packed engine ~90 ms over its plan and held its chunks at ``min_tokens``)."""
        return costs.decode_s(max_batch) + costs.chunk_s(self.min_tokens, shares_forward=max_batch > 0)

    def max_prefill_s(self, slack_s: float, more_tokens: int, decode_s: float, full_decode_s: float) -> float:
        """The prefill seconds one decoding sequence tolerates this step (``p_max`` in the module docstring)."""
        return slack_s + (self.target_s - decode_s) + max(0, more_tokens) * (self.target_s - full_decode_s)

    @property
    def yields(self) -> bool:
        """Whether a deadline's need can lift the cap (a cap is set and yields): callers skip the need otherwise."""
        return self.max_step_s is not None and self.yield_to_deadline

    def deadline_tokens(self, prefilling: Iterable[tuple[int, float | None]], decode_s: float, costs: StepCosts) -> int:
        """Prompt tokens this step needs so that every prompt in ``prefilling`` (oldest first: tokens left, seconds
        to its aim or None for no deadline) is in by its aim, later steps taking as many (module docstring)."""
        per = costs.prefill_per_token_s
        if not per:
            return 0
        step = decode_s + (0.0 if costs.fused else costs.prefill_overhead_s)
        need = ahead = 0
        for left, aim in prefilling:
            ahead += left
            if aim is None:
                continue
            spare = aim - ahead * per  # what the steps' decode and fixed parts may take
            k = math.floor(spare / step + 1e-9) if step > 0 else (1 if spare >= 0 else 0)
            need = max(need, ahead if k < 1 else math.ceil(ahead / k))
        return need

    def tokens(
        self,
        decoders: Iterable[tuple[float, int]],
        decode_s: float,
        full_decode_s: float,
        costs: StepCosts,
        need: int = 0,
    ) -> int:
        """The step's prefill budget in tokens; ``decoders``: (slack seconds, tokens expected after this step);
        ``decode_s``: this step's decode, ``full_decode_s``: the largest batch's; ``need``: the prompts'
        deadline need (:meth:`deadline_tokens`), which lifts the cap up to the TPOT plan when it yields."""
        allowed = min((self.max_prefill_s(sl, m, decode_s, full_decode_s) for sl, m in decoders), default=math.inf)
        if allowed == math.inf:
            return self.max_tokens
        per = costs.prefill_per_token_s
        if not per:
            return self.min_tokens
        fixed = 0.0 if costs.fused else costs.prefill_overhead_s  # fused: the chunk rides in the decode forward

        def fit(seconds: float) -> int:
            return max(self.min_tokens, min(self.max_tokens, math.floor((seconds - fixed) / per + 1e-9)))

        plan = fit(allowed)  # the TPOT plan
        if self.max_step_s is None:
            return plan
        capped = fit(min(allowed, self.max_step_s - decode_s))  # per gap: decode plus prefill within the cap
        return max(capped, min(plan, need)) if self.yield_to_deadline else capped
