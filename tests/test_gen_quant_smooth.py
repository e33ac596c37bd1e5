"""SmoothQuant folding and the validated INT8 screen (issue 19, session 13), on a tiny random Llama built
here with a planted activation outlier: block 1's MLP channel 0 is 1000x larger before ``down_proj`` and
1000x smaller inside it (the FP32 function unchanged), so one INT8 scale per activation row of
``down_proj`` spends its range on that channel, the pattern SmolLM2's ``down_proj`` shows."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.gen.quant import linear_names, quantize, screen  # noqa: E402
from latencylab.gen.smooth import input_absmax, smooth  # noqa: E402
from latencylab.optimize.gen_candidates import GenContext, GenInputs, build  # noqa: E402
from latencylab.workloads.gen_decode import DecodeConfig, generate  # noqa: E402
from latencylab.workloads.gen_fidelity import perplexity  # noqa: E402

VOCAB = 40
ALL = ("down", "qkv", "gate_up", "head")


def outlier_model() -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1, pad_token_id=0,
        initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    mlp = model.model.layers[1].mlp
    with torch.no_grad():
        mlp.up_proj.weight[0] *= 1000.0
        mlp.down_proj.weight[:, 0] /= 1000.0
    return model


def own_text(model: Any, starts: list[int]) -> list[list[int]]:
    """The model's own greedy text from each start token (sharp predictions: INT8's damage shows in perplexity)."""
    return [[t, *generate(model, [t], 15, DecodeConfig(ignore_eos=True))] for t in starts]


@pytest.fixture(scope="module")
def subject() -> tuple[Any, list[list[int]], list[list[int]]]:
    model = outlier_model()
    return model, own_text(model, [5, 13, 21]), own_text(model, [8, 17, 26])  # calibration, validation


def logits(model: Any, seqs: list[list[int]]) -> Any:
    with torch.inference_mode():
        return torch.cat([model(input_ids=torch.tensor([s]), use_cache=False).logits[0] for s in seqs])


def test_smoothing_is_the_same_function_in_float_and_rescues_int8(subject: Any) -> None:
    model, calib, val = subject
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    amax = input_absmax(model, calib, ["mlp.down_proj"])
    assert int(amax[1]["mlp.down_proj"].argmax()) == 0  # the planted outlier channel is the largest input
    s = smooth(model, calib, alpha=0.5, targets=ALL)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the model is left as it is
    up0, up1 = s.model.layers[1].mlp.up_proj.weight, model.model.layers[1].mlp.up_proj.weight
    assert not torch.allclose(up0, up1)  # the scales are really folded in ...
    assert not torch.allclose(s.model.layers[0].input_layernorm.weight, model.model.layers[0].input_layernorm.weight)
    ref = logits(model, val)
    assert torch.allclose(logits(s, val), ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))  # ... exactly
    assert float(input_absmax(s, calib, ["mlp.down_proj"])[1]["mlp.down_proj"].max()) < 0.1 * float(
        amax[1]["mlp.down_proj"].max()
    )  # the outlier's range moved into the weights
    fp32 = perplexity(model, val)
    plain = perplexity(quantize(model, "dynamic-perchannel"), val) / fp32 - 1.0
    smoothed = perplexity(quantize(s, "dynamic-perchannel"), val) / fp32 - 1.0
    assert plain > 0.05 and smoothed < plain / 4  # judged on text the scales were not calibrated on
    with pytest.raises(LatencyLabError):
        smooth(model, calib, alpha=1.5)
    with pytest.raises(LatencyLabError):
        smooth(model, calib, targets=("o_proj",))


def test_the_validated_screen_is_judged_on_validation_text_not_calibration(subject: Any) -> None:
    model, calib, val = subject
    s = screen(model, calib, "dynamic-perchannel", target=0.02, max_share=0.5, judge=val)
    assert s.judged_on == "validation"
    assert s.judge_fp32_ppl == pytest.approx(perplexity(model, val), rel=1e-6)
    assert s.fp32_ppl == pytest.approx(perplexity(model, calib), rel=1e-6)  # groups ranked on calibration
    assert "model.layers.1.mlp.down_proj" in s.kept_layers and s.met
    kept: list[str] = []
    for g, ppl, _ in s.curve:  # every step of the keep is the validation perplexity of that mixed copy
        kept += [n for n in linear_names(model) if n not in kept and n in _group(model, g)]
        assert ppl == pytest.approx(perplexity(quantize(model, "dynamic-perchannel", kept), val), rel=1e-4)
    assert s.curve[-1][1] <= 1.02 * s.judge_fp32_ppl
    assert all(g not in s.kept for g in s.rejected)
    unjudged = screen(model, calib, "dynamic-perchannel", target=0.02, max_share=0.5)
    assert unjudged.judged_on == "calibration" and unjudged.curve[0][1] != pytest.approx(s.curve[0][1])
    with pytest.raises(LatencyLabError):
        screen(model, calib, "dynamic-perchannel", judge=[[3]])


def _group(model: Any, g: str) -> list[str]:
    from latencylab.gen.quant import layer_groups

    return layer_groups(model)[g]


def test_the_candidates_keep_down_proj_and_fold_the_smoothing(subject: Any) -> None:
    model, calib, val = subject
    ids = lambda seqs: tuple(tuple(s) for s in seqs)  # noqa: E731
    ctx = GenContext(model, GenInputs(ids(val[:1]), ids(val[1:2]), ids(val[2:]), ids(calib)))
    down = [n for n in linear_names(model) if n.endswith("down_proj")]
    r = build(ctx, {"weights": "dynamic-perchannel", "keep": "kind:down_proj"})
    mods = dict(r.model.named_modules())
    assert r.stats["keep_float_layers"] == down
    assert all(isinstance(mods[n], torch.nn.Linear) == (n in down) for n in linear_names(model))
    sm = {"alpha": 0.5, "targets": list(ALL)}
    r2 = build(ctx, {"weights": "dynamic-perchannel", "smooth": sm})
    assert r2.stats["smooth"] == sm and ctx.smoothed(sm) is ctx.smoothed(dict(sm))  # folded once, shared
    assert perplexity(r2.model, val) < perplexity(quantize(model, "dynamic-perchannel"), val)
    with pytest.raises(LatencyLabError, match="validation text"):
        build(ctx, {"weights": "dynamic-perchannel", "keep": "screen-validated"})  # none given here
    with pytest.raises(LatencyLabError, match="no Linear layer"):
        build(ctx, {"weights": "dynamic-perchannel", "keep": "kind:nope"})
