"""Speculative decoding without a real model: the greedy and sampled loops over toy LMs (small vocabulary,
logits a fixed random table of the last two tokens), the rejection rule's output distribution (chi-square
against the target's exact distribution), prompt lookup, adaptive k. The real SmolLM2 and its drafts:
tests/test_gen_speculative_model.py (slow)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from scipy.stats import chisquare  # noqa: E402

from latencylab.clock import FakeClock  # noqa: E402
from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.gen.drafts import ModelDraft, PromptLookupDraft, lookup  # noqa: E402
from latencylab.gen.speculative import (  # noqa: E402
    AdaptiveK,
    Proposal,
    Sampler,
    accept_greedy,
    accept_sampled,
    speculative_generate,
)


class ToyLM:
    """A CachedLM over a small vocabulary: the logits after a context are row (a, b) of a seeded random
    table, (a, b) its last two tokens. The 'cache' is the list of tokens fed so far; ``calls`` counts
    forwards."""

    def __init__(self, vocab: int, seed: int, sharp: float = 2.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, vocab, generator=g) * sharp
        self.fed: list[int] = []
        self.calls = 0

    @property
    def length(self) -> int:
        return len(self.fed)

    def reset(self) -> None:
        self.fed = []

    def logits_after(self, ctx: Sequence[int]) -> Any:
        a = ctx[-2] if len(ctx) > 1 else 0
        return self.table[a, ctx[-1]]

    def forward(self, ids: Sequence[int], keep: int) -> Any:
        self.calls += 1
        rows = []
        for t in ids:
            self.fed.append(int(t))
            rows.append(self.logits_after(self.fed))
        return torch.stack(rows[-keep:])

    def crop(self, length: int) -> None:
        assert length <= len(self.fed)
        self.fed = self.fed[:length]


def plain_greedy(lm: ToyLM, prompt: list[int], n: int, eos: frozenset[int] = frozenset()) -> list[int]:
    ctx, out = list(prompt), []
    while len(out) < n:
        t = int(lm.logits_after(ctx).argmax())
        out.append(t)
        ctx.append(t)
        if t in eos:
            break
    return out


# ------------------------------------------------------------------------------------------------ greedy


@pytest.mark.parametrize("draft_seed", [1, 7])  # 1: a draft unlike the target; 7: see `close` below
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_is_token_identical_to_plain_greedy(draft_seed: int, k: int) -> None:
    target = ToyLM(5, seed=0)
    draft_lm = ToyLM(5, seed=draft_seed)
    if draft_seed == 7:  # a close draft: the target's table plus noise, so most drafts are accepted
        draft_lm.table = target.table + 0.5 * torch.randn(5, 5, 5, generator=torch.Generator().manual_seed(7))
    for prompt in ([1], [2, 3, 4], [0, 0, 1, 2, 3, 4, 4]):
        want = plain_greedy(target, prompt, 40)
        got = speculative_generate(target, ModelDraft(draft_lm, "toy"), prompt, 40, k=k)
        assert list(got.tokens) == want
        assert got.stop == "length"
        assert target.length == len(prompt) + 40 - 1  # the cache holds all but the last token
        assert draft_lm.length <= len(prompt) + 40 - 1


def test_greedy_stops_at_eos_and_at_the_limit_like_plain_decoding() -> None:
    target = ToyLM(6, seed=3)
    plain = plain_greedy(target, [1, 2], 30)
    stop_tok = plain[5]  # a token that occurs mid-answer: make it EOS
    eos = frozenset({stop_tok})
    want = plain_greedy(target, [1, 2], 30, eos)
    assert want[-1] == stop_tok and len(want) < 30
    same = ToyLM(6, seed=3)  # a perfect draft: accepts everything, so EOS arrives inside an accepted run
    res = speculative_generate(target, ModelDraft(same, "same"), [1, 2], 30, k=4, eos=eos)
    assert list(res.tokens) == want and res.stop == "eos"
    for n in (1, 2, 3, 7):
        res = speculative_generate(target, ModelDraft(ToyLM(6, seed=3), "same"), [1, 2], n, k=4)
        assert list(res.tokens) == plain[:n] and res.stop == "length"


def test_perfect_draft_accepts_everything_and_steps_are_counted() -> None:
    target, draft_lm = ToyLM(5, seed=0), ToyLM(5, seed=0)
    res = speculative_generate(target, ModelDraft(draft_lm, "same"), [1, 2], 21, k=4)
    # 1 token from the prefill, then 4 steps of 4 drafts + 1 target token = 21
    assert [(s.proposed, s.accepted, s.emitted) for s in res.steps] == [(4, 4, 5)] * 4
    assert res.acceptance_rate == 1.0 and res.tokens_per_step == 5.0
    assert target.calls == 1 + 4  # the prefill, then one forward per verify step


def test_step_times_come_from_the_clock() -> None:
    clock = FakeClock()

    class TimedToy(ToyLM):
        def __init__(self, vocab: int, seed: int, cost: int) -> None:
            super().__init__(vocab, seed)
            self.cost = cost

        def forward(self, ids: Sequence[int], keep: int) -> Any:
            clock.advance(self.cost)
            return super().forward(ids, keep)

    target, draft_lm = TimedToy(5, 0, 1000), TimedToy(5, 0, 100)
    res = speculative_generate(target, ModelDraft(draft_lm, "same"), [1], 11, k=2, clock=clock)
    assert res.prefill_ns == 1000
    # each step: 2 draft forwards (100 each), 1 verify (1000); 10 tokens after the first in 10 / 3 -> 4 steps
    assert [s.draft_ns for s in res.steps[:3]] == [200, 200, 200]
    assert all(s.verify_ns == 1000 for s in res.steps)
    assert res.decode_ns == sum(s.draft_ns + s.verify_ns for s in res.steps)
    assert res.tpot_ns == res.decode_ns / 10


def test_accept_greedy_takes_the_agreeing_prefix_and_the_targets_own_token() -> None:
    logits = torch.zeros(4, 5)
    for row, best in enumerate([2, 3, 1, 4]):
        logits[row, best] = 1.0
    assert accept_greedy(logits, [2, 3, 1]) == (3, 4)  # all accepted, then the bonus token
    assert accept_greedy(logits, [2, 0, 1]) == (1, 3)  # rejected at the second: the target's token there
    assert accept_greedy(logits[:1], []) == (0, 2)  # nothing drafted: a plain decode step


# --------------------------------------------------------------------------------------------- sampling


def _chi2_p(counts: Counter[Any], cells: list[Any], probs: list[float]) -> float:
    n = sum(counts.values())
    obs = [counts.get(c, 0) for c in cells]
    assert sum(obs) == n  # nothing fell outside the cells that have probability
    total = sum(probs)
    return float(chisquare(obs, [p / total * n for p in probs]).pvalue)


def test_rejection_rule_reproduces_the_target_distribution() -> None:
    """One position: x ~ q, then accept / resample. The outcome must be distributed as p (including a token
    q never proposes and one p never produces), and clearly not as q."""
    p = torch.tensor([0.40, 0.25, 0.20, 0.15, 0.0])
    q = torch.tensor([0.10, 0.50, 0.0, 0.15, 0.25])
    sampler = Sampler(1.0, generator=torch.Generator().manual_seed(0))
    n = 20000
    counts: Counter[int] = Counter()
    for _ in range(n):
        x = sampler.draw(q)
        acc, tok = accept_sampled(torch.stack([p, p]), q[None], [x], sampler)
        counts[x if acc == 1 else tok] += 1
    cells = [0, 1, 2, 3]
    assert counts[4] == 0
    assert _chi2_p(counts, cells, p[:4].tolist()) > 1e-3
    # the test has power: the draft's own distribution is rejected outright
    draft_like = Counter({c: int(q[c] * n) for c in range(5)})
    with pytest.raises(AssertionError):
        assert _chi2_p(draft_like, cells, p[:4].tolist()) > 1e-3


@pytest.mark.parametrize("draft", ["model", "lookup"])
def test_sampled_speculative_output_is_distributed_as_the_target(draft: str) -> None:
    """The whole loop (3 tokens, k = 2, caches rolled back) against the target's exact joint distribution of
    the 3 tokens, over 27 cells; the draft is a different toy model or prompt lookup (one-hot q)."""
    vocab, prompt, n_tok = 3, [0, 1, 2, 0, 1], 3
    target = ToyLM(vocab, seed=11, sharp=1.0)
    drafter: Any = ModelDraft(ToyLM(vocab, seed=12, sharp=1.0), "toy") if draft == "model" else PromptLookupDraft(2)
    gen = torch.Generator().manual_seed(5)
    runs = 1500
    counts: Counter[tuple[int, ...]] = Counter()
    accepted = 0
    for _ in range(runs):
        res = speculative_generate(target, drafter, prompt, n_tok, k=2, sampler=Sampler(1.0, generator=gen))
        counts[res.tokens] += 1
        accepted += res.accepted
    assert accepted > runs // 4  # the rejection rule was exercised both ways
    cells = list(itertools.product(range(vocab), repeat=n_tok))
    probs = []
    for cell in cells:
        ctx, pr = list(prompt), 1.0
        for t in cell:
            pr *= float(torch.softmax(target.logits_after(ctx), -1)[t])
            ctx.append(t)
        probs.append(pr)
    assert math.isclose(sum(probs), 1.0, rel_tol=1e-5)
    assert _chi2_p(counts, cells, probs) > 1e-3


def test_sampling_is_reproducible_with_a_seed() -> None:
    def run(seed: int) -> tuple[int, ...]:
        gen = torch.Generator().manual_seed(seed)
        target, d = ToyLM(7, seed=1), ModelDraft(ToyLM(7, seed=2), "toy")
        return speculative_generate(target, d, [1, 2], 30, k=3, sampler=Sampler(0.8, 0.9, gen)).tokens

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_sampler_top_p_keeps_the_smallest_prefix_reaching_top_p() -> None:
    s = Sampler(1.0, top_p=0.6)
    p = s.probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])))
    assert torch.allclose(p, torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))
    with pytest.raises(LatencyLabError):
        Sampler(0.0)


# ------------------------------------------------------------------------------------------- prompt lookup


def test_lookup_proposes_what_followed_the_latest_longest_match() -> None:
    ctx = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 6, 7]
    # trigram (3, 6, 7) never occurred before; bigram (6, 7): latest earlier occurrence at 6 -> 2, 3, 6
    assert lookup(ctx, 3, max_ngram=3) == [2, 3, 6]
    assert lookup(ctx, 10, max_ngram=3) == [2, 3, 6, 7]  # up to the end of the context
    assert lookup([1, 2, 3, 4], 3) == []  # no repeated token at all
    assert lookup([4, 1, 2, 3, 1, 2], 2, max_ngram=1) == [3, 1]  # unigram (2) at index 2
    d = PromptLookupDraft(3)
    assert d.propose(ctx, 2, None) == Proposal((2, 3))
    with pytest.raises(LatencyLabError):
        PromptLookupDraft(1, 2)


# ------------------------------------------------------------------------------------------- adaptive k


def test_adaptive_k_follows_the_acceptance_rate() -> None:
    ak = AdaptiveK(k_min=1, k_max=8, draft_cost=0.0, verify_slope=0.1, decay=0.9, prior_alpha=0.5)
    # alpha 0.5: tokens/cost (1 - .5^(k+1)) / .5 / (1 + .1 k): k=1 1.364, k=2 1.458, k=3 1.442 -> 2
    assert ak.alpha == 0.5 and ak.k() == 2
    for _ in range(30):
        ak.update(4, 4)  # everything accepted: alpha -> 1, the longest k pays
    assert ak.alpha > 0.95 and ak.k() == 8
    for _ in range(40):
        ak.update(4, 0)  # nothing accepted: alpha -> 0, the shortest k
    assert ak.alpha < 0.1 and ak.k() == 1


def test_adaptive_k_estimates_alpha_from_accepted_and_rejected_counts() -> None:
    ak = AdaptiveK(decay=1.0, prior_alpha=0.5)
    ak.update(4, 2)  # 2 accepted, then 1 rejection
    ak.update(3, 3)  # 3 accepted, no rejection
    ak.update(0, 0)  # nothing proposed: no evidence
    assert ak.alpha == pytest.approx((0.5 + 5) / (0.5 + 5 + 0.5 + 1))


def test_adaptive_k_shortens_when_drafting_costs_more() -> None:
    cheap, dear = AdaptiveK(draft_cost=0.0), AdaptiveK(draft_cost=0.5)
    for ak in (cheap, dear):
        for _ in range(20):
            ak.update(5, 4)
    assert ak.alpha == cheap.alpha
    assert dear.k() < cheap.k()
    # a fixed verify overhead favours longer runs: alpha 0.5, slope 0.1, base 1.0: k=2 1.75/2.2 = 0.795,
    # k=3 1.875/2.3 = 0.815, k=4 1.9375/2.4 = 0.807 -> 3 (2 without the overhead, see above)
    assert AdaptiveK(verify_base=1.0, verify_slope=0.1).k() == 3
    with pytest.raises(LatencyLabError):
        AdaptiveK(k_min=3, k_max=2)
