"""Open-loop (and closed-loop) load generation with coordinated-omission-correct timing.

Open loop: every request has an *intended* send time from the arrival process,
fixed before the run, independent of how fast the server answers. The sender
waits for each intended time by spinning (sleep to ~1.5 ms before it, then
yield to the event loop in a tight loop: on time to tens of microseconds,
at the price of a busy core) or by sleeping to it on a timer thread (~0.1 ms,
no CPU): ``spin="auto"`` spins only while a core is free for it, re-decided
every 0.5 s of the run (see ``latencylab.load.pacing``). If every connection
is busy it opens another instead of waiting. Each request gets three
timestamps (host ``perf_counter_ns``):

* intended  -- from the arrival process;
* sent      -- when its bytes were handed to the socket;
* done      -- when the last byte of the response arrived.

Latency (corrected) = done - intended: what a user arriving at that moment
experiences, so a server stall that delays sends still shows in percentiles.
Latency (uncorrected) = done - sent: what a closed-loop tool would report.
Lateness = sent - intended: the generator's own error. An open-loop run where
more than 1% of requests were more than 1 ms late is marked invalid.

Closed loop (``mode="closed"``): ``concurrency`` users, each sending its next
request when the previous one completes; intended = sent, so the corrected
and uncorrected figures coincide. This is what Locust-style tools measure;
results are labelled as such (latency from the actual send, coordinated
omission not corrected, validity not judged), because a stall pauses the
users and hides itself.

With ``request_start_header`` every request carries ``X-Request-Start: t=<unix µs>`` of its intended send
time (the run's wall-clock origin, read once, plus the schedule offset), so a server that trusts it counts
its deadline from when the user's wait began. Each request is encoded once with a fixed-width placeholder;
a send patches the digits into a copy.

Every request sent gets exactly one outcome: ok (2xx), shed (429/503),
error (other status, transport failure, timeout); ``sent == ok + shed + error``.

Streaming requests (``stream``: a generative protocol, ``latencylab.load.gen_client``) go through the same
schedule, connections and outcomes; their connections read each answer as a token stream
(``latencylab.load.sse``) and every request gets a ``Trace`` of its token arrival times (``Records.traces``).
A 2xx stream that went wrong (an error event, no end marker, no token, not a stream) is an error, with the
stream's reason.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab import gcpause
from latencylab.clock import wall_offset_ns
from latencylab.errors import LatencyLabError
from latencylab.load.arrivals import ArrivalProcess
from latencylab.load.early_stop import Progress
from latencylab.load.http import ConnectionPool, Target, build_request, build_stamped_request, stamp
from latencylab.load.pacing import SPIN_MODES, SPIN_NS, SpinPolicy, WakeMargin, Waker
from latencylab.load.sse import StreamConnection, StreamKind, Trace

LATE_NS = 1_000_000  # 1 ms
LATE_FRACTION = 0.01

OUTCOMES = ("ok", "shed", "error")


@dataclass(frozen=True, slots=True)
class Payload:
    """One pre-encoded request body (and what it represents, for records)."""

    body: bytes
    label: str = ""


@dataclass(frozen=True, slots=True)
class LoadConfig:
    mode: str = "open"  # "open" | "closed"
    concurrency: int = 1  # closed loop only
    duration_s: float | None = 10.0
    max_requests: int | None = None
    min_requests: int = 0  # keep sending past duration_s until this many were sent (statistical floor)
    timeout_s: float = 30.0
    connections: int = 8  # opened before the run
    max_connections: int = 4096
    headers: dict[str, str] = field(default_factory=dict)
    # send X-Request-Start: t=<unix µs of the request's intended send time>, so that a server can count its
    # deadline from when the user's wait began (time in the generator and the socket queue included)
    request_start_header: bool = False
    # open loop: busy-wait the last 1.5 ms before each send ("on"), sleep to it ("off"), or spin only while a
    # core is free for it ("auto"; latencylab.load.pacing)
    spin: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in ("open", "closed"):
            raise LatencyLabError(f"mode must be open or closed, got {self.mode!r}")
        if self.spin not in SPIN_MODES:
            raise LatencyLabError(f"spin must be one of {', '.join(SPIN_MODES)}, got {self.spin!r}")
        if self.duration_s is None and self.max_requests is None:
            raise LatencyLabError("give a duration or a maximum request count (runs are bounded)")
        if self.duration_s is not None and not self.duration_s > 0:
            raise LatencyLabError("duration must be > 0 s")
        if self.min_requests < 0 or (self.max_requests is not None and self.min_requests > self.max_requests):
            raise LatencyLabError("min requests must be >= 0 and <= max requests")
        if self.max_requests is not None and self.max_requests < 1:
            raise LatencyLabError("max requests must be >= 1")
        if self.concurrency < 1:
            raise LatencyLabError("concurrency must be >= 1")
        if not self.timeout_s > 0:
            raise LatencyLabError("timeout must be > 0 s")


@dataclass(slots=True)
class Records:
    """Raw per-request data of one run (arrays, ns relative to the run start)."""

    intended_ns: np.ndarray
    sent_ns: np.ndarray
    done_ns: np.ndarray
    outcome: np.ndarray  # 0 ok, 1 shed, 2 error
    status: np.ndarray
    payload: np.ndarray
    errors: dict[str, int]
    retry_after: list[str]
    # streaming runs: per request, its token arrival times (ns from the run start) and stream outcome
    traces: list[Trace | None] | None = None

    @property
    def n(self) -> int:
        return int(self.intended_ns.size)

    def corrected(self) -> np.ndarray:
        return self.done_ns - self.intended_ns

    def uncorrected(self) -> np.ndarray:
        return self.done_ns - self.sent_ns

    def lateness(self) -> np.ndarray:
        return self.sent_ns - self.intended_ns


@dataclass(frozen=True, slots=True)
class RunStats:
    """What the generator measured about itself."""

    wall_s: float  # first intended send to last completion
    send_span_s: float  # first to last intended send
    cpu_s: float  # generator process CPU (user + system) during the run
    connections_opened: int
    max_in_flight: int
    stopped_early: str = ""
    cpu_share: float | None = None  # cpu_s / wall time over the same interval, in cores (None: use wall_s)
    cores: int | None = None  # CPUs the generator could run on
    spin: str = ""  # the spin mode asked for ("" for closed loop: sends follow completions)
    spun: int = 0  # open-loop sends whose wait ended in a busy-wait
    other_cpu_cores: float | None = None  # mean other work on the generator's cores (per 0.5-s window), in cores
    gc_pauses: int = 0  # garbage collections in the generator's process during the run (latencylab.gcpause)
    gc_pause_max_ms: float = 0.0  # the longest of them: every send due meanwhile went out late


ProgressFn = Callable[[dict[str, Any]], None]
LiveFn = Callable[[Callable[[int], Records]], None]  # given, at the start, a reader of the records so far
AbortFn = Callable[[Progress], str]  # what the run knows -> reason to stop sending, or "" (see early_stop)


class _Run:
    """State of one run on the event loop."""

    def __init__(
        self, target: Target, path: str, payloads: Sequence[Payload], cfg: LoadConfig, stream: StreamKind | None = None
    ) -> None:
        if not payloads:
            raise LatencyLabError("no payloads to send")
        self.cfg = cfg
        self.traces: list[Trace | None] | None = None
        if stream is not None:
            kind = stream
            self.traces = []
            self.pool = ConnectionPool(
                target, cfg.max_connections, lambda pool: StreamConnection(pool, kind, self._on_trace)
            )
        else:
            self.pool = ConnectionPool(target, cfg.max_connections)
        self.requests: list[bytes] = []
        self.stamp_at: list[int] = []  # offset of the X-Request-Start digits per payload (request_start_header)
        for p in payloads:
            if cfg.request_start_header:
                request, offset = build_stamped_request(target, "POST", path, p.body, cfg.headers)
                self.stamp_at.append(offset)
            else:
                request = build_request(target, "POST", path, p.body, cfg.headers)
            self.requests.append(request)
        self.wall_offset_ns = 0  # unix ns - perf_counter_ns, read once at the run start (request_start_header)
        self.intended: list[int] = []
        self.sent: list[int] = []
        self.done: list[int] = []
        self.outcome: list[int] = []
        self.status: list[int] = []
        self.payload: list[int] = []
        self.errors: dict[str, int] = {}
        self.retry_after: list[str] = []
        self.inflight: dict[int, tuple[Any, int]] = {}
        self.max_inflight = 0
        self.completed = 0
        self.all_sent = False
        self.finished: asyncio.Event = asyncio.Event()
        self.t0 = 0
        self.on_complete: Callable[[int], None] | None = None
        self.slo_ns: float | None = None
        self.over = 0  # completed requests that missed slo_ns or did not succeed
        self.block_n: list[int] = []  # completions per 1-s block of intended send time (early stopping)
        self.block_over: list[int] = []
        self.stop_sending = False
        self.stop_reason = ""
        self._pending: set[asyncio.Future[None]] = set()
        self.waiting: collections.deque[int] = collections.deque()
        self._opening = 0
        self.policy = SpinPolicy(cfg.spin)
        self.spun = 0

    def _on_trace(self, rid: int, trace: Trace) -> None:
        assert self.traces is not None
        self.traces[rid] = trace

    def _record(self, status: int, headers: dict[str, str], body: bytes, done: int, rid: int) -> None:
        self.inflight.pop(rid, None)
        self.done[rid] = done - self.t0
        self.status[rid] = status
        trace = self.traces[rid] if self.traces is not None else None
        stream_error = trace.error if trace is not None else ""
        if 200 <= status < 300 and not stream_error:
            self.outcome[rid] = 0
        elif status in (429, 503):
            self.outcome[rid] = 1
            if "retry-after" in headers:
                self.retry_after.append(headers["retry-after"])
        else:
            self.outcome[rid] = 2
            reason = stream_error or (f"HTTP {status}" if status else body.decode("utf-8", "replace"))
            self.errors[reason] = self.errors.get(reason, 0) + 1
        self.completed += 1
        if self.waiting:
            self.send(self.waiting.popleft())
        if self.slo_ns is not None:
            b = self.intended[rid] // 1_000_000_000
            while len(self.block_n) <= b:
                self.block_n.append(0)
                self.block_over.append(0)
            self.block_n[b] += 1
            if self.outcome[rid] != 0 or done - self.t0 - self.intended[rid] > self.slo_ns:
                self.over += 1
                self.block_over[b] += 1
        if self.on_complete is not None:
            self.on_complete(rid)
        if self.all_sent and self.completed == len(self.intended):
            self.finished.set()

    def _new_slot(self, intended: int, payload: int) -> int:
        rid = len(self.intended)
        self.intended.append(intended)
        self.sent.append(0)
        self.done.append(0)
        self.outcome.append(-1)
        self.status.append(0)
        self.payload.append(payload)
        if self.traces is not None:
            self.traces.append(None)
        return rid

    def send(self, rid: int) -> None:
        conn = self.pool.acquire_idle()
        if conn is None and self.pool.size + self._opening >= self.cfg.max_connections:
            # Connection cap reached: the request waits for a free connection (its lateness grows, and a
            # run that falls behind this way is marked invalid, as a wrk-style fixed-connection client is).
            self.waiting.append(rid)
            return
        if conn is None:
            # Count the connection as opening now: a burst of sends in one loop turn must see it.
            self._opening += 1
            task = asyncio.ensure_future(self._send_on_new(rid))
            self._pending.add(task)  # keep a reference until done (the loop holds only weak ones)
            task.add_done_callback(self._pending.discard)
            return
        self._write(conn, rid)

    def _write(self, conn: Any, rid: int) -> None:
        now = time.perf_counter_ns()
        self.sent[rid] = now - self.t0
        self.inflight[rid] = (conn, now)
        if len(self.inflight) > self.max_inflight:
            self.max_inflight = len(self.inflight)
        p = self.payload[rid]
        request = self.requests[p]
        if self.stamp_at:  # the intended send time, in unix µs: lateness counts as the request's age
            request = stamp(request, self.stamp_at[p], (self.t0 + self.intended[rid] + self.wall_offset_ns) // 1000)
        conn.send(request, rid, self._record)

    async def _send_on_new(self, rid: int) -> None:
        try:
            conn = await self.pool.open()
        except ConnectionError as exc:
            self._opening -= 1
            self.sent[rid] = time.perf_counter_ns() - self.t0
            self._record(0, {}, str(exc).encode(), time.perf_counter_ns(), rid)
            return
        self._opening -= 1
        self._write(conn, rid)

    async def watchdog(self, abort_when: AbortFn | None) -> None:
        """Time out requests past the per-request timeout and apply the abort rule (every 50 ms)."""
        limit = int(self.cfg.timeout_s * 1e9)
        while not self.finished.is_set():
            await asyncio.sleep(0.05)
            self.policy.tick()
            if abort_when is not None and not self.stop_sending:
                elapsed = (time.perf_counter_ns() - self.t0) / 1e9
                # Blocks still receiving sends are left out: a half-filled block is not one observation.
                whole = max(0, min(len(self.block_n), int(elapsed) - 1))
                reason = abort_when(
                    Progress(
                        self.completed, self.over, elapsed, self.cfg.duration_s,
                        tuple(self.block_n[:whole]), tuple(self.block_over[:whole]),
                    )
                )  # fmt: skip
                if reason:
                    self.stop_sending = True
                    self.stop_reason = reason
            now = time.perf_counter_ns()
            for _rid, (conn, sent) in list(self.inflight.items()):
                if now - sent > limit:
                    conn.abort(f"timeout after {self.cfg.timeout_s:g} s")

    def records_from(self, start: int) -> Records:
        """Requests ``start`` onwards, as they stand (no traces): a live read, see ``generate``'s ``live``."""
        return Records(
            intended_ns=np.asarray(self.intended[start:], dtype=np.int64),
            sent_ns=np.asarray(self.sent[start:], dtype=np.int64),
            done_ns=np.asarray(self.done[start:], dtype=np.int64),
            outcome=np.asarray(self.outcome[start:], dtype=np.int8),
            status=np.asarray(self.status[start:], dtype=np.int16),
            payload=np.asarray(self.payload[start:], dtype=np.int32),
            errors=dict(self.errors),
            retry_after=[],
        )

    def records(self) -> Records:
        return Records(
            intended_ns=np.asarray(self.intended, dtype=np.int64),
            sent_ns=np.asarray(self.sent, dtype=np.int64),
            done_ns=np.asarray(self.done, dtype=np.int64),
            outcome=np.asarray(self.outcome, dtype=np.int8),
            status=np.asarray(self.status, dtype=np.int16),
            payload=np.asarray(self.payload, dtype=np.int32),
            errors=dict(self.errors),
            retry_after=list(self.retry_after),
            traces=None if self.traces is None else [t if t is None else t.shifted(self.t0) for t in self.traces],
        )


