"""``latencylab optimize --workload gen`` on a toy LM (a tiny random Llama): the candidates built and scored,
the budget, the choice and the recipe round trip. Time is a FakeClock advanced by every forward pass of the
model, at a cost per candidate (ms per forward, a stated law), so every TTFT, TPOT and speed-up is exact.
The real SmolLM2: tests/test_gen_optimize_model.py (slow). The fast tier keeps the budget, the unfaithful
candidate, the recipe round trip (which builds, scores and times two INT8 candidates) and the CLI refusals."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from latencylab.clock import FakeClock  # noqa: E402
from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.gen.quant import linear_names, quantize, sensitivity  # noqa: E402
from latencylab.optimize.gen_candidates import GenCandidate, GenContext, GenInputs, GenRunner, build  # noqa: E402
from latencylab.optimize.gen_lab import GenLabConfig, GenSubject, apply_gen_recipe, run_gen_lab  # noqa: E402
from latencylab.optimize.gen_search import GenBudget, search  # noqa: E402

VOCAB, EOS = 40, 2
MS = 1_000_000
# ms per forward pass by weights (a stated law, not a measurement): INT8 dynamic is the cheapest
COST = {"fp32": 10, "dynamic": 4, "dynamic-perchannel": 5, "weight": 12}


def toy_model(seed: int = 0) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=EOS, bos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def toy_inputs() -> GenInputs:
    g = torch.Generator().manual_seed(3)

    def seqs(n: int, length: int) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(int(x) for x in torch.randint(3, VOCAB, (length,), generator=g)) for _ in range(n))

    return GenInputs(seqs(3, 9), seqs(2, 12), seqs(3, 10), seqs(2, 10), frozenset({EOS}))


class Costed:
    """A runner whose model's forwards cost ``cost`` ms of the FakeClock each (set before every request)."""

    def __init__(self, inner: GenRunner, cost: float, state: dict[str, float]) -> None:
        self.inner, self.cost, self.state = inner, cost, state
        self.model, self.stats = inner.model, inner.stats

    def generate(self, ids: Any, n: int, eos: frozenset[int] = frozenset()) -> Any:
        self.state["cost"] = self.cost
        return self.inner.generate(ids, n, eos)

    def live_stats(self) -> dict[str, Any]:
        return self.inner.live_stats()

    def close(self) -> None:
        self.inner.close()


class Toy:
    """The toy subject, its FakeClock (advanced by a forward hook every copy of the model inherits) and a
    builder that also knows a deliberately unfaithful candidate (``noise``: every weight perturbed)."""

    def __init__(self, key: str = "toy-0") -> None:
        self.clock = FakeClock()
        self.state = {"cost": 0.0}
        model = toy_model()
        tick = torch.compiler.disable(lambda m, a, kw: self.clock.advance(self.state["cost"] * MS))  # not traced
        model.register_forward_pre_hook(tick, with_kwargs=True)
        self.subject = GenSubject(model, toy_inputs(), {"model": "toy", "key": key})

    def context(self, subject: GenSubject) -> GenContext:
        return GenContext(subject.model, subject.inputs, 1, clock=self.clock)

    def builder(self, ctx: GenContext, params: Mapping[str, Any]) -> Any:
        if params.get("noise"):
            noisy = copy.deepcopy(ctx.model)
            with torch.no_grad():
                for p in noisy.parameters():
                    p.add_(torch.randn_like(p) * float(params["noise"]))
            return Costed(GenRunner(noisy, 1, ctx.clock), 2, self.state)
        if params.get("compile"):  # dynamo's graph capture alone: inductor's C++ build is the real model's cost
            params = {**params, "compile": "eager"}
        return Costed(build(ctx, params), COST[str(params.get("weights", "fp32"))], self.state)

    def lab(self, cfg: GenLabConfig, out: Path | None = None) -> dict[str, Any]:
        return run_gen_lab(cfg, out, subject=self.subject, builder=self.builder, context=self.context)


def by_name(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["candidates"]}


# ------------------------------------------------------------------------------------------------ budget


def test_budget_parses_the_gen_terms_and_refuses_the_impossible() -> None:
    b = GenBudget.parse("ppl_delta<=2%,token_agreement>=0.95")
    assert b.terms == (("ppl_delta", "<=", 0.02), ("token_agreement", ">=", 0.95))
    for bad in ("", "cos>=0.99", "token_agreement<=0.9", "ppl_delta>=1%", "top1>=1.5", "exact>=101%"):
        with pytest.raises(LatencyLabError):
            GenBudget.parse(bad)


# ------------------------------------------------------------------------------------------------ quant


