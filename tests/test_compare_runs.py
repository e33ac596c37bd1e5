"""Issue 23: the run as the unit of variation, interleaved A/B, and the machine-speed canary.

Synthetic runs on the fake clock with a known between-run drift (the machine's speed, scaled per run):
the gate must not fire on drift alone and must fire on a real change.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import ttest_ind, wilcoxon

from latencylab import canary as canarymod
from latencylab.analysis import save_profile
from latencylab.canary import CanaryDelta, Reading, compare_canaries, summarize
from latencylab.cli import main
from latencylab.clock import FakeClock
from latencylab.compare import stats as cstats
from latencylab.compare.core import compare_docs
from latencylab.compare.interleave import Spec
from latencylab.compare.model import Comparison, Gate
from latencylab.env import diff as env_diff
from latencylab.errors import LatencyLabError
from latencylab.pipeline import Pipeline
from latencylab.profiler import ProfileConfig, profile, profile_interleaved
from latencylab.results import ProfileResult

# The machine's speed per run: up to 15% apart, as a shared host drifts between runs.
DRIFT = (1.00, 1.08, 0.95, 1.12, 0.97, 1.03)
GATES = [Gate.parse("p50>+5%"), Gate.parse("forward:p50>+5%")]


class Machine:
    """A fake machine: stages advance the fake clock by their work times ``speed`` (set per run)."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.speed = 1.0

    def pipeline(self, forward_ms: float = 3.0, seed: int = 0, name: str = "fake") -> Pipeline:
        rng = np.random.default_rng(seed)
        work = np.stack([rng.normal(1e6, 5e4, 4096), forward_ms * 1e6 * rng.lognormal(0, 0.1, 4096)], axis=1)

        def stage(j: int) -> Any:
            def fn(i: int) -> int:
                self.clock.advance(work[i % 4096, j] * self.speed)
                return i

            return fn

        pipe = Pipeline(name, source=lambda i: i)
        pipe.stage("preprocess", stage(0), kind="preprocess")
        pipe.stage("forward", stage(1), kind="forward")
        return pipe


def drifting_profile(
    drift: Sequence[float], forward_ms: float = 3.0, seed: int = 0, iterations: int = 300
) -> ProfileResult:
    m = Machine()

    def before_run(_k: int, r: int) -> None:
        m.speed = drift[r]

    cfg = ProfileConfig(warmup=5, iterations=iterations, runs=len(drift))
    return profile(m.pipeline(forward_ms, seed), cfg, clock=m.clock, env={}, before_run=before_run)


def doc(r: ProfileResult) -> dict[str, Any]:
    return r.to_dict()


# ------------------------------------------------------------------------------------------ statistics
def test_run_delta_welch_matches_scipy_on_the_logs() -> None:
    a = [10.0, 10.4, 9.7, 10.9, 10.1]
    b = [11.0, 10.6, 11.9, 11.2]
    rd = cstats.run_delta(a, b)
    assert rd is not None and rd.method == "welch"
    ref = ttest_ind(np.log(b), np.log(a), equal_var=False)
    assert rd.p_value == pytest.approx(float(ref.pvalue), rel=1e-9)
    assert rd.rel == pytest.approx(math.exp(np.log(b).mean() - np.log(a).mean()) - 1)
    assert rd.baseline == pytest.approx(math.exp(np.log(a).mean()))
    assert rd.rel_ci_low < rd.rel < rd.rel_ci_high
    assert rd.spread_baseline == pytest.approx(float(np.log(a).std(ddof=1)))


def test_run_delta_one_run_a_side_is_undecidable_and_one_run_on_one_side_uses_the_other() -> None:
    assert cstats.run_delta([10.0], [12.0]) is None
    rd = cstats.run_delta([10.0, 10.5, 9.5, 10.2], [12.0])
    assert rd is not None and rd.method == "one-run" and rd.df == 3
    s = float(np.log([10.0, 10.5, 9.5, 10.2]).std(ddof=1))
    half = math.log(rd.rel_ci_high + 1) - math.log(rd.rel + 1)
    from scipy.stats import t

    assert half == pytest.approx(float(t.ppf(0.975, 3)) * s * math.sqrt(1 / 4 + 1))


