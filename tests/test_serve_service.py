"""ModelService's request path: a handler's cancellation, a preprocess step past the deadline, bad input,
admission against the preprocess backlog.

No test here races a sleep: where a step must still be running while the test acts, the variant holds it at a
gate the test opens; where a duration matters, the service runs on a ``FakeClock``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from fake_variants import FakeVariant
from latencylab.clock import FakeClock
from latencylab.serve.app import build_state
from latencylab.serve.config import ModelConfig, ServerConfig
from latencylab.serve.protocol_request import parse_infer_request
from latencylab.serve.service import ModelService, ServiceError, Timing
from latencylab.serve.types import InferRequest

BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


class Gated(FakeVariant):
    """A fake variant whose forward (with ``hold_preprocess``: preprocess instead) waits while the test keeps
    ``gate`` closed (it starts open, for the warm-up); ``entered`` is set once one has begun."""

    def __init__(self, *args: Any, hold_preprocess: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.hold_preprocess = hold_preprocess

    def _hold(self) -> None:
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"

    def preprocess(self, request: InferRequest) -> Any:
        if self.hold_preprocess:
            self._hold()
        return super().preprocess(request)

    def forward(self, items: Sequence[Any]) -> Any:
        if not self.hold_preprocess:
            self._hold()
        return super().forward(items)


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Yield to the loop (real time) until ``condition()`` holds."""
    give_up = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < give_up, "the condition never held"
        await asyncio.sleep(0.001)


def test_a_handler_cancelled_while_queued_takes_its_item_out_of_the_batch() -> None:
    """The handler awaits the batcher's future itself (no shield): a client that goes away while its request
    waits for the compute thread cancels the item, and the batcher skips it rather than computing an answer
    nobody reads. The request ahead of it is answered as usual."""
    variant = Gated("fp32", 0.001)
    cfg = ServerConfig(
        models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make", max_batch_size=1),)
    )
    state = build_state(cfg, {"fake": [variant]})
    svc = state.services["fake"]
    batcher = svc.batchers[0]
    body = parse_infer_request(json.dumps(BODY).encode(), "fake", None, svc.inputs)

    async def go() -> tuple[list[int], bool]:
        await svc.start()
        try:
            variant.batch_sizes.clear()
            variant.entered.clear()
            variant.gate.clear()
            first = asyncio.create_task(svc.infer(body, Timing(svc.now_ns())))
            await until(variant.entered.is_set)  # the first is computing, held at the gate
            second = asyncio.create_task(svc.infer(body, Timing(svc.now_ns())))
            await until(lambda: len(batcher) == 1)  # the second is queued behind it
            second.cancel()
            variant.gate.set()
            resp, _ = await first
            await until(lambda: len(batcher) == 0 and not batcher._running)  # the batcher has moved past it
            return variant.batch_sizes, second.cancelled() and resp.outputs is not None
        finally:
            await svc.stop()

    batches, ok = asyncio.run(go())
    assert ok
    assert batches == [1]  # the cancelled item was never computed
    assert svc.in_flight == 0 and len(batcher) == 0


def _service(variant: FakeVariant) -> tuple[ModelService, InferRequest]:
    cfg = ServerConfig(
        models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make", max_batch_size=1),)
    )
    svc = build_state(cfg, {"fake": [variant]}).services["fake"]
    return svc, parse_infer_request(json.dumps(BODY).encode(), "fake", None, svc.inputs)


def test_a_preprocess_slower_than_the_deadline_is_answered_504_at_the_deadline() -> None:
    """The deadline's timer runs from admission, preprocessing included: a stuck preprocess step answers 504
    when the deadline passes, while the step is still stuck (not when it returns); its late item is dropped,
    never computed, and its admission reservation is released."""
    variant = Gated("fp32", 0.001, hold_preprocess=True)
    svc, _ = _service(variant)
    slow = parse_infer_request(
        json.dumps({**BODY, "parameters": {"deadline_ms": 60}}).encode(), "fake", None, svc.inputs
    )

    async def go() -> tuple[int, bool, int]:
        await svc.start()
        try:
            variant.batch_sizes.clear()
            variant.gate.clear()
            safety = threading.Timer(10.0, variant.gate.set)  # a service that waits for the step gets it back
            safety.start()
            try:
                await svc.infer(slow, Timing(svc.now_ns()))
                status = 200
            except ServiceError as exc:
                status = exc.status
            still_stuck = not variant.gate.is_set()
            safety.cancel()
            variant.gate.set()  # the preprocess step returns now, after the answer
            await until(lambda: svc.preprocessing == 0)
            await asyncio.sleep(0.05)  # a dropped item must stay dropped (a queued one would run at once)
            return status, still_stuck, len(variant.batch_sizes)
        finally:
            await svc.stop()

    status, still_stuck, batches = asyncio.run(go())
    assert status == 504
    assert still_stuck, "the 504 came only once the preprocess step returned"
    assert batches == 0
    batcher = svc.batchers[0]
    assert len(batcher) == 0 and batcher._reserved == 0 and svc.preprocessing == 0 and svc.in_flight == 0
    assert _misses(svc) == {"preprocess": 1}


