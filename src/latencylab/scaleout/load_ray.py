"""Distributed load generation on Ray: N generator actors, one driver, one merged ``load`` result.

The driver (:class:`LoadCluster`):

1. places N :class:`LoadWorker` actors, one CPU each, spread over the nodes (Ray's ``SPREAD`` strategy);
2. measures each worker's clock offset (``skew.measure_offset``: round trips, best of 8);
3. splits the arrival process (``split.split_arrivals``) and the request budget, one share per worker;
4. names a common start instant (``start_lead_s`` ahead, on the driver's wall clock) and gives each worker
   that instant on its own clock; each worker sends its first request at it (``generate``'s ``start_at_ns``)
   and runs the same duration, so they stop together too;
5. while they run, polls each worker every ``poll_s`` for the requests completed since the last poll
   (raw arrays of the new ones only) and folds them into that worker's running histograms and counters at
   once (``merge.PartFold``: the driver holds no raw request), so a worker that dies leaves everything it
   finished by its last poll; a worker whose abort rule stops it early (``--early-stop``) says so in its
   poll, and the driver stops the others (``LoadWorker.stop``), so the run ends together;
6. merges the workers' final parts (``merge.merge_summary``: HDR histograms, counts, lateness) into one
   result shaped like a one-host run, with ``summary["workers"]`` (per worker) and
   ``summary["distributed"]`` (offsets, start errors, failures). The run is invalid when any worker fell
   behind or failed, and the reasons name the worker.

Each worker's latencies are intervals on its own ``perf_counter_ns``; clock offsets only align the starts.
``ray`` is imported here only, and only when a cluster is opened.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from latencylab.clock import wall_offset_ns
from latencylab.errors import LatencyLabError
from latencylab.load.arrivals import ArrivalProcess
from latencylab.load.early_stop import Progress
from latencylab.load.generator import AbortFn, LoadConfig, Payload, Records, run_load
from latencylab.load.results import LoadResult, Slo, summarize_run
from latencylab.scaleout.merge import (
    RECORD_FIELDS,
    PartFold,
    WorkerPart,
    merge_summary,
    merged_records,
    merged_timeline,
    part_from_records,
    worker_row,
)
from latencylab.scaleout.skew import ClockOffset, measure_offset, start_error_ns
from latencylab.scaleout.split import Interleaved, split_arrivals, split_count, stream_seed

INSTALL_HINT = "distributed load needs Ray: pip install 'latencylab[ray]'"
log = logging.getLogger("latencylab.scaleout")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One worker's share of a run (picklable: it travels to the actor)."""

    url: str
    path: str
    payloads: Sequence[Payload]
    arrivals: ArrivalProcess | None
    cfg: LoadConfig
    seed: int
    start_unix_ns: int  # the common start, on this worker's wall clock
    slo: Slo | None = None
    confidence: float = 0.99
    abort_when: AbortFn | None = None
    keep_records: bool = False


