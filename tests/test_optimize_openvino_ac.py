"""NNCF's accuracy-control loop driven by latencylab's fidelity budget (``ov-int8-ac``) on the tiny encoder: the
budget as one score, validation on held-out feeds only, and a fully quantised model outside a tight budget
brought inside it by reverting quantisers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from latencylab.optimize.search import Budget, fidelity

sys.path.insert(0, str(Path(__file__).parent))

TIGHT = "cos>=0.999,min_cos>=0.998"


def test_slack_is_the_share_of_the_room_left_between_fp32_and_the_bound() -> None:
    from latencylab.optimize.families.openvino.accuracy import slack

    assert slack("cos", ">=", 0.99, 0.995) == pytest.approx(0.5)
    assert slack("min_cos", ">=", 0.98, 1.0) == pytest.approx(1.0)
    assert slack("cos", ">=", 0.99, 0.98) == pytest.approx(-1.0)
    assert slack("accuracy_drop", "<=", 0.01, 0.0075) == pytest.approx(0.25)
    assert slack("max_abs", "<=", 0.05, 0.1) == pytest.approx(-1.0)
    assert slack("top1", ">=", 1.0, 1.0) == 1.0 and slack("top1", ">=", 1.0, 0.9) == -1.0


def test_the_score_is_the_tightest_term() -> None:
    from latencylab.optimize.families.openvino.accuracy import score

    ref = np.array([[1.0, 0.0], [0.0, 1.0]])
    out = np.array([[1.0, 0.0], [0.1, 1.0]])  # row 2: cos 0.99504
    cos2 = 1 / np.sqrt(1.01)
    got = score(Budget.parse("cos>=0.99,min_cos>=0.99"), ref, out, None)
    assert got == pytest.approx(min(((1 + cos2) / 2 - 0.99) / 0.01, (cos2 - 0.99) / 0.01))
    labels = np.array([0, 0])  # the reference is right on row 1 only, and so is the output: no drop
    assert score(Budget.parse("accuracy_drop<=1%"), ref, out, labels) == pytest.approx(1.0)


openvino = pytest.importorskip("openvino", reason="OpenVINO is not installed: pip install 'latencylab[openvino]'")
pytest.importorskip("nncf", reason="NNCF is not installed: pip install 'latencylab[openvino]'")
pytest.importorskip("torch")

from latencylab.optimize.families import openvino as fam  # noqa: E402
from latencylab.optimize.types import BuildContext  # noqa: E402
from ov_tiny import TinyTextAdapter  # noqa: E402


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> BuildContext:
    c = BuildContext(adapter=TinyTextAdapter(), workdir=tmp_path_factory.mktemp("ovac"), threads=1)
    c.cache["budget"] = TIGHT
    return c


def test_the_recipe_carries_the_search_budget_or_the_default(tmp_path: Path) -> None:
    plain = BuildContext(adapter=TinyTextAdapter(), workdir=tmp_path, threads=1)
    by = {c.name: c for c in fam.candidates(plain)}
    assert by["ov-int8-ac"].params["quantization"]["budget"] == "cos>=0.99,min_cos>=0.98"
    assert by["ov-int8-transformer-ac"].params["quantization"]["model_type"] == "transformer"
    plain.cache["budget"] = TIGHT
    assert {c.name: c for c in fam.candidates(plain)}["ov-int8-ac"].params["quantization"]["budget"] == TIGHT


def test_validation_is_every_other_heldout_feed_never_a_calibration_one(ctx: BuildContext) -> None:
    from latencylab.optimize.families.openvino.accuracy import validation_items

    items = validation_items(ctx, Budget.parse(TIGHT))
    sets = ctx.input_sets()
    want = sets["sentences"][0::2] + sets["passages16"][0::2]
    assert len(items) == len(want) == 4
    for (feed, ref, lab), w in zip(items, want, strict=True):
        assert feed is w and lab is None
        np.testing.assert_allclose(ref, ctx.adapter.reference([w]), atol=1e-5)  # type: ignore[attr-defined]
    calib = {f["input_ids"].tobytes() for f in ctx.adapter.calibration()}
    assert not calib & {f["input_ids"].tobytes() for f, _, _ in items}


@pytest.mark.slow  # NNCF's loop on the tiny encoder: it quantises, ranks the quantisers and reverts: ~5 s on 2 vCPUs
def test_the_loop_brings_int8_inside_a_budget_the_full_quantisation_misses(ctx: BuildContext) -> None:
    from latencylab.optimize.families.openvino.accuracy import fake_quantizers

    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    if "vnni" not in flags:  # measured in session 25's clean-clone CI on such a host
        pytest.skip("no VNNI: OpenVINO's INT8 kernels on AVX2 end the loop at cos 0.9973, outside the 0.999 budget")

    feeds = ctx.all_feeds()
    ref = ctx.adapter.reference(feeds)  # type: ignore[attr-defined]
    budget = Budget.parse(TIGHT)
    ac = {c.name: c for c in fam.candidates(ctx)}["ov-int8-ac"].build(ctx)
    fid = fidelity(ref, np.concatenate([ac.run(f) for f in feeds]))
    assert budget.check(fid) == (True, "inside budget")  # on every held-out feed, half unseen by the loop
    st = ac.stats["accuracy_control"]
    assert st["budget"] == TIGHT and st["validation_feeds"] == 4
    # the fully quantised model was outside (NNCF's defaults give cos 0.997 / min 0.982 here), the result inside
    assert st["score_fully_quantised"] < 0 <= st["score"]
    assert 0 < st["fake_quantizers"] == fake_quantizers(ac.model)  # quantised still, in part
    again = fam.candidate_from_params("ov-int8-ac", "int8-static", dict(ac_params(ctx))).build(ctx)
    assert again.stats["ir"] == ac.stats["ir"] and again.stats["accuracy_control"] == st  # cached: no second loop


def ac_params(ctx: BuildContext) -> dict[str, object]:
    return dict({c.name: c for c in fam.candidates(ctx)}["ov-int8-ac"].params)
