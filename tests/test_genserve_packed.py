"""The packed engine (genserve/packed.py) on a tiny random Llama: a step's prefill chunks and decode tokens in one
forward give the logits the model's own forward gives, the scheduler over it gives plain greedy / seeded decoding
token for token, a cached prefix is copied into a sequence's buffers, and its buffers go when it leaves."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.genserve.scheduler import GenRequest, Sampling, Scheduler, SchedulerConfig, Seq  # noqa: E402

VOCAB = 96


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def prompt(n: int, seed: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(int(x) for x in torch.randint(3, VOCAB, (n,), generator=g))


def reference_logits(model, ids) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)])).logits[0, -1].float()


def test_chunks_and_decode_rows_in_one_forward_give_the_models_own_logits(tiny) -> None:  # type: ignore[no-untyped-def]
    from latencylab.genserve.packed import PackedEngine

    eng = PackedEngine(tiny)
    a = Seq(1, GenRequest(prompt(21, 1), 8), 0)
    b = Seq(2, GenRequest(prompt(9, 2), 8), 0)
    first_b = eng.prefill(b, 0, 9)  # b alone: a whole prompt from position 0 (causal)
    assert first_b == int(reference_logits(tiny, b.req.prompt_ids).argmax())
    b.tokens.append(first_b)
    assert eng.mixed([(a, 0, 8)], [b])[0] == [None]  # a's first chunk rides with b's decode; no token for a yet
    b.tokens.append(eng.last_logits[0].argmax().item())
    torch.testing.assert_close(eng.last_logits[0], reference_logits(tiny, (*b.req.prompt_ids, first_b)))
    firsts, out = eng.mixed([(a, 8, 21)], [b])  # a's second chunk (causal, offset by 8 cached) + b's next token
    torch.testing.assert_close(eng.last_logits[0], reference_logits(tiny, a.req.prompt_ids))
    torch.testing.assert_close(eng.last_logits[1], reference_logits(tiny, (*b.req.prompt_ids, *b.tokens)))
    assert firsts[0] == int(eng.last_logits[0].argmax()) and out == [int(eng.last_logits[1].argmax())]
    assert eng.forwards == 3
    with pytest.raises(RuntimeError, match="cache holds"):
        eng.prefill(a, 3, 10)  # not where its cache ends
    with pytest.raises(ValueError, match="bad chunk"):
        eng.mixed([(a, 21, 30)], [])


def test_the_scheduler_over_the_packed_engine_decodes_as_plain_decoding_does(tiny) -> None:  # type: ignore[no-untyped-def]
    from latencylab.genserve.packed import PackedEngine
    from latencylab.workloads.gen_decode import DecodeConfig, generate

    eng = PackedEngine(tiny)
    # 2 slots for 5 prompts and a 6-token budget a step: sequences join and leave, chunks ride with decode rows
    sched = Scheduler(eng, SchedulerConfig(max_num_seqs=2, prefill_chunk_tokens=6))
    assert sched.fused
    prompts = [prompt(n, 10 + i) for i, n in enumerate((5, 17, 11, 30, 8))]
    seqs = [sched.submit(GenRequest(p, 10)) for p in prompts]
    sampled = sched.submit(GenRequest(prompts[3], 10, Sampling(0.9, 0.95, seed=5)))
    mixed_steps = 0
    while (rep := sched.step()) is not None:
        mixed_steps += bool(rep.prefill_tokens and rep.decode_batch)
    assert mixed_steps >= 3
    for p, s in zip(prompts, seqs, strict=True):
        assert s.tokens == generate(tiny, list(p), 10), f"prompt of {len(p)} tokens"
    assert sampled.tokens == generate(tiny, list(prompts[3]), 10, DecodeConfig(0.9, 0.95), seed=5)
    assert eng.kv_bytes == 0 and not eng._slots  # every sequence left: its buffers went with it


def test_a_cached_prefix_is_copied_into_the_sequences_buffers(tiny) -> None:  # type: ignore[no-untyped-def]
    from latencylab.genserve.packed import PackedEngine
    from latencylab.workloads.gen_decode import generate

    pre = prompt(12, 40)
    eng = PackedEngine(tiny)
    eng.set_prefix(pre)
    p = (*pre, *prompt(7, 41))
    sched = Scheduler(eng, SchedulerConfig(max_num_seqs=2))
    s = sched.submit(GenRequest(p, 6))
    assert s.cached_tokens == 12
    while sched.step() is not None:
        pass
    assert s.tokens == generate(tiny, list(p), 6)


def test_a_model_that_is_not_llama_shaped_is_refused_with_the_reason() -> None:
    from latencylab.genserve.packed import PackedEngine, supports_packed

    class NotLlama(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Module()

    assert "embed_tokens" in supports_packed(NotLlama())
    with pytest.raises(LatencyLabError, match="packed engine cannot run"):
        PackedEngine(NotLlama())


@pytest.mark.parametrize("method", ["dynamic", "weight"])
def test_the_int8_rungs_run_in_the_packed_engine_as_in_the_padded_one(tiny, method: str) -> None:  # type: ignore[no-untyped-def]
    """The guard's INT8 standby (genserve/int8.py) on the packed engine: its projections are replaced modules
    (PyTorch dynamic INT8, or the weight-only one), called as modules; tokens equal the padded engine's."""
    from latencylab.genserve.engine import TorchEngine
    from latencylab.genserve.int8 import quantize_int8
    from latencylab.genserve.packed import PackedEngine

    q = quantize_int8(tiny, method)
    prompts = [prompt(n, 60 + i) for i, n in enumerate((9, 23, 14))]
    got = {}
    for kind, eng in (("padded", TorchEngine(q)), ("packed", PackedEngine(q))):
        sched = Scheduler(eng, SchedulerConfig(max_num_seqs=2, prefill_chunk_tokens=8))
        seqs = [sched.submit(GenRequest(p, 8)) for p in prompts]
        while sched.step() is not None:
            pass
        got[kind] = [s.tokens for s in seqs]
    assert got["packed"] == got["padded"] and all(len(t) == 8 for t in got["packed"])
