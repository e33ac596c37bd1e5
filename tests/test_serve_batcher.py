"""The deadline-aware batcher with a variant whose batch cost is known.

Most tests run the batcher on a ``FakeClock``: the variant spends its cost by advancing the clock, and a test
that needs the compute thread busy while it queues more holds the variant at a gate (``SleepVariant.gate``)
instead of racing a sleep, so every release time, prediction and order is exact on any machine. The tests
whose point is real timing (the release timer, two compute threads at once) state their noise precondition.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from conftest import Noise
from latencylab.clock import FakeClock
from latencylab.serve.admission import LatencyModel, Shed
from latencylab.serve.batcher import Batcher, DeadlineExceeded, ModelFailure
from latencylab.serve.types import InferRequest, Tensor, TensorSpec


class SleepVariant:
    """forward(batch of n) takes base + per_item * n seconds (sleeps, or advances ``clock``); records the batches
    it saw. With ``gate`` set, forward first waits (real time) until the test opens it; ``entered`` is set when a
    forward has begun."""

    name = "sleepy"
    kind = "primary"
    inputs = (TensorSpec("X", "FP32", (-1,)),)
    outputs = (TensorSpec("Y", "FP32", (-1,)),)

    def __init__(
        self, base: float = 0.004, per_item: float = 0.001, max_batch_size: int = 8, clock: FakeClock | None = None
    ) -> None:
        self.base, self.per_item, self.max_batch_size = base, per_item, max_batch_size
        self.clock = clock
        self.batches: list[list[Any]] = []
        self.fail_next = False
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def preprocess(self, request: InferRequest) -> Any:
        return request

    def forward(self, items: Sequence[Any]) -> Any:
        self.batches.append(list(items))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        self.spend(self.base + self.per_item * len(items))
        return list(items)

    def spend(self, seconds: float) -> None:
        if self.clock is None:
            time.sleep(seconds)
        else:
            self.clock.advance(seconds * 1e9)

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


def on_fake_clock(
    variant_cls: type[SleepVariant] = SleepVariant, **variant: Any
) -> tuple[FakeClock, SleepVariant, dict[str, Any]]:
    """A fake clock, a variant that spends its cost on it, and the keyword the Batcher needs to share it."""
    clock = FakeClock(10**12)
    v = variant_cls(clock=clock, **variant)
    return clock, v, {"clock": clock}


async def busy_with(b: Batcher, v: SleepVariant, item: Any, deadline_ns: int) -> asyncio.Future[Any]:
    """Submit ``item`` with the variant's gate closed and return once its forward has begun: the compute thread
    is busy until ``v.gate.set()``."""
    v.gate = threading.Event()
    v.entered.clear()
    fut = b.submit(item, deadline_ns)
    while not v.entered.is_set():
        await asyncio.sleep(0.001)
    return fut


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
        _, v, clk = on_fake_clock()
        b = Batcher(v, max_batch_size=4, max_delay_s=0.05, max_queue=100, **clk)
        b.start()
        far = b.now_ns() + ms(5000)
        futs = [b.submit(i, far) for i in range(8)]
        outs = await asyncio.gather(*futs)
        await b.stop()
        return [v.batches, outs]

    batches, outs = run(go())
    assert [len(x) for x in batches] == [4, 4]
    assert [o.reason for o in outs] == ["full"] * 8
    assert [float(o.outputs[0].data[0]) for o in outs] == list(range(8))
    # on the fake clock the second batch queued exactly as long as the first computed (4 + 4 x 1 ms)
    assert [o.queue_s for o in outs] == [0.0] * 4 + [pytest.approx(0.008)] * 4
    assert all(o.compute_s == pytest.approx(0.008) for o in outs)


def test_idle_batcher_releases_a_lone_request_at_once() -> None:
    async def go() -> Any:
        _, v, clk = on_fake_clock()
        b = Batcher(v, max_batch_size=8, max_delay_s=0.03, max_queue=100, **clk)
        b.start()
        out = await b.submit(1, b.now_ns() + ms(5000))
        await b.stop()
        return out

    out = run(go())
    assert out.reason == "idle"  # nothing else is expected within 30 ms: waiting would only add latency
    assert out.queue_s == 0.0


def test_release_plan_waits_max_delay_under_traffic_and_less_for_a_deadline() -> None:
    """The release plan on a fake clock: under traffic a lone request waits the queue delay ("timeout"); a
    deadline that the delay would break releases it at deadline - predicted compute - margin ("deadline")."""
    clock, v, clk = on_fake_clock(base=0.005, per_item=0.0)
    b = Batcher(v, max_batch_size=8, max_delay_s=0.03, max_queue=100, **clk)
    b.warmup([1, 2])  # teaches the model 5 ms per batch
    assert b.predict(0, 1) == b.predict(0, 2) == pytest.approx(0.005)

    async def go() -> list[tuple[int, str]]:
        b._gap_s = 0.002  # as after a stream of arrivals 2 ms apart: a batch is worth waiting for
        t0 = clock.now_ns
        b.submit(1, t0 + ms(5000))  # not started: only the plan is looked at
        plans = [b._release_at(t0)]
        b.submit(2, t0 + ms(20))
        plans.append(b._release_at(t0))
        await b.stop()
        return [(at - t0, why) for at, why in plans]

    assert run(go()) == [(ms(30), "timeout"), (ms(20 - 5) - b.margin_ns, "deadline")]


def test_lone_request_released_after_max_delay_in_real_time(machine_noise: Noise) -> None:
    """The release timer itself (real clock): a lone request under traffic leaves the queue after the 30-ms
    delay, not before, and not much after."""
    limits = {"stolen": 0.5, "wake_late_ms": 3.0}
    machine_noise.require("a 30-ms release timer to 15 ms", **limits)

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
    assert out.queue_s >= 0.03
    assert dt >= 0.035  # 30 ms wait + 5 ms compute
    if out.queue_s >= 0.045:
        machine_noise.recheck("a 30-ms release timer to 15 ms", **limits)
    assert out.queue_s < 0.045


def test_tight_deadline_releases_early_and_is_met_in_real_time(machine_noise: Noise) -> None:
    limits = {"stolen": 0.5, "wake_late_ms": 2.0}
    machine_noise.require("a deadline 20 ms away to 2 ms", **limits)

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

    # Up to three tries: a release planned right is met in nearly every try (typically 1.5-2.3 ms early), while a
    # single stall of a few ms on a quiet machine (seen once in CI: 2.19 ms late) must not fail it; a release
    # planned wrong (after the 200-ms delay, or without the compute's prediction) misses in every try.
    for _ in range(3):
        out, slack_ms = run(go())
        assert out.reason == "deadline"
        if out.queue_s < 0.019 and slack_ms >= -2.0:
            break
    if out.queue_s >= 0.019 or slack_ms < -2.0:
        machine_noise.recheck("a deadline 20 ms away to 2 ms", **limits)
    assert out.queue_s < 0.019  # released ~ deadline - predicted compute - margin, not after 200 ms
    assert slack_ms >= -2.0  # answered by its deadline (2 ms: sleep overshoot)


def test_earliest_deadline_first() -> None:
    async def go() -> list[Any]:
        _, v, clk = on_fake_clock(base=0.02, per_item=0.0, max_batch_size=1)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.001, max_queue=100, **clk)
        b.start()
        now = b.now_ns()
        first = await busy_with(b, v, "busy", now + ms(5000))  # holds the compute thread
        futs = [b.submit(name, now + ms(d)) for name, d in (("late", 3000), ("soon", 500), ("mid", 1000))]
        v.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(first, *futs)
        await b.stop()
        return [x[0] for x in v.batches]

    assert run(go()) == ["busy", "soon", "mid", "late"]


def test_admission_sheds_full_queue_and_infeasible_deadline() -> None:
    async def go() -> list[str]:
        _, v, clk = on_fake_clock(base=0.05, per_item=0.0)
        b = Batcher(v, max_batch_size=2, max_delay_s=0.001, max_queue=3, **clk)
        b.warmup([1, 2])
        reasons = []
        now = b.now_ns()
        b.admit(now + ms(54), now)  # 50 ms of compute + 3 ms margin fit in 54 ms
        b.unreserve()
        with pytest.raises(Shed) as e1:
            b.admit(now + ms(52), now)  # ... not in 52
        reasons.append(e1.value.reason)
        assert e1.value.retry_after_s == pytest.approx(0.1)  # at least 0.1 s (the finish is 53 ms away)
        for i in range(3):
            b.submit(i, now + ms(5000))
        with pytest.raises(Shed) as e2:
            b.admit(now + ms(5000), now)
        reasons.append(e2.value.reason)
        assert e2.value.retry_after_s == pytest.approx(0.1)  # 3 queued in batches of 2 at 50 ms: 75 ms -> 0.1
        await b.stop()
        return reasons

    assert run(go()) == ["deadline", "queue_full"]


def test_model_failure_fails_its_batch_only() -> None:
    async def go() -> tuple[bool, float]:
        _, v, clk = on_fake_clock()
        b = Batcher(v, max_batch_size=4, max_delay_s=0.001, max_queue=100, **clk)
        b.start()
        v.fail_next = True
        with pytest.raises(ModelFailure, match="RuntimeError: boom"):
            await b.submit(1, b.now_ns() + ms(5000))
        out = await b.submit(2, b.now_ns() + ms(5000))
        await b.stop()
        return True, float(out.outputs[0].data[0])

    assert run(go()) == (True, 2.0)


def test_request_past_its_deadline_in_the_queue_is_not_computed() -> None:
    async def go() -> tuple[list[Any], str]:
        _, v, clk = on_fake_clock(base=0.08, per_item=0.0, max_batch_size=1)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.001, max_queue=100, **clk)
        b.start()
        now = b.now_ns()
        busy = await busy_with(b, v, "busy", now + ms(5000))
        doomed = b.submit("doomed", now + ms(30))  # its deadline passes while "busy" computes (80 ms)
        v.gate.set()  # type: ignore[union-attr]
        with pytest.raises(DeadlineExceeded) as e:
            await doomed
        await busy
        await b.stop()
        return [x[0] for x in v.batches], str(e.value)

    assert run(go()) == (["busy"], "deadline passed while queued")


class SlowPreprocessVariant(SleepVariant):
    """Warm-up also pays a slow preprocess (like JPEG decode); compute alone is ``base + per_item * n``."""

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        for n in batch_sizes:
            for _ in range(2):
                self.spend(0.03)  # preprocess of the warm-up request
                self.forward([0] * n)

    def warmup_items(self, n: int) -> list[Any]:
        return [0] * n


def test_warmup_seeds_compute_time_not_preprocess() -> None:
    _, v, clk = on_fake_clock(SlowPreprocessVariant, base=0.004, per_item=0.0)
    b = Batcher(v, max_batch_size=1, max_delay_s=0.001, max_queue=4, **clk)
    b.warmup([1])
    # the old seed (half of warm-up) would be 34 ms; compute alone is 4 ms
    assert b.model.predict(1) == pytest.approx(0.004)
    # without warmup_items the variant is charged half its warm-up time (every stage, twice)
    _, v2, clk2 = on_fake_clock(base=0.004, per_item=0.0)
    b2 = Batcher(v2, max_batch_size=1, max_delay_s=0.001, max_queue=4, **clk2)
    b2.warmup([1])
    assert b2.model.predict(1) == pytest.approx(0.004)


def test_reservations_count_ahead_until_submitted_or_given_back() -> None:
    async def go() -> list[str]:
        _, v, clk = on_fake_clock(base=0.02, per_item=0.0)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.001, max_queue=3, **clk)
        b.warmup([1])
        out = []
        now = b.now_ns()
        for _ in range(3):  # three admitted, all still preprocessing: nothing in the queue yet
            b.admit(now + ms(5000), now)
        assert len(b) == 0
        with pytest.raises(Shed) as e1:  # ... but they are ahead of the next one
            b.admit(now + ms(5000), now)
        out.append(e1.value.reason)
        b.unreserve()
        b.unreserve()
        # one reservation left: a request admitted now waits for it (20 ms) then its own batch (20 ms)
        assert b.predicted_finish_ns(now) - now == ms(40)
        with pytest.raises(Shed) as e2:
            b.admit(now + ms(40) + b.margin_ns - 1, now)
        out.append(e2.value.reason)
        b.admit(now + ms(40) + b.margin_ns, now, lead_ns=0)
        with pytest.raises(Shed) as e3:  # lead time (preprocess still to come) counts against the deadline
            b.admit(now + ms(200), now, lead_ns=ms(300))
        out.append(e3.value.reason)
        await b.stop()
        return out

    assert run(go()) == ["queue_full", "deadline", "deadline"]


def test_nothing_ahead_means_no_queue_no_reservation_and_a_free_worker() -> None:
    """``nothing_ahead`` (the server's ``admit_when_idle``): a request admitted now would be computed next."""

    async def go() -> list[bool]:
        _, v, clk = on_fake_clock(base=0.004, per_item=0.0)
        b = Batcher(v, max_batch_size=4, max_delay_s=0.05, max_queue=8, **clk)
        b.warmup([1])
        now = b.now_ns()
        seen = [b.nothing_ahead()]
        b.admit(now + ms(5000), now)  # reserved, still preprocessing
        seen.append(b.nothing_ahead())
        b.unreserve()
        seen.append(b.nothing_ahead())
        b.start()
        b.admit(now + ms(5000), now)
        fut = asyncio.ensure_future(b.submit(1, now + ms(5000)))  # queued, waiting for its batch to fill
        await asyncio.sleep(0)
        seen.append(b.nothing_ahead())
        await fut
        seen.append(b.nothing_ahead())
        await b.stop()
        return seen

    assert run(go()) == [True, False, True, False, True]


def test_release_fails_fast_whoever_cannot_finish_by_the_deadline() -> None:
    async def go() -> tuple[list[str], str, int]:
        _, v, clk = on_fake_clock(base=0.05, per_item=0.0)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.0001, max_queue=8, **clk)
        b.warmup([1])
        warm = len(v.batches)
        b.start()
        now = b.now_ns()
        first = await busy_with(b, v, 1, now + ms(5000))  # occupies the compute thread for 50 ms
        # admitted earlier with a deadline that was feasible then; after waiting 50 ms behind the first batch it
        # can no longer finish its own 50 ms of compute by its deadline (now + 70 ms), which has not passed yet
        doomed = b.submit(2, now + ms(70))
        v.gate.set()  # type: ignore[union-attr]
        results = await asyncio.gather(first, doomed, return_exceptions=True)
        await b.stop()
        kinds = [type(r).__name__ for r in results]
        return kinds, str(results[1]), len(v.batches) - warm

    kinds, why, n_batches = run(go())
    assert kinds == ["BatchOutcome", "DeadlineExceeded"]
    assert why == "cannot finish by deadline"
    assert n_batches == 1  # the doomed request never spent compute