class LoadWorker:
    """One load generator. A Ray actor in a cluster (``ray.remote`` applied by the driver); a plain object
    in-process. ``run`` and ``snapshot`` are called from different threads of the actor."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._read: Callable[[int], Records] | None = None
        self._cursor = 0  # requests before it have all completed and been shipped by ``snapshot``
        self._shipped: set[int] = set()  # completed and shipped at or after the cursor
        self._lock = threading.Lock()
        self.start_unix_ns = 0
        self._stop = ""  # set by the driver: another worker stopped early
        self._stopped = ""  # why this worker's run stopped sending early ("" while it has not)

    def node(self) -> str:
        """The host (and Ray node id, in a cluster) this worker runs on."""
        try:
            import ray

            if ray.is_initialized():
                return f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:8]}"
        except ImportError:  # a plain in-process worker
            pass
        return socket.gethostname()

    def pid(self) -> int:
        import os

        return os.getpid()

    def now_ns(self) -> int:
        """This worker's wall clock (the clock-offset probe)."""
        return time.time_ns()

    def pin(self, cores: Sequence[int]) -> list[int]:
        """Run this worker (its process, all threads) on ``cores`` only (Linux); the CPUs it may use now."""
        import os

        pid = os.getpid()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), set(cores))
        return sorted(os.sched_getaffinity(0))

    def run(self, spec: WorkerSpec) -> WorkerPart:
        """Run this worker's share from the common start instant; its final part (with its own summary)."""
        offset = wall_offset_ns()  # unix ns - perf_counter_ns, on this host
        start_perf = spec.start_unix_ns - offset

        self._stop = self._stopped = ""

        def live(read: Callable[[int], Records]) -> None:
            # called right after the generator fixed its start: the later of the asked instant and 20 ms out
            self.start_unix_ns = max(start_perf, time.perf_counter_ns() + 20_000_000) + offset
            with self._lock:  # a new run: nothing of it shipped yet
                self._read, self._cursor, self._shipped = read, 0, set()

        def abort(progress: Progress) -> str:
            # the driver's stop (another worker stopped early) or this worker's own rule, whichever comes first
            reason = self._stop or (spec.abort_when(progress) if spec.abort_when is not None else "")
            if reason:
                self._stopped = reason
            return reason

        rec, stats = run_load(
            spec.url, spec.path, spec.payloads, spec.arrivals, spec.cfg, spec.seed, None,
            spec.slo.threshold_ns if spec.slo else None, abort, None, start_perf, live,
        )  # fmt: skip
        with self._lock:
            self._read = None
        target = spec.arrivals.mean_rate() if spec.arrivals is not None and spec.cfg.mode == "open" else None
        summary, _, _ = summarize_run(rec, stats, spec.cfg, target, spec.slo, spec.confidence)
        if stats.stopped_early:
            summary["stopped_early"] = stats.stopped_early
        return part_from_records(
            self.index, self.node(), rec, spec.slo.threshold_ns if spec.slo else None, self.start_unix_ns,
            summary, stats, keep_records=spec.keep_records,
        )  # fmt: skip

    def stop(self, reason: str) -> None:
        """Stop sending (the run drains what is in flight and returns): another worker stopped early. Seen by
        the generator's next look at its abort rule (every 50 ms)."""
        self._stop = reason

    def snapshot(self) -> dict[str, Any] | None:
        """The requests completed since the last snapshot, as raw arrays (``merge.RECORD_FIELDS``), and
        ``stopped``: why this worker stopped sending early ("" while it has not); None before the run starts.
        Cost: the in-flight window and the new completions, not the whole run."""
        with self._lock:
            read = self._read
            if read is None:
                return None
            rec = read(self._cursor)
            n = min(rec.intended_ns.size, rec.outcome.size, rec.done_ns.size, rec.sent_ns.size)
            n = min(n, rec.status.size, rec.payload.size)
            done = rec.outcome[:n] >= 0
            rids = np.flatnonzero(done) + self._cursor
            new = np.array([r for r in rids.tolist() if r not in self._shipped], dtype=np.int64)
            self._shipped.update(new.tolist())
            pending = np.flatnonzero(~done)
            advance = int(pending[0]) if pending.size else n
            self._shipped = {r for r in self._shipped if r >= self._cursor + advance}
            sel = new - self._cursor
            self._cursor += advance
            out: dict[str, Any] = {f: getattr(rec, f)[:n][sel] for f in RECORD_FIELDS}
            out["stopped"] = self._stopped
            return out


@dataclass(frozen=True, slots=True)
class DistributedRun:
    """A distributed run: the merged result, the merged raw records (when kept) and each worker's part."""

    result: LoadResult
    records: Records | None
    parts: tuple[WorkerPart, ...]
    failures: Mapping[int, str]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise LatencyLabError(INSTALL_HINT) from None
    return ray


START_LEAD_S = 0.25  # the common start instant this far ahead of the driver's clock, plus per worker:
START_LEAD_PER_WORKER_S = 0.01