def test_paired_hodges_lehmann_matches_scipy_wilcoxon() -> None:
    rng = np.random.default_rng(5)
    a = 1e6 * np.exp(rng.normal(0, 0.2, 12))  # the machine drifts by 20% from round to round ...
    b = a * np.exp(rng.normal(0.05, 0.01, 12))  # ... and B is 5% slower within each round
    rd = cstats.run_delta(a, b, paired=True)
    assert rd is not None and rd.method == "paired-wilcoxon"
    d = np.log(b) - np.log(a)
    assert rd.p_value == pytest.approx(float(wilcoxon(d).pvalue), rel=1e-9)
    assert rd.rel == pytest.approx(0.05, abs=0.01) and rd.significant
    assert not cstats.run_delta(a, b).significant  # unpaired, the drift hides the 5%
    # exact null: n = 3 -> T+ in 0..6 with counts 1,1,1,2,1,1,1
    assert cstats.signed_rank_null(3).tolist() == pytest.approx([1 / 8, 1 / 8, 1 / 8, 2 / 8, 1 / 8, 1 / 8, 1 / 8])


# ------------------------------------------------------------------------------------------ runs in a result
def test_profile_runs_are_recorded_and_round_trip(tmp_path: Path) -> None:
    r = drifting_profile(DRIFT[:3], iterations=50)
    assert r.n == 150 and r.n_runs == 3
    assert [s.start for s in r.run_slices()] == [0, 50, 100]
    assert [x["n"] for x in r.runs] == [50, 50, 50] and r.stop_reason == "3 runs: iterations reached"
    e2e = r.end_to_end_ns()
    # Every run replays the same inputs: run 1 is run 0 scaled by the machine's speed.
    assert e2e[50:100] == pytest.approx(e2e[:50] * 1.08, abs=2)
    back = ProfileResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r
    old = r.to_dict()
    for key in ("iteration_run", "runs"):
        old.pop(key)
    assert ProfileResult.from_dict(old).n_runs == 1  # files written before runs existed: one run
    assert "canary" not in r.env  # a fake clock's run is not on machine time
    with pytest.raises(LatencyLabError, match="runs must be >= 1"):
        ProfileConfig(runs=0)


# ------------------------------------------------------------------------------------------ the gate
def test_gate_does_not_fire_on_between_run_drift_alone() -> None:
    a = drifting_profile(DRIFT[:5], seed=1)
    b = drifting_profile(DRIFT[1:6][::-1], seed=2)  # same program, the machine at other speeds
    c = compare_docs(doc(a), doc(b), GATES)
    assert c.level == "run"
    p50 = c.find("end-to-end").metric("p50")
    assert p50.method == "welch" and not p50.significant
    assert c.find("end-to-end").spread_baseline == pytest.approx(float(np.log(DRIFT[:5]).std(ddof=1)), rel=0.1)
    assert not any(g.fired or g.undecided for g in c.gates) and c.exit_code == 0


def test_gate_fires_on_a_real_change_under_the_same_drift() -> None:
    a = drifting_profile(DRIFT[:5], seed=1)
    b = drifting_profile(DRIFT[1:6][::-1], forward_ms=3.6, seed=2)  # forward +20%: end-to-end about +15%
    c = compare_docs(doc(a), doc(b), GATES)
    fwd = c.find("forward").metric("p50")
    assert fwd.significant and fwd.rel == pytest.approx(0.20 * math.exp(np.log(DRIFT[1:6]).mean()) / 1.0, abs=0.06)
    assert [g.fired for g in c.gates] == [True, True] and c.exit_code == 1


def test_one_run_a_side_is_undecided_unless_strict() -> None:
    """The issue's case: one run each, the machine 15% slower in B's run: within-run statistics call it a
    significant +15%; compare must not fail the build on that, unless --strict."""
    a = drifting_profile((1.0,), seed=1)
    b = drifting_profile((1.15,), seed=2)
    c = compare_docs(doc(a), doc(b), GATES)
    assert c.level == "iteration" and c.find("end-to-end").metric("p50").significant
    assert [(g.fired, g.undecided) for g in c.gates] == [(False, True), (False, True)] and c.exit_code == 0
    strict = compare_docs(doc(a), doc(b), GATES, strict=True)
    assert all(g.fired for g in strict.gates) and strict.exit_code == 1