async def _progress_task(run: _Run, progress: ProgressFn, every_s: float = 0.25) -> None:
    while not run.finished.is_set():
        await asyncio.sleep(every_s)
        n_done = run.completed
        done = np.asarray(run.done[: len(run.intended)], dtype=np.int64)
        mask = done > 0
        lat = (done[mask] - np.asarray(run.intended, dtype=np.int64)[mask]) if mask.any() else np.array([])
        elapsed = (time.perf_counter_ns() - run.t0) / 1e9
        progress(
            {
                "elapsed_s": elapsed,
                "sent": len(run.intended),
                "done": n_done,
                "errors": sum(run.errors.values()),
                "in_flight": len(run.inflight),
                "rate": len(run.intended) / elapsed if elapsed > 0 else 0.0,
                "p50_ms": float(np.quantile(lat, 0.5)) / 1e6 if lat.size else float("nan"),
                "p99_ms": float(np.quantile(lat, 0.99)) / 1e6 if lat.size else float("nan"),
            }
        )


async def _open_loop(run: _Run, arrivals: ArrivalProcess, n_payloads: int, seed: int) -> None:
    cfg = run.cfg
    rng = np.random.default_rng(seed)
    choices = rng.integers(0, n_payloads, size=4096)
    counter = itertools.count()
    perf = time.perf_counter_ns
    t0 = run.t0
    # With a request floor the arrival stream is open-ended and the duration is checked here instead.
    floor = cfg.min_requests
    end_s = cfg.duration_s if cfg.duration_s is not None else float("inf")
    stream = arrivals.arrivals(None if floor else cfg.duration_s, cfg.max_requests or (2**62 if floor else None))
    burst = 0
    policy = run.policy
    waker: Waker | None = None  # started on the first sleep to a deadline (never with spin "on")
    # auto, while not spinning: sleep to the intended time minus the learned wake-up lateness, yield the rest
    margin = WakeMargin() if cfg.spin == "auto" else None
    try:
        for a in stream:
            if run.stop_sending or (floor and a.t_s >= end_s and len(run.intended) >= floor):
                break
            intended = t0 + round(a.t_s * 1e9)
            spun = False
            while True:
                dt = intended - perf()
                if dt <= 0:
                    # Catching up after a stall: yield now and then, so answers are read and connections
                    # return to the pool; a burst without yielding would open a connection per request.
                    burst += 1
                    if burst >= 4:
                        burst = 0
                        await asyncio.sleep(0)
                    break
                burst = 0
                if not policy.spin and dt > (early := margin.margin_ns if margin is not None else 0):
                    # Sleep to the time (auto: to the time minus the margin its wake-ups were late by lately,
                    # then yield to the loop for the rest): no CPU taken from the server under test; a late
                    # wake-up is lateness, measured, and counted in the latency (timed from the intended send).
                    if waker is None:
                        waker = Waker(asyncio.get_running_loop())
                    await waker.until(intended - early)
                    if margin is not None:
                        margin.observe(perf() - (intended - early))
                elif policy.spin and dt > SPIN_NS:
                    await asyncio.sleep((dt - SPIN_NS) / 1e9)
                else:
                    spun = policy.spin  # (auto's short yield after a sleep is not the spin)
                    await asyncio.sleep(0)  # yield: responses keep being processed while we spin
            run.spun += spun
            i = next(counter)
            payload = a.payload if a.payload is not None else int(choices[i % 4096])
            if payload >= n_payloads:
                raise LatencyLabError(f"arrival {i} names payload {payload}, but only {n_payloads} exist")
            run.send(run._new_slot(intended - t0, payload))
    finally:
        if waker is not None:
            waker.close()
    run.all_sent = True
    if run.completed == len(run.intended):
        run.finished.set()


