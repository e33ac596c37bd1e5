"""The search's logic with fake candidates of known speed and error (no real model)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from latencylab.errors import LatencyLabError
from latencylab.optimize.search import TIME_CAP_REASON, Budget, fidelity, pareto_front, search
from latencylab.optimize.types import BuildContext, Candidate, Feed


class FakeAdapter:
    name = "fake"
    input_names = ("x",)
    output_kind = "embedding"

    def __init__(self, n: int = 16) -> None:
        rng = np.random.default_rng(0)
        self._held = [{"x": rng.standard_normal((1, 8)).astype(np.float32)} for _ in range(n)]
        self._cal = [{"x": rng.standard_normal((1, 8)).astype(np.float32)} for _ in range(4)]

    def torch_model(self) -> Any:
        raise NotImplementedError

    def export_onnx(self, path: Path, opset: int = 17) -> Path:
        raise NotImplementedError

    def heldout(self) -> list[Feed]:
        return self._held

    def calibration(self) -> list[Feed]:
        return self._cal

    def labels(self) -> np.ndarray | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {}


class SpinRunner:
    """Output = x (+ noise); each call busy-waits ``ms``."""

    def __init__(self, ms: float, noise: float = 0.0) -> None:
        self.ns = int(ms * 1e6)
        self.noise = noise
        self.rng = np.random.default_rng(1)

    def run(self, feed: Feed) -> np.ndarray:
        end = time.perf_counter_ns() + self.ns
        while time.perf_counter_ns() < end:
            pass
        x = feed["x"]
        return x + self.noise * self.rng.standard_normal(x.shape).astype(np.float32)

    def close(self) -> None:
        pass


def cand(name: str, ms: float, noise: float = 0.0, skip: str | None = None, fail: bool = False) -> Candidate:
    def build(ctx: BuildContext) -> SpinRunner:
        if fail:
            raise RuntimeError("cannot quantise this")
        return SpinRunner(ms, noise)

    return Candidate(name, "test", "fake", {"ms": ms, "noise": noise}, build, lambda ctx: skip)


def ctx(tmp_path: Path) -> BuildContext:
    return BuildContext(FakeAdapter(), tmp_path)


def test_budget_parsing_and_checks() -> None:
    b = Budget.parse("cos>=0.99, min_cos>=0.98")
    f = fidelity(np.eye(3), np.eye(3))
    assert b.check(f) == (True, "inside budget")
    assert Budget.parse("accuracy_drop<=1%").terms == (("accuracy_drop", "<=", 0.01),)
    with pytest.raises(LatencyLabError, match="not understood"):
        Budget.parse("speed>=2x")
    worse = fidelity(np.eye(3), np.eye(3) + 0.5 * np.ones((3, 3)))
    ok, why = b.check(worse)
    assert not ok and why.startswith("cos ")


def test_fidelity_metrics_hand_computed() -> None:
    ref = np.array([[1.0, 0.0], [0.0, 1.0]])
    out = np.array([[1.0, 1.0], [0.0, 2.0]])
    f = fidelity(ref, out, labels=np.array([0, 0]))
    assert f.cos_mean == pytest.approx((1 / np.sqrt(2) + 1) / 2)
    assert f.cos_min == pytest.approx(1 / np.sqrt(2))
    assert f.max_abs == 1.0
    assert f.top1 == 1.0  # row 0: argmax 0 vs a tie (argmax takes the first: 0); row 1: 1 vs 1
    assert f.accuracy == 0.5 and f.reference_accuracy == 0.5


def test_picks_the_fastest_inside_the_budget(tmp_path: Path) -> None:
    res = search(
        ctx(tmp_path),
        [
            cand("base", 2.0),
            cand("fast-but-wrong", 0.3, noise=1.0),
            cand("quick", 1.0, noise=0.001),
            cand("quicker", 0.6, noise=0.002),
            cand("gpu-only", 0.1, skip="needs a CUDA device"),
            cand("broken", 0.1, fail=True),
            cand("slow-and-wrong", 3.0, noise=1.0),
        ],
        Budget.parse("cos>=0.99,min_cos>=0.98"),
        rounds=4,
        per_round=5,
    )
    status = {c.name: c.status for c in res.candidates}
    assert status == {"base": "baseline", "fast-but-wrong": "outside-budget", "quick": "inside-budget",
                      "quicker": "inside-budget", "gpu-only": "skipped", "broken": "failed",
                      "slow-and-wrong": "outside-budget"}  # fmt: skip
    assert res.chosen == "quicker"
    assert "faster (p50) than base" in res.verdict
    assert res.by_name("broken").reason == "build failed: RuntimeError: cannot quantise this"
    assert res.by_name("gpu-only").reason == "needs a CUDA device"
    # the hopeless one is reported with a short measurement only
    assert 0 < len(res.by_name("fast-but-wrong").samples_ns) < len(res.by_name("quick").samples_ns)
    # in latency order; each is more faithful than every faster one; slow-and-wrong is dominated
    assert res.pareto == ("fast-but-wrong", "quicker", "quick", "base")


def test_never_picks_a_variant_slower_than_the_baseline(tmp_path: Path) -> None:
    res = search(ctx(tmp_path), [cand("base", 0.5), cand("slower", 1.0), cand("same", 0.5)],
                 Budget.parse("cos>=0.99"), rounds=4, per_round=5)  # fmt: skip
    assert res.chosen is None
    assert res.verdict.startswith("no improvement found")


def test_time_budget_skips_the_rest(tmp_path: Path) -> None:
    res = search(ctx(tmp_path), [cand("base", 0.2), cand("a", 0.1), cand("b", 0.1)], Budget.parse("cos>=0.9"),
                 rounds=2, per_round=2, time_budget_s=0.0)  # fmt: skip
    assert res.by_name("a").status == "skipped" and res.by_name("a").reason == TIME_CAP_REASON


def test_pareto_front() -> None:
    pts = [("a", 1.0, 0.9), ("b", 2.0, 0.99), ("c", 2.5, 0.95), ("d", 0.5, 0.5)]
    assert pareto_front(pts) == ("d", "a", "b")
