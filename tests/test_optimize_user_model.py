"""``optimize --model`` on a user's model (issue 15): the .npz split, transformer detection, guessed inputs,
checks before the search (writable outputs, budgets), ``--out`` hygiene, temp cleanup, recipes that
travel and check their model, Hugging Face directories. Small models are built here, in tmp dirs."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latencylab.errors import LatencyLabError
from latencylab.optimize import lab
from latencylab.optimize.lab import LabConfig, apply_recipe, run_lab
from latencylab.optimize.lab_summary import input_lines
from latencylab.optimize.search import Budget

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((16, 8)).astype(np.float32)


def _mlp(path: Path, scale: float = 1.0) -> Path:
    """y = relu(x @ W1) @ W2, x: [batch, 16] (two MatMuls: something for INT8 to change)."""
    w2 = np.linspace(-1, 1, 8 * 5, dtype=np.float32).reshape(8, 5) * scale
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "W2"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [onnx.numpy_helper.from_array(W1, "W1"), onnx.numpy_helper.from_array(w2, "W2")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _npz(path: Path, n: int) -> Path:
    """``n`` samples whose first feature is the sample's index (so a feed says which samples it holds)."""
    x = np.random.default_rng(1).standard_normal((n, 16)).astype(np.float32)
    x[:, 0] = np.arange(n)
    np.savez(path, x=x)
    return path


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    return _mlp(tmp_path / "models" / "mlp.onnx")


@pytest.fixture
def no_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks under test must refuse before any model work: building a context fails the test."""

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("the run went past its up-front checks")

    monkeypatch.setattr(lab, "make_context", boom)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from latencylab.cli import main

    rc = main(["optimize", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ 11: the .npz split


def test_npz_samples_split_into_disjoint_sets_all_used(mlp: Path, tmp_path: Path) -> None:
    """64 samples (over the old 32-feed pool): 13 calibrate (every fifth), 51 are held out, none in both."""
    from latencylab.optimize.adapters import OnnxFileAdapter

    a = OnnxFileAdapter(str(mlp), str(_npz(tmp_path / "in.npz", 64)))
    held = sorted(int(v) for f in a.heldout() for v in f["x"][:, 0])
    calib = sorted(int(v) for f in a.calibration() for v in f["x"][:, 0])
    assert calib == list(range(0, 64, 5)) and held == [i for i in range(64) if i % 5]
    d = a.describe()
    assert (d["samples"], d["heldout_samples"], d["calibration_samples"]) == (64, 51, 13)
    assert (d["heldout_feeds"], d["calibration_feeds"]) == (51, 13)
    assert d["inputs_line"] == ("inputs: in.npz, 64 samples: 51 held out (fidelity and latency, 51 feeds of batch 1),"
                                " 13 for calibration (disjoint)")  # fmt: skip
    # at batch 4 the same samples, batched: 13 feeds held out (the last completed from the set's start)
    b = OnnxFileAdapter(str(mlp), str(tmp_path / "in.npz"), batch_size=4)
    held4 = [int(v) for f in b.heldout() for v in f["x"][:, 0]]
    assert len(b.heldout()) == 13 and sorted(set(held4)) == held and not set(held4) & set(calib)


def test_too_few_samples_to_judge_the_budget_are_refused(mlp: Path, tmp_path: Path) -> None:
    from latencylab.optimize.adapters import MIN_HELDOUT, OnnxFileAdapter, min_samples

    assert (MIN_HELDOUT, min_samples()) == (10, 13)
    with pytest.raises(LatencyLabError) as info:
        OnnxFileAdapter(str(mlp), str(_npz(tmp_path / "few.npz", 12)))
    msg = str(info.value)
    assert "\n" not in msg and "few.npz holds 12 sample(s)" in msg
    assert "at least 10 held out, i.e. at least 13 samples (9 held out now)" in msg
    assert OnnxFileAdapter(str(mlp), str(_npz(tmp_path / "ok.npz", 13))).describe()["heldout_samples"] == 10


# ------------------------------------------------------------------ 13: guessed inputs, --seq-len


def test_guessed_inputs_are_distinct_disjoint_and_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No --inputs: 40 generated feeds, none repeated (the old pool cycled 32 into 40, so calibration feeds
    reappeared among the held-out ones); the terminal says what was guessed."""
    from latencylab.optimize.adapters import OnnxFileAdapter

    path = tmp_path / "seqmodel.onnx"
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0, axes=[1])],
        "seq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    a = OnnxFileAdapter(str(path), seq_len=24)
    feeds = [f["x"].tobytes() for f in a.heldout() + a.calibration()]
    assert len(feeds) == len(set(feeds)) == 40 and a.heldout()[0]["x"].shape == (1, 24)  # --seq-len honoured
    assert a.describe()["guessed_dims"] == {"tokens": 24}
    lines = input_lines(a.describe(), 24)
    assert lines == [
        "inputs: guessed (no --inputs), 40 samples: 32 held out (fidelity and latency, 32 feeds of batch 1), "
        "8 for calibration (disjoint)",
        "  guessed x float32 [1, 24]: standard normal",
        "  guessed dimension(s) tokens=24 (from --seq-len; --param dim.tokens=N to choose, or --inputs FILE.npz for "
        "real inputs)",
    ]