def test_interleaved_pairs_cancel_drift_common_to_a_round() -> None:
    """A and B measured in alternating blocks; the machine's speed moves by up to 40% from round to round
    but is the same within a round: A/A never fires, +10% on forward always does."""
    speeds = (1.0, 1.4, 0.8, 1.2, 0.9, 1.3, 1.1, 0.85)

    def session(forward_b: float) -> list[ProfileResult]:
        m = Machine()

        def before_run(_k: int, r: int) -> None:
            m.speed = speeds[r]

        pipes = [m.pipeline(3.0, seed=1, name="A"), m.pipeline(forward_b, seed=2, name="B")]
        cfg = ProfileConfig(warmup=5, iterations=200, runs=len(speeds))
        return profile_interleaved(pipes, cfg, clock=m.clock, env={}, seed=3, before_run=before_run)

    a, b = session(3.0)
    assert a.config["interleaved"]["session"] == b.config["interleaved"]["session"]
    assert sorted([a.runs[0]["position"], b.runs[0]["position"]]) == [0, 1]
    same = compare_docs(doc(a), doc(b), GATES)
    assert same.level == "paired" and same.find("forward").metric("p50").method == "paired-wilcoxon"
    assert same.exit_code == 0 and not any(g.undecided for g in same.gates)
    # Unpaired, the same files would see the 40% drift as the noise floor: nothing is significant.
    a2, b2 = session(3.3)
    slow = compare_docs(doc(a2), doc(b2), GATES)
    fwd = slow.find("forward").metric("p50")
    assert fwd.rel == pytest.approx(0.10, abs=0.02) and fwd.significant
    assert [g.fired for g in slow.gates] == [True, True]


# ------------------------------------------------------------------------------------------ the canary
class FakeCanary:
    """Canary readings of a machine whose CPU kernel takes ``cpu_ms`` (times ``slow`` after ``switch``)."""

    def __init__(self, cpu_ms: float) -> None:
        self.cpu_ms = cpu_ms
        self.t = 0.0

    def read(self, at: str) -> Reading:
        self.t += 0.5
        ns = int(self.cpu_ms * 1e6)
        return Reading(at, self.t, (ns, ns + 1000, ns - 1000), (20.0, 21.0), 2600.0, 10, 1000, 5)


def canary_profile(drift: Sequence[float], cpu_ms: float, forward_ms: float = 3.0, seed: int = 0) -> ProfileResult:
    m = Machine()

    def before_run(_k: int, r: int) -> None:
        m.speed = drift[r]

    cfg = ProfileConfig(warmup=5, iterations=300, runs=len(drift))
    can = FakeCanary(cpu_ms)
    env = {"fingerprint_version": 1}
    return profile(m.pipeline(forward_ms, seed), cfg, clock=m.clock, env=env, canary=can, before_run=before_run)


def test_canary_summary_figures() -> None:
    readings = [
        Reading("before", 0.0, (1_000_000, 1_100_000, 900_000), (20.0, 22.0), 2000.0, 100, 10_000, 10),
        Reading("between", 1.0, (1_200_000,) * 3, (18.0,), 2000.0, 300, 12_000, 20),
        Reading("after", 2.0, (1_100_000,) * 3, (19.0,), None, 400, 14_000, 30),
    ]
    s = summarize(readings)
    assert s["cpu_ns"] == 1_100_000  # median over readings of each reading's median repeat
    assert s["cpu_best_ns"] == 1_100_000  # first quartiles 0.95, 1.2, 1.1 ms
    assert s["mem_gbps"] == 19.0  # median of the readings' best
    assert s["drift"] == pytest.approx((1.2 - 1.0) / 1.1, abs=1e-4)
    assert s["steal_fraction"] == pytest.approx(300 / 4000)
    assert s["involuntary_switches_per_s"] == pytest.approx(10.0)
    assert s["freq_mhz"] == 2000.0 and len(s["readings"]) == 3
    d = compare_canaries(s, {**s, "cpu_ns": 1_320_000, "mem_gbps": 9.5})
    assert isinstance(d, CanaryDelta) and d.slower == pytest.approx(0.2) and d.moved
    assert d.mem_slower == pytest.approx(1.0)
    assert "the machine was 20% slower in b's run than in a's" in d.describe(("a", "b"))
    assert compare_canaries(s, None) is None
    assert not compare_canaries(s, {**s, "cpu_ns": 1_150_000}).moved  # type: ignore[union-attr]


def test_real_canary_reads_the_machine() -> None:
    r = canarymod.MachineCanary(cpu_loop=2000, cpu_repeats=3, mem_bytes=2**20, mem_repeats=2).read("before")
    assert len(r.cpu_ns) == 3 and all(v > 0 for v in r.cpu_ns) and len(r.mem_gbps) == 2
    assert r.t_s == 0.0


