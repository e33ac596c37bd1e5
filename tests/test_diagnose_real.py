"""diagnose on real runs: the vision workload's data path, a real torch.compile recompilation, --deep.

No mocks: each test profiles a real workload on this machine. Marked slow (tens of seconds each).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from latencylab.analysis import save_profile
from latencylab.cli import main
from latencylab.findings import Finding

pytestmark = pytest.mark.slow


def _findings(path: Path) -> list[Finding]:
    doc = json.loads(path.read_text())
    assert doc["kind"] == "diagnose" and doc["schema_version"] == 1
    return [Finding.from_dict(d) for d in doc["findings"]]


def test_vision_names_decode_and_preprocess(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.json"
    assert main(["diagnose", "--workload", "vision", "--quiet", "--json", str(out)]) == 0
    fs = _findings(out)
    pre = [f for f in fs if f.rule == "preprocess-dominates"]
    assert len(pre) == 1, [f.title for f in fs]
    f = pre[0]
    assert f.source == "live run (vision)"
    assert f.title.startswith("data path decode + preprocess are") or f.title.startswith(
        "data path preprocess + decode are"
    )
    shares = f.details["shares"]
    # the three values are each rounded to 6 digits
    assert f.details["data_share"] == pytest.approx(shares["decode"] + shares["preprocess"], abs=2e-6)
    assert f.details["data_share"] >= 0.35
    assert "nvJPEG" in f.recommendation  # the decode remedy
    assert "data path" in capsys.readouterr().out


def test_torch_compile_recompilation_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.config as inductor_config

    from latencylab.profiler import ProfileConfig, profile
    from latencylab.workloads import WorkloadOptions, build_workload

    # a cold compiler, as on a fresh machine: inductor's on-disk caches would turn a recompilation done
    # earlier on this machine into a cache hit of a few ms
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    warmup = 5
    with inductor_config.patch(fx_graph_cache=False):  # (not monkeypatch: the config module restores itself)
        pipe = build_workload(
            "compiled",
            WorkloadOptions(params={"offset": str(warmup), "shapes": "16@0,32@150", "backend": "inductor"}),
        )
        result = profile(pipe, ProfileConfig(warmup=warmup, iterations=300, threads=1))
    assert [i for i, c in enumerate(result.iteration_meta["compiles"]) if c] == [150]
    src = save_profile(result, tmp_path / "compiled.json")
    out = tmp_path / "d.json"
    assert main(["diagnose", str(src), "--json", str(out)]) == 0
    rec = [f for f in _findings(out) if f.rule == "recompilation"]
    assert [f.title.split(":")[0] for f in rec] == [
        "recompiled at iteration 150 (shape (1, 32, 32))",
    ]  # one recompilation: each cold inductor compile costs seconds of the test suite
    for f, at in zip(rec, (150,), strict=True):
        spike = f.details["spike"]  # found by spike detection: the spike it found holds the recompilation
        assert f.severity == "critical" and spike["start"] <= at < spike["end"], spike
        assert f.details["spike"]["ratio"] > 1.5  # x1000 with a cold compiler; a few x when inductor reuses work
        labels = {e.label: e.value for e in f.evidence}
        assert str(labels["stage that grew most"]).startswith("forward")


def test_deep_returns_top_operators(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    assert main(["diagnose", "--workload", "text", "--deep", "--quiet", "--json", str(out)]) == 0
    fs = {f.rule: f for f in _findings(out)}
    stage = fs["sandwich-stage"]
    assert stage.details["stage"] == "forward"  # MiniLM's encoder dominates the text pipeline
    system = fs["sandwich-system"]
    assert system.details["samples"] >= 5 and len(system.details["cpu_mean_per_core"]) >= 1
    ops = fs["sandwich-operators"]
    assert ops.details["method"] == "torch.profiler"
    names = [o["name"] for o in ops.details["operators"]]
    assert len(names) >= 3 and all(n.startswith("aten::") for n in names[:3])
    assert any(
        n in names
        for n in ("aten::addmm", "aten::mm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")
    )
    assert sum(o["share"] for o in ops.details["operators"]) > 0.3
    # the text probe's per-iteration shapes: the corpus mixes queries and passages
    shapes = fs["shape-variance"]
    assert shapes.details["waste"] == 0.0 and shapes.details["waste_batched"] > 1.0
    assert len(shapes.details["edges"]) == 3 and shapes.details["waste_bucketed"] < shapes.details["waste_batched"]
