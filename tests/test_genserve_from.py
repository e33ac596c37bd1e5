"""``latencylab serve --model gen --from DIR``: the variant ``optimize --workload gen`` chose, rebuilt from its
recipe and served; the metadata names it; bad directories refused in one line.

On the toy LM of tests/test_gen_optimize.py (a tiny random Llama, vocabulary 40) with a toy tokenizer: the
search writes DIR (its FakeClock makes INT8 dynamic the choice), the server's engine holds that variant (its
logits are the INT8 copy's, not FP32's), answers through it, and says which candidate it serves with the TPOT
p50 and fidelity the search measured. Hand-written recipes cover SmoothQuant with kept layers, BF16, weight-only
INT8 and the refusals (which the CLI gives before any model loads).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import test_gen_optimize as toys  # noqa: E402  (the gen search's toy LM, its FakeClock and its costs)
from genserve_servers import get, post  # noqa: E402
from latencylab.cli import EXIT_USAGE, main  # noqa: E402
from latencylab.clock import FakeClock  # noqa: E402
from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.gen.quant import quantize  # noqa: E402
from latencylab.gen.smooth import smooth  # noqa: E402
from latencylab.genserve.from_optimize import calibration_ids, load_gen_plan  # noqa: E402
from latencylab.genserve.prefill import native_bf16  # noqa: E402
from latencylab.genserve.server import build_service, serve_in_thread  # noqa: E402
from latencylab.genserve.service import GenServeConfig  # noqa: E402
from latencylab.optimize.gen_lab import GenLabConfig, GenSubject  # noqa: E402
from latencylab.workloads.gen_model import LoadedModel  # noqa: E402


class ToyTokenizer:
    """Characters to ids 3..39 of the toy's vocabulary and back; EOS 2; a plain chat template."""

    eos_token_id = toys.EOS

    def __call__(self, text: str, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": [3 + ord(c) % 37 for c in text]}

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return "".join(chr(ord("a") + (i - 3) % 26) for i in ids)

    def apply_chat_template(self, messages: Sequence[dict[str, str]], **_: Any) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class Searched(toys.Toy):
    """The gen search's toy subject (its FakeClock advanced by every forward, at a cost per candidate), without
    ``torch.compiler.disable`` on the hook: importing dynamo takes seconds, and no candidate here compiles."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.state = {"cost": 0.0}
        model = toys.toy_model()
        model.register_forward_pre_hook(lambda m, a, kw: self.clock.advance(self.state["cost"] * toys.MS),
                                        with_kwargs=True)  # fmt: skip
        self.subject = GenSubject(model, toys.toy_inputs(), {"model": "toy", "key": "toy-0"})


def toy_lm(model: Any = None, key: str = "toy-0") -> LoadedModel:
    return LoadedModel(ToyTokenizer(), model if model is not None else toys.toy_model(), Path(key), "toy", False, 0.0)


def logits(model: Any, ids: Sequence[int] = (5, 9, 3, 17, 22, 4, 30)) -> Any:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)])).logits.float()


def served(out: Path, model: Any = None, key: str = "toy-0", **over: Any) -> Any:
    cfg = GenServeConfig(from_dir=str(out), prefix_cache=False, **over)
    return build_service(cfg, lm=toy_lm(model, key), warmup=False)


def write_recipe(out: Path, name: str, family: str, params: dict[str, Any], **more: Any) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    recipe = {
        "kind": "recipe", "schema_version": 1, "workload": "gen", "model": {"model": "toy", "key": "toy-0"},
        "candidate": name, "family": family, "params": params, "exact_by_construction": False,
        "keep_float_layers": None, "threads": 1, "budget": "token_agreement>=0", "tokens": 6, "rounds": 1,
        "calibration": 2, "measured": {"name": name, "tpot_ms": 4.0, "speedup_tpot": 2.5, "token_agreement": 0.5,
                                       "exact": 0.0, "top1": 0.9, "ppl_delta": 0.01},
    } | more  # fmt: skip
    (out / "recipe.json").write_text(json.dumps(recipe))
    return out


# ------------------------------------------------------------------------------------------------ served


def test_the_variant_the_search_chose_is_served_and_named(tmp_path: Path) -> None:
    toy = Searched()
    cfg = GenLabConfig.quick(budget="token_agreement>=0", only=("int8-dynamic",), tokens=6)
    doc = toy.lab(cfg, tmp_path)
    assert doc["summary"]["chosen"] == "int8-dynamic"  # 4 ms a forward against FP32's 10 on the FakeClock
    fp32 = toy.subject.model
    svc = served(tmp_path, fp32, ladder=("int8-dynamic", "int8", "capped"))
    assert [r.name for r in svc.rungs] == ["int8-dynamic", "int8", "capped"]
    # the engine serves the INT8 dynamic copy: its logits are that copy's to the bit, and not FP32's
    got, want, ref = logits(svc.engine.model), logits(quantize(fp32, "dynamic")), logits(fp32)
    assert torch.equal(got, want)
    assert not torch.allclose(got, ref, atol=1e-4)
    cand = next(c for c in doc["candidates"] if c["name"] == "int8-dynamic")
    with serve_in_thread(svc) as url:
        status, body = get(url, "/v1/models")
        assert status == 200
        card = json.loads(body)["data"][0]["latencylab"]
        assert card["candidate"] == "int8-dynamic" and card["from"] == str(tmp_path.resolve())
        assert card["tpot_p50_ms"] == pytest.approx(cand["tpot_p50_ms"]) == pytest.approx(4.0)
        assert card["speedup_tpot"] == pytest.approx(2.5)
        assert card["fidelity"]["token_agreement"] == pytest.approx(cand["fidelity"]["token_agreement"])
        status, body = get(url, "/v2/models/gen")
        meta = json.loads(body)["parameters"]
        assert meta["served"]["candidate"] == "int8-dynamic"
        assert [r["rung"] for r in meta["ladder"]] == ["int8-dynamic", "int8", "capped"]
        assert meta["ladder"][0]["tpot_p50_ms"] == pytest.approx(4.0)
        # an answer comes from it: labelled with its rung, its tokens the INT8 copy's greedy ones
        status, headers, raw = post(url, "/v2/models/gen/generate", {"text_input": "hello", "parameters":
                                                                     {"max_tokens": 5, "temperature": 0}})  # fmt: skip
        assert status == 200, raw
        answer = json.loads(raw)
        assert answer["latencylab"]["rung"] == "int8-dynamic" and headers["x-latencylab-rung"] == "int8-dynamic"
    ids = ToyTokenizer()("hello")["input_ids"]
    with torch.inference_mode():
        greedy = quantize(fp32, "dynamic").generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)
    want_ids = [t for t in greedy[0, len(ids) :].tolist()]
    want_text = ToyTokenizer().decode(want_ids[: want_ids.index(toys.EOS)] if toys.EOS in want_ids else want_ids)
    assert answer["text_output"] == want_text


def test_smoothquant_with_kept_layers_is_rebuilt_as_the_recipe_says(tmp_path: Path) -> None:
    model = toys.toy_model()
    keep = [n for n, _ in model.named_modules() if n.endswith("mlp.down_proj")]
    sm = {"alpha": 0.8, "targets": ["down", "qkv", "gate_up", "head"]}
    params = {"weights": "dynamic-perchannel", "smooth": sm, "keep": "kind:down_proj", "threads": 1}
    write_recipe(tmp_path, "int8-smooth-keep-down", "int8-smooth", params, keep_float_layers=keep)
    svc = served(tmp_path, model)
    eng = svc.engine.model
    mods = dict(eng.named_modules())
    assert all(type(mods[n]) is torch.nn.Linear for n in keep)  # kept in float, the others INT8
    assert type(mods["model.layers.0.self_attn.q_proj"]) is not torch.nn.Linear
    calib = calibration_ids(ToyTokenizer(), 2)  # the search's corpus lines, as its tokenizer reads them
    want = quantize(smooth(model, calib, 0.8, sm["targets"]), "dynamic-perchannel", keep)
    assert torch.equal(logits(eng), logits(want))
    # the smoothing is in it: plain per-channel INT8 with the same kept layers computes other numbers
    assert not torch.allclose(logits(eng), logits(quantize(model, "dynamic-perchannel", keep)), atol=1e-5)
    assert svc.info["int8-smooth-keep-down"]["fidelity"]["ppl_delta"] == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("bf16", {"weights": "fp32", "dtype": "bf16", "threads": 1}),
        ("int8-weight", {"weights": "weight", "threads": 1}),
    ],
)
def test_bf16_and_weight_only_variants_are_served(tmp_path: Path, name: str, params: dict[str, Any]) -> None:
    model = toys.toy_model()
    write_recipe(tmp_path, name, name, params)
    eng = served(tmp_path, model).engine.model
    ref = logits(model)
    if name == "bf16":
        assert next(eng.parameters()).dtype == torch.bfloat16
        assert torch.equal(logits(eng), logits(model.to(torch.bfloat16)))
    else:
        assert not any(isinstance(m, torch.nn.Linear) for m in eng.modules())  # every Linear weight-only INT8
        assert torch.equal(logits(eng), logits(quantize(model, "weight")))
    assert not torch.equal(logits(eng), ref) and torch.allclose(logits(eng), ref, atol=0.1)  # close, not FP32


# ------------------------------------------------------------------------------------------------ refused


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["serve", "--model", "gen", *argv]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_directories_are_refused_in_one_line_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no recipe.json" in _refused(capsys, "--from", str(empty))
    assert "no such directory" in _refused(capsys, "--from", str(tmp_path / "nope"))
    text = write_recipe(tmp_path / "text", "ort-int8", "onnxruntime", {"source": "fp32"}, workload="text")
    assert "workload 'text'" in _refused(capsys, "--from", str(text))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "recipe.json").write_text("[1, 2]")
    assert "not a recipe" in _refused(capsys, "--from", str(foreign))
    nochoice = tmp_path / "nochoice"
    nochoice.mkdir()
    (nochoice / "optimize.json").write_text(json.dumps({"kind": "optimize-gen", "summary": {"verdict": "no gain"}}))
    assert "chose no variant (no gain)" in _refused(capsys, "--from", str(nochoice))
    ok = write_recipe(tmp_path / "ok", "int8-dynamic", "int8-dynamic", {"weights": "dynamic", "threads": 1})
    (ok / "optimize.json").write_text(json.dumps({"kind": "optimize-gen", "summary": {"chosen": "bf16"}}))
    assert "not the same search" in _refused(capsys, "--from", str(ok))
    (ok / "optimize.json").unlink()
    assert "must start with the variant" in _refused(capsys, "--from", str(ok), "--ladder", "fp32,int8")
    assert "must start with the variant" in _refused(capsys, "--from", str(ok), "--ladder", "int8,int8-dynamic")
    # a BF16 prefill beside --from (without native BF16, bf16 itself is refused first)
    why = "--prefill-dtype with --from" if native_bf16() else "no native BF16"
    assert why in _refused(capsys, "--from", str(ok), "--prefill-dtype", "bf16")
    for name, params, why in (
        ("spec-lookup-k4", {"weights": "fp32", "draft": "lookup", "k": 4}, "speculative decoding"),
        ("kv-bf16", {"weights": "fp32", "kv_dtype": "bf16"}, "KV cache"),
        ("compile-decode", {"weights": "fp32", "compile": "inductor"}, "torch.compile"),
        ("int8-mixed", {"weights": "dynamic-perchannel", "keep": "screen"}, "does not record which"),
    ):
        d = write_recipe(tmp_path / name, name, "x", params)
        assert why in _refused(capsys, "--from", str(d)), name


def test_a_recipe_of_another_model_or_with_layers_it_lacks_is_refused(tmp_path: Path) -> None:
    d = write_recipe(tmp_path, "int8-dynamic", "int8-dynamic", {"weights": "dynamic", "threads": 1})
    with pytest.raises(LatencyLabError, match="made on model 'toy-0', this one is 'another'"):
        served(d, key="another")
    write_recipe(tmp_path, "int8-keep", "int8-mixed", {"weights": "dynamic", "keep_float": 1},
                 keep_float_layers=["model.layers.9.mlp.down_proj"])  # fmt: skip
    with pytest.raises(LatencyLabError, match="no Linear layer named"):
        served(d)
    assert load_gen_plan(d).keep == ("model.layers.9.mlp.down_proj",)
