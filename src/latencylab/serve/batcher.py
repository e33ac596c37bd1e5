"""Deadline-aware dynamic batching for one model variant.

Requests wait in an earliest-deadline-first queue. A batch is released when
it is full, when its oldest request has waited ``max_delay_s``, or when
waiting any longer would make the earliest deadline in the queue miss: the
release time is that deadline minus the predicted compute time of the batch
(a per-batch-size latency model learned online from every batch run, seeded
by warm-up with compute alone). Requests whose predicted finish is past their
deadline are refused at admission (``Shed("deadline")``) instead of timing
out in the queue; admitted requests still preprocessing count as queued
ahead of later ones (a reservation). At release, a request that can no
longer finish by its deadline (release + predicted compute) fails fast
(504) rather than spending compute on an answer that would come late; a
full queue refuses with ``Shed("queue_full")``. Up to ``workers`` batches
run at a time, each on one of the variant's own compute threads (so a hung
variant cannot block the other rungs of the ladder); on a CPU, N workers of
one intra-op thread each use N cores with no intra-op synchronisation, which
for small inputs beats one batch on N threads.

The admission half (the latency models, the predicted finish of a request, ``admit`` and ``recheck``) is
:class:`~latencylab.serve.admission.Admission` (serve/admission.py), this class's base; this module holds the
queues, the release loop and the compute threads.

Every time it reads (arrivals, releases, compute) comes from the injected
:class:`~latencylab.clock.Clock` (``perf_counter_ns`` by default), so tests
drive it with a ``FakeClock`` and get exact numbers. Waiting itself (the
release timer) is the event loop's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from latencylab.clock import Clock, PerfCounterClock
from latencylab.serve.admission import Admission, LatencyModel, Shed
from latencylab.serve.types import ProtocolError, Tensor, Variant

WARMUP_TOKENS = 2048  # bucketed warm-up times batches up to this many padded tokens (larger are extrapolated)


class ModelFailure(Exception):
    """The variant raised while computing the batch this request was in (500)."""


class DeadlineExceeded(Exception):
    """The request could not be answered by its deadline (504). ``where``: ``release_passed`` (its deadline had
    passed at its batch's release), ``release_late`` (its batch could not finish by it), ``queue_passed`` /
    ``queue_late`` (still queued, its deadline had passed / it could no longer finish by it even if it started at
    once, alone: ``Batcher._drop_hopeless``)."""

    def __init__(self, message: str, where: str = "release_late") -> None:
        super().__init__(message)
        self.where = where


def _missed(passed: bool, where: str) -> DeadlineExceeded:
    """The 504 of a job failed at ``where`` (``queue`` or ``release``): its deadline already ``passed``, or it
    cannot finish by it (``<where>_passed`` / ``<where>_late``)."""
    why = "deadline passed while queued" if passed else "cannot finish by deadline"
    return DeadlineExceeded(why, f"{where}_passed" if passed else f"{where}_late")


@dataclass(order=True, slots=True)
class Job:
    deadline_ns: int
    seq: int
    item: Any = field(compare=False)
    enqueued_ns: int = field(compare=False)
    future: asyncio.Future[BatchOutcome] = field(compare=False)
    bucket: int = field(compare=False, default=0)
    # when the request should be answered (its deadline, or start + SLO with order_by = "slo"): what the order
    # of buckets protects (_pick). The deadline stays what fails a request.
    target_ns: int = field(compare=False, default=0)
    # what admission planned its finish by (deadline - learned margin: its ``admit_by``; at most the target): the
    # order lets it ahead once waiting longer would miss this, and still while it can make its target (_pick)
    aim_ns: int = field(compare=False, default=0)

    def __post_init__(self) -> None:
        if not self.target_ns:
            self.target_ns = self.deadline_ns
        if not self.aim_ns or self.aim_ns > self.target_ns:
            self.aim_ns = self.target_ns


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    outputs: tuple[Tensor, ...]
    batch_size: int
    reason: str  # full | timeout | deadline | idle
    queue_s: float  # enqueue -> batch release
    batch_s: float  # release -> compute start (handing over to the compute thread)
    compute_s: float  # forward
    postprocess_s: float
    preprocess_s: float = 0.0  # its own preprocessing on the compute thread (an InBatch item), else 0


class Batcher(Admission):
    def __init__(
        self,
        variant: Variant,
        max_batch_size: int,
        max_delay_s: float,
        max_queue: int,
        on_batch: Callable[[str, int, str], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
        workers: int = 1,
        thread_init: Callable[[], None] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.clock: Clock = clock if clock is not None else PerfCounterClock()
        self.now_ns = now_reader(self.clock)
        self.variant = variant
        self.workers = workers
        self.max_batch = max(1, min(max_batch_size, variant.max_batch_size))
        self.max_delay_ns = int(max_delay_s * 1e9)
        self.max_queue = max_queue
        self.model = LatencyModel()  # the latency model of bucket 0 (every item, for a variant without buckets)
        # A variant with `bucket(item)` (text: the padded-length class of the item) gets a queue and a latency
        # model per bucket, and the shortest batch runs first (see _pick); without it, one EDF queue.
        self._bucket_of: Callable[[Any], int] | None = getattr(variant, "bucket", None)
        self._queues: dict[int, list[Job]] = {0: []}
        self._models: dict[int, LatencyModel] = {0: self.model}
        self._queued = 0
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        # thread_init runs in each compute thread: per-thread runtime settings (OpenMP's thread count is
        # per calling thread, so torch.set_num_threads in the main thread does not reach these threads)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix=f"compute-{variant.name}", initializer=thread_init
        )
        self._running: dict[int, tuple[int, float]] = {}  # batch id -> (start ns, predicted s)
        self._batch_ids = itertools.count()
        self._batches: dict[int, list[Job]] = {}  # batch id -> its jobs, while a compute thread has them
        self._last_arrival: int | None = None
        self._gap_s = 1.0  # EWMA of the time between arrivals
        self._reserved = 0  # admitted, still preprocessing: ahead of any later admission
        self._last_admit_ns: int | None = None
        # Shedding everything means no request runs, so no estimate is ever corrected: after this long
        # without an admission, the next request is admitted whatever the prediction says (a probe); and after
        # this long without a batch of a bucket, its next batch runs even if predicted late (a probe at release).
        self.probe_after_ns = 1_000_000_000
        self._started_ns: int | None = None  # start(): "nothing admitted yet" counts from here
        self._ran_ns: dict[int, int] = {}  # bucket -> when its last batch was released
        self._on_batch = on_batch
        self._on_depth = on_depth
        self._task: asyncio.Task[None] | None = None
        # release this long before the last moment: timer granularity (1 ms), thread hand-over, answer
        self.margin_ns = 3_000_000

    def __len__(self) -> int:
        return self._queued

    @property
    def bucketed(self) -> bool:
        return self._bucket_of is not None

    def warmup(self, sizes: list[int]) -> None:
        """Run each batch size (blocking) and seed the latency model with its compute time.

        The model predicts forward + postprocess only (preprocess runs before queueing), so the seed
        times exactly that, median of 3, on the variant's ``warmup_items`` when it has them; a variant
        without them is charged half its warm-up time (which runs every stage twice)."""
        items_fn = getattr(self.variant, "warmup_items", None)
        for size in sizes:
            if size > self.max_batch:
                continue
            t0 = self.now_ns()
            self.variant.warmup([size])
            elapsed = (self.now_ns() - t0) / 1e9
            if items_fn is None:
                self.model.observe(size, elapsed / 2)
                continue
            if self._bucket_of is not None:
                continue  # every bucket is timed below
            items = items_fn(size)
            runs = sorted(sum(self._compute(items)[1:3]) for _ in range(3))
            self.model.observe(size, runs[1])
        if self._bucket_of is not None and items_fn is not None:
            # Each bucket at each size, up to WARMUP_TOKENS per batch; larger batches are extrapolated.
            for bucket in getattr(self.variant, "buckets", ()):
                for size in sizes:
                    if size > self.max_batch or (size > 1 and size * bucket > WARMUP_TOKENS):
                        continue
                    items = items_fn(size, bucket)
                    runs = sorted(sum(self._compute(items)[1:3]) for _ in range(3))
                    self._model(bucket).observe(size, runs[1])

    async def run_direct(self, prepare: Callable[[], Any]) -> tuple[BatchOutcome, float]:
        """Preprocess (``prepare()``) and compute one request on a compute thread in one hand-over: the path of an
        idle server, where there is nothing to batch with and every extra thread hop is latency. Replaces
        ``submit`` for an admitted request (its reservation is released). Returns the outcome and the
        preprocess time (s). A ProtocolError from ``prepare`` propagates; a model error is a ModelFailure."""
        self.unreserve()
        bid = next(self._batch_ids)
        released = self.now_ns()
        self._running[bid] = (released, self.predict(self._cheapest_bucket(), 1))

        def job() -> tuple[Any, float, tuple[list[tuple[Tensor, ...]], float, float, int]]:
            t0 = self.now_ns()
            item = prepare()
            pre_s = (self.now_ns() - t0) / 1e9
            return item, pre_s, self._compute([item])

        def done(_: Any = None) -> None:
            self._running.pop(bid, None)
            self._wake.set()

        work = asyncio.get_running_loop().run_in_executor(self._executor, job)
        try:
            item, pre_s, (outs, fwd_s, post_s, t_start) = await asyncio.shield(work)
        except asyncio.CancelledError:
            # its client left: the compute thread still holds the item until it returns, and the worker counts
            # as busy until then (else another batch would be planned onto a thread that is not free)
            work.add_done_callback(done)
            raise
        except ProtocolError:
            done()
            raise
        except Exception as exc:
            done()
            raise ModelFailure(f"{type(exc).__name__}: {exc}") from None
        done()
        bucket = int(self._bucket_of(item)) if self._bucket_of is not None else 0
        self._ran_ns[bucket] = released
        self._model(bucket).observe(1, fwd_s + post_s)
        if self._on_batch is not None:
            self._on_batch(self.variant.name, 1, "direct")
        outcome = BatchOutcome(
            outputs=outs[0],
            batch_size=1,
            reason="direct",
            queue_s=0.0,
            batch_s=(t_start - released) / 1e9 - pre_s,
            compute_s=fwd_s,
            postprocess_s=post_s,
        )
        return outcome, pre_s

    def withdraw(self, fut: asyncio.Future[BatchOutcome]) -> bool:
        """Take the queued job answered by ``fut`` out of its queue (its client left, or its deadline passed
        while queued): it no longer counts ahead of anyone, holds no place, and moves no release. True if it
        was queued."""
        for q in self._queues.values():
            for i, job in enumerate(q):
                if job.future is fut:
                    q[i] = q[-1]
                    q.pop()
                    heapq.heapify(q)
                    self._queued -= 1
                    if self._on_depth is not None:
                        self._on_depth(self._queued)
                    self._wake.set()
                    return True
        return False

    def submit(
        self,
        item: Any,
        deadline_ns: int,
        fut: asyncio.Future[BatchOutcome] | None = None,
        target_ns: int | None = None,
        aim_ns: int | None = None,
    ) -> asyncio.Future[BatchOutcome]:
        """Queue ``item`` (its admission reservation becomes a queued job); the returned future (``fut`` if
        given) gets its outcome. ``target_ns``: when it should be answered to meet the latency objective (at
        most ``deadline_ns``, which it defaults to); the order of buckets protects it (see _pick). ``aim_ns``:
        the finish admission planned (its ``admit_by``, at most the target, which it defaults to): the order
        starts protecting the request there."""
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
        self.unreserve()
        now = self.now_ns()
        if self._last_arrival is not None:
            self._gap_s += 0.1 * ((now - self._last_arrival) / 1e9 - self._gap_s)
        self._last_arrival = now
        bucket = 0
        if self._bucket_of is not None:
            bucket = int(self._bucket_of(item))
        q = self._queues.get(bucket)
        if q is None:
            q = self._queues[bucket] = []
        target = deadline_ns if target_ns is None else min(target_ns, deadline_ns)
        aim = target if aim_ns is None else min(aim_ns, target)
        heapq.heappush(q, Job(deadline_ns, next(self._seq), item, now, fut, bucket, target, aim))
        self._queued += 1
        if self._on_depth is not None:
            self._on_depth(self._queued)
        self._wake.set()
        return fut

    def start(self) -> None:
        if self._started_ns is None:
            self._started_ns = self.now_ns()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self.variant.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for jobs in list(self._batches.values()):  # computing: their answers will not be delivered
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(Shed("shutting_down", 1.0))
        self._batches.clear()
        for q in self._queues.values():
            for job in q:
                if not job.future.done():
                    job.future.set_exception(Shed("shutting_down", 1.0))
            q.clear()
        self._queued = 0
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _release_at(self, now: int) -> tuple[int, str]:
        """(when to release the next batch, why).

        Work-conserving when idle: if the compute thread is free and fewer than one more arrival is
        expected within the queue delay, waiting would only add latency, so the batch goes now ("idle").
        """
        queues = [(b, q) for b, q in self._queues.items() if q]
        if any(len(q) >= self.max_batch for _, q in queues):
            return now, "full"
        if len(self._running) < self.workers and self.max_delay_ns / 1e9 < self._gap_s:
            return now, "idle"
        oldest = min(j.enqueued_ns for _, q in queues for j in q)
        timeout_at = oldest + self.max_delay_ns
        deadline_at = min(q[0].deadline_ns - int(self.predict(b, len(q)) * 1e9) for b, q in queues) - self.margin_ns
        if deadline_at < timeout_at:
            return deadline_at, "deadline"
        return timeout_at, "timeout"

    def _pick(self, now: int) -> int:
        """The bucket whose batch runs next: the shortest predicted batch, unless that would make another
        bucket's most urgent request miss its aim while it can still make its target if it goes now (then the one
        with the least laxity goes). Short requests do not queue behind long ones, and long ones still make their
        targets while they can: the order that lowers a p99 when compute times are heavy-tailed.

        A request's target is its deadline unless ``submit`` was given a sooner one (the service's
        ``order_by = "slo"``: start + SLO). With the deadline alone (30 s by default) no long request is ever at
        risk, and each waits for every short one that arrives meanwhile. Its aim is the finish admission planned
        (the service passes ``admit_by``: the deadline less the learned margin); without one, the target. A long
        request protected only at its target would be served at the last moment every time (shortest-first
        defers it until its laxity runs out), so under overload the long requests *were* the tail, at the target,
        whatever margin admission learned (issue 22: text p99 pinned at 300-303 ms of 300, 10-13% ending 504).
        Protected from its aim, it is let ahead once its laxity to the aim is less than the shortest batch takes,
        and it stays let ahead while it can still make its target (a short batch that overran its prediction
        must not push it out for good). A request that can no longer meet its target is not let ahead (it
        misses whatever the order; letting it ahead would make others miss too). The urgency of a bucket is its
        earliest-deadline request's, and its laxity is that request's alone: let ahead, it goes in a batch no
        larger than keeps its aim (``_joins``), so a bucket holding several long requests is not judged by the
        cost of all of them (it then looked unable to make its target at all, was never let ahead, and its most
        urgent request ended in a 504 behind the short batches)."""
        queues = [(b, q) for b, q in self._queues.items() if q]
        if len(queues) == 1:
            return queues[0][0]
        cost = {b: self.predict(b, min(len(q), self.max_batch)) for b, q in queues}
        first = min(queues, key=lambda bq: (cost[bq[0]], bq[1][0].deadline_ns))[0]
        # its most urgent request's finish if it went now, alone (the batch _joins forms keeps that when it can)
        need = {b: now + int(self.predict(b, 1) * 1e9) + self.margin_ns for b, _ in queues}
        to_aim = {b: q[0].aim_ns - need[b] for b, q in queues}
        # EDF lookahead: a bucket is at risk when the short batch plus every other bucket more urgent than it
        # (they would go before it once at risk) leave it less than its laxity; one at a time would let two long
        # buckets that fall due together both wait, and the second miss
        at_risk = []
        before = cost[first] * 1e9
        for b, q in sorted(((b, q) for b, q in queues if b != first), key=lambda bq: to_aim[bq[0]]):
            if to_aim[b] < before and q[0].target_ns - need[b] >= 0:
                at_risk.append(b)
            before += cost[b] * 1e9
        if at_risk:
            return min(at_risk, key=lambda b: to_aim[b])
        return first

    def _take(self, now: int) -> list[Job]:
        if not any(self._queues.values()):  # withdrawn while the release timer ran: nothing to take
            return []
        bucket = self._pick(now)
        q = self._queues[bucket]
        jobs: list[Job] = []
        while q and len(jobs) < self.max_batch:
            if jobs and self._bucket_of is not None and not self._joins(bucket, jobs, now):
                break  # the rest waits for the next batch of this bucket
            jobs.append(heapq.heappop(q))
        self._queued -= len(jobs)
        if self._on_depth is not None:
            self._on_depth(self._queued)
        return jobs

    def _joins(self, bucket: int, jobs: list[Job], now: int) -> bool:
        """Whether the next job of ``bucket`` may join the batch ``jobs`` (taken in EDF order): yes unless the
        batch one larger would finish past the aim of its most urgent member while the batch as it is would not.

        Admission and recheck predict each request's finish with the batch it joins as of then (the requests of
        its bucket due before it, plus itself); requests due later that join it at release make that batch
        costlier, and a text batch of eight long passages costs several times one: its most urgent members then
        missed their deadline at release (504) though a smaller batch would have made it. Bucketed variants only
        (a vision batch of 8 costs little more than one of 4)."""
        aim = min(j.aim_ns for j in jobs)
        slack = self.margin_ns
        fits_now = now + int(self.predict(bucket, len(jobs)) * 1e9) + slack <= aim
        return not fits_now or now + int(self.predict(bucket, len(jobs) + 1) * 1e9) + slack <= aim

    def _compute(self, items: list[Any]) -> tuple[list[tuple[Tensor, ...]], float, float, int]:
        """One batch of preprocessed items (or InBatch ones) on the compute thread; an item's preprocessing
        error is raised (the direct path's batch of one)."""
        outs, fwd_s, post_s, t_start, _ = self._compute_batch(items)
        answers: list[tuple[Tensor, ...]] = []
        for o in outs:
            if isinstance(o, BaseException):
                raise o
            answers.append(o)
        return answers, fwd_s, post_s, t_start

    def _compute_batch(self, items: list[Any]) -> _Computed:
        """On the compute thread: preprocess the InBatch items (one that raises is answered with its exception,
        the rest go on), forward, postprocess. The answers (or exceptions) are in the items' order; the times are
        the forward's and the postprocessing's, with each item's own preprocessing."""
        t_start = self.now_ns()
        pre = [0.0] * len(items)
        failed: dict[int, BaseException] = {}
        ready = items
        if any(isinstance(it, InBatch) for it in items):
            ready = []
            for i, it in enumerate(items):
                if isinstance(it, InBatch):
                    t0 = self.now_ns()
                    try:
                        it = it.run()
                    except Exception as exc:  # bad input found in preprocessing: this request's 4xx only
                        failed[i] = exc
                        continue
                    finally:
                        pre[i] = (self.now_ns() - t0) / 1e9
                ready.append(it)
        t_fwd0 = self.now_ns()
        raw = self.variant.forward(ready) if ready else None
        t_fwd = self.now_ns()
        answers = iter(self.variant.postprocess(raw, len(ready)) if ready else [])
        t_end = self.now_ns()
        outs: list[tuple[Tensor, ...] | BaseException] = [
            failed[i] if i in failed else next(answers) for i in range(len(items))
        ]
        return outs, (t_fwd - t_fwd0) / 1e9, (t_end - t_fwd) / 1e9, t_start, pre

    def _no_return_ns(self, bucket: int, job: Job, now: int) -> int:
        """The last instant ``job`` could start, alone, and still finish by its deadline: its deadline less its
        bucket's predicted cost of one (a stale bucket's estimate is unrefuted: its deadline itself)."""
        if self.bucket_stale(bucket, now):
            return job.deadline_ns
        return job.deadline_ns - int(self.predict(bucket, 1) * 1e9)

    def _drop_hopeless(self, now: int) -> int | None:
        """Fail now (504) every queued job past its point of no return (``_no_return_ns``): it would miss whatever
        ran next, and waiting for its deadline's timer kept it in the queue, counted ahead of every admission,
        until its 504 came after the deadline (issue 22: a third of the text model's 504s under 2x overload).
        Returns the next job's point of no return (None: nothing queued), when the loop looks again."""
        nxt: int | None = None
        dropped = False
        for b, q in self._queues.items():
            while q:
                job = q[0]
                at = self._no_return_ns(b, job, now)
                if at > now and not job.future.done():
                    nxt = at if nxt is None else min(nxt, at)
                    break
                heapq.heappop(q)
                self._queued -= 1
                dropped = True
                if not job.future.done():
                    job.future.set_exception(_missed(job.deadline_ns < now, "queue"))
        if dropped and self._on_depth is not None:
            self._on_depth(self._queued)
        return nxt

    async def _run(self) -> None:
        while True:
            now = self.now_ns()
            no_return = self._drop_hopeless(now) if self._queued else None
            if not self._queued or len(self._running) >= self.workers or not any(self._queues.values()):
                self._wake.clear()
                if no_return is None:
                    await self._wake.wait()
                else:  # every worker busy: look again when the next queued job would pass its point of no return
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout((no_return - now) / 1e9):
                            await self._wake.wait()
                continue
            release_at, reason = self._release_at(now)
            if release_at > now:
                self._wake.clear()
                try:  # asyncio.timeout: wait_for (Python 3.11) would wait in a task of its own, a pass more
                    async with asyncio.timeout((release_at - now) / 1e9):
                        await self._wake.wait()
                    continue  # something arrived or a worker freed: re-plan (the batch may now be full)
                except TimeoutError:
                    pass
            released = self.now_ns()
            # a client that left during the wait may have taken the last job out (withdraw): re-plan then
            jobs = self._take(released)
            if not jobs:
                continue
            bucket = jobs[0].bucket
            live = [j for j in jobs if not j.future.done()]  # done: the client went away or timed out
            # A bucket that has not run for probe_after_ns runs even if predicted late (its requests still
            # in time): a request failed on a prediction never runs, so an over-estimate would otherwise
            # refuse that bucket forever. Its measured time then replaces the estimate (remeasure).
            stale = self.bucket_stale(bucket, released)
            probe = False
            # Fail fast whoever can no longer make it: the batch finishes at release + predicted compute,
            # and dropping a late request shrinks the batch, so re-check until everyone left fits.
            while live:
                finish = released + int(self.predict(bucket, len(live)) * 1e9)
                late = [j for j in live if j.deadline_ns < finish]
                if stale and any(j.deadline_ns >= released for j in late):
                    probe = True
                    late = [j for j in late if j.deadline_ns < released]  # only those already past it
                if not late:
                    break
                for job in late:
                    job.future.set_exception(_missed(job.deadline_ns < released, "release"))
                live = [j for j in live if j.deadline_ns >= finish]
            if not live:
                continue  # nothing ran: the bucket's estimate is still unrefuted (stays due for a probe)
            self._ran_ns[bucket] = released
            bid = next(self._batch_ids)
            self._running[bid] = (released, self.predict(bucket, len(live)))
            self._start_batch(bid, live, reason, released, bucket, probe)

    def _start_batch(self, bid: int, live: list[Job], reason: str, released: int, bucket: int, probe: bool) -> None:
        """Hand the batch to a compute thread; the thread's completion calls :meth:`_finish_batch` on the loop.

        No task and no ``run_in_executor``: a task costs a pass of the event loop to start, and an executor's
        result reaches its awaiting task two passes after the thread ends (the future's state is copied on the
        loop, then its waiter is scheduled). Under overload every pass waits behind every refusal ready
        meanwhile (docs/benchmarks/serve.md, session 18), so the batch starts at once and its answers are set in
        the first pass after the thread ends."""
        loop = asyncio.get_running_loop()
        self._batches[bid] = live

        def ended(f: concurrent.futures.Future[Any]) -> None:  # on the compute thread (or here, if cancelled)
            with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nobody waits for the answer
                loop.call_soon_threadsafe(self._finish_batch, bid, live, reason, released, bucket, probe, f)

        try:
            work = self._executor.submit(self._compute_batch, [j.item for j in live])
        except RuntimeError as exc:  # the executor shut down (stop())
            work = concurrent.futures.Future()
            work.set_exception(exc)
        work.add_done_callback(ended)

    def _finish_batch(
        self,
        bid: int,
        live: list[Job],
        reason: str,
        released: int,
        bucket: int,
        probe: bool,
        work: concurrent.futures.Future[_Computed],
    ) -> None:
        self._running.pop(bid, None)
        self._batches.pop(bid, None)
        self._wake.set()  # a worker is free: the loop may release the next batch
        try:
            outs, fwd_s, post_s, t_start, pre = work.result()
        except BaseException as exc:  # the model raised (or the batch was cancelled): fail it, keep serving
            for job in live:
                if not job.future.done():
                    job.future.set_exception(ModelFailure(f"{type(exc).__name__}: {exc}"))
            return
        cost = fwd_s + post_s + sum(pre)  # what the batch held the compute thread for: what admission plans with
        if probe:  # ran against its prediction: what it measured replaces that prediction
            self._model(bucket).remeasure(len(live), cost)
        else:
            self._model(bucket).observe(len(live), cost)
        if self._on_batch is not None:
            self._on_batch(self.variant.name, len(live), reason)
        for job, out, pre_s in zip(live, outs, pre, strict=True):
            if job.future.done():
                continue
            if isinstance(out, BaseException):
                job.future.set_exception(out)
                continue
            job.future.set_result(
                BatchOutcome(
                    outputs=out,
                    batch_size=len(live),
                    reason=reason,
                    queue_s=(released - job.enqueued_ns) / 1e9,
                    batch_s=(t_start - released) / 1e9,
                    compute_s=fwd_s,
                    postprocess_s=post_s,
                    preprocess_s=pre_s,
                )
            )


class InBatch:
    """A request to be preprocessed on the compute thread, in its batch (``preprocess_in_batch``)."""

    __slots__ = ("preprocess", "request")

    def __init__(self, preprocess: Callable[[Any], Any], request: Any) -> None:
        self.preprocess = preprocess
        self.request = request

    def run(self) -> Any:
        return self.preprocess(self.request)


# a batch's answers (or each failed item's exception), forward s, postprocess s, start ns, each item's preprocess s
_Computed = tuple[list[tuple[Tensor, ...] | BaseException], float, float, int, list[float]]


def now_reader(clock: Clock) -> Callable[[], int]:
    """A function returning ``clock``'s time now, in ns (a host clock's marks resolve to themselves)."""
    mark, resolve = clock.mark, clock.resolve
    return lambda: int(resolve((mark(),))[0])
