"""ONNX Runtime candidate family: every candidate builds, stays close to FP32, rebuilds from its params."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from cache_seed import seeded  # noqa: E402
from latencylab.errors import LatencyLabError  # noqa: E402
from latencylab.optimize.adapters import TextAdapter, VisionAdapter  # noqa: E402
from latencylab.optimize.families import onnxruntime as fam  # noqa: E402
from latencylab.optimize.types import BuildContext, Candidate, Feed  # noqa: E402


def _torch_outputs(adapter: Any, feeds: list[Feed]) -> np.ndarray:
    model = adapter.torch_model()
    with torch.inference_mode():
        outs = [model(*[torch.from_numpy(f[n]) for n in adapter.input_names]).numpy() for f in feeds]
    return np.concatenate(outs).astype(np.float32)


def _run(runner: Any, feeds: list[Feed]) -> np.ndarray:
    return np.concatenate([runner.run(f) for f in feeds])


def _build(cand: Candidate, ctx: BuildContext) -> fam.OrtRunner:
    runner = cand.build(ctx)
    assert isinstance(runner, fam.OrtRunner)
    return runner


def _by_name(ctx: BuildContext) -> dict[str, Candidate]:
    return {c.name: c for c in fam.candidates(ctx)}


def _digest(feed: Feed) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(feed[k]).tobytes() for k in sorted(feed))).hexdigest()


def _graph_ops(path: str | Path) -> dict[str, str]:
    return {n.name: n.op_type for n in onnx.load(str(path)).graph.node}


def _kept_in_float(ops: dict[str, str], node: str) -> bool:
    """Still a float op under its name (a Gemm as the MatMul the dynamic quantizer rewrites it to)."""
    return ops.get(node) in ("Conv", "MatMul", "Gemm") or ops.get(f"{node}_MatMul") == "MatMul"


@pytest.fixture(scope="module")
def vision(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BuildContext, np.ndarray]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("LATENCYLAB_CACHE", str(seeded(tmp_path_factory.getbasetemp() / "cache")))
    adapter: Any = VisionAdapter()
    # Train (or load) outside export_onnx: it calls torch_model() under inference_mode, where training fails.
    adapter.torch_model()
    ctx = BuildContext(adapter=adapter, workdir=tmp_path_factory.mktemp("ort-vision"), threads=1)
    yield ctx, _torch_outputs(adapter, adapter.heldout())
    mp.undo()


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildContext, np.ndarray]:
    adapter: Any = TextAdapter(seq_len=32, n_heldout=6, n_calib=6, padding="max_length", n_passages=2)
    ctx = BuildContext(adapter=adapter, workdir=tmp_path_factory.mktemp("ort-text"), threads=1)
    return ctx, _torch_outputs(adapter, adapter.heldout())


def test_candidates_are_unique_described_and_json(vision: tuple[BuildContext, np.ndarray]) -> None:
    ctx, _ = vision
    cands = fam.candidates(ctx)
    names = [c.name for c in cands]
    assert len(names) == len(set(names))
    assert names[0] == "ort-fp32"
    assert {c.backend for c in cands} == {"onnxruntime"}
    assert {c.family for c in cands} == {"graph", "fusion", "int8-dynamic", "int8-static", "mixed", "shape"}
    assert {f"ort-int8-dynamic-fallback-k{k}" for k in (2, 4, 8, 16)} <= set(names)
    for c in cands:
        assert c.description
        assert json.loads(json.dumps(c.params)) == c.params


def test_vision_every_candidate_builds_and_stays_close(vision: tuple[BuildContext, np.ndarray]) -> None:
    ctx, torch_ref = vision
    feeds = ctx.adapter.heldout()
    labels = ctx.adapter.labels()
    skipped: dict[str, str] = {}
    for cand in fam.candidates(ctx):
        why = cand.skip_reason(ctx)
        if why:
            skipped[cand.name] = why
            continue
        runner = _build(cand, ctx)
        out = _run(runner, feeds)
        runner.close()
        assert out.dtype == np.float32 and out.shape == torch_ref.shape, cand.name
        if cand.name.startswith("ort-fp32"):
            assert np.abs(out - torch_ref).max() < 1e-4, cand.name
        else:
            agree = (out.argmax(1) == torch_ref.argmax(1)).mean()
            assert agree >= 0.95, (cand.name, agree)
            assert (out.argmax(1) == labels).mean() >= 0.95, cand.name
    # the CNN has 4 quantisable nodes (3 convs, the classifier Gemm): k >= 4 would be the FP32 model
    nothing = "leaves nothing quantised"
    too_many = {
        f"ort-int8-dynamic-{base}fallback-k{k}": f"only 4 quantisable nodes: keeping {k} in float {nothing}"
        for base, ks in (("", (4, 8, 16)), ("perchannel-", (4,)))
        for k in ks
    }
    not_transformer = [n for n in skipped if "fused" in n]
    assert len(not_transformer) == 5
    no_mask = "shape policy 'exact' trims padding by the attention mask: this model has none"
    assert skipped == {
        **dict.fromkeys(not_transformer, fam.NOT_A_TRANSFORMER),
        **too_many,
        **{n: no_mask for n in skipped if n.endswith("-exact")},
    }
    assert {"ort-fp32-exact", "ort-int8-dynamic-perchannel-fallback-k4-exact"} <= set(skipped)


@pytest.mark.parametrize(
    "name", ["ort-int8-dynamic-default", "ort-int8-static-ema-3sigma", "ort-int8-dynamic-fallback-k2"]
)
def test_rebuild_from_params_is_identical_and_reuses_the_file(
    vision: tuple[BuildContext, np.ndarray], name: str
) -> None:
    ctx, _ = vision
    feeds = ctx.adapter.heldout()[:40]
    cand = _by_name(ctx)[name]
    first = _build(cand, ctx)
    out1 = _run(first, feeds)
    path = Path(first.stats["model_file"])
    mtime = path.stat().st_mtime_ns
    recipe = json.loads(json.dumps({"name": cand.name, "family": cand.family, "params": dict(cand.params)}))
    again = fam.candidate_from_params(recipe["name"], recipe["family"], recipe["params"])
    second = _build(again, ctx)
    assert Path(second.stats["model_file"]) == path and path.stat().st_mtime_ns == mtime
    assert np.array_equal(_run(second, feeds), out1)


def test_calibration_reads_only_calibration_feeds(
    vision: tuple[BuildContext, np.ndarray], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, _ = vision
    adapter = base.adapter
    ctx = BuildContext(adapter=adapter, workdir=tmp_path, threads=1)
    ctx.cache["fp32_onnx"] = base.fp32_onnx()  # fresh workdir: calibration runs again, the export is shared
    calib = {_digest(f) for f in adapter.calibration()}
    held = {_digest(f) for f in adapter.heldout()}
    assert not calib & held
    served: list[str] = []

    class Recording(fam.FeedReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            item = super().get_next()
            if item is not None:
                served.append(_digest(item))
            return item

    monkeypatch.setattr(fam.quantisation, "FeedReader", Recording)  # where the builds construct it
    # and the held-out split is never asked for while building
    monkeypatch.setattr(adapter, "heldout", lambda: pytest.fail("held-out feeds used during a build"))
    cands = _by_name(ctx)
    for name in ("ort-int8-static-minmax", "ort-int8-static-percentile", "ort-int8-static-ema-3sigma"):
        served.clear()
        runner = _build(cands[name], ctx)
        assert runner.stats["calibration_feeds"] == len(calib)
        assert len(served) == len(calib) and set(served) == calib, name
    fam.sensitivity(ctx)  # sensitivity also runs on calibration feeds only


def test_sensitivity_ranks_nodes_and_fallback_keeps_exactly_those(
    vision: tuple[BuildContext, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, _ = vision
    nodes = fam.quantisable_nodes(ctx.fp32_onnx())
    assert nodes == ["/0/Conv", "/4/Conv", "/8/Conv", "/13/Gemm"]
    ranked = fam.sensitivity(ctx)
    assert sorted(n for n, _ in ranked) == sorted(nodes)
    errors = [e for _, e in ranked]
    assert errors == sorted(errors, reverse=True) and min(errors) > 0 and errors[0] > errors[-1]
    # cached: a second call quantises nothing
    import onnxruntime.quantization as oq

    monkeypatch.setattr(oq, "quantize_dynamic", lambda *a, **k: pytest.fail("sensitivity ran twice"))
    assert fam.sensitivity(ctx) == ranked
    monkeypatch.undo()

    runner = _build(_by_name(ctx)["ort-int8-dynamic-fallback-k2"], ctx)
    top = [n for n, _ in ranked[:2]]
    assert runner.stats["nodes_in_float"] == top
    ops = _graph_ops(runner.stats["model_file"])
    for n in nodes:
        assert _kept_in_float(ops, n) == (n in top), (n, ops.get(n))
    assert sum(op in ("ConvInteger", "MatMulInteger") for op in ops.values()) == len(nodes) - 2


def test_keepends_keeps_first_and_last_compute_layer(vision: tuple[BuildContext, np.ndarray]) -> None:
    ctx, _ = vision
    cands = _by_name(ctx)
    dyn = _build(cands["ort-int8-dynamic-keepends"], ctx)
    assert dyn.stats["nodes_in_float"] == ["/0/Conv", "/13/Gemm"]
    ops = _graph_ops(dyn.stats["model_file"])
    assert _kept_in_float(ops, "/0/Conv") and _kept_in_float(ops, "/13/Gemm")
    assert not _kept_in_float(ops, "/4/Conv") and not _kept_in_float(ops, "/8/Conv")
    # QDQ keeps every op under its name; a quantised one reads its inputs through DequantizeLinear
    static = _build(cands["ort-int8-static-minmax-keepends"], ctx)
    assert static.stats["nodes_in_float"] == ["/0/Conv", "/13/Gemm"]
    graph = onnx.load(static.stats["model_file"]).graph
    dq_out = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    reads_dq = {n.name: any(i in dq_out for i in n.input) for n in graph.node if n.op_type in ("Conv", "Gemm")}
    assert reads_dq == {"/0/Conv": False, "/4/Conv": True, "/8/Conv": True, "/13/Gemm": False}


def test_dynamic_quantisation_touches_exactly_the_quantisable_nodes(vision: tuple[BuildContext, np.ndarray]) -> None:
    ctx, _ = vision
    runner = _build(_by_name(ctx)["ort-int8-dynamic-default"], ctx)
    before = _graph_ops(ctx.fp32_onnx())
    after = _graph_ops(runner.stats["model_file"])
    rewritten = [n for n, op in before.items() if after.get(n) != op]
    assert rewritten == fam.quantisable_nodes(ctx.fp32_onnx())


def test_errors_name_the_candidate(vision: tuple[BuildContext, np.ndarray], tmp_path: Path) -> None:
    ctx, _ = vision
    bad_node = fam.candidate_from_params(
        "ort-int8-dynamic-typo",
        "mixed",
        {
            "source": "fp32",
            "graph_optimization": "all",
            "quantization": {"mode": "dynamic", "fallback": {"policy": "nodes", "nodes": ["/nope/Conv"]}},
        },
    )
    with pytest.raises(LatencyLabError, match=r"ort-int8-dynamic-typo: .*unknown node.*/nope/Conv"):
        _build(bad_node, ctx)
    bad_method = fam.candidate_from_params(
        "ort-int8-static-bogus",
        "int8-static",
        {"source": "fp32", "quantization": {"mode": "static", "calibration": "bogus"}},
    )
    with pytest.raises(LatencyLabError, match=r"ort-int8-static-bogus: .*unknown calibration method 'bogus'"):
        _build(bad_method, ctx)

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"this is not a protobuf")
    bctx = BuildContext(adapter=ctx.adapter, workdir=tmp_path / "work", threads=1)
    bctx.cache["fp32_onnx"] = broken
    cands = _by_name(bctx)
    for name in ("ort-fp32", "ort-int8-dynamic-default", "ort-int8-static-minmax", "ort-int8-dynamic-fallback-k2"):
        assert cands[name].skip_reason(bctx) is None
        with pytest.raises(LatencyLabError, match=f"^{name}: "):
            _build(cands[name], bctx)


def test_output_error_definitions() -> None:
    a = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    b = np.array([[1.0, 1.0], [0.0, -2.0]], dtype=np.float32)
    # cosines: 1/sqrt(2) and -1
    assert fam.output_error(a, b, "embedding") == pytest.approx(1 - (2**-0.5 - 1) / 2)
    assert fam.output_error(a, b, "logits") == pytest.approx((0 + 1 + 0 + 4) / 4)
    with pytest.raises(LatencyLabError, match="shape"):
        fam.output_error(a, b[:1], "logits")


def test_ema_sigma_ranges_by_hand(tmp_path: Path) -> None:
    # y = x @ W on a (1, 64) input: the calibrated tensors are x and y
    w = np.ones((64, 1), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    path = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    # mostly in [0, 1) with one outlier per batch: the outlier stretches MinMax, 3 sigma clips it
    rng = np.random.default_rng(0)
    xs = [rng.random((1, 64)) for _ in range(3)]
    for x, spike in zip(xs, (10.0, 30.0, 12.0), strict=True):
        x[0, 7] = spike
    feeds = [{"x": x.astype(np.float32)} for x in xs]
    c = 0.5
    got = fam.ema_sigma_ranges(path, fam.FeedReader(feeds), ["MatMul"], ema_constant=c, sigmas=3.0)

    def expect(batches: list[np.ndarray]) -> tuple[float, float]:
        lo, hi = float(batches[0].min()), float(batches[0].max())
        for b in batches[1:]:
            lo, hi = (1 - c) * lo + c * float(b.min()), (1 - c) * hi + c * float(b.max())
        allv = np.concatenate([b.ravel() for b in batches]).astype(np.float64)
        m, s = allv.mean(), allv.std()
        return max(lo, m - 3 * s), min(hi, m + 3 * s)

    assert set(got) == {"x", "y"}
    assert got["x"] == pytest.approx(expect(xs))
    assert got["y"] == pytest.approx(expect([x.sum(keepdims=True) for x in xs]))
    # x: the EMA max (0.5 * (0.5 * 10 + 0.5 * 30) + 0.5 * 12 = 16) is clipped to mean + 3 std; the low end
    # keeps the EMA min (about 0), since mean - 3 std is negative
    allx = np.concatenate([x.ravel() for x in xs])
    assert got["x"][1] == pytest.approx(allx.mean() + 3 * allx.std()) and got["x"][1] < 16 / 2
    assert 0 <= got["x"][0] < 0.05


def test_text_candidates_close_to_fp32(text: tuple[BuildContext, np.ndarray]) -> None:
    ctx, torch_ref = text
    feeds = ctx.adapter.heldout()
    cands = _by_name(ctx)
    fp32 = _run(_build(cands["ort-fp32"], ctx), feeds)
    assert np.abs(fp32 - torch_ref).max() < 1e-4
    fused = _build(cands["ort-fp32-fused"], ctx)
    assert fused.stats["fusions"].get("SkipLayerNormalization", 0) > 0
    assert np.abs(_run(fused, feeds) - fp32).max() < 1e-3
    cos = {}
    for name in (
        "ort-int8-dynamic-default",
        "ort-int8-dynamic-perchannel",
        "ort-int8-dynamic-fused",
        "ort-int8-static-minmax",
        "ort-int8-static-ema-3sigma",
    ):
        out = _run(_build(cands[name], ctx), feeds)
        cos[name] = float(((out * fp32).sum(1) / np.linalg.norm(out, axis=1) / np.linalg.norm(fp32, axis=1)).mean())
    assert min(cos[n] for n in cos if "dynamic" in n) >= 0.9, cos
    assert cos["ort-int8-dynamic-perchannel"] >= 0.98, cos
    # 3-sigma clipping saturates the few large hidden dimensions a transformer relies on: worse than MinMax here
    assert cos["ort-int8-static-ema-3sigma"] < cos["ort-int8-static-minmax"] - 0.05, cos
    # MiniLM-L6: 6 layers x (Q, K, V, attention out, FFN in, FFN out) MatMuls + word/type/position embeddings
    nodes = fam.quantisable_nodes(ctx.fp32_onnx())
    assert len(nodes) == 39 and sum("Gather" in n for n in nodes) == 3


def test_trim_padding_cuts_to_the_last_attended_position() -> None:
    ids = np.array([[5, 6, 7, 0, 0, 0], [5, 6, 0, 0, 0, 0]], dtype=np.int64)
    mask = (ids > 0).astype(np.int64)
    out = fam.trim_padding({"input_ids": ids, "attention_mask": mask, "other": np.ones(3)})
    assert out["input_ids"].tolist() == [[5, 6, 7], [5, 6, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert out["other"].shape == (3,)  # not shaped like the mask: untouched
    full = {"input_ids": ids[:, :3], "attention_mask": mask[:, :3]}
    assert fam.trim_padding(full)["input_ids"] is full["input_ids"]  # nothing to trim: no copy


def test_exact_shape_policy_matches_the_padded_run(text: tuple[BuildContext, np.ndarray]) -> None:
    ctx, torch_ref = text
    feeds = ctx.adapter.heldout()
    assert any(int(f["attention_mask"].sum()) < f["attention_mask"].shape[1] for f in feeds)  # padding exists
    cands = _by_name(ctx)

    def cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))

    # FP32: the same computation without the padded positions
    a = _run(_build(cands["ort-fp32"], ctx), feeds)
    b = _run(_build(cands["ort-fp32-exact"], ctx), feeds)
    assert np.abs(a - b).max() < 1e-4
    # INT8 dynamic: activation scales are per tensor, so dropping padding rows changes them (a different,
    # not a worse, quantisation): judged against the FP32 reference like any candidate
    q = _run(_build(cands["ort-int8-dynamic-perchannel-exact"], ctx), feeds)
    assert cos(q, torch_ref).mean() >= 0.98, cos(q, torch_ref)
    assert cands["ort-int8-dynamic-perchannel-exact"].params["shape_policy"] == "exact"


def test_torch_and_onnx_runtime_see_the_same_tokens_under_one_shape_policy(
    text: tuple[BuildContext, np.ndarray],
) -> None:
    """The shape policy is applied by every runner the same way: equal work, counted from what each ran."""
    from latencylab.optimize.families import torch as tfam

    ctx, _ = text
    feeds = ctx.all_feeds()
    torch_cands = {c.name: c for c in tfam.candidates(ctx)}
    ort_cands = _by_name(ctx)
    seen = {}
    for name, cand in [*[(n, torch_cands[n]) for n in ("torch-fp32", "torch-fp32-exact")],
                       *[(n, ort_cands[n]) for n in ("ort-fp32", "ort-fp32-exact")]]:  # fmt: skip
        assert cand.skip_reason(ctx) is None, name
        runner = cand.build(ctx)
        _run(runner, feeds)
        seen[name] = list(runner.tokens.seq_lens)  # type: ignore[attr-defined]
    real = [int(f["attention_mask"].sum(axis=1).max()) for f in feeds]
    assert seen["torch-fp32"] == seen["ort-fp32"] == [32] * len(feeds)  # as given: padded to 32
    assert seen["torch-fp32-exact"] == seen["ort-fp32-exact"] == real  # exact: each input's real length
    assert min(real) < 32  # the sentences are padded, the passages are not
    assert ort_cands["ort-fp32-exact"].input_policy == torch_cands["torch-fp32-exact"].input_policy == "exact"


def test_exact_is_skipped_with_its_reason_when_the_inputs_carry_no_padding(tmp_path: Path) -> None:
    natural: Any = TextAdapter(seq_len=32, n_heldout=4, n_calib=2, n_passages=2)  # padding="longest"
    ctx = BuildContext(adapter=natural, workdir=tmp_path, threads=1)
    assert all(f["attention_mask"].all() for f in ctx.all_feeds())  # batch 1, natural lengths: no padding
    why = _by_name(ctx)["ort-fp32-exact"].skip_reason(ctx)
    assert why is not None and "no padding" in why
