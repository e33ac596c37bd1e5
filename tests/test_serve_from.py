"""``latencylab serve --from DIR``: the ladder read off an optimize run, served; bad directories refused.

Fast tier: the rung rule on hand-written search records; real (tiny) ONNX graphs with the text interface
served in-process from a hand-built directory; every bad input through the CLI. Slow tier: a real optimize
run (text, three ONNX Runtime candidates) served by the real server process and asked through tritonclient;
a vision run served in-process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from starlette.testclient import TestClient  # noqa: E402

from latencylab.cli import EXIT_USAGE, main  # noqa: E402
from latencylab.serve.app import build_state, lifespan_app  # noqa: E402
from latencylab.serve.config import ModelConfig, ServerConfig, default_config, parse_config  # noqa: E402
from latencylab.serve.from_optimize import assign_rungs, load_plan  # noqa: E402
from latencylab.serve.frontend import load_variants  # noqa: E402
from ov_tiny import text_interface_onnx  # noqa: E402

# ------------------------------------------------------------------------------------------------ the rule


def _cand(name: str, p50: float, status: str = "inside-budget", int8: bool = False, cos: float = 0.995) -> dict:
    q = {"mode": "dynamic"} if int8 else None
    return {
        "name": name,
        "backend": "onnxruntime",
        "status": status,
        "p50_ms": p50,
        "fidelity": {"cos_mean": cos, "cos_min": cos - 0.01},
        "params": {"source": "fp32", "graph_optimization": "all", "quantization": q},
    }


SEARCH = [
    {**_cand("torch-fp32", 50.0, "baseline", cos=1.0), "backend": "torch"},
    _cand("ort-fp32", 30.0, cos=1.0),
    _cand("int8-fast-bad", 12.0, "outside-budget", int8=True, cos=0.95),
    _cand("int8-good", 20.0, int8=True, cos=0.992),
    _cand("int8-better", 25.0, int8=True, cos=0.997),
    _cand("int8-skipped", 0.0, "skipped", int8=True) | {"p50_ms": None},
]


def test_rule_primary_is_the_choice_lighter_the_fastest_faster_front_member_quantized_the_fastest_int8() -> None:
    pareto = ["int8-fast-bad", "int8-good", "int8-better", "ort-fp32"]
    everything = {c["name"]: "x.onnx" for c in SEARCH if c["backend"] == "onnxruntime"}
    # The choice is ort-fp32: the lighter rung is the fastest front member faster than it (outside the budget:
    # it trades fidelity for time); the standby is the fastest INT8 candidate inside the budget.
    rungs, absent = assign_rungs("ort-fp32", SEARCH, pareto, everything)
    assert rungs == [("primary", "ort-fp32"), ("lighter", "int8-fast-bad"), ("quantized", "int8-good")]
    assert absent == []
    # Only candidates with an artifact fill a rung: without int8-fast-bad's file the next faster front member
    # (int8-good) becomes the lighter rung, and the standby moves on to int8-better.
    some = {n: f for n, f in everything.items() if n != "int8-fast-bad"}
    rungs, absent = assign_rungs("ort-fp32", SEARCH, pareto, some)
    assert rungs == [("primary", "ort-fp32"), ("lighter", "int8-good"), ("quantized", "int8-better")]
    # An INT8 primary: the standby is the next INT8 candidate inside the budget.
    rungs, absent = assign_rungs("int8-good", SEARCH, pareto, everything)
    assert rungs == [("primary", "int8-good"), ("lighter", "int8-fast-bad"), ("quantized", "int8-better")]


def test_rule_leaves_out_what_the_search_cannot_fill_and_says_why() -> None:
    pareto = ["int8-fast-bad", "int8-good", "ort-fp32"]
    # The fastest candidate as primary: nothing on the front is faster.
    rungs, absent = assign_rungs("int8-fast-bad", SEARCH, pareto, {"int8-good": "a.onnx"})
    assert rungs == [("primary", "int8-fast-bad"), ("quantized", "int8-good")]
    assert absent == [("lighter", "no Pareto-front candidate is faster than the primary (12.000 ms)")]
    # Faster candidates exist but have no file; INT8 ones inside the budget too.
    rungs, absent = assign_rungs("ort-fp32", SEARCH, pareto, {})
    assert rungs == [("primary", "ort-fp32")]
    assert absent == [
        (
            "lighter",
            "no ONNX artifact for the Pareto-front candidates faster than the primary: int8-fast-bad, int8-good",
        ),
        ("quantized", "no ONNX artifact for the INT8 candidates inside the budget: int8-good, int8-better"),
    ]
    # The only INT8 candidates inside the budget are already rungs: none is invented.
    only = [c for c in SEARCH if c["name"] in ("ort-fp32", "int8-good")]
    rungs, absent = assign_rungs("ort-fp32", only, ["int8-good", "ort-fp32"], {"int8-good": "a.onnx"})
    assert rungs == [("primary", "ort-fp32"), ("lighter", "int8-good")]
    assert absent == [("quantized", "no INT8 candidate inside the budget other than the rungs above")]


# ------------------------------------------------------------------------------------- tiny real ONNX graphs


def _foreign_onnx(path: Path) -> Path:
    """A real ONNX graph with another interface (x float -> y)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "foreign",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _hand_dir(root: Path) -> Path:
    """An optimize output directory as the contract describes it, over tiny real graphs and the SEARCH records."""
    text_interface_onnx(root / "model.onnx", 1.0)
    rungs = {}
    for i, name in enumerate(("int8-fast-bad", "int8-good", "int8-better", "ort-fp32")):
        text_interface_onnx(root / "rungs" / f"{name}.onnx", 2.0 + i)
        rungs[name] = f"rungs/{name}.onnx"
    chosen = next(c for c in SEARCH if c["name"] == "ort-fp32")
    recipe = {
        "kind": "recipe",
        "workload": "text",
        "candidate": "ort-fp32",
        "backend": "onnxruntime",
        "params": chosen["params"],
        "threads": 1,
        "budget": "cos>=0.99,min_cos>=0.98",
        "measured": {"name": "ort-fp32", "p50_ms": 30.0, "cos_mean": 1.0, "cos_min": 0.99},
        "artifact": "model.onnx",
        "rungs": rungs,
        "input_policy": "as-given",
    }
    doc = {
        "kind": "optimize",
        "candidates": SEARCH,
        "summary": {
            "pareto": ["int8-fast-bad", "int8-good", "int8-better", "ort-fp32"],
            "chosen": {"name": "ort-fp32"},
        },
    }
    (root / "recipe.json").write_text(json.dumps(recipe))
    (root / "optimize.json").write_text(json.dumps(doc))
    return root


