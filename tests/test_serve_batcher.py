"""The deadline-aware batcher with a variant whose batch cost is known (sleeps)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from latencylab.serve.batcher import Batcher, DeadlineExceeded, LatencyModel, ModelFailure, Shed
from latencylab.serve.types import InferRequest, Tensor, TensorSpec


class SleepVariant:
    """forward(batch of n) sleeps base + per_item * n seconds; records the batches it saw."""

    name = "sleepy"
    kind = "primary"
    inputs = (TensorSpec("X", "FP32", (-1,)),)
    outputs = (TensorSpec("Y", "FP32", (-1,)),)

    def __init__(self, base: float = 0.004, per_item: float = 0.001, max_batch_size: int = 8) -> None:
        self.base, self.per_item, self.max_batch_size = base, per_item, max_batch_size
        self.batches: list[list[Any]] = []
        self.fail_next = False

    def preprocess(self, request: InferRequest) -> Any:
        return request

    def forward(self, items: Sequence[Any]) -> Any:
        self.batches.append(list(items))
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        time.sleep(self.base + self.per_item * len(items))
        return list(items)

    def postprocess(self, raw: Any, n: int) -> list[tuple[Tensor, ...]]:
        return [
            (Tensor("Y", "FP32", (1,), np.array([x if isinstance(x, int) else -1], dtype=np.float32)),) for x in raw
        ]

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        for n in batch_sizes:
            for _ in range(2):
                self.forward([0] * n)


def ms(x: float) -> int:
    return int(x * 1e6)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_latency_model_learns_and_interpolates() -> None:
    m = LatencyModel(alpha=0.5)
    assert m.predict(4) == 0.0
    m.observe(1, 0.010)
    m.observe(8, 0.024)
    assert m.predict(1) == 0.010
    assert m.predict(4) == pytest.approx(0.010 + 0.014 * 3 / 7)
    assert m.predict(16) == pytest.approx(0.048)  # per-item cost of the largest size
    m.observe(1, 0.020)
    assert m.predict(1) == pytest.approx(0.015)  # EWMA


def test_burst_fills_batches_to_the_maximum() -> None:
    async def go() -> list[Any]:
        v = SleepVariant()
        b = Batcher(v, max_batch_size=4, max_delay_s=0.05, max_queue=100)
        b.start()
        far = time.perf_counter_ns() + ms(5000)
        futs = [b.submit(i, far) for i in range(8)]
        outs = await asyncio.gather(*futs)
        await b.stop()
        return [v.batches, outs]

    batches, outs = run(go())
    assert [len(x) for x in batches] == [4, 4]
    assert [o.reason for o in outs] == ["full"] * 8
    assert [float(o.outputs[0].data[0]) for o in outs] == list(range(8))


def test_idle_batcher_releases_a_lone_request_at_once() -> None:
    async def go() -> Any:
        b = Batcher(SleepVariant(), max_batch_size=8, max_delay_s=0.03, max_queue=100)
        b.start()
        out = await b.submit(1, time.perf_counter_ns() + ms(5000))
        await b.stop()
        return out

    out = run(go())
    assert out.reason == "idle"  # nothing else is expected within 30 ms: waiting would only add latency
    assert out.queue_s < 0.005


def test_lone_request_released_after_max_delay_under_traffic() -> None:
    async def go() -> tuple[Any, float]:
        b = Batcher(SleepVariant(), max_batch_size=8, max_delay_s=0.03, max_queue=100)
        b._gap_s = 0.002  # as after a stream of arrivals 2 ms apart: a batch is worth waiting for
        b.start()
        t0 = time.perf_counter()
        out = await b.submit(1, time.perf_counter_ns() + ms(5000))
        dt = time.perf_counter() - t0
        await b.stop()
        return out, dt

    out, dt = run(go())
    assert out.reason == "timeout"
    assert out.batch_size == 1
    assert 0.03 <= out.queue_s < 0.045
    assert dt >= 0.035  # 30 ms wait + 5 ms compute


def test_tight_deadline_releases_early_and_is_met() -> None:
    async def go() -> tuple[Any, float]:
        v = SleepVariant(base=0.005, per_item=0.0)
        b = Batcher(v, max_batch_size=8, max_delay_s=0.2, max_queue=100)
        b._gap_s = 0.002  # busy traffic: without the deadline it would wait up to 200 ms
        b.warmup([1])  # teaches the model ~5 ms per batch
        b.start()
        t0 = time.perf_counter_ns()
        deadline = t0 + ms(20)
        out = await b.submit(1, deadline)
        done = time.perf_counter_ns()
        await b.stop()
        return out, (deadline - done) / 1e6

    out, slack_ms = run(go())
    assert out.reason == "deadline"
    assert out.queue_s < 0.019  # released ~ deadline - predicted compute - margin, not after 200 ms
    assert slack_ms >= -2.0  # answered by its deadline (2 ms: sleep overshoot on a busy 2-core machine)


def test_earliest_deadline_first() -> None:
    async def go() -> list[Any]:
        v = SleepVariant(base=0.02, per_item=0.0, max_batch_size=1)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.001, max_queue=100)
        b.start()
        now = time.perf_counter_ns()
        first = b.submit("busy", now + ms(5000))  # occupies the compute thread for 20 ms
        await asyncio.sleep(0.005)
        futs = [b.submit(name, now + ms(d)) for name, d in (("late", 3000), ("soon", 500), ("mid", 1000))]
        await asyncio.gather(first, *futs)
        await b.stop()
        return [x[0] for x in v.batches]

    assert run(go()) == ["busy", "soon", "mid", "late"]


def test_admission_sheds_full_queue_and_infeasible_deadline() -> None:
    async def go() -> list[str]:
        v = SleepVariant(base=0.05, per_item=0.0)
        b = Batcher(v, max_batch_size=2, max_delay_s=0.001, max_queue=3)
        b.warmup([1, 2])
        reasons = []
        now = time.perf_counter_ns()
        with pytest.raises(Shed) as e1:
            b.admit(now + ms(10), now)  # needs ~50 ms of compute
        reasons.append(e1.value.reason)
        for i in range(3):
            b.submit(i, now + ms(5000))
        with pytest.raises(Shed) as e2:
            b.admit(now + ms(5000), now)
        reasons.append(e2.value.reason)
        assert e2.value.retry_after_s > 0
        await b.stop()
        return reasons

    assert run(go()) == ["deadline", "queue_full"]


def test_model_failure_fails_its_batch_only() -> None:
    async def go() -> tuple[bool, float]:
        v = SleepVariant()
        b = Batcher(v, max_batch_size=4, max_delay_s=0.001, max_queue=100)
        b.start()
        v.fail_next = True
        with pytest.raises(ModelFailure, match="RuntimeError: boom"):
            await b.submit(1, time.perf_counter_ns() + ms(5000))
        out = await b.submit(2, time.perf_counter_ns() + ms(5000))
        await b.stop()
        return True, float(out.outputs[0].data[0])

    assert run(go()) == (True, 2.0)


def test_request_past_its_deadline_in_the_queue_is_not_computed() -> None:
    async def go() -> list[Any]:
        v = SleepVariant(base=0.08, per_item=0.0, max_batch_size=1)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.001, max_queue=100)
        b.start()
        now = time.perf_counter_ns()
        busy = b.submit("busy", now + ms(5000))
        await asyncio.sleep(0.005)
        doomed = b.submit("doomed", now + ms(30))  # its deadline passes while "busy" computes
        with pytest.raises(DeadlineExceeded):
            await doomed
        await busy
        await b.stop()
        return [x[0] for x in v.batches]

    assert run(go()) == ["busy"]


class SlowPreprocessVariant(SleepVariant):
    """Warm-up also pays a slow preprocess (like JPEG decode); compute alone is ``base + per_item * n``."""

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        for n in batch_sizes:
            for _ in range(2):
                time.sleep(0.03)  # preprocess of the warm-up request
                self.forward([0] * n)

    def warmup_items(self, n: int) -> list[Any]:
        return [0] * n


def test_warmup_seeds_compute_time_not_preprocess() -> None:
    v = SlowPreprocessVariant(base=0.004, per_item=0.0)
    b = Batcher(v, max_batch_size=1, max_delay_s=0.001, max_queue=4)
    b.warmup([1])
    # the old seed (half of warm-up) would be ~34 ms; compute alone is ~4 ms
    assert 0.003 <= b.model.predict(1) < 0.015
    # without warmup_items the variant is charged half its warm-up time (every stage, twice)
    b2 = Batcher(SleepVariant(base=0.004, per_item=0.0), max_batch_size=1, max_delay_s=0.001, max_queue=4)
    b2.warmup([1])
    assert 0.003 <= b2.model.predict(1) < 0.015


def test_reservations_count_ahead_until_submitted_or_given_back() -> None:
    async def go() -> list[str]:
        v = SleepVariant(base=0.02, per_item=0.0)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.001, max_queue=3)
        b.warmup([1])
        out = []
        now = time.perf_counter_ns()
        for _ in range(3):  # three admitted, all still preprocessing: nothing in the queue yet
            b.admit(now + ms(5000), now)
        assert len(b) == 0
        with pytest.raises(Shed) as e1:  # ... but they are ahead of the next one
            b.admit(now + ms(5000), now)
        out.append(e1.value.reason)
        b.unreserve()
        b.unreserve()
        # one reservation left: a request admitted now waits for it (~20 ms) then its own batch (~20 ms)
        finish = b.predicted_finish_ns(now)
        assert finish - now > ms(30)
        with pytest.raises(Shed) as e2:
            b.admit(now + ms(30), now)
        out.append(e2.value.reason)
        b.admit(now + ms(5000), now, lead_ns=0)
        with pytest.raises(Shed) as e3:  # lead time (preprocess still to come) counts against the deadline
            b.admit(now + ms(200), now, lead_ns=ms(300))
        out.append(e3.value.reason)
        await b.stop()
        return out

    assert run(go()) == ["queue_full", "deadline", "deadline"]


def test_release_fails_fast_whoever_cannot_finish_by_the_deadline() -> None:
    async def go() -> tuple[list[str], int]:
        v = SleepVariant(base=0.05, per_item=0.0)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.0001, max_queue=8)
        b.warmup([1])
        warm = len(v.batches)
        b.start()
        now = time.perf_counter_ns()
        first = b.submit(1, now + ms(5000))  # occupies the compute thread for ~50 ms
        await asyncio.sleep(0.005)
        # admitted earlier with a deadline that was feasible then; after waiting ~45 ms behind the first
        # batch it can no longer finish its own ~50 ms of compute by its deadline (now + 70 ms)
        doomed = b.submit(2, now + ms(70))
        results = await asyncio.gather(first, doomed, return_exceptions=True)
        await b.stop()
        kinds = [type(r).__name__ for r in results]
        return kinds, len(v.batches) - warm

    kinds, n_batches = run(go())
    assert kinds == ["BatchOutcome", "DeadlineExceeded"]
    assert n_batches == 1  # the doomed request never spent compute


def test_two_workers_run_two_batches_at_once() -> None:
    async def go() -> tuple[float, int]:
        v = SleepVariant(base=0.05, per_item=0.0, max_batch_size=1)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.0001, max_queue=16, workers=2)
        b.warmup([1])
        b.start()
        now = time.perf_counter_ns()
        t0 = time.perf_counter()
        # admission plans for two workers: 4 one-item batches of 50 ms finish in ~100 ms, not ~200 ms
        assert b.predicted_finish_ns(now) - now < ms(60)
        futs = [b.submit(i, now + ms(5000)) for i in range(4)]
        await asyncio.gather(*futs)
        took = time.perf_counter() - t0
        await b.stop()
        return took, max(o.batch_size for o in [f.result() for f in futs])

    took, biggest = run(go())
    assert biggest == 1
    assert 0.09 <= took < 0.17  # two at a time (one worker would need >= 0.2 s)


def test_workers_share_the_predicted_backlog() -> None:
    one = Batcher(SleepVariant(base=0.02, per_item=0.0), max_batch_size=1, max_delay_s=0.001, max_queue=64)
    two = Batcher(SleepVariant(base=0.02, per_item=0.0), max_batch_size=1, max_delay_s=0.001, max_queue=64, workers=2)
    for b in (one, two):
        b.model.observe(1, 0.02)
        for _ in range(10):
            b.admit(10**18, 0)
    w1 = one.predicted_finish_ns(0) / 1e9
    w2 = two.predicted_finish_ns(0) / 1e9
    assert w1 == pytest.approx(0.22)  # 10 ahead + its own, one at a time
    assert w2 == pytest.approx(0.12)  # 10 ahead shared by two workers + its own


def test_one_stall_cannot_make_the_model_shed_forever() -> None:
    m = LatencyModel()
    m.observe(1, 0.002)
    m.observe(1, 0.190)  # one 190-ms hiccup: clipped to 4x before the EWMA
    assert m.predict(1) == pytest.approx(0.002 + 0.2 * (0.008 - 0.002))
    for _ in range(30):  # a real, lasting slowdown is still learned
        m.observe(1, 0.050)
    assert m.predict(1) == pytest.approx(0.050, rel=0.02)


def test_admission_probes_after_shedding_everything_for_a_while() -> None:
    b = Batcher(SleepVariant(base=0.05, per_item=0.0), max_batch_size=1, max_delay_s=0.001, max_queue=8)
    b.model.observe(1, 0.05)
    b.probe_after_ns = ms(100)
    t = 10**12
    b.admit(t + ms(1000), t)  # admitted (feasible)
    b.unreserve()
    with pytest.raises(Shed):
        b.admit(t + ms(60) + ms(10), t + ms(60))  # infeasible, and the last admission is recent: shed
    b.admit(t + ms(200) + ms(10), t + ms(200))  # infeasible, but nothing admitted for 200 ms: a probe goes in
    with pytest.raises(Shed):
        b.admit(t + ms(210) + ms(10), t + ms(210))


def test_thread_init_runs_in_each_compute_thread() -> None:
    import threading

    ran: list[str] = []

    async def go() -> None:
        b = Batcher(SleepVariant(base=0.001, per_item=0.0), max_batch_size=1, max_delay_s=0.0001, max_queue=8,
                    workers=2, thread_init=lambda: ran.append(threading.current_thread().name))  # fmt: skip
        b.start()
        now = time.perf_counter_ns()
        await asyncio.gather(*[b.submit(i, now + ms(5000)) for i in range(6)])
        await b.stop()

    run(go())
    assert ran and all(n.startswith("compute-sleepy") for n in ran) and len(ran) <= 2


class BucketVariant(SleepVariant):
    """Items are (name, tokens); a batch sleeps 0.25 ms per token of its longest item per item, like an
    encoder whose cost grows with padded length. ``bucket`` is the next power of two >= tokens (min 16)."""

    buckets = (16, 32, 64, 128)

    def __init__(self) -> None:
        super().__init__(base=0.0, per_item=0.0, max_batch_size=8)

    def bucket(self, item: Any) -> int:
        return max(16, 1 << (item[1] - 1).bit_length())

    def forward(self, items: Sequence[Any]) -> Any:
        self.batches.append([x[0] for x in items])
        time.sleep(0.00025 * max(x[1] for x in items) * len(items) + 0.001)
        return [0 for _ in items]

    def warmup_items(self, n: int, bucket: int | None = None) -> list[Any]:
        return [("warm", (3 * (bucket or 16)) // 4) for _ in range(n)]

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        pass


def test_bucketed_latency_model_is_per_bucket() -> None:
    v = BucketVariant()
    b = Batcher(v, max_batch_size=8, max_delay_s=0.001, max_queue=100)
    b.warmup([1, 2, 4])
    assert b.bucketed and set(b._models) >= {16, 32, 64, 128}
    # 1 ms + 0.25 ms x 96 tokens = 25 ms for one item of bucket 128, 4 ms for bucket 16
    assert 0.02 <= b.predict(128, 1) < 0.04
    assert 0.003 <= b.predict(16, 1) < 0.009
    assert b.predict(128, 1) > 4 * b.predict(16, 1)
    assert b.predict(256, 1) == pytest.approx(2 * b.predict(128, 1))  # never measured: scaled from 128


def _started_bucket_batcher() -> tuple[BucketVariant, Batcher]:
    """A warmed, started batcher over BucketVariant (in a running loop), its warm-up batches forgotten."""
    v = BucketVariant()
    b = Batcher(v, max_batch_size=8, max_delay_s=0.001, max_queue=100)
    b.warmup([1, 2, 4])
    v.batches.clear()
    b.start()
    return v, b


def test_short_requests_do_not_wait_behind_long_ones() -> None:
    """The worker is busy; then one long request and three short ones queue, the long one first. The short
    batch (4 ms) runs first: the long one (25 ms) has laxity to spare."""

    async def go() -> list[list[Any]]:
        v, b = _started_bucket_batcher()
        now = time.perf_counter_ns()
        busy = b.submit(("busy", 100), now + ms(5000))  # ~26 ms on the worker
        await asyncio.sleep(0.003)
        futs = [b.submit(("long", 100), now + ms(1000))]
        futs += [b.submit((f"short{i}", 10), now + ms(1000)) for i in range(3)]
        await asyncio.gather(busy, *futs)
        await b.stop()
        return v.batches

    batches = run(go())
    assert batches[0] == ["busy"]
    assert sorted(batches[1]) == ["short0", "short1", "short2"] and batches[2] == ["long"]


def test_a_long_request_about_to_miss_goes_first() -> None:
    """Same queue, but the long request's deadline leaves it less laxity than the short batch takes: it goes
    first (it can still make it), and the short ones after."""

    async def go() -> tuple[list[list[Any]], list[Any]]:
        v, b = _started_bucket_batcher()
        now = time.perf_counter_ns()
        busy = b.submit(("busy", 100), now + ms(5000))
        await asyncio.sleep(0.003)
        # busy ends ~27 ms after `now`; the long one then needs ~25 ms + 3 ms margin: a 60-ms deadline
        # leaves it ~5 ms of laxity at that point, less than the short batch (3 x 12 tokens: ~10 ms) takes
        long = b.submit(("long", 100), now + ms(60))
        shorts = [b.submit((f"short{i}", 10), now + ms(1000)) for i in range(3)]
        results = await asyncio.gather(busy, long, *shorts, return_exceptions=True)
        await b.stop()
        return v.batches, results

    batches, results = run(go())
    assert batches[1] == ["long"], batches
    assert not any(isinstance(r, Exception) for r in results), results


def _long_then_shorts(target_ms: float | None) -> list[list[Any]]:
    """A busy worker, then one long request (deadline 5 s; target ``target_ms`` from now) and three short ones."""

    async def go() -> list[list[Any]]:
        v, b = _started_bucket_batcher()
        now = time.perf_counter_ns()
        busy = b.submit(("busy", 100), now + ms(5000))
        await asyncio.sleep(0.003)
        target = None if target_ms is None else now + ms(target_ms)
        long = b.submit(("long", 100), now + ms(5000), target_ns=target)
        shorts = [b.submit((f"short{i}", 10), now + ms(5000)) for i in range(3)]
        await asyncio.gather(busy, long, *shorts)
        await b.stop()
        return v.batches

    return run(go())


def test_the_order_protects_the_latency_target_not_only_the_deadline() -> None:
    """With a 5-s deadline nothing is at risk, and shortest-first makes the long request wait for the shorts.
    With a 60-ms target (start + SLO) it has less laxity than the short batch takes, so it goes first; with a
    target it can no longer meet (20 ms: busy alone ends after it), it is not let ahead of the others."""
    assert _long_then_shorts(None)[2] == ["long"]
    assert _long_then_shorts(60)[1] == ["long"]
    assert _long_then_shorts(20)[2] == ["long"]
