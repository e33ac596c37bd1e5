"""The decode-step variants of ``optimize --workload gen`` on a tiny random Llama built here: a KV cache
stored in BF16 or FP8 (the same greedy tokens as the FP32 cache on this model, the keys really stored in
the smaller dtype), the compiled decode step (identical tokens, one graph, no recompile across prompt
lengths, compile time on the clock) and the end-to-end INT8 screen (it finds the layer a planted
activation outlier breaks). Time is a FakeClock advanced 1 ms by every forward pass."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from latencylab.clock import FakeClock  # noqa: E402
from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.gen.decode_variants import CompiledStep, generate_plain, make_cache  # noqa: E402
from latencylab.gen.quant import layer_groups, linear_names, quantize, screen  # noqa: E402
from latencylab.workloads.gen_decode import DecodeConfig, generate  # noqa: E402

MS = 1_000_000
VOCAB = 40


def tiny(seed: int = 0, init: float = 0.02) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1, pad_token_id=0,
        initializer_range=init,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def clocked(model: Any) -> FakeClock:
    clock = FakeClock()
    # outside any compiled graph: traced, the clock's counter would be a guard (a recompile every step)
    tick = torch.compiler.disable(lambda m, a, kw: clock.advance(MS))
    model.register_forward_pre_hook(tick, with_kwargs=True)
    return clock


P1, P2 = [5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_a_smaller_kv_cache_stores_its_dtype_and_decodes_like_fp32(kv: str) -> None:
    model = tiny()
    clock = clocked(model)
    want = generate(model, P1, 10, DecodeConfig(ignore_eos=True))
    tokens, ttft, dec = generate_plain(model, P1, 10, frozenset(), clock, kv_dtype=kv)
    assert tokens == want  # a 2-layer toy: the cache's rounding does not change an argmax here
    assert (ttft, dec) == (1 * MS, 9 * MS)  # prefill: 1 forward; 9 decode forwards of 1 ms
    cache = make_cache(model, kv)
    with torch.inference_mode():
        model(input_ids=torch.tensor([P1]), cache=cache, use_cache=True)
    layer = cache.layers[0]
    stored = layer.keys.dtype if kv == "bf16" else layer._quantized_keys[0].dtype
    assert stored == (torch.bfloat16 if kv == "bf16" else torch.float8_e4m3fn)
    stop = generate_plain(model, P1, 10, frozenset({want[2]}), clock, kv_dtype=kv)[0]
    assert stop == want[: want.index(want[2]) + 1]  # EOS honoured when given
    with pytest.raises(LatencyLabError):
        make_cache(model, "int4")


@pytest.mark.slow  # dynamo traces the toy Llama once: 3-9 s on 2 busy cores
def test_the_compiled_decode_step_is_exact_compiles_once_and_reports_its_compile_time() -> None:
    model = tiny()
    clock = clocked(model)
    step = CompiledStep(model, "eager", max_len=64)  # dynamo's graph capture; inductor is the real model's
    assert step.warm_up(clock) == 4 * MS  # the 3-token prompt + 3 decode steps, 1 ms each on the clock
    assert step.graphs >= 1  # (the clock's forward hook breaks the graph here; the real model compiles 1)
    for prompt, n in ((P1, 10), (P2, 12)):
        want = generate(model, prompt, n, DecodeConfig(ignore_eos=True))
        tokens, ttft, dec = generate_plain(model, prompt, n, frozenset(), clock, step=step)
        assert tokens == want and (ttft, dec) == (MS, (n - 1) * MS)
    assert step.recompiles == 0  # a new prompt length and new positions: the static cache keeps the shapes
    with pytest.raises(LatencyLabError, match="static cache"):
        generate_plain(model, list(range(3, 40)) * 2, 4, frozenset(), clock, step=step)


def outlier_model() -> Any:
    """The toy (weights drawn wide enough that its predictions are sharp) with a planted activation outlier:
    block 1's MLP channel 0 scaled up 1000x before ``down_proj`` and down 1000x inside it, the FP32 function
    unchanged (the MLP is linear in ``up_proj``'s output), but one INT8 scale per activation row of
    ``down_proj`` now spends its range on that channel."""
    model = tiny(init=0.2)
    mlp = model.model.layers[1].mlp
    with torch.no_grad():
        mlp.up_proj.weight[0] *= 1000.0
        mlp.down_proj.weight[:, 0] /= 1000.0
    return model


@pytest.mark.slow  # 2-6 s on 2 busy cores: ~20 perplexities of the toy
def test_the_screen_finds_the_layer_int8_breaks_and_keeps_it_in_float() -> None:
    model = outlier_model()
    g = torch.Generator().manual_seed(5)
    starts = [int(x) for x in torch.randint(3, VOCAB, (4,), generator=g)]
    calib = [[t, *generate(model, [t], 23, DecodeConfig(ignore_eos=True))] for t in starts]  # its own text
    groups = layer_groups(model)
    assert set(groups) == {"block.0", "block.1", "lm_head"} | {f"kind.{k}" for k in
                                                              ("q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj")}  # fmt: skip
    s = screen(model, calib, "dynamic-perchannel", target=0.02, max_share=0.5)
    assert s.int8_ppl > 1.05 * s.fp32_ppl  # the outlier does break plain INT8
    assert [r[3] for r in s.groups] == sorted(r[3] for r in s.groups)  # the most helpful first
    culprit = "model.layers.1.mlp.down_proj"
    assert culprit in groups[s.kept[0]] and culprit in s.kept_layers  # found first, kept in float
    assert s.met and s.curve[-1][1] <= 1.02 * s.fp32_ppl and s.kept_share <= 0.5
    q = quantize(model, "dynamic-perchannel", s.kept_layers)
    kept = dict(q.named_modules())
    assert all(isinstance(kept[n], torch.nn.Linear) == (n in s.kept_layers) for n in linear_names(model))
    assert all(isinstance(m, torch.nn.Linear) for n, m in model.named_modules() if n in linear_names(model))