class LoadCluster:
    """N generator actors on a Ray cluster, reused run after run (a capacity search runs many)."""

    def __init__(
        self,
        workers: int,
        address: str | None = None,
        poll_s: float = 1.0,
        start_lead_s: float | None = None,
        clock_rounds: int = 8,
        spread: bool = True,
        pin_cores: Sequence[int] | None = None,
        place_timeout_s: float = 60.0,
    ) -> None:
        if workers < 1:
            raise LatencyLabError("--workers must be >= 1")
        self.n = workers
        self.address = address
        self.poll_s = poll_s
        # long enough to ship every worker its spec and open its connections (loopback: a few ms; a Ray RPC on
        # a LAN ~1 ms a worker); a worker that still starts late says so in its start error
        self.start_lead_s = START_LEAD_S + START_LEAD_PER_WORKER_S * workers if start_lead_s is None else start_lead_s
        self.clock_rounds = clock_rounds
        self.spread = spread
        self.pin_cores = tuple(pin_cores) if pin_cores else None  # worker i on core pin_cores[i % len]
        self.place_timeout_s = place_timeout_s
        self.actors: list[Any] = []
        self.nodes: list[str] = []
        self._started_ray = False
        self._ray: Any = None

    def __enter__(self) -> LoadCluster:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        ray = self._ray = _ray()
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
            self._started_ray = True
        self.actors = [self._actor(i) for i in range(self.n)]
        try:  # placed and ready; a cluster without a free CPU per worker would wait forever
            self.nodes = ray.get([a.node.remote() for a in self.actors], timeout=self.place_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise LatencyLabError(
                f"Ray could not place {self.n} load workers (one CPU each) within {self.place_timeout_s:g} s: "
                "the cluster has fewer free CPUs than --workers"
            ) from None
        self._pin()
        log.info("%d load workers on %s", self.n, ", ".join(self.nodes))

    def _pin(self) -> None:
        if self.pin_cores:
            cores = self.pin_cores
            self._ray.get([a.pin.remote([cores[i % len(cores)]]) for i, a in enumerate(self.actors)])

    def _actor(self, index: int) -> Any:
        ray = self._ray
        opts: dict[str, Any] = {"num_cpus": 1, "max_concurrency": 4}
        if self.spread:
            opts["scheduling_strategy"] = "SPREAD"
        return ray.remote(**opts)(LoadWorker).remote(index)

    def close(self) -> None:
        ray = self._ray
        if ray is None:
            return
        for a in self.actors:
            with contextlib.suppress(Exception):  # already dead: nothing to close
                ray.kill(a)
        self.actors = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def pids(self) -> list[int]:
        """The worker processes (tests kill one)."""
        return [int(p) for p in self._ray.get([a.pid.remote() for a in self.actors])]

    def offsets(self) -> list[ClockOffset]:
        ray = self._ray

        def probe(actor: Any) -> Callable[[], int]:
            return lambda: int(ray.get(actor.now_ns.remote()))

        return [measure_offset(probe(a), time.time_ns, self.clock_rounds) for a in self.actors]

    def run(
        self,
        url: str,
        path: str,
        payloads: Sequence[Payload],
        arrivals: ArrivalProcess | None,
        cfg: LoadConfig,
        slo: Slo | None = None,
        confidence: float = 0.99,
        seed: int = 0,
        abort_when: AbortFn | None = None,
        keep_records: bool = False,
        env: dict[str, Any] | None = None,
        target_info: dict[str, Any] | None = None,
        on_poll: Callable[[int, int], None] | None = None,
    ) -> DistributedRun:
        """One distributed run (module docstring); ``on_poll(poll, completed so far)`` after each poll."""
        ray = self._ray
        if ray is None:
            raise LatencyLabError("open the cluster first (with LoadCluster(...) as cluster: ...)")
        alive = [self._alive(a) for a in self.actors]
        self.actors = [a if ok else self._actor(i) for i, (a, ok) in enumerate(zip(self.actors, alive, strict=True))]
        if not all(alive):
            self._pin()
        if cfg.mode == "closed" and cfg.concurrency < self.n:
            raise LatencyLabError(f"--concurrency {cfg.concurrency} is fewer users than --workers {self.n}")
        offsets = self.offsets()
        streams = split_arrivals(arrivals, self.n, seed) if arrivals is not None else [None] * self.n
        interleaved = any(isinstance(s, Interleaved) for s in streams)
        start = time.time_ns() + int(self.start_lead_s * 1e9)
        specs = []
        for i, stream in enumerate(streams):
            wcfg = replace(
                cfg,
                max_requests=split_count(cfg.max_requests, self.n, i, interleaved),
                min_requests=split_count(cfg.min_requests, self.n, i, interleaved) or 0,
                concurrency=split_count(cfg.concurrency, self.n, i, False) or 1,
            )
            if wcfg.max_requests == 0:
                raise LatencyLabError(f"--max-requests {cfg.max_requests} leaves worker {i} nothing to send")
            wseed = stream_seed(seed, i) if self.n > 1 else seed
            at = offsets[i].to_worker(start)
            spec = WorkerSpec(url, path, payloads, stream, wcfg, wseed, at, slo, confidence, abort_when, keep_records)
            specs.append(spec)
        refs = {i: a.run.remote(specs[i]) for i, a in enumerate(self.actors)}
        folds = {i: PartFold(i, self.nodes[i], slo.threshold_ns if slo else None) for i in refs}
        finals, failures, first_stop = self._wait(refs, folds, on_poll)
        parts = [finals[i] if i in finals else folds[i].part() for i in range(self.n)]
        rows = []
        for p, off in zip(parts, offsets, strict=True):
            err = start_error_ns(off, p.start_unix_ns, start) if p.start_unix_ns else None
            extra = {
                "clock_offset_ms": off.offset_ns / 1e6,
                "clock_uncertainty_ms": off.uncertainty_ns / 1e6,
                "start_error_ms": None if err is None else err / 1e6,
            }
            rows.append({**worker_row(p, failures.get(p.index, "")), **extra})
        target_rate = arrivals.mean_rate() if arrivals is not None and cfg.mode == "open" else None
        summary, hists = merge_summary(parts, cfg, target_rate, slo, confidence, failures)
        if first_stop is not None:  # the worker whose rule stopped the run, not those it stopped
            summary["stopped_early"] = f"worker {first_stop[0]}: {first_stop[1]}"
        errors = [r["start_error_ms"] for r in rows if r["start_error_ms"] is not None]
        summary["workers"] = rows
        summary["distributed"] = {
            "workers": self.n,
            "address": self.address,
            "start_lead_s": self.start_lead_s,
            "poll_s": self.poll_s,
            "split": "interleaved" if interleaved else ("independent Poisson streams" if self.n > 1 else "none"),
            "start_error_max_ms": max((abs(e) for e in errors), default=None),
            "start_spread_ms": (max(errors) - min(errors)) if errors else None,
            "clock_uncertainty_max_ms": max(off.uncertainty_ns for off in offsets) / 1e6,
            "failed_workers": sorted(failures),
            "stopped_by": None if first_stop is None else first_stop[0],
        }
        config = asdict(cfg)
        config.update({"seed": seed, "payloads": len(payloads), "workers": self.n})
        if env is None:
            from latencylab.env import fingerprint

            env = fingerprint(sample_s=0.0)
        result = LoadResult(
            target={"url": url, "path": path, **(target_info or {})},
            arrivals=arrivals.describe() if arrivals is not None else None,
            config=config,
            summary=summary,
            histograms={k: h.to_dict() for k, h in hists.items()},
            timeline=tuple(merged_timeline(parts)),
            env=env,
        )
        return DistributedRun(result, merged_records(parts) if keep_records else None, tuple(parts), failures)

    def _alive(self, actor: Any) -> bool:
        try:
            self._ray.get(actor.now_ns.remote(), timeout=10)
            return True
        except Exception:
            return False

    def _wait(
        self, refs: dict[int, Any], folds: dict[int, PartFold], on_poll: Callable[[int, int], None] | None
    ) -> tuple[dict[int, WorkerPart], dict[int, str], tuple[int, str] | None]:
        """Poll until every worker has answered or failed, folding what each ships meanwhile into ``folds``;
        the first worker to stop early stops the others. Returns the final parts, the failures, and (worker,
        reason) of the first early stop (None: no worker stopped early)."""
        ray = self._ray
        finals: dict[int, WorkerPart] = {}
        failures: dict[int, str] = {}
        pending = dict(refs)
        t0 = time.monotonic()
        polls = 0
        first_stop: tuple[int, str] | None = None
        while pending:
            by_ref = {ref: i for i, ref in pending.items()}
            ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=self.poll_s)
            stops: list[tuple[int, str]] = []
            for ref in ready:
                i = by_ref[ref]
                del pending[i]
                try:
                    finals[i] = ray.get(ref)
                except Exception as exc:  # the actor died (RayActorError) or its run raised (RayTaskError)
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    failures[i] = f"{type(exc).__name__} after {time.monotonic() - t0:.1f} s: {first[:200]}"
                    continue
                why = (finals[i].summary or {}).get("stopped_early")
                if why:
                    stops.append((i, str(why)))
            snaps = {i: self.actors[i].snapshot.remote() for i in pending}
            if snaps:
                by_snap = {ref: i for i, ref in snaps.items()}
                done, _ = ray.wait(list(by_snap), num_returns=len(by_snap), timeout=self.poll_s)
                for ref in done:
                    try:
                        chunk = ray.get(ref)
                    except Exception:  # a dead worker shows in its run's answer
                        continue
                    if chunk:
                        folds[by_snap[ref]].add(chunk)  # folded now; the raw arrays are dropped here
                        if chunk.get("stopped"):
                            stops.append((by_snap[ref], str(chunk["stopped"])))
            if first_stop is None and stops:
                first_stop = min(stops)
                why = f"worker {first_stop[0]} stopped early ({first_stop[1]})"
                for i in pending:
                    if i != first_stop[0]:
                        with contextlib.suppress(Exception):  # a dead worker shows in its run's answer
                            self.actors[i].stop.remote(why)
            polls += 1
            if on_poll is not None:
                on_poll(polls, sum(f.folded for f in folds.values()))
        return finals, failures, first_stop
