"""OpenVINO candidate family on a tiny encoder exported in the test: every candidate builds, stays close to
FP32, rebuilds from its params, is measured by the search, and exports IR that reads back the same."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("openvino", reason="OpenVINO is not installed: pip install 'latencylab[openvino]'")
pytest.importorskip("nncf", reason="NNCF is not installed: pip install 'latencylab[openvino]'")
pytest.importorskip("onnx")
pytest.importorskip("torch")

from latencylab.optimize.families import openvino as fam
from latencylab.optimize.families.openvino.common import read_precision
from latencylab.optimize.lab import _family_of
from latencylab.optimize.lab_export import export
from latencylab.optimize.search import Budget, search
from latencylab.optimize.types import BuildContext, Candidate

sys.path.insert(0, str(Path(__file__).parent))
from ov_tiny import TinyTextAdapter


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def _run(runner: Any, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    return np.concatenate([runner.run(f) for f in feeds])


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> BuildContext:
    return BuildContext(adapter=TinyTextAdapter(), workdir=tmp_path_factory.mktemp("ov"), threads=1)


def _by_name(ctx: BuildContext) -> dict[str, Candidate]:
    return {c.name: c for c in fam.candidates(ctx)}


def test_every_candidate_runs_close_to_fp32(ctx: BuildContext) -> None:
    feeds = ctx.all_feeds()
    ref = ctx.adapter.reference(feeds)  # type: ignore[attr-defined]
    cands = fam.grid_candidates(ctx)  # the length-routed pairs: tests/test_optimize_routed.py
    assert len({c.name for c in cands}) == len(cands) == 9
    assert {c.name for c in fam.candidates(ctx)} - {c.name for c in cands} == {
        "route-ort-ov-int8", "route-ort-ov-int8-fallback-k2"}  # fmt: skip
    for c in cands:
        if (c.params["quantization"] or {}).get("mode") == "ptq-ac":
            continue  # NNCF's accuracy-control loop: tests/test_optimize_openvino_ac.py
        assert c.backend == "openvino" and c.description
        assert c.skip_reason(ctx) is None, c.name
        runner = c.build(ctx)
        out = _run(runner, feeds)
        assert out.shape == ref.shape and out.dtype == np.float32
        if c.params["quantization"] is None:
            np.testing.assert_allclose(out, ref, atol=1e-5, err_msg=c.name)
        elif c.params["quantization"]["mode"] == "weights":
            assert _cos(out, ref).min() > 0.999, c.name
        else:
            assert _cos(out, ref).min() > 0.97, c.name
        # the runner counts the positions it ran (the roofline credits them): 2 x (5 + 9 + 12) + 2 x 16
        assert runner.tokens.positions == 2 * 26 + 2 * 16
        # static shapes: one compiled model per distinct shape (5, 9, 12 and 16 tokens), none otherwise
        assert runner.stats["static_shapes"] == (4 if c.params["static"] else 0), c.name
        runner.close()


def test_the_transformer_recipe_is_closer_than_the_defaults_on_an_encoder(ctx: BuildContext) -> None:
    """SmoothQuant and the attention-aware scopes of model_type=TRANSFORMER matter on an encoder."""
    feeds = ctx.all_feeds()
    ref = ctx.adapter.reference(feeds)  # type: ignore[attr-defined]
    by = _by_name(ctx)
    default = _cos(_run(by["ov-int8"].build(ctx), feeds), ref).mean()
    transformer = _cos(_run(by["ov-int8-transformer"].build(ctx), feeds), ref).mean()
    assert transformer > default


def test_a_candidate_rebuilds_from_its_json_params(ctx: BuildContext) -> None:
    feeds = ctx.all_feeds()
    c = _by_name(ctx)["ov-int8-transformer"]
    params = json.loads(json.dumps(dict(c.params)))
    again = fam.candidate_from_params(c.name, c.family, params, c.description)
    assert dict(again.params) == dict(c.params) and again.input_policy == c.input_policy
    a, b = c.build(ctx), again.build(ctx)
    assert a.stats["ir"] == b.stats["ir"]  # the quantised IR is content-addressed: made once, reused
    np.testing.assert_array_equal(_run(a, feeds), _run(b, feeds))


def test_bad_params_fail_the_build_with_the_candidate_named(ctx: BuildContext) -> None:
    from latencylab.errors import LatencyLabError

    bad = fam.candidate_from_params("ov-bad", "compile", {"source": "fp32-onnx", "precision": "f8", "static": False})
    with pytest.raises(LatencyLabError, match=r"ov-bad: .*precision 'f8'"):
        bad.build(ctx)


def test_static_shapes_skip_with_the_count_when_there_are_too_many(tmp_path: Path) -> None:
    many = BuildContext(adapter=TinyTextAdapter(lengths=tuple(range(2, 14))), workdir=tmp_path, threads=1)
    by = _by_name(many)
    why = by["ov-fp32-static"].skip_reason(many)
    assert why is not None and why.startswith("13 distinct input shapes") and str(fam.MAX_STATIC_SHAPES) in why
    assert by["ov-fp32"].skip_reason(many) is None


def test_the_transformer_recipe_skips_a_model_that_is_not_one(tmp_path: Path) -> None:
    mlp = BuildContext(adapter=TinyTextAdapter(encoder=False), workdir=tmp_path, threads=1)
    by = _by_name(mlp)
    assert (by["ov-int8-transformer"].skip_reason(mlp) or "").startswith("not a transformer")
    assert by["ov-int8"].skip_reason(mlp) is None


def test_a_missing_openvino_is_a_skip_with_the_install_hint(ctx: BuildContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # what an environment without the package gives
    why = _by_name(ctx)["ov-fp32"].skip_reason(ctx)
    assert why == "openvino is not installed: pip install 'latencylab[openvino]'"


def test_the_search_measures_them_and_the_export_reads_back(ctx: BuildContext, tmp_path: Path) -> None:
    by = _by_name(ctx)
    cands = [by["ov-fp32"], by["ov-int8-transformer"], by["ov-fp32-static"]]
    res = search(ctx, cands, Budget.parse("cos>=0.99"), rounds=2, per_round=2)
    got = {r.name: r for r in res.candidates}
    assert got["ov-fp32"].status == "baseline"
    assert got["ov-fp32-static"].status == "inside-budget"
    assert got["ov-fp32-static"].fidelity.cos_min > 0.99999  # type: ignore[union-attr, operator]
    for r in res.candidates:  # timed in the interleaved rounds on both input sets
        assert [m.name for m in r.sets] == ["sentences", "passages16"]
        assert all(len(m.samples_ns) == 2 * 2 for m in r.sets)
        assert r.stats["seq_lens"] == [5, 9, 12, 5, 9, 12]

    out = tmp_path / "out"
    xml = export(ctx, by["ov-int8-transformer"], out)
    assert xml == out / "model.xml" and (out / "model.bin").is_file()
    model = fam.load_ir(xml)
    assert read_precision(model) == "f32"
    runner = fam.OvRunner(model, threads=1)
    feeds = ctx.all_feeds()
    np.testing.assert_allclose(_run(runner, feeds), _run(by["ov-int8-transformer"].build(ctx), feeds), atol=1e-6)
    assert _family_of("openvino") == "openvino"  # a recipe of an OpenVINO choice rebuilds in its family
