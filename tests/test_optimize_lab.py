"""The optimize lab end to end on the vision workload (real model, torch family)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from latencylab.optimize.lab import LabConfig, apply_recipe, run_lab


def test_lab_reports_every_candidate_and_keeps_the_baseline_when_nothing_wins(tmp_path: Path) -> None:
    cfg = LabConfig(workload="vision", families=("torch",), only=("torch-prune-magnitude-50", "torch-bf16"), rounds=2)
    doc = run_lab(cfg, tmp_path / "out", workdir=tmp_path / "work")
    status = {c["name"]: c["status"] for c in doc["candidates"]}
    assert status == {"torch-fp32": "baseline", "torch-prune-magnitude-50": "outside-budget", "torch-bf16": "skipped"}
    s = doc["summary"]
    assert s["chosen"] is None and s["verdict"].startswith("no improvement found")
    assert s["baseline"]["accuracy"] > 0.99 and s["budget"] == "accuracy_drop<=1%"
    assert not (tmp_path / "out" / "recipe.json").exists()  # nothing to reproduce
    json.dumps(doc)  # the whole document is JSON


@pytest.mark.slow
def test_chosen_variant_is_exported_with_a_recipe_that_reproduces_it(tmp_path: Path) -> None:
    import torch

    cfg = LabConfig(workload="vision", families=("torch",), only=("torch-compile",), rounds=6)
    doc = run_lab(cfg, tmp_path / "out", workdir=tmp_path / "work")
    if doc["summary"]["chosen"] is None:  # on a noisy machine the 1.2-1.4x gain can drown; then say so
        pytest.skip(f"torch.compile was not significantly faster this time: {doc['summary']['verdict']}")
    assert doc["summary"]["chosen"]["name"] == "torch-compile" and doc["summary"]["speedup_p50"] > 1
    model = torch.jit.load(doc["artifact"])
    from latencylab.optimize.adapters import VisionAdapter

    a = VisionAdapter()
    feed = a.heldout()[0]["pixels"]
    with torch.inference_mode():
        np.testing.assert_allclose(
            model(torch.from_numpy(feed)).numpy(), a.torch_model()(torch.from_numpy(feed)).numpy(), atol=1e-5
        )
    recipe = json.loads(Path(doc["recipe"]).read_text())
    assert recipe["candidate"] == "torch-compile" and recipe["params"]["backend"] == "inductor"
    again = apply_recipe(Path(doc["recipe"]), rounds=3)
    names = [c["name"] for c in again["candidates"]]
    assert names == ["torch-fp32", "torch-compile"]
    assert again["recipe"]["reproduced"]["accuracy"] == recipe["measured"]["accuracy"]


def test_cli_bad_budget_and_recipe_are_one_line_errors(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "latencylab", "optimize", "--budget", "fast>=2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "budget term 'fast>=2' is not understood" in p.stderr
    bad = tmp_path / "r.json"
    bad.write_text("{}")
    p = subprocess.run(
        [sys.executable, "-m", "latencylab", "optimize", "--recipe", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "not a latencylab recipe" in p.stderr


def test_an_onnx_runtime_choice_is_exported_as_its_onnx_file(tmp_path: Path) -> None:
    """ORT FP32 is ~6x faster than eager on the small CNN: chosen, its ONNX file exported and runnable."""
    import onnxruntime as ort

    cfg = LabConfig(workload="vision", families=("torch", "onnxruntime"), only=("ort-fp32",), rounds=4)
    doc = run_lab(cfg, tmp_path / "out", workdir=tmp_path / "work")
    assert "artifact_error" not in doc, doc.get("artifact_error")
    assert doc["summary"]["chosen"]["name"] == "ort-fp32"
    assert Path(doc["artifact"]).name == "model.onnx"
    from latencylab.optimize.adapters import VisionAdapter

    a = VisionAdapter()
    feed = a.heldout()[0]
    sess = ort.InferenceSession(doc["artifact"], providers=["CPUExecutionProvider"])
    import torch

    with torch.inference_mode():
        ref = a.torch_model()(torch.from_numpy(feed["pixels"])).numpy()
    np.testing.assert_allclose(sess.run(None, {"pixels": feed["pixels"]})[0], ref, atol=1e-4)
    recipe = json.loads(Path(doc["recipe"]).read_text())
    assert recipe["artifact"] == "model.onnx" and recipe["backend"] == "onnxruntime"
