"""Length-routed candidates (optimize/families/routed.py, serve/routed.py): an ONNX Runtime INT8 member for
short inputs, OpenVINO's transformer INT8 from a width; the crossover measured at build time on calibration
feeds; the search measures the router like any candidate; ``route.json`` exported and served by ``serve --from``."""

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

from starlette.testclient import TestClient

from latencylab.clock import FakeClock
from latencylab.errors import LatencyLabError, NotApplicable
from latencylab.optimize.families import openvino as fam
from latencylab.optimize.families import routed
from latencylab.optimize.lab import _family_of
from latencylab.optimize.lab_export import export
from latencylab.optimize.search import Budget, search
from latencylab.optimize.types import BuildContext, Candidate
from latencylab.serve.app import build_state, lifespan_app
from latencylab.serve.config import ModelConfig, ServerConfig
from latencylab.serve.from_optimize import load_plan
from latencylab.serve.frontend import load_variants
from latencylab.serve.routed import RoutedTextVariant, read_route

sys.path.insert(0, str(Path(__file__).parent))
from ov_tiny import TinyTextAdapter, text_interface_onnx


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> BuildContext:
    return BuildContext(adapter=TinyTextAdapter(), workdir=tmp_path_factory.mktemp("routed"), threads=1)


def _routes(ctx: BuildContext) -> dict[str, Candidate]:
    return {c.name: c for c in fam.candidates(ctx) if c.backend == routed.BACKEND}


def _pair(ctx: BuildContext, at: int | str = "auto", name: str = "route-test") -> Candidate:
    """A router of ORT's per-channel dynamic INT8 and OpenVINO's transformer INT8 (the listed routes' short
    members use ORT's fused graph, which the transformer optimizer cannot make of the tiny encoder)."""
    from latencylab.optimize.families import onnxruntime

    ort = {c.name: c for c in onnxruntime.candidates(ctx)}["ort-int8-dynamic-perchannel"]
    ov = {c.name: c for c in fam.grid_candidates(ctx)}["ov-int8-transformer"]
    params = {"short_name": ort.name, "short": dict(ort.params), "long_name": ov.name, "long": dict(ov.params),
              "at": at}  # fmt: skip
    return routed.candidate_from_params(name, params)


def test_the_listed_routes_pair_the_families_own_candidates(ctx: BuildContext) -> None:
    from latencylab.optimize.families import onnxruntime

    ort = {c.name: c for c in onnxruntime.candidates(ctx)}
    ov = {c.name: c for c in fam.grid_candidates(ctx)}
    for name, short, long in routed.ROUTES:
        c = _routes(ctx)[name]
        assert c.params["short"] == dict(ort[short].params) and c.params["long"] == dict(ov[long].params)
        assert c.params["at"] == "auto" and _family_of(c.backend) == "openvino"


def test_the_crossover_is_where_the_long_member_stays_faster() -> None:
    # (short ms, long ms) per width: the long member wins from 48 on, at every longer width
    assert routed.crossover({16: (1.0, 2.0), 32: (2.0, 2.5), 48: (3.0, 2.9), 64: (4.0, 3.5), 128: (8, 6)}) == 48
    # a win at 32 that does not hold at 48 does not count: the route must hold above it
    assert routed.crossover({16: (1.0, 2.0), 32: (2.0, 1.9), 48: (3.0, 3.1), 64: (4.0, 3.5)}) == 64
    assert routed.crossover({16: (1.0, 2.0), 128: (8.0, 9.0)}) is None  # never: everything stays short
    assert routed.crossover({16: (3.0, 2.0), 128: (9.0, 8.0)}) == 16


def test_a_feed_is_cut_to_a_width_without_touching_other_inputs() -> None:
    feed = {"input_ids": np.arange(10).reshape(1, 10), "attention_mask": np.ones((1, 10), np.int64),
            "extra": np.zeros((1, 3))}  # fmt: skip
    cut = routed.cut_to(feed, 4)
    assert cut["input_ids"].tolist() == [[0, 1, 2, 3]] and cut["attention_mask"].shape == (1, 4)
    assert cut["extra"].shape == (1, 3) and routed.width(cut) == 4 and routed.width({"pixels": np.ones(3)}) is None


