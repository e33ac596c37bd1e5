"""Speculative decoding: a cheap draft proposes k tokens, the target checks them all in one forward pass.

Each **verify step**: the draft proposes ``d_1..d_m`` (m <= k; a prompt-lookup draft may find none); the
target runs ``[last, d_1..d_m]`` through its KV cache in one forward and gets m+1 next-token distributions.

* **Greedy** (temperature 0, lossless): ``d_i`` is accepted while it equals the target's argmax at its
  position; the target's own argmax after the accepted prefix is appended (a correction, or a bonus token
  when all m were accepted). The output is token-for-token plain greedy decoding of the target.
* **Sampling** (Leviathan et al. 2023, Chen et al. 2023): ``d_i`` (drawn from the draft's ``q``) is accepted
  with probability ``min(1, p(d_i) / q(d_i))``; at the first rejection the token is drawn from
  ``norm(max(0, p - q))`` instead, and after m acceptances one more from ``p``. Every output token is then
  distributed as the target's ``p`` (the same temperature / top-p warping as plain decoding). A draft
  without probabilities (prompt lookup) proposes with ``q`` one-hot on its token.

Both caches then roll back past the first rejected token (:meth:`CachedLM.crop`). :class:`AdaptiveK` picks
k from the running acceptance rate. Timing goes through the Clock protocol: a step's draft and verify
costs and the time after each step are recorded in a frozen :class:`SpecResult`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError
from latencylab.gen.lm import CachedLM


@dataclass(frozen=True, slots=True)
class Proposal:
    """A draft's tokens and, for a sampled model draft, the distributions it drew them from ([m, vocab])."""

    tokens: tuple[int, ...]
    probs: Any = None  # None: deterministic proposals (q one-hot on each token)


class Draft(Protocol):
    """Proposes continuations of a context; told how much of its last proposal survived."""

    name: str

    def begin(self, prompt_ids: Sequence[int]) -> None: ...

    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None) -> Proposal: ...

    def rollback(self, length: int) -> None: ...  # context[:length] is final; forget anything past it


