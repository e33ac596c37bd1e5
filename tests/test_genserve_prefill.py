"""The BF16 prefill model (genserve/prefill.py) on a tiny random Llama built here: the prompt's forward runs
through the BF16 copy, the sequence's K/V reach the decode batch in FP32, decode runs the FP32 model, and the
greedy replies agree with plain FP32 decoding; ``auto``/``bf16`` resolve by the CPU's BF16 support."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.genserve.engine import TorchEngine  # noqa: E402
from latencylab.genserve.prefill import prefill_model, resolve, token_agreement  # noqa: E402
from latencylab.genserve.scheduler import GenRequest, Scheduler, SchedulerConfig  # noqa: E402
from latencylab.workloads.gen_decode import generate  # noqa: E402
from test_gen_decode_variants import tiny  # noqa: E402

PROMPTS = ([5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [3, 4, 30, 31])


def _calls(model: Any) -> list[tuple[int, int]]:
    """Each forward's input_ids shape (rows, tokens), as it is called."""
    seen: list[tuple[int, int]] = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    return seen


def test_the_prompt_runs_in_bf16_and_joins_the_decode_batch_in_fp32() -> None:
    model = tiny(init=0.2)
    bf = prefill_model(model, "bf16")
    assert bf is not model and next(bf.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # the copy leaves the decode model as it was
    prefills, decodes = _calls(bf), _calls(model)
    engine = TorchEngine(model, prefill_model=bf)
    engine.set_prefix(PROMPTS[0][:5])  # the prefix cache is built by the prefill model too
    assert prefills == [(1, 5)] and not decodes
    sched = Scheduler(engine, SchedulerConfig(max_num_seqs=2, prefill_chunk_tokens=4))
    seqs = [sched.submit(GenRequest(tuple(p), 6)) for p in PROMPTS]
    while sched.step() is not None:
        assert engine._cache is None or all(layer.keys.dtype == torch.float32 for layer in engine._cache.layers)
    # every prompt token went through the BF16 copy (the first prompt after its 5 cached ones), in chunks of at
    # most 4; every decode step (one token a row) through the FP32 model
    assert sum(n for _, n in prefills[1:]) == 2 + 11 + 4 and all(r == 1 and n <= 4 for r, n in prefills[1:])
    assert len(decodes) >= 5 and all(n == 1 for _, n in decodes)
    for p, s in zip(PROMPTS, seqs, strict=True):
        assert len(s.tokens) == 6
        ref = generate(model, list(p), 6)
        assert s.tokens[0] == ref[0]  # a random tiny model's first token survives BF16 here


def test_fp32_is_the_model_itself_and_agreement_is_measured() -> None:
    model = tiny(init=0.2)
    assert prefill_model(model, "fp32") is None
    got = token_agreement(model, PROMPTS, 6, dtype="fp32")
    assert got["token_agreement"] == 1.0 and got["identical"] == len(PROMPTS) == got["first_token_same"]
    bf = token_agreement(model, PROMPTS, 6, dtype="bf16")
    assert 0.0 <= bf["token_agreement"] <= 1.0 and bf["prompts"] == len(PROMPTS) and bf["dtype"] == "bf16"


def test_auto_and_bf16_follow_the_cpus_bf16_support() -> None:
    assert resolve("auto", native=True) == "bf16" and resolve("auto", native=False) == "fp32"
    assert resolve("bf16", native=True) == "bf16" and resolve("fp32", native=False) == "fp32"
    with pytest.raises(LatencyLabError, match="no native BF16"):
        resolve("bf16", native=False)
    with pytest.raises(LatencyLabError, match="choose from fp32, bf16, auto"):
        resolve("fp16", native=True)
