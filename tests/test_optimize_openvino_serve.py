"""``latencylab serve --from DIR`` where the search chose an OpenVINO candidate: the IR is the primary rung,
served by OpenVINO beside ONNX Runtime rungs; an IR without the serving interface is refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("openvino", reason="OpenVINO is not installed: pip install 'latencylab[openvino]'")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from starlette.testclient import TestClient

from latencylab.errors import LatencyLabError
from latencylab.optimize.families.openvino import load_ir, save_ir
from latencylab.serve.app import build_state, lifespan_app
from latencylab.serve.config import ModelConfig, ServerConfig
from latencylab.serve.from_optimize import load_plan
from latencylab.serve.frontend import load_variants
from latencylab.serve.ov_runner import OvModel, OvTextVariant

sys.path.insert(0, str(Path(__file__).parent))
from ov_tiny import text_interface_onnx


def _cand(name: str, backend: str, p50: float, int8: bool) -> dict[str, Any]:
    return {
        "name": name,
        "backend": backend,
        "status": "inside-budget",
        "p50_ms": p50,
        "fidelity": {"cos_mean": 0.995, "cos_min": 0.99},
        "params": {"quantization": {"mode": "ptq"} if int8 else None},
    }


def _ov_dir(root: Path) -> Path:
    """An optimize output directory whose choice is an OpenVINO IR (scale 1) with an ORT INT8 rung (scale 2)."""
    save_ir(load_ir(text_interface_onnx(root / "src.onnx", 1.0)), root / "model.xml", "f32")
    (root / "src.onnx").unlink()
    text_interface_onnx(root / "rungs" / "ort-int8.onnx", 2.0)
    search = [_cand("ov-int8-transformer", "openvino", 10.0, True), _cand("ort-int8", "onnxruntime", 15.0, True)]
    recipe = {
        "kind": "recipe",
        "workload": "text",
        "candidate": "ov-int8-transformer",
        "backend": "openvino",
        "params": search[0]["params"],
        "threads": 1,
        "budget": "cos>=0.99",
        "measured": {"name": "ov-int8-transformer", "p50_ms": 10.0},
        "artifact": "model.xml",
        "rungs": {"ort-int8": "rungs/ort-int8.onnx"},
    }
    summary = {"pareto": ["ov-int8-transformer"], "chosen": {"name": "ov-int8-transformer"}}
    doc = {"kind": "optimize", "candidates": search, "summary": summary}
    (root / "recipe.json").write_text(json.dumps(recipe))
    (root / "optimize.json").write_text(json.dumps(doc))
    return root


def _request(texts: list[str]) -> dict[str, Any]:
    return {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}


def test_an_openvino_choice_is_served_beside_onnx_runtime_rungs(tmp_path: Path) -> None:
    root = _ov_dir(tmp_path / "best")
    plan = load_plan(root)
    assert plan.ladder == ("ov-int8-transformer", "ort-int8", "cache")
    assert plan.rungs[0].artifact == "model.xml" and plan.rungs[1].role == "quantized"
    cfg = ServerConfig(
        models=(ModelConfig(name="text", ladder=plan.ladder, from_optimize=str(root), max_batch_size=4),),
        preprocess_threads=0,
    )
    variants = load_variants(cfg.models[0], "cpu")
    assert isinstance(variants[0], OvTextVariant) and variants[0].ov.precision == "f32"
    with TestClient(lifespan_app(build_state(cfg, {"text": variants}))) as client:
        meta = client.get("/v2/models/text").json()
        assert meta["versions"] == ["ov-int8-transformer", "ort-int8", "cache"]
        assert meta["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 4]}]
        outs = {}
        for version in ("ov-int8-transformer", "ort-int8"):
            r = client.post(f"/v2/models/text/versions/{version}/infer", json=_request(["hello world", "a b"]))
            assert r.status_code == 200, r.text
            outs[version] = np.asarray(r.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 4)
        base = outs["ov-int8-transformer"]
        assert (base > 0).all()
        # each rung runs its own file (scales 1 and 2) through its own runtime, on the same tokens
        np.testing.assert_allclose(outs["ort-int8"], 2 * base, rtol=1e-5)
        np.testing.assert_allclose(base[:, 1], 2 * base[:, 0], rtol=1e-5)


def test_an_ir_without_the_text_interface_is_refused(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, save

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "foreign",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(tmp_path / "foreign.onnx"))
    root = _ov_dir(tmp_path / "best")
    save_ir(load_ir(tmp_path / "foreign.onnx"), root / "model.xml")
    with pytest.raises(LatencyLabError, match="a text model takes input_ids and attention_mask"):
        load_plan(root)
    (root / "model.bin").unlink()
    with pytest.raises(LatencyLabError, match="no OpenVINO IR there"):
        OvModel(root / "model.xml")
