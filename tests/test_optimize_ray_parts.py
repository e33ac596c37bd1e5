"""The pieces of ``optimize --ray`` that need no cluster: the work-directory sync (what a build adds, written
on the timing node under the same name, never outside its directory), a builder run in-process whose shipped
file the timing node's build then opens instead of quantising again, and the CLI's refusals."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from latencylab.cli import main
from latencylab.errors import LatencyLabError
from latencylab.optimize.lab import LabConfig, lab_candidates, make_context, prepare_context
from latencylab.optimize.search import Budget, held_out_sets, run_sets
from latencylab.scaleout.optimize_ray import Builder, added_files, feeds_digest, snapshot, write_missing


def test_added_files_are_what_a_build_wrote_and_land_under_the_same_names(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "ort").mkdir(parents=True)
    (src / "old.bin").write_bytes(b"x")
    before = snapshot(src)
    (src / "ort" / "q-1234.onnx").write_bytes(b"quantised")
    (src / ".q-tmp.onnx").write_bytes(b"half-written")  # a temporary: never shipped
    (src / "old.bin").write_bytes(b"changed!")  # same path, new bytes: shipped again
    files = added_files(src, before)
    assert files == {"ort/q-1234.onnx": b"quantised", "old.bin": b"changed!"}
    (dst / "ort").mkdir(parents=True)
    (dst / "ort" / "q-1234.onnx").write_bytes(b"mine")
    assert write_missing(dst, files) == ["old.bin"]  # an existing file is kept: content-addressed names
    assert (dst / "ort" / "q-1234.onnx").read_bytes() == b"mine" and (dst / "old.bin").read_bytes() == b"changed!"
    with pytest.raises(LatencyLabError, match="outside the work directory"):
        write_missing(dst, {"../escape.onnx": b"no"})
    assert not (tmp_path / "escape.onnx").exists()


def test_a_builders_file_is_opened_on_the_timing_node_without_building_again(tmp_path: Path) -> None:
    cfg = LabConfig(workload="vision", only=("ort-int8-dynamic-perchannel",), rounds=2)
    budget = Budget.parse("accuracy_drop<=1%")
    here = make_context(cfg, tmp_path / "here")
    prepare_context(here, cfg, budget)
    here.fp32_onnx()  # the driver's export, sent to the builder as the search does
    builder = Builder(0, cfg, budget.text, added_files(here.workdir, {}))
    try:
        rep = builder.build("ort-int8-dynamic-perchannel", {})
        assert rep.error is None and rep.ran is not None and rep.feeds_digest == feeds_digest(held_out_sets(here))
        shipped = [rel for rel in rep.files if rel.endswith(".onnx")]
        assert len(shipped) == 1, rep.files.keys()  # the quantised graph, and not the FP32 export it was given
        write_missing(here.workdir, rep.files)
        dst = here.workdir / shipped[0]
        stamp = dst.stat().st_mtime_ns
        cand = next(c for c in lab_candidates(here, cfg) if c.name == "ort-int8-dynamic-perchannel")
        runner = cand.build(here)
        assert Path(runner.model_path) == dst and dst.stat().st_mtime_ns == stamp  # opened, not quantised again
        ran = run_sets(runner, held_out_sets(here))
        for name, (outs, _, _) in ran.items():
            np.testing.assert_array_equal(outs, rep.ran[name][0])  # the same bytes, the same kernels: equal
        runner.close()
        again = builder.build("torch-fp32", {})  # the same builder takes its next candidate: a torch one ships no file
        assert again.error is None and again.files == {}
    finally:
        builder.close()
    assert not builder.workdir.exists()


def test_the_cli_refuses_workers_without_ray_and_ray_with_a_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["optimize", "--workload", "vision", "--workers", "2"]) == 2
    assert "--workers needs --ray" in capsys.readouterr().err
    assert main(["optimize", "--recipe", os.fspath(tmp_path / "r.json"), "--ray"]) == 2
    assert "--ray distributes" in capsys.readouterr().err


def test_fallbacks_of_one_recipe_share_their_ranking_and_nothing_else_does(tmp_path: Path) -> None:
    cfg = LabConfig(workload="vision")
    cands = {c.name: c for c in lab_candidates(make_context(cfg, tmp_path), cfg)}
    k2, k4 = cands["ort-int8-dynamic-fallback-k2"].shares, cands["ort-int8-dynamic-fallback-k4"].shares
    assert k2 and k2 == k4 == cands["ort-int8-dynamic-fallback-k8"].shares
    assert cands["ort-int8-dynamic-perchannel-fallback-k2"].shares not in ("", k2)  # another recipe, another ranking
    assert cands["ort-int8-dynamic-perchannel"].shares == cands["torch-fp32"].shares == ""