def _misses(svc: ModelService) -> dict[str, int]:
    """The service's 504s by where each request was when its deadline passed (the metric's ``where``)."""
    out: dict[str, int] = {}
    for metric in svc.metrics.registry.collect():
        if metric.name == "latencylab_server_deadline_misses":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    out[sample.labels["where"]] = int(sample.value)
    return out


def test_each_504_says_where_its_request_was_when_the_deadline_passed() -> None:
    """A forward held past the deadlines: the request in it misses while ``computing``, the one queued behind
    it in the queue (one batch at a time); the metric counts each where it was, for the overload benchmark's
    account of which part of the server the admitted requests missed in."""
    variant = Gated("fp32", 0.001)
    svc, _ = _service(variant)
    body = parse_infer_request(
        json.dumps({**BODY, "parameters": {"deadline_ms": 80}}).encode(), "fake", None, svc.inputs
    )
    batcher = svc.batchers[0]

    async def status(task: asyncio.Task[Any]) -> int:
        try:
            await task
            return 200
        except ServiceError as exc:
            return exc.status

    async def go() -> list[int]:
        await svc.start()
        try:
            variant.entered.clear()
            variant.gate.clear()
            safety = threading.Timer(10.0, variant.gate.set)
            safety.start()
            first = asyncio.create_task(svc.infer(body, Timing(svc.now_ns())))
            await until(variant.entered.is_set)  # computing, held at the gate
            second = asyncio.create_task(svc.infer(body, Timing(svc.now_ns())))
            codes = [await status(first), await status(second)]
            safety.cancel()
            variant.gate.set()
            await until(lambda: not batcher._running)
            return codes
        finally:
            await svc.stop()

    assert asyncio.run(go()) == [504, 504]
    misses = _misses(svc)
    # the queued one: failed by the batcher's sweep at its point of no return (deadline - ~1 ms of predicted
    # compute), or once its deadline had passed if the loop woke late; either way found in the queue
    assert misses.pop("computing") == 1 and len(misses) == 1, misses
    assert next(iter(misses.items())) in (("queue_late", 1), ("queue_passed", 1)), misses


def test_a_bad_input_found_in_preprocessing_is_a_4xx_and_releases_its_reservation() -> None:
    variant = FakeVariant("fp32", 0.001)
    svc, _ = _service(variant)
    empty = parse_infer_request(
        json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [0, 4], "data": []}]}).encode(),
        "fake",
        None,
        svc.inputs,
    )

    async def go() -> ServiceError:
        await svc.start()
        try:
            try:
                await svc.infer(empty, Timing(time.perf_counter_ns()))
            except ServiceError as exc:
                return exc
            raise AssertionError("an empty input was answered")
        finally:
            await svc.stop()

    err = asyncio.run(go())
    assert err.status == 400 and "at least one row" in str(err)
    assert svc.batchers[0]._reserved == 0 and svc.preprocessing == 0 and svc.in_flight == 0


