from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from latencylab.errors import LatencyLabError
from latencylab.histogram import LatencyHistogram

QS = [0.0, 0.001, 0.01, 0.1, 0.25, 0.29, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999, 1.0]
UNIT = 512  # 2**floor(log2(1000)): the default layout's resolution floor


@pytest.fixture(scope="module")
def lognormal() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.rint(rng.lognormal(math.log(2e6), 0.8, 100_000))  # median 2 ms, p99.99 ~ 40 ms


@pytest.fixture(scope="module")
def hist(lognormal: np.ndarray) -> LatencyHistogram:
    h = LatencyHistogram()
    h.record_many(lognormal)
    return h


def test_quantiles_match_exact_order_statistics_within_hdr_precision(
    lognormal: np.ndarray, hist: LatencyHistogram
) -> None:
    srt = np.sort(lognormal)
    n = srt.size
    assert hist.count == n
    got = hist.quantiles(QS)
    for q, value in zip(QS, got, strict=True):
        assert value == hist.quantile(q)
        if q == 0.0:
            assert value <= srt[0] < value + UNIT
            continue
        # HDR: the rank round(q n) order statistic, rounded up to its bucket top.
        x = srt[max(1, int(q * n + 0.5)) - 1]
        tol = max(x * 1e-3, UNIT)
        assert x <= value <= x + tol, (q, x, value)
        # and within HDR precision (plus one rank's gap) of numpy's interpolated quantile
        exact = float(np.quantile(lognormal, q))
        k = int(q * n + 0.5)
        rank_gap = srt[min(k, n - 1)] - srt[max(k - 2, 0)]
        assert abs(value - exact) <= tol + rank_gap, (q, exact, value)
    # bulk quantiles (values >= unit * 10**3) are relatively precise to 0.1% against numpy
    for q in (0.1, 0.5, 0.9, 0.99):
        exact = float(np.quantile(lognormal, q))
        assert abs(hist.quantile(q) / exact - 1) < 1.2e-3


def test_statistics_agree_with_hdrh_and_numpy(lognormal: np.ndarray, hist: LatencyHistogram) -> None:
    ref = HdrHistogram(1000, 3_600_000_000_000, 3)
    for v in lognormal[:20_000]:
        ref.record_value(int(v))
    h = LatencyHistogram()
    h.record_many(lognormal[:20_000])
    assert h.encode() == ref.encode().decode()
    assert h.quantiles(QS) == [float(ref.get_value_at_percentile(q * 100)) for q in QS]
    assert h.mean_ns == pytest.approx(ref.get_mean_value(), rel=1e-12)
    assert h.std_ns == pytest.approx(ref.get_stddev(), rel=1e-9)
    assert h.min_ns == ref.get_min_value()
    assert h.max_ns == ref.get_max_value()
    # and the bucketed mean/std are within resolution of the exact ones
    assert hist.mean_ns == pytest.approx(lognormal.mean(), rel=1e-3)
    assert hist.std_ns == pytest.approx(lognormal.std(), rel=1e-3)
    assert hist.min_ns <= lognormal.min() < hist.min_ns + UNIT
    assert hist.max_ns >= lognormal.max() > hist.max_ns * (1 - 1e-3)


def test_record_many_equals_record_loop() -> None:
    values = [0, 1, 999.4, 1000, 1500.5, 2500.5, 1048575, 1048576, 123456789.7, 5e12, 3_600_000_000_000]
    a, b = LatencyHistogram(), LatencyHistogram()
    for v in values:
        a.record(v)
    b.record_many(values)
    b.record_many(np.array([], dtype=np.float64))
    assert a.encode() == b.encode()
    assert a.count == b.count == len(values)
    assert a.clamped == b.clamped == 1
    assert a.min_ns == b.min_ns == 512.0  # 0, 1 and 999.4 are recorded as lowest_ns=1000 (bucket 512-1023)