def test_each_feed_runs_on_the_member_its_width_picks(ctx: BuildContext) -> None:
    cand = _pair(ctx)
    assert cand.skip_reason(ctx) is None
    runner = _pair(ctx, 10).build(ctx)
    members = routed.build_runner(ctx, cand.params | {"at": 10})
    short, long = members.short, members.long
    feeds = ctx.all_feeds()  # sentences of 5, 9, 12, 5, 9, 12 tokens, passages of 16
    for f in feeds:
        want = (long if routed.width(f) >= 10 else short).run(f)  # type: ignore[operator]
        np.testing.assert_array_equal(runner.run(f), want)
    assert runner.routed == [4, 4]  # 5 and 9 short; 12 and 16 long
    # the members are the families' own candidates, not copies: the short one is ORT's INT8, the long OpenVINO's
    assert Path(short.model_path).name.startswith("q-dyn-") and type(long).__name__ == "OvRunner"
    ref = ctx.adapter.reference(feeds)  # type: ignore[attr-defined]
    out = np.concatenate([runner.run(f) for f in feeds])
    cos = (out * ref).sum(1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() > 0.97
    for r in (runner, members):
        r.close()
    with pytest.raises(LatencyLabError, match="route at 0"):
        routed.build_runner(ctx, cand.params | {"at": 0}, "route-bad")


class _Costed:
    """A real member whose calls the FakeClock sees cost ``fixed + per_position x width`` ms (a known curve)."""

    def __init__(self, runner: Any, clock: FakeClock, fixed_ms: float, per_position_ms: float) -> None:
        self.runner, self.clock, self.fixed, self.per = runner, clock, fixed_ms, per_position_ms

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        self.clock.advance((self.fixed + self.per * (routed.width(feed) or 0)) * 1e6)
        return self.runner.run(feed)

    def close(self) -> None:
        self.runner.close()


def test_auto_measures_the_crossover_on_calibration_widths(ctx: BuildContext) -> None:
    members = routed.build_runner(ctx, _pair(ctx, 10).params)
    clock = FakeClock()
    # short: 0.5 ms + 0.1 ms a position; long: 2 ms + 0.05 ms a position: the long one wins past 30 positions
    short, long = _Costed(members.short, clock, 0.5, 0.1), _Costed(members.long, clock, 2.0, 0.05)
    got = routed.measure_crossover(short, long, ctx.adapter.calibration(), clock)
    assert sorted(got["medians_ms"], key=int) == ["8", "16"]  # the calibration feeds are 16 wide
    assert got["medians_ms"]["8"] == [pytest.approx(1.3), pytest.approx(2.4)]
    assert got["medians_ms"]["16"] == [pytest.approx(2.1), pytest.approx(2.8)]
    assert got["at"] is None  # 16 positions is the widest measured: the long member never wins here
    cheap_long = _Costed(members.long, clock, 0.2, 0.05)  # now it wins from 8 positions on
    assert routed.measure_crossover(short, cheap_long, ctx.adapter.calibration(), clock)["at"] == 8
    members.close()


def test_auto_routes_where_it_measured_or_is_skipped_with_the_numbers(ctx: BuildContext) -> None:
    try:
        runner = _pair(ctx).build(ctx)
    except NotApplicable as exc:  # the long member lost at every width on this machine: a duplicate of short
        assert "is not faster than" in str(exc) and "the router would be its short member" in str(exc)
        res = search(ctx, [_pair(ctx, 10, "base"), _pair(ctx)], Budget.parse("cos>=0"), rounds=1, per_round=1,
                     time_budget_s=None)  # fmt: skip
        assert res.by_name("route-test").status == "skipped"
        return
    route = runner.stats["route"]
    medians = {int(k): tuple(v) for k, v in route["medians_ms"].items()}
    assert sorted(medians) == [8, 16] and route["at"] == routed.crossover(medians) == runner.at is not None
    runner.close()


def test_the_search_measures_a_router_and_exports_route_json(ctx: BuildContext, tmp_path: Path) -> None:
    from latencylab.optimize.families import onnxruntime

    base = next(c for c in onnxruntime.candidates(ctx) if c.name == "ort-fp32")
    cand = _pair(ctx, 10, "route-at-10")
    res = search(ctx, [base, cand], Budget.parse("cos>=0.9"), rounds=2, per_round=2, time_budget_s=None)
    got = res.by_name("route-at-10")
    assert got.status in ("inside-budget", "outside-budget") and got.latency() is not None
    assert got.stats["route"]["at"] == 10
    path = export(ctx, cand, tmp_path / "out")
    assert path.name == "route.json"
    at, short, long = read_route(path)
    assert at == 10 and short.name == "model.onnx" and long.name == "model.xml"
    assert long.with_suffix(".bin").is_file()


def _route_dir(root: Path, at: int | None) -> Path:
    """An optimize output directory whose choice is a route: scale 1 (ONNX, short), scale 2 (IR, long)."""
    from latencylab.optimize.families.openvino import load_ir, save_ir

    text_interface_onnx(root / "model.onnx", 1.0)
    save_ir(load_ir(text_interface_onnx(root / "src.onnx", 2.0)), root / "model.xml", "f32")
    (root / "src.onnx").unlink()
    (root / "route.json").write_text(json.dumps({"kind": "route", "at": at, "short": "model.onnx",
                                                 "long": "model.xml"}))  # fmt: skip
    params: dict[str, Any] = {"short": {"quantization": {"mode": "dynamic"}, "graph_optimization": "all"},
                              "long": {"quantization": {"mode": "ptq"}}, "at": "auto"}  # fmt: skip
    cand = {"name": "route-ort-ov-int8", "backend": "routed", "status": "inside-budget", "p50_ms": 5.0,
            "fidelity": {"cos_mean": 0.995, "cos_min": 0.99}, "params": params}  # fmt: skip
    recipe = {"kind": "recipe", "workload": "text", "candidate": cand["name"], "backend": "routed",
              "params": params, "threads": 1, "budget": "cos>=0.99", "artifact": "route.json", "rungs": {}}  # fmt: skip
    doc = {"kind": "optimize", "candidates": [cand], "summary": {"pareto": [cand["name"]], "chosen": cand["name"]}}
    (root / "recipe.json").write_text(json.dumps(recipe))
    (root / "optimize.json").write_text(json.dumps(doc))
    return root


def _embed(client: TestClient, text: str) -> np.ndarray:
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [text]}]}
    r = client.post("/v2/models/text/infer", json=body)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["outputs"][0]["data"], dtype=np.float32)


