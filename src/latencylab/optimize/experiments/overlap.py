"""Pipeline overlap (vision): serial decode -> preprocess -> forward against a double-buffered data path.

A producer thread prepares input i+1 while the model runs input i, through a bounded queue; reports
throughput and per-item latency of both, and whether their outputs match. Settings: :class:`OverlapConfig`."""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from latencylab import stats
from latencylab.clock import Clock, PerfCounterClock
from latencylab.errors import LatencyLabError
from latencylab.results.base import utc_now
from latencylab.results.experiment import experiment_doc
from latencylab.results.registry import SCHEMA_VERSION
from latencylab.threads import TorchThreads
from latencylab.timing import env_or_fingerprint, ms, rotated


@dataclass(frozen=True, slots=True)
class OverlapMode:
    """One way of running the pipeline over the same items, ``rounds`` times.

    ``wall_ns[r]``: time to process all items in round r. Per item (all rounds, in order):
    ``latency_ns`` from the moment the pipeline took the input (it was available) to its result,
    ``prepare_ns`` decode + preprocess, ``infer_ns`` forward + postprocess, ``wait_ns`` time between the
    input being prepared and the model starting on it (the bounded queue; 0 when serial).
    """

    name: str
    threads: int | None
    n_items: int
    wall_ns: tuple[int, ...]
    latency_ns: tuple[int, ...]
    prepare_ns: tuple[int, ...]
    infer_ns: tuple[int, ...]
    wait_ns: tuple[int, ...]

    @property
    def items_per_s(self) -> float:
        """All items over all rounds' wall time (one preempted round drags it down; see ``items_per_s_p50``)."""
        return self.n_items * len(self.wall_ns) / (sum(self.wall_ns) / 1e9)

    @property
    def items_per_s_p50(self) -> float:
        """Median over rounds of the round's throughput (robust to a round hit by another process)."""
        return float(np.median(self.round_items_per_s()))

    def round_items_per_s(self) -> np.ndarray:
        return self.n_items / (np.asarray(self.wall_ns, dtype=np.float64) / 1e9)

    def latency_summary(self) -> stats.Summary:
        return stats.summarize(np.asarray(self.latency_ns, dtype=np.float64) / 1e6, qs=(0.5, 0.99), label=self.name)

    def to_dict(self) -> dict[str, Any]:
        lat = self.latency_summary()
        p50, p99 = lat.at(0.5), lat.at(0.99)
        tput = stats.summarize(self.round_items_per_s(), qs=(0.5,), label=f"{self.name} items/s")
        return {
            "name": self.name,
            "threads": self.threads,
            "n_items": self.n_items,
            "rounds": len(self.wall_ns),
            "items_per_s": self.items_per_s,
            "items_per_s_p50_over_rounds": self.items_per_s_p50,
            "items_per_s_p50_ci": [tput.at(0.5).ci_low, tput.at(0.5).ci_high],
            "latency_ms": {
                "mean": lat.mean,
                "p50": p50.value,
                "p50_ci": [p50.ci_low, p50.ci_high],
                "p99": p99.value,
                "p99_ci": [p99.ci_low, p99.ci_high],
            },
            "prepare_ms_p50": float(np.median(self.prepare_ns)) / 1e6,
            "infer_ms_p50": float(np.median(self.infer_ns)) / 1e6,
            "wait_ms_p50": float(np.median(self.wait_ns)) / 1e6,
            "warnings": list(lat.warnings),
            "wall_ns": list(self.wall_ns),
            "latency_ns": list(self.latency_ns),
            "prepare_ns": list(self.prepare_ns),
            "infer_ns": list(self.infer_ns),
            "wait_ns": list(self.wait_ns),
        }


@dataclass(frozen=True, slots=True)
class OverlapResult:
    """Serial against double-buffered execution of the same pipeline over the same items."""

    label: str
    n_items: int
    rounds: int
    threads: int | None
    queue_size: int
    modes: tuple[OverlapMode, ...]
    speedup: float  # median over rounds of overlap items/s / serial items/s (paired within a round)
    speedup_by_round: tuple[float, ...]
    ideal_speedup: float  # (prepare + infer) / max(prepare, infer), from the serial medians
    outputs_match: bool | None
    conclusion: str
    env: Mapping[str, Any]
    created_at: str = field(default_factory=utc_now)
    schema_version: int = SCHEMA_VERSION
    kind: str = "pipeline-overlap"

    def mode(self, name: str) -> OverlapMode:
        for m in self.modes:
            if m.name == name:
                return m
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return experiment_doc(self, modes=[m.to_dict() for m in self.modes])