def test_clamping_is_counted_never_lost() -> None:
    h = LatencyHistogram(lowest_ns=1000, highest_ns=1_000_000)
    h.record(5e9)
    h.record(math.inf, count=3)
    h.record(1_000_000)  # exactly highest: not clamped
    h.record(1_000_000.4)  # rounds to highest: not clamped
    h.record_many([2_000_000, 10, 500_000])
    assert h.count == 9
    assert h.clamped == 5
    assert h.quantile(1.0) >= 1_000_000
    assert h.quantile(0.99) >= 1_000_000  # the clamped values sit at the top, not dropped
    assert h.quantile(0.0) <= 1000


def test_bad_values_and_fractions_raise() -> None:
    h = LatencyHistogram()
    with pytest.raises(ValueError, match="non-negative"):
        h.record(-1)
    with pytest.raises(ValueError, match="non-negative"):
        h.record(math.nan)
    with pytest.raises(ValueError, match="non-negative"):
        h.record_many([5.0, -3.0])
    with pytest.raises(ValueError, match="count"):
        h.record(5, count=-1)
    assert h.count == 0
    h.record(5000)
    for q in (99, 1.01, -0.1, math.nan):
        with pytest.raises(ValueError, match="fraction"):
            h.quantile(q)
    with pytest.raises(ValueError, match="fraction"):
        h.quantiles([0.5, 50])


def test_empty_histogram_is_nan_safe() -> None:
    h = LatencyHistogram()
    assert h.count == 0
    assert math.isnan(h.min_ns) and math.isnan(h.max_ns)
    assert math.isnan(h.mean_ns) and math.isnan(h.std_ns)
    assert math.isnan(h.quantile(0.99))  # hdrh itself answers 0
    assert h.cdf() == []
    back = LatencyHistogram.decode(h.encode())
    assert back.count == 0 and back.layout == h.layout


@pytest.mark.parametrize("shards", [4])
def test_merging_shards_equals_one_histogram(lognormal: np.ndarray, hist: LatencyHistogram, shards: int) -> None:
    parts = []
    for chunk in np.array_split(lognormal, shards):
        p = LatencyHistogram()
        p.record_many(chunk)
        parts.append(p)
    parts[2].record(7e12)  # a clamped value in one shard
    whole = hist.copy()
    whole.record(7e12)
    merged = LatencyHistogram.merged(parts)
    assert merged.count == whole.count == lognormal.size + 1
    assert merged.clamped == whole.clamped == 1
    qs = [i / 200 for i in range(201)] + [0.999, 0.9999]
    assert merged.quantiles(qs) == whole.quantiles(qs)
    assert (merged.min_ns, merged.max_ns, merged.mean_ns) == (whole.min_ns, whole.max_ns, whole.mean_ns)
    assert merged.encode() == whole.encode()
    assert LatencyHistogram.decode(merged.encode()).encode() == whole.encode()
    # merged() copies: the shards are untouched
    assert parts[0].count == len(np.array_split(lognormal, shards)[0])


def test_merge_with_empty_keeps_minimum() -> None:
    # hdrh's add() sets min to 0 when the other histogram is empty
    h = LatencyHistogram()
    h.record_many([5_000_000, 7_000_000])
    h.merge(LatencyHistogram())
    assert h.min_ns == pytest.approx(5_000_000, rel=1e-3)
    assert h._h.get_min_value() == h.min_ns
    empty = LatencyHistogram()
    empty.merge(h)
    assert (empty.count, empty.min_ns, empty.max_ns) == (2, h.min_ns, h.max_ns)


def test_layout_mismatch_raises() -> None:
    a = LatencyHistogram()
    for other in (
        LatencyHistogram(lowest_ns=1),
        LatencyHistogram(highest_ns=60_000_000_000),
        LatencyHistogram(significant_figures=2),
    ):
        with pytest.raises(LatencyLabError, match="different layouts"):
            a.merge(other)
    with pytest.raises(ValueError, match="at least one"):
        LatencyHistogram.merged([])


