"""One served model: its ladder of variants (each with a batcher), the SLO guard, the result cache.

``ModelService.infer`` is the whole request path after HTTP parsing:
route (guard) -> cache rung or admission -> preprocess (thread pool, overlapping the running batch)
-> deadline-aware batch -> response, with every stage timed for metrics, traces and the guard.

Every time it reads comes from one injected :class:`~latencylab.clock.Clock`, shared with its batchers and
its guard (``perf_counter_ns`` by default): a test passes a ``FakeClock`` and variants that advance it, and
every latency, deadline and guard decision follows exactly. Timers (a request's deadline, the guard's
evaluation period) still wait on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError
from latencylab.serve.admission import Shed
from latencylab.serve.batcher import Batcher, BatchOutcome, DeadlineExceeded, InBatch, ModelFailure, now_reader
from latencylab.serve.cache import ResultCache
from latencylab.serve.config import ModelConfig
from latencylab.serve.guard import Alarm, GuardConfig, SloGuard, Transition
from latencylab.serve.metrics import ServerMetrics
from latencylab.serve.slack import BoundarySlack, LearnedMargin
from latencylab.serve.types import InferRequest, InferResponse, ProtocolError, TensorSpec, Variant

log = logging.getLogger("latencylab.serve")


class ServiceError(Exception):
    """An answer other than 200: ``status``, message, optional Retry-After seconds."""

    def __init__(self, status: int, message: str, retry_after_s: float | None = None, kind: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s
        self.kind = kind


@dataclass(slots=True)
class Timing:
    """Marks (ns, on the service's clock) of one request, filled as it goes."""

    start: int
    age_ns: int = 0  # how long the request had existed when the handler started (X-Request-Start), >= 0
    parsed: int = 0
    preprocessed: int = 0
    outcome: BatchOutcome | None = None
    predicted: int = 0  # predicted finish of a request admitted near the boundary (else 0), for BoundarySlack
    idle: bool = False  # admitted with nothing ahead (ModelService.aim): its error teaches the idle slack
    budget: int = 0  # the request's whole deadline (ns from its start), the most one error can count for
    level: int = -1  # the rung whose batcher served it (-1: not a batcher, e.g. the cache)
    end: int = 0
    stages: list[tuple[str, float]] = field(default_factory=list)


class _Late(Exception):
    """An admitted request's deadline passed before its answer (a 504). ``where`` it was when that became
    known: ``preprocess`` (not yet preprocessed at the deadline), ``queued`` (in the batcher's queue at the
    deadline), ``computing`` (its batch ran past the deadline), ``release_passed`` / ``release_late`` (failed
    at its batch's release: the deadline had passed, or the batch could not finish by it), ``queue_passed`` /
    ``queue_late`` (failed in the queue: the same two, ``Batcher._drop_hopeless``)."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


class ModelService:
    def __init__(
        self,
        cfg: ModelConfig,
        variants: Sequence[Variant],
        metrics: ServerMetrics,
        preprocess_pool: concurrent.futures.Executor | None,
        on_alarm: Any = None,
        compute_threads: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        if [v.name for v in variants] != list(cfg.variants):
            raise ValueError("variants must follow the ladder order")
        self.cfg = cfg
        self.clock: Clock = clock if clock is not None else PerfCounterClock()
        self.now_ns = now_reader(self.clock)
        # how often the background task evaluates the guard (s); None: no task, the owner calls evaluate_guard()
        self.evaluate_every_s: float | None = 0.1
        self.name = cfg.name
        self.variants = list(variants)
        self.ladder = list(cfg.ladder)
        self.metrics = metrics
        self.pool = preprocess_pool
        self.cache = ResultCache(cfg.cache_entries, cfg.cache_ttl_s)
        guard_cfg = GuardConfig(slo_ms=cfg.slo_ms, q=cfg.quantile, **cfg.guard)
        self.guard = SloGuard(self.ladder, guard_cfg, self.clock, on_alarm=self._alarm(on_alarm))
        self.batchers: list[Batcher] = []
        self.boundary: list[BoundarySlack] = []  # per rung: admission slack from near-boundary errors (slack.py)
        # per rung: the slack of requests admitted with nothing ahead of them (admit_when_idle, ``aim``)
        self.idle_boundary: list[BoundarySlack] = []
        self._slack_shown: list[tuple[int, int]] = []
        self.margins: list[LearnedMargin] = []  # per rung: the planning margin learned from admitted latency
        self._margin_shown: list[int] = []
        self.in_flight = 0
        self.preprocessing = 0  # admitted requests in (or waiting for) the preprocess pool
        self.pre_s = 0.0  # EWMA of one preprocess call
        self.pool_workers = max(1, int(getattr(preprocess_pool, "_max_workers", 1)))  # None: inline, one at a time
        self.caching = "cache" in self.ladder  # only a ladder with a cache rung stores answers
        self.compute_threads = compute_threads
        for v in self.variants:
            if cfg.preprocess_in_batch and getattr(v, "bucket", None) is not None:
                raise LatencyLabError(
                    f"model {cfg.name!r}: preprocess_in_batch needs variants without cost buckets, and {v.name!r} "
                    "has them (its bucket is known only once a request is preprocessed)"
                )
            if cfg.ort_threads is not None and hasattr(v, "intra_op_threads"):  # ONNX Runtime variants
                setattr(v, "intra_op_threads", cfg.ort_threads)  # noqa: B010 (not in the Variant protocol)
            if cfg.ort_spin_us is not None and hasattr(v, "spin_us"):  # ONNX Runtime variants
                setattr(v, "spin_us", cfg.ort_spin_us)  # noqa: B010 (not in the Variant protocol)
            # long inputs on more threads (variants that support it: text)
            if cfg.long_input_threads and hasattr(v, "wide_threads"):
                setattr(v, "wide_threads", cfg.long_input_threads)  # noqa: B010 (not in the Variant protocol)
                setattr(v, "wide_tokens", cfg.long_input_tokens)  # noqa: B010
        self._eval_task: asyncio.Task[None] | None = None
        self._shadows: set[asyncio.Task[None]] = set()

    def _alarm(self, hook: Any) -> Any:
        def on_alarm(alarm: Alarm) -> None:
            self.metrics.alarm.labels(self.name).set(1 if alarm.active else 0)
            if hook is not None:
                hook(alarm)

        return on_alarm

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.variants[0].inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.variants[0].outputs

    def warmup(self) -> None:
        """Build batchers and run every batch-size bucket once per variant (before serving)."""
        sizes = sorted({1, 2, 4, self.cfg.max_batch_size} | {s for s in (8,) if s <= self.cfg.max_batch_size})
        for v in self.variants:
            b = Batcher(
                v,
                self.cfg.max_batch_size,
                self.cfg.max_queue_delay_ms / 1e3,
                self.cfg.max_queue,
                on_batch=self._on_batch,
                on_depth=self._on_depth,
                workers=self.cfg.compute_workers,
                clock=self.clock,
                # No thread_init calling torch.set_num_threads(--threads) in the compute thread (OpenMP's count
                # is per thread): it sped up the mean but, measured end to end, cut text capacity at
                # p99 <= 100 ms from 3.8/s to 0.8/s (docs/BENCHMARKS.md); kept off until understood.
            )
            t0 = self.now_ns()
            b.warmup([s for s in sizes if s <= b.max_batch])
            items_fn = getattr(v, "warmup_items", None)
            if items_fn is not None and v is self.variants[0]:  # seed the preprocess estimate (median of 3)
                runs = sorted(_timed(self.now_ns, items_fn, 1)[0] for _ in range(3))
                self.pre_s = runs[1]
            elapsed = (self.now_ns() - t0) / 1e9
            log.info("warmed %s/%s in %.1f s: %s", self.name, v.name, elapsed, b.model.by_size)
            self.batchers.append(b)
            self.boundary.append(BoundarySlack(self.cfg.quantile))
            self.idle_boundary.append(BoundarySlack(self.cfg.quantile))
            self._slack_shown.append((-1, -1))
            slo_ns = int(self.cfg.slo_ms * 1e6)
            self.margins.append(LearnedMargin(slo_ns, self.cfg.slo_target_fraction, self.cfg.margin_quantile))
            self._margin_shown.append(-1)

    def admit_by_ns(self, start_ns: int, deadline_ns: int, level: int = 0) -> int:
        """What admission aims at: the deadline less a margin, scaled by min(the request's budget, the SLO) / SLO.

        ``admission_margin = "fixed"``: the margin is (1 - ``slo_target_fraction``) x the SLO (with a deadline
        equal to the SLO, every finish planned inside 90% of it, the default). ``"learned"`` (the default): it
        starts there and is then the output of the rung's :class:`LearnedMargin`, which moves it until the
        ``margin_quantile`` of the admitted latency sits at ``slo_target_fraction`` x the SLO. The deadline
        itself (release, 504) is unchanged."""
        budget = deadline_ns - start_ns
        if self.cfg.admission_margin == "learned" and level < len(self.margins):
            return deadline_ns - self.margins[level].scaled_ns(budget)
        return self._fixed_target(deadline_ns, budget)

    def _fixed_target(self, deadline_ns: int, budget_ns: int) -> int:
        """The deadline less (1 - ``slo_target_fraction``) x min(budget, SLO): 90% of the SLO by default."""
        return deadline_ns - int((1.0 - self.cfg.slo_target_fraction) * min(budget_ns, self.cfg.slo_ms * 1e6))

    def aim(self, level: int, start_ns: int, deadline_ns: int, now: int) -> tuple[int, int, bool]:
        """What admission of a request to rung ``level`` checks its predicted finish against, now: (admit by,
        slack, nothing ahead).

        Behind a queue (or with ``admit_when_idle`` off): ``admit_by_ns`` (the learned margin's target) and the
        boundary slack. With nothing ahead of it (``Batcher.nothing_ahead``: nothing queued, nothing admitted
        and still preprocessing, a worker free) and ``admit_when_idle`` on: the *fixed* target, (1 -
        ``slo_target_fraction``) x min(budget, SLO) before the deadline, and the slack learned from requests
        admitted with nothing ahead alone. The learned margin and the boundary slack are learned behind a queue;
        grown past the SLO they refused an idle batcher too, so no request could show them too large (issue 22:
        the vision server's sticky low state). Work whose own cost scatters is still refused: its errors teach
        the idle slack."""
        batcher = self.batchers[level]
        if self.cfg.admission_margin == "learned":
            self.margins[level].update(now)  # it moves on its interval, also while nothing ends
        idle = self.cfg.admit_when_idle and batcher.nothing_ahead()
        by = (
            self._fixed_target(deadline_ns, deadline_ns - start_ns)
            if idle
            else self.admit_by_ns(start_ns, deadline_ns, level)
        )
        source = (self.idle_boundary if idle else self.boundary)[level]
        slack = source.current(now, batcher.margin_ns) if self.cfg.admission_slack == "boundary" else 0
        return by, slack, idle

    def preprocess_lead_ns(self) -> int:
        """Expected time before a request admitted now is preprocessed: its wait for a worker plus its own (0 when
        it is preprocessed in its batch: the batch's cost, which admission predicts, includes it)."""
        if self.cfg.preprocess_in_batch:
            return 0
        waves = 1 + self.preprocessing // self.pool_workers
        return int(waves * self.pre_s * 1e9)

    def _on_batch(self, variant: str, size: int, reason: str) -> None:
        self.metrics.batches.labels(self.name, variant, reason).inc()
        self.metrics.batch_size.labels(self.name, variant).observe(size)

    def _on_depth(self, _depth: int) -> None:
        self.metrics.queue_depth.labels(self.name).set(sum(len(b) for b in self.batchers))

    async def start(self) -> None:
        for b in self.batchers:
            b.start()
        if self.evaluate_every_s is not None:
            self._eval_task = asyncio.get_running_loop().create_task(self._evaluate_loop(self.evaluate_every_s))

    async def stop(self) -> None:
        if self._eval_task is not None:
            self._eval_task.cancel()
        for b in self.batchers:
            await b.stop()

    async def _evaluate_loop(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.evaluate_guard()

    def evaluate_guard(self) -> Transition | None:
        """Let the guard decide now (the background task does, every ``evaluate_every_s``); the step it made."""
        t = self.guard.evaluate()
        if t is not None:
            self.metrics.ladder_level.labels(self.name).set(self.guard.level)
        return t

    async def infer(
        self, request: InferRequest, timing: Timing, pinned: int | None = None
    ) -> tuple[InferResponse, dict[str, Any]]:
        """Serve one parsed request (at ``pinned`` level if given); raises ServiceError for anything but success."""
        now = self.now_ns()
        deadline_ms = request.parameters.get("deadline_ms", self.cfg.default_deadline_ms)
        # the deadline counts from when the request started: the handler start, minus the age it arrived with
        deadline_ns = timing.start - timing.age_ns + int(float(deadline_ms) * 1e6)
        if now >= deadline_ns:
            # Nothing left to spend (it aged past its deadline before the handler ran): refuse it now, before
            # the guard, the cache or admission (whose starvation probe would otherwise let it in).
            self.metrics.shed.labels(self.name, "deadline").inc()
            late = f"{timing.age_ns / 1e6:.1f} ms old on arrival, " if timing.age_ns else ""
            raise ServiceError(503, f"overloaded (deadline): {late}deadline {float(deadline_ms):g} ms", 1.0, "shed")
        level = self.guard.route() if pinned is None else pinned
        routed = pinned is None
        if routed and level < self.guard.level:
            # A probe of the rung above: shadow it (a copy runs there in the background and only the
            # guard sees its latency) and answer from the current rung, so probing never costs the user.
            self._shadow(request, level, float(deadline_ms))
            level = self.guard.level
        rung = self.ladder[level]
        key = None
        if rung == "cache":
            key = self.cache.key(self.name, request)
            hit = self.cache.get(key, allow_stale=True)
            if hit is not None:
                self.metrics.cache.labels(self.name, "stale" if hit.stale else "hit").inc()
                params = {"producer": "cache", "variant": hit.variant, "stale": hit.stale, "age_s": round(hit.age_s, 3)}
                resp = InferResponse(self.name, "cache", hit.outputs, request.id, params)
                self._served(level, timing, "cache", routed=True)
                return resp, params
            self.metrics.cache.labels(self.name, "miss").inc()
            level = len(self.variants) - 1  # no cached answer: the lightest model answers
            routed = False  # ... but its latency is not evidence about the rung it was routed to
        batcher = self.batchers[level]
        lead = self.preprocess_lead_ns()
        admit_by, slack, idle = self.aim(level, timing.start - timing.age_ns, deadline_ns, now)
        boundary = (self.idle_boundary if idle else self.boundary)[level]
        self._show_margin(level, batcher.variant.name)
        predicted = batcher.predicted_finish_ns(now) + lead  # what admission expects, before any margin
        near = boundary.near(admit_by - predicted, batcher.margin_ns)
        self._show_slack(level, batcher.variant.name)
        try:
            batcher.admit(admit_by, now, lead + slack)
        except Shed as shed:
            self.metrics.shed.labels(self.name, shed.reason).inc()
            raise ServiceError(503, f"overloaded ({shed.reason})", shed.retry_after_s, "shed") from None
        self.in_flight += 1
        self.metrics.in_flight.labels(self.name).set(self.in_flight)
        try:
            if self.cfg.direct_when_idle and batcher.idle():
                outcome = await self._direct(batcher, request, timing)
            else:
                outcome = await self._batched(
                    batcher, request, timing, deadline_ns, float(deadline_ms), admit_by, slack
                )
        except _Late as late:
            self.metrics.misses.labels(self.name, batcher.variant.name, late.where).inc()
            self._missed(boundary, deadline_ns, predicted if near else 0, int(float(deadline_ms) * 1e6))
            self._late_outcome(level, timing, deadline_ns)
            self._penalise(level, routed, deadline_ms)
            raise ServiceError(504, str(late), kind="deadline") from None
        except ModelFailure as exc:
            self._penalise(level, routed, deadline_ms)
            raise ServiceError(500, f"model error in {batcher.variant.name}: {exc}", kind="model") from None
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.labels(self.name).set(self.in_flight)
        timing.level = level
        timing.predicted = predicted if near else 0  # observed by the boundary slack at answer time
        timing.idle = idle  # ... the one it was admitted by
        timing.budget = deadline_ns - (timing.start - timing.age_ns)
        timing.outcome = outcome
        variant = batcher.variant.name
        if self.caching:
            if key is None:
                key = self.cache.key(self.name, request)
            self.cache.put(key, outcome.outputs, variant)
        params = {"producer": variant, "level": level, "batch_size": outcome.batch_size, "release": outcome.reason}
        self._served(level, timing, variant, routed)
        return InferResponse(self.name, variant, outcome.outputs, request.id, params), params

    async def _direct(self, batcher: Batcher, request: InferRequest, timing: Timing) -> BatchOutcome:
        """An idle batcher: preprocess and compute on its compute thread in one hand-over."""
        variant = batcher.variant
        self.preprocessing += 1
        try:
            outcome, pre_s = await batcher.run_direct(lambda: variant.preprocess(request))
        except ProtocolError as exc:
            raise ServiceError(exc.status, str(exc), kind="bad_input") from None
        finally:
            self.preprocessing -= 1
        self._observe_preprocess(pre_s)
        timing.preprocessed = timing.parsed + int(pre_s * 1e9)
        return outcome

    async def _batched(
        self,
        batcher: Batcher,
        request: InferRequest,
        timing: Timing,
        deadline_ns: int,
        deadline_ms: float,
        admit_by: int | None = None,
        slack_ns: int = 0,
    ) -> BatchOutcome:
        """Preprocess in the pool, then queue for a batch; raises _Late when the deadline passes.

        The handler awaits one future from admission to answer. The preprocess worker hands its item
        straight to the batcher (one callback on the loop), not back to this coroutine first: under load every
        pass through the event loop waits behind all other ready callbacks, and this saves one per request.
        The batcher answers (or fails fast) by the deadline; one timer covers a batcher that cannot (not
        wait_for(shield(fut)): each of those layers adds a pass too); it fires on the loop's time but expires the
        request only once the service's clock has passed the deadline (else it re-arms: a test's FakeClock
        decides). A handler cancelled (its client left: app.py watches for the disconnect) or expired takes its
        item out: not yet preprocessed, the preprocess worker skips it; queued, it leaves the queue
        (``Batcher.withdraw``); preprocessing, its result is dropped; only a batch already computing finishes.
        Once preprocessed, a text item's cost bucket is known and admission is checked again for it
        (``Batcher.recheck``, against ``admit_by`` with ``slack_ns``): a 503 now instead of a 504 at release.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[BatchOutcome] = loop.create_future()
        expired = False
        timer: asyncio.TimerHandle

        def arm() -> asyncio.TimerHandle:
            return loop.call_later(max(0.0, (deadline_ns - self.now_ns()) / 1e9) + 0.005, expire)

        def expire() -> None:
            nonlocal expired, timer
            if fut.done():
                return
            if self.now_ns() < deadline_ns:  # the loop's timer ran ahead of the service's clock (a FakeClock)
                timer = arm()
                return
            expired = True
            fut.cancel()

        timer = arm()
        try:
            recheck = (deadline_ns if admit_by is None else admit_by, slack_ns)
            self._preprocess_then_submit(loop, batcher, request, timing, deadline_ns, fut, recheck)
            return await fut
        except ProtocolError as exc:
            raise ServiceError(exc.status, str(exc), kind="bad_input") from None
        except asyncio.CancelledError:
            fut.cancel()  # a preprocess worker that has not begun skips it
            queued = batcher.withdraw(fut)
            if expired:
                where = "queued" if queued else "computing" if timing.preprocessed else "preprocess"
                raise _Late(f"deadline of {deadline_ms:g} ms exceeded", where) from None
            raise
        except DeadlineExceeded as exc:
            raise _Late(str(exc), exc.where) from None
        except Shed as shed:
            self.metrics.shed.labels(self.name, shed.reason).inc()
            raise ServiceError(503, f"overloaded ({shed.reason})", shed.retry_after_s, "shed") from None
        finally:
            timer.cancel()

    def _preprocess_then_submit(
        self,
        loop: asyncio.AbstractEventLoop,
        batcher: Batcher,
        request: InferRequest,
        timing: Timing,
        deadline_ns: int,
        fut: asyncio.Future[BatchOutcome],
        recheck: tuple[int, int] | None = None,
    ) -> None:
        """Start ``request``'s preprocessing; its item joins ``batcher``'s queue with ``fut`` as its answer, or
        ``fut`` gets the preprocessing's exception (or the Shed of ``recheck`` = (admit by, slack), see
        ``Batcher.recheck``). The admission reservation is always released once. A ``fut`` already done when a
        worker picks the request up (its handler is gone) is not preprocessed at all."""
        variant = batcher.variant
        self.preprocessing += 1

        def on_loop(took: float | None, item: Any, exc: BaseException | None) -> None:
            self.preprocessing -= 1
            if exc is not None:
                batcher.unreserve()
                if not fut.done():
                    fut.set_exception(exc)
                return
            if took is not None:  # None: skipped, its handler was gone before a worker took it
                self._observe_preprocess(took)
            timing.preprocessed = self.now_ns()
            if fut.done():  # the handler is gone (its client left, or its deadline passed): nothing to queue
                batcher.unreserve()
                return
            if recheck is not None:
                try:
                    batcher.recheck(item, deadline_ns, timing.preprocessed, recheck[1], recheck[0])
                except Shed as shed:
                    batcher.unreserve()
                    fut.set_exception(shed)
                    return
            target = deadline_ns
            if self.cfg.order_by == "slo":  # the bucket order protects start + SLO too (Batcher._pick)
                target = min(deadline_ns, timing.start - timing.age_ns + int(self.cfg.slo_ms * 1e6))
            # the order protects the finish admission planned (admit_by) from there on (Batcher._pick)
            batcher.submit(item, deadline_ns, fut, target, recheck[0] if recheck is not None else None)

        if self.cfg.preprocess_in_batch:  # on the compute thread, in the batch: no hand-over here at all
            on_loop(None, InBatch(variant.preprocess, request), None)
            return
        if self.pool is None:  # inline on the event loop: no thread hand-over (one core: nothing to overlap)
            try:
                took, item = _timed(self.now_ns, variant.preprocess, request)
            except Exception as exc:  # the handler raises it (ProtocolError: 4xx)
                on_loop(0.0, None, exc)
            else:
                on_loop(took, item, None)
            return

        def work() -> None:
            took: float | None = None
            item, err = None, None
            if not fut.done():  # a plain read from this thread: at worst a request gone this instant is run
                try:
                    took, item = _timed(self.now_ns, variant.preprocess, request)
                except Exception as exc:
                    err = exc
            with contextlib.suppress(RuntimeError):  # the loop closed (shutdown): nobody waits for the answer
                loop.call_soon_threadsafe(on_loop, took, item, err)

        try:
            self.pool.submit(work)
        except RuntimeError as exc:  # the pool shut down
            on_loop(0.0, None, exc)

    def answered(self, timing: Timing, now_ns: int) -> None:
        """The response is encoded: the request's latency teaches the learned margin, and a request admitted near
        the boundary reports its prediction error up to here.

        What the handler does after the batch (waking on the loop, encoding the outputs) is part of the
        latency the client sees, so it counts, not just the batch's end.
        """
        if timing.level < 0:
            return
        if self.cfg.admission_margin == "learned" and timing.budget > 0:
            self.margins[timing.level].observe(now_ns, now_ns - (timing.start - timing.age_ns), timing.budget)
        if timing.predicted:
            # an error beyond the request's whole deadline is a stall, not prediction noise: one must not make
            # the slack refuse every request for the length of the window
            boundary = (self.idle_boundary if timing.idle else self.boundary)[timing.level]
            boundary.observe(now_ns, min(now_ns - timing.predicted, timing.budget))

    def _late_outcome(self, level: int, timing: Timing, deadline_ns: int) -> None:
        """A 504 teaches the learned margin as a latency of at least its whole budget."""
        if self.cfg.admission_margin == "learned":
            start = timing.start - timing.age_ns
            now = max(self.now_ns(), deadline_ns)
            self.margins[level].observe(now, now - start, deadline_ns - start)

    def _show_slack(self, level: int, variant: str) -> None:
        """The gauges of the two slacks (behind a queue; with nothing ahead), when they changed."""
        slacks = (self.boundary[level].slack_ns, self.idle_boundary[level].slack_ns)
        if slacks != self._slack_shown[level]:
            self._slack_shown[level] = slacks
            self.metrics.slack.labels(self.name, variant).set(slacks[0] / 1e9)
            self.metrics.idle_slack.labels(self.name, variant).set(slacks[1] / 1e9)

    def _show_margin(self, level: int, variant: str) -> None:
        m = self.margins[level].margin_ns if level < len(self.margins) else 0
        if m != self._margin_shown[level]:
            self._margin_shown[level] = m
            self.metrics.margin.labels(self.name, variant).set(m / 1e9)

    def _observe_preprocess(self, took: float) -> None:
        if self.pre_s == 0.0:
            self.pre_s = took
        else:  # EWMA, one stall clipped to 4x the estimate (it must not make every admission look infeasible)
            self.pre_s += 0.1 * (min(took, 4 * self.pre_s) - self.pre_s)

    def _shadow(self, request: InferRequest, level: int, deadline_ms: float) -> None:
        if self.ladder[level] == "cache" or len(self._shadows) >= 16:  # bounded: probes must not pile up
            return
        task = asyncio.get_running_loop().create_task(self._run_shadow(request, level, deadline_ms))
        self._shadows.add(task)
        task.add_done_callback(self._shadows.discard)

    async def _run_shadow(self, request: InferRequest, level: int, deadline_ms: float) -> None:
        start = self.now_ns()
        deadline_ns = start + int(deadline_ms * 1e6)
        batcher = self.batchers[level]
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[BatchOutcome] = loop.create_future()
        try:
            batcher.admit(deadline_ns, start, self.preprocess_lead_ns())
            self._preprocess_then_submit(loop, batcher, request, Timing(start), deadline_ns, fut)
            await asyncio.wait_for(fut, max(0.0, (deadline_ns - self.now_ns()) / 1e9) + 0.005)
            latency = self.now_ns() - start
        except Exception:  # a probe that fails or cannot be admitted is a slow probe
            latency = int(deadline_ms * 1e6)
            batcher.withdraw(fut)  # timed out while queued: it leaves the queue, as a user's request does
        self.metrics.probes.labels(self.name, self.ladder[level]).inc()
        self.guard.observe(level, latency, probe=True)

    def _missed(self, boundary: BoundarySlack, deadline_ns: int, predicted: int, budget_ns: int) -> None:
        """A request that missed its deadline would have finished after it (failed fast at release: later)."""
        if predicted:
            now = self.now_ns()
            boundary.observe(now, min(max(now, deadline_ns) - predicted, budget_ns))

    def _penalise(self, level: int, routed: bool, deadline_ms: float) -> None:
        """A failed or timed-out request counts for the guard as a response at its deadline."""
        if routed:
            self.guard.observe(level, int(float(deadline_ms) * 1e6), probe=level < self.guard.level)

    def _served(self, level: int, timing: Timing, producer: str, routed: bool) -> None:
        # from when the request started (X-Request-Start, else handler start): the latency the client sees
        latency = self.now_ns() - (timing.start - timing.age_ns)
        if routed:  # pinned and fall-through requests are not evidence for the guard
            self.guard.observe(level, latency, probe=level < self.guard.level)
        switch = self.guard.first_served(level)
        if switch is not None:
            self.metrics.switch.labels(self.name, self.ladder[level]).observe(switch)
            log.warning("%s: first response from %s %.1f ms after the switch", self.name, producer, switch * 1e3)


def _timed(now_ns: Callable[[], int], fn: Any, arg: Any) -> tuple[float, Any]:
    """(seconds ``fn(arg)`` took on the worker by ``now_ns``, its result): the wait for a worker is not counted."""
    t0 = now_ns()
    out = fn(arg)
    return (now_ns() - t0) / 1e9, out