def test_serve_from_routes_each_batch_by_its_width(tmp_path: Path) -> None:
    root = _route_dir(tmp_path / "best", at=5)
    plan = load_plan(root)
    assert plan.rungs[0].artifact == "route.json" and plan.rungs[0].int8
    cfg = ServerConfig(
        models=(ModelConfig(name="text", ladder=plan.ladder, from_optimize=str(root), max_batch_size=1),),
        preprocess_threads=0,
    )
    variants = load_variants(cfg.models[0], "cpu")
    v = variants[0]
    assert isinstance(v, RoutedTextVariant) and v.at == 5
    with TestClient(lifespan_app(build_state(cfg, {"text": variants}))) as client:
        before = list(v.routed)  # the start-up warm-up ran both
        short = _embed(client, "a b")  # [CLS] a b [SEP]: 4 positions, the ONNX member
        assert [a - b for a, b in zip(v.routed, before, strict=True)] == [1, 0]
        long = _embed(client, "a b c d e f")  # 8 positions: the IR
        assert [a - b for a, b in zip(v.routed, before, strict=True)] == [1, 1]
    assert short.shape == long.shape == (4,)
    # each width runs on its member: the mean token id x (1, 2, 3, 4) x scale 1 (ONNX) or 2 (IR)
    ids = np.arange(5, 13, dtype=np.int64)[None, :]
    wide = v._encode(ids, np.ones_like(ids))
    narrow = v._encode(ids[:, :4], np.ones_like(ids[:, :4]))
    np.testing.assert_allclose(wide[0], 8.5 * 2 * np.arange(1, 5), rtol=1e-6)
    np.testing.assert_allclose(narrow[0], 6.5 * np.arange(1, 5), rtol=1e-6)
    v.intra_op_threads = 2  # the knob reaches both runtimes
    assert v.ov.intra_op_threads == 2 and v.intra_op_threads == 2


def test_a_broken_route_is_refused_in_one_line(tmp_path: Path) -> None:
    root = _route_dir(tmp_path / "best", at=5)
    (root / "route.json").write_text(
        json.dumps({"kind": "route", "at": -1, "short": "model.onnx", "long": "model.xml"})
    )
    with pytest.raises(LatencyLabError, match="'at' must be a number of positions"):
        load_plan(root)
    (root / "route.json").write_text(json.dumps({"kind": "route", "at": 5, "short": "model.onnx", "long": "gone.xml"}))
    with pytest.raises(LatencyLabError, match="member file is missing"):
        load_plan(root)
