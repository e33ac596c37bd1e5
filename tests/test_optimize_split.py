"""Equal work: the speedup split (model vs pipeline change), input sets, the time cap's order (fake clock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latencylab.clock import FakeClock
from latencylab.optimize import shapes
from latencylab.optimize.lab import _order
from latencylab.optimize.lab_summary import speedup_split, summary_of, twin_name
from latencylab.optimize.search import TIME_CAP_REASON, Budget, search
from latencylab.optimize.types import BuildContext, Candidate, Feed

SEQ = 16


def _feed(real: int) -> Feed:
    ids = np.zeros((1, SEQ), dtype=np.int64)
    ids[0, :real] = np.arange(1, real + 1) * 7 % 97 + 1
    return {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}


class PaddedAdapter:
    """Text-like inputs declared padded to 16 (sentences of 3-12 real tokens), and 16-token passages."""

    name = "padded"
    input_names = ("input_ids", "attention_mask")
    output_kind = "embedding"
    REAL = (3, 5, 8, 12, 4, 6)

    def input_sets(self) -> dict[str, list[Feed]]:
        return {"sentences": [_feed(n) for n in self.REAL], "passages16": [_feed(SEQ), _feed(SEQ)]}

    def heldout(self) -> list[Feed]:
        return self.input_sets()["sentences"]

    def calibration(self) -> list[Feed]:
        return [_feed(7)]

    def labels(self) -> None:
        return None

    def torch_model(self) -> Any:
        raise NotImplementedError

    def export_onnx(self, path: Path, opset: int = 17) -> Path:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"padding": "max_length", "seq_len": SEQ, "batch_size": 1}


class TokenRunner:
    """Costs ``ns_per_position`` of fake time per sequence position it runs; output depends on real tokens only."""

    def __init__(self, clock: FakeClock, ns_per_position: int, policy: str) -> None:
        self.clock, self.ns, self.policy = clock, ns_per_position, policy
        self.tokens = shapes.TokenCounter()

    def run(self, feed: Feed) -> np.ndarray:
        f = shapes.apply(feed, self.policy)
        self.tokens.count(f)
        self.clock.advance(self.ns * f["input_ids"].size)
        real = f["input_ids"][f["attention_mask"] == 1]  # padding does not change the output (as a mask ensures)
        return np.stack([np.bincount(real % 8, minlength=8).astype(np.float32)])

    def close(self) -> None:
        pass


def _cand(clock: FakeClock, name: str, ns: int, policy: str = shapes.AS_GIVEN, build_s: float = 0.0) -> Candidate:
    def build(ctx: BuildContext) -> TokenRunner:
        clock.advance(build_s * 1e9)
        return TokenRunner(clock, ns, policy)

    return Candidate(name, "test", "fake", {"ns": ns, "shape_policy": policy}, build, input_policy=policy)


def _run(tmp_path: Path, cands: list[Candidate], clock: FakeClock, **kw: Any) -> Any:
    ctx = BuildContext(PaddedAdapter(), tmp_path)
    return search(ctx, cands, Budget.parse("cos>=0.99"), rounds=3, per_round=2, clock=clock, **kw)


def test_speedup_is_against_the_baseline_model_on_identical_inputs(tmp_path: Path) -> None:
    clock = FakeClock()
    cands = [
        _cand(clock, "base", 100),
        _cand(clock, "base-exact", 100, shapes.EXACT),
        _cand(clock, "fast", 25),
        _cand(clock, "fast-exact", 25, shapes.EXACT),
    ]
    res = _run(tmp_path, cands, clock)
    assert res.sets == ("sentences", "passages16")
    assert res.chosen == "fast-exact"
    ref = res.by_name(twin_name("base", shapes.EXACT))
    chosen = res.by_name("fast-exact")
    for got, mine in zip(ref.sets, chosen.sets, strict=True):
        assert got.seq_lens == mine.seq_lens  # the equal-work reference ran exactly the chosen's inputs
    assert chosen.on_set("sentences").seq_lens == PaddedAdapter.REAL  # type: ignore[union-attr]
    s = summary_of(res, PaddedAdapter().describe())
    real_mean = float(np.median([n for n in PaddedAdapter.REAL]))
    # equal work: 100 vs 25 ns per position on the same positions, on both sets
    assert s["speedup"] == pytest.approx(4.0)
    assert s["speedup_by_set"] == pytest.approx({"sentences": 4.0, "passages16": 4.0})
    # the pipeline change: padded 16 positions vs the real ones (p50 of the baseline's calls), and none on
    # passages, which carry no padding
    assert s["pipeline_speedup"] == pytest.approx(SEQ / real_mean)
    assert s["pipeline_speedup_by_set"]["passages16"] == pytest.approx(1.0)
    assert s["total_speedup"] == pytest.approx(s["speedup"] * s["pipeline_speedup"])
    assert s["input_policy"] == "exact" and s["equal_work_reference"] == "base-exact"
    assert "at equal work" in s["verdict"] and "pipeline change" in s["verdict"]


def test_an_as_given_choice_has_no_pipeline_speedup(tmp_path: Path) -> None:
    clock = FakeClock()
    res = _run(tmp_path, [_cand(clock, "base", 100), _cand(clock, "fast", 40)], clock)
    split = speedup_split(res, "fast")
    assert split["equal_work_reference"] == "base"
    for entry in split["by_set"].values():
        assert entry["speedup"] == pytest.approx(2.5) and entry["pipeline_speedup"] is None
    s = summary_of(res, {})
    assert s["speedup"] == s["total_speedup"] == pytest.approx(2.5) and s["pipeline_speedup"] is None
    assert "pipeline change" not in s["verdict"]


def test_a_variant_outside_the_budget_on_one_set_is_outside(tmp_path: Path) -> None:
    class WrongOnPassages(TokenRunner):
        def run(self, feed: Feed) -> np.ndarray:
            out = super().run(feed)
            return out[:, ::-1].copy() if int(feed["attention_mask"].sum()) == SEQ else out

    clock = FakeClock()
    bad = Candidate("bad", "test", "fake", {}, lambda ctx: WrongOnPassages(clock, 10, shapes.AS_GIVEN))
    res = _run(tmp_path, [_cand(clock, "base", 100), bad], clock)
    r = res.by_name("bad")
    assert r.status == "outside-budget" and r.reason.startswith("passages16: cos")
    assert r.on_set("sentences").fidelity.cos_mean == pytest.approx(1.0)  # type: ignore[union-attr]
    assert res.chosen is None


def test_the_time_cap_cuts_the_last_candidates_but_never_the_baselines_twin(tmp_path: Path) -> None:
    clock = FakeClock()
    base = _cand(clock, "base", 100, build_s=10)
    others = [_cand(clock, f"c{i}", 50, build_s=10) for i in range(4)]
    twin = _cand(clock, "base-exact", 100, shapes.EXACT, build_s=10)
    res = _run(tmp_path, [base, *others, twin], clock, time_budget_s=25, keep=("base-exact",))
    status = {c.name: c.status for c in res.candidates}
    assert status["base-exact"] != "skipped"
    cut = [c.name for c in res.candidates if c.reason == TIME_CAP_REASON]
    assert cut == ["c2", "c3"]  # 10 s per build: base, c0, c1 fit in 25 s (the check is before each build)
    assert summary_of(res, {})["skipped_by_time_cap"] == cut


def test_order_puts_the_twins_first_and_the_slow_builds_last() -> None:
    def c(name: str, policy: str = shapes.AS_GIVEN) -> Candidate:
        return Candidate(name, "f", "b", {}, lambda ctx: None, input_policy=policy)  # type: ignore[arg-type,return-value]

    cands = [c("torch-fp32"), c("torch-compile"), c("ort-int8-static-entropy"), c("torch-bf16"),
             c("ort-int8-dynamic-perchannel-fallback-k2-exact", shapes.EXACT), c("torch-fp32-exact", shapes.EXACT),
             c("ort-int8-dynamic-perchannel"), c("something-new")]  # fmt: skip
    names = [x.name for x in _order(cands, ())]
    assert names[:3] == ["torch-fp32", "torch-fp32-exact", "ort-int8-dynamic-perchannel-fallback-k2-exact"]
    assert names.index("ort-int8-dynamic-perchannel") < names.index("torch-bf16") < names.index("torch-compile")
    assert names[-1] == "something-new"