def test_encode_decode_and_dict_round_trip(hist: LatencyHistogram) -> None:
    text = hist.encode()
    assert isinstance(text, str) and text.startswith("HISTF")
    back = LatencyHistogram.decode(text)
    assert back.layout == hist.layout
    assert back.count == hist.count
    assert back.quantiles(QS) == hist.quantiles(QS)
    assert back.encode() == text
    h = hist.copy()
    h.record(1e15)
    d = json.loads(json.dumps(h.to_dict()))
    assert set(d) == {"lowest_ns", "highest_ns", "significant_figures", "count", "clamped", "encoded"}
    assert (d["count"], d["clamped"], d["lowest_ns"]) == (hist.count + 1, 1, 1000)
    again = LatencyHistogram.from_dict(d)
    assert again.to_dict() == d
    # interoperable: plain hdrh reads our encoding and vice versa
    ref = HdrHistogram.decode(text)
    assert ref.get_total_count() == hist.count
    assert float(ref.get_value_at_percentile(99.0)) == hist.quantile(0.99)
    ref2 = HdrHistogram(1, 60_000_000_000, 2)
    ref2.record_value(12345)
    small = LatencyHistogram.decode(ref2.encode().decode())
    assert small.layout == (1, 60_000_000_000, 2) and small.count == 1
    assert small.quantile(0.5) == ref2.get_value_at_percentile(50)


@pytest.mark.parametrize("garbage", ["", "garbage", "!!!!", "HISTFAAAACB4nJNpmSzMwMDAxQABzFCaEUqz2X+AsQEAQ+sCkQ=="])
def test_decode_garbage_is_one_line_error(garbage: str) -> None:
    with pytest.raises(LatencyLabError, match="not an encoded HDR histogram") as err:
        LatencyHistogram.decode(garbage)
    assert "\n" not in str(err.value)


def test_from_dict_checks_consistency(hist: LatencyHistogram) -> None:
    d = hist.to_dict()
    with pytest.raises(LatencyLabError, match="count"):
        LatencyHistogram.from_dict({**d, "count": 3})
    with pytest.raises(LatencyLabError, match="layout"):
        LatencyHistogram.from_dict({**d, "significant_figures": 2})
    with pytest.raises(LatencyLabError, match="lacks encoded"):
        LatencyHistogram.from_dict({k: v for k, v in d.items() if k != "encoded"})


def test_cdf_points() -> None:
    h = LatencyHistogram()
    h.record_many([2_000_000] * 3 + [4_000_000] + [8_000_000] * 4)
    pts = h.cdf()
    assert [f for _, f in pts] == [3 / 8, 4 / 8, 1.0]
    for (v, _), true in zip(pts, (2_000_000, 4_000_000, 8_000_000), strict=True):
        assert true <= v < true * (1 + 1e-3)
    assert pts[-1][0] == h.max_ns


def test_copy_and_reset_are_independent() -> None:
    h = LatencyHistogram()
    h.record_many([1e6, 2e6, 3e6])
    h.record(1e14)
    c = h.copy()
    h.reset()
    assert (h.count, h.clamped) == (0, 0)
    assert math.isnan(h.quantile(0.5))
    assert (c.count, c.clamped) == (4, 1)
    assert 2e6 <= c.quantile(0.5) < 2e6 * 1.001
    h.record(5e6)
    assert c.count == 4 and h.count == 1
    assert h.min_ns <= 5e6 <= h.max_ns < h.min_ns * 1.001


def test_bad_layout_raises() -> None:
    with pytest.raises(LatencyLabError, match="lowest_ns"):
        LatencyHistogram(lowest_ns=0)
    with pytest.raises(LatencyLabError, match="highest_ns"):
        LatencyHistogram(lowest_ns=1000, highest_ns=1500)
    with pytest.raises(LatencyLabError, match="significant_figures"):
        LatencyHistogram(significant_figures=6)