def test_requests_are_queued_with_start_plus_slo_as_their_target() -> None:
    """order_by = "slo": the batcher is given each request's start + slo_ms as the target its bucket order
    protects (its deadline if sooner); "deadline" (the default): the deadline alone."""

    def targets(order_by: str, deadline_ms: float) -> list[tuple[int, int | None, int]]:
        variant = FakeVariant("fp32", 0.001)
        cfg = ServerConfig(
            models=(
                ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make", slo_ms=80, order_by=order_by),
            )
        )
        svc = build_state(cfg, {"fake": [variant]}).services["fake"]
        body = {**BODY, "parameters": {"deadline_ms": deadline_ms}}
        req = parse_infer_request(json.dumps(body).encode(), "fake", None, svc.inputs)
        batcher = svc.batchers[0]
        seen: list[tuple[int, int | None, int]] = []
        real_submit = batcher.submit

        def spy(
            item: object, deadline_ns: int, fut: object = None, target_ns: int | None = None, aim_ns: int | None = None
        ) -> object:
            seen.append((deadline_ns, target_ns, start))
            return real_submit(item, deadline_ns, fut, target_ns, aim_ns)  # type: ignore[arg-type]

        batcher.submit = spy  # type: ignore[method-assign]
        start = time.perf_counter_ns()

        async def go() -> None:
            await svc.start()
            try:
                await svc.infer(req, Timing(start))
            finally:
                await svc.stop()

        asyncio.run(go())
        return seen

    (deadline, target, start), *_ = targets("slo", 5000)
    assert deadline == start + 5000 * 10**6 and target == start + 80 * 10**6
    (deadline, target, start), *_ = targets("slo", 50)  # a deadline sooner than the SLO is the target
    assert target == deadline == start + 50 * 10**6
    (deadline, target, start), *_ = targets("deadline", 5000)
    assert target == deadline == start + 5000 * 10**6


def test_admission_counts_the_preprocess_backlog() -> None:
    """On a fake clock: warm-up measured a 200-ms preprocess (2 pool workers) and a 20-ms batch; 30 requests
    with a 700-ms deadline arrive at once. Admission plans each behind those admitted before it and still
    preprocessing: the k-th (from 0) is preprocessed after 1 + k // 2 waves of 200 ms, then needs its 20-ms
    batch and the 3-ms release margin, so 200 (1 + k // 2) + 23 <= 700 admits k = 0..5. Exactly those 6 are
    answered; the other 24 are refused at once (503, deadline), not admitted to miss their deadline."""
    clock = FakeClock()
    variant = FakeVariant("fp32", 0.02, pre_delay_s=0.2, clock=clock)
    cfg = ServerConfig(models=(ModelConfig(name="fake", ladder=("fp32",), factory="fake_variants:make"),))
    svc = build_state(cfg, {"fake": [variant]}, clock=clock).services["fake"]
    assert svc.pool_workers == 2
    assert svc.pre_s == pytest.approx(0.2) and svc.batchers[0].model.predict(1) == pytest.approx(0.02)
    # From here on preprocessing costs no fake time: two pool threads advancing one clock would add their times
    # up instead of overlapping them. All 30 admissions are decided before any preprocessing has finished.
    variant.pre_delay_s = 0.0
    body = {**BODY, "parameters": {"deadline_ms": 700}}
    req = parse_infer_request(json.dumps(body).encode(), "fake", None, svc.inputs)

    async def go() -> list[int]:
        await svc.start()
        try:
            now = clock.now_ns
            results = await asyncio.gather(*[svc.infer(req, Timing(now)) for _ in range(30)], return_exceptions=True)
        finally:
            await svc.stop()
        return [200 if not isinstance(r, BaseException) else getattr(r, "status", -1) for r in results]

    codes = asyncio.run(go())
    assert codes == [200] * 6 + [503] * 24, codes
    assert b'latencylab_server_shed_total{model="fake",reason="deadline"} 24.0' in svc.metrics.exposition()
    batcher = svc.batchers[0]
    assert batcher._reserved == 0 and svc.preprocessing == 0 and svc.in_flight == 0


def _fake_service(variant: Any, clock: FakeClock, **model: Any) -> ModelService:
    """One model over ``variant`` on ``clock``, preprocessing inline (each request's admission, preprocessing and
    queueing happen in order, before the batcher runs)."""
    cfg = ServerConfig(
        models=(ModelConfig(name="fake", ladder=(variant.name,), factory="fake_variants:make", **model),),
        preprocess_threads=0,
    )
    return build_state(cfg, {"fake": [variant]}, clock=clock).services["fake"]


def _request(svc: ModelService, x: float, deadline_ms: float) -> InferRequest:
    body = {"inputs": [{**BODY["inputs"][0], "data": [x, 2, 3, 4]}], "parameters": {"deadline_ms": deadline_ms}}
    return parse_infer_request(json.dumps(body).encode(), "fake", None, svc.inputs)


def _codes(results: Sequence[Any]) -> list[int]:
    return [200 if not isinstance(r, BaseException) else getattr(r, "status", -1) for r in results]