@dataclass(frozen=True, slots=True)
class Sampler:
    """Sampling settings: the warping of plain decoding (``gen_decode.pick``) and a seeded generator."""

    temperature: float
    top_p: float = 1.0
    generator: Any = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise LatencyLabError(f"speculative: a sampler needs temperature > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise LatencyLabError(f"speculative: top_p must be in (0, 1], got {self.top_p}")

    def probs(self, logits: Any) -> Any:
        """The distribution (rows of ``logits``, [..., vocab]) a token is drawn from: temperature, then top-p
        (the smallest prefix of the sorted distribution whose mass reaches top_p), renormalised."""
        import torch

        p = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = torch.sort(p, descending=True, dim=-1)
            drop = torch.cumsum(sorted_p, dim=-1) - sorted_p >= self.top_p
            p = torch.zeros_like(p).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
            p = p / p.sum(dim=-1, keepdim=True)
        return p

    def draw(self, probs: Any) -> int:
        import torch

        return int(torch.multinomial(probs, 1, generator=self.generator).item())

    def uniform(self) -> float:
        import torch

        return float(torch.rand((), generator=self.generator).item())


def accept_greedy(logits: Any, drafted: Sequence[int]) -> tuple[int, int]:
    """(accepted drafts, next token) from the target's logits [m+1, vocab] over ``[last, d_1..d_m]``."""
    best = logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(drafted) and drafted[n] == best[n]:
        n += 1
    return n, int(best[n])


def accept_sampled(p: Any, q: Any, drafted: Sequence[int], sampler: Sampler) -> tuple[int, int]:
    """(accepted drafts, next token) by the rejection rule: ``p`` is the target's [m+1, vocab] distributions,
    ``q`` the draft's [m, vocab] (None: one-hot on each drafted token)."""
    import torch

    for i, x in enumerate(drafted):
        px = float(p[i, x])
        qx = 1.0 if q is None else float(q[i, x])
        if qx > 0 and sampler.uniform() < min(1.0, px / qx):
            continue
        qi = torch.zeros_like(p[i]) if q is None else q[i]
        if q is None:
            qi[x] = 1.0
        residual = torch.clamp(p[i] - qi, min=0.0)
        total = float(residual.sum())
        # p == q leaves no residual mass; then the rejection had probability 0 and p itself is right
        return i, sampler.draw(residual / total if total > 0 else p[i])
    return len(drafted), sampler.draw(p[len(drafted)])


class AdaptiveK:
    """k from the running acceptance rate.

    Model (Leviathan et al., sec. 3): each drafted token is accepted with probability ``alpha``, independently,
    so a step with k drafts emits ``(1 - alpha**(k+1)) / (1 - alpha)`` tokens on average, at a cost of
    ``1 + verify_base + (verify_slope + draft_cost) * k`` in units of a one-token target forward
    (``verify_base``: what a multi-token forward costs over a one-token one before its per-token slope; on
    a CPU, where a one-token forward is a matrix-vector product and more tokens a matrix product, it is
    large). :meth:`k` is the k in [k_min, k_max] with the most tokens per unit cost. ``alpha`` is estimated
    from decayed counts of accepted drafts and of rejections (a step that stopped before its last draft
    ended on one rejection): the maximum likelihood estimate under that model, from a prior ``prior_alpha``.
    """

    def __init__(
        self,
        k_min: int = 1,
        k_max: int = 8,
        draft_cost: float = 0.0,
        verify_base: float = 0.0,
        verify_slope: float = 0.1,
        decay: float = 0.9,
        prior_alpha: float = 0.5,
    ) -> None:
        if not 1 <= k_min <= k_max:
            raise LatencyLabError(f"adaptive k: need 1 <= k_min <= k_max, got {k_min}, {k_max}")
        if draft_cost < 0 or verify_base < 0 or verify_slope < 0 or not 0 < decay <= 1 or not 0 < prior_alpha < 1:
            raise LatencyLabError("adaptive k: costs >= 0, decay in (0, 1], prior_alpha in (0, 1)")
        self.k_min, self.k_max = k_min, k_max
        self.draft_cost, self.verify_base, self.verify_slope, self.decay = draft_cost, verify_base, verify_slope, decay
        self._accepted, self._rejected = prior_alpha, 1.0 - prior_alpha  # one pseudo-observation

    @property
    def alpha(self) -> float:
        return self._accepted / (self._accepted + self._rejected)

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return  # nothing was drafted: no evidence about acceptance
        self._accepted = self.decay * self._accepted + accepted
        self._rejected = self.decay * self._rejected + (1.0 if accepted < proposed else 0.0)

    def k(self) -> int:
        a = min(self.alpha, 1.0 - 1e-9)
        best, best_rate = self.k_min, -1.0
        for k in range(self.k_min, self.k_max + 1):
            cost = 1 + self.verify_base + (self.verify_slope + self.draft_cost) * k
            rate = (1 - a ** (k + 1)) / (1 - a) / cost
            if rate > best_rate + 1e-12:
                best, best_rate = k, rate
        return best


class FixedK:
    """The same k every step."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise LatencyLabError(f"speculative: k must be >= 1, got {k}")
        self._k = k

    def update(self, proposed: int, accepted: int) -> None:
        pass

    def k(self) -> int:
        return self._k


class KPolicy(Protocol):
    def update(self, proposed: int, accepted: int) -> None: ...

    def k(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Step:
    """One verify step: drafts proposed and accepted, tokens emitted, draft and verify time (clock ns)."""

    proposed: int
    accepted: int
    emitted: int
    draft_ns: int
    verify_ns: int


@dataclass(frozen=True, slots=True)
class SpecResult:
    """One speculative generation: the tokens, the steps, and the clock's times (``prefill_ns``: from the
    start to the first token; ``decode_ns``: from the first token to the last)."""

    tokens: tuple[int, ...]
    steps: tuple[Step, ...]
    prefill_ns: int
    decode_ns: int
    stop: str  # "eos" | "length"

    @property
    def proposed(self) -> int:
        return sum(s.proposed for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts (nan when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else math.nan

    @property
    def tokens_per_step(self) -> float:
        """Tokens emitted per verify step (accepted drafts + the target's own token; cut at EOS / limit)."""
        return sum(s.emitted for s in self.steps) / len(self.steps) if self.steps else math.nan

    @property
    def tpot_ns(self) -> float:
        """Decode time per output token after the first (the gen profile's TPOT)."""
        return self.decode_ns / (len(self.tokens) - 1) if len(self.tokens) > 1 else math.nan


def _choose(logits: Any, sampler: Sampler | None) -> int:
    if sampler is None:
        return int(logits.argmax().item())
    return sampler.draw(sampler.probs(logits))


def speculative_generate(
    target: CachedLM,
    draft: Draft,
    prompt_ids: Sequence[int],
    max_tokens: int,
    *,
    k: KPolicy | int = 4,
    eos: frozenset[int] = frozenset(),
    sampler: Sampler | None = None,
    clock: Clock | None = None,
) -> SpecResult:
    """Generate up to ``max_tokens`` tokens (stopping after an EOS token) with ``draft`` proposing and
    ``target`` verifying; greedy when ``sampler`` is None (see the module docstring)."""
    if max_tokens < 1:
        raise LatencyLabError(f"speculative: max_tokens must be >= 1, got {max_tokens}")
    if not prompt_ids:
        raise LatencyLabError("speculative: empty prompt")
    policy: KPolicy = FixedK(k) if isinstance(k, int) else k
    clk = clock or PerfCounterClock()
    prompt = list(prompt_ids)
    marks = [clk.mark()]
    target.reset()
    draft.begin(prompt)
    tokens = [_choose(target.forward(prompt, 1)[-1], sampler)]
    marks.append(clk.mark())
    raw: list[tuple[int, int, int]] = []
    stop = ""
    while not stop:
        if tokens[-1] in eos:
            stop = "eos"
            break
        if len(tokens) >= max_tokens:
            stop = "length"
            break
        ctx = prompt + tokens
        want = min(policy.k(), max_tokens - len(tokens) - 1)  # the target's own token fills the last slot
        prop = draft.propose(ctx, want, sampler) if want > 0 else Proposal(())
        drafted = list(prop.tokens[:want])
        marks.append(clk.mark())
        logits = target.forward([tokens[-1], *drafted], len(drafted) + 1)
        if sampler is None:
            n, nxt = accept_greedy(logits, drafted)
        else:
            q = None if prop.probs is None else prop.probs[: len(drafted)]
            n, nxt = accept_sampled(sampler.probs(logits), q, drafted, sampler)
        new = [*drafted[:n], nxt]
        target.crop(len(ctx) + n)
        draft.rollback(len(ctx) + n)
        policy.update(len(drafted), n)
        emitted = 0
        for t in new:
            tokens.append(t)
            emitted += 1
            if t in eos:
                stop = "eos"
                break
        marks.append(clk.mark())
        raw.append((len(drafted), n, emitted))
    ns = [int(t) for t in clk.resolve(marks)]
    steps, prev = [], ns[1]  # marks: start, first token, then (drafted, verified) per step
    for i, (p, a, e) in enumerate(raw):
        mid, end = ns[2 + 2 * i], ns[3 + 2 * i]
        steps.append(Step(p, a, e, mid - prev, end - mid))
        prev = end
    return SpecResult(tuple(tokens), tuple(steps), ns[1] - ns[0], prev - ns[1], stop)