def test_a_queued_request_fails_at_its_point_of_no_return_not_after_its_deadline() -> None:
    """Every worker busy: a queued request that could no longer finish by its deadline even if it started now
    (deadline - its predicted cost) fails at once with a 504 before the deadline (issue 22: such requests sat in
    the queue, counted ahead of every admission, until their deadline's timer answered them after it); one that
    can still make it stays queued and runs."""

    async def go() -> tuple[str, str, bool, int, int, list[Any]]:
        clock, v, clk = on_fake_clock(base=0.05, per_item=0.0)
        b = Batcher(v, max_batch_size=1, max_delay_s=0.0001, max_queue=8, **clk)
        b.warmup([1])  # a batch of one costs 50 ms
        warm = len(v.batches)
        b.start()
        t0 = b.now_ns()
        busy = await busy_with(b, v, 1, t0 + ms(5000))  # the only worker, held at the gate
        doomed = b.submit(2, t0 + ms(120))  # its point of no return: t0 + 70 ms
        fine = b.submit(3, t0 + ms(5000))
        clock.advance(ms(80))  # past it, while the worker is still busy
        with pytest.raises(DeadlineExceeded) as e:
            await doomed
        failed_at, still_busy = b.now_ns() - t0, not busy.done()
        v.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(busy, fine)
        await b.stop()
        return e.value.where, str(e.value), still_busy, failed_at, len(b), [x[0] for x in v.batches[warm:]]

    where, why, still_busy, failed_at, left, ran = run(go())
    assert (where, why) == ("queue_late", "cannot finish by deadline")
    assert still_busy and failed_at == ms(80) < ms(120)  # before its deadline, while the worker was busy
    assert left == 0 and ran == [1, 3]  # the doomed request never computed; the one that could make it ran


