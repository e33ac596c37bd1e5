"""The ONNX Runtime candidates of ``optimize --workload gen`` on a tiny random Llama built here (grouped-query
attention: 4 heads, 2 K/V heads): the exported graph's logits equal the HF model's, its greedy decoding with
the K/V cache fed back is token-identical to torch's, EOS stops it, MatMulNBits replaces the MatMuls it is
asked to (and keeps the others FP32) with outputs close to FP32, the gen search's builder gives a runner the
fidelity checks score, and ``serve --from`` takes such a choice (tests/test_genserve_ort.py serves it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from latencylab.clock import FakeClock  # noqa: E402
from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.gen.ort_decode import build_ort_lm  # noqa: E402
from latencylab.gen.ort_llama import check_llama, export_llama, quantize_matmuls  # noqa: E402
from latencylab.optimize.gen_candidates import GenContext, GenInputs, build, candidates  # noqa: E402
from latencylab.workloads.gen_decode import DecodeConfig, generate  # noqa: E402

VOCAB = 64
P1, P2 = [5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]


def tiny(seed: int = 0, tied: bool = False) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=2, bos_token_id=1, pad_token_id=0,
        initializer_range=0.2, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("tied", [False, True])
def test_the_graph_gives_the_models_logits_and_its_greedy_tokens(tmp_path: Path, tied: bool) -> None:
    model = tiny(tied=tied)
    lm = build_ort_lm(model, tmp_path, threads=1)
    for p in (P1, P2):
        ids = torch.tensor([p])
        with torch.inference_mode():
            want = model(input_ids=ids, use_cache=False).logits
        got = lm.model(input_ids=ids, use_cache=False).logits
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
        # decoding: the prompt's forward, then one position a step over the cache the graph returns
        ref = generate(model, p, 12, DecodeConfig(ignore_eos=True))
        run = lm.generate(p, 12, frozenset(), FakeClock())
        assert list(run.tokens) == list(ref)


def test_eos_stops_the_reply(tmp_path: Path) -> None:
    model = tiny()
    lm = build_ort_lm(model, tmp_path, threads=1, scoring=False)
    full = lm.generate(P1, 10, frozenset(), FakeClock()).tokens
    stop = full[3]
    cut = lm.generate(P1, 10, frozenset({stop}), FakeClock()).tokens
    assert cut == full[: full.index(stop) + 1]


def test_matmul_nbits_swaps_what_it_is_asked_to_and_stays_close(tmp_path: Path) -> None:
    model = tiny()
    src = export_llama(model, tmp_path / "full.onnx", last_only=False)
    # 2 layers x (qkv, o, gateup, down) + the LM head
    assert quantize_matmuls(src, tmp_path / "q8.onnx", bits=8, block=32) == 9
    assert quantize_matmuls(src, tmp_path / "q8k.onnx", bits=8, block=32, keep_float=("down", "head")) == 6
    assert quantize_matmuls(src, tmp_path / "q4.onnx", bits=4, block=32) == 9
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q8k.onnx")).graph.node]
    assert ops.count("MatMulNBits") == 6
    with pytest.raises(LatencyLabError, match="4 or 8 bits"):
        quantize_matmuls(src, tmp_path / "q3.onnx", bits=3)
    from latencylab.gen.ort_decode import OrtLM

    ids = torch.tensor([P2])
    with torch.inference_mode():
        want = model(input_ids=ids, use_cache=False).logits
    errs = {}
    for name in ("q8", "q8k", "q4"):
        lm = OrtLM(tmp_path / f"{name}.onnx", tmp_path / f"{name}.onnx", 1, 2, 2, 16)
        got = lm.model(input_ids=ids).logits
        errs[name] = float((got - want).abs().max() / want.abs().max())
    assert errs["q8"] < 0.05 and errs["q8k"] < 0.05  # INT8 weights and activations per block of 32
    assert errs["q8"] < errs["q4"]  # 4-bit weights lose more
    assert errs["q8"] > 0  # it did quantise


def test_the_search_builds_and_scores_an_ort_runner() -> None:
    model = tiny()
    seqs = (tuple(P1), tuple(P2))
    calibration = (tuple(range(30, 40)),)
    ctx = GenContext(model, GenInputs(seqs, seqs, seqs, calibration, frozenset({2})), 1, clock=FakeClock())
    names = {c.name: c for c in candidates(ctx)}
    assert {"ort-fp32", "ort-fp32-lookup-k4", "ort-fp32-int8draft-k4", "ort-int8-block32", "ort-int4-block32"} <= set(
        names
    )
    assert names["ort-int8-block32"].skip is None
    runner: Any = build(ctx, names["ort-fp32"].params)
    work = runner.work
    assert work.is_dir() and runner.stats["graph_mb"] > 0
    ref = generate(model, P1, 6, DecodeConfig(ignore_eos=True))
    assert list(runner.generate(P1, 6).tokens) == list(ref)
    from latencylab.workloads.gen_fidelity import perplexity

    assert perplexity(runner.model, [P2]) == pytest.approx(perplexity(model, [P2]), rel=1e-4)
    runner.close()
    assert not work.exists()
    q = build(ctx, names["ort-int8-block32"].params)
    assert q.stats["matmul_nbits"] == {"bits": 8, "block": 32, "accuracy_level": 4}
    q.close()
    spec = build(ctx, names["ort-fp32-int8draft-k4"].params)
    run = spec.generate(P2, 8)
    assert list(run.tokens) == list(generate(model, P2, 8, DecodeConfig(ignore_eos=True)))
    assert run.proposed > 0 and run.steps > 0
    spec.close()
    for bad, why in (({"draft": "int4"}, "not supported"), ({"draft": "ort-int8", "bits": 8}, "FP32 target")):
        with pytest.raises(LatencyLabError, match=why):
            build(ctx, {"runtime": "ort", "bits": 0, "threads": 1, **bad})


def test_a_model_the_graph_does_not_reproduce_is_refused() -> None:
    class Cfg:
        model_type = "gpt2"

    class M:
        config = Cfg()

    with pytest.raises(LatencyLabError, match="Llama-family"):
        check_llama(M())
    from latencylab.optimize.gen_ort import ort_skip

    assert "Llama-family" in (ort_skip(M()) or "")


def test_serve_from_takes_an_ort_choice_and_refuses_a_bad_one() -> None:
    from latencylab.genserve.from_optimize import unservable

    assert unservable({"runtime": "ort", "bits": 8, "block": 32, "accuracy_level": 4, "threads": 1}) is None
    assert unservable({"runtime": "ort", "bits": 0, "threads": 1, "draft": "ort-int8", "k": 4}) is None
    why = unservable({"runtime": "ort", "bits": 0, "threads": 1, "draft": "int4"})
    assert why is not None and "int4" in why


@pytest.mark.parametrize("k", [1, 4])
def test_lookup_speculation_in_the_graph_gives_its_plain_greedy_tokens(tmp_path: Path, k: int) -> None:
    model = tiny(seed=3)
    lm = build_ort_lm(model, tmp_path, threads=1)
    stats = {"proposed": 0, "accepted": 0, "steps": 0}
    # repetitive prompts: the lookup finds n-grams to draft from; a random toy model rejects most of them
    for p in ([5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], P2 + P2, P1):
        plain = lm.generate(p, 16, frozenset(), FakeClock())
        spec = lm.generate_lookup(p, 16, frozenset(), FakeClock(), k=k)
        assert spec.tokens == plain.tokens  # rejected positions cut from the cache, the rest decodes on
        assert len(spec.tokens) == 16
        for key in stats:
            stats[key] += getattr(spec, key)
    assert stats["proposed"] > 0 and stats["steps"] > 0
    assert 0 <= stats["accepted"] <= stats["proposed"]
    eos_run = lm.generate_lookup(P1, 16, frozenset({plain.tokens[2]}), FakeClock(), k=k)
    assert eos_run.tokens == plain.tokens[: plain.tokens.index(plain.tokens[2]) + 1]


def test_drafts_that_are_always_right_are_all_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import latencylab.gen.drafts as drafts

    model = tiny(seed=4)
    lm = build_ort_lm(model, tmp_path, threads=1)
    plain = lm.generate(P1, 20, frozenset(), FakeClock()).tokens
    oracle = list(P1) + list(plain)

    def right(ctx: Any, k: int, **_: Any) -> list[int]:  # the plain greedy continuation: never rejected
        return oracle[len(ctx) : len(ctx) + k]

    monkeypatch.setattr(drafts, "lookup", right)
    spec = lm.generate_lookup(P1, 20, frozenset(), FakeClock(), k=4)
    assert spec.tokens == plain
    assert spec.accepted == spec.proposed > 0
    assert spec.steps <= 5  # 19 tokens after the first, up to 5 a verify step (4 drafts + the model's own)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_model_draft_gives_the_targets_greedy_tokens(tmp_path: Path, k: int) -> None:
    from latencylab.gen.ort_decode import OrtLM
    from latencylab.gen.ort_spec import generate_with_draft

    target_model, other = tiny(seed=5), tiny(seed=6)
    target = build_ort_lm(target_model, tmp_path / "t", threads=1)
    # drafts: the target's own INT8 copy (mostly right) and an unrelated model (mostly wrong)
    quantize_matmuls(target.gen_path, tmp_path / "q8.onnx", bits=8, block=32)
    int8 = OrtLM(tmp_path / "q8.onnx", None, 1, 2, 2, 16)
    wrong = build_ort_lm(other, tmp_path / "o", threads=1, scoring=False)
    for draft, name in ((int8, "int8"), (wrong, "other")):
        tot = {"proposed": 0, "accepted": 0}
        for p in (P1, P2, [9, 9, 9]):
            plain = target.generate(p, 14, frozenset(), FakeClock()).tokens
            spec = generate_with_draft(target, draft, p, 14, frozenset(), FakeClock(), k=k)
            assert spec.tokens == plain, name  # both caches cut back to what was kept, whatever the draft
            tot["proposed"] += spec.proposed
            tot["accepted"] += spec.accepted
            stop = plain[4]
            cut = generate_with_draft(target, draft, p, 14, frozenset({stop}), FakeClock(), k=k).tokens
            assert cut == plain[: plain.index(stop) + 1]
        assert tot["proposed"] > 0
        if name == "int8":  # the INT8 copy agrees with its FP32 graph far more often than a stranger does
            kept_int8 = tot["accepted"] / tot["proposed"]
        else:
            assert tot["accepted"] / tot["proposed"] < kept_int8
    with pytest.raises(ValueError, match="k must be"):
        generate_with_draft(target, int8, P1, 4, frozenset(), FakeClock(), k=0)


def test_the_cache_grows_and_cuts_in_place(tmp_path: Path) -> None:
    """The K/V buffers are written in place: a cache too small for the prompt grows (keeping what it holds), and
    a cut only moves the length back, the next step overwriting the positions after it."""
    model = tiny(seed=7)
    lm = build_ort_lm(model, tmp_path, threads=1, scoring=False)
    plain = lm.generate(P2, 8, frozenset(), FakeClock()).tokens
    cache = lm.empty_cache(3)
    toks: list[int] = []
    logits = lm.run(P2[:5], cache)  # grows 3 -> 6
    logits = lm.run(P2[5:], cache)  # grows again
    assert cache.length == len(P2) and cache.capacity >= len(P2)
    for _ in range(8):
        toks.append(int(logits[-1].argmax()))
        lm.run([toks[-1], 1, 2, 3], cache)  # the token and three wrong positions after it ...
        lm.cut(cache, cache.length - 4)  # ... cut back before the token: the next step writes over them
        logits = lm.run([toks[-1]], cache)
    assert tuple(toks) == plain