@pytest.mark.slow  # 3.5-4.5 s on 2 busy cores
def test_quantize_keeps_the_named_layers_in_float_and_sensitivity_ranks_every_layer() -> None:
    model = toy_model()
    names = linear_names(model)
    assert len(names) == 2 * 7 + 1  # q k v o gate up down per layer, and the LM head
    ranked = sensitivity(model, toy_inputs().calibration, "dynamic-perchannel")
    assert sorted(n for n, _ in ranked) == sorted(names)
    errs = [e for _, e in ranked]
    assert errs == sorted(errs, reverse=True) and errs[0] > 0
    keep = [n for n, _ in ranked[:3]]
    q = quantize(model, "dynamic-perchannel", keep)
    mods = dict(q.named_modules())
    for n in names:
        assert isinstance(mods[n], torch.nn.Linear) == (n in keep), n  # kept: FP32 Linear; others: quantised
    assert all(isinstance(m, torch.nn.Linear) for n, m in model.named_modules() if n in names)  # original intact
    w = quantize(model, "weight")
    assert not any(isinstance(m, torch.nn.Linear) for m in w.modules())
    ids = torch.tensor([list(toy_inputs().texts[0])])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
        assert torch.allclose(w(input_ids=ids).logits, want, atol=0.05)  # INT8 weights: close, not equal
    with pytest.raises(LatencyLabError):
        quantize(model, "dynamic", ["model.nope"])


# ------------------------------------------------------------------------------------------------ the lab


@pytest.mark.slow  # 4.5-15 s on 2 busy cores (dynamo traces the toy once for compile-decode)
def test_every_candidate_is_built_scored_and_timed_on_the_clock() -> None:
    from latencylab.optimize.gen_candidates import candidates

    toy = Toy()
    names = [x.name for x in candidates(toy.context(toy.subject))]
    # one dynamo trace is enough here; session 13's INT8 variants (smoothing, keep-down, the validated screen)
    # are tested on their own in test_gen_quant_smooth.py (not again here: the suite's time)
    s13 = {"int8-dynamic-keep-down", "int8-smooth", "int8-smooth-keep-down", "int8-smooth-screen",
           "int8-dynamic-screen-validated"}  # fmt: skip
    assert s13 <= set(names)
    # the ONNX Runtime graphs run outside torch (the clock's forward hook): tests/test_gen_ort.py
    assert {"ort-fp32", "ort-fp32-lookup-k4", "ort-fp32-int8draft-k4", "ort-int8-block32"} <= set(names)
    only = tuple(n for n in names[1:] if n != "compile-decode-bf16" and n not in s13 and not n.startswith("ort-"))
    doc = toy.lab(GenLabConfig.quick(budget="token_agreement>=0", tokens=6, rounds=2, only=only))
    c = by_name(doc)
    assert next(iter(c)) == "fp32" and c["fp32"]["status"] == "baseline"
    assert {"int8-dynamic", "int8-dynamic-perchannel", "int8-weight", "spec-lookup-k4", "spec-int8-k3"} <= set(c)
    assert {"bf16", "int8-dynamic-screen", "kv-bf16", "kv-fp8", "compile-decode"} <= set(c)
    assert any(n.startswith("int8-dynamic-perchannel-keep") for n in c)
    assert c["kv-int8"]["status"] == "skipped" and c["kv-int8"]["reason"].startswith("not built")  # with why
    comp = c["compile-decode"]
    assert comp["status"] == "inside-budget" and comp["fidelity"]["exact"] == 1.0  # the same greedy tokens
    assert comp["stats"]["compile_s"] == pytest.approx(0.04) and comp["stats"]["recompiles"] == 0  # 4 x 10 ms
    assert comp["tpot_ms"] == pytest.approx(10.0)  # the compiled step's forwards cost what FP32's do here
    scr = c["int8-dynamic-screen"]["stats"]
    assert scr["screen"]["kept_layers"] == len(scr["keep_float_layers"]) and "lm_head" in [
        g[0] for g in scr["screen"]["groups"]
    ]
    for name in ("bf16", "kv-bf16", "kv-fp8"):
        assert c[name]["fidelity"] is not None and c[name]["tpot_ms"] == pytest.approx(10.0)
    # equal work: 2 rounds x 2 timing prompts, 6 tokens each; fp32 costs 10 ms a forward: TTFT 10, TPOT 10
    base = c["fp32"]
    assert base["n"] == 4 and base["tpot_ms"] == pytest.approx(10.0) and base["ttft_p50_ms"] == pytest.approx(10.0)
    assert c["int8-dynamic"]["tpot_ms"] == pytest.approx(4.0)
    assert doc["summary"]["speedups"]["int8-dynamic"]["tpot"] == pytest.approx(2.5)
    assert doc["summary"]["speedups"]["int8-weight"]["tpot"] == pytest.approx(10 / 12)
    # greedy speculative decoding of the FP32 model: exact, by construction and as measured
    for name in ("spec-lookup-k4", "spec-int8-k3"):
        f = c[name]["fidelity"]
        assert c[name]["exact_by_construction"] and f["token_agreement"] == 1.0 and f["exact"] == 1.0
        assert f["top1"] == 1.0 and f["ppl_delta"] == 0.0 and c[name]["tokens_per_step"] >= 1.0
    q = c["int8-dynamic-perchannel"]["fidelity"]
    assert 0 <= q["token_agreement"] <= 1 and 0 <= q["top1"] <= 1 and q["perplexity"] > 0
    keep = next(v for n, v in c.items() if n.startswith("int8-dynamic-perchannel-keep"))
    assert len(keep["stats"]["keep_float_layers"]) == keep["params"]["keep_float"]
    # the choice: the cheapest inside the budget at the baseline's threads; the 2-thread FP32 is not chosen
    assert doc["summary"]["chosen"] == "int8-dynamic" and doc["summary"]["speedup_tpot"] == pytest.approx(2.5)
    if "fp32-t2" in c:
        assert "not significantly faster" in c["fp32-t2"]["reason"] or "threads" in c["fp32-t2"]["reason"]
    assert "0.83x" in c["int8-weight"]["reason"] and "not significantly faster" in c["int8-weight"]["reason"]


