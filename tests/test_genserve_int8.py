"""The guard's INT8 rung on the real model (SmolLM2): once the guard steps down, the INT8 copy answers, and the
answer says so."""

from __future__ import annotations

import json

import pytest

from genserve_servers import post, real_server

pytestmark = pytest.mark.slow  # loads SmolLM2, quantises a copy, generates for real


def test_the_int8_rung_answers_and_is_labelled() -> None:
    guard = {"dwell_s": 0.0, "min_samples": 1, "window_s": 60.0}  # one breach steps down; no quiet step up here
    with real_server(ladder=("fp32", "int8"), int8_fidelity=False, ttft_slo_s=30.0, guard=guard) as (url, svc):
        from latencylab.genserve.int8 import quantize_int8

        assert type(svc.scheds["int8"].engine.model).__name__ == type(quantize_int8(svc.engine.model)).__name__
        ask = {"model": "gen", "messages": [{"role": "user", "content": "What is the capital of France?"}],
               "max_tokens": 12}  # fmt: skip
        status, headers, body = post(url, "/v1/chat/completions", ask, timeout=120)
        assert status == 200 and headers["x-latencylab-rung"] == "fp32"
        assert svc.guard is not None
        svc.guard.slo.observe(0, 1e12)  # a breach at fp32: the guard's next decision steps down to int8
        svc.evaluate_guard()  # (or the step thread's timer did, first)
        assert svc.guard.level == 1
        status, headers, body = post(url, "/v1/chat/completions", ask, timeout=120)
        obj = json.loads(body)
        assert status == 200 and headers["x-latencylab-rung"] == "int8"
        assert obj["latencylab"]["rung"] == "int8" and obj["latencylab"]["producer"] == "int8"
        # on topic: an AVX-512 VNNI host's INT8 kernels answered "Paris"; an AVX2 host's (7-bit activations in
        # fbgemm) "France is a country in Western Europe." (session 25)
        content = obj["choices"][0]["message"]["content"]
        assert "Paris" in content or "France" in content, content
        assert svc.scheds["int8"].costs.seeded  # warmed up before serving, as the top rung is


def test_int8_copies_leave_fp32_alone_and_serve_in_the_engine() -> None:
    """A small random Llama (no download): the weight-only INT8 copy's logits stay within the per-channel
    rounding of FP32's, the FP32 model is untouched, and the continuous-batching engine runs both INT8 copies."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from latencylab.genserve.engine import TorchEngine
    from latencylab.genserve.int8 import quantize_int8
    from latencylab.genserve.scheduler import GenRequest, Scheduler

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    fp32 = transformers.LlamaForCausalLM(cfg).eval()
    before = {k: v.clone() for k, v in fp32.state_dict().items()}
    q = quantize_int8(fp32, "weight")
    assert all(torch.equal(before[k], v) for k, v in fp32.state_dict().items())
    assert not any(isinstance(m, torch.nn.Linear) for m in q.modules())
    ids = torch.randint(0, 300, (2, 12))
    with torch.inference_mode():
        a, b = fp32(input_ids=ids).logits, q(input_ids=ids).logits
    assert torch.allclose(a, b, atol=0.05 * float(a.abs().max())) and not torch.equal(a, b)
    for model in (q, quantize_int8(fp32, "dynamic")):
        sched = Scheduler(TorchEngine(model))
        seqs = [sched.submit(GenRequest(tuple(int(x) for x in ids[i]), 5)) for i in range(2)]
        while sched.step() is not None:
            pass
        assert [len(s.tokens) for s in seqs] == [5, 5]