def test_two_workers_run_two_batches_at_once(machine_noise: Noise) -> None:
    """Real threads, real sleeps: the point is that two batches really overlap."""
    limits = {"stolen": 0.5, "wake_late_ms": 5.0}
    machine_noise.require("two 50-ms batches overlapping, to 70 ms", **limits)

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
    assert took >= 0.09  # two at a time, two rounds
    if took >= 0.17:
        machine_noise.recheck("two 50-ms batches overlapping, to 70 ms", **limits)
    assert took < 0.17  # one worker would need >= 0.2 s


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
    """Items are (name, tokens); a batch takes 0.25 ms per token of its longest item per item, plus 1 ms, like an
    encoder whose cost grows with padded length. ``bucket`` is the next power of two >= tokens (min 16)."""

    buckets = (16, 32, 64, 128)

    def __init__(self, clock: FakeClock | None = None) -> None:
        super().__init__(base=0.0, per_item=0.0, max_batch_size=8, clock=clock)

    def bucket(self, item: Any) -> int:
        return max(16, 1 << (item[1] - 1).bit_length())

    def forward(self, items: Sequence[Any]) -> Any:
        self.batches.append([x[0] for x in items])
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        self.spend(0.00025 * max(x[1] for x in items) * len(items) + 0.001)
        return [0 for _ in items]

    def warmup_items(self, n: int, bucket: int | None = None) -> list[Any]:
        return [("warm", (3 * (bucket or 16)) // 4) for _ in range(n)]

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        pass


def test_bucketed_latency_model_is_per_bucket() -> None:
    _, b = _bucket_batcher()
    assert b.bucketed and set(b._models) >= {16, 32, 64, 128}
    # warmed on 3/4 of each bucket: 1 ms + 0.25 ms x 96 tokens = 25 ms for one item of bucket 128, 4 ms for 16
    assert b.predict(128, 1) == pytest.approx(0.025)
    assert b.predict(16, 1) == pytest.approx(0.004)
    assert b.predict(16, 3) == pytest.approx((0.007 + 0.013) / 2)  # between the sizes measured (2 and 4)
    assert b.predict(128, 8) == pytest.approx(2 * 0.097)  # 8 x 128 > 2048 tokens: never run, extrapolated from 4
    assert b.predict(256, 1) == pytest.approx(2 * b.predict(128, 1))  # never measured: scaled from 128


def _bucket_batcher() -> tuple[BucketVariant, Batcher]:
    """A batcher over BucketVariant on a fake clock, warmed on batches of 1, 2 and 4 items (not started)."""
    _, v, clk = on_fake_clock(BucketVariant)
    b = Batcher(v, max_batch_size=8, max_delay_s=0.001, max_queue=100, **clk)
    b.warmup([1, 2, 4])
    return v, b  # type: ignore[return-value]


async def _bucket_batcher_busy() -> tuple[BucketVariant, Batcher, asyncio.Future[Any], int]:
    """A warmed, started batcher over BucketVariant on a fake clock (its warm-up batches forgotten), its compute
    thread held by a ("busy", 100) request (26 ms once the gate opens); and the time it was submitted."""
    v, b = _bucket_batcher()
    v.batches.clear()
    b.start()
    now = b.now_ns()
    busy = await busy_with(b, v, ("busy", 100), now + ms(5000))
    return v, b, busy, now  # type: ignore[return-value]


def test_short_requests_do_not_wait_behind_long_ones() -> None:
    """The worker is busy; then one long request and three short ones queue, the long one first. The short
    batch (predicted 10 ms) runs first: the long one (25 ms) has laxity to spare."""

    async def go() -> list[list[Any]]:
        v, b, busy, now = await _bucket_batcher_busy()
        futs = [b.submit(("long", 100), now + ms(1000))]
        futs += [b.submit((f"short{i}", 10), now + ms(1000)) for i in range(3)]
        v.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(busy, *futs)
        await b.stop()
        return v.batches

    batches = run(go())
    assert batches == [["busy"], ["short0", "short1", "short2"], ["long"]]


def test_a_long_request_about_to_miss_goes_first() -> None:
    """Same queue, but the long request's deadline leaves it less laxity than the short batch takes: it goes
    first (it can still make it), and the short ones after."""

    async def go() -> tuple[list[list[Any]], list[Any]]:
        v, b, busy, now = await _bucket_batcher_busy()
        # busy ends 26 ms after `now`; the long one then needs 25 ms (predicted) + 3 ms margin: a 60-ms deadline
        # leaves it 6 ms of laxity at that point, less than the short batch (3 x 10 tokens: 10 ms) takes
        long = b.submit(("long", 100), now + ms(60))
        shorts = [b.submit((f"short{i}", 10), now + ms(1000)) for i in range(3)]
        v.gate.set()  # type: ignore[union-attr]
        results = await asyncio.gather(busy, long, *shorts, return_exceptions=True)
        await b.stop()
        return v.batches, results

    batches, results = run(go())
    assert batches == [["busy"], ["long"], ["short0", "short1", "short2"]]
    assert not any(isinstance(r, Exception) for r in results), results
    assert results[1].queue_s == pytest.approx(0.026) and results[2].queue_s == pytest.approx(0.052)


def _long_then_shorts(target_ms: float | None, aim_ms: float | None = None) -> list[list[Any]]:
    """A busy worker, then one long request (deadline 5 s; target ``target_ms`` and aim ``aim_ms`` from now) and
    three short ones due in 5 s: the batches in the order they ran."""

    async def go() -> list[list[Any]]:
        v, b, busy, now = await _bucket_batcher_busy()
        target = None if target_ms is None else now + ms(target_ms)
        aim = None if aim_ms is None else now + ms(aim_ms)
        long = b.submit(("long", 100), now + ms(5000), target_ns=target, aim_ns=aim)
        shorts = [b.submit((f"short{i}", 10), now + ms(5000)) for i in range(3)]
        v.gate.set()  # type: ignore[union-attr]
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


def test_a_job_withdrawn_while_the_release_timer_runs_does_not_kill_the_batcher() -> None:
    """The race that stopped a server under overload: the batcher planned a release for a queued job, a client
    left and its job was withdrawn before the timer fired (the wake-up it set was cleared by the planner), and
    the batcher then took from empty queues and died (min() of an empty sequence): every later request got 504.
    The batcher re-plans instead, and keeps serving."""

    class WithdrawWhilePlanning(Batcher):
        victim: asyncio.Future[Any] | None = None

        def _release_at(self, now: int) -> tuple[int, str]:
            at = super()._release_at(now)
            if self.victim is not None and at[0] > now:
                fut, self.victim = self.victim, None
                assert self.withdraw(fut)  # its wake-up is cleared as _run starts to wait: the timer fires
                fut.cancel()
            return at

    async def go() -> tuple[Any, bool]:
        _, v, clk = on_fake_clock()
        # busy worker gone, gap unknown: a lone job waits for its max delay (a timed release)
        b = WithdrawWhilePlanning(v, max_batch_size=8, max_delay_s=0.02, max_queue=100, **clk)
        b._gap_s = 0.0  # arrivals expected at once: no "idle" release, the timer runs
        b.start()
        far = b.now_ns() + ms(5000)
        loop = asyncio.get_running_loop()
        b.victim = loop.create_future()
        b.submit("gone", far, fut=b.victim)
        await asyncio.sleep(0.1)  # the timer has fired on the empty queues
        alive = b._task is not None and not b._task.done()
        out = await asyncio.wait_for(b.submit(7, far), 5)
        await b.stop()
        return out, alive

    out, alive = run(go())
    assert alive
    assert float(out.outputs[0].data[0]) == 7.0


def test_stop_fails_a_batch_still_computing_and_its_late_answer_is_dropped() -> None:
    # The compute thread hands its answers back with one call onto the loop (no task per batch): a batch still
    # computing when the batcher stops is answered 503 (shutting down) at once, and when its forward ends after
    # that, nothing is set twice and nothing raises.
    async def go() -> tuple[BaseException | None, Any, int]:
        _, v, clk = on_fake_clock()
        b = Batcher(v, max_batch_size=4, max_delay_s=0.0, max_queue=100, **clk)
        b.start()
        fut = await busy_with(b, v, 7, b.now_ns() + ms(5000))
        await b.stop()
        err = fut.exception() if fut.done() else None
        assert v.gate is not None
        v.gate.set()  # the forward ends after the stop: its answer reaches a future already failed
        for _ in range(50):
            await asyncio.sleep(0.002)
        return err, fut.done(), len(v.batches)

    err, done, n = run(go())
    assert done and isinstance(err, Shed) and err.reason == "shutting_down"
    assert n == 1


def test_a_batch_is_answered_without_a_task_of_its_own() -> None:
    # Each task costs a pass of the event loop to start; a batch used to run in one (create_task + run_in_executor,
    # whose result reached it two passes after the thread ended). Now the batch is handed to the compute thread
    # directly: while it computes, no task exists besides the batcher's own loop and the test's.
    async def go() -> tuple[int, float]:
        _, v, clk = on_fake_clock()
        b = Batcher(v, max_batch_size=4, max_delay_s=0.0, max_queue=100, **clk)
        b.start()
        fut = await busy_with(b, v, 3, b.now_ns() + ms(5000))
        tasks = len(asyncio.all_tasks())  # this test's task and the batcher's loop
        assert v.gate is not None
        v.gate.set()
        out = await fut
        await b.stop()
        return tasks, float(out.outputs[0].data[0])

    tasks, value = run(go())
    assert tasks == 2
    assert value == 3.0


def test_items_preprocessed_in_their_batch_count_in_its_cost() -> None:
    # preprocess_in_batch: the compute thread preprocesses each InBatch item before the forward; each outcome says
    # its own preprocessing apart from the forward, and the latency model learns the whole time the batch held
    # the compute thread (admission predicts with it; there is no preprocess lead any more).
    from latencylab.serve.batcher import InBatch

    async def go() -> tuple[list[Any], float]:
        clock, v, clk = on_fake_clock()
        b = Batcher(v, max_batch_size=2, max_delay_s=0.05, max_queue=100, **clk)
        b.start()

        def pre(x: int) -> int:
            clock.advance(3e6)  # 3 ms of preprocessing each
            return x

        far = b.now_ns() + ms(5000)
        outs = await asyncio.gather(*(b.submit(InBatch(pre, i), far) for i in (5, 6)))
        await b.stop()
        return outs, b.model.predict(2)

    outs, predicted = run(go())
    assert [float(o.outputs[0].data[0]) for o in outs] == [5.0, 6.0]
    assert all(o.preprocess_s == pytest.approx(0.003) for o in outs)
    assert all(o.compute_s == pytest.approx(0.006) for o in outs)  # base 4 ms + 2 x 1 ms: the forward alone
    assert predicted == pytest.approx(0.006 + 0.006)  # forward + both preprocessings
