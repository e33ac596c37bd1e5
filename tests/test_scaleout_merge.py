"""Merging per-worker parts: lossless histograms, one-host summary form, validity per worker (fast tier)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from latencylab.histogram import LatencyHistogram
from latencylab.load.generator import LATE_NS, LoadConfig, Records, RunStats
from latencylab.load.results import Slo, new_histogram, summarize_run
from latencylab.scaleout.load_ray import LoadWorker
from latencylab.scaleout.merge import (
    RECORD_FIELDS,
    PartFold,
    completed,
    merge_summary,
    merged_histograms,
    merged_records,
    merged_timeline,
    part_from_records,
    worker_row,
)

QS = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999, 1.0]
CFG = LoadConfig(duration_s=5.0)
SLO = Slo.parse("p99=40ms")


def _records(seed: int, n: int, late_share: float = 0.0) -> Records:
    rng = np.random.default_rng(seed)
    intended = np.sort(rng.uniform(0, 5e9, n)).astype(np.int64)
    late = np.where(rng.random(n) < late_share, 3 * LATE_NS, rng.integers(0, 200_000, n)).astype(np.int64)
    sent = intended + late
    done = sent + rng.lognormal(np.log(10e6), 0.6 + 0.2 * seed, n).astype(np.int64)
    outcome = rng.choice([0, 1, 2], size=n, p=[0.9, 0.07, 0.03]).astype(np.int8)
    status = np.where(outcome == 0, 200, np.where(outcome == 1, 503, 500)).astype(np.int16)
    errors = {"HTTP 500": int((outcome == 2).sum())}
    return Records(intended, sent, done, outcome, status, np.zeros(n, np.int32), errors, [])


def _stats(rec: Records) -> RunStats:
    return RunStats(
        wall_s=float(rec.done_ns.max()) / 1e9, send_span_s=float(rec.intended_ns.max()) / 1e9, cpu_s=0.5,
        connections_opened=4, max_in_flight=3, cpu_share=0.1, cores=1, spin="auto", spun=rec.n // 2,
        other_cpu_cores=0.05,
    )  # fmt: skip


def _part(i: int, rec: Records, keep: bool = False):  # type: ignore[no-untyped-def]
    run = _stats(rec)
    summary, _, _ = summarize_run(rec, run, CFG, 100.0, SLO, 0.99)
    return part_from_records(i, f"node{i}", rec, SLO.threshold_ns, 0, summary, run, keep_records=keep)


def _all(recs: list[Records]) -> Records:
    cat = {f: np.concatenate([getattr(r, f) for r in recs]) for f in ("intended_ns", "sent_ns", "done_ns", "outcome")}
    n = cat["outcome"].size
    return Records(cat["intended_ns"], cat["sent_ns"], cat["done_ns"], cat["outcome"], np.zeros(n, np.int16),
                   np.zeros(n, np.int32), {}, [])  # fmt: skip


def test_merged_percentiles_equal_one_histogram_of_all_samples() -> None:
    recs = [_records(i, 3000 + 977 * i) for i in range(3)]
    parts = [_part(i, r) for i, r in enumerate(recs)]
    merged = merged_histograms(parts)
    everything = _all(recs)
    ok = everything.outcome == 0
    for name, values in (
        ("corrected_ok", everything.corrected()[ok]),
        ("uncorrected_ok", everything.uncorrected()[ok]),
        ("lateness", everything.lateness()),
        ("corrected_shed", everything.corrected()[everything.outcome == 1]),
    ):
        one = new_histogram()
        one.record_many(np.maximum(values, 1))
        assert merged[name].count == one.count == values.size
        assert merged[name].quantiles(QS) == one.quantiles(QS)
        assert merged[name].encode() == one.encode()
    summary, _ = merge_summary(parts, CFG, 300.0, SLO, 0.99)
    one = new_histogram()
    one.record_many(np.maximum(everything.corrected()[ok], 1))
    assert summary["p99_ms"] == one.quantile(0.99) / 1e6
    assert summary["p99_9_ms"] == one.quantile(0.999) / 1e6


def test_merged_summary_has_the_one_host_form_and_counts() -> None:
    recs = [_records(i, 2000) for i in range(2)]
    parts = [_part(i, r) for i, r in enumerate(recs)]
    summary, _ = merge_summary(parts, CFG, 200.0, SLO, 0.99)
    everything = _all(recs)
    one, _, verdict = summarize_run(everything, _stats(everything), CFG, 200.0, SLO, 0.99)
    assert set(one) <= set(summary)  # every one-host key, plus none missing
    for k in ("sent", "ok", "shed", "error", "late_fraction", "valid", "target_rate"):
        assert summary[k] == one[k], k
    assert summary["slo"]["over"] == one["slo"]["over"] and summary["slo"]["verdict"] == verdict.status
    # HDR percentile vs the interpolated order statistic: within the histogram's resolution and one sample gap
    srt = np.sort(everything.corrected()[everything.outcome == 0])
    k = round(0.99 * srt.size)
    assert srt[k - 2] / 1e6 <= summary["p99_ms"] <= srt[k] * 1.001 / 1e6
    lo, hi = summary["p99_ci_ms"]
    assert lo <= summary["p99_ms"] <= hi
    assert summary["client_cores"] == 2 and summary["connections_opened"] == 8  # two nodes of one core


def test_a_worker_that_fell_behind_or_died_makes_the_run_invalid_and_is_named() -> None:
    good = _part(0, _records(0, 2000))
    behind = _part(1, _records(1, 2000, late_share=0.05))
    assert good.summary is not None and good.summary["valid"]
    summary, _ = merge_summary([good, behind], CFG, 200.0)
    assert summary["valid"] is False
    assert any(r.startswith("worker 1 (node1): generator fell behind") for r in summary["invalid_reasons"])
    partial = part_from_records(1, "node1", _records(2, 500), partial=True)
    summary, _ = merge_summary([good, partial], CFG, 200.0, failures={1: "ActorDiedError after 2.0 s"})
    assert summary["valid"] is False and summary["sent"] == 2500
    assert "worker 1 (node1) failed: ActorDiedError" in summary["invalid_reasons"][0]
    row = worker_row(partial, "ActorDiedError after 2.0 s")
    assert row["partial"] and row["valid"] is False and row["sent"] == 500


def test_a_merged_run_late_only_by_its_workers_is_kept_by_the_capacity_searchs_late_rule() -> None:
    # --find-capacity --ray --max-late F: a chunk whose only fault is a worker's late sends is kept up to F, as
    # one host's is; a worker that died is never "late only"
    from latencylab.load.capacity import Segment
    from latencylab.load.results import LoadResult

    recs = [_records(0, 2000), _records(1, 2000, late_share=0.05)]
    good, behind = _part(0, recs[0]), _part(1, recs[1])

    def segment(summary: dict) -> Segment:  # type: ignore[type-arg]
        result = LoadResult({}, None, {}, summary, {}, (), {})
        return Segment.from_run(200.0, result, _all(recs))

    late, _ = merge_summary([good, behind], CFG, 200.0)
    seg = segment(late)
    assert not seg.valid and seg.late_only and 0.02 < seg.late_fraction < 0.03  # 5% of one worker's half
    assert seg.usable(0.05) and not seg.usable(0.01)
    died, _ = merge_summary([good, behind], CFG, 200.0, failures={0: "ActorDiedError after 2.0 s"})
    assert not segment(died).late_only and not segment(died).usable(0.5)


def test_timeline_and_records_merge_per_second() -> None:
    recs = [_records(i, 1500) for i in range(2)]
    parts = [_part(i, r, keep=True) for i, r in enumerate(recs)]
    tl = merged_timeline(parts)
    everything = _all(recs)
    sec = everything.intended_ns // 1_000_000_000
    assert [row["sent"] for row in tl] == [int((sec == b).sum()) for b in range(len(tl))]
    b = 2
    sel = (sec == b) & (everything.outcome == 0)
    h = LatencyHistogram.merged([new_histogram()])
    h.record_many(np.maximum(everything.corrected()[sel], 1))
    assert tl[b]["p99_ms"] == h.quantile(0.99) / 1e6
    rec = merged_records(parts)
    assert rec is not None and rec.n == 3000 and np.all(np.diff(rec.intended_ns) >= 0)
    assert merged_records([parts[0], part_from_records(1, "x", recs[1])]) is None  # one without records


def test_completed_keeps_answered_requests_and_cuts_ragged_arrays() -> None:
    rec = _records(0, 10)
    outcome = rec.outcome.copy()
    outcome[[2, 5]] = -1
    ragged = Records(rec.intended_ns, rec.sent_ns[:9], rec.done_ns, outcome, rec.status, rec.payload, {}, [])
    got = completed(ragged)
    assert got.n == 7 and np.array_equal(got.intended_ns, rec.intended_ns[[0, 1, 3, 4, 6, 7, 8]])


def test_snapshots_ship_each_completed_request_once_in_any_completion_order() -> None:
    rng = np.random.default_rng(5)
    n = 400
    outcome = np.full(n, -1, np.int8)
    sent_so_far = 0

    def read(start: int) -> Records:
        k = sent_so_far
        z = np.arange(k, dtype=np.int64)
        return Records(z[start:], z[start:], z[start:] + 1, outcome[start:k].copy(), np.zeros(k - start, np.int16),
                       np.zeros(k - start, np.int32), {}, [])  # fmt: skip

    w = LoadWorker(0)
    assert w.snapshot() is None
    w._read = read
    shipped: list[int] = []
    for _ in range(40):
        sent_so_far = min(n, sent_so_far + 10)
        pending = np.flatnonzero(outcome[:sent_so_far] < 0)
        done = rng.choice(pending, size=min(pending.size, int(rng.integers(0, 15))), replace=False)
        outcome[done] = 0
        snap = w.snapshot()
        assert snap is not None
        shipped += snap["intended_ns"].tolist()
    outcome[:] = 0
    snap = w.snapshot()
    assert snap is not None
    shipped += snap["intended_ns"].tolist()
    assert sorted(shipped) == list(range(n))  # every request exactly once


def test_part_needs_matching_layouts() -> None:
    part = _part(0, _records(0, 100))
    assert part.histogram("corrected_ok").layout == new_histogram().layout
    with pytest.raises(KeyError):
        part.histogram("nope")


def _chunks(rec: Records, sizes: list[int]) -> list[dict[str, np.ndarray]]:
    """``rec`` cut into polls of completed requests (in completion order, as a worker ships them)."""
    order = np.argsort(rec.done_ns, kind="stable")
    out, at = [], 0
    for k in sizes:
        sel = order[at : at + k]
        out.append({f: getattr(rec, f)[sel] for f in RECORD_FIELDS})
        at += k
    return out


def test_folding_polls_as_they_arrive_equals_one_part_of_all_their_requests() -> None:
    rec = _records(3, 3000, late_share=0.02)
    fold = PartFold(1, "node1", SLO.threshold_ns)
    for chunk in _chunks(rec, [1, 0, 700, 299, 1500, 500]):
        fold.add(chunk)
    got = fold.part()
    whole = part_from_records(1, "node1", _all_fields(rec), SLO.threshold_ns, partial=True)
    assert got.histograms == whole.histograms  # the same HDR encodings, byte for byte
    assert got.counts == whole.counts and got.late == whole.late
    assert (got.slo_over, got.slo_good) == (whole.slo_over, whole.slo_good)
    assert got.timeline == whole.timeline
    assert fold.folded == rec.n
    assert PartFold(2, "n", None).part().counts["sent"] == 0  # nothing shipped: an empty partial part


def test_the_drivers_fold_holds_histograms_not_requests() -> None:
    # the same 5 s of intended time polled twice over: twice the requests, and the fold's state does not grow
    rec = _records(1, 100_000)
    fold = PartFold(0, "node0", SLO.threshold_ns)
    sizes = []
    for _ in range(2):
        for chunk in _chunks(rec, [rec.n // 20] * 20):
            fold.add(chunk)
        state = [*vars(fold).values(), *[v for r in fold.rows.values() for v in r.values()]]
        assert not any(isinstance(v, np.ndarray) for v in state)  # no raw request is kept
        sizes.append(len(pickle.dumps(fold.part())))  # the fold's content, in its wire form
    assert fold.folded == 2 * rec.n and fold.part().counts["sent"] == 2 * rec.n
    raw = sum(getattr(rec, f).nbytes for f in RECORD_FIELDS)
    assert sizes[0] < raw / 5  # 100k requests' raw arrays are ~2.8 MB; the fold is a few histograms
    assert sizes[1] < 1.1 * sizes[0]  # 2x the requests: the same buckets, larger counts


def _all_fields(rec: Records) -> Records:
    return Records(rec.intended_ns, rec.sent_ns, rec.done_ns, rec.outcome, rec.status, rec.payload, {}, [])
