"""The ONNX Runtime engine of ``serve --model gen --from`` (genserve/ort_engine.py) on a tiny random Llama: served
greedy answers equal the graph's plain greedy decoding token for token, with no draft, prompt lookup or a model
draft, sequences joining and leaving the batch; a sampled sequence's tokens drawn through draft-and-verify steps
follow the target's distribution (the rejection rule, checked by a chi-square test against the exact
probabilities); an ``ort-*`` recipe is served, with the draft it names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from latencylab.clock import FakeClock  # noqa: E402
from latencylab.gen.ort_decode import OrtLM, build_ort_lm  # noqa: E402
from latencylab.gen.ort_llama import quantize_matmuls  # noqa: E402
from latencylab.genserve.ort_engine import OrtEngine  # noqa: E402
from latencylab.genserve.scheduler import GenRequest, Sampling, Scheduler, SchedulerConfig, Seq  # noqa: E402
from test_gen_ort import tiny  # noqa: E402

VOCAB = 64


def _prompt(n: int, seed: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(int(x) for x in torch.randint(3, VOCAB, (n,), generator=g))


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    d = tmp_path_factory.mktemp("ort")
    target = build_ort_lm(tiny(seed=11), d / "t", threads=1)
    quantize_matmuls(target.gen_path, d / "q8.onnx", bits=8, block=32)
    int8 = OrtLM(d / "q8.onnx", None, 1, target.layers, target.kv_heads, target.head_dim)
    other = build_ort_lm(tiny(seed=12), d / "o", threads=1, scoring=False)  # a draft that is mostly wrong
    return target, int8, other


@pytest.mark.parametrize("draft", ["none", "lookup", "int8", "other"])
def test_served_greedy_answers_equal_the_graphs_plain_decoding(graphs: Any, draft: str) -> None:
    target, int8, other = graphs
    d = {"none": None, "lookup": "lookup", "int8": int8, "other": other}[draft]
    base = _prompt(8, 3)
    prompts = [base * 3, _prompt(17, 4), _prompt(11, 5), base + _prompt(20, 6), _prompt(5, 8)]
    n = 24
    cfg = SchedulerConfig(max_num_seqs=3, prefill_chunk_tokens=16)
    engine = OrtEngine(target, d, k=4, spec_max_batch=2)
    sched = Scheduler(engine, cfg)
    seqs = [sched.submit(GenRequest(p, n)) for p in prompts]
    while sched.step() is not None:
        pass
    for p, s in zip(prompts, seqs, strict=True):
        assert tuple(s.tokens) == target.generate(list(p), n, frozenset(), FakeClock()).tokens, f"prompt {len(p)}"
    if draft in ("int8", "other"):  # drafts in the steps with at most 2 sequences decoding
        assert sched.spec_proposed > 0 and 0 <= sched.spec_accepted <= sched.spec_proposed
    if draft == "int8":
        assert sched.spec_accepted > sched.spec_proposed / 2  # the INT8 copy mostly agrees with its FP32 graph
    if draft == "none":
        assert sched.spec_proposed == 0
    assert engine.kv_bytes == 0  # every sequence's buffers released


def test_sampled_draft_and_verify_keeps_the_targets_distribution(graphs: Any) -> None:
    """The first token a verify step yields after a fixed context, over many seeded trials, against the target's
    exact next-token distribution (temperature 1): a draft that is often wrong (another model) forces the
    residual draws the rule depends on."""
    scipy_stats = pytest.importorskip("scipy.stats")
    import numpy as np

    target, _, other = graphs
    p = _prompt(9, 21)
    eng = OrtEngine(target, other, k=3)
    first = 7
    cache = target.empty_cache(len(p) + 1)
    probs = torch.softmax(torch.from_numpy(target.run([*p, first], cache)[-1]), -1).numpy()
    trials = 3000
    counts = np.zeros(VOCAB)
    rejected = 0
    for i in range(trials):
        s = Seq(i, GenRequest(p, 8, Sampling(1.0, 1.0, seed=1000 + i)), 0)
        eng.prefill(s, 0, len(p))  # its sampled first token is replaced by a fixed one: the context is fixed
        s.tokens.append(first)
        new, drafted = eng._verify(s)
        assert drafted == 3
        counts[new[0]] += 1
        rejected += len(new) == 1
        eng.release(s)
    assert rejected > trials / 10  # the residual distribution was drawn from often
    big = probs * trials >= 5  # chi-square over the tokens expected 5+ times, the rest lumped
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(probs[big], probs[~big].sum()) * trials
    _, pvalue = scipy_stats.chisquare(obs, exp / exp.sum() * obs.sum())
    assert pvalue > 0.001, (pvalue, obs, exp)


def test_an_ort_recipe_is_served_with_its_draft(graphs: Any) -> None:
    from latencylab.genserve.from_optimize import ort_engine, unservable

    model = tiny(seed=11)
    eng = ort_engine(model, {"runtime": "ort", "bits": 0, "threads": 1, "draft": "ort-int8", "k": 4}, 1)
    assert isinstance(eng, OrtEngine) and isinstance(eng.draft, OrtLM) and eng.k == 4
    target = graphs[0]
    p = _prompt(12, 2)
    s = Seq(1, GenRequest(p, 10), 0)
    s.tokens.append(eng.prefill(s, 0, len(p)))  # type: ignore[arg-type]
    while len(s.tokens) < 10:
        _, outs, _, _ = eng.mixed_drafted([], [s])
        s.tokens.extend(outs[0][: 10 - len(s.tokens)])
    assert tuple(s.tokens) == target.generate(list(p), 10, frozenset(), FakeClock()).tokens
    assert unservable({"runtime": "ort", "bits": 8, "block": 32, "accuracy_level": 4, "threads": 1}) is None
    assert "FP32 graph" in (unservable({"runtime": "ort", "bits": 8, "draft": "ort-int8"}) or "")
    assert "unknown" in (unservable({"runtime": "ort", "dtype": "bf16"}) or "")
    assert Path(eng.target.gen_path).exists()