_DONE = object()


def _run_serial(
    items: Sequence[Any], prepare: Callable[[Any], Any], infer: Callable[[Any], Any], clk: Clock
) -> tuple[int, list[tuple[int, int, int, int]], list[Any]]:
    rows: list[tuple[int, int, int, int]] = []
    outs: list[Any] = []
    mark, resolve = clk.mark, clk.resolve
    start = mark()
    for item in items:
        m0 = mark()
        x = prepare(item)
        m1 = mark()
        outs.append(infer(x))
        m2 = mark()
        t0, t1, t2 = (int(t) for t in resolve([m0, m1, m2]))
        rows.append((t2 - t0, t1 - t0, t2 - t1, 0))
    end = mark()
    s, e = resolve([start, end])
    return int(e) - int(s), rows, outs


def _run_overlapped(
    items: Sequence[Any],
    prepare: Callable[[Any], Any],
    infer: Callable[[Any], Any],
    clk: Clock,
    queue_size: int,
) -> tuple[int, list[tuple[int, int, int, int]], list[Any]]:
    """A producer thread prepares inputs into a bounded queue while this thread runs the model."""
    mark, resolve = clk.mark, clk.resolve
    n = len(items)
    taken: list[Any] = [None] * n
    prepared: list[Any] = [None] * n
    q: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
    stop = threading.Event()
    errors: list[BaseException] = []

    def put(obj: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(obj, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def producer() -> None:
        try:
            for i, item in enumerate(items):
                if stop.is_set():
                    return
                taken[i] = mark()
                x = prepare(item)
                prepared[i] = mark()
                if not put((i, x)):
                    return
        except BaseException as exc:  # handed to the consumer, re-raised there
            errors.append(exc)
        finally:
            put(_DONE)

    rows: list[tuple[int, int, int, int]] = []
    outs: list[Any] = []
    start = mark()
    worker = threading.Thread(target=producer, name="latencylab-prepare", daemon=True)
    worker.start()
    try:
        while True:
            got = q.get()
            if got is _DONE:
                break
            i, x = got
            m_start = mark()
            outs.append(infer(x))
            m_done = mark()
            t_take, t_prep, t_start, t_done = (int(t) for t in resolve([taken[i], prepared[i], m_start, m_done]))
            rows.append((t_done - t_take, t_prep - t_take, t_done - t_start, t_start - t_prep))
    finally:
        stop.set()
        worker.join()
    end = mark()
    if errors:
        raise errors[0]
    if len(rows) != n:
        raise LatencyLabError(f"overlapped run produced {len(rows)} results for {n} inputs")
    s, e = resolve([start, end])
    return int(e) - int(s), rows, outs


def _same_outputs(a: Sequence[Any], b: Sequence[Any]) -> bool | None:
    """Whether two runs' outputs agree (numpy-able outputs only; None when they cannot be compared)."""
    if len(a) != len(b):
        return False
    try:
        for x, y in zip(a, b, strict=True):
            xa, ya = _as_numpy(x), _as_numpy(y)
            if xa.shape != ya.shape or not np.allclose(xa, ya, rtol=1e-5, atol=1e-6):
                return False
    except (TypeError, ValueError):
        return None
    return True


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "probs"):  # vision Predictions
        x = x.probs
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == object:
        raise TypeError("not a numeric output")
    return arr


@dataclass(frozen=True, slots=True)
class OverlapConfig:
    """Settings of :func:`pipeline_overlap` (each field's ``help`` says what it sets)."""

    rounds: int = field(default=5, metadata={"help": "interleaved rounds"})
    warmup: int = field(default=5, metadata={"help": "untimed calls per variant first"})
    threads: int | None = field(default=1, metadata={"help": "torch intra-op threads (None: leave as is)"})
    queue_size: int = field(default=2, metadata={"help": "bounded queue between the producer and the model"})
    reference_threads: int | None = field(
        default=None, metadata={"help": "also time serial at this many threads (None: skip)"}
    )
    label: str = field(default="", metadata={"help": "what was measured, for the table and the result"})


def pipeline_overlap(
    items: Sequence[Any],
    prepare: Callable[[Any], Any],
    infer: Callable[[Any], Any],
    config: OverlapConfig | None = None,
    *,
    clock: Clock | None = None,
    env: Mapping[str, Any] | None = None,
    **settings: Any,
) -> OverlapResult:
    """Serial against double-buffered (asynchronous data path) execution over the same ``items``.

    * ``serial``: for each item, ``infer(prepare(item))``, one after the other;
    * ``overlap``: a producer thread runs ``prepare`` on item i+1 (and up to ``queue_size`` ahead, through
      a bounded queue) while this thread runs ``infer`` on item i.

    Both at ``threads`` torch intra-op threads (default 1, so that the two stages can each have a core);
    ``reference_threads`` adds ``serial-<n>t``, the serial pipeline with n torch threads (is overlap better
    than giving the model the cores?). Each round runs every mode over all items, in rotated order.

    Latency of an item runs from when the pipeline takes the input (it is available: in a saturated
    stream, the moment the previous one's preparation ends) to its result, so queue waits are charged to
    the overlapped mode. Throughput is items / wall time of the round.
    """
    cfg = dataclasses.replace(config or OverlapConfig(), **settings)
    rounds, warmup, threads, queue_size, reference_threads, label = (
        cfg.rounds,
        cfg.warmup,
        cfg.threads,
        cfg.queue_size,
        cfg.reference_threads,
        cfg.label,
    )
    if not items:
        raise LatencyLabError("pipeline_overlap needs at least one item")
    if rounds < 1 or queue_size < 1 or warmup < 0:
        raise LatencyLabError("rounds and queue_size must be >= 1, warmup >= 0")
    clk = clock or PerfCounterClock()
    modes: list[tuple[str, int | None, bool]] = [("serial", threads, False), ("overlap", threads, True)]
    if reference_threads is not None and reference_threads != threads:
        modes.append((f"serial-{reference_threads}t", reference_threads, False))
    walls: dict[str, list[int]] = {m[0]: [] for m in modes}
    rows: dict[str, list[tuple[int, int, int, int]]] = {m[0]: [] for m in modes}
    first_outs: dict[str, list[Any]] = {}
    warm = [items[i % len(items)] for i in range(warmup)]
    with TorchThreads() as th:
        for _, t, overlapped in modes:
            th.set(t)
            if not warm:
                continue
            # The overlapped warm-up goes through the producer thread too (first concurrent use of the libraries).
            if overlapped:
                _run_overlapped(warm, prepare, infer, clk, queue_size)
            else:
                _run_serial(warm, prepare, infer, clk)
        for r in range(rounds):
            for name, t, overlapped in rotated(modes, r):
                th.set(t)
                if overlapped:
                    wall, rr, outs = _run_overlapped(items, prepare, infer, clk, queue_size)
                else:
                    wall, rr, outs = _run_serial(items, prepare, infer, clk)
                walls[name].append(wall)
                rows[name].extend(rr)
                first_outs.setdefault(name, outs)
    results = tuple(
        OverlapMode(
            name=name,
            threads=t,
            n_items=len(items),
            wall_ns=tuple(walls[name]),
            latency_ns=tuple(x[0] for x in rows[name]),
            prepare_ns=tuple(x[1] for x in rows[name]),
            infer_ns=tuple(x[2] for x in rows[name]),
            wait_ns=tuple(x[3] for x in rows[name]),
        )
        for name, t, _ in modes
    )
    serial, overlap = results[0], results[1]
    by_round = tuple(float(s / o) for s, o in zip(serial.wall_ns, overlap.wall_ns, strict=True))
    speedup = float(np.median(by_round))
    prep, inf = float(np.median(serial.prepare_ns)), float(np.median(serial.infer_ns))
    ideal = (prep + inf) / max(prep, inf) if max(prep, inf) > 0 else 1.0
    match = _same_outputs(first_outs["serial"], first_outs["overlap"])
    conclusion = _overlap_conclusion(results, speedup, by_round, ideal, prep, inf, queue_size)
    return OverlapResult(
        label=label,
        n_items=len(items),
        rounds=rounds,
        threads=threads,
        queue_size=queue_size,
        modes=results,
        speedup=speedup,
        speedup_by_round=by_round,
        ideal_speedup=ideal,
        outputs_match=match,
        conclusion=conclusion,
        env=env_or_fingerprint(env),
    )


def _overlap_conclusion(
    modes: Sequence[OverlapMode],
    speedup: float,
    by_round: Sequence[float],
    ideal: float,
    prep_ns: float,
    infer_ns: float,
    queue_size: int,
) -> str:
    serial, overlap = modes[0], modes[1]
    sl, ol = serial.latency_summary(), overlap.latency_summary()
    bottleneck = "prepare (decode + preprocess)" if prep_ns >= infer_ns else "infer (forward + postprocess)"
    parts = [
        f"Throughput (median over rounds): serial {serial.items_per_s_p50:.1f} items/s, overlapped "
        f"{overlap.items_per_s_p50:.1f} items/s; speed-up x{speedup:.2f} (median of {len(by_round)} paired rounds, "
        f"range {min(by_round):.2f}-{max(by_round):.2f}).",
        f"Serial stage medians: prepare {ms(prep_ns):.2f} ms, infer {ms(infer_ns):.2f} ms; perfect overlap would "
        f"give x{ideal:.2f} (the slower stage, {bottleneck}, sets the pace).",
        f"Per-item latency p50: serial {sl.median:.2f} ms, overlapped {ol.median:.2f} ms (p99 {sl.at(0.99).value:.2f} "
        f"vs {ol.at(0.99).value:.2f}). Overlap does not shorten one item's own path; under a saturated stream "
        f"the prepared items wait in the queue of {queue_size} "
        f"(median wait {ms(float(np.median(overlap.wait_ns))):.2f} ms), and what it buys is capacity: "
        "a stream arriving faster than the serial pipeline's rate queues without bound serially but not here.",
        "Threads suffice (no processes) because the heavy parts release the GIL: Pillow's JPEG decoder and "
        "resize, numpy's array arithmetic and torch's kernels run without it; only the Python glue between "
        "them contends, which is why the achieved speed-up stays below the ideal.",
    ]
    if len(modes) > 2:
        ref = modes[2]
        parts.append(
            f"Reference {ref.name} (serial, model on {ref.threads} threads): {ref.items_per_s_p50:.1f} items/s, "
            f"x{ref.items_per_s_p50 / serial.items_per_s_p50:.2f} over serial: "
            + (
                "overlap uses the second core better than intra-op threads do."
                if overlap.items_per_s_p50 > ref.items_per_s_p50
                else "giving the model both cores does as well or better here."
            )
        )
    return " ".join(parts)


def format_overlap(r: OverlapResult) -> str:
    lines = [
        f"pipeline overlap, {r.label or 'pipeline'}, {r.n_items} items x {r.rounds} rounds, "
        f"queue {r.queue_size}, outputs match: {r.outputs_match}",
        f"{'mode':<12} {'thr':>3} {'items/s':>8} {'(all)':>8} {'lat p50':>8} {'p50 95% CI':>17} {'lat p99':>8} "
        f"{'prep p50':>8} {'infer p50':>9} {'wait p50':>8}",
    ]
    for m in r.modes:
        s = m.latency_summary()
        a50 = s.at(0.5)
        lines.append(
            f"{m.name:<12} {m.threads!s:>3} {m.items_per_s_p50:8.1f} {m.items_per_s:8.1f} {a50.value:8.2f} "
            f"{f'[{a50.ci_low:.2f}, {a50.ci_high:.2f}]':>17} {s.at(0.99).value:8.2f} "
            f"{ms(float(np.median(m.prepare_ns))):8.2f} {ms(float(np.median(m.infer_ns))):9.2f} "
            f"{ms(float(np.median(m.wait_ns))):8.2f}"
        )
    lines.append(r.conclusion)
    return "\n".join(lines)
