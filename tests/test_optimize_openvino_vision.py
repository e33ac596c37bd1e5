"""The OpenVINO family on a vision model (a tiny CNN with task labels) judged by the accuracy-drop budget: the
candidates that apply build and stay inside ``accuracy_drop<=1%``, the transformer recipes skip with the
reason, static shapes need one compile, and the accuracy-control loop validates on labelled held-out images."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openvino", reason="OpenVINO is not installed: pip install 'latencylab[openvino]'")
pytest.importorskip("nncf", reason="NNCF is not installed: pip install 'latencylab[openvino]'")
pytest.importorskip("torch")

from latencylab.optimize.families import openvino as fam
from latencylab.optimize.search import Budget, fidelity
from latencylab.optimize.types import BuildContext

sys.path.insert(0, str(Path(__file__).parent))
from ov_tiny import TinyVisionAdapter

BUDGET = "accuracy_drop<=1%"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> BuildContext:
    c = BuildContext(adapter=TinyVisionAdapter(), workdir=tmp_path_factory.mktemp("ovv"), threads=1)
    c.cache["budget"] = BUDGET
    return c


@pytest.mark.slow  # three OpenVINO builds, two of them NNCF quantisations (one with the loop), a tiny CNN: ~5 s
def test_the_family_on_a_classifier_within_the_accuracy_drop_budget(ctx: BuildContext) -> None:
    feeds = ctx.all_feeds()
    ref = ctx.adapter.reference(feeds)  # type: ignore[attr-defined]
    labels = ctx.adapter.labels()
    by = {c.name: c for c in fam.candidates(ctx)}
    for name in ("ov-int8-transformer", "ov-int8-transformer-ac", "ov-int8-transformer-static"):
        assert (by[name].skip_reason(ctx) or "").startswith("not a transformer"), name
    assert by["ov-int8-ac"].params["quantization"]["budget"] == BUDGET
    for name in ("ov-fp32-static", "ov-int8", "ov-int8-ac"):
        assert by[name].skip_reason(ctx) is None, name
        runner = by[name].build(ctx)
        f = fidelity(ref, np.concatenate([runner.run(x) for x in feeds]), labels)
        assert f.reference_accuracy == pytest.approx(0.8)  # the labels: FP32's top-1 but every fifth
        assert Budget.parse(BUDGET).check(f) == (True, "inside budget"), (name, f)
        assert runner.stats["static_shapes"] == (1 if by[name].params["static"] else 0)
        if name == "ov-int8-ac":
            st = runner.stats["accuracy_control"]
            assert st["validation_feeds"] == 20 and st["score"] >= 0  # every other labelled held-out image