def _burst(svc: ModelService, clock: FakeClock, reqs: Sequence[InferRequest]) -> tuple[list[int], list[Any]]:
    """All ``reqs`` at one instant; (status codes, results) in order."""

    async def go() -> list[Any]:
        await svc.start()
        try:
            now = clock.now_ns
            return await asyncio.gather(*[svc.infer(r, Timing(now)) for r in reqs], return_exceptions=True)
        finally:
            await svc.stop()

    results = asyncio.run(go())
    return _codes(results), results


@pytest.mark.parametrize(("fraction", "admitted"), [(0.9, 8), (1.0, 9)])
def test_admission_aims_at_the_slo_target_fraction(fraction: float, admitted: int) -> None:
    """SLO 100 ms and deadline 100 ms, a 10-ms batch of one, 12 requests at once: the k-th (from 0) is predicted
    to finish at 10 (k + 1) ms + the 3-ms margin. Admission aims at slo_target_fraction x 100 ms: at 0.9, k <= 7
    fit 90 ms (8 answered, the last at 80 ms); at 1.0, k <= 8 fit 100 ms (9). The gauge says which."""
    clock = FakeClock()
    svc = _fake_service(FakeVariant("fp32", 0.01, clock=clock), clock, max_batch_size=1, slo_target_fraction=fraction)
    codes, _results = _burst(svc, clock, [_request(svc, 1, 100)] * 12)
    assert codes == [200] * admitted + [503] * (12 - admitted), codes
    assert f'latencylab_server_slo_target_fraction{{model="fake"}} {fraction}'.encode() in svc.metrics.exposition()


def test_goodput_under_the_target_is_not_refused() -> None:
    """Below the target nothing is refused: 8 requests at once, the last predicted at 83 ms <= 90 ms (0.9 of the
    100-ms SLO), all answered, none shed, each inside the SLO."""
    clock = FakeClock()
    svc = _fake_service(FakeVariant("fp32", 0.01, clock=clock), clock, max_batch_size=1)
    start = clock.now_ns
    ends: list[int] = []

    async def go() -> list[Any]:
        await svc.start()
        try:

            async def one() -> Any:
                out = await svc.infer(_request(svc, 1, 100), Timing(start))
                ends.append(clock.now_ns)
                return out

            return await asyncio.gather(*[one() for _ in range(8)], return_exceptions=True)
        finally:
            await svc.stop()

    assert _codes(asyncio.run(go())) == [200] * 8
    assert b'latencylab_server_shed_total{model="fake"' not in svc.metrics.exposition()  # never incremented
    assert max(ends) - start == 80_000_000  # eight 10-ms batches back to back


def test_admission_is_checked_again_in_the_requests_own_cost_bucket() -> None:
    """Text-like buckets: a long item costs 120 ms per item, a short one 1 ms; batches of up to 8; 11 long items
    with a 1-s deadline at once. Admission before preprocessing (bucket unknown) admitted 9 of them, and the
    ninth, released after the first batch of 8 (960 ms), failed at release with 504 (1080 ms > 1 s). Now each is
    checked again once preprocessed, in its own bucket's order: the k-th waits for k // 8 full batches and runs in
    a batch of k % 8 + 1, so k <= 7 finish by 963 ms (with the 3-ms margin) inside the 990-ms target (1 s less
    10% of the 100-ms SLO) and k = 8 is refused (503): 8 answered, 3 refused, none admitted only to fail."""
    from fake_variants import BucketedFakeVariant

    clock = FakeClock()
    variant = BucketedFakeVariant("fp32", {16: 0.001, 256: 0.12}, clock=clock)
    svc = _fake_service(variant, clock, max_batch_size=8)
    batcher = svc.batchers[0]
    assert batcher.predict(256, 1) == pytest.approx(0.12) and batcher.predict(16, 1) == pytest.approx(0.001)
    variant.batch_sizes.clear()
    codes, results = _burst(svc, clock, [_request(svc, 200, 1000)] * 11)
    assert codes == [200] * 8 + [503] * 3, (codes, [str(r) for r in results])
    assert variant.batch_sizes == [8]
    m = svc.metrics.exposition()
    assert b'latencylab_server_shed_total{model="fake",reason="deadline"} 3.0' in m


