"""Apache TVM candidate family on a tiny encoder exported in the test: Relax from the ONNX export, compiled for
the host (no tuning), dynamic and per static shape; outputs close to FP32; the library exports and reloads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tvm", reason="Apache TVM is not installed: pip install 'latencylab[tvm]'")
pytest.importorskip("onnx")
pytest.importorskip("torch")

from latencylab.optimize.families import tvm as fam
from latencylab.optimize.lab_export import export
from latencylab.optimize.types import BuildContext

sys.path.insert(0, str(Path(__file__).parent))
from ov_tiny import TinyTextAdapter


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> BuildContext:
    return BuildContext(adapter=TinyTextAdapter(lengths=(5, 9, 5, 9)), workdir=tmp_path_factory.mktemp("tvm"))


@pytest.mark.slow  # two LLVM compiles of the tiny graph plus one per static shape: ~8 s on 2 vCPUs
def test_both_candidates_compile_and_match_fp32(ctx: BuildContext, tmp_path: Path) -> None:
    feeds = ctx.all_feeds()
    ref = ctx.adapter.reference(feeds)  # type: ignore[attr-defined]
    cands = {c.name: c for c in fam.candidates(ctx)}
    assert sorted(cands) == ["tvm-relax", "tvm-relax-static"]
    for c in cands.values():
        assert c.backend == "tvm" and c.params["tune_time_s"] == 0 and c.skip_reason(ctx) is None
        runner = c.build(ctx)
        out = np.concatenate([runner.run(f) for f in feeds])
        np.testing.assert_allclose(out, ref, atol=1e-4, err_msg=c.name)
        assert runner.tokens.positions == 2 * 14 + 2 * 16
        assert runner.stats["static_shapes"] == (3 if c.params["static"] else 0)  # 5, 9 and 16 tokens
        assert "llvm" in runner.stats["target"]
    # a recipe's params rebuild it; the export is a library TVM loads back
    again = fam.candidate_from_params("tvm-relax", "compile", json.loads(json.dumps(dict(cands["tvm-relax"].params))))
    lib = export(ctx, again, tmp_path)
    assert lib == tmp_path / "model.so" and lib.stat().st_size > 0
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    f = feeds[0]
    got = vm["main"](tvm.runtime.tensor(f["input_ids"]), tvm.runtime.tensor(f["attention_mask"])).numpy()
    np.testing.assert_allclose(got, ref[:1], atol=1e-4)


def test_tuning_and_too_many_static_shapes_are_skips_with_reasons(tmp_path: Path) -> None:
    many = BuildContext(adapter=TinyTextAdapter(lengths=tuple(range(2, 14))), workdir=tmp_path)
    by = {c.name: c for c in fam.candidates(many)}
    assert (by["tvm-relax-static"].skip_reason(many) or "").startswith("13 distinct input shapes")
    tuned = fam.candidate_from_params("tvm-tuned", "compile", {**by["tvm-relax"].params, "tune_time_s": 60})
    assert "not implemented yet" in (tuned.skip_reason(many) or "")