def _text_request(texts: list[str]) -> dict[str, Any]:
    return {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}


def test_a_hand_built_directory_is_served_with_its_ladder_and_metadata(tmp_path: Path) -> None:
    root = _hand_dir(tmp_path / "best")
    plan = load_plan(root)
    assert plan.ladder == ("ort-fp32", "int8-fast-bad", "int8-good", "cache")
    assert plan.lines()[1:4] == [
        "primary: ort-fp32 (model.onnx; inside-budget): p50 30.000 ms, cos_mean 1.0000, cos_min 0.9900",
        "lighter: int8-fast-bad (rungs/int8-fast-bad.onnx; outside-budget): p50 12.000 ms, cos_mean 0.9500, "
        "cos_min 0.9400",
        "quantized: int8-good (rungs/int8-good.onnx; inside-budget): p50 20.000 ms, cos_mean 0.9920, cos_min 0.9820",
    ]
    cfg = ServerConfig(
        models=(ModelConfig(name="text", ladder=plan.ladder, from_optimize=str(root), max_batch_size=4),),
        preprocess_threads=0,
    )
    variants = load_variants(cfg.models[0], "cpu")
    assert [(v.name, v.kind) for v in variants] == [
        ("ort-fp32", "primary"),
        ("int8-fast-bad", "lighter"),
        ("int8-good", "quantized"),
    ]
    state = build_state(cfg, {"text": variants})
    with TestClient(lifespan_app(state)) as client:
        meta = client.get("/v2/models/text").json()
        assert meta["versions"] == ["ort-fp32", "int8-fast-bad", "int8-good", "cache"]
        assert meta["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 4]}]
        ladder = meta["parameters"]["ladder"]
        assert [(r["version"], r["rung"]) for r in ladder] == [
            ("ort-fp32", "primary"),
            ("int8-fast-bad", "lighter"),
            ("int8-good", "quantized"),
            ("cache", "cache"),
        ]
        assert ladder[1]["p50_ms"] == 12.0 and ladder[1]["fidelity"] == {"cos_mean": 0.95, "cos_min": 0.94}
        assert ladder[1]["status"] == "outside-budget" and ladder[1]["int8"] is True
        assert ladder[0]["artifact"] == "model.onnx" and ladder[0]["int8"] is False
        assert meta["parameters"]["absent"] == []
        assert meta["parameters"]["source"]["budget"] == "cos>=0.99,min_cos>=0.98"
        # Each rung runs its own file: the graphs differ only by their scale (1, 2, 3).
        outs = {}
        for version in ("ort-fp32", "int8-fast-bad", "int8-good"):
            r = client.post(f"/v2/models/text/versions/{version}/infer", json=_text_request(["hello world"]))
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["model_version"] == version
            outs[version] = np.asarray(body["outputs"][0]["data"], dtype=np.float32)
        base = outs["ort-fp32"]
        assert base[0] > 0
        assert np.allclose(outs["int8-fast-bad"], 2 * base, rtol=1e-5)
        assert np.allclose(outs["int8-good"], 3 * base, rtol=1e-5)
        r = client.post("/v2/models/text/infer", json=_text_request(["hello world"]))
        assert r.status_code == 200 and r.json()["model_version"] == "ort-fp32"


def test_missing_rungs_are_left_out_with_reasons_never_invented(tmp_path: Path) -> None:
    root = _hand_dir(tmp_path / "best")
    recipe = json.loads((root / "recipe.json").read_text())
    (root / "rungs" / "int8-good.onnx").unlink()  # listed but gone
    _foreign_onnx(root / "rungs" / "int8-better.onnx")  # listed but not a text model
    recipe["rungs"] = {k: v for k, v in recipe["rungs"].items() if k != "int8-fast-bad"}  # not exported
    (root / "recipe.json").write_text(json.dumps(recipe))
    plan = load_plan(root)
    assert plan.ladder == ("ort-fp32", "cache")
    assert plan.absent == (
        (
            "lighter",
            "no ONNX artifact for the Pareto-front candidates faster than the primary: int8-fast-bad, int8-good, "
            "int8-better",
        ),
        ("quantized", "no ONNX artifact for the INT8 candidates inside the budget: int8-good, int8-better"),
    )
    assert [name for name, _ in plan.dropped] == ["int8-good", "int8-better"]
    assert "an ONNX text model takes input_ids and attention_mask" in plan.dropped[1][1]
    assert "lighter: absent (no ONNX artifact" in "\n".join(plan.lines())
    # Without optimize.json only the choice is known: primary + cache.
    (root / "optimize.json").unlink()
    os.utime(root / "recipe.json", ns=(time.time_ns(), time.time_ns() + 10**9))  # a new version of the directory
    plan = load_plan(root)
    assert plan.ladder == ("ort-fp32", "cache")
    assert plan.rungs[0].p50_ms == 30.0  # what the recipe measured
    assert [role for role, _ in plan.absent] == ["lighter", "quantized"]


def test_a_config_file_can_serve_an_optimize_directory_without_naming_its_ladder(tmp_path: Path) -> None:
    root = _hand_dir(tmp_path / "best")
    cfg = parse_config({"models": [{"name": "minilm", "from_optimize": str(root)}]})
    assert cfg.models[0].ladder == ("ort-fp32", "int8-fast-bad", "int8-good", "cache")


def test_the_default_text_ladder_starts_on_onnx_runtime() -> None:
    # docs/serve.md: fp32-onnx is the text rung to serve on a CPU; a GPU server keeps torch fp32 first.
    assert default_config("text").models[0].ladder == ("fp32-onnx", "trunc64", "int8", "cache")
    assert default_config("vision").models[0].ladder == ("fp32", "res32", "int8", "cache")
    from latencylab.serve.config import default_ladder

    assert default_ladder("text", "cuda") == ("fp32", "trunc64", "int8", "cache")


# ------------------------------------------------------------------------------------------- bad input


def _serve_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc = main(["serve", "--port", "0", *args])
    err = capsys.readouterr().err
    assert rc == EXIT_USAGE, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("latencylab serve: error: ")
    return lines[0]


def test_bad_directories_get_one_line_and_a_usage_exit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _serve_error(capsys, "--from", str(empty)) == (
        f"latencylab serve: error: {empty}: no recipe.json: not an output directory of latencylab optimize --out"
    )
    assert "no such directory" in _serve_error(capsys, "--from", str(tmp_path / "nowhere"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "recipe.json").write_text(json.dumps({"kind": "optimize", "summary": {}}))
    assert _serve_error(capsys, "--from", str(foreign)).endswith(
        "recipe.json: not a latencylab recipe (kind 'optimize', expected 'recipe')"
    )
    (foreign / "recipe.json").write_text("{not json")
    assert _serve_error(capsys, "--from", str(foreign)).endswith("recipe.json: not a readable recipe (JSONDecodeError)")

    good = _hand_dir(tmp_path / "best")
    recipe = json.loads((good / "recipe.json").read_text())

    def variant(name: str, **changes: Any) -> Path:
        d = tmp_path / name
        shutil.copytree(good, d)
        (d / "recipe.json").write_text(json.dumps({**recipe, **changes}))
        return d

    d = variant("gone")
    (d / "model.onnx").unlink()
    assert _serve_error(capsys, "--from", str(d)) == (
        f"latencylab serve: error: {d / 'model.onnx'}: the recipe's artifact is missing"
    )
    d = variant("wrong-interface")
    _foreign_onnx(d / "model.onnx")
    assert _serve_error(capsys, "--from", str(d)) == (
        f"latencylab serve: error: {d / 'model.onnx'}: an ONNX text model takes input_ids and attention_mask, "
        "tensor(int64); this one takes x tensor(float)"
    )
    d = variant("text-as-vision", workload="vision")
    assert "an ONNX vision model takes one input, pixels tensor(float)" in _serve_error(capsys, "--from", str(d))
    d = variant("garbage")
    (d / "model.onnx").write_bytes(b"not a protobuf")
    assert "model.onnx: ONNX Runtime cannot load it" in _serve_error(capsys, "--from", str(d))
    d = variant("unknown-workload", workload="onnx")
    assert _serve_error(capsys, "--from", str(d)).endswith(
        "recipe.json: workload 'onnx' cannot be served: serve --from knows text, vision"
    )
    d = variant("generative", workload="gen")
    assert _serve_error(capsys, "--from", str(d)).endswith(
        "recipe.json: a generative search's choice: serve it with `serve --model gen --from DIR`"
    )
    d = variant("torch", artifact="model.pt", backend="torch", candidate="ort-fp32")
    err = _serve_error(capsys, "--from", str(d))
    assert "model.pt, not ONNX, OpenVINO IR or a route: only those can be served" in err
    d = variant("other-search", candidate="int8-good")
    assert _serve_error(capsys, "--from", str(d)).endswith(
        "recipe.json chose int8-good but optimize.json chose ort-fp32: not the same search"
    )
    assert _serve_error(capsys, "--from", str(good), "--model", "text") == (
        "latencylab serve: error: give one of --config, --model or --from"
    )


def test_bad_directory_through_the_real_command_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "latencylab", "serve", "--from", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.splitlines() == [
        f"latencylab serve: error: {tmp_path}: no recipe.json: not an output directory of latencylab optimize --out"
    ]
    assert proc.stdout == ""


# ------------------------------------------------------------------------------ a real optimize run, served


def _optimize(tmp: Path, workload: str, only: tuple[str, ...]) -> Path:
    from latencylab.optimize.lab import LabConfig, run_lab

    # 30 calls per candidate and input set: enough for the choice's p50 CI to clear the baseline's on a busy machine
    cfg = LabConfig(workload=workload, only=only, rounds=6, per_round=5, time_budget_s=None)
    out = tmp / "best"
    doc = run_lab(cfg, out, workdir=tmp / "work")
    assert doc["summary"]["chosen"] is not None, doc["summary"]
    assert (out / "optimize.json").is_file() and "rungs" in json.loads((out / "recipe.json").read_text())
    return out


@pytest.fixture(scope="module")
def text_best(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # FP32 and three INT8 recipes, 1.2-6x faster than eager torch: inside the budget and outside, on the front
    only = ("ort-fp32", "ort-int8-dynamic-default", "ort-int8-dynamic-perchannel", "ort-int8-dynamic-fused-perchannel")
    return _optimize(tmp_path_factory.mktemp("opt-text"), "text", only)


@pytest.fixture(scope="module")
def text_server(text_best: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "latencylab", "serve", "--from", str(text_best), "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 600
    url = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("listening "):
            url = line.split(" ", 1)[1].strip()
            break
        if not line and proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read() if proc.stderr else ''}")
    if url is None:
        proc.kill()
        raise RuntimeError("server did not start in time")
    try:
        yield url, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _expected_ladder(best: Path) -> tuple[list[tuple[str, str]], dict[str, dict[str, Any]]]:
    """The documented rule, checked rung by rung against the search's own records (docs/serve.md)."""
    recipe = json.loads((best / "recipe.json").read_text())
    doc = json.loads((best / "optimize.json").read_text())
    by = {c["name"]: c for c in doc["candidates"]}
    served = set(recipe["rungs"]) - {recipe["candidate"]}
    primary = recipe["candidate"]
    p0 = by[primary]["p50_ms"]
    faster = [n for n in doc["summary"]["pareto"] if n in served and by[n]["p50_ms"] < p0]
    ladder = [("primary", primary)]
    if faster:
        ladder.append(("lighter", min(faster, key=lambda n: by[n]["p50_ms"])))
    used = {n for _, n in ladder}
    int8 = [
        n
        for n in served - used
        if by[n]["params"].get("quantization") is not None and by[n]["status"] == "inside-budget"
    ]
    if int8:
        ladder.append(("quantized", min(int8, key=lambda n: by[n]["p50_ms"])))
    return ladder, by


@pytest.mark.slow
def test_optimize_then_serve_from_its_directory(text_best: Path, text_server: tuple[str, Any]) -> None:
    import tritonclient.http as httpclient

    from latencylab.workloads.text import corpus, embedding_module, load_model

    url, proc = text_server
    expected, by = _expected_ladder(text_best)
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_server_ready() and client.is_model_ready("text")
    meta = client.get_model_metadata("text")
    assert meta["versions"] == [n for _, n in expected] + ["cache"]
    ladder = meta["parameters"]["ladder"]
    assert [(r["rung"], r["version"]) for r in ladder] == [*expected, ("cache", "cache")]
    for r in ladder[:-1]:
        c = by[r["version"]]
        assert r["candidate"] == r["version"] and r["status"] == c["status"]
        assert r["p50_ms"] == c["p50_ms"]
        assert r["fidelity"] == {k: v for k, v in c["fidelity"].items() if k in r["fidelity"]}
        assert r["fidelity"]["cos_mean"] == c["fidelity"]["cos_mean"]
    assert {a["rung"] for a in meta["parameters"]["absent"]} == {"primary", "lighter", "quantized"} - {
        role for role, _ in expected
    }

    # Every rung answers with a real embedding, close to the FP32 model's by as much as the search measured.
    tok, encoder = load_model(attn="eager")
    text = corpus()[7]
    import torch

    enc = tok([text], return_tensors="pt")
    with torch.inference_mode():
        ref = embedding_module(encoder)(enc["input_ids"], enc["attention_mask"]).numpy()[0]
    for rung in ["", *(n for _, n in expected)]:
        inp = httpclient.InferInput("TEXT", [1], "BYTES")
        inp.set_data_from_numpy(np.array([text.encode()], dtype=object), binary_data=False)
        out = httpclient.InferRequestedOutput("EMBEDDING", binary_data=False)
        result = client.infer("text", [inp], outputs=[out], model_version=rung)
        emb = result.as_numpy("EMBEDDING")
        assert emb.shape == (1, 384)
        producer = result.get_response()["model_version"]
        assert producer == (rung or expected[0][1])
        cos = float(emb[0] @ ref / np.linalg.norm(emb[0]) / np.linalg.norm(ref))
        assert cos > by[producer]["fidelity"]["cos_min"] - 0.02, (producer, cos)

    # The startup log names the candidate of every rung, with its p50 and fidelity.
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    log = proc.stderr.read()
    for role, name in expected:
        assert f"model text: {role}: {name} (" in log
        assert f"p50 {by[name]['p50_ms']:.3f} ms, cos_mean {by[name]['fidelity']['cos_mean']:.4f}" in log
    for role in {"lighter", "quantized"} - {r for r, _ in expected}:
        assert f"model text: {role}: absent (" in log


@pytest.mark.slow
def test_a_vision_search_is_served_from_its_directory(tmp_path: Path) -> None:
    import base64

    from latencylab.workloads.vision import heldout_set

    best = _optimize(tmp_path, "vision", ("ort-fp32",))
    plan = load_plan(best)
    assert plan.workload == "vision" and plan.rungs[0].candidate == "ort-fp32"
    cfg = ServerConfig(
        models=(ModelConfig(name="vision", ladder=plan.ladder, from_optimize=str(best)),), preprocess_threads=0
    )
    state = build_state(cfg, {"vision": load_variants(cfg.models[0], "cpu")})
    data = heldout_set()
    with TestClient(lifespan_app(state)) as client:
        meta = client.get("/v2/models/vision").json()
        assert meta["versions"][0] == "ort-fp32" and meta["versions"][-1] == "cache"
        assert meta["parameters"]["ladder"][0]["fidelity"]["accuracy"] == plan.rungs[0].fidelity["accuracy"]
        right = 0
        for i in range(20):
            body = {
                "inputs": [
                    {
                        "name": "IMAGE",
                        "datatype": "BYTES",
                        "shape": [1],
                        "data": [base64.b64encode(data.jpegs[i]).decode()],
                    }
                ]
            }
            r = client.post("/v2/models/vision/infer", json=body)
            assert r.status_code == 200, r.text
            outs = {o["name"]: o for o in r.json()["outputs"]}
            assert outs["PROBABILITIES"]["shape"] == [1, 10]
            right += outs["CLASS"]["data"][0] == data.labels[i]
        assert right >= 18  # the digits CNN is 0.997 accurate held out
