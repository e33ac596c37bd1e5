"""Speculative decoding of the real SmolLM2-135M-Instruct (slow tier): greedy speculative output is
token-identical to the FP32 model's plain greedy decoding (the gen workload's fidelity reference: the first
16 built-in prompts, chat-templated, 32 tokens, EOS honoured; 1-3 of them per draft, 16 tokens), for each
kind of draft; the early-exit draft with every layer is the target itself. One model load for the module."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol() -> Any:
    from latencylab.workloads.gen_model import gguf_path, load_model

    try:
        gguf_path()
    except Exception as exc:  # the weights package is missing
        pytest.skip(str(exc))
    return load_model()


@pytest.fixture(scope="module")
def reference(smol: Any) -> Any:
    from latencylab.workloads.gen_fidelity import FIDELITY_VERSION, build_reference, load_or_build_reference
    from latencylab.workloads.gen_model import cache_root

    key = smol.path.name
    path = cache_root() / f"reference-{key}-v{FIDELITY_VERSION}.json"
    return load_or_build_reference(path, lambda: build_reference(smol.tokenizer, smol.model, key=key))


# The reference's prompts: 0-7 chat questions, 8-15 instructions over passages of 1-12 sentences (9, 11, 13, 15:
# the long ones, where prompt lookup finds the most). 16 tokens each keep the slow tier short.
@pytest.mark.parametrize(
    ("spec", "prompts", "k"),
    [("lookup", (0, 9, 15), "adaptive"), ("int8", (1, 13), 4), ("exit:24", (8,), 3)],
)
def test_greedy_speculative_matches_plain_greedy(
    smol: Any, reference: Any, spec: str, prompts: tuple[int, ...], k: Any
) -> None:
    from latencylab.gen.drafts import build_draft
    from latencylab.gen.lm import HFLM
    from latencylab.gen.speculative import AdaptiveK, speculative_generate
    from latencylab.workloads.gen_decode import eos_ids

    eos = eos_ids(smol.tokenizer, smol.model)
    target, draft = HFLM(smol.model), build_draft(spec, smol.model)
    proposed = 0
    n = 16  # greedy decoding is prefix-consistent: the first 16 tokens of the 32-token reference answers
    assert reference.max_tokens >= n
    for i in prompts:
        p, want = reference.prompts[i], list(reference.outputs[i])[:n]
        policy = AdaptiveK() if k == "adaptive" else k
        res = speculative_generate(target, draft, p, n, k=policy, eos=eos)
        assert list(res.tokens) == want, f"{spec}: differs from plain greedy on prompt {i}"
        proposed += res.proposed
    assert proposed > 0  # the draft was exercised, not bypassed


def test_early_exit_with_every_layer_is_the_target(smol: Any) -> None:
    import torch

    from latencylab.gen.drafts import early_exit_model

    model = smol.model
    n = model.config.num_hidden_layers
    full, short = early_exit_model(model, n), early_exit_model(model, 2)
    ids = torch.tensor([smol.tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"]])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
        assert torch.equal(full(input_ids=ids).logits, want)
        assert not torch.allclose(short(input_ids=ids).logits, want)
    assert short.model.layers[0] is model.model.layers[0]  # shares weights, copies nothing
    assert model.config.num_hidden_layers == n and len(model.model.layers) == n  # the target is untouched