def test_the_budget_excludes_an_unfaithful_candidate_and_keeps_the_exact_one() -> None:
    toy = Toy()
    ctx = toy.context(toy.subject)
    cands = [
        GenCandidate("fp32", "fp32", {"weights": "fp32", "threads": 1}),
        GenCandidate("spec-lookup-k4", "speculative", {"weights": "fp32", "threads": 1, "draft": "lookup", "k": 4},
                     exact=True),
        GenCandidate("noisy", "test", {"noise": 0.5}),  # 5x cheaper than FP32, but wrong
    ]  # fmt: skip
    res = search(ctx, cands, GenBudget.parse("token_agreement>=0.95"), tokens=8, rounds=1, builder=toy.builder)
    noisy = res.by_name("noisy")
    assert noisy.status == "outside-budget" and noisy.reason.startswith("token_agreement")
    assert noisy.fidelity is not None and noisy.fidelity.token_agreement < 0.95
    assert res.speedups["noisy"]["tpot"] == pytest.approx(5.0)  # fastest of all, and still not chosen
    spec = res.by_name("spec-lookup-k4")
    assert spec.status == "inside-budget" and spec.fidelity is not None and spec.fidelity.exact == 1.0
    assert res.chosen != "noisy"


def test_recipe_round_trip_rebuilds_the_choice_and_reproduces_it(tmp_path: Path) -> None:
    toy = Toy()
    cfg = GenLabConfig.quick(budget="token_agreement>=0", only=("int8-dynamic", "int8-weight"), tokens=6)
    doc = toy.lab(cfg, tmp_path)
    recipe = json.loads((tmp_path / "recipe.json").read_text())
    assert recipe["candidate"] == "int8-dynamic" and recipe["params"] == {"weights": "dynamic", "threads": 1}
    assert json.loads((tmp_path / "optimize.json").read_text())["summary"]["chosen"] == "int8-dynamic"
    again = apply_gen_recipe(tmp_path / "recipe.json", subject=toy.subject, builder=toy.builder, context=toy.context)
    rec = again["recipe"]
    assert [c["name"] for c in again["candidates"]] == ["fp32", "int8-dynamic"]
    assert rec["reproduced"]["speedup_tpot"] == rec["recorded"]["speedup_tpot"] == pytest.approx(2.5)
    assert rec["reproduced"]["token_agreement"] == rec["recorded"]["token_agreement"]  # same model, same math
    assert rec["forced"] == [] and doc["recipe"] == str(tmp_path / "recipe.json")
    other = Toy(key="another-model")
    with pytest.raises(LatencyLabError, match="--force"):
        apply_gen_recipe(tmp_path / "recipe.json", subject=other.subject, builder=other.builder, context=other.context)


def test_the_cli_refuses_a_bad_gen_budget_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from latencylab.cli import main

    assert main(["optimize", "--workload", "gen", "--budget", "cos>=0.99", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "token_agreement" in err[0]
    for bad in (["--force"], ["--model", "m.onnx"], ["--only", "no-such-candidate", "--budget", "top1>=2"]):
        assert main(["optimize", "--workload", "gen", "--quiet", *bad]) == 2  # refused before any model loads
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
