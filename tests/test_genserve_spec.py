"""Speculative decoding inside the continuous-batching server (genserve/packed.py ``mixed_spec``, the scheduler's
``spec_lookup_k``) on a tiny random Llama: drafts verified in the step's forward keep exactly the prefix the model
agrees with plus its own next token, the cache after a rejection decodes on as if the rejected drafts had never
been written, and the served greedy answers equal plain greedy decoding token for token, sequences joining and
leaving, sampled sequences never drafted for."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from latencylab.genserve.scheduler import GenRequest, Sampling, Scheduler, SchedulerConfig, Seq  # noqa: E402
from latencylab.workloads.gen_decode import DecodeConfig, generate  # noqa: E402
from test_genserve_packed import VOCAB, prompt, tiny  # noqa: E402, F401  (tiny: a fixture)


@pytest.mark.parametrize(("wrong_at", "kept"), [(None, 5), (0, 1), (1, 2), (3, 4)])
def test_verify_keeps_the_agreeing_prefix_and_the_models_next_token(tiny, wrong_at, kept) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from latencylab.genserve.packed import PackedEngine

    p = prompt(13, 7)
    want = generate(tiny, list(p), 12)  # plain greedy: the truth the drafts are judged against
    eng = PackedEngine(tiny)
    s = Seq(1, GenRequest(p, 12), 0)
    s.tokens.append(eng.prefill(s, 0, len(p)))  # type: ignore[arg-type]
    draft = list(want[1:5])  # the true next 4 tokens ...
    if wrong_at is not None:
        draft[wrong_at] = (draft[wrong_at] + 1) % VOCAB  # ... one of them wrong
    _, outs = eng.mixed_spec([], [s], [draft])
    assert len(outs[0]) == kept
    assert outs[0] == want[1 : 1 + kept]  # the kept drafts and the correction (or bonus) are the model's own
    assert s.engine_state.length == len(p) + kept  # tokens[-1] + the drafts kept; rejected positions are free
    s.tokens.extend(outs[0])
    while len(s.tokens) < 12:  # decoding on over the overwritten positions gives plain greedy's tokens
        s.tokens.extend(eng.decode([s]))
    assert s.tokens == want


def test_drafts_are_refused_for_a_sampled_sequence_and_past_the_reservation(tiny) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from latencylab.genserve.packed import PackedEngine

    eng = PackedEngine(tiny)
    s = Seq(1, GenRequest(prompt(6, 1), 3, Sampling(0.8, 1.0, seed=1)), 0)
    s.tokens.append(eng.prefill(s, 0, 6))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="greedily"):
        eng.mixed_spec([], [s], [[5]])
    g = Seq(2, GenRequest(prompt(6, 2), 3), 0)  # 6 + 3 - 1 = 8 positions reserved
    g.tokens.append(eng.prefill(g, 0, 6))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="overrun"):
        eng.mixed_spec([], [g], [[5, 6, 7]])
    with pytest.raises(ValueError, match="one draft"):
        eng.mixed_spec([], [g], [])
    with pytest.raises(ValueError, match="spec_lookup_k"):
        SchedulerConfig(spec_lookup_k=-1)
    with pytest.raises(ValueError, match="spec_max_batch"):
        SchedulerConfig(spec_lookup_k=4, spec_max_batch=0)


def test_served_greedy_answers_with_prompt_lookup_equal_plain_decoding(tiny) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from latencylab.genserve.packed import PackedEngine

    base = prompt(8, 3)
    prompts = [base * 3, prompt(17, 4) * 2, prompt(11, 5), base + prompt(20, 6), prompt(30, 8)]
    n = 40

    def serve(k: int, most: int = 4) -> tuple[list[list[int]], list[int], Scheduler]:
        cfg = SchedulerConfig(max_num_seqs=3, prefill_chunk_tokens=16, spec_lookup_k=k, spec_max_batch=most)
        sched = Scheduler(PackedEngine(tiny), cfg)
        seqs = [sched.submit(GenRequest(p, n)) for p in prompts]
        sampled = sched.submit(GenRequest(prompts[0], n, Sampling(0.9, 0.95, seed=5)))
        while sched.step() is not None:
            pass
        return [s.tokens for s in seqs], sampled.tokens, sched

    plain, plain_sampled, _ = serve(0)
    spec, spec_sampled, sched = serve(4)
    for p, got, want in zip(prompts, spec, plain, strict=True):
        assert got == want == generate(tiny, list(p), n), f"prompt of {len(p)} tokens"
        assert len(got) == n  # max_tokens holds though a step may bring several tokens
    assert spec_sampled == plain_sampled == generate(tiny, list(prompts[0]), n, DecodeConfig(0.9, 0.95), seed=5)
    assert sched.spec_proposed > 0 and 0 < sched.spec_accepted <= sched.spec_proposed
    # drafts only while at most spec_max_batch sequences decode: with 1 of 3 slots' worth, fewer steps draft
    capped, _, few = serve(4, most=1)
    assert capped == plain and 0 < few.spec_proposed < sched.spec_proposed