async def _closed_loop(run: _Run, n_payloads: int, seed: int) -> None:
    cfg = run.cfg
    rng = np.random.default_rng(seed)
    end_ns = run.t0 + round(cfg.duration_s * 1e9) if cfg.duration_s is not None else None
    budget = cfg.max_requests
    loop = asyncio.get_running_loop()

    def next_request(_prev: int | None = None) -> None:
        if run.all_sent:
            return
        now = time.perf_counter_ns()
        if (
            run.stop_sending
            or (end_ns is not None and now >= end_ns and len(run.intended) >= cfg.min_requests)
            or (budget is not None and len(run.intended) >= budget)
        ):
            run.all_sent = True
            if run.completed == len(run.intended):
                run.finished.set()
            return
        rid = run._new_slot(now - run.t0, int(rng.integers(0, n_payloads)))
        run.send(rid)

    def on_complete(rid: int) -> None:
        loop.call_soon(next_request)

    run.on_complete = on_complete
    for _ in range(cfg.concurrency):
        next_request()
    await run.finished.wait()


async def generate(
    url: str,
    path: str,
    payloads: Sequence[Payload],
    arrivals: ArrivalProcess | None,
    cfg: LoadConfig,
    seed: int = 0,
    progress: ProgressFn | None = None,
    slo_ns: float | None = None,
    abort_when: AbortFn | None = None,
    stream: StreamKind | None = None,
    start_at_ns: int | None = None,
    live: LiveFn | None = None,
) -> tuple[Records, RunStats]:
    """Run one load test against ``url + path`` and return the raw records and the generator's own stats.

    ``start_at_ns``: the first send's ``perf_counter_ns`` instant (default 20 ms after the pool is warm), so
    that several generators start together (``latencylab.scaleout``). ``live(read)`` is called once the run
    starts, with ``read(i)``: the records of requests ``i`` onwards so far, callable from any thread (in-flight
    requests have outcome -1; the arrays may differ in length by the sends of the moment: cut them).

    ``stream``: read every answer as a token stream of that protocol (``latencylab.load.gen_client``);
    ``Records.traces`` then holds each request's token times.

    ``abort_when(progress)`` is consulted every 50 ms (``progress.over`` counts
    completed requests slower than ``slo_ns`` or unsuccessful; see
    ``latencylab.load.early_stop``); a non-empty
    reason stops sending, lets in-flight requests finish, and is returned in
    ``RunStats.stopped_early``.
    """
    target = Target.parse(url)
    run = _Run(target, path, payloads, cfg, stream)
    run.slo_ns = slo_ns
    if cfg.mode == "open" and arrivals is None:
        raise LatencyLabError("open-loop mode needs an arrival process")
    try:
        await run.pool.warm(min(cfg.connections, cfg.max_connections))
    except ConnectionError as exc:
        raise LatencyLabError(str(exc)) from exc
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_t0 = time.perf_counter_ns()
    run.policy.start()
    run.t0 = time.perf_counter_ns() + 20_000_000  # first send 20 ms from now: the loop is settled
    if start_at_ns is not None:
        run.t0 = max(run.t0, start_at_ns)
    if live is not None:
        live(run.records_from)
    run.wall_offset_ns = wall_offset_ns()
    tasks = [asyncio.ensure_future(run.watchdog(abort_when))]
    if progress is not None:
        tasks.append(asyncio.ensure_future(_progress_task(run, progress)))
    try:
        if cfg.mode == "open":
            assert arrivals is not None
            await _open_loop(run, arrivals, len(payloads), seed)
            await run.finished.wait()
        else:
            while time.perf_counter_ns() < run.t0:
                await asyncio.sleep(0.001)
            await _closed_loop(run, len(payloads), seed)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        run.pool.close()
    run.policy.finish()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_wall_s = (time.perf_counter_ns() - cpu_t0) / 1e9
    rec = run.records()
    end = int(rec.done_ns.max()) if rec.n else 0
    cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    stats = RunStats(
        wall_s=end / 1e9,
        send_span_s=(int(rec.intended_ns.max()) if rec.n else 0) / 1e9,
        cpu_s=cpu_s,
        connections_opened=run.pool.opened,
        max_in_flight=run.max_inflight,
        stopped_early=run.stop_reason,
        cpu_share=cpu_s / cpu_wall_s if cpu_wall_s > 0 else None,
        cores=run.policy.cores,
        spin=cfg.spin if cfg.mode == "open" else "",
        spun=run.spun,
        other_cpu_cores=run.policy.others_mean,
    )
    return rec, stats


def run_load(
    url: str,
    path: str,
    payloads: Sequence[Payload],
    arrivals: ArrivalProcess | None,
    cfg: LoadConfig,
    seed: int = 0,
    progress: ProgressFn | None = None,
    slo_ns: float | None = None,
    abort_when: AbortFn | None = None,
    stream: StreamKind | None = None,
    start_at_ns: int | None = None,
    live: LiveFn | None = None,
) -> tuple[Records, RunStats]:
    """Synchronous wrapper: runs ``generate`` on a fresh event loop (uvloop when installed)."""
    coro = generate(url, path, payloads, arrivals, cfg, seed, progress, slo_ns, abort_when, stream, start_at_ns, live)
    with gcpause.frozen(), gcpause.PauseMeter() as gc_meter:  # no full collection of the process mid-run
        rec, stats = _run_coro(coro)
    return rec, dataclasses.replace(stats, gc_pauses=gc_meter.count, gc_pause_max_ms=gc_meter.max_ns / 1e6)


def _run_coro(coro: Any) -> tuple[Records, RunStats]:
    if os.environ.get("LATENCYLAB_NO_UVLOOP") is None:
        try:
            import uvloop

            return uvloop.run(coro)
        except ImportError:
            pass
    return asyncio.run(coro)
