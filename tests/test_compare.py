"""latencylab compare: statistics, gates, profile and load comparisons, the CLI and its JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import fisher_exact, mannwhitneyu

from conftest import Noise
from latencylab.analysis import save_profile
from latencylab.cli import main
from latencylab.compare import stats as cstats
from latencylab.compare.core import compare_docs, compare_files
from latencylab.compare.model import Comparison, Gate
from latencylab.compare.series import compare_series
from latencylab.errors import LatencyLabError
from latencylab.histogram import LatencyHistogram
from latencylab.load.results import LoadResult
from latencylab.results import ProfileResult, StageSeries

# Short iterations (~1 ms, so a shared machine rarely preempts one), yet every stage >= 200 us, so the run-to-run
# jitter of the timer overhead (a few hundred ns) stays below compare's 1% noise threshold.
STAGES = "stages=preprocess:normal(200us,20us);forward:lognormal({fwd},0.25);postprocess:constant(200us)"


def lognormal_ns(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    """End-to-end-like latencies: 1 ms floor plus a lognormal(3 ms, 0.25) part, times ``scale``."""
    return scale * (1e6 + 3e6 * rng.lognormal(0.0, 0.25, n))


# ------------------------------------------------------------------------------------------ statistics
def test_binned_quantiles_match_numpy_type7() -> None:
    rng = np.random.default_rng(0)
    x = np.round(rng.lognormal(0, 1, 501) * 100)  # ties on purpose
    b = cstats.Binned.from_samples(x)
    assert b.n == 501
    for q in (0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0):
        assert cstats.quantile(b, q) == pytest.approx(float(np.quantile(x, q)), rel=1e-12)
    assert cstats.mean(b) == pytest.approx(float(x.mean()))
    assert cstats.statistic(b, "max") == x.max()


def test_mann_whitney_matches_scipy_with_and_without_ties() -> None:
    rng = np.random.default_rng(1)
    a, c = lognormal_ns(rng, 700), lognormal_ns(rng, 900, 1.03)
    for xa, xc in ((a, c), (np.round(a / 1e5), np.round(c / 1e5))):
        r = cstats.mann_whitney(cstats.Binned.from_samples(xa), cstats.Binned.from_samples(xc))
        ref = mannwhitneyu(xc, xa, method="asymptotic")
        assert r.u == pytest.approx(float(ref.statistic))
        assert r.p_value == pytest.approx(float(ref.pvalue), rel=1e-9)
        assert r.prob_greater == pytest.approx(r.u / (700 * 900))


def test_binned_from_histogram_keeps_every_count() -> None:
    rng = np.random.default_rng(2)
    x = lognormal_ns(rng, 5000)
    h = LatencyHistogram(lowest_ns=1)
    h.record_many(x)
    b = cstats.Binned.from_cdf(h.cdf(), h.count)
    assert b.n == 5000
    assert b.values.size < 2000  # one bin per occupied bucket
    # HDR buckets are 0.1% wide at 3 significant figures: quantiles agree with the raw ones to that.
    for q in (0.5, 0.9, 0.99):
        assert cstats.quantile(b, q) == pytest.approx(float(np.quantile(x, q)), rel=2e-3)


def test_bootstrap_detects_a_10pct_p50_regression() -> None:
    rng = np.random.default_rng(3)
    base, cand = lognormal_ns(rng, 1000), lognormal_ns(rng, 1000, 1.10)
    s = compare_series("end-to-end", cstats.Binned.from_samples(base), cstats.Binned.from_samples(cand))
    p50 = s.metric("p50")
    assert p50.significant and p50.flagged and p50.p_value < 0.05
    assert p50.rel == pytest.approx(0.10, abs=0.03)
    assert p50.rel_ci_low is not None and p50.rel_ci_high is not None
    assert 0 < p50.rel_ci_low < 0.10 < p50.rel_ci_high
    assert s.metric("mean").flagged
    assert s.rank.p_value < 1e-6 and s.rank.prob_greater > 0.55


def test_same_distribution_is_not_flagged() -> None:
    rng = np.random.default_rng(4)
    base, cand = lognormal_ns(rng, 1000), lognormal_ns(rng, 1000)
    s = compare_series("end-to-end", cstats.Binned.from_samples(base), cstats.Binned.from_samples(cand))
    assert not any(m.flagged for m in s.metrics)
    assert s.rank.p_value > 0.05


def test_aa_false_positive_rate_is_near_alpha() -> None:
    """200 A/A comparisons (same distribution): the flagged fraction is about alpha, not above it."""
    rng = np.random.default_rng(12345)
    reps = 200
    hits = {"p50": 0, "p90": 0, "mean": 0, "rank": 0}
    for i in range(reps):
        a = cstats.Binned.from_samples(lognormal_ns(rng, 400))
        b = cstats.Binned.from_samples(lognormal_ns(rng, 400))
        s = compare_series("e2e", a, b, n_boot=500, seed=i)
        for k in ("p50", "p90", "mean"):
            hits[k] += s.metric(k).significant
        hits["rank"] += s.rank.p_value < 0.05
    rates = {k: v / reps for k, v in hits.items()}
    # Binomial(200, 0.05) exceeds 0.10 with probability ~0.2%: a rate above it means a miscalibrated test.
    assert all(r <= 0.10 for r in rates.values()), rates
    assert sum(rates.values()) / len(rates) >= 0.02, rates  # and the tests are not vacuous


def test_block_bootstrap_keeps_correlated_runs_from_false_alarms() -> None:
    """Runs whose iterations drift (AR(1), phi = 0.9): an i.i.d. bootstrap calls most A/A pairs different;
    resampling blocks of twice the estimated correlation time cuts the false alarms by more than half."""
    rng = np.random.default_rng(7)

    def drifting(n: int) -> np.ndarray:
        e = rng.normal(0.0, 1.0, n)
        x = np.empty(n)
        x[0] = e[0] / math.sqrt(1 - 0.81)
        for i in range(1, n):
            x[i] = 0.9 * x[i - 1] + e[i]
        return 3e6 * (1.0 + 0.02 * x)

    reps = 60
    iid = blocked = 0
    for i in range(reps):
        a, b = drifting(600), drifting(600)
        ba, bb = cstats.Binned.from_samples(a, ordered=True), cstats.Binned.from_samples(b, ordered=True)
        assert 16 <= ba.block <= 60  # twice the integrated autocorrelation time, (1 + 0.9) / (1 - 0.9) = 19
        blocked += cstats.bootstrap_deltas(ba, bb, [0.5], n_boot=400, seed=i)[0].significant
        ia, ib = cstats.Binned.from_samples(a), cstats.Binned.from_samples(b)
        iid += cstats.bootstrap_deltas(ia, ib, [0.5], n_boot=400, seed=i)[0].significant
    assert iid / reps > 0.4
    assert blocked / reps <= 0.25 and blocked < iid / 2
    assert cstats.Binned.from_samples(rng.normal(size=600), ordered=True).block == 1


def test_max_uses_the_exact_exceedance_test() -> None:
    base = cstats.Binned.from_samples(np.arange(100.0))
    one_outlier = cstats.Binned.from_samples(np.r_[np.arange(99.0), 1000.0])
    six_beyond = cstats.Binned.from_samples(np.r_[np.arange(94.0), np.arange(200.0, 206.0)])
    assert cstats.exceedance_test(base, one_outlier) == pytest.approx(1.0)
    # C(100, 6) / C(200, 6), two-sided
    expected = 2 * math.comb(100, 6) / math.comb(200, 6)
    assert cstats.exceedance_test(base, six_beyond) == pytest.approx(expected)
    assert expected < 0.05
    s = compare_series("x", base, six_beyond)
    assert s.metric("max").method == "exceedance" and s.metric("max").significant


def test_rate_tests() -> None:
    assert cstats.error_rate_test(5, 1000, 30, 1000) == pytest.approx(fisher_exact([[5, 995], [30, 970]])[1], rel=1e-9)
    assert cstats.error_rate_test(5, 1000, 6, 1000) > 0.5
    assert cstats.poisson_rate_test(1000, 10.0, 1010, 10.0) > 0.5
    assert cstats.poisson_rate_test(1000, 10.0, 800, 10.0) < 1e-4


# ------------------------------------------------------------------------------------------ gates
@pytest.mark.parametrize(
    ("text", "series", "metric", "op", "threshold", "relative"),
    [
        ("p99>+5%", None, "p99", ">", 0.05, True),
        (" p50 > 5 % ", None, "p50", ">", 0.05, True),
        ("forward:p50>+10%", "forward", "p50", ">", 0.10, True),
        ("mean>2ms", None, "mean", ">", 2e6, False),
        ("p99.9>500us", None, "p999", ">", 5e5, False),
        ("p999>+0%", None, "p999", ">", 0.0, True),
        ("max>1s", None, "max", ">", 1e9, False),
        ("throughput<-5%", None, "throughput", "<", -0.05, True),
        ("throughput<-20", None, "throughput", "<", -20.0, False),
        ("error_rate>+1pp", None, "error_rate", ">", 0.01, False),
        ("error_rate>0.002", None, "error_rate", ">", 0.002, False),
        ("uncorrected:p99>+5%", "uncorrected", "p99", ">", 0.05, True),
    ],
)
def test_gate_parse(text: str, series: str | None, metric: str, op: str, threshold: float, relative: bool) -> None:
    g = Gate.parse(text)
    assert (g.series, g.metric, g.op, g.relative) == (series, metric, op, relative)
    assert g.threshold == pytest.approx(threshold)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("p99", "bad gate"),
        ("p99>>5%", "bad gate"),
        ("p98>+5%", "unknown metric"),
        ("p99>5", "needs % or a unit"),
        ("p99>-5%", "threshold must be >= 0"),
        ("throughput<5%", "write 'throughput<-5%'"),
        ("throughput<-5ms", "plain number"),
        ("forward:error_rate>1pp", "belongs to the whole run"),
        ("error_rate>+1ms", "%, pp or a fraction"),
    ],
)
def test_gate_parse_rejects(text: str, why: str) -> None:
    with pytest.raises(LatencyLabError, match=why.replace("(", r"\(").replace("+", r"\+")):
        Gate.parse(text)


# ------------------------------------------------------------------------------------------ fixtures
def fingerprint(model: str = "Test CPU", memory: int = 2**34) -> dict[str, Any]:
    return {
        "fingerprint_version": 1,
        "cpu": {"model": model, "logical_cpus": 8},
        "memory": {"total_bytes": memory, "available_bytes": 123},
        "load": {"loadavg": [0.5, 0.5, 0.5]},
    }


def profile_result(
    seed: int, forward_scale: float = 1.0, n: int = 1500, env: dict[str, Any] | None = None
) -> ProfileResult:
    rng = np.random.default_rng(seed)
    pre = rng.normal(1e6, 1e5, n)
    fwd = forward_scale * 3e6 * rng.lognormal(0.0, 0.25, n)
    stages = (
        StageSeries("preprocess", "preprocess", tuple(int(v) for v in pre)),
        StageSeries("forward", "forward", tuple(int(v) for v in fwd)),
    )
    e2e = np.rint(pre).astype(np.int64) + np.rint(fwd).astype(np.int64)
    starts = np.r_[0, np.cumsum(e2e)[:-1]]
    return ProfileResult(
        workload="synthetic",
        stages=stages,
        iteration_start_ns=tuple(int(v) for v in starts),
        clock="fake",
        config={"rule": "iterations", "iterations": n},
        pipeline={"name": "synthetic", "forward_scale": forward_scale},
        env=env if env is not None else fingerprint(),
        stop_reason="iterations reached",
        warmup_iterations=0,
        wall_time_s=float(e2e.sum()) / 1e9,
    )


@pytest.fixture(scope="module")
def profile_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("profiles")
    return {
        "base": save_profile(profile_result(1), d / "base.json"),
        "same": save_profile(profile_result(2), d / "same.json"),
        "slow": save_profile(profile_result(3, forward_scale=1.10), d / "slow.json"),
        "other_cpu": save_profile(profile_result(2, env=fingerprint("Other CPU", memory=2**35)), d / "other_cpu.json"),
    }


def load_doc(seed: int, scale: float = 1.0, n: int = 20_000, errors: int = 20, seconds: float = 10.0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    corrected = lognormal_ns(rng, n, scale)
    uncorrected = corrected * 0.98
    hists = {}
    for name, values in (("corrected_ok", corrected), ("uncorrected_ok", uncorrected)):
        h = LatencyHistogram(lowest_ns=1)
        h.record_many(values)
        hists[name] = h.to_dict()
    summary = {"ok": n, "sent": n + errors, "error": errors, "shed": 0, "duration_s": seconds}
    return LoadResult(
        target={"url": "http://127.0.0.1:8000", "model": "m"},
        arrivals={"kind": "poisson", "rate": n / seconds},
        config={"mode": "open"},
        summary=summary,
        histograms=hists,
        timeline=(),
        env=fingerprint(),
    ).to_dict()


# ------------------------------------------------------------------------------------------ profile results
def test_profile_comparison_flags_the_regressed_stage(profile_files: dict[str, Path]) -> None:
    gates = ["forward:p50>+5%", "preprocess:p50>+1%"]
    c = compare_files(profile_files["base"], profile_files["slow"], gates=gates, strict=True)
    assert c.level == "iteration"
    assert [s.name for s in c.series] == ["end-to-end", "preprocess", "forward"]
    fwd = c.find("forward").metric("p50")
    assert fwd.flagged and fwd.rel == pytest.approx(0.10, abs=0.03)
    assert not any(m.flagged for m in c.find("preprocess").metrics)
    assert c.find("end-to-end").metric("p50").flagged
    assert [g.fired for g in c.gates] == [True, False]
    assert c.exit_code == 1
    assert any(d.path == "pipeline.forward_scale" for d in c.config)
    # Without --strict the same evidence (one run a side) leaves the gate undecided: exit 0.
    lenient = compare_files(profile_files["base"], profile_files["slow"], gates=gates)
    assert [(g.fired, g.undecided) for g in lenient.gates] == [(False, True), (False, False)]
    assert lenient.exit_code == 0 and "one run a side" in lenient.gates[0].why


def test_profile_comparison_of_one_configuration_flags_nothing(profile_files: dict[str, Path]) -> None:
    c = compare_files(profile_files["base"], profile_files["same"], gates=["p50>+1%", "p99>+1%", "mean>+0%"])
    assert not any(m.flagged for s in c.series for m in s.metrics)
    assert c.exit_code == 0 and not c.failed
    assert c.env == ()


def test_env_differences_that_matter_are_shown(
    profile_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    c = compare_files(profile_files["base"], profile_files["other_cpu"])
    assert [(d.path, d.impact) for d in c.env] == [("cpu.model", "high")]  # memory size: low impact, hidden
    assert main(["compare", str(profile_files["base"]), str(profile_files["other_cpu"])]) == 0
    out = capsys.readouterr().out
    assert "environment differences that may explain a change:" in out
    assert "high   cpu.model: Test CPU -> Other CPU" in out
    assert "total_bytes" not in out


# ------------------------------------------------------------------------------------------ the CLI
def test_cli_gate_fires_with_exit_1_and_figures(
    profile_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["compare", str(profile_files["base"]), str(profile_files["slow"]), "--fail-if", "p50>+5%"]
    assert main(args) == 0  # one run a side: undecided, not failed
    out = capsys.readouterr().out
    assert "undecided p50>+5%: beyond +5% and significant: end-to-end p50" in out
    assert "    but one run a side: the within-run statistics cannot separate a change" in out
    assert "compare: 1 gate(s) undecided, not failed: p50>+5%" in out
    assert "level: one run a side." in out
    rc = main([*args, "--strict"])
    out = capsys.readouterr().out
    assert rc == 1
    line = next(x for x in out.splitlines() if "FAIL p50>+5% (--strict): " in x)
    assert "    undecided without --strict: one run a side" in out
    assert "end-to-end p50" in line and "95% CI" in line and "p<" in line
    assert "compare: 1 gate(s) fired: p50>+5%" in out
    assert "slower" in out


def test_cli_gate_within_threshold_exits_0(profile_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["compare", str(profile_files["base"]), str(profile_files["slow"]), "--fail-if", "p50>+30%"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "pass p50>+30%: within +30%" in out


def test_cli_noise_never_fires_a_gate(profile_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """A zero threshold on an A/A pair: whatever the point estimate, no significant change, no failure."""
    args = ["compare", str(profile_files["base"]), str(profile_files["same"])]
    rc = main([*args, "--fail-if", "p50>0%", "--fail-if", "forward:p90>0%", "--fail-if", "mean>0ms"])
    assert rc == 0
    assert "FAIL" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--fail-if", "p99>5"], "needs % or a unit"),
        (["--fail-if", "nosuch:p50>+5%"], "no series 'nosuch'"),
        (["--fail-if", "throughput<-5%"], "load results only"),
    ],
)
def test_cli_usage_errors_exit_2(
    profile_files: dict[str, Path], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    rc = main(["compare", str(profile_files["base"]), str(profile_files["same"]), *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("latencylab compare: error:") and message in err
    assert len(err.strip().splitlines()) == 1


def test_cli_input_errors_exit_2(
    profile_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = str(profile_files["base"])
    (tmp_path / "load.json").write_text(json.dumps(load_doc(0)))
    (tmp_path / "opt.json").write_text(json.dumps({"schema_version": 1, "kind": "optimize", "candidates": []}))
    (tmp_path / "junk.json").write_text("{not json")
    cases = [
        (str(tmp_path / "missing.json"), "no such result file"),
        (str(tmp_path / "junk.json"), "not a JSON result file"),
        (str(tmp_path / "load.json"), "cannot compare a profile result with a load result"),
        (str(tmp_path / "opt.json"), "cannot compare kind 'optimize'"),
    ]
    for path, message in cases:
        assert main(["compare", base, path]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_json_output_round_trips(profile_files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cmp.json"
    rc = main(
        ["compare", str(profile_files["base"]), str(profile_files["slow"]), "--fail-if", "p99>+5%", "--json", str(out)]
    )
    data = json.loads(out.read_text())
    assert data["kind"] == "compare" and data["result_kind"] == "profile" and data["alpha"] == 0.05
    back = Comparison.from_dict(data)
    assert back == compare_files(profile_files["base"], profile_files["slow"], gates=["p99>+5%"])
    assert back.to_dict() == data
    assert rc == back.exit_code
    p50 = back.find("forward").metric("p50")
    assert data["series"][2]["metrics"][0]["baseline"] == p50.baseline


# ------------------------------------------------------------------------------------------ load results
def test_load_comparison_from_histograms() -> None:
    base = load_doc(10)
    slow = load_doc(11, scale=1.10, errors=150, seconds=10.0)
    c = compare_docs(base, slow, gates=[Gate.parse("p50>+5%"), Gate.parse("error_rate>+0.2pp")], strict=True)
    assert c.result_kind == "load"
    assert [s.name for s in c.series] == ["latency", "uncorrected"]
    lat = c.find("latency")
    assert lat.n_baseline == 20_000 and lat.n_candidate == 20_000
    p50 = lat.metric("p50")
    assert p50.flagged and p50.rel == pytest.approx(0.10, abs=0.01)
    err = next(r for r in c.rates if r.metric == "error_rate")
    assert err.baseline == pytest.approx(20 / 20_020) and err.candidate == pytest.approx(150 / 20_150)
    assert err.flagged and err.method == "fisher"
    thr = next(r for r in c.rates if r.metric == "throughput")
    assert thr.baseline == pytest.approx(2000.0) and not thr.significant
    assert [g.fired for g in c.gates] == [True, True]


def test_load_aa_comparison_flags_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(load_doc(20)))
    b.write_text(json.dumps(load_doc(21)))
    rc = main(
        ["compare", str(a), str(b), "--fail-if", "p99>+0%", "--fail-if", "throughput<-0%", "--fail-if", "error_rate>0"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "changed: nothing" in out


def test_load_throughput_drop_fires_its_gate() -> None:
    base = load_doc(30, n=20_000, seconds=10.0)
    fewer = load_doc(31, n=18_000, errors=18, seconds=10.0)  # 1800/s instead of 2000/s
    c = compare_docs(base, fewer, gates=[Gate.parse("throughput<-5%"), Gate.parse("throughput<-20%")], strict=True)
    thr = next(r for r in c.rates if r.metric == "throughput")
    assert thr.rel == pytest.approx(-0.10) and thr.significant
    assert [g.fired for g in c.gates] == [True, False]
    # One load run a side: without --strict the drop is undecided (the machine may have moved between runs).
    c = compare_docs(base, fewer, gates=[Gate.parse("throughput<-5%")])
    assert c.gates[0].undecided and not c.gates[0].fired and c.exit_code == 0


# ------------------------------------------------------------------------------------------ real runs
def _profile(path: Path, forward: str) -> None:
    args = ["profile", "--workload", "synthetic", "--iterations", "1500", "--warmup", "20", "--quiet"]
    assert main([*args, "--param", STAGES.format(fwd=forward), "--json", str(path)]) == 0


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three real ``latencylab profile --workload synthetic`` runs: two of one configuration, one 10% slower."""
    d = tmp_path_factory.mktemp("real")
    paths = {"a": d / "a.json", "b": d / "b.json", "slow": d / "slow.json"}
    _profile(paths["a"], "600us")
    _profile(paths["b"], "600us")
    _profile(paths["slow"], "660us")
    return paths