@pytest.mark.parametrize("bucketed", [False, True])
def test_a_stale_over_estimate_is_probed_and_clears(bucketed: bool) -> None:
    """The trap: the estimate of a request's cost is 2 s (say, learned under a stall), the truth 170 ms, and the
    deadline 1 s. A request refused on a prediction never runs, so nothing corrects it: before the fix, every
    request was refused forever (503 at admission for a plain variant, which had never admitted one since start;
    504 "cannot finish by deadline" at release for a text bucket). Now, once nothing has been admitted (or no batch
    of that bucket has run) for ``probe_after_ns`` (1 s), one request runs as a probe, its measured time replaces
    the estimate, and the requests after it are served. One request every 100 ms on a fake clock."""
    from fake_variants import BucketedFakeVariant

    clock = FakeClock()
    variant: FakeVariant
    if bucketed:
        variant = BucketedFakeVariant("fp32", {16: 0.001, 256: 0.17}, clock=clock)
        x, bucket = 200.0, 256
    else:
        variant = FakeVariant("fp32", 0.17, clock=clock)
        x, bucket = 1.0, 0
    svc = _fake_service(variant, clock, max_batch_size=1)
    batcher = svc.batchers[0]
    model = batcher._models[bucket]
    model.by_size = {s: 2.0 for s in model.by_size}  # the stale over-estimate

    async def go() -> list[int]:
        await svc.start()
        codes = []
        try:
            for _ in range(30):
                try:
                    await svc.infer(_request(svc, x, 1000), Timing(clock.now_ns))
                    codes.append(200)
                except ServiceError as exc:
                    codes.append(exc.status)
                clock.advance(100_000_000)
        finally:
            await svc.stop()
        return codes

    codes = asyncio.run(go())
    assert codes[0] == 503, codes  # the trap is there at first ...
    first = codes.index(200)
    assert 9 <= first <= 12, codes  # ... a probe goes in ~1 s later ...
    assert codes[first:] == [200] * (30 - first), codes  # ... and clears it
    assert batcher.predict(bucket, 1) == pytest.approx(0.17, rel=0.05)


class ThreadNoting(FakeVariant):
    """Notes the thread each preprocess ran on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pre_threads: list[str] = []

    def preprocess(self, request: InferRequest) -> Any:
        self.pre_threads.append(threading.current_thread().name)
        return super().preprocess(request)


def test_preprocess_in_batch_runs_on_the_compute_thread_and_a_bad_input_fails_alone() -> None:
    """With ``preprocess_in_batch`` a request is preprocessed on the compute thread, in its batch (no preprocess
    pool hand-off); one whose preprocessing finds bad input is answered 400 and the rest of its batch is answered
    as usual, from a forward over the good items only."""
    variant = ThreadNoting("fp32", 0.001)
    model = ModelConfig(
        name="fake", ladder=("fp32",), factory="fake_variants:make", max_batch_size=4, preprocess_in_batch=True
    )
    svc = build_state(ServerConfig(models=(model,)), {"fake": [variant]}).services["fake"]
    good = parse_infer_request(json.dumps(BODY).encode(), "fake", None, svc.inputs)
    empty = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [0, 4], "data": []}]}
    bad = parse_infer_request(json.dumps(empty).encode(), "fake", None, svc.inputs)

    async def go() -> list[Any]:
        await svc.start()
        try:
            variant.batch_sizes.clear()
            variant.pre_threads.clear()
            calls = [svc.infer(r, Timing(time.perf_counter_ns())) for r in (good, bad, good)]
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await svc.stop()

    a, b, c = asyncio.run(go())
    assert isinstance(b, ServiceError) and b.status == 400 and "at least one row" in str(b)
    for ok in (a, c):
        resp, _ = ok
        assert resp.outputs[0].data.tolist() == [[2.0, 4.0, 6.0, 8.0]]  # the fake variant doubles
    assert sum(variant.batch_sizes) == 2  # the bad one never reached the forward
    assert variant.pre_threads and all(t.startswith("compute-") for t in variant.pre_threads)
    assert svc.preprocess_lead_ns() == 0  # the batch's predicted cost includes preprocessing
    assert svc.batchers[0]._reserved == 0 and svc.preprocessing == 0 and svc.in_flight == 0


def test_preprocess_in_batch_is_refused_for_variants_with_cost_buckets() -> None:
    from fake_variants import BucketedFakeVariant
    from latencylab.errors import LatencyLabError

    model = ModelConfig(
        name="fake", ladder=("fp32",), factory="fake_variants:make", max_batch_size=4, preprocess_in_batch=True
    )
    with pytest.raises(LatencyLabError, match="preprocess_in_batch needs variants without cost buckets"):
        build_state(ServerConfig(models=(model,)), {"fake": [BucketedFakeVariant("fp32", {16: 0.001, 256: 0.002})]})
