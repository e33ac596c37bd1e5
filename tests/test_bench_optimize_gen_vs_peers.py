"""benchmarks/optimize_gen_vs_peers.py: the transformers peers as runners on a tiny random Llama (real
``generate``, real assisted generation), a peer with no torch model scored on its tokens only, and the table's
targets on a synthetic result. The SmolLM2 run itself is the benchmark (docs/benchmarks/optimize-gen.md)."""

from __future__ import annotations

import io
import math
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import optimize_gen_vs_peers as ogp  # noqa: E402
from latencylab.clock import PerfCounterClock  # noqa: E402
from latencylab.optimize.gen_candidates import GenContext, GenInputs, GenRun, GenRunner  # noqa: E402
from latencylab.optimize.gen_search import GenBudget, GenFidelity, score  # noqa: E402

VOCAB, EOS = 40, 2
PROMPT = (5, 9, 11, 5, 9, 11, 5, 9, 17, 23, 5, 9)  # repeats: prompt lookup finds n-grams to propose


def toy(layers: int = 2, seed: int = 0) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=EOS, bos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def plain(model: Any, ids: tuple[int, ...], n: int, eos: frozenset[int] = frozenset()) -> tuple[int, ...]:
    return GenRunner(model, 1, PerfCounterClock()).generate(ids, n, eos).tokens


@pytest.mark.parametrize(
    ("gen", "assistant"),
    [({}, None), ({"prompt_lookup_num_tokens": 4}, None), ({}, "int8"), ({"assistant_early_exit": 1}, None)],
    ids=["generate", "prompt-lookup", "assisted-int8", "early-exit"],
)
def test_hf_runner_equal_work_and_greedy_identity(gen: dict[str, Any], assistant: str | None) -> None:
    model = toy()
    draft = ogp.int8_copy(model) if assistant else None
    r = ogp.HFRunner(model, 1, PerfCounterClock(), gen, draft)
    run = r.generate(PROMPT, 12)
    assert isinstance(run, GenRun)
    assert len(run.tokens) == 12  # EOS ignored: exactly n tokens, the work every variant does
    assert run.ttft_ns > 0 and run.decode_ns > 0
    assert 1 <= run.steps <= 11  # one streamer put per step after the first token
    want = plain(model, PROMPT, 12)
    if not gen and assistant is None:
        assert run.tokens == want  # transformers' greedy = latencylab's greedy loop on the same model
    if gen.get("prompt_lookup_num_tokens"):
        assert run.tokens == want  # assisted greedy is lossless
    # with the stop token: the run stops at it, as the fidelity answers do
    eos = frozenset({run.tokens[3]})
    stopped = r.generate(PROMPT, 12, eos)
    assert stopped.tokens[-1] in eos and len(stopped.tokens) <= 12


def test_peer_without_a_torch_model_is_judged_on_its_tokens_only() -> None:
    model = toy()
    inputs = GenInputs((PROMPT,), (PROMPT,), ((3, 4, 5, 6, 7, 8),), (), frozenset())
    ctx = GenContext(model, inputs, 1)
    ref = [plain(model, PROMPT, 8)]

    class Remote:  # a server in another process: tokens, no model
        model = None
        stats: ClassVar[dict[str, Any]] = {}

        def generate(self, ids: Any, n: int, eos: frozenset[int] = frozenset()) -> GenRun:
            return GenRun(ref[0][:4] + (39,) * (n - 4), 1, 1)

    base = GenFidelity(1.0, 1.0, 1.0, 10.0, 10.0, 8, 1, True)
    f = score(Remote(), ctx, ref, 10.0, 8, False, base)  # type: ignore[arg-type]
    assert f.token_agreement == pytest.approx(0.5) and f.exact == 0.0
    assert math.isnan(f.top1) and math.isnan(f.perplexity)
    assert GenBudget.parse("token_agreement>=0.4").check(f) == (True, "inside budget")
    assert GenBudget.parse("token_agreement>=0.4,ppl_delta<=2%").check(f) == (False, "ppl_delta not measured")


def row(name: str, tpot: float, inside: bool, family: str = "peer", agree: float = 1.0) -> dict[str, Any]:
    return {"name": name, "family": family, "status": "inside-budget", "reason": "", "tpot_ms": tpot,
            "ttft_p50_ms": 100.0, "tokens_per_step": 1.0,
            "fidelity": {"token_agreement": agree, "exact": 1.0, "top1": 1.0, "ppl_delta": 0.0},
            "issue_budget": {"inside": inside,
                             "why": "inside budget" if inside else "token_agreement 0.5 < 0.95"}}  # fmt: skip


def doc(choice_tpot: float | None, lookup_tpot: float) -> list[dict[str, Any]]:
    rows = [row("hf-generate-fp32", 90.0, True), row("torch-int8-dynamic", 30.0, False, agree=0.5),
            row("hf-prompt-lookup", lookup_tpot, True), row("latencylab-fp32", 88.0, True, "fp32"),
            {"name": "llamacpp-q4_1", "family": "peer", "status": "skipped", "reason": "no binary"}]  # fmt: skip
    if choice_tpot is not None:
        rows.append(row("latencylab:bf16", choice_tpot, True, "bf16"))
    return [{"threads": 1, "search": {"verdict": "v", "wall_s": 1.0},
             "compare": {"rows": rows, "tokens": 24, "rounds": 3},
             "llama_bench": {"tokens_per_s": 50.0, "tpot_ms": 20.0, "n_gen": 24, "type": "q4_1"}}]  # fmt: skip


def test_targets_against_eager_and_the_fastest_peer_inside_the_budget() -> None:
    out = io.StringIO()
    assert ogp.report(doc(25.0, 75.0), out) is True  # 3.6x eager; 3.0x the lookup peer (1.2x)
    text = out.getvalue()
    assert "vs eager FP32 3.60x (>= 3x: met)" in text
    assert "(hf-prompt-lookup, 1.20x) 3.00x (>= 1.5x: met)" in text
    assert "llamacpp-q4_1" in text and "skipped: no binary" in text
    assert "4.50x hf-generate-fp32's TPOT" in text  # llama.cpp's own speed beside
    # the faster INT8 peer is outside the budget: it is not the peer the choice is held against
    assert ogp.report(doc(25.0, 35.0), io.StringIO()) is False  # 3.6x eager, but 1.4x the lookup peer's 2.57x
    assert ogp.report(doc(None, 75.0), io.StringIO()) is False  # no choice: 1x eager
    assert ogp.report(doc(40.0, 75.0), io.StringIO()) is False  # 2.25x eager: under 3x