def test_two_real_runs_of_one_configuration_do_not_differ(
    real_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    gates = ["p50>+2%", "p90>+2%", "forward:p50>+2%", "preprocess:p50>+2%"]
    rc = main(["compare", str(real_runs["a"]), str(real_runs["b"]), *(x for g in gates for x in ("--fail-if", g))])
    out = capsys.readouterr().out
    assert rc == 0, out
    c = compare_files(real_runs["a"], real_runs["b"], gates=gates)
    # One run a side: the within-run tests may call a real difference between the two runs significant (on a
    # busy machine they do: issue 23, and a run here once flagged p90 +2.6%), but that difference is the
    # machine's as much as the program's, so such a gate is undecided and never fails the build.
    assert c.level == "iteration" and not c.failed
    assert all(g.undecided for g in c.gates if g.beyond and g.significant)
    assert {g.series for g in c.gates} == {"end-to-end", "forward", "preprocess"}  # the gated series exist


def test_real_run_with_a_10pct_slower_forward_is_flagged(
    real_runs: dict[str, Path], capsys: pytest.CaptureFixture[str], machine_noise: Noise
) -> None:
    capsys.readouterr()
    rc = main(["compare", str(real_runs["a"]), str(real_runs["slow"]), "--fail-if", "forward:p50>+5%", "--strict"])
    out = capsys.readouterr().out
    c = compare_files(real_runs["a"], real_runs["slow"])
    fwd = c.find("forward").metric("p50")
    judged = rc == 1 and fwd.flagged and abs((fwd.rel or 0) - 0.10) <= 0.015
    if not judged:
        # One run a side is at the machine's mercy (issue 23; the interleaved gate is tested in
        # test_compare_runs.py): a failure counts only if the machine was quiet.
        machine_noise.recheck("a +10% stage change between two single runs", stolen=0.05)
    assert rc == 1, out
    assert fwd.flagged and fwd.rel == pytest.approx(0.10, abs=0.015)
    assert not c.find("preprocess").metric("p50").flagged
    assert any("forward.a_ns" in d.path for d in c.config)
    assert c.find("end-to-end").metric("p50").flagged