def test_canary_that_moved_refuses_the_gate_and_says_by_how_much(tmp_path: Path) -> None:
    """Between the two results the machine got 25% slower (canary) and so did the program: with five runs
    a side Welch's t would call that a change; the canary makes the gate undecided instead."""
    a = canary_profile(DRIFT[:5], cpu_ms=1.0, seed=1)
    b = canary_profile(tuple(1.25 * x for x in DRIFT[:5]), cpu_ms=1.25, seed=2)
    assert a.env["canary"]["cpu_ns"] == 1_000_000 and len(a.env["canary"]["readings"]) == 6
    pa, pb = save_profile(a, tmp_path / "a.json"), save_profile(b, tmp_path / "b.json")
    c = compare_docs(doc(a), doc(b), GATES, names=("a", "b"))
    assert c.find("end-to-end").metric("p50").significant
    assert c.canary is not None and c.canary.slower == pytest.approx(0.25) and c.canary.moved
    assert all(g.undecided and not g.fired for g in c.gates) and c.exit_code == 0
    assert any("the machine was 25% slower in b's run than in a's" in n for n in c.notes)
    # the same without the canary's move: it fires
    b_same = canary_profile(tuple(1.25 * x for x in DRIFT[:5]), cpu_ms=1.0, seed=2)
    assert compare_docs(doc(a), doc(b_same), GATES).exit_code == 1
    # the JSON of a run-level comparison with a canary and undecided gates round-trips
    back = Comparison.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c
    # env --diff shows the canary as a high-impact difference
    rows = [d for d in env_diff(a.env, b.env) if d.path.startswith("canary")]
    assert len(rows) == 1 and rows[0].impact == "high" and "25% slower" in str(rows[0].b)
    rc = main(["env", "--diff", str(pa), str(pb)])
    assert rc == 0


def test_reads_a_version_1_comparison(tmp_path: Path) -> None:
    a = drifting_profile((1.0,), seed=1)
    b = drifting_profile((1.0,), seed=2)
    d = compare_docs(doc(a), doc(b), [Gate.parse("p50>+5%")]).to_dict()
    d["version"] = 1
    for key in ("level", "strict", "canary"):
        d.pop(key)
    for g in d["gates"]:
        g.pop("undecided")
        g.pop("why")
    back = Comparison.from_dict(d)
    assert back.level == "iteration" and back.canary is None


# ------------------------------------------------------------------------------------------ the CLI
def test_spec_parsing() -> None:
    s = Spec.parse('--workload synthetic --param "stages=forward:constant(1ms)" --threads 2', "A")
    assert s.workload == "synthetic" and s.params == (("stages", "forward:constant(1ms)"),) and s.threads == 2
    with pytest.raises(LatencyLabError, match="compare --run B"):
        Spec.parse("--nope", "B")
    with pytest.raises(LatencyLabError, match="key=value"):
        Spec.parse("--param x", "A")


def test_cli_interleaved_run_catches_a_slower_stage_and_passes_an_unchanged_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = "--workload synthetic --param stages=pre:constant(100us);forward:constant({})"
    a, slow = base.format("300us"), base.format("390us")  # forward +30%
    common = ["--rounds", "6", "--iterations", "30", "--warmup", "3", "--fail-if", "forward:p50>+10%"]
    rc = main(["compare", "--run", a, slow, *common, "--keep", str(tmp_path), "--json", str(tmp_path / "c.json")])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "latencylab compare (profile, paired level): A -> B" in out and "FAIL forward:p50>+10%" in out
    c = Comparison.from_dict(json.loads((tmp_path / "c.json").read_text()))
    assert c.level == "paired" and c.find("forward").metric("p50").rel == pytest.approx(0.30, abs=0.1)
    ra = ProfileResult.from_dict(json.loads((tmp_path / "A.json").read_text()))
    assert ra.n_runs == 6 and ra.n == 180 and "canary" in ra.env and len(ra.env["canary"]["readings"]) == 7
    rc = main(["compare", "--run", a, a, *common])
    out = capsys.readouterr().out
    assert rc == 0, out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare"], "give two result files"),
        (["compare", "x.json", "--run", "--workload synthetic", "--workload synthetic"], "not both"),
        (["compare", "--run", "--workload synthetic", "--workload synthetic", "--rounds", "1"], "at least 2 rounds"),
        (["compare", "--run", "--workload synthetic", "--bogus 1"], "compare --run B"),
    ],
)
def test_cli_compare_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_cli_profile_runs_writes_runs_and_a_canary(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = ["profile", "--workload", "synthetic", "--param", "stages=forward:constant(100us)"]
    assert main([*args, "--iterations", "20", "--warmup", "2", "--runs", "3", "--quiet", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["config"]["runs"] == 3 and d["iteration_run"] == [0] * 20 + [1] * 20 + [2] * 20
    assert [r["at"] for r in d["env"]["canary"]["readings"]] == ["before", "between", "between", "after"]
    assert d["env"]["canary"]["cpu_ns"] > 0
