from __future__ import annotations

import numpy as np
import pytest

from latencylab import stats


def test_quantile_is_type7_linear_interpolation() -> None:
    x = [10.0, 20.0, 30.0, 40.0]
    # h = (n-1) q = 3 * 0.5 = 1.5 -> 20 + 0.5 * (30 - 20)
    assert stats.quantile(x, 0.5) == 25.0
    # h = 3 * 0.9 = 2.7 -> 30 + 0.7 * 10
    assert stats.quantile(x, 0.9) == pytest.approx(37.0)
    assert stats.quantile(x, 0.0) == 10.0
    assert stats.quantile(x, 1.0) == 40.0


def test_quantiles_must_be_fractions() -> None:
    with pytest.raises(ValueError, match="fraction"):
        stats.quantile([1.0, 2.0], 99)
    with pytest.raises(ValueError, match="no samples"):
        stats.quantile([], 0.5)


def test_samples_needed_for_tail() -> None:
    assert stats.samples_needed(0.99) == 1000
    assert stats.samples_needed(0.999) == 10000
    assert stats.samples_needed(0.5) == 20


def test_summary_descriptives_hand_computed() -> None:
    x = np.arange(1, 101, dtype=float)  # 1..100
    s = stats.summarize(x, qs=(0.5, 0.99), n_boot=200)
    assert s.n == 100
    assert s.mean == 50.5
    assert s.min == 1 and s.max == 100
    assert s.median == 50.5
    assert s.iqr == pytest.approx(75.25 - 25.75)
    assert s.std == pytest.approx(np.std(x, ddof=1))
    p99 = s.at(0.99)
    assert p99.value == pytest.approx(99.01)
    assert p99.tail_samples == 1 and not p99.enough
    assert any("p99 rests on 1 tail samples of 100: need 900 more samples" in w for w in s.warnings)


def test_bootstrap_ci_covers_true_median_and_shrinks_with_n() -> None:
    rng = np.random.default_rng(1)
    small = stats.summarize(rng.normal(100, 10, 200), qs=(0.5,))
    large = stats.summarize(rng.normal(100, 10, 5000), qs=(0.5,))
    for s in (small, large):
        est = s.at(0.5)
        assert est.ci_low <= 100 <= est.ci_high
    assert (large.at(0.5).ci_high - large.at(0.5).ci_low) < (small.at(0.5).ci_high - small.at(0.5).ci_low) / 3


def test_bootstrap_coverage_is_near_nominal() -> None:
    # 200 experiments: a 95% CI for p90 of an exponential should cover the truth ~95% of the time.
    truth = -np.log(0.1)  # p90 of Exp(1)
    rng = np.random.default_rng(7)
    covered = 0
    for i in range(200):
        x = rng.exponential(1.0, 400)
        lo, hi = stats.bootstrap_quantile_ci(np.sort(x), [0.9], n_boot=300, seed=i)[0]
        covered += lo <= truth <= hi
    assert 0.88 <= covered / 200 <= 0.99


def test_order_stat_ci_covers_truth_for_large_n() -> None:
    rng = np.random.default_rng(3)
    x = np.sort(rng.exponential(1.0, 50_000))
    lo, hi = stats.order_stat_ci(x, 0.99)
    truth = -np.log(0.01)
    assert lo <= truth <= hi
    assert (hi - lo) / truth < 0.1
    s = stats.summarize(x, qs=(0.99,))
    assert "order statistics" in s.ci_method


def test_stability_warnings() -> None:
    steady = stats.summarize(np.full(2000, 5.0) + np.linspace(0, 0.1, 2000), qs=(0.5, 0.99))
    assert steady.warnings == ()
    noisy = stats.summarize(np.random.default_rng(0).lognormal(0, 1.0, 2000), qs=(0.5,))
    assert any("unstable: IQR" in w for w in noisy.warnings)
    assert any("noisy: std" in w for w in noisy.warnings)


def test_format_q() -> None:
    assert stats.format_q(0.5) == "p50"
    assert stats.format_q(0.99) == "p99"
    assert stats.format_q(0.999) == "p99.9"
    assert stats.format_q(0.9999) == "p99.99"


def test_detect_level_shift_located() -> None:
    rng = np.random.default_rng(0)
    x = rng.lognormal(np.log(1e6), 0.1, 2000)
    x[1200:1400] *= 2.0
    spikes = stats.detect_spikes(x)
    assert len(spikes) == 1
    sp = spikes[0]
    assert sp.kind == "level-shift"
    assert abs(sp.start - 1200) <= 2 and abs(sp.end - 1400) <= 2
    assert sp.ratio == pytest.approx(2.0, rel=0.05)
    assert sp.at_s == pytest.approx(x[: sp.start].sum() / 1e9, rel=1e-9)


def test_detect_isolated_stall() -> None:
    x = np.random.default_rng(0).normal(1e6, 5e4, 1000)
    x[500] = 200e6
    spikes = stats.detect_spikes(x)
    assert [(s.kind, s.start) for s in spikes] == [("stall", 500)]
    assert spikes[0].ratio == pytest.approx(200, rel=0.05)


@pytest.mark.parametrize("sigma", [0.1, 0.25, 0.5])
def test_no_false_alarm_on_clean_heavy_tailed_runs(sigma: float) -> None:
    x = np.random.default_rng(11).lognormal(np.log(1e6), sigma, 5000)
    assert stats.detect_spikes(x) == []


def test_share() -> None:
    assert stats.share(25, 100) == 0.25
    assert stats.share(1, 0) == 0.0