def test_a_failing_guess_names_the_fix_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gemm.onnx"
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W"], ["y"])],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [onnx.numpy_helper.from_array(W1, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    rc, _, err = _cli(capsys, "--model", str(path), "--quiet", "--seq-len", "20")
    assert rc == 2 and err.count("\n") == 1
    assert "guessed n=20" in err and "--param dim.n=N" in err and "--inputs FILE.npz" in err


# ------------------------------------------------------------------ 14, 15: refused before the search


def test_unwritable_out_and_json_are_refused_before_the_search(
    mlp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_search: None
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for flag, target, phrase in (
        ("--out", blocker / "best", "cannot be created: " + str(blocker) + " is a file"),
        ("--out", blocker, "is a file, not a directory"),
        ("--json", blocker / "opt.json", "cannot be created"),
        ("--json", tmp_path, "is a directory, not a file"),
    ):
        rc, _, err = _cli(capsys, "--model", str(mlp), "--quiet", flag, str(target))
        assert rc == 2 and err.count("\n") == 1 and phrase in err, (flag, err)
    assert not (blocker.parent / "best").exists()  # nothing created on the way


@pytest.mark.parametrize(
    ("budget", "phrase"),
    [
        ("cos>=1.5", "can never be met: cos lies in [-1, 1]"),
        ("top1>=1.01", "can never be met: top1 lies in [0, 1]"),
        ("accuracy_drop<=150%", "bounds nothing: accuracy_drop lies in [0, 1]"),
        ("", "the budget is empty"),
        ("  ", "the budget is empty"),
        ("cos<=0.9", "from the wrong side"),
        ("max_abs>=0.1", "from the wrong side"),
        ("cos>=0.9.9", "is not understood"),
        ("cos>=.", "is not understood"),
    ],
)
def test_budgets_that_cannot_apply_are_refused(budget: str, phrase: str) -> None:
    with pytest.raises(LatencyLabError) as info:
        Budget.parse(budget)
    assert phrase in str(info.value) and "\n" not in str(info.value)


def test_budgets_at_the_edges_are_accepted() -> None:
    assert Budget.parse("cos>=1").terms == (("cos", ">=", 1.0),)
    assert Budget.parse("accuracy_drop<=100%").terms == (("accuracy_drop", "<=", 1.0),)
    assert Budget.parse("top1>=.99,max_abs<=5").terms == (("top1", ">=", 0.99), ("max_abs", "<=", 5.0))


def test_cli_refuses_budgets_up_front(mlp: Path, capsys: pytest.CaptureFixture[str], no_search: None) -> None:
    for budget in ("cos>=1.5", "top1>=1.01", ""):
        rc, _, err = _cli(capsys, "--model", str(mlp), "--quiet", "--budget", budget)
        assert rc == 2 and err.count("\n") == 1, err


def test_accuracy_drop_without_labels_is_refused_before_the_search(
    mlp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("searched")

    monkeypatch.setattr(lab, "search", boom)
    cfg = LabConfig(workload="onnx", model_path=str(mlp), budget="accuracy_drop<=1%")
    with pytest.raises(LatencyLabError, match=r"accuracy_drop needs task labels and onnx \(mlp.onnx\) has none"):
        run_lab(cfg, workdir=tmp_path / "work")


# ------------------------------------------------------------------ 16: --out hygiene


def _previous_run(out: Path) -> None:
    (out / "rungs").mkdir(parents=True)
    (out / "recipe.json").write_text(json.dumps({"kind": "recipe", "candidate": "old"}))
    (out / "optimize.json").write_text(json.dumps({"kind": "optimize"}))
    (out / "model.onnx").write_bytes(b"the previous model")
    (out / "rungs" / "old-int8.onnx").write_bytes(b"old rung")
    (out / "notes.txt").write_text("the user's")
    (out / "rungs" / "README").write_text("the user's too")


def test_a_run_without_a_choice_clears_the_previous_artifacts_only(
    mlp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "best"
    _previous_run(out)
    # INT8 cannot meet max_abs<=0: no choice, so nothing new is exported
    rc, stdout, _ = _cli(capsys, "--model", str(mlp), "--quiet", "--only", "ort-int8-dynamic-default", "--rounds", "2",
                         "--budget", "max_abs<=0", "--out", str(out))  # fmt: skip
    assert rc == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "notes.txt", "optimize.json", "rungs", "rungs/README"
    ]  # fmt: skip
    doc = json.loads((out / "optimize.json").read_text())
    assert doc["kind"] == "optimize" and doc["summary"]["chosen"] is None
    assert doc["out_removed"] == ["model.onnx", "recipe.json", "optimize.json", "rungs/old-int8.onnx"]
    assert "removed the previous run's model.onnx, recipe.json, optimize.json, rungs/old-int8.onnx" in stdout


def test_out_holding_files_latencylab_did_not_write_is_refused(
    mlp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_search: None
) -> None:
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"someone's model")
    rc, _, err = _cli(capsys, "--model", str(mlp), "--quiet", "--out", str(out))
    assert rc == 2 and "holds model.onnx, which latencylab did not write" in err
    # an earlier run's directory whose model.onnx is this run's --model: refused, never overwritten
    _previous_run(tmp_path / "again")
    rc, _, err = _cli(capsys, "--model", str(tmp_path / "again" / "model.onnx"), "--quiet", "--out",
                      str(tmp_path / "again"))  # fmt: skip
    assert rc == 2 and "would replace model.onnx, this run's input" in err
    assert (tmp_path / "again" / "model.onnx").read_bytes() == b"the previous model"


# ------------------------------------------------------------------ 17: the scratch directory goes


def test_the_scratch_directory_is_removed_on_success_error_and_interrupt(
    mlp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "systemp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    cfg = LabConfig(workload="onnx", model_path=str(mlp), only=("ort-fp32-basic",), rounds=2)
    run_lab(cfg)
    assert os.listdir(scratch) == []
    real = lab.search
    for exc in (KeyboardInterrupt(), RuntimeError("boom")):

        def fail(*a: Any, exc: BaseException = exc, **k: Any) -> Any:
            assert len(list(scratch.glob("latencylab-opt-*"))) == 1  # it existed during the run
            raise exc

        monkeypatch.setattr(lab, "search", fail)
        with pytest.raises(type(exc)):
            run_lab(cfg)
        assert os.listdir(scratch) == []
    monkeypatch.setattr(lab, "search", real)


# ------------------------------------------------------------------ 18: recipes travel and check their model


def test_recipe_has_absolute_paths_and_refuses_another_model_unless_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "proj"
    model = _mlp(work / "mlp.onnx")
    _npz(work / "in.npz", 20)
    monkeypatch.chdir(work)
    real = lab.search

    def choose_basic(*a: Any, **k: Any) -> Any:  # a recipe is written only for a choice: make one
        return dataclasses.replace(real(*a, **k), chosen="ort-fp32-basic")

    monkeypatch.setattr(lab, "search", choose_basic)
    cfg = LabConfig(workload="onnx", model_path="mlp.onnx", inputs_path="in.npz", only=("ort-fp32-basic",), rounds=2)
    run_lab(cfg, tmp_path / "best")
    monkeypatch.setattr(lab, "search", real)
    recipe_path = tmp_path / "best" / "recipe.json"
    recorded = json.loads(recipe_path.read_text())["model"]
    assert recorded["model_path"] == str(model.resolve())
    assert recorded["inputs_path"] == str((work / "in.npz").resolve())
    assert recorded["inputs_sha256"] and recorded["model_sha256"]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    scratch = tmp_path / "systemp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    again = apply_recipe(recipe_path, rounds=2)  # from another directory
    assert [c["name"] for c in again["candidates"]] == ["ort-fp32", "ort-fp32-basic"]
    assert again["recipe"]["forced"] == [] and os.listdir(scratch) == []  # latencylab-recipe-* removed

    _mlp(model, scale=2.0)  # the same path, another model
    with pytest.raises(LatencyLabError) as info:
        apply_recipe(recipe_path, rounds=2)
    assert "is not the model this recipe was made from" in str(info.value) and "--force" in str(info.value)
    rc, _, err = _cli(capsys, "--recipe", str(recipe_path), "--quiet")
    assert rc == 2 and "--force to rebuild anyway" in err
    forced = apply_recipe(recipe_path, rounds=2, force=True)
    assert len(forced["recipe"]["forced"]) == 1 and os.listdir(scratch) == []
    rc, _, err = _cli(capsys, "--model", str(model), "--force", "--quiet")
    assert rc == 2 and "--force only applies with --recipe" in err


# ------------------------------------------------------------------ 12, 19: transformers, Hugging Face directories


def _save_bert(path: Path, classifier: bool = False) -> Path:
    transformers = pytest.importorskip("transformers")
    import torch

    # unusual sizes: 3 heads of 12, a 211-token vocabulary
    kw: dict[str, Any] = dict(vocab_size=211, hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
                              intermediate_size=52, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    if classifier:
        cfg = transformers.BertConfig(num_labels=5, architectures=["BertForSequenceClassification"], **kw)
        transformers.BertForSequenceClassification(cfg).save_pretrained(path)
    else:
        transformers.BertModel(transformers.BertConfig(**kw)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_bert(tmp_path_factory.mktemp("hf") / "tinybert")


def test_a_bert_style_onnx_file_gets_the_fusion_candidates(bert_dir: Path, tmp_path: Path) -> None:
    """A user's BERT ONNX (not the built-in text model): detected as an encoder, its hidden size and heads
    read from the graph, the transformer optimizer fuses its attention; the guessed ids stay in its vocabulary."""
    from latencylab.optimize.families.onnxruntime import detect_encoder
    from latencylab.optimize.hf_export import export_directory

    path = tmp_path / "bert.onnx"
    export_directory(bert_dir, path)
    assert detect_encoder(path) == {"model_type": "bert", "num_heads": 3, "hidden_size": 36}
    assert detect_encoder(_mlp(tmp_path / "mlp.onnx")) is None
    cfg = LabConfig(workload="onnx", model_path=str(path), only=("ort-fp32-fused",), rounds=2, seq_len=16)
    doc = run_lab(cfg, workdir=tmp_path / "work")
    fused = doc["candidates"][1]
    assert fused["name"] == "ort-fp32-fused" and fused["status"] in ("inside-budget", "outside-budget"), fused["reason"]
    assert fused["stats"]["fusion"] == {"model_type": "bert", "num_heads": 3, "hidden_size": 36}
    assert fused["stats"]["fusions"]["Attention"] == 2 and fused["fidelity"]["cos_min"] > 0.999
    guessed = {g["name"]: g for g in doc["model"]["guessed_inputs"]}
    assert guessed["input_ids"]["shape"] == [1, 16] and "0..210" in guessed["input_ids"]["values"]
    assert guessed["attention_mask"]["values"].startswith("1 everywhere")


def test_a_hugging_face_directory_is_exported_and_optimised(
    bert_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "systemp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "opt.json"
    rc, stdout, _ = _cli(capsys, "--model", str(bert_dir), "--only", "ort-fp32-basic", "--rounds", "2", "--seq-len",
                         "12", "--quiet", "--json", str(out))  # fmt: skip
    assert rc == 0
    doc = json.loads(out.read_text())
    m = doc["model"]
    assert m["model_path"] == str(bert_dir.resolve()) and m["exported"]["architecture"] == "BertModel"
    assert m["output_kind"] == "embedding" and doc["summary"]["budget"] == "cos>=0.99,min_cos>=0.98"
    assert m["model_sha256"] == __import__("latencylab.optimize.adapters", fromlist=["x"]).model_digest(bert_dir)
    assert "guessed input_ids int64 [1, 12]" in stdout
    assert os.listdir(scratch) == []  # the export lived in the run's scratch directory


def test_a_hugging_face_classifier_is_judged_by_top1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _save_bert(tmp_path / "tinycls", classifier=True)
    out = tmp_path / "opt.json"
    rc, _, _ = _cli(capsys, "--model", str(path), "--only", "ort-fp32-basic", "--rounds", "2", "--seq-len", "8",
                    "--quiet", "--json", str(out))  # fmt: skip
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["model"]["output_kind"] == "logits" and doc["model"]["exported"]["output"] == "logits"
    assert doc["summary"]["budget"] == "top1>=0.99"  # no labels: agreement with FP32, not accuracy_drop


def test_a_directory_that_is_not_a_model_says_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    rc, _, err = _cli(capsys, "--model", str(tmp_path / "empty"), "--quiet")
    assert rc == 2 and err.count("\n") == 1
    assert "without config.json or model.onnx" in err and "save_pretrained" in err


def test_a_directory_holding_model_onnx_is_used_as_it_is(mlp: Path, tmp_path: Path) -> None:
    """An ``optimum-cli export onnx`` output: DIR/model.onnx is the model; the recipe's hash covers it."""
    from latencylab.optimize.adapters import OnnxFileAdapter, model_digest

    d = tmp_path / "optimum-out"
    _mlp(d / "model.onnx")
    a = OnnxFileAdapter(str(d))
    assert a.model_path == str((d / "model.onnx").resolve()) and a.describe()["model_path"] == str(d.resolve())
    before = a.describe()["model_sha256"]
    assert before == model_digest(d)
    _mlp(d / "model.onnx", scale=3.0)
    assert model_digest(d) != before


def test_options_that_would_be_ignored_are_refused(
    mlp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_search: None
) -> None:
    from latencylab.optimize.adapters import adapter_for

    rc, _, err = _cli(capsys, "--recipe", str(tmp_path / "recipe.json"), "--out", str(tmp_path / "o"), "--quiet")
    assert rc == 2 and "--out does not apply with --recipe" in err
    with pytest.raises(LatencyLabError, match=r"--workload vision takes no --param \(got \['res'\]\)"):
        adapter_for("vision", params={"res": "32"})


def test_a_graph_with_unnamed_nodes_gets_its_fallback_recipes(tmp_path: Path) -> None:
    """The quantiser keeps nodes in float by name: an export names the unnamed ones (it once failed the fallback
    recipes of such a graph with "unknown node(s) ['<unnamed node 0>', ...]")."""
    from onnx_models import deep_mlp

    deep_mlp(tmp_path / "deep.onnx", layers=4)
    cfg = LabConfig(workload="onnx", model_path=str(tmp_path / "deep.onnx"), only=("ort-int8-dynamic-fallback-k2",),
                    rounds=2)  # fmt: skip
    doc = run_lab(cfg, workdir=tmp_path / "work")
    got = {c["name"]: c for c in doc["candidates"]}["ort-int8-dynamic-fallback-k2"]
    assert got["status"] in ("inside-budget", "outside-budget"), got["reason"]
    saved = onnx.load(str(tmp_path / "work" / "fp32.onnx"))
    assert all(n.name for n in saved.graph.node) and len({n.name for n in saved.graph.node}) == 8
    assert onnx.load(str(tmp_path / "deep.onnx")).graph.node[0].name == ""  # the user's file is left as it was
