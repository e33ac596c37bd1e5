"""The real engine (SmolLM2): batched continuous decoding gives the single-sequence tokens, prompt for prompt."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # loads and runs SmolLM2-135M (a few minutes on 2 busy cores)

MAX_TOKENS = 16  # enough steps for sequences to join and leave the batch; the reference runs one at a time


@pytest.fixture(scope="module")
def lm():  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    from latencylab.workloads.gen_model import load_model

    try:
        return load_model()
    except Exception as exc:  # the weights package is missing: say how to get it
        pytest.skip(f"SmolLM2 not available: {exc}")


def test_batched_greedy_matches_single_sequence_greedy_on_the_shipped_prompts(lm) -> None:  # type: ignore[no-untyped-def]
    from latencylab.genserve.engine import TorchEngine
    from latencylab.genserve.scheduler import GenRequest, Sampling, Scheduler, SchedulerConfig
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_decode import DecodeConfig, eos_ids, generate
    from latencylab.workloads.gen_prompts import builtin_prompts

    tok, model = lm.tokenizer, lm.model
    eos = eos_ids(tok, model)
    every = [chat_ids(tok, messages_of(p)) for p in builtin_prompts()]
    # four short questions and the two longest prompts (the whole set took ~4 min of a slow tier on 2 cores)
    longest = sorted(range(len(every)), key=lambda i: len(every[i]))[-2:]
    prompts = [every[i] for i in (0, 1, 2, 3, *longest)]
    assert max(len(p) for p in prompts) > 128  # a long prompt is prefilled in chunks
    engine = TorchEngine(model)
    # 3 slots for 6 prompts: sequences join as others leave; a 128-token prefill budget chunks the long ones
    sched = Scheduler(engine, SchedulerConfig(max_num_seqs=3, prefill_chunk_tokens=128))
    seqs = [sched.submit(GenRequest(tuple(p), MAX_TOKENS, eos_ids=eos)) for p in prompts]
    sampled = [
        sched.submit(GenRequest(tuple(prompts[i]), MAX_TOKENS, Sampling(0.8, 0.9, seed=7 + i), eos_ids=eos))
        for i in (0, 5)
    ]
    steps = 0
    while sched.step() is not None:
        steps += 1
    assert engine.repacks > 2 and max(len(s.tokens) for s in seqs) == MAX_TOKENS
    for p, s in zip(prompts, seqs, strict=True):
        assert s.tokens == generate(model, p, MAX_TOKENS, eos=eos), f"prompt of {len(p)} tokens"
    for i, s in zip((0, 5), sampled, strict=True):
        cfg = DecodeConfig(temperature=0.8, top_p=0.9)
        assert s.tokens == generate(model, prompts[i], MAX_TOKENS, cfg, eos=eos, seed=7 + i)


def test_a_cached_chat_prefix_gives_the_tokens_a_whole_prefill_gives(lm) -> None:  # type: ignore[no-untyped-def]
    """The prefix cache (genserve/prefix.py): a chat prompt starts after the template's fixed prefix, its K/V a
    copy of the prefix's; greedy tokens equal the reference's, and a raw prompt (another prefix) is unchanged."""
    import torch

    from latencylab.genserve.engine import TorchEngine
    from latencylab.genserve.prefix import chat_prefix
    from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig
    from latencylab.workloads.gen import chat_ids
    from latencylab.workloads.gen_decode import eos_ids, generate

    tok, model = lm.tokenizer, lm.model
    eos = eos_ids(tok, model)
    prefix = chat_prefix(lambda m: chat_ids(tok, m))
    chat = chat_ids(tok, [{"role": "user", "content": "Name a colour."}])
    raw = list(tok("The capital of France is", add_special_tokens=False)["input_ids"])
    engine = TorchEngine(model)
    engine.set_prefix(prefix)
    before = [k.clone() for k, _ in engine.prefix.layers]
    sched = Scheduler(engine, SchedulerConfig(max_num_seqs=2))
    n = 4
    seqs = [sched.submit(GenRequest(tuple(p), n, eos_ids=eos)) for p in (chat, raw)]
    assert [s.cached_tokens for s in seqs] == [len(prefix), 0] and len(prefix) >= 16
    while sched.step() is not None:
        pass
    for p, s in zip((chat, raw), seqs, strict=True):
        assert s.tokens == generate(model, p, n, eos=eos), f"prompt of {len(p)} tokens"
    assert all(torch.equal(a, k) for a, (k, _) in zip(before, engine.prefix.layers, strict=True))  # read-only


def test_the_packed_engine_decodes_smollm2_as_plain_greedy_decoding_does(lm) -> None:  # type: ignore[no-untyped-def]
    """genserve/packed.py on the real model: chunks riding with decode rows in one forward, a cached chat prefix,
    sequences joining and leaving; greedy tokens equal the model's own decoding, prompt for prompt."""
    from latencylab.genserve.packed import PackedEngine
    from latencylab.genserve.prefix import chat_prefix
    from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig
    from latencylab.workloads.gen import chat_ids, messages_of
    from latencylab.workloads.gen_decode import eos_ids, generate
    from latencylab.workloads.gen_prompts import builtin_prompts

    tok, model = lm.tokenizer, lm.model
    eos = eos_ids(tok, model)
    every = [chat_ids(tok, messages_of(p)) for p in builtin_prompts()]
    longest = max(range(len(every)), key=lambda i: len(every[i]))
    prompts = [every[i] for i in (0, 1, 2, longest)]
    engine = PackedEngine(model)
    engine.set_prefix(chat_prefix(lambda m: chat_ids(tok, m)))
    # 2 slots, 48 prompt tokens a step: the long prompt goes in in chunks beside the others' decode rows
    sched = Scheduler(engine, SchedulerConfig(max_num_seqs=2, prefill_chunk_tokens=48))
    seqs = [sched.submit(GenRequest(tuple(p), 12, eos_ids=eos)) for p in prompts]
    assert all(s.cached_tokens > 0 for s in seqs[:3])
    mixed = 0
    while (rep := sched.step()) is not None:
        mixed += bool(rep.prefill_tokens and rep.decode_batch)
    assert mixed >= 2
    for p, s in zip(prompts, seqs, strict=True):
        assert s.tokens == generate(model, p, 12, eos=eos), f"prompt of {len(p)} tokens"
